"""The C dialect of the C-family renderer: one uniform kernel signature `void name(void **bufs, const long long
*vals)` (the variables as 64-bit ints, whatever their dtype: a thread's loop bounds of a big kernel pass int32's).

The kernels build with GCC and clang alike, for any -march: the header's routines pick x86 builtins by the target's
feature macros and the compiler's `__has_builtin`, else plain C; float16 and bfloat16 are floats rounded after every
operation (see _NARROW_FLOATS), never the compiler's _Float16."""

from __future__ import annotations

import platform
import sys
import threading
from typing import Optional

from tg_clang.toolchain import Toolchain
from tgcore.dtype import DType, PtrDType, dtypes, truncate
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.plugin import CompileError
from tgcore.renderer.cstyle import CStyleLanguage, KernelLaunch

# float32 exp2 in plain C arithmetic (scalar and GCC/clang vector versions, the same operations so that both give
# the same bits): 2^x = 2^n * 2^f with n = round(x) and f in [-0.5, 0.5]; 2^f a degree-6 polynomial (relative
# error 3e-9 before float32 rounding; at most 1 ulp from the exact result over all floats), 2^n applied as two
# power-of-two factors so that subnormal results round once. NaN, inf, overflow (x >= 128) and underflow
# (x < -150) are handled explicitly. libm's exp2f is a call per element; this one runs in vector registers
_EXP2_POLY = (
    "p = 0.00015353360504377633f * f + 0.0013398875016719103f; p = p * f + 0.009618436917662621f; "
    "p = p * f + 0.055503323674201965f; p = p * f + 0.24022647738456726f; p = p * f + 0.6931471824645996f; "
    "p = p * f + 1.0f;"
)
_EXP2_SCALAR = (
    "static inline float tg_exp2f(float x) {\n"
    "  if (x != x) return x + x;\n  if (x >= 128.0f) return __builtin_inff();\n  if (x < -150.0f) return 0.0f;\n"
    f"  float n = (x + 12582912.0f) - 12582912.0f, f = x - n, p; {_EXP2_POLY}\n"
    "  int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;\n"
    "  unsigned b1 = (unsigned)(n1 + 127) << 23, b2 = (unsigned)(n2 + 127) << 23;\n"
    "  float s1, s2; __builtin_memcpy(&s1, &b1, 4); __builtin_memcpy(&s2, &b2, 4);\n"
    "  return p * s1 * s2;\n}\n"
)


def _exp2_vector(n: int) -> str:
    f, i = f"tg_exp_f{n}", f"tg_exp_i{n}"
    return (
        f"typedef float {f} __attribute__((vector_size({4 * n}), aligned(4), may_alias));\n"
        f"typedef int {i} __attribute__((vector_size({4 * n}), aligned(4), may_alias));\n"
        f"static inline {f} tg_exp2f{n}({f} x) {{\n"
        f"  {i} special = (x >= 128.0f) | (x < -150.0f) | (x != x);\n"
        f"  {f} xc = ({f})(({i})x & ~special);\n"
        f"  {f} n = (xc + 12582912.0f) - 12582912.0f, f = xc - n, p; {_EXP2_POLY}\n"
        f"  {i} ni = __builtin_convertvector(n, {i}), n1 = ni >> 1, n2 = ni - n1;\n"
        f"  {f} r = p * ({f})((n1 + 127) << 23) * ({f})((n2 + 127) << 23);\n"
        f"  {i} sp = ((x >= 128.0f) & 0x7f800000) | (({i})(x + x) & (x != x));\n"
        f"  return ({f})((({i})r & ~special) | (sp & special));\n}}\n"
    )


# Vector routines that use an x86 instruction where the compiler targets it: alternatives (condition, expression) tried
# in order by the preprocessor, else libm lane by lane (the same result: one rounding per lane). The builtins differ
# between compilers (GCC's 512-bit square root is the masked form, clang's takes a rounding mode instead), so each
# alternative asks for its builtin by name (__has_builtin: GCC 10+, every clang) besides the target's feature macro.
#
# fused multiply-add of whole vectors (MULACC, fused_mulacc): GCC turns the lane-by-lane form into vector FMAs only in
# part (a conv kernel kept 768 scalar ones)
_FMA_X86: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {
    ("float", 16): (("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),),
    ("float", 8): (("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),),
    ("float", 4): (("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)"),),
    ("double", 8): (("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4)"),),
    ("double", 4): (("__FMA__", "__builtin_ia32_vfmaddpd256(a, b, c)"),),
    ("double", 2): (("__FMA__", "__builtin_ia32_vfmaddpd(a, b, c)"),),
}
# square roots of whole vectors (SQRT), likewise (correctly rounded either way: the same bits). Lane-by-lane calls
# in the kernel itself took GCC ~10 ms more to compile for a 16-wide kernel
_SQRT_X86: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {
    ("float", 16): (
        ("__AVX512F__", "__builtin_ia32_sqrtps512_mask(x, x, (unsigned short)-1, 4)"),
        ("__AVX512F__", "__builtin_ia32_sqrtps512(x, 4)"),
    ),
    ("float", 8): (("__AVX__", "__builtin_ia32_sqrtps256(x)"),),
    ("float", 4): (("__SSE__", "__builtin_ia32_sqrtps(x)"),),
    ("double", 8): (
        ("__AVX512F__", "__builtin_ia32_sqrtpd512_mask(x, x, (unsigned char)-1, 4)"),
        ("__AVX512F__", "__builtin_ia32_sqrtpd512(x, 4)"),
    ),
    ("double", 4): (("__AVX__", "__builtin_ia32_sqrtpd256(x)"),),
    ("double", 2): (("__SSE2__", "__builtin_ia32_sqrtpd(x)"),),
}
# clang's one-argument-plus-rounding sqrtps512 is GCC's name for a different (one-argument) builtin: that
# alternative is clang's only
_CLANG_ONLY = ("__builtin_ia32_sqrtps512(", "__builtin_ia32_sqrtpd512(")


def _condition(feature: str, expression: str) -> str:
    builtin = expression.split("(", 1)[0]
    clang = " && defined(__clang__)" if expression.startswith(_CLANG_ONLY) else ""
    return f"defined({feature}) && __has_builtin({builtin}){clang}"


def _lanewise_vector(
    op: str, libm: str, args: str, x86: dict[tuple[str, int], tuple[tuple[str, str], ...]], scalar: str, n: int
) -> str:
    """`static inline tg_<libm><n>(args)` on vectors of n `scalar`s: the first x86 builtin of x86[(scalar, n)] that
    the compiler has and targets; else, where the target has one for narrower vectors, the routine of n / 2 on each
    half (a 16-wide float FMA on AVX2 is two 8-wide ones: lane by lane, GCC spilled a matmul's tile and took 2.3 s
    instead of 0.1); else the libm function (libm + "f" for float) lane by lane."""
    t, fn = f"tg_{op}_{scalar}{n}", libm + ("f" if scalar == "float" else "")
    names = args.split(", ")
    lanes = ", ".join(f"{fn}({', '.join(f'{a}[{i}]' for a in names)})" for i in range(n))
    alternatives = [_condition(feature, expr) for feature, expr in x86.get((scalar, n), ())]
    branches = [f"  return ({t}){expr};\n" for _, expr in x86.get((scalar, n), ())]
    narrower = [_condition(f, e) for (s, m), alts in x86.items() if s == scalar and m < n for f, e in alts]
    if narrower:
        half = f"tg_{op}_{scalar}{n // 2}"
        parts = [f"tg_{fn}{n // 2}({', '.join(f'(({half}*)&{a})[{k}]' for a in names)})" for k in (0, 1)]
        alternatives.append(" || ".join(f"({c})" for c in narrower))
        branches.append(f"  {t} r;\n  (({half}*)&r)[0] = {parts[0]};\n  (({half}*)&r)[1] = {parts[1]};\n  return r;\n")
    body = f"  return ({t}){{{lanes}}};\n"
    if alternatives:
        chosen = "".join(
            f"#{'if' if k == 0 else 'elif'} {c}\n{b}" for k, (c, b) in enumerate(zip(alternatives, branches))
        )
        body = f"{chosen}#else\n{body}#endif\n"
    size = n * (4 if scalar == "float" else 8)
    params = ", ".join(f"{t} {a}" for a in names)
    return (
        f"typedef {scalar} {t} __attribute__((vector_size({size}), aligned(4), may_alias));\n"
        f"static inline {t} tg_{fn}{n}({params}) {{\n{body}}}\n"
    )


# NaN-propagating max of whole vectors (MAX; a ternary on vectors is C++ only): lane masks select a's bits where a
# is larger or NaN, else b's
def _max_vector(scalar: str, n: int) -> str:
    size = n * (4 if scalar == "float" else 8)
    t, i = f"tg_max_{scalar}{n}", f"tg_max_{scalar}_i{n}"
    name = f"tg_max{'f' if scalar == 'float' else ''}{n}"
    return (
        f"typedef {scalar} {t} __attribute__((vector_size({size}), aligned(4), may_alias));\n"
        f"typedef {'int' if scalar == 'float' else 'long long'} {i} __attribute__((vector_size({size}), aligned(4)));\n"
        f"static inline {t} {name}({t} a, {t} b) {{\n"
        f"  {i} m = (a > b) | (a != a);\n  return ({t})((({i})a & m) | (({i})b & ~m));\n}}\n"
    )


# float16 and bfloat16 values live in registers as floats that hold a value of the dtype, in memory as its 16 bits.
# Each operation computes in float and rounds the result to the dtype (a single + - * / or sqrt of float16 or
# bfloat16 values computed in float and rounded is correctly rounded: float has more than 2p + 2 bits), so results do
# not depend on the compiler, its flags or the CPU's fp16 support (GCC keeps _Float16 products in float within an
# expression where the CPU lacks AVX512-FP16; clang 14 refuses _Float16 there). The conversions to and from float16
# are C casts to _Float16 where the compiler has the type and the target the instructions (GCC 12+, clang 15+ with
# F16C or AVX512-FP16: the compiler vectorizes them, a 2048 x 1024 a*a+a in 0.3 ms with AVX512-FP16, 5 ms with F16C),
# else the F16C instructions one value at a time (9 ms), else integer arithmetic on the bits (13 ms; GCC's _Float16
# casts without F16C call libgcc, 73 ms); every form rounds to nearest even
_NARROW_FLOATS = r"""static inline unsigned tg_f2u(float x) { unsigned u; __builtin_memcpy(&u, &x, 4); return u; }
static inline float tg_u2f(unsigned u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
#if defined(__AVX512FP16__) || (defined(__F16C__) && (defined(__clang__) ? __clang_major__ >= 15 : __GNUC__ >= 12))
static inline float tg_h2f(unsigned short h) { _Float16 f; __builtin_memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short tg_f2h(float x) {
  _Float16 f = (_Float16)x; unsigned short h; __builtin_memcpy(&h, &f, 2); return h;
}
static inline float tg_round_half(float x) { return (float)(_Float16)x; }
#elif defined(__F16C__) && __has_builtin(__builtin_ia32_vcvtps2ph) && __has_builtin(__builtin_ia32_vcvtph2ps)
typedef float tg_f16c_f4 __attribute__((vector_size(16)));
typedef short tg_f16c_h8 __attribute__((vector_size(16)));
static inline unsigned short tg_f2h(float x) {
  return (unsigned short)__builtin_ia32_vcvtps2ph((tg_f16c_f4){x, 0.0f, 0.0f, 0.0f}, 0)[0];
}
static inline float tg_h2f(unsigned short h) { return __builtin_ia32_vcvtph2ps((tg_f16c_h8){(short)h})[0]; }
static inline float tg_round_half(float x) { return tg_h2f(tg_f2h(x)); }
#else
static inline float tg_h2f(unsigned short h) {
  unsigned e = (h >> 10) & 31u, m = h & 1023u, s = (unsigned)(h & 0x8000u) << 16;
  float sub = (float)m * 5.9604644775390625e-08f; /* a subnormal: m * 2^-24, exact */
  unsigned bits = e == 0u ? tg_f2u(sub) : e == 31u ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13);
  return tg_u2f(s | bits);
}
static inline unsigned short tg_f2h(float x) {
  unsigned b = tg_f2u(x), a = b & 0x7fffffffu, s = (b >> 16) & 0x8000u, r;
  if (a > 0x7f800000u) r = 0x7e00u | ((a >> 13) & 0x3ffu); /* NaN: quiet, payload kept */
  else if (a >= 0x477ff000u) r = 0x7c00u; /* rounds to 65520 or more: inf */
  else if (a < 0x38800000u) r = tg_f2u(tg_u2f(a) + 0.5f) - 0x3f000000u; /* subnormal: the add rounds to 2^-24 */
  else r = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* rebias, round the 13 dropped bits to nearest even */
  return (unsigned short)(s | r);
}
static inline float tg_round_half(float x) {
  unsigned b = tg_f2u(x), a = b & 0x7fffffffu, s = b ^ a;
  if (a >= 0x477ff000u) return a > 0x7f800000u ? x : tg_u2f(s | 0x7f800000u);
  if (a < 0x38800000u) return tg_u2f(s | tg_f2u((tg_u2f(a) + 0.5f) - 0.5f));
  return tg_u2f(s | ((a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u));
}
#endif
/* double -> float16 rounded once: to float rounding to odd (24 >= 11 + 2 bits), then to nearest even */
static inline float tg_d2h(double d) {
  float n = (float)d;
  if ((double)n != d && d == d) {
    unsigned b = tg_f2u(n);
    if (__builtin_fabs((double)n) > __builtin_fabs(d)) b -= 1u;
    n = tg_u2f(b | 1u);
  }
  return tg_round_half(n);
}
static inline float tg_bf2f(unsigned short h) { return tg_u2f((unsigned)h << 16); }
static inline unsigned short tg_f2bf(float x) { return (unsigned short)(tg_f2u(x) >> 16); } /* x: a bfloat16 */
static inline float tg_round_bf16(float x) { /* to nearest even; a NaN stays a (quiet) NaN. A select, not a branch:
  both compilers vectorize it (clang 2 ms instead of 9 for a 2048 x 1024 a*a+a) */
  unsigned b = tg_f2u(x), r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return tg_u2f((b & 0x7fffffffu) > 0x7f800000u ? (b | 0x00400000u) & 0xffff0000u : r);
}
"""

# NaN-propagating max of one float32 or float64 value, a select of its bits under a mask: a C ternary on floats is a
# branch at -O1 (GCC and clang both), and a max of data (a ReLU before a max pool) mispredicts half the time
# (ResNet's 3x3 max pool of a ReLU, 2 x 64 x 112 x 112 on one core: 15.0 -> 5.0 ms). WHERE stays a ternary: its
# condition is mostly a padding mask, which a branch predicts (as a select, that pool without the ReLU 1.0 -> 1.7 ms)
_SELECT_SCALAR = r"""typedef unsigned long long tg_u64;
static inline tg_u64 tg_d2u(double x) { tg_u64 u; __builtin_memcpy(&u, &x, 8); return u; }
static inline double tg_u2d(tg_u64 u) { double x; __builtin_memcpy(&x, &u, 8); return x; }
static inline float tg_maxf(float a, float b) {
  unsigned m = 0u - (unsigned)((a > b) | (a != a)); return tg_u2f((tg_f2u(a) & m) | (tg_f2u(b) & ~m));
}
static inline double tg_max(double a, double b) {
  tg_u64 m = 0ull - (tg_u64)((a > b) | (a != a)); return tg_u2d((tg_d2u(a) & m) | (tg_d2u(b) & ~m));
}
"""

_WIDTHS = (2, 4, 8, 16)  # the vector widths the header has routines for
# the libm functions a kernel may call, declared instead of including <math.h> (which takes the compiler ~20 ms to
# read: a third of a small kernel's build), and the exp2, vector FMA, max and square root routines
_HEADER = (
    "#ifndef __has_builtin\n#define __has_builtin(x) 0\n#endif\n"
    + "".join(f"float {f}f(float); double {f}(double); " for f in ("exp2", "log2", "sin", "sqrt"))
    + "float fmodf(float, float); double fmod(double, double);\n"
    + "float fmaf(float, float, float); double fma(double, double, double);\n"
    + _NARROW_FLOATS
    + _SELECT_SCALAR
    + _EXP2_SCALAR
    + "".join(_exp2_vector(n) for n in (2, 4, 8, 16))
    + "".join(_lanewise_vector("fma", "fma", "a, b, c", _FMA_X86, t, n) for t in ("float", "double") for n in _WIDTHS)
    + "".join(_max_vector(t, n) for t in ("float", "double") for n in _WIDTHS)
    + "".join(_lanewise_vector("sqrt", "sqrt", "x", _SQRT_X86, t, n) for t in ("float", "double") for n in _WIDTHS)
)
# what every kernel's source starts with: a source of several kernels has it once (ClangCompiler.compile_many)
KERNEL_PRELUDE = _HEADER.rstrip("\n") + "\n"
# the name each narrow float's routines go by: rounding a float to it, reading and writing its bits
_ROUND = {dtypes.float16: "tg_round_half", dtypes.bfloat16: "tg_round_bf16"}
_FROM_BITS = {dtypes.float16: "tg_h2f", dtypes.bfloat16: "tg_bf2f"}
_TO_BITS = {dtypes.float16: "tg_f2h", dtypes.bfloat16: "tg_f2bf"}
# ops that round nothing on values of the dtype: they are spelled on the floats as they are
_EXACT_OPS = (BinaryOps.CMPLT, BinaryOps.CMPEQ, BinaryOps.MAX, TernaryOps.WHERE, UnaryOps.NEG)


def _scratch_bytes(most: int) -> int:
    """The scratch memory (stack) one kernel may declare: `most`, or less where a thread that may run a kernel could
    have a small stack. CLANG's pool threads get 8 MB (pool.py); a Python thread gets threading.stack_size() where set,
    else the C library's default: the stack limit with glibc (8 MB unless lowered), 16 MB for CPython on macOS, but
    128 KB with musl; the main thread the stack limit. Each such stack must hold the block 8 times over."""
    sizes = []
    if threading.stack_size():
        sizes.append(threading.stack_size())
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_STACK)[0]
        if limit != resource.RLIM_INFINITY:
            sizes.append(limit)
    except (ImportError, OSError, ValueError):
        pass
    if sys.platform.startswith("linux") and platform.libc_ver()[0] != "glibc":  # (musl: 128 KB threads)
        sizes.append(128 * 1024)
    return min([most, *(size // 8 for size in sizes)])


class ClangRenderer(CStyleLanguage):
    """C11 with GCC/clang vector extensions and builtins; global dimensions are loops."""

    device = "CLANG"
    global_max = None
    type_map = {
        dtypes.bool: "_Bool",
        dtypes.int8: "signed char",  # plain char is unsigned on some ABIs (ARM)
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
        dtypes.float16: "float",  # in registers; in memory the 16 bits (memory_type)
        dtypes.bfloat16: "float",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    prelude = (_HEADER.rstrip("\n"),)  # instead of the base's includes
    wrap_signed = False  # the kernels are built with -fwrapv: signed + - * wrap as they are
    vector_uops = True
    threads = True  # the core splits a big kernel's outermost loop across the host's cores
    # ClangProgram runs the parts on its C thread pool (pool.py), a hand-off of about a microsecond: kernels from
    # 2^14 units of work on are split (EfficientNet-B0 on 2 cores: 13.9 -> 12.6 ms against the core's default 2^18)
    thread_min_work = 1 << 14
    pointer_offsets = True  # the kernels are built with -fwrapv
    index_type = "long"  # 64-bit index math: with -fwrapv, int index math cannot become pointer increments
    # a float SUM of products accumulates with fmaf / fma (the compiler emits FMA instructions, lane by lane vectors
    # become one vector FMA); -ffp-contract=off keeps every other multiply and add rounding on its own
    fused_mulacc = True
    # float32 vectors: tg_exp2f<n>, float64 ones lane by lane through libm; MAX: tg_maxf<n> / tg_max<n>; SQRT:
    # tg_sqrtf<n> / tg_sqrt<n>; float32 comparisons give masks, int vectors of -1 (true) and 0 (the extensions'
    # comparison result, tg_mask<n>), and WHERE selects bits by one (a ternary on vectors is C++ only); a float
    # vector's bits as a uint vector and back (BITCAST: a memcpy between the two vector types) and SHL of those by a
    # constant (the extensions' <<), so that exp builds its powers of two in vector registers
    vector_math = (
        UnaryOps.EXP2,
        BinaryOps.MAX,
        UnaryOps.SQRT,
        BinaryOps.CMPLT,
        BinaryOps.CMPEQ,
        TernaryOps.WHERE,
        UnaryOps.BITCAST,
        BinaryOps.SHL,
    )
    # PACK blocks are arrays on the stack of the thread that runs the kernel: up to 512 KB where every such thread's
    # stack is known to hold it many times over (_scratch_bytes). A 128 KB block of a 2048 x 2048 matmul's right-hand
    # input made it ~20% faster; ResNet-50's 3x3 convs over 512 channels at 7x7 pack 295 KB of weights per column
    # tile: 1.80 -> 1.30 ms on two AVX-512 cores
    scratch_max = 512 * 1024
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'

    def __init__(self, toolchain: Optional[Toolchain] = None) -> None:
        """Vector widths for the toolchain's target (default: the one CLANG compiles with; 16-byte vectors when
        there is no usable compiler, so that rendering still works)."""
        if toolchain is None:
            try:
                toolchain = Toolchain.resolve()
            except (OSError, ValueError, CompileError):
                toolchain = None
        vector_bytes = toolchain.vector_bytes if toolchain is not None else 16
        # the target's vector registers: the optimizer upcasts contiguous axes to fill one, and float32 / float64
        # values become vector-extension types (vector_uops)
        self.vector_widths = {dt: vector_bytes // dt.itemsize for dt in dtypes.fields().values() if dt != dtypes.bool}
        self.vector_registers = toolchain.vector_registers if toolchain is not None else 16
        self.scratch_max = _scratch_bytes(type(self).scratch_max)

    def render_dtype(self, dt: DType) -> str:
        if isinstance(dt, PtrDType):
            return self.memory_type(dt.base)
        if dt.count > 1 and dt.scalar() == dtypes.bool:
            return f"tg_mask{dt.count}"
        return super().render_dtype(dt)

    def render_vector_type(self, dt: DType) -> str:
        if dt.scalar() == dtypes.bool:  # a float32 comparison's mask: an int lane per float
            return f"typedef int tg_mask{dt.count} __attribute__((vector_size({4 * dt.count})));"
        return super().render_vector_type(dt)

    def render_lane(self, x: str, i: int, dt: DType) -> str:
        if dt.scalar() == dtypes.bool:  # a mask's lane (-1 or 0) as a bool
            return f"(({x}[{i}])!=0)"
        return super().render_lane(x, i, dt)

    def memory_type(self, dt: DType) -> str:
        """The C type of `dt` in a buffer or local array."""
        return "unsigned short" if dt in _ROUND else super().render_dtype(dt)

    def render_const(self, val: object, dt: DType) -> str:
        if dt in _ROUND:  # a float holding the value rounded to the dtype
            return super().render_const(truncate(val, dt), dtypes.float32)  # type: ignore[arg-type]
        text = super().render_const(val, dt)
        if dt == dtypes.float64:  # the float spellings of inf and nan, widened
            text = text.replace("__builtin_inff()", "__builtin_inf()").replace(
                '__builtin_nanf("")', '__builtin_nan("")'
            )
        return text

    def render_cast(self, x: str, dt: DType) -> str:
        if dt in _ROUND:  # x is a float (the base's transcendental and fmod spellings compute narrow floats in float)
            return f"{_ROUND[dt]}({x})"
        return super().render_cast(x, dt)

    def render_conversion(self, x: str, src_dt: DType, dt: DType) -> str:
        if dt == dtypes.float16 and src_dt == dtypes.float64:
            return f"tg_d2h({x})"  # one rounding (through float it would be two)
        if dt in _ROUND:  # from any other dtype through float: exact, or (int -> float16) beyond float16's range
            return f"{_ROUND[dt]}((float)({x}))"
        return super().render_cast(x, dt)  # from a narrow float: from its float value

    def render_reinterpret(self, name: str, x: str, src_dt: DType, dt: DType) -> list[str]:
        if src_dt not in _ROUND and dt not in _ROUND:
            return super().render_bitcast(name, x, dt)
        bits = f"{_TO_BITS[src_dt]}({x})" if src_dt in _ROUND else f"(unsigned short)({x})"
        if dt in _ROUND:
            return [f"float {name} = {_FROM_BITS[dt]}({bits});"]
        t = self.render_dtype(dt)
        return [f"{t} {name} = ({t})({bits});"]

    def render_load(self, access: str, dt: DType) -> str:
        return f"{_FROM_BITS[dt]}({access})" if dt in _ROUND else access

    def render_store(self, access: str, value: str, dt: DType) -> str:
        return f"{access} = {_TO_BITS[dt]}({value});" if dt in _ROUND else f"{access} = {value};"

    def render_local(self, name: str, dt: DType, size: int) -> str:
        return f"{self.memory_type(dt)} {name}[{size}] __attribute__((aligned(64)));"  # whole cache lines

    def render_fma(self, a: str, b: str, c: str, dt: DType) -> str:
        if dt.count > 1:  # the header's vector routine
            return f"tg_{'fmaf' if dt.scalar() == dtypes.float32 else 'fma'}{dt.count}({a}, {b}, {c})"
        return super().render_fma(a, b, c, dt)

    def render_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        if src_dt in _ROUND:  # computed in float, the result rounded to the dtype (a product before its sum)
            f32 = dtypes.float32
            if op in _EXACT_OPS:
                return super().render_alu(op, srcs, dtypes.bool if dt == dtypes.bool else f32, f32)
            rnd = _ROUND[src_dt]
            if op is TernaryOps.MULACC:
                return f"{rnd}({rnd}({srcs[0]}*{srcs[1]})+{srcs[2]})"
            return f"{rnd}({self.render_alu(op, srcs, f32, f32)})"
        if op is BinaryOps.MAX and dt.count > 1:  # the header's vector routine
            return f"tg_max{'f' if dt.scalar() == dtypes.float32 else ''}{dt.count}({srcs[0]}, {srcs[1]})"
        if op is BinaryOps.MAX and dt in (dtypes.float32, dtypes.float64):  # without a branch (see _SELECT_SCALAR)
            return f"tg_max{'f' if dt == dtypes.float32 else ''}({srcs[0]}, {srcs[1]})"
        if op in (BinaryOps.CMPLT, BinaryOps.CMPEQ) and dt.count > 1:
            return f"(({self.render_dtype(dt)})({srcs[0]}{'<' if op is BinaryOps.CMPLT else '=='}{srcs[1]}))"
        if op is BinaryOps.SHL and dt.count > 1:  # by a splat constant within the lane's width (codegen/uops.py)
            return f"({srcs[0]}<<{srcs[1]})"
        if op is TernaryOps.WHERE and dt.count > 1:
            m, t = srcs[0], self.render_dtype(dtypes.bool.vec(dt.count))
            return f"(({self.render_dtype(dt)})((({t})({srcs[1]})&({m}))|(({t})({srcs[2]})&~({m}))))"
        return super().render_alu(op, srcs, dt, src_dt)

    def render_math(self, fn: str, x: str, dt: DType) -> str:
        if dt.count > 1:
            if fn == "exp2" and dt.scalar() == dtypes.float32:
                return f"tg_exp2f{dt.count}({x})"
            if fn == "sqrt" and dt.scalar() in (dtypes.float32, dtypes.float64):
                return f"tg_sqrt{'f' if dt.scalar() == dtypes.float32 else ''}{dt.count}({x})"
            lanes = ", ".join(self.render_math(fn, f"({x})[{i}]", dt.scalar()) for i in range(dt.count))
            return f"(({self.render_dtype(dt)}){{{lanes}}})"
        if fn == "exp2" and dt == dtypes.float32:
            return f"tg_exp2f({x})"
        return super().render_math(fn, x, dt)

    def render_kernel(
        self, name: str, kernel: list[str], bufs: list[tuple[str, DType, bool]], launch: KernelLaunch
    ) -> str:
        prologue, n_buf, n_var = [], 0, 0
        for n, dt, writable in bufs:
            if isinstance(dt, PtrDType):
                t = self.render_dtype(dt)
                prologue.append(f"  {'' if writable else 'const '}{t}* restrict {n} = ({t}*)bufs[{n_buf}];")
                n_buf += 1
            else:
                t = self.render_dtype(dt)
                prologue.append(f"  const {t} {n} = ({t})vals[{n_var}];")
                n_var += 1
        body = "\n".join("  " + line for line in kernel)
        signature = f"void {name}(void **bufs, const long long *vals)"
        return f"{signature} {{\n" + "\n".join(prologue) + f"\n{body}\n}}"


def probe_kernel() -> tuple[str, str]:
    """(name, source) of a kernel that calls every routine of the header once (on data it never reads: it is built,
    loaded and called with no buffers), so that a compiler that lacks a builtin the header picks fails to build it."""
    name = "tg_clang_probe"
    calls = []
    for n in _WIDTHS:
        for scalar, f in (("float", "f"), ("double", "")):
            t = f"tg_fma_{scalar}{n}"
            calls += [
                f"{t} a{f}{n} = {{0}}; volatile {t} r{f}{n};",
                f"r{f}{n} = tg_fma{f}{n}(a{f}{n}, a{f}{n}, a{f}{n});",
                f"r{f}{n} = ({t})tg_sqrt{f}{n}((tg_sqrt_{scalar}{n})a{f}{n});",
                f"r{f}{n} = ({t})tg_max{f}{n}((tg_max_{scalar}{n})a{f}{n}, (tg_max_{scalar}{n})a{f}{n});",
            ]
        calls.append(f"r{'f'}{n} = (tg_fma_float{n})tg_exp2f{n}((tg_exp_f{n})af{n});")
    calls += [
        "volatile float x = 0.0f; volatile unsigned short h;",
        "x = tg_exp2f(x); x = tg_round_half(x); x = tg_round_bf16(x); x = tg_d2h((double)x);",
        "h = tg_f2h(x); x = tg_h2f(h); h = tg_f2bf(x); x = tg_bf2f(h);",
        "volatile double d = 0.0; x = tg_maxf(x, x); d = tg_max(d, d);",
    ]
    body = "\n".join("  " + line for line in calls)
    return name, f"{_HEADER}void {name}(void **bufs, const long long *vals) {{\n{body}\n}}\n"
