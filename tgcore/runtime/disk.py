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

This module is the device (its allocator and registration); what the lazy graph and Tensor do on it (views of its
bytes instead of kernels, writes into the file) is in tgcore/storage.py, called from small guarded branches in
lazy.py and tensor.py for devices whose DeviceSpec says storage_only.
"""

from __future__ import annotations

import mmap
import os
import stat
import weakref
from typing import Any, Optional

from tgcore.plugin import ALL_DTYPES, PLUGIN_API_VERSION, Allocator, DeviceSpec, hookimpl, part_for

DEVICE = "DISK"


# ***** the allocator: one file per device instance *****


class _Mapping:
    """One memory map of a whole file, whether it can be written through, and which file it is (device, inode)."""

    __slots__ = ("mm", "writable", "file", "__weakref__")

    def __init__(self, mm: mmap.mmap, writable: bool, file: tuple[int, int]) -> None:
        self.mm, self.writable, self.file = mm, writable, file


class DiskBuffer:
    """A byte range of the file: `size` bytes from `offset`, in an allocation that ends at byte `end`."""

    __slots__ = ("offset", "size", "end", "mapping", "root")

    def __init__(
        self, offset: int, size: int, end: int, mapping: Optional[_Mapping] = None, root: Optional[DiskBuffer] = None
    ) -> None:
        self.offset, self.size, self.end = offset, size, end
        self.mapping = mapping  # the map this range was last read or written through (kept alive by it)
        # the allocation this range is a view of (itself for an allocation): a view's first map is the allocation's
        # too, so it lives as long as the tensor over the whole allocation (a slice read does not map the file anew)
        self.root: DiskBuffer = self if root is None else root

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
        # a view reads the file its base reads
        return DiskBuffer(buf.offset + offset, size, buf.end, buf.mapping, buf.root)

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
                self._keep(buf, m)
                return m
        m = self._open(need, write, buf)
        self._current = weakref.ref(m)
        self._keep(buf, m)
        return m

    @staticmethod
    def _keep(buf: DiskBuffer, m: _Mapping) -> None:
        buf.mapping = m
        if buf.root.mapping is None:  # (an allocation keeps reading the file it first read)
            buf.root.mapping = m

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
