"""Level 1: sizes no device can hold are refused with the error that names them (MemoryError or ValueError, never an
OverflowError or TypeError from a binding), and the device allocates as before after a failed allocation."""

from __future__ import annotations

import numpy as np
import pytest

from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tgcore import Tensor
from tgcore.device import Buffer
from tgcore.dtype import dtypes

pytestmark = pytest.mark.usefixtures("executing")

HOPELESS = 2**62  # bytes: a quarter of a 64-bit address space, more than any machine has


@pytest.mark.tg_op("impossible sizes")
def test_an_allocation_of_more_than_the_device_has_raises_memory_error(executing: Target) -> None:
    """The allocator itself raises MemoryError (the LRU cache frees what it holds and retries on it); a Buffer says
    which device and size."""
    with pytest.raises(MemoryError):
        executing.device.allocator.alloc(HOPELESS)
    with pytest.raises(MemoryError, match=rf"{executing.name}\b.*{HOPELESS}"):
        Buffer(executing.name, HOPELESS, dtypes.uint8).allocate()


@pytest.mark.tg_op("impossible sizes")
def test_a_buffer_larger_than_an_address_space_is_refused_when_it_is_made(executing: Target) -> None:
    with pytest.raises(MemoryError, match=str(HOPELESS * 4)):
        Buffer(executing.name, HOPELESS, dtypes.float32)
    with pytest.raises(MemoryError, match=str(2**80)):  # a shape whose element count passes int64
        Tensor.empty(2**40, 2**40, dtype=dtypes.uint8, device=executing.name)


@pytest.mark.tg_op("impossible sizes")
def test_negative_sizes_are_refused(executing: Target) -> None:
    with pytest.raises(ValueError, match="-1"):
        executing.device.allocator.alloc(-1)
    with pytest.raises(ValueError, match="-5"):
        Buffer(executing.name, -5, dtypes.float32)


@pytest.mark.tg_op("impossible sizes")
def test_a_kernel_past_int64_is_refused(executing: Target) -> None:
    with pytest.raises(ValueError, match=str(2**80)):
        Tensor.ones(2**40, 2**40, dtype=dtypes.uint8, device=executing.name).sum().realize()


@pytest.mark.tg_op("alloc after a failure")
def test_the_device_allocates_after_a_failed_allocation(executing: Target) -> None:
    with pytest.raises(MemoryError):
        Buffer(executing.name, HOPELESS, dtypes.uint8).allocate()
    data = np.arange(1001, dtype=np.int32)
    buf = Buffer(executing.name, 1001, dtypes.int32, initial_value=data.tobytes())
    assert_array("a Buffer after a failed allocation", executing.name, buf.numpy(), data)
    got = (Tensor(data, device=executing.name) * 2).numpy()
    assert_array("a kernel after a failed allocation", executing.name, got, data * 2)
