"""Device memory as cl.Buffer objects in the platform's shared context, with the core's LRU cache on top.

A view (`offset`) is a `BufferView`. OpenCL makes sub-buffers only at offsets that are multiples of the device's
CL_DEVICE_MEM_BASE_ADDR_ALIGN (128 bytes on PoCL, 512 on most GPUs); a view at such an offset carries a
sub-buffer, which kernels use in place. Any other view is reached by offset copies, and a kernel gets a copy of it
that is written back afterwards if the kernel writes it (see runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from tg_opencl.cl_platform import OpenCLPlatform
from tgcore.plugin import LRUAllocator


@dataclass(frozen=True, eq=False)
class BufferView:
    """`size` bytes at byte `offset` of the allocation `root`; `sub` is the sub-buffer over them, where OpenCL
    could make one."""

    root: Any  # cl.Buffer
    offset: int
    size: int
    sub: Optional[Any] = None  # cl.Buffer


def locate(opaque: Any) -> tuple[Any, int]:
    """(the cl.Buffer allocation, byte offset into it) of a buffer or a view."""
    return (opaque.root, opaque.offset) if isinstance(opaque, BufferView) else (opaque, 0)


class OpenCLAllocator(LRUAllocator):
    """cl.Buffer memory; copies go through the queue of device `index` and block until they are done."""

    def __init__(self, platform: OpenCLPlatform, index: int = 0) -> None:
        super().__init__()
        self.platform, self.index = platform, index
        self.queue = platform.queues[index]
        self.align = max(info.mem_base_addr_align for info in platform.infos)  # a sub-buffer serves every device

    def _alloc(self, size: int, options: Any) -> Any:
        import pyopencl as cl

        flags = cl.mem_flags.READ_WRITE
        if options is not None and getattr(options, "host", False):
            flags |= cl.mem_flags.ALLOC_HOST_PTR
        try:
            # OpenCL has no empty buffer: an empty Buffer holds one byte that is never read
            return cl.Buffer(self.platform.context, flags, max(size, 1))
        except cl.MemoryError as e:  # the LRU cache frees what it holds and tries again on MemoryError
            raise MemoryError(f"OpenCL could not allocate {size} bytes: {e}") from e
        except cl.Error as e:
            if e.code != cl.status_code.INVALID_BUFFER_SIZE:
                raise
            largest = self.platform.devices[self.index].max_mem_alloc_size
            raise MemoryError(
                f"OpenCL cannot make a buffer of {size} bytes: the largest one this device allocates is {largest} bytes"
            ) from e

    def _free(self, opaque: Any, options: Any) -> None:
        opaque.release()

    def copyin(self, dest: Any, src: memoryview) -> None:
        import pyopencl as cl

        root, offset = locate(dest)
        data = src if not src.readonly else bytes(src)
        cl.enqueue_copy(self.queue, root, data, dst_offset=offset, is_blocking=True)

    def copyout(self, dest: memoryview, src: Any) -> None:
        import pyopencl as cl

        root, offset = locate(src)
        cl.enqueue_copy(self.queue, dest, root, src_offset=offset, is_blocking=True)

    def offset(self, buf: Any, size: int, offset: int) -> BufferView:
        """A view of `size` bytes at byte `offset` of `buf` (a buffer or a view)."""
        root, start = locate(buf)
        start += offset
        sub = root.get_sub_region(start, size) if size and start % self.align == 0 else None
        return BufferView(root, start, size, sub)

    def transfer(self, dest: Any, src: Any, size: int, src_dev: Any = None, dest_dev: Any = None) -> None:
        """Copy `size` bytes between two buffers of this platform (say OPENCL and OPENCL:1) without the host."""
        import pyopencl as cl

        if size == 0:
            return
        self.platform.synchronize()  # the source may still be written by a kernel on another device's queue
        queue = self.platform.queues[self.platform.index(dest_dev.name)] if dest_dev is not None else self.queue
        (dest_root, dest_offset), (src_root, src_offset) = locate(dest), locate(src)
        cl.enqueue_copy(queue, dest_root, src_root, byte_count=size, src_offset=src_offset, dst_offset=dest_offset)

    def synchronize(self) -> None:
        self.platform.synchronize()
