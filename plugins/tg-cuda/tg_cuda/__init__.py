"""tg-cuda: the CUDA device. Kernels are rendered to CUDA C++, compiled by NVRTC (from the `nvidia-cuda-nvrtc`
wheel) to PTX, and run through the CUDA driver API on cuMemAlloc memory. `CUDA` is GPU 0, `CUDA:N` is GPU N.

Without an NVIDIA driver or GPU the device is listed as unavailable with the reason, and its renderer and compiler
still answer, so `tg-conformance --device CUDA --compile-only` renders and compiles every kernel to PTX.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from tg_cuda.allocator import CUDAAllocator
from tg_cuda.compiler import ARCH_ENV, DEFAULT_ARCH, CUDACompiler, parse_arch
from tg_cuda.driver import (
    DEVICE,
    CUDAError,
    DriverUnavailable,
    describe_devices,
    device_count,
    driver,
    open_device,
    ordinal_of,
)
from tg_cuda.nvrtc import NVRTCUnavailable, load_nvrtc
from tg_cuda.renderer import CUDARenderer
from tg_cuda.runtime import CUDAProgram
from tgcore.plugin import ALL_DTYPES, DeviceSpec, hookimpl, part_for

__version__ = "0.2.0"
API_VERSION = (2, 0)  # the tgcore plugin API this plugin is built for


def probe(instance: str = DEVICE) -> Optional[str]:
    """None when `instance` ("CUDA" or "CUDA:N") can run kernels here, else why not. (The core asks about the
    device with no argument and about each instance, e.g. "CUDA:1", with its name.)"""
    try:
        ordinal = ordinal_of(instance)
        count = device_count()
        if count == 0:
            return "the NVIDIA driver sees no CUDA device"
        if ordinal >= count:
            return f"there is no CUDA device {ordinal}: this machine has {count} ({describe_devices()})"
        gpu = open_device(ordinal)
        driver_version = driver().version()
    except (DriverUnavailable, CUDAError, ValueError) as e:
        return str(e)
    try:
        nvrtc = load_nvrtc()
    except NVRTCUnavailable as e:
        return f"{e} (kernels cannot be compiled for {gpu.name})"
    arch = gpu.compute_capability[0] * 10 + gpu.compute_capability[1]
    if arch not in nvrtc.supported_archs and ARCH_ENV not in os.environ:
        return (
            f"{gpu.name} is sm_{arch}, which NVRTC {nvrtc.version[0]}.{nvrtc.version[1]} does not compile for "
            f"(it supports sm_{min(nvrtc.supported_archs)} and newer): install an nvidia-cuda-nvrtc for this GPU"
        )
    if driver_version < nvrtc.version:
        return (
            f"the NVIDIA driver supports CUDA {driver_version[0]}.{driver_version[1]}, older than NVRTC "
            f"{nvrtc.version[0]}.{nvrtc.version[1]}, whose PTX it cannot load: install "
            f"nvidia-cuda-nvrtc=={driver_version[0]}.{driver_version[1]}.* or update the driver"
        )
    return None


def target_arch(instance: str = DEVICE) -> int:
    """The architecture kernels for `instance` are compiled for: $TG_CUDA_ARCH, else the GPU's, else sm_90."""
    if env := os.environ.get(ARCH_ENV):
        return parse_arch(env)
    try:
        gpu = open_device(ordinal_of(instance))
    except (DriverUnavailable, CUDAError, ValueError):
        return DEFAULT_ARCH
    return gpu.compute_capability[0] * 10 + gpu.compute_capability[1]


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            DEVICE,
            API_VERSION,
            priority=40,
            probe=probe,
            dtypes=ALL_DTYPES,
            description="CUDA C++ compiled by NVRTC to PTX, run through the CUDA driver API",
        )
    )


tg_renderer = part_for(DEVICE, CUDARenderer)
tg_compiler = part_for(DEVICE, lambda instance: CUDACompiler(target_arch(instance)), per_instance=True)
tg_allocator = part_for(DEVICE, lambda instance: CUDAAllocator(open_device(ordinal_of(instance))), per_instance=True)
tg_runtime = part_for(DEVICE, lambda: CUDAProgram)
