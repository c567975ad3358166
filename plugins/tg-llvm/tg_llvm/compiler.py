"""Compiles LLVM IR text to object code for this CPU with llvmlite: parse, verify, optimize, emit."""

from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import Any

from tgcore.device import CompileError, Compiler


@functools.lru_cache(maxsize=None)
def llvm() -> Any:
    """llvmlite.binding with the native target initialized (once)."""
    import llvmlite.binding as binding

    binding.initialize_native_target()
    binding.initialize_native_asmprinter()
    binding.initialize_native_asmparser()
    return binding


def host_target_machine(opt: int) -> Any:
    """A new target machine for this CPU and its features; jit=True picks a code model MCJIT can load anywhere.
    (Not shared: an MCJIT engine takes ownership of the target machine it is given.)"""
    binding = llvm()
    target = binding.Target.from_triple(binding.get_process_triple())
    return target.create_target_machine(
        cpu=binding.get_host_cpu_name(), features=binding.get_host_cpu_features().flatten(), opt=opt, jit=True
    )


def default_opt_level() -> int:
    """The optimization level from LLVMOPT (0..3), default 2."""
    level = os.environ.get("LLVMOPT", "2")
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"LLVMOPT={level!r}: expected an optimization level 0, 1, 2 or 3")
    return int(level)


class LLVMCompiler(Compiler):
    """LLVM IR text -> object code (ELF, Mach-O or COFF: whatever this host's MCJIT loads)."""

    def __init__(self, opt: int | None = None) -> None:
        self.opt = default_opt_level() if opt is None else opt
        if self.opt not in (0, 1, 2, 3):
            raise ValueError(f"LLVM optimization level {self.opt}: expected 0, 1, 2 or 3")
        binding = llvm()
        self.tm = host_target_machine(self.opt)  # this compiler's own, used only to emit code
        features = hashlib.sha256(binding.get_host_cpu_features().flatten().encode()).hexdigest()[:12]
        version = "_".join(map(str, binding.llvm_version_info))
        # object code depends on the LLVM version, the CPU and its features, and the optimization level
        cpu = re.sub(r"\W", "_", binding.get_host_cpu_name())
        self.cachekey = f"compile_llvm_{version}_{cpu}_{features}_O{self.opt}"

    def compile(self, src: str) -> bytes:
        binding = llvm()
        if (nul := src.find("\0")) >= 0:  # llvmlite hands LLVM a C string: it would silently stop reading there
            line = src.count("\n", 0, nul) + 1
            log = f"<string>:{line}: error: NUL character at offset {nul}: LLVM IR text cannot contain one"
            raise CompileError("LLVM rejected the kernel's IR", log=log, src=src)
        try:
            mod = binding.parse_assembly(src)
            mod.verify()
        except RuntimeError as e:
            raise CompileError("LLVM rejected the kernel's IR", log=str(e), src=src) from e
        mod.triple = self.tm.triple
        mod.data_layout = str(self.tm.target_data)
        if self.opt > 0:
            tuning = binding.create_pipeline_tuning_options(speed_level=self.opt)
            tuning.loop_vectorization = tuning.slp_vectorization = self.opt >= 2
            builder = binding.create_pass_builder(self.tm, tuning)
            builder.getModulePassManager().run(mod, builder)
        return bytes(self.tm.emit_object(mod))
