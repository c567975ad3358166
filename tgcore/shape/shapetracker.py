"""ShapeTracker: a stack of Views describing how a logical shape is read from a flat buffer.

`views[0]` is the innermost view (it indexes the buffer); `views[-1]` is the outermost/current one
and gives `shape`. Each outer view produces a flat index that addresses the elements of the next
inner view's shape in C order. Movement ops (reshape, permute, expand, pad, shrink, stride) return
new ShapeTrackers; a reshape that cannot be expressed on the last view appends a new view.

`expr_idxs` turns per-axis index Nodes into (flat buffer index, validity) Nodes; see symbolic.py for
the node kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, cast

from tgcore.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, sint
from tgcore.shape.view import View, _canon, _plain_ints, _prod, strides_for_shape

_MOVES_KEPT = 16
_ADDED_KEPT = 1 << 15
# (a, b) -> a + b, for trackers without Variables
_ADDED: Dict[Tuple["ShapeTracker", "ShapeTracker"], "ShapeTracker"] = {}


def _view_expr(view: View, idxs: Sequence[Node]) -> Tuple[Node, Node]:
    """(flat index, validity) of one view for the given per-axis index nodes."""
    terms: List[sint] = [view.offset]
    terms += [i * st for i, st in zip(idxs, view.strides) if not (isinstance(st, int) and st == 0)]
    conds: List[Node] = []
    if view.mask is not None:
        for i, s, (b, e) in zip(idxs, view.shape, view.mask):
            if not (isinstance(b, int) and b == 0):
                conds.append(i >= b)
            if e != s:
                conds.append(i < e)
    return Node.sum(terms), Node.ands(conds)


def _unravel(shape: Sequence[sint], idx: Node) -> List[Node]:
    """Per-axis indices of a flat C-order index over `shape` (the outermost axis is not wrapped)."""
    first = next((i for i, s in enumerate(shape) if s != 1), None)
    ret: List[Node] = []
    acc: sint = 1
    for i in range(len(shape) - 1, -1, -1):
        s = shape[i]
        if s == 1:
            ret.append(NumNode(0))
            continue
        x = idx // acc
        ret.append(x if i == first else x % s)
        acc = _canon(acc * s)
    return [n if isinstance(n, Node) else NumNode(n) for n in reversed(ret)]


def _linear_coef(term: Node, var: Variable) -> Optional[sint]:
    """c when term == var * c with c free of var, else None."""
    if term == var:
        return 1
    if isinstance(term, MulNode):
        b = term.b
        if not (isinstance(b, Node) and var in b.vars()):
            c = _linear_coef(term.a, var)
            return None if c is None else _canon(c * b)
        if var not in term.a.vars():
            c = _linear_coef(b, var)
            return None if c is None else _canon(c * term.a)
    return None


def _view_real_size(v: View) -> int:
    if any(isinstance(s, int) and s == 0 for s in v.shape):
        return 0
    mask = v.mask if v.mask is not None else tuple((0, s) for s in v.shape)
    if any(b == e for b, e in mask):
        return 0

    def ub(x: sint) -> int:
        return x.max if isinstance(x, Node) else x

    hi = ub(v.offset) + sum(max(ub(_canon(st * (e - 1))), ub(_canon(st * b))) for st, (b, e) in zip(v.strides, mask))
    return max(0, hi + 1)


# trackers made on every op (LazyBuffer outputs, constants), memoized for int shapes; symbolic shapes are not kept: a
# bound Variable compares equal to its unbound self
_FROM_SHAPE: Dict[Tuple[int, ...], "ShapeTracker"] = {}
_BROADCAST: Dict[Tuple[int, ...], "ShapeTracker"] = {}


def _memoized(cache: dict, shape: Tuple[sint, ...], view: Callable[[Tuple[sint, ...]], View]) -> "ShapeTracker":
    if not _plain_ints(shape):
        return ShapeTracker((view(shape),))
    if (ret := cache.get(shape)) is None:
        if len(cache) >= 4096:
            cache.clear()
        ret = cache[shape] = ShapeTracker((view(shape),))
    return ret


@dataclass(frozen=True)
class ShapeTracker:
    views: Tuple[View, ...]

    def __post_init__(self):
        views = self.views
        if type(views) is not tuple or not views:
            raise ValueError(f"ShapeTracker needs a non-empty tuple of Views, got {views!r}")
        for v in views:
            if not isinstance(v, View):
                raise ValueError(f"ShapeTracker needs a non-empty tuple of Views, got {views!r}")

    def __hash__(self) -> int:  # computed once: shapetrackers are hashed in every schedule-cache key
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(self.views)
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> Dict[str, Any]:  # (a hash of Variables' names differs in another process: not pickled)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @staticmethod
    def from_shape(shape: Sequence[sint]) -> "ShapeTracker":
        """The contiguous tracker of `shape`."""
        return _memoized(_FROM_SHAPE, tuple(shape), View.create)

    @staticmethod
    def broadcast(shape: Sequence[sint]) -> "ShapeTracker":
        """A single element read at every index of `shape` (all strides 0): a constant's view."""
        return _memoized(_BROADCAST, tuple(shape), lambda s: View.create(s, (0,) * len(s)))

    # ---- info ---------------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[sint, ...]:
        return self.views[-1].shape

    @property
    def size(self) -> sint:
        """Number of elements of `shape` (a Node for symbolic shapes)."""
        d = self.__dict__  # computed once: a frozen dataclass may still keep a cache in its __dict__
        if "_size" not in d:
            object.__setattr__(self, "_size", _prod(self.shape))
        return d["_size"]

    def broadcasts(self) -> bool:
        """Whether the last view reads some element more than once: a stride-0 axis of size > 1 (an expand)."""
        v = self.views[-1]
        return any(stride == 0 and size != 1 for size, stride in zip(v.shape, v.strides))

    @property
    def contiguous(self) -> bool:
        return len(self.views) == 1 and self.views[0].contiguous

    def vars(self) -> Set[Variable]:
        ret: Set[Variable] = set()
        for v in self.views:
            ret |= v.vars()
        return ret

    def unbind(self) -> Tuple["ShapeTracker", Dict[Variable, int]]:
        """(this tracker with bound Variables replaced by unbound ones, {unbound Variable: value})."""
        views, vals = [], {}
        for v in self.views:
            nv, d = v.unbind()
            views.append(nv)
            vals.update(d)
        return ShapeTracker(tuple(views)), vals

    @property
    def var_vals(self) -> Dict[Variable, int]:
        return self.unbind()[1]

    # ---- index expressions -----------------------------------------------------------------------
    def _default_idxs(self) -> List[Node]:
        ret: List[Node] = []
        for i, s in enumerate(self.shape):
            hi = (s.max if isinstance(s, Node) else s) - 1
            ret.append(Variable(f"idx{i}", 0, hi) if hi > 0 else NumNode(0))
        return ret

    def expr_idxs(self, idxs: Optional[Sequence[sint]] = None) -> Tuple[Node, Node]:
        """(flat buffer index, validity) for one index per axis of `shape`; default idxs are
        Variables idx0, idx1, ... in [0, size-1]. Validity is NumNode(1) when always valid."""
        if idxs is None:
            idxs = self._default_idxs()
        nidxs: List[Node] = [NumNode(i) if isinstance(i, int) else i for i in idxs]
        if len(nidxs) != len(self.shape):
            raise ValueError(f"expr_idxs needs {len(self.shape)} indices, got {len(nidxs)}")
        idx, valid = _view_expr(self.views[-1], nidxs)
        for v in reversed(self.views[:-1]):
            idx, v_valid = _view_expr(v, _unravel(v.shape, idx))
            valid = Node.ands([valid, v_valid])
        return idx, valid

    def expr_node(self, idx: Optional[Node] = None) -> Tuple[Node, Node]:
        """expr_idxs from a single flat C-order index over `shape` (default Variable 'idx')."""
        if idx is None:
            size = self.size
            hi = (size.max if isinstance(size, Node) else size) - 1
            idx = Variable("idx", 0, hi) if hi > 0 else NumNode(0)
        return self.expr_idxs(_unravel(self.shape, idx))

    def axis_is_masked(self, axis: int) -> bool:
        """True when the validity depends on the index of `axis`."""
        _, valid = self.expr_idxs()
        return f"idx{axis}" in {v.expr for v in valid.vars()}

    def real_strides(self, ignore_valid: bool = False) -> Tuple[Optional[sint], ...]:
        """Per axis, the flat buffer stride when it is a single number (0 if the axis is not used),
        else None. Masked axes give None unless ignore_valid."""
        v = self.views[-1]
        if len(self.views) == 1:
            if v.mask is None or ignore_valid:
                return v.strides
            return tuple(None if (b, e) != (0, s) else st for st, s, (b, e) in zip(v.strides, v.shape, v.mask))
        idxs = self._default_idxs()
        idx, valid = self.expr_idxs(idxs)
        ret: List[Optional[sint]] = [0] * len(idxs)
        axis_of = {x: i for i, x in enumerate(idxs) if isinstance(x, Variable)}
        for term in idx.nodes if isinstance(idx, SumNode) else (idx,):
            used = [axis_of[x] for x in term.vars() if x in axis_of]
            if not used:
                continue
            if len(used) > 1:
                for i in used:
                    ret[i] = None
                continue
            i = used[0]
            c = _linear_coef(term, cast(Variable, idxs[i]))
            cur = ret[i]
            ret[i] = None if c is None or cur is None else _canon(cur + c)
        if not ignore_valid:
            for x in valid.vars():
                if x in axis_of:
                    ret[axis_of[x]] = None
        return tuple(ret)

    def unit_stride_axes(self, ignore_valid: bool = False) -> List[int]:
        return [i for i, st in enumerate(self.real_strides(ignore_valid)) if isinstance(st, int) and st == 1]

    def real_size(self) -> int:
        """1 + the largest flat buffer index a valid element reads (0 if none); an upper bound when
        there are several views or symbolic sizes (symbolic values count with their max)."""
        if any(isinstance(s, int) and s == 0 for s in self.shape):
            return 0
        ret = _view_real_size(self.views[0])
        if len(self.views) == 1 or ret == 0:
            return ret
        last = self.views[-1]
        mask = last.mask if last.mask is not None else tuple((0, s) for s in last.shape)
        if not all(isinstance(x, int) for m in mask for x in m):
            return ret
        if any(b >= e for b, e in mask):
            return 0
        imask = cast(Tuple[Tuple[int, int], ...], mask)
        idxs = [Variable(f"idx{i}", b, e - 1) if e - b > 1 else NumNode(b) for i, (b, e) in enumerate(imask)]
        try:
            idx, valid = self.expr_idxs(idxs)
        except ValueError:
            return ret
        if valid.max == 0:
            return 0
        return max(0, min(ret, idx.max + 1))

    # ---- combining ------------------------------------------------------------------------------
    def simplify(self) -> "ShapeTracker":
        """Merge the last two views while they can be expressed as one."""
        views = list(self.views)
        while len(views) >= 2:
            merged = views[-2] + views[-1]
            if merged is None:
                break
            views[-2:] = [merged]
        return self if len(views) == len(self.views) else ShapeTracker(tuple(views))

    def __add__(self, st: "ShapeTracker") -> "ShapeTracker":
        """Compose: `st` reads the elements of self.shape (flat, C order) as its buffer; the result
        reads self's buffer directly. Views of `st` go on top of self's, merged where possible."""
        if not isinstance(st, ShapeTracker):
            return NotImplemented
        # remembered for trackers without Variables (a bound Variable equals the unbound one, so a remembered sum
        # could carry another binding): the scheduler composes the same pairs for every kernel that reads a tensor
        plain = self._plain() and st._plain()
        if plain and (hit := _ADDED.get((self, st))) is not None:
            return hit
        ret = self
        for v in st.views:
            ret = ShapeTracker(ret.views + (v,)).simplify()
        if plain:
            if len(_ADDED) >= _ADDED_KEPT:
                _ADDED.clear()
            _ADDED[(self, st)] = ret
        return ret

    def _plain(self) -> bool:
        """Whether no view has a symbolic Variable (computed once)."""
        d = self.__dict__
        if "_plain_views" not in d:
            object.__setattr__(self, "_plain_views", not self.vars())
        return d["_plain_views"]

    def invert(self, out_shape: Sequence[sint]) -> Optional["ShapeTracker"]:
        """For a tracker that permutes/flips/reshapes a buffer of `out_shape`, the tracker that reads a
        buffer laid out in self.shape order back into `out_shape`; None if not invertible."""
        shapes = [v.shape for v in self.views[::-1][1:]] + [tuple(out_shape)]
        inv = []
        for v, s in zip(self.views[::-1], shapes):
            x = v._invert_flat(s)
            if x is None:
                return None
            inv.append(x)
        return ShapeTracker(tuple(inv)).reshape(tuple(out_shape))

    # ---- movement ops -----------------------------------------------------------------------------
    def _replace_last(self, v: View) -> "ShapeTracker":
        return ShapeTracker(self.views[:-1] + (v,))

    # the movement ops are remembered per tracker (up to _MOVES_KEPT each) for plain int arguments: a program moves
    # the same trackers the same way at every step (a sum of everything is four reshapes, a conv2d some 25 movement
    # ops), and a remembered result is the tracker of the last step, whose own moves are remembered in turn. Per
    # object, not in a global table, because a bound Variable compares equal to the unbound one and must not be
    # swapped for it.
    def _moved(self, key: Tuple[Any, ...], plain: bool, make: Callable[[], "ShapeTracker"]) -> "ShapeTracker":
        cache = self.__dict__.get("_moves")
        if cache is not None and (ret := cache.get(key)) is not None:
            return ret
        ret = make()
        if plain:
            if cache is None:
                object.__setattr__(self, "_moves", cache := {})
            if len(cache) < _MOVES_KEPT:
                cache[key] = ret
        return ret

    def reshape(self, new_shape: Sequence[sint]) -> "ShapeTracker":
        new_shape = tuple(new_shape)
        return self._moved(("reshape", new_shape), _plain_ints(new_shape), lambda: self._reshape(new_shape))

    def _reshape(self, new_shape: Tuple[sint, ...]) -> "ShapeTracker":
        nv = self.views[-1].reshape(new_shape)
        return self._replace_last(nv) if nv is not None else ShapeTracker(self.views + (View.create(new_shape),))

    def permute(self, axis: Sequence[int]) -> "ShapeTracker":
        axis = tuple(axis)
        return self._moved(("permute", axis), True, lambda: self._replace_last(self.views[-1].permute(axis)))

    def expand(self, new_shape: Sequence[sint]) -> "ShapeTracker":
        new_shape = tuple(new_shape)
        make = lambda: self._replace_last(self.views[-1].expand(new_shape))  # noqa: E731
        return self._moved(("expand", new_shape), _plain_ints(new_shape), make)

    def pad(self, arg: Sequence[Tuple[sint, sint]]) -> "ShapeTracker":
        arg = tuple(tuple(p) for p in arg)  # (lists of lists too: a key must hash)
        make = lambda: self._replace_last(self.views[-1].pad(arg))  # noqa: E731
        return self._moved(("pad", arg), _plain_pairs(arg), make)

    def shrink(self, arg: Sequence[Tuple[sint, sint]]) -> "ShapeTracker":
        arg = tuple(tuple(p) for p in arg)  # (lists of lists too: a key must hash)
        make = lambda: self._replace_last(self.views[-1].shrink(arg))  # noqa: E731
        return self._moved(("shrink", arg), _plain_pairs(arg), make)

    def stride(self, mul: Sequence[int]) -> "ShapeTracker":
        mul = tuple(mul)
        return self._moved(("stride", mul), True, lambda: self._replace_last(self.views[-1].stride(mul)))

    def window(self, axis: int, k: int, stride: int, dilation: int) -> "ShapeTracker":
        """Sliding windows along `axis` (size n): it becomes the o = (n - dilation * (k - 1) - 1) // stride + 1
        window positions, and a new last axis the k taps of each; element (.., i, .., j) is element
        stride * i + dilation * j of the axis. One view, whose index is affine in i and j, when the last view reads
        the axis unmasked; else a view on top of it (a padded axis: its mask is not a box in (i, j)). Remembered as
        the other movement ops are (a conv's windows, then the moves of their tracker, at every call)."""
        plain = all(type(a) is int for a in (axis, k, stride, dilation)) and _plain_ints(self.views[-1].shape)
        make = lambda: self._window(axis, k, stride, dilation)  # noqa: E731
        return self._moved(("window", axis, k, stride, dilation), plain, make)

    def _window(self, axis: int, k: int, stride: int, dilation: int) -> "ShapeTracker":
        last = self.views[-1]
        n = last.shape[axis]
        o = (n - dilation * (k - 1) - 1) // stride + 1
        new_shape = last.shape[:axis] + (o,) + last.shape[axis + 1 :] + (k,)
        st = last.strides[axis]
        if (last.mask is None or tuple(last.mask[axis]) == (0, n)) and isinstance(st, int):
            strides = last.strides[:axis] + (stride * st,) + last.strides[axis + 1 :] + (dilation * st,)
            mask = None
            if last.mask is not None:
                mask = tuple(last.mask[:axis]) + ((0, o),) + tuple(last.mask[axis + 1 :]) + ((0, k),)
            return self._replace_last(View.create(new_shape, strides, last.offset, mask))
        flat = strides_for_shape(last.shape)
        strides = flat[:axis] + (stride * flat[axis],) + flat[axis + 1 :] + (dilation * flat[axis],)
        return ShapeTracker(self.views + (View.create(new_shape, strides),)).simplify()

    def flip(self, axes: Sequence[int]) -> "ShapeTracker":
        axes = tuple(axes)
        return self._moved(("flip", axes), True, lambda: self._replace_last(self.views[-1].flip(axes)))


def _plain_pairs(arg: Tuple[Tuple[sint, ...], ...]) -> bool:
    """Every bound of a pad or shrink is a plain int (and each is a pair: the View checks and words anything else)."""
    return all(len(p) == 2 and type(p[0]) is int and type(p[1]) is int for p in arg)
