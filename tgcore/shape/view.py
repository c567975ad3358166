"""A View: one strided, optionally masked, window onto a flat buffer.

Element `(i0, i1, ...)` of a view (a position inside `shape`) is read from the flat buffer index
`offset + sum(i_k * strides[k])`, and is *valid* only when `mask[k][0] <= i_k < mask[k][1]` on every
axis (`mask is None` means everything is valid). Invalid elements read as zero (padding).

Views are canonical (built with `View.create`): size-1 axes have stride 0, a mask that covers the
whole shape is `None`, an axis whose mask keeps a single position gets stride 0 (its contribution is
folded into `offset`), and a view with an empty mask is the all-invalid view (strides 0, offset 0,
mask `(0, 0)` everywhere).

Composition (`vm2 + vm1`): `vm2` is the older/inner view (it indexes the buffer) and `vm1` the
newer/outer one (its flat index addresses the elements of `vm2.shape` in C order). The sum is a single
View equivalent to applying `vm1` then `vm2`, or None when no single view can express it.

Sizes, strides, offsets and mask bounds are `sint` (int or symbolic Node). Symbolic values are
supported where the answer is structurally clear; otherwise the methods that may return None do so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Set, Tuple, cast

from tgcore.shape.symbolic import Node, NumNode, Variable, sint

Mask = Tuple[Tuple[sint, sint], ...]


# ---- small local helpers (this module may not import tgcore.helpers) ----------------------------------


def _canon(x) -> sint:
    """int / Node normalisation: NumNode and bool become int."""
    if isinstance(x, NumNode):
        return x.b
    if isinstance(x, Node):
        return x
    if isinstance(x, int):
        return int(x)
    raise TypeError(f"expected an int or a symbolic Node, got {type(x).__name__}: {x!r}")


def _prod(xs: Sequence[sint]) -> sint:
    ret: sint = 1
    for x in xs:
        ret = _canon(ret * x)
    return ret


def _all_int(xs) -> bool:
    return all(isinstance(x, int) for x in xs)


def _nonneg(x: sint) -> bool:
    return x >= 0 if isinstance(x, int) else x.min >= 0


def _le(a: sint, b: sint) -> Optional[bool]:
    """a <= b if decidable from the bounds, else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    d = _canon(b - a)
    if isinstance(d, int):
        return d >= 0
    if d.min >= 0:
        return True
    if d.max < 0:
        return False
    return None


def _smax(a: sint, b: sint) -> sint:
    le = _le(a, b)
    if le is None:
        raise ValueError(f"cannot decide max({a}, {b}) for symbolic values")
    return b if le else a


def _smin(a: sint, b: sint) -> sint:
    le = _le(a, b)
    if le is None:
        raise ValueError(f"cannot decide min({a}, {b}) for symbolic values")
    return a if le else b


def _is_empty(b: sint, e: sint) -> bool:
    le = _le(e, b)
    return bool(le)


def _same_size(a: Sequence[sint], b: Sequence[sint]) -> bool:
    pa, pb = _prod(a), _prod(b)
    if isinstance(pa, int) and isinstance(pb, int):
        return pa == pb
    if pa == pb:
        return True
    if isinstance(pa, int) or isinstance(pb, int):
        pa, pb = Node.sum([pa]), Node.sum([pb])
    vs = pa.vars() | pb.vars()
    if all(v.val is not None for v in vs):  # bound variables: a concrete shape may become a symbolic one
        vals = {v: v.val for v in vs}
        return pa.evaluate(vals) == pb.evaluate(vals)
    for pick in (lambda v: v.min, lambda v: v.max):
        vals = {v: pick(v) for v in vs}
        if pa.evaluate(vals) != pb.evaluate(vals):
            return False
    return True


def strides_for_shape(shape: Sequence[sint]) -> Tuple[sint, ...]:
    """C-contiguous strides, with 0 for size-1 axes."""
    acc: sint = 1
    ret: List[sint] = []
    for s in reversed(shape):
        ret.append(0 if s == 1 else acc)
        acc = _canon(acc * s)
    return tuple(reversed(ret))


def _check_shape(shape: Sequence[sint], what: str = "shape") -> Tuple[sint, ...]:
    try:
        shape = tuple(_canon(s) for s in shape)
    except TypeError as e:
        raise ValueError(f"invalid {what}: {e}") from None
    for s in shape:
        if not _nonneg(s):
            raise ValueError(f"{what} {shape} has a negative size")
    return shape


def _ceil_div(a: sint, m: int) -> sint:
    return _canon((a + (m - 1)) // m)


def _plain_ints(xs: Sequence) -> bool:
    for x in xs:  # a plain loop: this runs for every view made, and beats all() over a generator
        if type(x) is not int:
            return False
    return True


_CREATE_CACHE: dict = {}
_CREATE_CACHE_MAX = 1 << 16


# ---- View ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    shape: Tuple[sint, ...]
    strides: Tuple[sint, ...]
    offset: sint
    mask: Optional[Mask]
    contiguous: bool

    @staticmethod
    def create(
        shape: Sequence[sint],
        strides: Optional[Sequence[sint]] = None,
        offset: sint = 0,
        mask: Optional[Sequence[Tuple[sint, sint]]] = None,
    ) -> "View":
        """The canonical View (see the module docstring); strides default to C-contiguous."""
        # Views are immutable, so the all-int case (nearly every view a program builds) is memoized. Symbolic
        # arguments are not: a bound Variable compares equal to the unbound one but must not be swapped for it.
        if (
            type(offset) is int
            and _plain_ints(shape)
            and (strides is None or _plain_ints(strides))
            and (mask is None or all(_plain_ints(m) for m in mask))
        ):
            key = (
                tuple(shape),
                None if strides is None else tuple(strides),
                offset,
                None if mask is None else tuple(tuple(m) for m in mask),
            )
            ret = _CREATE_CACHE.get(key)
            if ret is None:
                if len(_CREATE_CACHE) >= _CREATE_CACHE_MAX:
                    _CREATE_CACHE.clear()
                ret = _CREATE_CACHE[key] = View._create(shape, strides, offset, mask)
            return ret
        return View._create(shape, strides, offset, mask)

    @staticmethod
    def _create(shape, strides, offset, mask) -> "View":
        shape = _check_shape(shape)
        n = len(shape)
        if strides is None:
            strides = strides_for_shape(shape)
        else:
            strides = tuple(_canon(st) for st in strides)
            if len(strides) != n:
                raise ValueError(f"strides {strides} do not match shape {shape}")
        strides = tuple(0 if s == 1 else st for s, st in zip(shape, strides))
        offset = _canon(offset)
        if mask is not None:
            mask = tuple((_canon(b), _canon(e)) for b, e in mask)
            if len(mask) != n:
                raise ValueError(f"mask {mask} does not match shape {shape}")
            for (b, e), s in zip(mask, shape):
                if _le(0, b) is False or _le(e, s) is False:
                    raise ValueError(f"mask {mask} out of bounds for shape {shape}")
            if any(_is_empty(b, e) for b, e in mask):
                return View(shape, (0,) * n, 0, ((0, 0),) * n, False)
            # an axis restricted to one position: fold its contribution into the offset
            new_strides = list(strides)
            for i, (b, e) in enumerate(mask):
                if _canon(e - b) == 1 and new_strides[i] != 0:
                    offset = _canon(offset + b * new_strides[i])
                    new_strides[i] = 0
            strides = tuple(new_strides)
            if all(b == 0 and e == s for (b, e), s in zip(mask, shape)):
                mask = None
        contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
        return View(shape, strides, offset, mask, contiguous)

    def __hash__(self) -> int:  # computed once: views are hashed in every schedule-cache key
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.shape, self.strides, self.offset, self.mask, self.contiguous))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # (a hash of Variables' names differs in another process: not pickled)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # ---- info ---------------------------------------------------------------------------------
    def size(self) -> int:
        """Number of elements (symbolic sizes count with their max)."""
        ret = 1
        for s in self.shape:
            ret *= s.max if isinstance(s, Node) else s
        return ret

    def vars(self) -> Set[Variable]:
        ret: Set[Variable] = set()
        for x in self._sints():
            if isinstance(x, Node):
                ret |= x.vars()
        return ret

    def _sints(self) -> List[sint]:
        return (
            list(self.shape)
            + list(self.strides)
            + [self.offset]
            + ([x for m in self.mask for x in m] if self.mask is not None else [])
        )

    def substitute(self, var_vals) -> "View":
        """Replace Variables in shape/strides/offset/mask (e.g. to unbind them)."""

        def sub(x):
            return _canon(x.substitute(var_vals)) if isinstance(x, Node) else x

        return View.create(
            tuple(sub(s) for s in self.shape),
            tuple(sub(s) for s in self.strides),
            sub(self.offset),
            None if self.mask is None else tuple((sub(b), sub(e)) for b, e in self.mask),
        )

    def unbind(self) -> Tuple["View", dict]:
        """(this view with bound Variables replaced by unbound ones, {Variable: value})."""
        bound = {v: v.unbind() for v in self.vars() if v.val is not None}
        if not bound:
            return self, {}
        return self.substitute({v: u for v, (u, _) in bound.items()}), {u: val for u, val in bound.values()}

    def _mask_or_full(self) -> Mask:
        return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

    # ---- movement ops -------------------------------------------------------------------------
    def _check_len(self, arg, what: str) -> tuple:
        arg = tuple(arg)
        if len(arg) != len(self.shape):
            raise ValueError(f"{what} {arg} needs {len(self.shape)} axes for shape {self.shape}")
        return arg

    def permute(self, axis: Sequence[int]) -> "View":
        axis = self._check_len(axis, "permute")
        if sorted(axis) != list(range(len(self.shape))):
            raise ValueError(f"permute {axis} is not a permutation of {len(self.shape)} axes")
        return View.create(
            tuple(self.shape[a] for a in axis),
            tuple(self.strides[a] for a in axis),
            self.offset,
            None if self.mask is None else tuple(self.mask[a] for a in axis),
        )

    def expand(self, new_shape: Sequence[sint]) -> "View":
        new_shape = self._check_len(_check_shape(new_shape, "expand shape"), "expand")
        if new_shape == self.shape:
            return self
        mask = []
        for s, ns, (b, e) in zip(self.shape, new_shape, self._mask_or_full()):
            if s == ns:
                mask.append((b, e))
            elif s == 1:
                mask.append((0, ns) if (b, e) != (0, 0) else (0, 0))
            else:
                raise ValueError(f"cannot expand {self.shape} to {new_shape}: only size-1 axes can grow")
        strides = tuple(0 if s != ns else st for s, ns, st in zip(self.shape, new_shape, self.strides))
        return View.create(new_shape, strides, self.offset, None if self.mask is None else tuple(mask))

    def pad(self, arg: Sequence[Tuple[sint, sint]]) -> "View":
        arg = self._check_len(arg, "pad")
        arg = tuple((_canon(b), _canon(a)) for b, a in arg)
        if any(not (_nonneg(b) and _nonneg(a)) for b, a in arg):
            raise ValueError(f"pad {arg} has a negative amount")
        if all(b == 0 and a == 0 for b, a in arg):
            return self
        shape = tuple(_canon(s + b + a) for s, (b, a) in zip(self.shape, arg))
        mask = tuple((_canon(mb + b), _canon(me + b)) for (mb, me), (b, _) in zip(self._mask_or_full(), arg))
        offset = _canon(self.offset - sum((b * st for (b, _), st in zip(arg, self.strides)), 0))
        return View.create(shape, self.strides, offset, mask)

    def shrink(self, arg: Sequence[Tuple[sint, sint]]) -> "View":
        arg = self._check_len(arg, "shrink")
        arg = tuple((_canon(b), _canon(e)) for b, e in arg)
        for (b, e), s in zip(arg, self.shape):
            if _le(0, b) is False or _le(b, e) is False or _le(e, s) is False:
                raise ValueError(f"shrink {arg} out of bounds for shape {self.shape}")
        if all(b == 0 and e == s for (b, e), s in zip(arg, self.shape)):
            return self
        shape = tuple(_canon(e - b) for b, e in arg)
        offset = _canon(self.offset + sum((b * st for (b, _), st in zip(arg, self.strides)), 0))
        mask: Optional[Mask] = None
        if self.mask is not None:
            new_mask = []
            for (mb, me), (b, e) in zip(self.mask, arg):
                nb, ne = _canon(_smax(mb, b) - b), _canon(_smin(me, e) - b)
                if _is_empty(nb, ne):
                    nb, ne = 0, 0
                new_mask.append((nb, ne))
            mask = tuple(new_mask)
        return View.create(shape, self.strides, offset, mask)

    def stride(self, mul: Sequence[int]) -> "View":
        mul = self._check_len(mul, "stride")
        if any(not isinstance(m, int) or m == 0 for m in mul):
            raise ValueError(f"stride {mul} needs nonzero ints")
        shape = tuple(s if abs(m) == 1 else _ceil_div(s, abs(m)) for s, m in zip(self.shape, mul))
        strides = tuple(_canon(st * m) for st, m in zip(self.strides, mul))
        flipped = ((s - 1) * st for s, st, m in zip(self.shape, self.strides, mul) if m < 0)
        offset = _canon(self.offset + sum(flipped, 0))
        mask: Optional[Mask] = None
        if self.mask is not None:
            new_mask = []
            for (b, e), s, m in zip(self.mask, self.shape, mul):
                if m < 0:
                    b, e = _canon(s - e), _canon(s - b)
                am = abs(m)
                new_mask.append((b, e) if am == 1 else (_ceil_div(b, am), _ceil_div(e, am)))
            mask = tuple(new_mask)
        return View.create(shape, strides, offset, mask)

    def flip(self, axes: Sequence[int]) -> "View":
        """Reverse the given axes (a stride of -1)."""
        return self.stride(tuple(-1 if i in axes else 1 for i in range(len(self.shape))))

    # ---- reshape ------------------------------------------------------------------------------
    def reshape(self, new_shape: Sequence[sint]) -> Optional["View"]:
        """The same elements under `new_shape` (C order) as one View, or None if that needs two views."""
        new_shape = _check_shape(new_shape, "reshape shape")
        if new_shape == self.shape:
            return self
        if not _same_size(self.shape, new_shape):
            raise ValueError(f"cannot reshape {self.shape} to {new_shape}: different number of elements")
        if self.contiguous:
            return View.create(new_shape)
        if any(s == 0 for s in self.shape):
            return View.create(new_shape)
        if self.mask is not None and any(_is_empty(b, e) for b, e in self.mask):
            return _all_invalid(new_shape)
        old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self._mask_or_full()) if s != 1]
        new = [s for s in new_shape if s != 1]
        blocks = _group_blocks([s for s, _, _ in old], new)
        if blocks is None:
            return None
        new_strides: List[sint] = []
        new_mask: List[Tuple[sint, sint]] = []
        offset = self.offset
        oi = 0
        for n_old, new_sizes in blocks:
            r = _reshape_block(old[oi : oi + n_old], new_sizes)
            if r is None:
                return None
            strides, mask, delta = r
            oi += n_old
            new_strides += strides
            new_mask += mask
            offset = _canon(offset + delta)
        it_st, it_m = iter(new_strides), iter(new_mask)
        strides_out: List[sint] = []
        mask_out: List[Tuple[sint, sint]] = []
        for s in new_shape:
            if s == 1:
                strides_out.append(0)
                mask_out.append((0, 1))
            else:
                strides_out.append(next(it_st))
                mask_out.append(next(it_m))
        return View.create(new_shape, strides_out, offset, None if self.mask is None else mask_out)

    # ---- merge, invert, minify --------------------------------------------------------------------
    def __add__(self, vm1: "View") -> Optional["View"]:
        """self (vm2, inner/older) + vm1 (outer/newer) -> one equivalent View, or None."""
        if not isinstance(vm1, View):
            return NotImplemented
        vm2 = self
        if vm2.contiguous:
            return vm1
        if vm1.contiguous and vm1.shape == vm2.shape:
            return vm2
        if vm1.contiguous and _same_size(vm1.shape, vm2.shape):
            return vm2.reshape(vm1.shape)
        all_invalid = _all_invalid(vm1.shape)
        if any(s == 0 for s in vm1.shape):
            return View.create(vm1.shape)
        if vm2.mask is not None and any(_is_empty(b, e) for b, e in vm2.mask):
            return all_invalid
        if vm1.mask is not None:
            if any(_is_empty(b, e) for b, e in vm1.mask):
                return all_invalid
            merged = vm2 + vm1.shrink(vm1.mask)
            if merged is None:
                return None
            return merged.pad(tuple((b, _canon(s - e)) for (b, e), s in zip(vm1.mask, vm1.shape)))
        if not all(_all_int(v._sints()) for v in (vm1, vm2)):
            return None
        return _merge_affine(vm2, vm1)

    def invert(self, out_shape: Sequence[sint]) -> Optional["View"]:
        """For a view that is a permutation/flip of a buffer laid out as `out_shape`, the View over
        `out_shape` that reads, from a buffer laid out in `self.shape` order, the element that `self`
        placed there (so `self` followed by the inverse is the identity). None if not invertible."""
        x = self._invert_flat(out_shape)
        return None if x is None else x.reshape(out_shape)

    def _invert_flat(self, out_shape: Sequence[sint]) -> Optional["View"]:
        out_shape = _check_shape(out_shape, "out_shape")
        if self.mask is not None or not _all_int(self._sints()) or not _all_int(out_shape):
            return None
        if not _same_size(self.shape, out_shape):
            return None
        if any(st == 0 for s, st in zip(self.shape, self.strides) if s != 1):
            return None
        flips = tuple(-1 if st < 0 else 1 for st in self.strides)
        istrides = cast(Tuple[int, ...], self.strides)
        order = sorted(range(len(self.shape)), key=lambda i: -abs(istrides[i]))
        if not self.stride(flips).permute(order).contiguous:
            return None
        return View.create(self.shape).stride(flips).permute(order)

    def minify(self) -> "View":
        """An equivalent View with mergeable neighbouring axes (and size-1 axes) merged."""
        groups: List[List[int]] = []
        for i, s in enumerate(self.shape):
            if s == 1:
                continue
            if groups:
                j = groups[-1][-1]
                unmasked = self.mask is None or (self.mask[j] == (0, self.shape[j]) and self.mask[i] == (0, s))
                if unmasked and self.strides[j] == _canon(self.strides[i] * s):
                    groups[-1].append(i)
                    continue
            groups.append([i])
        new_shape = tuple(_prod([self.shape[i] for i in g]) for g in groups)
        if not new_shape and self.shape:
            new_shape = (1,)
        if new_shape == self.shape:
            return self
        ret = self.reshape(new_shape)
        return self if ret is None else ret


def _all_invalid(shape: Tuple[sint, ...]) -> Optional[View]:
    """The view where nothing is valid; None for 0-d shapes, where a mask cannot say so."""
    return View.create(shape, mask=((0, 0),) * len(shape)) if shape else None


# ---- reshape internals ------------------------------------------------------------------------------


def _group_blocks(old: List[sint], new: List[sint]) -> Optional[List[Tuple[int, List[sint]]]]:
    """Split old and new sizes (no 1s) into consecutive blocks with equal products:
    [(number of old axes, new sizes), ...], or None."""
    blocks: List[Tuple[int, List[sint]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        if i >= len(old) or j >= len(new):
            return None
        po, pn = old[i], new[j]
        n_old, sizes = 1, [new[j]]
        i, j = i + 1, j + 1
        while po != pn:
            if isinstance(po, int) and isinstance(pn, int):
                grow_old = po < pn
            elif isinstance(po, Node) and isinstance(pn, Node):
                if po.max == pn.max:
                    return None
                grow_old = po.max < pn.max
            else:
                grow_old = isinstance(po, int)
            if grow_old:
                if i >= len(old):
                    return None
                po, n_old, i = _canon(po * old[i]), n_old + 1, i + 1
            else:
                if j >= len(new):
                    return None
                pn = _canon(pn * new[j])
                sizes.append(new[j])
                j += 1
        blocks.append((n_old, sizes))
    return blocks


def _exact_div(a: sint, b: sint) -> Optional[sint]:
    """a / b when it divides exactly (and is recognisable symbolically), else None."""
    if isinstance(b, int) and b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a // b if a % b == 0 else None
    if a == 0:
        return 0
    if a == b:
        return 1
    if isinstance(b, int):
        q = _canon(a // b)
        return q if _canon(q * b) == a else None
    try:
        q = _canon(a // b)
    except ValueError:
        return None
    return q if _canon(q * b) == a else None


def _reshape_block(axes: List[Tuple[sint, sint, Tuple[sint, sint]]], new_sizes: List[sint]):
    """Merge old axes (size, stride, mask) into one flat axis and split it into new_sizes.
    Returns (strides, masks, offset delta) or None."""
    if len(axes) == 1 and len(new_sizes) == 1:
        return [axes[0][1]], [axes[0][2]], 0
    n = len(axes)
    C: List[sint] = [1] * n
    for k in range(n - 2, -1, -1):
        C[k] = _canon(C[k + 1] * axes[k + 1][0])
    full = [b == 0 and e == s for s, _, (b, e) in axes]
    width = [_canon(e - b) for _, _, (b, e) in axes]
    if not all(full) and not _all_int([x for s, _, m in axes for x in (s, *m)] + list(new_sizes)):
        return None
    wide = [not (w == 1) for w in width]
    # the stride of one step of the flat axis
    S: sint = 0
    for k in range(n - 1, -1, -1):
        if wide[k]:
            q = _exact_div(axes[k][1], C[k])
            if q is None:
                return None
            S = q
            break
    delta: sint = 0
    for k in range(n):
        want = _canon(S * C[k])
        if wide[k]:
            if axes[k][1] != want:
                return None
        else:
            delta = _canon(delta + axes[k][2][0] * (axes[k][1] - want))
    # the flat mask must be one contiguous range
    flat_mask: Optional[Tuple[int, int]] = None
    if not all(full):
        k0 = max(k for k in range(n) if not full[k])
        if any(width[k] != 1 for k in range(k0)):
            return None
        fb = cast(int, sum(axes[k][2][0] * C[k] for k in range(n)))
        flat_mask = (fb, fb + cast(int, width[k0] * C[k0]))
    m = len(new_sizes)
    D: List[sint] = [1] * m
    for k in range(m - 2, -1, -1):
        D[k] = _canon(D[k + 1] * new_sizes[k + 1])
    strides = [_canon(S * d) for d in D]
    masks: Optional[List[Tuple[sint, sint]]]
    if flat_mask is None:
        masks = [(0, s) for s in new_sizes]
    else:
        split = _split_mask(flat_mask[0], flat_mask[1], cast(List[int], new_sizes))
        masks = cast(Optional[List[Tuple[sint, sint]]], split)
        if masks is None:
            return None
    return strides, masks, delta


def _split_mask(b: int, e: int, sizes: List[int]) -> Optional[List[Tuple[int, int]]]:
    """The flat range [b, e) over C-ordered `sizes` as a per-axis box, or None if it is not a box."""
    if len(sizes) == 1:
        return [(b, e)]
    inner = math.prod(sizes[1:])
    if b % inner == 0 and e % inner == 0:
        return [(b // inner, e // inner)] + [(0, s) for s in sizes[1:]]
    q = b // inner
    if q == (e - 1) // inner:
        rest = _split_mask(b - q * inner, e - q * inner, sizes[1:])
        return None if rest is None else [(q, q + 1)] + rest
    return None


# ---- merging two views (ints only) ------------------------------------------------------------


def _unravel(x: int, shape: Tuple[int, ...], C: List[int]) -> List[int]:
    """Greedy mixed-radix digits of x (size-1 axes get 0; the outermost digit is unbounded)."""
    neg = x < 0
    x = abs(x)
    ret = [0] * len(shape)
    for k, s in enumerate(shape):
        if s == 1:
            continue
        ret[k], x = divmod(x, C[k])
    return [-d for d in ret] if neg else ret


def _merge_affine(vm2: View, vm1: View) -> Optional[View]:
    """vm1 unmasked, everything int: vm1's flat index mapped through vm2's coordinates, if affine."""
    shape2 = cast(Tuple[int, ...], vm2.shape)
    C = [1] * len(shape2)
    for k in range(len(shape2) - 2, -1, -1):
        C[k] = C[k + 1] * shape2[k + 1]
    off1 = cast(int, vm1.offset)
    if off1 < 0:
        return None
    o = _unravel(off1, shape2, C)
    d = [_unravel(st, shape2, C) for st in cast(Tuple[int, ...], vm1.strides)]
    n1 = cast(Tuple[int, ...], vm1.shape)
    for k, s2 in enumerate(shape2):
        lo = o[k] + sum(min(0, (n - 1) * di[k]) for n, di in zip(n1, d))
        hi = o[k] + sum(max(0, (n - 1) * di[k]) for n, di in zip(n1, d))
        if lo < 0 or hi > s2 - 1:
            return None
    strides = tuple(sum(di[k] * vm2.strides[k] for k in range(len(shape2))) for di in d)
    offset = vm2.offset + sum(o[k] * vm2.strides[k] for k in range(len(shape2)))
    if vm2.mask is None:
        return View.create(n1, strides, offset)
    mask = [[0, n] for n in n1]
    for k, ((b, e), s2) in enumerate(zip(vm2.mask, shape2)):
        if b == 0 and e == s2:
            continue
        deps = [i for i, di in enumerate(d) if di[k] != 0 and n1[i] != 1]
        if not deps:
            if not b <= o[k] < e:
                return _all_invalid(n1)
            continue
        if len(deps) > 1:
            return None
        i = deps[0]
        c = d[i][k]
        if c > 0:
            lo, hi = -((o[k] - b) // c), -((o[k] - e) // c)
        else:
            lo, hi = (o[k] - e) // -c + 1, (o[k] - b) // -c + 1
        mask[i][0] = max(mask[i][0], lo)
        mask[i][1] = min(mask[i][1], hi)
    fixed = []
    for (lo, hi), n in zip(mask, n1):
        lo, hi = min(max(lo, 0), n), min(max(hi, 0), n)
        fixed.append((lo, max(lo, hi)))
    return View.create(n1, strides, offset, tuple(fixed))
