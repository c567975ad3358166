"""Checking rendered OpenCL C where no OpenCL platform can build it: parse it with clang's OpenCL front end.

Where the platform cannot build kernels (the probe says why; e.g. PoCL 3.0 from pip on a CPU its LLVM does not know),
`tg-conformance --device OPENCL --render-only` with `TG_OPENCL_SYNTAX_CHECK=1` still checks every kernel it renders:
clang parses it as OpenCL C 1.2 with the standard builtin declarations (`-finclude-default-header`) and with the
half and double extensions on, so an undeclared name, a wrong builtin or a type error fails with clang's log and the
source. `TG_OPENCL_CLANG` names the front end (default: `clang` on PATH). Off unless asked for: where the platform
builds, its own compiler checks more.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Optional

from tgcore.plugin import CompileError

ENV_CHECK = "TG_OPENCL_SYNTAX_CHECK"
ENV_CLANG = "TG_OPENCL_CLANG"
FLAGS = [
    "-x",
    "cl",
    "-cl-std=CL1.2",
    "-Xclang",
    "-finclude-default-header",
    "-Xclang",
    "-cl-ext=+cl_khr_fp16,+cl_khr_fp64",
]
_TIMEOUT_S = 120


class OpenCLSyntaxError(CompileError):
    """A rendered OpenCL kernel failed to parse under clang's OpenCL front end; carries its log and the source."""


def syntax_check_enabled() -> bool:
    return os.environ.get(ENV_CHECK, "").strip() not in ("", "0")


def find_clang() -> Optional[str]:
    return shutil.which(os.environ.get(ENV_CLANG) or "clang")


def check_syntax(name: str, src: str) -> None:
    """Parse `src` (kernel `name`) as OpenCL C; OpenCLSyntaxError with clang's log when it does not parse."""
    clang = find_clang()
    if clang is None:
        raise OpenCLSyntaxError(
            f"{ENV_CHECK} asks for a syntax check of kernel {name}, but no OpenCL front end "
            f"({os.environ.get(ENV_CLANG) or 'clang'}) is on PATH: install clang, or set {ENV_CHECK}=0"
        )
    log = _parse(clang, src)
    if log is not None:
        raise OpenCLSyntaxError(
            f"the OpenCL C source of kernel {name} does not parse under {os.path.basename(clang)}", log=log, src=src
        )


@functools.lru_cache(maxsize=4096)
def _parse(clang: str, src: str) -> Optional[str]:
    """None when `src` parses, else clang's messages (each source is parsed once per process)."""
    try:
        proc = subprocess.run(
            [clang, "-fsyntax-only", *FLAGS, "-"],
            input=src.encode(),
            capture_output=True,
            check=False,
            timeout=_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{clang} did not finish parsing within {_TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    return proc.stderr.decode(errors="replace").strip() or f"{clang} exited with code {proc.returncode} and no message"
