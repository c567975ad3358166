"""Lowering and running a schedule: each ScheduleItem becomes an ExecItem (a compiled kernel, a copy, ...)."""

from __future__ import annotations

import functools
import hashlib
import pathlib
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Optional

from tgcore.codegen.kernel import Kernel
from tgcore.codegen.program import to_program
from tgcore.device import Buffer, Device
from tgcore.engine.runner import (  # (the runners and the thread pool lived here: their old names still work)
    BufferCopy,
    CompiledRunner,
    CustomRunner,
    EmptyRunner,
    Runner,
    _run_threaded,
    compile_pool,
    parts_per_thread,
    thread_count,
)
from tgcore.engine.search import beam_search
from tgcore.helpers import BEAM, DEBUG, NOOPT, GlobalCounters, colored, diskcache_get, diskcache_put, getenv
from tgcore.ops import BufferOps, LazyOp, LoadOps
from tgcore.plugin import ProgramSpec, Renderer
from tgcore.shape.symbolic import Variable

__all__ = [
    "BufferCopy",
    "CompiledRunner",
    "CustomRunner",
    "EmptyRunner",
    "ExecItem",
    "Runner",
    "_run_threaded",
    "compile_ahead",
    "get_kernel",
    "get_runner",
    "lower_schedule_item",
    "parts_per_thread",
    "raise_if_counted",
    "run_schedule",
    "thread_count",
]


_runner_cache: dict[tuple[Any, ...], CompiledRunner] = {}
# the same, by the identity of the AST object: a cached schedule hands out the same ASTs again, and this lookup
# costs no walk of the AST (the AST is kept with its runner, so its id is not reused)
_runner_by_id: dict[tuple[int, str, int, int], tuple[LazyOp, CompiledRunner]] = {}


def _exact_consts(ast: LazyOp) -> tuple[Any, ...]:
    """The AST's constants as values that tell 0.0 from -0.0 (which LazyOp equality does not)."""
    return tuple(
        (float, x.arg.val.hex()) if isinstance(x.arg.val, float) else (type(x.arg.val), x.arg.val)
        for x in ast.lazyops()
        if x.op is BufferOps.CONST
    )


def get_kernel(renderer: Renderer, ast: LazyOp, device: Optional[str] = None) -> Kernel:
    """The Kernel for `ast`, optimized for `renderer` unless NOOPT: with BEAM=n (and the device to time it on) the
    fastest form a beam search finds, else the hand-coded heuristics' choice."""
    k = Kernel(ast, renderer)
    if NOOPT:
        pass
    elif BEAM >= 1 and device is not None:
        k = beam_search(k, device, BEAM.value)
    else:
        k.hand_coded_optimizations()
    if DEBUG >= 3:
        print(f"{k.name}: {k.applied_opts}")
    return k


# the disk table of rendered kernels: a new process that meets a kernel it has seen skips optimizing, linearizing
# and rendering it (its compiled bytes are then found in the compiler's own table, by source)
PROGRAM_TABLE = "program"
# the core's modules whose code decides what a kernel becomes: a change to any of them changes the key
_LOWERING_MODULES = ("codegen", "renderer", "shape", "ops.py", "dtype.py", "plugin.py", "engine/realize.py")


@functools.lru_cache(maxsize=None)
def _code_digest(extra: tuple[str, ...]) -> str:
    """sha256 of the source of the core's lowering modules and of the files in `extra` (a renderer's module)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    files: list[pathlib.Path] = []
    for name in _LOWERING_MODULES:
        path = root / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    files.extend(pathlib.Path(f) for f in extra)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes() if f.is_file() else b"<missing>")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _package_files(module_names: tuple[str, ...]) -> tuple[str, ...]:
    """Every .py file of the top-level packages that define these modules (a plugin's renderer and compiler): a change
    anywhere in the plugin (a helper its renderer imports) changes the key, not only the files of the two classes."""
    files: list[str] = []
    for name in module_names:
        top = sys.modules.get(name.split(".")[0])
        where = getattr(top, "__file__", None)
        if where is None:
            continue
        folder = pathlib.Path(where).parent
        found = sorted(folder.rglob("*.py")) if pathlib.Path(where).name == "__init__.py" else [pathlib.Path(where)]
        files.extend(str(f) for f in found if "tgcore" not in f.relative_to(folder.parent).parts[:1])
    return tuple(dict.fromkeys(files))


def _settings_repr(obj: Any) -> str:
    """The class and every setting of a renderer or compiler (class attributes, then the instance's own)."""
    cls = type(obj)
    attrs: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        attrs.update({k: v for k, v in vars(klass).items() if not k.startswith("__") and not callable(v)})
    attrs.update(getattr(obj, "__dict__", {}))
    plain = [(k, repr(v)) for k, v in attrs.items() if not isinstance(v, (staticmethod, classmethod, property))]
    # (a value shown by its address, a handle, differs in every process: it is no setting the key could match)
    return f"{cls.__module__}.{cls.__qualname__}{sorted((k, r) for k, r in plain if ' at 0x' not in r)}"


def _ast_text(ast: LazyOp) -> str:
    """The AST as text, each node once (by identity: a shared subtree is written once, not once per use)."""
    lines: list[str] = []
    _ast_lines(ast, {}, lines)
    return "\n".join(lines)


def _ast_lines(n: LazyOp, index: dict[int, int], lines: list[str]) -> int:
    """_ast_text's walk: n's line number, its sources written first (a function of its own, not a recursive closure:
    that would be a reference cycle for the garbage collector)."""
    if (i := index.get(id(n))) is not None:
        return i
    srcs = [_ast_lines(x, index, lines) for x in n.src]
    lines.append(f"{n.op}|{srcs}|{n.arg!r}")
    index[id(n)] = len(lines) - 1
    return index[id(n)]


def _program_key(device: str, ast: LazyOp) -> Optional[str]:
    """The disk key of the rendered kernel for `ast` on `device` under this process's settings: everything that can
    change the program goes in (the AST with its exact constants, the renderer's and compiler's class and settings,
    the compiler's cache table, NOOPT, the code of the lowering modules); None when it is not cached (a BEAM search
    keeps its own table of choices, and a kernel with symbolic variables would need them rebuilt)."""
    if BEAM >= 1 or getenv("DISABLE_PROGRAM_CACHE") != 0:
        return None
    text = _ast_text(ast)
    if "Variable" in text or "Node" in text:  # symbolic shapes
        return None
    dev = Device[device]
    renderer, compiler = dev.renderer, dev.compiler
    if compiler.cachekey is None:
        return None
    modules = _package_files(tuple(type(x).__module__ for x in (renderer, compiler)))
    parts = (
        device,
        text,
        repr(_exact_consts(ast)),
        _settings_repr(renderer),
        _settings_repr(compiler),
        compiler.cachekey,
        str(NOOPT.value),
        _code_digest(modules),
    )
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def _stored_program(device: str, key: str) -> Optional[ProgramSpec]:
    """The ProgramSpec stored under `key`, or None when there is none or it is not what was stored (then the kernel
    is lowered again)."""
    try:
        val = diskcache_get(PROGRAM_TABLE, key)
        if not isinstance(val, dict):
            return None

        def sizes(v: Any) -> Optional[tuple[int, ...]]:
            if v is None:
                return None
            if not isinstance(v, (list, tuple)) or not all(type(n) is int for n in v):
                raise TypeError(f"launch size {v!r}")
            return tuple(v)

        name, src = val["name"], val["src"]
        if not isinstance(name, str) or not isinstance(src, str) or not src:
            return None
        extent = val["thread_extent"]
        if extent is not None and type(extent) is not int:
            return None
        ints = [val["op_estimate"], val["mem_estimate"]]
        if not all(type(n) is int for n in ints):
            return None
        return ProgramSpec(
            name,
            src,
            device,
            sizes(val["global_size"]),
            sizes(val["local_size"]),
            (),
            sizes(val["outputs"]) or (0,),
            ints[0],
            ints[1],
            [],
            extent,
        )
    except (KeyError, TypeError, ValueError):
        return None


def lower_program(device: str, ast: LazyOp) -> ProgramSpec:
    """The rendered kernel for `ast` on `device`: from the disk table of rendered kernels when this setting saw it
    before, else optimized, linearized and rendered (and stored there when it has no symbolic variables)."""
    key = _program_key(device, ast)
    if key is not None and (spec := _stored_program(device, key)) is not None:
        GlobalCounters.program_cache_hits += 1
        return spec
    spec = to_program(get_kernel(Device[device].renderer, ast, device))
    if key is not None and not spec.variables:
        val = {
            "name": spec.name,
            "src": spec.src,
            "global_size": spec.global_size,
            "local_size": spec.local_size,
            "outputs": spec.outputs,
            "op_estimate": int(spec.op_estimate),
            "mem_estimate": int(spec.mem_estimate),
            "thread_extent": spec.thread_extent,
        }
        diskcache_put(PROGRAM_TABLE, key, val)
    return spec


def _runner_key(device: str, ast: LazyOp) -> tuple[Any, ...]:
    return (device, ast, _exact_consts(ast), NOOPT.value, BEAM.value)


def _known_runner(device: str, ast: LazyOp, key: Optional[tuple[Any, ...]] = None) -> Optional[CompiledRunner]:
    """The runner already compiled for `ast` on `device` (under this optimization setting), or None."""
    by_id = (id(ast), device, NOOPT.value, BEAM.value)
    if (hit := _runner_by_id.get(by_id)) is not None and hit[0] is ast:
        return hit[1]
    if (runner := _runner_cache.get(key or _runner_key(device, ast))) is not None:
        _remember_by_id(by_id, ast, runner)
    return runner


def _remember_by_id(by_id: tuple[int, str, int, int], ast: LazyOp, runner: CompiledRunner) -> None:
    if len(_runner_by_id) >= 8192:
        _runner_by_id.clear()
    _runner_by_id[by_id] = (ast, runner)


def get_runner(device: str, ast: LazyOp) -> CompiledRunner:
    """The compiled kernel for `ast` on `device` (lowered and compiled once per process and optimization setting)."""
    by_id = (id(ast), device, NOOPT.value, BEAM.value)
    if (hit := _runner_by_id.get(by_id)) is not None and hit[0] is ast:
        return hit[1]
    key = _runner_key(device, ast)
    if (runner := _runner_cache.get(key)) is None:
        runner = _runner_cache[key] = CompiledRunner(device, lower_program(device, ast))
    _remember_by_id(by_id, ast, runner)
    return runner


def compile_ahead(schedule: list[Any]) -> Optional[tuple[int, Exception]]:
    """Lower the schedule's kernels that have no runner yet, in order on this thread (Python: it holds the GIL), and
    compile each on compile_pool's threads as soon as it is lowered, so that the C compiler of one (a process of its
    own) runs while the next is lowered and several compile at once on several cores: on devices whose Compiler is
    `concurrent` (the others' kernels compile in get_runner, one at a time). A compiler that builds several sources in
    one run (Compiler.batch) gets them in groups of up to that many, as each group is lowered. The runners go into the
    cache that get_runner reads, in schedule order. A kernel that fails to lower or compile stops it: returned as (its
    index in the schedule, the error), which run_schedule raises when it comes to that kernel, after the kernels
    before it have run, as they would have one by one; the kernels after it are not loaded."""
    if BEAM >= 1:  # the search times every candidate on the device: one kernel at a time
        return None
    kernels = [(i, si) for i, si in enumerate(schedule) if si.ast.op is BufferOps.STORE]
    if len(kernels) < 2:  # (the common case of a realize in a loop: nothing to look up here)
        return None
    pending: list[tuple[int, str, LazyOp, tuple[Any, ...]]] = []
    keys: set[tuple[Any, ...]] = set()
    for i, si in kernels:
        device = si.outputs[0].device
        if not Device[device].compiler.concurrent:  # (its kernels compile one at a time in get_runner)
            continue
        hit = _runner_by_id.get((id(si.ast), device, NOOPT.value, BEAM.value))
        if hit is not None and hit[0] is si.ast:  # compiled before: no walk of the AST
            continue
        key = _runner_key(device, si.ast)
        if key not in keys and _known_runner(device, si.ast, key) is None:
            keys.add(key)
            pending.append((i, device, si.ast, key))
    if len(pending) < 2:  # nothing to overlap: get_runner compiles it when it is reached
        return None
    threads = min(thread_count(), len(pending))
    pool = compile_pool(threads)
    # groups of a compiler's `batch` kernels build in one run, but never so few groups that a core idles
    group_size = max(1, -(-len(pending) // (2 * threads)))
    jobs: list[tuple[int, str, tuple[Any, ...], ProgramSpec, Future[list[Any]], int]] = []
    group: list[tuple[int, str, tuple[Any, ...], ProgramSpec]] = []

    def submit_group() -> None:
        if group:
            job = pool.submit(_compile_group, Device[group[0][1]].compiler, [spec.src for *_, spec in group])
            jobs.extend((*entry, job, k) for k, entry in enumerate(group))
            group.clear()

    failed: Optional[tuple[int, Exception]] = None
    for i, device, ast, key in pending:
        try:
            spec = lower_program(device, ast)
        except Exception as e:
            failed = (i, e)
            break
        size = min(Device[device].compiler.batch, group_size)
        if group and (group[0][1] != device or any(g[3].name == spec.name for g in group)):
            submit_group()  # (a group is one device's, and its kernels' names differ)
        group.append((i, device, key, spec))
        if len(group) >= size:
            submit_group()
    submit_group()
    for i, device, key, spec, job, k in jobs:
        try:
            lib = job.result()[k]
            if isinstance(lib, Exception):
                raise lib
            runner = CompiledRunner(device, spec, lib)
        except Exception as e:  # (an earlier kernel than a lowering failure: it comes first)
            return i, e
        _runner_cache[key] = runner
    return failed


def _compile_group(compiler: Any, srcs: list[str]) -> list[Any]:
    """The compiled bytes of each source, or the error that compiling it alone raised: built together where the
    compiler takes several at once (Compiler.batch), else one by one; a failed group is built again one by one, so
    that each error is its own kernel's and the others still build."""
    if len(srcs) > 1:
        try:
            return compiler.compile_cached_many(srcs)
        except Exception:  # (its kernels again, alone: the error is the one that fails)
            pass
    out: list[Any] = []
    for src in srcs:
        try:
            out.append(compiler.compile_cached(src))
        except Exception as e:
            out.append(e)
    return out


@dataclass
class ExecItem:
    """A Runner bound to its buffers."""

    prg: Runner
    bufs: list[Buffer]
    # a check's kernel (engine/schedule.py): (error, message), raised after the run when its 1-element count is not 0
    check: Optional[tuple[type, str]] = None

    def run(self, var_vals: Optional[dict[Variable, int]] = None, wait: bool = False) -> Optional[float]:
        et = _run(self.prg, self.bufs, var_vals or {}, wait)
        if self.check is not None:
            raise_if_counted(self.bufs[0], self.check)
        return et


def raise_if_counted(buffer: Buffer, check: tuple[type, str]) -> None:
    """Raise the check's error if its count (a 1-element int32 buffer) is not 0."""
    raw = bytearray(4)
    buffer.copyout(memoryview(raw))
    if (n := int.from_bytes(raw, "little", signed=True)) != 0:
        error, message = check
        raise error(f"{message} (found {n} time{'s' if n != 1 else ''})")


def _run(prg: Runner, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool) -> Optional[float]:
    """Run `prg` on `bufs` (allocating the ones that have no memory yet) and count it in GlobalCounters."""
    for b in bufs:
        if b._opaque is None:
            b.allocate()
    debug = DEBUG.value
    et = prg(bufs, var_vals, wait=wait or debug >= 2)
    if isinstance(prg, CompiledRunner):
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += prg.op_estimate
        GlobalCounters.global_mem += prg.mem_estimate
    if et is not None:
        GlobalCounters.time_sum_s += et
    if debug >= 2:
        t = f"{et * 1e6:9.2f} us" if et is not None else " " * 12
        print(
            f"{colored(f'*** {bufs[0].device:7s} {GlobalCounters.kernel_count:4d}', 'green')} "
            f"{prg.display_name:40s} {t}  mem {GlobalCounters.mem_used / 1e6:8.2f} MB"
        )
    return et


def lower_schedule_item(si: Any) -> ExecItem:
    """The ExecItem that carries out one ScheduleItem."""
    bufs = list(si.bufs)
    if si.ast.op is BufferOps.STORE:
        return ExecItem(get_runner(si.outputs[0].device, si.ast), bufs)
    if si.ast.op is LoadOps.COPY:
        return ExecItem(BufferCopy(), bufs)
    if si.ast.op is LoadOps.CUSTOM:
        return ExecItem(CustomRunner(si.ast.arg), bufs)
    if si.ast.op is LoadOps.EMPTY:
        return ExecItem(EmptyRunner(), bufs)
    raise NotImplementedError(f"cannot lower a schedule item of {si.ast.op}")


def run_schedule(schedule: list[Any], var_vals: Optional[dict[Variable, int]] = None) -> None:
    """Run every item in order, then mark its outputs realized."""
    vals = var_vals or {}
    if len(schedule) == 1:  # one kernel (an op realized in a loop): launched without the general loop's bookkeeping
        si = schedule[0]
        if si.ast.op is BufferOps.STORE and si.check is None and not _capturing.stack:
            out = si.outputs[0]
            _run(get_runner(out.device, si.ast), [*si.bufs], vals, False)
            out.realized, out.srcs = out.buffer, ()
            return
    # a schedule made from a cached template that ran before has its kernels compiled: nothing to look for
    template = getattr(schedule, "template", None)
    failed = None if template is not None and template.ran else compile_ahead(schedule)
    for i, si in enumerate(schedule):
        if failed is not None and i == failed[0]:
            raise failed[1]
        if capturing_stack := _capturing.stack:  # TinyJit records the ExecItem (this thread's)
            ei = lower_schedule_item(si)
            ei.check = si.check
            capturing = capturing_stack[-1]
            _run(ei.prg, ei.bufs, vals, False)
            capturing(ei, vals)
            if si.check is not None:
                raise_if_counted(ei.bufs[0], si.check)
        elif si.ast.op is BufferOps.STORE:  # a kernel: launched without an ExecItem (what lower_schedule_item does)
            _run(get_runner(si.outputs[0].device, si.ast), [*si.bufs], vals, False)
            if si.check is not None:
                raise_if_counted(si.outputs[0].buffer, si.check)
        else:
            lower_schedule_item(si).run(vals)
        for out in si.outputs:
            out.realized = out.buffer
            out.srcs = ()
    if template is not None:
        template.ran = True


# TinyJit registers a callback here while it records a function's kernels
# .stack: per thread, the callbacks of the TinyJits recording (only this thread's kernels go to its recording)
class _Capturing(threading.local):
    stack: Any = ()  # (a thread that never recorded: a class default, read without getattr's missed-attribute cost)


_capturing = _Capturing()
