"""The C compiler CLANG builds with and the CPU it builds for: `$CC` (else cc, clang or gcc) and `-march` from
`TG_CLANG_MARCH` (default `native`, this CPU).

What the target can do is read from the compiler itself: the macros it predefines for that `-march` (`__AVX512F__`,
`__FMA__`, `__F16C__`, ...) give the vector register width the renderer tiles for, and the kernel header picks its
vector routines from the same macros when it is compiled, so the two always agree. Those macros, asked once per
compiler and target (a preprocessor run, 20-90 ms), are kept in the disk cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from tgcore.helpers import diskcache_get, diskcache_put
from tgcore.plugin import CompileError, vector_register_bytes, vector_register_count

MARCH_ENV = "TG_CLANG_MARCH"
DEFAULT_MARCH = "native"
_MARCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# the instruction-set macros a compiler may act on in a kernel: a target that defines one the host does not would
# build code this CPU cannot run (x86 SIMD, bit manipulation; ARM's optional features)
_ISA_MACRO = re.compile(
    r"__(SSE\w*|SSSE3|AVX\w*|FMA|FMA4|F16C|BMI2?|LZCNT|POPCNT|MOVBE|ADX|ARM_FEATURE_\w+|ARM_NEON|ARM_FP16\w*)(__)?"
)
_TIMEOUT_S = 60


def find_compiler() -> str:
    """The C compiler to use: $CC, else cc, clang or gcc on PATH; FileNotFoundError says what to install."""
    if cc := os.environ.get("CC"):
        path = shutil.which(cc)
        if path is None:
            raise FileNotFoundError(f"the C compiler CC={cc!r} was not found on PATH")
        return path
    for name in ("cc", "clang", "gcc"):
        if (path := shutil.which(name)) is not None:
            return path
    raise FileNotFoundError("no C compiler found (tried $CC, cc, clang, gcc): install gcc or clang, or set CC")


def march_from_env() -> str:
    """The `-march` value from TG_CLANG_MARCH (default native); ValueError for one that is not a -march word."""
    march = os.environ.get(MARCH_ENV, "").strip() or DEFAULT_MARCH
    if not _MARCH.fullmatch(march):
        raise ValueError(
            f"{MARCH_ENV}={march!r} is not a -march value: expected a CPU or ISA level such as native, x86-64-v2, "
            "x86-64-v3, skylake-avx512 (see your compiler's -march list)"
        )
    return march


@dataclass(frozen=True)
class Toolchain:
    """A C compiler and the -march it builds for, with the macros it predefines there."""

    cc: str  # the compiler's path
    march: str
    macros: tuple[tuple[str, str], ...]  # (name, value) of each predefined macro, sorted

    @staticmethod
    def resolve(cc: Optional[str] = None, march: Optional[str] = None) -> Toolchain:
        """The toolchain of compiler `cc` (a name on PATH or a path; default: find_compiler()) for `march` (default:
        march_from_env()).

        FileNotFoundError without the compiler, ValueError for a malformed march, CompileError when the compiler
        rejects the march."""
        if cc is None:
            path = find_compiler()
        elif (found := shutil.which(cc)) is not None:
            path = found
        else:
            raise FileNotFoundError(f"the C compiler {cc!r} was not found on PATH")
        return _resolve(path, march if march is not None else march_from_env())

    @property
    def name(self) -> str:
        """The compiler's file name (gcc, clang, cc, ...)."""
        return os.path.basename(self.cc)

    @property
    def version(self) -> str:
        """The compiler's version as it states it (its __VERSION__ macro: "12.2.0", "Clang 14.0.6"), "" if unsaid."""
        return next((value.strip('"') for name, value in self.macros if name == "__VERSION__"), "")

    @property
    def is_gcc(self) -> bool:
        """Whether the compiler is GCC (__GNUC__, which clang defines too, without __clang__), whatever its name."""
        return self.defines("__GNUC__") and not self.defines("__clang__")

    def defines(self, macro: str) -> bool:
        return any(name == macro for name, _ in self.macros)

    @property
    def features(self) -> set[str]:
        """The vector features the target has, by the macros the compiler predefines ("avx", "avx512f")."""
        return {name for name, macro in (("avx", "__AVX__"), ("avx512f", "__AVX512F__")) if self.defines(macro)}

    @property
    def vector_bytes(self) -> int:
        """Bytes in one vector register of the target: 64 with AVX-512, 32 with AVX, else 16 (SSE, NEON)."""
        return vector_register_bytes(self.features)

    @property
    def vector_registers(self) -> int:
        """Vector registers of the target: 32 with AVX-512 and on AArch64, else 16 (SSE, AVX, AVX2)."""
        x86 = self.defines("__x86_64__") or self.defines("__i386__")
        return vector_register_count(self.features, x86) if x86 or self.defines("__aarch64__") else 16

    @property
    def flags(self) -> list[str]:
        """The compiler flags that select the target."""
        return [f"-march={self.march}"]

    @property
    def identity(self) -> str:
        """A digest of everything that decides the code this toolchain makes (compiler, version, target features)."""
        text = "\n".join([self.cc, self.march, *(f"{n}={v}" for n, v in self.macros)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def isa(self) -> set[str]:
        """The instruction-set macros the target defines."""
        return {name for name, _ in self.macros if _ISA_MACRO.fullmatch(name)}

    def missing_on_host(self) -> list[str]:
        """The instruction sets this target builds for that this CPU (`-march=native`) lacks; [] when it runs here."""
        if self.march == "native":
            return []
        try:
            native = Toolchain.resolve(self.cc, "native")
        except CompileError:  # a compiler that cannot target this CPU's own -march: nothing to compare with
            return []
        return sorted(self.isa() - native.isa())


@functools.lru_cache(maxsize=None)
def _resolve(cc: str, march: str) -> Toolchain:
    if not _MARCH.fullmatch(march):
        raise ValueError(f"-march={march!r} is not a -march value: expected e.g. native, x86-64-v3, skylake-avx512")
    return Toolchain(cc, march, _predefined_macros(cc, march))


def _compiler_stamp(cc: str) -> str:
    """What identifies the compiler binary on disk: its real path, size and modification time."""
    real = os.path.realpath(cc)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _host_stamp() -> str:
    """What identifies this CPU's features for -march=native (a disk cache may move to another machine)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("flags", "Features", "model name", "CPU part"))]
    except OSError:
        lines = []
    return hashlib.sha256("".join(sorted(set(lines))).encode()).hexdigest()[:16]


def _predefined_macros(cc: str, march: str) -> tuple[tuple[str, str], ...]:
    key = {"compiler": _compiler_stamp(cc), "march": march, "host": _host_stamp() if march == "native" else ""}
    if (text := diskcache_get("clang_target_macros", key)) is None:
        proc = subprocess.run(
            [cc, f"-march={march}", "-dM", "-E", "-x", "c", "-"],
            input=b"",
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            log = proc.stderr.decode(errors="replace").strip()
            raise CompileError(
                f"{os.path.basename(cc)} rejects -march={march}: set {MARCH_ENV} to a -march it knows (native, "
                f"x86-64-v2, x86-64-v3, ...) or unset it",
                log=log,
            )
        text = diskcache_put("clang_target_macros", key, proc.stdout.decode(errors="replace"))
    macros = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] == "#define":
            macros[parts[1]] = parts[2] if len(parts) == 3 else ""
    return tuple(sorted(macros.items()))
