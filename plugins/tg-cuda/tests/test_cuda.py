"""tg-cuda without a GPU: discovery and the reason CUDA is unavailable, the renderer's CUDA C++, NVRTC to PTX (and
ptxas to SASS where it can run), launch sizes. `test_gpu.py` runs kernels where there is a GPU."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import tg_cuda
from tg_cuda import compiler as cuda_compiler
from tg_cuda.compiler import CUDACompiler, parse_arch
from tg_cuda.nvrtc import NVRTCUnavailable, load_nvrtc
from tg_cuda.renderer import LAUNCH_FLAT, CUDARenderer
from tg_cuda.runtime import launch_dims

from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps, plain_index_ops
from tgcore.device import Device, DeviceUnavailable
from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps
from tgcore.plugin import ALL_DTYPES, CompileError
from tgcore.registry import plugins


def _driver_loads() -> bool:
    try:
        ctypes.CDLL(os.environ.get("TG_CUDA_LIBCUDA") or "libcuda.so.1")
    except OSError:
        return False
    return True


HAS_DRIVER = _driver_loads()
no_driver = pytest.mark.skipif(HAS_DRIVER, reason="this machine has an NVIDIA driver")


@pytest.fixture(scope="module")
def compiler() -> CUDACompiler:
    return CUDACompiler(90)


class Builder:
    """Appends uops in program order (a GPU-style kernel: launched indices, no loops for the global axes)."""

    def __init__(self) -> None:
        self.uops: list[UOp] = []
        self.n_buffers = 0

    def add(self, op: UOps, dtype: DType | None = None, src: tuple[UOp, ...] = (), arg: object = None) -> UOp:
        self.uops.append(UOp(op, dtype, src, arg))
        return self.uops[-1]

    def buffer(self, dt: DType, writable: bool = False) -> UOp:
        self.n_buffers += 1
        return self.add(
            UOps.DEFINE_GLOBAL, PtrDType.of(dt), (), (self.n_buffers - 1, f"data{self.n_buffers - 1}", writable)
        )

    def const(self, v: object, dt: DType) -> UOp:
        return self.add(UOps.CONST, dt, (), v)

    def alu(self, op: object, dt: DType, *src: UOp) -> UOp:
        return self.add(UOps.ALU, dt, src, op)


def elementwise(op: object, dt: DType, n: int = 100) -> list[UOp]:
    """out[i] = op(a[i], b[i]) over one SPECIAL gidx0."""
    b = Builder()
    out, x, y = b.buffer(dt, True), b.buffer(dt), b.buffer(dt)
    i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", n))
    b.add(UOps.STORE, None, (out, i, b.alu(op, dt, b.add(UOps.LOAD, dt, (x, i)), b.add(UOps.LOAD, dt, (y, i)))))
    return b.uops


# ***** discovery, and CUDA unavailable without a driver *****


def test_device_is_registered_with_every_dtype() -> None:
    spec = Device.specs()["CUDA"]
    assert spec.priority == 40 and set(spec.dtypes) == set(ALL_DTYPES)
    assert plugins.records["cuda"].error is None


@no_driver
def test_unavailable_without_driver_says_why() -> None:
    reason = Device.status("CUDA")
    assert reason is not None and "libcuda" in reason and "no NVIDIA driver" in reason
    assert tg_cuda.probe("CUDA:1") == reason
    with pytest.raises(DeviceUnavailable, match="libcuda"):
        Device["CUDA"]


@no_driver
def test_devices_command_lists_cuda_unavailable() -> None:
    out = subprocess.run([sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("CUDA "))
    assert "unavailable: libcuda.so.1 not found: no NVIDIA driver" in line, out.stdout


def test_libcuda_override_that_does_not_load() -> None:
    env = {**os.environ, "TG_CUDA_LIBCUDA": "/nonexistent/libcuda.so.1"}
    out = subprocess.run(
        [sys.executable, "-c", "import tg_cuda; print(tg_cuda.probe())"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "TG_CUDA_LIBCUDA='/nonexistent/libcuda.so.1' cannot be loaded" in out.stdout


def test_renderer_and_compiler_answer_without_a_device() -> None:
    assert isinstance(plugins.part("tg_renderer", "CUDA"), CUDARenderer)
    assert isinstance(plugins.part("tg_compiler", "CUDA", "CUDA:1"), CUDACompiler)
    assert plugins.part("tg_renderer", "CLANG") is None or not isinstance(
        plugins.part("tg_renderer", "CLANG"), CUDARenderer
    )


@no_driver
def test_target_arch_is_sm90_without_device_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TG_CUDA_ARCH", raising=False)
    assert tg_cuda.target_arch() == 90
    monkeypatch.setenv("TG_CUDA_ARCH", "sm_80")
    assert tg_cuda.target_arch("CUDA:3") == 80


@pytest.mark.parametrize(
    "text,arch", [("sm_90", 90), ("compute_86", 86), ("75", 75), ("8.9", 89), ("sm_90a", 90), ("sm_100", 100)]
)
def test_parse_arch(text: str, arch: int) -> None:
    assert parse_arch(text) == arch


def test_parse_arch_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="TG_CUDA_ARCH"):
        parse_arch("hopper")


# ***** NVRTC *****


def test_nvrtc_from_the_wheel() -> None:
    nvrtc = load_nvrtc()
    assert nvrtc.version >= (12, 0) and 90 in nvrtc.supported_archs


def test_nvrtc_override_that_does_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CUDA_NVRTC", "/nonexistent/libnvrtc.so.13")
    with pytest.raises(NVRTCUnavailable, match="TG_CUDA_NVRTC='/nonexistent/libnvrtc.so.13'"):
        load_nvrtc()


def test_compiles_to_ptx_for_the_arch(compiler: CUDACompiler) -> None:
    src = CUDARenderer().render("k_add", elementwise(BinaryOps.ADD, dtypes.float32))
    ptx = compiler.compile(src).decode()
    assert ptx.startswith(LAUNCH_FLAT + "\n")
    assert ".target sm_90" in ptx and ".entry k_add(" in ptx
    assert "fma" not in ptx  # -fmad=false


def test_other_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CUDA_PTXAS", "0")
    ptx = CUDACompiler(75).compile(CUDARenderer().render("k", elementwise(BinaryOps.MUL, dtypes.float16))).decode()
    assert ".target sm_75" in ptx


def test_arch_nvrtc_cannot_compile_for() -> None:
    with pytest.raises(ValueError, match="cannot compile for sm_35"):
        CUDACompiler(35)


def test_compile_error_carries_log_and_source(compiler: CUDACompiler) -> None:
    src = CUDARenderer().render("k", elementwise(BinaryOps.ADD, dtypes.int32)) + "\nthis is not CUDA;\n"
    with pytest.raises(CompileError) as info:
        compiler.compile(src)
    assert "error" in info.value.log and "this is not CUDA" in info.value.src
    assert info.value.log.strip().splitlines()[0] in str(info.value)


def test_nul_in_source_is_a_compile_error(compiler: CUDACompiler) -> None:
    with pytest.raises(CompileError, match="NUL character"):
        compiler.compile('extern "C" __global__ void k() {}\x00garbage')


def test_cachekey_names_arch_and_ptxas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CUDA_PTXAS", "0")
    without = CUDACompiler(90)
    assert without.ptxas is None and without.cachekey.startswith("compile_cuda_sm90_")
    assert CUDACompiler(80).cachekey != without.cachekey
    monkeypatch.delenv("TG_CUDA_PTXAS")
    auto = CUDACompiler(90)
    assert (auto.cachekey != without.cachekey) == (auto.ptxas is not None)


# ***** ptxas *****


def _ptxas_or_skip() -> cuda_compiler.Ptxas:
    found, note = cuda_compiler.find_ptxas(load_nvrtc().version)
    if found is None:
        pytest.skip(note)
    return found


def test_ptxas_assembles_every_dtype_to_sass(monkeypatch: pytest.MonkeyPatch) -> None:
    ptxas = _ptxas_or_skip()
    monkeypatch.setenv("TG_CUDA_PTXAS", ptxas.path)
    c = CUDACompiler(90)
    assert c.ptxas == ptxas
    for dt in ALL_DTYPES:
        ptx = c.compile(CUDARenderer().render("k", elementwise(BinaryOps.MAX, dt)))
        cubin = c.assemble(ptx)
        assert cubin[:4] == b"\x7fELF"


def test_ptxas_failure_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ptxas = _ptxas_or_skip()
    monkeypatch.setenv("TG_CUDA_PTXAS", ptxas.path)
    c = CUDACompiler(90)
    with pytest.raises(CompileError, match="ptxas -arch=sm_90 rejected") as info:
        c.assemble(b".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus.instruction; }\n")
    assert info.value.log


def test_ptxas_required_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_CUDA_PTXAS", "/nonexistent/ptxas")
    with pytest.raises(CompileError, match="TG_CUDA_PTXAS=/nonexistent/ptxas asks for ptxas"):
        CUDACompiler(90)


def test_ptxas_older_than_nvrtc_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    fake = os.path.join(str(tmp_path), "ptxas")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    os.chmod(fake, 0o755)
    monkeypatch.delenv("TG_CUDA_PTXAS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cuda_compiler, "nvidia_dirs", lambda: [])
    monkeypatch.setattr(cuda_compiler.os.path, "isfile", lambda p: p == fake)
    found, note = cuda_compiler.find_ptxas((13, 0))
    assert found is None and "older than NVRTC 13.0" in note
    monkeypatch.setenv("TG_CUDA_PTXAS", "1")
    with pytest.raises(CompileError, match="older than NVRTC 13.0"):
        cuda_compiler.find_ptxas((13, 0))


# ***** the renderer *****


def test_flat_kernel_guards_and_declares_launch_bounds() -> None:
    src = CUDARenderer().render("k", elementwise(BinaryOps.ADD, dtypes.float32, 1000))
    assert src.startswith(LAUNCH_FLAT + "\n")
    assert "__launch_bounds__(256) void k(float* __restrict__ data0, const float* __restrict__ data1" in src
    assert "if (blockIdx.x*blockDim.x+threadIdx.x >= 1000u) return;" in src
    assert "int gidx0 = blockIdx.x*blockDim.x+threadIdx.x;" in src


def grouped_kernel() -> list[UOp]:
    """A workgroup sum: each of 16 threads loads one value into __shared__ memory, a barrier, then thread 0 of
    each block adds the 16 and stores the block's sum."""
    b = Builder()
    out, x = b.buffer(dtypes.float32, True), b.buffer(dtypes.float32)
    smem = b.add(UOps.DEFINE_LOCAL, PtrDType.of(dtypes.float32), (), ("temp", 16))
    zero, sixteen = b.const(0, dtypes.int32), b.const(16, dtypes.int32)
    g = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 8))
    lid = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "lidx0", 16))
    idx = b.alu(BinaryOps.ADD, dtypes.int32, b.alu(BinaryOps.MUL, dtypes.int32, g, sixteen), lid)
    b.add(UOps.STORE, None, (smem, lid, b.add(UOps.LOAD, dtypes.float32, (x, idx))))
    b.add(UOps.BARRIER)
    first = b.add(UOps.IF, None, (b.alu(BinaryOps.CMPEQ, dtypes.bool, lid, zero),))
    acc = b.add(UOps.DEFINE_ACC, dtypes.float32, (), 0.0)
    r = b.add(UOps.RANGE, dtypes.int32, (zero, sixteen), (1, True))
    b.add(
        UOps.PHI,
        dtypes.float32,
        (acc, b.alu(BinaryOps.ADD, dtypes.float32, acc, b.add(UOps.LOAD, dtypes.float32, (smem, r)))),
    )
    b.add(UOps.ENDRANGE, None, (r,))
    b.add(UOps.STORE, None, (out, g, acc))
    b.add(UOps.ENDIF, None, (first,))
    return b.uops


def test_grouped_kernel_with_shared_memory_and_barrier(compiler: CUDACompiler) -> None:
    src = CUDARenderer().render("k_group", grouped_kernel())
    assert not src.startswith(LAUNCH_FLAT)
    assert "__launch_bounds__(16) void k_group(" in src
    body = src.split("{", 1)[1].splitlines()
    assert body[1].strip() == "__shared__ float temp[16];"  # hoisted to the kernel's scope
    assert "int gidx0 = blockIdx.x;" in src and "int lidx0 = threadIdx.x;" in src and "__syncthreads();" in src
    ptx = compiler.compile(src).decode()
    assert ".shared" in ptx and "bar.sync" in ptx and ".maxntid 16, 1, 1" in ptx


def test_vector_loads_stores_and_lanes(compiler: CUDACompiler) -> None:
    for dt in (dtypes.float32, dtypes.float16, dtypes.int8, dtypes.bfloat16, dtypes.float64):
        vec = dt.vec(4)
        b = Builder()
        out, x = b.buffer(dt, True), b.buffer(dt)
        i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 64))
        idx = b.alu(BinaryOps.MUL, dtypes.int32, i, b.const(4, dtypes.int32))
        v = b.add(UOps.LOAD, vec, (x, idx))
        two = b.const(dtypes.as_const(2, dt), vec)
        s = b.alu(BinaryOps.MAX, vec, b.alu(BinaryOps.MUL, vec, v, two), v)
        gate = b.alu(BinaryOps.CMPLT, dtypes.bool, i, b.const(60, dtypes.int32))
        b.add(UOps.STORE, None, (out, idx, s, gate))
        src = CUDARenderer().render("k_vec", b.uops)
        name = f"tg_{dt.short_name}x4"
        assert f"*((const {name}*)(data1+alu0))" in src and f"*(({name}*)(data0+alu0))" in src
        ptx = compiler.compile(src).decode()
        if dt in (dtypes.float32, dtypes.float64):  # one 16-byte (2 x 16-byte for double) access per thread
            assert ".v4.f32" in ptx or ".v2.f64" in ptx or ".v4.b32" in ptx or ".v2.b64" in ptx, ptx


def test_vector_cast(compiler: CUDACompiler) -> None:
    b = Builder()
    out, x = b.buffer(dtypes.float16, True), b.buffer(dtypes.float32)
    i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 8))
    idx = b.alu(BinaryOps.MUL, dtypes.int32, i, b.const(2, dtypes.int32))
    v = b.add(UOps.LOAD, dtypes.float32.vec(2), (x, idx))
    b.add(UOps.STORE, None, (out, idx, b.add(UOps.CAST, dtypes.float16.vec(2), (v,))))
    src = CUDARenderer().render("k_vcast", b.uops)
    assert "tg_float16x2{((tg_half)(val0.v[0])), ((tg_half)(val0.v[1]))}" in src
    compiler.compile(src)


def test_index_arithmetic_is_plain_and_values_wrap() -> None:
    b = Builder()
    out, x = b.buffer(dtypes.int32, True), b.buffer(dtypes.int32)
    i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 10))
    idx = b.alu(
        BinaryOps.ADD,
        dtypes.int32,
        b.alu(BinaryOps.MUL, dtypes.int32, i, b.const(3, dtypes.int32)),
        b.const(1, dtypes.int32),
    )
    v = b.add(UOps.LOAD, dtypes.int32, (x, idx))
    value = b.alu(BinaryOps.ADD, dtypes.int32, v, i)  # data + index: a value, may overflow
    b.add(UOps.STORE, None, (out, i, value))
    assert plain_index_ops(b.uops) == {id(b.uops[4]), id(b.uops[6])}
    src = CUDARenderer().render("k", b.uops)
    assert "int alu0 = (gidx0*3);" in src and "int alu1 = (alu0+1);" in src
    assert "int alu2 = ((int)((unsigned int)(val0)+(unsigned int)(gidx0)));" in src


@pytest.mark.parametrize(
    "val,dt,text",
    [
        (0.1, dtypes.float32, "0.10000000149011612f"),
        (0.1, dtypes.float16, "((tg_half)(0.0999755859375f))"),
        (1 / 3, dtypes.bfloat16, "((tg_bf16)(0.3333333432674408f))"),
        (float("inf"), dtypes.float64, "__longlong_as_double(0x7ff0000000000000LL)"),
        (float("-inf"), dtypes.float64, "(-__longlong_as_double(0x7ff0000000000000LL))"),
        (float("nan"), dtypes.float32, "__int_as_float(0x7fc00000)"),
        (-(2**63), dtypes.int64, "((long long)(-9223372036854775807ll-1))"),
        (2**64 - 1, dtypes.uint64, "18446744073709551615ull"),
        (True, dtypes.bool, "true"),
        (3, dtypes.int8, "((signed char)3)"),
    ],
)
def test_constants_are_exact(val: object, dt: DType, text: str) -> None:
    assert CUDARenderer().render_const(val, dt) == text


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="cannot render dtype"):
        CUDARenderer().render_dtype(dtypes.imagef((2, 2)))


def test_prelude_only_what_is_used() -> None:
    plain = CUDARenderer().render("k", elementwise(BinaryOps.ADD, dtypes.float32))
    assert "tg_half" not in plain and "tg_bf16" not in plain and "tg_bitcast" not in plain
    half = CUDARenderer().render("k", elementwise(BinaryOps.ADD, dtypes.float16))
    assert "struct tg_half" in half and "struct tg_bf16" not in half


def test_every_alu_op_and_dtype_compiles(compiler: CUDACompiler) -> None:
    """Like the conformance suite's uop level, in one source per dtype (faster): each op once."""
    ops = [UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.NEG, *BinaryOps, *TernaryOps]
    for dt in ALL_DTYPES:
        b = Builder()
        out, x, y = b.buffer(dt, True), b.buffer(dt), b.buffer(dt)
        cond = b.buffer(dtypes.bool)
        i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 77))
        a, c, g = b.add(UOps.LOAD, dt, (x, i)), b.add(UOps.LOAD, dt, (y, i)), b.add(UOps.LOAD, dtypes.bool, (cond, i))
        acc = b.add(UOps.DEFINE_ACC, dt, (), dtypes.as_const(0, dt))
        for op in ops:
            float_only = op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT)
            if (float_only and not dtypes.is_float(dt)) or (
                dtypes.is_float(dt) and op in (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR)
            ):
                continue
            if dt == dtypes.bool and op in (
                BinaryOps.SUB,
                BinaryOps.DIV,
                BinaryOps.MOD,
                BinaryOps.SHL,
                BinaryOps.SHR,
                TernaryOps.MULACC,
            ):
                continue
            srcs = {1: (a,), 2: (a, c), 3: (g, a, c) if op is TernaryOps.WHERE else (a, c, a)}
            arity = 1 if isinstance(op, UnaryOps) else 3 if isinstance(op, TernaryOps) else 2
            rdt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPEQ) else dt
            r = b.alu(op, rdt, *srcs[arity])
            if rdt == dt:
                acc = b.add(UOps.PHI, dt, (acc, b.alu(BinaryOps.MAX, dt, acc, r)))
        b.add(UOps.STORE, None, (out, i, acc))
        compiler.compile(CUDARenderer().render(f"k_{dt.short_name}", b.uops))


# ***** kernels the linearizer makes, rendered for CUDA and compiled *****


def _tensor_cases() -> dict[str, Any]:
    """Tensor programs on PYTHON (only scheduled here, never run), by name."""
    from tgcore import Tensor

    rng = np.random.default_rng(0)

    def t(shape: tuple[int, ...], dt: Any = np.float32) -> Tensor:
        return Tensor(rng.standard_normal(shape).astype(dt), device="PYTHON")

    def ints() -> Tensor:
        return Tensor(rng.integers(-100, 100, (5, 6)).astype(np.int32), device="PYTHON")

    return {
        "elementwise": lambda: (t((7, 13)) * 2 + 1).exp2().sqrt().maximum(0.5),
        "matmul": lambda: t((7, 13)) @ t((13, 5)),
        "conv2d": lambda: t((2, 3, 9, 9)).conv2d(t((4, 3, 3, 3)), padding=1),
        "max_pool": lambda: t((2, 3, 9, 9)).max_pool2d(),
        "softmax": lambda: t((7, 13)).softmax(axis=1),
        "argmax": lambda: t((7, 13)).argmax(axis=0),
        "cumsum": lambda: t((7, 13)).cumsum(axis=1),
        "pad_shrink": lambda: t((7, 13)).pad(((1, 2), (0, 3))).shrink(((1, 5), (2, 9))) * 3,
        "int_ops": lambda: (ints() // 7) % 5 + (ints() << 2) - (ints() >> 1),
        "half": lambda: t((7, 13)).cast(dtypes.float16).sin() * 2,
        "bfloat16": lambda: t((7, 13)).cast(dtypes.bfloat16).relu().sum(axis=1),
        "where": lambda: (t((7, 13)) > 0).where(t((7, 13)), 1.5),
        "rand": lambda: Tensor.rand(17, 3, device="PYTHON") + 1,
        "uint8_int64": lambda: (ints().cast(dtypes.uint8) * 3).cast(dtypes.int64),
        "big_3d": lambda: t((70000, 2, 3)).sum(axis=2) + 1,
    }


@pytest.mark.parametrize("name", list(_tensor_cases()))
def test_linearized_kernels_compile(name: str, compiler: CUDACompiler) -> None:
    from tgcore.codegen.kernel import Kernel
    from tgcore.ops import BufferOps

    items = [si for si in _tensor_cases()[name]().schedule() if si.ast.op is BufferOps.STORE]
    assert items, f"{name}: no kernel scheduled"
    for si in items:
        for optimize in (
            False,
            True,
        ):  # as the linearizer gives it, and with the core's optimizations where it has them
            k = Kernel(si.ast, CUDARenderer())
            if optimize and hasattr(k, "hand_coded_optimizations"):
                k.hand_coded_optimizations()
            program = to_program(k)
            assert program.global_size is not None and program.local_size is not None
            ptx = compiler.compile(program.src).decode()
            assert f".entry {program.name}(" in ptx


# ***** launch sizes *****


@pytest.mark.parametrize(
    "flat,global_size,local_size,grid,block",
    [
        (True, (1000, 1, 1), (1, 1, 1), (4, 1, 1), (256, 1, 1)),
        (True, (33, 1, 1), (1, 1, 1), (1, 1, 1), (64, 1, 1)),
        (True, (1, 1, 1), (1, 1, 1), (1, 1, 1), (32, 1, 1)),
        (True, (513, 7, 3), (1, 1, 1), (3, 7, 3), (256, 1, 1)),
        (True, (0, 1, 1), (1, 1, 1), (0, 1, 1), (32, 1, 1)),
        (True, (2**31 - 1, 1, 1), None, (2**23, 1, 1), (256, 1, 1)),
        (False, (8, 2, 1), (16, 4, 1), (8, 2, 1), (16, 4, 1)),
        (False, (5,), (3,), (5, 1, 1), (3, 1, 1)),
    ],
)
def test_launch_dims(
    flat: bool,
    global_size: tuple[int, ...],
    local_size: tuple[int, ...] | None,
    grid: tuple[int, ...],
    block: tuple[int, ...],
) -> None:
    assert launch_dims(flat, global_size, local_size) == (grid, block)


def test_flat_kernel_with_a_workgroup_is_refused() -> None:
    with pytest.raises(ValueError, match="local_size"):
        launch_dims(True, (64, 1, 1), (8, 1, 1))


# ***** constants and rounding: compiled to PTX here, and run on this CPU through CUDAEMU *****

try:  # the suite's cases, where tg-conformance is installed (its absence skips these tests)
    from tg_conformance import uop_cases
    from tg_conformance.target import COMPILE, Target
except ImportError:
    uop_cases = None  # type: ignore[assignment]
EXACTNESS = (
    [pytest.param(builder, params, id=name) for name, builder, params in uop_cases.exactness_cases()]
    if uop_cases is not None
    else []
)


def _case(builder: Any, params: dict[str, Any], target: Target) -> Any:
    return builder(target, uop_cases.seeded_rng(str(params)), **params)


@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_no_contraction_compile(builder: Any, params: dict[str, Any]) -> None:
    # x - c with c a negative float constant was rendered x--1.5f (NVRTC refused it)
    t = Target.resolve("CUDA", COMPILE)
    uop_cases.run_case(t, _case(builder, params, t))


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16])
def test_a_times_b_plus_c_stays_two_roundings_in_the_ptx(compiler: CUDACompiler, dt: DType) -> None:
    if uop_cases is None:
        pytest.skip("needs tg-conformance")
    # -fmad=false: NVRTC writes mul.rn / add.rn, which ptxas may not fuse either; no fma instruction at all
    t = Target.resolve("CUDA", COMPILE)
    case = uop_cases.contraction(t, np.random.default_rng(0), dt)
    ptx = compiler.compile(CUDARenderer().render(case.kernel.name, case.kernel.uops)).decode()
    width = "f64" if dt == dtypes.float64 else "f32"
    assert "fma." not in ptx and "mad." not in ptx.replace("mad.lo", "")
    assert f"mul.rn.{width}" in ptx and (f"add.rn.{width}" in ptx or f"sub.rn.{width}" in ptx)


@pytest.fixture(scope="module")
def emulated() -> Any:
    """The CUDAEMU device (tg-cuda's renderer, the host's C++ compiler) registered in this process."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to emulate CUDA kernels with")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import host_emulation
    finally:
        sys.path.pop(0)
    host_emulation.register()
    yield Target.resolve(host_emulation.DEVICE)
    plugins.unregister("cudaemu")


@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_no_contraction_compute_exactly(
    builder: Any, params: dict[str, Any], emulated: Target
) -> None:
    uop_cases.run_case(emulated, _case(builder, params, emulated))


def test_two_reduces_that_stage_one_input_name_their_shared_arrays_apart(compiler: CUDACompiler) -> None:
    """A kernel of two matmuls reading one input (a gated FFN) stages that input once per reduce: each copy gets its
    own shared array, and the kernel compiles (it declared `stage0` twice, which NVRTC refuses)."""
    from tgcore import Tensor
    from tgcore.engine.realize import get_kernel

    x, w1, w3 = Tensor.rand(5, 32), Tensor.rand(32, 96), Tensor.rand(32, 96)
    src = to_program(get_kernel(CUDARenderer(), ((x @ w1) * (x @ w3)).schedule()[-1].ast)).src
    shared = [line.split()[2].split("[")[0] for line in src.splitlines() if "__shared__" in line]
    assert len(shared) >= 2 and len(shared) == len(set(shared)), shared
    compiler.compile(src)


# ***** names from outside (a model file's dimension names) in generated source *****


def hostile_names(marker: str) -> list[str]:
    """Variable names that would break out of an identifier (some run `touch marker` if pasted into the source),
    keywords, and names the renderer, CUDA or the core use themselves."""
    shell = f'system("touch {marker}")'
    return [
        f"N\n#define N ({shell}, 4)\n",
        f"n; {shell}; int m",
        f"n */ {shell}; /* x",
        f'n // x\n"{shell}" %d \\',
        "two words",
        "naïve 名前",
        "int",
        "return",
        "threadIdx",
        "blockIdx",
        "gidx0",
        "acc0",
        "data0",
        "loop0",
        "half",
    ]


def _hostile_kernels(name: str, device: str = "PYTHON") -> tuple[list[Any], list[np.ndarray]]:
    """Two tensor programs on `device` over a Variable named `name` (the first with a second, plain Variable), and
    numpy's answers."""
    from tgcore import Tensor, Variable

    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    a = Tensor(x[:4, :5].copy(), device=device).reshape(Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5))
    b = Tensor(x[:, :5].copy(), device=device).reshape(6, Variable(name, 1, 7).bind(5))
    return [(a * 2 + 1).sum(), (b * 3 - 1).sum(1)], [(x[:4, :5] * 2 + 1).sum(), (x[:, :5] * 3 - 1).sum(1)]


@pytest.mark.parametrize("index", range(len(hostile_names(""))))
def test_a_hostile_variable_name_renders_and_compiles_to_ptx(
    index: int, compiler: CUDACompiler, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgcore.codegen.kernel import Kernel

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    name = hostile_names(str(marker))[index]
    for out in _hostile_kernels(name)[0]:
        program = to_program(Kernel(out.schedule()[-1].ast, CUDARenderer()))
        assert name not in program.src or name.isidentifier()  # (a plain word may be part of others: int, acc0)
        assert f".entry {program.name}(" in compiler.compile(program.src).decode()
    assert not marker.exists() and not os.listdir(tmp_path)


@pytest.mark.parametrize("index", [0, 2, 6, 8])
def test_a_hostile_variable_name_computes_numpys_result_on_emulated_cuda(
    index: int, emulated: Target, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    outs, wants = _hostile_kernels(hostile_names(str(marker))[index], emulated.name)
    for out, want in zip(outs, wants):
        np.testing.assert_array_equal(out.numpy(), want)
    assert not marker.exists() and not os.listdir(tmp_path)


def test_a_compile_error_shows_the_line_the_log_points_at_and_reports_the_rest(
    compiler: CUDACompiler, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the user's temp folder, and so the report, go here
    src = "".join(f"// padding line {i} {'.' * 100}\n" for i in range(150))
    src += 'extern "C" __global__ void f(int* a) {\n  a[0] = nope;\n}\n'
    with pytest.raises(CompileError) as info:
        compiler.compile(src)
    text = str(info.value)
    assert len(text) < 2000 and ">  152 |   a[0] = nope;" in text and '   151 | extern "C"' in text
    report = text.rsplit("--- the whole log and source: ", 1)[1].split(" ---")[0]
    assert report.startswith(str(tmp_path))
    with open(report) as f:
        assert src in f.read()


def test_a_ptxas_removed_mid_run_is_a_compile_error_that_names_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = "{}.{}".format(*load_nvrtc().version)
    ptxas = tmp_path / "ptxas-that-goes"
    ptxas.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.0"\n')
    ptxas.chmod(0o755)
    monkeypatch.setenv("TG_CUDA_PTXAS", str(ptxas))
    compiler = CUDACompiler(90)
    assert compiler.ptxas is not None and compiler.ptxas.path == str(ptxas)
    os.unlink(ptxas)
    with pytest.raises(CompileError, match="ptxas-that-goes cannot be run .*No such file.*TG_CUDA_PTXAS=0"):
        compiler.compile(_render_elementwise())


def _render_elementwise() -> str:
    return CUDARenderer().render("E_100", elementwise(BinaryOps.ADD, dtypes.float32))
