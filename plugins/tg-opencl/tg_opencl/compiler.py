"""Builds OpenCL C with the platform's compiler and returns the program binaries, so the disk cache skips the build.

A build targets every kind of device of the platform at once (devices with the same name and driver share one
binary). The bytes are a small container of (key, bytes) pairs, never a pickle: one per device key, and the
source under SOURCE_KEY (the runtime reads which buffers a kernel writes from its signature):

    b"TGCL" | u32 count | count x (u32 key length | key utf-8 | u64 length | bytes)
"""

from __future__ import annotations

import hashlib
import struct
import warnings

from tg_opencl.cl_platform import OpenCLPlatform
from tgcore.plugin import CompileError, Compiler

_MAGIC = b"TGCL"
SOURCE_KEY = "#source"


def pack_binaries(binaries: dict[str, bytes]) -> bytes:
    """The container of `binaries` (device build key -> program binary)."""
    parts = [_MAGIC, struct.pack("<I", len(binaries))]
    for key, binary in binaries.items():
        k = key.encode()
        parts += [struct.pack("<I", len(k)), k, struct.pack("<Q", len(binary)), binary]
    return b"".join(parts)


def unpack_binaries(lib: bytes) -> dict[str, bytes]:
    """Inverse of pack_binaries; ValueError on anything that is not such a container."""
    if lib[:4] != _MAGIC:
        raise ValueError("not an OpenCL program of tg-opencl: the bytes do not start with TGCL")
    try:
        (count,), pos, out = struct.unpack_from("<I", lib, 4), 8, {}
        for _ in range(count):
            (klen,) = struct.unpack_from("<I", lib, pos)
            key = lib[pos + 4 : pos + 4 + klen].decode()
            (blen,) = struct.unpack_from("<Q", lib, pos + 4 + klen)
            start = pos + 12 + klen
            if start + blen > len(lib):
                raise ValueError(f"binary for {key!r} is cut short")
            out[key], pos = lib[start : start + blen], start + blen
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"a corrupt OpenCL program container: {e}") from e
    return out


class OpenCLCompiler(Compiler):
    """OpenCL C source -> a container of program binaries, one per kind of device on the platform."""

    def __init__(self, platform: OpenCLPlatform) -> None:
        self.platform = platform
        # one device of each kind builds for all devices of that kind
        self.builders: dict[str, int] = {}
        for i, info in enumerate(platform.infos):
            self.builders.setdefault(info.build_key, i)
        # -w: the C-family spellings compare constants (`(2)==-1`), which compilers warn about to no purpose
        self.options = ["-w"]
        if all(i.correctly_rounded_divide_sqrt for i in platform.infos):  # float32 / and sqrt round like numpy
            self.options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        identity = "\n".join([platform.name, platform.version, *self.builders, *self.options])
        self.cachekey = "compile_opencl_" + hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.identity = f"{platform.name} {platform.version} program build {' '.join(self.options)}".strip()

    def compile(self, src: str) -> bytes:
        import pyopencl as cl

        if "\x00" in src:  # OpenCL takes sources as C strings: it would silently compile only what precedes it
            at = src.index("\x00")
            raise CompileError(
                f"OpenCL source contains a NUL character at offset {at}",
                log=f"the source has a NUL character at offset {at}; an OpenCL compiler stops reading there",
                src=src,
            )

        devices = [self.platform.devices[i] for i in self.builders.values()]
        program = cl.Program(self.platform.context, src)
        try:
            with warnings.catch_warnings():  # a build's warnings are not the user's business; its errors are
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program.build(options=self.options, devices=devices)
        except cl.Error as e:
            logs = []
            with warnings.catch_warnings():  # asking a failed program for its log may warn about pyopencl's cache
                warnings.simplefilter("ignore")
                for key, i in self.builders.items():
                    try:
                        log = program.get_build_info(self.platform.devices[i], cl.program_build_info.LOG).strip()
                    except cl.Error:
                        log = ""
                    if log:
                        logs.append(f"{key}:\n{log}")
            raise CompileError(
                f"OpenCL build failed on {self.platform.name}: {str(e).splitlines()[0]}",
                log="\n".join(logs) or str(e),  # pyopencl's message carries the log when the program kept none
                src=src,
            ) from e
        binaries = program.get_info(cl.program_info.BINARIES)
        built = program.get_info(cl.program_info.DEVICES)
        by_device = {d.int_ptr: b for d, b in zip(built, binaries)}
        out = {key: bytes(by_device[self.platform.devices[i].int_ptr]) for key, i in self.builders.items()}
        return pack_binaries({**out, SOURCE_KEY: src.encode()})
