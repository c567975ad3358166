"""The C dialect of the C-family renderer: one uniform kernel signature `void name(void **bufs, const int *vals)`."""

from __future__ import annotations

from typing import Optional

from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.renderer.cstyle import CStyleLanguage

# the libm functions a kernel may call, declared instead of including <math.h> (which takes the compiler ~20 ms to
# read: a third of a small kernel's build)
_HEADER = (
    "".join(f"float {f}f(float); double {f}(double); " for f in ("exp2", "log2", "sin", "sqrt"))
    + "float fmodf(float, float); double fmod(double, double);\n"
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
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'

    def render_const(self, val: object, dt: DType) -> str:
        text = super().render_const(val, dt)
        if dt == dtypes.float64:  # the float spellings of inf and nan, widened
            text = text.replace("__builtin_inff()", "__builtin_inf()").replace(
                '__builtin_nanf("")', '__builtin_nan("")'
            )
        return text

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
