"""Builds C source into a shared object with the system C compiler (gcc or clang) for the toolchain's -march."""

from __future__ import annotations

import os
import subprocess
from typing import Optional

from tg_clang.renderer import KERNEL_PRELUDE
from tg_clang.toolchain import Toolchain, find_compiler
from tgcore.plugin import CompileError, Compiler, compile_folder

__all__ = ["CFLAGS", "GCC_CFLAGS", "ClangCompiler", "find_compiler"]

# -O1: the kernels come vectorized and unrolled as rendered, so -O2's passes made them no faster (matmul, convs,
# sums, whole models within noise) and cost a third more compile time (EfficientNet-B0's 74 kernels: 9.6 -> 6.3 s);
# -fwrapv: signed overflow wraps (as numpy's integers do); -ffp-contract=off: no fused multiply-add but the explicit
# fmaf / fma of MULACC, so every + - * rounds on its own on every compiler (clang's default would fuse within an
# expression); -std=c11; -fno-math-errno: sqrtf is one instruction; -pipe: the stages hand over through pipes, not
# temporary files (~2-3 ms of a ~50 ms build). float16 and bfloat16 are computed in float and rounded in plain C (see
# renderer.py), so no flag decides how they round. The -march comes from the Toolchain (TG_CLANG_MARCH)
CFLAGS = [
    "-shared",
    "-fPIC",
    "-O1",
    "-std=c11",
    "-fwrapv",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-pipe",
]
# gcc only (clang has no such pass): no bit-level constant propagation (which bits of a value are known: alignments,
# masks). The rendered kernels spell their constants and vector loads out, so it found nothing that made them faster
# (ResNet-50 and EfficientNet-B0 steady times within noise, A/B) and cost a sixth of the build: ResNet-50's 41
# kernels (15 compiler runs) 4.2 -> 3.5 s of compiler CPU on a Zen 3 core, twice each. No dead-store elimination
# (-fno-tree-dse, -fno-dse): a rendered kernel stores each value once, where it is needed, so gcc 12 emitted the same
# instructions for all of EfficientNet-B0's 99 kernels and 36 of ResNet-50's 37 (the other: two more stores of a
# spilled register), and the builds of those 136 kernels took 6-10% less compiler CPU (16.2-18.0 -> 15.2-15.8 s on a
# Zen 3 core, three runs each; ResNet-50's alone 6.6-7.5 -> 5.8-7.3)
GCC_CFLAGS = ["-fno-tree-bit-ccp", "-fno-tree-dse", "-fno-dse"]


class ClangCompiler(Compiler):
    """C source -> shared object bytes."""

    concurrent = True  # each compile is a process of its own, in a folder of its own
    # kernels built in one run (compile_many): a run costs ~60 ms of CPU before its first kernel (starting the
    # compiler, the assembler and the linker, and the prelude: gcc 12 on a Zen 3 core), as much as a small kernel's
    # build, so runs of up to 12 rather than 4 (compile_ahead makes at least two groups a thread): first calls with an
    # empty cache on two Zen 3 cores, three pairs each, EfficientNet-B0 (99 kernels) 4.93 / 5.15 / 5.63 -> 4.91 / 4.30
    # / 5.02 s, its compiler CPU 13-27% less (5.2-6.2 -> 3.9-4.8 s); ResNet-50 (37) 3.18 / 3.48 / 3.86 -> 2.88 / 3.27
    # / 3.99 s, compiler CPU 11-18% less
    batch = 12

    def __init__(self, toolchain: Optional[Toolchain] = None) -> None:
        self.toolchain = toolchain if toolchain is not None else Toolchain.resolve()
        self.cc = self.toolchain.cc
        # the compiler, its version and the target's features (the -march and, for native, this CPU's) decide the
        # object code: a cache shared between compilers or targets must not hand one's kernels to the other
        self.cachekey = f"compile_clang_{_identifier(self.toolchain.name)}_{self.toolchain.identity}"
        self.cflags = CFLAGS + (GCC_CFLAGS if self.toolchain.is_gcc else [])
        flags = " ".join(flag for flag in self.cflags if flag.startswith(("-O", "-fno-")))
        self.identity = f"{self.toolchain.name} {self.toolchain.version} {flags} -march={self.toolchain.march}"

    def compile(self, src: str) -> bytes:
        # the compiler reads the source from stdin; the shared object goes to a folder of this process's own, which a
        # later process removes should this one be killed mid-compile (tgcore/renderer/scratch.py)
        with compile_folder("clang-") as tmp:
            out = os.path.join(tmp, "kernel.so")
            try:
                proc = subprocess.run(
                    [self.cc, *self.cflags, *self.toolchain.flags, "-x", "c", "-", "-o", out, "-lm"],
                    input=src.encode(),
                    capture_output=True,
                    check=False,
                )
            except OSError as e:  # removed or made unrunnable since CLANG found it
                raise CompileError(
                    f"the C compiler {self.cc} cannot be run ({type(e).__name__}: {e.strerror or e}): reinstall it, "
                    "or set CC to a C compiler on PATH (gcc or clang) and start again"
                ) from e
            if proc.returncode != 0:
                how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
                raise CompileError(
                    f"{self.toolchain.name} -march={self.toolchain.march} {how} (exit code {proc.returncode})",
                    log=proc.stderr.decode(errors="replace"),
                    src=src,
                )
            with open(out, "rb") as f:
                return f.read()


    def compile_many(self, srcs: list[str]) -> list[bytes]:
        """One shared object with every kernel of `srcs` (their prelude once), the same bytes for each."""
        if not all(src.startswith(KERNEL_PRELUDE) for src in srcs):  # (sources ClangRenderer did not render)
            return super().compile_many(srcs)
        lib = self.compile(KERNEL_PRELUDE + "".join(src[len(KERNEL_PRELUDE) :] for src in srcs))
        return [lib] * len(srcs)


def _identifier(name: str) -> str:
    """`name` with every character that is not a letter, digit or _ replaced by _ (a cache table name)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
