"""tg-clang: the CLANG device end to end, its compiler's errors, and isolation from broken plugins."""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from tg_clang.compiler import ClangCompiler
from tg_clang.toolchain import Toolchain
from tg_conformance import reference as ref
from tg_conformance import uop_cases
from tg_conformance.target import Target

from tgcore import Device, GlobalCounters, Tensor, Variable, dtypes, scratch
from tgcore.codegen.program import to_program
from tgcore.ops import BinaryOps
from tgcore.plugin import CompileError


def test_clang_is_available_and_default():
    assert Device.status("CLANG") is None
    assert "CLANG" in Device.available()


def test_elementwise_reduce_matmul_backward_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 13)).astype(np.float32), rng.standard_normal((13, 5)).astype(np.float32)
    ta, tb = Tensor(a, device="CLANG", requires_grad=True), Tensor(b, device="CLANG", requires_grad=True)
    np.testing.assert_allclose((ta * 2 - 1).exp().numpy(), np.exp(a * 2 - 1), rtol=1e-6)
    np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    loss = (ta @ tb).relu().sum()
    loss.backward()
    mask = ((a @ b) > 0).astype(np.float32)
    np.testing.assert_allclose(ta.grad.numpy(), mask @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ mask, rtol=1e-5, atol=1e-5)


def test_five_chained_elementwise_ops_are_one_kernel():
    x = Tensor(np.arange(10, dtype=np.float32), device="CLANG").realize()
    GlobalCounters.reset()
    out = ((((x + 1) * 2).sqrt() - 3) / 4).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(out, (np.sqrt((np.arange(10) + 1) * 2) - 3) / 4, rtol=1e-6)


def test_signed_overflow_wraps_like_numpy():
    big = np.array([2**31 - 1, -(2**31)], dtype=np.int32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal((Tensor(big, device="CLANG") + 1).numpy(), big + np.int32(1))
        np.testing.assert_array_equal((Tensor(big, device="CLANG") * 3).numpy(), big * np.int32(3))


def test_half_and_double():
    x = np.array([0.5, 1.5, -2.25, 1000.0], dtype=np.float16)
    np.testing.assert_array_equal((Tensor(x, device="CLANG") * 3).numpy(), x * np.float16(3))
    d = np.array([1e-300, 3.0, -7.5], dtype=np.float64)
    np.testing.assert_array_equal((Tensor(d, device="CLANG") / 3).numpy(), d / 3)


def test_bad_source_raises_compile_error_with_log():
    with pytest.raises(CompileError) as info:
        ClangCompiler().compile("void broken( { this is not C }")
    assert "error" in info.value.log.lower()
    assert "this is not C" in info.value.src


def test_kernels_built_together_each_load_from_the_one_library():
    # three kernels rendered for CLANG (their prelude once in the combined source): one shared object, in which each
    # program finds its own kernel by name and computes what the kernel built alone computes
    from tg_clang.runtime import ClangProgram

    from tgcore.engine.realize import get_kernel

    inputs = [np.linspace(-3, 3, n, dtype=np.float32) for n in (64, 48, 40)]
    xs = [Tensor(a, device="CLANG").realize() for a in inputs]
    ts = [xs[0] * 3, (xs[1] - 1).exp(), xs[2].sum()]
    specs = [to_program(get_kernel(Device["CLANG"].renderer, t.schedule()[-1].ast, "CLANG")) for t in ts]
    assert len({p.name for p in specs}) == 3
    libs = ClangCompiler().compile_many([p.src for p in specs])
    assert len(libs) == 3 and libs[0] == libs[1] == libs[2]
    for spec, t, x in zip(specs, ts, xs):
        out = Tensor.empty(*t.shape, device="CLANG").realize()
        ClangProgram("CLANG", spec.name, libs[0])(out.lazydata.buffer._opaque, x.lazydata.buffer._opaque, wait=True)
        np.testing.assert_allclose(out.numpy(), t.numpy(), rtol=1e-6)
    # sources it did not render (no prelude) build one by one
    plain = ["void tg_one(void **b, const long long *v) {}", "void tg_two(void **b, const long long *v) {}"]
    one, two = ClangCompiler().compile_many(plain)
    assert one != two


def test_missing_compiler_is_a_clear_unavailable_reason():
    env = {**os.environ, "CC": "no-such-compiler-tg"}
    out = subprocess.run(
        [sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, env=env, check=True
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("CLANG"))
    assert "unavailable" in line and "no-such-compiler-tg" in line
    code = "from tgcore import Tensor; Tensor([1.0], device='CLANG')"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert err.returncode != 0 and "no-such-compiler-tg" in err.stderr


def test_compiled_programs_are_cached(tmp_path):
    compiler = Device["CLANG"].compiler
    src = Device["CLANG"].renderer.render("cache_probe", [])
    lib = compiler.compile_cached(src)
    assert compiler.compile_cached(src) is lib


def test_broken_entry_point_is_listed_and_clang_still_works(tmp_path):
    dist = tmp_path / "brokenplug-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text("[tgcore]\nbroken = broken_tg_plugin\n")
    (tmp_path / "broken_tg_plugin.py").write_text("raise RuntimeError('this plugin is broken on purpose')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, env=env, check=True
    )
    broken = next(x for x in out.stdout.splitlines() if x.startswith("broken"))
    assert "broken on purpose" in broken
    assert any(x.startswith("CLANG") and "available" in x and "unavailable" not in x for x in out.stdout.splitlines())
    code = textwrap.dedent("""
        from tgcore import Tensor
        print((Tensor([1.0, 2.0], device='CLANG') * 3).tolist())
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert run.stdout.strip() == "[3.0, 6.0]"


def test_device_instances():
    x = Tensor([1.0, 2.0, 3.0], device="CLANG")
    y = x.to("CLANG:1") * 2
    assert y.device == "CLANG:1"
    np.testing.assert_allclose(y.to("CLANG").numpy(), [2.0, 4.0, 6.0])
    assert Tensor([1], dtype=dtypes.int8, device="CLANG:1").dtype == dtypes.int8


def test_shard_across_clang_instances_matches_unsharded():
    rng = np.random.default_rng(3)
    a, w = rng.standard_normal((9, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    x = Tensor(a, device="CLANG").shard(("CLANG:0", "CLANG:1"), axis=0)
    out = (x @ Tensor(w, device="CLANG").shard(("CLANG", "CLANG:1"))).relu().sum(axis=1)
    assert out.device == ("CLANG", "CLANG:1")
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ w, 0).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_index_math_is_64_bit_and_value_math_stays_int32():
    # loop variables and address arithmetic are `long` (fast with -fwrapv); an int32 value computed in the same
    # kernel still wraps at 32 bits, also when it reads the same shape numbers as the index math
    from tgcore.engine.realize import get_kernel

    big = np.random.default_rng(0).integers(-(2**31), 2**31, (96, 96), dtype=np.int64).astype(np.int32)
    big[0, :2] = [2**31 - 1, -(2**31)]
    t = Tensor(big, device="CLANG")
    out = (t * 65536 + t.T).sum(axis=1)
    with np.errstate(over="ignore"):
        ref = (big * np.int32(65536) + big.T).sum(axis=1, dtype=np.int32)
    ast = out.schedule()[-1].ast
    np.testing.assert_array_equal(out.numpy(), ref)
    src = to_program(get_kernel(Device["CLANG"].renderer, ast, "CLANG")).src
    assert "for (long " in src and "int alu" in src and "int val" in src


def test_exp2_is_within_one_ulp_and_vector_lanes_match_scalar_bits():
    # CLANG computes float32 exp2 with its own routine (vector registers instead of a libm call per element)
    from tg_conformance.checks import assert_exp2_within_one_ulp

    assert_exp2_within_one_ulp("CLANG")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_float_sum_of_products_rounds_once_per_step(dtype):
    # the renderer declares fused_mulacc: a matmul accumulates with fmaf / fma, k in order, optimized or not
    from tg_conformance.reference import fused_multiply_add

    from tgcore.codegen.kernel import Kernel, Opt, OptOps
    from tgcore.device import Buffer
    from tgcore.engine.realize import CompiledRunner, get_kernel
    from tgcore.helpers import Context

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 40)).astype(dtype), rng.standard_normal((40, 24)).astype(dtype)
    dt = dtypes.float32 if dtype == np.float32 else dtypes.float64
    fused, twice = np.zeros((6, 24), dtype), np.zeros((6, 24), dtype)
    for k in range(40):
        fused = np.array(
            [[fused_multiply_add(a[i, k], b[k, j], fused[i, j], dt) for j in range(24)] for i in range(6)], dtype
        )
        twice = twice + a[:, k : k + 1] * b[k : k + 1, :]
    assert not np.array_equal(fused, twice)  # the inputs tell one rounding from two
    out = Tensor(a, device="CLANG") @ Tensor(b, device="CLANG")
    si = out.schedule()[-1]
    src = to_program(get_kernel(Device["CLANG"].renderer, si.ast, "CLANG")).src
    assert ("fmaf(" if dtype == np.float32 else "fma(") in src
    np.testing.assert_array_equal(out.numpy(), fused)
    with Context(NOOPT=1):
        plain = (Tensor(a, device="CLANG") @ Tensor(b, device="CLANG")).numpy()
    np.testing.assert_array_equal(plain, fused)
    # vector accumulators over products of strided (VECTORIZE) or vector loads, scalar ones over vector products
    inputs = [x.base.buffer.allocate() for x in si.inputs]
    for opts in (
        [Opt(OptOps.UPCAST, 0, 2)],
        [Opt(OptOps.UPCAST, 1, 8)],
        [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4)],
        [Opt(OptOps.UPCAST, 0, 3), Opt(OptOps.UNROLL, 0, 0)],
    ):
        k = Kernel(si.ast, Device["CLANG"].renderer)
        k.apply_opts(opts)
        dest = Buffer("CLANG", 6 * 24, dt).allocate()
        CompiledRunner("CLANG", to_program(k))([dest] + inputs, {})
        np.testing.assert_array_equal(dest.numpy().reshape(6, 24), fused, err_msg=str(opts))
    # an elementwise multiply and add still round apart
    x, y, z = (rng.standard_normal(64).astype(dtype) for _ in range(3))
    np.testing.assert_array_equal(
        (Tensor(x, device="CLANG") * Tensor(y, device="CLANG") + Tensor(z, device="CLANG")).numpy(), x * y + z
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_max_and_sqrt_routines_match_numpy_bits(dtype):
    # an upcast kernel keeps MAX and SQRT whole (tg_max<n>, tg_sqrt<n>): NaN wins a max like numpy's, and a square
    # root is correctly rounded either way, so the vector kernel gives numpy's bits
    from tgcore.engine.realize import get_kernel

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(1024) * 100).astype(dtype), (rng.standard_normal(1024) * 100).astype(dtype)
    a[::9], b[::13], a[5], a[6], b[7] = np.nan, np.nan, np.inf, -np.inf, -0.0
    ta, tb = Tensor(a, device="CLANG"), Tensor(b, device="CLANG")
    out = ta.maximum(tb).abs().sqrt().maximum(tb)
    src = to_program(get_kernel(Device["CLANG"].renderer, out.schedule()[-1].ast, "CLANG")).src
    suffix = "f" if dtype == np.float32 else ""
    kernel = src.split("void ")[-1]  # (after the header's routines)
    assert f"tg_max{suffix}" in kernel and f"tg_sqrt{suffix}" in kernel and f" sqrt{suffix}(" not in kernel
    with np.errstate(invalid="ignore"):
        ref = np.maximum(np.sqrt(np.abs(np.maximum(a, b))), b)
    np.testing.assert_array_equal(out.numpy(), ref)


# ***** constants and rounding, the same on every compiler (see test_portability.py for other targets) *****

EXACTNESS = [pytest.param(builder, params, id=name) for name, builder, params in uop_cases.exactness_cases()]


@pytest.mark.parametrize("builder,params", EXACTNESS)
def test_negative_constants_and_no_contraction(builder, params):
    # x - c with c a negative constant was rendered x--9 (a decrement: no kernel built); a*b + c must round twice
    t = Target.resolve("CLANG")
    uop_cases.run_case(t, builder(t, uop_cases.seeded_rng(str(params)), **params))


def test_subtracting_a_negative_constant_from_a_realized_tensor():
    x = Tensor([8], dtype=dtypes.int32, device="CLANG").realize()
    assert (x - Tensor(-9, dtype=dtypes.int32, device="CLANG")).tolist() == [17]
    big = Tensor([1, -5], dtype=dtypes.int64, device="CLANG").realize()
    with np.errstate(over="ignore"):
        exp = np.array([1, -5], np.int64) - np.int64(-(2**63))
    np.testing.assert_array_equal((big - Tensor(-(2**63), dtype=dtypes.int64, device="CLANG")).numpy(), exp)
    f = Tensor([2.0, -0.0], device="CLANG").realize()
    np.testing.assert_array_equal((f - Tensor(-0.0, device="CLANG")).numpy(), np.array([2.0, -0.0]) - -0.0)
    np.testing.assert_array_equal((f * -1.5).numpy(), np.array([-3.0, 0.0], np.float32))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16])
def test_tensor_a_times_b_plus_c_rounds_twice(dtype):
    # inputs where one rounding of a*b+c gives the product's error and two give 0: any contraction shows
    a, b, c = uop_cases.contraction_inputs(dtype, 256, np.random.default_rng(1))
    ta, tb, tc = (Tensor(v, device="CLANG").cast(dtype) for v in (a, b, c))
    got = (ta * tb + tc).float().numpy()
    exp = ref.alu_reference(BinaryOps.ADD, dtype, [ref.alu_reference(BinaryOps.MUL, dtype, [a, b]), c])
    np.testing.assert_array_equal(got, exp.astype(np.float32))
    assert not np.any(got)  # every lane: exactly 0 (a fused sum would be the product's rounding error)


# ***** names from outside (a model file's dimension names) in generated C *****


def hostile_names(marker: str) -> list[str]:
    """Variable names that would break out of a C identifier (several run `touch marker` if pasted into the source),
    C keywords, and names the renderer, its header or the core use themselves."""
    shell = f'system("touch {marker}")'
    return [
        f"N\n#define N ({shell}, 4)\n",
        f"n; {shell}; int m",
        f"n */ {shell}; /* x",
        f"n // x\n{shell};",
        f'"{shell}"',
        "it's",
        "back\\slash\\",
        "%d %n",
        "two words",
        "naïve",
        "名前",
        "int",
        "return",
        "bufs",
        "vals",
        "gidx0",
        "ridx0",
        "acc0",
        "data0",
        "alu0",
        "core_start",
        "INFINITY",
        "fmaf",
        "tg_exp2f",
        "main",
    ]


@pytest.mark.parametrize("index", range(len(hostile_names(""))))
def test_a_hostile_variable_name_compiles_runs_and_runs_nothing_else(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a relative `touch` would land, too
    marker = tmp_path / "pwned"
    name = hostile_names(str(marker))[index]
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    # two Variables in one kernel: the hostile one and a plain one, bound to other values
    a = Tensor(x[:4, :5].copy(), device="CLANG").reshape(Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5))
    np.testing.assert_array_equal((a * 2 + 1).sum().numpy(), (x[:4, :5] * 2 + 1).sum())
    b = Tensor(x[:, :5].copy(), device="CLANG").reshape(6, Variable(name, 1, 7).bind(5))
    np.testing.assert_array_equal((b * 3 - 1).sum(1).numpy(), (x[:, :5] * 3 - 1).sum(1))
    assert not marker.exists() and not os.listdir(tmp_path)


def test_a_variable_named_like_the_thread_bounds_in_a_threaded_kernel():
    from tgcore.codegen.uops import UOps
    from tgcore.engine.realize import get_kernel

    x = np.arange(1024 * 300, dtype=np.float32).reshape(1024, 300) % 7
    a = Tensor(x, device="CLANG").reshape(1024, Variable("core_start", 1, 512).bind(300))
    out = (a * 2).sum(1)
    program = to_program(get_kernel(Device["CLANG"].renderer, out.schedule()[-1].ast, "CLANG"))
    assert program.thread_extent is not None  # the loop is split across threads: core_start / core_end are the core's
    names = [u.arg[0] for u in program.uops if u.op is UOps.DEFINE_VAR]
    assert names == ["var_core_start", "core_start", "core_end"]
    np.testing.assert_array_equal(out.numpy(), (x * 2).sum(1))


def test_a_long_fused_expression_is_threaded_at_a_smaller_size_than_an_add():
    # half the renderer's thread_min_work in elements: too few for an add to pay for a thread, enough for SiLU after
    # BatchNorm (~50 ops an element)
    from tgcore.engine.realize import get_kernel

    rows = Device["CLANG"].renderer.thread_min_work // 2 // 256
    x_np = np.random.default_rng(0).standard_normal((rows, 256)).astype(np.float32)
    x = Tensor(x_np, device="CLANG")
    plain, heavy = x + 1, ((x - 0.5) * 1.5).silu()
    for out, threaded in ((plain, False), (heavy, True)):
        program = to_program(get_kernel(Device["CLANG"].renderer, out.schedule()[-1].ast, "CLANG"))
        assert (program.thread_extent is not None) is threaded
    ref = (x_np - np.float32(0.5)) * np.float32(1.5)
    np.testing.assert_allclose(heavy.numpy(), ref / (1 + np.exp(-ref.astype(np.float64))), rtol=1e-6, atol=1e-30)


def test_a_scalar_max_is_a_select_of_bits_not_a_branch():
    """A max of one float32 or float64 value (a ReLU feeding a max pool, which reads its lanes one by one) is
    tg_maxf / tg_max, which selects bits under a mask (a C ternary on floats compiles to a branch, which random
    data mispredicts); it keeps numpy's NaN propagation and the sign of zero the max picks."""
    from tgcore.engine.realize import get_kernel

    for dt, np_dt, fn in ((dtypes.float32, np.float32, "tg_maxf("), (dtypes.float64, np.float64, "tg_max(")):
        x_np = np.array([[1.5, -2.0, np.nan, 0.0], [-0.0, 3.0, -np.inf, 7.0], [2.0, np.nan, -1.0, -5.0]], np_dt)
        x = Tensor(x_np, device="CLANG")
        out = x.relu().pad(((0, 0), (1, 1)), value=float("-inf")).reshape(1, 3, 6).max_pool2d((1, 3), (1, 2))[0]
        src = to_program(get_kernel(Device["CLANG"].renderer, out.schedule()[-1].ast, "CLANG")).src
        body = src[src.rindex("\nvoid ") :]  # (the kernel, after the header's routines)
        assert fn in body and "||" not in body
        xp = np.pad(np.maximum(x_np, 0, dtype=np_dt), ((0, 0), (1, 1)), constant_values=-np.inf)
        want = np.stack([xp[:, j : j + 3] for j in (0, 2)], 1).max(-1)
        got = out.numpy()
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


# ***** compile errors, compiler faults and what a killed compile leaves *****


def _wrapper(path, body: str) -> str:
    """A shell script at `path` standing in for the C compiler: `body`, then the real compiler with its arguments."""
    real = Toolchain.resolve().cc
    path.write_text(f'#!/bin/sh\n{body}\nexec "{real}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_compile_error_shows_the_lines_the_log_points_at_and_reports_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the user's temp folder, and so the report, go here
    lines = [f"int f{i}(int x) {{ return x * {i} + {i % 7}; /* {'padding ' * 6}*/ }}" for i in range(300)]
    lines[149] = "int f149(int x) { return y149; }"
    src = "\n".join(lines) + "\n"
    assert len(src) > 15000
    with pytest.raises(CompileError) as info:
        ClangCompiler().compile(src)
    text = str(info.value)
    assert len(text) < 3000 and text.count("\n") < 40
    assert info.value.log.strip().splitlines()[0] in text and "y149" in text
    assert ">  150 | int f149(int x) { return y149; }" in text  # the line the log points at, marked
    assert "   148 | " in text and "   152 | " in text and "   147 | " not in text and "   153 | " not in text
    report = text.rsplit("--- the whole log and source: ", 1)[1].split(" ---")[0]
    assert report.startswith(str(tmp_path / f"tgcore-{os.getuid()}" / "compile-errors"))
    with open(report, encoding="utf-8") as f:
        saved = f.read()
    assert src in saved and info.value.log in saved
    assert info.value.src == src and "y149" in info.value.log  # the error still carries both, whole
    restored = pickle.loads(pickle.dumps(info.value))  # (an error sent from another process)
    assert (restored.log, restored.src, str(restored)) == (info.value.log, src, text)


def test_a_compiler_removed_mid_run_is_a_compile_error_that_names_it(tmp_path):
    cc = _wrapper(tmp_path / "cc-that-goes", "")
    compiler = ClangCompiler(Toolchain.resolve(cc))
    assert compiler.compile("int f(void) { return 1; }\n")  # it works, then it is gone
    os.unlink(cc)
    with pytest.raises(CompileError, match="cc-that-goes cannot be run .*No such file.*set CC to a C compiler"):
        compiler.compile("int f(void) { return 2; }\n")
    (tmp_path / "cc-that-goes").write_text("#!/bin/sh\n")  # there, but not runnable
    with pytest.raises(CompileError, match="cc-that-goes cannot be run .*Permission denied"):
        compiler.compile("int f(void) { return 3; }\n")


def test_a_compiler_killed_by_a_signal_says_so(tmp_path):
    cc = _wrapper(tmp_path / "cc", 'case "$*" in *kernel.so*) kill -9 $$;; esac')
    with pytest.raises(CompileError, match=r"was killed by signal 9 \(exit code -9\)"):
        ClangCompiler(Toolchain.resolve(cc)).compile("int f(void) { return 1; }\n")


def _leftovers(tmpdir) -> list[str]:
    """What is in `tmpdir` but the user's folder, and the process folders in that."""
    user = f"tgcore-{os.getuid()}"
    found = [name for name in os.listdir(tmpdir) if name != user]
    if (tmpdir / user).exists():
        found += [f"{user}/{name}" for name in os.listdir(tmpdir / user) if name != "compile-errors"]
    return found


def _in_a_process(code: str, tmp_path, **env: str):
    """Run `code` in a new Python process with its own temp dir and disk cache (so that it compiles)."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "CACHEDB": str(tmp_path / "cache.db"), **env}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, start_new_session=True)


def test_a_compile_killed_by_sigkill_leaves_nothing_a_later_run_does_not_remove(tmp_path):
    (tmp_path / "tmp").mkdir()
    started = tmp_path / "started"
    # a compiler that hangs on the kernel with a Variable named hang_here, once it has read it
    cc = tmp_path / "cc"
    cc.write_text(
        f'#!/bin/sh\nsrc="$(cat)"\ncase "$src" in *var_hang_here*) touch "{started}"; sleep 120;; esac\n'
        f'printf "%s" "$src" | exec "{Toolchain.resolve().cc}" "$@"\n'
    )
    cc.chmod(0o755)
    code = """
        from tgcore import Tensor, Variable
        x = Tensor([1.0, 2.0, 3.0], device="CLANG").reshape(Variable("hang_here", 1, 5).bind(3))
        (x * 2).sum().item()
    """
    child = _in_a_process(code, tmp_path, CC=str(cc))
    try:
        for _ in range(600):
            if started.exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), f"the compile never started (exit code {child.poll()})"
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the Python process and the compiler under it
        child.wait()
    left = _leftovers(tmp_path / "tmp")
    assert len(left) == 1 and left[0].startswith(f"tgcore-{os.getuid()}/proc-{child.pid}-"), left
    assert os.listdir(tmp_path / "tmp" / left[0])  # the killed compile's folder, and its lock
    # a new process that compiles, with the system's compiler: it removes the dead process's folder, then its own
    later = _in_a_process(
        "from tgcore import Tensor; assert (Tensor([1.0], device='CLANG') + 1).item() == 2.0", tmp_path
    )
    assert later.wait(timeout=120) == 0
    assert _leftovers(tmp_path / "tmp") == []


def test_a_sweep_removes_only_the_folders_of_processes_that_are_gone(tmp_path):
    live, dead = tmp_path / "proc-1-live", tmp_path / "proc-2-dead"
    for folder in (live, dead):
        folder.mkdir()
        (folder / "lock").write_text("")
        (folder / "kernel.so").write_text("x")
    holder = os.open(live / "lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # (another open file holds it: as another process would)
    unfinished, young, other = tmp_path / ".new-abc", tmp_path / ".new-def", tmp_path / "not-ours"
    for folder in (unfinished, young, other):
        folder.mkdir()
    os.utime(unfinished, (time.time() - 3600, time.time() - 3600))
    try:
        assert sorted(scratch.sweep(str(tmp_path))) == sorted([str(dead), str(unfinished)])
    finally:
        os.close(holder)
    assert sorted(os.listdir(tmp_path)) == [".new-def", "not-ours", "proc-1-live"]
    assert scratch.sweep(str(tmp_path)) == [str(live)]  # its process is gone now


def test_a_run_that_ends_normally_leaves_nothing(tmp_path):
    (tmp_path / "tmp").mkdir()
    code = """
        import numpy as np
        from tgcore import Tensor
        a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="CLANG")
        assert (a @ a.T).numpy().tolist() == (np.arange(12).reshape(3, 4) @ np.arange(12).reshape(3, 4).T).tolist()
    """
    assert _in_a_process(code, tmp_path).wait(timeout=120) == 0
    assert _leftovers(tmp_path / "tmp") == []


def test_the_users_folder_is_private_and_someone_elses_is_never_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = scratch.user_folder()
    assert mine == str(tmp_path / f"tgcore-{os.getuid()}") and os.stat(mine).st_mode & 0o777 == 0o700
    os.rmdir(mine)
    os.symlink(tmp_path / "elsewhere", mine)  # a link planted where the folder goes: never followed
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setitem(scratch._state, "user", None)
    other = scratch.user_folder()
    assert other != mine and os.path.isdir(other) and not os.path.islink(other)
    assert os.stat(other).st_mode & 0o777 == 0o700 and os.listdir(tmp_path / "elsewhere") == []


def test_an_os_error_any_plugins_compiler_lets_through_is_a_compile_error(tmp_path, monkeypatch):
    from tgcore.device import Compiler

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class Careless(Compiler):
        def compile(self, src: str) -> bytes:
            raise FileNotFoundError(2, "No such file or directory", "/opt/gone/bin/cc")

    with pytest.raises(CompileError, match=r"Careless could not compile \(FileNotFoundError: .*/opt/gone/bin/cc") as e:
        Careless().compile_cached("int f(void) { return 0; }\n")
    assert e.value.src == "int f(void) { return 0; }\n" and isinstance(e.value.__cause__, FileNotFoundError)


def test_scratch_memory_fits_every_stack_a_kernel_may_run_on(monkeypatch):
    # a kernel's PACK blocks live on the stack of the thread that runs it: 512 KB where stacks are large, less where a
    # thread's may be small (a lowered stack limit, threading.stack_size, musl's 128 KB threads)
    import resource

    import tg_clang.renderer as renderer_module

    big = 8 << 20
    monkeypatch.setattr(resource, "getrlimit", lambda which: (big, resource.RLIM_INFINITY))
    monkeypatch.setattr(renderer_module.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert renderer_module._scratch_bytes(512 * 1024) == 512 * 1024
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 20, resource.RLIM_INFINITY))
    assert renderer_module._scratch_bytes(512 * 1024) == 128 * 1024
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    monkeypatch.setattr(renderer_module.threading, "stack_size", lambda: 256 * 1024)
    assert renderer_module._scratch_bytes(512 * 1024) == 32 * 1024
    monkeypatch.setattr(renderer_module.threading, "stack_size", lambda: 0)
    if sys.platform.startswith("linux"):
        monkeypatch.setattr(renderer_module.platform, "libc_ver", lambda: ("", ""))
        assert renderer_module._scratch_bytes(512 * 1024) == 16 * 1024
