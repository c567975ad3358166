"""A stand-in for pyobjc's `Metal` and `libdispatch` modules, for testing tg-metal's macOS code on any OS.

It answers the calls tg-metal makes, with pyobjc's conventions ((result, NSError) pairs for error out-parameters,
nil as None), and really computes: its "Metal compiler" is a C++ front end with tg-metal's <metal_stdlib> (errors
are the front end's messages), its MTLBuffers are bytearrays, and a committed command buffer runs its kernel
through tests/cpu_emulation.py. Every encoder call is recorded for the tests to inspect. Method names are
pyobjc's (selectors with `:` as `_`).
"""

from __future__ import annotations

import struct
import subprocess
from types import SimpleNamespace
from typing import Any, Optional

from cpu_emulation import EmulatedKernel, EmulatedLibrary, address
from tg_metal.syntax import syntax_command


class NSError:
    def __init__(self, message: str) -> None:
        self.message = message

    def localizedDescription(self) -> str:
        return self.message


class Contents:
    """What MTLBuffer.contents() gives in pyobjc: a pointer whose as_buffer(n) is a memoryview."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def as_buffer(self, length: int) -> memoryview:
        return memoryview(self.data)[:length]


class Buffer:
    def __init__(self, length: int) -> None:
        self.data = bytearray(b"\x5a" * length)

    def length(self) -> int:
        return len(self.data)

    def contents(self) -> Contents:
        return Contents(self.data)


class Library:
    """A "compiled" library: its source, built for the CPU when a pipeline is made from one of its kernels."""

    def __init__(self, device: Device, src: str) -> None:
        self.device, self.src = device, src

    def newFunctionWithName_(self, name: str) -> Optional[tuple[Library, str]]:
        return (self, name) if f"kernel void {name}(" in self.src else None

    def functionNames(self) -> list[str]:
        return [part.split("(")[0] for part in self.src.split("kernel void ")[1:]]

    def libraryDataContents(self) -> Any:
        data = b"FAKE-METALLIB\n" + self.src.encode()
        return SimpleNamespace(bytes=lambda: memoryview(data))


class Pipeline:
    def __init__(self, library: Library, name: str, max_threads: int) -> None:
        self.kernel = EmulatedKernel.from_source(name, library.src)
        self.max_threads = max_threads
        self.library = EmulatedLibrary(library.device.cxx, [self.kernel])

    def maxTotalThreadsPerThreadgroup(self) -> int:
        return self.max_threads


class Encoder:
    def __init__(self, command_buffer: CommandBuffer) -> None:
        self.command_buffer = command_buffer
        self.calls = command_buffer.calls

    def setComputePipelineState_(self, pipeline: Pipeline) -> None:
        self.calls.append(("pipeline", pipeline))
        self.command_buffer.pipeline = pipeline

    def setBuffer_offset_atIndex_(self, buf: Buffer, offset: int, index: int) -> None:
        self.calls.append(("buffer", index, offset))
        self.command_buffer.buffers[index] = (buf, offset)

    def setBytes_length_atIndex_(self, data: bytes, length: int, index: int) -> None:
        self.calls.append(("bytes", index, bytes(data)[:length]))
        self.command_buffer.ints[index] = struct.unpack("<i", bytes(data)[:length])[0]

    def dispatchThreads_threadsPerThreadgroup_(self, grid: tuple, group: tuple) -> None:
        self.calls.append(("dispatchThreads", grid, group))
        self.command_buffer.launches.append((grid, (1, 1, 1)))

    def dispatchThreadgroups_threadsPerThreadgroup_(self, groups: tuple, group: tuple) -> None:
        self.calls.append(("dispatchThreadgroups", groups, group))
        self.command_buffer.launches.append((groups, group))

    def endEncoding(self) -> None:
        self.calls.append(("endEncoding",))


class CommandBuffer:
    def __init__(self, queue: Queue) -> None:
        self.queue, self.calls = queue, queue.device.calls
        self.pipeline: Optional[Pipeline] = None
        self.buffers: dict[int, tuple[Buffer, int]] = {}
        self.ints: dict[int, int] = {}
        self.launches: list[tuple[tuple, tuple]] = []
        self.failure: Optional[NSError] = queue.device.fail_next
        queue.device.fail_next = None
        self.waited = False

    def computeCommandEncoder(self) -> Encoder:
        return Encoder(self)

    def commit(self) -> None:
        """Runs the kernel now: the queue is in order, so running at commit is what the GPU would compute."""
        self.calls.append(("commit",))
        if self.failure is not None or self.pipeline is None:
            return
        k = self.pipeline.kernel
        n = len(k.buffer_types)
        pointers = [address(self.buffers[i][0].data) + self.buffers[i][1] for i in range(n)]
        vals = [self.ints[i] for i in range(n, n + k.n_vars)]
        for grid, group in self.launches:
            self.pipeline.library.run(k.name, pointers, vals, grid, group)

    def waitUntilCompleted(self) -> None:
        self.waited = True

    def error(self) -> Optional[NSError]:
        return self.failure

    def GPUStartTime(self) -> float:
        return 10.0

    def GPUEndTime(self) -> float:
        return 10.25


class Queue:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.command_buffers: list[CommandBuffer] = []

    def commandBuffer(self) -> CommandBuffer:
        self.command_buffers.append(CommandBuffer(self))
        return self.command_buffers[-1]


class Device:
    """An MTLDevice whose compiler is the C++ front end `cxx` and whose memory is the host's."""

    def __init__(
        self, cxx: str, memory_limit: int = 1 << 30, max_threads: int = 1024, gpu: str = "Fake Metal GPU"
    ) -> None:
        self.cxx, self.memory_limit, self.max_threads, self.gpu = cxx, memory_limit, max_threads, gpu
        self.calls: list[tuple] = []
        self.fail_next: Optional[NSError] = None  # the next command buffer fails with this error
        self.queue = Queue(self)

    def name(self) -> str:
        return self.gpu

    def registryID(self) -> int:
        return id(self)

    def newCommandQueue(self) -> Queue:
        return self.queue

    def newBufferWithLength_options_(self, length: int, options: int) -> Optional[Buffer]:
        return Buffer(length) if length <= self.memory_limit else None

    def newLibraryWithSource_options_error_(self, src: str, options: Any, error: None) -> tuple:
        self.calls.append(("compile", options.settings))
        proc = subprocess.run(syntax_command(self.cxx), input=src.encode(), capture_output=True)
        if proc.returncode != 0:
            return None, NSError("program_source: " + proc.stderr.decode(errors="replace"))
        return Library(self, src), None

    def newLibraryWithData_error_(self, data: bytes, error: None) -> tuple:
        if not data.startswith(b"FAKE-METALLIB\n"):
            return None, NSError("Invalid library file")
        return Library(self, data[len(b"FAKE-METALLIB\n") :].decode()), None

    def newComputePipelineStateWithFunction_error_(self, function: tuple, error: None) -> tuple:
        library, name = function
        return Pipeline(library, name, self.max_threads), None


class CompileOptions:
    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def setFastMathEnabled_(self, value: bool) -> None:
        self.settings["fastMathEnabled"] = value


def metal_module(device: Optional[Device], *others: Device) -> SimpleNamespace:
    """A `Metal` module whose system default device is `device` (None: a Mac without a Metal device), and which has
    `others` too."""
    return SimpleNamespace(
        MTLCreateSystemDefaultDevice=lambda: device,
        MTLCopyAllDevices=lambda: [*others, device] if device is not None else [],
        MTLCompileOptions=SimpleNamespace(new=CompileOptions),
        MTLResourceStorageModeShared=0,
        MTLSize=lambda width, height, depth: (width, height, depth),
    )


def dispatch_module() -> SimpleNamespace:
    """A `libdispatch` module: dispatch data are the bytes themselves."""
    return SimpleNamespace(dispatch_data_create=lambda data, length, queue, destructor: bytes(data[:length]))
