"""The CUDA C++ dialect of the C-family renderer.

Kernels are `extern "C" __global__` functions. What CUDA C++ would compute differently from numpy is spelled so
that it agrees: signed `+ - *` and negation of int and long long are done on the unsigned type (signed overflow is
undefined in C++) except in index arithmetic, which is left plain so the compiler can fold addresses; unsigned
short products are taken as unsigned int (they would be promoted to int and could overflow); the compiler gets
`-fmad=false`, so `a*b+c` is rounded twice. Consts are rounded to their dtype in Python, exactly.

half and bfloat16 need no CUDA header: the source declares `tg_half` and `tg_bf16`, 16-bit structs that convert
to and from float (half with the PTX `cvt.rn` instructions, bfloat16 by rounding to nearest even in integer
arithmetic, as `tgcore.dtype.bf16_round` does). Arithmetic on them happens in float and rounds back once per op,
which is exact for + - * / (float has more than 2p+2 bits); a MULACC rounds `a*b` before it adds.

Launching. A kernel whose only launch indices are global (what the linearizer emits) is "flat": its `gidx0` is
`blockIdx.x*blockDim.x+threadIdx.x`, guarded by the global size, and the runtime launches it in blocks of up to
FLAT_THREADS threads; `gidx1`, `gidx2` are `blockIdx.y`, `blockIdx.z`. A kernel with local indices (`lidx`),
`__shared__` memory or barriers is launched as given: `gidx` is `blockIdx`, `lidx` is `threadIdx`, the grid is
`global_size` and the block `local_size`. The first source line tells the runtime which (see `LAUNCH_FLAT`).

Vector dtypes (`dtypes.float32.vec(4)`, ...) are structs `tg_<dtype>x<N>` of N lanes in `.v[]`, aligned to their
size up to 16 bytes: a vector LOAD / STORE is one wide memory access, and ALU ops, CAST and CONST on vectors work
lane by lane.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tgcore.codegen.uops import UOp, UOps, plain_index_ops
from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.renderer.cstyle import CStyleLanguage

FLAT_THREADS = 256  # the most threads per block of a flat kernel (its __launch_bounds__)
LAUNCH_FLAT = "// tg-cuda launch: flat"  # first line of a flat kernel's source, copied into its PTX
_DIMS = "xyz"
_WRAPPED = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long long"}  # signed types computed unsigned

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
            lane = self.render_const(val, dt.scalar())
            return f"{self.render_dtype(dt)}{{{', '.join([lane] * dt.count)}}}"
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

    # ***** ops *****

    def render_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        scalar = src_dt.scalar()
        if scalar in _WRAPPED:  # signed overflow is undefined in C++: compute on the unsigned type, which wraps
            t, u = self.type_map[scalar], _WRAPPED[scalar]
            w = [f"({u})({s})" for s in srcs]
            if op in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL):
                sign = {BinaryOps.ADD: "+", BinaryOps.SUB: "-", BinaryOps.MUL: "*"}[op]
                return f"(({t})({w[0]}{sign}{w[1]}))"
            if op is UnaryOps.NEG:
                return f"(({t})(0-{w[0]}))"
            if op is TernaryOps.MULACC:
                return f"(({t})({w[0]}*{w[1]}+{w[2]}))"
            if op is BinaryOps.DIV:  # x / -1 is a negation, which wraps at the minimum
                a, b = srcs
                return f"(({b})==0?0:(({b})==-1?(({t})(0-{w[0]})):({a}/{b})))"
        if scalar == dtypes.uint16 and op in (BinaryOps.MUL, TernaryOps.MULACC):  # promoted to int, 65535^2 overflows
            w = [f"(unsigned int)({s})" for s in srcs]
            return f"({w[0]}*{w[1]})" if op is BinaryOps.MUL else f"({w[0]}*{w[1]}+{w[2]})"
        if scalar in (dtypes.float16, dtypes.bfloat16) and op is TernaryOps.MULACC:  # a*b rounds before the add
            return f"({self.render_cast(f'{srcs[0]}*{srcs[1]}', scalar)}+{srcs[2]})"
        return super().render_alu(op, srcs, dt, src_dt)

    def render_lanes(self, op: Op, srcs: list[str], vector: list[bool], dt: DType, src_dt: DType) -> str:
        """A vector ALU op, lane by lane (`vector` says which sources are vectors; the others are broadcast)."""
        count = max(dt.count, src_dt.count)
        lanes = [
            self.render_cast(
                self.render_alu(
                    op, [f"{s}.v[{i}]" if v else s for s, v in zip(srcs, vector)], dt.scalar(), src_dt.scalar()
                ),
                dt.scalar(),
            )
            for i in range(count)
        ]
        return f"{self.render_dtype(dt)}{{{', '.join(lanes)}}}"

    # ***** the kernel *****

    def render(self, name: str, uops: list[UOp]) -> str:
        grouped = any(
            (u.op is UOps.SPECIAL and u.arg[1].startswith("l")) or u.op in (UOps.DEFINE_LOCAL, UOps.BARRIER)
            for u in uops
        )
        first = next((u for u in uops if u.op is UOps.SPECIAL and u.arg[1] == "gidx0"), None)
        flat_size = first.arg[2] if first is not None and not grouped and isinstance(first.arg[2], int) else None
        plain = plain_index_ops(uops)
        names: dict[int, str] = {}
        buffers: list[str] = []
        scalars: list[str] = []
        body: list[str] = []
        counter: dict[str, int] = {}
        depth = 1

        def fresh(prefix: str) -> str:
            counter[prefix] = counter.get(prefix, -1) + 1
            return f"{prefix}{counter[prefix]}"

        def emit(line: str) -> None:
            body.append("  " * depth + line)

        # a flat kernel's thread index, in the kernel's index dtype: the unsigned int product wraps at 2^32
        wide = first is not None and first.dtype == dtypes.int64
        flat_id = "(long long)blockIdx.x*blockDim.x+threadIdx.x" if wide else "blockIdx.x*blockDim.x+threadIdx.x"

        def workitem(u: UOp) -> str:
            dim, kind = u.arg[0], u.arg[1][0]
            if kind == "l":
                return f"threadIdx.{_DIMS[dim]}"
            if dim == 0 and flat_size is not None:
                return flat_id
            return f"blockIdx.{_DIMS[dim]}"

        if flat_size is not None:  # the last block runs past the global size
            emit(f"if ({flat_id} >= {flat_size}{'ll' if wide else 'u'}) return;")
        # __shared__ arrays first, at the kernel's outermost scope
        ordered = [u for u in uops if u.op is UOps.DEFINE_LOCAL] + [u for u in uops if u.op is not UOps.DEFINE_LOCAL]
        for u in ordered:
            s = [names.get(id(x), "") for x in u.src]
            dt = u.dtype
            if u.op is UOps.DEFINE_GLOBAL:
                assert isinstance(dt, PtrDType)
                names[id(u)] = u.arg[1]
                const = "" if u.arg[2] else "const "
                buffers.append(f"{const}{self.render_dtype(dt)}*{self.buffer_suffix} {u.arg[1]}")
            elif u.op is UOps.DEFINE_VAR:
                assert dt is not None
                names[id(u)] = u.arg[0]
                scalars.append(self.render_scalar_arg(u.arg[0], dt))
            elif u.op is UOps.DEFINE_LOCAL:
                assert dt is not None
                names[id(u)] = u.arg[0]
                emit(f"{self.smem_prefix}{self.render_dtype(dt)} {u.arg[0]}[{u.arg[1]}];")
            elif u.op is UOps.CONST:
                assert dt is not None
                names[id(u)] = self.render_const(u.arg, dt)
            elif u.op is UOps.SPECIAL:
                names[id(u)] = u.arg[1]
                assert dt is not None
                emit(f"{self.render_dtype(dt)} {u.arg[1]} = {workitem(u)}; /* {u.arg[2]} */")
            elif u.op is UOps.RANGE:
                n = names[id(u)] = fresh("ridx" if u.arg[1] else "loop")
                assert dt is not None
                emit(f"for ({self.render_dtype(dt)} {n} = {s[0]}; {n} < {s[1]}; {n}++) {{")
                depth += 1
            elif u.op in (UOps.ENDRANGE, UOps.ENDIF):
                depth -= 1
                emit("}")
            elif u.op is UOps.IF:
                emit(f"if ({s[0]}) {{")
                depth += 1
            elif u.op is UOps.BARRIER:
                emit(self.barrier)
            elif u.op is UOps.DEFINE_ACC:
                assert dt is not None
                n = names[id(u)] = fresh("acc")
                emit(f"{self.render_dtype(dt)} {n} = {self.render_const(u.arg, dt)};")
            elif u.op is UOps.PHI:
                emit(f"{s[0]} = {s[1]};")
                names[id(u)] = s[0]
            elif u.op is UOps.LOAD:
                assert dt is not None
                n = names[id(u)] = fresh("val")
                t = self.render_dtype(dt)
                load = f"*((const {t}*)({s[0]}+{s[1]}))" if dt.count > 1 else f"{s[0]}[{s[1]}]"
                emit(f"{t} {n} = {f'({s[2]})?({load}):({s[3]})' if len(s) == 4 else load};")
            elif u.op is UOps.STORE:
                value_dt = u.src[2].dtype
                assert value_dt is not None
                target = (
                    f"*(({self.render_dtype(value_dt)}*)({s[0]}+{s[1]}))" if value_dt.count > 1 else f"{s[0]}[{s[1]}]"
                )
                emit(f"if ({s[3]}) {target} = {s[2]};" if len(s) == 4 else f"{target} = {s[2]};")
            elif u.op is UOps.ALU:
                assert dt is not None
                src_dt = u.src[-1].dtype if u.arg is TernaryOps.WHERE else u.src[0].dtype
                assert src_dt is not None
                n = names[id(u)] = fresh("alu")
                vector = [x.dtype is not None and x.dtype.count > 1 for x in u.src]
                if any(vector) or dt.count > 1:
                    expr = self.render_lanes(u.arg, s, vector, dt, src_dt)
                elif id(u) in plain:
                    expr = CStyleLanguage.render_alu(self, u.arg, s, dt, src_dt)
                else:
                    expr = self.render_alu(u.arg, s, dt, src_dt)
                emit(f"{self.render_dtype(dt)} {n} = {expr};")
            elif u.op is UOps.CAST:
                assert dt is not None and u.src[0].dtype is not None
                n = names[id(u)] = fresh("cast")
                if dt.count > 1:
                    lanes = [
                        self.render_cast(f"{s[0]}.v[{i}]" if u.src[0].dtype.count > 1 else s[0], dt.scalar())
                        for i in range(dt.count)
                    ]
                    emit(f"{self.render_dtype(dt)} {n} = {self.render_dtype(dt)}{{{', '.join(lanes)}}};")
                else:
                    emit(f"{self.render_dtype(dt)} {n} = {self.render_cast(s[0], dt)};")
            elif u.op is UOps.BITCAST:
                assert dt is not None
                n = names[id(u)] = fresh("bitcast")
                for line in self.render_bitcast(n, s[0], dt):
                    emit(line)
            else:
                raise NotImplementedError(f"{type(self).__name__} cannot render uop {u.op}")
        threads: Optional[int] = FLAT_THREADS if flat_size is not None else None
        if grouped:
            sizes = [u.arg[2] for u in uops if u.op is UOps.SPECIAL and u.arg[1].startswith("l")]
            threads = math.prod(sizes) if all(isinstance(x, int) for x in sizes) else None
        bounds = f"__launch_bounds__({threads}) " if threads is not None else ""
        header = [LAUNCH_FLAT] if flat_size is not None else []
        header += self.prelude(uops)
        signature = f"{self.kernel_prefix}void {bounds}{name}({', '.join(buffers + scalars)})"
        return "\n".join(header + [signature + " {", *body, "}"]) + "\n"

    def prelude(self, uops: list[UOp]) -> list[str]:
        """The declarations a kernel needs beyond CUDA's builtins: half, bfloat16, vector types, BITCAST."""
        used: dict[DType, None] = {}
        for u in uops:
            if u.dtype is not None:
                dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
                used[dt.scalar()] = None
                used[dt] = None
        out = []
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
