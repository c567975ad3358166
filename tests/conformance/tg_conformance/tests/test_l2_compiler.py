"""Level 2: the device's contract (DeviceSpec and parts), and its compiler: a trivial kernel renders, compiles and
runs; bad source raises CompileError carrying the compiler's log."""
from __future__ import annotations

import math

import pytest

from tg_conformance import reference as ref
from tg_conformance.checks import assert_array
from tg_conformance.kernels import Kernel, KernelBuilder, execute, kernel_name
from tg_conformance.target import Target
from tgcore.device import Buffer, CompileError
from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps
from tgcore.plugin import ALL_DTYPES, PLUGIN_API_VERSION, version_refusal


def _trivial_dtype(target: Target) -> DType:
    for dt in (dtypes.int32, dtypes.float32, *target.spec.dtypes):
        if dt in target.spec.dtypes and dt != dtypes.bool:
            return dt
    pytest.skip(f"{target.name} claims no numeric dtype")


def trivial_kernel(target: Target, dt: DType, n: int = 33) -> Kernel:
    """out[i] = in[i] + 1."""
    b = KernelBuilder(target.renderer, kernel_name("trivial", dt.short_name))
    out, src = b.buffer(dt, n, writable=True), b.buffer(dt, n)
    one = b.const(dtypes.as_const(1, dt), dt)
    i = b.global_index(n)
    b.store(out, i, b.alu(BinaryOps.ADD, dt, b.load(src, i), one))
    return b.finish()


@pytest.mark.tg_op("DeviceSpec contract")
def test_device_spec_contract(target: Target) -> None:
    """The DeviceSpec names the device, targets this plugin API, claims known dtypes with a tolerance for each float."""
    spec = target.spec
    problems = []
    if spec.name != target.name.split(":")[0]:
        problems.append(f"spec.name is {spec.name!r}, expected {target.name.split(':')[0]!r}")
    # a plugin is built for the API version it names: this core's, or an older minor of the same major (2.0 on 2.1)
    if (refusal := version_refusal(spec.name, spec.api_version)) is not None:
        problems.append(f"spec.api_version is {spec.api_version}, this tgcore serves {PLUGIN_API_VERSION}: {refusal}")
    if not spec.dtypes:
        problems.append("spec.dtypes is empty")
    problems += [f"spec.dtypes has {dt!r}, which is not one of tgcore.plugin.ALL_DTYPES" for dt in spec.dtypes
                 if dt not in ALL_DTYPES]
    for dt in spec.dtypes:
        if not dtypes.is_float(dt):
            continue
        tol = spec.tolerances.get(dt)
        if tol is None:
            problems.append(f"spec.tolerances has no (atol, rtol) for claimed float dtype {dt.short_name}")
        elif len(tol) != 2 or not all(isinstance(t, (int, float)) and math.isfinite(t) and 0 <= t < 1 for t in tol):
            problems.append(f"spec.tolerances[{dt.short_name}] is {tol!r}: expected (atol, rtol), each in [0, 1)")
    if not callable(spec.probe):
        problems.append("spec.probe is not callable")
    assert not problems, f"DeviceSpec of {target.name} breaks the contract:\n  " + "\n  ".join(problems)


@pytest.mark.tg_op("renderer contract")
def test_renderer_contract(target: Target) -> None:
    """The renderer declares the attributes the optimizer reads and renders a kernel to text."""
    r = target.renderer
    problems = []
    gm = getattr(r, "global_max", "missing")
    if gm is not None and not (isinstance(gm, tuple) and gm and all(isinstance(x, int) and x > 0 for x in gm)):
        problems.append(f"global_max is {gm!r}: expected None (loops) or a tuple of positive ints")
    for attr in ("has_local", "has_shared", "vector_uops"):
        if not isinstance(getattr(r, attr, None), bool):
            problems.append(f"{attr} is {getattr(r, attr, 'missing')!r}: expected a bool")
    assert not problems, f"renderer {type(r).__name__} of {target.name}:\n  " + "\n  ".join(problems)
    k = trivial_kernel(target, _trivial_dtype(target))
    src = r.render(k.name, k.uops)
    assert isinstance(src, str) and src.strip(), f"render returned {src!r}: expected non-empty source text"


@pytest.mark.tg_op("compile")
def test_trivial_kernel_compiles(target: Target) -> None:
    """compile(src) gives bytes; compile_cached gives the same program."""
    target.require_compiler()
    k = trivial_kernel(target, _trivial_dtype(target))
    src = target.renderer.render(k.name, k.uops)
    lib = target.compiler.compile(src)
    assert isinstance(lib, bytes) and lib, f"compile returned {type(lib).__name__} of length {len(lib or b'')}"
    assert isinstance(target.compiler.compile_cached(src), bytes)


@pytest.mark.tg_op("compile and run")
def test_trivial_kernel_runs(executing: Target) -> None:
    """The runtime loads the compiled kernel by name and runs it: out[i] = in[i] + 1."""
    dt = _trivial_dtype(executing)
    x = ref.make_array(range(33), dt)
    out = execute(executing, trivial_kernel(executing, dt), {1: x})
    assert out is not None
    assert_array(f"trivial kernel out = in + 1 ({dt.short_name})", executing.name, out[0],
                 ref.make_array(range(1, 34), dt), inputs=[("in", x)])


@pytest.mark.tg_op("program reuse")
def test_trivial_kernel_program_is_reusable(executing: Target) -> None:
    """One loaded Program runs several times on different buffers."""
    dt = _trivial_dtype(executing)
    k = trivial_kernel(executing, dt, 8)
    lib = executing.compiler.compile(executing.renderer.render(k.name, k.uops))
    program = executing.runtime(executing.name, k.name, lib)
    launch = {"global_size": k.global_size, "local_size": k.local_size} if k.global_size else {}
    for start in (0, 100, -50):
        x = ref.make_array(range(start, start + 8), dt)
        out = Buffer(executing.name, 8, dt).allocate()
        src = Buffer(executing.name, 8, dt, initial_value=ref.to_bytes(x, dt))
        program(out._opaque, src._opaque, vals=(), wait=False, **launch)
        assert_array(f"run {start} of a reused program", executing.name, ref.from_bytes(bytes(out.as_buffer()), dt),
                     ref.make_array(range(start + 1, start + 9), dt))


@pytest.mark.tg_op("bad source")
@pytest.mark.parametrize("garbage", ["\n}}} @@@ this is not a program @@@ {{{\n",
                                     "\n#error tg-conformance: not a program\n"], ids=["braces", "directive"])
def test_bad_source_raises_compile_error_with_log(target: Target, garbage: str) -> None:
    """The rendered source with garbage appended raises CompileError; its message contains the compiler's log."""
    target.require_compiler()
    k = trivial_kernel(target, _trivial_dtype(target))
    src = target.renderer.render(k.name, k.uops) + garbage
    with pytest.raises(CompileError) as info:
        target.compiler.compile(src)
    err = info.value
    assert getattr(err, "log", "").strip(), f"CompileError carries no compiler log: {err!s}"
    assert err.log.strip().splitlines()[0] in str(err), (
        f"the CompileError message does not contain the compiler log\n--- message ---\n{err!s}\n--- log ---\n{err.log}")


@pytest.mark.tg_op("not source")
def test_text_that_is_not_source_raises_compile_error(target: Target) -> None:
    """Text that is no program at all raises CompileError (not a crash, not another exception)."""
    target.require_compiler()
    with pytest.raises(CompileError):
        target.compiler.compile("\x7f not a kernel \x7f")
