"""tg-llvm: the LLVM device. Kernels are rendered to LLVM IR, compiled to object code for this CPU by llvmlite,
loaded with llvmlite's MCJIT, and run on host memory from the core's MallocAllocator."""

from __future__ import annotations

from typing import Any, Optional

from tg_llvm.renderer import LLVMRenderer
from tgcore.device import MallocAllocator
from tgcore.plugin import ALL_DTYPES, PLUGIN_API_VERSION, DeviceSpec, hookimpl

__version__ = "0.2.0"
DEVICE = "LLVM"


def probe() -> Optional[str]:
    """None when llvmlite imports and can make a target machine for this CPU, else why LLVM cannot run here."""
    try:
        from tg_llvm.compiler import host_target_machine

        host_target_machine(0)
    except ImportError as e:
        return f"llvmlite is not importable ({e}): pip install llvmlite"
    except Exception as e:  # llvmlite raises RuntimeError for a host it cannot target
        return f"llvmlite cannot target this CPU: {type(e).__name__}: {e}"
    return None


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            DEVICE,
            PLUGIN_API_VERSION,
            priority=20,
            probe=probe,
            dtypes=ALL_DTYPES,
            description="LLVM IR through llvmlite, run on this CPU by MCJIT",
        )
    )


@hookimpl
def tg_renderer(device: str) -> Optional[LLVMRenderer]:
    return LLVMRenderer() if device == DEVICE else None


@hookimpl
def tg_compiler(device: str) -> Any:
    if device != DEVICE:
        return None
    from tg_llvm.compiler import LLVMCompiler  # imported on use: without llvmlite, probe() says why LLVM is out

    return LLVMCompiler()


@hookimpl
def tg_allocator(device: str) -> Optional[MallocAllocator]:
    return MallocAllocator() if device == DEVICE else None


@hookimpl
def tg_runtime(device: str) -> Optional[type]:
    if device != DEVICE:
        return None
    from tg_llvm.runtime import LLVMProgram

    return LLVMProgram
