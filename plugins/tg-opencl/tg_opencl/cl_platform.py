"""Finding OpenCL: the platform (`CL_PLATFORM` picks one), its devices as OPENCL, OPENCL:1, ..., one context that
holds them all, one in-order queue per device, and what each device reports (extensions and limits).

pyopencl is imported here, lazily, so that discovering the plugin costs nothing until OPENCL is used. Everything
that can go wrong on a machine without OpenCL becomes an `OpenCLUnavailable` whose message says what to do.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Optional

PLATFORM_ENV = "CL_PLATFORM"  # a platform index, or a case-insensitive part of its name or vendor
DEVICE = "OPENCL"
_INSTALL_HINT = (
    "install an OpenCL driver (ICD) for your hardware, or `pip install 'tg-opencl[pocl]'` for PoCL on this CPU"
)


class OpenCLUnavailable(RuntimeError):
    """OpenCL cannot be used here; the message says why and what to do."""


@dataclass(frozen=True)
class DeviceInfo:
    """What one OpenCL device reports about itself."""

    name: str
    driver_version: str
    version: str
    extensions: frozenset[str]
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_size: int  # bytes of __local memory per work-group
    local_mem_dedicated: bool  # __local memory is on-chip (CL_LOCAL), not a part of global memory (a CPU's)
    mem_base_addr_align: int  # bytes; a sub-buffer must start at a multiple of it
    correctly_rounded_divide_sqrt: bool  # float32 `/` and sqrt can be built to round like IEEE (and numpy)
    profiling: bool  # its queues can time kernels with events

    @property
    def fp16(self) -> bool:
        return "cl_khr_fp16" in self.extensions

    @property
    def fp64(self) -> bool:
        return "cl_khr_fp64" in self.extensions

    @property
    def build_key(self) -> str:
        """Devices with equal keys run the same program binary."""
        return f"{self.name} | {self.driver_version} | {self.version}"

    @staticmethod
    def of(dev: Any) -> DeviceInfo:
        import pyopencl as cl

        single_fp = dev.single_fp_config
        return DeviceInfo(
            name=dev.name.strip(),
            driver_version=dev.driver_version.strip(),
            version=dev.version.strip(),
            extensions=frozenset(dev.extensions.split()),
            max_work_group_size=int(dev.max_work_group_size),
            max_work_item_sizes=tuple(int(s) for s in dev.max_work_item_sizes),
            local_mem_size=int(dev.local_mem_size),
            local_mem_dedicated=dev.local_mem_type == cl.device_local_mem_type.LOCAL,
            mem_base_addr_align=max(1, int(dev.mem_base_addr_align) // 8),
            correctly_rounded_divide_sqrt=bool(single_fp & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT),
            profiling=bool(dev.queue_properties & cl.command_queue_properties.PROFILING_ENABLE),
        )


class OpenCLPlatform:
    """The chosen platform: its devices (OPENCL:N is `devices[N]`), a shared context, and a queue per device."""

    def __init__(self, platform: Any, devices: list[Any]) -> None:
        import pyopencl as cl

        self.platform, self.devices = platform, devices
        self.name = platform.name.strip()
        self.version = platform.version.strip()
        self.infos = [DeviceInfo.of(d) for d in devices]
        # one context for every device of the platform: a buffer of OPENCL is usable by OPENCL:1 too
        self.context = cl.Context(devices)
        self.queues = [
            cl.CommandQueue(
                self.context, d, properties=cl.command_queue_properties.PROFILING_ENABLE if info.profiling else 0
            )
            for d, info in zip(devices, self.infos)
        ]
        self._build_checked: dict[int, Optional[str]] = {}

    def index(self, device: str) -> int:
        """The position of "OPENCL" / "OPENCL:N" among this platform's devices; ValueError when there is none."""
        base, _, n = device.partition(":")
        index = int(n) if n else 0
        if base.upper() != DEVICE or index >= len(self.devices):
            names = ", ".join(f"{DEVICE}:{i} = {info.name}" for i, info in enumerate(self.infos))
            raise ValueError(
                f"no OpenCL device {device!r} on platform {self.name!r}: it has {len(self.devices)} ({names}); "
                f"set {PLATFORM_ENV} to use another platform"
            )
        return index

    def build_problem(self, index: int) -> Optional[str]:
        """None when the platform's compiler builds a trivial kernel for device `index`, else why not (checked once).

        A platform can list a device whose compiler cannot target it: PoCL 3.0 from pip (LLVM 14) names a CPU newer
        than its LLVM "generic" and then rejects that name, so every build fails. Such a device is unavailable, said
        at probe time, instead of failing at the first kernel."""
        if index in self._build_checked:
            return self._build_checked[index]
        import pyopencl as cl

        problem: Optional[str] = None
        program = cl.Program(self.context, "__kernel void tg_probe(__global int *a) { a[get_global_id(0)] += 1; }")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program.build(devices=[self.devices[index]])
        except cl.Error as e:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    log = program.get_build_info(self.devices[index], cl.program_build_info.LOG).strip()
                except cl.Error:
                    log = ""
            detail = " | ".join(line.strip() for line in (log or str(e)).splitlines() if line.strip())[:300]
            problem = f"{self.name} cannot build a kernel for {self.infos[index].name}: {detail}"
            if "unknown target CPU" in detail:
                problem += (
                    " (this OpenCL compiler's LLVM does not know this CPU: install an OpenCL platform built for it, "
                    f"or choose another with {PLATFORM_ENV})"
                )
        self._build_checked[index] = problem
        return problem

    def synchronize(self) -> None:
        """Wait for every queued command on every device."""
        for q in self.queues:
            q.finish()

    def describe(self) -> str:
        return f"{self.name} ({self.version}): " + ", ".join(
            f"{DEVICE}:{i} {info.name}" for i, info in enumerate(self.infos)
        )


def choose_platform(platforms: list[Any], choice: Optional[str]) -> tuple[Any, list[Any]]:
    """(platform, its devices, GPUs first) among `platforms`, by `choice` (an index or a part of the name) when it
    is given, else the first platform with a GPU, else the first with any device. OpenCLUnavailable if none fits."""
    import pyopencl as cl

    def devices_of(p: Any) -> list[Any]:
        try:
            devs = list(p.get_devices())
        except cl.Error:  # a platform with no devices raises DEVICE_NOT_FOUND
            return []
        return sorted(devs, key=lambda d: not d.type & cl.device_type.GPU)

    listing = "; ".join(f"{i}: {p.name.strip()} ({len(devices_of(p))} devices)" for i, p in enumerate(platforms))
    if choice is not None and choice.strip():
        choice = choice.strip()
        if choice.isdigit():
            matches = [platforms[int(choice)]] if int(choice) < len(platforms) else []
        else:
            matches = [p for p in platforms if choice.lower() in f"{p.name} {p.vendor}".lower()]
        if not matches:
            raise OpenCLUnavailable(
                f"{PLATFORM_ENV}={choice!r} matches no OpenCL platform; the platforms are: {listing}"
            )
        if not (devs := devices_of(matches[0])):
            raise OpenCLUnavailable(
                f"the OpenCL platform {matches[0].name.strip()!r} ({PLATFORM_ENV}={choice}) has no device"
            )
        return matches[0], devs
    with_devices = [(p, devs) for p in platforms if (devs := devices_of(p))]
    if not with_devices:
        raise OpenCLUnavailable(f"no OpenCL platform has a device (platforms: {listing or 'none'}): {_INSTALL_HINT}")
    for p, devs in with_devices:
        if any(d.type & cl.device_type.GPU for d in devs):
            return p, devs
    return with_devices[0]


_opened: dict[Optional[str], OpenCLPlatform] = {}


def get_platform() -> OpenCLPlatform:
    """The platform OPENCL runs on (opened once per process and `CL_PLATFORM` value); OpenCLUnavailable if none."""
    choice = os.environ.get(PLATFORM_ENV)
    if (opened := _opened.get(choice)) is not None:
        return opened
    try:
        import pyopencl as cl
    except ImportError as e:
        raise OpenCLUnavailable(f"pyopencl cannot be imported ({e}): `pip install 'tg-opencl[pocl]'`") from e
    try:
        platforms = list(cl.get_platforms())
    except cl.Error as e:  # the ICD loader found no platform at all
        raise OpenCLUnavailable(f"no OpenCL platform found ({str(e).strip()}): {_INSTALL_HINT}") from e
    platform, devices = choose_platform(platforms, choice)
    try:
        opened = OpenCLPlatform(platform, devices)
    except cl.Error as e:
        raise OpenCLUnavailable(f"cannot open the OpenCL platform {platform.name.strip()!r}: {e}") from e
    _opened[choice] = opened
    return opened
