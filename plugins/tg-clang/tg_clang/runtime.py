"""Loads a compiled shared object (ctypes) and calls its kernel through a cffi function pointer; a threaded kernel's
parts run on CLANG's own thread pool (pool.py)."""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
import time
from typing import Any, Optional

from cffi import FFI

from tg_clang.pool import MAX_PARTS, MAX_VALS, pool
from tgcore.plugin import Program, process_folder

# one FFI for every kernel: each declaration is parsed once (pycparser: ~1.3 ms a parse, three a kernel when each
# program declared its own, 0.4 s of EfficientNet-B0's first call), and a kernel is a function pointer of this type
_FFI = FFI()
# the buffers as integers: the same ABI as void**, and cheaper to build than void* cdata
_FFI.cdef("typedef void (*tg_kernel)(uintptr_t *bufs, const long long *vals);")
# the variables as 64-bit ints: a thread's bounds of a kernel past 2^31 - 1 iterations do not fit an int
_PTRS, _INTS, _KERNEL = _FFI.typeof("uintptr_t[]"), _FFI.typeof("long long[]"), _FFI.typeof("tg_kernel")


@functools.lru_cache(maxsize=1024)
def _bounds_array(bounds: tuple[int, ...]) -> Any:
    """`bounds` as a C array (the parts of a kernel's loop repeat with every launch: built once)."""
    return _FFI.new(_INTS, bounds)


class ClangProgram(Program):
    """One kernel of a shared object: `void name(void **bufs, const long long *vals)`."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        # dlopen needs a file: it is written in this process's own folder (tgcore/renderer/scratch.py), which a later
        # process removes should this one be killed before the unlink
        fd, path = tempfile.mkstemp(prefix="kernel-", suffix=".so", dir=process_folder())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            self.lib = ctypes.CDLL(path)  # (kept: the library stays loaded as long as its program lives)
        finally:
            os.unlink(path)  # the loaded library stays mapped
        address = ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value
        self.fxn = _FFI.cast(_KERNEL, address)
        self._no_ints = _FFI.new(_INTS, 1)
        # argument arrays by buffer addresses: the addresses are the whole content, so a hit is always right
        self._ptr_arrays: dict[tuple[int, ...], Any] = {}
        self._pool = pool(_FFI)
        self.supports_parts = self._pool is not None

    def _ptrs(self, bufs: tuple[Any, ...]) -> Any:
        addresses = tuple(map(ctypes.addressof, bufs))
        if (ptrs := self._ptr_arrays.get(addresses)) is None:  # the same buffers again (a loop, a TinyJit replay)
            if len(self._ptr_arrays) >= 64:
                self._ptr_arrays.clear()
            ptrs = self._ptr_arrays[addresses] = _FFI.new(_PTRS, list(addresses) or [0])
        return ptrs

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        ptrs = self._ptrs(bufs)
        ints = _FFI.new(_INTS, vals) if vals else self._no_ints
        if not wait:
            self.fxn(ptrs, ints)
            return None
        st = time.perf_counter()
        self.fxn(ptrs, ints)
        return time.perf_counter() - st

    def run_parts(self, *bufs: Any, vals: tuple[int, ...], bounds: tuple[int, ...], threads: int) -> None:
        """The kernel once per part [bounds[i], bounds[i + 1]) on the pool's threads and this one (one C call: the GIL
        is released for all of it)."""
        parts = len(bounds) - 1
        if len(vals) > MAX_VALS or parts > MAX_PARTS:  # (beyond any kernel's: run them here, one by one)
            for i in range(parts):
                self(*bufs, vals=(*vals, bounds[i], bounds[i + 1]))
            return
        ints = _FFI.new(_INTS, vals) if vals else self._no_ints
        if self._pool.tg_run_parts(self.fxn, self._ptrs(bufs), ints, len(vals), _bounds_array(bounds), parts, threads):
            raise ValueError(f"{self.name}: {parts} parts of {len(vals)} vals are beyond CLANG's thread pool")
