"""Loads a compiled shared object through cffi and calls its kernel."""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from typing import Any, Optional

from cffi import FFI

from tgcore.plugin import Program, process_folder


class ClangProgram(Program):
    """One kernel of a shared object: `void name(void **bufs, const long long *vals)`."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self.ffi = FFI()
        # the buffers as integers: the same ABI as void**, and cheaper to build than void* cdata
        self.ffi.cdef(f"void {name}(uintptr_t *bufs, const long long *vals);")
        # dlopen needs a file: it is written in this process's own folder (tgcore/renderer/scratch.py), which a later
        # process removes should this one be killed before the unlink
        fd, path = tempfile.mkstemp(prefix="kernel-", suffix=".so", dir=process_folder())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            self.lib = self.ffi.dlopen(path)
        finally:
            os.unlink(path)  # the loaded library stays mapped
        self.fxn = getattr(self.lib, name)
        # the variables as 64-bit ints: a thread's bounds of a kernel past 2^31 - 1 iterations do not fit an int
        self._ptrs, self._ints = self.ffi.typeof("uintptr_t[]"), self.ffi.typeof("long long[]")
        self._no_ints = self.ffi.new(self._ints, 1)
        # argument arrays by buffer addresses: the addresses are the whole content, so a hit is always right
        self._ptr_arrays: dict[tuple[int, ...], Any] = {}

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        addresses = tuple(map(ctypes.addressof, bufs))
        if (ptrs := self._ptr_arrays.get(addresses)) is None:  # the same buffers again (a loop, a TinyJit replay)
            if len(self._ptr_arrays) >= 64:
                self._ptr_arrays.clear()
            ptrs = self._ptr_arrays[addresses] = self.ffi.new(self._ptrs, list(addresses) or [0])
        ints = self.ffi.new(self._ints, vals) if vals else self._no_ints
        if not wait:
            self.fxn(ptrs, ints)
            return None
        st = time.perf_counter()
        self.fxn(ptrs, ints)
        return time.perf_counter() - st
