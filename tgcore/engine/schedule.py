"""The scheduler: turns the lazy graph behind some outputs into an ordered list of kernels (ScheduleItems).

Fusion rules:
- A chain of elementwise ops is one kernel: unrealized elementwise bases are inlined into whoever reads them,
  through any view (reshape, permute, expand, shrink, flip; pad only when the inlined ops map 0 to 0).
- Elementwise ops feeding a reduce join the reduce's kernel, except an elementwise base that the reduce's
  operands read through an expand (a broadcast, as each matmul operand is): it would be recomputed for every
  element it is broadcast to, so it is realized once (a kernel of its own) and loaded. Likewise an elementwise
  epilogue of another reduce that a reduce reads through a moved view (a pool's windows over relu(conv + bias)): it
  is realized, so it joins the first reduce's kernel (below) instead of being recomputed for every window.
- A reduce whose result is read, unmoved, by exactly one kernel of its own shape (through elementwise ops
  only) joins that kernel too; otherwise it is a kernel of its own.
- LoadOps (EMPTY, COPY, CONTIGUOUS, ASSIGN, CUSTOM) and the requested outputs are always realized.
- A GATHER is inlined like an elementwise op, with its index expression: the kernel that reads it loads each element
  at its index. The table it reads from is realized (its kernel must have run: the load's address is only known in
  the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Optional

from tgcore import lazymath
from tgcore.device import Device
from tgcore.engine.realize import raise_if_counted
from tgcore.lazy import LazyBuffer
from tgcore.ops import (
    BinaryOps,
    BufferOps,
    ComposedOps,
    ConstBuffer,
    GatherBuffer,
    IndexOps,
    LazyOp,
    LoadOps,
    MemBuffer,
    ReduceOps,
    TernaryOps,
    UnaryOps,
)
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import Node, Variable
from tgcore.shape.view import View, _plain_ints

# elementwise ops with f(0, ..., 0) == 0: safe to compute on the zeros a pad's mask reads
_PAD_SAFE = {
    UnaryOps.NEG,
    UnaryOps.SIN,
    UnaryOps.SQRT,
    UnaryOps.CAST,
    UnaryOps.BITCAST,
    BinaryOps.ADD,
    BinaryOps.SUB,
    BinaryOps.MUL,
    BinaryOps.MAX,
    BinaryOps.CMPLT,
    BinaryOps.XOR,
    BinaryOps.AND,
    BinaryOps.OR,
    BinaryOps.SHL,
    BinaryOps.SHR,
    TernaryOps.WHERE,
    TernaryOps.MULACC,
}
_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps, ComposedOps)
_INLINED = (UnaryOps, BinaryOps, TernaryOps, ComposedOps, IndexOps)  # bases computed inside the kernels that read them
# the most ops a kernel's expression nests (deeper chains are split into kernels, see _Graph._limit_kernels) and the
# most buffers it reads; the deepest of tgcore's own composed functions (pow, through exp and log) nest about 90
MAX_FUSED_DEPTH = 128
MAX_KERNEL_INPUTS = 64
# an elementwise base that reads this many buffers or more (through what is inlined into it) and is read by a reduce
# and by something else is realized, not computed again inside each reader: a residual stream (x + attention +
# feed-forward, layer after layer) read by the next layer's LayerNorm. Inlined, each layer's kernels read one more
# term than the last (GPT-2's 12 layers compiled 84 kernels for one step, 12 for one layer realized)
SHARED_INPUTS_MIN = 3


_COMPOSED_TRAITS: dict[tuple[ComposedOps, str, str], tuple[int, bool]] = {}


def _composed_traits(b: LazyBuffer) -> tuple[int, bool]:
    """For a ComposedOps node: (how deep its composition's ops nest, whether each of them maps zeros to 0), what
    _limit_kernels and _pad_safe find in the written-out graph. The same for every node of one op and dtype: found
    once, on a stand-in source."""
    key = (b.op, b.dtype.name, b.device)
    if (found := _COMPOSED_TRAITS.get(key)) is None:
        stand_in = LazyBuffer.loadop(LoadOps.EMPTY, (1,), b.dtype, b.device)
        root = lazymath.COMPOSITIONS[b.op](stand_in).base  # type: ignore[index]
        depth: dict[LazyBuffer, int] = {}
        safe, stack = True, [root]
        while stack:  # sources first, each once
            n = stack[-1]
            todo = [s.base for s in n.srcs if s.base is not stand_in and s.base.op is not LoadOps.CONST]
            if pending := [s for s in todo if s not in depth]:
                stack.extend(pending)
                continue
            stack.pop()
            depth[n] = 1 + max((depth[s] for s in todo), default=0)
            safe = safe and n.op in _PAD_SAFE
        found = _COMPOSED_TRAITS[key] = (depth[root], safe)
    return found


@dataclass
class ScheduleItem:
    """One unit of work: a kernel AST (STORE root) or a LoadOps (COPY, EMPTY, CUSTOM), with its buffers."""

    ast: LazyOp
    outputs: tuple[LazyBuffer, ...]
    inputs: tuple[LazyBuffer, ...]
    var_vals: dict[Variable, int] = field(default_factory=dict)
    # for the kernel of a check (LazyBuffer.checks): (the error, its message), raised when its output is not 0
    check: Optional[tuple[type, str]] = None

    @property
    def bufs(self) -> tuple[Any, ...]:
        return (*map(_output_buffer, self.outputs), *map(_base_buffer, self.inputs))  # map: no comprehension frames


_base_buffer = attrgetter("base.buffer")


def _output_buffer(b: LazyBuffer) -> Any:
    """An output base's Buffer: the one it has, else a new one (LazyBuffer.new_buffer, not __getattr__'s path)."""
    buffer = b.__dict__.get("buffer")
    return buffer if buffer is not None else b.new_buffer()


def _broadcasts(st: ShapeTracker) -> bool:
    """Whether reading through `st` may visit some element more than once: a stride-0 axis of size > 1 in any of its
    views (of the movement ops only an expand revisits elements; a pad reads more elements than the base holds, but
    each real one once, and its reads of nothing are settled by `_pad_safe`)."""
    return any(stride == 0 and size != 1 for v in st.views for size, stride in zip(v.shape, v.strides))


class _Graph:
    """The part of the lazy graph that is not realized yet, with the decision of what to realize."""

    def __init__(self, outs: list[LazyBuffer]) -> None:
        self.outs = outs
        self.realizes: dict[LazyBuffer, None] = {b: None for b in outs}
        self.children: dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]] = {}  # base -> [(child, view read)]
        self.seen: dict[LazyBuffer, None] = {}
        self.masked_reads: list[LazyBuffer] = []
        self.expanded_reads: list[tuple[LazyBuffer, LazyBuffer]] = []  # (elementwise base, its reader)
        self.windowed_reads: list[LazyBuffer] = []  # elementwise bases a reduce reads through a moved view
        self.epilogue: dict[LazyBuffer, bool] = {}  # _epilogue_of_reduce's answers
        self.pad_safe: dict[LazyBuffer, bool] = {}
        self.post_order: list[LazyBuffer] = []  # every unrealized base, its sources first
        self.checks: dict[LazyBuffer, tuple[type, str]] = {}  # count of invalid values -> (error, message)
        for b in outs:
            self._walk(b)
        for count in list(self.checks):  # the checks' own kernels (an index computed in this schedule is read twice)
            self.realizes[count] = None
            self._walk(count)
        for b in self.seen:
            if b.op in ReduceOps:
                self.realizes[b] = None
        for b in self.masked_reads:
            if b not in self.realizes and not self._pad_safe(b):
                self.realizes[b] = None
        for b, reader in self.expanded_reads:
            if reader.op in ReduceOps or any(c.op in ReduceOps for c, _ in self.children.get(reader, [])):
                self.realizes[b] = None
        for b in self.windowed_reads:
            if tops := self._epilogues_below(b):
                self.realizes.update(dict.fromkeys(tops))
                self.epilogue.clear()  # (answers that read through what is realized now no longer hold)
        self._limit_kernels()
        self.fused_reduces: dict[LazyBuffer, list[LazyBuffer]] = {}
        for b in list(self.seen):
            if b.op in ReduceOps and b not in outs and not b.forced_realize:
                self._try_fuse_reduce(b)

    def _walk(self, root: LazyBuffer) -> None:
        """Visit the unrealized graph below `root` depth first, each base once (a loop, not recursion: graphs can be
        deeper than Python's recursion limit), noting what each node's reads force to be realized."""
        if root.realized is not None or root in self.seen:
            return
        self._enter(root)
        stack: list[tuple[LazyBuffer, int]] = [(root, 0)]
        while stack:
            b, i = stack[-1]
            if i == len(b.srcs):
                stack.pop()
                self.post_order.append(b)
                continue
            stack[-1] = (b, i + 1)
            src = b.srcs[i]
            sb = src.base
            self.children.setdefault(sb, []).append((b, src))
            if sb.realized is not None:
                continue
            if b.op in (LoadOps.COPY, LoadOps.CUSTOM) or (b.op is IndexOps.GATHER and i == 0):
                self.realizes[sb] = None
            if src is not sb and sb.op is not LoadOps.CONST:
                if sb.op in ReduceOps:
                    self.realizes[sb] = None
                elif any(v.mask is not None for v in src.st.views):
                    self.masked_reads.append(sb)
                if isinstance(sb.op, _INLINED) and _broadcasts(src.st):
                    self.expanded_reads.append((sb, b))
                elif b.op in ReduceOps and isinstance(sb.op, _ELEMENTWISE):
                    self.windowed_reads.append(sb)
            if sb not in self.seen:
                self._enter(sb)
                stack.append((sb, 0))

    def _limit_kernels(self) -> None:
        """Realize the inlined sources of a node whose kernel would nest more than MAX_FUSED_DEPTH ops deep or read
        more than MAX_KERNEL_INPUTS buffers: a chain of 10,000 ops becomes kernels of at most that depth (every walk
        of a kernel's AST stays far below Python's recursion limit), a sum of 500 tensors kernels of at most that
        many inputs."""
        depth: dict[LazyBuffer, int] = {}
        inputs: dict[LazyBuffer, frozenset[LazyBuffer]] = {}
        realizes, const = self.realizes, LoadOps.CONST
        for b in self.post_order:
            d, ins, inlined = 0, set(), []
            for s in b.srcs:
                sb = s.base
                if sb.realized is not None or sb in realizes:
                    ins.add(sb)
                elif sb.op is not const:
                    inlined.append(sb)
                    d = max(d, depth[sb])
                    ins |= inputs[sb]
            weight = _composed_traits(b)[0] if isinstance(b.op, ComposedOps) else 1  # (the ops it stands for)
            if inlined and (d + weight > MAX_FUSED_DEPTH or len(ins) > MAX_KERNEL_INPUTS):
                for sb in inlined:
                    realizes[sb] = None
                d, ins = 0, {s.base for s in b.srcs if s.base.op is not const or s.base.realized is not None}
            depth[b], inputs[b] = d + weight, frozenset(ins)
            if len(ins) >= SHARED_INPUTS_MIN and b not in realizes and isinstance(b.op, _ELEMENTWISE):
                readers = {c for c, _ in self.children.get(b, [])}
                if len(readers) >= 2 and any(c.op in ReduceOps for c in readers):
                    realizes[b] = None

    def _enter(self, b: LazyBuffer) -> None:
        self.seen[b] = None
        for count, error, message in b.checks:
            if count.base.realized is not None:  # computed for an earlier realize that stopped at it
                raise_if_counted(count.base.buffer, (error, message))
            else:
                self.checks[count.base] = (error, message)
        if (isinstance(b.op, LoadOps) and b.op is not LoadOps.CONST) or b.forced_realize:
            self.realizes[b] = None

    def _epilogues_below(self, b: LazyBuffer) -> list[LazyBuffer]:
        """The elementwise bases in b's inlined graph (b included) that are the top of a reduce's epilogue (each the
        first one met from b down, _epilogue_of_reduce): what a reduce reading b through a moved view would otherwise
        recompute for every window."""
        tops, stack, seen = [], [b], {b}
        while stack:
            n = stack.pop()
            if n in self.realizes:
                continue
            if self._epilogue_of_reduce(n):
                tops.append(n)
                continue
            for s in n.srcs:
                sb = s.base
                if sb not in seen and sb.realized is None and isinstance(sb.op, _ELEMENTWISE):
                    seen.add(sb)
                    stack.append(sb)
        return tops

    def _epilogue_of_reduce(self, b: LazyBuffer) -> bool:
        """Whether elementwise base `b` computes on the result of a reduce of this schedule, through elementwise ops
        that read it unmoved (relu(conv + bias)): realized, it is that reduce's epilogue (_try_fuse_reduce). (Not
        through a pad's or another view's move: the reduce could not join b's kernel, and b would be a kernel more.)
        Memoized (self.epilogue) and a loop, sources first: _epilogues_below asks it of every node of a chain."""
        memo = self.epilogue
        stack = [b]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            found, todo = False, []
            for s in n.srcs:
                sb = s.base
                if sb.realized is not None or sb.op is LoadOps.CONST or not s.st.contiguous or s.size != n.size:
                    continue
                if sb.op in ReduceOps:
                    found = True
                    break
                if isinstance(sb.op, _ELEMENTWISE) and sb not in self.realizes:
                    if sb not in memo:
                        todo.append(sb)
                    elif memo[sb]:
                        found = True
                        break
            if found or not todo:
                memo[n] = found
                stack.pop()
            else:
                stack.extend(todo)
        return memo[b]

    def _pad_safe(self, b: LazyBuffer) -> bool:
        """Whether computing `b` inline gives 0 where a pad reads nothing (every op below it maps zeros to 0)."""
        stack = [b]
        while stack:  # sources first, each once (memoized: a graph that reuses nodes would make it exponential)
            n = stack[-1]
            if n.realized is not None or n in self.realizes or n.op is LoadOps.CONST:
                self.pad_safe[n] = True
            if n in self.pad_safe:
                stack.pop()
                continue
            if n.op not in _PAD_SAFE and not (isinstance(n.op, ComposedOps) and _composed_traits(n)[1]):
                self.pad_safe[n] = False
                stack.pop()
                continue
            todo = [s.base for s in n.srcs if s.base not in self.pad_safe]
            if todo:
                stack.extend(todo)
                continue
            self.pad_safe[n] = all(self.pad_safe[s.base] for s in n.srcs)
            stack.pop()
        return self.pad_safe[b]

    def _try_fuse_reduce(self, r: LazyBuffer) -> None:
        group: dict[LazyBuffer, None] = {}
        frontier = [r]
        while frontier:
            node = frontier.pop()
            for child, view in self.children.get(node, []):
                if not view.st.contiguous or view.size != r.size:
                    return  # read through a view that moves data: the reader's index space differs
                if child in self.realizes:
                    group[child] = None
                elif isinstance(child.op, _ELEMENTWISE):
                    frontier.append(child)
                else:
                    return
        if len(group) != 1:
            return
        consumer = next(iter(group))
        if consumer.op in ReduceOps or consumer.op in (LoadOps.COPY, LoadOps.CUSTOM, LoadOps.EMPTY):
            return
        fused = self.fused_reduces.setdefault(consumer, [])
        key = (r.srcs[0].shape, r.arg)
        if any((f.srcs[0].shape, f.arg) != key for f in fused):
            return
        fused.append(r)
        del self.realizes[r]


class _KernelBuilder:
    """Builds the AST of the kernel that realizes one base, numbering the buffers it reads."""

    def __init__(self, graph: _Graph, out: LazyBuffer) -> None:
        self.graph, self.out = graph, out
        self.inputs: list[LazyBuffer] = []
        self.var_vals: dict[Variable, int] = {}
        self.cache: dict[tuple[LazyBuffer, ShapeTracker], LazyOp] = {}

    def _buffer_index(self, b: LazyBuffer) -> int:
        if self.out.op is LoadOps.ASSIGN and b.buffer is self.out.buffer:
            return 0  # reading the assign target reads the output buffer itself
        if b not in self.inputs:
            self.inputs.append(b)
        return self.inputs.index(b) + 1

    def _unbind(self, st: ShapeTracker) -> ShapeTracker:
        st, var_vals = st.unbind()
        self.var_vals.update(var_vals)
        return st

    def read(self, b: LazyBuffer, st: ShapeTracker) -> LazyOp:
        """The AST that reads base `b` through `st` (kernel index space -> b's contiguous layout)."""
        key = (b, st)
        if key not in self.cache:
            self.cache[key] = self._read(b, st)
        return self.cache[key]

    def _read(self, b: LazyBuffer, st: ShapeTracker) -> LazyOp:
        if b.realized is not None or (b in self.graph.realizes and b is not self.out):
            return LazyOp(BufferOps.LOAD, (), MemBuffer(self._buffer_index(b), b.dtype, self._unbind(st)))
        if b.op is LoadOps.CONST:
            val = b.arg
            if isinstance(val, Node):
                var, value = val.unbind() if isinstance(val, Variable) else (val, None)
                if value is not None:
                    self.var_vals[var] = value
                val = var
            return LazyOp(BufferOps.CONST, (), ConstBuffer(val, b.dtype, self._unbind(st)))
        if b.op in ReduceOps:
            src = b.srcs[0]
            return LazyOp(b.op, (self.read(src.base, src.st),), b.arg)
        if b.op in (LoadOps.CONTIGUOUS, LoadOps.ASSIGN):
            src = b.srcs[0]
            return self.read(src.base, src.st + st)
        if b.op is IndexOps.GATHER:
            return self._gather(b, st)
        if isinstance(b.op, ComposedOps):  # written out: its composition's base, read as b is
            root = lazymath.compose(b)
            return self.read(root, st) if root._base is None else self.read(root.base, root.st + st)
        return LazyOp(b.op, tuple(self.read(s.base, s.st + st) for s in b.srcs), b.arg)

    def _gather(self, b: LazyBuffer, st: ShapeTracker) -> LazyOp:
        """A GATHER read through `st`: a LOAD of the table (a realized buffer, read through one plain view) whose
        tracker has the gathered axis at stride 0, and whose src is the index expression; the linearizer adds the
        index (clamped) times that axis's stride."""
        table, index = b.srcs
        axis, view = b.arg, table.st.views[0]
        strides = tuple(0 if a == axis else s for a, s in enumerate(view.strides))
        access = ShapeTracker((View.create(b.shape, strides, view.offset),)) + st
        arg = GatherBuffer(
            self._buffer_index(table.base),
            table.dtype,
            self._unbind(access),
            view.strides[axis],
            table.shape[axis],
        )
        return LazyOp(BufferOps.LOAD, (self.read(index.base, index.st + st),), arg)

    def build(self) -> ScheduleItem:
        b = self.out
        if b.size == 0:  # nothing to compute: the (empty) buffer is all there is
            return ScheduleItem(LazyOp(LoadOps.EMPTY), (b,), ())
        if b.op in (LoadOps.EMPTY, LoadOps.COPY, LoadOps.CUSTOM):
            inputs = tuple(s.base for s in b.srcs)
            return ScheduleItem(LazyOp(b.op, (), b.arg), (b,), inputs)
        if Device.storage_only(b.device):
            raise RuntimeError(
                f"device {b.device} only holds data and runs no kernels, but this tensor needs one ({b.op} on it): "
                f"copy the data to a compute device first (t.to(Device.DEFAULT)) and compute there"
            )
        # a fused reduce may reach this kernel through reshapes: index the kernel in the reduce's output shape
        fused = self.graph.fused_reduces.get(b)
        out_st = ShapeTracker.from_shape(b.shape)
        if fused and fused[0].shape != b.shape:
            out_st = out_st.reshape(fused[0].shape)
        value = self._read(b, out_st)
        store_st = out_st
        if b.op is LoadOps.ASSIGN and b.arg is not None:  # into a view: each element lands where the view reads it
            store_st = self._unbind(b.arg if out_st.shape == b.shape else b.arg.reshape(out_st.shape))
        ast = LazyOp(BufferOps.STORE, (value,), MemBuffer(0, b.dtype, store_st))
        return ScheduleItem(ast, (b,), tuple(self.inputs), self.var_vals)


def create_schedule_with_vars(outs: list[LazyBuffer]) -> tuple[list[ScheduleItem], dict[Variable, int]]:
    """The ordered kernels that realize `outs`, and the values of the symbolic variables they use."""
    if len(outs) == 1:  # the common case, without the dedup (`x._base or x` is x.base without the property call)
        base = outs[0]._base or outs[0]
        bases = [base] if base.realized is None else []
    else:
        bases = list(dict.fromkeys(x.base for x in outs if x.base.realized is None))
    if not bases:
        return [], {}
    graph_key = _graph_key(bases)
    if graph_key is not None:
        nodes = graph_key[1]
        if any(n.op is LoadOps.ASSIGN for n in nodes):
            extra, force = _old_value_readers(nodes, set(nodes))
            if extra or force:  # the graph grows by them (forced_realize is part of the key)
                for b in force:
                    b.forced_realize = True
                bases = bases + [b for b in extra if b not in bases]
                graph_key = _graph_key(bases)
        if graph_key is not None and (template := _schedule_cache.get(graph_key[0])) is not None:
            return _instantiate(template, graph_key[1], graph_key[2]), {}
        schedule, var_vals = _create_schedule(bases, readers_known=True)
    else:
        schedule, var_vals = _create_schedule(bases)
    if graph_key is not None and not var_vals:
        key, nodes, leaves = graph_key
        if (template := _template(schedule, nodes, leaves)) is not None:
            if len(_schedule_cache) >= _SCHEDULE_CACHE_SIZE:
                _schedule_cache.pop(next(iter(_schedule_cache)))
            _schedule_cache[key] = template
            schedule = _Instance(schedule)
            schedule.template = template
    return schedule, var_vals


# ***** the schedule cache: a graph that repeats (an op in a loop, a training step) is scheduled once *****

# the ops a cached graph may hold: the ones whose schedule depends on nothing but the graph's structure (a set: ops
# hash by identity, in C)
_CACHEABLE = frozenset(
    (*UnaryOps, *BinaryOps, *TernaryOps, *ComposedOps, *ReduceOps, *IndexOps, LoadOps.CONST, LoadOps.CONTIGUOUS,
     LoadOps.ASSIGN)
)
_SCHEDULE_CACHE_SIZE = 4096


class _Template(list):  # type: ignore[type-arg]
    """A cached schedule: per kernel, (ast, index of its output, indexes of its inputs, check), indexes into the
    graph's nodes followed by its leaves (the realized buffers it reads). `ran`: a schedule made from it has run, so
    its kernels were compiled (engine/realize.py then runs the next one without looking for kernels to compile)."""

    ran = False


class _Instance(list):  # type: ignore[type-arg]
    """A schedule (a list of ScheduleItems) made from a cached template, or the one the template was made from, and
    that template."""

    template: _Template


_schedule_cache: dict[tuple[Any, ...], _Template] = {}


def _graph_key(
    bases: list[LazyBuffer],
) -> Optional[tuple[tuple[Any, ...], list[LazyBuffer], list[LazyBuffer]]]:
    """A key that equals another graph's exactly when scheduling both gives the same kernels (up to which buffers
    they run on), with the graph's unrealized bases and realized buffers in the order the key numbers them; None
    for a graph the cache does not take (symbolic shapes, copies, custom ops). A graph whose views hold bound
    Variables gets a key, but its schedule has var_vals and is never stored. Realized buffers are keyed with the
    first one that shares their memory (an assign's kernel reads its target through its output: which other reads
    are of that memory changes the kernel)."""
    if len(bases) == 1 and (flat := _flat_graph_key(bases[0])) is not _NOT_FLAT:
        return flat
    nodes: dict[LazyBuffer, int] = {}
    leaves: dict[LazyBuffer, int] = {}
    memory: dict[int, int] = {}  # id of a realized Buffer -> the first leaf on it
    parts: list[Any] = []
    # an iterative post-order walk (graphs can be deeper than Python's recursion limit); this runs for every
    # realize, so it is written for speed: `x._base or x` is `x.base` without the property call, and a dtype is
    # keyed by its name (unique among the scalar dtypes a LazyBuffer holds; a str hashes without a Python call)
    stack: list[tuple[LazyBuffer, bool]] = [(b, False) for b in reversed(bases)]
    while stack:
        b, expanded = stack.pop()
        if b in nodes:
            continue
        if not expanded:
            stack.append((b, True))
            for s in reversed(b.srcs):
                sb = s._base or s
                if sb.realized is None and sb not in nodes:
                    stack.append((sb, False))
            for count, _, _ in b.checks:  # a check's count is part of the schedule too
                if count.base.realized is None and count.base not in nodes:
                    stack.append((count.base, False))
            continue
        op, arg = b.op, b.arg
        if op not in _CACHEABLE:
            return None
        if isinstance(arg, Node) or not _plain_ints(b.shape):
            return None
        srcs = []
        for count, error, message in b.checks:
            if count.base.realized is not None:
                return None  # (a count computed before: read back when it is scheduled, not reused)
            srcs.append(("check", nodes[count.base], error, message))
        for s in b.srcs:
            sb = s._base or s
            st = s.st if s is not sb else None
            if sb.realized is not None:
                leaf = leaves.setdefault(sb, len(leaves))
                same = memory.setdefault(id(sb.buffer), leaf)
                srcs.append((False, leaf, sb.dtype.name, sb.device, sb.shape, st, same))
            else:
                srcs.append((True, nodes[sb], st))
        nodes[b] = len(nodes)
        parts.append((op, _arg_key(arg), b.dtype.name, b.device, b.shape, b.forced_realize, tuple(srcs)))
    key = (tuple(parts), tuple(nodes[b] for b in bases))
    return key, list(nodes), list(leaves)


_NOT_FLAT: Any = object()


def _arg_key(arg: Any) -> tuple[Any, Any]:
    """An op's arg in a graph key: a float by its value, and 0.0, -0.0 and NaN by their bits (the zeros differ, a NaN
    equals itself); True and 1 differ by type."""
    return (float, arg.hex()) if type(arg) is float and (arg == 0.0 or arg != arg) else (type(arg), arg)


def _flat_graph_key(b: LazyBuffer) -> Any:
    """_graph_key of the graph of one base whose sources are realized buffers and constants (an op on a tensor and
    a number, in a loop): the same key, nodes and leaves the generic walk makes, built without its stack; _NOT_FLAT
    for any other graph. The constants are numbered first, in the order b reads them, then b: the walk's post-order."""
    const = LoadOps.CONST
    nodes: dict[LazyBuffer, int] = {}
    leaves: dict[LazyBuffer, int] = {}
    memory: dict[int, int] = {}
    parts: list[Any] = []
    srcs: list[tuple[Any, ...]] = []
    for s in b.srcs:
        sb = s._base or s
        st = s.st if s is not sb else None
        if sb.realized is not None:
            leaf = leaves.setdefault(sb, len(leaves))
            srcs.append((False, leaf, sb.dtype.name, sb.device, sb.shape, st, memory.setdefault(id(sb.buffer), leaf)))
            continue
        if sb.op is not const or sb.srcs:
            return _NOT_FLAT
        if (index := nodes.get(sb)) is None:
            arg = sb.arg
            if isinstance(arg, Node) or not _plain_ints(sb.shape):
                return None
            index = nodes[sb] = len(nodes)
            parts.append((const, _arg_key(arg), sb.dtype.name, sb.device, sb.shape, sb.forced_realize, ()))
        srcs.append((True, index, st))
    op, arg = b.op, b.arg
    if b.checks:
        return _NOT_FLAT
    if op not in _CACHEABLE:
        return None
    if isinstance(arg, Node) or not _plain_ints(b.shape):
        return None
    nodes[b] = index = len(nodes)
    parts.append((op, _arg_key(arg), b.dtype.name, b.device, b.shape, b.forced_realize, tuple(srcs)))
    return (tuple(parts), (index,)), list(nodes), list(leaves)


def _template(schedule: list[ScheduleItem], nodes: list[LazyBuffer], leaves: list[LazyBuffer]) -> Optional[_Template]:
    index = {b: i for i, b in enumerate(nodes + leaves)}
    out = _Template()
    for si in schedule:
        if len(si.outputs) != 1 or index.get(si.outputs[0], len(nodes)) >= len(nodes) or si.var_vals:
            return None
        if any(x not in index for x in si.inputs):
            return None
        out.append((si.ast, index[si.outputs[0]], tuple(index[x] for x in si.inputs), si.check))
    return out


def _instantiate(template: _Template, nodes: list[LazyBuffer], leaves: list[LazyBuffer]) -> _Instance:
    every = nodes + leaves
    pick = every.__getitem__
    out = _Instance(
        ScheduleItem(ast, (every[i],), tuple(map(pick, refs)), {}, check) for ast, i, refs, check in template
    )
    out.template = template
    return out


def _outside_readers(b: LazyBuffer, inside: Any) -> list[LazyBuffer]:
    """The readers of base `b` that are alive, not computed yet, and not part of the graph being scheduled (one loop
    with no call a reader: a training step asks it of every node that reads a parameter)."""
    out = []
    for ref in b.__dict__.get("readers", ()):
        r = ref()
        if r is not None and r not in inside and r.realized is None and not Device.storage_only(r.device):
            out.append(r)
    return out


def _old_value_readers(order: list[LazyBuffer], inside: Any) -> tuple[list[LazyBuffer], list[LazyBuffer]]:
    """What an ASSIGN in the graph (`order`: its unrealized bases, sources first) must not let read the new contents of
    its target: `b = a * 2; a.assign(a + 10)` must leave b twice the old a, as in numpy, and the loss a training step
    returns must be the loss before the step. Returns (bases outside the graph that read a target: computed in this
    schedule too, the outermost of them; bases inside it that read a target, directly or through what is inlined,
    and are read from outside: realized, so those readers find the old values). Every kernel that reads a target's
    old contents runs before the assign."""
    targets = {a.srcs[1].base for a in order if a.op is LoadOps.ASSIGN}
    if not targets:
        return [], []
    tainted: set[LazyBuffer] = set()
    force: list[LazyBuffer] = []
    assign = LoadOps.ASSIGN
    for n in order:  # (this runs for every realize of a graph with an assign: `s._base or s` is s.base without a call)
        if n.op is not assign:
            for s in n.srcs:
                if (sb := s._base or s) in targets or sb in tainted:
                    tainted.add(n)
                    if _outside_readers(n, inside):
                        force.append(n)
                    break
    found: dict[LazyBuffer, None] = {}
    for target in targets:
        for r in _outside_readers(target, inside):
            if not (r.op is LoadOps.ASSIGN and r.buffer is target.buffer):
                found[r] = None
    if not found:
        return [], force
    below: set[LazyBuffer] = set()  # what those readers read: computed with the outermost ones, not as outputs
    stack = list(found)
    while stack:
        for src in stack.pop().srcs:
            sb = src.base
            if sb.realized is None and sb not in below:
                below.add(sb)
                stack.append(sb)
    return [r for r in found if r not in below], force


def _create_schedule(
    bases: list[LazyBuffer], readers_known: bool = False
) -> tuple[list[ScheduleItem], dict[Variable, int]]:
    graph = _Graph(bases)
    extra, force = ([], []) if readers_known else _old_value_readers(graph.post_order, graph.seen)
    if extra or force:
        for b in force:
            b.forced_realize = True
        graph = _Graph(bases + [b for b in extra if b not in bases])
    items: dict[LazyBuffer, ScheduleItem] = {b: _KernelBuilder(graph, b).build() for b in graph.realizes}
    for count, check in graph.checks.items():
        items[count].check = check
    # an ASSIGN must run after every other kernel that reads the old contents of its target
    after: dict[LazyBuffer, list[LazyBuffer]] = {b: [x for x in items[b].inputs if x in items] for b in items}
    for b, si in items.items():
        if b.op is LoadOps.ASSIGN:
            target = b.srcs[1].base
            after[b] += [o for o, other in items.items() if o is not b and target in other.inputs]
    # dependencies first, depth first: a loop (a recursive closure would hold itself, and with it every buffer of
    # the schedule, in a reference cycle that only the garbage collector frees)
    order: list[ScheduleItem] = []
    state: dict[LazyBuffer, int] = {}  # 1: being visited, 2: done
    for root in (*graph.checks, *items):  # the checks first: nothing that reads invalid data runs before them
        if state.get(root) == 2:
            continue
        state[root] = 1
        stack = [(root, iter(after[root]))]
        while stack:
            b, deps = stack[-1]
            for dep in deps:
                if (seen := state.get(dep)) == 2:
                    continue
                if seen == 1:
                    raise RuntimeError(
                        f"cycle in the schedule at {dep}: an assign target is read by its own dependency"
                    )
                state[dep] = 1
                stack.append((dep, iter(after[dep])))
                break
            else:
                stack.pop()
                state[b] = 2
                order.append(items[b])
    var_vals: dict[Variable, int] = {}
    for si in order:
        var_vals.update(si.var_vals)
    return order, var_vals


def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
    """The ordered kernels that realize `outs`."""
    return create_schedule_with_vars(outs)[0]
