"""tg-metal: the METAL device. Kernels are rendered to Metal Shading Language, built into Metal libraries and run on
shared-storage MTLBuffers through pyobjc, on macOS. Elsewhere METAL is listed as unavailable with the reason, and
its renderer still works: `tg-conformance --device METAL --render-only` renders every kernel of the suite and
parses each with a C++ front end against tg-metal's stand-in <metal_stdlib> (see tg_metal.syntax).

Importing this module imports no pyobjc: that happens on first use of the device, on macOS only.
"""

from __future__ import annotations

import platform
import sys
from typing import Any, Optional

from tg_metal.allocator import MetalAllocator
from tg_metal.compiler import MetalCompiler
from tg_metal.context import MetalUnavailable, get_context
from tg_metal.renderer import MetalRenderer
from tg_metal.runtime import MetalProgram
from tgcore.dtype import DType, dtypes
from tgcore.plugin import ALL_DTYPES, DEFAULT_TOLERANCES, DeviceSpec, hookimpl, part_for

__version__ = "0.2.0"
DEVICE = "METAL"
API_VERSION = (2, 0)  # the tgcore plugin API this plugin is built for


def probe(instance: str = DEVICE) -> Optional[str]:
    """None when this machine has the Metal device `instance` ("METAL" or "METAL:N"), else why it cannot run here."""
    try:
        get_context(instance)
    except MetalUnavailable as e:
        return str(e)
    return None


def device_dtypes() -> tuple[DType, ...]:
    """Every dtype but float64 (Metal has no double); bfloat16 needs MSL 3.1, which came with macOS 14."""
    claimed = tuple(dt for dt in ALL_DTYPES if dt != dtypes.float64)
    if sys.platform == "darwin" and _macos_major() < 14:
        claimed = tuple(dt for dt in claimed if dt != dtypes.bfloat16)
    return claimed


def _macos_major() -> int:
    version = platform.mac_ver()[0]
    return int(version.split(".")[0]) if version else 0


def _is_mine(device: str) -> bool:
    return device.partition(":")[0].upper() == DEVICE


@hookimpl
def tg_register_devices(registry: Any) -> None:
    claimed = device_dtypes()
    registry.add(
        DeviceSpec(
            DEVICE,
            API_VERSION,
            priority=40,
            probe=probe,
            dtypes=claimed,
            tolerances={dt: tol for dt, tol in DEFAULT_TOLERANCES.items() if dt in claimed},
            description="Metal Shading Language through pyobjc on macOS (render-only elsewhere)",
        )
    )


# the part hooks get the device's base name and the instance being opened (METAL, METAL:1, ...)


tg_renderer = part_for(DEVICE, MetalRenderer)  # rendering needs no Metal: it works on every OS


def _runs_here(device: str) -> bool:
    # off macOS there is no compiler, memory or runtime to give (a missing part, as `--compile-only` reports it)
    return _is_mine(device) and sys.platform == "darwin"


@hookimpl
def tg_compiler(device: str, instance: str) -> Optional[MetalCompiler]:
    return MetalCompiler(get_context(instance)) if _runs_here(device) else None


@hookimpl
def tg_allocator(device: str, instance: str) -> Optional[MetalAllocator]:
    return MetalAllocator(get_context(instance)) if _runs_here(device) else None


@hookimpl
def tg_runtime(device: str) -> Optional[type]:
    return MetalProgram if _runs_here(device) else None
