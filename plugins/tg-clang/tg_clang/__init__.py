"""tg-clang: the CLANG device. Kernels are rendered to C, compiled to a shared object by the system C compiler
(`CC` overrides), loaded through cffi, and run on host memory from the core's MallocAllocator."""

from __future__ import annotations

from typing import Any, Optional

from tg_clang.compiler import ClangCompiler, find_compiler
from tg_clang.renderer import ClangRenderer
from tg_clang.runtime import ClangProgram
from tgcore.device import MallocAllocator
from tgcore.dtype import dtypes
from tgcore.plugin import ALL_DTYPES, PLUGIN_API_VERSION, DeviceSpec, hookimpl

__version__ = "0.1.0"
DEVICE = "CLANG"


def probe() -> Optional[str]:
    """None when a C compiler is found, else why CLANG cannot run here."""
    try:
        find_compiler()
    except FileNotFoundError as e:
        return str(e)
    return None


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            DEVICE,
            PLUGIN_API_VERSION,
            priority=10,
            probe=probe,
            dtypes=tuple(d for d in ALL_DTYPES if d != dtypes.bfloat16),
            description="C through the system compiler, run on this CPU",
        )
    )


@hookimpl
def tg_renderer(device: str) -> Optional[ClangRenderer]:
    return ClangRenderer() if device == DEVICE else None


@hookimpl
def tg_compiler(device: str) -> Optional[ClangCompiler]:
    return ClangCompiler() if device == DEVICE else None


@hookimpl
def tg_allocator(device: str) -> Optional[MallocAllocator]:
    return MallocAllocator() if device == DEVICE else None


@hookimpl
def tg_runtime(device: str) -> Optional[type]:
    return ClangProgram if device == DEVICE else None
