"""CUDAEMU: the CUDA renderer's kernels run on this CPU, to check what they compute where there is no GPU.

A test-only device: its renderer is tg-cuda's CUDARenderer, its compiler builds the rendered CUDA C++ with the host
C++ compiler (g++ by default, `CXX` overrides) behind a header that stands in for CUDA's built-ins (blockIdx,
threadIdx, __int_as_float, ...), with UndefinedBehaviorSanitizer on, so a spelling that relies on undefined
behaviour (signed overflow, an oversized shift) stops the run. Its runtime runs the kernel once per thread, block
by block, sized by tg-cuda's own `launch_dims`. What differs from a GPU: the half conversions take the rendered
source's host branch (`_Float16`) instead of the PTX `cvt` instructions, the math library is the host's, and
kernels with barriers cannot be emulated (the linearizer emits none).

    python plugins/tg-cuda/tests/host_emulation.py [tg-conformance options, e.g. -k "test_alu"]

runs the conformance suite on CUDAEMU; `test_host_emulation.py` runs its uop level under pytest.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Optional

from tg_cuda.renderer import LAUNCH_FLAT, CUDARenderer
from tg_cuda.runtime import launch_dims

from tgcore.plugin import (
    ALL_DTYPES,
    PLUGIN_API_VERSION,
    CompileError,
    Compiler,
    DeviceSpec,
    MallocAllocator,
    plugin_module,
    plugins,
)
from tgcore.scratch import compile_folder, process_folder

DEVICE = "CUDAEMU"
_SHIM = r"""#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static
struct tg_dim3 { unsigned int x, y, z; };
static tg_dim3 blockIdx, threadIdx, blockDim, gridDim;
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline void __syncthreads() {}
"""
CXXFLAGS = [
    "-std=c++17",
    "-O1",
    "-shared",
    "-fPIC",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-w",
    "-fsanitize=undefined",
    "-fno-sanitize-recover=undefined",
]
_SIGNATURE = re.compile(r'^extern "C" __global__ (?:__launch_bounds__\(\d+\) )?void (\w+)\((.*)\) \{$', re.M)


def launcher(src: str) -> str:
    """C++ for `tg_launch(bufs, vals, grid, block)`, which runs the source's kernel once per thread."""
    m = _SIGNATURE.search(src)
    if m is None:
        raise CompileError("CUDAEMU: no kernel signature found in the source", log="no kernel", src=src)
    name, params = m.group(1), [p for p in m.group(2).split(", ") if p]
    args, n_buf, n_val = [], 0, 0
    for p in params:
        if "*" in p:
            args.append(f"({p.split('*')[0].strip()}*)bufs[{n_buf}]")
            n_buf += 1
        else:
            args.append(f"vals[{n_val}]")
            n_val += 1
    return f"""
extern "C" void tg_launch(void **bufs, const int *vals, const unsigned int *grid, const unsigned int *block) {{
  gridDim = tg_dim3{{grid[0], grid[1], grid[2]}};
  blockDim = tg_dim3{{block[0], block[1], block[2]}};
  for (unsigned int bz = 0; bz < grid[2]; bz++) for (unsigned int by = 0; by < grid[1]; by++)
  for (unsigned int bx = 0; bx < grid[0]; bx++) for (unsigned int tz = 0; tz < block[2]; tz++)
  for (unsigned int ty = 0; ty < block[1]; ty++) for (unsigned int tx = 0; tx < block[0]; tx++) {{
    blockIdx = tg_dim3{{bx, by, bz}};
    threadIdx = tg_dim3{{tx, ty, tz}};
    {name}({", ".join(args)});
  }}
}}
"""


class HostCompiler(Compiler):
    """Rendered CUDA C++ -> a shared object for this CPU (b"flat\\n" or b"grid\\n", then the object's bytes)."""

    def __init__(self) -> None:
        self.cxx = shutil.which(os.environ.get("CXX", "g++")) or ""
        self.cachekey = None  # the shim may change between runs: never cache on disk

    def compile(self, src: str) -> bytes:
        if not self.cxx:
            raise CompileError("CUDAEMU needs a C++ compiler: install g++ or set CXX")
        if "__syncthreads();" in src:
            raise CompileError(
                "CUDAEMU runs threads one after another: it cannot emulate a barrier", log="barrier", src=src
            )
        code = _SHIM + src + launcher(src)
        with compile_folder("cudaemu-") as tmp:  # (removed afterwards; after a kill, by the next process)
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run(
                [self.cxx, *CXXFLAGS, "-x", "c++", "-", "-o", out],
                input=code.encode(),
                capture_output=True,
                check=False,
            )
            if proc.returncode != 0:
                raise CompileError(f"{self.cxx} failed", log=proc.stderr.decode(errors="replace"), src=code)
            with open(out, "rb") as f:
                return (b"flat\n" if src.startswith(LAUNCH_FLAT) else b"grid\n") + f.read()


class HostProgram:
    """Runs an emulated kernel on host memory (the core's MallocAllocator buffers)."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        self.name, self.flat = name, lib.startswith(b"flat\n")
        fd, path = tempfile.mkstemp(prefix="cudaemu-", suffix=".so", dir=process_folder())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib[5:])
            self.lib = ctypes.CDLL(path)
        finally:
            os.unlink(path)
        self.launch = self.lib.tg_launch

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        grid, block = launch_dims(self.flat, global_size, local_size)
        if 0 in grid or 0 in block:
            return 0.0 if wait else None
        ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
        ints = (ctypes.c_int * max(len(vals), 1))(*vals)
        self.launch(ptrs, ints, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block))
        return 0.0 if wait else None


class EmulatedRenderer(CUDARenderer):
    device = DEVICE


def register() -> None:
    """Register the CUDAEMU device in this process."""
    plugins.register(
        plugin_module(
            "cudaemu",
            tg_register_devices=lambda registry: registry.add(
                DeviceSpec(DEVICE, PLUGIN_API_VERSION, priority=-1, dtypes=ALL_DTYPES)
            ),
            tg_renderer=lambda device: EmulatedRenderer() if device == DEVICE else None,
            tg_compiler=lambda device: HostCompiler() if device == DEVICE else None,
            tg_allocator=lambda device: MallocAllocator() if device == DEVICE else None,
            tg_runtime=lambda device: HostProgram if device == DEVICE else None,
        ),
        name="cudaemu",
    )


if __name__ == "__main__":
    from tg_conformance.cli import main

    register()
    sys.exit(main(["--device", DEVICE, *sys.argv[1:]]))
