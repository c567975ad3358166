"""tg-opencl: the OPENCL device. Kernels are rendered to OpenCL C, built by the platform's compiler through pyopencl
into program binaries, and launched on cl.Buffer memory. `CL_PLATFORM` (an index or part of a name) picks the
platform; its devices are OPENCL, OPENCL:1, ... Without a GPU, PoCL from pip (`tg-opencl[pocl]`) runs it on the CPU.
"""

from __future__ import annotations

from typing import Any, Optional

from tg_opencl.allocator import OpenCLAllocator
from tg_opencl.cl_platform import DEVICE, OpenCLUnavailable, get_platform
from tg_opencl.compiler import OpenCLCompiler
from tg_opencl.renderer import OpenCLRenderer
from tg_opencl.runtime import OpenCLProgram
from tgcore.dtype import DType, dtypes
from tgcore.plugin import ALL_DTYPES, DeviceSpec, hookimpl, part_for

__version__ = "0.2.0"
API_VERSION = (2, 0)  # the tgcore plugin API this plugin is built for
# what every OpenCL device computes (bfloat16 in float: see renderer.py); half and double only where every device
# reports cl_khr_fp16 / cl_khr_fp64
BASE_DTYPES: tuple[DType, ...] = tuple(dt for dt in ALL_DTYPES if dt not in (dtypes.float16, dtypes.float64))


def probe(device: str = DEVICE) -> Optional[str]:
    """None when an OpenCL platform has the device `device` ("OPENCL" or "OPENCL:N") and builds kernels for it, else
    why it cannot run here.
    (The core calls it with no argument, for the device's base name.)"""
    try:
        platform = get_platform()
        return platform.build_problem(platform.index(device))
    except (OpenCLUnavailable, ValueError) as e:
        return str(e)


def device_dtypes() -> tuple[DType, ...]:
    """The dtypes the platform's devices all compute: the base set, plus half and double where reported."""
    try:
        infos = get_platform().infos
    except OpenCLUnavailable:
        return BASE_DTYPES
    extra: list[DType] = []
    if all(i.fp16 for i in infos):
        extra.append(dtypes.float16)
    if all(i.fp64 for i in infos):
        extra.append(dtypes.float64)
    return BASE_DTYPES + tuple(extra)


@hookimpl
def tg_register_devices(registry: Any) -> None:
    try:
        description = f"OpenCL C through pyopencl on {get_platform().describe()}"
    except OpenCLUnavailable:
        description = "OpenCL C through pyopencl (no OpenCL platform here)"
    registry.add(
        DeviceSpec(
            DEVICE, API_VERSION, priority=30, probe=probe, dtypes=device_dtypes(), description=description
        )
    )


def _renderer() -> OpenCLRenderer:
    try:
        return OpenCLRenderer(get_platform().infos)
    except OpenCLUnavailable:  # rendering needs no device: render for OpenCL's guaranteed limits
        return OpenCLRenderer()


def _allocator(instance: str) -> OpenCLAllocator:
    platform = get_platform()
    return OpenCLAllocator(platform, platform.index(instance))


tg_renderer = part_for(DEVICE, _renderer)
tg_compiler = part_for(DEVICE, lambda: OpenCLCompiler(get_platform()))
tg_allocator = part_for(DEVICE, _allocator, per_instance=True)
tg_runtime = part_for(DEVICE, lambda: OpenCLProgram)
