"""LazyBuffer: a node of the lazy graph. Nothing computes until a schedule realizes it.

A *base* LazyBuffer holds an op (elementwise, reduce, or a LoadOps) and its sources and owns a Buffer. A *view*
LazyBuffer is a ShapeTracker over a base (movement ops never compute; they only change how a base is read).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Optional, Union

import numpy as np

from tgcore import storage
from tgcore.device import MAX_BUFFER_BYTES, Buffer, Device
from tgcore.dtype import ConstType, DType, dtypes, truncate
from tgcore.ops import (
    COMPOSITIONS,
    BinaryOps,
    ComposedOps,
    IndexOps,
    LoadOps,
    Op,
    ReduceOps,
    TernaryOps,
    UnaryOps,
    exec_alu,
)
from tgcore.registry import plugins
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import Node, sint
from tgcore.shape.view import _plain_ints


class LazyBuffer:
    """A lazily computed array on a device: a base with an op, or a view of a base."""

    # checks of the data this base is computed from (engine/schedule.py): (a 0-d int32 count of invalid values, the
    # error to raise when it is not 0, its message); realizing the base, or anything read from it, computes each
    # count first, on the device, and raises before any kernel that reads the invalid data runs
    checks: tuple[tuple[LazyBuffer, type, str], ...] = ()
    # weak references to the bases that read this one (set on the first): a kernel that writes this base's memory
    # (an ASSIGN) first computes those not yet computed, so they see the old contents (engine/schedule.py)
    readers: list[weakref.ref[LazyBuffer]]

    def __init__(
        self,
        device: str,
        st: ShapeTracker,
        dtype: DType,
        op: Optional[Op] = None,
        arg: Any = None,
        srcs: tuple[LazyBuffer, ...] = (),
        base: Optional[LazyBuffer] = None,
    ) -> None:
        self.device, self.st, self.dtype = device, st, dtype
        self.shape: tuple[sint, ...] = st.shape
        self.size = st.size
        self._base = base
        if base is None:
            # a dict get by the dtype object's id: no Python call (DType hashes in Python) for a dtype seen before
            if (supported := _SUPPORTED.get(device)) is None or supported.get(id(dtype)) is not dtype:
                _check_dtype(device, dtype)
            self.op, self.arg, self.srcs = op, arg, srcs
            for src in srcs:  # each base this one reads learns of it (an assign into that base computes it first)
                b = src._base or src
                if (readers := b.__dict__.get("readers")) is None:
                    b.readers = readers = []
                elif len(readers) >= 64 and not len(readers) & 63:
                    readers[:] = [r for r in readers if r() is not None]
                readers.append(weakref.ref(self))
            self.realized: Optional[Buffer] = None
            self.forced_realize = False  # realize this base even if it could be fused into its readers
            # an ASSIGN writes into the buffer of its target, another LoadOps (EMPTY, COPY, ...) has its own; an op
            # that computes gets its Buffer when first asked (__getattr__): most are computed inside the kernels that
            # read them and never need one, and a constant is folded into them. A size too large for any buffer fails
            # here, where the tensor is made
            if op is LoadOps.ASSIGN:
                self.buffer = srcs[1].base.buffer
            elif isinstance(op, LoadOps) and op is not LoadOps.CONST:
                size = self.size
                self.buffer = Buffer(device, size if type(size) is int else _max_size(size), dtype)
            elif op is not LoadOps.CONST and type(size := self.size) is int:
                if size * dtype.itemsize > MAX_BUFFER_BYTES:
                    Buffer(device, size, dtype)  # (raises, saying why)
        else:
            if base._base is not None:
                raise ValueError("a view's base must be a base LazyBuffer")

    def __getattr__(self, name: str) -> Any:  # only called for attributes not set: a base's Buffer, on first use
        if name == "buffer" and self.__dict__.get("_base", 0) is None and "op" in self.__dict__:
            return self.new_buffer()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def new_buffer(self) -> Buffer:
        """A base's Buffer, made now (the scheduler asks for its outputs' this way: through __getattr__, the failed
        attribute lookup first cost 2.5 us a kernel)."""
        self.buffer = buffer = Buffer(self.device, _max_size(self.size), self.dtype)
        return buffer

    def __repr__(self) -> str:
        if self._base is not None:
            return f"<LB view {self.device} {self.shape} {self.dtype} of {self._base!r}>"
        state = "realized" if self.realized is not None else f"{self.op}"
        return f"<LB {self.device} {self.shape} {self.dtype} {state}>"

    @property
    def base(self) -> LazyBuffer:
        return self._base if self._base is not None else self

    @property
    def is_realized(self) -> bool:
        return self.base.realized is not None

    # ***** creation *****

    @staticmethod
    def loadop(
        op: LoadOps,
        shape: tuple[sint, ...],
        dtype: DType,
        device: str,
        arg: Any = None,
        srcs: tuple[LazyBuffer, ...] = (),
    ) -> LazyBuffer:
        """A base LazyBuffer made by a LoadOps (EMPTY, CONST, CUSTOM, ...)."""
        if op is LoadOps.CONST and not isinstance(arg, Node):
            arg = truncate(arg, dtype)
        return LazyBuffer(device, ShapeTracker.from_shape(shape), dtype, op, arg, srcs)

    @staticmethod
    def fromcpu(x: np.ndarray, device: str, dtype: Optional[DType] = None) -> LazyBuffer:
        """A realized LazyBuffer holding a copy of the numpy array `x`."""
        dt = dtype or dtypes.from_np(x.dtype)
        ret = LazyBuffer.loadop(LoadOps.EMPTY, x.shape, dt, device)
        ret.buffer.allocate().copyin(memoryview(np.ascontiguousarray(x).data))
        ret.realized = ret.buffer
        return ret

    def const(self, val: ConstType, shape: Optional[tuple[sint, ...]] = None) -> LazyBuffer:
        """A constant of this buffer's dtype and device, broadcast to `shape` (default: this shape)."""
        shape = self.shape if shape is None else shape
        vtype = type(val)
        key: Optional[tuple[Any, ...]] = None
        if (
            (vtype is int or vtype is bool or (vtype is float and val == val))  # a NaN is not kept: it equals nothing
            and type(shape) is tuple
            and shape
            and _plain_ints(shape)
        ):
            # 0.0 and -0.0 by their bits (they compare equal); True and 1 differ by type
            key = (val.hex() if vtype is float and val == 0.0 else val, vtype, self.dtype.name, self.device, shape)  # type: ignore[union-attr]
            view = _CONSTS.get(key)
            if (
                view is not None
                and view.base.realized is None
                and (view.dtype is self.dtype or view.dtype == self.dtype)
            ):
                return view
        base = LazyBuffer.loadop(LoadOps.CONST, (), self.dtype, self.device, arg=val)
        if not shape:
            return base
        st = ShapeTracker.broadcast(shape)  # the broadcast, built in one step
        if st.size == 0:
            return base.reshape((1,) * len(shape)).expand(shape)
        view = LazyBuffer(self.device, st, self.dtype, base=base)
        if key is not None:
            base.shared = True  # read by every graph that asks for this constant: never written through a view
            if len(_CONSTS) >= _CONSTS_SIZE:
                _CONSTS.pop(next(iter(_CONSTS)))
            _CONSTS[key] = view
        return view

    def is_unrealized_const(self) -> bool:
        return self.base.realized is None and self.base.op is LoadOps.CONST

    def is_unrealized_unmasked_const(self) -> bool:
        return self.is_unrealized_const() and all(v.mask is None for v in self.st.views)

    # ***** ops that make a new base *****

    def contiguous(self) -> LazyBuffer:
        """This data in a buffer of its own, laid out contiguously (a no-op when it already is)."""
        if not self.st.contiguous or self.size != self.base.size or self.is_unrealized_const():
            if Device.storage_only(self.device):  # no kernel: a Buffer over the same bytes, if they are one run
                return storage.contiguous(self)
            return self._new(LoadOps.CONTIGUOUS, None, (self,))
        if self.base.realized is None:
            self.base.forced_realize = True  # a kernel boundary: this base gets a buffer of its own
        return self

    def copy(self) -> LazyBuffer:
        """This data in a new buffer of its own, always (contiguous() returns a contiguous buffer as it is)."""
        return self._new(LoadOps.CONTIGUOUS, None, (self,))

    def cast(self, dtype: DType, bitcast: bool = False) -> LazyBuffer:
        """Convert each element to `dtype` (or reinterpret its bits when bitcast)."""
        if self.dtype == dtype:
            return self
        if bitcast and Device.storage_only(self.device):  # a view of the same bytes, no kernel
            return storage.bitcast(self, dtype)
        if bitcast and self.dtype.itemsize != dtype.itemsize:
            raise ValueError(f"cannot bitcast {self.dtype} to {dtype}: the item sizes differ")
        if self.is_unrealized_unmasked_const() and not bitcast and _foldable_cast(self.base.arg, dtype):
            return (
                LazyBuffer.loadop(LoadOps.CONST, (), dtype, self.device, self.base.arg)
                .reshape((1,) * len(self.shape))
                .expand(self.shape)
            )
        return LazyBuffer(
            self.device,
            ShapeTracker.from_shape(self.shape),
            dtype,
            UnaryOps.BITCAST if bitcast else UnaryOps.CAST,
            dtype,
            (self,),
        )

    def e(self, op: Union[UnaryOps, BinaryOps, TernaryOps], *in_srcs: LazyBuffer, arg: Any = None) -> LazyBuffer:
        """Elementwise `op` of this buffer and `in_srcs` (same shape and device)."""
        srcs = (self, *in_srcs)
        shape, device = self.shape, self.device
        for s in in_srcs:
            if s.shape != shape:
                raise ValueError(f"{op} needs operands of one shape, got {[x.shape for x in srcs]}")
            if s.device != device:
                raise ValueError(f"{op} needs operands on one device, got {[x.device for x in srcs]}")
        value_srcs = in_srcs if op is TernaryOps.WHERE else srcs
        value_dtype = value_srcs[0].dtype
        for s in value_srcs:
            if s.dtype is not value_dtype and s.dtype != value_dtype:  # (identity first: DType.__eq__ is Python)
                raise TypeError(f"{op} needs operands of one dtype, got {[s.dtype for s in value_srcs]}")
        if op is TernaryOps.WHERE and self.dtype != dtypes.bool:
            raise TypeError(f"WHERE needs a bool condition, got {self.dtype}")
        out_dtype = dtypes.bool if op is BinaryOps.CMPLT or op is BinaryOps.CMPEQ else value_dtype
        if (self._base or self).op is LoadOps.CONST and all(
            s.is_unrealized_unmasked_const() and not isinstance(s.base.arg, Node) for s in srcs
        ):
            folded = exec_alu(op, out_dtype, [np.array(s.base.arg, dtype=_np_type(s.dtype)) for s in srcs])
            return (
                LazyBuffer.loadop(LoadOps.CONST, (), out_dtype, self.device, folded.item())
                .reshape((1,) * len(self.shape))
                .expand(self.shape)
            )
        # a base's tracker is the contiguous one of its shape: reused, not looked up again
        st = self.st if self._base is None else ShapeTracker.from_shape(shape)
        return LazyBuffer(device, st, out_dtype, op, arg, srcs)

    def composed(self, op: ComposedOps) -> LazyBuffer:
        """The float function `op` (lazymath.py) of this buffer: one node that stands for its whole composition (the
        scheduler writes it out into the kernel that computes it); of a constant, the folded constant."""
        if self.dtype not in dtypes._float_set:
            raise TypeError(f"{op.name.lower()} needs a float operand, got {self.dtype}")
        if self.size == 0 or (self.is_unrealized_unmasked_const() and not isinstance(self.base.arg, Node)):
            return COMPOSITIONS[op](self)  # (each op of it folds; nothing computes an empty one)
        st = self.st if self._base is None else ShapeTracker.from_shape(self.shape)
        return LazyBuffer(self.device, st, self.dtype, op, None, (self,))

    def r(self, op: ReduceOps, axis: tuple[int, ...]) -> LazyBuffer:
        """Reduce over `axis`, keeping those axes with size 1."""
        axis = tuple(sorted({a for a in axis if self.shape[a] != 1}))
        new_shape = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
        if not axis:
            return self
        if self.size == 0:  # a reduction of nothing is the op's identity
            return self.const(0 if op is ReduceOps.SUM else dtypes.min(self.dtype), new_shape)
        if (split := self._split_reduce(op, new_shape)) is not None:
            return split
        return self._reduced(op, axis, new_shape)

    def _reduced(self, op: ReduceOps, axis: tuple[int, ...], new_shape: tuple[sint, ...]) -> LazyBuffer:
        """The reduce node itself (r, once it has sorted its axes and not split it)."""
        return LazyBuffer(self.device, ShapeTracker.from_shape(new_shape), self.dtype, op, axis, (self,))

    def _split_reduce(self, op: ReduceOps, new_shape: tuple[sint, ...]) -> Optional[LazyBuffer]:
        """A reduce of everything into one value, in two stages: the n elements are viewed as (parts, n / parts), the
        first kernel reduces each part (a contiguous block; the parts spread over the cores, and the kernel reduces
        a long contiguous axis in vector lanes: codegen/kernel.py), the second the parts' results. A single reduce
        would run on one core. The split depends on n alone, so the order of float additions is the same on every
        device."""
        n = self.size
        if not isinstance(n, int) or n < SPLIT_REDUCE_MIN or any(s != 1 for s in new_shape):
            return None
        flat = self.reshape((n,))
        most = 1 << min(6, (n // SPLIT_PART_MIN).bit_length() - 1)  # parts of at least SPLIT_PART_MIN elements
        parts = next((p for p in (64, 32, 16, 8, 4, 2) if p <= most and n % (p * SPLIT_PART_ALIGN) == 0), None)
        if parts is None:
            if op is not ReduceOps.SUM:
                return None
            parts = most  # a sum is padded with zeros (its identity) to whole parts
            padded = -(-n // (parts * SPLIT_PART_ALIGN)) * parts * SPLIT_PART_ALIGN
            flat, n = flat.pad(((0, padded - n),)), padded
        # (each stage's reduce made directly: r() would only sort its axis and ask this method again)
        first = flat.reshape((parts, n // parts))._reduced(op, (1,), (parts, 1))
        return first.reshape((parts,))._reduced(op, (0,), (1,)).reshape(new_shape)

    def gather(self, index: LazyBuffer, axis: int) -> LazyBuffer:
        """out[p] = self[p with p[axis] replaced by index[p]]: `index` (integers, of this shape except on `axis`)
        picks one element along `axis` for each output position. The kernel that computes the result loads each
        element at its index (engine/schedule.py), reading this buffer's memory as it is laid out; an index out of
        [0, shape[axis]) is clamped there, so checking the values (tensor.py) is the caller's part."""
        if len(index.shape) != len(self.shape) or any(
            i != s for a, (i, s) in enumerate(zip(index.shape, self.shape)) if a != axis
        ):
            raise ValueError(f"gather needs an index of shape {self.shape} except on axis {axis}, got {index.shape}")
        if not dtypes.is_int(index.dtype):
            raise TypeError(f"gather needs an integer index, got {index.dtype}")
        if index.device != self.device:
            raise ValueError(f"gather needs the index on {self.device}, got it on {index.device}")
        if self.shape[axis] == 0 and index.size != 0:
            raise IndexError(f"gather along axis {axis} of size 0: no index is in range")
        table = self
        views = table.st.views
        # the kernel reads the table through one view of int strides without a mask: anything else is copied first
        if len(views) != 1 or views[0].mask is not None or not _plain_ints((*views[0].strides, views[0].offset)):
            table = table._new(LoadOps.CONTIGUOUS, None, (table,))
        return LazyBuffer(
            self.device, ShapeTracker.from_shape(index.shape), self.dtype, IndexOps.GATHER, axis, (table, index)
        )

    def copy_to_device(self, device: str) -> LazyBuffer:
        """This data on another device."""
        if device == self.device:
            return self
        if self.is_unrealized_unmasked_const():
            return (
                LazyBuffer.loadop(LoadOps.CONST, (), self.dtype, device, self.base.arg)
                .reshape((1,) * len(self.shape))
                .expand(self.shape)
            )
        if self._base is not None and Device.storage_only(self.device):  # copies the bytes the view reads
            return storage.copy_to_device(self, device)
        src = self.contiguous()
        return LazyBuffer(device, ShapeTracker.from_shape(self.shape), self.dtype, LoadOps.COPY, None, (src,))

    def assign(self, x: LazyBuffer) -> LazyBuffer:
        """Write `x` into this buffer's memory: a base, or the elements of its base that this view reads (each at
        most once: see writes_through). The ASSIGN's arg is the view's tracker, None for a base."""
        if x.shape != self.shape:
            raise ValueError(f"assign needs a value of the target's shape {self.shape}, got {x.shape}")
        if self._base is not None and not self.writes_through():
            raise ValueError("assign into a view needs one that reads each element of its base once, without padding")
        arg = None if self._base is None else self.st
        return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, LoadOps.ASSIGN, arg, (x, self))

    def writes_through(self) -> bool:
        """Whether a write into this view lands in its base: no padding (a pad makes a new tensor, as in numpy), no
        element read twice (an expand), and a base that belongs to no one else (a constant the engine shares between
        graphs does)."""
        base = self.base
        if base is self or base.__dict__.get("shared", False):
            return base is self
        return all(v.mask is None and not any(st == 0 and sz != 1 for st, sz in zip(v.strides, v.shape))
                   for v in self.st.views)

    def _new(self, op: Op, arg: Any, srcs: tuple[LazyBuffer, ...]) -> LazyBuffer:
        return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, op, arg, srcs)

    # ***** movement ops: views *****

    def _view(self, st: ShapeTracker) -> LazyBuffer:
        if st.size == 0 and self.size != 0:  # nothing to read: an empty buffer of the new shape
            return LazyBuffer.loadop(LoadOps.EMPTY, st.shape, self.dtype, self.device)
        if st.contiguous and st.shape == self.base.shape:
            return self.base
        return LazyBuffer(self.device, st, self.dtype, base=self.base)

    def reshape(self, shape: tuple[sint, ...]) -> LazyBuffer:
        if shape == self.shape:  # (the same view: a flat input's first step of a split reduce)
            return self
        return self._view(self.st.reshape(shape))

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> LazyBuffer:
        return self._view(self.st.pad(arg))

    def expand(self, shape: tuple[sint, ...]) -> LazyBuffer:
        return self._view(self.st.expand(shape))

    def reshape_expand(self, reshaped: tuple[sint, ...], shape: tuple[sint, ...]) -> LazyBuffer:
        """reshape(reshaped).expand(shape) as one view: the same tracker, without the view between (a broadcast)."""
        return self._view(self.st.reshape(reshaped).expand(shape))

    def permute(self, order: tuple[int, ...]) -> LazyBuffer:
        return self._view(self.st.permute(order))

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> LazyBuffer:
        return self._view(self.st.shrink(arg))

    def stride(self, arg: tuple[int, ...]) -> LazyBuffer:
        return self._view(self.st.stride(arg))


# a reduce of everything over at least this many elements runs in two stages (see LazyBuffer._split_reduce), in at
# most 64 parts of at least SPLIT_PART_MIN elements each, a whole number of SPLIT_PART_ALIGN (vectors of any width)
SPLIT_REDUCE_MIN = 1 << 15
SPLIT_PART_MIN = 4096
SPLIT_PART_ALIGN = 64


def _np_type(dt: DType) -> type:
    return np.float32 if dt == dtypes.bfloat16 else dt.np  # type: ignore[return-value]


def _foldable_cast(val: object, dtype: DType) -> bool:
    """Whether casting the constant `val` to `dtype` can be done now (inf and NaN have no integer value)."""
    return not (isinstance(val, float) and not math.isfinite(val) and (dtypes.is_int(dtype) or dtype == dtypes.bool))


_DEVICE_DTYPES: dict[str, frozenset[DType]] = {}  # the dtypes each device instance claims in its DeviceSpec
# per device, the dtype objects checked against those, by id (each kept here, so its id is not reused)
_SUPPORTED: dict[str, dict[int, DType]] = {}
plugins.on_change.append(_DEVICE_DTYPES.clear)
plugins.on_change.append(_SUPPORTED.clear)


def _check_dtype(device: str, dtype: DType) -> None:
    """Raise TypeError unless `device` supports `dtype` (for a vector dtype: its scalar type); remember a yes."""
    if (claimed := _DEVICE_DTYPES.get(device)) is None:
        claimed = _DEVICE_DTYPES[device] = frozenset(Device[device].spec.dtypes)
    if dtype.scalar() not in claimed:
        supported = ", ".join(d.short_name for d in sorted(claimed))
        raise TypeError(
            f"device {device} does not support {dtype}; it supports {supported}: cast first, or use another device"
        )
    known = _SUPPORTED.setdefault(device, {})
    if len(known) >= 256:  # vec() makes a new DType object per call
        known.clear()
    known[id(dtype)] = dtype


# constants broadcast to a shape, by (value, its type, dtype name, device, shape): `x + 1` in a loop makes its constant
# operand once. A constant is pure, so one node may be read by any number of graphs; the entry is replaced once its
# base gets realized (reading a realized buffer gives the same values, but it is no longer a constant to fold). 0-d
# constants are not kept: they are bases a tensor can hold directly (and assign into).
_CONSTS: dict[tuple[Any, ...], LazyBuffer] = {}
_CONSTS_SIZE = 1024
plugins.on_change.append(_CONSTS.clear)


def _max_size(size: sint) -> int:
    """Elements to allocate: a symbolic size gets room for its largest value."""
    return size if isinstance(size, int) else int(size.max)
