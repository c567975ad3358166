"""`python -m tg_cuda`: what tg-cuda found here: NVRTC, the target architecture, ptxas, the driver and the GPUs.
Exits with 0 when CUDA can run kernels here, 2 when it cannot (the last line says why)."""

from __future__ import annotations

import sys

import tg_cuda
from tg_cuda.driver import DriverUnavailable, describe_devices
from tg_cuda.nvrtc import NVRTCUnavailable
from tgcore.plugin import CompileError


def main() -> int:
    try:
        print(f"compiler: {tg_cuda.CUDACompiler(tg_cuda.target_arch()).describe()}")
    except (NVRTCUnavailable, ValueError, CompileError) as e:
        print(f"compiler: unavailable: {e}")
    try:
        print(f"GPUs: {describe_devices()}")
    except DriverUnavailable as e:
        print(f"GPUs: none: {e}")
    reason = tg_cuda.probe()
    print(f"CUDA: {'available' if reason is None else 'unavailable: ' + reason}")
    return 0 if reason is None else 2


if __name__ == "__main__":
    sys.exit(main())
