"""Sizes at and past int32: a kernel indexes in int64 where its sizes call for it (and only there), impossible sizes
are refused with errors that name them, and host allocation recovers after memory ran out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

from tgcore import Device, Tensor, Variable, dtypes
from tgcore.codegen import linearizer
from tgcore.codegen.kernel import Kernel
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps
from tgcore.device import MAX_BUFFER_BYTES, Buffer
from tgcore.dtype import DType
from tgcore.engine import realize
from tgcore.engine.realize import CompiledRunner, get_kernel
from tgcore.ops import BinaryOps, BufferOps, LazyOp, MemBuffer
from tgcore.runtime.python import PythonRenderer
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.view import View

PAST_INT32 = 2**31 + 5  # elements: one more than int32 holds, and a few (an odd count, prime factors 7, 7, 43826197)


def _uops(t: Tensor) -> list[UOp]:
    """The uops of the first kernel of `t`'s schedule (the one over the input, for a reduce split in two), optimized
    for PYTHON; nothing is allocated or run."""
    ast = next(si.ast for si in t.schedule() if si.ast.op is BufferOps.STORE)
    return to_program(get_kernel(PythonRenderer(), ast, "PYTHON")).uops


def _index_dtypes(uops: list[UOp]) -> set[DType]:
    return {u.dtype for u in uops if u.op in (UOps.RANGE, UOps.SPECIAL) and u.dtype is not None}


@pytest.fixture
def free_python_cache() -> Iterator[None]:
    """Give the PYTHON allocator's cached buffers back afterwards (a test's big buffer must not stay cached)."""
    yield
    Device["PYTHON"].allocator.free_cache()


# ***** the index dtype of a kernel *****


def test_ordinary_kernels_index_in_int32() -> None:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((64, 64)).astype(np.float32))
    chain = ((a * 2 + 1).exp() - a).sqrt()
    for t in (a @ a, chain, a.sum(axis=1), Tensor.ones(1 << 20).sum(), a.flip(0).pad(((1, 2), (3, 0))).contiguous()):
        uops = _uops(t)
        assert _index_dtypes(uops) == {dtypes.int32}
        assert not any(u.dtype == dtypes.int64 for u in uops)


def test_a_kernel_past_int32_elements_indexes_in_int64() -> None:
    x = Tensor.empty(PAST_INT32, dtype=dtypes.uint8)  # scheduled, never allocated
    # the whole buffer, a reduce of as many elements, and a small kernel that reads the end of the big buffer
    for t in (x + 1, Tensor.ones(PAST_INT32, dtype=dtypes.uint8).sum(), x[PAST_INT32 - 9 :] * 2):
        assert _index_dtypes(_uops(t)) == {dtypes.int64}


def _masked_view_kernel() -> Kernel:
    """out[i, j] = in[i * 2**30 + j] where i < 2, else 0 (shape (4, 2)): an input of 2**30 + 2 elements, whose index
    expression reaches 3 * 2**30 + 1 (past int32) where the mask hides it."""
    view = View.create((4, 2), (2**30, 1), 0, ((0, 2), (0, 2)))
    load = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.uint8, ShapeTracker((view,))))
    store = LazyOp(BufferOps.STORE, (load,), MemBuffer(0, dtypes.uint8, ShapeTracker.from_shape((4, 2))))
    return Kernel(store, PythonRenderer())


def test_index_math_that_passes_int32_in_a_small_kernel_is_int64(free_python_cache: None) -> None:
    k = _masked_view_kernel()
    assert linearizer.index_dtype_of(k) == dtypes.int32  # its sizes alone would keep int32
    program = to_program(k)
    assert _index_dtypes(program.uops) == {dtypes.int64}
    index_math = [u for u in program.uops if u.op is UOps.ALU and u.arg is BinaryOps.MUL]
    assert index_math and all(u.dtype == dtypes.int64 for u in index_math)
    # run it (the input is mapped memory of which only the two pages it reads are touched)
    out = Buffer("PYTHON", 8, dtypes.uint8).allocate()
    src = Buffer("PYTHON", 2**30 + 2, dtypes.uint8).allocate()
    src.view(2, dtypes.uint8, 0).copyin(memoryview(bytearray([3, 4])))
    src.view(2, dtypes.uint8, 2**30).copyin(memoryview(bytearray([5, 6])))
    CompiledRunner("PYTHON", program)([out, src], {})
    np.testing.assert_array_equal(out.numpy(), np.array([3, 4, 5, 6, 0, 0, 0, 0], np.uint8))
    del src


@pytest.fixture
def int64_everywhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[DType]]:
    """Every kernel lowered from here on indexes in int64 (the kernels cached before are not reused); yields the
    index dtypes of the kernels that were lowered."""
    seen: list[DType] = []

    def always_int64(k: Kernel) -> DType:
        seen.append(dtypes.int64)
        return dtypes.int64

    monkeypatch.setattr(linearizer, "index_dtype_of", always_int64)
    monkeypatch.setattr(realize, "_runner_cache", {})
    monkeypatch.setattr(realize, "_runner_by_id", {})
    yield seen


def test_int64_kernels_match_numpy(int64_everywhere: list[DType]) -> None:
    """The int64 index path of the linearizer and the PYTHON interpreter, on small kernels of every kind."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 35)).astype(np.float32)
    b = rng.standard_normal((35, 6)).astype(np.float32)
    ta, tb = Tensor(a), Tensor(b)
    n = Variable("n", 1, 35).bind(20)
    cases = [
        ((ta * 2 + 1).numpy(), a * 2 + 1),
        (ta.sum(axis=1).numpy(), a.sum(axis=1)),
        (ta.max(axis=0).numpy(), a.max(axis=0)),
        ((ta @ tb).numpy(), a @ b),
        (ta.flip(1).pad(((2, 1), (0, 3))).numpy(), np.pad(a[:, ::-1], ((2, 1), (0, 3)))),
        (ta.T.contiguous().numpy(), a.T),
        (ta[1:8:3, ::-4].numpy(), a[1:8:3, ::-4]),
        (Tensor.arange(50).numpy(), np.arange(50)),
        ((Tensor(a[:, :20]).reshape(9, n) * 3).sum(axis=1).numpy(), (a[:, :20] * 3).sum(axis=1)),
    ]
    for got, want in cases:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert int64_everywhere  # (the kernels were lowered here, in int64)


def test_past_int32_elements_on_python(free_python_cache: None) -> None:
    """A real buffer of 2**31 + 5 bytes on PYTHON (mapped, never touched but at its end: a few pages of memory), read
    near its end by small kernels whose indices pass int32."""
    x = Tensor.empty(PAST_INT32, dtype=dtypes.uint8, device="PYTHON").realize()
    tail = np.arange(1, 17, dtype=np.uint8) * 7
    buffer = x.lazydata.base.realized
    assert buffer is not None
    buffer.view(16, dtypes.uint8, PAST_INT32 - 16).copyin(memoryview(bytearray(tail.tobytes())))
    np.testing.assert_array_equal(x[PAST_INT32 - 16 :].numpy(), tail)
    np.testing.assert_array_equal((x[PAST_INT32 - 16 :] + 1).numpy(), tail + 1)
    np.testing.assert_array_equal((x[PAST_INT32 - 16 :: 3] * 2).numpy(), tail[::3] * 2)
    np.testing.assert_array_equal(x[-16:].flip(0).contiguous().numpy(), tail[::-1])
    assert x[-16:].sum().item() == int(tail.astype(np.int64).sum())
    del x, buffer


# ***** impossible sizes *****


def test_a_buffer_larger_than_any_address_space_is_refused_where_it_is_made() -> None:
    with pytest.raises(MemoryError, match=f"{2**62} float32 elements on PYTHON would be {2**64} bytes"):
        Tensor.empty(2**62)
    with pytest.raises(MemoryError, match=str(2**80)):  # a shape whose element count passes int64
        Tensor.empty(2**40, 2**40, dtype=dtypes.uint8)
    with pytest.raises(MemoryError, match=str(MAX_BUFFER_BYTES + 1)):
        Buffer("PYTHON", MAX_BUFFER_BYTES + 1, dtypes.uint8)


def test_an_allocation_the_host_cannot_hold_raises_memory_error_naming_it() -> None:
    t = Tensor.empty(2**62, dtype=dtypes.uint8)  # fits the address space, not this machine
    with pytest.raises(MemoryError, match=f"device PYTHON has no memory for a buffer of {2**62} uint8 elements"):
        t.realize()
    with pytest.raises(MemoryError, match=f"could not map {2**62} bytes"):
        Device["PYTHON"].allocator.alloc(2**62)
    np.testing.assert_array_equal((Tensor([1, 2, 3]) + 1).numpy(), [2, 3, 4])  # and the device works on


def test_negative_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="-1 bytes"):
        Device["PYTHON"].allocator.alloc(-1)
    with pytest.raises(ValueError, match="-3"):
        Buffer("PYTHON", -3, dtypes.float32)


def test_a_kernel_past_int64_is_refused_naming_its_size() -> None:
    with pytest.raises(ValueError, match=f"spans {2**80} elements"):
        Tensor.ones(2**40, 2**40, dtype=dtypes.uint8).sum().realize()


# ***** running out of memory, and recovering *****

# A child process with its address space limited to what it uses plus LIMIT: it allocates a big buffer, fails a
# second allocation for real, frees the first (into the LRU cache), then allocates nearly LIMIT, which fits only once
# the cache is given back and only without the huge-page path's extra alignment page
_RECOVERY = textwrap.dedent(
    """
    import json, resource, sys
    from tgcore import Device, Tensor, dtypes
    from tgcore.device import Buffer

    MIB = 1 << 20
    LIMIT = 160 * MIB
    Device["PYTHON"].allocator
    (Tensor([1.0]) + 1).numpy()  # everything a kernel needs is loaded before the limit
    used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))
    report = {}
    first = Buffer("PYTHON", LIMIT - 32 * MIB, dtypes.uint8).allocate()
    try:
        Buffer("PYTHON", 64 * MIB, dtypes.uint8).allocate()
        report["failed"] = None
    except MemoryError as e:
        report["failed"] = str(e)
    del first
    report["cached"] = sum(len(v) for v in Device["PYTHON"].allocator.cache.values())
    big = Buffer("PYTHON", LIMIT - MIB, dtypes.uint8).allocate()
    big.view(4, dtypes.uint8, LIMIT - MIB - 4).copyin(memoryview(bytearray(b"\\x01\\x02\\x03\\x04")))
    report["big_tail"] = big.view(4, dtypes.uint8, LIMIT - MIB - 4).numpy().tolist()
    del big
    Device["PYTHON"].allocator.free_cache()
    report["after"] = (Tensor.arange(6) * 2).numpy().tolist()
    print(json.dumps(report))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="limits the address space with RLIMIT_AS and /proc (Linux)")
@pytest.mark.parametrize("huge_pages", ["1", "0"], ids=["huge-page path", "heap path"])
def test_allocation_recovers_after_memory_ran_out(huge_pages: str) -> None:
    env = {**os.environ, "TGCORE_HUGE_PAGES": huge_pages, "DEVICE": "PYTHON"}
    done = subprocess.run([sys.executable, "-c", _RECOVERY], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed"] is not None, "the 64 MiB allocation did not fail: the limit did not apply"
    assert f"device PYTHON has no memory for a buffer of {64 << 20} uint8 elements" in report["failed"]
    assert report["cached"] == 1  # the freed buffer waited in the cache ...
    assert report["big_tail"] == [1, 2, 3, 4]  # ... and was given back for an allocation that needed its memory
    assert report["after"] == [0, 2, 4, 6, 8, 10]


def test_a_split_sum_of_a_cast_reads_its_input_in_place(free_python_cache: None) -> None:
    """A sum of everything runs in two stages over a count padded to whole parts; the cast (uint8 -> uint32) below it
    is computed inline where the pad reads nothing, not first into a buffer four times the input's size."""
    n = 7 * 1000003  # no number of parts divides it: the first stage reads past the end, masked
    x = Tensor.ones(n, dtype=dtypes.uint8, device="PYTHON").contiguous().realize()
    total = x.sum()
    sizes = [b.nbytes for si in total.schedule() for b in si.bufs if b is not x.lazydata.base.buffer]
    assert max(sizes) < 4096, sizes  # only the stages' small outputs are made
    assert total.dtype == dtypes.uint32 and total.item() == n


@pytest.mark.parametrize(
    "dtype, fits, passes, wide",
    [
        (dtypes.bool, 2**31 - 1, 2**31, dtypes.int64),
        (dtypes.uint8, (2**32 - 1) // 255, (2**32 - 1) // 255 + 1, dtypes.uint64),
        (dtypes.int8, (2**31 - 1) // 128, (2**31 - 1) // 128 + 1, dtypes.int64),
        (dtypes.uint16, (2**32 - 1) // 65535, (2**32 - 1) // 65535 + 1, dtypes.uint64),
        (dtypes.int16, (2**31 - 1) // 32768, (2**31 - 1) // 32768 + 1, dtypes.int64),
    ],
)
def test_a_sum_that_could_pass_int32_accumulates_in_64_bits(dtype: DType, fits: int, passes: int, wide: DType) -> None:
    """tinygrad sums narrow integers in (u)int32; where the count summed could pass that range the total is made in
    (u)int64, as numpy's, never wrapped (nothing is allocated here: only the dtypes are asked)."""
    narrow = dtypes.uint32 if dtypes.is_unsigned(wide) else dtypes.int32
    assert Tensor.empty(fits, dtype=dtype, device="PYTHON").sum().dtype == narrow
    assert Tensor.empty(passes, dtype=dtype, device="PYTHON").sum().dtype == wide
    assert Tensor.empty(2, passes, dtype=dtype, device="PYTHON").sum(axis=0).dtype == narrow  # (2 summed: fits)
    assert Tensor.empty(passes, dtype=dtype, device="PYTHON").sum(acc_dtype=dtypes.int32).dtype == dtypes.int32
    n = Variable("n", 1, passes).bind(3)
    assert Tensor.empty(n, dtype=dtype, device="PYTHON").sum().dtype == wide  # (n could be that many)
