"""Device memory as MTLBuffers in shared storage (the CPU and the GPU see the same bytes), with the core's LRU cache
on top. A buffer or a view of one is a `MetalBuffer`: the MTLBuffer, a byte offset into it and a size; kernels bind
it at that offset. Copies wait for the kernels still running, then move bytes through the buffer's contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tg_metal.context import MetalContext
from tgcore.plugin import LRUAllocator


@dataclass(frozen=True, eq=False)
class MetalBuffer:
    """`size` bytes at byte `offset` of the MTLBuffer `buf`."""

    buf: Any  # MTLBuffer
    offset: int
    size: int


class MetalAllocator(LRUAllocator):
    """Shared-storage MTLBuffers of the process's Metal device."""

    def __init__(self, context: MetalContext) -> None:
        super().__init__()
        self.context = context

    def _alloc(self, size: int, options: Any) -> MetalBuffer:
        metal = self.context.metal
        # Metal makes no empty buffer: an empty Buffer holds one byte that is never read
        buf = self.context.device.newBufferWithLength_options_(max(size, 1), metal.MTLResourceStorageModeShared)
        if buf is None:  # the LRU cache frees what it holds and tries again on MemoryError
            raise MemoryError(f"Metal could not allocate {size} bytes on {self.context.name}")
        return MetalBuffer(buf, 0, size)

    def _free(self, opaque: Any, options: Any) -> None:
        pass  # pyobjc releases the MTLBuffer with its last reference; a command buffer retains those it uses

    def _contents(self, buf: MetalBuffer) -> memoryview:
        whole = buf.buf.contents().as_buffer(buf.buf.length())
        view = memoryview(whole)
        return (view if view.format == "B" else view.cast("B"))[buf.offset : buf.offset + buf.size]

    def as_buffer(self, src: MetalBuffer) -> memoryview:
        """The buffer's bytes themselves, once the kernels that may write them are done."""
        self.context.synchronize()
        return self._contents(src)

    def copyin(self, dest: MetalBuffer, src: memoryview) -> None:
        self.context.synchronize()  # a kernel still running may read the bytes about to change
        self._contents(dest)[:] = src.cast("B") if src.format != "B" else src

    def copyout(self, dest: memoryview, src: MetalBuffer) -> None:
        self.context.synchronize()
        (dest.cast("B") if dest.format != "B" else dest)[:] = self._contents(src)

    def offset(self, buf: MetalBuffer, size: int, offset: int) -> MetalBuffer:
        """A view of `size` bytes at byte `offset` of `buf` (a buffer or a view)."""
        return MetalBuffer(buf.buf, buf.offset + offset, size)

    def synchronize(self) -> None:
        self.context.synchronize()
