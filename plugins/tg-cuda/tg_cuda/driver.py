"""A small ctypes binding of the CUDA driver API (`libcuda`): devices, their primary contexts, memory, modules,
launches and events. Every call is checked; a failed one raises `CUDAError` naming the call and the CUDA error.

libcuda is loaded on first use. On a machine without the NVIDIA driver, or without a GPU, everything here raises
`DriverUnavailable` with the reason, and nothing is loaded at import time (the renderer and compiler need none of it).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

LIBCUDA_ENV = "TG_CUDA_LIBCUDA"  # a path to libcuda.so, for drivers installed where the loader does not look
DEVICE = "CUDA"

# enum values from cuda.h
_ATTR = {
    "max_threads_per_block": 1,
    "max_block_dim_x": 2,
    "max_block_dim_y": 3,
    "max_block_dim_z": 4,
    "max_grid_dim_x": 5,
    "max_grid_dim_y": 6,
    "max_grid_dim_z": 7,
    "max_shared_memory_per_block": 8,
    "multiprocessor_count": 16,
    "compute_capability_major": 75,
    "compute_capability_minor": 76,
}
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222


class DriverUnavailable(RuntimeError):
    """The CUDA driver cannot be used on this machine; the message says why and what to do."""


class CUDAError(RuntimeError):
    """A CUDA driver call failed: `call` is the function, `name` the CUDA error (e.g. CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, call: str, code: int, name: str, description: str, detail: str = "") -> None:
        self.call, self.code, self.name, self.description = call, code, name, description
        super().__init__(f"{call} failed: {name} ({description}){': ' + detail if detail else ''}")


class CUDAOutOfMemory(CUDAError, MemoryError):
    """cuMemAlloc found no memory (a MemoryError, so the core's LRU allocator frees its cache and tries again)."""


_c = ctypes
_CU_FUNCTIONS: dict[str, tuple[Any, ...]] = {
    # name: argtypes (every function returns CUresult, an int)
    "cuGetErrorName": (_c.c_int, _c.POINTER(_c.c_char_p)),
    "cuGetErrorString": (_c.c_int, _c.POINTER(_c.c_char_p)),
    "cuInit": (_c.c_uint,),
    "cuDriverGetVersion": (_c.POINTER(_c.c_int),),
    "cuDeviceGetCount": (_c.POINTER(_c.c_int),),
    "cuDeviceGet": (_c.POINTER(_c.c_int), _c.c_int),
    "cuDeviceGetName": (_c.c_char_p, _c.c_int, _c.c_int),
    "cuDeviceGetAttribute": (_c.POINTER(_c.c_int), _c.c_int, _c.c_int),
    "cuDeviceTotalMem_v2": (_c.POINTER(_c.c_size_t), _c.c_int),
    "cuDevicePrimaryCtxRetain": (_c.POINTER(_c.c_void_p), _c.c_int),
    "cuCtxSetCurrent": (_c.c_void_p,),
    "cuCtxSynchronize": (),
    "cuMemAlloc_v2": (_c.POINTER(_c.c_uint64), _c.c_size_t),
    "cuMemFree_v2": (_c.c_uint64,),
    "cuMemcpyHtoD_v2": (_c.c_uint64, _c.c_void_p, _c.c_size_t),
    "cuMemcpyDtoH_v2": (_c.c_void_p, _c.c_uint64, _c.c_size_t),
    "cuMemcpyDtoD_v2": (_c.c_uint64, _c.c_uint64, _c.c_size_t),
    "cuMemcpyPeer": (_c.c_uint64, _c.c_void_p, _c.c_uint64, _c.c_void_p, _c.c_size_t),
    "cuModuleLoadDataEx": (
        _c.POINTER(_c.c_void_p),
        _c.c_void_p,
        _c.c_uint,
        _c.POINTER(_c.c_int),
        _c.POINTER(_c.c_void_p),
    ),
    "cuModuleGetFunction": (_c.POINTER(_c.c_void_p), _c.c_void_p, _c.c_char_p),
    "cuModuleUnload": (_c.c_void_p,),
    "cuLaunchKernel": (
        _c.c_void_p,
        *([_c.c_uint] * 7),
        _c.c_void_p,
        _c.POINTER(_c.c_void_p),
        _c.POINTER(_c.c_void_p),
    ),
    "cuEventCreate": (_c.POINTER(_c.c_void_p), _c.c_uint),
    "cuEventRecord": (_c.c_void_p, _c.c_void_p),
    "cuEventSynchronize": (_c.c_void_p,),
    "cuEventElapsedTime": (_c.POINTER(_c.c_float), _c.c_void_p, _c.c_void_p),
    "cuEventDestroy_v2": (_c.c_void_p,),
}


class Driver:
    """libcuda with its functions typed; `call(name, *args)` runs one and raises CUDAError when it fails."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        self.functions: dict[str, Any] = {}
        for name, argtypes in _CU_FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
            self.functions[name] = fn

    def error_name(self, code: int) -> tuple[str, str]:
        """(CUDA_ERROR_..., its description) for a CUresult."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if self.functions["cuGetErrorName"](code, ctypes.byref(name)) != 0 or name.value is None:
            return f"CUDA error {code}", "unknown error code"
        self.functions["cuGetErrorString"](code, ctypes.byref(text))
        return name.value.decode(), (text.value or b"").decode()

    def call(self, name: str, *args: Any, detail: str = "") -> None:
        code = self.functions[name](*args)
        if code != 0:
            err_name, description = self.error_name(code)
            cls = CUDAOutOfMemory if code == CUDA_ERROR_OUT_OF_MEMORY else CUDAError
            raise cls(name, code, err_name, description, detail)

    def version(self) -> tuple[int, int]:
        """The CUDA version this driver supports, e.g. (13, 0)."""
        v = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return v.value // 1000, (v.value % 1000) // 10


_lock = threading.Lock()
_driver: Optional[Driver] = None
_driver_error: Optional[str] = None


def _load_libcuda() -> tuple[ctypes.CDLL, str]:
    override = os.environ.get(LIBCUDA_ENV)
    candidates = [override] if override else ["libcuda.so.1", "libcuda.so"]
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(str(e))
    if override:
        raise DriverUnavailable(f"{LIBCUDA_ENV}={override!r} cannot be loaded: {errors[0]}")
    raise DriverUnavailable(
        "libcuda.so.1 not found: no NVIDIA driver is installed on this machine (CUDA kernels can still be rendered "
        "and compiled to PTX here: `tg-conformance --device CUDA --compile-only`)"
    )


def driver() -> Driver:
    """libcuda, initialized (cuInit) once per process; DriverUnavailable says why it cannot be."""
    global _driver, _driver_error
    with _lock:
        if _driver is not None:
            return _driver
        if _driver_error is not None:
            raise DriverUnavailable(_driver_error)
        try:
            lib, path = _load_libcuda()
            drv = Driver(lib, path)
            drv.call("cuInit", 0)
        except DriverUnavailable as e:
            _driver_error = str(e)
            raise
        except AttributeError as e:  # a libcuda without a function this binding uses: a driver from before CUDA 4
            _driver_error = f"the NVIDIA driver's libcuda is too old for tg-cuda: {e}"
            raise DriverUnavailable(_driver_error) from e
        except CUDAError as e:
            _driver_error = f"the NVIDIA driver is installed but cannot start: {e}" + (
                " (this machine has no NVIDIA GPU, or it is not visible here)"
                if e.name == "CUDA_ERROR_NO_DEVICE"
                else ""
            )
            raise DriverUnavailable(_driver_error) from e
        _driver = drv
        return drv


def device_count() -> int:
    """How many CUDA devices the driver sees (DriverUnavailable when there is no driver)."""
    n = ctypes.c_int()
    driver().call("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def ordinal_of(instance: str) -> int:
    """The device ordinal of a device instance name: "CUDA" -> 0, "CUDA:1" -> 1."""
    base, _, index = instance.partition(":")
    if base.upper() != DEVICE or (index and not index.isdigit()):
        raise ValueError(f"{instance!r} is not a CUDA device instance: expected CUDA or CUDA:N")
    return int(index or 0)


@dataclass
class CUDADevice:
    """One GPU: its primary context (shared with every other library in the process) and what it reports."""

    ordinal: int
    handle: int
    context: int
    name: str
    compute_capability: tuple[int, int]
    attributes: dict[str, int]
    total_memory: int

    @property
    def arch(self) -> str:
        """The virtual architecture NVRTC compiles for, e.g. compute_90."""
        return f"compute_{self.compute_capability[0]}{self.compute_capability[1]}"

    def make_current(self) -> Driver:
        """Make this device's context current on the calling thread; returns the driver."""
        drv = driver()
        drv.call("cuCtxSetCurrent", self.context)
        return drv

    def synchronize(self) -> None:
        self.make_current().call("cuCtxSynchronize")


_devices: dict[int, CUDADevice] = {}


def open_device(ordinal: int) -> CUDADevice:
    """The CUDA device `ordinal` with its primary context retained (once per process)."""
    with _lock:
        if ordinal in _devices:
            return _devices[ordinal]
    count = device_count()
    if not 0 <= ordinal < count:
        raise DriverUnavailable(f"there is no CUDA device {ordinal}: this machine has {count} ({describe_devices()})")
    drv = driver()
    handle, ctx = ctypes.c_int(), ctypes.c_void_p()
    drv.call("cuDeviceGet", ctypes.byref(handle), ordinal)
    name = ctypes.create_string_buffer(256)
    drv.call("cuDeviceGetName", name, len(name), handle)
    attributes = {}
    for key, attr in _ATTR.items():
        v = ctypes.c_int()
        drv.call("cuDeviceGetAttribute", ctypes.byref(v), attr, handle, detail=key)
        attributes[key] = v.value
    total = ctypes.c_size_t()
    drv.call("cuDeviceTotalMem_v2", ctypes.byref(total), handle)
    drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), handle)
    dev = CUDADevice(
        ordinal,
        handle.value,
        ctx.value or 0,
        name.value.decode(errors="replace"),
        (attributes["compute_capability_major"], attributes["compute_capability_minor"]),
        attributes,
        total.value,
    )
    with _lock:
        return _devices.setdefault(ordinal, dev)


def describe_devices() -> str:
    """ "CUDA = <name> (sm_90), CUDA:1 = ..." for every device the driver sees."""
    drv = driver()
    parts = []
    for i in range(device_count()):
        handle, name = ctypes.c_int(), ctypes.create_string_buffer(256)
        drv.call("cuDeviceGet", ctypes.byref(handle), i)
        drv.call("cuDeviceGetName", name, len(name), handle)
        major, minor = ctypes.c_int(), ctypes.c_int()
        drv.call("cuDeviceGetAttribute", ctypes.byref(major), _ATTR["compute_capability_major"], handle)
        drv.call("cuDeviceGetAttribute", ctypes.byref(minor), _ATTR["compute_capability_minor"], handle)
        label = DEVICE if i == 0 else f"{DEVICE}:{i}"
        parts.append(f"{label} = {name.value.decode(errors='replace')} (sm_{major.value}{minor.value})")
    return ", ".join(parts) or "none"
