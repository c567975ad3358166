"""What the lazy graph and Tensor do on a storage-only device (DeviceSpec.storage_only: the built-in DISK, whose
buffers are bytes of a file): views of its bytes instead of kernels, and writes straight into them.

A storage-only device runs no kernels, so the ops that would make one take another path, through small guarded
branches in lazy.py (contiguous, bitcast, copy_to_device) and tensor.py (assign, __setitem__):
- a view that reads one contiguous run of bytes (a reshape, shrink, basic index, or a bitcast that keeps the bytes)
  becomes a new Buffer over those bytes: a LazyBuffer of op CUSTOM with a no-op function, so the scheduler only
  orders it after the buffer it views;
- a copy to a compute device of a view that is not one run copies the smallest run that covers it and applies the
  view there;
- assign and setitem write the value's bytes into the device's buffer now (the value computed on its own device);
- anything else (arithmetic, a contiguous copy of a strided view, a constant on the device) raises, saying to copy
  the data to a compute device first.

This module sits between lazy.py and tensor.py and imports neither: it is given their objects and makes new ones
with `type(...)` of them, so no import circle runs through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from tgcore.device import Buffer, Device
from tgcore.dtype import DType
from tgcore.helpers import all_int, prod
from tgcore.ops import LoadOps
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.view import View

if TYPE_CHECKING:
    from tgcore.lazy import LazyBuffer
    from tgcore.tensor import Tensor


def _broadcasts_to(shape: tuple[Any, ...], target: tuple[Any, ...]) -> bool:
    """Whether numpy's broadcasting takes `shape` to exactly `target`."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _storage_view(*bufs: Buffer) -> None:
    """The CUSTOM op of a view of a storage buffer: nothing to run, the view's Buffer already points at the bytes."""


def _compute_device() -> str:
    """A device that runs kernels, for values DISK cannot make itself and for the advice in errors."""
    default = Device.DEFAULT
    return default if not Device.storage_only(default) else Device.available()[0]


def _copy_first(lb: LazyBuffer, what: str) -> ValueError:
    return ValueError(
        f"{lb.device} cannot {what}: a DISK tensor is data in a file, and DISK hands out only contiguous runs of its "
        f"bytes and runs no kernels. Copy it to a compute device first, e.g. t.to({_compute_device()!r}), and do it "
        "there"
    )


def _check_storable(lb: LazyBuffer) -> None:
    """Raise unless `lb` reads data that is in the file (a constant on DISK would need a kernel to exist)."""
    base = lb.base
    if base.realized is None and base.op is LoadOps.CONST:
        raise ValueError(
            f"{lb.device} cannot hold a constant tensor (zeros, ones, full): DISK runs no kernels to fill it. Make it "
            'on a compute device and copy it: Tensor.zeros(...).to("disk:...")'
        )
    if not all_int(lb.shape):
        raise ValueError(f"{lb.device} cannot hold the symbolic shape {lb.shape}: DISK buffers have a fixed size")


def byte_range(lb: LazyBuffer) -> Optional[tuple[int, int]]:
    """(first byte, end byte) in its base's buffer of the data `lb` reads, when that is one contiguous run of bytes in
    order (a reshape, shrink or basic index of a contiguous base); else None."""
    isz = lb.dtype.itemsize
    if lb._base is None:
        return 0, prod(lb.shape) * isz
    views = lb.st.views
    if len(views) != 1 or views[0].mask is not None or not all_int(lb.shape):
        return None
    v = views[0]
    expected = 1
    for size, stride in zip(reversed(v.shape), reversed(v.strides)):
        if size != 1 and stride != expected:
            return None
        expected *= size
    if not isinstance(v.offset, int):
        return None
    return v.offset * isz, (v.offset + prod(v.shape)) * isz


def _view_base(base: LazyBuffer, shape: tuple[int, ...], dtype: DType, byte_offset: int) -> LazyBuffer:
    """A base LazyBuffer of `shape` and `dtype` whose Buffer is the bytes of `base`'s from `byte_offset` on."""
    view = type(base)(base.device, ShapeTracker.from_shape(shape), dtype, LoadOps.CUSTOM, _storage_view, (base,))
    view.buffer = base.buffer.view(prod(shape), dtype, byte_offset)
    if base.realized is not None:  # nothing to order after: the view is ready
        view.realized, view.srcs = view.buffer, ()
    return view


def contiguous(lb: LazyBuffer) -> LazyBuffer:
    """`lb` as a base: a Buffer over its bytes in the file when they are one contiguous run (no copy)."""
    _check_storable(lb)
    rng = byte_range(lb)
    if rng is None:
        raise _copy_first(lb, f"make a contiguous tensor of a strided, permuted, padded or broadcast view {lb.shape}")
    return _view_base(lb.base, tuple(lb.shape), lb.dtype, rng[0])  # type: ignore[arg-type]


def bitcast(lb: LazyBuffer, dtype: DType) -> LazyBuffer:
    """The bytes of `lb` read as `dtype`; for another item size the last axis is resized to cover the same bytes."""
    _check_storable(lb)
    rng = byte_range(lb)
    if rng is None:
        raise _copy_first(lb, f"bitcast a view {lb.shape} that is not one contiguous run of bytes")
    shape: tuple[int, ...] = tuple(lb.shape)  # type: ignore[arg-type]
    old, new = lb.dtype.itemsize, dtype.itemsize
    if old != new:
        if not shape:
            raise ValueError(
                f"cannot bitcast a 0-d {lb.dtype} tensor to {dtype}: the item sizes differ ({old} and {new} bytes), "
                "and a 0-d tensor has no last axis to resize; reshape it to (1,) first"
            )
        if (shape[-1] * old) % new:
            raise ValueError(
                f"cannot bitcast {lb.dtype} of shape {shape} to {dtype}: the last axis holds {shape[-1] * old} bytes, "
                f"not a whole number of {new}-byte items; bitcast a slice whose last axis divides evenly"
            )
        shape = shape[:-1] + (shape[-1] * old // new,)
    return _view_base(lb.base, shape, dtype, rng[0])


def copy_to_device(lb: LazyBuffer, device: str) -> LazyBuffer:
    """A view of a DISK buffer copied to `device`: its bytes when they are one run, else the smallest run of elements
    that covers the view (the whole base for a view of several stacked Views), with the view applied on `device`."""
    _check_storable(lb)
    if byte_range(lb) is not None:
        return contiguous(lb).copy_to_device(device)
    base, isz = lb.base, lb.dtype.itemsize
    window, moved = base, lb.st
    if len(lb.st.views) == 1:
        v = lb.st.views[0]
        box = v.mask if v.mask is not None else tuple((0, s) for s in v.shape)
        if all(b < e for b, e in box):
            lo = v.offset + sum(min(b * s, (e - 1) * s) for (b, e), s in zip(box, v.strides))
            hi = v.offset + sum(max(b * s, (e - 1) * s) for (b, e), s in zip(box, v.strides)) + 1
            window = _view_base(base, (hi - lo,), lb.dtype, lo * isz)
            moved = ShapeTracker((View.create(v.shape, v.strides, v.offset - lo, v.mask),))
    return window.copy_to_device(device)._view(moved)


# ***** writing: assign and setitem on DISK tensors (called from tensor.py) *****


def _write(target: Tensor, value: Tensor) -> None:
    """Write the data of `value` (same shape and dtype, on any device) into the bytes of `target` in its file, now."""
    lb = target.lazydata
    _check_storable(lb)
    if byte_range(lb) is None:
        raise _copy_first(lb, f"assign to a view {lb.shape} that is not one contiguous run of bytes")
    if target.numel() == 0:
        return
    dest = contiguous(lb) if lb._base is not None else lb
    if dest.realized is None:  # e.g. the copy that made this file: it must land before these bytes go over it
        type(target)(dest).realize()
    src = value._buffer()  # realized on its own device first, so a value read from this file is read before the write
    data = src.as_buffer()
    if Device.storage_only(src.device):
        data = memoryview(bytes(data))  # two ranges of one file may overlap
    dest.buffer.copyin(data)


def _as_value(value: Any, target: Tensor) -> Tensor:
    """`value` as a Tensor (data becomes one on a compute device, in the target's dtype)."""
    tensor = type(target)
    return value if isinstance(value, tensor) else tensor(value, device=_compute_device(), dtype=target.dtype)


def assign(target: Tensor, value: Any) -> Tensor:
    """Tensor.assign on DISK: write `value` (a Tensor on any device, or data) into the target's bytes, now."""
    value = _as_value(value, target)
    if value.shape != target.shape or value.dtype != target.dtype:
        raise ValueError(
            f"assign needs the same shape and dtype: target {target.shape} {target.dtype} on {target.device}, "
            f"value {value.shape} {value.dtype} on {value.device}"
        )
    _write(target, value)
    return target


def setitem(target: Tensor, indices: Any, value: Any) -> None:
    """Tensor.__setitem__ on DISK: write `value` (broadcast, cast to the target's dtype) into the indexed bytes."""
    view = target[indices]  # (list or tensor indexes raise: they need a kernel)
    value = _as_value(value, target)
    if value.shape != view.shape or value.dtype != view.dtype:
        if not _broadcasts_to(tuple(value.shape), tuple(view.shape)):
            raise ValueError(
                f"cannot assign a value of shape {value.shape} to an index of shape {view.shape}: it does not "
                "broadcast to that shape"
            )
        sharded = type(value.lazydata) is not type(target.lazydata)  # (a MultiLazyBuffer: target's is a LazyBuffer)
        if sharded or Device.storage_only(value.device):
            value = value.to(_compute_device())  # cast and broadcast are computed there
        value = value.cast(target.dtype)._broadcast_to(view.shape)
    _write(view, value)
