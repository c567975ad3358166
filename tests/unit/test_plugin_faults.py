"""Plugins that misbehave, and first use from several threads: probes that hang, plugin code that raises anything
(SystemExit included), two plugins that register one device name, a default device that falls back, and discovery,
opening and Device.DEFAULT raced by threads that start at once."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from importlib import metadata
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.device import (
    DEFAULT_PROBE_TIMEOUT_S,
    Device,
    DeviceFallbackWarning,
    DeviceUnavailable,
    MallocAllocator,
    probe_timeout,
)
from tgcore.plugin import PLUGIN_API_VERSION, DeviceSpec, plugin_module
from tgcore.registry import PluginManager, PluginWarning, plugins
from tgcore.runtime.python import PythonCompiler, PythonProgram, PythonRenderer

SUBPROCESS_TIMEOUT_S = 120  # turns a hang of the code under test into a failure; a pass takes a few seconds


class TaggedRenderer(PythonRenderer):
    """The PYTHON renderer, marked with the plugin that made it: shows whose part hook answered."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag


def device_plugin(
    name: str,
    device: str,
    priority: int = -5,
    probe: Callable[..., Optional[str]] = lambda: None,
    api_version: Any = PLUGIN_API_VERSION,
) -> Any:
    """A plugin that provides `device` from the PYTHON device's parts, its renderer tagged with the plugin's name."""

    def register(registry: Any) -> None:
        registry.add(DeviceSpec(device, api_version, priority=priority, probe=probe))

    wanted = device

    def answers(make: Callable[[], Any]) -> Callable[[str], Any]:
        return lambda device: make() if device == wanted else None  # (pluggy passes hook arguments by name)

    return plugin_module(
        name,
        tg_register_devices=register,
        tg_renderer=answers(lambda: TaggedRenderer(name)),
        tg_compiler=answers(PythonCompiler),
        tg_allocator=answers(MallocAllocator),
        tg_runtime=answers(lambda: PythonProgram),
    )



class FakeDist:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeEntryPoint:
    """An entry point of the `tgcore` group whose load() runs `loader` (and whose distribution is `dist`)."""

    def __init__(self, name: str, loader: Callable[[], Any], dist: Optional[str] = None) -> None:
        self.name, self.value, self._loader = name, f"fake_{name}", loader
        self.dist = FakeDist(dist) if dist else None

    def load(self) -> Any:
        return self._loader()


def manager_with(monkeypatch: pytest.MonkeyPatch, eps: list[FakeEntryPoint]) -> PluginManager:
    """A fresh plugin manager that discovers `eps` (and the built-in devices), loaded."""
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: eps if group == "tgcore" else [])
    pm = PluginManager()
    pm.load()
    return pm


# ***** fake installed distributions, for subprocesses: real entry-point discovery *****

PLUGIN_TEMPLATE = """
import os, time
from tgcore.plugin import PLUGIN_API_VERSION, DeviceSpec, hookimpl
from tgcore.plugin import MallocAllocator
from tgcore.runtime.python import PythonCompiler, PythonProgram, PythonRenderer
DEVICE = {device!r}
{prelude}
def probe():
{probe}

@hookimpl
def tg_register_devices(registry):
    registry.add(DeviceSpec(DEVICE, PLUGIN_API_VERSION, priority={priority}, probe=probe))

@hookimpl
def tg_renderer(device):
    return PythonRenderer() if device == DEVICE else None

@hookimpl
def tg_compiler(device):
    return PythonCompiler() if device == DEVICE else None

@hookimpl
def tg_allocator(device):
    return MallocAllocator() if device == DEVICE else None

@hookimpl
def tg_runtime(device):
    return PythonProgram if device == DEVICE else None
"""


def install_fake(
    root: pathlib.Path,
    entry: str,
    device: str = "FAKE",
    priority: int = 50,
    probe: str = "return None",
    prelude: str = "",
    dist: Optional[str] = None,
) -> None:
    """Write module `tgfake_<entry>` and a distribution whose `tgcore` entry point `entry` names it into `root`."""
    module = f"tgfake_{entry}"
    source = PLUGIN_TEMPLATE.format(
        device=device, priority=priority, probe=textwrap.indent(probe, "    "), prelude=prelude
    )
    (root / f"{module}.py").write_text(source)
    dist = dist or f"tgfake-{entry}"
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tgcore]\n{entry} = {module}\n")


def run_python(root: pathlib.Path, args: list[str], plugins_env: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run python with the fake distributions in `root` installed and only `plugins_env` of them loaded; DEVICE unset,
    so the default device is chosen by priority."""
    full_env = {k: v for k, v in os.environ.items() if k != "DEVICE"}
    full_env.update(PYTHONPATH=str(root), TGCORE_PLUGINS=plugins_env, **env)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=full_env, timeout=SUBPROCESS_TIMEOUT_S
    )


# ***** probes with a time limit *****


def test_probe_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TGCORE_PROBE_TIMEOUT", raising=False)
    assert probe_timeout() == DEFAULT_PROBE_TIMEOUT_S
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "2.5")
    assert probe_timeout() == 2.5
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "0")
    assert probe_timeout() is None
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TGCORE_PROBE_TIMEOUT='soon' is not a number"):
        probe_timeout()


def test_a_hung_probe_times_out_and_its_late_answer_is_ignored(monkeypatch, registered) -> None:
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "0.3")
    release, answered = threading.Event(), threading.Event()

    def hangs() -> Optional[str]:
        try:  # (a probe that never answers: 60 s caps it so that a core without time limits fails, not hangs)
            release.wait(60)
            return "the late answer"
        finally:
            answered.set()

    registered(device_plugin("hangplug", "HANG", probe=hangs))
    try:
        reason = Device.status("HANG")
        assert reason is not None and reason.startswith("probe timed out") and "0.3 s" in reason
        assert "TGCORE_PROBE_TIMEOUT" in reason
        assert "HANG" not in Device.available()
        with pytest.raises(DeviceUnavailable, match="HANG is not available: probe timed out"):
            Device["HANG"]
    finally:
        release.set()
    assert answered.wait(10)
    assert Device.status("HANG").startswith("probe timed out")  # type: ignore[union-attr]


def test_probes_of_several_devices_run_at_once(monkeypatch, registered) -> None:
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "60")
    # each probe answers only once all three are running: probes run one after another never get there
    everyone = threading.Barrier(3, timeout=20)

    def meets() -> Optional[str]:
        everyone.wait()
        return None

    for i in range(3):
        registered(device_plugin(f"slow{i}", f"SLOW{i}", probe=meets))
    assert {"SLOW0", "SLOW1", "SLOW2"} <= set(Device.available())
    assert all(Device.status(f"SLOW{i}") is None for i in range(3))


def test_an_instance_probe_that_hangs_times_out(monkeypatch, registered) -> None:
    monkeypatch.setenv("TGCORE_PROBE_TIMEOUT", "0.3")
    release = threading.Event()

    def probe(instance: str = "INSTH") -> Optional[str]:
        if instance == "INSTH:1":
            release.wait(60)
            return "the late answer"
        return None

    registered(device_plugin("insthang", "INSTH", probe=probe))
    try:
        assert Device.status("INSTH") is None
        assert Device.status("INSTH:1").startswith("probe timed out")  # type: ignore[union-attr]
        assert Device["INSTH"].name == "INSTH"
    finally:
        release.set()


@pytest.mark.parametrize(
    "answer, expected",
    [
        (lambda: (_ for _ in ()).throw(SystemExit(4)), "probe raised SystemExit: 4"),
        (lambda: True, "probe returned True: expected None (usable here) or a str"),
        (lambda: (_ for _ in ()).throw(RuntimeError("no driver")), "probe raised RuntimeError: no driver"),
    ],
    ids=["system-exit", "not-a-reason", "error"],
)
def test_a_probe_that_breaks_the_contract_is_unavailable_with_the_cause(registered, answer, expected) -> None:
    registered(device_plugin("badprobe", "BADPROBE", probe=answer))
    reason = Device.status("BADPROBE")
    assert reason is not None and reason.startswith(expected)


def test_a_part_hook_that_raises_makes_the_device_unavailable(registered) -> None:
    def renderer(device: str) -> Any:
        if device == "PARTBOOM":
            raise SystemExit("renderer gone")
        return None

    plugin = device_plugin("partboom", "PARTBOOM")
    plugin.tg_renderer = plugin_module("x", tg_renderer=renderer).tg_renderer
    registered(plugin)
    assert Device.status("PARTBOOM") == "its tg_renderer hook raised SystemExit: renderer gone"


def test_python_m_tgcore_devices_and_the_first_tensor_do_not_wait_for_a_hung_probe(tmp_path) -> None:
    install_fake(tmp_path, "hang", device="HANG", priority=50, probe="time.sleep(600)\nreturn None")
    out = run_python(tmp_path, ["-m", "tgcore", "devices"], "hang", TGCORE_PROBE_TIMEOUT="1")
    assert out.returncode == 0, out.stderr
    assert "HANG       hang               50  unavailable: probe timed out: no answer within 1 s" in out.stdout
    assert "default device: PYTHON" in out.stdout
    code = "from tgcore import Tensor; print(Tensor([1.0, 2.0]).mul(3).tolist(), Tensor([1.0]).device)"
    out = run_python(tmp_path, ["-c", code], "hang", TGCORE_PROBE_TIMEOUT="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[3.0,", "6.0]", "PYTHON"]
    assert "DeviceFallbackWarning" in out.stderr and "HANG (priority 50): probe timed out" in out.stderr


# ***** plugin code that raises anything *****


def _exits() -> Any:
    raise SystemExit(3)


def test_an_entry_point_that_raises_system_exit_is_recorded_and_the_others_load(monkeypatch) -> None:
    good = FakeEntryPoint("good", lambda: device_plugin("good", "GOOD"))
    pm = manager_with(monkeypatch, [FakeEntryPoint("aexit", _exits), good])
    assert pm.loaded
    assert pm.records["aexit"].error == "failed to import fake_aexit: SystemExit: 3"
    assert pm.records["good"].error is None and "GOOD" in pm.registry.specs


def test_keyboard_interrupt_at_import_reaches_the_user_and_the_next_use_loads_everything(monkeypatch) -> None:
    calls: list[int] = []

    def interrupted_once() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return device_plugin("ctrlc", "CTRLC")

    eps = [FakeEntryPoint("ctrlc", interrupted_once), FakeEntryPoint("zgood", lambda: device_plugin("zgood", "ZGOOD"))]
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: eps if group == "tgcore" else [])
    pm = PluginManager()
    with pytest.raises(KeyboardInterrupt):
        pm.load()
    assert not pm.loaded
    pm.load()
    assert pm.loaded and {"CTRLC", "ZGOOD", "PYTHON"} <= set(pm.registry.specs)
    assert all(r.error is None for r in pm.records.values())


def test_register_devices_or_a_contract_break_that_raises_anything_is_recorded(registered) -> None:
    def exits(registry: Any) -> None:
        raise SystemExit("plugin wants out")

    record = registered(plugin_module("regexit", tg_register_devices=exits))
    assert record.error == "tg_register_devices raised SystemExit: plugin wants out"
    record = registered(plugin_module("notspec", tg_register_devices=lambda registry: registry.add("MYDEV")))
    assert record.error is not None and "expects a tgcore.plugin.DeviceSpec, got str" in record.error
    record = registered(plugin_module("badhook", tg_renderer=lambda device, colour: None))
    assert record.error is not None and record.error.startswith("breaks the plugin contract")
    np.testing.assert_allclose((Tensor([1.0, 2.0], device="PYTHON") + 1).numpy(), [2.0, 3.0])


def test_a_plugin_that_exits_at_import_does_not_end_the_program_nor_move_tensors(tmp_path) -> None:
    install_fake(tmp_path, "aexit", device="EXITDEV", prelude="raise SystemExit(3)")
    install_fake(tmp_path, "fast", device="FAST", priority=50)
    code = (
        "from tgcore import Tensor\nfrom tgcore.registry import plugins\n"
        "t = Tensor([1.0, 2.0]) + 1\nprint(t.device, t.tolist())\nprint(plugins.records['aexit'].error)\n"
    )
    out = run_python(tmp_path, ["-c", code], "aexit,fast")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["FAST [2.0, 3.0]", "failed to import tgfake_aexit: SystemExit: 3"]
    out = run_python(tmp_path, ["-m", "tgcore", "devices"], "aexit,fast")
    assert out.returncode == 0, out.stderr
    assert "failed (failed to import tgfake_aexit: SystemExit: 3)" in out.stdout
    assert "default device: FAST" in out.stdout


# ***** two plugins that register one device name *****


def _claims(pm: PluginManager, device: str) -> dict[str, Optional[str]]:
    return {r.plugin: r.refused for r in pm.registry.claims(device)}


def test_between_equal_priorities_the_shipped_plugin_wins_over_one_that_sorts_first(monkeypatch) -> None:
    eps = [
        FakeEntryPoint("aimpostor", lambda: device_plugin("aimpostor", "DUP", priority=10), dist="not-ours"),
        FakeEntryPoint("real", lambda: device_plugin("real", "DUP", priority=10), dist="tg-clang"),
    ]
    with pytest.warns(PluginWarning, match="device DUP is registered by two plugins, 'real' and 'aimpostor'"):
        pm = manager_with(monkeypatch, eps)
    assert pm.registry.owner["DUP"] == "real"
    claims = _claims(pm, "DUP")
    assert claims["real"] is None
    assert claims["aimpostor"] == "shadowed by plugin 'real', which also registers DUP ('real' ships with tgcore)"
    assert pm.part("tg_renderer", "DUP").tag == "real"  # the shadowed plugin's parts are not asked
    assert pm.records["aimpostor"].devices == ["DUP"] and pm.records["aimpostor"].error is None


def test_the_higher_priority_wins_then_the_first_by_entry_point_name(monkeypatch) -> None:
    eps = [
        FakeEntryPoint("aa", lambda: device_plugin("aa", "DUP", priority=5)),
        FakeEntryPoint("bb", lambda: device_plugin("bb", "DUP", priority=20)),
        FakeEntryPoint("cc", lambda: device_plugin("cc", "TIE", priority=1)),
        FakeEntryPoint("dd", lambda: device_plugin("dd", "TIE", priority=1)),
    ]
    with pytest.warns(PluginWarning) as record:
        pm = manager_with(monkeypatch, eps)
    assert pm.registry.owner["DUP"] == "bb" and pm.part("tg_renderer", "DUP").tag == "bb"
    assert (
        _claims(pm, "DUP")["aa"]
        == "shadowed by plugin 'bb', which also registers DUP (it has the higher priority (20 > 5))"
    )
    assert pm.registry.owner["TIE"] == "cc" and pm.part("tg_renderer", "TIE").tag == "cc"
    assert _claims(pm, "TIE")["dd"] == "shadowed by plugin 'cc', which also registers TIE (it was registered first)"
    messages = [str(w.message) for w in record]
    assert any("'bb' and 'aa'" in m and "set TGCORE_DISABLE_PLUGINS=bb" in m for m in messages)
    assert any("'cc' and 'dd'" in m for m in messages)


def test_the_user_picks_with_tgcore_plugins_or_tgcore_disable_plugins(monkeypatch) -> None:
    eps = [
        FakeEntryPoint("high", lambda: device_plugin("high", "DUP", priority=20), dist="tg-clang"),
        FakeEntryPoint("low", lambda: device_plugin("low", "DUP", priority=1)),
    ]
    monkeypatch.setenv("TGCORE_PLUGINS", "low,high")
    with pytest.warns(PluginWarning, match="TGCORE_PLUGINS names 'low' first"):
        pm = manager_with(monkeypatch, eps)
    assert pm.registry.owner["DUP"] == "low" and pm.part("tg_renderer", "DUP").tag == "low"
    monkeypatch.delenv("TGCORE_PLUGINS")
    monkeypatch.setenv("TGCORE_DISABLE_PLUGINS", "high")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)  # one claim: nothing to warn about
        pm = manager_with(monkeypatch, eps)
    assert pm.registry.owner["DUP"] == "low" and _claims(pm, "DUP") == {"low": None}


def test_a_second_distribution_with_a_taken_entry_point_name_is_listed_not_dropped(monkeypatch) -> None:
    eps = [
        FakeEntryPoint("same", lambda: device_plugin("same", "SAME1"), dist="dist-one"),
        FakeEntryPoint("same", lambda: device_plugin("same", "SAME2"), dist="dist-two"),
    ]
    pm = manager_with(monkeypatch, eps)
    assert pm.records["same"].error is None and "SAME1" in pm.registry.specs and "SAME2" not in pm.registry.specs
    error = pm.records["same (dist-two)"].error
    assert error is not None and "the plugin name 'same' is taken by entry point fake_same of dist-one" in error


def test_a_refused_claim_does_not_take_a_valid_one_down(monkeypatch) -> None:
    eps = [
        FakeEntryPoint("aold", lambda: device_plugin("aold", "DUP", api_version=(PLUGIN_API_VERSION[0] + 7, 0))),
        FakeEntryPoint("new", lambda: device_plugin("new", "DUP")),
    ]
    pm = manager_with(monkeypatch, eps)
    assert pm.registry.owner["DUP"] == "new" and "DUP" not in pm.registry.rejected
    assert f"is built for tgcore plugin API {PLUGIN_API_VERSION[0] + 7}.0" in str(_claims(pm, "DUP")["aold"])
    assert pm.part("tg_renderer", "DUP").tag == "new"


def test_unregistering_the_winner_gives_the_device_to_the_shadowed_plugin(registered) -> None:
    registered(device_plugin("first", "TAKEN", priority=3))
    with pytest.warns(PluginWarning, match="'second' is used"):
        registered(device_plugin("second", "TAKEN", priority=4))
    assert Device["TAKEN"].renderer.tag == "second"
    plugins.unregister("second")
    assert plugins.registry.owner["TAKEN"] == "first" and Device["TAKEN"].renderer.tag == "first"


def test_a_plugin_that_registers_a_built_in_name_is_shadowed_by_it(registered) -> None:
    with pytest.warns(
        PluginWarning, match="'python' is used \\('python' ships with tgcore\\); a built-in device gives"
    ):
        registered(device_plugin("mypython", "PYTHON", priority=0))
    assert plugins.registry.owner["PYTHON"] == "python"
    assert not isinstance(Device["PYTHON"].renderer, TaggedRenderer)  # the built-in's parts, not the impostor's
    np.testing.assert_allclose((Tensor([1.0, 2.0], device="PYTHON") * 2).numpy(), [2.0, 4.0])


def test_an_unavailable_device_names_the_plugins_it_shadows(registered) -> None:
    registered(device_plugin("other", "TAKEN2", priority=1))
    with pytest.warns(PluginWarning):
        registered(device_plugin("winner", "TAKEN2", priority=9, probe=lambda: "no hardware"))
    reason = Device.status("TAKEN2")
    assert reason is not None and reason.startswith(
        "no hardware (device TAKEN2 of plugin 'winner'; 'other' also registers TAKEN2, shadowed by it: to use 'other'"
    )
    with pytest.raises(DeviceUnavailable, match="TGCORE_DISABLE_PLUGINS=winner"):
        Device["TAKEN2"]


def test_python_m_tgcore_devices_lists_both_claims(tmp_path) -> None:
    install_fake(tmp_path, "aimpostor", device="DUP", priority=10)
    install_fake(tmp_path, "real", device="DUP", priority=30)
    out = run_python(tmp_path, ["-m", "tgcore", "devices"], "real,aimpostor")  # (which picks 'real' by name, too)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("DUP ")]
    assert rows == [
        "DUP        real               30  available",
        "DUP        aimpostor          10  unavailable: shadowed by plugin 'real', which also registers DUP "
        "(TGCORE_PLUGINS names 'real' first)",
    ]
    assert "note: device DUP is registered by two plugins, 'real' and 'aimpostor'" in out.stdout
    assert "PluginWarning" in out.stderr and "default device: DUP" in out.stdout
    out = run_python(tmp_path, ["-m", "tgcore", "devices"], "aimpostor,real")
    rows = [line for line in out.stdout.splitlines() if line.startswith("DUP ")]
    assert out.returncode == 0 and rows[0] == "DUP        aimpostor          10  available"
    assert rows[1].startswith("DUP        real               30  unavailable: shadowed by plugin 'aimpostor'")


# ***** no silent fall-back *****


@pytest.fixture
def default_by_priority(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """DEVICE unset (the unit tests' conftest sets it), so DEFAULT is chosen by priority; PYTHON again afterwards."""
    monkeypatch.delenv("DEVICE")
    yield
    Device.DEFAULT = "PYTHON"


def test_the_first_default_use_warns_once_when_a_higher_priority_device_is_unavailable(
    default_by_priority, registered
) -> None:
    registered(device_plugin("brokencc", "BROKENCC", priority=10_000, probe=lambda: "CC='gcc -o x' cannot build"))
    with pytest.warns(DeviceFallbackWarning) as record:
        default = Device.DEFAULT
    assert default != "BROKENCC" and default in Device.available()
    [message] = [str(w.message) for w in record]
    assert "BROKENCC (priority 10000): CC='gcc -o x' cannot build" in message
    assert f"New tensors go to {default} " in message and f"set DEVICE={default}" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceFallbackWarning)
        assert Tensor([1.0]).device == default  # once: not again for later uses
        plugins.register(plugin_module("unrelated"))  # (which makes DEFAULT be chosen again)
        assert Device.DEFAULT == default
    plugins.unregister("unrelated")


def test_a_chosen_default_device_does_not_warn(monkeypatch, registered) -> None:
    registered(device_plugin("brokenhw", "BROKENHW", priority=10_000, probe=lambda: "no hardware"))
    monkeypatch.setenv("DEVICE", "PYTHON")
    Device._reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceFallbackWarning)
        assert Device.DEFAULT == "PYTHON"


def test_no_device_available_says_why_of_each(default_by_priority, monkeypatch) -> None:
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: [])
    pm = PluginManager()
    pm.load()
    pm.registry.specs["PYTHON"].probe = lambda: "interpreter switched off"  # (a spec of this manager's own)
    monkeypatch.setattr(plugins, "registry", pm.registry)  # PYTHON (and DISK) only
    Device._reset()
    try:
        with pytest.raises(DeviceUnavailable, match=r"no device is available \(PYTHON: interpreter switched off\)"):
            Device.DEFAULT
    finally:
        monkeypatch.undo()
        Device._reset()  # (forgets the statuses learnt from that registry)


def test_a_subprocess_warns_on_stderr_when_its_best_device_is_broken(tmp_path) -> None:
    install_fake(tmp_path, "best", device="BEST", priority=50, probe="return os.environ.get('BEST_BROKEN')")
    code = "from tgcore import Tensor; print(Tensor([1.0, 2.0]).sum().item(), Tensor([1.0]).device)"
    out = run_python(tmp_path, ["-c", code], "best", BEST_BROKEN="CC='gcc -o x' builds no shared object")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3.0", "PYTHON"]
    assert out.stderr.count("DeviceFallbackWarning") == 1
    assert "<string>:1: DeviceFallbackWarning" in out.stderr  # (shown at the user's line, not the core's)
    assert "BEST (priority 50): CC='gcc -o x' builds no shared object" in out.stderr
    out = run_python(tmp_path, ["-c", code], "best")
    assert out.returncode == 0 and out.stdout.split() == ["3.0", "BEST"] and "Warning" not in out.stderr


# ***** first use from several threads at once *****


def test_threads_asking_a_new_device_at_once_probe_and_open_it_once(registered) -> None:
    probes, allocators, lock = [], [], threading.Lock()

    def probe() -> Optional[str]:
        with lock:
            probes.append(1)
        time.sleep(0.005)  # (slow parts widen the window in which a second thread could start a second probe)
        return None

    plugin = device_plugin("shared", "SHARED", probe=probe)

    def allocator(device: str) -> Any:
        if device != "SHARED":
            return None
        with lock:
            allocators.append(1)
        time.sleep(0.005)
        return MallocAllocator()

    plugin.tg_allocator = plugin_module("x", tg_allocator=allocator).tg_allocator
    for round in range(20):
        registered(plugin)  # (again: a fresh device, never probed nor opened)
        probes.clear(), allocators.clear()
        start, seen = threading.Barrier(4), []

        def use() -> None:
            start.wait()
            seen.append((Device.status("SHARED"), Device["SHARED"], Device["shared"]))

        threads = [threading.Thread(target=use) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SUBPROCESS_TIMEOUT_S)
        assert len(seen) == 4 and all(s[0] is None and s[1] is seen[0][1] and s[2] is seen[0][1] for s in seen)
        assert len(probes) == 1, f"round {round}: {len(probes)} probes"
        assert len(allocators) == 2, f"round {round}: {len(allocators)} allocators (one from the status check)"


THREADS_SCRIPT = """
import json, threading
import numpy as np
from tgcore import Device, Tensor
from tgcore.registry import plugins

results = []
for round in range({rounds}):
    if round:
        plugins.reset()  # discovery, probes and DEFAULT all start over
    start, answers = threading.Barrier(4), [None] * 4

    def first_use(i):
        start.wait()
        try:
            default = Device.DEFAULT
            x = Tensor([1.0, 2.0, 3.0]) * (i + 1)
            y = (x + Tensor.ones(3)).sum()
            answers[i] = [default, x.device, y.device, y.item(), Device[default].name]
        except Exception as e:
            answers[i] = repr(e)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.append(answers)
print(json.dumps(results))
"""


@pytest.mark.parametrize("process", range(3))
def test_first_use_from_four_threads_at_once_gets_the_default_device_and_the_right_numbers(tmp_path, process) -> None:
    # a slow probe and a slow import widen the window in which a thread could see discovery half done
    install_fake(tmp_path, "fast", device="FAST", priority=50, probe="time.sleep(0.02)\nreturn None")
    install_fake(tmp_path, "aslowimport", device="SLOWIMP", priority=-1, prelude="time.sleep(0.02)")
    rounds = 15
    out = run_python(tmp_path, ["-c", THREADS_SCRIPT.format(rounds=rounds)], "fast,aslowimport")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    expected = [["FAST", "FAST", "FAST", 6.0 * (i + 1) + 3.0, "FAST"] for i in range(4)]
    bad = [(r, answers) for r, answers in enumerate(results) if answers != expected]
    assert len(results) == rounds and not bad, f"rounds that went wrong: {bad[:3]}"
