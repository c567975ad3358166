"""tg-llvm: the renderer on every op and dtype, the compiler and its errors, the MCJIT runtime, agreement with
CLANG bit for bit, and tensor ops against numpy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tg_conformance import uop_cases
from tg_conformance.checks import assert_exp2_within_one_ulp, exp2_inputs, exp2_op
from tg_conformance.reference import fused_multiply_add
from tg_conformance.target import Target
from tg_llvm.compiler import LLVMCompiler
from tg_llvm.renderer import reg_type
from tg_llvm.runtime import LLVMProgram, undefined_symbols
from uop_kernels import (
    FLOATS,
    INTS,
    TRANSCENDENTAL,
    cast_inputs,
    edge_values,
    elementwise_uops,
    from_buffer,
    operands,
    ops_for,
    reference_bitcast,
    reference_cast,
    run_elementwise,
    same_bits,
)

from tgcore import Device, GlobalCounters, Tensor, dtypes
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps
from tgcore.device import Buffer
from tgcore.dtype import DType, PtrDType
from tgcore.engine.realize import get_kernel
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu
from tgcore.plugin import ALL_DTYPES, CompileError

ALL = [dtypes.bool, *INTS, *FLOATS]
ALU_CASES = [(op, dt) for dt in ALL for op in ops_for(dt)]


def _id(case: tuple) -> str:
    return "-".join(x.short_name if isinstance(x, DType) else x.name for x in case)


def clang_or_skip() -> None:
    pytest.importorskip("tg_clang", reason="tg-clang is not installed: no CLANG to compare with")
    if (reason := Device.status("CLANG")) is not None:
        pytest.skip(f"CLANG is unavailable here: {reason}")


# ***** the device *****


def test_llvm_is_registered_available_and_above_clang():
    assert Device.status("LLVM") is None
    spec = Device.specs()["LLVM"]
    assert spec.priority == 20 and set(spec.dtypes) == set(ALL_DTYPES)
    assert "LLVM" in Device.available()


def test_missing_llvmlite_is_a_clear_unavailable_reason():
    code = textwrap.dedent("""
        import sys
        sys.modules["llvmlite"] = None  # import llvmlite now raises ImportError
        from tgcore import Device
        print(Device.status("LLVM"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "llvmlite" in out.stdout and "pip install llvmlite" in out.stdout


# ***** renderer + compiler + runtime on every ALU op and dtype, against exec_alu *****


@pytest.mark.parametrize("op,dt", ALU_CASES, ids=[_id(c) for c in ALU_CASES])
def test_alu_matches_exec_alu(op, dt):
    inputs, in_dts, out_dt = operands(op, dt)
    got = run_elementwise("LLVM", op, inputs, in_dts, out_dt)
    with np.errstate(all="ignore"):
        if op is TernaryOps.MULACC and dt in (dtypes.float32, dtypes.float64):  # fused_mulacc: llvm.fma
            lanes = np.broadcast_arrays(*[np.asarray(x) for x in inputs])
            want = np.array([fused_multiply_add(*map(float, lane), dt) for lane in zip(*lanes)], dtype=got.dtype)
        else:
            want = exec_alu(op, out_dt, [np.asarray(x) for x in inputs])
    if op in TRANSCENDENTAL:
        atol, rtol = Device.specs()["LLVM"].tolerances[dt]
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
        return
    # the sign of max(-0.0, 0.0) is not IEEE's to say (numpy's float16 and float32 loops even differ): CLANG's
    # spelling (a > b || a != a) ? a : b is kept, so both CPU devices agree
    ok = same_bits(got, want, zero_sign=op is not BinaryOps.MAX)
    bad = np.flatnonzero(~ok)[:5]
    assert ok.all(), [(tuple(x[i] for x in inputs), got[i], want[i]) for i in bad]


CAST_CASES = [(src, dst) for src in ALL for dst in ALL if src != dst]


@pytest.mark.parametrize("src,dst", CAST_CASES, ids=[_id(c) for c in CAST_CASES])
def test_cast_matches_numpy(src, dst):
    x = cast_inputs(src, dst)
    got = run_elementwise("LLVM", None, [x], [src], dst, kind=UOps.CAST)
    ok = same_bits(got, reference_cast(x, src, dst))
    assert ok.all(), [(x[i], got[i]) for i in np.flatnonzero(~ok)[:5]]


BITCAST_CASES = [(src, dst) for src, dst in CAST_CASES if src.itemsize == dst.itemsize]


@pytest.mark.parametrize("src,dst", BITCAST_CASES, ids=[_id(c) for c in BITCAST_CASES])
def test_bitcast_keeps_the_bits(src, dst):
    x = edge_values(src)
    got = run_elementwise("LLVM", None, [x], [src], dst, kind=UOps.BITCAST)
    assert same_bits(got, reference_bitcast(x, src, dst)).all()


def test_float64_to_float16_rounds_once():
    rng = np.random.default_rng(0)
    lo = rng.integers(0, 0x7BFF, 4000).astype(np.uint16).view(np.float16)
    hi = np.nextafter(lo, np.float16(np.inf))
    mid = (lo.astype(np.float64) + hi.astype(np.float64)) / 2  # exact halfway points: ties go to even
    x = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), -mid, [65519.99, 65520.0, 1e300]])
    got = run_elementwise("LLVM", None, [x], [dtypes.float64], dtypes.float16, kind=UOps.CAST)
    with np.errstate(over="ignore"):
        assert same_bits(got, x.astype(np.float16)).all()


def test_loops_accumulators_variables_and_gates():
    """out[i] = sum(in[i*m + j] for j < m) for even i, a gated load reading 0 past n: RANGE in RANGE, DEFINE_ACC,
    PHI, DEFINE_VAR, gated LOAD and STORE, IF/ENDIF."""
    i32, f32 = dtypes.int32, dtypes.float32
    out = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(f32), (), (0, "data0", True))
    inp = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(f32), (), (1, "data1", False))
    m, n = UOp(UOps.DEFINE_VAR, i32, (), ("m", 1, 10)), UOp(UOps.DEFINE_VAR, i32, (), ("n", 1, 100))
    zero, one, two, rows = (UOp(UOps.CONST, i32, (), v) for v in (0, 1, 2, 6))
    fzero, fone = UOp(UOps.CONST, f32, (), 0.0), UOp(UOps.CONST, f32, (), 1.0)
    i = UOp(UOps.RANGE, i32, (zero, rows), (0, False))
    acc = UOp(UOps.DEFINE_ACC, f32, (), 0.0)
    j = UOp(UOps.RANGE, i32, (zero, m), (1, True))
    idx = UOp(UOps.ALU, i32, (UOp(UOps.ALU, i32, (i, m), BinaryOps.MUL), j), BinaryOps.ADD)
    inside = UOp(UOps.ALU, dtypes.bool, (idx, n), BinaryOps.CMPLT)
    load = UOp(UOps.LOAD, f32, (inp, idx, inside, fzero))
    phi = UOp(UOps.PHI, f32, (acc, UOp(UOps.ALU, f32, (acc, load), BinaryOps.ADD)))
    end_j = UOp(UOps.ENDRANGE, None, (j,))
    even = UOp(UOps.ALU, dtypes.bool, (UOp(UOps.ALU, i32, (i, two), BinaryOps.MOD), zero), BinaryOps.CMPEQ)
    store = UOp(UOps.STORE, None, (out, i, acc, even))
    gate = UOp(UOps.IF, None, (even,))
    bump = UOp(UOps.ALU, f32, (UOp(UOps.LOAD, f32, (out, i)), fone), BinaryOps.ADD)
    uops = [out, inp, m, n, zero, one, two, rows, fzero, fone, i, acc, j, *idx.src[:1], idx, inside, load, phi.src[1]]
    uops += [phi, end_j, even.src[0], even, store, gate, bump.src[0], bump, UOp(UOps.STORE, None, (out, i, bump))]
    uops += [UOp(UOps.ENDIF, None, (gate,)), UOp(UOps.ENDRANGE, None, (i,))]
    data = np.arange(20, dtype=np.float32)
    bufs = [Buffer("LLVM", 6, f32, initial_value=np.full(6, -1, np.float32).tobytes())]
    bufs.append(Buffer("LLVM", 20, f32, initial_value=data.tobytes()))
    dev = Device["LLVM"]
    prg = dev.runtime("LLVM", "gates", dev.compiler.compile(dev.renderer.render("gates", uops)))
    prg(*[b._opaque for b in bufs], vals=(4, 18))  # m=4, n=18: row 4 reads past n, as 0
    padded = np.concatenate([np.where(np.arange(20) < 18, data, 0), np.zeros(4, np.float32)]).reshape(6, 4).sum(1)
    np.testing.assert_array_equal(from_buffer(bufs[0]), np.where(np.arange(6) % 2 == 0, padded + 1, -1))


def test_renderer_has_no_fast_math_and_the_uniform_signature():
    src = Device["LLVM"].renderer.render("k", _mulacc_uops())
    assert 'define void @"k"(ptr %bufs, ptr %vals)' in src
    for flag in (" fast ", " contract ", " reassoc ", "fmuladd", " afn "):
        assert flag not in src


# ***** constants and rounding *****

EXACTNESS = [pytest.param(builder, params, id=name) for name, builder, params in uop_cases.exactness_cases()]


@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_no_contraction(builder, params):
    # negative constants (-0.0, INT_MIN, int64 min, half and bfloat16 ones) as right operands and under NEG; a*b + c
    # of separate MUL and ADD uops rounds twice (no fmuladd, no contract flag, whatever LLVM's defaults)
    t = Target.resolve("LLVM")
    uop_cases.run_case(t, builder(t, uop_cases.seeded_rng(str(params)), **params))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16])
def test_tensor_a_times_b_plus_c_rounds_twice(dtype):
    a, b, c = uop_cases.contraction_inputs(dtype, 256, np.random.default_rng(1))
    ta, tb, tc = (Tensor(v, device="LLVM").cast(dtype) for v in (a, b, c))
    out = ta * tb + tc
    src = to_program(get_kernel(Device["LLVM"].renderer, out.schedule()[-1].ast)).src
    for flag in (" fast ", " contract ", " reassoc ", "fmuladd", "llvm.fma"):
        assert flag not in src
    got = out.float().numpy()
    assert not np.any(got)  # every lane 0: a fused sum would be the product's rounding error


def _mulacc_uops(n: int = 4) -> list[UOp]:
    return elementwise_uops(TernaryOps.MULACC, [dtypes.float32] * 3, dtypes.float32, n)


def test_only_float_vectors_are_rendered():
    # the optimizer makes vectors of float32 / float64 (codegen.uops.VECTOR_DTYPES); any other is refused by name
    with pytest.raises(NotImplementedError, match="vector types of"):
        Device["LLVM"].renderer.render("k", [UOp(UOps.CONST, dtypes.int32.vec(4), (), 1)])
    assert reg_type(dtypes.float32.vec(16)) == "<16 x float>" and reg_type(dtypes.float64.vec(4)) == "<4 x double>"


# ***** compiler and runtime *****


def test_bad_ir_raises_compile_error_with_llvm_log_and_the_ir():
    with pytest.raises(CompileError) as info:
        LLVMCompiler().compile("define void @broken( { this is not IR }")
    assert "error" in info.value.log and "this is not IR" in info.value.src
    assert info.value.log.splitlines()[0] in str(info.value)


def test_invalid_ir_that_parses_raises_compile_error():
    with pytest.raises(CompileError, match="i32"):
        LLVMCompiler().compile("define i32 @k() {\n  ret void\n}\n")


def test_nul_in_the_ir_is_a_compile_error_not_a_truncation():
    src = Device["LLVM"].renderer.render("k", _mulacc_uops()) + "\x00 garbage after a NUL"
    with pytest.raises(CompileError, match="NUL"):
        LLVMCompiler().compile(src)


def _mul_then_add_uops(n: int) -> list[UOp]:
    """out[i] = in1[i]*in2[i] + in3[i] as two ALU ops (MUL, then ADD)."""
    uops = elementwise_uops(TernaryOps.MULACC, [dtypes.float32] * 3, dtypes.float32, n)
    mulacc = next(u for u in uops if u.op is UOps.ALU)
    product = UOp(UOps.ALU, dtypes.float32, mulacc.src[:2], BinaryOps.MUL)
    total = UOp(UOps.ALU, dtypes.float32, (product, mulacc.src[2]), BinaryOps.ADD)
    at = uops.index(mulacc)
    store = uops[at + 1]
    return [*uops[:at], product, total, UOp(UOps.STORE, None, (*store.src[:2], total)), *uops[at + 2 :]]


@pytest.mark.parametrize("opt", [0, 1, 2, 3])
def test_every_optimization_level_computes_the_same(opt):
    """A multiply then an add round twice at every level (no contraction); MULACC is one fma at every level."""
    rng = np.random.default_rng(opt)
    a, b, c = (rng.standard_normal(37).astype(np.float32) for _ in range(3))
    dev = Device["LLVM"]
    fused = np.array([fused_multiply_add(*map(float, lane), dtypes.float32) for lane in zip(a, b, c)], np.float32)
    assert not same_bits(fused, a * b + c).all()  # the inputs tell the two apart
    for name, uops, want in (("mul_add", _mul_then_add_uops(37), a * b + c), ("mulacc", _mulacc_uops(37), fused)):
        prg = LLVMProgram("LLVM", name, LLVMCompiler(opt=opt).compile(dev.renderer.render(name, uops)))
        out = Buffer("LLVM", 37, dtypes.float32).allocate()
        ins = [Buffer("LLVM", 37, dtypes.float32, initial_value=x.tobytes()) for x in (a, b, c)]
        prg(out._opaque, *[x._opaque for x in ins])
        assert same_bits(from_buffer(out), want).all(), name


def test_optimization_level_from_the_environment():
    assert LLVMCompiler(opt=1).cachekey.endswith("_O1")
    env = {**os.environ, "LLVMOPT": "7"}
    code = "from tg_llvm.compiler import LLVMCompiler; LLVMCompiler()"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert err.returncode != 0 and "LLVMOPT" in err.stderr


def test_kernels_with_the_same_name_stay_apart():
    add = run_elementwise("LLVM", BinaryOps.ADD, [np.ones(3), np.ones(3)], [dtypes.float64] * 2, dtypes.float64)
    mul = run_elementwise("LLVM", BinaryOps.MUL, [np.ones(3), np.ones(3)], [dtypes.float64] * 2, dtypes.float64)
    np.testing.assert_array_equal(add, [2, 2, 2])
    np.testing.assert_array_equal(mul, [1, 1, 1])


def test_a_missing_symbol_is_an_error_not_a_crash():
    lib = LLVMCompiler().compile(
        'declare void @tg_no_such_function()\ndefine void @"k"(ptr %b, ptr %v) {\n'
        "  call void @tg_no_such_function()\n  ret void\n}\n"
    )
    assert "tg_no_such_function" in undefined_symbols(lib)
    with pytest.raises(RuntimeError, match="tg_no_such_function"):
        LLVMProgram("LLVM", "k", lib)


def test_compiled_programs_are_cached():
    compiler = Device["LLVM"].compiler
    src = Device["LLVM"].renderer.render("cache_probe", _mulacc_uops())
    assert compiler.compile_cached(src) is compiler.compile_cached(src)


# ***** CLANG and LLVM agree bit for bit where IEEE fixes the result *****

EXACT_CASES = [(op, dt) for op, dt in ALU_CASES if op not in TRANSCENDENTAL]


@pytest.mark.parametrize("op,dt", EXACT_CASES, ids=[_id(c) for c in EXACT_CASES])
def test_clang_and_llvm_agree_bit_for_bit(op, dt):
    clang_or_skip()
    inputs, in_dts, out_dt = operands(op, dt)
    llvm = run_elementwise("LLVM", op, inputs, in_dts, out_dt)
    clang = run_elementwise("CLANG", op, inputs, in_dts, out_dt)
    ok = same_bits(llvm, clang)
    assert ok.all(), [(tuple(x[i] for x in inputs), llvm[i], clang[i]) for i in np.flatnonzero(~ok)[:5]]


def test_clang_and_llvm_casts_agree_bit_for_bit():
    clang_or_skip()
    for src, dst in CAST_CASES:
        x = cast_inputs(src, dst)
        llvm = run_elementwise("LLVM", None, [x], [src], dst, kind=UOps.CAST)
        clang = run_elementwise("CLANG", None, [x], [src], dst, kind=UOps.CAST)
        assert same_bits(llvm, clang).all(), (src, dst)


# ***** tensor ops against numpy *****


def test_elementwise_reduce_matmul_backward_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
    ta, tb = Tensor(a, device="LLVM", requires_grad=True), Tensor(b, device="LLVM", requires_grad=True)
    np.testing.assert_allclose((ta * 2 - 1).exp().numpy(), np.exp(a * 2 - 1), rtol=1e-6)
    np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    loss = (ta @ tb).relu().sum()
    loss.backward()
    mask = ((a @ b) > 0).astype(np.float32)
    np.testing.assert_allclose(ta.grad.numpy(), mask @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ mask, rtol=1e-5, atol=1e-5)


def test_chained_elementwise_ops_are_one_kernel():
    x = Tensor(np.arange(10, dtype=np.float32), device="LLVM").realize()
    GlobalCounters.reset()
    out = ((((x + 1) * 2).sqrt() - 3) / 4).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(out, (np.sqrt((np.arange(10) + 1) * 2) - 3) / 4, rtol=1e-6)


def test_padding_and_movement_match_numpy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(x, device="LLVM")
    np.testing.assert_array_equal(t.pad(((1, 0), None, (2, 1))).numpy(), np.pad(x, ((1, 0), (0, 0), (2, 1))))
    np.testing.assert_array_equal(t.permute(2, 0, 1)[1:, :, ::-1].numpy(), x.transpose(2, 0, 1)[1:, :, ::-1])


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint16, dtypes.int32, dtypes.int64], ids=lambda d: d.short_name)
def test_integer_tensors_wrap_and_divide_like_exec_alu(dt):
    info = np.iinfo(dt.np)
    a = np.array([info.max, info.min, 7, -7 if info.min < 0 else 9, 0], dtype=dt.np)
    b = np.array([2, -1 if info.min < 0 else 3, -2 if info.min < 0 else 2, 2, 0], dtype=dt.np)
    ta, tb = Tensor(a, device="LLVM"), Tensor(b, device="LLVM")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((ta + tb).numpy(), a + b)
        np.testing.assert_array_equal((ta * tb).numpy(), a * b)
        np.testing.assert_array_equal((ta // tb).numpy(), a // b)  # floor division, x // 0 = 0, MIN // -1 wraps


def test_bfloat16_and_half_tensors():
    x = np.array([0.5, 1.5, -2.25, 1000.0, 3.14159], dtype=np.float32)
    h = Tensor(x.astype(np.float16), device="LLVM")
    np.testing.assert_array_equal((h * 3).numpy(), x.astype(np.float16) * np.float16(3))
    bf = Tensor(x, device="LLVM").cast(dtypes.bfloat16)
    bits = (x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16 << 16
    rounded = bits.astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(bf.numpy(), rounded)
    want = exec_alu(BinaryOps.ADD, dtypes.bfloat16, [rounded, np.float32(1)])
    np.testing.assert_array_equal((bf + 1).cast(dtypes.float32).numpy(), want)


def test_bool_tensors():
    a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
    ta, tb = Tensor(a, device="LLVM"), Tensor(b, device="LLVM")
    np.testing.assert_array_equal((ta & tb).numpy(), a & b)
    np.testing.assert_array_equal((ta | tb).numpy(), a | b)
    np.testing.assert_array_equal(ta.where(1.5, -2.0).numpy(), np.where(a, 1.5, -2.0).astype(np.float32))


# ***** float32 exp2: the renderer's own routine *****


def test_exp2_is_within_one_ulp_and_vector_lanes_match_scalar_bits():
    assert_exp2_within_one_ulp("LLVM")


def test_exp2_matches_clang_bit_for_bit():
    # the same float32 operations in the same order as CLANG's routine (no FMA on either side)
    clang_or_skip()
    x = exp2_inputs()
    llvm, clang = exp2_op(x, "LLVM"), exp2_op(x, "CLANG")
    differ = np.flatnonzero(llvm.view(np.uint32) != clang.view(np.uint32))
    assert len(differ) == 0, [(x[i], llvm[i], clang[i]) for i in differ[:5]]


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_half_and_bfloat16_exp2_round_the_float32_routine(dt):
    x = np.linspace(-30.0, 20.0, 1001, dtype=np.float32)
    src = Tensor(x, device="LLVM").cast(dt)
    got = Tensor(src.lazydata.e(UnaryOps.EXP2)).cast(dtypes.float32)
    wide = exp2_op(src.cast(dtypes.float32).numpy(), "LLVM")  # the float32 routine on the same inputs
    want = Tensor(wide, device="LLVM").cast(dt).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))


def test_one_loop_of_whole_vectors_gets_the_short_pipeline_and_the_same_results():
    # the optimizer's vectorized elementwise kernel is compiled with the short pass pipeline; a matmul (nested
    # loops) and a kernel with scalar lanes keep O2; either way the results are numpy's
    from tg_llvm.compiler import _whole_vectors

    from tgcore.engine.realize import get_kernel

    def src(t: Tensor) -> str:
        return to_program(get_kernel(Device["LLVM"].renderer, t.schedule()[-1].ast, "LLVM")).src

    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    t = Tensor(x, device="LLVM")
    elementwise = ((t * 1.5 + 0.5).exp2().sqrt() - 1.0).maximum(0.25)
    assert _whole_vectors(src(elementwise))
    with np.errstate(invalid="ignore"):
        expected = np.maximum(np.sqrt(np.exp2(x * np.float32(1.5) + np.float32(0.5))) - np.float32(1.0), 0.25)
    np.testing.assert_allclose(elementwise.numpy(), expected, rtol=2e-6)
    m = Tensor(x.reshape(64, 64), device="LLVM")
    assert not _whole_vectors(src(m @ m))
    # float32 compares and wheres are masks on whole vectors; float64 ones go lane by lane
    assert _whole_vectors(src((t < 0.5).where(t, 2.0)))
    np.testing.assert_array_equal((t < 0.5).where(t, 2.0).numpy(), np.where(x < 0.5, x, np.float32(2.0)))
    assert not _whole_vectors(src((t.cast(dtypes.float64) < 0.5).where(t, 2.0)))
    np.testing.assert_allclose((m @ m).numpy(), x.reshape(64, 64) @ x.reshape(64, 64), rtol=1e-4, atol=1e-4)


def test_index_arithmetic_is_64_bit_and_int32_values_still_wrap():
    # the addresses of a conv (nested loops, a padded window, threads' bounds) are computed in i64, as CLANG's C
    # computes them: no i32 sum or product is left, every access is addressed by an i64; the results are numpy's
    import re

    def src(t: Tensor) -> str:
        return to_program(get_kernel(Device["LLVM"].renderer, t.schedule()[-1].ast, "LLVM")).src

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 8, 12, 12)).astype(np.float32), rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    conv = Tensor(x, device="LLVM").conv2d(Tensor(w, device="LLVM"), padding=1)
    ir = src(conv)
    assert not re.search(r"= (add|sub|mul)( nsw)? i32 ", ir)
    accesses = re.findall(r"getelementptr inbounds (?:float|i8|i16|i32|i64|double|half), ptr %\w+, (i\d+)", ir)
    assert accesses and set(accesses) == {"i64"}
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    np.testing.assert_allclose(conv.numpy(), np.einsum("bchwij,ocij->bohw", windows, w), rtol=1e-4, atol=1e-4)
    # int32 values (not addresses) keep int32 arithmetic: they wrap as numpy's do, also next to an index
    big = np.array([2**31 - 1, -(2**31), 5, 7], dtype=np.int32)
    t = Tensor(big, device="LLVM")
    wrapped = t * 3 + Tensor.arange(4, device="LLVM").cast(dtypes.int32)
    assert re.search(r"= mul i32 ", src(wrapped))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(wrapped.numpy(), big * np.int32(3) + np.arange(4, dtype=np.int32))


# ***** names from outside (a model file's dimension names) in generated source *****


def hostile_names(marker: str) -> list[str]:
    """Variable names that would break out of an identifier (some run `touch marker` if pasted into C-like source),
    keywords, and names the renderer or the core use themselves."""
    shell = f'system("touch {marker}")'
    return [
        f"N\n#define N ({shell}, 4)\n",
        f"n; {shell}; int m",
        f"n */ {shell}; /* x",
        f'n // x\n"{shell}" %d \\',
        "@n %0 !dbg",
        "two words",
        "naïve 名前",
        "int",
        "return",
        "bufs",
        "vals",
        "gidx0",
        "acc0",
        "data0",
        "entry",
        "core_start",
    ]


@pytest.mark.parametrize("index", range(len(hostile_names(""))))
def test_a_hostile_variable_name_compiles_runs_and_runs_nothing_else(index, tmp_path, monkeypatch):
    from tgcore import Variable

    monkeypatch.chdir(tmp_path)  # where a relative `touch` would land, too
    marker = tmp_path / "pwned"
    name = hostile_names(str(marker))[index]
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    # two Variables in one kernel: the hostile one and a plain one, bound to other values
    a = Tensor(x[:4, :5].copy(), device="LLVM").reshape(Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5))
    np.testing.assert_array_equal((a * 2 + 1).sum().numpy(), (x[:4, :5] * 2 + 1).sum())
    b = Tensor(x[:, :5].copy(), device="LLVM").reshape(6, Variable(name, 1, 7).bind(5))
    np.testing.assert_array_equal((b * 3 - 1).sum(1).numpy(), (x[:, :5] * 3 - 1).sum(1))
    assert not marker.exists() and not os.listdir(tmp_path)


def test_a_compile_error_shows_the_line_the_log_points_at_and_reports_the_rest(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the user's temp folder, and so the report, go here
    src = "".join(f"; padding line {i} {'.' * 100}\n" for i in range(150))
    src += "define void @f() {\nentry:\n  %a = add i32 %nope, 1\n  ret void\n}\n"
    with pytest.raises(CompileError) as info:
        LLVMCompiler().compile(src)
    text = str(info.value)
    assert len(text) < 2000 and ">  153 |   %a = add i32 %nope, 1" in text and "   151 | define void @f() {" in text
    report = text.rsplit("--- the whole log and source: ", 1)[1].split(" ---")[0]
    assert report.startswith(str(tmp_path))
    with open(report) as f:
        assert src in f.read()
