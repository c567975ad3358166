"""Renders the UOp IR straight to LLVM IR text: one function `void @name(ptr %bufs, ptr %vals)` per kernel (vals: the
variables as 64-bit ints, whatever their dtype).

Every dtype keeps a register type and a memory type. bool is `i1` in registers and a byte in memory, as numpy
stores it. float16 is `half`, but its arithmetic is computed in `float` and rounded back after every operation
(exactly what numpy does): only conversions ever touch a `half`, and float64 -> float16 rounds once through a
small helper instead of a compiler-runtime call that MCJIT might not resolve. bfloat16 lives in
memory as the upper 16 bits of a float32 and in registers as a `float` already rounded to bfloat16, rounded
(to nearest even) after every operation, as `tgcore.ops.exec_alu` defines it.

Loops are `phi` induction variables; accumulators are stack slots that LLVM's mem2reg turns into registers.
No instruction carries a fast-math flag and no `fmuladd` is emitted, so every result rounds as numpy's does, but for
float32 / float64 MULACC, which is `llvm.fma` (the Renderer declares `fused_mulacc`: one rounding, as C's fma).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from tg_llvm.compiler import host_vector_bytes, host_vector_registers
from tgcore.codegen.uops import VECTOR_BITS, VECTOR_DTYPES, UOp, UOps, index_uops
from tgcore.dtype import ConstType, DType, PtrDType, bf16_round, dtypes, truncate
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.plugin import Renderer

# the register type of each dtype (bfloat16 is carried as a float rounded to bfloat16)
_REG: dict[DType, str] = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.uint64: "i64",
    dtypes.float16: "half",
    dtypes.bfloat16: "float",
    dtypes.float32: "float",
    dtypes.float64: "double",
}
# the type of each dtype in memory, where it differs from the register type
_MEM: dict[DType, str] = {dtypes.bool: "i8", dtypes.bfloat16: "i16"}
# integers of each width, for bitcasts
_BITS_TYPE: dict[int, str] = {1: "i8", 2: "i16", 4: "i32", 8: "i64"}
_FLOAT_INTRINSICS: dict[Op, str] = {
    UnaryOps.EXP2: "exp2",
    UnaryOps.LOG2: "log2",
    UnaryOps.SIN: "sin",
    UnaryOps.SQRT: "sqrt",
}
# the intrinsics that become calls into the C library (exp2f, log2f, sinf and their double versions); frem is fmod
_LIBRARY_CALLS = {"exp2", "log2", "sin"}
_FLOAT_BINARY: dict[Op, str] = {
    BinaryOps.ADD: "fadd",
    BinaryOps.SUB: "fsub",
    BinaryOps.MUL: "fmul",
    BinaryOps.DIV: "fdiv",
    BinaryOps.MOD: "frem",  # C's fmod, numpy's np.fmod
}
_INT_BINARY: dict[Op, str] = {
    BinaryOps.ADD: "add",
    BinaryOps.SUB: "sub",
    BinaryOps.MUL: "mul",
    BinaryOps.XOR: "xor",
    BinaryOps.AND: "and",
    BinaryOps.OR: "or",
}

# helpers emitted into a module when a kernel needs them; alwaysinline, so they cost no call
_HELPERS: dict[str, str] = {
    # float32 -> bfloat16 precision, round to nearest even, NaN -> the canonical quiet NaN (as dtype.bf16_round)
    "tg_bf16_round": """define internal float @tg_bf16_round(float %x) alwaysinline nounwind {
  %bits = bitcast float %x to i32
  %high = lshr i32 %bits, 16
  %lsb = and i32 %high, 1
  %bias = add i32 %lsb, 32767
  %sum = add i32 %bits, %bias
  %rounded = and i32 %sum, -65536
  %value = bitcast i32 %rounded to float
  %nan = fcmp uno float %x, 0.0
  %out = select i1 %nan, float 0x7FF8000000000000, float %value
  ret float %out
}""",
    # float64 -> float16 with one rounding: round to odd into float32 (24 >= 11 + 2 bits), then to nearest even
    "tg_f64_to_f16": """define internal half @tg_f64_to_f16(double %x) alwaysinline nounwind {
  %near = fptrunc double %x to float
  %back = fpext float %near to double
  %exact = fcmp ueq double %back, %x
  %bits = bitcast float %near to i32
  %abs_back = call double @llvm.fabs.f64(double %back)
  %abs_x = call double @llvm.fabs.f64(double %x)
  %away = fcmp ogt double %abs_back, %abs_x
  %toward = add i32 %bits, -1
  %truncated = select i1 %away, i32 %toward, i32 %bits
  %odd = or i32 %truncated, 1
  %chosen = select i1 %exact, i32 %bits, i32 %odd
  %f = bitcast i32 %chosen to float
  %h = fptrunc float %f to half
  ret half %h
}""",
}
_HELPER_NEEDS: dict[str, tuple[str, ...]] = {"tg_f64_to_f16": ("declare double @llvm.fabs.f64(double)",)}


def reg_type(dt: DType) -> str:
    """The LLVM type a value of `dt` has in a register (vectors: `<n x float>` and `<n x double>`)."""
    if dt.count != 1:
        if dt.scalar() == dtypes.bool:  # a float32 comparison's mask
            return f"<{dt.count} x i1>"
        if dt.scalar() not in VECTOR_DTYPES and dt.scalar() not in VECTOR_BITS.values():
            raise NotImplementedError(
                f"the LLVM renderer has vector types of {VECTOR_DTYPES} and their bits only, got {dt}"
            )
        return f"<{dt.count} x {reg_type(dt.scalar())}>"
    if (t := _REG.get(dt)) is None:
        raise NotImplementedError(f"the LLVM renderer has no type for dtype {dt}")
    return t


def mem_type(dt: DType) -> str:
    """The LLVM type a value of `dt` has in memory."""
    return _MEM.get(dt, reg_type(dt))


def _hex_double(v: float) -> str:
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", v))[0]


def _float_literal(v: float) -> str:
    """A float32 constant as LLVM writes it (the double with the same value)."""
    return _hex_double(float(np.float32(v)))


# float32 exp2 without a call: 2^x = 2^n * 2^f, n = x rounded to nearest even (adding and subtracting 1.5 * 2^23),
# f = x - n in [-0.5, 0.5], 2^f a degree-6 polynomial (Horner, each product and sum rounded), and 2^n applied as two
# powers of two built from exponent bits, so that a subnormal result rounds once. At most 1 ulp from the exact
# value; the same float32 operations in the same order as CLANG's routine, so the two give the same bits.
# NaN -> x + x, x >= 128 -> +inf, x < -150 -> +0, chosen with selects: no branch, so the loop vectorizer widens it.
_EXP2_COEFFICIENTS = (
    0.00015353360504377633,
    0.0013398875016719103,
    0.009618436917662621,
    0.055503323674201965,
    0.24022647738456726,
    0.6931471824645996,
    1.0,
)


def _exp2_helper(lanes: int = 1) -> str:
    """The routine for a float (lanes 1: @tg_exp2f) or a vector of `lanes` floats (@tg_exp2f_v<lanes>): the same
    operations on every lane."""

    def vec(scalar: str) -> str:
        return scalar if lanes == 1 else f"<{lanes} x {scalar}>"

    def splat(literal: str, scalar: str = "float") -> str:
        return literal if lanes == 1 else "<" + ", ".join([f"{scalar} {literal}"] * lanes) + ">"

    f, i, b = vec("float"), vec("i32"), vec("i1")
    c = [splat(_float_literal(v)) for v in _EXP2_COEFFICIENTS]
    horner = [f"  %p0 = fmul {f} %f, {c[0]}", f"  %q0 = fadd {f} %p0, {c[1]}"]
    for n, coefficient in enumerate(c[2:], start=1):
        horner += [f"  %p{n} = fmul {f} %f, %q{n - 1}", f"  %q{n} = fadd {f} %p{n}, {coefficient}"]
    last = f"%q{len(c) - 2}"
    name = "tg_exp2f" if lanes == 1 else f"tg_exp2f_v{lanes}"
    lines = [
        f"define internal {f} @{name}({f} %x) alwaysinline nounwind {{",
        f"  %shifted = fadd {f} %x, {splat(_float_literal(12582912.0))}",
        f"  %n = fadd {f} %shifted, {splat(_float_literal(-12582912.0))}",
        f"  %f = fsub {f} %x, %n",
        *horner,
        f"  %ni = fptosi {f} %n to {i}",
        f"  %n1 = ashr {i} %ni, {splat('1', 'i32')}",
        f"  %n2 = sub {i} %ni, %n1",
        # (k + 127) << 23, the bits of 2^k, written as (k << 23) + (127 << 23): the form LLVM would rewrite it to
        f"  %e1 = shl {i} %n1, {splat('23', 'i32')}",
        f"  %e2 = shl {i} %n2, {splat('23', 'i32')}",
        f"  %b1 = add {i} %e1, {splat('1065353216', 'i32')}",
        f"  %b2 = add {i} %e2, {splat('1065353216', 'i32')}",
        f"  %s1 = bitcast {i} %b1 to {f}",
        f"  %s2 = bitcast {i} %b2 to {f}",
        f"  %scaled = fmul {f} {last}, %s1",
        f"  %r = fmul {f} %scaled, %s2",
        # the lanes below are out of the routine's range: their %r (poison where fptosi overflows) is not chosen
        f"  %low = fcmp olt {f} %x, {splat(_float_literal(-150.0))}",
        f"  %r1 = select {b} %low, {f} {splat('0.0')}, {f} %r",
        f"  %high = fcmp oge {f} %x, {splat(_float_literal(128.0))}",
        f"  %r2 = select {b} %high, {f} {splat('0x7FF0000000000000')}, {f} %r1",
        f"  %nan = fcmp uno {f} %x, {splat('0.0')}",
        f"  %quiet = fadd {f} %x, %x",
        f"  %out = select {b} %nan, {f} %quiet, {f} %r2",
        f"  ret {f} %out",
        "}",
    ]
    return "\n".join(lines)


_HELPERS["tg_exp2f"] = _exp2_helper()
_HELPERS.update({f"tg_exp2f_v{n}": _exp2_helper(n) for n in (2, 4, 8, 16)})


def render_const(val: ConstType, dt: DType) -> str:
    """An LLVM literal of type reg_type(dt) for the Python value `val` (wrapped or rounded to `dt`; a vector: every
    lane `val`)."""
    if dt.count > 1:
        reg_type(dt)  # refuses vectors of anything but float32 / float64
        lane = f"{reg_type(dt.scalar())} {render_const(val, dt.scalar())}"
        return f"<{', '.join([lane] * dt.count)}>"
    if dt == dtypes.bool:
        return "true" if val else "false"
    if dtypes.is_int(dt):
        i = int(truncate(int(val), dt))
        bits = dt.itemsize * 8
        return str(i - (1 << bits) if i >= 1 << (bits - 1) else i)  # LLVM reads integer literals as signed
    v = float(val)
    if dt == dtypes.float16:
        with np.errstate(over="ignore"):
            return "0xH%04X" % int(np.array(v, dtype=np.float16).view(np.uint16))
    if dt == dtypes.bfloat16:
        v = float(bf16_round(np.array([v], dtype=np.float32))[0])
    elif dt == dtypes.float32:
        with np.errstate(over="ignore"):
            v = float(np.float32(v))  # a float literal must be exact in float
    if math.isnan(v):
        return "0x7FF8000000000000"
    return _hex_double(v)


class LLVMRenderer(Renderer):
    """UOps -> LLVM IR; global dimensions are loops (a CPU kernel), float vectors, no locals."""

    device = "LLVM"
    global_max = None
    has_local = False
    has_shared = False
    supports_float4 = False
    threads = True  # the core splits a big kernel's outermost loop across the host's cores (two more DEFINE_VARs)
    # from this much work on (plugin.py): the core's Python threads run the parts, a hand-off of 30-60 us, which kernels
    # below ~4M units lost to (on two Zen 4 cores, one thread against two: 128 x 128 matmul 43 against 75-81 us, 1M sum
    # 142 against 175, 256K exp 147 against 167; 4M sum 376-410 against 309-324, 1M exp 447 against 319-335)
    thread_min_work = 1 << 22
    scratch_max = 256 * 1024  # PACK blocks: stack arrays (alloca) of the calling thread
    fused_mulacc = True  # float32 / float64 MULACC is llvm.fma: a float SUM of products runs on FMA instructions
    # vector uops as LLVM vector types, as wide as the host's vector registers: the optimizer's register tiles
    # (a matmul's, a conv's) become vector code without relying on LLVM's vectorizers
    vector_uops = True
    # whole-vector EXP2 (float32: the routine above on every lane), SQRT and MAX, float32 comparisons into <n x i1>
    # masks and selects by them: an elementwise kernel of these is vector code as rendered, and the compiler skips
    # LLVM's loop vectorizer for it (a third of its compile time); a float vector's bits as an integer vector and back
    # (BITCAST) and SHL of those by a constant, so that exp builds its powers of two in vector registers
    vector_math = (
        UnaryOps.EXP2,
        UnaryOps.SQRT,
        BinaryOps.MAX,
        BinaryOps.CMPLT,
        BinaryOps.CMPEQ,
        TernaryOps.WHERE,
        UnaryOps.BITCAST,
        BinaryOps.SHL,
    )

    def __init__(self) -> None:
        self.vector_widths = {dt: host_vector_bytes() // dt.itemsize for dt in VECTOR_DTYPES}
        self.vector_registers = host_vector_registers()

    def render(self, name: str, uops: list[UOp]) -> str:
        return _FunctionWriter(name, uops).render()


class _FunctionWriter:
    """The state of rendering one kernel: value names, basic blocks, loops, and what the module must declare."""

    def __init__(self, name: str, uops: list[UOp]) -> None:
        self.name, self.uops = name, uops
        self.params: list[tuple[str, str, str]] = []  # the body's parameters: (type, name, where the entry finds it)
        self.prologue: list[str] = []  # the body's entry block: stack slots
        self.body: list[str] = []
        self.values: dict[int, str] = {}  # id(uop) -> LLVM operand (a %name or a literal)
        self.slots: dict[int, str] = {}  # id(DEFINE_ACC) -> the stack slot holding it
        self.declares: set[str] = set()
        self.helpers: set[str] = set()
        self.counter = 0
        self.block = "entry"
        self.library_calls = 0  # calls into the C library emitted so far (see ENDRANGE)
        self.metadata: list[str] = []  # the module's metadata nodes, `!n = ...` in order
        # the int32 index arithmetic (index_uops: it cannot overflow for a valid kernel), computed in i64 as CLANG's C
        # does: LLVM's scalar evolution then reads each address as an affine function of the loop variables, where i32
        # sums that may wrap, sign-extended at every address, made O2's loop passes (LoopIdiomRecognize,
        # IndVarSimplify) crawl: ResNet-18's 25 kernels compile in 3.8 s instead of 10.8 (its first call 12.3 -> 4.9 s
        # on a Zen 4 core), the same code where it was fast and faster in places (conv2d B=1 149 -> 175 GFLOP/s)
        index = index_uops(uops)
        self.wide = {id(u) for u in uops if id(u) in index and u.dtype == dtypes.int32}

    # ***** emission *****

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, instruction: str, prefix: str = "v") -> str:
        """Emit `%name = instruction` and return `%name`."""
        name = "%" + self.fresh(prefix)
        self.body.append(f"  {name} = {instruction}")
        return name

    def line(self, text: str) -> None:
        self.body.append(f"  {text}")

    def label(self, label: str) -> None:
        self.body.append(f"{label}:")
        self.block = label

    def value(self, u: UOp) -> str:
        """The operand for uop `u` here (an accumulator is read from its slot at each use)."""
        if u.op in (UOps.DEFINE_ACC, UOps.PHI):
            acc = u if u.op is UOps.DEFINE_ACC else u.src[0]
            assert acc.dtype is not None
            return self.emit(f"load {reg_type(acc.dtype)}, ptr {self.slots[id(acc)]}")
        if id(u) not in self.values:
            raise NotImplementedError(f"the LLVM renderer got {u} before the uop that defines it")
        return self.values[id(u)]

    def int_value(self, u: UOp, ty: str) -> str:
        """The integer uop `u`'s value as an `ty` register (i32 or i64): an index sum kept in i64 (self.wide) is
        narrowed, an int32 value widened (both exact: an index value fits int32)."""
        x, have = self.value(u), self.index_type(u)
        if have == ty or u.op is UOps.CONST:  # (a literal is a literal of either type)
            return x
        return self.emit(f"{'sext' if ty == 'i64' else 'trunc'} {have} {x} to {ty}")

    def index_type(self, u: UOp) -> str:
        """The register type of an address or loop bound `u`."""
        return "i64" if id(u) in self.wide else reg_type(u.dtype)  # type: ignore[arg-type]

    def intrinsic(self, fn: str, ty: str, *args: str) -> str:
        self.library_calls += fn in _LIBRARY_CALLS
        scalar = ty.split(" x ")[-1].rstrip(">")
        lanes = f"v{ty[1:].split(' x ')[0]}" if ty.startswith("<") else ""
        suffix = lanes + {"float": "f32", "double": "f64"}[scalar]
        self.declares.add(f"declare {ty} @llvm.{fn}.{suffix}({', '.join([ty] * len(args))})")
        return self.emit(f"call {ty} @llvm.{fn}.{suffix}({', '.join(f'{ty} {a}' for a in args)})")

    def helper(self, fn: str, ret: str, arg_ty: str, arg: str) -> str:
        self.helpers.add(fn)
        return self.emit(f"call {ret} @{fn}({arg_ty} {arg})")

    # ***** the conversions every op is built from *****

    def to_compute(self, x: str, dt: DType) -> str:
        """A float16 value widened to float (exact); other values unchanged."""
        return self.emit(f"fpext half {x} to float") if dt == dtypes.float16 else x

    def from_compute(self, x: str, dt: DType) -> str:
        """A computed float value as a `dt` register: rounded to float16 or to bfloat16 precision."""
        if dt == dtypes.float16:
            return self.emit(f"fptrunc float {x} to half")
        if dt == dtypes.bfloat16:
            return self.helper("tg_bf16_round", "float", "float", x)
        return x

    def load(self, buf: str, idx: str, dt: DType, idx_ty: str = "i32") -> str:
        ptr = self.emit(f"getelementptr inbounds {mem_type(dt.scalar())}, ptr {buf}, {idx_ty} {idx}")
        raw = self.emit(f"load {mem_type(dt)}, ptr {ptr}, align {dt.scalar().itemsize}")  # a vector: n from there
        if dt == dtypes.bool:
            return self.emit(f"icmp ne i8 {raw}, 0")
        if dt == dtypes.bfloat16:
            wide = self.emit(f"zext i16 {raw} to i32")
            return self.emit(f"bitcast i32 {self.emit(f'shl i32 {wide}, 16')} to float")
        return raw

    def store(self, buf: str, idx: str, value: str, dt: DType, idx_ty: str = "i32") -> None:
        ptr = self.emit(f"getelementptr inbounds {mem_type(dt.scalar())}, ptr {buf}, {idx_ty} {idx}")
        if dt == dtypes.bool:
            value = self.emit(f"zext i1 {value} to i8")
        elif dt == dtypes.bfloat16:  # the register already holds a bfloat16 value: keep its upper half
            high = self.emit(f"lshr i32 {self.emit(f'bitcast float {value} to i32')}, 16")
            value = self.emit(f"trunc i32 {high} to i16")
        self.line(f"store {mem_type(dt)} {value}, ptr {ptr}, align {dt.scalar().itemsize}")

    def cast(self, x: str, src: DType, dst: DType) -> str:
        """numpy's astype, on this platform: ints wrap, floats round to nearest even, x != 0 for bool."""
        if src == dst:
            return x
        if dst == dtypes.bool:
            if dtypes.is_float(src):  # NaN -> True
                ty = "double" if src == dtypes.float64 else "float"
                return self.emit(f"fcmp une {ty} {self.to_compute(x, src)}, 0.0")
            return self.emit(f"icmp ne {reg_type(src)} {x}, 0")
        if dtypes.is_float(src):
            return self._cast_from_float(x, src, dst)
        # from bool or an integer
        signed = dtypes.is_int(src) and not dtypes.is_unsigned(src)
        if dtypes.is_int(dst):
            sb, db = (1 if src == dtypes.bool else src.itemsize * 8), dst.itemsize * 8
            if sb == db:
                return x
            op = "trunc" if sb > db else ("sext" if signed else "zext")
            return self.emit(f"{op} {reg_type(src)} {x} to {reg_type(dst)}")
        # int -> float; to float16 and bfloat16 through float32: exact below 2**24, and above that float16
        # overflows either way and bfloat16 rounds through float32 by definition
        target = "double" if dst == dtypes.float64 else "float"
        out = self.emit(f"{'sitofp' if signed else 'uitofp'} {reg_type(src)} {x} to {target}")
        return self.from_compute(out, dst)

    def _cast_from_float(self, x: str, src: DType, dst: DType) -> str:
        x = self.to_compute(x, src)  # float16 -> float, exact
        ty = "double" if src == dtypes.float64 else "float"
        if dtypes.is_float(dst):
            if dst == dtypes.float64:
                return x if ty == "double" else self.emit(f"fpext float {x} to double")
            if ty == "double":
                if dst == dtypes.float16:  # one rounding, without the __truncdfhf2 library call
                    self.declares.update(_HELPER_NEEDS["tg_f64_to_f16"])
                    return self.helper("tg_f64_to_f16", "half", "double", x)
                x = self.emit(f"fptrunc double {x} to float")
            return self.from_compute(x, dst)
        # float -> int: in range this is exact; narrower ints convert through int32 (int64 for uint32) and wrap,
        # as numpy's C casts do on x86-64
        bits = dst.itemsize * 8
        if dst == dtypes.uint64:
            return self.emit(f"fptoui {ty} {x} to i64")
        wide = "i64" if bits == 64 or dst == dtypes.uint32 else "i32"
        out = self.emit(f"fptosi {ty} {x} to {wide}")
        return out if wide == reg_type(dst) else self.emit(f"trunc {wide} {out} to {reg_type(dst)}")

    def bitcast(self, x: str, src: DType, dst: DType) -> str:
        if src.count > 1:  # a float vector and the integer vector of its bits (codegen/uops.py, VECTOR_BITS)
            return self.emit(f"bitcast {reg_type(src)} {x} to {reg_type(dst)}")
        if src.itemsize != dst.itemsize:
            raise NotImplementedError(f"the LLVM renderer cannot bitcast {src} to {dst}: the sizes differ")
        bits_ty = _BITS_TYPE[src.itemsize]
        if src == dtypes.bool:
            bits = self.emit(f"zext i1 {x} to i8")
        elif src == dtypes.bfloat16:
            as_int = self.emit(f"bitcast float {x} to i32")
            bits = self.emit(f"trunc i32 {self.emit(f'lshr i32 {as_int}, 16')} to i16")
        elif dtypes.is_float(src):
            bits = self.emit(f"bitcast {reg_type(src)} {x} to {bits_ty}")
        else:
            bits = x
        if dst == dtypes.bool:
            return self.emit(f"icmp ne i8 {bits}, 0")
        if dst == dtypes.bfloat16:
            wide = self.emit(f"zext i16 {bits} to i32")
            return self.emit(f"bitcast i32 {self.emit(f'shl i32 {wide}, 16')} to float")
        if dtypes.is_float(dst):
            return self.emit(f"bitcast {bits_ty} {bits} to {reg_type(dst)}")
        return bits

    # ***** ALU ops *****

    def alu(self, op: Op, dt: DType, srcs: list[str], src_dts: list[DType]) -> str:
        """The result of `op` (exec_alu's semantics) as a register of the result dtype `dt`."""
        if dt.count > 1:  # lane by lane: the ops codegen.uops allows on vectors, and this renderer's vector_math
            ty = reg_type(dt)
            if op is TernaryOps.MULACC:
                return self.intrinsic("fma", ty, *srcs)
            if op is UnaryOps.NEG:
                return self.emit(f"fneg {ty} {srcs[0]}")
            if op in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV):
                return self.emit(f"{_FLOAT_BINARY[op]} {ty} {srcs[0]}, {srcs[1]}")
            if op is UnaryOps.EXP2 and dt.scalar() == dtypes.float32:  # the float routine, on every lane
                return self.helper(f"tg_exp2f_v{dt.count}", ty, ty, srcs[0])
            if op in (UnaryOps.EXP2, UnaryOps.SQRT):
                return self.intrinsic(_FLOAT_INTRINSICS[op], ty, srcs[0])
            if op is BinaryOps.MAX:  # numpy's maximum, lane by lane: a NaN in either operand is the result
                return self.float_max(ty, srcs[0], srcs[1])
            if op in (BinaryOps.CMPLT, BinaryOps.CMPEQ):  # float32 vectors into a mask
                operand = reg_type(src_dts[0])
                return self.emit(f"fcmp {'olt' if op is BinaryOps.CMPLT else 'oeq'} {operand} {srcs[0]}, {srcs[1]}")
            if op is TernaryOps.WHERE:  # by a mask
                return self.emit(f"select {reg_type(src_dts[0])} {srcs[0]}, {ty} {srcs[1]}, {ty} {srcs[2]}")
            if op is BinaryOps.SHL:  # a float vector's bits, by a splat constant within the lane's width
                return self.emit(f"shl {ty} {srcs[0]}, {srcs[1]}")
            raise NotImplementedError(f"the LLVM renderer has no vector {op}")
        if op is TernaryOps.WHERE:
            cond = srcs[0] if src_dts[0] == dtypes.bool else self.cast(srcs[0], src_dts[0], dtypes.bool)
            a, b = (self.cast(s, sdt, dt) for s, sdt in zip(srcs[1:], src_dts[1:]))
            return self.emit(f"select i1 {cond}, {reg_type(dt)} {a}, {reg_type(dt)} {b}")
        if op is TernaryOps.MULACC and dt in (dtypes.float32, dtypes.float64):  # fused_mulacc: rounds once
            return self.intrinsic("fma", reg_type(dt), *srcs)
        if op is TernaryOps.MULACC:  # half floats: a*b rounds to the dtype, then the sum rounds again; ints wrap
            product = self.alu(BinaryOps.MUL, dt, srcs[:2], src_dts[:2])
            return self.alu(BinaryOps.ADD, dt, [product, srcs[2]], [dt, src_dts[2]])
        sdt = src_dts[0]
        if sdt == dtypes.bool and op is UnaryOps.NEG:
            return self.emit(f"xor i1 {srcs[0]}, true")
        if sdt == dtypes.bool and op in (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR):
            return self.emit(f"{_INT_BINARY[op]} i1 {srcs[0]}, {srcs[1]}")
        if sdt == dtypes.bool:  # arithmetic on bools is done on 0/1 bytes, then read back as != 0 (C's _Bool)
            widened = [self.emit(f"zext i1 {s} to i8") for s in srcs]
            compare = op in (BinaryOps.CMPLT, BinaryOps.CMPEQ)
            out = self.alu(op, dtypes.bool if compare else dtypes.uint8, widened, [dtypes.uint8] * len(srcs))
            return out if compare else self.cast(out, dtypes.uint8, dt)
        if dtypes.is_float(sdt):
            return self.float_alu(op, dt, srcs, sdt)
        if dtypes.is_int(sdt):
            return self.int_alu(op, dt, srcs, src_dts)
        raise NotImplementedError(f"the LLVM renderer cannot render ALU op {op} on {sdt}")

    def float_alu(self, op: Op, dt: DType, srcs: list[str], sdt: DType) -> str:
        xs = [self.to_compute(s, sdt) for s in srcs]
        ty = "double" if sdt == dtypes.float64 else "float"
        if op is UnaryOps.EXP2 and ty == "float":  # the routine above, for float32, float16 and bfloat16
            return self.from_compute(self.helper("tg_exp2f", "float", "float", xs[0]), dt)
        if op in _FLOAT_INTRINSICS:
            return self.from_compute(self.intrinsic(_FLOAT_INTRINSICS[op], ty, xs[0]), dt)
        if op is UnaryOps.NEG:
            return self.from_compute(self.emit(f"fneg {ty} {xs[0]}"), dt)
        if op in _FLOAT_BINARY:
            self.library_calls += op is BinaryOps.MOD
            return self.from_compute(self.emit(f"{_FLOAT_BINARY[op]} {ty} {xs[0]}, {xs[1]}"), dt)
        if op is BinaryOps.CMPLT:
            return self.emit(f"fcmp olt {ty} {xs[0]}, {xs[1]}")
        if op is BinaryOps.CMPEQ:
            return self.emit(f"fcmp oeq {ty} {xs[0]}, {xs[1]}")
        if op is BinaryOps.MAX:  # compared as they are (a comparison rounds nothing, half included)
            return self.float_max(reg_type(sdt), srcs[0], srcs[1])
        raise NotImplementedError(f"the LLVM renderer cannot render ALU op {op} on {sdt}")

    def float_max(self, ty: str, a: str, b: str) -> str:
        """numpy's maximum, (a > b || a != a) ? a : b as CLANG spells it: a NaN in either operand is the result (for
        float scalars or vectors of type `ty`)."""
        lanes = ty[1:].split(" x ")[0] if ty.startswith("<") else None
        bool_ty, zero = (f"<{lanes} x i1>", "zeroinitializer") if lanes else ("i1", "0.0")
        greater = self.emit(f"fcmp ogt {ty} {a}, {b}")
        a_nan = self.emit(f"fcmp uno {ty} {a}, {zero}")
        take_a = self.emit(f"or {bool_ty} {greater}, {a_nan}")
        return self.emit(f"select {bool_ty} {take_a}, {ty} {a}, {ty} {b}")

    def int_alu(self, op: Op, dt: DType, srcs: list[str], src_dts: list[DType]) -> str:
        sdt = src_dts[0]
        ty, signed = reg_type(sdt), not dtypes.is_unsigned(sdt)
        a = srcs[0]
        if op is UnaryOps.NEG:
            return self.emit(f"sub {ty} 0, {a}")
        if op in (BinaryOps.SHL, BinaryOps.SHR):
            return self.shift(op, a, srcs[1], sdt, src_dts[1])
        b = srcs[1]
        if op in _INT_BINARY:
            return self.emit(f"{_INT_BINARY[op]} {ty} {a}, {b}")
        if op is BinaryOps.CMPLT:
            return self.emit(f"icmp {'slt' if signed else 'ult'} {ty} {a}, {b}")
        if op is BinaryOps.CMPEQ:
            return self.emit(f"icmp eq {ty} {a}, {b}")
        if op is BinaryOps.MAX:
            greater = self.emit(f"icmp {'sgt' if signed else 'ugt'} {ty} {a}, {b}")
            return self.emit(f"select i1 {greater}, {ty} {a}, {ty} {b}")
        if op in (BinaryOps.DIV, BinaryOps.MOD):
            # x / 0 = x % 0 = 0; x / -1 = -x (wrapping at INT_MIN) and x % -1 = 0: the divisions LLVM leaves
            # undefined never reach sdiv/udiv, whose divisor becomes 1 there
            zero = self.emit(f"icmp eq {ty} {b}, 0")
            special = self.emit(f"or i1 {zero}, {self.emit(f'icmp eq {ty} {b}, -1')}") if signed else zero
            divisor = self.emit(f"select i1 {special}, {ty} 1, {ty} {b}")
            if op is BinaryOps.MOD:
                rem = self.emit(f"{'srem' if signed else 'urem'} {ty} {a}, {divisor}")
                return self.emit(f"select i1 {special}, {ty} 0, {ty} {rem}")
            quo = self.emit(f"{'sdiv' if signed else 'udiv'} {ty} {a}, {divisor}")
            if signed:
                quo = self.emit(f"select i1 {special}, {ty} {self.emit(f'sub {ty} 0, {a}')}, {ty} {quo}")
            return self.emit(f"select i1 {zero}, {ty} 0, {ty} {quo}")
        raise NotImplementedError(f"the LLVM renderer cannot render ALU op {op} on {sdt}")

    def shift(self, op: Op, a: str, b: str, dt: DType, b_dt: DType) -> str:
        """Shifts past the width (or by a negative amount) give 0, or -1 for a right shift of a negative value."""
        ty, bty, bits = reg_type(dt), reg_type(b_dt), dt.itemsize * 8
        b_signed = dtypes.is_int(b_dt) and not dtypes.is_unsigned(b_dt)
        too_big = self.emit(f"icmp {'sge' if b_signed else 'uge'} {bty} {b}, {bits}")
        out_of_range = self.emit(f"or i1 {too_big}, {self.emit(f'icmp slt {bty} {b}, 0')}") if b_signed else too_big
        amount = self.emit(f"select i1 {out_of_range}, {bty} 0, {bty} {b}")
        if bty != ty:  # the amount is in range now, so any width holds it
            widen = "trunc" if b_dt.itemsize > dt.itemsize else "zext"
            amount = self.emit(f"{widen} {bty} {amount} to {ty}")
        signed = not dtypes.is_unsigned(dt)
        if op is BinaryOps.SHL:
            return self.emit(f"select i1 {out_of_range}, {ty} 0, {ty} {self.emit(f'shl {ty} {a}, {amount}')}")
        shifted = self.emit(f"{'ashr' if signed else 'lshr'} {ty} {a}, {amount}")
        fill = self.emit(f"ashr {ty} {a}, {bits - 1}") if signed else "0"  # -1 for negative a, else 0
        return self.emit(f"select i1 {out_of_range}, {ty} {fill}, {ty} {shifted}")

    def no_unroll(self) -> str:
        """`, !llvm.loop !n` for a loop's back edge: LLVM's loop unroller leaves that loop as it is (the loop
        vectorizer still widens it)."""
        loop, disable = len(self.metadata), len(self.metadata) + 1
        self.metadata += [
            f"!{loop} = distinct !{{!{loop}, !{disable}}}",
            f'!{disable} = !{{!"llvm.loop.unroll.disable"}}',
        ]
        return f", !llvm.loop !{loop}"

    # ***** the walk over the uops *****

    def render(self) -> str:
        n_vars = 0
        # id(RANGE) -> (header label, exit label, phi line, var, library calls before the loop)
        loops: dict[int, tuple[str, str, int, str, int]] = {}
        ifs: dict[int, str] = {}  # id(IF) -> the label after it
        for u in self.uops:
            dt = u.dtype
            if u.op is UOps.DEFINE_GLOBAL:
                name = self.values[id(u)] = "%" + self.fresh("buf")
                self.params.append(("ptr", name, f"getelementptr inbounds ptr, ptr %bufs, i32 {u.arg[0]}"))
            elif u.op is UOps.DEFINE_VAR:
                assert dt is not None
                name = self.values[id(u)] = "%" + self.fresh("var")
                # vals holds 64-bit ints (an int32 variable is their low half): see module()
                self.params.append((reg_type(dt), name, f"getelementptr inbounds i64, ptr %vals, i32 {n_vars}"))
                n_vars += 1
            elif u.op is UOps.DEFINE_LOCAL:
                assert isinstance(dt, PtrDType)
                name = "%" + self.fresh("local")
                self.prologue.append(f"  {name} = alloca [{u.arg[1]} x {mem_type(dt.base)}], align 64")
                self.values[id(u)] = name
            elif u.op is UOps.CONST:
                assert dt is not None
                self.values[id(u)] = render_const(u.arg, dt)
            elif u.op is UOps.DEFINE_ACC:
                assert dt is not None
                slot = "%" + self.fresh("acc")
                self.prologue.append(f"  {slot} = alloca {reg_type(dt)}, align {max(8, dt.itemsize)}")
                self.slots[id(u)] = slot
                # the accumulator starts over wherever its definition is reached (e.g. in each outer iteration)
                self.line(f"store {reg_type(dt)} {render_const(u.arg, dt)}, ptr {slot}")
            elif u.op is UOps.PHI:
                assert dt is not None
                new = self.value(u.src[1])
                self.line(f"store {reg_type(dt)} {new}, ptr {self.slots[id(u.src[0])]}")
            elif u.op is UOps.RANGE:
                assert dt is not None
                ity = self.index_type(u)
                start, end = self.int_value(u.src[0], ity), self.int_value(u.src[1], ity)
                header, body, exit_ = self.fresh("loop"), self.fresh("body"), self.fresh("exit")
                before = self.block
                self.line(f"br label %{header}")
                self.label(header)
                var = "%" + self.fresh("ridx")
                self.body.append(f"  {var} = phi {ity} [ {start}, %{before} ]")  # the back edge is added at ENDRANGE
                loops[id(u)] = (header, exit_, len(self.body) - 1, var, self.library_calls)
                self.values[id(u)] = var
                cond = self.emit(f"icmp slt {ity} {var}, {end}")
                self.line(f"br i1 {cond}, label %{body}, label %{exit_}")
                self.label(body)
            elif u.op is UOps.ENDRANGE:
                header, exit_, phi_line, var, calls_before = loops[id(u.src[0])]
                ity = self.index_type(u.src[0])
                step = self.emit(f"add nsw {ity} {var}, 1")  # var < end <= the index type's max: no overflow
                self.body[phi_line] += f", [ {step}, %{self.block} ]"
                # a loop that calls the C library is not unrolled: the calls cost the same either way (measured),
                # and unrolled copies of them double the code LLVM has to generate
                self.line(f"br label %{header}{self.no_unroll() if self.library_calls > calls_before else ''}")
                self.label(exit_)
            elif u.op is UOps.IF:
                then, after = self.fresh("then"), self.fresh("endif")
                self.line(f"br i1 {self.value(u.src[0])}, label %{then}, label %{after}")
                ifs[id(u)] = after
                self.label(then)
            elif u.op is UOps.ENDIF:
                after = ifs[id(u.src[0])]
                self.line(f"br label %{after}")
                self.label(after)
            elif u.op is UOps.BARRIER:
                pass  # no SPECIAL or local ids here: one thread runs the whole kernel, nothing to wait for
            elif u.op is UOps.VECTORIZE:
                assert dt is not None
                lanes, ty, lane_ty = [self.value(s) for s in u.src], reg_type(dt), reg_type(dt.scalar())
                if all(x == lanes[0] for x in lanes):  # a splat: one insert, then a shuffle
                    one = self.emit(f"insertelement {ty} poison, {lane_ty} {lanes[0]}, i32 0")
                    self.values[id(u)] = self.emit(
                        f"shufflevector {ty} {one}, {ty} poison, <{dt.count} x i32> zeroinitializer"
                    )
                else:
                    vec = "poison"
                    for i, x in enumerate(lanes):
                        vec = self.emit(f"insertelement {ty} {vec}, {lane_ty} {x}, i32 {i}")
                    self.values[id(u)] = vec
            elif u.op is UOps.GEP:
                assert u.src[0].dtype is not None
                vec_ty = reg_type(u.src[0].dtype)
                self.values[id(u)] = self.emit(f"extractelement {vec_ty} {self.value(u.src[0])}, i32 {u.arg}")
            elif u.op is UOps.LOAD:
                assert dt is not None
                buf, idx = self.value(u.src[0]), self.value(u.src[1])
                ity = self.index_type(u.src[1])
                if len(u.src) == 4:  # gated: the load must not run when the gate is false (its index may be wild)
                    gate, alt = self.value(u.src[2]), self.value(u.src[3])
                    before, load_block, merge = self.block, self.fresh("load"), self.fresh("loaded")
                    self.line(f"br i1 {gate}, label %{load_block}, label %{merge}")
                    self.label(load_block)
                    got = self.load(buf, idx, dt, ity)
                    self.line(f"br label %{merge}")
                    self.label(merge)
                    out = self.emit(f"phi {reg_type(dt)} [ {got}, %{load_block} ], [ {alt}, %{before} ]")
                    self.values[id(u)] = out
                else:
                    self.values[id(u)] = self.load(buf, idx, dt, ity)
            elif u.op is UOps.STORE:
                value_dt = u.src[0].dtype
                assert isinstance(value_dt, PtrDType)
                buf, idx, value = (self.value(s) for s in u.src[:3])
                ity = self.index_type(u.src[1])
                stored = u.src[2].dtype or value_dt.base
                if stored.count == 1:  # (a vector: its lanes to consecutive elements, as they are)
                    value, stored = self.cast(value, stored, value_dt.base), value_dt.base
                if len(u.src) == 4:  # gated: a padded lane's store (PADTO), a STAGE's copy
                    gate, store_block, after = self.value(u.src[3]), self.fresh("store"), self.fresh("stored")
                    self.line(f"br i1 {gate}, label %{store_block}, label %{after}")
                    self.label(store_block)
                    self.store(buf, idx, value, stored, ity)
                    self.line(f"br label %{after}")
                    self.label(after)
                else:
                    self.store(buf, idx, value, stored, ity)
            elif u.op is UOps.ALU:
                assert dt is not None
                src_dts = [s.dtype for s in u.src]
                if any(d is None for d in src_dts):
                    raise NotImplementedError(f"the LLVM renderer got an ALU operand without a dtype in {u}")
                # index math (an int32 result in self.wide, or a gate comparing index sums): int32 operands in i64.
                # (An int32 uop that reads a wide one is wide itself: index_uops takes only uops whose every user
                # addresses memory.)
                if id(u) in self.wide or any(id(s) in self.wide for s in u.src):
                    srcs = [self.int_value(s, "i64") if s.dtype == dtypes.int32 else self.value(s) for s in u.src]
                    src_dts = [dtypes.int64 if d == dtypes.int32 else d for d in src_dts]
                    out_dt = dtypes.int64 if dt == dtypes.int32 else dt
                    self.values[id(u)] = self.alu(u.arg, out_dt, srcs, src_dts)  # type: ignore[arg-type]
                else:
                    srcs = [self.value(s) for s in u.src]
                    self.values[id(u)] = self.alu(u.arg, dt, srcs, src_dts)  # type: ignore[arg-type]
            elif u.op is UOps.CAST:
                assert dt is not None and u.src[0].dtype is not None
                self.values[id(u)] = self.cast(self.value(u.src[0]), u.src[0].dtype, dt)
            elif u.op is UOps.BITCAST:
                assert dt is not None and u.src[0].dtype is not None
                self.values[id(u)] = self.bitcast(self.value(u.src[0]), u.src[0].dtype, dt)
            else:
                why = " (its kernels are CPU loops: global_max is None)" if u.op is UOps.SPECIAL else ""
                raise NotImplementedError(f"the LLVM renderer cannot render uop {u.op.name}{why}")
        return self.module()

    def module(self) -> str:
        """The kernel: an entry with the uniform signature that reads its arguments and calls the body, whose
        buffer parameters are `noalias` (C's restrict, as CLANG's kernels have); the body is inlined into it."""
        body_name = f'"{self.name}.body"'
        params = ", ".join(f"{ty}{' noalias' if ty == 'ptr' else ''} {name}" for ty, name, _ in self.params)
        body = [f"define internal void @{body_name}({params}) alwaysinline nounwind {{", "entry:"]
        body += self.prologue + self.body + ["  ret void", "}"]
        entry = [f'define void @"{self.name}"(ptr %bufs, ptr %vals) nounwind {{', "entry:"]
        args = []
        for i, (ty, _, address) in enumerate(self.params):
            entry.append(f"  %p{i} = {address}")
            if ty == "ptr" or ty == "i64":
                entry.append(f"  %a{i} = load {ty}, ptr %p{i}, align 8")
            else:  # an int32 variable: the low half of its 64-bit val
                entry += [f"  %w{i} = load i64, ptr %p{i}, align 8", f"  %a{i} = trunc i64 %w{i} to {ty}"]
            args.append(f"{ty} %a{i}")
        entry += [f"  call void @{body_name}({', '.join(args)})", "  ret void", "}"]
        helpers = [_HELPERS[h] for h in sorted(self.helpers)]
        parts = sorted(self.declares) + helpers + ["\n".join(body), "\n".join(entry)]
        if self.metadata:
            parts.append("\n".join(self.metadata))
        return "\n\n".join(parts) + "\n"
