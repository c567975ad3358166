"""The linearizer: lowers a Kernel to the UOp list (the IR documented in codegen/uops.py).

Global axes become loops (a Renderer with `global_max = None`, like a CPU) or launched grid indices (SPECIAL),
reduce axes become loops with an accumulator. Index arithmetic comes from each buffer's ShapeTracker as
symbolic Nodes and is lowered to index ALU uops. Equal uops are emitted once per loop scope, and uops without
effects that nothing reads are dropped at the end. Where the Renderer declares `fused_mulacc`, a float SUM of
products accumulates with MULACC; a STAGEd input is copied into shared memory (DEFINE_LOCAL) by the workgroup before
the innermost reduce loop, between BARRIERs, and read from there; a PACKed input is copied by the thread into a
scratch block (DEFINE_LOCAL, no BARRIER) at each step of the outermost loop (of a HOISTed kernel: of the outer reduce
loops), and read from there.

The index uops are int32, or int64 where a value the index arithmetic computes may not fit int32 (a buffer or an
index space past 2^31 - 1 elements; see index_dtype_of).
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Union

import numpy as np

from tgcore.codegen.kernel import Kernel, _int, dtype_of, is_vector_bits_op, stride_order
from tgcore.codegen.names import THREAD_BOUNDS, internal_prefix, variable_identifier
from tgcore.codegen.uops import (
    VECTOR_ALU,
    VECTOR_DTYPES,
    VECTOR_SELECT,
    VECTOR_SELECT_DTYPE,
    UOp,
    UOps,
    has_vector_select,
)
from tgcore.dtype import ConstType, DType, PtrDType, dtypes
from tgcore.helpers import prod
from tgcore.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, ReduceOps, TernaryOps, UnaryOps
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, sint
from tgcore.shape.view import View

_REDUCE_ALU = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}
# a SUM of products over these accumulates with MULACC on a renderer with `fused_mulacc`
_FUSED_DTYPES = (dtypes.float32, dtypes.float64)
# uops without effects: dropped when nothing reads them (a product that a MULACC took over)
_PURE = (UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE)
# ALU ops per iteration that count as one unit of a kernel's work: its outermost loop is split across threads when
# it runs at least the renderer's thread_min_work (plugin.py) of those units (an add with its loads and store is one)
THREAD_OPS = 4
# a symbolic outermost loop (a dynamic batch) is split across threads as range(its upper bound, at most this many):
# each part of that range runs its proportional share of the loop's size at run time (Linearizer._open_globals)
SYMBOLIC_THREAD_PARTS = 1 << 10
# a PACK's copy of rows a multiple of ROWWISE_APART bytes apart (one L1 way: all in one set) takes ROWWISE_BYTES of a
# row at a time (a cache line: Linearizer._rowwise_steps)
ROWWISE_BYTES, ROWWISE_APART = 64, 4096
# vector uops (a renderer with `vector_uops`): the dtypes and ops they are used for, and the most lanes in one
_VECTOR_REDUCE = (ReduceOps.SUM,)
MAX_VECTOR = 16
# a value of one group of lanes: a vector uop, or one scalar uop per lane
Value = Union[UOp, tuple[UOp, ...]]
# the values int32 index arithmetic holds; a kernel whose index values may leave them computes its indices in int64
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _IndexOverflow(Exception):
    """A value of a kernel's int32 index arithmetic may not fit int32: the kernel is lowered again in int64."""


def _upper(s: sint) -> int:
    return s if isinstance(s, int) else s.max


def index_dtype_of(k: Kernel) -> DType:
    """The index dtype a kernel's sizes call for: int64 when its index space or a buffer it touches has more than
    INT32_MAX elements, else int32 (int32 math is as fast as int64 on CPUs and faster on GPUs). An int32 kernel whose
    index arithmetic still reaches past int32 (an intermediate value, a symbolic bound) is lowered again in int64."""
    if (space := prod([_upper(s) for s in k.full_shape])) > INT64_MAX:
        raise ValueError(
            f"kernel {k.name} spans {space} elements (shape {k.full_shape}), more than int64 indexes (the widest index "
            "of every device): use tensors of fewer elements"
        )
    if space > INT32_MAX:
        return dtypes.int64
    if any(leaf.arg.real_size() > INT32_MAX for leaf in k.leaves if leaf.op is not BufferOps.CONST):
        return dtypes.int64
    return dtypes.int32


class Linearizer:
    """Emits the uops of one Kernel."""

    def __init__(self, k: Kernel, index_dtype: Optional[DType] = None) -> None:
        self.k = k
        # the dtype of every index uop (RANGE, SPECIAL, the ALU uops of index math, their CONSTs)
        self.index_dtype = index_dtype or index_dtype_of(k)
        self.vector_math = tuple(k.opts.vector_math)
        self.vector_select = has_vector_select(self.vector_math)  # float32 comparisons into masks, selects by them
        self.header: list[UOp] = []  # DEFINE_GLOBAL, DEFINE_VAR and CONST uops, before any loop
        self.uops: list[UOp] = []
        # the uops emitted so far that later ones may reuse (common subexpressions), by (op, dtype, sources, arg): one
        # table for every open scope, and each scope's keys, dropped from it when the scope closes
        self.cse: dict[tuple[Any, ...], UOp] = {}
        self.scopes: list[list[tuple[Any, ...]]] = [[]]
        # each scope's index Nodes already lowered (a kernel's lanes share most of their index terms)
        self.node_cse: dict[Node, UOp] = {}
        self.node_scopes: list[list[Node]] = [[]]
        self.consts: dict[tuple[Any, ...], UOp] = {}
        self.global_size: Optional[tuple[sint, ...]] = None
        self.local_size: Optional[tuple[int, ...]] = None
        self.variables: list[Variable] = []
        self.thread_extent: Optional[int] = None
        self.op_estimate = 0
        self.mem_estimate = 0
        # STAGE: each staged input's shared-memory tile and its (axis, stride) pairs; set while lowering the reduce
        self.stages: dict[LazyOp, tuple[UOp, list[tuple[int, int]]]] = {}
        self.staging = False
        # PACK: each packed input's block, as a LOAD of a scratch buffer (a negative idx) whose MemBuffer's tracker
        # spans the kernel's axes
        self.packs: dict[LazyOp, LazyOp] = {}

    # ***** emission *****

    def uop(
        self, op: UOps, dtype: Optional[DType] = None, src: tuple[UOp, ...] = (), arg: Any = None, cse: bool = True
    ) -> UOp:
        """Emit a uop, or return the equal one already emitted in an enclosing scope."""
        key = (op, dtype, tuple(map(id, src)), arg)
        if cse and (u := self.cse.get(key)) is not None:
            return u
        u = UOp(op, dtype, src, arg)
        self.uops.append(u)
        if cse:
            self.cse[key] = u
            self.scopes[-1].append(key)
        return u

    def const(self, val: ConstType, dtype: DType) -> UOp:
        key = (val, dtype, type(val))
        if key not in self.consts:  # constants go in the header, so every scope sees them
            self.consts[key] = UOp(UOps.CONST, dtype, (), dtypes.as_const(val, dtype))
            self.header.append(self.consts[key])
        return self.consts[key]

    def alu(self, op: Any, dtype: DType, *src: UOp) -> UOp:
        return self.uop(UOps.ALU, dtype, src, op)

    def open_range(self, start: UOp, end: UOp, axis: int, reduce: bool) -> UOp:
        r = self.uop(UOps.RANGE, self.index_dtype, (start, end), (axis, reduce), cse=False)
        self.scopes.append([])
        self.node_scopes.append([])
        return r

    def close_range(self, r: UOp) -> None:
        self.uop(UOps.ENDRANGE, None, (r,), cse=False)
        for key in self.scopes.pop():  # (what was computed inside the loop is not valid after it)
            del self.cse[key]
        for n in self.node_scopes.pop():
            del self.node_cse[n]

    # ***** index math: symbolic Node -> uops *****

    def check_index(self, lo: int, hi: int) -> None:
        """Raise _IndexOverflow when an index value in [lo, hi] does not fit this kernel's int32 index dtype, and
        ValueError when it does not fit int64."""
        if lo >= INT32_MIN and hi <= INT32_MAX:
            return
        if self.index_dtype == dtypes.int32:
            raise _IndexOverflow
        if lo < INT64_MIN or hi > INT64_MAX:
            raise ValueError(
                f"kernel {self.k.name} (shape {self.k.full_shape}) computes index values from {lo} to {hi}, past "
                "int64's range (the widest index of every device): use tensors of fewer elements"
            )

    def node(self, n: sint) -> UOp:
        """Index Node `n` as uops (each distinct Node lowered once per scope)."""
        if isinstance(n, int):
            self.check_index(n, n)
            return self.const(n, self.index_dtype)
        if (u := self.node_cse.get(n)) is not None:
            return u
        u = self.node_cse[n] = self._node(n)
        self.node_scopes[-1].append(n)
        return u

    def _node(self, n: Node) -> UOp:
        idx = self.index_dtype
        self.check_index(n.min, n.max)
        if isinstance(n, NumNode):
            return self.const(int(n.b), idx)
        if isinstance(n, Variable):
            return self.index_vars[n] if n in self.index_vars else self.var_index(n)
        if isinstance(n, MulNode):
            return self.alu(BinaryOps.MUL, idx, self.node(n.a), self.node(n.b))
        if isinstance(n, (DivNode, ModNode)):
            # Nodes divide with floor semantics, ALU DIV/MOD truncate: shift a numerator that can be negative
            # by a multiple of the divisor so both agree
            shift = -(n.a.min // n.b) if isinstance(n.b, int) and n.a.min < 0 else 0
            a = self.node(n.a + shift * n.b) if shift else self.node(n.a)
            if isinstance(n, ModNode):
                return self.alu(BinaryOps.MOD, idx, a, self.node(n.b))
            q = self.alu(BinaryOps.DIV, idx, a, self.node(n.b))
            return self.alu(BinaryOps.SUB, idx, q, self.const(shift, idx)) if shift else q
        if isinstance(n, LtNode):
            return self.alu(BinaryOps.CMPLT, dtypes.bool, self.node(n.a), self.node(n.b))
        if isinstance(n, (SumNode, AndNode)):
            op, dt = (BinaryOps.ADD, idx) if isinstance(n, SumNode) else (BinaryOps.AND, dtypes.bool)
            parts = [self.node(x) for x in n.nodes]
            out, lo, hi = parts[0], n.nodes[0].min, n.nodes[0].max
            for x, p in zip(n.nodes[1:], parts[1:]):
                if dt is idx:  # a partial sum may reach further than the whole
                    lo, hi = lo + x.min, hi + x.max
                    self.check_index(lo, hi)
                out = self.alu(op, dt, out, p)
            return out
        raise NotImplementedError(f"the linearizer cannot lower the index node {type(n).__name__}: {n}")

    def var_dtype(self, v: Variable) -> DType:
        """A symbolic variable's DEFINE_VAR dtype: int32, unless its range passes int32's (then the kernel's indices
        are int64 too)."""
        if v.min >= INT32_MIN and v.max <= INT32_MAX:
            return dtypes.int32
        self.check_index(v.min, v.max)
        return dtypes.int64

    def var_index(self, v: Variable) -> UOp:
        """Symbolic variable `v` as an index value: its DEFINE_VAR, cast (once, in the header) to an int64 index."""
        var = self.var_uops[v.expr]
        if var.dtype == self.index_dtype:
            return var
        if (wide := self.wide_vars.get(v.expr)) is None:
            wide = self.wide_vars[v.expr] = UOp(UOps.CAST, self.index_dtype, (var,))
            self.header.append(wide)
        return wide

    # ***** the kernel *****

    def linearize(self) -> list[UOp]:
        """The kernel's uops; their index arithmetic in int64 when a value of it may not fit int32."""
        try:
            return self._linearize()
        except _IndexOverflow:  # (only an int32 kernel raises it)
            self.__init__(self.k, dtypes.int64)  # type: ignore[misc]
            return self._linearize()

    def _linearize(self) -> list[UOp]:
        k = self.k
        self.buffers: dict[int, UOp] = {}
        for leaf in k.leaves:
            if leaf.op is not BufferOps.CONST and leaf.arg.idx not in self.buffers:
                self.buffers[leaf.arg.idx] = UOp(
                    UOps.DEFINE_GLOBAL,
                    PtrDType.of(leaf.arg.dtype),
                    (),
                    (leaf.arg.idx, f"data{leaf.arg.idx}", leaf.op is BufferOps.STORE),
                )
        self.header.extend(self.buffers[idx] for idx in sorted(self.buffers))
        shape_vars: set[Variable] = set()
        for st in k.sts.values():
            shape_vars |= st.vars()
        for s in k.full_shape:
            if isinstance(s, Node):
                shape_vars |= s.vars()
        for leaf in k.leaves:
            if leaf.op is BufferOps.CONST and isinstance(leaf.arg.val, Variable):
                shape_vars.add(leaf.arg.val)
        self.variables = sorted(shape_vars, key=lambda v: v.expr)
        # each by the identifier its name maps to (codegen/names.py): the user's name never reaches the source
        self.var_uops = {
            v.expr: UOp(UOps.DEFINE_VAR, self.var_dtype(v), (), (variable_identifier(v.expr), v.min, v.max))
            for v in self.variables
        }
        self.header.extend(self.var_uops.values())
        self.wide_vars: dict[str, UOp] = {}  # an int32 DEFINE_VAR cast to an int64 kernel's index dtype
        self.index_vars: dict[Variable, UOp] = {}
        self.ranges: list[UOp] = []
        # the loop indices, as Variables named unlike any of the kernel's own (a user's Variable named _axis0 with
        # the same bounds would compare equal to one, and be read as that loop's index)
        axis = internal_prefix("_axis", self.var_uops)
        self.axis_vars = [
            Variable(f"{axis}{i}", 0, s - 1) if isinstance(s, int) else Variable(f"{axis}{i}", 0, s.max - 1)
            for i, s in enumerate(k.full_shape[: k.first_upcast])
        ]
        # lanes: every combination of the upcast axes' indices, in C order (the last axis varies fastest); groups:
        # runs of `width` neighbouring lanes of the last upcast axis, one vector each where the renderer has vectors
        self.upcast_axes = list(range(k.first_upcast, k.shape_len))
        self.lanes = list(itertools.product(*(range(s) for s in k.upcast_sizes)))
        self.unrolled = [j for j, a in enumerate(self.upcast_axes) if k.is_unrolled(a)]
        self.width = self._vector_width()
        self.index_nodes_cache: dict[LazyOp, tuple[list[int], list[tuple[Node, Optional[Node]]]]] = {}
        self.index_terms: dict[LazyOp, tuple[Node, int]] = {}  # (see _access_index)
        # each access's validity, for a leaf (in lane_offsets) whose validity depends on the lane
        self.lane_valids: dict[LazyOp, list[Optional[Node]]] = {}
        self.lane_combo_cache: dict[tuple[int, ...], list[int]] = {}  # (see _lane_combos)
        # every leaf whose accesses are lane 0's index plus constants: (that index, the constants, the validity
        # shared by every lane, None when always valid)
        self.lane_offsets: dict[LazyOp, tuple[Node, list[int], Optional[Node]]] = {}
        self.lane_prefix = internal_prefix("_lane", self.var_uops)
        # lowered AST nodes, one dict per open reduce loop (a value computed inside a loop is not valid after it)
        self.ast_caches: list[dict[LazyOp, list[Value]]] = [{}]
        store = k.ast
        n_global = k.first_reduce - k.local_dims
        inner = list(range(n_global - k.inner_globals, n_global))
        outer = list(range(n_global - k.inner_globals))
        if k.packed and not k.inner_globals:  # the blocks are copied at each step of the outermost loop
            self._open_globals(outer[:1])
            self._pack_inputs()
            self._open_globals(outer[1:], may_thread=False)
        else:
            self._open_globals(outer)
        if k.inner_globals:  # the accumulators live in the output: set them, then run the outer reduce loops
            inner_ranges = self._open_loops(inner, False)
            init = dtypes.as_const(
                0 if k.reduceops[0].op is ReduceOps.SUM else dtypes.min(store.arg.dtype), store.arg.dtype
            )
            zero = self._splat(self.const(init, store.arg.dtype))
            self._store(store, [self._vector(zero) if self._vectorizable(store.arg.dtype) else zero] * self.n_groups)
            for r in reversed(inner_ranges):
                self.close_range(r)
            self.ranges += self._open_loops(list(range(k.first_reduce, k.first_reduce + k.outer_reduces)), True)
            self._pack_inputs()
            self.ranges += self._open_loops(inner, False)
        if k.inner_globals and store.src[0] is not k.reduceops[0]:
            self._hoisted_epilogue(inner)
        else:
            self._store(store, self.lower(store.src[0]))
        for r in reversed(self.ranges):
            self.close_range(r)
        self.uops = _live(self.uops)
        self.uops = _at_first_use(_hoisted(self.uops))
        n_alu = sum(1 for u in self.uops if u.op is UOps.ALU)
        iterations = prod([s if isinstance(s, int) else s.max for s in k.full_shape[: k.first_upcast]])
        self.op_estimate = n_alu * iterations
        self.mem_estimate = sum(
            leaf.arg.dtype.itemsize * leaf.arg.real_size() for leaf in k.leaves if leaf.op is not BufferOps.CONST
        )
        self.uops = self.header + self.uops
        return self.uops

    def _hoisted_epilogue(self, inner: list[int]) -> None:
        """HOIST of a kernel that computes more after its reduce (a Linear layer's bias, GELU): the outer reduce
        loops leave the bare sums in the output; then one more pass over this step's output tiles (in cache) reads
        each sum back and stores what the kernel computes of it."""
        k, store = self.k, self.k.ast
        self._store(store, self.lower(k.reduceops[0]))
        n = len(inner) + k.outer_reduces
        for r in reversed(self.ranges[-n:]):
            self.close_range(r)
        del self.ranges[-n:]
        self.ranges += self._open_loops(inner, False)
        self.ast_caches.append({k.reduceops[0]: [self._lower_group(store, g) for g in range(self.n_groups)]})
        self._store(store, self.lower(store.src[0]))
        self.ast_caches.pop()

    def _vector_width(self) -> int:
        """Lanes per group: the largest power of two up to MAX_VECTOR dividing the last upcast axis, when the
        renderer takes vector uops and that axis is not an unrolled reduce axis."""
        k = self.k
        if not k.opts.vector_uops or not self.upcast_axes or k.is_unrolled(self.upcast_axes[-1]):
            return 1
        size = k.upcast_sizes[-1]
        # at most one register of the output's dtype where the renderer says how wide its registers are: on AVX2 a
        # 16-float vector is two registers, which gcc built slowly (EfficientNet's pooled SiLU: 3.4 s a kernel) and
        # ran no faster than two 8-float groups
        most = min(MAX_VECTOR, k.opts.vector_widths.get(k.ast.arg.dtype, MAX_VECTOR) or MAX_VECTOR)
        return next((w for w in (16, 8, 4, 2) if w <= most and size % w == 0), 1)

    @property
    def n_groups(self) -> int:
        return len(self.lanes) // self.width

    def _open_loops(self, axes: list[int], reduce: bool) -> list[UOp]:
        loops = []
        for a in axes:
            r = self.open_range(self.const(0, self.index_dtype), self.node(self.k.full_shape[a]), a, reduce)
            self.index_vars[self.axis_vars[a]] = r
            loops.append(r)
        return loops

    def _threaded(self, axes: list[int]) -> bool:
        """Whether the outermost loop is split across threads: a big kernel that does not read its output."""
        k = self.k
        if not k.opts.threads or not axes or _upper(k.full_shape[axes[0]]) < 2:
            return False
        if any(leaf.op is BufferOps.LOAD and leaf.arg.idx == 0 for leaf in k.leaves):
            return False  # an in-place update may read what another thread writes
        # iterations, weighted by the ALU ops of each beyond the first few: an elementwise kernel of a long fused
        # expression (BatchNorm + SiLU, ~100 ops an element) pays for a thread at a fraction of an add's size
        # (EfficientNet's (672, 196): 2.3 -> 1.3 ms on two cores)
        alu = sum(1 for x in k.ast.lazyops() if isinstance(x.op, (UnaryOps, BinaryOps, TernaryOps)))
        work = prod([s if isinstance(s, int) else s.max for s in k.full_shape]) * max(1, alu // THREAD_OPS)
        return work >= k.opts.thread_min_work

    def _open_globals(self, axes: list[int], may_thread: bool = True) -> None:
        k = self.k
        local_axes = list(range(k.first_reduce - k.local_dims, k.first_reduce))
        sizes = [k.full_shape[a] for a in axes]
        if self.k.opts.global_max is None:
            for n, (a, s) in enumerate(zip(axes, sizes)):
                if n == 0 and may_thread and self._threaded(axes):
                    r = self._threaded_range(a, s)
                else:
                    r = self.open_range(self.const(0, self.index_dtype), self.node(s), a, False)
                self.ranges.append(r)
                self.index_vars[self.axis_vars[a]] = r
            return
        limit = self.k.opts.global_max
        fits = len(axes) <= len(limit) and all(isinstance(s, int) and s <= m for s, m in zip(reversed(sizes), limit))
        if fits:
            # the innermost axis is grid dimension 0
            for dim, a in enumerate(reversed(axes)):
                self.index_vars[self.axis_vars[a]] = self.uop(
                    UOps.SPECIAL, self.index_dtype, (), (dim, f"gidx{dim}", k.full_shape[a]), cse=False
                )
            self.global_size = tuple(reversed(sizes)) + (1,) * (3 - len(sizes)) if sizes else (1, 1, 1)
        else:  # too many axes for the grid: one flat index, split into the axes
            total = prod(sizes)
            self.check_index(0, _upper(total))
            flat = self.uop(UOps.SPECIAL, self.index_dtype, (), (0, "gidx0", self._source_node(total)), cse=False)
            stride = 1
            for a, s in reversed(list(zip(axes, sizes))):
                self.index_vars[self.axis_vars[a]] = self.alu(
                    BinaryOps.MOD,
                    self.index_dtype,
                    self.alu(BinaryOps.DIV, self.index_dtype, flat, self.node(stride)),
                    self.node(s),
                )
                stride = stride * s
            self.global_size = (total, 1, 1)
        local_size = [1, 1, 1]
        for dim, a in enumerate(reversed(local_axes)):  # the innermost local axis is local dimension 0
            size = k.full_shape[a]
            assert isinstance(size, int)
            self.index_vars[self.axis_vars[a]] = self.uop(
                UOps.SPECIAL, self.index_dtype, (), (dim, f"lidx{dim}", size), cse=False
            )
            local_size[dim] = size
        self.local_size = tuple(local_size)

    def _threaded_range(self, axis: int, size: sint) -> UOp:
        """The outermost loop, over the part of it between the thread bounds (plugin.py, Renderer.threads). A loop of
        symbolic size n splits range(parts) instead, parts = its upper bound (at most SYMBOLIC_THREAD_PARTS): the part
        [start, end) of it runs the loop's steps [start * n // parts, end * n // parts), so the parts cover range(n)
        once, whatever n is, each in proportion to its share of range(parts)."""
        parts = size if isinstance(size, int) else min(size.max, SYMBOLIC_THREAD_PARTS)
        self.thread_extent = parts
        self.check_index(0, parts if isinstance(size, int) else parts * size.max)
        bounds = [UOp(UOps.DEFINE_VAR, self.index_dtype, (), (name, 0, parts)) for name in THREAD_BOUNDS]
        self.header.extend(bounds)
        if isinstance(size, int):
            return self.open_range(bounds[0], bounds[1], axis, False)
        n, divisor = self.node(size), self.const(parts, self.index_dtype)
        start, end = (
            self.alu(BinaryOps.DIV, self.index_dtype, self.alu(BinaryOps.MUL, self.index_dtype, b, n), divisor)
            for b in bounds
        )
        return self.open_range(start, end, axis, False)

    def _source_node(self, n: sint) -> sint:
        """`n` with its Variables renamed to their identifiers: a uop's Node argument may be spelled in the source."""
        if not isinstance(n, Node) or not (found := n.vars()):
            return n
        return n.substitute({v: Variable(variable_identifier(v.expr), v.min, v.max) for v in found})

    # ***** buffer accesses *****

    def index_nodes(self, leaf: LazyOp) -> tuple[list[int], list[tuple[Node, Optional[Node]]]]:
        """For each lane, which distinct access of `leaf` it makes; and each distinct access as its (flat index,
        validity) Nodes (validity None when always valid). Lanes of an axis the buffer does not vary along share."""
        if leaf in self.index_nodes_cache:
            return self.index_nodes_cache[leaf]
        st = self.k.sts.get(leaf) or leaf.arg.st  # (a PACK's block is no leaf of the kernel: its tracker is its own)
        loop_idxs: list[Node] = [
            NumNode(0) if st.shape[i] == 1 else self.axis_vars[i] for i in range(self.k.first_upcast)
        ]
        varying = tuple(j for j, a in enumerate(self.upcast_axes) if st.shape[a] != 1)
        # the distinct accesses are every combination of the varying axes' indices, in C order (the order in which
        # the lanes first make them); a lane makes the one its own indices along those axes pick
        sizes = [self.k.upcast_sizes[j] for j in varying]
        keys = list(itertools.product(*(range(size) for size in sizes)))
        lane_combo = self._lane_combos(varying)
        combos: list[Optional[tuple[Node, Optional[Node]]]] = []
        # the common case: a lane's index is lane 0's plus a constant, so the symbolic index is built once (with a
        # Variable per upcast axis) instead of once per lane (ResNet-50's 109 kernels lowered in 15 s, then in 8)
        linear = self._lane_linear(st, loop_idxs, list(varying)) if varying else None
        offsets: list[int] = []  # (each access's index minus lane 0's, when `linear` made them)
        valids: list[Optional[Node]] = []  # (each access's validity, where it depends on the lane)
        if linear is not None:
            base, coefs, valid, lane_vars = linear
            offsets = _grid_sums(sizes, [coefs[j] for j in varying])
            by_lanes: dict[tuple[int, ...], Node] = {}
            for key, offset in zip(keys, offsets):
                if lane_vars:  # the validity depends on the lane: each access's own, with its lane's indices
                    at = dict(zip(varying, key))
                    picked = tuple(at[j] for j in lane_vars.values())  # (the accesses that agree there share it)
                    if (v := by_lanes.get(picked)) is None:
                        v = by_lanes[picked] = valid.substitute({var: NumNode(at[j]) for var, j in lane_vars.items()})
                    valids.append(None if isinstance(v, NumNode) and int(v.b) == 1 else v)
                    combos.append(None)
                else:  # (built when a lane needs it on its own: see access())
                    combos.append((base, valid) if offset == 0 else None)
            if lane_vars:
                self.lane_valids[leaf] = valids
        else:
            for key in keys:
                at = dict(zip(varying, key))
                up: list[Node] = [NumNode(at.get(j, 0)) for j in range(len(self.upcast_axes))]
                idx, valid = st.expr_idxs(loop_idxs + up)
                combos.append((idx, None if isinstance(valid, NumNode) and int(valid.b) == 1 else valid))
        self.index_nodes_cache[leaf] = (lane_combo, combos)  # type: ignore[assignment]
        if linear is not None:
            self.lane_offsets[leaf] = (linear[0], offsets, linear[2])
        return lane_combo, combos  # type: ignore[return-value]

    def _lane_combos(self, varying: tuple[int, ...]) -> list[int]:
        """For each lane, the index of its combination of the `varying` upcast axes' indices among all of them in C
        order (shared by every leaf that varies along the same axes)."""
        if (got := self.lane_combo_cache.get(varying)) is None:
            sizes = self.k.upcast_sizes
            weights = [0] * len(sizes)
            for j in varying:  # (mixed radix: an axis counts the combinations of the axes after it)
                weights[j] = prod(sizes[i] for i in varying if i > j)
            got = self.lane_combo_cache[varying] = _grid_sums(sizes, weights)
        return got

    def _lane_linear(
        self, st: ShapeTracker, loop_idxs: list[Node], varying: list[int]
    ) -> Optional[tuple[Node, dict[int, int], Optional[Node], dict[Variable, int]]]:
        """When `st`'s flat index is lane 0's plus a constant per lane (an int coefficient times each varying upcast
        axis's index): (lane 0's index, each axis's coefficient, the validity (None when always valid), and the lane
        Variables it depends on, by axis); else None. Built once with a Variable in place of each upcast index."""
        lane_vars = {Variable(f"{self.lane_prefix}{j}", 0, st.shape[self.upcast_axes[j]] - 1): j for j in varying}
        axis_of = {j: var for var, j in lane_vars.items()}
        up = [axis_of.get(j, NumNode(0)) for j in range(len(self.upcast_axes))]
        idx, valid = st.expr_idxs(loop_idxs + up)
        coefs = {j: 0 for j in varying}
        rest: list[Node] = []
        for term in idx.nodes if isinstance(idx, SumNode) else (idx,):
            if isinstance(term, Variable) and term in lane_vars:
                coefs[lane_vars[term]] += 1
            elif isinstance(term, MulNode) and isinstance(term.b, int) and term.a in lane_vars:
                coefs[lane_vars[term.a]] += term.b
            elif any(v in lane_vars for v in term.vars()):  # (a lane index inside a division: per lane, then)
                return None
            else:
                rest.append(term)
        always = isinstance(valid, NumNode) and int(valid.b) == 1
        depends = {} if always else {v: j for v, j in lane_vars.items() if v in valid.vars()}
        return Node.sum(rest), coefs, None if always else valid, depends

    def access(self, leaf: LazyOp, combo: int) -> tuple[Node, Optional[Node]]:
        """Distinct access `combo` of `leaf` (see index_nodes) as its (flat index, validity) Nodes."""
        combos = self.index_nodes(leaf)[1]
        if (got := combos[combo]) is None:  # lane 0's index plus the access's constant offset
            base, offsets, valid = self.lane_offsets[leaf]
            if (valids := self.lane_valids.get(leaf)) is not None:
                valid = valids[combo]
            got = combos[combo] = (base + offsets[combo], valid)
        return got

    def _offsets(self, leaf: LazyOp) -> Optional[tuple[Node, list[int]]]:
        """(lane 0's index, each access's constant) of a leaf whose accesses are always valid and lane 0's index plus
        constants (see index_nodes); else None."""
        known = self.lane_offsets.get(leaf)
        return None if known is None or known[2] is not None else (known[0], known[1])

    def _access_index(self, leaf: LazyOp, combo: int) -> UOp:
        """The flat index of access `combo` of `leaf` as a uop. Where the accesses are lane 0's index plus constants
        (_offsets), that is lane 0's terms plus one constant, with no Node math per access."""
        if (known := self._offsets(leaf)) is None:
            return self.node(self.access(leaf, combo)[0])
        return self._offset_index(leaf, combo, *known)

    def _offset_index(
        self, leaf: LazyOp, combo: int, base: Node, offsets: list[int], unless: Optional[Node] = None
    ) -> UOp:
        """Access `combo` of `leaf`, whose accesses are lane 0's index `base` plus `offsets`, as a uop: lane 0's
        terms plus one constant. With `unless` (a validity), lane 0's own index where it is false."""
        if (split := self.index_terms.get(leaf)) is None:  # (lane 0's index as its variable terms and its constant)
            terms = base.nodes if isinstance(base, SumNode) else (base,)
            const = sum(int(t.b) for t in terms if isinstance(t, NumNode))
            split = self.index_terms[leaf] = (Node.sum([t for t in terms if not isinstance(t, NumNode)]), const)
        var, const = split
        self.check_index(base.min + offsets[combo], base.max + offsets[combo])
        if unless is not None and offsets[combo]:  # (a choice between two constants: computed outside the loops)
            where, own = self.node(unless), self.node(const + offsets[combo])
            pick = self.alu(TernaryOps.WHERE, self.index_dtype, where, own, self.node(const))
            return pick if isinstance(var, NumNode) else self.alu(BinaryOps.ADD, self.index_dtype, self.node(var), pick)
        offset = const + offsets[combo]
        if isinstance(var, NumNode):
            return self.node(offset)
        at = self.node(var)
        if offset == 0:
            return at
        return self.alu(BinaryOps.ADD, self.index_dtype, at, self.const(offset, self.index_dtype))

    def _unguarded(self, leaf: LazyOp, combo: int, valid: Node) -> Optional[UOp]:
        """The index a load of access `combo` of `leaf` (valid where `valid` holds) reads at with no test, where it
        can (else None): a leaf whose only mask is a PADTO's (Kernel.pad_only), read at lane 0's index plus a
        constant. A padded lane computes only values that are never stored, so its load need only stay inside the
        buffer: there it reads lane 0's element (valid: a padded axis pads less than one tile, so every tile's lane 0
        is inside)."""
        if leaf not in self.k.pad_only or (known := self.lane_offsets.get(leaf)) is None:
            return None
        return self._offset_index(leaf, combo, known[0], known[1], unless=valid)

    def _contiguous(self, leaf: LazyOp, group: int) -> Optional[Node]:
        """The index of the group's first element when the group reads or writes `width` consecutive, always valid
        elements of `leaf` (a vector access), else None."""
        got = self._vector_access(leaf, group)
        return got[0] if got is not None and got[1] is None else None

    def _vector_access(self, leaf: LazyOp, group: int) -> Optional[tuple[Node, Optional[Node]]]:
        """(the index of the group's first element, the validity every lane of it shares: None when always valid)
        when the group reads or writes `width` consecutive elements of `leaf` under one validity (a padded axis that
        is not the vector's: PADTO's rows), else None."""
        if self.width == 1:
            return None
        lane_combo = self.index_nodes(leaf)[0]
        lanes = lane_combo[group * self.width : (group + 1) * self.width]
        first = lanes[0]
        idx0, valid0 = self.access(leaf, first)
        if (known := self.lane_offsets.get(leaf)) is not None:  # the lanes' offsets are known: no Node math
            offsets = known[1]
            if not all(offsets[c] - offsets[first] == i for i, c in enumerate(lanes)):
                return None
            valids = self.lane_valids.get(leaf)  # (None: one validity for every lane)
            return (idx0, valid0) if valids is None or all(valids[c] == valid0 for c in lanes) else None
        for i in range(1, self.width):
            idx, valid = self.access(leaf, lanes[i])
            diff = idx - idx0
            if valid != valid0 or not isinstance(diff, NumNode) or int(diff.b) != i:
                return None
        return idx0, valid0

    def _store_index(self, store: LazyOp, combo: int) -> tuple[UOp, Optional[Node]]:
        """Access `combo` of `store`: its index as a uop (with no Node math where _access_index has none) and its
        validity (None: always valid)."""
        if self._offsets(store) is not None:  # (always valid)
            return self._access_index(store, combo), None
        idx, valid = self.access(store, combo)
        if (known := self.lane_offsets.get(store)) is None:
            return self.node(idx), valid
        return self._offset_index(store, combo, known[0], known[1]), valid

    def _store(self, store: LazyOp, values: list[Value]) -> None:
        """Store one value per group into the buffer of `store` (the output, or a PACK's block); lanes that write the
        same element (an unrolled axis, an axis the buffer ignores) store it once."""
        lane_combo, combos = self.index_nodes(store)
        buf = self.buffers[store.arg.idx]
        stored: set[int] = set()
        for g, value in enumerate(values):
            first = lane_combo[g * self.width]
            if first in stored:
                continue
            block = store.arg.idx < 0  # a PACK's block: lanes gathered into it go in with one vector store
            got = self._vector_access(store, g) if block or not isinstance(value, tuple) else None
            if got is not None and block and isinstance(value, tuple) and self._vectorizable(store.arg.dtype):
                value = self._vector(value)
            if not isinstance(value, tuple) and got is not None and self._vectorizable(store.arg.dtype):
                stored.add(first)  # (a mask, a bool vector, is stored lane by lane)
                self._gated_store(buf, self.node(got[0]), value, got[1])
                continue
            for i, v in enumerate(self._scalars(value)):
                combo = lane_combo[g * self.width + i]
                if combo not in stored:
                    stored.add(combo)
                    at, valid = self._store_index(store, combo)
                    self._gated_store(buf, at, v, valid)

    def _gated_store(self, buf: UOp, at: UOp, value: UOp, valid: Optional[Node]) -> None:
        """A STORE of `value` at `at`, only where `valid` holds (None: always; a padded lane's is never)."""
        if valid is None:
            self.uop(UOps.STORE, None, (buf, at, value), cse=False)
        elif not isinstance(valid, NumNode):
            self.uop(UOps.STORE, None, (buf, at, value, self.node(valid)), cse=False)

    # ***** values: one per group, a vector uop or a tuple of `width` scalar uops *****

    def _scalars(self, v: Value) -> tuple[UOp, ...]:
        if isinstance(v, tuple):
            return v
        assert v.dtype is not None
        return tuple(self.uop(UOps.GEP, v.dtype.scalar(), (v,), i) for i in range(self.width))

    def _vector(self, v: Value) -> UOp:
        if not isinstance(v, tuple):
            return v
        assert v[0].dtype is not None
        return self.uop(UOps.VECTORIZE, v[0].dtype.vec(self.width), v)

    def _splat(self, x: UOp) -> Value:
        return (x,) * self.width

    def _vectorizable(self, dt: DType) -> bool:
        return self.width > 1 and dt in VECTOR_DTYPES

    def _vector_bits(self, op: LazyOp) -> bool:
        """Whether `op` is a BITCAST between float and uint vectors, or an SHL of a uint vector by a constant, that
        this renderer computes on whole vectors (codegen/uops.py, VECTOR_BITS)."""
        return self.width > 1 and op.op in self.vector_math and is_vector_bits_op(op)

    def lower(self, op: LazyOp) -> list[Value]:
        """The value of AST node `op` at the current position, one per group (each shared node is lowered once per
        scope)."""
        for cache in reversed(self.ast_caches):
            if op in cache:
                return cache[op]
        out = self.ast_caches[-1][op] = self._lower(op)
        return out

    def _lower(self, op: LazyOp) -> list[Value]:
        if op.op in ReduceOps:
            return self.reduce(op)
        if op.op is BufferOps.LOAD and op.src:
            return self._lower_gather(op)
        if op.op in (BufferOps.CONST, BufferOps.LOAD):
            return [self._lower_group(op, g) for g in range(self.n_groups)]
        srcs = [self.lower(s) for s in op.src]
        if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
            kind = UOps.CAST if op.op is UnaryOps.CAST else UOps.BITCAST
            if kind is UOps.CAST and op.arg == VECTOR_SELECT_DTYPE and dtype_of(op.src[0]) == dtypes.bool:
                # (a mask exists only where self.vector_select)
                return [self._mask_to_float(v) if not isinstance(v, tuple) else
                        tuple(self.uop(kind, op.arg, (x,)) for x in v) for v in srcs[0]]  # fmt: skip
            if kind is UOps.BITCAST and self._vector_bits(op):
                return [self.uop(kind, op.arg.vec(self.width), (v,)) if not isinstance(v, tuple) else
                        tuple(self.uop(kind, op.arg, (x,)) for x in v) for v in srcs[0]]  # fmt: skip
            return [tuple(self.uop(kind, op.arg, (x,)) for x in self._scalars(v)) for v in srcs[0]]
        dt = dtype_of(op)
        src_dts = [dtype_of(s) for s in op.src]
        select = op.op in VECTOR_SELECT and self.vector_select and self.width > 1
        out: list[Value] = []
        for group in zip(*srcs):
            if select and all(d == VECTOR_SELECT_DTYPE for d in src_dts[-2:]):
                if op.op is TernaryOps.WHERE and not isinstance(group[0], tuple):  # a mask from a vector compare
                    out.append(self.alu(op.op, dt.vec(self.width), group[0], *map(self._vector, group[1:])))
                    continue
                if op.op is not TernaryOps.WHERE and any(not isinstance(v, tuple) for v in group):
                    out.append(self.alu(op.op, dt.vec(self.width), *map(self._vector, group)))
                    continue
            if (
                (op.op in VECTOR_ALU or op.op in self.vector_math)
                and (self._vectorizable(dt) or self._vector_bits(op))
                and all(d == dt for d in src_dts)
                and any(not isinstance(v, tuple) for v in group)
            ):
                out.append(self.alu(op.op, dt.vec(self.width), *[self._vector(v) for v in group]))
            else:
                out.append(tuple(self.alu(op.op, dt, *lane) for lane in zip(*[self._scalars(v) for v in group])))
        return out

    def _mask_to_float(self, mask: UOp) -> UOp:
        """A mask (a vector comparison's bool vector) cast to float32: 1.0 where it is true, else 0.0."""
        one, zero = (self._vector(self._splat(self.const(c, VECTOR_SELECT_DTYPE))) for c in (1.0, 0.0))
        return self.alu(TernaryOps.WHERE, VECTOR_SELECT_DTYPE.vec(self.width), mask, one, zero)

    def _lower_group(self, op: LazyOp, g: int) -> Value:
        dt = op.arg.dtype
        op = self.packs.get(op, op)
        if self.staging and op in self.stages:
            return tuple(self._staged_load(op, lane) for lane in self._group_lanes(g))
        lane_combo, combos = self.index_nodes(op)
        if op.op is not BufferOps.CONST and self._vectorizable(dt) and (got := self._vector_access(op, g)) is not None:
            # one vector load where always valid, or padded by PADTO alone (read with no test); a gated input's lanes
            # (a conv's padding) keep their loads per lane
            idx, valid = got
            at = self.node(idx) if valid is None else self._unguarded(op, lane_combo[g * self.width], valid)
            if at is not None:
                return self.uop(UOps.LOAD, dt.vec(self.width), (self.buffers[op.arg.idx], at))
        if (known := self._offsets(op)) is not None:  # every access always valid, at lane 0's plus a constant
            if op.op is BufferOps.CONST:
                return tuple(self._lower_leaf(op, known[0], None) for _ in self._group_lanes(g))
            buf = self.buffers[op.arg.idx]
            lanes = self._group_lanes(g)
            return tuple(self.uop(UOps.LOAD, dt, (buf, self._access_index(op, lane_combo[lane]))) for lane in lanes)
        if op.op is not BufferOps.CONST and (valids := self.lane_valids.get(op)) is not None:
            # the validity depends on the lane, the index is lane 0's plus a constant: each lane's index with no Node
            # math (lane 0's terms lowered once), its validity as its own
            base, offsets = self.lane_offsets[op][:2]
            buf = self.buffers[op.arg.idx]
            return tuple(
                self.const(0, dt)  # (never valid)
                if isinstance(valid := valids[combo], NumNode)
                else self.uop(UOps.LOAD, dt, (buf, at))
                if valid is not None and (at := self._unguarded(op, combo, valid)) is not None
                else self._lower_leaf(op, self._offset_index(op, combo, base, offsets), valid)
                for combo in (lane_combo[lane] for lane in self._group_lanes(g))
            )
        return tuple(self._lower_leaf(op, *self.access(op, lane_combo[lane])) for lane in self._group_lanes(g))

    def _lower_gather(self, op: LazyOp) -> list[Value]:
        """A gathered LOAD (its arg a GatherBuffer, its src the index expression): each lane reads at its access plus
        its index's offset, and 0 where its index is out of range (no check ran: as the one-hot form gave); a group
        whose lanes share one index and read consecutive elements is one vector load."""
        dt, buf = op.arg.dtype, self.buffers[op.arg.idx]
        lane_combo = self.index_nodes(op)[0]
        zero = self.const(0, dt)
        out: list[Value] = []
        for g, index in enumerate(self.lower(op.src[0])):
            picks = [self._gather_offset(op, i) for i in self._scalars(index)]
            if self._vectorizable(dt) and all(p[0] is picks[0][0] and p[1] is picks[0][1] for p in picks):
                if (first := self._contiguous(op, g)) is not None:
                    offset, inside = picks[0]
                    at = self._gather_address(first, offset, op)
                    # a vector of zeros where the index is out of range: one gated vector load (its address, of the
                    # clamped index, is inside the buffer either way), not a select and a store per lane (a 128 x 256
                    # embedding lookup's kernel on one Zen 3 core, its launch included: 18 -> 11 us)
                    gate = () if inside is None else (inside, self._vector(self._splat(zero)))
                    out.append(self.uop(UOps.LOAD, dt.vec(self.width), (buf, at, *gate)))
                    continue
            lanes = []
            for lane, (offset, inside) in zip(self._group_lanes(g), picks):
                idx, valid = self.access(op, lane_combo[lane])
                if isinstance(valid, NumNode):  # (never valid: a pad's zeros)
                    lanes.append(zero)
                    continue
                at = self._gather_address(idx, offset, op)
                gate = inside if valid is None else self.node(valid)
                if valid is not None and inside is not None:
                    gate = self.alu(BinaryOps.AND, dtypes.bool, gate, inside)
                lanes.append(self.uop(UOps.LOAD, dt, (buf, at) if gate is None else (buf, at, gate, zero)))
            out.append(tuple(lanes))
        return out

    def _gather_offset(self, op: LazyOp, index: UOp) -> tuple[UOp, Optional[UOp]]:
        """The element offset a gathered index value selects, and whether the value is in range (None: always). The
        offset is of the value clamped to [0, size) in its own dtype, so that every load stays inside the buffer even
        where no check ran; in the index dtype, times the axis's stride."""
        size, stride, dt = op.arg.size, op.arg.stride, index.dtype
        assert dt is not None and dtypes.is_int(dt), f"a gather index must be an integer, got {dt}"
        v = index
        if not dtypes.is_unsigned(dt):
            v = self.alu(BinaryOps.MAX, dt, v, self.const(0, dt))
        if size - 1 < dtypes.max(dt):
            last = self.const(size - 1, dt)
            v = self.alu(TernaryOps.WHERE, dt, self.alu(BinaryOps.CMPLT, dtypes.bool, last, v), last, v)
        inside = None if v is index else self.alu(BinaryOps.CMPEQ, dtypes.bool, v, index)  # (clamping changed nothing)
        if stride == 0 or size <= 1:
            return self.const(0, self.index_dtype), inside
        if dt != self.index_dtype:
            v = self.uop(UOps.CAST, self.index_dtype, (v,))
        return (v if stride == 1 else self.alu(BinaryOps.MUL, self.index_dtype, v, self.node(stride))), inside

    def _gather_address(self, idx: Node, offset: UOp, op: LazyOp) -> UOp:
        """The flat index `idx` of an access plus a gathered offset (whose values lie between 0 and (size-1)*stride)."""
        reach = (op.arg.size - 1) * op.arg.stride
        self.check_index(idx.min + min(reach, 0), idx.max + max(reach, 0))
        return self.alu(BinaryOps.ADD, self.index_dtype, self.node(idx), offset)

    def _group_lanes(self, g: int) -> range:
        return range(g * self.width, (g + 1) * self.width)

    def _lower_leaf(self, op: LazyOp, idx: Union[Node, UOp], valid: Optional[Node]) -> UOp:
        """A CONST or LOAD leaf at index `idx` (a Node, or its uop already lowered), 0 where `valid` is false."""
        dt = op.arg.dtype
        if op.op is BufferOps.CONST:
            val = self.var_uops[op.arg.val.expr] if isinstance(op.arg.val, Variable) else self.const(op.arg.val, dt)
            if isinstance(op.arg.val, Variable) and dt != val.dtype:
                val = self.uop(UOps.CAST, dt, (val,))
            if valid is None:
                return val
            if isinstance(valid, NumNode):
                return self.const(0, dt)
            return self.alu(TernaryOps.WHERE, dt, self.node(valid), val, self.const(0, dt))
        buf = self.buffers[op.arg.idx]
        if isinstance(valid, NumNode):
            return self.const(0, dt)
        at = idx if isinstance(idx, UOp) else self.node(idx)
        if valid is None:
            return self.uop(UOps.LOAD, dt, (buf, at))
        return self.uop(UOps.LOAD, dt, (buf, at, self.node(valid), self.const(0, dt)))

    def reduce(self, op: LazyOp) -> list[Value]:
        k = self.k
        dt = dtype_of(op.src[0])
        init = 0 if op.op is ReduceOps.SUM else dtypes.min(dt)
        # vector accumulators for a SUM, and for a MAX where the renderer has a vector MAX
        vector = self._vectorizable(dt) and (op.op in _VECTOR_REDUCE or _REDUCE_ALU[op.op] in self.vector_math)
        # one accumulator per group of the global upcast axes; lanes of an unrolled axis share it
        groups_of: dict[tuple[int, ...], list[int]] = {}
        for g in range(self.n_groups):
            lane = self.lanes[g * self.width]
            groups_of.setdefault(tuple(v for j, v in enumerate(lane) if j not in self.unrolled), []).append(g)
        accs: dict[tuple[int, ...], Value] = {}
        for key in groups_of:
            accs[key] = self._new_acc(dt, vector, init)
        if compensated := self.k.compensated_sum(op):  # each accumulator's rounding errors, summed
            errors = {key: self._new_acc(dt, vector, 0) for key in groups_of}
        if k.inner_globals:  # the accumulators start from what the outer reduce loops left in the output
            for key, groups in groups_of.items():
                loaded = self._lower_group(k.ast, groups[0])
                accs[key] = self._phi(accs[key], self._vector(loaded) if vector else self._scalars(loaded))
        loops = self._open_loops(list(range(k.first_reduce + k.outer_reduces, k.first_upcast - bool(k.staged))), True)
        if k.staged:  # the workgroup copies what the innermost loop reads of the staged inputs, then runs it
            self._stage_inputs()
            loops += self._open_loops([k.first_upcast - 1], True)
        self.ast_caches.append({})
        self.staging = bool(k.staged)
        vals = self.lower(op.src[0])
        self.staging = False
        self.ast_caches.pop()
        # each accumulator adds its unrolled lanes in index order: the order of the loop they replace
        current = {key: self._acc(acc) for key, acc in accs.items()}  # in a loop, read the DEFINE_ACC itself
        fused = op.op is ReduceOps.SUM and dt in _FUSED_DTYPES and k.opts.fused_mulacc
        for key, groups in groups_of.items():
            ordered = sorted(groups, key=lambda g: [self.lanes[g * self.width][j] for j in self.unrolled])
            if compensated:  # each group of k.summed_terms terms (consecutive: its axis is the innermost unrolled one)
                terms = [self._vector(vals[g]) if vector else self._scalars(vals[g]) for g in ordered]
                n = k.summed_terms
                for i in range(0, len(terms), n):
                    v = self._tree_sum(terms[i : i + n])
                    current[key], errors[key] = self._compensated_add(current[key], errors[key], v)
                continue
            for g in ordered:
                cur, product = current[key], self._product(vals[g]) if fused else None
                if not isinstance(cur, tuple):  # a vector accumulator
                    if product is not None:
                        mulacc = (self._vector(product[0]), self._vector(product[1]), cur)
                        new = self.uop(UOps.ALU, cur.dtype, mulacc, TernaryOps.MULACC, cse=False)
                    else:
                        alu = _REDUCE_ALU[op.op]  # type: ignore[index]
                        new = self.uop(UOps.ALU, cur.dtype, (cur, self._vector(vals[g])), alu, cse=False)
                    current[key] = self._phi(cur, new)
                elif product is not None:
                    current[key] = tuple(
                        self._phi_one(acc, self.uop(UOps.ALU, dt, (x, y, acc), TernaryOps.MULACC, cse=False))
                        for acc, x, y in zip(cur, self._scalars(product[0]), self._scalars(product[1]))
                    )
                else:
                    alu = _REDUCE_ALU[op.op]  # type: ignore[index]
                    current[key] = tuple(
                        self._phi_one(a, self.uop(UOps.ALU, dt, (a, v), alu, cse=False))
                        for a, v in zip(cur, self._scalars(vals[g]))
                    )
        for r in reversed(loops):
            self.close_range(r)
            if k.staged and r is loops[-1]:  # every work item is done with the tiles before they are copied again
                self.uop(UOps.BARRIER, None, (), cse=False)
        if k.reduce_lanes:
            return self._combine_lanes(op, accs, errors if compensated else None)
        if compensated:
            final = {key: self._compensated_result(accs[key], errors[key]) for key in groups_of}
            return [final[self._group_key(g)] for g in range(self.n_groups)]
        return [self._acc(accs[key]) for g in range(self.n_groups) for key in [self._group_key(g)]]

    def _combine_lanes(
        self, op: LazyOp, accs: dict[tuple[int, ...], Value], errors: Optional[dict[tuple[int, ...], Value]]
    ) -> list[Value]:
        """A lane reduce's value per group (every lane of a group holds the same): its lanes' accumulators combined
        in lane order from the identity; for a compensated sum, the lanes' sums with Fast2Sum and every error
        added back at the end."""
        dt = dtype_of(op.src[0])
        outs: dict[tuple[int, ...], list[tuple[UOp, Optional[UOp]]]] = {}  # per output (a key without its lane)
        for key in sorted(accs, key=lambda key: key[-1]):  # (a key's last index is its first lane)
            sums = self._scalars(self._acc(accs[key]))
            errs = self._scalars(self._acc(errors[key])) if errors is not None else (None,) * len(sums)
            outs.setdefault(key[:-1], []).extend(zip(sums, errs))
        init = self.const(0 if op.op is ReduceOps.SUM else dtypes.min(dt), dt)
        combined = {}
        for out, lanes in outs.items():
            total, err = init, self.const(0, dt)
            for s, e in lanes:
                if e is None:
                    total = self.alu(_REDUCE_ALU[op.op], dt, total, s)  # type: ignore[index]
                    continue
                total, lost = self._fast2sum(total, s)
                err = self.alu(BinaryOps.ADD, dt, err, self.alu(BinaryOps.ADD, dt, lost, e))
            combined[out] = total if errors is None else self._with_errors(total, err)
        return [self._splat(combined[self._group_key(g)[:-1]]) for g in range(self.n_groups)]

    def _new_acc(self, dt: DType, vector: bool, init: ConstType) -> Value:
        if vector:
            return self.uop(UOps.DEFINE_ACC, dt.vec(self.width), (), init, cse=False)
        return tuple(self.uop(UOps.DEFINE_ACC, dt, (), init, cse=False) for _ in range(self.width))

    def _fast2sum(self, s: UOp, v: UOp) -> tuple[UOp, UOp]:
        """t = s + v and the rounding error of that add, (s - t) + v (Fast2Sum: exact while |s| >= |v|, i.e. once the
        sum outgrows its terms)."""

        def alu(op: BinaryOps, a: UOp, b: UOp) -> UOp:
            return self.uop(UOps.ALU, a.dtype, (a, b), op, cse=False)

        t = alu(BinaryOps.ADD, s, v)
        return t, alu(BinaryOps.ADD, alu(BinaryOps.SUB, s, t), v)

    def _tree_sum(self, terms: list[Value]) -> Value:
        """The plain sum of `terms` (vector uops, or tuples of lanes) as a balanced tree: (t0 + t1) + (t2 + t3)."""

        def add(a: Value, b: Value) -> Value:
            if isinstance(a, tuple):
                return tuple(self.uop(UOps.ALU, x.dtype, (x, y), BinaryOps.ADD, cse=False) for x, y in zip(a, b))
            return self.uop(UOps.ALU, a.dtype, (a, b), BinaryOps.ADD, cse=False)

        while len(terms) > 1:
            terms = [add(terms[i], terms[i + 1]) for i in range(0, len(terms), 2)]
        return terms[0]

    def _compensated_add(self, s: Value, e: Value, v: Value) -> tuple[Value, Value]:
        """`v` into the sum `s` (a vector uop or a tuple of lanes), and the rounding error of that add into `e`. Each
        lane's new values are computed before its accumulators take them."""
        lanes = isinstance(s, tuple)
        new_s, new_e = [], []
        for s1, e1, v1 in zip(*((s, e, v) if lanes else ((s,), (e,), (v,)))):  # type: ignore[arg-type]
            t, lost = self._fast2sum(s1, v1)
            err = self.uop(UOps.ALU, e1.dtype, (e1, lost), BinaryOps.ADD, cse=False)
            new_s.append(self._phi_one(s1, t))
            new_e.append(self._phi_one(e1, err))
        return (tuple(new_s), tuple(new_e)) if lanes else (new_s[0], new_e[0])

    def _compensated_result(self, s: Value, e: Value) -> Value:
        """A compensated sum after its loop: s + e, the sum with its rounding errors added back; where that is not
        finite, s itself, which has the IEEE result of an infinity or NaN among the terms or of an overflow (after
        one, the errors are NaN)."""
        s, e = self._acc(s), self._acc(e)
        lanes = tuple(self._with_errors(s1, e1) for s1, e1 in zip(self._scalars(s), self._scalars(e)))
        return lanes if isinstance(s, tuple) else self._vector(lanes)

    def _with_errors(self, s: UOp, e: UOp) -> UOp:
        """s + e where that is finite, else s."""
        assert s.dtype is not None
        total = self.alu(BinaryOps.ADD, s.dtype, s, e)
        # total - total is 0 for a finite total, NaN otherwise (and NaN < 1 is false)
        zero_if_finite = self.alu(BinaryOps.SUB, s.dtype, total, total)
        finite = self.alu(BinaryOps.CMPLT, dtypes.bool, zero_if_finite, self.const(1.0, s.dtype))
        return self.alu(TernaryOps.WHERE, s.dtype, finite, total, s)

    def _stage_inputs(self) -> None:
        """STAGE: each staged input's tile (what the innermost reduce loop reads of it, over the workgroup) is copied
        into shared memory, every work item taking an equal share, then a BARRIER. Invalid elements are copied as 0,
        so reads of the tile are never gated."""
        k = self.k
        local_axes = list(range(k.first_reduce - k.local_dims, k.first_reduce))
        flat: Node = NumNode(0)
        for a in local_axes:  # the work item's position in its workgroup, the last local axis fastest
            flat = flat * _int(k.full_shape[a]) + self.axis_vars[a]
        group = prod([_int(k.full_shape[a]) for a in local_axes])
        fixed = {*range(k.first_reduce - k.local_dims), *range(k.first_reduce, k.first_upcast - 1)}
        for leaf in k.staged:
            axes = k.stage_axes(leaf)
            sizes = [_int(k.full_shape[a]) for a in axes]
            strides = [prod(sizes[i + 1 :]) for i in range(len(sizes))]
            n = sum(1 for u in self.header if u.op is UOps.DEFINE_LOCAL)  # (a kernel of two reduces stages twice)
            buf = UOp(UOps.DEFINE_LOCAL, PtrDType.of(leaf.arg.dtype), (), (f"stage{n}", prod(sizes)))
            self.header.append(buf)  # shared memory is declared at the kernel's top (OpenCL requires it)
            self.stages[leaf] = (buf, list(zip(axes, strides)))
            # neighbouring work items copy neighbouring elements of the input: its smallest stride varies fastest
            order = sorted(range(len(axes)), key=lambda j: -stride_order(k.stride_of(leaf, axes[j])))
            total = prod(sizes)
            for i in range(-(-total // group)):  # the last round's work items past the tile copy nothing
                e, coords = flat + i * group, {}
                inside = e < total if (i + 1) * group > total else None
                for j in reversed(order):
                    coords[axes[j]], e = e % sizes[j], e // sizes[j]
                # the other axes: global and outer reduce loops as they are, the ones the input ignores at 0
                idxs = [coords.get(a, self.axis_vars[a] if a in fixed else NumNode(0)) for a in range(k.shape_len)]
                idx, valid = k.sts[leaf].expr_idxs(idxs)
                valid = Node.ands([valid, inside]) if inside is not None else valid
                always = isinstance(valid, NumNode) and int(valid.b) == 1
                value = self._lower_leaf(leaf, idx, None if always else valid)
                at = self.node(Node.sum([coords[a] * st for a, st in zip(axes, strides)]))
                self.uop(UOps.STORE, None, (buf, at, value) if inside is None else (buf, at, value, self.node(inside)))
        self.uop(UOps.BARRIER, None, (), cse=False)

    def _pack_inputs(self) -> None:
        """PACK: each packed input's block (what the loops inside the copy read of it: Kernel.pack_loops) is copied
        into scratch memory by loops over its axes, laid out in kernel order, so those loops read it contiguously (a
        block whose rows are a power of two apart in the input no longer maps to a few cache sets; columns gathered
        from a transposed input are gathered once). Invalid elements are copied as 0, so reads of the block are
        never gated."""
        k = self.k
        for leaf in k.packed:
            n = sum(1 for u in self.header if u.op is UOps.DEFINE_LOCAL)  # (a kernel of two reduces packs twice)
            axes = k.pack_axes(leaf)
            sizes = [_int(k.full_shape[a]) for a in axes]
            strides = {a: prod(sizes[i + 1 :]) for i, a in enumerate(axes)}
            buf = UOp(UOps.DEFINE_LOCAL, PtrDType.of(leaf.arg.dtype), (), (f"pack{n}", prod(sizes)))
            self.header.append(buf)
            shape = tuple(s if a in strides else 1 for a, s in enumerate(k.full_shape))
            st = ShapeTracker((View.create(shape, tuple(strides.get(a, 0) for a in range(k.shape_len))),))
            block = LazyOp(BufferOps.LOAD, (), MemBuffer(-1 - n, leaf.arg.dtype, st))
            self.buffers[-1 - n] = buf
            loop_axes = [a for a in axes if a < k.first_upcast]
            steps = self._rowwise_steps(leaf, block, loop_axes)
            loops = self._open_loops([a for a in loop_axes if a < k.first_reduce], False)
            loops += self._open_loops([a for a in loop_axes if a >= k.first_reduce][: -1 if steps else None], True)
            if steps:
                loops.append(self._copy_rowwise(leaf, block, loop_axes[-1], steps, strides[loop_axes[-1]]))
            else:
                self._store(block, [self._lower_group(leaf, g) for g in range(self.n_groups)])
            for r in reversed(loops):
                self.close_range(r)
            self.packs[leaf] = block

    def _rowwise_steps(self, leaf: LazyOp, block: LazyOp, loop_axes: list[int]) -> int:
        """Steps of the copy's innermost loop that one row-wise copy step takes (0: copy as the kernel reads it). A
        block gathered from rows a multiple of 4 KB apart (a conv's weights along its output channels, w in x @ w.T,
        over 1024 or more input floats), of which each step of that loop reads a short run of every row, is copied
        ROWWISE_BYTES of each row at a time, row after row, in scalar stores: copied as the kernel reads it, every step
        reads each row's cache line again, and such rows share one L1 set, so each of those reads missed. Two AVX-512
        cores: ResNet-50's 1x1 convs 2048 -> 512 at 7x7 0.82-0.87 -> 0.68-0.76 ms, 1024 -> 2048 stride 2 1.88-1.94 ->
        1.44-1.50, 1024 -> 256 at 14x14 0.56-0.59 -> 0.50-0.51; x @ w.T, 128 rows, K = 1024 0.41 -> 0.35 ms, K = 2048
        1.51-1.61 -> 1.43. (Rows 2 KB apart, 512 floats, spread over two sets and ran 10-15% slower so; 2000 floats
        apart 15-25% slower.)"""
        k = self.k
        if k.opts.global_max is not None or not loop_axes or loop_axes[-1] < k.first_reduce or self.width == 1:
            return 0
        a, itemsize = loop_axes[-1], leaf.arg.dtype.itemsize
        run, size = k.stride_of(leaf, a), k.full_shape[a]
        if not isinstance(run, int) or run <= 0 or not isinstance(size, int):
            return 0
        self.index_nodes(leaf), self.index_nodes(block)  # (the lanes' offsets, where lane 0's plus constants)
        if (known := self._offsets(leaf)) is None or self._offsets(block) is None:
            return 0
        # the lanes read runs of `run` consecutive elements, one run per row, the rows far apart
        offsets = sorted(set(known[1]))
        rows = sorted({o - o % run for o in offsets}) if all(o >= 0 for o in offsets) else []
        if len(rows) < 2 or len(offsets) != len(rows) * run:
            return 0
        if any((b - a_) * itemsize % ROWWISE_APART for a_, b in zip(rows, rows[1:])):
            return 0  # (rows that spread over the cache's sets: copied as the kernel reads them, they ran faster)
        present = set(offsets)
        if any(o not in present for r in rows for o in range(r, r + run)):
            return 0
        steps = ROWWISE_BYTES // (run * itemsize)
        return steps if steps > 1 and size % steps == 0 else 0

    def _copy_rowwise(self, leaf: LazyOp, block: LazyOp, axis: int, steps: int, block_stride: int) -> UOp:
        """The copy loop of _rowwise_steps: `steps` steps of loop `axis` at a time, the lanes' loads in address order
        (a row's run of `steps` steps, then the next row's), each element stored on its own into the block."""
        k = self.k
        size = _int(k.full_shape[axis])
        r = self.open_range(self.const(0, self.index_dtype), self.const(size // steps, self.index_dtype), axis, True)
        first = self.alu(BinaryOps.MUL, self.index_dtype, r, self.const(steps, self.index_dtype))
        self.index_vars[self.axis_vars[axis]] = first
        stride = _int(k.stride_of(leaf, axis))
        lane_combo = self.index_nodes(leaf)[0]
        block_combo = self.index_nodes(block)[0]
        known = self._offsets(leaf)
        assert known is not None
        offsets = known[1]
        dt, buf, out = leaf.arg.dtype, self.buffers[leaf.arg.idx], self.buffers[block.arg.idx]
        done: set[tuple[int, int]] = set()
        order = sorted(
            ((offsets[lane_combo[lane]] + j * stride, j, lane) for lane in range(len(self.lanes)) for j in range(steps))
        )
        for _, j, lane in order:
            if (j, block_combo[lane]) in done:
                continue
            done.add((j, block_combo[lane]))
            at = self._access_index(leaf, lane_combo[lane])
            if j:
                at = self.alu(BinaryOps.ADD, self.index_dtype, at, self.const(j * stride, self.index_dtype))
            to = self._access_index(block, block_combo[lane])
            if j:
                to = self.alu(BinaryOps.ADD, self.index_dtype, to, self.const(j * block_stride, self.index_dtype))
            self.uop(UOps.STORE, None, (out, to, self.uop(UOps.LOAD, dt, (buf, at))), cse=False)
        return r

    def _staged_load(self, leaf: LazyOp, lane: int) -> UOp:
        """A lane's element of a staged input, read from its shared-memory tile."""
        buf, axes = self.stages[leaf]
        first_upcast = self.k.first_upcast
        lane_of = self.lanes[lane]
        coords = [self.axis_vars[a] if a < first_upcast else NumNode(lane_of[a - first_upcast]) for a, _ in axes]
        idx = Node.sum([c * st for c, (_, st) in zip(coords, axes)])
        return self.uop(UOps.LOAD, leaf.arg.dtype, (buf, self.node(idx)))

    @staticmethod
    def _product(v: Value) -> Optional[tuple[Value, Value]]:
        """(a, b) when every lane of `v` is a product a*b (a fused renderer accumulates it as MULACC(a, b, acc))."""
        lanes = v if isinstance(v, tuple) else (v,)
        if not all(x.op is UOps.ALU and x.arg is BinaryOps.MUL for x in lanes):
            return None
        if isinstance(v, tuple):
            return tuple(x.src[0] for x in v), tuple(x.src[1] for x in v)
        return v.src[0], v.src[1]

    def _group_key(self, g: int) -> tuple[int, ...]:
        lane = self.lanes[g * self.width]
        return tuple(v for j, v in enumerate(lane) if j not in self.unrolled)

    def _phi(self, acc: Value, new: Value) -> Value:
        """The accumulator `acc` takes `new` (each lane's, for scalars); reading it afterwards reads the new value."""
        if isinstance(acc, tuple):
            assert isinstance(new, tuple)
            return tuple(self._phi_one(a, n) for a, n in zip(acc, new))
        assert not isinstance(new, tuple)
        return self._phi_one(acc, new)

    def _phi_one(self, acc: UOp, new: UOp) -> UOp:
        return self.uop(UOps.PHI, acc.dtype, (acc.src[0] if acc.op is UOps.PHI else acc, new), cse=False)

    def _acc(self, acc: Value) -> Value:
        """The accumulator itself (its DEFINE_ACC), as read after its loop."""
        if isinstance(acc, tuple):
            return tuple(a.src[0] if a.op is UOps.PHI else a for a in acc)
        return acc.src[0] if acc.op is UOps.PHI else acc


def _live(uops: list[UOp]) -> list[UOp]:
    """`uops` without the effect-free ones whose value nothing reads."""
    read: set[int] = set()
    keep = []
    for u in reversed(uops):
        if u.op in _PURE and id(u) not in read:
            continue
        keep.append(u)
        read.update(id(s) for s in u.src)
    return keep[::-1]


# uops a LOAD (or a vector built of loads) is not moved past: loop and branch bounds, and anything that writes or
# orders memory
_LOAD_FENCES = frozenset((UOps.RANGE, UOps.ENDRANGE, UOps.IF, UOps.ENDIF, UOps.STORE, UOps.BARRIER))
_SUNK = frozenset((UOps.LOAD, UOps.VECTORIZE))


def _at_first_use(uops: list[UOp]) -> list[UOp]:
    """`uops` with each LOAD and VECTORIZE moved down to just before the first uop that reads it, within its block
    (no loop or branch bound, store or barrier is crossed, so every load reads the same memory as before). A tile's
    loads and broadcasts are lowered together at the top of its loop body; a C compiler at -O1 keeps that order, so
    all of them are live at once and spill the registers the accumulators need (a 3x3 conv of 256 channels at 14x14
    on AVX2: 16 input values, 3 weight vectors and 14 accumulators for 16 registers; one thread 49 -> 59 GFLOP/s,
    64 channels at 56x56 53 -> 70)."""
    out: list[UOp] = []
    pending: dict[int, UOp] = {}  # id -> a LOAD or VECTORIZE not placed yet, in program order
    for u in uops:
        if u.op in _SUNK:
            pending[id(u)] = u
            continue
        if u.op in _LOAD_FENCES:
            _flush(pending, out)
        _place(u, pending, out)
    _flush(pending, out)
    return out


def _place(u: UOp, pending: dict[int, UOp], out: list[UOp]) -> None:
    """_at_first_use: `u` after the pending uops it reads (functions of their own, not closures: a recursive closure
    is a reference cycle, here holding every uop, for the garbage collector)."""
    for s in u.src:
        if (p := pending.pop(id(s), None)) is not None:
            _place(p, pending, out)
    out.append(u)


def _flush(pending: dict[int, UOp], out: list[UOp]) -> None:
    """Every pending uop, in program order (placing one may place others it reads first)."""
    while pending:
        _place(pending.pop(next(iter(pending))), pending, out)


# uops whose value depends on nothing but their sources (a LOAD too, from memory the kernel does not write)
_HOISTABLE = frozenset((UOps.ALU, UOps.CONST, UOps.CAST, UOps.BITCAST, UOps.VECTORIZE, UOps.GEP, UOps.LOAD))


def _hoisted(uops: list[UOp]) -> list[UOp]:
    """`uops` with each value computed in the outermost loop where its sources are known: a value that no loop
    index of an inner loop reaches is computed once before that loop instead of at every iteration (a
    squeeze-and-excitation gate, a sigmoid of one value per channel, was computed again for each of a channel's
    3136 elements in the kernel that multiplies by it). Nothing leaves an IF, and a LOAD leaves a loop only where
    the loop is known to run (constant bounds, at least one iteration) and reads memory the kernel does not write;
    an accumulator's reads stay where they are (its value changes from one iteration to the next)."""
    written = {id(u.src[0]) for u in uops if u.op is UOps.STORE}
    # blocks[d]: the uops placed at depth d so far; its last uop is the RANGE of the loop at depth d + 1 (when open)
    blocks: list[list[UOp]] = [[]]
    floors = [0]  # per block: the shallowest depth a uop inside it may go to (an IF's or a loop's that may not run)
    load_floors = [0]
    depth: dict[int, int] = {}  # id -> the depth its value is known from
    for u in uops:
        here = len(blocks) - 1
        if u.op in _HOISTABLE and not any(s.op in (UOps.DEFINE_ACC, UOps.PHI) for s in u.src):
            floor = floors[-1]
            if u.op is UOps.LOAD:
                buf = u.src[0]
                if buf.op is not UOps.DEFINE_GLOBAL or id(buf) in written:
                    floor = here
                else:
                    floor = max(floor, load_floors[-1])
            d = max([floor] + [depth.get(id(s), 0) for s in u.src])
            depth[id(u)] = d
            if d < here:  # before the RANGE that opened the loop at depth d + 1
                blocks[d].insert(len(blocks[d]) - 1, u)
            else:
                blocks[-1].append(u)
            continue
        depth[id(u)] = here
        if u.op is UOps.RANGE or u.op is UOps.IF:
            blocks[-1].append(u)
            # (a loop of constant bounds with at least one iteration: loads may leave it)
            runs = u.op is UOps.RANGE and all(b.op is UOps.CONST for b in u.src) and u.src[1].arg > u.src[0].arg
            blocks.append([])
            depth[id(u)] = here + 1  # (the loop index is known inside the loop)
            floors.append(here + 1 if u.op is UOps.IF else floors[-1])
            load_floors.append(load_floors[-1] if runs else here + 1)
        elif u.op is UOps.ENDRANGE or u.op is UOps.ENDIF:
            inner = blocks.pop()
            floors.pop()
            load_floors.pop()
            blocks[-1].extend(inner)
            blocks[-1].append(u)
        else:
            blocks[-1].append(u)
    assert len(blocks) == 1, "unbalanced loops"
    return blocks[0]


def _grid_sums(sizes: list[int] | tuple[int, ...], weights: list[int]) -> list[int]:
    """Over every combination of indices below `sizes`, in C order: the indices times `weights`, summed."""
    big = sum(abs(w) * s for w, s in zip(weights, sizes)) >= 2**62  # (beyond int64: Python ints)
    total = np.zeros(tuple(sizes), dtype=object if big else np.int64)
    for i, (size, weight) in enumerate(zip(sizes, weights)):
        if weight:
            ramp = np.arange(size, dtype=np.int64).astype(total.dtype) * weight
            total = total + ramp.reshape([-1 if k == i else 1 for k in range(len(sizes))])
    return total.ravel().tolist()  # type: ignore[no-any-return]
