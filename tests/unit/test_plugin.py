"""The plugin contract: discovery, isolation, environment controls, direct registration, selection."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from importlib import metadata
from typing import Any, Optional

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.device import Device, DeviceUnavailable
from tgcore.plugin import PLUGIN_API_VERSION, DeviceSpec, MallocAllocator, plugin_module
from tgcore.registry import PluginManager, plugins
from tgcore.runtime.python import PythonCompiler, PythonProgram, PythonRenderer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def fake_device_plugin(
    name: str,
    device: str,
    probe: Optional[str] = None,
    api_version: Any = PLUGIN_API_VERSION,
    parts: tuple[str, ...] = ("renderer", "compiler", "allocator", "runtime"),
) -> Any:
    """A plugin that provides `device` by reusing the PYTHON device's parts."""
    makers = {
        "renderer": PythonRenderer,
        "compiler": PythonCompiler,
        "allocator": MallocAllocator,
        "runtime": lambda: PythonProgram,
    }

    def register(registry: Any) -> None:
        registry.add(DeviceSpec(device, api_version, priority=-5, probe=lambda: probe))

    hooks: dict[str, Any] = {"tg_register_devices": register}
    for part in parts:

        def answer(device: str, _part: str = part, _dev: str = device) -> Any:
            return makers[_part]() if device == _dev else None

        hooks[f"tg_{part}"] = answer
    return plugin_module(name, **hooks)



def test_builtin_python_device_is_registered_through_hooks():
    plugins.load()
    assert plugins.records["python"].source == "builtin"
    assert "PYTHON" in plugins.records["python"].devices
    assert Device.status("PYTHON") is None
    assert Device["python"].name == "PYTHON"


def test_directly_registered_plugin_runs_tensors(registered):
    registered(fake_device_plugin("fakeplug", "FAKE"))
    assert Device.status("FAKE") is None
    x = Tensor([1.0, 2.0, 3.0], device="fake")
    np.testing.assert_allclose((x * 2 + 1).sum().numpy(), 15.0)
    assert x.device == "FAKE"


def test_register_devices_that_raises_is_recorded_and_others_still_work(registered):
    def boom(registry: Any) -> None:
        raise RuntimeError("kaboom")

    record = registered(plugin_module("broken", tg_register_devices=boom))
    assert record.error is not None and "kaboom" in record.error
    np.testing.assert_allclose((Tensor([1.0, 2.0], device="PYTHON") + 1).numpy(), [2.0, 3.0])


def test_api_version_mismatch_names_plugin_versions_and_fix(registered):
    major, minor = PLUGIN_API_VERSION
    registered(fake_device_plugin("oldplug", "OLDDEV", api_version=(major + 41, 0)))
    reason = Device.status("OLDDEV")
    assert reason is not None
    assert "oldplug" in reason and f"API {major}.{minor}" in reason and f"API {major + 41}.0" in reason
    assert "upgrade tgcore" in reason
    with pytest.raises(DeviceUnavailable, match="OLDDEV"):
        Device["OLDDEV"]


def test_failing_probe_makes_device_unavailable_with_reason(registered):
    registered(fake_device_plugin("nohw", "NOHW", probe="no such hardware here"))
    assert Device.status("NOHW") == "no such hardware here"
    assert "NOHW" not in Device.available()
    with pytest.raises(DeviceUnavailable, match="no such hardware here"):
        Tensor([1.0], device="NOHW")


def test_device_missing_a_part_says_which(registered):
    registered(fake_device_plugin("partial", "PARTIAL", parts=("renderer",)))
    reason = Device.status("PARTIAL")
    assert reason is not None and "compiler" in reason and "allocator" in reason and "runtime" in reason
    assert "renderer" not in reason


def test_tryfirst_plugin_overrides_one_part(registered):
    class CountingAllocator(MallocAllocator):
        allocs = 0

        def _alloc(self, size: int, options: Any) -> Any:
            CountingAllocator.allocs += 1
            return super()._alloc(size, options)

    from tgcore.plugin import hookimpl

    class Override:
        __name__ = "override"

        @hookimpl(tryfirst=True)
        def tg_allocator(self, device: str) -> Any:
            return CountingAllocator() if device == "PYTHON" else None

    registered(Override())
    assert isinstance(Device["PYTHON"].allocator, CountingAllocator)
    (Tensor([1.0, 2.0], device="PYTHON") * 3).realize()
    assert CountingAllocator.allocs > 0


def test_unknown_device_lists_available_ones():
    reason = Device.status("NOPE")
    assert reason is not None and "NOPE" in reason and "PYTHON" in reason


class FakeEntryPoint:
    def __init__(self, name: str, loader: Any) -> None:
        self.name, self.value, self._loader, self.dist = name, f"fake_{name}", loader, None

    def load(self) -> Any:
        return self._loader()


def _manager_with(monkeypatch: pytest.MonkeyPatch, eps: list[FakeEntryPoint]) -> PluginManager:
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: eps if group == "tgcore" else [])
    pm = PluginManager()
    pm.load()
    return pm


def _raise_import() -> Any:
    raise ImportError("missing dependency libfoo")


def test_entry_point_that_fails_to_import_is_listed_with_its_error(monkeypatch):
    good = FakeEntryPoint("good", lambda: fake_device_plugin("good", "GOOD"))
    bad = FakeEntryPoint("bad", _raise_import)
    pm = _manager_with(monkeypatch, [bad, good])
    assert pm.records["bad"].error is not None and "libfoo" in pm.records["bad"].error
    assert pm.records["good"].error is None and "GOOD" in pm.registry.specs
    assert "PYTHON" in pm.registry.specs


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"TGCORE_PLUGINS": "one"}, {"one"}),
        ({"TGCORE_DISABLE_PLUGINS": "one"}, {"two"}),
        ({"TGCORE_PLUGIN_AUTOLOAD": "0"}, set()),
        ({}, {"one", "two"}),
    ],
)
def test_environment_controls(monkeypatch, env, expected):
    for k in ("TGCORE_PLUGINS", "TGCORE_DISABLE_PLUGINS", "TGCORE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    eps = [
        FakeEntryPoint("one", lambda: fake_device_plugin("one", "ONE")),
        FakeEntryPoint("two", lambda: fake_device_plugin("two", "TWO")),
    ]
    pm = _manager_with(monkeypatch, eps)
    assert set(pm.records) - {"python", "disk"} == expected  # the built-in devices are always there


def test_discovery_is_lazy():
    code = (
        "import tgcore, tgcore.plugin as p; assert not p.plugins.loaded; "
        "tgcore.Device['PYTHON']; assert p.plugins.loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_device_selection(monkeypatch, registered):
    registered(fake_device_plugin("selplug", "SEL"))
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.setenv("SEL", "1")
    assert Device.default_and_reason() == ("SEL", "set by SEL=1")
    monkeypatch.setenv("DEVICE", "python")
    assert Device.default_and_reason()[0] == "PYTHON"
    monkeypatch.delenv("DEVICE")
    monkeypatch.delenv("SEL")
    name, why = Device.default_and_reason()
    specs = Device.specs()
    assert name == max(Device.available(), key=lambda n: specs[n].priority) and "priority" in why


def test_canonicalize():
    assert Device.canonicalize("python") == "PYTHON"
    assert Device.canonicalize("python:0") == "PYTHON"
    assert Device.canonicalize("python:1") == "PYTHON:1"
    with pytest.raises(ValueError):
        Device.canonicalize("python:x")


def test_device_instances_are_separate():
    assert Device["PYTHON:1"] is not Device["PYTHON"]
    assert Device["PYTHON:1"].allocator is not Device["PYTHON"].allocator
    x = Tensor([1.0, 2.0], device="PYTHON")
    np.testing.assert_allclose(x.to("PYTHON:1").mul(2).to("PYTHON").numpy(), [2.0, 4.0])


def test_python_m_tgcore_devices_lists_status():
    env = {**os.environ, "TGCORE_PLUGIN_AUTOLOAD": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, check=True, env=env
    )
    assert re.search(r"PYTHON\s+python\s+\d+\s+available", out.stdout)
    assert "default device: PYTHON" in out.stdout


def test_core_names_no_plugin_device_and_imports_no_plugin():
    pattern = re.compile(r"[\"'](CLANG|LLVM|OPENCL|GPU|CUDA|METAL|HIP|AMD|NV)(:\d+)?[\"']")
    offenders = [
        f"{p}:{i}"
        for p in (ROOT / "tgcore").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
    imports = [p for p in (ROOT / "tgcore").rglob("*.py") if re.search(r"^\s*(from|import)\s+tg_", p.read_text(), re.M)]
    assert imports == []
    code = (
        "import sys, tgcore; tgcore.Tensor([1.0], device='PYTHON').numpy(); "
        "print([m for m in sys.modules if m.startswith('tg_')])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TGCORE_PLUGIN_AUTOLOAD": "0"},
    )
    assert out.stdout.strip() == "[]"


def test_instances_are_probed_and_parts_see_the_instance(registered):
    seen: list[str] = []

    def register(registry: Any) -> None:
        registry.add(
            DeviceSpec(
                "INST",
                PLUGIN_API_VERSION,
                probe=lambda instance="INST": (
                    None if instance in ("INST", "INST:1") else f"{instance}: this machine has two INST devices"
                ),
            )
        )

    def allocator(device: str, instance: str) -> Any:
        if device != "INST":
            return None
        seen.append(instance)
        return MallocAllocator()

    registered(
        plugin_module(
            "inst",
            tg_register_devices=register,
            tg_allocator=allocator,
            tg_renderer=lambda device: PythonRenderer() if device == "INST" else None,
            tg_compiler=lambda device: PythonCompiler() if device == "INST" else None,
            tg_runtime=lambda device: PythonProgram if device == "INST" else None,
        )
    )
    assert Device.status("INST:1") is None
    assert Device.status("INST:2") == "INST:2: this machine has two INST devices"
    with pytest.raises(DeviceUnavailable, match="two INST devices"):
        Device["INST:2"]
    Device["INST"], Device["INST:1"]
    assert seen[-2:] == ["INST", "INST:1"] and "INST:2" not in seen


def test_host_buffers_start_on_a_cache_line_and_keep_their_contents() -> None:
    import ctypes

    from tgcore.plugin import _COLOR_STEP, _COLORS, _HUGE_PAGES, ALIGNMENT, HUGE_PAGE

    allocator = MallocAllocator()
    for size in (1, 3, 64, 1000, 1 << 20, HUGE_PAGE, 3 * HUGE_PAGE + 5):
        buf = allocator.alloc(size)
        assert ctypes.addressof(buf) % ALIGNMENT == 0 and len(buf) == size
        assert not any(bytes(buf[:4096])) and not any(bytes(buf[-4096:]))  # fresh memory reads as zeros
        if size >= HUGE_PAGE and _HUGE_PAGES:  # a mapping of its own, a color's offset past a huge-page boundary
            offset = ctypes.addressof(buf) % HUGE_PAGE
            assert offset % _COLOR_STEP == 0 and offset < _COLORS * _COLOR_STEP
        data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        allocator.copyin(buf, memoryview(data))
        out = bytearray(size)
        allocator.copyout(memoryview(out), buf)
        assert bytes(out) == data
        if size > 8:  # a view at an offset reads the same memory
            assert bytes(allocator.offset(buf, 8, size - 8)) == data[-8:]
        allocator.free(buf, size)


def test_big_host_buffers_in_turn_start_at_different_cache_sets() -> None:
    """Buffers in huge pages that all started on a huge-page boundary would share their physical address bits up to
    2 MB, and a kernel streaming several at one index would read and write the same cache sets: each of _COLORS
    successive big buffers starts at its own offset from the boundary, and at its own offset within a 4 KB page."""
    import ctypes

    from tgcore.plugin import _COLORS, _HUGE_PAGES, HUGE_PAGE

    if not _HUGE_PAGES:
        pytest.skip("this OS has no huge-page mappings: big host buffers come from the C heap")
    allocator = MallocAllocator()
    bufs = [allocator.alloc(HUGE_PAGE + 4096 * i) for i in range(_COLORS)]  # (sizes the LRU cache cannot hand back)
    offsets = [ctypes.addressof(b) % HUGE_PAGE for b in bufs]
    assert len(set(offsets)) == _COLORS and len({o % 4096 for o in offsets}) == _COLORS
    for i, b in enumerate(bufs):  # each is its own memory, whole: writing one leaves the others as they were
        ctypes.memset(b, i + 1, len(b))
    assert [bytes(b[:1]) + bytes(b[-1:]) for b in bufs] == [bytes([i + 1]) * 2 for i in range(_COLORS)]
    for i, b in enumerate(bufs):
        allocator.free(b, HUGE_PAGE + 4096 * i)


def test_a_failed_host_mapping_tries_the_exact_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    from tgcore import plugin as device  # (the host allocator's module)

    if not device._HUGE_PAGES:
        pytest.skip("this OS has no huge-page mappings: big host buffers come from the C heap")
    real, calls = mmap.mmap, []

    def failing_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        if len(calls) == 1:
            raise OSError(12, "Cannot allocate memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(device.mmap, "mmap", failing_once)
    allocator = MallocAllocator()
    allocator.free(allocator.alloc(64), 64)  # a cached buffer, which the failure must release
    buf = allocator.alloc(device.HUGE_PAGE)
    # the aligned mapping (size + a huge page of slack) failed: the exact size is mapped instead, the cache kept
    assert len(calls) == 2 and calls[1][1] == device.HUGE_PAGE and len(buf) == device.HUGE_PAGE
