"""Kernel: one kernel's AST with the shapes of every buffer it touches, and the optimizations applied to it.

Every buffer has a ShapeTracker over the kernel's index space `full_shape`. A buffer written or read after the
reduce has size 1 on the reduce axes. The axes come in this order:

    [0, first_reduce)               global axes: loops on a CPU (`Renderer.global_max is None`), launched grid
                                    indices on a GPU; the last `local_dims` of them are workgroup (local) indices
    [first_reduce, first_upcast)    reduce loops, outermost first: the order the accumulator sees its elements
    [first_upcast, shape_len)       upcast axes: no loop, the body is repeated once per index ("lanes"); an upcast
                                    axis that is a reduce axis is *unrolled*: its lanes are accumulated in order;
                                    except the last axis of a lane reduce (`reduce_lanes`), whose lanes accumulate
                                    apart and are combined in order after the loop

A lane reduce is fixed at construction, from the AST (and, for a MAX, whether the renderer has a vector MAX): a float
SUM or MAX whose innermost reduce axis an input reads contiguously (n >= LANE_REDUCE_MIN, a multiple of
REDUCE_LANES), not a contraction with a tile to make (Kernel._reuse_axes), has that axis viewed as (n / L, L) with
L = REDUCE_LANES: lane l takes elements l, L + l, 2L + l, ... (L independent chains that fill a vector register; with
outer reduce axes, a BatchNorm's sum over N, H and W, each lane runs through them too, outermost first), then the L
lanes are combined from the first (for a compensated sum with their errors: codegen/linearizer.py). A compensated
sum's innermost loop is also split at construction into groups of consecutive terms, an unrolled axis inside any the
optimizer adds (Kernel._group_compensated). Every device and every optimization of the kernel sums in that order (a
MAX's result has no order).

Optimizations (`Opt`) reshape and permute every ShapeTracker the same way (PADTO also pads a global axis, masked:
its padded lanes read 0 or an element of their tile and store nothing). None of them changes a result: global axes
are independent, and a reduce is only unrolled from its innermost loop, so every accumulator still adds its elements
in the order of the unoptimized kernel. `hand_coded_optimizations` chooses them from the AST and the
Renderer's declared abilities only, so a kernel's optimized form is deterministic and cacheable.

A symbolic size (a bound Variable's: a dynamic batch, a KV cache's length) is an axis of its own, never merged with
another (one of size n * c, an integer c, is split into n and c), and stays a plain loop: no Opt upcasts, unrolls,
splits or makes a workgroup axis of it, and no PACK or STAGE copies along it. The heuristics optimize the integer
axes around it, so one compiled kernel is right for every value of the Variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Optional

from tgcore.codegen.names import internal_prefix, kernel_identifier
from tgcore.codegen.uops import (
    VECTOR_ALU,
    VECTOR_DTYPES,
    VECTOR_SELECT,
    VECTOR_SELECT_DTYPE,
    has_vector_select,
    is_vector_bitcast,
    is_vector_shift,
)
from tgcore.dtype import DType, dtypes
from tgcore.helpers import prod
from tgcore.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tgcore.renderer import Renderer
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import MulNode, NumNode, Variable, sint

# the most lanes one loop iteration may carry: global upcasts, and everything (unrolled reduce lanes included)
MAX_UPCAST = 256
# an elementwise kernel is upcast (vector lanes) when all its ops are vector ops, or SQRT: one instruction per
# lane (an optimizer's update is loads, divisions and a square root)
_ELEMENTWISE_LANES_OK = (*VECTOR_ALU, UnaryOps.SQRT)
MAX_LANES = 1024
# ALU ops from which an elementwise kernel is vectorized along an axis its output is not contiguous along (a SiLU
# after BatchNorm is ~60; an add or a cast, whose gathered loads and scattered stores would cost more, a few)
HEAVY_ELEMENTWISE = 24
# vectors an elementwise kernel of at least INTERLEAVE_MIN_OPS ALU ops computes at once on CPU loops
# (Kernel._interleave_vectors: exp over 1.2M floats on one AVX-512 core 0.88 -> 0.70 ns an element; an add: no gain)
INTERLEAVE_VECTORS, INTERLEAVE_MIN_OPS = 4, 12
# ALU ops a kernel's lanes may carry between them (Kernel._lane_budget): a matmul's 1-2 per lane allow every tile
LANE_OPS = 8192
# a kernel of more ALU ops than this (a fused random-number kernel: Threefry's 20 rounds and Box-Muller, ~520 ops)
# gets at most LONG_KERNEL_LANES lanes, fewer than one vector: its ops, not its loads, are the work, so a tile
# saves nothing, and each lane is another copy of the whole expression for the C compiler (randn(1024, 1024).max()
# on CLANG: 16 lanes 198k characters of C, 1.2 s of gcc; 4 lanes 70k, 0.36 s; the kernel ran no faster in 16)
LONG_KERNEL_OPS = 256
LONG_KERNEL_LANES = 4
# cache blocking of a big matmul-like kernel on a CPU: reduce steps per block, output tiles per panel
BLOCK_REDUCE = 256
# a reduce of at least this many steps but too short for two blocks runs as one block: a panel of output tiles over
# its packed share of the columns' input (128 x 256 @ 256 x 4096, a language model's logits, on two Zen 3 cores:
# 81 -> 149 GFLOP/s, 175 in 6 x 2-vector tiles (PADTO); the rows of b, 16 KB apart, share few L1 sets unpacked)
ONE_BLOCK = BLOCK_REDUCE // 2
# a tile's rows are far apart when an input's rows are at least this many elements apart (one 64-byte cache line of
# floats: each row of the tile touches a line of its own)
ROW_FAR = 16
MAX_GROUP = 128  # work items in a workgroup the heuristics make
MAX_STAGE_COPIES = 32  # elements each work item copies into shared memory for one STAGE
STAGE_REDUCE = 16  # reduce steps per shared-memory tile the heuristics stage
PANEL_TILES = 4
# a sum over a contiguous axis at least this long runs in REDUCE_LANES lanes (see the module docstring): 16 floats
# are one AVX-512 register, two AVX2 or four NEON ones (a 4096 x 4096 row sum was ~6% faster than with 64 lanes;
# rows of 64 to 1024 sum 1.2-2.3x faster in lanes than in one chain each, four rows at a time)
LANE_REDUCE_MIN = 64
# vector accumulators a tile needs to keep the FMA units busy: each takes one FMA at a time, which waits ~4 cycles
# for the one before it, and a core starts two a cycle
MIN_ACCUMULATORS = 8
# the rows of a two-vector tile on a target of 16 vector registers, best first: 2 x rows accumulators, two column
# vectors and a broadcast row value fit them (7 rows: one register too many, taken where no tile of 14 rows one vector
# wide fits: Kernel._wide_rows)
WIDE_ROWS = (6, 7, 5)
# where none of WIDE_ROWS divides the rows (a power of two: 1024, BERT's 128 tokens), the rows are padded to a
# multiple of the first (PADTO) when that adds at most this share of rows
WIDE_ROWS_PAD = 1 / 8
# a matmul's output columns that no tile two vectors wide divides are padded to a multiple of it when that adds at
# most this share of columns (Kernel._packed_column_tile: a 14 x 14 conv's 196 pixels -> 208)
COLUMN_PAD_WASTE = 1 / 16
# an elementwise kernel's row that its view cannot split (masked: a padded copy) is upcast whole where it is at most
# this long (Kernel._optimize_elementwise; longer rows cost more compile time than they save: a 114-lane copy 0.19 s of
# gcc against 0.07 unrolled, for 0.15 ms a run)
PADDED_ROW_LANES = 64
REDUCE_LANES = 16
# an elementwise kernel's global axis at most this long, along which most of its ops read nothing that changes, goes
# whole into lanes (Kernel._shared_lanes: the lanes share those ops)
SHARED_LANES = 4
# a reduce whose body has scalar ops (not computed on whole vectors: bit ops, libm calls) is a lane reduce only where
# those ops, once per lane, come to at most this many (Kernel._split_lanes)
LANE_SCALAR_OPS = 64
# a window reduce of at most this many steps (a 5 x 5 window over one channel: a depthwise conv) over a padded input
# takes a whole output row in lanes (Kernel._window_rows)
WINDOW_STEPS = 25
# a float32 SUM of this many terms per accumulator or more is compensated (Kernel.compensated_sum): float32
# adds along one chain of n terms err by up to n/2^24 of the sum (the mean of 16M copies of 0.1 was off by 6e-5), a
# compensated sum by a few ulps of its terms' magnitudes whatever n. It costs three adds per group of terms (see
# COMPENSATED_GROUP); a row of 4096 (256 terms per lane of a lane reduce) stays below it.
COMPENSATED_MIN = 1024
# a compensated sum adds its innermost loop's terms in groups of this many consecutive terms (of 2 where that loop is
# a multiple of 2 only): each group's plain sum, then one compensated add (Kernel._group_compensated)
COMPENSATED_GROUP = 4
# a row reduce of at least this many bytes (more than a core's L2) reads one row at a time (Kernel._streamed_rows)
STREAMED_BYTES = 1 << 20
# gathered rows this many bytes apart (or a multiple) map to few sets of a CPU's L1 cache (Kernel._aliased)
ALIASED_BYTES = 2048


def _int(s: sint) -> int:
    assert isinstance(s, int), f"expected a concrete size, got {s}"
    return s


def _reduce_block(size: int) -> int:
    """The reduce steps of a block of a reduce of `size` steps run in blocks for the cache (_block_for_cache):
    BLOCK_REDUCE, or the divisor of the reduce nearest below it down to half of it (784 = 4 x 196 blocks); 0 where
    no such block divides it or it is shorter than two blocks (it runs unblocked)."""
    step = next((b for b in range(BLOCK_REDUCE, BLOCK_REDUCE // 2 - 1, -1) if size % b == 0), 0)
    return step if step and size >= 2 * step else 0


def _pads_within(size: int, multiple: int, share: float) -> bool:
    """Whether padding `size` to a multiple of `multiple` adds at most `share` of it (PADTO's waste)."""
    return -(-size // multiple) * multiple <= size * (1 + share)


def _panel(tiles: int, want: int) -> int:
    """The column tiles of a panel of a kernel run in blocks for the cache: `want` (Kernel.panel_tiles), or a near count
    that divides the tiles (1040 columns: 65 tiles, 13 panels), or else PANEL_TILES or a count near it; at least two
    panels (each thread takes whole panels); 0 where none does."""
    near = (want, want + 1, want - 1, want + 2)
    if want != PANEL_TILES:
        near += (PANEL_TILES, PANEL_TILES + 1, PANEL_TILES - 1, PANEL_TILES + 2)
    return next((p for p in near if p < tiles and tiles % p == 0), 0)


def stride_order(stride: Optional[sint]) -> int:
    """A buffer stride as a sort key: an unknown or symbolic one counts as the largest."""
    return stride if isinstance(stride, int) else 1 << 62


def dtype_of(op: LazyOp) -> DType:
    """The dtype an AST node produces."""
    if op.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE):
        return op.arg.dtype
    if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
        return op.arg
    if op.op in (BinaryOps.CMPLT, BinaryOps.CMPEQ):
        return dtypes.bool
    return dtype_of(op.src[-1])


def _is_alu(op: LazyOp) -> bool:
    return isinstance(op.op, (UnaryOps, BinaryOps, TernaryOps))


def is_vector_bits_op(op: LazyOp) -> bool:
    """Whether AST node `op` is a BITCAST between a float vector dtype and the uint of its bits, or an SHL of such a
    uint by a constant smaller than its width: what a renderer listing them in `vector_math` computes on whole vectors
    (codegen/uops.py)."""
    if op.op is UnaryOps.BITCAST:
        return is_vector_bitcast(dtype_of(op.src[0]), op.arg)
    if op.op is BinaryOps.SHL:
        amount = op.src[1]
        return amount.op is BufferOps.CONST and is_vector_shift(dtype_of(op), amount.arg.val)
    return False


class OptOps(Enum):
    """The kinds of optimization. `amount` 0 means the whole axis."""

    UPCAST = auto()  # axis: a global axis; its last `amount` indices become lanes
    UNROLL = auto()  # axis: counted from first_reduce, the innermost reduce loop; its last `amount` indices, in order
    LOCAL = auto()  # axis: a global axis; its last `amount` indices become a workgroup dimension (has_local)
    SWAP = auto()  # axis and amount: two global loop axes that exchange places (loop order)
    SPLIT = auto()  # axis: a global or reduce loop; it becomes two loops, the inner one of `amount` iterations
    # axis, amount: the last `axis` global loops run inside the first `amount` reduce loops, accumulating in the
    # output buffer (CPU loops only, for a kernel of one reduce whose output holds the accumulator's dtype; what it
    # computes after the reduce runs in a last pass over the output); the last optimization applied
    HOIST = auto()
    # axis: an input (its index among the kernel's loads): before each run of the innermost reduce loop, the
    # workgroup copies what that loop reads of it into shared memory, and the loop reads it from there (devices with
    # shared memory; the input must be reused across a local axis); only STAGEs may follow
    STAGE = auto()
    # axis: an input (its index among the kernel's loads), on a renderer with `scratch_max`: at each step of the
    # outermost loop (after HOIST: of the outer reduce loops) the thread copies what the loops inside it will read of
    # the input into scratch memory, laid out in the order they read it (contiguous), and they read it from there;
    # a global loop inside must read the same elements again; only PACKs may follow
    PACK = auto()
    # axis: a global axis, as UPCAST by `amount` where `amount` does not divide its size: the axis is padded to the
    # next multiple of `amount` first; the lanes past its end read 0 (from an input padded by PADTO alone, an element
    # of their own tile) and store nothing (CPU loops only, and only for a kernel whose values there cannot trap:
    # Kernel._pad_refusal)
    PADTO = auto()


@dataclass(frozen=True, order=True)
class Opt:
    """One optimization step: `op` on `axis` by `amount`."""

    op: OptOps
    axis: int
    amount: int

    def __repr__(self) -> str:
        return f"Opt({self.op.name}, {self.axis}, {self.amount})"


class KernelOptError(Exception):
    """An optimization that does not apply to this kernel."""


def _check(cond: bool, why: str) -> None:
    if not cond:
        raise KernelOptError(why)


class Kernel:
    """An AST plus its buffers' ShapeTrackers over one shared index space, and the optimizations applied."""

    def __init__(self, ast: LazyOp, opts: Renderer) -> None:
        if ast.op is not BufferOps.STORE:
            raise ValueError(f"a kernel AST must have a STORE root, got {ast.op}")
        self.ast, self.opts = ast, opts
        nodes = ast.lazyops()
        self.reduceops = [x for x in nodes if x.op in ReduceOps]
        self.leaves = [x for x in nodes if x.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE)]
        self.sts: dict[LazyOp, ShapeTracker] = {x: x.arg.st for x in self.leaves}
        output_shape = ast.arg.st.shape
        if self.reduceops:
            full = self.reduceops[0].src[0]
            while full.op not in (BufferOps.LOAD, BufferOps.CONST):
                full = full.src[0]
            self.full_shape: tuple[sint, ...] = full.arg.st.shape
            for r in self.reduceops:
                if r.arg != self.reduceops[0].arg:
                    raise ValueError(f"a kernel's reduces must share their axes, got {[x.arg for x in self.reduceops]}")
        else:
            self.full_shape = output_shape
        for st in self.sts.values():
            if len(st.shape) != len(self.full_shape):
                raise ValueError(f"buffer shape {st.shape} does not match the kernel's shape {self.full_shape}")
        self.reduce_axes = tuple(i for i, (o, f) in enumerate(zip(output_shape, self.full_shape)) if o != f)
        self.n_reduce = 0  # reduce loops
        self.upcasted = 0  # trailing upcast axes
        self.local_dims = 0  # global axes launched as workgroup indices
        self.inner_globals = 0  # HOIST: global loops nested inside the first `outer_reduces` reduce loops
        self.outer_reduces = 0
        self.staged: tuple[LazyOp, ...] = ()  # STAGE: the loads read through shared memory
        self.packed: tuple[LazyOp, ...] = ()  # PACK: the loads read through a scratch block
        # PADTO: the leaves whose only mask is a PADTO's (what a padded lane of them reads is never stored: the
        # linearizer reads a safe element there instead of testing each load)
        self.pad_only: frozenset[LazyOp] = frozenset()
        self.reduce_lanes = 0  # a lane reduce: its lanes, the last upcast axis
        self.summed_terms = 1  # a compensated sum's terms summed plainly before each compensated add
        self.applied_opts: list[Opt] = []
        self._reduce_last()
        self._split_products()
        self._merge_axes()
        self._split_lanes()
        self._group_compensated()

    def copy(self) -> Kernel:
        """A kernel with the same state; optimizing it leaves this one as it is."""
        k = object.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.sts, k.applied_opts = dict(self.sts), list(self.applied_opts)
        return k

    # ***** the axes *****

    @property
    def shape_len(self) -> int:
        return len(self.full_shape)

    @property
    def first_upcast(self) -> int:
        """The index of the first upcast axis (== shape_len when there is none)."""
        return self.shape_len - self.upcasted

    @property
    def first_reduce(self) -> int:
        """The index of the first reduce loop (== first_upcast when there is none)."""
        return self.first_upcast - self.n_reduce

    @property
    def output_shape(self) -> tuple[sint, ...]:
        return self.sts[self.ast].shape

    def is_concrete(self, axis: int) -> bool:
        """Whether `axis` has an integer size. A symbolic one (a bound Variable's: a dynamic batch, a KV cache's length)
        stays a plain loop: it is never upcast, unrolled, split, made a workgroup axis, packed or staged."""
        return isinstance(self.full_shape[axis], int)

    def is_reduce_axis(self, axis: int) -> bool:
        """True for a reduce loop, an unrolled reduce axis or the lanes of a lane reduce."""
        return self.output_shape[axis] != self.full_shape[axis]

    def is_unrolled(self, axis: int) -> bool:
        """True for an upcast reduce axis whose lanes share one accumulator (not a lane reduce's lanes)."""
        return (
            axis >= self.first_upcast
            and self.is_reduce_axis(axis)
            and not (self.reduce_lanes and axis == self.shape_len - 1)
        )

    @property
    def upcast_sizes(self) -> tuple[int, ...]:
        return tuple(_int(s) for s in self.full_shape[self.first_upcast :])

    def _reduce_last(self) -> None:
        """Permute so the reduce axes come after the global axes."""
        self.n_reduce = len(self.reduce_axes)
        order = tuple([i for i in range(self.shape_len) if i not in self.reduce_axes] + list(self.reduce_axes))
        if order != tuple(range(self.shape_len)):
            self.sts = {k: st.permute(order) for k, st in self.sts.items()}
            self.full_shape = tuple(self.full_shape[i] for i in order)

    def _split_products(self) -> None:
        """Split an axis of a symbolic size n * c (c an integer: a dynamic batch merged with a sequence, batch * 16)
        into (n, c) where every buffer can without a second view: the integer part becomes an axis the optimizer may
        upcast or unroll."""
        i = 0
        while i < self.shape_len:
            size = self.full_shape[i]
            if not (isinstance(size, MulNode) and isinstance(size.b, int) and size.b > 1):
                i += 1
                continue
            split = {}
            for k, st in self.sts.items():
                if st.shape[i] not in (size, 1):
                    break
                part = (size.a, size.b) if st.shape[i] == size else (1, 1)
                new = st.reshape(st.shape[:i] + part + st.shape[i + 1 :])
                if len(new.views) != len(st.views):
                    break
                split[k] = new
            else:
                self.n_reduce += i >= self.first_reduce
                self.sts = split
                self.full_shape = self.full_shape[:i] + (size.a, size.b) + self.full_shape[i + 1 :]
            i += 1

    def _merge_axes(self) -> None:
        """Drop axes of size 1 and merge neighbouring axes every buffer can merge without a second view."""
        keep = [i for i, s in enumerate(self.full_shape) if s != 1]
        if len(keep) != self.shape_len:
            self.n_reduce = len([i for i in keep if i >= self.first_reduce])
            self.sts = {k: st.reshape(tuple(st.shape[i] for i in keep)) for k, st in self.sts.items()}
            self.full_shape = tuple(self.full_shape[i] for i in keep)
        i = 0
        while i < self.shape_len - 1:
            if (i < self.first_reduce) != (i + 1 < self.first_reduce):  # never merge a global with a reduce axis
                i += 1
                continue
            # nor a symbolic size with another axis: merged into it, an integer axis could no longer be upcast or
            # unrolled (a dynamic batch of images would take every image axis with it)
            if not (self.is_concrete(i) and self.is_concrete(i + 1)):
                i += 1
                continue
            merged = {}
            for k, st in self.sts.items():
                new = st.reshape(st.shape[:i] + (st.shape[i] * st.shape[i + 1],) + st.shape[i + 2 :])
                if len(new.views) != len(st.views):
                    break
                merged[k] = new
            else:
                if i >= self.first_reduce:
                    self.n_reduce -= 1
                self.sts = merged
                self.full_shape = (
                    self.full_shape[:i] + (self.full_shape[i] * self.full_shape[i + 1],) + self.full_shape[i + 2 :]
                )
                continue
            i += 1

    def compensated_sum(self, op: LazyOp) -> bool:
        """Whether reduce `op` is a compensated sum: a float32 SUM into one value, or of at least COMPENSATED_MIN
        terms per accumulator, that is not a contraction (a matmul or conv: products of inputs that other outputs
        reuse, accumulated as they come, as BLAS does). The choice depends on the AST alone, so every device and
        every optimization of a kernel sums the same way."""
        k = self
        if op.op is not ReduceOps.SUM or dtype_of(op) != dtypes.float32 or k.inner_globals:
            return False
        if k.is_contraction():
            return False
        if all(s == 1 for a, s in enumerate(k.full_shape) if not k.is_reduce_axis(a)):
            return True  # a sum into one value (as the last stage of a reduce of everything): cheap, and exact matters
        sizes = [s if isinstance(s, int) else s.max for a, s in enumerate(k.full_shape) if k.is_reduce_axis(a)]
        return prod(sizes) // max(k.reduce_lanes, 1) >= COMPENSATED_MIN  # (terms per lane)

    def is_contraction(self) -> bool:
        """A reduce of products of inputs that other outputs reuse (one broadcast along an output axis): a matmul or
        a conv, which the optimizer tiles."""
        outputs = [a for a, s in enumerate(self.full_shape) if not self.is_reduce_axis(a) and s != 1]
        return any(r.src[0].op is BinaryOps.MUL for r in self.reduceops) and any(
            self.stride_of(ld, a) == 0 for ld in self.loads() for a in outputs
        )

    def is_matrix_vector(self) -> bool:
        """A contraction of a matrix with a vector whose rows it reads contiguously: one input broadcast along every
        output axis (the vector), another read with stride 1 along the (single) reduce axis, as a decoder's `x @ w.T`
        at batch 1. No output reuses another's loads of the matrix, so there is no tile to make: it runs as a lane
        reduce of each output's row instead (16 independent chains of FMAs, one vector register)."""
        outputs = [a for a, s in enumerate(self.full_shape) if not self.is_reduce_axis(a) and s != 1]
        loads = self.loads()
        vectors = [ld for ld in loads if all(self.stride_of(ld, a) == 0 for a in outputs)]
        # the matrix reads each output's row contiguously along the reduce (x @ w.T); where it does not (x @ w, the
        # reduce walks down its columns) neighbouring outputs fill the vectors instead
        rows = [ld for ld in loads if ld not in vectors and self.stride_of(ld, self.first_reduce) == 1]
        return bool(outputs) and bool(vectors) and bool(rows)

    def _reuse_axes(self) -> list[int]:
        """The integer output axes along which an input is broadcast: the axes of a contraction's tile. A contraction
        whose only such axis is symbolic (attention's scores over a KV cache of symbolic length: the query is reused
        along the cache) has no tile to make, and runs as a lane reduce where it can."""
        outputs = [a for a, s in enumerate(self.full_shape) if not self.is_reduce_axis(a) and s != 1]
        loads = self.loads()
        return [a for a in outputs if self.is_concrete(a) and any(self.stride_of(ld, a) == 0 for ld in loads)]

    def _split_lanes(self) -> None:
        """Make this a lane reduce where it is one (see the module docstring)."""
        if not self.n_reduce or self.upcasted or not self.reduceops:
            return
        if any(dtype_of(r) not in VECTOR_DTYPES for r in self.reduceops):
            return  # (integer lanes would be scalar accumulators: a 2048 x 1024 int32 row sum ran 1.8x slower)
        if any(r.op is not ReduceOps.SUM for r in self.reduceops) and BinaryOps.MAX not in self.opts.vector_math:
            return  # a MAX in lanes needs the renderer's vector MAX (its result has no order to fix)
        axis, lanes = self.first_reduce + self.n_reduce - 1, REDUCE_LANES  # the innermost reduce axis
        n = self.full_shape[axis]
        if not isinstance(n, int) or n < LANE_REDUCE_MIN or n % lanes != 0:
            return
        if self.is_contraction() and not self.is_matrix_vector() and self._reuse_axes():
            return  # (a matmul or conv is tiled: each output of a tile reuses the loads of the others)
        if not any(self.stride_of(ld, axis) == 1 for ld in self.loads()):
            return  # (a reduce across rows: neighbouring outputs fill the vectors instead)
        if self._scalar_ops(self.reduceops[0].lazyops()) * lanes > LANE_SCALAR_OPS:
            # (scalar ops in every lane: randn's Box-Muller (11 bit ops) into a max made 270k characters of C, 1.6 s
            # of gcc, and ran 30 ms for 1M values)
            return
        self._split(axis, lanes, self.shape_len)
        self.upcasted, self.reduce_lanes = 1, lanes

    def _group_compensated(self) -> None:
        """A compensated sum (compensated_sum) takes the terms of its innermost loop in groups of COMPENSATED_GROUP
        consecutive terms (2 where that loop is a multiple of 2 only; none where it is neither, or symbolic): each
        group is summed plainly, as a balanced tree, then added to its accumulator with Fast2Sum. That is 1.75 adds a
        term instead of 4, and each group's rounding error is at most 2 ulps of its terms' magnitudes (numpy's
        pairwise sum errs by up to log2(n) of them): a 1M float32 sum in cache was bound by its adds (92 GB/s on two
        AVX-512 cores). The group is an unrolled axis fixed here, from the AST, as a lane reduce is: the innermost
        unrolled axis (an UNROLL the optimizer adds goes outside it), so every device and every optimization of the
        kernel sums in the same groups."""
        if len(self.reduceops) != 1 or not self.n_reduce or not self.compensated_sum(self.reduceops[0]):
            return
        axis = self.first_upcast - 1  # the innermost reduce loop
        size = self.full_shape[axis]
        if not isinstance(size, int) or not (group := self._divisor(size, (COMPENSATED_GROUP, 2))):
            return
        try:
            self._split_checked(Opt(OptOps.UNROLL, self.n_reduce - 1, group), axis, group, axis + 1)
        except KernelOptError:
            return
        self.upcasted += 1
        if size == group:  # (the loop went whole)
            self.n_reduce -= 1
        self.summed_terms = group

    def _split(self, axis: int, amount: int, to: int) -> None:
        """Split `axis` into (size // amount, amount) and move the `amount` part to position `to` (counted in the
        shape after the split, with the split-off part removed)."""
        size = self.full_shape[axis]
        shape = list(self.full_shape)
        split = shape[:axis] + [size // amount, amount] + shape[axis + 1 :]
        order = [i for i in range(len(split)) if i != axis + 1]
        order.insert(to, axis + 1)
        new_sts = {}
        for k, st in self.sts.items():
            s = st.shape[axis]  # 1 where this buffer does not vary along the axis
            new = st.reshape(st.shape[:axis] + ((s // amount, amount) if s != 1 else (1, 1)) + st.shape[axis + 1 :])
            new_sts[k] = new.permute(tuple(order))
        self.sts = new_sts
        self.full_shape = tuple(split[i] for i in order)
        if size == amount:  # the loop that is left has size 1: drop it
            self._drop_axis(axis)

    def _drop_axis(self, axis: int) -> None:
        self.sts = {k: st.reshape(st.shape[:axis] + st.shape[axis + 1 :]) for k, st in self.sts.items()}
        self.full_shape = self.full_shape[:axis] + self.full_shape[axis + 1 :]

    # ***** optimizations *****

    def apply_opt(self, opt: Opt) -> None:
        """Apply one optimization; KernelOptError (and no change) when it does not apply."""
        _check(opt.amount >= 0, f"{opt}: the amount must be >= 0")
        _check(not self.inner_globals or opt.op is OptOps.PACK, f"{opt}: only PACK may follow HOIST")
        _check(not self.packed or opt.op is OptOps.PACK, f"{opt}: only PACK may follow PACK")
        _check(not self.staged or opt.op is OptOps.STAGE, f"{opt}: only STAGE may follow STAGE")
        if opt.op is OptOps.PACK:
            self._pack(opt)
            return
        if opt.op is OptOps.HOIST:
            self._hoist(opt)
            return
        if opt.op is OptOps.STAGE:
            self._stage(opt)
            return
        if opt.op is OptOps.PADTO:
            self._padto(opt)
            return
        if opt.op is OptOps.SWAP:
            n_global = self.first_reduce - self.local_dims
            _check(0 <= opt.axis < opt.amount < n_global, f"{opt}: not two global axes in order")
            order = list(range(self.shape_len))
            order[opt.axis], order[opt.amount] = opt.amount, opt.axis
            self.sts = {k: st.permute(tuple(order)) for k, st in self.sts.items()}
            self.full_shape = tuple(self.full_shape[i] for i in order)
            self.applied_opts.append(opt)
            return
        if opt.op is OptOps.SPLIT:
            axis = opt.axis
            _check(
                0 <= axis < self.first_upcast
                and axis not in range(self.first_reduce - self.local_dims, self.first_reduce),
                f"{opt}: not a loop",
            )
            size = self.full_shape[axis]
            _check(
                isinstance(size, int) and 1 < opt.amount < size and size % opt.amount == 0,
                f"{opt}: {opt.amount} does not split an axis of {size} in two loops",
            )
            is_reduce = axis >= self.first_reduce
            self._split(axis, opt.amount, axis + 1)  # the inner part right after the outer: the order is the same
            self.n_reduce += is_reduce
            self.applied_opts.append(opt)
            return
        if opt.op is OptOps.UNROLL:
            # only the innermost reduce loop: unrolling any other would change the order the accumulator adds in
            _check(opt.axis == self.n_reduce - 1, f"{opt}: only the innermost reduce loop can be unrolled")
            axis = self.first_reduce + opt.axis
        else:
            axis = opt.axis
            _check(0 <= axis < self.first_reduce - self.local_dims, f"{opt}: not a global axis")
        size = self.full_shape[axis]
        _check(isinstance(size, int), f"{opt}: the axis has a symbolic size")
        assert isinstance(size, int)
        amount = opt.amount or size
        _check(amount > 1 and size % amount == 0, f"{opt}: {amount} does not split an axis of {size}")
        if opt.op is OptOps.LOCAL:
            _check(self.opts.has_local and self.opts.global_max is not None, f"{opt}: the device has no workgroups")
            local_max = self.opts.local_max or ()
            _check(self.local_dims < min(3, len(local_max)), f"{opt}: no local dimension left")
            group = prod(_int(s) for s in self.full_shape[self.first_reduce - self.local_dims : self.first_reduce])
            _check(amount <= local_max[self.local_dims] and group * amount <= max(local_max), f"{opt}: too big")
            self._split_checked(opt, axis, amount, self.first_reduce - self.local_dims)
            self.local_dims += 1
        else:
            self._upcast(opt, axis, amount)
            if opt.op is OptOps.UNROLL and size == amount:
                self.n_reduce -= 1
        self.applied_opts.append(opt)

    def _upcast(self, opt: Opt, axis: int, amount: int, new_views: int = 0) -> None:
        """Split `amount` lanes off `axis` (UPCAST, UNROLL, PADTO), at the front of the upcast axes: a new unrolled
        axis is the outer part of the ones split before."""
        lanes = prod(self.upcast_sizes) * amount
        _check(lanes <= MAX_LANES, f"{opt}: {lanes} lanes is more than {MAX_LANES}")
        upcast = prod(s for a, s in enumerate(self.upcast_sizes) if not self.is_reduce_axis(self.first_upcast + a))
        _check(opt.op is OptOps.UNROLL or upcast * amount <= MAX_UPCAST, f"{opt}: more than {MAX_UPCAST} lanes")
        self._split_checked(opt, axis, amount, self.first_upcast, new_views)
        self.upcasted += 1

    def _split_checked(self, opt: Opt, axis: int, amount: int, to: int, new_views: int = 0) -> None:
        """_split, refused (and undone) where a buffer's tracker would need more than `new_views` more views for it
        (its index would take divisions)."""
        before = (self.sts, self.full_shape)
        self._split(axis, amount, to)
        if any(len(self.sts[k].views) > len(st.views) + new_views for k, st in before[0].items()):
            self.sts, self.full_shape = before
            raise KernelOptError(f"{opt}: a buffer's view cannot split that axis")

    def _padto(self, opt: Opt) -> None:
        axis, amount = opt.axis, opt.amount
        _check(0 <= axis < self.first_reduce - self.local_dims, f"{opt}: not a global axis")
        size = self.full_shape[axis]
        _check(isinstance(size, int) and 1 < amount < size and size % amount != 0, f"{opt}: use UPCAST")
        assert isinstance(size, int)
        refusal = self._pad_refusal()
        _check(refusal is None, f"{opt}: {refusal}")
        padded = -(-size // amount) * amount
        shape = self.full_shape[:axis] + (padded,) + self.full_shape[axis + 1 :]
        sts, pad_only = {}, set(self.pad_only)
        for k, st in self.sts.items():
            if st.shape[axis] == 1:
                sts[k] = st
            elif self.stride_of(k, axis) == 0:  # broadcast along it: any index past the end reads the same
                one = st.shrink(tuple((0, 1) if a == axis else (0, s) for a, s in enumerate(st.shape)))
                sts[k] = one.expand(st.shape[:axis] + (padded,) + st.shape[axis + 1 :])
            else:  # the pad's mask makes the accesses past the end invalid
                if all(v.mask is None for v in st.views):
                    pad_only.add(k)
                sts[k] = st.pad(tuple((0, padded - size) if a == axis else (0, 0) for a in range(len(st.shape))))
        saved = (self.sts, self.full_shape)
        self.sts, self.full_shape = sts, shape
        try:  # (a padded tracker takes one view more: its mask's, whose index is the same sum)
            self._upcast(opt, axis, amount, new_views=1)
        except KernelOptError:
            self.sts, self.full_shape = saved
            raise
        self.pad_only = frozenset(pad_only)
        self.applied_opts.append(opt)

    def _pad_refusal(self) -> Optional[str]:
        """Why no PADTO may pad this kernel's global axes, or None where one may. The padded lanes compute on the
        zeros their masked loads read: harmless for float math (and never stored), but an integer division there
        would divide by zero; a gathered load's index would be made of those zeros; a kernel that reads its own
        output might read what a padded lane did not write."""
        if self.opts.global_max is not None:
            return "only CPU-style kernels (global loops) pad an axis"
        if any(x.op in (BinaryOps.DIV, BinaryOps.MOD) and not dtypes.is_float(dtype_of(x)) for x in self.ast.lazyops()):
            return "an integer division would divide by the padded zeros"
        if any(x.op is BufferOps.LOAD and (x.src or x.arg.idx == 0) for x in self.leaves):
            return "a gathered input, or the output read back"
        return None

    def _hoist(self, opt: Opt) -> None:
        n_global = self.first_reduce - self.local_dims
        _check(self.opts.global_max is None, f"{opt}: only CPU-style kernels (global loops) hoist their reduce")
        _check(1 <= opt.axis <= n_global and 1 <= opt.amount <= self.n_reduce, f"{opt}: not that many loops")
        refusal = self._hoist_refusal()
        _check(refusal is None, f"{opt}: {refusal}")
        self.inner_globals, self.outer_reduces = opt.axis, opt.amount
        self.applied_opts.append(opt)

    def _hoist_refusal(self) -> Optional[str]:
        """Why no HOIST can keep this kernel's partial sums in its output, or None where one can."""
        # (what the kernel computes after its reduce runs in one more pass over the output: Linearizer's
        # _hoisted_epilogue)
        if len(self.reduceops) != 1:
            return "the kernel must have one reduce"
        if self.reduce_lanes:
            return "a lane reduce combines its lanes before the store"
        if dtype_of(self.reduceops[0]) != self.ast.arg.dtype:
            return "the output holds another dtype than the accumulator"
        if any(x.op is BufferOps.LOAD and x.arg.idx == 0 for x in self.leaves):
            return "reads its output"
        return None

    def stage_axes(self, leaf: LazyOp) -> list[int]:
        """The axes a STAGE of `leaf` copies: the local axes, the innermost reduce loop and the upcast axes that the
        leaf's index or validity depends on (the others only repeat the same elements)."""
        candidates = [*range(self.first_reduce - self.local_dims, self.first_reduce), self.first_upcast - 1]
        return self._axes_read(leaf, candidates + list(range(self.first_upcast, self.shape_len)))

    def pack_loops(self) -> list[int]:
        """The loops a PACK's block is copied for (the copy runs before them, at each step of the loops outside
        them): after HOIST, the inner global and inner reduce loops; else every loop but the outermost."""
        n_global = self.first_reduce - self.local_dims
        if self.inner_globals:
            inner = range(n_global - self.inner_globals, n_global)
            return [*inner, *range(self.first_reduce + self.outer_reduces, self.first_upcast)]
        return [*range(1, n_global), *range(self.first_reduce, self.first_upcast)]

    def pack_axes(self, leaf: LazyOp) -> list[int]:
        """The axes a PACK of `leaf` copies, in the block's layout (the kernel's order, the last axis contiguous):
        the pack_loops and the upcast axes that its index or validity depends on."""
        return self._axes_read(leaf, [*self.pack_loops(), *range(self.first_upcast, self.shape_len)])

    def pack_size(self, leaf: LazyOp) -> int:
        """Elements a PACK of `leaf` copies."""
        return prod(_int(self.full_shape[a]) for a in self.pack_axes(leaf))

    def _axes_read(self, leaf: LazyOp, candidates: list[int]) -> list[int]:
        """The `candidates` that `leaf`'s index or validity depends on."""
        st = self.sts[leaf]
        axis = internal_prefix("_axis", (v.expr for v in st.vars()))  # unlike the name of a Variable of the user's
        idxs = [
            Variable(f"{axis}{a}", 0, (s if isinstance(s, int) else s.max) - 1) if s != 1 else NumNode(0)
            for a, s in enumerate(self.full_shape)
        ]
        idx, valid = st.expr_idxs(idxs)
        used = {v.expr for v in idx.vars()} | {v.expr for v in valid.vars()}
        return [a for a in candidates if f"{axis}{a}" in used]

    def stage_size(self, leaf: LazyOp) -> int:
        """Elements a STAGE of `leaf` copies."""
        return prod(_int(self.full_shape[a]) for a in self.stage_axes(leaf))

    def _stage(self, opt: Opt) -> None:
        _check(self.opts.has_shared and self.opts.global_max is not None, f"{opt}: the device has no shared memory")
        _check(self.local_dims > 0 and self.n_reduce > 0, f"{opt}: needs a workgroup and a reduce loop")
        loads = self.loads()
        _check(opt.amount == 0 and 0 <= opt.axis < len(loads), f"{opt}: not an input of the kernel")
        leaf = loads[opt.axis]
        _check(leaf not in self.staged, f"{opt}: that input is staged already")
        _check(not leaf.src, f"{opt}: a gathered input is read where its index says, not in a tile")
        local_axes = range(self.first_reduce - self.local_dims, self.first_reduce)
        # (the loops outside the tile may be symbolic: the tile is copied at each of their steps)
        _check(self.is_concrete(self.first_upcast - 1), f"{opt}: the innermost reduce loop has a symbolic size")
        axes = self.stage_axes(leaf)
        _check(any(a not in axes for a in local_axes), f"{opt}: no work item reuses what another loads")
        group = prod(_int(self.full_shape[a]) for a in local_axes)
        tile = prod(_int(self.full_shape[a]) for a in axes)
        _check(-(-tile // group) <= MAX_STAGE_COPIES, f"{opt}: {tile} elements are too many for {group} work items")
        nbytes = [self.stage_size(x) * x.arg.dtype.itemsize for x in (*self.staged, leaf)]
        _check(sum(nbytes) <= self.opts.shared_max, f"{opt}: {sum(nbytes)} bytes of shared memory is too much")
        self.staged = (*self.staged, leaf)
        self.applied_opts.append(opt)

    def _pack(self, opt: Opt) -> None:
        scratch = self.opts.scratch_max
        _check(scratch > 0 and self.opts.global_max is None, f"{opt}: the device has no scratch memory for kernels")
        loads = self.loads()
        _check(opt.amount == 0 and 0 <= opt.axis < len(loads), f"{opt}: not an input of the kernel")
        leaf = loads[opt.axis]
        _check(leaf not in self.packed, f"{opt}: that input is packed already")
        _check(not leaf.src, f"{opt}: a gathered input is read where its index says, not in a block")
        _check(leaf.arg.idx != 0, f"{opt}: the kernel's output: a copy made early would miss the kernel's own writes")
        axes = self.pack_axes(leaf)
        # (a symbolic loop the input does not depend on may run inside the copy: the block is the same at each step)
        _check(all(self.is_concrete(a) for a in axes), f"{opt}: the block would span a symbolic size")
        _check(
            any(a < self.first_reduce and a not in axes for a in self.pack_loops()),
            f"{opt}: no global loop inside the copy reads the same elements again",
        )
        nbytes = sum(self.pack_size(x) * x.arg.dtype.itemsize for x in (*self.packed, leaf))
        _check(nbytes <= scratch, f"{opt}: {nbytes} bytes of scratch memory is more than {scratch}")
        self.packed = (*self.packed, leaf)
        self.applied_opts.append(opt)

    def apply_opts(self, opts: list[Opt]) -> None:
        for opt in opts:
            self.apply_opt(opt)

    def _try(self, opt: Opt) -> bool:
        """Apply `opt` when it applies, leaving the kernel as it was when it does not."""
        saved = self.copy()
        try:
            self.apply_opt(opt)
            return True
        except KernelOptError:
            self.__dict__.update(saved.__dict__)
            return False

    # ***** heuristics *****

    def loads(self) -> list[LazyOp]:
        return [x for x in self.leaves if x.op is BufferOps.LOAD]

    def stride_of(self, leaf: LazyOp, axis: int) -> Optional[sint]:
        """The buffer stride of `leaf` along `axis` (0 when broadcast), None when it is not a plain stride."""
        st = self.sts[leaf]
        if st.shape[axis] == 1:
            return 0
        return st.real_strides()[axis]

    def _vector_width(self) -> int:
        widths = self.opts.vector_widths
        return max(
            [widths.get(leaf.arg.dtype.scalar(), 1) for leaf in self.leaves if leaf.op is not BufferOps.CONST] or [1]
        )

    def hand_coded_optimizations(self) -> None:
        """Pick optimizations from the AST's shape and the renderer's abilities (deterministic)."""
        if self.shape_len == 0:
            return
        vw = self._vector_width()
        # the global axes the heuristics may upcast: a symbolic one (a dynamic batch) stays a plain loop around them
        globals_ = [a for a in range(self.first_reduce) if self.is_concrete(a)]
        if self.reduceops:
            self._optimize_reduce(globals_, vw)
        else:
            self._optimize_elementwise(globals_, vw)
        if self.opts.has_local and self.opts.global_max is not None:
            self._optimize_locals()
            if self.opts.has_shared and self.opts.shared_is_fast and self.reduceops:
                self._optimize_stage()

    def _divisor(self, size: int, choices: tuple[int, ...]) -> int:
        return next((c for c in choices if size % c == 0 and c <= size), 0)

    def _lane_budget(self) -> int:
        """The most lanes (upcast and unrolled) worth giving this kernel: LANE_OPS over its ALU ops, so that a kernel
        with a long fused expression (a matmul reading a GELU's gradient: ~80 ops a lane) is not unrolled into tens
        of thousands of uops (87k, 38 s of a C compiler's time, for no speed: it spills the registers anyway). An op
        after a reduce that a vector renderer computes on whole vectors (a Linear layer's bias and GELU) is rendered
        once a vector, not once a lane: it counts as 1/vw of one (GELU after 128x768 @ 768x3072 held the tile to 4 x
        32 lanes: 2.8 -> 3.x ms on two AVX-512 cores). On a vector renderer, the scalar ops among them (bit ops,
        libm calls: once per lane, each lane taken out of its vector and put back) come to at most LANE_SCALAR_OPS
        (but LONG_KERNEL_LANES lanes are always allowed): randn's Box-Muller into a max (11 scalar ops) took 16 lanes,
        82k characters of C and 0.29 s of gcc, in 4 lanes ~0.1 s, as fast."""
        ops = [x for x in self.ast.lazyops() if not isinstance(x.op, (BufferOps, ReduceOps))]
        inside = set(self.reduceops[0].lazyops()) if self.reduceops else set(ops)
        vw = self._vector_width() if self.opts.vector_uops else 1
        cost = sum(1 if x in inside or not self._vector_op(x) else 1 / vw for x in ops)
        budget = max(1, int(LANE_OPS // max(cost, 1)))
        if scalar := self._scalar_ops(ops):
            budget = min(budget, max(LONG_KERNEL_LANES, LANE_SCALAR_OPS // scalar))
        return min(budget, LONG_KERNEL_LANES) if len(ops) > LONG_KERNEL_OPS else budget

    def _scalar_ops(self, nodes: list[LazyOp]) -> int:
        """How many of the ALU `nodes` a vector renderer computes lane by lane (0 on a renderer without vector UOps:
        there every op is)."""
        if not self.opts.vector_uops:
            return 0
        return sum(1 for x in nodes if _is_alu(x) and not self._vector_op(x))

    def _optimize_reduce(self, globals_: list[int], vw: int) -> None:
        loads = self.loads()
        budget = self._lane_budget()
        gated = self._gated_symbolic()  # (its lanes stay the lane reduce's: no more upcasts, no unroll)
        if not gated and self._window_rows(globals_, vw, budget):
            return
        # a matmul-like reduce: global axes along which some input is broadcast (each output of the tile reuses
        # the loads of the others); the one contiguous in another input becomes the vector axis
        broadcast = [a for a in globals_ if any(self.stride_of(ld, a) == 0 for ld in loads)]
        contiguous = [a for a in globals_ if any(self.stride_of(ld, a) == 1 for ld in loads)]
        pack_col: Optional[int] = None  # a tile's column axis, whose gathered input _pack_gathered may pack
        packed_col = None if self.reduce_lanes else self._packed_column_tile(broadcast, vw, budget)
        if packed_col is not None:
            pack_col = packed_col
        elif not self.reduce_lanes and (len(broadcast) >= 2 or (broadcast and len(loads) >= 2)):
            # the column axis is one that the reduce's own loads read whole vectors along: an input read after the
            # reduce (a residual added to a conv's output: once per output, not per reduce step) does not choose it
            # (ResNet's 3x3 convs with the shortcut added had their vectors along the output's row, gathered from
            # the masked input, instead of along the output channels of the weights: 10.5 -> 5.8 ms on one core)
            inside = set(self.reduceops[0].lazyops())
            in_reduce = [ld for ld in loads if ld in inside]
            read_whole = [a for a in contiguous if any(self.stride_of(ld, a) == 1 for ld in in_reduce)]
            col, col_amount = self._tile_column(broadcast, read_whole or contiguous, vw, gathered=not read_whole)
            # down to one vector, or below it for a long kernel (whose budget is under one vector)
            floor = vw if vw > 1 and budget >= vw else 1
            while col_amount > max(budget, 1) and col_amount % 2 == 0 and col_amount > floor:
                col_amount //= 2

            def broadcast_in(axis: int) -> set[int]:
                return {i for i, ld in enumerate(loads) if self.stride_of(ld, axis) == 0}

            # the rows reuse what the columns load: an axis along which the other inputs are broadcast
            rows = [a for a in broadcast if a != col and broadcast_in(a) != broadcast_in(col)]
            rows = rows or [a for a in broadcast if a != col]
            row: Optional[int] = ([a for a in rows if a in contiguous] or rows or [-1])[-1]
            row = None if row == -1 else row
            wide_rows, pad_rows = self._wide_rows(row, col, col_amount, vw, budget)
            col_amount *= 2 if wide_rows else 1
            col_size = _int(self.full_shape[col])
            # the column axis first, so that it is the last (fastest, vectorized) upcast axis
            if not col_amount or not self._try(Opt(OptOps.UPCAST, col, col_amount)):
                col = -1
            elif col_amount == col_size:  # the whole axis went: the axes after it move down
                row = None if row is None else row - (row > col)
                col = -1
            if row is not None:
                row_size = _int(self.full_shape[row])
                limit = min(self._rows_max(row, vw), MAX_UPCAST // max(col_amount, 1), budget // max(col_amount, 1))
                row_amount = wide_rows or self._divisor(row_size, tuple(range(limit, 1, -1)))
                upcast = OptOps.PADTO if pad_rows else OptOps.UPCAST
                if not row_amount or not self._try(Opt(upcast, row, row_amount)):
                    row = None
                elif row_amount == row_size:  # the whole row axis went: a tile of one row of tiles
                    col -= col > row
                    row = None
            if row is not None and col >= 0:
                self._block_for_cache(row, col)
                pack_col = col
            elif col_amount and vw > 1:
                taken = self._more_rows(vw, col)
                if col >= 0:  # (ResNet's 256-channel 3x3 convs at 14x14: rows of 14 outputs, weights gathered)
                    col -= taken is not None and taken < col
                    pack_col = col
        elif (
            contiguous
            and self.n_reduce
            and not self.reduce_lanes
            and not any(self.stride_of(ld, self.first_reduce + self.n_reduce - 1) == 1 for ld in loads)
        ):
            # the reduce walks across rows: take a whole vector of neighbouring outputs at once
            col = contiguous[-1]
            choices = (4 * vw, 2 * vw, vw, 4, 2) if vw > 1 else (4, 2)
            amount = self._divisor(_int(self.full_shape[col]), tuple(c for c in choices if c <= max(budget, 2)))
            if amount:
                self._try(Opt(OptOps.UPCAST, col, amount))
        elif globals_ and not gated and not self._streamed_rows(vw):
            # a reduce along contiguous memory: independent accumulators hide the latency of each add (a lane reduce
            # too: one vector accumulator per core streamed a compensated 64 MB sum at 10 GB/s, four at 15), within the
            # lane budget with the lanes there are (a compensated sum's group of terms: _group_compensated)
            lanes = prod(self.upcast_sizes)
            choices = tuple(c for c in (4, 2) if lanes * c <= max(budget, 4))
            amount = self._divisor(_int(self.full_shape[globals_[-1]]), choices)
            if amount:
                self._try(Opt(OptOps.UPCAST, globals_[-1], amount))
        # (a packed column tile's reduce is not unrolled: 1020^3 and GPT-2's logits ran 1.2-1.7x slower unrolled by 2
        # or 4, its 12 accumulators and the lanes of each step more than 16 registers hold)
        unroll = packed_col is None and not self.inner_globals
        if self.n_reduce and unroll and self.is_concrete(self.first_upcast - 1) and not gated:
            last = _int(self.full_shape[self.first_upcast - 1])
            amount = last if last <= 4 else self._divisor(last, (2,) if self._spills(vw) else (4, 2))
            if amount and prod(self.upcast_sizes) * amount <= min(MAX_LANES, max(budget, 4)):
                self._try(Opt(OptOps.UNROLL, self.n_reduce - 1, amount))
        if pack_col is not None and not self.inner_globals:
            self._pack_gathered(pack_col, contiguous=packed_col is not None)
        if self.n_reduce and not self.inner_globals and not self.is_concrete(self.first_upcast - 1) and not gated:
            self._more_accumulators(vw, budget)

    def _window_rows(self, globals_: list[int], vw: int, budget: int) -> bool:
        """A depthwise conv on CPU loops: a SUM over a short window (at most WINDOW_STEPS steps, no channels) of a
        padded input (a masked load) that no output position shares with another (nothing to reuse along a tile's
        rows). Its output row goes whole into lanes (up to PADDED_ROW_LANES, else the largest divisor of whole vectors
        within that), the window's last axis unrolled: the mask falls on the row's two ends instead of on every tile
        of 8 x 14 outputs (two Zen 3 cores, each pair of kernels timed in turn: EfficientNet-B0's 3x3 depthwise convs
        at 112 x 112 -> 56 x 56 and at 56 x 56 1.1-1.7x, 1.4x, a 32-channel one at 112 x 112 1.5x). A conv summing
        over channels too (ResNet's 3x3: 5-7x slower so) and a max pool do not take it. Returns whether it did."""
        if self.opts.global_max is not None or vw <= 1 or self.reduce_lanes or not globals_:
            return False
        if len(self.reduceops) != 1 or self.reduceops[0].op is not ReduceOps.SUM or self.inner_globals:
            return False
        if (steps := self._reduce_steps()) is None or steps > WINDOW_STEPS or self.n_reduce < 2:
            return False
        row = globals_[-1]
        if row != self.first_reduce - 1 or self.stride_of(self.ast, row) != 1:
            return False  # (the output's row is the innermost global axis)
        inside = set(self.reduceops[0].lazyops())
        padded = [ld for ld in self.loads() if ld in inside and any(v.mask is not None for v in self.sts[ld].views)]
        if not padded or any(self.stride_of(ld, a) == 0 for ld in padded for a in globals_):
            return False
        size, last = _int(self.full_shape[row]), _int(self.full_shape[self.first_upcast - 1])
        lanes = size if size <= PADDED_ROW_LANES else self._divisor(size, tuple(range(PADDED_ROW_LANES, vw, -vw)))
        if lanes < 2 * vw or lanes * last > max(budget, 1) or not self._try(Opt(OptOps.UPCAST, row, lanes)):
            return False
        if last <= 5:
            self._try(Opt(OptOps.UNROLL, self.n_reduce - 1, last))
        return True

    def _streamed_rows(self, vw: int) -> bool:
        """Whether this is a plain row reduce that a CPU streams best one row at a time: one SUM or MAX of one input
        read in whole vectors (a lane reduce as wide as the target's vectors or wider), nothing else computed per
        element, not a compensated sum (whose longer chain of adds wants the accumulators of several rows), of more
        data than a core's L2 holds. Each row more read at once is another stream of memory for a core to prefetch.
        Two AVX-512 cores, medians of 60 runs: 4096 x 4096 row sums 2.0-2.7 -> 1.1-1.7 ms one row at a time instead
        of 4, row maxes 2.6-3.2 -> 1.6-2.0, 16384 x 256 row sums 0.73-0.88 -> 0.12; rows in cache (128 or 768 long)
        within noise either way. (Rows of 1000, 4 lanes wide, ran 3x slower one at a time: the chain of adds, not
        memory, is their limit; an exp per element (a softmax's sum) also wants several rows.)"""
        if self.opts.global_max is not None or vw <= 1 or self.reduce_lanes < vw or len(self.reduceops) != 1:
            return False  # (CPU loops only: a GPU's work items hide the latency)
        (op,) = self.reduceops
        if op.op not in (ReduceOps.SUM, ReduceOps.MAX) or self.compensated_sum(op):
            return False
        src = op.src[0]
        if src.op is not BufferOps.LOAD or len(self.loads()) != 1:
            return False
        elements = prod(s if isinstance(s, int) else s.max for s in self.full_shape)
        return elements * src.arg.dtype.itemsize >= STREAMED_BYTES

    def _gated_symbolic(self) -> bool:
        """Whether an input's mask has a symbolic bound (attention's keys over a KV cache: the cache up to start_pos
        and the new entry after it, joined). Each lane of a masked load is a scalar load and a select, so lanes beyond
        a lane reduce's make the kernel longer to build, not faster (GPT-2's scores, 4 heads x 4 unrolled steps x 16
        lanes of them: gcc 1.7-2.0 s for one kernel). (A padding's masks, of integer bounds, are not these.)"""
        return any(
            pair != (0, size) and not all(isinstance(bound, int) for bound in pair)
            for ld in self.loads()
            for view in self.sts[ld].views
            if view.mask is not None
            for pair, size in zip(view.mask, view.shape)
        )

    def _more_accumulators(self, vw: int, budget: int) -> None:
        """CPU loops over a reduce whose innermost loop is symbolic (attention's weighted sum over a KV cache), which
        cannot be unrolled: its vector accumulators are the only chains of FMAs that overlap. Where they are fewer
        than MIN_ACCUMULATORS, more lanes along an integer global axis, the one the output is nearest along first (the
        same rows of memory). (GPT-2's 12 heads x 64 over 400 positions, one AVX-512 core: 32 lanes 20 us, 4 x 32 lanes
        17.5 us.)"""
        lanes = prod(self.upcast_sizes)
        if self.opts.global_max is not None or vw <= 1 or lanes % vw or self.is_reduce_axis(self.shape_len - 1):
            return  # (a GPU's work items hide the latency: CPU loops only)
        while (want := MIN_ACCUMULATORS * vw // lanes) >= 2:
            choices = tuple(c for c in (8, 4, 2) if c <= want and c * lanes <= min(budget, MAX_UPCAST))
            axes = [a for a in range(self.first_reduce - self.local_dims) if self.is_concrete(a)]
            for axis in sorted(axes, key=lambda a: stride_order(self.stride_of(self.ast, a))):
                amount = self._divisor(_int(self.full_shape[axis]), choices)
                if amount and self._try(Opt(OptOps.UPCAST, axis, amount)):
                    lanes *= amount
                    break
            else:
                return

    def _rows_max(self, row: int, vw: int) -> int:
        """The most rows of a tile one vector wide along global axis `row`: 16, but 8 with 16 vector registers (AVX2,
        SSE) where the rows are far apart in memory (a matmul's, not a conv's neighbouring positions): 16 rows a
        multiple of 4 KB apart share one L1 set, more than its 8 ways (AVX2, a 1024 matmul: 16 rows 38 GFLOP/s, 8 rows
        123; 128x3072 @ 3072x768 the same; with K = 3000 104 -> 143; a conv's 16 rows ran faster than 8)."""
        if vw <= 1:
            return 4
        far = any(isinstance(s := self.stride_of(ld, row), int) and abs(s) >= ROW_FAR for ld in self.loads())
        return 8 if far and self.opts.vector_registers < 32 or self._aliased(row) else 16

    def _wide_rows(self, row: Optional[int], col: int, col_amount: int, vw: int, budget: int) -> tuple[int, bool]:
        """With 16 vector registers (AVX2): the rows of a tile two vectors wide, WIDE_ROWS of them where one divides the
        row axis, and whether the row axis is padded to a multiple of them first (PADTO); (0, False) where the tile
        stays one vector wide. Each broadcast row value then feeds two FMAs instead of one: a one-vector tile of 8
        rows loads 9 values for 8 FMAs and ran at 50-57 GFLOP/s on one Zen 3 core with its operands in L1, a 6 x
        2-vector tile 80-94 (5 or 7 rows: ~79; 4 rows: ~60, too few accumulators for the FMA latency; 8 rows: 16
        accumulators, spilled). Rows that none of them divides are padded, up to WIDE_ROWS_PAD more: on two Zen 3
        cores a 1024 x 1024 matmul ran at 121 GFLOP/s in 8 x 1-vector tiles, 1020 x 1024 at 168 in 6 x 2, and the same
        4 x 2-vector tiles gave nothing (119)."""
        if self.opts.vector_registers >= 32 or vw <= 1 or row is None or col_amount != vw or row == col:
            return 0, False
        if _int(self.full_shape[col]) % (2 * vw) or budget < 2 * vw * min(WIDE_ROWS):
            return 0, False
        size = _int(self.full_shape[row])
        # not where the rows read a padded input (a 3x3 conv's gated row loads ran 8.4 -> 10.9 ms in 7 x 2-vector
        # tiles against 14 x 1), unless a tile one vector wide would have fewer than MIN_ACCUMULATORS rows, each
        # waiting on the FMA before it, and no other axis to take more rows along (_more_rows: a batch of two):
        # ResNet-50's 512-channel 3x3 convs with 7 x 7 outputs, two Zen 3 cores, timed in turn against 7 rows of
        # one vector in five runs: 7-9% faster in four, even in one (at batch 2, two images of 7 rows one vector
        # wide ran 3.75 ms, 7 rows of two vectors 4.01)
        if any(self.sts[ld].axis_is_masked(row) for ld in self.loads()):
            narrow = self._divisor(size, tuple(range(self._rows_max(row, vw), 1, -1)))
            if narrow >= MIN_ACCUMULATORS or self._other_rows(row, col) or not (rows := self._divisor(size, WIDE_ROWS)):
                return 0, False
            return rows, False
        if rows := self._divisor(size, WIDE_ROWS):
            # 7 rows of two vectors hold 14 accumulators, and with the two column vectors and the broadcast row value
            # one more than 16 registers: where 14 neighbouring rows fit a tile one vector wide, that tile instead (its
            # 14 accumulators, a column vector and a row value fit). 1x1 convs with 14 x 14 outputs, two Zen 3 cores,
            # the two kernels timed in turn: ResNet-50's 256 -> 1024 1.15-1.31 -> 0.90-1.08 ms, 1024 -> 256
            # 1.05-2.04 -> 0.89-1.93; EfficientNet-B0's 7-32% faster each (480 -> 112 0.30 -> 0.23 ms); 256 -> 512
            # at stride 2 (28 x 28 outputs) 2.88 / 2.06 -> 2.65 / 2.18 in two runs; with 7 x 7 outputs, 7 rows one
            # vector wide ran 5-15% slower than 7 rows of two vectors: they stay
            if rows == 7 and size % 14 == 0 and self._rows_max(row, vw) >= 14:
                return 0, False
            return rows, False
        # padded only where the kernel will run in blocks for the cache, whose packed operands let the wider tile pay
        # (two Zen 3 cores: attention's weights @ values, 12 heads of 128 x 128 @ 128 x 64, ran 358 -> 405 us with
        # its 128 rows padded to 132; ResNet-50's unblocked 1x1 convs over 128 and 256 output channels 11-14% slower)
        rows = WIDE_ROWS[0]
        if size <= rows or not self._will_block(row, col, 2 * vw) or self._pad_refusal() is not None:
            return 0, False
        return (rows, True) if _pads_within(size, rows, WIDE_ROWS_PAD) else (0, False)

    def _spills(self, vw: int) -> bool:
        """Whether the tile's vector accumulators, its column vectors and a broadcast row value need more registers
        than the target has (7 rows of two vectors on AVX2's 16: 17; 16 rows of one: 18). Such a tile unrolls its
        reduce by 2, not 4: the two kernels timed in turn on two Zen 3 cores, ResNet-50's 1x1 convs with 7 x 7 outputs
        (2048 -> 512, 512 -> 2048) 12-16% faster in each of three runs, its 64 -> 256 at 56 x 56 (16 rows) 13%,
        EfficientNet-B0's 1152 -> 192 and 192 -> 1152 at 7 x 7 11-21%, 32 -> 16 at 112 x 112 10% (tiles of 14 rows one
        vector wide, which fit, ran the same either way)."""
        ups = self.upcast_sizes
        if vw <= 1 or not ups or ups[-1] % vw or self.is_reduce_axis(self.shape_len - 1):
            return False
        return prod(ups) // vw + ups[-1] // vw + 1 > self.opts.vector_registers

    def _other_rows(self, row: int, col: int) -> bool:
        """Whether a global axis besides `row` and `col` could give a tile more rows as _more_rows takes them: one
        whose rows reuse the column's loads, of a size 2, 3 or 4 divides."""
        return any(
            self._reuses_column_loads(axis, col) and any(_int(self.full_shape[axis]) % c == 0 for c in (4, 3, 2))
            for axis in range(self.first_reduce)
            if axis not in (row, col) and self.is_concrete(axis)
        )

    def _reuses_column_loads(self, axis: int, col: int) -> bool:
        """Whether rows along global `axis` reuse what the tile loads along its columns `col`: some load is broadcast
        along `axis` and not along `col` (a conv's weights, the same for every image of a batch)."""
        return any(self.stride_of(ld, axis) == 0 and self.stride_of(ld, col) != 0 for ld in self.loads())

    def _more_rows(self, vw: int, col: int) -> Optional[int]:
        """A second row axis for a tile of fewer than MIN_ACCUMULATORS vector accumulators (a conv's weight gradient:
        its rows, the kernel's 3 columns, took their whole axis): each accumulator's FMAs wait on each other, so the
        tile waits on the FMA latency; more rows, along an axis that the column's loads are broadcast along, reuse
        those loads (a 16 -> 16 3x3 conv's weight gradient at batch 32, 32 x 32, on one AVX2 core: 6.4 -> 3.6 ms;
        ResNet-18's 512-channel 3x3 convs at 7 x 7, batch 2, rows of 7 outputs: two images at once, 8.9 -> 7.7 ms).
        With 16 vector registers a tile of one vector and no rows goes two vectors wide along its column axis `col`
        first (-1: none left), so that each broadcast value feeds two FMAs, as in _wide_rows' tiles (two Zen 3 cores,
        each pair of kernels timed in turn: EfficientNet-B0's depthwise convs 1.3-1.8x faster, a CNN's stride-2 conv's
        input gradient 1.7x; kernels of a few us within noise either way).
        Returns the global axis it took whole (the axes after it moved down), else None."""
        lanes = prod(self.upcast_sizes)
        if lanes % vw or lanes // vw >= MIN_ACCUMULATORS:  # (a column narrower than a vector: no vector tile)
            return None
        if lanes == vw and self.opts.vector_registers < 32 and col >= 0:
            size = _int(self.full_shape[col])
            if size > 2 and size % 2 == 0 and self._try(Opt(OptOps.UPCAST, col, 2)):
                lanes *= 2
        accumulators = lanes // vw
        # up to 14 accumulators with 16 registers (one left for the column's vector, one for a broadcast row value)
        limit = (14 if self.opts.vector_registers < 32 else 24) // accumulators
        for axis in reversed(range(self.first_reduce)):  # (the innermost global axis first)
            if not self.is_concrete(axis) or not self._reuses_column_loads(axis, self.shape_len - 1):
                continue
            size = _int(self.full_shape[axis])
            for amount in (c for c in (4, 3, 2) if c <= limit and size % c == 0):
                if self._try(Opt(OptOps.UPCAST, axis, amount)):  # (refused past MAX_UPCAST lanes: fewer then)
                    return axis if amount == size else None
        return None

    def _tile_column(self, broadcast: list[int], contiguous: list[int], vw: int, gathered: bool) -> tuple[int, int]:
        """The tile's column axis (its last upcast axis: the vector axis) and how many columns a tile has. `gathered`:
        no load of the reduce reads whole vectors along any of the `contiguous` axes."""
        if vw > 1:
            # two vectors wide only where the accumulators fit the registers: a target with 16 vector registers (AVX2,
            # SSE) spills a 16 x 2-vector tile (CLANG -march=x86-64-v3 through GCC: a 1024 matmul 2.5 s, one vector
            # wide 43 ms); and, where the reduce gathers its column vectors, only where that block is packed: a conv's
            # weights, gathered along the output channels at every reduce step, cost a load a lane (ResNet-18's
            # 512-channel 3x3 convs at 7x7, batch 2, one AVX-512 Zen 4 core: 7 x 32 tiles 26 ms, 14 x 16 8.5 ms)
            packs_wide = self._packs_gathered(2 * vw)
            wide = self.opts.vector_registers >= 32 and (packs_wide or not gathered)
            widths = (2 * vw, vw) if wide else (vw,)
            # an axis the output is contiguous along comes first, even one vector wide: its tiles store whole vectors
            # (dz.T @ x of the MLP's backward, 512x128 @ 128x784: 16 columns along the output's rows ran 1.4-1.7x
            # faster than 32 along its columns, whose stores were scattered)
            stored = [a for a in broadcast if self.stride_of(self.ast, a) == 1]
            for among in (stored, broadcast):
                for amount in widths:
                    fits = [a for a in among if a in contiguous and _int(self.full_shape[a]) % amount == 0]
                    fits = [a for a in fits if amount == vw or not self._aliased(a)]
                    if fits:
                        return fits[-1], amount
            # no contiguous axis holds a vector: gather one along the axis with the smallest stride, of equal ones the
            # output's contiguous axis (a @ b.T: the tile stores whole vectors, and a blocked kernel packs b's block);
            # two vectors wide where the gathered block will be packed (a @ b.T at K = 768: 8 x 32 tiles ran ~10%
            # faster than 8 x 16), but one where b's rows lie a multiple of 2 KB apart (_aliased: at K = 1024 and
            # 2048 8 x 16 tiles ran 1.1-1.5x faster than 8 x 32, and 16 x 16 tiles, 16 rows of a in one cache set, 2x
            # slower)
            for amount in widths if packs_wide else (vw,):
                fits = [a for a in broadcast if _int(self.full_shape[a]) % amount == 0]
                if fits:
                    strides = {a: [self.stride_of(ld, a) for ld in self.loads()] for a in fits}
                    col = min(fits, key=lambda a: (max(stride_order(s) for s in strides[a]), a not in stored))
                    if amount > vw and self._aliased(col):
                        continue
                    return col, amount
        cols = [a for a in broadcast if a in contiguous]
        col = cols[-1] if cols else broadcast[-1]
        return col, self._divisor(_int(self.full_shape[col]), (8, 4, 2) if vw > 1 else (4, 2))

    def _packed_column_tile(self, broadcast: list[int], vw: int, budget: int) -> Optional[int]:
        """CPU loops over a matmul-like reduce whose tile would otherwise have fewer than two vectors of columns, or too
        few rows: a tile two vectors wide and 6 or 5 rows high (padded where none divides), the column tiles the
        outer loop, each one's share of the input read along the columns packed (_pack_gathered), the reduce not
        unrolled; returns the column axis, else None with the kernel unchanged. It takes
        - output columns that no two vectors divide, padded to a multiple of them (PADTO) where that adds at most
          COLUMN_PAD_WASTE: before, such a matmul had tiles along its rows or a few lanes wide. Two Zen 3 cores, each
          pair of kernels timed in turn: 128 x 768 @ (50257 x 768).T, GPT-2's logits, 26 -> 150-154 GFLOP/s; 1020^3
          47-60 -> 128-160; 2040^3 98 -> 155; 512 x 512 @ (500 x 512).T 99-141 -> 83-186; a 3x3 conv over
          250-pixel rows 32 -> 38; 1x1 convs at 14 x 14 (196 pixels -> 208, before _wide_rows' 14 rows one vector
          wide): ResNet-50's 1.02-1.23x faster, EfficientNet-B0's 1.08-1.33x. (Blocked for the cache instead,
          _block_for_cache, 1020^3 ran 130 and 1000^3 151.)
        - with 16 vector registers (AVX2), columns that two vectors divide but rows that none of WIDE_ROWS does, in a
          kernel of one reduce axis too short to run in blocks (_will_block), where _wide_rows leaves the tile one
          vector wide: attention's 12 x (128 x 64 @ 64 x 128) and 12 x (128 x 128 @ 128 x 64) 1.20-1.36x faster, an
          MLP's 32 x 784 @ 784 x 64 and its backward's 1.14-1.18x, ResNet-50's 1x1 convs at 56 x 56 1.13-1.43x
          (a conv of several reduce axes, its 7x7 stem, ran 0.6x: not taken)."""
        if vw <= 1 or self.opts.global_max is not None or not self.opts.scratch_max or len(self.reduceops) != 1:
            return None
        # (the cheap tests first: this runs for every reduce a CPU renderer lowers)
        stored = [a for a in broadcast if self.stride_of(self.ast, a) == 1]
        if len(stored) != 1:
            return None
        col, width = stored[0], 2 * vw
        size = _int(self.full_shape[col])
        divides = size % width == 0
        if size < 4 * width or not _pads_within(size, width, COLUMN_PAD_WASTE) or budget < width * WIDE_ROWS[0]:
            return None
        if divides and (self.opts.vector_registers >= 32 or self.n_reduce != 1):
            return None  # (_optimize_reduce's tile is two vectors wide)
        inside = set(self.reduceops[0].lazyops())
        along = [ld for ld in self.loads() if ld in inside and self.stride_of(ld, col) != 0]
        rows = [a for a in broadcast if a != col and all(self.stride_of(ld, a) == 0 for ld in along)]
        if len(along) != 1 or not rows or (steps := self._reduce_steps()) is None:
            return None
        # (the block of a column tile must fit the scratch memory: unpacked, its padded lanes load one by one)
        if steps * width * along[0].arg.dtype.itemsize > self.opts.scratch_max:
            return None
        row = rows[-1]
        row_size = _int(self.full_shape[row])
        if divides and (self._divisor(row_size, WIDE_ROWS) or self._will_block(row, col, width)):
            return None  # (_optimize_reduce's tile is two vectors wide, or blocked)
        if self._pad_refusal() is not None or self._gated_symbolic():
            return None
        if self.opts.vector_registers < 32:
            # 6 or 5 rows, else 6 padded, else 7 (14 accumulators and 3 more registers: one more than 16, spilled;
            # EfficientNet-B0's 1x1 convs at 14 x 14 with 112 output channels ran 0.63-0.65x as fast in 7 rows as in
            # 14 rows one vector wide)
            amount, pad_rows = self._divisor(row_size, tuple(r for r in WIDE_ROWS if r != 7)), False
            if not amount and _pads_within(row_size, WIDE_ROWS[0], WIDE_ROWS_PAD):
                amount, pad_rows = WIDE_ROWS[0], True
            amount = amount or self._divisor(row_size, (7,))
        else:
            limit = min(self._rows_max(row, vw), MAX_UPCAST // width)
            amount, pad_rows = self._divisor(row_size, tuple(range(limit, 1, -1))), False
        if not amount or row_size <= amount:
            return None
        saved = self.copy()
        # (the column axis keeps its place: it is longer than one tile)
        columns = Opt(OptOps.UPCAST if divides else OptOps.PADTO, col, width)
        if self._try(columns) and self._try(Opt(OptOps.PADTO if pad_rows else OptOps.UPCAST, row, amount)):
            return col
        self.__dict__.update(saved.__dict__)
        return None

    def _block_for_cache(self, row: int, col: int) -> None:
        """CPU loops over a big matmul-like reduce: run the reduce in blocks of about BLOCK_REDUCE steps, each over a
        panel of output tiles that keeps its share of both inputs in cache (the partial sums wait in the output, so
        every output still adds its elements in order); a reduce too short for two blocks runs as one, over the
        panels. The tile's row and column axes must be the last globals."""
        if not self._will_block(row, col, 1):
            return
        steps, tiles = _int(self.full_shape[self.first_reduce]), _int(self.full_shape[col])
        step, panel = _reduce_block(steps), _panel(tiles, self.panel_tiles())
        saved = self.copy()
        try:
            # [.., rows, cols] -> [.., panels, rows, tiles of a panel] -> reduce [blocks, steps]; a reduce of one
            # block (ONE_BLOCK) keeps its loop and its accumulators: only the panel and its packed block
            self.apply_opt(Opt(OptOps.SPLIT, col, panel))
            self.apply_opt(Opt(OptOps.SWAP, row, col))
            if step:
                self.apply_opt(Opt(OptOps.SPLIT, self.first_reduce, step))
                self.apply_opt(Opt(OptOps.HOIST, 2, 1))
        except KernelOptError:
            self.__dict__.update(saved.__dict__)
            return
        # the input read in vectors along the tile's columns, one row of it per reduce step: its block is packed
        # (rows a power of two apart share a few cache sets; packed, they stream: 2048 x 2048 on one core 121 -> 145
        # GFLOP/s). The other input, read one broadcast element at a time, stays (packed, it was ~20% slower)
        # (an input added after the reduce, as a bias, is read once per output in the epilogue: not packed)
        inside = set(self.reduceops[0].lazyops())
        for i, leaf in enumerate(self.loads()):
            if leaf in inside and self.shape_len - 1 in self.pack_axes(leaf):
                self._try(Opt(OptOps.PACK, i, 0))

    def _will_block(self, row: int, col: int, columns: int) -> bool:
        """Whether _block_for_cache blocks this kernel once its tile is `columns` wide along `col` (1: the tile is made
        already): CPU loops over one reduce long enough for two blocks (or one: ONE_BLOCK), the tile's row and column
        axes the last globals, and at least two panels of panel_tiles() or a near count of tiles that divides them."""
        if self.opts.global_max is not None or self.n_reduce != 1 or not self.is_concrete(self.first_reduce):
            return False
        if (row, col) != (self.first_reduce - 2, self.first_reduce - 1) or _int(self.full_shape[col]) % columns:
            return False
        tiles, steps = _int(self.full_shape[col]) // columns, _int(self.full_shape[self.first_reduce])
        return (bool(_reduce_block(steps)) or steps >= ONE_BLOCK) and _panel(tiles, self.panel_tiles()) != 0

    def panel_tiles(self) -> int:
        """Column tiles a panel of a kernel run in blocks for the cache wants: PANEL_TILES, twice as many with 16 vector
        registers (AVX2, SSE), whose tiles are half as wide: the same columns a panel. Two Zen 3 cores, 6 x 16 tiles,
        panels of 4 tiles against 8: 128 x 768 @ 768 x 768 150 -> 174 GFLOP/s, 128 x 3072 @ 3072 x 768 147 -> 168,
        2048^3 173 -> 182."""
        return PANEL_TILES * (2 if self.opts.vector_registers < 32 else 1)

    def _aliased(self, axis: int) -> bool:
        """Whether a load of the reduce reads rows along global `axis` that lie a multiple of ALIASED_BYTES apart
        (neither broadcast nor contiguous): such rows share a few sets of a CPU's L1 cache, so a tile or a packing
        copy that reads 16 or 32 of them at once evicts its own lines. On two AVX-512 Zen 4 cores, x @ w.T with
        128 rows: K = 1024 in 32 columns of w 124 GFLOP/s, in 16 164; K = 2048 131 -> 175 (K = 768, 3 KB apart:
        197 in 32, 178 in 16); ResNet-50's 1x1 convs, whose columns are output channels: 2048 -> 512 at 7x7 1.30 ->
        0.75 ms, 1024 -> 2048 stride 2 2.61 -> 1.50, 512 -> 2048 at 7x7 0.79 -> 0.55 (from 2000 channels 0.52 ms
        either way). A tile's rows too: 16 rows of x with 16 columns ran 81 GFLOP/s at K = 1024, 8 rows 164. (CPU
        loops only: a GPU's work items read such rows in other patterns.)"""
        if self.opts.global_max is not None:
            return False
        inside = set(self.reduceops[0].lazyops())
        return any(
            isinstance(st := self.stride_of(ld, axis), int)
            and st not in (0, 1)
            and (st * ld.arg.dtype.itemsize) % ALIASED_BYTES == 0
            for ld in self.loads()
            if ld in inside
        )

    def _packs_gathered(self, columns: int) -> bool:
        """Whether a gathered input's block for a tile of `columns` can be packed in the renderer's scratch memory (CPU
        loops only): a matmul of two global axes whose reduce is long enough (a bias or GELU after it too) runs in
        blocks (_block_for_cache), each block packed; else every reduce step of them (float32 or narrower:
        _pack_gathered). (A Linear layer's 3072 -> 768 projection with its bias, 128 rows, before it could block: 32
        columns, unpacked, ran at 27 GFLOP/s on two AVX-512 cores; 16, packed, at 86-94; in blocks 32 wide, ~220.)"""
        if not self.opts.scratch_max or self.opts.global_max is not None or self.local_dims:
            return False
        if (steps := self._reduce_steps()) is None:
            return False  # (a block of a symbolic reduce has no size to fit the scratch memory)
        if self.first_reduce == 2 and self.n_reduce == 1 and self._hoist_refusal() is None:
            if _reduce_block(_int(self.full_shape[self.first_reduce])):
                return True
        return steps * columns * 4 <= self.opts.scratch_max

    def _reduce_steps(self) -> Optional[int]:
        """The steps of the kernel's reduce loops together, None where one is symbolic."""
        reduce_axes = range(self.first_reduce, self.first_reduce + self.n_reduce)
        if not all(self.is_concrete(a) for a in reduce_axes):
            return None
        return prod(_int(self.full_shape[a]) for a in reduce_axes)

    def _pack_gathered(self, col: int, contiguous: bool = False) -> None:
        """CPU loops over a matmul-like reduce whose tile columns an input holds far apart (x @ w.T, a Linear layer:
        the columns are w's rows; a conv's weights along its output channels): the column tiles become the outer loop
        and that input's block for one of them (every reduce step of the tile's columns) is packed, each element
        gathered once instead of once per row tile (x (128, 784) @ w.T (784, 512) + b on two cores: 1.5 -> 0.7 ms).
        `contiguous`: the tile is _packed_column_tile's, whose input read along the columns is packed even where it is
        contiguous (padded, its lanes are valid one by one, and the block makes them one vector load again)."""
        if self.opts.global_max is not None or self.local_dims or not 0 <= col < self.first_reduce:
            return
        # (a contiguous input packs for no gain: 128x512 @ 512x512 and its transposes ran 3-15% slower packed; and an
        # input added after the reduce, as a bias, is read once per output, not per reduce step)
        inside = set(self.reduceops[0].lazyops())
        last = self.shape_len - 1
        skip = (0,) if contiguous else (0, 1)
        gathered = [i for i, ld in enumerate(self.loads()) if ld in inside and self.stride_of(ld, last) not in skip]
        if len(gathered) != 1:
            return
        saved = self.copy()
        if col and not self._try(Opt(OptOps.SWAP, 0, col)):
            return
        if not self._try(Opt(OptOps.PACK, gathered[0], 0)):
            self.__dict__.update(saved.__dict__)

    def _vector_op(self, x: LazyOp) -> bool:
        """Whether a vector renderer computes ALU node `x` on whole vectors (codegen/uops.py): the vector ALU ops and
        its `vector_math` on operands of one dtype; comparisons, selects and masks cast to float32 on float32 vectors
        where it declares the three select ops."""
        math = self.opts.vector_math
        if x.op in (UnaryOps.BITCAST, BinaryOps.SHL):
            return x.op in math and is_vector_bits_op(x)
        if has_vector_select(math):
            if x.op in VECTOR_SELECT:
                return dtype_of(x.src[-1]) == VECTOR_SELECT_DTYPE
            if x.op is UnaryOps.CAST:
                return x.arg == VECTOR_SELECT_DTYPE and dtype_of(x.src[0]) == dtypes.bool
        return x.op in _ELEMENTWISE_LANES_OK or x.op in math

    def _optimize_elementwise(self, globals_: list[int], vw: int) -> None:
        if vw <= 1:
            return
        out = self.ast
        contiguous = [a for a in globals_ if self.stride_of(out, a) == 1]
        # (an index that every lane along the vector axis shares is computed once a vector: its ops do not count)
        nodes = out.lazyops()
        shared = self._shared_index_ops(nodes, contiguous[-1]) if contiguous else set()
        alu = [x for x in nodes if _is_alu(x) and x not in shared]
        self._shared_lanes(globals_, alu)
        if self.opts.vector_uops and not all(map(self._vector_op, alu)):
            return  # lanes of a scalar op (a libm call, a compare) only make the kernel longer to compile
        amount = self._divisor(_int(self.full_shape[contiguous[-1]]), (vw, 4, 2)) if contiguous else 0
        heavy = len(alu) >= HEAVY_ELEMENTWISE
        if heavy and amount != vw:
            # no whole vector along the output's rows (EfficientNet's 7x7 maps: rows of 49; 14x14: 196, 4 lanes): an
            # arithmetic-heavy kernel takes its vectors along another axis, loads gathered and stores scattered, its
            # ops still `vw` lanes at a time (BatchNorm + SiLU over (1152, 49) on AVX2: 2.8 -> 0.8 ms; over (480,
            # 196) on one AVX-512 core: 417 -> 222 us against vectors of 4 along the rows)
            for axis in reversed(globals_):
                if axis not in contiguous[-1:] and self._divisor(_int(self.full_shape[axis]), (vw,)):
                    if self._try(Opt(OptOps.UPCAST, axis, vw)):
                        self._interleave_vectors(len(alu))
                        return
            if not contiguous and any(self.stride_of(out, a) == 1 for a in range(self.first_reduce)):
                # the output's rows run along a symbolic axis (a softmax's exp over a KV cache of symbolic length):
                # lanes along an integer axis that holds no whole vector, rather than none (GPT-2's 12 heads x 400
                # positions, one AVX-512 core: 23-32 us scalar, 8-9 us in 12 lanes)
                for axis in reversed(globals_):
                    size = _int(self.full_shape[axis])
                    lanes = size if size <= vw else self._divisor(size, (vw // 2, vw // 4))
                    if lanes > 1 and self._try(Opt(OptOps.UPCAST, axis, lanes)):
                        return
        if amount and self._try(Opt(OptOps.UPCAST, contiguous[-1], amount)):
            # (CPU loops: a GPU's work items read a row's elements together)
            blocked = self.opts.global_max is None and self._transpose_block(amount)
            # (a transpose's block is vectors enough to overlap: interleaved on top, a CNN's BatchNorm into NHWC,
            # 32 x 32 x 32 x 16, ran 1.3x slower)
            if len(alu) >= INTERLEAVE_MIN_OPS and amount == vw and not blocked:
                self._interleave_vectors(len(alu))
        elif amount and self.opts.global_max is None and _int(self.full_shape[contiguous[-1]]) <= PADDED_ROW_LANES:
            # the row's view would not split (a padded copy, a conv's input with its border: 34 = 32 + 2, masked):
            # the whole row in lanes, which needs no split (two Zen 3 cores, each pair of kernels timed in turn: a CNN's
            # padded copies of (512, 32, 32) 1.8-3.5x faster, EfficientNet-B0's 2.7-3.9x)
            self._try(Opt(OptOps.UPCAST, contiguous[-1], 0))

    def _shared_lanes(self, globals_: list[int], alu: list[LazyOp]) -> None:
        """An elementwise kernel whose ops, most of them, read nothing that changes along a short global axis (at most
        SHARED_LANES long): that axis goes whole into lanes, so its lanes compute those ops once (equal uops are one)
        and differ only where they must. Random draws are such a kernel: the 20 rounds of Threefry per counter, then a
        pick of one of its two words ((2, n / 2) outputs): 2.4M uint32 words 18 -> 9 ms on two Zen 3 cores."""
        if len(alu) < HEAVY_ELEMENTWISE:
            return
        for axis in globals_:
            size = _int(self.full_shape[axis])
            if not 1 < size <= SHARED_LANES:
                continue
            invariant: dict[LazyOp, bool] = {}
            for x in alu:
                self._invariant_along(x, axis, invariant)
            if sum(invariant[x] for x in alu) * 4 >= len(alu) * 3:
                self._try(Opt(OptOps.UPCAST, axis, size))
                return

    def _invariant_along(self, x: LazyOp, axis: int, memo: dict[LazyOp, bool]) -> bool:
        """Whether AST node `x` has one value along global `axis`: it reads only loads broadcast along it."""
        if (known := memo.get(x)) is not None:
            return known
        ok = (x.op is not BufferOps.LOAD or self.stride_of(x, axis) == 0) and all(
            self._invariant_along(y, axis, memo) for y in x.src
        )
        memo[x] = ok
        return ok

    def _shared_index_ops(self, nodes: list[LazyOp], axis: int) -> set[LazyOp]:
        """Those of the kernel's `nodes` in a gathered load's index expression whose loads are all broadcast along
        global `axis`: every lane along it has the same index, so the linearizer computes them once per group of lanes
        (equal uops are one) and the loads at that index are whole vectors. (`table[ids]` wraps a negative id with an
        int compare and select: scalar ops, but no reason to leave the row's copy one float at a time: 256 rows of 64
        floats under TinyJit on the Zen 3 VM, with the layout of Tensor._advanced_index, 40-65 -> ~27 us.)"""
        shared: set[LazyOp] = set()
        for x in nodes:
            if x.op is BufferOps.LOAD and x.src:
                index = x.src[0].lazyops()
                if all(self.stride_of(n, axis) == 0 for n in index if n.op is BufferOps.LOAD):
                    shared.update(index)
        return shared

    def _interleave_vectors(self, ops: int) -> None:
        """CPU loops over an arithmetic-heavy elementwise kernel: each vector's ops are one chain (SiLU: ~70, each
        waiting on the one before), so one vector an iteration runs at the ops' latency; INTERLEAVE_VECTORS
        independent vectors an iteration (along any global axis that they divide) let the CPU overlap them (SiLU over
        1.2M floats on one AVX-512 core: 1.19 -> 0.87 ns an element; 2 vectors: 0.99)."""
        if self.opts.global_max is not None:
            return
        lanes = prod(self.upcast_sizes)
        for axis in reversed(range(self.first_reduce)):
            if not self.is_concrete(axis):
                continue
            fits = (c for c in (INTERLEAVE_VECTORS, 2) if c * lanes * ops <= LANE_OPS and c * lanes <= MAX_UPCAST)
            choices = tuple(fits)
            amount = self._divisor(_int(self.full_shape[axis]), choices)
            if amount and self._try(Opt(OptOps.UPCAST, axis, amount)):
                return

    def _transpose_block(self, amount: int) -> bool:
        """A kernel that stores along an axis an input reads far apart (a transpose: NCHW to NHWC) reads that input in
        blocks: the axis it is contiguous along is upcast too, so each of its rows gives `amount` neighbouring
        elements at once instead of one per output vector (rows a power of two apart share one L1 set, and every
        read missed it: on one AVX2 core a 1024 x 1024 transpose 4.9 -> 0.74 ms, NCHW -> NHWC of 32 x 32 x 32 x 32
        2.3 -> 0.57 ms, a 3x3 conv's weight relayout 256 x 2304 0.82 -> 0.34 ms; blocks of 16 were slower)."""
        loads = self.loads()
        vector_axis = self.shape_len - 1
        for ld in loads:
            st = self.stride_of(ld, vector_axis)
            if not isinstance(st, int) or abs(st) < ROW_FAR:
                continue
            along = [a for a in range(self.first_reduce) if self.stride_of(ld, a) == 1 and self.is_concrete(a)]
            if along:
                size = _int(self.full_shape[along[-1]])
                block = self._divisor(size, tuple(c for c in (8, 4) if c * amount <= MAX_UPCAST // 2))
                if block and self._try(Opt(OptOps.UPCAST, along[-1], block)):
                    return True
        return False

    def _optimize_locals(self) -> None:
        """Workgroups of up to MAX_GROUP items from the innermost global axes, each axis keeping two groups or more
        (a kernel that is one workgroup runs on one compute unit)."""
        local_max = self.opts.local_max or (1,)
        budget = min(max(local_max), MAX_GROUP)
        for axis in reversed(range(self.first_reduce - self.local_dims)):
            size = self.full_shape[axis]
            if budget < 2 or self.local_dims >= 3:
                break
            if not isinstance(size, int):  # (a symbolic axis stays a grid axis)
                continue
            amount = self._divisor(size, tuple(c for c in (32, 16, 8, 4, 2) if c <= budget and c * 2 <= size))
            if amount and self._try(Opt(OptOps.LOCAL, axis, amount)):
                budget //= amount

    def _optimize_stage(self) -> None:
        """Inputs that several work items of a workgroup read (a matmul's rows and columns) go through shared
        memory, up to STAGE_REDUCE reduce steps at a time (fewer when that lets more inputs fit): each element is
        loaded from device memory once per workgroup instead of once per work item."""
        if not self.local_dims or not self.n_reduce or not self.is_concrete(self.first_upcast - 1):
            return
        start, best, best_staged = self.copy(), None, 0
        size = _int(self.full_shape[self.first_upcast - 1])
        for amount in [a for a in (STAGE_REDUCE, 8, 4, 2) if a < size and size % a == 0] or [size]:
            self.__dict__.update(start.copy().__dict__)
            if amount < size and not self._try(Opt(OptOps.SPLIT, self.first_upcast - 1, amount)):
                continue
            staged = sum(self._try(Opt(OptOps.STAGE, i, 0)) for i in range(len(self.loads())))
            if staged > best_staged:
                best, best_staged = self.copy(), staged
        self.__dict__.update((best or start).__dict__)

    # ***** output *****

    @property
    def name(self) -> str:
        """The kernel's function name: r_ or E_ and its shape, as an identifier (codegen/names.py)."""
        prefix = "r" if self.reduceops else "E"
        return kernel_identifier("_".join([prefix, *(str(s) for s in self.full_shape)]))
