"""A small ctypes binding of NVRTC, CUDA's runtime compiler, found in the `nvidia-cuda-nvrtc` wheel (no GPU and no
CUDA toolkit needed). `TG_CUDA_NVRTC` names another libnvrtc.so to use.

The wheels put the library in the `nvidia` namespace package: `nvidia/cu13/lib/libnvrtc.so.13` for CUDA 13,
`nvidia/cuda_nvrtc/lib/libnvrtc.so.12` for CUDA 12. NVRTC opens its builtins library (`libnvrtc-builtins.so.X.Y`)
by name at compile time; it lies beside libnvrtc but no loader path points there, so it is loaded first, globally.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from typing import Optional

NVRTC_ENV = "TG_CUDA_NVRTC"
_INSTALL_HINT = "`pip install nvidia-cuda-nvrtc` (or set TG_CUDA_NVRTC to a libnvrtc.so)"


class NVRTCUnavailable(RuntimeError):
    """NVRTC cannot be loaded; the message says where it was looked for and what to do."""


class NVRTCError(RuntimeError):
    """An NVRTC call other than the compilation itself failed."""


@dataclass(frozen=True)
class CompileResult:
    """What one nvrtcCompileProgram gave: success, the program log, and the PTX (empty on failure)."""

    ok: bool
    log: str
    ptx: bytes


def nvidia_dirs() -> list[str]:
    """The folders of the `nvidia` namespace package, where NVIDIA's wheels install."""
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations or []) if spec is not None else []


def _major_of(path: str) -> int:
    m = re.search(r"libnvrtc\.so\.(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else 0


def candidate_paths() -> list[str]:
    """Where libnvrtc is looked for, in order: the pip wheels (newest CUDA first), then the system's CUDA."""
    found: list[str] = []
    for root in nvidia_dirs():
        for sub in ("cu*/lib", "cuda_nvrtc/lib"):
            found += [p for p in glob.glob(os.path.join(root, sub, "libnvrtc.so.*")) if ".alt." not in p]
    found.sort(key=_major_of, reverse=True)
    for cuda in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cuda:
            found += sorted(glob.glob(os.path.join(cuda, "lib64", "libnvrtc.so*")), key=_major_of, reverse=True)
    return found + ["libnvrtc.so"]  # last: whatever the dynamic loader finds


class NVRTC:
    """libnvrtc with the functions tg-cuda uses."""

    def __init__(self, path: str) -> None:
        builtins = sorted(
            p for p in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")) if ".alt." not in p
        )
        for b in builtins:  # NVRTC dlopens it by soname at compile time: have it loaded already
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        c = ctypes
        signatures = {
            "nvrtcVersion": (c.POINTER(c.c_int), c.POINTER(c.c_int)),
            "nvrtcGetNumSupportedArchs": (c.POINTER(c.c_int),),
            "nvrtcGetSupportedArchs": (c.POINTER(c.c_int),),
            "nvrtcCreateProgram": (
                c.POINTER(c.c_void_p),
                c.c_char_p,
                c.c_char_p,
                c.c_int,
                c.POINTER(c.c_char_p),
                c.POINTER(c.c_char_p),
            ),
            "nvrtcDestroyProgram": (c.POINTER(c.c_void_p),),
            "nvrtcCompileProgram": (c.c_void_p, c.c_int, c.POINTER(c.c_char_p)),
            "nvrtcGetPTXSize": (c.c_void_p, c.POINTER(c.c_size_t)),
            "nvrtcGetPTX": (c.c_void_p, c.c_char_p),
            "nvrtcGetProgramLogSize": (c.c_void_p, c.POINTER(c.c_size_t)),
            "nvrtcGetProgramLog": (c.c_void_p, c.c_char_p),
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = list(argtypes), c.c_int
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [c.c_int], c.c_char_p
        major, minor = c.c_int(), c.c_int()
        self._check("nvrtcVersion", lib.nvrtcVersion(c.byref(major), c.byref(minor)))
        self.version: tuple[int, int] = (major.value, minor.value)
        n = c.c_int()
        self._check("nvrtcGetNumSupportedArchs", lib.nvrtcGetNumSupportedArchs(c.byref(n)))
        archs = (c.c_int * n.value)()
        self._check("nvrtcGetSupportedArchs", lib.nvrtcGetSupportedArchs(archs))
        self.supported_archs: tuple[int, ...] = tuple(archs)  # e.g. (75, 80, ..., 90, ...)

    def _check(self, call: str, result: int) -> None:
        if result != 0:
            raise NVRTCError(f"{call} failed: {self.lib.nvrtcGetErrorString(result).decode()} ({result})")

    def compile(self, src: str, options: list[str], name: str = "tg_kernel.cu") -> CompileResult:
        """Compile CUDA C++ `src` with `options`; the log and, when it succeeded, the PTX."""
        c, lib = ctypes, self.lib
        prog = c.c_void_p()
        self._check(
            "nvrtcCreateProgram", lib.nvrtcCreateProgram(c.byref(prog), src.encode(), name.encode(), 0, None, None)
        )
        try:
            opts = (c.c_char_p * len(options))(*[o.encode() for o in options])
            result = lib.nvrtcCompileProgram(prog, len(options), opts)
            size = c.c_size_t()
            self._check("nvrtcGetProgramLogSize", lib.nvrtcGetProgramLogSize(prog, c.byref(size)))
            log = c.create_string_buffer(size.value)
            self._check("nvrtcGetProgramLog", lib.nvrtcGetProgramLog(prog, log))
            text = log.value.decode(errors="replace")
            if result != 0:
                status = lib.nvrtcGetErrorString(result).decode()
                return CompileResult(False, text.strip() or status, b"")
            self._check("nvrtcGetPTXSize", lib.nvrtcGetPTXSize(prog, c.byref(size)))
            ptx = c.create_string_buffer(size.value)
            self._check("nvrtcGetPTX", lib.nvrtcGetPTX(prog, ptx))
            return CompileResult(True, text, ptx.value)
        finally:
            lib.nvrtcDestroyProgram(c.byref(prog))


_lock = threading.Lock()
_loaded: dict[Optional[str], NVRTC] = {}


def load_nvrtc() -> NVRTC:
    """NVRTC, loaded once per process (per TG_CUDA_NVRTC value); NVRTCUnavailable says why it cannot be."""
    override = os.environ.get(NVRTC_ENV)
    with _lock:
        if override in _loaded:
            return _loaded[override]
        paths = [override] if override else candidate_paths()
        errors = []
        for path in paths:
            try:
                nvrtc = NVRTC(path)
            except (OSError, AttributeError, NVRTCError) as e:
                errors.append(f"{path}: {e}")
                continue
            _loaded[override] = nvrtc
            return nvrtc
    if override:
        raise NVRTCUnavailable(f"{NVRTC_ENV}={override!r} is not a usable NVRTC library: {errors[0]}")
    raise NVRTCUnavailable(f"NVRTC (libnvrtc.so) not found: {_INSTALL_HINT}; looked in: " + "; ".join(errors[-4:]))
