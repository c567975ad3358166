"""CLANG kernels built by GCC and by clang, for CPUs without AVX-512 or native fp16 (-march=x86-64-v2, x86-64-v3,
skylake-avx512) as well as this one, run here, give the same bits: as numpy, and as the default build.

A kernel built for a lesser -march runs on this CPU, so every target is checked by running it. A compiler that is
not installed, a -march it does not know or one whose code this CPU cannot run is a skip that says which."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest
from tg_clang import ClangCompiler, ClangProgram, ClangRenderer, Toolchain, check_toolchain
from tg_clang.compiler import GCC_CFLAGS
from tg_clang.renderer import KERNEL_PRELUDE
from tg_clang.toolchain import MARCH_ENV
from tg_conformance import reference as ref
from tg_conformance import uop_cases as cases
from tg_conformance.kernels import run_alu
from tg_conformance.target import RUN, Target

from tgcore import Device, Tensor, dtypes
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOps
from tgcore.dtype import bf16_round
from tgcore.engine.realize import get_kernel
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps
from tgcore.plugin import CompileError

X86 = platform.machine().lower() in ("x86_64", "amd64")
# CPUs without AVX-512 (v2: SSE4.2, no FMA or F16C; v3: AVX2, FMA, F16C) and with AVX-512 but not AVX512-FP16
MARCHES = ("x86-64-v2", "x86-64-v3", "skylake-avx512") if X86 else ()
COMPILERS = ("gcc", "clang")
CONFIGS = [pytest.param(cc, march, id=f"{cc}-{march}") for cc in COMPILERS for march in ("native", *MARCHES)]
F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64


def toolchain(cc: str, march: str) -> Toolchain:
    """The toolchain of `cc` for `march`, or a skip that says why it cannot be tested here."""
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed (e.g. apt-get install {cc}): its CLANG builds are not tested")
    try:
        tc = Toolchain.resolve(cc, march)
    except CompileError as e:
        pytest.skip(f"{cc} does not know -march={march}: {e.log.splitlines()[0] if e.log else e}")
    if missing := tc.missing_on_host():
        pytest.skip(f"this CPU cannot run -march={march} code: it lacks {', '.join(missing)}")
    return tc


def target(tc: Toolchain) -> Target:
    """The CLANG device as the conformance suite tests it, built by `tc`."""
    return Target("CLANG", RUN, Device.specs()["CLANG"], ClangRenderer(tc), ClangCompiler(tc), ClangProgram, None)


# ***** level-3 uop kernels: float16 and bfloat16 arithmetic, conversions, constants, no contraction *****

UOP_CASES: list[tuple[Callable[..., cases.Case], dict[str, Any]]] = [
    *[
        (cases.alu, {"op": op, "dtype": dt})
        for dt in (F16, BF16)
        for op in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV, TernaryOps.MULACC, BinaryOps.MAX)
    ],
    (cases.alu, {"op": UnaryOps.SQRT, "dtype": F16}),
    (cases.alu, {"op": TernaryOps.MULACC, "dtype": F32}),
    (cases.alu, {"op": TernaryOps.MULACC, "dtype": F64}),
    *[
        (cases.convert, {"uop": UOps.CAST, "dtype": src, "dst": dst})
        for src, dst in ((F32, F16), (F64, F16), (F16, BF16), (BF16, F16), (F32, BF16), (F64, BF16), (BF16, F32))
        + ((dtypes.int32, BF16), (dtypes.int64, F16), (F16, dtypes.int32), (BF16, dtypes.bool))
    ],
    *[
        (cases.convert, {"uop": UOps.BITCAST, "dtype": src, "dst": dst})
        for src, dst in ((F16, dtypes.int16), (BF16, dtypes.uint16), (dtypes.uint16, BF16), (F16, BF16))
    ],
    *[(cases.contraction, {"dtype": dt}) for dt in (F16, BF16, F32, F64)],
    *[
        (cases.const_operand, {"dtype": dt, "value": v})
        for dt, v in ((dtypes.int32, -(2**31)), (dtypes.int64, -9), (F16, -0.0), (BF16, -1.5), (F32, -0.0))
    ],
]


@pytest.mark.parametrize("cc,march", CONFIGS)
def test_narrow_floats_conversions_constants_and_contraction_are_exact(cc: str, march: str) -> None:
    # the user's case: GCC without AVX512-FP16 kept (a*b) in float inside ((a*b)+c) on _Float16: MULACC(-100.5, 7.25,
    # 7.25) gave -721.5 instead of -721.0
    t = target(toolchain(cc, march))
    failures = []
    for builder, params in UOP_CASES:
        name = f"{builder.__name__}[{','.join(map(str, params.values()))}]"
        try:
            cases.run_case(t, builder(t, cases.seeded_rng(name), **params))
        except AssertionError as e:
            failures.append(f"{name}: {str(e)[:600]}")
    assert not failures, f"{cc} -march={march}: {len(failures)} of {len(UOP_CASES)} cases differ:\n" + "\n".join(
        failures[:4]
    )


def test_the_users_mulacc_case_on_every_compiler_without_avx512_fp16() -> None:
    cols = [np.array([-100.5], np.float16), np.array([7.25], np.float16), np.array([7.25], np.float16)]
    assert ref.alu_reference(TernaryOps.MULACC, F16, cols)[0] == -721.0  # (-728.625 rounds to -728.5) + 7.25
    tested = 0
    for cc in COMPILERS:
        for march in MARCHES[:2]:
            if shutil.which(cc) is None:
                continue
            t = target(Toolchain.resolve(cc, march))
            got = run_alu(t, TernaryOps.MULACC, F16, cols)
            assert got is not None and got[0] == -721.0, f"{cc} -march={march}: {got}"
            tested += 1
    if not tested:
        pytest.skip("no x86 -march without AVX512-FP16 to build for, or neither gcc nor clang installed")


# ***** whole kernels from tensors: vector widths and the header's vector routines *****


def run_with(tc: Toolchain, out: Tensor) -> np.ndarray:
    """`out` computed by kernels that `tc` builds (every kernel of its schedule, optimized for tc's target)."""
    renderer, compiler = ClangRenderer(tc), ClangCompiler(tc)
    schedule = out.schedule()
    for si in schedule:
        p = to_program(get_kernel(renderer, si.ast))
        program = ClangProgram("CLANG", p.name, compiler.compile_cached(p.src))
        bufs = [b if b.is_allocated() else b.allocate() for b in si.bufs]
        vals = tuple(si.var_vals[v] for v in p.variables)
        if p.thread_extent is not None:  # one thread: the whole outer loop
            vals += (0, p.thread_extent)
        program(*[b._opaque for b in bufs], vals=vals)
    return schedule[-1].outputs[0].buffer.numpy().reshape(out.shape)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def same_bits(got: np.ndarray, exp: np.ndarray) -> bool:
    """Bit for bit, but any NaN matches any NaN."""
    both_nan = np.isnan(got.astype(np.float64)) & np.isnan(exp.astype(np.float64))
    return bool(np.all((bits(got) == bits(exp)) | both_nan))


def _inputs(dt: type, n: int, seed: int) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(n) * 30).astype(dt)
    x[::17], x[5], x[6], x[7], x[8] = np.nan, np.inf, -np.inf, -0.0, 0.0
    return x


def tensor_programs() -> dict[str, tuple[Callable[[], Tensor], np.ndarray]]:
    """Name -> (a function making the lazy result, numpy's answer or None where the default build is the answer)."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 72)).astype(np.float32)
    f, g = _inputs(np.float32, 1024, 1), _inputs(np.float32, 1024, 2)
    d, e = _inputs(np.float64, 512, 3), _inputs(np.float64, 512, 4)
    h1, h2, h3 = (_inputs(np.float16, 640, s) / 8 for s in (5, 6, 7))
    b1, b2, b3 = (bf16_round(_inputs(np.float32, 640, s)) for s in (8, 9, 10))
    with np.errstate(all="ignore"):
        return {
            "matmul float32 (fused)": (lambda: _t(a) @ _t(b), None),
            # exp2 is the plugin's routine (within 1 ulp, numpy's may differ): the default build is the answer
            "exp2 sqrt max float32": (
                lambda: _t(f).exp2().abs().sqrt().maximum(_t(g)),
                None,
            ),
            "sqrt max float64": (
                lambda: _t(d).abs().sqrt().maximum(_t(e)),
                np.maximum(np.sqrt(np.abs(d)), e),
            ),
            "float16 a*b+c then *a": (
                lambda: (_t(h1) * _t(h2) + _t(h3)) * _t(h1),
                (h1 * h2 + h3) * h1,
            ),
            "bfloat16 a*b+c then *a": (
                lambda: (_bf16(b1) * _bf16(b2) + _bf16(b3)) * _bf16(b1),
                bf16_round(bf16_round(bf16_round(b1 * b2) + b3) * b1),
            ),
        }


def _t(x: np.ndarray) -> Tensor:
    return Tensor(x, device="CLANG")


def _bf16(x: np.ndarray) -> Tensor:
    return _t(x).cast(dtypes.bfloat16).realize()


@pytest.fixture(scope="module")
def default_results() -> dict[str, np.ndarray]:
    """Each program as the CLANG device computes it by default."""
    return {name: make().numpy() for name, (make, _) in tensor_programs().items()}


@pytest.mark.parametrize("cc,march", CONFIGS)
def test_tensor_kernels_match_numpy_and_the_default_build(
    cc: str, march: str, default_results: dict[str, np.ndarray]
) -> None:
    tc = toolchain(cc, march)
    for name, (make, expected) in tensor_programs().items():
        got = run_with(tc, make())
        assert same_bits(got, default_results[name]), f"{cc} -march={march}: {name} differs from the default build"
        if expected is not None:
            assert same_bits(got, expected.astype(got.dtype)), f"{cc} -march={march}: {name} differs from numpy"


def test_the_default_build_of_the_tensor_programs_matches_numpy(default_results: dict[str, np.ndarray]) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 72)).astype(np.float32)
    np.testing.assert_allclose(default_results["matmul float32 (fused)"], a @ b, rtol=1e-5, atol=1e-5)
    f, g = _inputs(np.float32, 1024, 1), _inputs(np.float32, 1024, 2)
    with np.errstate(all="ignore"):
        exp = np.maximum(np.sqrt(np.abs(np.exp2(f.astype(np.float64)))), g)
    np.testing.assert_allclose(default_results["exp2 sqrt max float32"], exp.astype(np.float32), rtol=3e-7)
    for name, (_, expected) in tensor_programs().items():
        if expected is not None:
            assert same_bits(default_results[name], expected.astype(default_results[name].dtype)), name


@pytest.mark.parametrize(
    "march,vector_bytes,registers", [("x86-64-v2", 16, 16), ("x86-64-v3", 32, 16), ("skylake-avx512", 64, 32)]
)
def test_vector_widths_follow_the_target(march: str, vector_bytes: int, registers: int) -> None:
    if not X86:
        pytest.skip("x86 -march values")
    tc = toolchain("gcc", march) if shutil.which("gcc") else toolchain("clang", march)
    renderer = ClangRenderer(tc)
    assert renderer.vector_widths[F32] == vector_bytes // 4 and renderer.vector_widths[F64] == vector_bytes // 8
    assert renderer.vector_registers == registers
    x = Tensor(np.arange(4096, dtype=np.float32), device="CLANG").realize()
    src = to_program(get_kernel(renderer, (x.exp2() + 1).schedule()[-1].ast)).src
    assert f"tg_float{vector_bytes // 4} " in src and f"tg_exp2f{vector_bytes // 4}(" in src.split("void ")[-1]


# ***** choosing the compiler and the target *****


def test_every_config_builds_the_probe_kernel() -> None:
    built = []
    for cc in COMPILERS:
        for march in ("native", *MARCHES):
            if shutil.which(cc) is None:
                continue
            try:
                tc = Toolchain.resolve(cc, march)
            except CompileError:
                continue
            if not tc.missing_on_host():
                assert check_toolchain(tc) is None, f"{cc} -march={march}: {check_toolchain(tc)}"
                built.append(f"{cc}-{march}")
    assert built, "no C compiler could be tested"


def test_cache_key_names_compiler_and_target() -> None:
    keys = set()
    for cc in COMPILERS:
        for march in ("native", *MARCHES[:2]):
            if shutil.which(cc) is not None:
                key = ClangCompiler(Toolchain.resolve(cc, march)).cachekey
                assert key.startswith(f"compile_clang_{cc}_") and key.isidentifier()
                keys.add(key)
    assert len(keys) == sum(shutil.which(cc) is not None for cc in COMPILERS) * (1 + len(MARCHES[:2]))


def test_gcc_only_flags_go_to_gcc_alone() -> None:
    seen = []
    for cc in COMPILERS:
        if shutil.which(cc) is None:
            continue
        tc = Toolchain.resolve(cc, "native")
        # (by its own word, __VERSION__, not its name: macOS's gcc is clang)
        assert tc.is_gcc == ("clang" not in tc.version.lower()), f"{cc} ({tc.version}): is_gcc {tc.is_gcc}"
        compiler = ClangCompiler(tc)
        assert all((flag in compiler.cflags) == tc.is_gcc for flag in GCC_CFLAGS), compiler.cflags
        src = KERNEL_PRELUDE + "void tg_probe(float *restrict a) { a[0] = a[0] * 2.0f + 1.0f; }\n"
        assert compiler.compile(src).startswith(b"\x7fELF") or sys.platform != "linux", f"{cc} built no shared object"
        seen.append(cc)
    assert seen, "no C compiler could be tested"


def _devices_line(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, env=env, check=True
    ).stdout
    return next(x for x in out.splitlines() if x.startswith("CLANG"))


@pytest.mark.parametrize(
    "march,says",
    [("not-a-cpu-tg", "rejects -march=not-a-cpu-tg"), ("x;y", "is not a -march value")]
    + ([("knl", "this CPU lacks")] if X86 else []),
)
def test_a_target_clang_cannot_use_is_unavailable_with_the_reason(march: str, says: str) -> None:
    env = {**os.environ, MARCH_ENV: march}
    if march == "knl":  # Xeon Phi's AVX512ER: the check needs a CPU without it (every CPU made since 2018)
        try:
            tc = Toolchain.resolve(None, march)
        except CompileError:
            pytest.skip("this compiler does not know -march=knl")
        if not tc.missing_on_host():
            pytest.skip("this CPU runs -march=knl code")
    line = _devices_line(env)
    assert "unavailable" in line and says in line, line


def test_clang_as_cc_builds_and_runs_kernels() -> None:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (e.g. apt-get install clang)")
    env = {**os.environ, "CC": "clang"}
    assert "unavailable" not in _devices_line(env)
    code = "from tgcore import Tensor; print(((Tensor([1.0, 4.0], device='CLANG') * 3).sqrt()).tolist())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert run.stdout.strip() == str(np.sqrt(np.array([3.0, 12.0], np.float32)).tolist())


def test_a_compiler_that_cannot_build_the_header_is_unavailable(tmp_path: Any) -> None:
    # a "compiler" that preprocesses like gcc but fails every build: the probe reports its error
    fake = tmp_path / "brokencc"
    fake.write_text(
        '#!/bin/sh\ncase "$*" in *-dM*) exec gcc "$@";; esac\necho \'error: this compiler is broken on purpose\' >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    if shutil.which("gcc") is None:
        pytest.skip("the fake compiler preprocesses with gcc")
    env = {**os.environ, "CC": str(fake), "CACHEDB": str(tmp_path / "cache.db")}
    line = _devices_line(env)
    assert "unavailable" in line and "cannot build a CLANG kernel" in line and "broken on purpose" in line, line


def test_dtype_claims_include_bfloat16() -> None:
    assert set(Device.specs()["CLANG"].dtypes) >= {F16, BF16, F32, F64}
