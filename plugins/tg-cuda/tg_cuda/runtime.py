"""Loads a kernel's PTX into a CUDA module on one device and launches it on the legacy default stream."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from tg_cuda.driver import (
    CU_JIT_ERROR_LOG_BUFFER,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDAError,
    driver,
    open_device,
    ordinal_of,
)
from tg_cuda.renderer import FLAT_THREADS, LAUNCH_FLAT
from tgcore.plugin import Program

_LOG_SIZE = 16384


def launch_dims(
    flat: bool,
    global_size: Optional[tuple[int, ...]],
    local_size: Optional[tuple[int, ...]],
    max_threads: int = FLAT_THREADS,
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of a launch. A flat kernel's global x dimension counts threads, in blocks of up to
    `max_threads` (a multiple of the warp, 32); otherwise the grid is `global_size` and the block `local_size`."""
    grid = tuple(global_size or ()) + (1,) * (3 - len(global_size or ()))
    block = tuple(local_size or ()) + (1,) * (3 - len(local_size or ()))
    if flat:
        if block != (1, 1, 1):
            raise ValueError(
                f"a flat kernel (global indices only) is launched with local_size (1, 1, 1), got {local_size}"
            )
        threads = min(max_threads, -(-max(grid[0], 1) // 32) * 32)
        return (-(-grid[0] // threads), grid[1], grid[2]), (threads, 1, 1)
    return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


class CUDAProgram(Program):
    """One kernel of a PTX module, on device `device` ("CUDA" or "CUDA:N")."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self.gpu = open_device(ordinal_of(device))
        self.flat = lib.startswith(LAUNCH_FLAT.encode())
        drv = self.gpu.make_current()
        module, log = ctypes.c_void_p(), ctypes.create_string_buffer(_LOG_SIZE)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(_LOG_SIZE))
        image = lib + b"\x00"  # PTX is loaded as a C string
        try:
            drv.call("cuModuleLoadDataEx", ctypes.byref(module), image, 2, options, values)
        except CUDAError as e:
            hint = ""
            if e.code == CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
                major, minor = drv.version()
                hint = (
                    f"; this driver supports CUDA {major}.{minor}, older than the NVRTC that made the PTX: install "
                    f"nvidia-cuda-nvrtc=={major}.{minor}.* or update the NVIDIA driver"
                )
            jit_log = log.value.decode(errors="replace").strip()
            raise CUDAError(
                e.call,
                e.code,
                e.name,
                f"{e.description}; loading kernel {name} on {device}{hint}",
                f"JIT log: {jit_log}" if jit_log else "",
            ) from e
        self.module = module.value
        function = ctypes.c_void_p()
        drv.call("cuModuleGetFunction", ctypes.byref(function), self.module, name.encode(), detail=name)
        self.function = function.value

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        grid, block = launch_dims(self.flat, global_size, local_size)
        if 0 in grid or 0 in block:  # nothing to run (an empty tensor)
            return 0.0 if wait else None
        args = [ctypes.c_uint64(b) for b in bufs] + [ctypes.c_int32(v) for v in vals]
        params = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        drv = self.gpu.make_current()
        events: list[ctypes.c_void_p] = []
        if wait:
            for _ in range(2):
                events.append(ctypes.c_void_p())
                drv.call("cuEventCreate", ctypes.byref(events[-1]), 0)
            drv.call("cuEventRecord", events[0], None)
        try:
            drv.call(
                "cuLaunchKernel",
                self.function,
                *grid,
                *block,
                0,
                None,
                params,
                None,
                detail=f"{self.name} with grid {grid}, block {block}",
            )
            if not wait:
                return None
            drv.call("cuEventRecord", events[1], None)
            drv.call("cuEventSynchronize", events[1], detail=f"running {self.name}")
            ms = ctypes.c_float()
            drv.call("cuEventElapsedTime", ctypes.byref(ms), events[0], events[1])
            return ms.value * 1e-3
        finally:
            for event in events:
                drv.call("cuEventDestroy_v2", event)

    def __del__(self) -> None:
        module = getattr(self, "module", None)
        if module is None:
            return
        try:
            self.gpu.make_current()
            driver().call("cuModuleUnload", module)
        except Exception:  # interpreter shutdown: the module goes with the process
            pass
