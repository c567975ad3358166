"""Loads a kernel's object code into this process with llvmlite's MCJIT and calls it through ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
import threading
import time
import weakref
from typing import Any, Optional

from tg_llvm.compiler import host_target_machine, llvm
from tgcore.plugin import Program

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


def elf_symbols(obj: bytes) -> Optional[tuple[list[str], list[str]]]:
    """(the global functions an ELF64 little-endian object file defines, the names it imports), or None for any
    other format."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        return None
    shoff, shentsize, shnum = struct.unpack_from("<Q", obj, 0x28)[0], *struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    defined: list[str] = []
    imported: list[str] = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab_offset = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, pos)
            if st_name == 0 or (st_info >> 4) == 0:  # unnamed or local
                continue
            if st_shndx == 0 or (st_info & 0xF) == 2:  # undefined, or a function (STT_FUNC)
                end = obj.index(b"\0", strtab_offset + st_name)
                (imported if st_shndx == 0 else defined).append(obj[strtab_offset + st_name : end].decode())
    return defined, imported


def undefined_symbols(obj: bytes) -> list[str]:
    """The names an ELF64 little-endian object file imports (empty for any other format: nothing to check)."""
    return [] if (symbols := elf_symbols(obj)) is None else symbols[1]


class _Engine:
    """An MCJIT engine and the objects loaded into it. MCJIT cannot unload one object, so an engine's code lives
    as long as the engine: each program keeps a reference to its engine, and an engine is disposed (its code
    freed) once no program uses it and it no longer takes new ones."""

    CAPACITY = 64  # objects per shared engine: bounds the code that freed programs leave behind

    def __init__(self) -> None:
        binding = llvm()
        self.engine = binding.create_mcjit_compiler(binding.parse_assembly(""), host_target_machine(0))
        self.objects: dict[str, tuple[bytes, int]] = {}  # symbol -> (the object that defines it, its address)

    def load(self, lib: bytes, symbol: str) -> int:
        binding = llvm()
        self.engine.add_object_file(binding.ObjectFileRef.from_data(lib))
        self.engine.finalize_object()
        address = self.engine.get_function_address(symbol)
        self.objects[symbol] = (lib, address)
        return address


_shared: Optional[_Engine] = None  # the engine that takes new objects
_by_symbol: weakref.WeakValueDictionary[str, _Engine] = weakref.WeakValueDictionary()  # live engines' symbols
_lock = threading.Lock()


def _load_shared(lib: bytes, symbol: str) -> tuple[_Engine, int]:
    """The engine holding `lib` and the address of `symbol` in it: an engine that already has this object (the
    same kernel loaded again), else the shared engine, replaced by a new one when it is full or has the name."""
    global _shared
    with _lock:
        if (engine := _by_symbol.get(symbol)) is not None and engine.objects[symbol][0] == lib:
            return engine, engine.objects[symbol][1]
        if _shared is None or len(_shared.objects) >= _Engine.CAPACITY or symbol in _shared.objects:
            _shared = _Engine()
        engine = _shared
        address = engine.load(lib, symbol)
        _by_symbol[symbol] = engine
        return engine, address


class LLVMProgram(Program):
    """One kernel, `void name(void **bufs, const long long *vals)`, from object code loaded by MCJIT. Objects from
    LLVMCompiler export the kernel as `name.<digest of its source>` (compiler.unique_symbol), so many of them
    share an engine; an object that exports `name` itself (kernel names repeat across kernels) or is not ELF
    gets an engine of its own."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        binding = llvm()
        _load_support_libraries()
        symbols = elf_symbols(lib)
        defined, imported = symbols if symbols is not None else ([], [])
        missing = [s for s in imported if s not in _LINKER_SYMBOLS and binding.address_of_symbol(s) is None]
        if missing:  # MCJIT would bind them to address 0 and the kernel would crash the process
            raise RuntimeError(
                f"kernel {name} needs symbols this process does not provide: {', '.join(missing)}; "
                "install the C runtime library that defines them (libm, libgcc_s)"
            )
        unique = [s for s in defined if s.startswith(f"{name}.")]
        if name not in defined and len(unique) == 1:
            symbol = unique[0]
            self._engine, address = _load_shared(lib, symbol)
        else:
            symbol, self._engine = name, _Engine()
            address = self._engine.load(lib, symbol)
        if not address:
            raise RuntimeError(f"the object code has no function {name!r}")
        self.symbol = symbol
        self.fxn = _KERNEL(address)
        self._no_ints = (ctypes.c_int64 * 1)()
        # argument arrays by buffer addresses: the addresses are the whole content, so a hit is always right (a loop or
        # a TinyJit replay runs on the same buffers again: 4.2-4.6 -> 3.2-3.8 us per tiny op replayed)
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
        if (ptrs := self._ptr_arrays.get(addresses)) is None:
            if len(self._ptr_arrays) >= 64:
                self._ptr_arrays.clear()
            ptrs = self._ptr_arrays[addresses] = (ctypes.c_void_p * max(len(bufs), 1))(*addresses)
        # 64-bit: a thread's loop bounds of a kernel past 2^31 - 1 iterations do not fit a C int (which ctypes would
        # wrap without a word)
        ints = (ctypes.c_int64 * len(vals))(*vals) if vals else self._no_ints
        if not wait:
            self.fxn(ptrs, ints)
            return None
        st = time.perf_counter()
        self.fxn(ptrs, ints)
        return time.perf_counter() - st
