"""What the CUDA renderer's kernels compute, checked on this CPU (see host_emulation.py): conformance cases on the
CUDAEMU device, whose kernels are tg-cuda's CUDA C++ built by g++ with UndefinedBehaviorSanitizer.

By default the cases where the CUDA spellings differ most from plain C: every ALU op on int32 / int64 (computed
unsigned), uint16 (products in unsigned int), float16 and bfloat16 (the prelude's structs), casts to and from half
and bfloat16, and two whole kernels. `TG_CUDA_EMULATION=full` runs the whole suite (about 10 minutes on two
cores), `TG_CUDA_EMULATION=0` skips this test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SUBSET = (
    "test_alu and (-int32 or -int64 or uint16 or float16 or bfloat16) or test_where_chain or test_define_var "
    "or (test_cast and (float16- or bfloat16- or -float16 or -bfloat16))"
)
MODE = os.environ.get("TG_CUDA_EMULATION", "subset")


@pytest.mark.skipif(MODE == "0", reason="TG_CUDA_EMULATION=0")
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler (g++ or $CXX)")
def test_conformance_on_emulated_cuda(tmp_path: object) -> None:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_emulation.py")
    args = [sys.executable, script, "--json", os.path.join(str(tmp_path), "cudaemu.json")]
    if MODE != "full":
        args += ["-k", SUBSET]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3600, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    assert proc.returncode == 0, f"tg-conformance on CUDAEMU failed (exit code {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
