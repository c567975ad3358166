"""tg-cuda on a GPU: the driver binding, memory, launches (flat and with a workgroup), timing, vector kernels and
errors. Skipped, with the reason, where CUDA is unavailable (the conformance suite covers the rest on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import tg_cuda
from test_cuda import Builder, elementwise, grouped_kernel  # the tests folder is on sys.path
from tg_cuda.driver import CUDAError, device_count, open_device

from tgcore import Tensor
from tgcore.device import Buffer, Device
from tgcore.dtype import dtypes
from tgcore.ops import BinaryOps

_reason = tg_cuda.probe()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"CUDA is unavailable here: {_reason}")


def _program(uops: list, name: str) -> tg_cuda.CUDAProgram:
    dev = Device["CUDA"]
    return dev.runtime("CUDA", name, dev.compiler.compile(dev.renderer.render(name, uops)))


def _buffer(values: np.ndarray) -> Buffer:
    return Buffer("CUDA", values.size, dtypes.from_np(values.dtype), initial_value=values.tobytes())


def test_device_reports_itself() -> None:
    gpu = open_device(0)
    assert gpu.compute_capability >= (7, 5) and gpu.total_memory > 0 and gpu.name
    assert Device["CUDA"].compiler.arch == gpu.compute_capability[0] * 10 + gpu.compute_capability[1]


def test_flat_kernel_runs_and_is_timed() -> None:
    n = 100_003  # not a multiple of the block: the guard keeps the last block in bounds
    a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, dtype=np.float32)
    out, x, y = Buffer("CUDA", n, dtypes.float32).allocate(), _buffer(a), _buffer(b)
    seconds = _program(elementwise(BinaryOps.ADD, dtypes.float32, n), "k_add")(
        out._opaque, x._opaque, y._opaque, global_size=(n, 1, 1), local_size=(1, 1, 1), wait=True
    )
    assert seconds is not None and 0 < seconds < 1
    np.testing.assert_array_equal(out.numpy(), a + b)


def test_grouped_kernel_with_shared_memory_runs() -> None:
    x = np.arange(8 * 16, dtype=np.float32)
    out, src = Buffer("CUDA", 8, dtypes.float32).allocate(), _buffer(x)
    _program(grouped_kernel(), "k_group")(out._opaque, src._opaque, global_size=(8, 1, 1), local_size=(16, 1, 1))
    np.testing.assert_array_equal(out.numpy(), x.reshape(8, 16).sum(axis=1))


def test_vector_kernel_runs() -> None:
    from tgcore.codegen.uops import UOps

    b = Builder()
    out, x = b.buffer(dtypes.float32, True), b.buffer(dtypes.float32)
    i = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 64))
    idx = b.alu(BinaryOps.MUL, dtypes.int32, i, b.const(4, dtypes.int32))
    vec = dtypes.float32.vec(4)
    v = b.add(UOps.LOAD, vec, (x, idx))
    b.add(UOps.STORE, None, (out, idx, b.alu(BinaryOps.ADD, vec, v, v)))
    data = np.arange(256, dtype=np.float32)
    res, src = Buffer("CUDA", 256, dtypes.float32).allocate(), _buffer(data)
    _program(b.uops, "k_vec")(res._opaque, src._opaque, global_size=(64, 1, 1), local_size=(1, 1, 1))
    np.testing.assert_array_equal(res.numpy(), data * 2)


def test_failed_call_names_the_cuda_error() -> None:
    with pytest.raises(CUDAError, match="cuMemFree_v2 failed: CUDA_ERROR_INVALID_VALUE"):
        Device["CUDA"].allocator._free(12345, None)


def test_views_and_round_trip() -> None:
    base = _buffer(np.arange(64, dtype=np.int32))
    view = base.view(4, dtypes.int32, 40)
    np.testing.assert_array_equal(view.numpy(), np.arange(10, 14, dtype=np.int32))


def test_tensor_program_on_cuda() -> None:
    a = np.random.default_rng(0).standard_normal((33, 65)).astype(np.float32)
    t = Tensor(a, device="CUDA")
    np.testing.assert_allclose((t @ t.T).numpy(), a @ a.T, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(_reason is None and device_count() < 2, reason="one GPU: no second device to copy to")
def test_copy_between_two_gpus() -> None:
    x = np.arange(1000, dtype=np.float32)
    t = Tensor(x, device="CUDA").to("CUDA:1") + 1
    np.testing.assert_array_equal(t.to("CUDA").numpy(), x + 1)
