"""BEAM search (`BEAM=n`): time optimized forms of a kernel on its device and keep the fastest.

The search starts from the unoptimized kernel and the hand-coded heuristics' choice. Each step applies every action
(one more Opt) to each of the `n` best kernels so far, compiles and times the new ones on buffers of random values,
and keeps the `n` fastest; it stops when a step finds nothing faster. A candidate whose output differs in any bit
from the heuristics' kernel is dropped, so the search never changes a result. The winner's Opts are stored in the
disk cache (table `beam_search`) under the AST and the device, and later processes apply them without searching.
Candidates compile on several threads; BEAM_TIMEOUT (seconds, default 60) bounds one kernel's search.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from tgcore.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgcore.codegen.program import to_program
from tgcore.device import Buffer, CompileError, Device
from tgcore.dtype import dtypes
from tgcore.engine.runner import CompiledRunner, thread_count
from tgcore.helpers import DEBUG, diskcache_get, diskcache_put, getenv, prod
from tgcore.ops import BufferOps, LazyOp
from tgcore.plugin import ProgramSpec

# the disk-cache table, and the version of what it stores (bump it when Opts change meaning)
CACHE_TABLE = "beam_search"
CACHE_VERSION = 2  # 2: a long contiguous reduce is a lane reduce (its kernels have one axis more)
MAX_STEPS = 8  # steps of a search; each adds one Opt
RUNS = 3  # timed runs of each candidate (the fastest counts)
MAX_UNROLLED_OPS = 4096  # candidates whose loop body would hold more AST nodes than this are not tried (compile time)

_UPCAST_AMOUNTS = (0, 2, 3, 4, 5, 8, 16, 32)
_UNROLL_AMOUNTS = (0, 2, 3, 4, 8)
_LOCAL_AMOUNTS = (2, 4, 8, 16, 32)
_SPLIT_AMOUNTS = (4, 8, 64, 128, 256)


def actions(k: Kernel) -> list[Opt]:
    """Every single Opt worth trying on `k` next (some may not apply; apply_opt tells)."""
    if k.inner_globals:  # only PACK may follow HOIST
        return [Opt(OptOps.PACK, i, 0) for i in range(len(k.loads()))] if k.opts.scratch_max else []
    stage = [Opt(OptOps.STAGE, i, 0) for i in range(len(k.loads()))] if k.opts.has_shared and k.local_dims else []
    if k.staged:
        return stage  # only STAGE may follow STAGE
    n_global = k.first_reduce - k.local_dims
    out = [Opt(OptOps.UPCAST, a, n) for a in range(n_global) for n in _UPCAST_AMOUNTS]
    if k.n_reduce:
        out += [Opt(OptOps.UNROLL, k.n_reduce - 1, n) for n in _UNROLL_AMOUNTS]
    if k.opts.has_local and k.opts.global_max is not None:
        out += [Opt(OptOps.LOCAL, a, n) for a in range(n_global) for n in _LOCAL_AMOUNTS]
        out += [Opt(OptOps.SPLIT, a, n) for a in range(k.first_reduce, k.first_upcast) for n in (4, 8, 16)]
        out += stage
    if k.opts.global_max is None:
        out += [Opt(OptOps.SWAP, a, b) for a in range(n_global) for b in range(a + 1, n_global)]
        out += [Opt(OptOps.SPLIT, a, n) for a in range(k.first_upcast) for n in _SPLIT_AMOUNTS]
        out += [Opt(OptOps.HOIST, g, r) for g in (1, 2) for r in range(1, k.n_reduce + 1)]
    return out


def ast_key(ast: LazyOp) -> str:
    """A stable text key of an AST: each node once (an AST is a DAG), its arg spelled exactly (-0.0 and nan too)."""
    index: dict[int, int] = {}
    lines: list[str] = []

    def visit(n: LazyOp) -> int:
        if id(n) not in index:
            srcs = [visit(s) for s in n.src]
            index[id(n)] = len(lines)
            lines.append(f"{n.op} {srcs} {n.arg!r}")
        return index[id(n)]

    visit(ast)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _cache_key(ast: LazyOp, device: str, amount: int) -> dict[str, Any]:
    return {"ast": ast_key(ast), "device": device.split(":")[0], "amount": amount, "version": CACHE_VERSION}


def _random_buffers(k: Kernel, device: str) -> Optional[list[Buffer]]:
    """Buffers for the kernel's arguments, inputs filled with random values (None when it cannot be searched)."""
    sizes: dict[int, tuple[int, Any]] = {}
    for leaf in k.leaves:
        if leaf.op is BufferOps.CONST:
            continue
        size = leaf.arg.real_size()
        if not isinstance(size, int):
            return None
        prev = sizes.get(leaf.arg.idx, (0, leaf.arg.dtype))[0]
        sizes[leaf.arg.idx] = (max(prev, size, 1), leaf.arg.dtype)
    rng = np.random.default_rng(0)
    bufs = []
    for idx in range(max(sizes) + 1):
        size, dt = sizes.get(idx, (1, dtypes.uint8))
        buf = Buffer(device, size, dt).allocate()
        if idx != 0:
            np_dt = np.float32 if dt == dtypes.bfloat16 else dt.np
            if dt == dtypes.bool:
                values = rng.integers(0, 2, size).astype(np.bool_)
            elif dtypes.is_float(dt):
                values = rng.standard_normal(size).astype(np_dt)
            else:
                values = rng.integers(0, 100, size).astype(np_dt)
            if dt == dtypes.bfloat16:
                values = (values.view(np.uint32) >> 16).astype(np.uint16)
            buf.copyin(memoryview(values.tobytes()))
        bufs.append(buf)
    return bufs


class _Timer:
    """Compiles and times candidates on one set of buffers, checking each one's output against a reference."""

    def __init__(self, device: str, bufs: list[Buffer]) -> None:
        self.device, self.bufs = device, bufs
        self.reference: Optional[bytes] = None
        self.seen: set[str] = set()

    def programs(self, kernels: list[Kernel]) -> list[tuple[Kernel, ProgramSpec]]:
        """The kernels not tried before, small enough to compile quickly, rendered and compiled (on several
        threads: the compiler runs outside the GIL)."""
        out = []
        for k in kernels:
            if prod(k.upcast_sizes) * len(k.ast.lazyops()) > MAX_UNROLLED_OPS:
                continue
            try:
                program = to_program(k)
            except (KernelOptError, NotImplementedError, AssertionError):
                continue
            if program.src not in self.seen:
                self.seen.add(program.src)
                out.append((k, program))
        compiler = Device[self.device].compiler

        def compile_quietly(src: str) -> None:
            try:
                compiler.compile_cached(src)
            except CompileError:
                pass  # the candidate is dropped when it is timed

        with ThreadPoolExecutor(thread_count()) as pool:
            list(pool.map(compile_quietly, [p.src for _, p in out]))
        return out

    def time(self, k: Kernel, program: ProgramSpec) -> Optional[float]:
        """Seconds one run of `k` takes (the fastest of RUNS), or None when it fails or differs."""
        try:
            runner = CompiledRunner(self.device, program)
        except (CompileError, RuntimeError) as e:
            if DEBUG >= 2:
                print(f"BEAM: {k.applied_opts} does not compile: {str(e).splitlines()[0]}")
            return None
        out = self.bufs[0]
        out.copyin(memoryview(bytes(out.nbytes)))
        times = [runner(self.bufs, {}, wait=True) or 0.0]
        result = bytes(out.as_buffer())
        if self.reference is None:
            self.reference = result
        elif result != self.reference:
            if DEBUG >= 1:
                print(f"BEAM: {k.applied_opts} changes the result; dropped")
            return None
        for _ in range(RUNS - 1):
            times.append(runner(self.bufs, {}, wait=True) or 0.0)
        return min(times)


def beam_search(k: Kernel, device: str, amount: int) -> Kernel:
    """The fastest form of `k` found by a beam of width `amount` (from the disk cache when it was searched before).
    `k` must be unoptimized; it is left as it is."""
    key = _cache_key(k.ast, device, amount)
    if getenv("IGNORE_BEAM_CACHE") == 0 and (stored := diskcache_get(CACHE_TABLE, key)) is not None:
        found = k.copy()
        try:
            found.apply_opts([Opt(OptOps[op], axis, n) for op, axis, n in stored])
            return found
        except (KernelOptError, KeyError):
            pass  # stored by an older optimizer: search again
    if any(leaf.op is BufferOps.LOAD and leaf.arg.idx == 0 for leaf in k.leaves):
        return _heuristic(k)  # an in-place kernel: every run would change its own input
    if any(st.vars() for st in k.sts.values()) or any(not isinstance(s, int) for s in k.full_shape):
        return _heuristic(k)  # symbolic shapes: no single size to time
    bufs = _random_buffers(k, device)
    if bufs is None:
        return _heuristic(k)
    from tqdm import tqdm  # type: ignore[import-untyped]  # (here, not with every realize: ~30 ms)

    timer = _Timer(device, bufs)
    start = time.perf_counter()
    deadline = start + getenv("BEAM_TIMEOUT", 60.0)
    # the heuristics' kernel first: its output is the reference every candidate must reproduce
    beam = [(t, c) for c, p in timer.programs([_heuristic(k), k]) if (t := timer.time(c, p)) is not None]
    if not beam:
        return _heuristic(k)
    beam = sorted(beam, key=lambda x: x[0])[:amount]
    for _ in range(MAX_STEPS):
        candidates = []
        for _, parent in beam:
            for opt in actions(parent):
                child = parent.copy()
                try:
                    child.apply_opt(opt)
                except KernelOptError:
                    continue
                candidates.append(child)
        timed = []
        programs = timer.programs(candidates)
        for child, program in tqdm(programs, desc=f"BEAM {k.name}", leave=False, disable=getenv("BEAM_BAR", 1) == 0):
            if time.perf_counter() > deadline:
                break
            if (t := timer.time(child, program)) is not None:
                timed.append((t, child))
        best = sorted(beam + timed, key=lambda x: x[0])[:amount]
        if best[0][0] >= beam[0][0] or time.perf_counter() > deadline:
            beam = best
            break
        beam = best
    winner = beam[0][1]
    if DEBUG >= 1:
        took = time.perf_counter() - start
        print(f"BEAM {k.name}: {beam[0][0] * 1e6:.1f} us with {winner.applied_opts} ({took:.1f} s of search)")
    diskcache_put(CACHE_TABLE, key, [[o.op.name, o.axis, o.amount] for o in winner.applied_opts])
    return winner


def _heuristic(k: Kernel) -> Kernel:
    h = k.copy()
    h.hand_coded_optimizations()
    return h
