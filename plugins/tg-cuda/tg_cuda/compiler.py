"""CUDA C++ -> PTX through NVRTC, and (where a ptxas that reads that PTX exists) PTX -> SASS as a check.

The target architecture is `TG_CUDA_ARCH` when it is set (`sm_90`, `90` or `compute_90`), else the device's own,
else sm_90 on a machine without a GPU. The PTX is what the runtime loads (the driver JIT-compiles it for the GPU).

`ptxas`, when it runs, assembles every PTX for `-arch=sm_XX` and throws the result away: a kernel that NVRTC
accepts but that ptxas rejects fails to compile here, not on a GPU. `TG_CUDA_PTXAS` controls it: unset, ptxas
runs when one is found (the `nvidia-cuda-nvcc` wheel's, on PATH, or in /usr/local/cuda/bin) whose CUDA release is
at least NVRTC's (an older one cannot read the newer PTX); `0` never runs it; `1` requires it; a path names it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from tg_cuda.nvrtc import NVRTC, load_nvrtc, nvidia_dirs
from tgcore.plugin import CompileError, Compiler, compile_folder

ARCH_ENV = "TG_CUDA_ARCH"
PTXAS_ENV = "TG_CUDA_PTXAS"
DEFAULT_ARCH = 90  # sm_90 (Hopper) where no device says otherwise
# -fmad=false: a*b+c rounds twice, like numpy (and MULACC's definition); the rest are NVRTC's defaults, stated:
# IEEE division and square root, denormals kept. -w: the numpy-exact spellings compare constants, which warns.
NVRTC_OPTIONS = ["-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "--std=c++17", "-w"]
MARKER = "// tg-cuda "  # leading source lines with this prefix are launch metadata, copied to the top of the PTX


def parse_arch(text: str) -> int:
    """ "sm_90", "compute_90", "90" or "9.0" -> 90; ValueError for anything else."""
    m = re.fullmatch(r"\s*(?:sm_|compute_)?(\d)\.?(\d{1,2})a?\s*", text)
    if m is None:
        raise ValueError(f"{ARCH_ENV}={text!r} is not a CUDA architecture: expected e.g. sm_90, compute_86 or 90")
    return int(m.group(1) + m.group(2))


@dataclass(frozen=True)
class Ptxas:
    """A ptxas executable and the CUDA release it comes from."""

    path: str
    release: tuple[int, int]


def ptxas_release(path: str) -> tuple[int, int]:
    """The CUDA release of a ptxas (from `ptxas --version`); ValueError if it does not say."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if m is None:
        raise ValueError(f"{path} --version does not name a CUDA release: {out.strip()[:200]!r}")
    return int(m.group(1)), int(m.group(2))


def _ptxas_candidates() -> list[str]:
    found = []
    for root in nvidia_dirs():  # the nvidia-cuda-nvcc wheel
        for sub in ("cu*/bin/ptxas", "cuda_nvcc/bin/ptxas"):
            found += sorted(glob.glob(os.path.join(root, sub)), reverse=True)
    if (on_path := shutil.which("ptxas")) is not None:
        found.append(on_path)
    found.append("/usr/local/cuda/bin/ptxas")
    return [p for p in dict.fromkeys(found) if os.path.isfile(p) and os.access(p, os.X_OK)]


def find_ptxas(nvrtc_version: tuple[int, int]) -> tuple[Optional[Ptxas], str]:
    """(the ptxas to check PTX with, or None; a line that says which and why) under TG_CUDA_PTXAS.

    Raises CompileError when TG_CUDA_PTXAS asks for a ptxas that cannot be had."""
    setting = os.environ.get(PTXAS_ENV, "").strip()
    if setting.lower() in ("0", "off", "no", "false"):
        return None, f"ptxas not run ({PTXAS_ENV}={setting})"
    required = bool(setting)
    named = setting if setting and setting.lower() not in ("1", "on", "yes", "true") else None
    candidates = [named] if named else _ptxas_candidates()
    rejected = []
    for path in candidates:
        try:
            release = ptxas_release(path)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            rejected.append(f"{path}: {e}")
            continue
        if release < nvrtc_version:
            rejected.append(
                f"{path} is from CUDA {release[0]}.{release[1]}, older than NVRTC {nvrtc_version[0]}.{nvrtc_version[1]}"
                f" (it cannot read that PTX): install nvidia-cuda-nvcc=={nvrtc_version[0]}.{nvrtc_version[1]}.* or "
                f"nvidia-cuda-nvrtc=={release[0]}.{release[1]}.*"
            )
            continue
        return Ptxas(path, release), f"ptxas {path} (CUDA {release[0]}.{release[1]})"
    why = "; ".join(rejected) if rejected else "no ptxas found (nvidia-cuda-nvcc wheel, PATH, /usr/local/cuda/bin)"
    if required:
        raise CompileError(f"{PTXAS_ENV}={setting} asks for ptxas, and none can be used: {why}")
    return None, f"ptxas not run: {why}"


class CUDACompiler(Compiler):
    """CUDA C++ source -> PTX text (bytes) for one architecture, checked by ptxas where it can be."""

    def __init__(self, arch: int = DEFAULT_ARCH, nvrtc: Optional[NVRTC] = None) -> None:
        self.nvrtc = nvrtc if nvrtc is not None else load_nvrtc()
        if arch not in self.nvrtc.supported_archs:
            supported = ", ".join(f"sm_{a}" for a in self.nvrtc.supported_archs)
            raise ValueError(
                f"NVRTC {self.nvrtc.version[0]}.{self.nvrtc.version[1]} cannot compile for sm_{arch}; it supports "
                f"{supported}: set {ARCH_ENV} to one of them, or install an nvidia-cuda-nvrtc that supports sm_{arch}"
            )
        self.arch = arch
        self.options = [f"--gpu-architecture=compute_{arch}", *NVRTC_OPTIONS]
        self.ptxas, self.ptxas_note = find_ptxas(self.nvrtc.version)
        identity = [f"nvrtc {self.nvrtc.version}", *self.options]
        if self.ptxas is not None:  # a kernel compiled without the ptxas check must be checked when it is on
            identity.append(f"ptxas {self.ptxas.release} sm_{arch}")
        self.cachekey = f"compile_cuda_sm{arch}_" + hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
        self.identity = self.describe()

    def describe(self) -> str:
        major, minor = self.nvrtc.version
        return f"NVRTC {major}.{minor} ({self.nvrtc.path}) for sm_{self.arch}; {self.ptxas_note}"

    def compile(self, src: str) -> bytes:
        if "\x00" in src:  # NVRTC takes a C string: it would compile only what precedes the NUL
            at = src.index("\x00")
            raise CompileError(
                f"CUDA source contains a NUL character at offset {at}",
                log=f"the source has a NUL character at offset {at}; NVRTC stops reading there",
                src=src,
            )
        result = self.nvrtc.compile(src, self.options)
        if not result.ok:
            major, minor = self.nvrtc.version
            raise CompileError(
                f"NVRTC {major}.{minor} failed to compile for compute_{self.arch}", log=result.log, src=src
            )
        metadata = [line for line in src.splitlines()[:8] if line.startswith(MARKER)]
        ptx = "".join(line + "\n" for line in metadata).encode() + result.ptx
        if self.ptxas is not None:
            self.assemble(ptx, src)
        return ptx

    def assemble(self, ptx: bytes, src: str = "") -> bytes:
        """SASS (a cubin) for sm_XX from `ptx`, by ptxas; CompileError with ptxas's messages when it fails."""
        if self.ptxas is None:
            raise CompileError(f"cannot assemble PTX: {self.ptxas_note}")
        # ptxas reads and writes files: in a folder of this process's own, which a later process removes should this
        # one be killed mid-compile (tgcore/renderer/scratch.py)
        with compile_folder("ptxas-") as tmp:
            ptx_path, cubin_path = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
            with open(ptx_path, "wb") as f:
                f.write(ptx)
            try:
                proc = subprocess.run(
                    [self.ptxas.path, f"-arch=sm_{self.arch}", "-o", cubin_path, ptx_path],
                    capture_output=True,
                    timeout=300,
                    check=False,
                )
            except OSError as e:  # removed or made unrunnable since it was found
                raise CompileError(
                    f"ptxas {self.ptxas.path} cannot be run ({type(e).__name__}: {e.strerror or e}): reinstall it "
                    f"(pip install nvidia-cuda-nvcc), point {PTXAS_ENV} at another, or set {PTXAS_ENV}=0 to skip "
                    "the check"
                ) from e
            except subprocess.TimeoutExpired as e:
                raise CompileError(f"ptxas {self.ptxas.path} did not finish within {e.timeout:g} s", src=src) from e
            if proc.returncode != 0:
                log = (proc.stderr or proc.stdout).decode(errors="replace").strip()
                raise CompileError(
                    f"ptxas -arch=sm_{self.arch} rejected the PTX that NVRTC made (exit code {proc.returncode})",
                    log=log or f"exit code {proc.returncode}",
                    src=src + "\n/* --- PTX --- */\n" + ptx.decode(errors="replace"),
                )
            with open(cubin_path, "rb") as f:
                return f.read()
