"""The C dialect of the C-family renderer: one uniform kernel signature `void name(void **bufs, const int *vals)`."""

from __future__ import annotations

from typing import Optional

from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, Op, UnaryOps
from tgcore.renderer.cstyle import CStyleLanguage

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


# fused multiply-add of whole vectors (MULACC, fused_mulacc): the x86 FMA instruction of that width where the
# compiler targets one (-march=native), else fmaf / fma lane by lane (the same result: one rounding per lane). GCC
# turns the lane-by-lane form into vector FMAs only in part (a conv kernel kept 768 scalar ones)
_FMA_X86 = {
    ("float", 16): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
    ("float", 8): ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),
    ("float", 4): ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)"),
    ("double", 8): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4)"),
    ("double", 4): ("__FMA__", "__builtin_ia32_vfmaddpd256(a, b, c)"),
    ("double", 2): ("__FMA__", "__builtin_ia32_vfmaddpd(a, b, c)"),
}
# square roots of whole vectors (SQRT), likewise: the x86 instruction, else sqrtf / sqrt lane by lane (correctly
# rounded either way: the same bits). Lane-by-lane calls in the kernel itself took GCC ~10 ms more to compile for a
# 16-wide kernel
_SQRT_X86 = {
    ("float", 16): ("__AVX512F__", "__builtin_ia32_sqrtps512_mask(x, x, (unsigned short)-1, 4)"),
    ("float", 8): ("__AVX__", "__builtin_ia32_sqrtps256(x)"),
    ("float", 4): ("__SSE__", "__builtin_ia32_sqrtps(x)"),
    ("double", 8): ("__AVX512F__", "__builtin_ia32_sqrtpd512_mask(x, x, (unsigned char)-1, 4)"),
    ("double", 4): ("__AVX__", "__builtin_ia32_sqrtpd256(x)"),
    ("double", 2): ("__SSE2__", "__builtin_ia32_sqrtpd(x)"),
}


def _lanewise_vector(op: str, libm: str, args: str, x86: dict[tuple[str, int], tuple[str, str]], scalar: str, n: int):
    """`static inline tg_<libm><n>(args)` on vectors of n `scalar`s: the x86 builtin of x86[(scalar, n)] where the
    compiler targets it, else the libm function (libm + "f" for float) lane by lane."""
    t, fn = f"tg_{op}_{scalar}{n}", libm + ("f" if scalar == "float" else "")
    names = args.split(", ")
    lanes = ", ".join(f"{fn}({', '.join(f'{a}[{i}]' for a in names)})" for i in range(n))
    body = f"  return ({t}){{{lanes}}};\n"
    if (builtin := x86.get((scalar, n))) is not None:
        body = f"#if defined({builtin[0]})\n  return ({t}){builtin[1]};\n#else\n{body}#endif\n"
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


_WIDTHS = (2, 4, 8, 16)  # the vector widths the header has routines for
# the libm functions a kernel may call, declared instead of including <math.h> (which takes the compiler ~20 ms to
# read: a third of a small kernel's build), and the exp2 and vector FMA routines
_HEADER = (
    "".join(f"float {f}f(float); double {f}(double); " for f in ("exp2", "log2", "sin", "sqrt"))
    + "float fmodf(float, float); double fmod(double, double);\n"
    + "float fmaf(float, float, float); double fma(double, double, double);\n"
    + _EXP2_SCALAR
    + "".join(_exp2_vector(n) for n in (2, 4, 8, 16))
    + "".join(_lanewise_vector("fma", "fma", "a, b, c", _FMA_X86, t, n) for t in ("float", "double") for n in _WIDTHS)
    + "".join(_max_vector(t, n) for t in ("float", "double") for n in _WIDTHS)
    + "".join(_lanewise_vector("sqrt", "sqrt", "x", _SQRT_X86, t, n) for t in ("float", "double") for n in _WIDTHS)
)


def _host_vector_bytes() -> int:
    """Bytes in one vector register of this CPU: 64 with AVX-512, 32 with AVX, else 16 (SSE, NEON)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return 16
    return 64 if "avx512f" in flags else 32 if "avx" in flags else 16


_VECTOR_BYTES = _host_vector_bytes()


class ClangRenderer(CStyleLanguage):
    """C99 with gcc/clang builtins; global dimensions are loops."""

    device = "CLANG"
    global_max = None
    type_map = {
        dtypes.bool: "_Bool",
        dtypes.float16: "_Float16",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
    }
    # the host's vector registers (-march=native): the optimizer upcasts contiguous axes to fill one, and float
    # values become vector-extension types (vector_uops)
    vector_widths = {dt: _VECTOR_BYTES // dt.itemsize for dt in dtypes.fields().values() if dt != dtypes.bool}
    vector_uops = True
    threads = True  # the core splits a big kernel's outermost loop across the host's cores
    pointer_offsets = True  # the kernels are built with -fwrapv
    index_type = "long"  # 64-bit index math: with -fwrapv, int index math cannot become pointer increments
    # a float SUM of products accumulates with fmaf / fma (the compiler emits FMA instructions, lane by lane vectors
    # become one vector FMA); -ffp-contract=off keeps every other multiply and add rounding on its own
    fused_mulacc = True
    # float32 vectors: tg_exp2f<n>, float64 ones lane by lane through libm; MAX: tg_maxf<n> / tg_max<n>; SQRT:
    # tg_sqrtf<n> / tg_sqrt<n>
    vector_math = (UnaryOps.EXP2, BinaryOps.MAX, UnaryOps.SQRT)
    # PACK blocks are arrays on the stack of the calling thread (8 MB for the main thread and, on Linux, Python's
    # others; a 128 KB block of a 2048 x 2048 matmul's right-hand input made it ~20% faster)
    scratch_max = 256 * 1024
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'

    def render_const(self, val: object, dt: DType) -> str:
        text = super().render_const(val, dt)
        if dt == dtypes.float64:  # the float spellings of inf and nan, widened
            text = text.replace("__builtin_inff()", "__builtin_inf()").replace(
                '__builtin_nanf("")', '__builtin_nan("")'
            )
        return text

    def render_local(self, name: str, dt: DType, size: int) -> str:
        return f"{self.render_dtype(dt)} {name}[{size}] __attribute__((aligned(64)));"  # whole cache lines

    def render_fma(self, a: str, b: str, c: str, dt: DType) -> str:
        if dt.count > 1:  # the header's vector routine
            return f"tg_{'fmaf' if dt.scalar() == dtypes.float32 else 'fma'}{dt.count}({a}, {b}, {c})"
        return super().render_fma(a, b, c, dt)

    def render_alu(self, op: Op, srcs: list[str], dt: DType, src_dt: DType) -> str:
        if op is BinaryOps.MAX and dt.count > 1:  # the header's vector routine
            return f"tg_max{'f' if dt.scalar() == dtypes.float32 else ''}{dt.count}({srcs[0]}, {srcs[1]})"
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
        self, name: str, kernel: list[str], bufs: list[tuple[str, DType, bool]], local_size: Optional[list[int]] = None
    ) -> str:
        prologue, n_buf, n_var = [], 0, 0
        for n, dt, writable in bufs:
            if isinstance(dt, PtrDType):
                t = self.render_dtype(dt)
                prologue.append(f"  {'' if writable else 'const '}{t}* restrict {n} = ({t}*)bufs[{n_buf}];")
                n_buf += 1
            else:
                prologue.append(f"  const int {n} = vals[{n_var}];")
                n_var += 1
        body = "\n".join("  " + line for line in kernel)
        return f"{_HEADER}void {name}(void **bufs, const int *vals) {{\n" + "\n".join(prologue) + f"\n{body}\n}}\n"
