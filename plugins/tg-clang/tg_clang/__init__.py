"""tg-clang: the CLANG device. Kernels are rendered to C, compiled to a shared object by the system C compiler
(`CC` overrides), loaded through cffi, and run on host memory from the core's MallocAllocator."""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Any, Optional

from tg_clang.compiler import ClangCompiler
from tg_clang.renderer import ClangRenderer, probe_kernel
from tg_clang.runtime import ClangProgram
from tg_clang.toolchain import MARCH_ENV, Toolchain, find_compiler
from tgcore.plugin import (
    ALL_DTYPES,
    CompileError,
    DeviceSpec,
    HostCollective,
    MallocAllocator,
    hookimpl,
    part_for,
    process_folder,
)

__all__ = ["ClangCompiler", "ClangProgram", "ClangRenderer", "Toolchain", "check_toolchain", "find_compiler", "probe"]
__version__ = "0.2.0"
DEVICE = "CLANG"
# the tgcore plugin API this plugin is built for (2.1: tg_collective; 2.2: Compiler.batch; 2.3: Program.run_parts)
API_VERSION = (2, 3)
_LOG_LINES = 6  # of a failed build's log, in the reason CLANG is unavailable


def probe() -> Optional[str]:
    """None when CLANG's compiler (CC) builds, and this CPU runs, a kernel for its target (TG_CLANG_MARCH), else why
    CLANG cannot run here."""
    try:
        toolchain = Toolchain.resolve()
    except (FileNotFoundError, ValueError) as e:
        return str(e)
    except CompileError as e:
        return f"{e.args[0].splitlines()[0]}: {_first_lines(e.log)}"
    return check_toolchain(toolchain)


def check_toolchain(toolchain: Toolchain) -> Optional[str]:
    """None when `toolchain` builds a kernel this CPU runs, else why not. The probe kernel calls every routine of the
    kernel header (the builtins they use differ by compiler and target); it goes through the disk cache, so a later
    process pays a lookup, not a build."""
    if missing := toolchain.missing_on_host():
        return (
            f"{MARCH_ENV}={toolchain.march} builds for instructions this CPU lacks ({', '.join(missing)}): choose a "
            f"-march this CPU runs (e.g. native, x86-64-v2) or unset {MARCH_ENV}"
        )
    name, src = probe_kernel()
    try:
        _call(name, ClangCompiler(toolchain).compile_cached(src))
    except CompileError as e:
        return f"{toolchain.name} -march={toolchain.march} cannot build a CLANG kernel: {_first_lines(e.log)}"
    except OSError as e:  # a shared object this system cannot load
        return f"a kernel built by {toolchain.name} -march={toolchain.march} does not load: {e}"
    return None


def _call(name: str, lib: bytes) -> None:
    """Load shared object `lib` and call its kernel `name` with no buffers, through ctypes: cffi's first use parses C
    declarations (~30 ms), which a process that never runs a CLANG kernel should not pay for at discovery."""
    fd, path = tempfile.mkstemp(prefix="probe-", suffix=".so", dir=process_folder())  # (see runtime.py)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lib)
        kernel = getattr(ctypes.CDLL(path), name)
    finally:
        os.unlink(path)
    kernel(None, None)


def _first_lines(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    more = f" ... ({len(lines) - _LOG_LINES} more lines)" if len(lines) > _LOG_LINES else ""
    return " | ".join(lines[:_LOG_LINES]) + more


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            DEVICE,
            API_VERSION,
            priority=10,
            probe=probe,
            dtypes=ALL_DTYPES,
            description="C through the system compiler, run on this CPU",
        )
    )


tg_renderer = part_for(DEVICE, ClangRenderer)
tg_compiler = part_for(DEVICE, ClangCompiler)
tg_allocator = part_for(DEVICE, MallocAllocator)
# host memory: tgcore.distributed reduces a tensor's own bytes in place, no copy through a host array
tg_collective = part_for(DEVICE, HostCollective)
tg_runtime = part_for(DEVICE, lambda: ClangProgram)
