"""Builds C source into a shared object with the system C compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from tgcore.device import CompileError, Compiler

# -fwrapv: signed overflow wraps (as numpy's integers do); -ffp-contract=off: no fused multiply-add, so results
# round like numpy's; -std=c11: _Float16 math rounds after every operation; -pipe: the stages hand over through pipes,
# not temporary files (~2-3 ms of a ~50 ms build)
CFLAGS = [
    "-shared",
    "-fPIC",
    "-O2",
    "-march=native",
    "-std=c11",
    "-fwrapv",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-pipe",
]


def find_compiler() -> str:
    """The C compiler to use: $CC, else cc, clang or gcc on PATH; FileNotFoundError says what to install."""
    if cc := os.environ.get("CC"):
        path = shutil.which(cc)
        if path is None:
            raise FileNotFoundError(f"the C compiler CC={cc!r} was not found on PATH")
        return path
    for name in ("cc", "clang", "gcc"):
        if (path := shutil.which(name)) is not None:
            return path
    raise FileNotFoundError("no C compiler found (tried $CC, cc, clang, gcc): install gcc or clang, or set CC")


class ClangCompiler(Compiler):
    """C source -> shared object bytes."""

    def __init__(self) -> None:
        self.cc = find_compiler()
        self.cachekey = f"compile_clang_{os.path.basename(self.cc)}"

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tg_clang_") as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run(
                [self.cc, *CFLAGS, "-x", "c", "-", "-o", out, "-lm"],
                input=src.encode(),
                capture_output=True,
                check=False,
            )
            if proc.returncode != 0:
                raise CompileError(
                    f"{os.path.basename(self.cc)} failed with exit code {proc.returncode}",
                    log=proc.stderr.decode(errors="replace"),
                    src=src,
                )
            with open(out, "rb") as f:
                return f.read()
