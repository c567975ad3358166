"""The runners an ExecItem runs (a compiled kernel, a copy, a Python function) and the host threads that split a
threaded kernel's outer loop: what lowering (realize.py) makes and the beam search (search.py) times, so that
neither imports the other."""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from tgcore.device import Buffer, Device
from tgcore.helpers import DEBUG
from tgcore.plugin import ProgramSpec, thread_count
from tgcore.shape.symbolic import Variable, sym_infer

__all__ = [
    "BufferCopy",
    "CompiledRunner",
    "CustomRunner",
    "EmptyRunner",
    "Runner",
    "compile_pool",
    "parts_per_thread",
    "thread_count",
]


class Runner:
    """Something an ExecItem runs on its buffers."""

    display_name: str = ""
    op_estimate: int = 0
    mem_estimate: int = 0

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        raise NotImplementedError


class CompiledRunner(Runner):
    """A kernel compiled for its device, ready to launch."""

    def __init__(self, device: str, p: ProgramSpec, lib: Optional[bytes] = None) -> None:
        """`lib`: the compiled source when it was compiled ahead (realize.py compiles a schedule's kernels on
        compile_pool's threads), else it is compiled here."""
        self.device, self.p = device, p
        dev = Device[device]
        if DEBUG >= 4:
            print(p.src)
        self.lib = dev.compiler.compile_cached(p.src) if lib is None else lib
        self.clprg = dev.runtime(device, p.name, self.lib)
        self.display_name, self.op_estimate, self.mem_estimate = p.name, p.op_estimate, p.mem_estimate
        # the common CPU launch: no variables, threads or launch sizes, just the buffers
        self.plain_launch = not p.variables and p.thread_extent is None and p.global_size is None
        self.parts_per_thread = parts_per_thread(p.op_estimate, p.mem_estimate)
        # the Program runs a threaded launch's parts on threads of its own (plugin.py, Program.run_parts)
        self.own_threads = bool(getattr(self.clprg, "supports_parts", False))

    def __call__(self, bufs: list[Buffer], var_vals: dict[Variable, int], wait: bool = False) -> Optional[float]:
        if self.plain_launch:
            return self.clprg(*[b._opaque for b in bufs], wait=wait)
        p = self.p
        vals = tuple(var_vals[v] for v in p.variables) if p.variables else ()
        if p.thread_extent is not None:
            opaques = [b._opaque for b in bufs]
            return _run_threaded(
                self.clprg, opaques, vals, p.thread_extent, wait, self.parts_per_thread, self.own_threads
            )
        if p.global_size is None:
            return self.clprg(*[b._opaque for b in bufs], vals=vals, wait=wait)
        gs = tuple(sym_infer(s, var_vals) for s in p.global_size)
        return self.clprg(*[b._opaque for b in bufs], global_size=gs, local_size=p.local_size, vals=vals, wait=wait)


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


@functools.lru_cache(maxsize=None)
def compile_pool(n: int) -> ThreadPoolExecutor:
    """`n` threads that compile kernels: a C compiler (or nvrtc, or LLVM) runs outside the GIL, so the kernels of one
    schedule compile on every core at once while the Python lowering of the next goes on."""
    return ThreadPoolExecutor(n, thread_name_prefix="tgcore-compile")


def _after_fork_in_child() -> None:  # a forked child has none of the parent's threads: it starts its own
    _workers.cache_clear()
    compile_pool.cache_clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.lru_cache(maxsize=1024)
def _bounds(extent: int, parts: int) -> tuple[int, ...]:
    """The bounds of `parts` near-equal parts of range(extent): part i is [bounds[i], bounds[i + 1])."""
    return tuple(extent * i // parts for i in range(parts + 1))


def _run_threaded(
    prg: Any,
    opaques: list[Any],
    vals: tuple[int, ...],
    extent: int,
    wait: bool,
    per_thread: int = 1,
    own_threads: bool = False,
) -> Optional[float]:
    """Run a kernel whose outermost loop is bounded by its last two vals, in `per_thread` parts per thread that the
    threads take in turn. Each output element is written by exactly one part, so the result is the same on any
    number of threads."""
    threads = min(thread_count(), extent)
    parts = min(extent, threads * per_thread)
    st = time.perf_counter()
    if threads <= 1:
        prg(*opaques, vals=vals + (0, extent))
    elif own_threads:  # the Program's threads take the parts (plugin.py, Program.run_parts)
        prg.run_parts(*opaques, vals=vals, bounds=_bounds(extent, parts), threads=threads)
    else:
        bounds = _bounds(extent, parts)
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
        if allocator.supports_transfer and dest.device.split(":")[0] == src.device.split(":")[0]:
            dest.allocate(), src.allocate()  # (a view made for the copy has no memory of its own yet)
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
