"""tg-llvm: the LLVM device. Kernels are rendered to LLVM IR, compiled to object code for this CPU by llvmlite,
loaded with llvmlite's MCJIT, and run on host memory from the core's MallocAllocator."""

from __future__ import annotations

from typing import Any, Optional

from tg_llvm.renderer import LLVMRenderer
from tgcore.plugin import ALL_DTYPES, Compiler, DeviceSpec, HostCollective, MallocAllocator, Program, hookimpl, part_for

__version__ = "0.2.0"
DEVICE = "LLVM"
API_VERSION = (2, 1)  # the tgcore plugin API this plugin is built for (2.1: tg_collective)


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
            API_VERSION,
            priority=20,
            probe=probe,
            dtypes=ALL_DTYPES,
            description="LLVM IR through llvmlite, run on this CPU by MCJIT",
        )
    )


def _compiler() -> Compiler:
    from tg_llvm.compiler import LLVMCompiler  # imported on use: without llvmlite, probe() says why LLVM is out

    return LLVMCompiler()


def _runtime() -> type[Program]:
    from tg_llvm.runtime import LLVMProgram

    return LLVMProgram


tg_renderer = part_for(DEVICE, LLVMRenderer)
tg_compiler = part_for(DEVICE, _compiler)
tg_allocator = part_for(DEVICE, MallocAllocator)
# host memory: tgcore.distributed reduces a tensor's own bytes in place, no copy through a host array
tg_collective = part_for(DEVICE, HostCollective)
tg_runtime = part_for(DEVICE, _runtime)
