"""The built-in DISK device: tensors whose data is a memory-mapped file, registered through the same hooks as a plugin.

A device instance is a file: `disk:/data/weights.bin` (the path after the colon is kept as written, case and all).
Every buffer allocated on it starts at byte 0 of that file, and views of a buffer are byte ranges of the same file,
so `Tensor.empty(n, dtype=dtypes.uint8, device="disk:/path")` is the whole file and its slices are parts of it.

What DISK does (DeviceSpec.storage_only: it holds data and runs no kernels):
- writing: a copy to DISK (`t.to("disk:/path")`), `assign` and `t[...] = v` write the bytes into the file. A write
  creates the file if it is missing and grows it to the size of the tensor written into; it never shrinks a file.
- reading: `.numpy()`, copies to any device (`t.to(device)`), copies between files. A read needs the file to exist and
  to hold the bytes read: a missing file or one too short raises (FileNotFoundError, ValueError) rather than reading
  zeros. Reads and writes go through one shared mapping of the whole file, made on first use and unmapped with the
  last buffer that uses it: opening a file reads nothing, and a read touches only the pages of the bytes asked for.
  A buffer keeps the file it first mapped even when the path is given to another file (safe_save renames a new file
  into place); a file cut short by another program raises instead of touching pages past its end (SIGBUS).
- views without a copy: reshapes, shrinks and basic indexing that select one contiguous run of bytes, and `bitcast`
  (to a dtype of the same item size, or of another where the last axis's bytes divide evenly, as safetensors loading
  needs), each a new Buffer over the same bytes (LazyBuffer op CUSTOM with a no-op function, so the scheduler only
  orders it after the buffer it views).
- copying a view that is not one run of bytes (a column, a permutation) to a compute device copies the smallest run
  that covers it and applies the view there.

What DISK refuses, with an error that says to copy to a compute device first: arithmetic, casts and reductions (the
scheduler refuses any kernel on a storage-only device), `.contiguous()`, `assign` or `bitcast` of a view that is not
one run of bytes, indexing with lists or tensors, and random numbers (tensor.py refuses those before they write).

The lazy-graph entry points below (contiguous, bitcast, copy_to_device, assign, setitem) are called from small
guarded branches in lazy.py and tensor.py for devices whose DeviceSpec says storage_only.
"""

from __future__ import annotations

import mmap
import os
import stat
import weakref
from typing import TYPE_CHECKING, Any, Optional

from tgcore.device import Buffer, Device
from tgcore.dtype import DType
from tgcore.helpers import all_int, prod
from tgcore.lazy import LazyBuffer
from tgcore.multi import MultiLazyBuffer
from tgcore.ops import LoadOps
from tgcore.plugin import ALL_DTYPES, PLUGIN_API_VERSION, Allocator, DeviceSpec, hookimpl, part_for
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.view import View

if TYPE_CHECKING:
    from tgcore.tensor import Tensor

DEVICE = "DISK"


# ***** the allocator: one file per device instance *****


class _Mapping:
    """One memory map of a whole file, whether it can be written through, and which file it is (device, inode)."""

    __slots__ = ("mm", "writable", "file", "__weakref__")

    def __init__(self, mm: mmap.mmap, writable: bool, file: tuple[int, int]) -> None:
        self.mm, self.writable, self.file = mm, writable, file


class DiskBuffer:
    """A byte range of the file: `size` bytes from `offset`, in an allocation that ends at byte `end`."""

    __slots__ = ("offset", "size", "end", "mapping")

    def __init__(self, offset: int, size: int, end: int, mapping: Optional[_Mapping] = None) -> None:
        self.offset, self.size, self.end = offset, size, end
        self.mapping = mapping  # the map this range was last read or written through (kept alive by it)

    def __repr__(self) -> str:
        return f"<DiskBuffer bytes {self.offset}..{self.offset + self.size}>"


class DiskAllocator(Allocator):
    """Buffers of one file (the device instance "DISK:<path>"), each starting at its byte 0; mapped on first use."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.path = device.partition(":")[2]
        # the newest mapping, held weakly: it lives while some buffer uses it, and is unmapped when none does
        self._current: Optional[weakref.ref[_Mapping]] = None

    def _alloc(self, size: int, options: Any) -> DiskBuffer:
        if not self.path:
            raise ValueError(
                f"device {self.device} names no file: DISK tensors live in a file, name it in the device, "
                'e.g. device="disk:/path/to/file"'
            )
        return DiskBuffer(0, size, size)

    def offset(self, buf: DiskBuffer, size: int, offset: int) -> DiskBuffer:
        return DiskBuffer(buf.offset + offset, size, buf.end, buf.mapping)  # a view reads the file its base reads

    def copyin(self, dest: DiskBuffer, src: memoryview) -> None:
        with memoryview(self._map(dest, write=True).mm) as mv:
            mv[dest.offset : dest.offset + src.nbytes] = src.cast("B") if src.nbytes else src

    def copyout(self, dest: memoryview, src: DiskBuffer) -> None:
        with memoryview(self._map(src, write=False).mm) as mv:
            dest[:] = mv[src.offset : src.offset + dest.nbytes]

    def as_buffer(self, src: DiskBuffer) -> memoryview:
        if src.size == 0:
            return memoryview(b"")
        return memoryview(self._map(src, write=False).mm)[src.offset : src.offset + src.size]

    def _map(self, buf: DiskBuffer, write: bool) -> _Mapping:
        """A mapping that holds `buf` (and, for a write, its whole allocation), opening or growing the file.

        A buffer keeps reading the file it first read, even once the path names another (safe_save replaces a file);
        a buffer used for the first time maps the file the path names now."""
        need = buf.end if write else buf.offset + buf.size
        try:
            now: Optional[os.stat_result] = os.stat(self.path)
        except OSError:
            now = None
        m = buf.mapping
        if m is None and self._current is not None and (m := self._current()) is not None:
            if now is None or (now.st_dev, now.st_ino) != m.file:
                m = None  # the path names another file now
        if m is not None:
            if now is not None and (now.st_dev, now.st_ino) == m.file and now.st_size < min(need, len(m.mm)):
                # (touching mapped pages past the end of a file kills the process with SIGBUS)
                raise ValueError(
                    f"{self.device}: the file was cut to {now.st_size} bytes since it was opened (by another "
                    f"program?), but the tensor needs bytes {buf.offset}..{need}"
                )
            if len(m.mm) >= need and (m.writable or not write):
                buf.mapping = m
                return m
        m = self._open(need, write, buf)
        self._current = weakref.ref(m)
        buf.mapping = m
        return m

    def _open(self, need: int, write: bool, buf: DiskBuffer) -> _Mapping:
        path, what = self.path, f"{self.device}"
        try:
            if write:
                fd, writable = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666), True
            else:
                try:  # mapped writable where allowed, so that later writes share this mapping
                    fd, writable = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0)), True
                except PermissionError:
                    fd, writable = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), False
        except FileNotFoundError as e:
            if write:
                raise FileNotFoundError(
                    e.errno, f"cannot create the file of {what}: {e.strerror} (does its folder exist?)", path
                ) from e
            raise FileNotFoundError(
                e.errno,
                f"cannot read {what}: no such file. Check the path, or write the tensor first "
                f'(x.to("disk:{path}"), t.assign(x)) to create the file',
                path,
            ) from e
        except OSError as e:
            action = "write" if write else "read"
            raise type(e)(e.errno, f"cannot {action} {what}: {e.strerror}", path) from e
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{what}: {path!r} is not a regular file; DISK tensors map regular files only")
            size = info.st_size
            if size < need:
                if not write:
                    raise ValueError(
                        f"{what}: the file has {size} bytes, but the tensor needs bytes {buf.offset}..{need}: its "
                        "shape and dtype ask for more than the file holds (a wrong shape, or a truncated file)"
                    )
                os.ftruncate(fd, need)  # grown with zeros (sparse where the file system allows)
                size = need
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
            return _Mapping(mm, writable, (info.st_dev, info.st_ino))
        finally:
            os.close(fd)  # the mapping keeps the file open


# ***** views, bitcasts and copies of DISK tensors (called from lazy.py for storage-only devices) *****


def _disk_view(*bufs: Buffer) -> None:
    """The CUSTOM op of a view of a DISK buffer: nothing to run, the view's Buffer already points at the bytes."""


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
    view = LazyBuffer(base.device, ShapeTracker.from_shape(shape), dtype, LoadOps.CUSTOM, _disk_view, (base,))
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
    assert isinstance(lb, LazyBuffer)
    _check_storable(lb)
    if byte_range(lb) is None:
        raise _copy_first(lb, f"assign to a view {lb.shape} that is not one contiguous run of bytes")
    if target.numel() == 0:
        return
    dest = contiguous(lb) if lb._base is not None else lb
    if dest.realized is None:  # e.g. the copy that made this file: it must land before these bytes go over it
        from tgcore.tensor import Tensor

        Tensor(dest).realize()
    src = value._buffer()  # realized on its own device first, so a value read from this file is read before the write
    data = src.as_buffer()
    if Device.storage_only(src.device):
        data = memoryview(bytes(data))  # two ranges of one file may overlap
    dest.buffer.copyin(data)


def _as_value(value: Any, dtype: DType) -> Tensor:
    from tgcore.tensor import Tensor

    return value if isinstance(value, Tensor) else Tensor(value, device=_compute_device(), dtype=dtype)


def assign(target: Tensor, value: Any) -> Tensor:
    """Tensor.assign on DISK: write `value` (a Tensor on any device, or data) into the target's bytes, now."""
    value = _as_value(value, target.dtype)
    if value.shape != target.shape or value.dtype != target.dtype:
        raise ValueError(
            f"assign needs the same shape and dtype: target {target.shape} {target.dtype} on {target.device}, "
            f"value {value.shape} {value.dtype} on {value.device}"
        )
    _write(target, value)
    return target


def setitem(target: Tensor, indices: Any, value: Any) -> None:
    """Tensor.__setitem__ on DISK: write `value` (broadcast, cast to the target's dtype) into the indexed bytes."""
    from tgcore.tensor import _broadcast_shape

    view = target[indices]  # (list or tensor indexes raise: they need a kernel)
    value = _as_value(value, target.dtype)
    if value.shape != view.shape or value.dtype != view.dtype:
        if _broadcast_shape(value.shape, view.shape) != view.shape:
            raise ValueError(f"cannot assign a value of shape {value.shape} to an index of shape {view.shape}")
        if isinstance(value.lazydata, MultiLazyBuffer) or Device.storage_only(value.device):
            value = value.to(_compute_device())  # cast and broadcast are computed there
        value = value.cast(target.dtype)._broadcast_to(view.shape)
    _write(view, value)


# ***** registration, through the same hooks as any plugin *****


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            DEVICE,
            PLUGIN_API_VERSION,
            priority=-100,
            dtypes=ALL_DTYPES,
            description='built-in: tensors in memory-mapped files, device "disk:/path"; holds data, runs no kernels',
            storage_only=True,
            path_instances=True,
        )
    )


tg_allocator = part_for(DEVICE, DiskAllocator, per_instance=True)  # one per instance: a file each
