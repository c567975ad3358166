"""tg-metal: the plugin off macOS (unavailable with its reason, renderer still there), the Metal spellings on
hand-built and linearized kernels, the syntax check, the spellings' arithmetic run on this CPU against the
conformance suite's reference, and the macOS compiler, allocator and runtime against a fake pyobjc Metal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any, Iterator, Optional

import fake_metal as fake
import numpy as np
import pytest
import tg_metal
from cpu_emulation import EmulatedKernel, EmulatedLibrary
from tg_conformance import uop_cases
from tg_metal import context as metal_context
from tg_metal.allocator import MetalAllocator, MetalBuffer
from tg_metal.compiler import (
    LIBRARY,
    SOURCE,
    MetalCompiler,
    MetalLibrary,
    compile_options,
    pack_library,
    unpack_library,
)
from tg_metal.context import MetalUnavailable
from tg_metal.renderer import MetalRenderer
from tg_metal.runtime import MetalProgram, threads_per_threadgroup
from tg_metal.syntax import ENV_CHECK, ENV_CXX, MetalSyntaxError, check_syntax, find_cxx

from tgcore import Device, Tensor, dtypes
from tgcore import plugin as contract
from tgcore.codegen.kernel import Kernel
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps
from tgcore.device import DeviceUnavailable
from tgcore.dtype import DType, PtrDType
from tgcore.engine import realize
from tgcore.ops import BinaryOps, BufferOps, TernaryOps
from tgcore.plugin import CompileError, InstanceCache

DEV = "METAL"
ON_MACOS = sys.platform == "darwin"
CXX = find_cxx()
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ front end (clang++, g++, c++) on PATH")


def _front_ends() -> list[str]:
    """Every C++ front end here that tg-metal can use (g++ first: it builds the emulation fastest)."""
    names = [os.environ.get(ENV_CXX, ""), "g++", "clang++"]
    return [path for path in dict.fromkeys(shutil.which(n) for n in names if n) if path is not None]


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env={**os.environ, **env}
    )


def _global(dt: DType, index: int, writable: bool = False) -> UOp:
    return UOp(UOps.DEFINE_GLOBAL, PtrDType.of(dt), (), (index, f"data{index}", writable))


def _const(v: Any, dt: DType = dtypes.int32) -> UOp:
    return UOp(UOps.CONST, dt, (), v)


def _special(name: str, size: int, dim: int = 0) -> UOp:
    return UOp(UOps.SPECIAL, dtypes.int32, (), (dim, name, size))


def _elementwise(op: Any, dt: DType, n: int, result: Optional[DType] = None) -> list[UOp]:
    """out[i] = op(a[i], b[i]) over a grid of n."""
    out, a, b = _global(result or dt, 0, True), _global(dt, 1), _global(dt, 2)
    i = _special("gidx0", n)
    la, lb = UOp(UOps.LOAD, dt, (a, i)), UOp(UOps.LOAD, dt, (b, i))
    alu = UOp(UOps.ALU, result or dt, (la, lb), op)
    return [out, a, b, i, la, lb, alu, UOp(UOps.STORE, None, (out, i, alu))]


def _body(src: str) -> str:
    return src.split("#endif\n", 1)[1]


# ***** the plugin off macOS *****


@pytest.mark.skipif(ON_MACOS, reason="off macOS only")
def test_devices_lists_metal_unavailable_with_the_reason() -> None:
    proc = _run_python("from tgcore.__main__ import main; main(['devices'])")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("METAL "))
    assert "metal" in line and "40" in line and "unavailable: Metal needs macOS (this is Linux)" in line, line


def test_importing_the_plugin_imports_no_pyobjc() -> None:
    proc = _run_python(
        """
        import sys, tg_metal
        from tgcore import Device
        Device.status("METAL")
        tg_metal.tg_renderer("METAL", "METAL").render
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("Metal", "objc", "libdispatch", "Foundation")))
        """
    )
    expected = "[]" if not ON_MACOS else proc.stdout.strip()
    assert proc.returncode == 0 and proc.stdout.strip() == expected, proc.stderr


def test_device_spec() -> None:
    spec = Device.specs()[DEV]
    assert spec.priority == 40 and spec.api_version == tg_metal.API_VERSION == (2, 0)
    assert dtypes.float64 not in spec.dtypes and dtypes.int64 in spec.dtypes and dtypes.float16 in spec.dtypes
    assert not ON_MACOS or tg_metal._macos_major() >= 14 or dtypes.bfloat16 not in spec.dtypes
    assert all(dt in spec.tolerances for dt in spec.dtypes if dtypes.is_float(dt))


@pytest.mark.skipif(ON_MACOS, reason="off macOS only")
def test_off_macos_only_the_renderer_is_given() -> None:
    assert Device.status(DEV) == "Metal needs macOS (this is Linux)"
    assert tg_metal.probe() == "Metal needs macOS (this is Linux)"
    assert isinstance(tg_metal.tg_renderer(device="METAL", instance="METAL"), MetalRenderer)
    assert tg_metal.tg_renderer(device="OPENCL", instance="OPENCL") is None
    assert tg_metal.tg_compiler(device="METAL", instance="METAL") is None
    assert tg_metal.tg_allocator(device="METAL", instance="METAL:1") is None
    assert tg_metal.tg_runtime(device="METAL") is None
    with pytest.raises(DeviceUnavailable, match="Metal needs macOS"):
        Device[DEV]
    with pytest.raises(MetalUnavailable, match="needs macOS"):
        metal_context.import_metal()


def test_probe_on_a_mac_without_a_metal_device() -> None:
    with pytest.raises(MetalUnavailable, match="no Metal device"):
        metal_context.metal_devices(fake.metal_module(None))


# ***** the renderer *****


def test_signature_bindings_and_grid_indexing() -> None:
    out, a = _global(dtypes.float32, 0, True), _global(dtypes.float32, 1)
    n = UOp(UOps.DEFINE_VAR, dtypes.int32, (), ("n", 1, 10))
    i = _special("gidx0", 4)
    val = UOp(UOps.LOAD, dtypes.float32, (a, i))
    # a DEFINE_VAR before a DEFINE_GLOBAL still binds after every buffer, where the runtime puts the ints
    src = MetalRenderer().render("k", [out, n, a, i, val, UOp(UOps.STORE, None, (out, i, val))])
    assert src.startswith("#include <metal_stdlib>\nusing namespace metal;\n")
    signature = src.split("kernel void k(")[1].split(") {")[0]
    assert signature == (
        "device float* data0 [[buffer(0)]], const device float* data1 [[buffer(1)]], "
        "constant int& n [[buffer(2)]], uint3 gid [[thread_position_in_grid]]"
    )
    assert "int gidx0 = gid.x;" in src


def _workgroup_sum(n_groups: int, group: int) -> list[UOp]:
    """out[g] = sum of in[g*group : (g+1)*group], through threadgroup memory and a barrier."""
    out, inp = _global(dtypes.float32, 0, True), _global(dtypes.float32, 1)
    c_group, c_zero = _const(group), _const(0)
    gidx, lidx = _special("gidx0", n_groups), _special("lidx0", group)
    idx = UOp(
        UOps.ALU, dtypes.int32, (UOp(UOps.ALU, dtypes.int32, (gidx, c_group), BinaryOps.MUL), lidx), BinaryOps.ADD
    )
    val = UOp(UOps.LOAD, dtypes.float32, (inp, idx))
    temp = UOp(UOps.DEFINE_LOCAL, PtrDType.of(dtypes.float32), (), ("temp", group))
    first = UOp(UOps.ALU, dtypes.bool, (lidx, c_zero), BinaryOps.CMPEQ)
    gate = UOp(UOps.IF, None, (first,))
    acc = UOp(UOps.DEFINE_ACC, dtypes.float32, (), 0.0)
    loop = UOp(UOps.RANGE, dtypes.int32, (c_zero, c_group), (1, True))
    part = UOp(UOps.LOAD, dtypes.float32, (temp, loop))
    phi = UOp(UOps.PHI, dtypes.float32, (acc, UOp(UOps.ALU, dtypes.float32, (acc, part), BinaryOps.ADD)))
    return [
        out, inp, c_group, c_zero, gidx, lidx, idx.src[0], idx, val, temp,
        UOp(UOps.STORE, None, (temp, lidx, val)), UOp(UOps.BARRIER), first, gate, acc, loop, part, phi.src[1], phi,
        UOp(UOps.ENDRANGE, None, (loop,)), UOp(UOps.STORE, None, (out, gidx, acc)), UOp(UOps.ENDIF, None, (gate,)),
    ]  # fmt: skip


def test_threadgroup_memory_barrier_and_local_ids() -> None:
    r = MetalRenderer()
    src = r.render("wgsum", _workgroup_sum(3, 4))
    assert "threadgroup float temp[4];" in src and "threadgroup_barrier(mem_flags::mem_threadgroup);" in src
    assert "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]" in src
    assert "int lidx0 = lid.x;" in src and "[[thread_position_in_grid]]" not in src
    assert src.index("threadgroup float temp") < src.index("int gidx0")  # declared at the kernel's top
    # the renderer keeps no state between kernels: the next one is grid-indexed again
    assert "[[thread_position_in_grid]]" in r.render("k", _elementwise(BinaryOps.ADD, dtypes.float32, 4))


def test_no_float64() -> None:
    with pytest.raises(NotImplementedError, match="Metal has no float64"):
        MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.float64, 4))


def test_signed_arithmetic_wraps_but_index_arithmetic_stays_plain() -> None:
    src = MetalRenderer().render("k", _elementwise(BinaryOps.MUL, dtypes.int32, 4))
    assert "int alu0 = as_type<int>(as_type<uint>(val0)*as_type<uint>(val1));" in src
    assert "as_type<long>(as_type<ulong>(val0)-as_type<ulong>(val1))" in MetalRenderer().render(
        "k", _elementwise(BinaryOps.SUB, dtypes.int64, 4)
    )
    assert "((ushort)((uint)(val0)*(uint)(val1)))" in MetalRenderer().render(
        "k", _elementwise(BinaryOps.MUL, dtypes.uint16, 4)
    )
    src = MetalRenderer().render("wgsum", _workgroup_sum(3, 4))
    assert "int alu0 = (gidx0*4);" in src and "int alu1 = (alu0+lidx0);" in src


def test_half_and_bfloat_compute_in_float_and_mulacc_rounds_twice() -> None:
    out, a, b, c = (_global(dtypes.float16, i, i == 0) for i in range(4))
    i = _special("gidx0", 4)
    loads = [UOp(UOps.LOAD, dtypes.float16, (buf, i)) for buf in (a, b, c)]
    mac = UOp(UOps.ALU, dtypes.float16, tuple(loads), TernaryOps.MULACC)
    src = _body(MetalRenderer().render("k", [out, a, b, c, i, *loads, mac, UOp(UOps.STORE, None, (out, i, mac))]))
    assert "float alu0 = (cast0*cast1);\n  half cast2 = ((half)(alu0));" in src  # the product rounds to half
    assert "float alu1 = (cast3+cast4);\n  half cast5 = ((half)(alu1));" in src
    bf = _body(MetalRenderer().render("k", _elementwise(BinaryOps.CMPLT, dtypes.bfloat16, 4, dtypes.bool)))
    assert "bool alu0 = (cast0<cast1);" in bf and "float cast0 = ((float)(val0));" in bf
    x, y = _global(dtypes.int64, 1), _global(dtypes.bfloat16, 0, True)
    load = UOp(UOps.LOAD, dtypes.int64, (x, i))
    cast = UOp(UOps.CAST, dtypes.bfloat16, (load,))
    src = MetalRenderer().render("k", [y, x, i, load, cast, UOp(UOps.STORE, None, (y, i, cast))])
    assert "float cast0 = ((float)(val0));\n  bfloat cast1 = ((bfloat)(cast0));" in src  # through float


def test_constants_and_bitcast() -> None:
    out, a = _global(dtypes.int64, 0, True), _global(dtypes.uint64, 1)
    i = _special("gidx0", 2)
    load = UOp(UOps.LOAD, dtypes.uint64, (a, i))
    big = _const(2**64 - 1, dtypes.uint64)
    alu = UOp(UOps.ALU, dtypes.uint64, (load, big), BinaryOps.AND)
    bits = UOp(UOps.BITCAST, dtypes.int64, (alu,))
    least = _const(-(2**63), dtypes.int64)
    low = UOp(UOps.ALU, dtypes.int64, (bits, least), BinaryOps.MAX)
    uops = [out, a, big, least, i, load, alu, bits, low, UOp(UOps.STORE, None, (out, i, low))]
    src = MetalRenderer().render("k", uops)
    assert "18446744073709551615UL" in src and "((long)(-9223372036854775807L-1L))" in src
    assert "long bitcast0 = as_type<long>(alu0);" in src and "ll" not in _body(src)


def test_vector_types() -> None:
    f4, h4 = dtypes.float32.vec(4), dtypes.float16.vec(4)
    out, inp, hin = _global(f4, 0, True), _global(f4, 1), _global(h4, 2)
    i = _special("gidx0", 2)
    one = _const(1.5, f4)
    val, hval = UOp(UOps.LOAD, f4, (inp, i)), UOp(UOps.LOAD, h4, (hin, i))
    add = UOp(UOps.ALU, f4, (val, one), BinaryOps.ADD)
    hsum = UOp(UOps.ALU, h4, (hval, hval), BinaryOps.ADD)
    total = UOp(UOps.ALU, f4, (add, UOp(UOps.CAST, f4, (hsum,))), BinaryOps.MAX)
    uops = [out, inp, hin, one, i, val, hval, add, hsum, total.src[1], total, UOp(UOps.STORE, None, (out, i, total))]
    src = MetalRenderer().render("vectors", uops)
    assert "device float4* data0 [[buffer(0)]]" in src and "const device half4* data2" in src
    assert "float4 alu0 = float4(((float)(((val0).x+(float4(1.5f)).x)))," in src
    assert "float4 cast0 = float4(val1);" in src and "half4 cast2 = half4(alu1);" in src  # half4 in float4
    with pytest.raises(NotImplementedError, match="2, 3 or 4 components"):
        MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.float32.vec(8), 2))
    if CXX is not None:  # the lanes compute what numpy does
        lib = EmulatedLibrary(CXX, [EmulatedKernel.from_source("vectors", src)])
        x = np.arange(8, dtype=np.float32) - 3
        h = (np.arange(8) * 0.75).astype(np.float16)
        got = np.zeros(8, np.float32)
        lib.run("vectors", [got.ctypes.data, x.ctypes.data, h.ctypes.data], [], (2, 1, 1))
        np.testing.assert_array_equal(got, np.maximum(x + 1.5, (h + h).astype(np.float32)))


# ***** the syntax check *****


@needs_cxx
def test_a_bad_rendering_raises_with_the_front_ends_log() -> None:
    src = MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.bfloat16, 4))
    broken = src.replace("float alu0 = (cast0+cast1);", "float alu0 = (val0+val1);")  # arithmetic on bfloat
    with pytest.raises(MetalSyntaxError) as info:
        check_syntax("k", broken)
    assert isinstance(info.value, CompileError) and "bfloat" in info.value.log and info.value.src == broken
    assert "does not parse" in str(info.value) and info.value.log.splitlines()[0] in str(info.value)
    wrong_size = src.replace("float cast0 = ((float)(val0));", "float cast0 = as_type<float>(val0);")
    with pytest.raises(MetalSyntaxError, match="must have the size of x"):
        check_syntax("k", wrong_size)
    with pytest.raises(MetalSyntaxError, match="math.h"):  # nothing but the stand-in <metal_stdlib> is reachable
        check_syntax("k", "#include <math.h>\n" + src)


@pytest.mark.parametrize("cxx", _front_ends() or [None])
def test_every_front_end_parses_linearized_kernels(cxx: Optional[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels of real tensor programs (reduce, matmul, conv, where, casts, int math), as the linearizer emits them."""
    if cxx is None:
        pytest.skip("no C++ front end on PATH")
    monkeypatch.setenv(ENV_CXX, cxx)
    monkeypatch.setenv(ENV_CHECK, "1")
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((2, 3, 7, 9)).astype(np.float32), device="PYTHON")
    w = Tensor(rng.standard_normal((4, 3, 3, 2)).astype(np.float32), device="PYTHON")
    ints = Tensor(rng.integers(-50, 50, (5, 6)).astype(np.int32), device="PYTHON")
    outs = [
        a.conv2d(w).relu().sum(axis=(2, 3)),
        (a.reshape(6, 63) @ a.reshape(63, 6)).max(axis=1).cast(dtypes.float16),
        (ints * 3 // 7 % 5 + (ints << 2)).where(ints < 0, 0).cast(dtypes.bfloat16).cast(dtypes.float32),
        a.pad(((0, 0), (1, 0), (0, 2), (1, 1))).flip(3).exp2().mean(),
    ]
    count = 0
    for out in outs:
        for si in out.schedule():
            if si.ast.op is BufferOps.STORE:
                to_program(Kernel(si.ast, MetalRenderer()))  # raises MetalSyntaxError if it does not parse
                count += 1
    assert count >= 4


def test_syntax_check_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    monkeypatch.setattr("tg_metal.renderer.check_syntax", lambda name, src: checked.append(name))
    kernel = _elementwise(BinaryOps.ADD, dtypes.float32, 4)
    monkeypatch.setenv(ENV_CHECK, "0")
    MetalRenderer().render("off", kernel)
    monkeypatch.setenv(ENV_CHECK, "1")
    MetalRenderer().render("on", kernel)
    monkeypatch.delenv(ENV_CHECK)
    MetalRenderer().render("default", kernel)
    assert checked == ["on"] + ([] if ON_MACOS or CXX is None else ["default"])


def test_syntax_check_asked_for_without_a_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CHECK, "1")
    monkeypatch.setenv(ENV_CXX, "no-such-cxx-tg-metal")
    with pytest.raises(MetalSyntaxError, match="TG_METAL_CXX='no-such-cxx-tg-metal' is not on PATH"):
        MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.float32, 4))


# ***** the spellings' arithmetic, run on this CPU against the conformance suite's reference *****


def _level3_cases(target: Any) -> list[Any]:
    from tg_conformance import uop_cases as cases
    from tg_conformance.tests.test_l3_uops import ALU_CASES, BITCAST_CASES, BUILDERS, CAST_CASES, REDUCE_CASES

    params = [("test_alu", {"op": p.values[0], "dtype": p.values[1]}) for p in ALU_CASES]
    params += [("test_cast", {"dtype": p.values[0], "dst": p.values[1]}) for p in CAST_CASES]
    params += [("test_bitcast", {"dtype": p.values[0], "dst": p.values[1]}) for p in BITCAST_CASES]
    params += [("test_reduce_loop", {"op": p.values[0], "dtype": p.values[1]}) for p in REDUCE_CASES]
    params += [(name, {"dtype": dt}) for name in ("test_load_gated", "test_store_gated") for dt in target.spec.dtypes]
    params += [("test_define_var", {"count": c}) for c in (0, 1, 6)]
    params += [("test_where_chain", {"dtype": dt}) for dt in (dtypes.float32, dtypes.int32)]
    built = [BUILDERS[name](target, cases.seeded_rng(name), **kw) for name, kw in params]
    # negative constants and a*b + c that must round twice
    built += [builder(target, cases.seeded_rng(name), **kw) for name, builder, kw in cases.exactness_cases()]
    return [c for c in built if all(target.supports(dt) for dt in c.requires)]


@pytest.mark.parametrize("cxx", _front_ends()[:2] or [None])
def test_level3_cases_compute_what_numpy_does(
    cxx: Optional[str], capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every level-3 kernel of tg-conformance, rendered for Metal, run on this CPU with UBSan, checked by the suite.
    The first front end runs them all; a second (another stand-in `half`, say) runs those that touch float16."""
    if cxx is None:
        pytest.skip("no C++ front end on PATH")
    reference = pytest.importorskip("tg_conformance.reference")
    from tg_conformance.target import RENDER, Target

    monkeypatch.setenv(ENV_CHECK, "0")  # the build below parses every kernel anyway
    target = Target(DEV, RENDER, Device.specs()[DEV], MetalRenderer(), None, None, None)
    cases = _level3_cases(target)
    if cxx != _front_ends()[0]:
        cases = [c for c in cases if dtypes.float16 in c.requires]
    kernels = {c.kernel.name: EmulatedKernel.from_source(c.kernel.name, _render(c)) for c in cases}  # one per name
    lib = EmulatedLibrary(cxx, list(kernels.values()))
    failures = []
    for c in cases:
        bufs = []
        for i, (dt, size) in enumerate(c.kernel.buffers):
            raw = reference.to_bytes(c.inputs[i], dt) if i in c.inputs else b"\xa5" * (size * dt.itemsize)
            bufs.append(np.frombuffer(bytearray(raw), dtype=np.uint8))
        lib.run(c.kernel.name, [b.ctypes.data for b in bufs], c.vals, c.kernel.global_size)
        try:
            c.check([reference.from_bytes(b.tobytes(), dt) for b, (dt, _) in zip(bufs, c.kernel.buffers)])
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, f"{len(failures)} of {len(cases)} cases differ:\n" + "\n".join(failures[:5])
    assert "runtime error" not in capfd.readouterr().err  # UBSan found no undefined behaviour
    assert len(cases) > (300 if cxx == _front_ends()[0] else 20)


def _render(case: Any) -> str:
    return MetalRenderer().render(case.kernel.name, case.kernel.uops)


try:  # the suite's cases, where tg-conformance is installed (its absence skips these tests)
    from tg_conformance import uop_cases
    from tg_conformance.target import RENDER, Target
except ImportError:
    uop_cases = None  # type: ignore[assignment]
EXACTNESS = (
    [pytest.param(builder, params, id=name) for name, builder, params in uop_cases.exactness_cases()]
    if uop_cases is not None
    else []
)


@needs_cxx
@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_contraction_render_and_parse(
    builder: Any, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # x - c with c a negative float constant was rendered x--1.5f, which does not parse
    monkeypatch.setenv(ENV_CHECK, "1")
    target = Target(DEV, RENDER, Device.specs()[DEV], MetalRenderer(), None, None, None)
    uop_cases.run_case(target, builder(target, uop_cases.seeded_rng(str(params)), **params))


def test_no_contraction_fast_math_off_and_each_op_its_own_statement() -> None:
    if uop_cases is None:
        pytest.skip("needs tg-conformance")
    options = compile_options(fake.metal_module(None))
    assert options.settings == {"fastMathEnabled": False}
    target = Target(DEV, RENDER, Device.specs()[DEV], MetalRenderer(), None, None, None)
    case = uop_cases.contraction(target, np.random.default_rng(0), dtypes.float32)
    src = MetalRenderer().render(case.kernel.name, case.kernel.uops)
    assert "#pragma METAL fp contract(off)" in src and "fma(" not in src
    products = [line for line in src.splitlines() if "*" in line and "float alu" in line]
    assert products and all("+" not in line and "-" not in line.split("=", 1)[1] for line in products)


@needs_cxx
def test_the_emulation_reports_undefined_behaviour(capfd: pytest.CaptureFixture[str]) -> None:
    """UBSan is live in the emulation: a plain signed + that overflows is reported."""
    src = MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.int32, 1))
    src = src.replace("as_type<int>(as_type<uint>(val0)+as_type<uint>(val1))", "(val0+val1)")
    lib = EmulatedLibrary(str(CXX), [EmulatedKernel.from_source("k", src)])
    out, a, b = np.zeros(1, np.int32), np.array([2**31 - 1], np.int32), np.array([1], np.int32)
    lib.run("k", [out.ctypes.data, a.ctypes.data, b.ctypes.data], [], (1, 1, 1))
    assert "runtime error" in capfd.readouterr().err


# ***** the macOS parts, on a fake pyobjc Metal *****


@pytest.mark.skipif(os.environ.get("TG_METAL_FAKE_CONFORMANCE") != "1", reason="slow: set TG_METAL_FAKE_CONFORMANCE=1")
def test_fake_mac_passes_the_whole_conformance_suite(tmp_path: Any) -> None:
    """tg-conformance in RUN mode on the fake Mac (about 7 minutes on 2 cores)."""
    pytest.importorskip("tg_conformance")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_conformance.py")
    env = {**os.environ, "CACHEDB": str(tmp_path / "cache.db")}
    command = [sys.executable, script, "--json", str(tmp_path / "report.json")]
    proc = subprocess.run(command, env=env, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "runtime error" not in proc.stderr  # UBSan


def test_library_container() -> None:
    lib = MetalLibrary(LIBRARY, True, b"\x00metallib\xff")
    assert unpack_library(pack_library(lib)) == lib
    assert unpack_library(pack_library(MetalLibrary(SOURCE, False, b""))) == MetalLibrary(SOURCE, False, b"")
    with pytest.raises(ValueError, match="TGMT"):
        unpack_library(b"\x7fELF" + bytes(20))
    with pytest.raises(ValueError, match="cut short"):
        unpack_library(pack_library(lib)[:-1])


def test_threads_per_threadgroup() -> None:
    assert threads_per_threadgroup((5, 3, 1), 1024) == (5, 3, 1)
    assert threads_per_threadgroup((100000, 7, 2), 1024) == (1024, 1, 1)
    assert threads_per_threadgroup((100, 100, 100), 1024) == (100, 10, 1)
    assert threads_per_threadgroup((1, 1, 5000), 256) == (1, 1, 256)


@pytest.fixture
def fake_mac(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """METAL on a fake Mac: tg-metal's own compiler, allocator and runtime over the fake pyobjc Metal."""
    if CXX is None:
        pytest.skip("the fake Metal compiles with a C++ front end, and there is none on PATH")
    device = fake.Device(CXX)
    metal = fake.metal_module(device)
    monkeypatch.setattr(metal_context, "import_metal", lambda: (metal, fake.dispatch_module()))
    monkeypatch.setattr(metal_context, "_contexts", InstanceCache(metal_context.open_context))
    monkeypatch.setattr(tg_metal, "_runs_here", tg_metal._is_mine)
    monkeypatch.setenv(ENV_CHECK, "0")  # the fake's compiler parses everything anyway
    for attr in ("_instances", "_status"):  # forget what the core learnt about METAL off this fake Mac
        monkeypatch.setattr(Device, attr, {})
    monkeypatch.setattr(realize, "_runner_cache", {})
    # programs compiled by the fake stay out of the caches
    monkeypatch.setattr(contract, "_compiled", {})
    monkeypatch.setattr(contract, "diskcache_get", lambda table, key: None)
    monkeypatch.setattr(contract, "diskcache_put", lambda table, key, value: value)
    yield SimpleNamespace(device=device, context=metal_context.get_context(DEV), metal=metal)


def test_fake_mac_runs_tensor_programs_through_the_core(fake_mac: SimpleNamespace) -> None:
    assert Device.status(DEV) is None
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((7, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
    ta, tb = Tensor(a, device=DEV), Tensor(b, device=DEV)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_array_equal((ta * 2 - 1).cast(dtypes.float16).numpy(), (a * 2 - 1).astype(np.float16))
    i = np.arange(-6, 6, dtype=np.int64)
    np.testing.assert_array_equal((Tensor(i, device=DEV) * 3 + 1).numpy(), i * 3 + 1)
    np.testing.assert_array_equal(Tensor(a, device=DEV)[2:5, ::3].to("PYTHON").numpy(), a[2:5, ::3])
    compiles = [c for c in fake_mac.device.calls if c[0] == "compile"]
    assert compiles and all(c[1] == {"fastMathEnabled": False} for c in compiles)  # no fast math


def test_fake_mac_instances(fake_mac: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """METAL:N is the Mac's N-th Metal device (the default first); one that does not exist says what there is."""
    assert (
        Device.status("METAL:1") == "METAL:1 does not exist: this Mac has 1 Metal device(s) (METAL:0 = Fake Metal GPU)"
    )
    second = fake.Device(str(CXX), gpu="Second Fake GPU")
    monkeypatch.setattr(fake_mac.metal, "MTLCopyAllDevices", lambda: [second, fake_mac.device])
    monkeypatch.setattr(Device, "_status", {})
    assert Device.status("METAL:1") is None and Device["METAL:1"].allocator.context.device is second
    x = np.arange(10, dtype=np.float32)
    moved = (Tensor(x, device=DEV) + 1).to("METAL:1") * 2
    np.testing.assert_array_equal(moved.numpy(), (x + 1) * 2)
    assert any(c[0] == "commit" for c in second.calls)  # the multiply ran on the second device


def test_fake_mac_compiler_errors_carry_metals_message(fake_mac: SimpleNamespace) -> None:
    compiler = MetalCompiler(fake_mac.context)
    src = MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.float32, 4))
    compiled = unpack_library(compiler.compile(src))
    assert compiled.kind == LIBRARY and compiled.grid_indexed and compiled.payload.startswith(b"FAKE-METALLIB")
    with pytest.raises(CompileError, match="Metal could not compile") as info:
        compiler.compile(src + "\n}}} not a kernel {{{\n")
    assert "program_source" in info.value.log and info.value.log.splitlines()[0] in str(info.value)
    with pytest.raises(CompileError, match="NUL character"):
        compiler.compile(src + "\x00")
    assert compiler.cachekey.startswith("compile_metal_")


def test_fake_mac_program_launches_views_vals_timing_and_errors(fake_mac: SimpleNamespace) -> None:
    ctx, calls = fake_mac.context, fake_mac.device.calls
    allocator, compiler = MetalAllocator(ctx), MetalCompiler(ctx)
    out, inp = _global(dtypes.int32, 0, True), _global(dtypes.int32, 1)
    n = UOp(UOps.DEFINE_VAR, dtypes.int32, (), ("n", 0, 100))
    i = _special("gidx0", 4)
    load = UOp(UOps.LOAD, dtypes.int32, (inp, i))
    add = UOp(UOps.ALU, dtypes.int32, (load, n), BinaryOps.ADD)
    src = MetalRenderer().render("addn", [out, inp, n, i, load, add, UOp(UOps.STORE, None, (out, i, add))])
    prg = MetalProgram(DEV, "addn", compiler.compile(src))
    base = allocator.alloc(64)
    allocator.copyin(base, memoryview(np.arange(16, dtype=np.int32)).cast("B"))
    view = allocator.offset(base, 16, 20)  # elements 5..8
    dest = allocator.alloc(16)
    assert prg(dest, view, global_size=(4, 1, 1), local_size=(1, 1, 1), vals=(100,)) is None  # not waited for
    assert len(ctx.in_flight) == 1
    got = np.zeros(4, np.int32)
    allocator.copyout(memoryview(got).cast("B"), dest)  # waits first
    assert ctx.in_flight == [] and list(got) == [105, 106, 107, 108]
    assert ("buffer", 1, 20) in calls and ("bytes", 2, (100).to_bytes(4, "little")) in calls
    assert ("dispatchThreads", (4, 1, 1), (4, 1, 1)) in calls
    assert prg(dest, view, global_size=(4, 1, 1), vals=(1,), wait=True) == pytest.approx(0.25)  # GPU time
    assert prg(dest, view, global_size=(0, 1, 1), vals=(1,), wait=True) == 0.0  # nothing to launch
    assert bytes(allocator.as_buffer(view)) == np.arange(5, 9, dtype=np.int32).tobytes()
    fake_mac.device.fail_next = fake.NSError("Caused GPU Timeout Error")
    with pytest.raises(RuntimeError, match="Caused GPU Timeout Error"):
        prg(dest, view, global_size=(4, 1, 1), vals=(1,), wait=True)
    with pytest.raises(RuntimeError, match="no kernel named other; it has \\['addn'\\]"):
        MetalProgram(DEV, "other", compiler.compile(src))
    with pytest.raises(ValueError, match="TGMT"):
        MetalProgram(DEV, "addn", b"not a library")


def test_fake_mac_threadgroup_kernels_dispatch_threadgroups(fake_mac: SimpleNamespace) -> None:
    """A kernel with local ids is launched as global_size threadgroups of local_size threads."""
    ctx, calls = fake_mac.context, fake_mac.device.calls
    out, inp = _global(dtypes.float32, 0, True), _global(dtypes.float32, 1)
    gidx, lidx = _special("gidx0", 3), _special("lidx0", 4)
    idx = UOp(
        UOps.ALU, dtypes.int32, (UOp(UOps.ALU, dtypes.int32, (gidx, _const(4)), BinaryOps.MUL), lidx), BinaryOps.ADD
    )
    val = UOp(UOps.LOAD, dtypes.float32, (inp, idx))
    sq = UOp(UOps.ALU, dtypes.float32, (val, val), BinaryOps.MUL)
    uops = [out, inp, idx.src[0].src[1], gidx, lidx, idx.src[0], idx, val, sq, UOp(UOps.STORE, None, (out, idx, sq))]
    src = MetalRenderer().render("square", uops)
    compiled = MetalCompiler(ctx).compile(src)
    assert not unpack_library(compiled).grid_indexed
    prg = MetalProgram(DEV, "square", compiled)
    allocator = MetalAllocator(ctx)
    x = np.arange(12, dtype=np.float32)
    a, b = allocator.alloc(48), allocator.alloc(48)
    allocator.copyin(b, memoryview(x).cast("B"))
    prg(a, b, global_size=(3, 1, 1), local_size=(4, 1, 1), wait=True)
    assert ("dispatchThreadgroups", (3, 1, 1), (4, 1, 1)) in calls
    got = np.zeros(12, np.float32)
    allocator.copyout(memoryview(got).cast("B"), a)
    np.testing.assert_array_equal(got, x * x)
    with pytest.raises(ValueError, match="more than the 1024"):
        prg(a, b, global_size=(3, 1, 1), local_size=(64, 32, 1))


def test_fake_mac_library_from_source_where_metal_cannot_serialize(
    fake_mac: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(fake.Library, "libraryDataContents")
    src = MetalRenderer().render("k", _elementwise(BinaryOps.ADD, dtypes.float32, 4))
    compiled = MetalCompiler(fake_mac.context).compile(src)
    assert unpack_library(compiled) == MetalLibrary(SOURCE, True, src.encode())
    prg = MetalProgram(DEV, "k", compiled)
    allocator = MetalAllocator(fake_mac.context)
    bufs = [allocator.alloc(16) for _ in range(3)]
    for k, buf in enumerate(bufs[1:]):
        allocator.copyin(buf, memoryview(np.full(4, k + 1.5, np.float32)).cast("B"))
    prg(*bufs, global_size=(4, 1, 1), wait=True)
    assert bytes(allocator.as_buffer(bufs[0])) == np.full(4, 4.0, np.float32).tobytes()


def test_fake_mac_allocator(fake_mac: SimpleNamespace) -> None:
    allocator = MetalAllocator(fake_mac.context)
    empty = allocator.alloc(0)
    assert isinstance(empty, MetalBuffer) and empty.size == 0 and empty.buf.length() == 1
    allocator.copyin(empty, memoryview(b""))
    buf = allocator.alloc(10)
    allocator.copyin(buf, memoryview(bytes(range(10))))  # read-only source
    nested = allocator.offset(allocator.offset(buf, 8, 2), 4, 3)
    assert nested.offset == 5 and bytes(allocator.as_buffer(nested)) == bytes([5, 6, 7, 8])
    allocator.copyin(nested, memoryview(bytearray(b"\xff" * 4)))
    out = bytearray(10)
    allocator.copyout(memoryview(out), buf)
    assert out == bytes([0, 1, 2, 3, 4, 255, 255, 255, 255, 9])
    allocator.free(buf, 10)
    assert allocator.alloc(10) is buf  # the LRU cache hands it out again
    fake_mac.device.memory_limit = 100
    with pytest.raises(MemoryError, match="could not allocate 1000 bytes on Fake Metal GPU"):
        allocator.alloc(1000)


# ***** on a Mac with Metal *****


@pytest.mark.skipif(not ON_MACOS or tg_metal.probe() is not None, reason="needs macOS with a Metal device")
def test_real_metal_runs_tensor_programs() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((33, 17)).astype(np.float32), rng.standard_normal((17, 9)).astype(np.float32)
    ta, tb = Tensor(a, device=DEV), Tensor(b, device=DEV)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ta.max(axis=1).numpy(), a.max(axis=1))
    np.testing.assert_array_equal((ta * 3).cast(dtypes.float16).numpy(), (a * 3).astype(np.float16))
    i = np.array([2**31 - 1, -(2**31), 7, -7], dtype=np.int32)
    np.testing.assert_array_equal((Tensor(i, device=DEV) + 1).numpy(), i + np.int32(1))
    dev = Device[DEV]
    src = dev.renderer.render("k", _elementwise(BinaryOps.ADD, dtypes.float32, 4))
    prg = dev.runtime(DEV, "k", dev.compiler.compile(src))
    bufs = [dev.allocator.alloc(16) for _ in range(3)]
    elapsed = prg(*bufs, global_size=(4, 1, 1), local_size=(1, 1, 1), wait=True)
    assert isinstance(elapsed, float) and 0 <= elapsed < 10
    with pytest.raises(CompileError) as info:
        dev.compiler.compile(src + "\n}}} not a kernel {{{\n")
    assert info.value.log.strip()


# ***** names from outside (a model file's dimension names) in generated source *****


def hostile_names(marker: str) -> list[str]:
    """Variable names that would break out of an identifier (some run `touch marker` if pasted into the source),
    keywords, and names the renderer, Metal or the core use themselves."""
    shell = f'system("touch {marker}")'
    return [
        f"N\n#define N ({shell}, 4)\n",
        f"n; {shell}; int m",
        f"n */ {shell}; /* x",
        f'n // x\n"{shell}" %d \\',
        "n [[buffer(7)]]",
        "two words",
        "naïve 名前",
        "int",
        "kernel",
        "device",
        "gid",
        "lid",
        "gidx0",
        "acc0",
        "data0",
    ]


def _hostile_kernels(name: str, device: str) -> tuple[list[Any], list[np.ndarray]]:
    """Two tensor programs on `device` over a Variable named `name` (the first with a second, plain Variable), and
    numpy's answers."""
    from tgcore import Variable

    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    a = Tensor(x[:4, :5].copy(), device=device).reshape(Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5))
    b = Tensor(x[:, :5].copy(), device=device).reshape(6, Variable(name, 1, 7).bind(5))
    return [(a * 2 + 1).sum(), (b * 3 - 1).sum(1)], [(x[:4, :5] * 2 + 1).sum(), (x[:, :5] * 3 - 1).sum(1)]


@needs_cxx
@pytest.mark.parametrize("index", range(len(hostile_names(""))))
def test_a_hostile_variable_name_renders_and_parses(index: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_CHECK, "1")
    marker = tmp_path / "pwned"
    name = hostile_names(str(marker))[index]
    for out in _hostile_kernels(name, "PYTHON")[0]:
        program = to_program(Kernel(out.schedule()[-1].ast, MetalRenderer()))  # MetalSyntaxError if it does not parse
        assert name not in program.src or name.isidentifier()  # (a plain word may be part of others: int, acc0)
    assert not marker.exists() and not os.listdir(tmp_path)


@pytest.mark.parametrize("index", [0, 4, 10])
def test_a_hostile_variable_name_computes_numpys_result_on_a_fake_mac(
    index: int, fake_mac: SimpleNamespace, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    outs, wants = _hostile_kernels(hostile_names(str(marker))[index], DEV)
    for out, want in zip(outs, wants):
        np.testing.assert_array_equal(out.numpy(), want)
    assert not marker.exists() and not os.listdir(tmp_path)


@needs_cxx
def test_a_syntax_error_shows_the_line_the_log_points_at_and_reports_the_rest(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the user's temp folder, and so the report, go here
    src = "#include <metal_stdlib>\n" + "".join(f"// padding line {i} {'.' * 100}\n" for i in range(150))
    src += "kernel void f(device int* a) {\n  a[0] = nope;\n}\n"
    with pytest.raises(MetalSyntaxError) as info:
        check_syntax("k", src)
    text = str(info.value)
    assert len(text) < 2000 and ">  153 |   a[0] = nope;" in text and "   152 | kernel void f" in text
    report = text.rsplit("--- the whole log and source: ", 1)[1].split(" ---")[0]
    assert report.startswith(str(tmp_path))
    with open(report) as f:
        assert src in f.read()


def test_a_front_end_removed_mid_run_is_a_syntax_error_that_names_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tg_metal import syntax

    gone = str(tmp_path / "cxx-that-goes")
    monkeypatch.setattr(syntax, "find_cxx", lambda: gone)  # found, then removed before it runs
    with pytest.raises(MetalSyntaxError, match="cxx-that-goes cannot be run .*No such file.*TG_METAL_SYNTAX_CHECK=0"):
        check_syntax("k", "kernel void f() {}\n")
