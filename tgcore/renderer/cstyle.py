"""The C-family renderer base: C, OpenCL C, CUDA C and Metal share this walk over the uops; dialects override
the small methods and tables (types, the prelude, how to spell a work-item index, a barrier, a kernel signature,
launch bounds, a bitcast, a vector lane).

The base by itself renders ISO C11 that GCC and clang build as it is (`-std=c11`): fixed-width types (stdint.h),
the prelude's includes (INFINITY and NAN, exp2f / log2f / sqrtf / sinf of math.h), signed `+ - *` spelled on the
unsigned type so that they wrap. Its kernels take their buffers (DEFINE_GLOBAL index order) and then their
variables as plain parameters. float16 and bfloat16 are not in its type_map (clang has no _Float16 on every
target); a dialect that adds a half type gets every op rounded to it once (a MULACC's product before its sum).

Every value becomes a local variable declared where it is computed; the target compiler inlines them.
The op spellings keep numpy's semantics: NaN propagates through MAX, integer division by zero gives 0,
INT_MIN / -1 wraps, shifts past the width give 0 (or -1 for a right shift of a negative number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tgcore.codegen.uops import UOp, UOps, index_uops, plain_index_ops
from tgcore.dtype import DType, PtrDType, dtypes, truncate
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.renderer import Renderer


@dataclass(frozen=True)
class KernelLaunch:
    """How a kernel is launched, read off its uops: what a GPU dialect's signature, launch bounds and work-item
    index spellings depend on (render_special, launch_bounds, kernel_prologue, render_prelude, render_kernel)."""

    specials: tuple[UOp, ...]  # the SPECIAL uops (launch indices), in kernel order
    # local indices, local memory or barriers: launched as global_size groups of local_size work items (else the
    # global indices count work items and the runtime picks the group size)
    grouped: bool
    local_size: tuple[Any, ...]  # per dimension (3), the size of its local SPECIAL; 1 where there is none

    @staticmethod
    def of(uops: list[UOp]) -> KernelLaunch:
        specials = tuple(u for u in uops if u.op is UOps.SPECIAL)
        local_size: list[Any] = [1, 1, 1]
        for u in specials:
            if u.arg[1].startswith("l"):
                local_size[u.arg[0]] = u.arg[2]
        grouped = any(u.arg[1].startswith("l") for u in specials) or any(
            u.op in (UOps.DEFINE_LOCAL, UOps.BARRIER) for u in uops
        )
        return KernelLaunch(specials, grouped, tuple(local_size))

    @property
    def threads(self) -> Optional[int]:
        """Work items per group of a grouped kernel, None when a local size is symbolic or the kernel is not grouped."""
        if not self.grouped or not all(isinstance(x, int) for x in self.local_size):
            return None
        return math.prod(self.local_size)

    def special(self, name: str) -> Optional[UOp]:
        """The SPECIAL named `name` (e.g. "gidx0"), if the kernel has it."""
        return next((u for u in self.specials if u.arg[1] == name), None)


class CStyleLanguage(Renderer):
    """Renders uops as a C-like kernel (by itself: ISO C11 for GCC and clang)."""

    kernel_prefix: str = ""  # before the return type, e.g. "__kernel " or 'extern "C" __global__ '
    buffer_prefix: str = ""  # before a buffer's element type, e.g. "__global "
    buffer_suffix: str = " restrict"
    arg_int_prefix: str = "const int"
    smem_prefix: str = ""
    barrier: str = ""
    float4: Optional[str] = None
    # SPECIAL index spelling, by the first letter of its name ("g"lobal / "l"ocal): fmt(dim) -> expression
    code_for_workitem: dict[str, Callable[[int], str]] = {}
    # fixed-width C types (stdint.h, stdbool.h: render_prelude); plain char's sign differs between ABIs
    type_map: dict[DType, str] = {
        dtypes.bool: "bool",
        dtypes.int8: "int8_t",
        dtypes.uint8: "uint8_t",
        dtypes.int16: "int16_t",
        dtypes.uint16: "uint16_t",
        dtypes.int32: "int32_t",
        dtypes.uint32: "uint32_t",
        dtypes.int64: "int64_t",
        dtypes.uint64: "uint64_t",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    extra_args: list[str] = []
    # the lines before the kernel (render_prelude's default): what the default spellings use
    prelude: tuple[str, ...] = ("#include <math.h>", "#include <stdbool.h>", "#include <stdint.h>")
    # signed int32 / int64 + - *, negation and MULACC overflow is undefined in C, C++ and OpenCL C: spelled on the
    # unsigned type of the width (render_as_unsigned, render_as_signed), which wraps as numpy does; the index
    # arithmetic, which cannot overflow (codegen.uops.plain_index_ops), stays plain so that the compiler folds it
    # into addresses. False for a dialect whose compiler is told that ints wrap (-fwrapv)
    wrap_signed: bool = True
    # vector dtypes whose ALU ops are spelled lane by lane (render_lanes: render_lane, render_vectorize): structs
    # (CUDA's), or vectors whose ops would not keep numpy's semantics as they are (Metal's)
    lanewise_vectors: bool = False
    # the float type transcendental ops of half / bfloat16 compute in
    float_compute: dict[DType, DType] = {dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32}
    infinity: str = "INFINITY"
    nan: str = "NAN"
    # spell an access at index `x + c` (c a constant) as `(buf+x)[c]`: the constant becomes part of the address
    # instead of int arithmetic, which a compiler told that ints wrap (-fwrapv) cannot fold into the address
    pointer_offsets: bool = False
    # the C type of the int32 index arithmetic (codegen.uops.index_uops: loop variables, launched indices and the
    # ops that only compute addresses, gates and bounds), None to keep int. Indices of an int32 kernel never overflow
    # int32 (the linearizer makes the kernel int64 otherwise), but a compiler told that ints wrap (-fwrapv) must redo
    # int index math each iteration: in a 64-bit type it strength-reduces it to pointer increments. An int64 kernel's
    # index uops are spelled as int64 (render_dtype)
    index_type: Optional[str] = None
    # vector uops (codegen/uops.py): the dtype.vec(n) types are GCC/clang vector extension types, declared at the
    # top of the kernel by render_vector_type; a vector load or store reads n consecutive, possibly unaligned elements
    vector_uops: bool = False

    # ***** spellings a dialect may override *****

    def render_dtype(self, dt: DType) -> str:
        base = dt.base if isinstance(dt, PtrDType) else dt
        if base.count > 1:
            return f"tg_{self.render_dtype(base.scalar()).replace(' ', '_')}{base.count}"
        if base not in self.type_map:
            raise NotImplementedError(
                f"{type(self).__name__} has no C type for {base.short_name} (its type_map has "
                f"{', '.join(dt.short_name for dt in self.type_map)})"
            )
        return self.type_map[base]

    def render_vector_type(self, dt: DType) -> str:
        """The declaration of vector type `dt` (GCC/clang vector extensions; aligned to one element, may alias it)."""
        scalar = dt.scalar()
        return (
            f"typedef {self.render_dtype(scalar)} {self.render_dtype(dt)} "
            f"__attribute__((vector_size({scalar.itemsize * dt.count}), aligned({scalar.itemsize}), may_alias));"
        )

    def render_const(self, val: object, dt: DType) -> str:
        if dt == dtypes.bool:
            return "1" if val else "0"
        if dtypes.is_float(dt):
            v = float(truncate(val, dt))  # rounded to the dtype here, so the C compiler's parse is exact
            if math.isnan(v):
                text = self.nan
            elif math.isinf(v):
                text = self.infinity if v > 0 else f"(-{self.infinity})"
            else:
                text = repr(v) + ("f" if dt != dtypes.float64 else "")
                if "e" not in text and "." not in text:
                    text = text.replace("f", ".0f") if dt != dtypes.float64 else text + ".0"
                text = negative_literal(text)
            return text if dt in (dtypes.float32, dtypes.float64) else f"(({self.render_dtype(dt)}){text})"
        v = int(val)  # type: ignore[call-overload]
        bits = dt.itemsize * 8
        if not dtypes.is_unsigned(dt) and v == -(2 ** (bits - 1)):
            return f"(({self.render_dtype(dt)})({v + 1}{'ll' if bits == 64 else ''}-1))"
        suffix = {(True, 64): "ull", (False, 64): "ll", (True, 32): "u"}.get((dtypes.is_unsigned(dt), bits), "")
        text = negative_literal(f"{v}{suffix}")
        return text if bits >= 32 else f"(({self.render_dtype(dt)}){text})"

    def render_cast(self, x: str, dt: DType) -> str:
        return f"(({self.render_dtype(dt)})({x}))"

    def render_conversion(self, x: str, src_dt: DType, dt: DType) -> str:
        """A CAST uop: value `x` of `src_dt` converted to `dt` (a dialect that spells some conversions by their
        source overrides this; the default is render_cast)."""
        return self.render_cast(x, dt)

    def render_bitcast(self, name: str, x: str, dt: DType) -> list[str]:
        """Statements that declare `name` of type `dt` with the bits of `x`."""
        t = self.render_dtype(dt)
        src = x if x.isidentifier() else f"(__typeof__({x})){{{x}}}"  # a folded constant: as a compound literal
        return [f"{t} {name};", f"__builtin_memcpy(&{name}, &{src}, sizeof({t}));"]

    def render_reinterpret(self, name: str, x: str, src_dt: DType, dt: DType) -> list[str]:
        """A BITCAST uop: statements that declare `name` of `dt` with the bits of `x` of `src_dt` (default:
        render_bitcast)."""
        return self.render_bitcast(name, x, dt)

    def render_load(self, access: str, dt: DType) -> str:
        """The value that reading `access` (an element or vector of `dt` in memory) gives: the access itself, unless
        the dialect keeps `dt` in registers in another type than in memory."""
        return access

    def render_store(self, access: str, value: str, dt: DType) -> str:
        """The statement that writes `value` to `access`, an element (or vector) of a buffer of `dt`."""
        return f"{access} = {value};"

    def render_math(self, fn: str, x: str, dt: DType) -> str:
        """A libm-style call: fn is exp2/log2/sin/sqrt; float32 uses the `f` variant."""
        if dt == dtypes.float64:
            return f"{fn}({x})"
        if dt == dtypes.float32:
            return f"{fn}f({x})"
        compute = self.float_compute[dt]
        return self.render_cast(self.render_math(fn, self.render_cast(x, compute), compute), dt)

    def render_fma(self, a: str, b: str, c: str, dt: DType) -> str:
        """a*b+c rounded once (a renderer with fused_mulacc; dt float32 or float64; a dialect with vector uops spells
        vectors itself)."""
        return f"{'fma' if dt == dtypes.float64 else 'fmaf'}({a},{b},{c})"

    def render_access(
        self, buf: str, idx: UOp, names: dict[int, str], dt: Optional[DType] = None, store: bool = False
    ) -> str:
        """The element of `buf` at index uop `idx` (the vector of dt.count elements from there, for a vector dt) that
        a LOAD reads or (`store`) a STORE writes."""
        offset = self.pointer_offsets and idx.op is UOps.ALU and idx.arg is BinaryOps.ADD
        if offset and idx.src[1].op is UOps.CONST:
            base, const = names[id(idx.src[0])], names[id(idx.src[1])]
        else:
            base, const = names[id(idx)], "0"
        if dt is not None and dt.count > 1 and self.vector_uops:  # n scalars from a scalar buffer
            return f"*({self.render_dtype(dt)}*)({buf}+{base}+{const})"
        return f"({buf}+{base})[{const}]" if const != "0" else f"{buf}[{base}]"

    def render_scalar_arg(self, name: str, dt: DType) -> str:
        """The kernel parameter of a DEFINE_VAR: `arg_int_prefix name`; the launches of the dialects that use it pass
        int32 values, so an int64 variable (one whose range passes int32's) is refused."""
        if dt != dtypes.int32:
            raise NotImplementedError(
                f"{type(self).__name__} passes symbolic variables as int32, but {name} is {dt.name} (its range passes "
                f"int32's): bind {name} to a range within -2**31 .. 2**31 - 1"
            )
        return f"{self.arg_int_prefix} {name}"

    def render_buffer_arg(self, name: str, dt: DType, writable: bool) -> str:
        """The kernel parameter of a DEFINE_GLOBAL (a read-only buffer is a pointer to const)."""
        return f"{self.buffer_prefix}{'' if writable else 'const '}{self.render_dtype(dt)}*{self.buffer_suffix} {name}"

    # ***** launching: what GPU dialects override *****

    def render_special(self, u: UOp, launch: KernelLaunch) -> str:
        """The expression of SPECIAL `u` (arg: dim, name, size): a work-item index of the launch (default:
        code_for_workitem by the name's first letter, "g"lobal or "l"ocal)."""
        if u.arg[1][0] not in self.code_for_workitem:
            raise NotImplementedError(f"{type(self).__name__} launches no work items: it cannot render {u.arg[1]}")
        return self.code_for_workitem[u.arg[1][0]](u.arg[0])

    def launch_bounds(self, launch: KernelLaunch) -> str:
        """Text between kernel_prefix and the return type (an attribute with the launch's work-group size), or ""."""
        return ""

    def kernel_prologue(self, launch: KernelLaunch) -> list[str]:
        """Statements at the top of the kernel body, before the first uop's (e.g. a guard on the global size)."""
        return []

    def render_prelude(self, uops: list[UOp], launch: KernelLaunch) -> list[str]:
        """The lines before the kernel: includes, pragmas, the declarations its spellings use (default: prelude)."""
        return list(self.prelude)

    def render_kernel(
        self, name: str, kernel: list[str], bufs: list[tuple[str, DType, bool]], launch: KernelLaunch
    ) -> str:
        """The kernel function: signature (buffers, then variables, then extra_args) and `kernel`, its body."""
        args = [
            self.render_buffer_arg(n, dt, writable) if isinstance(dt, PtrDType) else self.render_scalar_arg(n, dt)
            for n, dt, writable in bufs
        ]
        body = "\n".join("  " + line for line in kernel)
        signature = f"{self.kernel_prefix}{self.launch_bounds(launch)}void {name}({', '.join(args + self.extra_args)})"
        return f"{signature} {{\n{body}\n}}"

    # ***** vectors spelled lane by lane (lanewise_vectors) *****

    def render_lane(self, x: str, i: int, dt: DType) -> str:
        """Lane `i` of vector `x` of `dt` (also a GEP's spelling)."""
        return f"{x}[{i}]"

    def render_vectorize(self, dt: DType, lanes: list[str]) -> str:
        """The vector of `dt` made of `lanes` (VECTORIZE, a vector DEFINE_ACC's start, a lane-by-lane ALU op)."""
        return f"({self.render_dtype(dt)}){{{', '.join(lanes)}}}"

    def render_lanes(self, op: Op, srcs: list[str], src_dts: list[DType], dt: DType) -> str:
        """A vector ALU op as the vector of the scalar op on each lane (scalar sources are broadcast)."""
        count = max([dt.count, *(d.count for d in src_dts)])
        src_dt = src_dts[-1] if op is TernaryOps.WHERE else src_dts[0]
        lanes = []
        for i in range(count):
            parts = [self.render_lane(s, i, d) if d.count > 1 else s for s, d in zip(srcs, src_dts)]
            lanes.append(self.render_cast(self.render_alu(op, parts, dt.scalar(), src_dt.scalar()), dt.scalar()))
        return self.render_vectorize(dt, lanes)

    # ***** op spellings *****

    def render_as_unsigned(self, x: str, dt: DType) -> str:
        """`x` of signed `dt` as the unsigned type of its width, the bits kept (wrap_signed)."""
        unsigned = _UNSIGNED_OF[dt.scalar()]
        return f"({self.render_dtype(unsigned.vec(dt.count) if dt.count > 1 else unsigned)})({x})"

    def render_as_signed(self, x: str, dt: DType) -> str:
        """`x` of the unsigned type of `dt`'s width as signed `dt`, the bits kept (wrap_signed; C converts
        modulo 2^n on every compiler this targets)."""
        return f"(({self.render_dtype(dt)})({x}))"

    def render_wrapping(self, op: Op, srcs: list[str], dt: DType) -> Optional[str]:
        """Signed + - *, negation, MULACC and the x / -1 negation of int32 / int64 on the unsigned type, so that they
        wrap (wrap_signed); a uint16 product in unsigned int (C promotes uint16 to int, where 65535^2 overflows);
        None for every other op."""
        scalar = dt.scalar()
        if scalar == dtypes.uint16 and op in (BinaryOps.MUL, TernaryOps.MULACC):
            w = [f"({self.render_dtype(dtypes.uint32)})({s})" for s in srcs]
            return f"(({self.render_dtype(dt)})({w[0]}*{w[1]}{'' if op is BinaryOps.MUL else '+' + w[2]}))"
        if scalar not in (dtypes.int32, dtypes.int64):
            return None
        w = [self.render_as_unsigned(s, dt) for s in srcs]
        if op in _WRAPPING:
            return self.render_as_signed(f"{w[0]}{_WRAPPING[op]}{w[1]}", dt)
        if op is UnaryOps.NEG:  # 0 converts to the unsigned type
            return self.render_as_signed(f"0-{w[0]}", dt)
        if op is TernaryOps.MULACC:
            return self.render_as_signed(f"{w[0]}*{w[1]}+{w[2]}", dt)
        if op is BinaryOps.DIV:  # x / -1 is a negation, which wraps at the minimum
            a, b = srcs
            neg = self.render_as_signed(f"0-{w[0]}", dt)
            return f"(({b})==0?0:(({b})==-1?{neg}:({a}/{b})))"
        return None

    def render_index_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        """An int + - * of the index arithmetic (plain_index_ops; wrap_signed only): plain C, which cannot overflow
        there, so that the compiler keeps its no-overflow assumptions for addressing."""
        return f"({srcs[0]}{_INFIX[op]}{srcs[1]})"

    def render_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        a = srcs[0]
        b = srcs[1] if len(srcs) > 1 else ""
        is_float, signed = dtypes.is_float(src_dt), dtypes.is_int(src_dt) and not dtypes.is_unsigned(src_dt)
        if self.wrap_signed and (wrapped := self.render_wrapping(op, srcs, src_dt)) is not None:
            return wrapped
        if op is UnaryOps.NEG:
            return f"(!{a})" if src_dt == dtypes.bool else f"(-{a})"
        if op is UnaryOps.EXP2:
            return self.render_math("exp2", a, dt)
        if op is UnaryOps.LOG2:
            return self.render_math("log2", a, dt)
        if op is UnaryOps.SIN:
            return self.render_math("sin", a, dt)
        if op is UnaryOps.SQRT:
            return self.render_math("sqrt", a, dt)
        if op in _INFIX:
            return f"({a}{_INFIX[op]}{b})"
        if op is BinaryOps.MAX:
            return f"((({a})>({b})||({a})!=({a}))?({a}):({b}))" if is_float else f"(({a})>({b})?({a}):({b}))"
        if op is BinaryOps.DIV:
            if is_float:
                return f"({a}/{b})"
            return f"(({b})==0?0:(({b})==-1?(-{a}):({a}/{b})))" if signed else f"(({b})==0?0:({a}/{b}))"
        if op is BinaryOps.MOD:
            if is_float:
                return (
                    self.render_math("fmod", f"{a},{b}", dt)
                    if dt in (dtypes.float32, dtypes.float64)
                    else self.render_cast(f"fmodf((float)({a}),(float)({b}))", dt)
                )
            return f"((({b})==0{'||(' + b + ')==-1' if signed else ''})?0:({a}%{b}))"
        if op in (BinaryOps.SHL, BinaryOps.SHR):
            return self.render_shift(op, a, b, src_dt)
        if op is TernaryOps.WHERE:
            return f"({a}?{b}:{srcs[2]})"
        if op is TernaryOps.MULACC:
            if self.fused_mulacc and dt.scalar() in (dtypes.float32, dtypes.float64):
                return self.render_fma(a, b, srcs[2], dt)
            if dt.scalar() in self.float_compute:  # a half type: the product rounds to it before the sum, as a MUL
                return f"({self.render_cast(f'{a}*{b}', dt)}+{srcs[2]})"  # then ADD would (one op: one rounding)
            return f"(({a}*{b})+{srcs[2]})"
        raise NotImplementedError(f"{type(self).__name__} cannot render ALU op {op}")

    def render_local(self, name: str, dt: DType, size: int) -> str:
        """The declaration of a DEFINE_LOCAL array of `size` elements."""
        return f"{self.smem_prefix}{self.render_dtype(dt)} {name}[{size}];"

    def render_shift(self, op: Op, a: str, b: str, dt: DType) -> str:
        bits = dt.itemsize * 8
        t = self.render_dtype(dt)
        unsigned = self.render_dtype(_UNSIGNED_OF.get(dt, dt))
        out_of_range = f"(({b})<0||({b})>={bits})"
        if op is BinaryOps.SHL:  # shift in the unsigned type: a left shift of a negative number is undefined in C
            return f"({out_of_range}?0:(({t})(({unsigned})({a})<<({b}))))"
        fill = f"(({a})<0?-1:0)" if dtypes.is_int(dt) and not dtypes.is_unsigned(dt) else "0"
        return f"({out_of_range}?{fill}:(({a})>>({b})))"

    def _folded_offsets(self, uops: list[UOp]) -> set[int]:
        """The ids of the index + constant uops that every user spells as a pointer offset (render_access, where
        pointer_offsets): they need no statement of their own."""
        if not self.pointer_offsets:
            return set()
        folded = {id(u) for u in uops if u.op is UOps.ALU and u.arg is BinaryOps.ADD and u.src[-1].op is UOps.CONST}
        for u in uops:
            access = u.op is UOps.LOAD or u.op is UOps.STORE
            for position, s in enumerate(u.src):
                if not (access and position == 1):
                    folded.discard(id(s))
        return folded

    # ***** the walk *****

    def render(self, name: str, uops: list[UOp]) -> str:
        names: dict[int, str] = {}
        kernel: list[str] = []
        globals_: list[tuple[int, tuple[str, DType, bool]]] = []
        variables: list[tuple[str, DType, bool]] = []
        launch = KernelLaunch.of(uops)
        kernel.extend(self.kernel_prologue(launch))
        # local arrays first, at the kernel's outermost scope (OpenCL, CUDA and Metal declare them only there)
        uops = [u for u in uops if u.op is UOps.DEFINE_LOCAL] + [u for u in uops if u.op is not UOps.DEFINE_LOCAL]
        # the index arithmetic (index_uops), found once: what wrap_signed spells plainly and index_type spells wide
        index = index_uops(uops) if self.wrap_signed or self.index_type is not None else set()
        plain = plain_index_ops(uops, index) if self.wrap_signed else set()
        folded = self._folded_offsets(uops)
        depth = 0
        counter: dict[str, int] = {}

        def fresh(prefix: str) -> str:
            counter[prefix] = counter.get(prefix, -1) + 1
            return f"{prefix}{counter[prefix]}"

        def emit(line: str) -> None:
            kernel.append("  " * depth + line)

        # the int32 index arithmetic, spelled in index_type (if the dialect sets one)
        wide = set() if self.index_type is None else {id(u) for u in uops if id(u) in index and u.dtype == dtypes.int32}

        def int_t(u: UOp) -> str:
            assert u.dtype is not None
            return self.index_type if id(u) in wide else self.render_dtype(u.dtype)  # type: ignore[return-value]

        for u in uops:
            s = [names.get(id(x), "") for x in u.src]
            dt = u.dtype
            if u.op is UOps.DEFINE_GLOBAL:
                assert dt is not None
                names[id(u)] = u.arg[1]
                globals_.append((u.arg[0], (u.arg[1], dt, u.arg[2])))
            elif u.op is UOps.DEFINE_VAR:
                assert dt is not None
                names[id(u)] = u.arg[0]
                variables.append((u.arg[0], dt, False))
            elif u.op is UOps.DEFINE_LOCAL:
                assert dt is not None
                names[id(u)] = u.arg[0]
                emit(self.render_local(u.arg[0], dt.base, u.arg[1]))
            elif u.op is UOps.CONST:
                assert dt is not None
                names[id(u)] = self.render_const(u.arg, dt)
            elif u.op is UOps.SPECIAL:
                names[id(u)] = u.arg[1]
                emit(f"{int_t(u)} {u.arg[1]} = {self.render_special(u, launch)}; /* {u.arg[2]} */")
            elif u.op is UOps.RANGE:
                n = names[id(u)] = fresh("ridx" if u.arg[1] else "gidx")
                emit(f"for ({int_t(u)} {n} = {s[0]}; {n} < {s[1]}; {n}++) {{")
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
                init = self.render_const(u.arg, dt.scalar())
                if dt.count > 1:
                    init = self.render_vectorize(dt, [init] * dt.count)
                emit(f"{self.render_dtype(dt)} {n} = {init};")
            elif u.op is UOps.VECTORIZE:
                assert dt is not None
                n = names[id(u)] = fresh("vec")
                emit(f"{self.render_dtype(dt)} {n} = {self.render_vectorize(dt, s)};")
            elif u.op is UOps.GEP:
                assert u.src[0].dtype is not None
                names[id(u)] = self.render_lane(s[0], u.arg, u.src[0].dtype)
            elif u.op is UOps.PHI:
                emit(f"{s[0]} = {s[1]};")
                names[id(u)] = s[0]
            elif u.op is UOps.LOAD:
                assert dt is not None
                n = names[id(u)] = fresh("val")
                load = self.render_load(self.render_access(s[0], u.src[1], names, dt), dt)
                emit(f"{self.render_dtype(dt)} {n} = {f'({s[2]})?({load}):({s[3]})' if len(s) == 4 else load};")
            elif u.op is UOps.STORE:
                assert isinstance(u.src[0].dtype, PtrDType)
                access = self.render_access(s[0], u.src[1], names, u.src[2].dtype, store=True)
                store = self.render_store(access, s[2], u.src[0].dtype.base)
                emit(f"if ({s[3]}) {store}" if len(s) == 4 else store)
            elif u.op is UOps.ALU:
                if id(u) in folded:  # (spelled where it is used)
                    continue
                assert dt is not None and u.src[0].dtype is not None
                src_dt = u.src[-1].dtype if u.arg is TernaryOps.WHERE else u.src[0].dtype
                assert src_dt is not None
                n = names[id(u)] = fresh("alu")
                t = int_t(u) if id(u) in wide else self.render_dtype(dt)
                src_dts = [x.dtype for x in u.src]
                if self.lanewise_vectors and any(d is not None and d.count > 1 for d in [dt, *src_dts]):
                    expr = self.render_lanes(u.arg, s, src_dts, dt)  # type: ignore[arg-type]
                elif id(u) in plain:
                    expr = self.render_index_alu(u.arg, s, dt, src_dt)
                else:
                    expr = self.render_alu(u.arg, s, dt, src_dt)
                emit(f"{t} {n} = {expr};")
            elif u.op is UOps.CAST:
                assert dt is not None
                assert u.src[0].dtype is not None
                n = names[id(u)] = fresh("cast")
                emit(f"{self.render_dtype(dt)} {n} = {self.render_conversion(s[0], u.src[0].dtype, dt)};")
            elif u.op is UOps.BITCAST:
                assert dt is not None and u.src[0].dtype is not None
                n = names[id(u)] = fresh("bitcast")
                for line in self.render_reinterpret(n, s[0], u.src[0].dtype, dt):
                    emit(line)
            else:
                raise NotImplementedError(f"{type(self).__name__} cannot render uop {u.op}")
        if self.vector_uops:  # dialects without vector uops spell their own vector types (float4, half4, ...)
            vector_types = dict.fromkeys(u.dtype for u in uops if u.dtype is not None and u.dtype.count > 1)
            kernel[:0] = [self.render_vector_type(dt) for dt in vector_types]
        bufs = [b for _, b in sorted(globals_, key=lambda g: g[0])] + variables  # the order runtimes pass them in
        return "\n".join([*self.render_prelude(uops, launch), self.render_kernel(name, kernel, bufs, launch)]) + "\n"


def negative_literal(text: str) -> str:
    """A numeric literal that may start with a minus sign, parenthesized if it does: the ops are spelled by pasting
    operands next to their operator, and `x-` followed by `-9` would be `x--9` (a decrement, which does not compile)."""
    return f"({text})" if text.startswith("-") else text


_INFIX: dict[Op, str] = {
    BinaryOps.ADD: "+",
    BinaryOps.SUB: "-",
    BinaryOps.MUL: "*",
    BinaryOps.CMPLT: "<",
    BinaryOps.CMPEQ: "==",
    BinaryOps.XOR: "^",
    BinaryOps.AND: "&",
    BinaryOps.OR: "|",
}
_WRAPPING: dict[Op, str] = {BinaryOps.ADD: "+", BinaryOps.SUB: "-", BinaryOps.MUL: "*"}
_UNSIGNED_OF: dict[DType, DType] = {
    dtypes.int8: dtypes.uint8,
    dtypes.int16: dtypes.uint16,
    dtypes.int32: dtypes.uint32,
    dtypes.int64: dtypes.uint64,
}
