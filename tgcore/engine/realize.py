"""Lowering and running a schedule: each ScheduleItem becomes an ExecItem (a compiled kernel, a copy, ...)."""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tgcore.codegen.kernel import Kernel
from tgcore.device import Buffer, Device
from tgcore.helpers import BEAM, DEBUG, NOOPT, GlobalCounters, colored
from tgcore.ops import BufferOps, LazyOp, LoadOps
from tgcore.renderer import ProgramSpec, Renderer
from tgcore.shape.symbolic import Variable, sym_infer


class Runner:
    """Something an ExecItem runs on its buffers."""

    display_name: str = ""
    op_estimate: int = 0
    mem_estimate: int = 0

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        raise NotImplementedError


class CompiledRunner(Runner):
    """A kernel compiled for its device, ready to launch."""

    def __init__(self, device: str, p: ProgramSpec) -> None:
        self.device, self.p = device, p
        dev = Device[device]
        if DEBUG >= 4:
            print(p.src)
        self.lib = dev.compiler.compile_cached(p.src)
        self.clprg = dev.runtime(device, p.name, self.lib)
        self.display_name, self.op_estimate, self.mem_estimate = p.name, p.op_estimate, p.mem_estimate
        # the common CPU launch: no variables, threads or launch sizes, just the buffers
        self.plain_launch = not p.variables and p.thread_extent is None and p.global_size is None
        self.parts_per_thread = parts_per_thread(p.op_estimate, p.mem_estimate)

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        if self.plain_launch:
            return self.clprg(*[b._opaque for b in bufs], wait=wait)
        p = self.p
        vals = tuple(var_vals[v] for v in p.variables) if p.variables else ()
        if p.thread_extent is not None:
            return _run_threaded(
                self.clprg, [b._opaque for b in bufs], vals, p.thread_extent, wait, self.parts_per_thread
            )
        if p.global_size is None:
            return self.clprg(*[b._opaque for b in bufs], vals=vals, wait=wait)
        gs = tuple(sym_infer(s, var_vals) for s in p.global_size)
        return self.clprg(*[b._opaque for b in bufs], global_size=gs, local_size=p.local_size, vals=vals, wait=wait)


def thread_count() -> int:
    """Host threads a kernel may use: TGCORE_THREADS, else the cores this process may run on."""
    if (n := os.environ.get("TGCORE_THREADS", "")).isdigit() and int(n) > 0:
        return int(n)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# a kernel of at least this many ops, and this many per byte it moves, runs in 4 parts per thread, which threads take
# in turn (one that the machine runs slower takes fewer); any other in one part per thread: a part costs a GIL
# hand-off, and a kernel that mostly moves memory (a sum, an elementwise chain) shares one memory bus between the
# threads, which parts do not balance (a 4096 x 4096 row sum and a compensated 16M sum were 3-5% slower in 4 parts
# per thread; an elementwise chain with an exp the same in both)
_BALANCE_WORK = 1 << 24
_BALANCE_OPS_PER_BYTE = 1
_PARTS_PER_THREAD = 4


def parts_per_thread(op_estimate: int, mem_estimate: int) -> int:
    """The parts per thread of a threaded kernel that runs about `op_estimate` ops and moves `mem_estimate` bytes."""
    compute_bound = op_estimate >= _BALANCE_WORK and op_estimate >= mem_estimate * _BALANCE_OPS_PER_BYTE
    return _PARTS_PER_THREAD if compute_bound else 1


class _Workers:
    """Host threads that each run the job they are handed, then report back. The hand-off is two C-level locks per
    thread (about 12 us here, against 32 us through a ThreadPoolExecutor's queue and futures)."""

    def __init__(self, n: int) -> None:
        self.job: Callable[[], None] = lambda: None
        self.errors: list[BaseException] = []
        self.busy = threading.Lock()  # one job at a time: a caller that finds it taken runs its job alone
        self.start = [threading.Lock() for _ in range(n)]
        self.done = [threading.Lock() for _ in range(n)]
        for i, (start, done) in enumerate(zip(self.start, self.done)):
            start.acquire()
            done.acquire()
            threading.Thread(target=self._loop, args=(start, done), name=f"tgcore-kernel-{i}", daemon=True).start()

    def _loop(self, start: threading.Lock, done: threading.Lock) -> None:
        while True:
            start.acquire()
            try:
                self.job()
            except BaseException as e:  # handed to the caller
                self.errors.append(e)
            done.release()

    def run(self, job: Callable[[], None]) -> None:
        """Run `job` on every worker thread and on this one; return when all are done."""
        if not self.busy.acquire(blocking=False):
            job()
            return
        try:
            self.job = job
            for start in self.start:
                start.release()
            try:
                job()
            finally:
                for done in self.done:
                    done.acquire()
            if self.errors:
                raise self.errors.pop()
        finally:
            self.errors.clear()
            self.busy.release()


@functools.lru_cache(maxsize=None)
def _workers(n: int) -> _Workers:
    return _Workers(n)


if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads: it starts its own
    os.register_at_fork(after_in_child=_workers.cache_clear)


def _run_threaded(
    prg: Any, opaques: list[Any], vals: tuple[int, ...], extent: int, wait: bool, per_thread: int = 1
) -> Optional[float]:
    """Run a kernel whose outermost loop is bounded by its last two vals, in `per_thread` parts per thread that the
    threads take in turn. Each output element is written by exactly one part, so the result is the same on any
    number of threads."""
    threads = min(thread_count(), extent)
    st = time.perf_counter()
    if threads <= 1:
        prg(*opaques, vals=vals + (0, extent))
    else:
        parts = min(extent, threads * per_thread)
        bounds = [extent * i // parts for i in range(parts + 1)]
        turn = itertools.count()  # next() on it is atomic under the GIL

        def work() -> None:
            while (i := next(turn)) < parts:
                prg(*opaques, vals=vals + (bounds[i], bounds[i + 1]))

        _workers(threads - 1).run(work)
    return time.perf_counter() - st if wait else None


class BufferCopy(Runner):
    """Copies a buffer to another device (or to another buffer of the same size)."""

    display_name = "copy"

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        dest, src = bufs
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copy between buffers of {src.nbytes} and {dest.nbytes} bytes")
        st = time.perf_counter()
        allocator = Device[dest.device].allocator
        if hasattr(allocator, "transfer") and dest.device.split(":")[0] == src.device.split(":")[0]:
            allocator.transfer(
                dest._opaque, src._opaque, dest.nbytes, src_dev=Device[src.device], dest_dev=Device[dest.device]
            )
        else:
            dest.copyin(src.as_buffer())
        return time.perf_counter() - st if wait else None


class CustomRunner(Runner):
    """Runs a Python function on the buffers (LoadOps.CUSTOM)."""

    def __init__(self, fxn: Callable[..., None]) -> None:
        self.fxn, self.display_name = fxn, getattr(fxn, "__name__", "custom")

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        self.fxn(*bufs)
        return None


class EmptyRunner(Runner):
    """Allocation only."""

    display_name = "empty"

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        return None


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
        from tgcore.engine.search import beam_search

        k = beam_search(k, device, BEAM.value)
    else:
        k.hand_coded_optimizations()
    if DEBUG >= 3:
        print(f"{k.name}: {k.applied_opts}")
    return k


def get_runner(device: str, ast: LazyOp) -> CompiledRunner:
    """The compiled kernel for `ast` on `device` (lowered and compiled once per process and optimization setting)."""
    by_id = (id(ast), device, NOOPT.value, BEAM.value)
    if (hit := _runner_by_id.get(by_id)) is not None and hit[0] is ast:
        return hit[1]
    key = (device, ast, _exact_consts(ast), NOOPT.value, BEAM.value)
    if (runner := _runner_cache.get(key)) is None:
        runner = _runner_cache[key] = CompiledRunner(
            device, get_kernel(Device[device].renderer, ast, device).to_program()
        )
    if len(_runner_by_id) >= 8192:
        _runner_by_id.clear()
    _runner_by_id[by_id] = (ast, runner)
    return runner


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
    for si in schedule:
        if capturing_stack := getattr(_capturing, "stack", None):  # TinyJit records the ExecItem (this thread's)
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


# TinyJit registers a callback here while it records a function's kernels
# .stack: per thread, the callbacks of the TinyJits recording (only this thread's kernels go to its recording)
_capturing = threading.local()
