"""`python -m tgcore new-plugin NAME`: writes a device plugin package to start a backend from.

The package is a complete, working device: a C renderer on the core's C-family base, the system C compiler to a
shared object, a Program that loads it with ctypes, the core's host allocator, a DeviceSpec with a probe, a test
against numpy, a README that says what to change first, and a tox.ini that runs the plugin's tests and
`tg-conformance --device NAME`. It passes the conformance suite as generated, on a machine with a C compiler.

The templates are the strings below (no package data to ship); `@NAME@`, `@DEVICE@`, `@PACKAGE@`, `@DIST@` and
`@CLASS@` are replaced by the plugin's names (see PluginNames).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from tgcore.registry import plugins

__all__ = ["PluginNames", "ScaffoldError", "check_unused", "main", "plugin_files", "plugin_names", "write_plugin"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class ScaffoldError(ValueError):
    """The plugin cannot be written as asked; the message says what was wrong and what to do."""


@dataclass(frozen=True)
class PluginNames:
    """The names one plugin name gives: "my_dev" -> device MY_DEV, module tg_my_dev, distribution tg-my-dev."""

    name: str  # the entry-point name, lower case: "my_dev"
    device: str  # the device name: "MY_DEV"
    package: str  # the import name: "tg_my_dev"
    distribution: str  # the pip name, also the folder written: "tg-my-dev"
    cls: str  # the prefix of the plugin's class names: "MyDev"


def plugin_names(name: str) -> PluginNames:
    """The names of plugin `name`; ScaffoldError when it is not an identifier of letters, digits and _."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ScaffoldError(
            f"plugin name {name!r} is not a valid identifier: expected a letter followed by letters, digits or _ "
            "(e.g. mydev or my_dev); it names the device (MYDEV), the module (tg_mydev) and the package (tg-mydev)"
        )
    lower = name.lower()
    cls = "".join(part[:1].upper() + part[1:] for part in lower.split("_"))
    return PluginNames(lower, lower.upper(), f"tg_{lower}", "tg-" + lower.replace("_", "-"), cls)


def check_unused(names: PluginNames) -> None:
    """ScaffoldError when an installed plugin (or a built-in device) already uses the device or plugin name."""
    plugins.load()
    claims = [r.plugin for r in plugins.registry.registrations if r.device == names.device]
    if claims:
        raise ScaffoldError(
            f"device {names.device} already exists (registered by plugin {claims[0]!r}): choose another name "
            "(`python -m tgcore devices` lists the devices installed here)"
        )
    if names.name in plugins.records:
        raise ScaffoldError(
            f"a plugin named {names.name!r} is already installed ({plugins.records[names.name].source}): choose "
            "another name (`python -m tgcore devices` lists the plugins installed here)"
        )


def plugin_files(names: PluginNames) -> dict[str, str]:
    """The generated package: relative path -> text."""
    subst = {
        "@NAME@": names.name,
        "@DEVICE@": names.device,
        "@PACKAGE@": names.package,
        "@DIST@": names.distribution,
        "@CLASS@": names.cls,
    }
    files = {}
    for path, template in _TEMPLATES.items():
        for key, value in subst.items():
            path, template = path.replace(key, value), template.replace(key, value)
        files[path] = template
    return files


def write_plugin(name: str, directory: Optional[os.PathLike[str] | str] = None, check: bool = True) -> pathlib.Path:
    """Write plugin `name`'s package into `directory` (default ./tg-name) and return that folder.

    ScaffoldError for an invalid name, a name in use (with `check`), or a folder that exists and is not empty."""
    names = plugin_names(name)
    if check:
        check_unused(names)
    root = pathlib.Path(directory if directory is not None else names.distribution)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ScaffoldError(f"{root} already exists and is not an empty folder: choose another with --dir")
    for path, text in plugin_files(names).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m tgcore new-plugin NAME [--dir DIR]`: 0 on success, 2 with the reason on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m tgcore new-plugin", description="Write a device plugin package to start a backend from."
    )
    parser.add_argument("name", help="the plugin's name, an identifier (mydev: device MYDEV, package tg-mydev)")
    parser.add_argument("--dir", help="the folder to write (default: ./tg-NAME); it must not exist or be empty")
    args = parser.parse_args(argv)
    try:
        root = write_plugin(args.name, args.dir)
    except ScaffoldError as e:
        print(f"python -m tgcore new-plugin: {e}", file=sys.stderr)
        return 2
    names = plugin_names(args.name)
    print(f"wrote {names.distribution} (device {names.device}) to {root}")
    print(f"next: pip install {root} && python -m tgcore devices && tg-conformance --device {names.device}")
    print(f"      then read {root / 'README.md'}: what to change first")
    return 0


# ***** the templates *****

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "@DIST@"
version = "0.1.0"
description = "The @DEVICE@ device for tgcore"
readme = "README.md"
requires-python = ">=3.10"
# tgcore 0.2.x serves plugin API 2 (its version is 0.<API major>.<release>): the range this plugin is built for
dependencies = ["tgcore>=0.2,<0.3"]

[project.optional-dependencies]
test = ["pytest>=7", "numpy"]

# how tgcore finds the plugin: on first use of Device it imports this module and calls its hooks
[project.entry-points.tgcore]
@NAME@ = "@PACKAGE@"

[tool.setuptools]
packages = ["@PACKAGE@"]
"""

_INIT = '''\
"""@DIST@: the @DEVICE@ device for tgcore.

tgcore asks a plugin for a device's four parts through four hooks: a renderer (UOps -> C source), a compiler
(source -> shared object bytes), an allocator (the buffers' memory) and a runtime (the Program class that runs a
compiled kernel). Each hook answers None for a device that is not this plugin's.
"""

from __future__ import annotations

from typing import Any, Optional

# the names this plugin takes from tgcore's contract, all here
from tgcore.dtype import dtypes
from tgcore.plugin import ALL_DTYPES, DeviceSpec, MallocAllocator, Program, hookimpl

from @PACKAGE@.compiler import @CLASS@Compiler, find_compiler
from @PACKAGE@.renderer import @CLASS@Renderer
from @PACKAGE@.runtime import @CLASS@Program

__version__ = "0.1.0"
DEVICE = "@DEVICE@"
# the tgcore plugin API this plugin is written for, (major, minor): it loads on a tgcore that serves 2.y, y >= 0
API_VERSION = (2, 0)
# the dtypes the device claims (tg-conformance tests these, and skips the others saying so): float16 and bfloat16
# need a renderer that spells them in C (see the README), so they are left out until it does
DTYPES = tuple(dt for dt in ALL_DTYPES if dt not in (dtypes.float16, dtypes.bfloat16))


def probe() -> Optional[str]:
    """None when @DEVICE@ can run here, else why not: it needs a C compiler."""
    try:
        find_compiler()
    except FileNotFoundError as e:
        return str(e)
    return None


@hookimpl
def tg_register_devices(registry: Any) -> None:
    # priority decides the default device among those available (the built-in PYTHON device has 0): keep it below
    # the devices you do not mean to replace
    registry.add(
        DeviceSpec(DEVICE, API_VERSION, priority=1, probe=probe, dtypes=DTYPES, description="C on this CPU")
    )


@hookimpl
def tg_renderer(device: str) -> Optional[@CLASS@Renderer]:
    return @CLASS@Renderer() if device == DEVICE else None


@hookimpl
def tg_compiler(device: str) -> Optional[@CLASS@Compiler]:
    return @CLASS@Compiler() if device == DEVICE else None


@hookimpl
def tg_allocator(device: str) -> Optional[MallocAllocator]:
    # host memory (ctypes arrays, cached by size): the Program receives these objects as its buffers. A device with
    # memory of its own subclasses tgcore's Allocator instead (alloc / free / copyin / copyout)
    return MallocAllocator() if device == DEVICE else None


@hookimpl
def tg_runtime(device: str) -> Optional[type[Program]]:
    return @CLASS@Program if device == DEVICE else None
'''

_RENDERER = '''\
"""UOps -> C source, on tgcore's C-family renderer: the base walks the UOps and spells every op; a dialect sets the
attributes the optimizer reads and overrides the few spellings that differ."""

from __future__ import annotations

# the names this module takes from tgcore, all here
from tgcore.renderer.cstyle import CStyleLanguage


class @CLASS@Renderer(CStyleLanguage):
    """C kernels: `void name(T *restrict data0, const T *restrict data1, ..., const int var0, ...)`, the buffers in
    the order of the kernel's DEFINE_GLOBALs, then its DEFINE_VARs as int32."""

    device = "@DEVICE@"
    # global_max is None (the base's default): the kernel's global dimensions become loops inside it, as a CPU runs
    # them. For speed, set vector_widths first (e.g. {dtypes.float32: 8} for AVX): see tgcore's docs/plugins.md.
    # The base's type_map (fixed-width C types) and prelude (math.h, stdint.h, stdbool.h) are standard C: a dialect
    # overrides the spellings that differ, e.g. type_map for a type of its own, render_prelude for other headers
'''

_COMPILER = '''\
"""C source -> shared object bytes, built by the system C compiler (CC, else gcc, cc or clang)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

# the names this module takes from tgcore, all here
from tgcore.plugin import CompileError, Compiler

# -fwrapv: signed integers wrap as numpy's do; -ffp-contract=off: every + - * rounds on its own (no fused multiply-add);
# -fno-math-errno: sqrtf is one instruction. Add -march=native here to build for this CPU (and say so in cachekey)
CFLAGS = ["-shared", "-fPIC", "-O2", "-std=c11", "-fwrapv", "-ffp-contract=off", "-fno-math-errno"]


def find_compiler() -> str:
    """The C compiler's path: $CC, else gcc, cc or clang on PATH; FileNotFoundError says what to install."""
    if cc := os.environ.get("CC"):
        if (path := shutil.which(cc)) is None:
            raise FileNotFoundError(f"the C compiler CC={cc!r} was not found on PATH")
        return path
    for name in ("gcc", "cc", "clang"):
        if (path := shutil.which(name)) is not None:
            return path
    raise FileNotFoundError("no C compiler found (tried $CC, gcc, cc, clang): install gcc or clang, or set CC")


class @CLASS@Compiler(Compiler):
    """Builds a kernel's C source into a shared object; tgcore caches the bytes (in memory and on disk)."""

    def __init__(self) -> None:
        self.cc = find_compiler()
        # the disk-cache table of the built kernels: another compiler (or other flags) must not reuse them
        stat = os.stat(os.path.realpath(self.cc))
        stamp = f"{os.path.realpath(self.cc)} {stat.st_size} {stat.st_mtime_ns} {CFLAGS}"
        self.cachekey = f"compile_@NAME@_{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
        # what `python -m tgcore devices` and tg-conformance's report name as this device's compiler
        self.identity = f"{os.path.basename(self.cc)} {' '.join(CFLAGS)}"

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="@DIST@-") as tmp:
            out = os.path.join(tmp, "kernel.so")
            try:  # an argument list, never a shell; the source comes on stdin
                proc = subprocess.run(
                    [self.cc, *CFLAGS, "-x", "c", "-", "-o", out, "-lm"], input=src.encode(), capture_output=True
                )
            except OSError as e:
                raise CompileError(f"the C compiler {self.cc} cannot be run ({e}): reinstall it or set CC") from e
            if proc.returncode != 0:  # the log goes with the error: tgcore shows its first lines and the source
                raise CompileError(
                    f"{os.path.basename(self.cc)} failed (exit code {proc.returncode})",
                    log=proc.stderr.decode(errors="replace"),
                    src=src,
                )
            with open(out, "rb") as f:
                return f.read()
'''

_RUNTIME = '''\
"""Runs a compiled kernel: loads the shared object with ctypes and calls the kernel on the buffers' addresses."""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from typing import Any, Optional

# the names this module takes from tgcore, all here
from tgcore.plugin import Program


class @CLASS@Program(Program):
    """One kernel of a shared object, made as `Program(instance, name, lib)` by tgcore (instance: "@DEVICE@" or
    "@DEVICE@:1", name: the kernel's function, lib: the compiler's bytes).

    Called as `prog(*bufs, global_size=None, local_size=None, vals=(), wait=False)`: `bufs` are the allocator's
    buffers (here ctypes arrays of host memory) in the order of the kernel's DEFINE_GLOBALs, `vals` the values of
    its DEFINE_VARs in order. It returns the seconds the kernel took when `wait` is true (after it has finished),
    else None. The launch sizes are for devices with a grid (a GPU); this renderer loops instead, so they are None.
    """

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        self.device, self.name = device, name
        with tempfile.TemporaryDirectory(prefix="@DIST@-") as tmp:  # dlopen needs a file; the mapping outlives it
            path = os.path.join(tmp, "kernel.so")
            with open(path, "wb") as f:
                f.write(lib)
            self.lib = ctypes.CDLL(path)
        self.fxn = getattr(self.lib, name)  # (ctypes releases the GIL while the kernel runs)

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        # the C signature: one pointer per buffer, then one int per variable
        args = [ctypes.c_void_p(ctypes.addressof(b)) for b in bufs] + [ctypes.c_int(v) for v in vals]
        start = time.perf_counter()
        self.fxn(*args)  # synchronous: the results are in the buffers when it returns
        return time.perf_counter() - start if wait else None
'''

_TEST = '''\
"""@DEVICE@ against numpy: one kernel, one reduction, and the compile error's log."""

from __future__ import annotations

import numpy as np
import pytest

from @PACKAGE@ import DEVICE
from tgcore import Device, Tensor
from tgcore.plugin import CompileError


def test_elementwise_kernel_matches_numpy() -> None:
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.linspace(-1, 1, 4, dtype=np.float32)
    got = (Tensor(a, device=DEVICE) * Tensor(b, device=DEVICE) + 1).numpy()
    np.testing.assert_array_equal(got, a * b + 1)


def test_reduction_matches_numpy() -> None:
    a = np.arange(-50, 51, dtype=np.int32).reshape(101, 1) * np.arange(7, dtype=np.int32)
    np.testing.assert_array_equal(Tensor(a, device=DEVICE).sum(axis=0).numpy(), a.sum(axis=0))


def test_bad_source_raises_compile_error_with_the_log() -> None:
    with pytest.raises(CompileError) as info:
        Device[DEVICE].compiler.compile("void broken( {")
    assert info.value.log.strip()
'''

_TOX = """\
# The plugin's CI: its tests, then the tgcore conformance suite on @DEVICE@ (which exits non-zero on any failure).
# tgcore and tg-conformance come from TGCORE and TG_CONFORMANCE (a path to a tgcore checkout and to its
# tests/conformance folder, or a version to install), e.g. TGCORE=../tgcore TG_CONFORMANCE=../tgcore/tests/conformance
[tox]
envlist = py
skipsdist = true

[testenv]
skip_install = true
deps =
    {env:TGCORE:tgcore}
    {env:TG_CONFORMANCE:tg-conformance}
    {toxinidir}
    pytest>=7
setenv =
    CACHEDB = {envtmpdir}/cache.db
passenv = CC
commands =
    python -m tgcore devices
    pytest -q {toxinidir}/tests
    tg-conformance --device @DEVICE@ --json {envtmpdir}/conformance-@NAME@.json
"""

_README = """\
# @DIST@

The @DEVICE@ device for tgcore, as `python -m tgcore new-plugin @NAME@` wrote it: kernels rendered to C, built by
the system C compiler (`CC`, else gcc, cc or clang) into a shared object, loaded with ctypes, run on host memory.
It passes `tg-conformance --device @DEVICE@` as it is; make it yours from there, one part at a time, running the
suite after each change.

    pip install ./@DIST@                  # beside tgcore (and tg-conformance, to test it)
    python -m tgcore devices              # @DEVICE@ should say "available"
    pytest @DIST@/tests
    tg-conformance --device @DEVICE@      # the op x dtype table, a JSON report, exit 1 on any failure
    tox -c @DIST@/tox.ini                 # both, in a fresh venv (see tox.ini for where tgcore comes from)

| file | the part | hook |
|---|---|---|
| `@PACKAGE@/__init__.py` | the DeviceSpec (name, priority, probe, dtypes, tolerances) and the four hooks | all |
| `@PACKAGE@/renderer.py` | UOps -> C source, on `tgcore.renderer.cstyle.CStyleLanguage` | `tg_renderer` |
| `@PACKAGE@/compiler.py` | C source -> shared object bytes (a failed build raises `CompileError`) | `tg_compiler` |
| `@PACKAGE@/runtime.py` | the Program: loads the bytes, calls the kernel on the buffers | `tg_runtime` |
| (tgcore's `MallocAllocator`) | host memory for the buffers | `tg_allocator` |

## What to change first

1. The name, description and priority in `__init__.py` (priority decides which available device is the default).
2. Speed on this CPU: `-march=native` in `compiler.py`'s CFLAGS, and `vector_widths = {dtypes.float32: 8}` (AVX)
   on the renderer, so the optimizer upcasts to whole vector registers.
3. A device with memory of its own: an Allocator subclass (alloc / free / copyin / copyout) in place of
   MallocAllocator, and a Program that passes that memory's handles to the kernel.
4. A language other than C: keep the renderer's base where it is C-like (OpenCL C, CUDA C, Metal), overriding the
   spellings that differ (types, kernel signature, barriers, launched indices), or write a Renderer from scratch.
5. float16 and bfloat16: spell them in the renderer, then add them to DTYPES in `__init__.py`.

The contract, the UOp IR and what each renderer attribute changes are in tgcore's `docs/plugins.md`.
"""

_TEMPLATES: dict[str, str] = {
    "pyproject.toml": _PYPROJECT,
    "README.md": _README,
    "tox.ini": _TOX,
    "@PACKAGE@/__init__.py": _INIT,
    "@PACKAGE@/renderer.py": _RENDERER,
    "@PACKAGE@/compiler.py": _COMPILER,
    "@PACKAGE@/runtime.py": _RUNTIME,
    "tests/test_@NAME@.py": _TEST,
}
