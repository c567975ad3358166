"""The contract's rules: which plugin API versions load, the render check of a new device, the declared optional
abilities, and the helpers plugins share (tgcore/plugin.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.codegen.uops import UOps
from tgcore.device import Device, DeviceUnavailable
from tgcore.dtype import dtypes
from tgcore.ops import UnaryOps
from tgcore.plugin import (
    PLUGIN_API_VERSION,
    Allocator,
    DeviceSpec,
    InstanceCache,
    MallocAllocator,
    Program,
    instance_index,
    numpy_dtype,
    part_for,
    plugin_module,
    vector_register_bytes,
    vector_widths,
    version_refusal,
)
from tgcore.runtime.python import PythonCompiler, PythonProgram, PythonRenderer

MAJOR, MINOR = PLUGIN_API_VERSION


def device_plugin(name: str, device: str, api_version: Any = PLUGIN_API_VERSION, renderer: Any = PythonRenderer) -> Any:
    """A plugin that provides `device` with the PYTHON device's parts (and the given renderer class)."""

    def register(registry: Any) -> None:
        registry.add(DeviceSpec(device, api_version, priority=-5, description=f"{name}'s test device"))

    return plugin_module(
        name,
        tg_register_devices=register,
        tg_renderer=part_for(device, renderer),
        tg_compiler=part_for(device, PythonCompiler),
        tg_allocator=part_for(device, MallocAllocator),
        tg_runtime=part_for(device, lambda: PythonProgram),
    )



# ***** versions *****


def test_the_served_version_is_major_minor():
    assert PLUGIN_API_VERSION == (2, 3)


@pytest.mark.parametrize("built", [(MAJOR, MINOR), (MAJOR, 0)])
def test_same_major_and_an_older_or_equal_minor_loads(registered, built):
    assert version_refusal("p", built) is None
    registered(device_plugin("samemajor", "SAMEMAJOR", api_version=built))
    assert Device.status("SAMEMAJOR") is None
    np.testing.assert_allclose((Tensor([1.0, 2.0], device="samemajor") * 3).numpy(), [3.0, 6.0])


def test_an_older_minor_loads_on_a_newer_core():
    assert version_refusal("p", (2, 0), served=(2, 3)) is None
    assert version_refusal("p", (2, 3), served=(2, 3)) is None


@pytest.mark.parametrize(
    "built, words",
    [
        ((MAJOR, MINOR + 1), ["newer minor", "upgrade tgcore"]),
        ((MAJOR + 1, 0), ["newer major", "upgrade tgcore"]),
        ((MAJOR - 1, 0), ["older major", f"built for API {MAJOR}.x"]),
        (1, ["not a plugin API version", f"api_version={PLUGIN_API_VERSION!r}"]),
        ((MAJOR,), ["not a plugin API version"]),
        ("2.0", ["not a plugin API version"]),
    ],
)
def test_any_other_version_is_refused_naming_plugin_versions_and_fix(registered, built, words):
    registered(device_plugin("otherversion", "OTHERVERSION", api_version=built))
    reason = Device.status("OTHERVERSION")
    assert reason is not None
    built_text = f"{built[0]}.{built[1]}" if isinstance(built, tuple) and len(built) == 2 else repr(built)
    assert "'otherversion'" in reason and f"API {built_text}" in reason and f"API {MAJOR}.{MINOR}" in reason
    for word in words:
        assert word in reason
    with pytest.raises(DeviceUnavailable, match="OTHERVERSION"):
        Device["OTHERVERSION"]
    assert "OTHERVERSION" not in Device.available()


def test_a_newer_minor_is_refused_even_on_an_older_core():
    reason = version_refusal("p", (2, 1), served=(2, 0))
    assert reason is not None and "API 2.1" in reason and "API 2.0" in reason


# ***** the render check *****


class NoSinRenderer(PythonRenderer):
    """Renders everything but SIN."""

    def render(self, name: str, uops: list[Any]) -> str:
        for u in uops:
            if u.op is UOps.ALU and u.arg is UnaryOps.SIN:
                raise NotImplementedError("NOSIN cannot render SIN")
        return super().render(name, uops)


class EmptyRenderer(PythonRenderer):
    def render(self, name: str, uops: list[Any]) -> str:
        return ""


def test_a_renderer_that_refuses_sin_makes_its_device_unavailable(registered):
    registered(device_plugin("nosin", "NOSIN", renderer=NoSinRenderer))
    reason = Device.status("NOSIN")
    assert reason is not None
    assert "NoSinRenderer cannot render a kernel of basic ops" in reason and "NOSIN cannot render SIN" in reason
    assert "NOSIN" not in Device.available()
    with pytest.raises(DeviceUnavailable, match="cannot render SIN"):
        Tensor([1.0], device="NOSIN")


def test_a_renderer_that_renders_nothing_makes_its_device_unavailable(registered):
    registered(device_plugin("emptyrender", "EMPTYRENDER", renderer=EmptyRenderer))
    reason = Device.status("EMPTYRENDER")
    assert reason is not None and "EmptyRenderer rendered ''" in reason


def test_the_render_check_renders_every_basic_op():
    from tgcore.codegen.program import basic_ops_kernel, to_program

    uops = to_program(basic_ops_kernel(PythonRenderer())).uops
    alus = {u.arg for u in uops if u.op is UOps.ALU}
    assert {UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN} <= alus
    assert {UOps.LOAD, UOps.STORE} <= {u.op for u in uops}


# ***** declared optional abilities *****


def test_optional_abilities_are_declared_off_and_on_by_override():
    class Plain(Allocator):
        def _alloc(self, size: int, options: Any) -> bytearray:
            return bytearray(size)

    class Views(Plain):
        def offset(self, buf: Any, size: int, offset: int) -> Any:
            return memoryview(buf)[offset : offset + size]

    class NoViews(Views):
        supports_offset = False

    assert not any((Plain.supports_offset, Plain.supports_transfer, Plain.supports_as_buffer))
    assert not Plain.supports_synchronize
    assert Views.supports_offset and not Views.supports_transfer and not NoViews.supports_offset
    assert MallocAllocator.supports_offset and MallocAllocator.supports_as_buffer
    assert not MallocAllocator.supports_transfer
    with pytest.raises(NotImplementedError, match="supports_transfer is False"):
        Plain().transfer(None, None, 0, None, None)


def test_program_base_documents_and_refuses_an_unimplemented_call():
    prog = Program("MYDEV:1", "k", b"lib")
    assert (prog.device, prog.name, prog.lib) == ("MYDEV:1", "k", b"lib")
    with pytest.raises(NotImplementedError, match="Program does not implement __call__"):
        prog(wait=True)
    assert issubclass(PythonProgram, Program)


# ***** helpers *****


def test_part_for_answers_only_for_its_device():
    plain = part_for("MYDEV", PythonCompiler)
    per_instance = part_for("MYDEV", lambda instance: instance, per_instance=True)
    assert isinstance(plain("MYDEV", "MYDEV"), PythonCompiler) and plain("OTHER", "OTHER") is None
    assert per_instance("MYDEV", "MYDEV:3") == "MYDEV:3" and per_instance("OTHER", "OTHER:1") is None
    assert plain.tgcore_impl is not None  # (marked as a hookimpl)


def test_instance_cache_makes_one_object_per_instance_across_threads():
    made: list[str] = []
    lock = threading.Lock()

    def make(instance: str) -> object:
        with lock:
            made.append(instance)
        return object()

    cache = InstanceCache(make)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(cache("MYDEV"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(r is results[0] for r in results)
    assert cache("MYDEV:0") is results[0] and cache("MYDEV:1") is not results[0]
    assert made == ["MYDEV", "MYDEV:1"]


def test_instance_index():
    assert [instance_index(n) for n in ("MYDEV", "MYDEV:0", "MYDEV:12")] == [0, 0, 12]
    with pytest.raises(ValueError, match="expected NAME or NAME:N"):
        instance_index("MYDEV:x")


def test_vector_helpers():
    assert [vector_register_bytes(f) for f in ({"avx512f", "avx"}, {"avx", "sse2"}, {"neon"})] == [64, 32, 16]
    widths = vector_widths(32, [dtypes.float32, dtypes.float64, dtypes.bool, dtypes.int8])
    assert widths == {dtypes.float32: 8, dtypes.float64: 4, dtypes.int8: 32}


def test_numpy_dtype():
    assert numpy_dtype(dtypes.float32) == np.float32 and numpy_dtype(dtypes.int64) == np.int64
    assert numpy_dtype(dtypes.bfloat16) == np.float32


# ***** the optional Collective (2.1) *****


def test_a_device_without_a_collective_hook_has_none(registered):
    registered(device_plugin("nocoll", "NOCOLL"))
    assert Device["NOCOLL"].collective is None


def test_host_collective_views_host_memory_in_place(registered):
    from tgcore.plugin import HostCollective

    plugin = device_plugin("hostcoll", "HOSTCOLL")
    plugin.tg_collective = part_for("HOSTCOLL", HostCollective)
    registered(plugin)
    dev = Device["HOSTCOLL"]
    assert isinstance(dev.collective, HostCollective) and dev.collective is dev.collective  # (asked once)
    t = Tensor(np.arange(5, dtype=np.float32), device="HOSTCOLL").realize()
    buf = t.lazydata.base.realized
    mem = dev.collective.mpi_buffer(dev.allocator, buf._opaque, buf.nbytes)
    assert isinstance(mem, memoryview) and mem.nbytes == 20 and not mem.readonly
    np.frombuffer(mem, np.float32)[:] *= 2  # what MPI writes lands in the tensor's own memory
    assert t.numpy().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert HostCollective().mpi_buffer(Allocator(), object(), 20) is None  # (no zero-copy view: copy instead)


def test_a_collective_hook_answering_something_else_is_refused(registered):
    plugin = device_plugin("badcoll", "BADCOLL")
    plugin.tg_collective = part_for("BADCOLL", lambda: "not a collective")
    registered(plugin)
    with pytest.raises(TypeError, match="tg_collective hook for device BADCOLL returned a str"):
        Device["BADCOLL"].collective


def test_a_copy_by_transfer_gets_both_buffers_allocated(monkeypatch):
    # a view made for the copy (an output read back at its real size) has no memory until it is allocated: the
    # allocator's transfer gets both buffers' memory, never None
    import ctypes

    from tgcore.device import Buffer
    from tgcore.engine.runner import BufferCopy

    allocator = Device["PYTHON"].allocator
    seen = []

    def transfer(dest, src, size, src_dev=None, dest_dev=None):
        seen.append((dest, src))
        assert dest is not None and src is not None, "transfer got a buffer without memory"
        ctypes.memmove(dest, src, size)

    monkeypatch.setattr(type(allocator), "supports_transfer", True)
    monkeypatch.setattr(allocator, "transfer", transfer)
    src = Buffer("PYTHON", 8, dtypes.float32).copyin(memoryview(np.arange(8, dtype=np.float32).tobytes()))
    dest = Buffer("PYTHON", 3, dtypes.float32)
    BufferCopy()([dest, src.view(3, dtypes.float32, 8)], {})
    assert len(seen) == 1
    np.testing.assert_array_equal(np.frombuffer(dest.as_buffer(), np.float32), [2.0, 3.0, 4.0])
