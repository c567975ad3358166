"""Device memory of one GPU through the driver API, with the core's LRU cache on top.

A buffer is its device address (an int, a CUdeviceptr); a view (`offset`) is that address plus the offset. Copies
use the legacy default stream, like the runtime's launches, so they are ordered after the kernels queued before
them; a copy to the host returns when the data is there.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tg_cuda.driver import CUDADevice
from tgcore.plugin import LRUAllocator


def _host_pointer(mv: memoryview) -> tuple[Any, Any]:
    """(a pointer to `mv`'s bytes, the object that keeps them alive) for a C-contiguous memoryview."""
    if mv.readonly:
        data = bytes(mv)
        return ctypes.c_char_p(data), data
    holder = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return holder, holder


class CUDAAllocator(LRUAllocator):
    """cuMemAlloc memory on `device`."""

    def __init__(self, device: CUDADevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, size: int, options: Any) -> int:
        ptr = ctypes.c_uint64()
        # cuMemAlloc refuses 0 bytes: an empty buffer gets a byte that is never read
        self.device.make_current().call("cuMemAlloc_v2", ctypes.byref(ptr), max(size, 1), detail=f"{size} bytes")
        return ptr.value

    def _free(self, opaque: int, options: Any) -> None:
        self.device.make_current().call("cuMemFree_v2", opaque)

    def copyin(self, dest: int, src: memoryview) -> None:
        pointer, _keep = _host_pointer(src)
        self.device.make_current().call("cuMemcpyHtoD_v2", dest, pointer, src.nbytes)

    def copyout(self, dest: memoryview, src: int) -> None:
        pointer, _keep = _host_pointer(dest)
        self.device.make_current().call("cuMemcpyDtoH_v2", pointer, src, dest.nbytes)

    def offset(self, buf: int, size: int, offset: int) -> int:
        """A view of `size` bytes at byte `offset` of `buf`: its address."""
        return buf + offset

    def transfer(self, dest: int, src: int, size: int, src_dev: Any = None, dest_dev: Any = None) -> None:
        """Copy `size` bytes from a buffer of another CUDA device instance (`src_dev`) to `dest` on this one."""
        if size == 0:
            return
        source: CUDADevice = src_dev.allocator.device if src_dev is not None else self.device
        source.synchronize()  # kernels queued on the source may still be writing it
        drv = self.device.make_current()
        if source.context == self.device.context:
            drv.call("cuMemcpyDtoD_v2", dest, src, size)
        else:
            drv.call("cuMemcpyPeer", dest, self.device.context, src, source.context, size)
        self.device.synchronize()

    def synchronize(self) -> None:
        self.device.synchronize()
