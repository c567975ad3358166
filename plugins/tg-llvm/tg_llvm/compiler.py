"""Compiles LLVM IR text to object code for this CPU with llvmlite: parse, verify, optimize, emit."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from typing import Any

from tgcore.plugin import CompileError, Compiler, thread_count, vector_register_bytes, vector_register_count


@functools.lru_cache(maxsize=None)
def llvm() -> Any:
    """llvmlite.binding with the native target initialized (once)."""
    import llvmlite.binding as binding

    binding.initialize_native_target()
    binding.initialize_native_asmprinter()
    binding.initialize_native_asmparser()
    return binding


@functools.lru_cache(maxsize=None)
def host_cpu() -> tuple[Any, str, str]:
    """This process's target, CPU name and CPU feature string (asked of LLVM once: the features take ~0.3 ms)."""
    binding = llvm()
    target = binding.Target.from_triple(binding.get_process_triple())
    return target, binding.get_host_cpu_name(), binding.get_host_cpu_features().flatten()


def _llvmlite_version() -> str:
    import llvmlite

    return str(llvmlite.__version__)


def host_features() -> set[str]:
    """The instruction-set features LLVM finds on this CPU, as lower-case names ("avx2", "avx512f", ...)."""
    return {f[1:] for f in host_cpu()[2].split(",") if f.startswith("+")}


def host_vector_bytes() -> int:
    """Bytes in one vector register of this CPU: 64 with AVX-512, 32 with AVX, else 16 (SSE, NEON)."""
    return vector_register_bytes(host_features())


def host_vector_registers() -> int:
    """Vector registers of this CPU: 32 with AVX-512 and off x86 (AArch64's NEON), 16 on x86 without AVX-512."""
    x86 = llvm().get_process_triple().startswith(("x86_64", "i386", "i686"))
    return vector_register_count(host_features(), x86)


def host_target_machine(opt: int) -> Any:
    """A new target machine for this CPU and its features; jit=True picks a code model MCJIT can load anywhere.
    (Not shared: an MCJIT engine takes ownership of the target machine it is given.)"""
    target, cpu, features = host_cpu()
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, jit=True)


def unique_symbol(name: str, src: str) -> str:
    """The exported name of kernel `name` compiled from `src`: the name and a digest of the source, so that
    objects of different kernels with the same name can share one MCJIT engine (see runtime.py)."""
    return f"{name}.{hashlib.sha256(src.encode()).hexdigest()[:16]}"


def default_opt_level() -> int:
    """The optimization level from LLVMOPT (0..3), default 2."""
    level = os.environ.get("LLVMOPT", "2")
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"LLVMOPT={level!r}: expected an optimization level 0, 1, 2 or 3")
    return int(level)


# the passes of the short pipeline for kernels the optimizer vectorized (LLVMCompiler.compile)
_LIGHT_PIPELINE = (
    "add_always_inliner_pass",
    "add_sroa_pass",
    "add_instruction_combine_pass",
    "add_simplify_cfg_pass",
    "add_new_gvn_pass",
    "add_instruction_combine_pass",
    "add_aggressive_dce_pass",
    "add_global_dead_code_eliminate_pass",
)


def _whole_vectors(src: str) -> bool:
    """Whether the kernel is one loop computing in vectors throughout: vector types, at most one loop, and no lane
    taken out of a vector or put into one other than a constant's splat. (Where lanes are, LLVM's SLP vectorizer
    makes the code faster; nested loops want O2's loop passes.)"""
    if " x float>" not in src and " x double>" not in src:
        return False
    if src.count(" = phi i") > 1 or "extractelement" in src:
        return False
    inserts = (line.split("insertelement", 1)[1] for line in src.splitlines() if "insertelement" in line)
    return all(x.split(",", 1)[0].endswith("poison") for x in inserts)


class LLVMCompiler(Compiler):
    """LLVM IR text -> object code (ELF, Mach-O or COFF: whatever this host's MCJIT loads).

    In ELF objects each exported function is renamed to `unique_symbol(name, src)`; the runtime finds it in the
    object's symbol table. Should this host's objects not be ELF, the first compile finds out and the compiler
    keeps the names as rendered from then on (the runtime gives such objects an engine each).

    llvmlite runs one call into LLVM at a time in a process, so a kernel compiled here waits for any other: the
    new kernels of a schedule come in groups (`batch`, from the core's compile threads: `concurrent`) to
    compile_many, which hands them to worker processes (workers.py), one per core, once there is enough to compile
    to pay for starting them; a lone kernel, and every kernel where workers cannot run, compiles here."""

    concurrent = True  # (compile() takes a lock of its own: one in-process compile at a time, as llvmlite allows)
    batch = 8

    def __init__(self, opt: int | None = None, workers: int | None = None) -> None:
        """`workers`: compile processes for compile_many (default: one per core this process may run on; 0: none)."""
        self.opt = default_opt_level() if opt is None else opt
        if self.opt not in (0, 1, 2, 3):
            raise ValueError(f"LLVM optimization level {self.opt}: expected 0, 1, 2 or 3")
        self.workers = thread_count() if workers is None else workers
        binding = llvm()
        self.tm = host_target_machine(self.opt)  # this compiler's own, used only to emit code
        self.triple, self.data_layout = self.tm.triple, str(self.tm.target_data)
        self.unique_names = True
        _, cpu_name, cpu_features = host_cpu()
        features = hashlib.sha256(cpu_features.encode()).hexdigest()[:12]
        version = "_".join(map(str, binding.llvm_version_info))
        # object code depends on the LLVM version, the CPU and its features, and the optimization level ("u": the
        # exported names carry a digest of the source, which objects cached before that did not)
        cpu = re.sub(r"\W", "_", cpu_name)
        self.cachekey = f"compile_llvm_{version}_{cpu}_{features}_u_O{self.opt}"
        llvm_version = ".".join(map(str, binding.llvm_version_info))
        self.identity = f"llvmlite {_llvmlite_version()} (LLVM {llvm_version}) -O{self.opt} -mcpu={cpu_name}"

    def compile_many(self, srcs: list[str]) -> list[bytes]:
        """Each source's object code: compiled by the worker processes where they run and the sources are worth
        their start (WORKER_MIN_IR bytes of IR, or workers already started), else here, one by one. A worker that
        fails (or cannot start: Workers.broken) leaves the rest of the sources to this process."""
        from tg_llvm import workers as _workers  # (on use: `python -m tg_llvm.workers` runs that module as main)

        pool = _workers.workers(self.opt, self.workers)
        if pool is None or (not pool.started and sum(map(len, srcs)) < WORKER_MIN_IR):
            return [self.compile(src) for src in srcs]
        out: list[bytes] = []
        for src in srcs:
            try:
                out.append(pool.compile(src))
            except _workers.WorkerError:
                out.append(self.compile(src))
        return out

    def compile(self, src: str) -> bytes:
        with _IN_PROCESS:
            return self._compile(src)

    def _compile(self, src: str) -> bytes:
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
        mod.triple, mod.data_layout = self.triple, self.data_layout
        renamed = self.unique_names
        if renamed:
            for fn in mod.functions:
                if not fn.is_declaration and fn.linkage == binding.Linkage.external:
                    fn.name = unique_symbol(fn.name, src)
        if self.opt > 0:
            tuning = binding.create_pipeline_tuning_options(speed_level=self.opt)
            builder = binding.create_pass_builder(self.tm, tuning)
            # one loop of whole vectors, as the optimizer vectorized it: a short pipeline (inlining, scalar
            # replacement, instcombine, CFG cleanup, value numbering) gives code as fast as O2's in two thirds of the
            # compile time (the bench's first-call kernel: 9.6 -> 6.4 ms); nested loops, lanes taken apart and scalar
            # code get O2 (with LLVM's loop and SLP vectorizers)
            if _whole_vectors(src) and self.opt <= 2:
                passes = binding.create_new_module_pass_manager()
                for add in _LIGHT_PIPELINE:
                    getattr(passes, add)()
                passes.run(mod, builder)
            else:
                tuning.loop_vectorization = self.opt >= 2
                tuning.slp_vectorization = self.opt >= 2
                builder.getModulePassManager().run(mod, builder)
        obj = bytes(self.tm.emit_object(mod))
        if renamed and obj[:4] != b"\x7fELF":  # the runtime could not find the renamed function: keep the names
            self.unique_names = False
            return self._compile(src)
        return obj


# one compile at a time in this process (llvmlite's LLVM calls share one context and one lock)
_IN_PROCESS = threading.Lock()
# a group of new kernels starts the worker processes (~0.3 s each, in parallel) once its IR is this large: about a
# second of compiling (ResNet-18's 25 kernels are ~1.3 MB of IR and took 3.8 s here)
WORKER_MIN_IR = 128 * 1024

