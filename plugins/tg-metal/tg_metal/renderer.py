"""The Metal Shading Language dialect of the C-family renderer.

A kernel is a `kernel void` function over `device` buffers bound at `[[buffer(i)]]` (i = the DEFINE_GLOBAL's index),
followed by its symbolic ints as `constant int&` at the next indices, in DEFINE_VAR order. Launch indices:

- a kernel with no local index, threadgroup memory or barrier reads `[[thread_position_in_grid]]`: the runtime
  launches `global_size` threads with `dispatchThreads` and picks the threadgroup size itself;
- one with them reads `[[threadgroup_position_in_grid]]` and `[[thread_position_in_threadgroup]]`: the runtime
  launches `global_size` threadgroups of `local_size` threads with `dispatchThreadgroups`.

Where Metal (C++14 underneath) differs from what numpy computes, the spelling makes it agree. Signed 32- and 64-bit
`+ - *` and negation are done on the unsigned type through `as_type` (signed overflow is undefined in C++: the
base's wrap_signed), except in index arithmetic, which stays within int by construction and is left plain for the
compiler's addressing; uint16 products are taken in uint (ushort promotes to int, whose product can overflow);
MULACC is a product and a sum in two statements, each rounded; half and bfloat16 compute every op in float and round
the result once (exact for + - * / and sqrt, as numpy's float16 does), and convert through float. Vectors (2 to 4
components) compute component by component, with the scalar spellings. float64 does not exist in Metal.

When enabled (see `tg_metal.syntax`), every rendering is parsed by a C++ front end against tg-metal's stand-in
`<metal_stdlib>` before it is returned.
"""

from __future__ import annotations

from typing import Optional

from tg_metal.syntax import check_syntax, syntax_check_enabled
from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, Op, TernaryOps
from tgcore.renderer.cstyle import CStyleLanguage, KernelLaunch, negative_literal

_INT32_MAX = 2**31 - 1
_HEADER = (
    "#include <metal_stdlib>\n"
    "using namespace metal;\n"
    # MSL 3.2 can forbid contracting a*b+c into one rounding; older versions have only MTLCompileOptions' fast math
    "#if __METAL_VERSION__ >= 320\n"
    "#pragma METAL fp contract(off)\n"
    "#endif\n"
)
_LANES = "xyzw"
_GRID_ID = {"g": lambda dim: f"gid.{_LANES[dim]}", "l": lambda dim: f"lid.{_LANES[dim]}"}
_UNSIGNED = {dtypes.int32: "uint", dtypes.int64: "ulong"}
_HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)  # computed in float


class MetalRenderer(CStyleLanguage):
    """Metal Shading Language (MSL 3.1 for bfloat; everything else MSL 2)."""

    device = "METAL"
    kernel_prefix = "kernel "
    buffer_prefix = "device "
    smem_prefix = "threadgroup "
    arg_int_prefix = "constant int&"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    float4 = "float4"
    supports_float4 = True
    has_local = True
    has_shared = True
    global_max = (_INT32_MAX, _INT32_MAX, _INT32_MAX)  # indices are int
    local_max = (1024, 1024, 1024)  # and at most 1024 threads in a threadgroup on every Metal GPU
    shared_max = 32768  # threadgroup memory every Apple GPU has
    code_for_workitem = _GRID_ID
    prelude = (_HEADER.rstrip("\n"),)
    lanewise_vectors = True  # vectors of 2 to 4 components compute component by component
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
        dtypes.bfloat16: "bfloat",
        dtypes.float32: "float",
    }
    infinity = "INFINITY"
    nan = "NAN"

    # ***** types and constants *****

    def render_dtype(self, dt: DType) -> str:
        base = dt.base if isinstance(dt, PtrDType) else dt
        scalar = base.scalar()
        if scalar not in self.type_map:
            raise NotImplementedError(f"Metal has no {scalar.short_name} type (tg-metal renders no {scalar.name})")
        if base.count > 1 and base.count not in (2, 3, 4):
            raise NotImplementedError(f"Metal vectors have 2, 3 or 4 components, not {base.count} ({base!r})")
        name = self.type_map[scalar]
        return f"{name}{base.count}" if base.count > 1 else name

    def render_const(self, val: object, dt: DType) -> str:
        if dt.count > 1:
            return f"{self.render_dtype(dt)}({self.render_const(val, dt.scalar())})"
        if dt in (dtypes.int64, dtypes.uint64):  # long is 64 bits in Metal, and there is no long long
            v = int(val)  # type: ignore[call-overload]
            if v == -(2**63):
                return "((long)(-9223372036854775807L-1L))"
            return f"{v}UL" if dt == dtypes.uint64 else negative_literal(f"{v}L")
        return super().render_const(val, dt)

    def render_cast(self, x: str, dt: DType) -> str:
        return f"{self.render_dtype(dt)}({x})" if dt.count > 1 else super().render_cast(x, dt)

    def render_bitcast(self, name: str, x: str, dt: DType) -> list[str]:
        t = self.render_dtype(dt)
        return [f"{t} {name} = as_type<{t}>({x});"]

    def render_as_unsigned(self, x: str, dt: DType) -> str:
        return f"as_type<{_UNSIGNED[dt]}>({x})"

    def render_as_signed(self, x: str, dt: DType) -> str:
        return f"as_type<{self.type_map[dt]}>({x})"

    def render_lane(self, x: str, i: int, dt: DType) -> str:
        return f"({x}).{_LANES[i]}"

    def render_vectorize(self, dt: DType, lanes: list[str]) -> str:
        return f"{self.render_dtype(dt)}({', '.join(lanes)})"

    def render_math(self, fn: str, x: str, dt: DType) -> str:
        if dt == dtypes.float32:
            return f"metal::{fn}({x})"
        # half and bfloat16 reach here only through the float rewrite; kept general for direct callers
        return self.render_cast(self.render_math(fn, self.render_cast(x, dtypes.float32), dtypes.float32), dt)

    # ***** the kernel *****

    def render(self, name: str, uops: list[UOp]) -> str:
        src = super().render(name, lower_for_metal(uops))
        if syntax_check_enabled():
            check_syntax(name, src)
        return src

    def render_kernel(
        self, name: str, kernel: list[str], bufs: list[tuple[str, DType, bool]], launch: KernelLaunch
    ) -> str:
        args = []
        for binding, (n, dt, writable) in enumerate(bufs):  # buffers in index order, then the variables
            if isinstance(dt, PtrDType):
                args.append(f"{'' if writable else 'const '}device {self.render_dtype(dt)}* {n}")
            else:
                args.append(self.render_scalar_arg(n, dt))
            args[-1] += f" [[buffer({binding})]]"
        if launch.grouped:
            args += ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
        else:
            args.append("uint3 gid [[thread_position_in_grid]]")
        body = "\n".join("  " + line for line in kernel)
        return f"{self.kernel_prefix}void {name}({', '.join(args)}) {{\n{body}\n}}"


def lower_for_metal(uops: list[UOp]) -> list[UOp]:
    """The uops rewritten into what the Metal spellings expect (the same computation):

    - MULACC as MUL then ADD, two statements, so the product is rounded before the sum;
    - ALU ops on half and bfloat16 (but WHERE, which only selects) on float operands, the result cast back;
    - CASTs between bfloat16 and anything but float through float (Metal converts bfloat to and from float)."""
    return _Lowering().run(uops)


class _Lowering:
    """One pass of lower_for_metal: emits the new list, remembering which new uop stands for each old one."""

    def __init__(self) -> None:
        self.out: list[UOp] = []
        self.new: dict[int, UOp] = {}

    def run(self, uops: list[UOp]) -> list[UOp]:
        for u in uops:
            src = tuple(self.new.get(id(s), s) for s in u.src)
            dt = u.dtype
            if u.op is UOps.ALU and u.arg is TernaryOps.MULACC:
                assert dt is not None
                product = self.alu(dt, src[:2], BinaryOps.MUL)
                rebuilt = self.alu(dt, (product, src[2]), BinaryOps.ADD)
            elif u.op is UOps.ALU:
                assert dt is not None
                rebuilt = self.alu(dt, src, u.arg)
            elif u.op is UOps.CAST and dt is not None and src[0].dtype is not None and _through_float(src[0].dtype, dt):
                rebuilt = self.emit(UOps.CAST, dt, (self.as_float(src[0]),))
            elif all(a is b for a, b in zip(src, u.src)):
                self.out.append(u)
                rebuilt = u
            else:
                rebuilt = self.emit(u.op, dt, src, u.arg)
            self.new[id(u)] = rebuilt
        return self.out

    def emit(self, op: UOps, dtype: Optional[DType], src: tuple[UOp, ...], arg: object = None) -> UOp:
        u = UOp(op, dtype, src, arg)
        self.out.append(u)
        return u

    def as_float(self, u: UOp) -> UOp:
        assert u.dtype is not None
        return self.emit(UOps.CAST, _float_like(u.dtype), (u,))

    def alu(self, dt: DType, src: tuple[UOp, ...], op: Op) -> UOp:
        """ALU `op`; on half or bfloat16 operands, computed in float with the result cast back to `dt`."""
        if any(s.dtype is not None and s.dtype.count != dt.count for s in src):
            widths = [s.dtype for s in src]
            raise NotImplementedError(f"Metal renderer: ALU {op} of {dt!r} has operands of other widths: {widths}")
        operands = src[1:] if op is TernaryOps.WHERE else src
        narrow = any(s.dtype is not None and s.dtype.scalar() in _HALF_FLOATS for s in operands)
        if op is TernaryOps.WHERE or not narrow:  # WHERE only selects: no rounding to keep
            return self.emit(UOps.ALU, dt, src, op)
        result = dt if dt.scalar() == dtypes.bool else _float_like(dt)
        value = self.emit(UOps.ALU, result, tuple(self.as_float(s) for s in src), op)
        return value if result == dt else self.emit(UOps.CAST, dt, (value,))


def _float_like(dt: DType) -> DType:
    """float32 with as many components as dt."""
    return dtypes.float32.vec(dt.count) if dt.count > 1 else dtypes.float32


def _through_float(src: DType, dst: DType) -> bool:
    """A CAST between these dtypes goes through float: one side is bfloat16 and the other is not float."""
    sides = (src.scalar(), dst.scalar())
    return dtypes.bfloat16 in sides and dtypes.float32 not in sides
