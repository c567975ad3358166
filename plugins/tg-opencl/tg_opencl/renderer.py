"""The OpenCL C dialect of the C-family renderer.

Kernels are `__kernel` functions over `__global` buffers. Where OpenCL C differs from what numpy computes, the
spelling makes it agree: signed `+ - *` and negation are done on the unsigned type of the same width (signed
overflow is undefined in OpenCL C as in C: the base's wrap_signed, spelled with `as_uint` / `as_int`) except in index
arithmetic, which cannot overflow and is left plain so the compiler can optimize addressing; `#pragma OPENCL
FP_CONTRACT OFF` stops `a*b+c` from becoming one fused rounding, and half computes `/` and the transcendental
functions in float. bool buffers are `uchar` (OpenCL C allows no bool in kernel arguments); a bool value in the
body is a `bool`. bfloat16 (which OpenCL C lacks) is `ushort` in memory and a `float` in the body, rounded to
nearest even after every op (exact for + - * / and sqrt).

A kernel with no local index, local memory or barrier takes its global index from `get_global_id` and lets the
driver choose the work-group size. One that has them (a grouped KernelLaunch) takes `get_group_id` / `get_local_id`
and carries `reqd_work_group_size` with the sizes of its local SPECIALs (launch_bounds): the runtime reads that
attribute back and launches `global_size * local_size` work items in groups of `local_size`.
"""

from __future__ import annotations

from typing import Sequence

from tg_opencl.cl_platform import DeviceInfo
from tg_opencl.syntax import check_syntax, syntax_check_enabled
from tgcore.codegen.uops import UOp
from tgcore.dtype import DType, PtrDType, dtypes, truncate
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.renderer.cstyle import CStyleLanguage, KernelLaunch, negative_literal

_INT32_MAX = 2**31 - 1
_UNSIGNED = {dtypes.int8: "uchar", dtypes.int16: "ushort", dtypes.int32: "uint", dtypes.int64: "ulong"}
# bfloat16 in float registers: rounding to nearest even (a NaN stays a quiet NaN), and its bits in memory
_BF16 = """inline float tg_round_bf16(float x) {
  uint b = as_uint(x), r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return as_float((b & 0x7fffffffu) > 0x7f800000u ? (b | 0x00400000u) & 0xffff0000u : r);
}
inline float tg_bf2f(ushort h) { return as_float((uint)h << 16); }
inline ushort tg_f2bf(float x) { return (ushort)(as_uint(x) >> 16); }"""
# ops that round nothing: spelled on bfloat16's floats as they are
_EXACT_OPS = (BinaryOps.CMPLT, BinaryOps.CMPEQ, BinaryOps.MAX, TernaryOps.WHERE, UnaryOps.NEG)


# the limits OpenCL guarantees to every full-profile device, for rendering where no device can be asked
_FALLBACK = (256, (256, 256, 256), 32768)


class OpenCLRenderer(CStyleLanguage):
    """OpenCL C; limits and the half / double types come from the devices it renders for."""

    device = "OPENCL"
    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    smem_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    float4 = "(float4)"
    supports_float4 = True
    has_local = True
    has_shared = True
    type_map = {
        dtypes.bool: "bool",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.int16: "short",
        dtypes.uint16: "ushort",
        dtypes.int32: "int",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
        dtypes.float16: "half",
        dtypes.bfloat16: "float",  # in registers; in memory ushort (render_dtype)
        dtypes.float32: "float",
        dtypes.float64: "double",
    }

    def __init__(self, infos: Sequence[DeviceInfo] = ()) -> None:
        """Limits are the smallest among `infos` (the devices a program is built for)."""
        if infos:
            group = min(i.max_work_group_size for i in infos)
            dims = min(len(i.max_work_item_sizes) for i in infos)
            items = tuple(min(i.max_work_item_sizes[d] for i in infos) for d in range(min(dims, 3)))
            shared = min(i.local_mem_size for i in infos)
        else:
            group, items, shared = _FALLBACK
        self.max_work_group_size = group
        self.global_max = (_INT32_MAX,) * len(items)  # indices are int
        self.local_max = tuple(min(s, group) for s in items)
        self.shared_max = shared
        # staging inputs in __local memory pays where it is on-chip (a GPU's), not where it is global memory (PoCL's)
        self.shared_is_fast = all(i.local_mem_dedicated for i in infos) if infos else True
        self.fp16 = bool(infos) and all(i.fp16 for i in infos)
        self.fp64 = bool(infos) and all(i.fp64 for i in infos)

    def render(self, name: str, uops: list[UOp]) -> str:
        src = super().render(name, uops)
        if syntax_check_enabled():  # (TG_OPENCL_SYNTAX_CHECK=1: where no platform here can build, see syntax.py)
            check_syntax(name, src)
        return src

    # ***** types and constants *****

    def render_dtype(self, dt: DType) -> str:
        base = dt.base if isinstance(dt, PtrDType) else dt
        if isinstance(dt, PtrDType) and base.scalar() == dtypes.bool:
            return "uchar"  # bool has no defined size in OpenCL C: bool memory is bytes
        if isinstance(dt, PtrDType) and base.scalar() == dtypes.bfloat16:
            return "ushort"  # bfloat16 memory is its 16 bits; its values are floats (type_map)
        name = self.type_map[base.scalar()]
        return f"{name}{base.count}" if base.count > 1 else name

    def render_const(self, val: object, dt: DType) -> str:
        if dt.count > 1:
            return f"(({self.render_dtype(dt)})({self.render_const(val, dt.scalar())}))"
        if dt == dtypes.bfloat16:  # a float holding the value rounded to bfloat16
            return super().render_const(truncate(val, dt), dtypes.float32)  # type: ignore[arg-type]
        if dt in (dtypes.int64, dtypes.uint64):  # OpenCL C spells 64-bit literals with L, not ll
            v = int(val)  # type: ignore[call-overload]
            if v == -(2**63):
                return "((long)(-9223372036854775807L-1L))"
            return f"{v}UL" if dt == dtypes.uint64 else negative_literal(f"{v}L")
        return super().render_const(val, dt)

    def render_bitcast(self, name: str, x: str, dt: DType) -> list[str]:
        t = self.render_dtype(dt)
        return [f"{t} {name} = as_{t}({x});"]

    def render_as_unsigned(self, x: str, dt: DType) -> str:
        return f"as_{_UNSIGNED[dt.scalar()]}{dt.count if dt.count > 1 else ''}({x})"

    def render_as_signed(self, x: str, dt: DType) -> str:
        return f"as_{self.render_dtype(dt)}({x})"

    # ***** bfloat16: floats rounded to nearest even after every op, stored as their top 16 bits *****

    def render_conversion(self, x: str, src_dt: DType, dt: DType) -> str:
        if dt == dtypes.bfloat16:  # through float (from float64 too: bfloat16 is defined as float32's top half)
            return f"tg_round_bf16((float)({x}))"
        return super().render_conversion(x, src_dt, dt)

    def render_reinterpret(self, name: str, x: str, src_dt: DType, dt: DType) -> list[str]:
        if dtypes.bfloat16 not in (src_dt, dt):
            return super().render_reinterpret(name, x, src_dt, dt)
        bits = f"tg_f2bf({x})" if src_dt == dtypes.bfloat16 else f"as_ushort({x})"
        if dt == dtypes.bfloat16:
            return [f"float {name} = tg_bf2f({bits});"]
        t = self.render_dtype(dt)
        return [f"{t} {name} = as_{t}({bits});"]

    def render_load(self, access: str, dt: DType) -> str:
        return f"tg_bf2f({access})" if dt == dtypes.bfloat16 else access

    def render_store(self, access: str, value: str, dt: DType) -> str:
        return f"{access} = tg_f2bf({value});" if dt == dtypes.bfloat16 else f"{access} = {value};"

    def render_local(self, name: str, dt: DType, size: int) -> str:
        t = "ushort" if dt == dtypes.bfloat16 else self.render_dtype(dt)
        return f"{self.smem_prefix}{t} {name}[{size}];"

    def render_math(self, fn: str, x: str, dt: DType) -> str:
        if dt.scalar() in (dtypes.float32, dtypes.float64):
            return f"{fn}({x})"  # OpenCL's math functions are overloaded on the argument type
        compute = self.float_compute[dt.scalar()]
        return self.render_cast(f"{fn}({self.render_cast(x, compute)})", dt)

    # ***** ops *****

    def render_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        if src_dt == dtypes.bfloat16:  # computed in float, the result rounded (a product before its sum)
            f32 = dtypes.float32
            if op in _EXACT_OPS:
                return self.render_alu(op, srcs, dtypes.bool if dt == dtypes.bool else f32, f32)
            if op is TernaryOps.MULACC:
                return f"tg_round_bf16(tg_round_bf16({srcs[0]}*{srcs[1]})+{srcs[2]})"
            return f"tg_round_bf16({self.render_alu(op, srcs, f32, f32)})"
        if src_dt.scalar() == dtypes.float16 and op in (BinaryOps.DIV, BinaryOps.MOD):
            # cl_khr_fp16 division need not round correctly: divide in float, which rounds once to half exactly
            f = self.float_compute[dtypes.float16]
            a, b = (self.render_cast(s, f) for s in srcs)
            return self.render_cast(f"({a}/{b})" if op is BinaryOps.DIV else f"fmod({a},{b})", dt)
        if op is BinaryOps.MOD and dtypes.is_float(src_dt):
            return f"fmod({srcs[0]},{srcs[1]})"
        return super().render_alu(op, srcs, dt, src_dt)

    def render_shift(self, op: Op, a: str, b: str, dt: DType) -> str:
        if op is BinaryOps.SHL and dt.scalar() in _UNSIGNED:
            # shift the bits as unsigned, then reinterpret: no out-of-range signed conversion
            bits, t, u = dt.itemsize * 8, self.render_dtype(dt), _UNSIGNED[dt.scalar()]
            return f"((({b})<0||({b})>={bits})?0:as_{t}(({u})(as_{u}({a})<<({b}))))"
        return super().render_shift(op, a, b, dt)

    # ***** the kernel *****

    def render_special(self, u: UOp, launch: KernelLaunch) -> str:
        if u.arg[1].startswith("l"):
            return f"get_local_id({u.arg[0]})"
        return f"get_{'group' if launch.grouped else 'global'}_id({u.arg[0]})"

    def launch_bounds(self, launch: KernelLaunch) -> str:
        if not launch.grouped:
            return ""
        return f"__attribute__((reqd_work_group_size({','.join(str(s) for s in launch.local_size)}))) "

    def render_prelude(self, uops: list[UOp], launch: KernelLaunch) -> list[str]:
        used = {
            (u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() for u in uops if u.dtype is not None
        }
        header = ["#pragma OPENCL FP_CONTRACT OFF"]
        if dtypes.bfloat16 in used:
            header.append(_BF16)
        if dtypes.float16 in used:
            header.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if dtypes.float64 in used:
            header.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        return header
