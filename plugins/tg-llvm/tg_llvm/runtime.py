"""Loads a kernel's object code into this process with llvmlite's MCJIT and calls it through ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
import time
from typing import Any, Optional

from tg_llvm.compiler import host_target_machine, llvm

_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_LINKER_SYMBOLS = {"_GLOBAL_OFFSET_TABLE_"}  # MCJIT's loader makes these itself


@functools.lru_cache(maxsize=None)
def _load_support_libraries() -> None:
    """Make libm (the transcendental calls) and libgcc (half conversions on CPUs without F16C) visible to MCJIT."""
    binding = llvm()
    for lib in ("m", "gcc_s"):
        if (path := ctypes.util.find_library(lib)) is not None:
            try:
                binding.load_library_permanently(path)
            except RuntimeError:  # not loadable here: a kernel that needs it fails with the symbol's name
                pass


def undefined_symbols(obj: bytes) -> list[str]:
    """The names an ELF64 little-endian object file imports (empty for any other format: nothing to check)."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        return []
    shoff, shentsize, shnum = struct.unpack_from("<Q", obj, 0x28)[0], *struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab_offset = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, pos)
            if st_shndx == 0 and st_name != 0 and (st_info >> 4) != 0:  # undefined, named, not local
                end = obj.index(b"\0", strtab_offset + st_name)
                names.append(obj[strtab_offset + st_name : end].decode())
    return names


class LLVMProgram:
    """One kernel, `void name(void **bufs, const int *vals)`, from object code loaded by its own MCJIT engine
    (kernel names repeat across kernels, so each program keeps its own symbol space)."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        self.device, self.name = device, name
        binding = llvm()
        _load_support_libraries()
        self.engine = binding.create_mcjit_compiler(binding.parse_assembly(""), host_target_machine(0))
        imported = [s for s in undefined_symbols(lib) if s not in _LINKER_SYMBOLS]
        missing = [s for s in imported if binding.address_of_symbol(s) is None]
        if missing:  # MCJIT would bind them to address 0 and the kernel would crash the process
            raise RuntimeError(
                f"kernel {name} needs symbols this process does not provide: {', '.join(missing)}; "
                "install the C runtime library that defines them (libm, libgcc_s)"
            )
        self.engine.add_object_file(binding.ObjectFileRef.from_data(lib))
        self.engine.finalize_object()
        address = self.engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"the object code has no function {name!r}")
        self.fxn = _KERNEL(address)

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
        ints = (ctypes.c_int * max(len(vals), 1))(*vals)
        st = time.perf_counter()
        self.fxn(ptrs, ints)
        return time.perf_counter() - st if wait else None
