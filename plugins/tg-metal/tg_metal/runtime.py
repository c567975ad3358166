"""Loads a compiled kernel into a compute pipeline and launches it: one command buffer per call, encoded, committed,
and waited for (and timed by the GPU) when the caller asks."""

from __future__ import annotations

import struct
from typing import Optional

from tg_metal.allocator import MetalBuffer
from tg_metal.compiler import LIBRARY, compile_options, unpack_library
from tg_metal.context import describe, get_context
from tgcore.plugin import Program


def _dims(size: Optional[tuple[int, ...]]) -> tuple[int, int, int]:
    """A launch size as three dimensions (missing ones are 1)."""
    dims = tuple(int(s) for s in size) if size is not None else ()
    if len(dims) > 3:
        raise ValueError(f"a Metal launch has at most 3 dimensions, got {dims}")
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


def threads_per_threadgroup(grid: tuple[int, int, int], max_threads: int) -> tuple[int, int, int]:
    """The threadgroup size for dispatchThreads over `grid`: as many threads as allowed, filling x, then y, then z."""
    x = max(1, min(grid[0], max_threads))
    y = max(1, min(grid[1], max_threads // x))
    z = max(1, min(grid[2], max_threads // (x * y)))
    return x, y, z


class MetalProgram(Program):
    """One kernel of a compiled library, as a compute pipeline on device instance `device` (METAL, METAL:1, ...)."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self.context = context = get_context(device)
        compiled = unpack_library(lib)
        self.grid_indexed = compiled.grid_indexed
        if compiled.kind == LIBRARY:
            data = context.dispatch.dispatch_data_create(compiled.payload, len(compiled.payload), None, None)
            library, error = context.device.newLibraryWithData_error_(data, None)
        else:
            library, error = context.device.newLibraryWithSource_options_error_(
                compiled.payload.decode(), compile_options(context.metal), None
            )
        if library is None:
            raise RuntimeError(f"Metal could not load the library of kernel {name}: {describe(error)}")
        function = library.newFunctionWithName_(name)
        if function is None:
            raise RuntimeError(f"the Metal library has no kernel named {name}; it has {list(library.functionNames())}")
        self.pipeline, error = context.device.newComputePipelineStateWithFunction_error_(function, None)
        if self.pipeline is None:
            raise RuntimeError(f"Metal could not make a compute pipeline for kernel {name}: {describe(error)}")
        self.max_threads = int(self.pipeline.maxTotalThreadsPerThreadgroup())

    def __call__(
        self,
        *bufs: MetalBuffer,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        grid, group = _dims(global_size), _dims(local_size)
        if not self.grid_indexed and group[0] * group[1] * group[2] > self.max_threads:
            raise ValueError(
                f"kernel {self.name}: threadgroups of {group} are {group[0] * group[1] * group[2]} threads, more than "
                f"the {self.max_threads} this pipeline allows"
            )
        if 0 in grid:
            return 0.0 if wait else None
        metal = self.context.metal
        command_buffer = self.context.queue.commandBuffer()
        encoder = command_buffer.computeCommandEncoder()
        encoder.setComputePipelineState_(self.pipeline)
        for i, buf in enumerate(bufs):
            encoder.setBuffer_offset_atIndex_(buf.buf, buf.offset, i)
        for i, value in enumerate(vals, start=len(bufs)):
            encoder.setBytes_length_atIndex_(struct.pack("<i", value), 4, i)
        if self.grid_indexed:
            threads = threads_per_threadgroup(grid, self.max_threads)
            encoder.dispatchThreads_threadsPerThreadgroup_(metal.MTLSize(*grid), metal.MTLSize(*threads))
        else:
            encoder.dispatchThreadgroups_threadsPerThreadgroup_(metal.MTLSize(*grid), metal.MTLSize(*group))
        encoder.endEncoding()
        command_buffer.commit()
        if not wait:
            self.context.in_flight.append(command_buffer)
            return None
        self.context.synchronize()  # earlier kernels first: they ran before this one, in queue order
        self.context.wait(command_buffer)
        return float(command_buffer.GPUEndTime() - command_buffer.GPUStartTime())
