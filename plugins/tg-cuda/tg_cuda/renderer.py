"""The CUDA C++ dialect of the C-family renderer.

Kernels are `extern "C" __global__` functions. What CUDA C++ would compute differently from numpy is spelled so
that it agrees (the base's spellings): signed `+ - *` and negation of int and long long are done on the unsigned type
(signed overflow is undefined in C++) except in index arithmetic, which is left plain so the compiler can fold
addresses; unsigned short products are taken as unsigned int (they would be promoted to int and could overflow);
the compiler gets `-fmad=false`, so `a*b+c` is rounded twice. Consts are rounded to their dtype in Python, exactly.

half and bfloat16 need no CUDA header: the source declares `tg_half` and `tg_bf16`, 16-bit structs that convert
to and from float (half with the PTX `cvt.rn` instructions, bfloat16 by rounding to nearest even in integer
arithmetic, as `tgcore.dtype.bf16_round` does). Arithmetic on them happens in float and rounds back once per op,
which is exact for + - * / (float has more than 2p+2 bits); a MULACC rounds `a*b` before it adds.

Launching (the base's launch hooks). A kernel whose only launch indices are global (what the linearizer emits) is
"flat": its `gidx0` is `blockIdx.x*blockDim.x+threadIdx.x`, guarded by the global size, and the runtime launches it
in blocks of up to FLAT_THREADS threads; `gidx1`, `gidx2` are `blockIdx.y`, `blockIdx.z`. A kernel with local
indices (`lidx`), `__shared__` memory or barriers is launched as given: `gidx` is `blockIdx`, `lidx` is `threadIdx`,
the grid is `global_size` and the block `local_size`. The first source line tells the runtime which (see
`LAUNCH_FLAT`).

Vector dtypes (`dtypes.float32.vec(4)`, ...) are structs `tg_<dtype>x<N>` of N lanes in `.v[]`, aligned to their
size up to 16 bytes: a vector LOAD / STORE is one wide memory access, and ALU ops, CAST and CONST on vectors work
lane by lane.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.renderer.cstyle import CStyleLanguage, KernelLaunch

FLAT_THREADS = 256  # the most threads per block of a flat kernel (its __launch_bounds__)
LAUNCH_FLAT = "// tg-cuda launch: flat"  # first line of a flat kernel's source, copied into its PTX
_DIMS = "xyz"

_HALF = """struct tg_half {  // IEEE binary16 storage; arithmetic converts to float
  unsigned short bits;
  tg_half() = default;
  __device__ tg_half(float f) {
#ifdef __CUDA_ARCH__
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
#else
    _Float16 h = (_Float16)f; memcpy(&bits, &h, 2);
#endif
  }
  __device__ tg_half(double d) {
#ifdef __CUDA_ARCH__
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(bits) : "d"(d));
#else
    _Float16 h = (_Float16)d; memcpy(&bits, &h, 2);
#endif
  }
  template <class T> __device__ tg_half(T x) : tg_half((float)x) {}
  __device__ operator float() const {
#ifdef __CUDA_ARCH__
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits)); return f;
#else
    _Float16 h; memcpy(&h, &bits, 2); return (float)h;
#endif
  }
};"""
_BF16 = """struct tg_bf16 {  // the top 16 bits of a float; rounds to nearest even, NaN stays NaN
  unsigned short bits;
  tg_bf16() = default;
  __device__ tg_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    bits = (unsigned short)(f != f ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  template <class T> __device__ tg_bf16(T x) : tg_bf16((float)x) {}
  __device__ operator float() const { return __uint_as_float((unsigned int)bits << 16); }
};"""
_BITCAST = """template <class T, class F> __device__ __forceinline__ T tg_bitcast(F x) {
  static_assert(sizeof(T) == sizeof(F), "BITCAST between dtypes of different sizes");
  T out; memcpy(&out, &x, sizeof(T)); return out;
}"""


class CUDARenderer(CStyleLanguage):
    """CUDA C++ for NVRTC; the limits are those of every GPU NVRTC 13 compiles for (sm_75 and newer)."""

    device = "CUDA"
    kernel_prefix = 'extern "C" __global__ '
    buffer_suffix = " __restrict__"
    smem_prefix = "__shared__ "
    barrier = "__syncthreads();"
    global_max = (2**31 - 1, 65535, 65535)  # grid x (a flat kernel's gidx0 counts threads: int), y, z
    local_max = (1024, 1024, 64)  # block dimensions; at most 1024 threads in all
    has_local = True
    has_shared = True
    shared_max = 48 * 1024  # static __shared__ memory per block
    supports_float4 = True
    lanewise_vectors = True  # vectors are structs: ALU ops and CASTs lane by lane
    type_map = {
        dtypes.bool: "bool",
        dtypes.int8: "signed char",
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
        dtypes.float16: "tg_half",
        dtypes.bfloat16: "tg_bf16",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fc00000)"

    # ***** types and constants *****

    def render_dtype(self, dt: DType) -> str:
        base = dt.base if isinstance(dt, PtrDType) else dt
        if base.count > 1:
            return f"tg_{base.scalar().short_name}x{base.count}"
        if base not in self.type_map:
            raise NotImplementedError(f"{type(self).__name__} cannot render dtype {base!r}")
        return self.type_map[base]

    def render_const(self, val: object, dt: DType) -> str:
        if dt.count > 1:
            return self.render_vectorize(dt, [self.render_const(val, dt.scalar())] * dt.count)
        if dt == dtypes.bool:
            return "true" if val else "false"
        if dt == dtypes.float64 and not math.isfinite(float(val)):  # type: ignore[arg-type]
            v = float(val)  # type: ignore[arg-type]
            bits = "0x7ff8000000000000LL" if math.isnan(v) else "0x7ff0000000000000LL"
            return f"__longlong_as_double({bits})" if v > 0 or math.isnan(v) else f"(-__longlong_as_double({bits}))"
        if dt in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
            # round to the dtype here, once, as numpy does; the literal is then exact in float
            with np.errstate(all="ignore"):
                v = float(np.float16(val) if dt == dtypes.float16 else np.float32(val))  # type: ignore[arg-type]
            text = super().render_const(v, dtypes.float32)
            return text if dt == dtypes.float32 else f"(({self.render_dtype(dt)})({text}))"
        return super().render_const(val, dt)

    def render_bitcast(self, name: str, x: str, dt: DType) -> list[str]:
        t = self.render_dtype(dt)
        return [f"{t} {name} = tg_bitcast<{t}>({x});"]

    # ***** vectors: structs of lanes in .v[] *****

    def render_lane(self, x: str, i: int, dt: DType) -> str:
        return f"{x}.v[{i}]"

    def render_vectorize(self, dt: DType, lanes: list[str]) -> str:
        return f"{self.render_dtype(dt)}{{{', '.join(lanes)}}}"

    def render_conversion(self, x: str, src_dt: DType, dt: DType) -> str:
        if dt.count > 1:  # lane by lane
            lanes = [self.render_lane(x, i, src_dt) if src_dt.count > 1 else x for i in range(dt.count)]
            return self.render_vectorize(dt, [self.render_cast(lane, dt.scalar()) for lane in lanes])
        return super().render_conversion(x, src_dt, dt)

    def render_access(
        self, buf: str, idx: UOp, names: dict[int, str], dt: Optional[DType] = None, store: bool = False
    ) -> str:
        if dt is not None and dt.count > 1:  # one wide access from the scalar buffer (the struct is aligned)
            return f"*(({'' if store else 'const '}{self.render_dtype(dt)}*)({buf}+{names[id(idx)]}))"
        return super().render_access(buf, idx, names, dt, store)

    # ***** launching *****

    def flat(self, launch: KernelLaunch) -> Optional[UOp]:
        """The gidx0 of a flat kernel (counting threads across blocks, guarded by its size), None if not flat."""
        first = launch.special("gidx0")
        return first if first is not None and not launch.grouped and isinstance(first.arg[2], int) else None

    def flat_id(self, gidx0: UOp) -> str:
        """A flat kernel's thread index, in the kernel's index dtype: the unsigned int product wraps at 2^32."""
        wide = gidx0.dtype == dtypes.int64
        return "(long long)blockIdx.x*blockDim.x+threadIdx.x" if wide else "blockIdx.x*blockDim.x+threadIdx.x"

    def render_special(self, u: UOp, launch: KernelLaunch) -> str:
        dim, kind = u.arg[0], u.arg[1][0]
        if kind == "l":
            return f"threadIdx.{_DIMS[dim]}"
        if dim == 0 and (gidx0 := self.flat(launch)) is not None:
            return self.flat_id(gidx0)
        return f"blockIdx.{_DIMS[dim]}"

    def kernel_prologue(self, launch: KernelLaunch) -> list[str]:
        if (gidx0 := self.flat(launch)) is None:
            return []
        wide = gidx0.dtype == dtypes.int64  # the last block runs past the global size
        return [f"if ({self.flat_id(gidx0)} >= {gidx0.arg[2]}{'ll' if wide else 'u'}) return;"]

    def launch_bounds(self, launch: KernelLaunch) -> str:
        threads = FLAT_THREADS if self.flat(launch) is not None else launch.threads
        return f"__launch_bounds__({threads}) " if threads is not None else ""

    def render_prelude(self, uops: list[UOp], launch: KernelLaunch) -> list[str]:
        """The first line of a flat kernel (LAUNCH_FLAT) and the declarations a kernel needs beyond CUDA's builtins:
        half, bfloat16, vector types, BITCAST."""
        used: dict[DType, None] = {}
        for u in uops:
            if u.dtype is not None:
                dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
                used[dt.scalar()] = None
                used[dt] = None
        out = [LAUNCH_FLAT] if self.flat(launch) is not None else []
        if dtypes.float16 in used:
            out.append(_HALF)
        if dtypes.bfloat16 in used:
            out.append(_BF16)
        for dt in used:
            if dt.count > 1:
                size = dt.itemsize
                align = min(size, 16) if size & (size - 1) == 0 else dt.scalar().itemsize
                out.append(
                    f"struct alignas({align}) {self.render_dtype(dt)} {{ {self.render_dtype(dt.scalar())} "
                    f"v[{dt.count}]; }};"
                )
        if any(u.op is UOps.BITCAST for u in uops):
            out.append(_BITCAST)
        return out
