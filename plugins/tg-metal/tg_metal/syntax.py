"""Checking rendered Metal where there is no Metal: parse it with a C++ front end against tg-metal's `<metal_stdlib>`.

The stand-in header (`tg_metal/include/metal_stdlib`) declares the Metal types, address-space qualifiers and
builtins the renderer emits. The front end runs with `-nostdinc`, so the kernel sees nothing else: an undeclared
name, a type error, an `as_type` between different sizes, arithmetic on bfloat or unbalanced braces fail the check.
It cannot check Metal's own rules (attributes, address-space conversions): only Metal's compiler, on macOS, does.

`TG_METAL_SYNTAX_CHECK=1` turns the check on (and fails when no front end is found), `=0` turns it off; unset, it
is on where Metal is not (every OS but macOS) and a front end exists. The front end is `$TG_METAL_CXX`, else the
first of clang++, g++, c++ on PATH.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Optional

from tgcore.plugin import CompileError

ENV_CHECK = "TG_METAL_SYNTAX_CHECK"
ENV_CXX = "TG_METAL_CXX"
INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
# C++14 is the language MSL is built on; -fsigned-char and an LP64 target give Metal's char and long
CXX_FLAGS = ["-std=c++14", "-fsigned-char", "-nostdinc", "-nostdinc++", "-I", INCLUDE_DIR, "-Wno-attributes", "-w"]
_TIMEOUT_S = 120


class MetalSyntaxError(CompileError):
    """A rendered Metal kernel failed to parse under the C++ front end; carries its log and the source."""


def find_cxx() -> Optional[str]:
    """The C++ front end to check with: $TG_METAL_CXX, else clang++, g++ or c++ on PATH; None if there is none."""
    if cxx := os.environ.get(ENV_CXX):
        return shutil.which(cxx)
    for name in ("clang++", "g++", "c++"):
        if (path := shutil.which(name)) is not None:
            return path
    return None


def syntax_check_enabled() -> bool:
    """Whether renderings are checked: as TG_METAL_SYNTAX_CHECK says, else off macOS wherever a front end exists."""
    setting = os.environ.get(ENV_CHECK, "").strip()
    if setting:
        return setting != "0"
    return sys.platform != "darwin" and find_cxx() is not None


def check_syntax(name: str, src: str) -> None:
    """Parse `src` (the kernel `name`) with the C++ front end; MetalSyntaxError with its log when it does not parse."""
    cxx = find_cxx()
    if cxx is None:
        wanted = os.environ.get(ENV_CXX)
        raise MetalSyntaxError(
            f"{ENV_CHECK} asks for a syntax check of kernel {name}, but "
            + (f"{ENV_CXX}={wanted!r} is not on PATH" if wanted else "no C++ front end (clang++, g++, c++) is on PATH")
            + f": install g++ or clang++, or set {ENV_CHECK}=0"
        )
    log = _parse(cxx, src)
    if log is not None:
        raise MetalSyntaxError(
            f"the Metal source of kernel {name} does not parse under {os.path.basename(cxx)} with tg-metal's "
            f"<metal_stdlib> ({INCLUDE_DIR})",
            log=log,
            src=src,
        )


def syntax_command(cxx: str) -> list[str]:
    """The command line that checks a source read from stdin."""
    return [cxx, "-fsyntax-only", *CXX_FLAGS, "-x", "c++", "-"]


@functools.lru_cache(maxsize=4096)
def _parse(cxx: str, src: str) -> Optional[str]:
    """None when `src` parses, else the front end's messages (each source is parsed once per process)."""
    try:
        proc = subprocess.run(
            syntax_command(cxx), input=src.encode(), capture_output=True, check=False, timeout=_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"{cxx} did not finish parsing within {_TIMEOUT_S} s"
    except OSError as e:  # removed or made unrunnable since it was found (raised, not cached: it may come back)
        raise MetalSyntaxError(
            f"the C++ front end {cxx} cannot be run ({type(e).__name__}: {e.strerror or e}): reinstall it, set "
            f"{ENV_CXX} to another (clang++ or g++), or set {ENV_CHECK}=0 to render without the check"
        ) from e
    if proc.returncode == 0:
        return None
    return proc.stderr.decode(errors="replace").strip() or f"{cxx} exited with code {proc.returncode} and no message"
