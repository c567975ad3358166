"""MultiLazyBuffer: one logical array split across several devices (or replicated on each).

It answers the same methods as LazyBuffer, so every Function works on sharded tensors unchanged: each op runs
on every device's part. A reduction over the split axis adds the parts (an all-reduce) and leaves the result
replicated. Movement ops that would cut across the split axis first replicate the data.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Union

from tgcore.dtype import ConstType, DType
from tgcore.helpers import all_same, prod
from tgcore.lazy import LazyBuffer
from tgcore.ops import BinaryOps, ComposedOps, ReduceOps, TernaryOps, UnaryOps
from tgcore.shape.symbolic import sint


def _split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of `parts` chunks covering `total` elements, as equal as possible, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class MultiLazyBuffer:
    """The parts of a logical array, one LazyBuffer per device, split along `axis` (None: each holds it all)."""

    def __init__(self, lbs: list[LazyBuffer], axis: Optional[int]) -> None:
        if not lbs:
            raise ValueError("a MultiLazyBuffer needs at least one part")
        if not all_same([x.dtype for x in lbs]):
            raise TypeError(f"the parts of a MultiLazyBuffer must share a dtype, got {[x.dtype for x in lbs]}")
        if axis is None and not all_same([x.shape for x in lbs]):
            raise ValueError(f"replicated parts must share a shape, got {[x.shape for x in lbs]}")
        self.lbs, self.axis, self.dtype = lbs, axis, lbs[0].dtype
        self.device = tuple(x.device for x in lbs)
        shape = list(lbs[0].shape)
        if axis is not None:
            shape[axis] = sum(x.shape[axis] for x in lbs)
        self.shape: tuple[sint, ...] = tuple(shape)
        self.size = prod(self.shape)
        self.bounds = (
            list(itertools.pairwise(itertools.accumulate([x.shape[axis] for x in lbs], initial=0)))
            if axis is not None
            else None
        )

    def __repr__(self) -> str:
        return f"<MLB axis={self.axis} {self.shape} {self.dtype} on {self.device}>"

    @staticmethod
    def from_sharded(lb: LazyBuffer, devices: tuple[str, ...], axis: Optional[int]) -> MultiLazyBuffer:
        """Split `lb` along `axis` over `devices` (or copy it whole to each when axis is None)."""
        if axis is None:
            return MultiLazyBuffer([lb.copy_to_device(d) for d in devices], None)
        if not isinstance(lb.shape[axis], int):
            raise ValueError(f"cannot shard along the symbolic axis {axis} of shape {lb.shape}")
        parts, start = [], 0
        for d, size in zip(devices, _split_sizes(lb.shape[axis], len(devices))):
            arg = tuple((start, start + size) if i == axis else (0, s) for i, s in enumerate(lb.shape))
            parts.append(lb.shrink(arg).copy_to_device(d))
            start += size
        return MultiLazyBuffer(parts, axis)

    def copy_to_device(self, device: str) -> LazyBuffer:
        """The whole array on one device."""
        if self.axis is None:
            return self.lbs[0].copy_to_device(device)
        assert self.bounds is not None
        out: Optional[LazyBuffer] = None
        for lb, (start, end) in zip(self.lbs, self.bounds):
            pad = tuple(
                (start, self.shape[self.axis] - end) if i == self.axis else (0, 0) for i in range(len(self.shape))
            )
            part = lb.copy_to_device(device).pad(pad)
            out = part if out is None else out.e(BinaryOps.ADD, part)
        assert out is not None
        return out

    def replicated(self) -> MultiLazyBuffer:
        """The same array held whole on every device."""
        if self.axis is None:
            return self
        whole = self.copy_to_device(self.device[0])
        return MultiLazyBuffer([whole.copy_to_device(d) for d in self.device], None)

    def _on_shards_of(self, other: MultiLazyBuffer) -> MultiLazyBuffer:
        """This (replicated) array cut into the parts `other` holds."""
        assert self.axis is None and other.axis is not None and other.bounds is not None
        parts = []
        for lb, (start, end) in zip(self.lbs, other.bounds):
            parts.append(lb.shrink(tuple((start, end) if i == other.axis else (0, s) for i, s in enumerate(lb.shape))))
        return MultiLazyBuffer(parts, other.axis)

    # ***** the LazyBuffer interface *****

    @property
    def base(self) -> MultiLazyBuffer:
        return self

    @property
    def realized(self) -> Any:
        return None if any(x.base.realized is None for x in self.lbs) else True

    def is_unrealized_const(self) -> bool:
        return all(x.is_unrealized_const() for x in self.lbs)

    def is_unrealized_unmasked_const(self) -> bool:
        return all(x.is_unrealized_unmasked_const() for x in self.lbs)

    def const(self, val: ConstType, shape: Optional[tuple[sint, ...]] = None) -> MultiLazyBuffer:
        if shape is not None and shape != self.shape:
            return MultiLazyBuffer([x.const(val, shape) for x in self.lbs], None)
        return MultiLazyBuffer([x.const(val) for x in self.lbs], self.axis)

    def contiguous(self) -> MultiLazyBuffer:
        return MultiLazyBuffer([x.contiguous() for x in self.lbs], self.axis)

    def cast(self, dtype: DType, bitcast: bool = False) -> MultiLazyBuffer:
        return MultiLazyBuffer([x.cast(dtype, bitcast) for x in self.lbs], self.axis)

    def e(
        self, op: Union[UnaryOps, BinaryOps, TernaryOps], *in_srcs: MultiLazyBuffer, arg: Any = None
    ) -> MultiLazyBuffer:
        srcs = [self, *in_srcs]
        for s in srcs:
            if not isinstance(s, MultiLazyBuffer) or s.device != self.device:
                raise ValueError(
                    f"{op} needs operands sharded over the same devices, got {[getattr(x, 'device', x) for x in srcs]}"
                )
        axes = {s.axis for s in srcs if s.axis is not None}
        if len(axes) > 1 or (axes and not all_same([s.bounds for s in srcs if s.axis is not None])):
            srcs = [s.replicated() for s in srcs]  # parts split differently: work on whole copies
            axes = set()
        if axes:
            first = next(s for s in srcs if s.axis is not None)
            srcs = [s if s.axis is not None else s._on_shards_of(first) for s in srcs]
        axis = axes.pop() if axes else None
        return MultiLazyBuffer([lbs[0].e(op, *lbs[1:], arg=arg) for lbs in zip(*[s.lbs for s in srcs])], axis)

    def composed(self, op: ComposedOps) -> MultiLazyBuffer:
        return MultiLazyBuffer([x.composed(op) for x in self.lbs], self.axis)

    def r(self, op: ReduceOps, axis: tuple[int, ...]) -> MultiLazyBuffer:
        parts = [x.r(op, axis) for x in self.lbs]
        if self.axis is None or self.axis not in axis:
            return MultiLazyBuffer(parts, self.axis)
        # an all-reduce: every device combines every part
        combine = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
        out = []
        for d in self.device:
            acc = parts[0].copy_to_device(d)
            for p in parts[1:]:
                acc = acc.e(combine, p.copy_to_device(d))
            out.append(acc)
        return MultiLazyBuffer(out, None)

    def _part_shape(self, shape: tuple[sint, ...], lb: LazyBuffer, axis: Optional[int]) -> tuple[sint, ...]:
        return tuple(lb.shape[self.axis] if i == axis else s for i, s in enumerate(shape))

    def reshape(self, shape: tuple[sint, ...]) -> MultiLazyBuffer:
        if self.axis is None:
            return MultiLazyBuffer([x.reshape(shape) for x in self.lbs], None)
        before = prod(self.shape[: self.axis])
        new_axis = next(
            (i for i in range(len(shape)) if prod(shape[:i]) == before and shape[i] == self.shape[self.axis]), None
        )
        if new_axis is None:  # the split axis does not survive this reshape: work on whole copies
            return self.replicated().reshape(shape)
        return MultiLazyBuffer([x.reshape(self._part_shape(shape, x, new_axis)) for x in self.lbs], new_axis)

    def reshape_expand(self, reshaped: tuple[sint, ...], shape: tuple[sint, ...]) -> MultiLazyBuffer:
        return self.reshape(reshaped).expand(shape)

    def expand(self, shape: tuple[sint, ...]) -> MultiLazyBuffer:
        return MultiLazyBuffer([x.expand(self._part_shape(shape, x, self.axis)) for x in self.lbs], self.axis)

    def permute(self, order: tuple[int, ...]) -> MultiLazyBuffer:
        new_axis = order.index(self.axis) if self.axis is not None else None
        return MultiLazyBuffer([x.permute(order) for x in self.lbs], new_axis)

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> MultiLazyBuffer:
        if self.axis is not None and arg[self.axis] != (0, 0):
            return self.replicated().pad(arg)
        return MultiLazyBuffer([x.pad(arg) for x in self.lbs], self.axis)

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> MultiLazyBuffer:
        if self.axis is not None and arg[self.axis] != (0, self.shape[self.axis]):
            return self.replicated().shrink(arg)
        return MultiLazyBuffer([x.shrink(self._part_arg(arg, x)) for x in self.lbs], self.axis)

    def _part_arg(self, arg: tuple[tuple[sint, sint], ...], lb: LazyBuffer) -> tuple[tuple[sint, sint], ...]:
        return tuple((0, lb.shape[i]) if i == self.axis else a for i, a in enumerate(arg))

    def stride(self, arg: tuple[int, ...]) -> MultiLazyBuffer:
        if self.axis is not None and arg[self.axis] != 1:
            return self.replicated().stride(arg)
        return MultiLazyBuffer([x.stride(arg) for x in self.lbs], self.axis)

    def assign(self, x: MultiLazyBuffer) -> MultiLazyBuffer:
        """Write `x` into these parts; `x` is first split (or gathered) the way this array is."""
        if x.device != self.device:
            raise ValueError(f"assign needs the same devices, got {x.device} for {self.device}")
        if x.axis != self.axis:
            x = x.replicated()
            if self.axis is not None:
                x = x._on_shards_of(self)
        return MultiLazyBuffer([a.assign(b) for a, b in zip(self.lbs, x.lbs)], self.axis)
