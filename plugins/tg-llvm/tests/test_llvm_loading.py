"""How tg-llvm names, loads and frees kernels: objects export `name.<digest of the source>`, many programs share
one MCJIT engine, a freed program leaves the others working, and an engine goes once none of its programs is left;
loops that call the C library are not unrolled."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest
import tg_llvm.runtime as runtime
from tg_llvm.compiler import LLVMCompiler, unique_symbol
from tg_llvm.runtime import LLVMProgram, elf_symbols
from uop_kernels import elementwise_uops, from_buffer, to_buffer

from tgcore import Device, dtypes
from tgcore.device import Buffer
from tgcore.ops import BinaryOps, Op, UnaryOps

pytestmark = pytest.mark.skipif(Device.status("LLVM") is not None, reason="LLVM is not available here")

N = 37
RNG = np.random.default_rng(7)
A, B = (RNG.standard_normal(N).astype(np.float32) for _ in range(2))
NUMPY = {BinaryOps.ADD: A + B, BinaryOps.MUL: A * B, BinaryOps.SUB: A - B, BinaryOps.MAX: np.maximum(A, B)}


def source(op: Op, name: str = "kern") -> str:
    return Device["LLVM"].renderer.render(name, elementwise_uops(op, [dtypes.float32] * 2, dtypes.float32, N))


def elf_or_skip() -> None:
    if elf_symbols(LLVMCompiler().compile(source(BinaryOps.ADD))) is None:
        pytest.skip("this host's objects are not ELF: each program has an engine of its own")


def run(prg: LLVMProgram) -> np.ndarray:
    out = Buffer("LLVM", N, dtypes.float32).allocate()
    ins = [to_buffer("LLVM", x, dtypes.float32).allocate() for x in (A, B)]
    prg(out._opaque, *[x._opaque for x in ins])
    return from_buffer(out)


def test_a_program_called_again_reads_the_buffers_it_is_given():
    # (the argument arrays are kept by buffer address: a call on other buffers, then on the first ones again)
    prg = LLVMProgram("LLVM", "again", LLVMCompiler().compile(source(BinaryOps.SUB, "again")))
    out = Buffer("LLVM", N, dtypes.float32).allocate()
    a, b = (to_buffer("LLVM", x, dtypes.float32).allocate() for x in (A, B))
    for first, second, expected in ((a, b, A - B), (b, a, B - A), (a, b, A - B), (b, b, B - B)):
        prg(out._opaque, first._opaque, second._opaque)
        np.testing.assert_array_equal(from_buffer(out), expected)


def test_objects_export_the_name_with_a_digest_of_the_source():
    elf_or_skip()
    src = source(BinaryOps.ADD)
    defined, _ = elf_symbols(LLVMCompiler().compile(src)) or ([], [])
    assert defined == [unique_symbol("kern", src)]
    assert unique_symbol("kern", src) != unique_symbol("kern", source(BinaryOps.MUL))


def test_programs_with_the_same_kernel_name_share_an_engine_and_stay_apart():
    elf_or_skip()
    compiler = LLVMCompiler()
    runtime._shared = None  # a fresh shared engine, with room for all of them
    programs = {op: LLVMProgram("LLVM", "kern", compiler.compile(source(op))) for op in NUMPY}
    assert len({id(p._engine) for p in programs.values()}) == 1
    assert len({p.symbol for p in programs.values()}) == len(programs)
    for op, prg in programs.items():  # every one loaded before any runs
        np.testing.assert_array_equal(run(prg), NUMPY[op], err_msg=str(op))


def test_a_freed_program_leaves_the_others_working():
    compiler = LLVMCompiler()
    libs = {op: compiler.compile(source(op, "freed")) for op in NUMPY}
    programs = {op: LLVMProgram("LLVM", "freed", lib) for op, lib in libs.items()}
    del programs[BinaryOps.ADD], programs[BinaryOps.SUB]
    gc.collect()
    for op, prg in programs.items():
        np.testing.assert_array_equal(run(prg), NUMPY[op], err_msg=str(op))
    again = LLVMProgram("LLVM", "freed", libs[BinaryOps.ADD])  # the freed kernel loads and runs again
    np.testing.assert_array_equal(run(again), NUMPY[BinaryOps.ADD])


def test_the_same_object_loaded_twice_is_loaded_once():
    lib = LLVMCompiler().compile(source(BinaryOps.MUL, "twice"))
    first, second = LLVMProgram("LLVM", "twice", lib), LLVMProgram("LLVM", "twice", lib)
    np.testing.assert_array_equal(run(first), NUMPY[BinaryOps.MUL])
    np.testing.assert_array_equal(run(second), NUMPY[BinaryOps.MUL])
    if elf_symbols(lib) is not None:
        assert first._engine is second._engine
        assert ctypes.cast(first.fxn, ctypes.c_void_p).value == ctypes.cast(second.fxn, ctypes.c_void_p).value


def test_one_symbol_from_two_different_objects_gets_two_engines():
    src = source(BinaryOps.SUB, "levels")  # one source, so one exported name
    lib0, lib2 = LLVMCompiler(opt=0).compile(src), LLVMCompiler(opt=2).compile(src)
    assert lib0 != lib2
    prg0, prg2 = LLVMProgram("LLVM", "levels", lib0), LLVMProgram("LLVM", "levels", lib2)
    assert prg0._engine is not prg2._engine
    np.testing.assert_array_equal(run(prg0), NUMPY[BinaryOps.SUB])
    np.testing.assert_array_equal(run(prg2), NUMPY[BinaryOps.SUB])


def test_an_engine_is_disposed_once_its_programs_are_gone():
    elf_or_skip()
    compiler = LLVMCompiler()
    runtime._shared = None  # a fresh shared engine
    programs = [
        LLVMProgram("LLVM", f"k{i}", compiler.compile(source(BinaryOps.ADD, f"k{i}")))
        for i in range(runtime._Engine.CAPACITY + 1)  # it takes CAPACITY, the last one goes to the next engine
    ]
    first = weakref.ref(programs[0]._engine)
    assert all(p._engine is programs[0]._engine for p in programs[:-1])
    assert programs[-1]._engine is not programs[0]._engine and runtime._shared is programs[-1]._engine
    survivor = programs.pop()
    np.testing.assert_array_equal(run(programs[5]), NUMPY[BinaryOps.ADD])
    del programs
    gc.collect()
    assert first() is None  # its programs are freed and it takes no new ones: its code is freed
    np.testing.assert_array_equal(run(survivor), NUMPY[BinaryOps.ADD])


def test_an_object_that_exports_the_plain_name_gets_its_own_engine():
    compiler = LLVMCompiler()
    compiler.unique_names = False  # as objects of other formats, or compiled before names had a digest
    lib = compiler.compile(source(BinaryOps.MAX, "plain"))
    prg = LLVMProgram("LLVM", "plain", lib)
    assert prg.symbol == "plain" and prg._engine is not runtime._shared
    np.testing.assert_array_equal(run(prg), NUMPY[BinaryOps.MAX])


def test_objects_that_are_not_elf_make_the_compiler_keep_the_names(monkeypatch: pytest.MonkeyPatch):
    compiler = LLVMCompiler()
    names: list[list[str]] = []

    def emit_object(mod):  # type: ignore[no-untyped-def]  # objects of another format: no symbol table to read
        names.append([f.name for f in mod.functions if not f.is_declaration])
        return b"\xcf\xfa\xed\xfe not an ELF object"

    monkeypatch.setattr(compiler.tm, "emit_object", emit_object)
    compiler.compile(source(BinaryOps.ADD, "fmt"))
    assert not compiler.unique_names
    assert names[0] != names[1] and "fmt" in names[1] and "fmt" not in names[0]
    compiler.compile(source(BinaryOps.MUL, "fmt"))
    assert "fmt" in names[2]


def test_loops_that_call_the_c_library_are_not_unrolled():
    renderer = Device["LLVM"].renderer
    calls = renderer.render("k", elementwise_uops(UnaryOps.SIN, [dtypes.float32], dtypes.float32, N))
    fmod = renderer.render("k", elementwise_uops(BinaryOps.MOD, [dtypes.float32] * 2, dtypes.float32, N))
    plain = renderer.render("k", elementwise_uops(UnaryOps.SQRT, [dtypes.float32], dtypes.float32, N))
    assert "llvm.loop.unroll.disable" in calls and "!llvm.loop !0" in calls
    assert "llvm.loop.unroll.disable" in fmod
    assert "llvm.loop" not in plain and "!0" not in plain  # sqrt is an instruction: LLVM may unroll that loop
    prg = LLVMProgram("LLVM", "k", LLVMCompiler().compile(calls))
    out, x = Buffer("LLVM", N, dtypes.float32).allocate(), to_buffer("LLVM", A, dtypes.float32).allocate()
    prg(out._opaque, x._opaque)
    np.testing.assert_allclose(from_buffer(out), np.sin(A), rtol=1e-6, atol=1e-7)


def test_float32_exp2_is_inline_arithmetic_and_its_loop_is_vectorized():
    # float32 exp2 (and float16/bfloat16, computed in float32) is the renderer's own routine: no call, no branch,
    # no unroll rule; float64 exp2 still calls the C library
    renderer = Device["LLVM"].renderer
    for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
        src = renderer.render("k", elementwise_uops(UnaryOps.EXP2, [dt], dt, N))
        assert "@llvm.exp2" not in src and "@tg_exp2f" in src and "llvm.loop" not in src, dt
        assert "fmuladd" not in src and " fast " not in src and "contract" not in src
    wide = renderer.render("k", elementwise_uops(UnaryOps.EXP2, [dtypes.float64], dtypes.float64, N))
    assert "@llvm.exp2.f64" in wide and "@tg_exp2f" not in wide and "llvm.loop.unroll.disable" in wide
    import llvmlite.binding as binding

    compiler = LLVMCompiler()
    src = renderer.render("k", elementwise_uops(UnaryOps.EXP2, [dtypes.float32], dtypes.float32, 4096))
    mod = binding.parse_assembly(src)
    mod.triple, mod.data_layout = compiler.triple, compiler.data_layout
    tuning = binding.create_pipeline_tuning_options(speed_level=2)
    tuning.loop_vectorization = tuning.slp_vectorization = True
    builder = binding.create_pass_builder(compiler.tm, tuning)
    builder.getModulePassManager().run(mod, builder)
    optimized = str(mod)
    assert "x float>" in optimized and "call float" not in optimized  # widened, and no call per element
