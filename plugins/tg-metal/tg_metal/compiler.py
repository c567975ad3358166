"""Builds Metal Shading Language into a Metal library and returns its bytes, so the disk cache skips the build.

The bytes are a small container, never a pickle: a header, then the serialized MTLLibrary (or, where this macOS
cannot serialize one, the source, which the runtime builds again when it loads the kernel):

    b"TGMT" | u8 kind (1 library, 2 source) | u8 flags (bit 0: indexed by thread_position_in_grid) | 2 x 0 |
    u64 payload length | payload

The flag tells the runtime how to launch the kernel (see renderer.py): dispatchThreads for a kernel indexed by its
thread's position in the grid, dispatchThreadgroups for one indexed by threadgroup.
"""

from __future__ import annotations

import hashlib
import platform
import struct
from dataclasses import dataclass
from typing import Any

from tg_metal.context import MetalContext, describe
from tgcore.plugin import CompileError, Compiler

_MAGIC = b"TGMT"
_HEADER = struct.Struct("<4sBBxxQ")
LIBRARY, SOURCE = 1, 2
_GRID_FLAG = 1
GRID_MARKER = "[[thread_position_in_grid]]"


@dataclass(frozen=True)
class MetalLibrary:
    """What a compiled kernel is: a serialized library (or its source), and how it is launched."""

    kind: int  # LIBRARY or SOURCE
    grid_indexed: bool  # dispatchThreads (True) or dispatchThreadgroups (False)
    payload: bytes


def pack_library(lib: MetalLibrary) -> bytes:
    return _HEADER.pack(_MAGIC, lib.kind, _GRID_FLAG if lib.grid_indexed else 0, len(lib.payload)) + lib.payload


def unpack_library(data: bytes) -> MetalLibrary:
    """Inverse of pack_library; ValueError on anything else."""
    if len(data) < _HEADER.size or data[:4] != _MAGIC:
        raise ValueError("not a Metal kernel of tg-metal: the bytes do not start with TGMT")
    _, kind, flags, length = _HEADER.unpack_from(data)
    if kind not in (LIBRARY, SOURCE):
        raise ValueError(f"a tg-metal kernel of unknown kind {kind}")
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise ValueError(f"a tg-metal kernel cut short: {len(payload)} of {length} bytes")
    return MetalLibrary(kind, bool(flags & _GRID_FLAG), payload)


def compile_options(metal: Any) -> Any:
    """MTLCompileOptions without fast math: IEEE NaN and infinity, precise math functions, no reassociation."""
    options = metal.MTLCompileOptions.new()
    options.setFastMathEnabled_(False)
    if hasattr(options, "setMathMode_") and hasattr(metal, "MTLMathModeSafe"):  # macOS 15
        options.setMathMode_(metal.MTLMathModeSafe)
    if hasattr(options, "setMathFloatingPointFunctions_") and hasattr(metal, "MTLMathFloatingPointFunctionsPrecise"):
        options.setMathFloatingPointFunctions_(metal.MTLMathFloatingPointFunctionsPrecise)
    return options


class MetalCompiler(Compiler):
    """Metal Shading Language -> a serialized Metal library for this Mac's GPU."""

    def __init__(self, context: MetalContext) -> None:
        self.context = context
        identity = f"{self.context.name}\n{platform.mac_ver()[0]}"
        self.cachekey = "compile_metal_" + hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.identity = f"Metal library compiler for {self.context.name} (macOS {platform.mac_ver()[0]})"

    def compile(self, src: str) -> bytes:
        if "\x00" in src:  # Metal's compiler would read the source only up to it
            at = src.index("\x00")
            raise CompileError(
                f"Metal source contains a NUL character at offset {at}",
                log=f"the source has a NUL character at offset {at}; Metal's compiler stops reading there",
                src=src,
            )
        metal = self.context.metal
        library, error = self.context.device.newLibraryWithSource_options_error_(src, compile_options(metal), None)
        if library is None:
            log = describe(error)
            raise CompileError(f"Metal could not compile the kernel: {log.splitlines()[0] if log else ''}", log, src)
        grid_indexed = GRID_MARKER in src
        serialize = getattr(library, "libraryDataContents", None)  # not in Metal's public headers: may be missing
        if serialize is None:
            return pack_library(MetalLibrary(SOURCE, grid_indexed, src.encode()))
        return pack_library(MetalLibrary(LIBRARY, grid_indexed, bytes(serialize().bytes().tobytes())))
