"""The linearizer: lowers a Kernel to the UOp list (the IR documented in codegen/uops.py).

Global axes become loops (a Renderer with `global_max = None`, like a CPU) or launched grid indices (SPECIAL),
reduce axes become loops with an accumulator. Index arithmetic comes from each buffer's ShapeTracker as
symbolic Nodes and is lowered to int32 ALU uops. Equal uops are emitted once per loop scope.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

from tgcore.codegen.kernel import Kernel, dtype_of
from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import ConstType, DType, PtrDType, dtypes
from tgcore.helpers import prod
from tgcore.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tgcore.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, sint

_REDUCE_ALU = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}
# a kernel's outermost loop is split across threads when it runs at least this many innermost iterations
THREAD_MIN_WORK = 1 << 17
_THREAD_BOUNDS = ("core_start", "core_end")


class Linearizer:
    """Emits the uops of one Kernel."""

    def __init__(self, k: Kernel) -> None:
        self.k = k
        self.header: list[UOp] = []  # DEFINE_GLOBAL, DEFINE_VAR and CONST uops, before any loop
        self.uops: list[UOp] = []
        self.scopes: list[dict[tuple[Any, ...], UOp]] = [{}]
        self.consts: dict[tuple[Any, ...], UOp] = {}
        self.global_size: Optional[tuple[sint, ...]] = None
        self.local_size: Optional[tuple[int, ...]] = None
        self.variables: list[Variable] = []
        self.thread_extent: Optional[int] = None
        self.op_estimate = 0
        self.mem_estimate = 0

    # ***** emission *****

    def uop(
        self, op: UOps, dtype: Optional[DType] = None, src: tuple[UOp, ...] = (), arg: Any = None, cse: bool = True
    ) -> UOp:
        """Emit a uop, or return the equal one already emitted in an enclosing scope."""
        key = (op, dtype, tuple(id(s) for s in src), arg)
        if cse:
            for scope in reversed(self.scopes):
                if key in scope:
                    return scope[key]
        u = UOp(op, dtype, src, arg)
        self.uops.append(u)
        if cse:
            self.scopes[-1][key] = u
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
        r = self.uop(UOps.RANGE, dtypes.int32, (start, end), (axis, reduce), cse=False)
        self.scopes.append({})
        return r

    def close_range(self, r: UOp) -> None:
        self.uop(UOps.ENDRANGE, None, (r,), cse=False)
        self.scopes.pop()

    # ***** index math: symbolic Node -> uops *****

    def node(self, n: sint) -> UOp:
        if isinstance(n, int):
            return self.const(n, dtypes.int32)
        if isinstance(n, NumNode):
            return self.const(int(n.b), dtypes.int32)
        if isinstance(n, Variable):
            return self.index_vars[n] if n in self.index_vars else self.var_uops[n.expr]
        if isinstance(n, MulNode):
            return self.alu(BinaryOps.MUL, dtypes.int32, self.node(n.a), self.node(n.b))
        if isinstance(n, (DivNode, ModNode)):
            # Nodes divide with floor semantics, ALU DIV/MOD truncate: shift a numerator that can be negative
            # by a multiple of the divisor so both agree
            shift = -(n.a.min // n.b) if isinstance(n.b, int) and n.a.min < 0 else 0
            a = self.node(n.a + shift * n.b) if shift else self.node(n.a)
            if isinstance(n, ModNode):
                return self.alu(BinaryOps.MOD, dtypes.int32, a, self.node(n.b))
            q = self.alu(BinaryOps.DIV, dtypes.int32, a, self.node(n.b))
            return self.alu(BinaryOps.SUB, dtypes.int32, q, self.const(shift, dtypes.int32)) if shift else q
        if isinstance(n, LtNode):
            return self.alu(BinaryOps.CMPLT, dtypes.bool, self.node(n.a), self.node(n.b))
        if isinstance(n, (SumNode, AndNode)):
            op, dt = (BinaryOps.ADD, dtypes.int32) if isinstance(n, SumNode) else (BinaryOps.AND, dtypes.bool)
            parts = [self.node(x) for x in n.nodes]
            out = parts[0]
            for p in parts[1:]:
                out = self.alu(op, dt, out, p)
            return out
        raise NotImplementedError(f"the linearizer cannot lower the index node {type(n).__name__}: {n}")

    # ***** the kernel *****

    def linearize(self) -> list[UOp]:
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
        self.var_uops = {v.expr: UOp(UOps.DEFINE_VAR, dtypes.int32, (), (v.expr, v.min, v.max)) for v in self.variables}
        self.header.extend(self.var_uops.values())
        self.index_vars: dict[Variable, UOp] = {}
        self.ranges: list[UOp] = []
        self.axis_vars = [
            Variable(f"_axis{i}", 0, s - 1) if isinstance(s, int) else Variable(f"_axis{i}", 0, s.max - 1)
            for i, s in enumerate(k.full_shape[: k.first_upcast])
        ]
        # lanes: every combination of the upcast axes' indices, in C order (the last axis varies fastest)
        self.upcast_axes = list(range(k.first_upcast, k.shape_len))
        self.lanes = list(itertools.product(*(range(s) for s in k.upcast_sizes)))
        self.unrolled = [j for j, a in enumerate(self.upcast_axes) if k.is_reduce_axis(a)]
        self.index_nodes_cache: dict[LazyOp, tuple[list[int], list[tuple[Node, Optional[Node]]]]] = {}
        self._open_globals()
        # lowered AST nodes, one dict per open reduce loop (a value computed inside a loop is not valid after it)
        self.ast_caches: list[dict[LazyOp, list[UOp]]] = [{}]
        store = k.ast
        values = self.lower(store.src[0])
        lane_combo, combos = self.index_nodes(store)
        stored: set[int] = set()
        for lane, combo in enumerate(lane_combo):
            if combo not in stored:  # lanes of an unrolled axis store the same element
                stored.add(combo)
                self.uop(UOps.STORE, None, (self.buffers[0], self.node(combos[combo][0]), values[lane]), cse=False)
        for r in reversed(self.ranges):
            self.close_range(r)
        n_alu = sum(1 for u in self.uops if u.op is UOps.ALU)
        iterations = prod([s if isinstance(s, int) else s.max for s in k.full_shape[: k.first_upcast]])
        self.op_estimate = n_alu * iterations
        self.mem_estimate = sum(
            leaf.arg.dtype.itemsize * leaf.arg.st.real_size() for leaf in k.leaves if leaf.op is not BufferOps.CONST
        )
        self.uops = self.header + self.uops
        return self.uops

    def _threaded(self, axes: list[int]) -> bool:
        """Whether the outermost loop is split across threads: a big kernel that does not read its output."""
        k = self.k
        if not k.opts.threads or not axes or not isinstance(k.full_shape[axes[0]], int) or k.full_shape[axes[0]] < 2:
            return False
        if any(leaf.op is BufferOps.LOAD and leaf.arg.idx == 0 for leaf in k.leaves):
            return False  # an in-place update may read what another thread writes
        work = prod([s if isinstance(s, int) else s.max for s in k.full_shape])
        return work >= THREAD_MIN_WORK

    def _open_globals(self) -> None:
        k = self.k
        axes = list(range(k.first_reduce - k.local_dims))
        local_axes = list(range(k.first_reduce - k.local_dims, k.first_reduce))
        sizes = [k.full_shape[a] for a in axes]
        if self.k.opts.global_max is None:
            for n, (a, s) in enumerate(zip(axes, sizes)):
                if n == 0 and self._threaded(axes):
                    assert isinstance(s, int)
                    self.thread_extent = s
                    bounds = [UOp(UOps.DEFINE_VAR, dtypes.int32, (), (name, 0, s)) for name in _THREAD_BOUNDS]
                    self.header.extend(bounds)
                    r = self.open_range(bounds[0], bounds[1], a, False)
                else:
                    r = self.open_range(self.const(0, dtypes.int32), self.node(s), a, False)
                self.ranges.append(r)
                self.index_vars[self.axis_vars[a]] = r
            return
        limit = self.k.opts.global_max
        fits = len(axes) <= len(limit) and all(isinstance(s, int) and s <= m for s, m in zip(reversed(sizes), limit))
        if fits:
            # the innermost axis is grid dimension 0
            for dim, a in enumerate(reversed(axes)):
                self.index_vars[self.axis_vars[a]] = self.uop(
                    UOps.SPECIAL, dtypes.int32, (), (dim, f"gidx{dim}", k.full_shape[a]), cse=False
                )
            self.global_size = tuple(reversed(sizes)) + (1,) * (3 - len(sizes)) if sizes else (1, 1, 1)
        else:  # too many axes for the grid: one flat index, split into the axes
            total = prod(sizes)
            flat = self.uop(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", total), cse=False)
            stride = 1
            for a, s in reversed(list(zip(axes, sizes))):
                self.index_vars[self.axis_vars[a]] = self.alu(
                    BinaryOps.MOD,
                    dtypes.int32,
                    self.alu(BinaryOps.DIV, dtypes.int32, flat, self.node(stride)),
                    self.node(s),
                )
                stride = stride * s
            self.global_size = (total, 1, 1)
        local_size = [1, 1, 1]
        for dim, a in enumerate(reversed(local_axes)):  # the innermost local axis is local dimension 0
            size = k.full_shape[a]
            assert isinstance(size, int)
            self.index_vars[self.axis_vars[a]] = self.uop(
                UOps.SPECIAL, dtypes.int32, (), (dim, f"lidx{dim}", size), cse=False
            )
            local_size[dim] = size
        self.local_size = tuple(local_size)

    def index_nodes(self, leaf: LazyOp) -> tuple[list[int], list[tuple[Node, Optional[Node]]]]:
        """For each lane, which distinct access of `leaf` it makes; and each distinct access as its (flat index,
        validity) Nodes (validity None when always valid). Lanes of an axis the buffer does not vary along share."""
        if leaf in self.index_nodes_cache:
            return self.index_nodes_cache[leaf]
        st = self.k.sts[leaf]
        loop_idxs: list[Node] = [
            NumNode(0) if st.shape[i] == 1 else self.axis_vars[i] for i in range(self.k.first_upcast)
        ]
        varying = [j for j, a in enumerate(self.upcast_axes) if st.shape[a] != 1]
        combo_of: dict[tuple[int, ...], int] = {}
        combos: list[tuple[Node, Optional[Node]]] = []
        lane_combo: list[int] = []
        for lane in self.lanes:
            key = tuple(lane[j] for j in varying)
            if key not in combo_of:
                up: list[Node] = [NumNode(lane[j] if j in varying else 0) for j in range(len(self.upcast_axes))]
                idx, valid = st.expr_idxs(loop_idxs + up)
                combo_of[key] = len(combos)
                combos.append((idx, None if isinstance(valid, NumNode) and int(valid.b) == 1 else valid))
            lane_combo.append(combo_of[key])
        self.index_nodes_cache[leaf] = (lane_combo, combos)
        return lane_combo, combos

    def lower(self, op: LazyOp) -> list[UOp]:
        """The uops computing AST node `op` at the current position, one per lane (each shared node is lowered
        once per scope)."""
        for cache in reversed(self.ast_caches):
            if op in cache:
                return cache[op]
        out = self.ast_caches[-1][op] = self._lower(op)
        return out

    def _lower(self, op: LazyOp) -> list[UOp]:
        if op.op in ReduceOps:
            return self.reduce(op)
        if op.op in (BufferOps.CONST, BufferOps.LOAD):
            lane_combo, combos = self.index_nodes(op)
            per_combo = [self._lower_leaf(op, idx, valid) for idx, valid in combos]
            return [per_combo[c] for c in lane_combo]
        srcs = [self.lower(s) for s in op.src]
        if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
            kind = UOps.CAST if op.op is UnaryOps.CAST else UOps.BITCAST
            return [self.uop(kind, op.arg, (x,)) for x in srcs[0]]
        dt = dtype_of(op)
        return [self.alu(op.op, dt, *lane) for lane in zip(*srcs)]

    def _lower_leaf(self, op: LazyOp, idx: Node, valid: Optional[Node]) -> UOp:
        dt = op.arg.dtype
        if op.op is BufferOps.CONST:
            val = self.var_uops[op.arg.val.expr] if isinstance(op.arg.val, Variable) else self.const(op.arg.val, dt)
            if isinstance(op.arg.val, Variable) and dt != dtypes.int32:
                val = self.uop(UOps.CAST, dt, (val,))
            if valid is None:
                return val
            if isinstance(valid, NumNode):
                return self.const(0, dt)
            return self.alu(TernaryOps.WHERE, dt, self.node(valid), val, self.const(0, dt))
        buf = self.buffers[op.arg.idx]
        if valid is None:
            return self.uop(UOps.LOAD, dt, (buf, self.node(idx)))
        if isinstance(valid, NumNode):
            return self.const(0, dt)
        return self.uop(UOps.LOAD, dt, (buf, self.node(idx), self.node(valid), self.const(0, dt)))

    def reduce(self, op: LazyOp) -> list[UOp]:
        k = self.k
        dt = dtype_of(op.src[0])
        init = 0 if op.op is ReduceOps.SUM else dtypes.min(dt)

        def outer(lane: tuple[int, ...]) -> tuple[int, ...]:  # the lane's indices on the global upcast axes
            return tuple(v for j, v in enumerate(lane) if j not in self.unrolled)

        accs: dict[tuple[int, ...], UOp] = {}
        for lane in self.lanes:
            if outer(lane) not in accs:
                accs[outer(lane)] = self.uop(UOps.DEFINE_ACC, dt, (), init, cse=False)
        loops = []
        for a in range(k.first_reduce, k.first_upcast):
            r = self.open_range(self.const(0, dtypes.int32), self.node(k.full_shape[a]), a, True)
            self.index_vars[self.axis_vars[a]] = r
            loops.append(r)
        self.ast_caches.append({})
        vals = self.lower(op.src[0])
        self.ast_caches.pop()
        # each accumulator adds its unrolled lanes in index order: the order of the loop they replace
        current = dict(accs)
        order = sorted(range(len(self.lanes)), key=lambda i: ([self.lanes[i][j] for j in self.unrolled], i))
        for i in order:
            key = outer(self.lanes[i])
            new = self.uop(UOps.ALU, dt, (current[key], vals[i]), _REDUCE_ALU[op.op], cse=False)  # type: ignore[index]
            current[key] = self.uop(UOps.PHI, dt, (accs[key], new), cse=False)
        for r in reversed(loops):
            self.close_range(r)
        return [accs[outer(lane)] for lane in self.lanes]
