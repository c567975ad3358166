"""LLVM past int32: a tensor of 2**31 + 5 bytes (ones, an exact sum, an elementwise op over all of it, slices and
numpy copies of its end), one whose elements fit int32 but whose bytes do not, and int64-index kernels of every kind
(threaded ones included) against numpy. The big tests hold one 2 GiB buffer at a time and give it back after."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest

from tgcore import Device, Tensor, dtypes
from tgcore.codegen import linearizer
from tgcore.codegen.kernel import Kernel
from tgcore.dtype import DType
from tgcore.engine import realize

DEVICE = "LLVM"
PAST_INT32 = 2**31 + 5  # elements (7 * 7 * 43826197: no axis splits it evenly into lanes)
NEEDED = 5 << 30  # bytes of free memory the 2 GiB tests want: the buffer, the machine's others, headroom


def _available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not reported here: assume enough
        return NEEDED


@pytest.fixture
def big_buffers() -> Iterator[None]:
    """A test of 2 GiB buffers: skipped where the machine has not that much free, its buffers given back after."""
    if _available_memory() < NEEDED:
        pytest.skip(f"needs {NEEDED >> 30} GiB of free memory, this machine has {_available_memory() >> 20} MiB")
    yield
    gc.collect()
    Device[DEVICE].allocator.free_cache()


def test_past_int32_elements(big_buffers: None) -> None:
    n = PAST_INT32
    x = Tensor.ones(n, dtype=dtypes.uint8, device=DEVICE).contiguous().realize()
    total = x.sum()  # in two stages over a padded count, the cast to uint64 computed inline (no 16 GiB buffer)
    assert total.dtype == dtypes.uint64 and total.item() == n  # every one counted: 2**31 uint8 could pass uint32
    np.testing.assert_array_equal(x[n - 7 :].numpy(), np.ones(7, np.uint8))
    x.assign(x * 3 - 1).realize()  # elementwise over the whole buffer, in place (no second 2 GiB)
    assert (x - 1).sum().item() == n
    np.testing.assert_array_equal(x[n - 4 :].numpy(), np.full(4, 2, np.uint8))
    np.testing.assert_array_equal((x[n - 9 :: 4] + 5).numpy(), np.full(3, 7, np.uint8))
    assert x.max().item() == 2
    del x, total


def test_past_int32_bytes(big_buffers: None) -> None:
    n = 2**29 + 3  # float32 elements: an int32 count, 2 GiB + 12 bytes
    x = Tensor.ones(n, dtype=dtypes.float32, device=DEVICE).contiguous().realize()
    assert x.sum().item() == np.float32(n)  # n rounded to float32 once (a compensated sum)
    x.assign(x * 2 + 0.5).realize()
    np.testing.assert_array_equal(x[n - 5 :].numpy(), np.full(5, 2.5, np.float32))
    np.testing.assert_array_equal(x[-3:].flip(0).contiguous().numpy(), np.full(3, 2.5, np.float32))
    del x


@pytest.fixture
def int64_everywhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[DType]]:
    """Every kernel lowered from here on indexes in int64 (cached kernels are not reused); yields their dtypes."""
    seen: list[DType] = []

    def always_int64(k: Kernel) -> DType:
        seen.append(dtypes.int64)
        return dtypes.int64

    monkeypatch.setattr(linearizer, "index_dtype_of", always_int64)
    monkeypatch.setattr(realize, "_runner_cache", {})
    monkeypatch.setattr(realize, "_runner_by_id", {})
    yield seen


def test_int64_kernels_match_numpy(int64_everywhere: list[DType]) -> None:
    """The int64 index spellings of the LLVM IR renderer on small kernels of every kind; the big elementwise one and
    the big sum are threaded (their loop bounds are int64 vals)."""
    from tgcore import Variable

    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 35)).astype(np.float32)
    b = rng.standard_normal((35, 6)).astype(np.float32)
    c = rng.standard_normal(1 << 19).astype(np.float32)
    ta, tb, tc = Tensor(a, device=DEVICE), Tensor(b, device=DEVICE), Tensor(c, device=DEVICE)
    n = Variable("n", 1, 35).bind(20)
    cases = [
        ((ta * 2 + 1).numpy(), a * 2 + 1),
        (ta.sum(axis=1).numpy(), a.sum(axis=1)),
        (ta.max(axis=0).numpy(), a.max(axis=0)),
        ((ta @ tb).numpy(), a @ b),
        (ta.flip(1).pad(((2, 1), (0, 3))).numpy(), np.pad(a[:, ::-1], ((2, 1), (0, 3)))),
        (ta[1:8:3, ::-4].numpy(), a[1:8:3, ::-4]),
        ((Tensor(a[:, :20], device=DEVICE).reshape(9, n) * 3).sum(axis=1).numpy(), (a[:, :20] * 3).sum(axis=1)),
        ((tc * 3 - 1).numpy(), c * 3 - 1),
        (tc.reshape(512, 1024).sum(axis=1).numpy(), c.reshape(512, 1024).sum(axis=1)),
    ]
    for got, want in cases:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert int64_everywhere
