"""tg-opencl: the OPENCL device end to end (on PoCL where there is no GPU), its renderer's OpenCL specifics on
hand-built uop kernels (local memory, barriers, vectors, half), compiler errors, views, timing, device selection."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, Optional

import numpy as np
import pytest
from tg_conformance import uop_cases
from tg_conformance.target import Target
from tg_opencl import probe
from tg_opencl.allocator import BufferView
from tg_opencl.cl_platform import get_platform
from tg_opencl.compiler import OpenCLCompiler, unpack_binaries
from tg_opencl.renderer import OpenCLRenderer

from tgcore import Device, GlobalCounters, Tensor, dtypes
from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import DType, PtrDType, bf16_round
from tgcore.ops import BinaryOps
from tgcore.plugin import CompileError

DEV = "OPENCL"


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env={**os.environ, **env}
    )


def _launch(uops: list[UOp], inputs: list[np.ndarray], out: np.ndarray, device: str = DEV, **launch: Any) -> np.ndarray:
    """Render, compile and run a hand-built kernel; buffer 0 is `out` (its shape and dtype), then `inputs`."""
    dev = Device[device]
    src = dev.renderer.render("handmade", uops)
    prg = dev.runtime(device, "handmade", dev.compiler.compile_cached(src))
    bufs = []
    for a in [out, *inputs]:
        b = dev.allocator.alloc(a.nbytes)
        dev.allocator.copyin(b, memoryview(np.ascontiguousarray(a)).cast("B"))
        bufs.append(b)
    prg(*bufs, wait=True, **launch)
    got = np.empty_like(out)
    dev.synchronize()
    dev.allocator.copyout(memoryview(got).cast("B"), bufs[0])
    return got


def _global(dt: DType, index: int, writable: bool = False) -> UOp:
    return UOp(UOps.DEFINE_GLOBAL, PtrDType.of(dt), (), (index, f"data{index}", writable))


def _const(v: Any, dt: DType = dtypes.int32) -> UOp:
    return UOp(UOps.CONST, dt, (), v)


# ***** the device *****


def test_opencl_is_available_with_limits_from_the_device():
    assert Device.status(DEV) is None, Device.status(DEV)
    info = get_platform().infos[0]
    r = Device[DEV].renderer
    assert r.shared_max == info.local_mem_size and r.local_max[0] <= info.max_work_group_size
    assert len(r.global_max) == min(3, len(info.max_work_item_sizes))
    spec = Device.specs()[DEV]
    assert spec.priority == 30 and dtypes.bfloat16 in spec.dtypes  # computed in float: needs no extension
    assert (dtypes.float16 in spec.dtypes) == info.fp16 and (dtypes.float64 in spec.dtypes) == info.fp64


def test_elementwise_reduce_matmul_backward_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
    ta, tb = Tensor(a, device=DEV, requires_grad=True), Tensor(b, device=DEV, requires_grad=True)
    np.testing.assert_allclose((ta * 2 - 1).exp().numpy(), np.exp(a * 2 - 1), rtol=1e-5)
    np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    (ta @ tb).relu().sum().backward()
    mask = ((a @ b) > 0).astype(np.float32)
    np.testing.assert_allclose(ta.grad.numpy(), mask @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ mask, rtol=1e-5, atol=1e-5)


def test_division_and_sqrt_round_like_numpy():
    x = np.random.default_rng(1).uniform(0.1, 1000, 257).astype(np.float32)
    t = Tensor(x, device=DEV)
    np.testing.assert_array_equal((t / 3.7).numpy(), x / np.float32(3.7))
    np.testing.assert_array_equal(t.sqrt().numpy(), np.sqrt(x))


def test_signed_overflow_wraps_like_numpy():
    for dt in (np.int32, np.int64):
        info = np.iinfo(dt)
        big = np.array([info.max, info.min, -1, 7], dtype=dt)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal((Tensor(big, device=DEV) + 1).numpy(), big + dt(1))
            np.testing.assert_array_equal((Tensor(big, device=DEV) * 3).numpy(), big * dt(3))
            np.testing.assert_array_equal((-Tensor(big, device=DEV)).numpy(), -big)


def test_bool_buffers_are_bytes():
    x = np.array([0.0, 1.5, -2.0, np.nan], dtype=np.float32)
    got = (Tensor(x, device=DEV) > 0).numpy()
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, x > 0)
    np.testing.assert_array_equal((~Tensor(x > 0, device=DEV)).numpy(), ~(x > 0))


def test_double_where_claimed():
    if dtypes.float64 not in Device.specs()[DEV].dtypes:
        pytest.skip("this OpenCL device does not report cl_khr_fp64")
    d = np.array([1e-300, 3.0, -7.5, 2.0**60 + 1], dtype=np.float64)
    np.testing.assert_array_equal((Tensor(d, device=DEV) / 3).numpy(), d / 3)
    np.testing.assert_array_equal((Tensor(d, device=DEV) + 1).numpy(), d + 1)


def test_half_where_claimed():
    if dtypes.float16 not in Device.specs()[DEV].dtypes:
        pytest.skip("this OpenCL device does not report cl_khr_fp16")
    x = np.array([0.5, 1.5, -2.25, 1000.0, 3.0], dtype=np.float16)
    np.testing.assert_array_equal((Tensor(x, device=DEV) * 3).numpy(), x * np.float16(3))
    np.testing.assert_array_equal((Tensor(x, device=DEV) / 7).numpy(), x / np.float16(7))


def test_five_chained_elementwise_ops_are_one_kernel():
    x = Tensor(np.arange(10, dtype=np.float32), device=DEV).realize()
    GlobalCounters.reset()
    out = ((((x + 1) * 2).sqrt() - 3) / 4).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(out, (np.sqrt((np.arange(10) + 1) * 2) - 3) / 4, rtol=1e-6)


# ***** copies *****


def test_copies_between_opencl_and_clang_both_ways():
    if Device.status("CLANG") is not None:
        pytest.skip(f"CLANG is not available: {Device.status('CLANG')}")
    x = np.arange(37, dtype=np.float32) - 11
    on_cl = Tensor(x, device="CLANG").to(DEV) * 2
    assert on_cl.device == DEV
    back = (on_cl.to("CLANG") + 1).realize()
    assert back.device == "CLANG"
    np.testing.assert_array_equal(back.numpy(), x * 2 + 1)
    i = Tensor(np.arange(5, dtype=np.int64), device=DEV).to("CLANG").to(DEV)
    np.testing.assert_array_equal(i.numpy(), np.arange(5))


# ***** the renderer, on hand-built kernels *****


def _workgroup_sum(n_groups: int, group: int) -> list[UOp]:
    """out[g] = sum of in[g*group : (g+1)*group], through __local memory and a barrier."""
    out, inp = _global(dtypes.float32, 0, True), _global(dtypes.float32, 1)
    temp = UOp(UOps.DEFINE_LOCAL, PtrDType.of(dtypes.float32), (), ("temp", group))
    c_group, c_zero = _const(group), _const(0)
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", n_groups))
    lidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "lidx0", group))
    idx = UOp(
        UOps.ALU, dtypes.int32, (UOp(UOps.ALU, dtypes.int32, (gidx, c_group), BinaryOps.MUL), lidx), BinaryOps.ADD
    )
    val = UOp(UOps.LOAD, dtypes.float32, (inp, idx))
    first = UOp(UOps.ALU, dtypes.bool, (lidx, c_zero), BinaryOps.CMPEQ)
    gate = UOp(UOps.IF, None, (first,))
    acc = UOp(UOps.DEFINE_ACC, dtypes.float32, (), 0.0)
    rng = UOp(UOps.RANGE, dtypes.int32, (c_zero, c_group), (1, True))
    part = UOp(UOps.LOAD, dtypes.float32, (temp, rng))
    phi = UOp(UOps.PHI, dtypes.float32, (acc, UOp(UOps.ALU, dtypes.float32, (acc, part), BinaryOps.ADD)))
    return [
        out, inp, temp, c_group, c_zero, gidx, lidx, idx.src[0], idx, val,
        UOp(UOps.STORE, None, (temp, lidx, val)), UOp(UOps.BARRIER), first, gate, acc, rng, part, phi.src[1], phi,
        UOp(UOps.ENDRANGE, None, (rng,)), UOp(UOps.STORE, None, (out, gidx, acc)), UOp(UOps.ENDIF, None, (gate,)),
    ]  # fmt: skip


def test_local_memory_barrier_and_local_ids():
    uops = _workgroup_sum(n_groups=3, group=4)
    src = Device[DEV].renderer.render("handmade", uops)
    assert "__local float temp[4];" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
    assert "get_group_id(0)" in src and "get_local_id(0)" in src and "reqd_work_group_size(4,1,1)" in src
    assert src.index("__local float temp") < src.index("get_group_id")  # declared at the kernel's top
    x = np.arange(12, dtype=np.float32)
    got = _launch(uops, [x], np.zeros(3, np.float32), global_size=(3, 1, 1), local_size=(4, 1, 1))
    np.testing.assert_array_equal(got, x.reshape(3, 4).sum(axis=1))
    with pytest.raises(ValueError, match="work-groups"):
        _launch(uops, [x], np.zeros(3, np.float32), global_size=(3, 1, 1), local_size=(2, 1, 1))


def test_vector_types():
    f4 = dtypes.float32.vec(4)
    out, inp = _global(f4, 0, True), _global(f4, 1)
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 2))
    one = _const(1.5, f4)
    val = UOp(UOps.LOAD, f4, (inp, gidx))
    add = UOp(UOps.ALU, f4, (val, one), BinaryOps.ADD)
    uops = [out, inp, one, gidx, val, add, UOp(UOps.STORE, None, (out, gidx, add))]
    src = Device[DEV].renderer.render("handmade", uops)
    assert "__global float4* restrict data0" in src and "(float4)(1.5f)" in src
    x = np.arange(8, dtype=np.float32)
    got = _launch(uops, [x], np.zeros(8, np.float32), global_size=(2, 1, 1), local_size=(1, 1, 1))
    np.testing.assert_array_equal(got, x + 1.5)


@pytest.mark.no_build
def test_render_bool_half_double_and_contraction():
    r = OpenCLRenderer()
    b, h, d = _global(dtypes.bool, 0, True), _global(dtypes.float16, 1), _global(dtypes.float64, 2)
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 4))
    lh, ld = UOp(UOps.LOAD, dtypes.float16, (h, gidx)), UOp(UOps.LOAD, dtypes.float64, (d, gidx))
    cast = UOp(UOps.CAST, dtypes.float64, (lh,))
    cmp = UOp(UOps.ALU, dtypes.bool, (cast, ld), BinaryOps.CMPLT)
    src = r.render("k", [b, h, d, gidx, lh, ld, cast, cmp, UOp(UOps.STORE, None, (b, gidx, cmp))])
    assert "__global uchar* restrict data0" in src and "const half* restrict data1" in src
    assert "#pragma OPENCL FP_CONTRACT OFF" in src
    assert "cl_khr_fp16 : enable" in src and "cl_khr_fp64 : enable" in src
    assert "get_global_id(0)" in src and "reqd_work_group_size" not in src
    plain = r.render("k", [_global(dtypes.float32, 0, True)])
    assert "cl_khr_fp16" not in plain and "cl_khr_fp64" not in plain


@pytest.mark.no_build
def test_index_arithmetic_is_plain_and_data_arithmetic_wraps():
    out, inp = _global(dtypes.int32, 0, True), _global(dtypes.int32, 1)
    gidx, two = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 4)), _const(2)
    idx = UOp(UOps.ALU, dtypes.int32, (gidx, two), BinaryOps.MUL)
    val = UOp(UOps.LOAD, dtypes.int32, (inp, idx))
    data = UOp(UOps.ALU, dtypes.int32, (val, two), BinaryOps.MUL)
    at = UOp(UOps.ALU, dtypes.int32, (val, gidx), BinaryOps.ADD)  # an index that depends on data still wraps
    uops = [out, inp, two, gidx, idx, val, data, at, UOp(UOps.STORE, None, (out, at, data))]
    src = OpenCLRenderer().render("k", uops)
    assert "= (gidx0*2);" in src
    assert "as_int(as_uint(val0)*as_uint(2))" in src and "as_int(as_uint(val0)+as_uint(gidx0))" in src


@pytest.mark.no_build
def test_int64_constants_use_opencl_suffixes():
    r = OpenCLRenderer()
    assert r.render_const(-(2**63), dtypes.int64) == "((long)(-9223372036854775807L-1L))"
    assert r.render_const(2**64 - 1, dtypes.uint64) == "18446744073709551615UL"
    assert r.render_const(-9, dtypes.int64) == "(-9L)"  # `x-` then `-9L` would be `x--9L`


# ***** constants, rounding and bfloat16 *****

EXACTNESS = [pytest.param(builder, params, id=name) for name, builder, params in uop_cases.exactness_cases()]


@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_no_contraction(builder, params):
    # negative constants as right operands and under NEG (x - -1.5f was x--1.5f); a*b + c of separate MUL and ADD
    # uops rounds twice (#pragma OPENCL FP_CONTRACT OFF), on the platform's compiler
    t = Target.resolve(DEV)
    uop_cases.run_case(t, builder(t, uop_cases.seeded_rng(str(params)), **params))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.bfloat16])
def test_tensor_a_times_b_plus_c_rounds_twice(dtype):
    if dtype not in Device.specs()[DEV].dtypes:
        pytest.skip(f"{DEV} here does not claim {dtype.short_name}")
    a, b, c = uop_cases.contraction_inputs(dtype, 256, np.random.default_rng(1))
    ta, tb, tc = (Tensor(v, device=DEV).cast(dtype) for v in (a, b, c))
    assert not np.any((ta * tb + tc).float().numpy())  # every lane 0: a fused sum would be the product's error


def test_bfloat16_is_floats_rounded_after_every_op_and_stored_as_bits():
    rng = np.random.default_rng(4)
    x, y = (rng.standard_normal(300).astype(np.float32) * 50 for _ in range(2))
    x[:4] = [np.nan, np.inf, -0.0, 3.0e38]
    x, y = bf16_round(x), bf16_round(y)
    tx, ty = (Tensor(v, device=DEV).cast(dtypes.bfloat16) for v in (x, y))
    out = ((tx * ty + tx) / ty).sqrt()
    with np.errstate(all="ignore"):
        exp = bf16_round(np.sqrt(bf16_round(bf16_round(bf16_round(x * y) + x) / y)))
    got = out.float().numpy()
    assert np.array_equal(got.view(np.uint32), exp.view(np.uint32)) or np.array_equal(got, exp, equal_nan=True)
    # promotion: with float32 the sum is float32 (exact: bfloat16 values are floats), with an int it stays bfloat16
    wide = tx + Tensor(y, device=DEV)
    assert wide.dtype == dtypes.float32
    assert np.array_equal(wide.numpy(), (x + y).astype(np.float32), equal_nan=True)
    assert (tx * 3).dtype == dtypes.bfloat16
    with np.errstate(over="ignore"):
        assert np.array_equal((tx * 3).float().numpy(), bf16_round(x * 3), equal_nan=True)
    src = OpenCLRenderer().render("k", _bf16_add_uops())
    assert "__global ushort* restrict data0" in src and "tg_round_bf16(" in src and "tg_f2bf(" in src


def _bf16_add_uops() -> list[UOp]:
    out, inp = _global(dtypes.bfloat16, 0, True), _global(dtypes.bfloat16, 1)
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 4))
    val = UOp(UOps.LOAD, dtypes.bfloat16, (inp, gidx))
    total = UOp(UOps.ALU, dtypes.bfloat16, (val, val), BinaryOps.ADD)
    return [out, inp, gidx, val, total, UOp(UOps.STORE, None, (out, gidx, total))]


# ***** compiler and runtime *****


def test_bad_source_raises_compile_error_with_log_and_source():
    compiler = Device[DEV].compiler
    with pytest.raises(CompileError) as info:
        compiler.compile("__kernel void broken(__global float* a) { a[0] = this_is_not_declared; }")
    assert "this_is_not_declared" in info.value.log
    assert "this_is_not_declared" in info.value.src and "compiler log" in str(info.value)
    with pytest.raises(CompileError, match="NUL"):
        compiler.compile("__kernel void k(__global float* a) { a[0] = 1.0f; }\x00 garbage (((")


def test_compiler_returns_binaries_the_disk_cache_can_keep(monkeypatch):
    src = "__kernel void cached_probe(__global float* a) { a[get_global_id(0)] = 2.0f; }"
    lib = Device[DEV].compiler.compile_cached(src)
    binaries = unpack_binaries(lib)
    assert set(binaries) >= {info.build_key for info in get_platform().infos}
    fresh = OpenCLCompiler(get_platform())

    def must_not_build(self: OpenCLCompiler, src: str) -> bytes:
        raise AssertionError("the disk cache should have answered")

    monkeypatch.setattr(OpenCLCompiler, "compile", must_not_build)
    assert fresh.compile_cached(src) == lib
    prg = Device[DEV].runtime(DEV, "cached_probe", lib)
    buf = Device[DEV].allocator.alloc(16)
    assert prg(buf, global_size=(4, 1, 1), local_size=(1, 1, 1)) is None
    elapsed = prg(buf, global_size=(4, 1, 1), local_size=(1, 1, 1), wait=True)  # from OpenCL profiling events
    assert isinstance(elapsed, float) and 0 <= elapsed < 10
    out = np.zeros(4, np.float32)
    Device[DEV].allocator.copyout(memoryview(out).cast("B"), buf)
    np.testing.assert_array_equal(out, 2.0)


def test_symbolic_values_are_int_arguments():
    out = _global(dtypes.int32, 0, True)
    var = UOp(UOps.DEFINE_VAR, dtypes.int32, (), ("n", 0, 100))
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 3))
    add = UOp(UOps.ALU, dtypes.int32, (gidx, var), BinaryOps.ADD)
    got = _launch([out, var, gidx, add, UOp(UOps.STORE, None, (out, gidx, add))], [], np.zeros(3, np.int32),
                  global_size=(3, 1, 1), local_size=(1, 1, 1), vals=(40,))  # fmt: skip
    np.testing.assert_array_equal(got, [40, 41, 42])


def test_views_aligned_are_sub_buffers_and_unaligned_work_in_kernels():
    alloc = Device[DEV].allocator
    align = alloc.align
    base = alloc.alloc(align * 2)
    alloc.copyin(base, memoryview(np.zeros(align // 2, np.float32)).cast("B"))
    aligned, unaligned = alloc.offset(base, 16, align), alloc.offset(base, 16, 4)
    assert isinstance(aligned, BufferView) and aligned.sub is not None and unaligned.sub is None
    out = _global(dtypes.float32, 0, True)
    inp = _global(dtypes.float32, 1)
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 4))
    val = UOp(UOps.LOAD, dtypes.float32, (inp, gidx))
    dbl = UOp(UOps.ALU, dtypes.float32, (val, val), BinaryOps.ADD)
    uops = [out, inp, gidx, val, dbl, UOp(UOps.STORE, None, (out, gidx, dbl))]
    prg = Device[DEV].runtime(DEV, "views", Device[DEV].compiler.compile(Device[DEV].renderer.render("views", uops)))
    alloc.copyin(aligned, memoryview(np.array([1, 2, 3, 4], np.float32)).cast("B"))
    prg(unaligned, aligned, global_size=(4, 1, 1), local_size=(1, 1, 1))
    Device[DEV].synchronize()
    whole = np.empty(align // 2, np.float32)
    alloc.copyout(memoryview(whole).cast("B"), base)
    np.testing.assert_array_equal(whole[1:5], [2, 4, 6, 8])
    np.testing.assert_array_equal(whole[align // 4 : align // 4 + 4], [1, 2, 3, 4])  # the input is untouched
    assert whole[0] == 0 and whole[5] == 0


# ***** device selection *****


def _devices_line(out: str) -> Optional[str]:
    return next((x for x in out.splitlines() if x.startswith("OPENCL ")), None)


def test_probe_names_a_missing_instance():
    import tg_opencl

    n = len(get_platform().devices)
    assert tg_opencl.probe() is None and tg_opencl.probe(f"OPENCL:{n - 1}") is None
    reason = tg_opencl.probe(f"OPENCL:{n}")
    assert reason is not None and f"no OpenCL device 'OPENCL:{n}'" in reason and f"it has {n}" in reason


def test_platform_by_index_and_name():
    for choice in ("0", get_platform().name.split()[0].lower()):
        out = _run_python("from tgcore import Tensor; print((Tensor([1.0, 2.0], device='OPENCL') * 3).tolist())",
                          CL_PLATFORM=choice)  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip() == "[3.0, 6.0]", out.stderr


@pytest.mark.no_build
def test_no_matching_platform_is_a_clear_unavailable_reason():
    env = {"CL_PLATFORM": "no-such-platform-tg"}
    out = subprocess.run([sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True)  # fmt: skip
    line = _devices_line(out.stdout)
    assert line is not None and "unavailable" in line and "no-such-platform-tg" in line
    err = _run_python("from tgcore import Tensor; Tensor([1.0], device='OPENCL').realize()", **env)
    assert err.returncode != 0 and "no-such-platform-tg" in err.stderr


@pytest.mark.no_build
def test_without_pyopencl_the_device_is_unavailable_not_a_crash():
    code = """
        import sys
        sys.modules["pyopencl"] = None  # as if it were not installed
        from tgcore import Device, Tensor
        print("STATUS", Device.status("OPENCL"))
        print((Tensor([1.0, 2.0], device="PYTHON") + 1).tolist())
    """
    out = _run_python(code)
    assert out.returncode == 0, out.stderr
    assert "STATUS pyopencl cannot be imported" in out.stdout and "[2.0, 3.0]" in out.stdout


def test_second_device_and_transfers_between_them():
    code = """
        import numpy as np
        from tgcore import Tensor
        a = Tensor(np.arange(6, dtype=np.float32), device="OPENCL:1") * 2
        b = a.to("OPENCL") + 1
        c = b.to("OPENCL:1") * 10
        print(a.device, b.device, c.device, c.numpy().tolist())
    """
    out = _run_python(code, POCL_DEVICES="pthread pthread")
    if "no OpenCL device 'OPENCL:1'" in out.stderr:
        pytest.skip("the OpenCL platform here is not PoCL (POCL_DEVICES makes no second device)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["OPENCL:1", "OPENCL", "OPENCL:1"]
    assert "[10.0, 30.0, 50.0, 70.0, 90.0, 110.0]" in out.stdout


# ***** STAGE: inputs through __local memory (tg-conformance checks the results) *****


def test_shared_memory_counts_as_fast_only_where_it_is_on_chip():
    from tgcore.codegen.kernel import OptOps
    from tgcore.engine.realize import get_kernel

    renderer = Device[DEV].renderer
    assert renderer.shared_is_fast == all(i.local_mem_dedicated for i in get_platform().infos)
    assert OpenCLRenderer().shared_is_fast  # rendering for no particular device: assume a GPU's
    a, b = Tensor.ones(256, 512, device=DEV), Tensor.ones(512, 256, device=DEV)
    opts = get_kernel(renderer, (a @ b).schedule()[-1].ast, DEV).applied_opts
    assert (OptOps.STAGE in {o.op for o in opts}) == renderer.shared_is_fast


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
    a = Tensor(x[:4, :5].copy(), device="OPENCL").reshape(Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5))
    np.testing.assert_array_equal((a * 2 + 1).sum().numpy(), (x[:4, :5] * 2 + 1).sum())
    b = Tensor(x[:, :5].copy(), device="OPENCL").reshape(6, Variable(name, 1, 7).bind(5))
    np.testing.assert_array_equal((b * 3 - 1).sum(1).numpy(), (x[:, :5] * 3 - 1).sum(1))
    assert not marker.exists() and not os.listdir(tmp_path)


def test_a_compile_error_shows_the_line_the_log_points_at_and_reports_the_rest(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the user's temp folder, and so the report, go here
    src = "".join(f"// padding line {i} {'.' * 100}\n" for i in range(150))
    src += "__kernel void f(__global int* a) {\n  a[0] = nope;\n}\n"
    with pytest.raises(CompileError) as info:
        Device[DEV].compiler.compile(src)
    text = str(info.value)
    assert len(text) < 3000 and ">  152 |   a[0] = nope;" in text and "   151 | __kernel void f" in text
    report = text.rsplit("--- the whole log and source: ", 1)[1].split(" ---")[0]
    assert report.startswith(str(tmp_path))
    with open(report) as f:
        assert src in f.read()


@pytest.mark.no_build
def test_probe_is_none_exactly_when_the_platform_builds_a_kernel():
    """A platform that lists a device but cannot build for it (PoCL 3.0's LLVM on a newer CPU) is unavailable, with
    the compiler's words; one that builds is available, and then a real kernel compiles and runs."""
    try:
        platform = get_platform()
    except Exception as e:  # no platform at all: the probe must say so
        assert probe() is not None and str(e)[:40] in probe()
        return
    import pyopencl as cl

    program = cl.Program(platform.context, "__kernel void k(__global float *a) { a[get_global_id(0)] *= 2.0f; }")
    try:
        program.build(devices=[platform.devices[0]])
        builds = True
    except cl.Error:
        builds = False
    reason = probe()
    if builds:
        assert reason is None
        assert (Tensor([1.5, -2.0], device=DEV) * 2).numpy().tolist() == [3.0, -4.0]
    else:
        assert reason is not None and "cannot build a kernel" in reason, reason
        with pytest.raises(RuntimeError, match="cannot build a kernel"):
            Tensor([1.0], device=DEV).numpy()


@pytest.mark.no_build
def test_the_syntax_check_parses_renderings_and_refuses_bad_source(monkeypatch):
    """Where no platform can build, TG_OPENCL_SYNTAX_CHECK=1 has clang's OpenCL front end parse every rendering."""
    from tg_opencl import syntax

    if syntax.find_clang() is None:
        pytest.skip("no clang on PATH: the OpenCL syntax check cannot run here (apt-get install clang)")
    monkeypatch.setenv(syntax.ENV_CHECK, "1")
    r = OpenCLRenderer()
    r.fp16 = r.fp64 = True
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int64):
        out = _global(dt, 0, True)
        uops = [out, _global(dt, 1)]
        gid = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 4))
        x = UOp(UOps.LOAD, dt, (uops[1], gid))
        y = UOp(UOps.ALU, dt, (x, x), BinaryOps.MUL)
        uops += [gid, x, y, UOp(UOps.STORE, None, (out, gid, y))]
        assert "__kernel" in r.render(f"k_{dt.name}", uops)  # parsed by clang, else OpenCLSyntaxError
    with pytest.raises(syntax.OpenCLSyntaxError, match="does not parse") as e:
        syntax.check_syntax("bad", "__kernel void bad(__global float *a) { a[0] = no_such_builtin(1.0f); }")
    assert "no_such_builtin" in e.value.log
