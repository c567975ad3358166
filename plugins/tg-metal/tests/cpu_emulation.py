"""Running rendered Metal kernels on this CPU, for tests: tg-metal's stand-in <metal_stdlib> defines what it declares,
so a rendered kernel is also a C++ function. Kernels are built (many at once) into a shared object with UBSan, which
reports a spelling that leans on undefined behaviour (signed overflow, an oversized shift, ...), and a kernel is
called once per thread: over the grid, or over each threadgroup's threads in turn (right for kernels without
barriers; a barrier needs threads that run together, so kernels with one are refused).

This checks the spellings' arithmetic against numpy; it says nothing about Metal's compiler or GPU (the accuracy of
its exp2, whether it flushes float32 subnormals, ...): only a Mac can.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from tg_metal.syntax import CXX_FLAGS

from tgcore.scratch import compile_folder

# the syntax check's flags, plus code generation with UBSan (whose default checks leave IEEE float division by zero
# alone) and no fused multiply-add
BUILD_FLAGS = [*CXX_FLAGS, "-O1", "-shared", "-fPIC", "-fsanitize=undefined", "-ffp-contract=off"]
_QUALIFIERS = {"const", "device", "threadgroup", "constant"}


@dataclass
class EmulatedKernel:
    """A rendered kernel and what its driver needs: element types of its buffers and how many ints, in binding
    order, and whether it is indexed by threadgroup."""

    name: str
    src: str
    buffer_types: list[str]
    n_vars: int
    grouped: bool

    @staticmethod
    def from_source(name: str, src: str) -> EmulatedKernel:
        if "threadgroup_barrier" in src:
            raise ValueError(f"kernel {name} has a barrier: its threads must run together, which the emulation cannot")
        m = re.search(rf"kernel void {re.escape(name)}\((.*?)\) {{", src)
        if m is None:
            raise ValueError(f"no kernel named {name} in the source")
        types, n_vars = [], 0
        for arg in m.group(1).split(", "):
            decl = arg.split("[[")[0].strip()
            if "*" in decl:
                types.append(" ".join(w for w in decl.split("*")[0].split() if w not in _QUALIFIERS))
            elif decl.startswith("constant int&"):
                n_vars += 1
        return EmulatedKernel(name, src, types, n_vars, "[[thread_position_in_threadgroup]]" in src)

    def driver(self) -> str:
        """`extern "C" void tg_run_<name>(void **bufs, int *vals, int *grid, int *group)`: every thread in turn."""
        args = [f"({t}*)bufs[{i}]" for i, t in enumerate(self.buffer_types)]
        args += [f"vals[{i}]" for i in range(self.n_vars)]
        position = "uint3((uint)x, (uint)y, (uint)z)"
        if self.grouped:
            call = f"{self.name}({', '.join(args + [position, 'uint3((uint)lx, (uint)ly, (uint)lz)'])});"
            call = (
                "for (int lz = 0; lz < group[2]; lz++) for (int ly = 0; ly < group[1]; ly++) "
                f"for (int lx = 0; lx < group[0]; lx++) {call}"
            )
        else:
            call = f"{self.name}({', '.join(args + [position])});"
        return (
            f'extern "C" void tg_run_{self.name}(void **bufs, int *vals, int *grid, int *group) {{\n'
            "  for (int z = 0; z < grid[2]; z++) for (int y = 0; y < grid[1]; y++) for (int x = 0; x < grid[0]; x++)\n"
            f"    {call}\n}}\n"
        )


def _sanitizer_runtime(cxx: str) -> list[str]:
    """clang links UBSan's runtime into executables only: a shared object needs it shared, and found at load."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    if "clang" not in version:
        return []
    runtime_dir = subprocess.run([cxx, "--print-runtime-dir"], capture_output=True, text=True).stdout.strip()
    return ["-shared-libsan", f"-Wl,-rpath,{runtime_dir}"]


class EmulatedLibrary:
    """Kernels built into one shared object with `cxx`."""

    def __init__(self, cxx: str, kernels: Sequence[EmulatedKernel], workdir: Optional[str] = None) -> None:
        self.kernels = {k.name: k for k in kernels}
        source = "".join(k.src + k.driver() for k in kernels)
        # built in a folder of this process's own (removed once loaded; after a kill, by the next process)
        with contextlib.ExitStack() as stack:
            folder = workdir or stack.enter_context(compile_folder("metal-emulation-"))
            path = os.path.join(folder, "kernels.so")
            proc = subprocess.run(
                [cxx, *BUILD_FLAGS, *_sanitizer_runtime(cxx), "-x", "c++", "-", "-o", path, "-lm"],
                input=source.encode(),
                capture_output=True,
            )
            if proc.returncode != 0:
                log = proc.stderr.decode(errors="replace")
                raise RuntimeError(f"{cxx} could not build the emulated kernels:\n{log}")
            self.lib = ctypes.CDLL(path)

    def run(
        self,
        name: str,
        pointers: Sequence[int],
        vals: Sequence[int],
        grid: Sequence[int],
        group: Sequence[int] = (1, 1, 1),
    ) -> None:
        """Run kernel `name` on the memory at `pointers` (one address per buffer, in binding order)."""
        k = self.kernels[name]
        if len(pointers) != len(k.buffer_types) or len(vals) != k.n_vars:
            raise ValueError(f"kernel {name} takes {len(k.buffer_types)} buffers and {k.n_vars} ints")
        ptrs = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
        ints = (ctypes.c_int * max(1, len(vals)))(*vals)
        dims = [(ctypes.c_int * 3)(*(list(d) + [1] * (3 - len(d)))) for d in (grid, group)]
        getattr(self.lib, f"tg_run_{name}")(ptrs, ints, *dims)


def address(data: Any) -> int:
    """The address of a writable buffer (a bytearray or a numpy array)."""
    return ctypes.addressof((ctypes.c_char * len(memoryview(data).cast("B"))).from_buffer(data))
