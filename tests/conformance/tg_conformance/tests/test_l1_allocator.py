"""Level 1: the device's Allocator (alloc / free / copyin / copyout, optional offset and as_buffer) and
`tgcore.device.Buffer` on top of it: round trips at sizes 0, 1, odd and large, views, many alloc/free cycles."""
from __future__ import annotations

import numpy as np
import pytest

from tg_conformance import reference as ref
from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tgcore import GlobalCounters
from tgcore.device import Buffer
from tgcore.dtype import DType, dtypes

pytestmark = pytest.mark.usefixtures("executing")

SIZES = [0, 1, 17, 1001, 8 * 1024 * 1024 + 3]


def _bytes_equal(what: str, device: str, got: bytes, exp: bytes) -> None:
    if got == exp:
        return
    if len(got) != len(exp):
        raise AssertionError(f"{what} on {device}: {len(got)} bytes back, expected {len(exp)}")
    first = next(i for i, (a, b) in enumerate(zip(got, exp)) if a != b)
    wrong = sum(a != b for a, b in zip(got, exp)) if len(got) < 1 << 16 else "some"
    raise AssertionError(f"{what} on {device}: {wrong} of {len(exp)} bytes differ; first at byte {first}: expected "
                         f"{exp[first:first + 8].hex()} got {got[first:first + 8].hex()}")


@pytest.mark.tg_op("alloc round trip")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
def test_allocator_round_trip(executing: Target, size: int, rng: np.random.Generator) -> None:
    """alloc(size) -> copyin(random bytes) -> copyout gives the same bytes; a 0-byte buffer allocates and frees."""
    allocator = executing.device.allocator
    opaque = allocator.alloc(size)
    try:
        if size:
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            allocator.copyin(opaque, memoryview(bytearray(data)))
            out = bytearray(size)
            allocator.copyout(memoryview(out), opaque)
            _bytes_equal(f"allocator round trip of {size} bytes", executing.name, bytes(out), data)
    finally:
        allocator.free(opaque, size)


@pytest.mark.tg_op("copyin read-only")
def test_allocator_copyin_from_readonly_memory(executing: Target) -> None:
    """copyin accepts a read-only memoryview (e.g. of bytes), as Buffer.copyin passes them."""
    allocator = executing.device.allocator
    data = bytes(range(97))
    opaque = allocator.alloc(len(data))
    try:
        allocator.copyin(opaque, memoryview(data))
        out = bytearray(len(data))
        allocator.copyout(memoryview(out), opaque)
        _bytes_equal("copyin from read-only bytes", executing.name, bytes(out), data)
    finally:
        allocator.free(opaque, len(data))


@pytest.mark.tg_op("offset views")
@pytest.mark.parametrize("offset", [256, 8])
def test_allocator_offset_views(executing: Target, offset: int) -> None:
    """offset(buf, size, offset) is a view: reads see the base's bytes, writes land in the base (at an offset
    aligned for any device, and at a small unaligned one)."""
    allocator = executing.device.allocator
    if not allocator.supports_offset:
        pytest.skip(f"{executing.name}'s allocator declares no offset (supports_offset: optional in the contract)")
    data = bytes(range(256)) * 2
    base = allocator.alloc(len(data))
    try:
        allocator.copyin(base, memoryview(bytearray(data)))
        view = allocator.offset(base, 16, offset)
        out = bytearray(16)
        allocator.copyout(memoryview(out), view)
        _bytes_equal(f"copyout of offset(base, 16, {offset})", executing.name, bytes(out), data[offset:offset + 16])
        allocator.copyin(view, memoryview(bytearray(b"\xff" * 16)))
        whole = bytearray(len(data))
        allocator.copyout(memoryview(whole), base)
        _bytes_equal(f"base after copyin into offset(base, 16, {offset})", executing.name, bytes(whole),
                     data[:offset] + b"\xff" * 16 + data[offset + 16:])
    finally:
        allocator.free(base, len(data))


@pytest.mark.tg_op("as_buffer")
def test_allocator_as_buffer(executing: Target) -> None:
    """as_buffer(opaque), where the allocator has it, shows the buffer's bytes."""
    allocator = executing.device.allocator
    if not allocator.supports_as_buffer:
        pytest.skip(f"{executing.name}'s allocator declares no as_buffer (supports_as_buffer: optional)")
    data = bytes(range(33))
    opaque = allocator.alloc(len(data))
    try:
        allocator.copyin(opaque, memoryview(bytearray(data)))
        _bytes_equal("as_buffer", executing.name, bytes(allocator.as_buffer(opaque)), data)
    finally:
        allocator.free(opaque, len(data))


@pytest.mark.tg_op("alloc/free x1000")
def test_allocator_many_alloc_free_cycles(executing: Target) -> None:
    """1000 alloc/copyin/free cycles of mixed sizes; the allocator still round-trips afterwards."""
    allocator = executing.device.allocator
    sizes = [1, 64, 4096, 17, 100_000]
    for i in range(1000):
        size = sizes[i % len(sizes)]
        opaque = allocator.alloc(size)
        allocator.copyin(opaque, memoryview(bytearray(i.to_bytes(4, "little")[:1] * size)))
        allocator.free(opaque, size)
    opaque = allocator.alloc(4096)
    try:
        data = bytes(range(256)) * 16
        allocator.copyin(opaque, memoryview(bytearray(data)))
        out = bytearray(4096)
        allocator.copyout(memoryview(out), opaque)
        _bytes_equal("round trip after 1000 alloc/free cycles", executing.name, bytes(out), data)
    finally:
        allocator.free(opaque, 4096)
    if hasattr(allocator, "free_cache"):
        allocator.free_cache()


# ***** through tgcore.device.Buffer *****

@pytest.mark.tg_op("Buffer round trip")
@pytest.mark.parametrize("dtype", ref.EVERY_DTYPE, ids=lambda d: d.short_name)
@pytest.mark.parametrize("size", [0, 1, 17, 1001])
def test_buffer_round_trip(executing: Target, dtype: DType, size: int, rng: np.random.Generator) -> None:
    """Buffer(device, size, dtype, initial_value=...) gives its values back through copyout and numpy()."""
    executing.require(dtype)
    values = np.concatenate([ref.edge_values(dtype), ref.random_values(dtype, size, rng)])[:size]
    raw = ref.to_bytes(values, dtype)
    buf = Buffer(executing.name, size, dtype, initial_value=raw)
    out = bytearray(len(raw))
    buf.copyout(memoryview(out))
    _bytes_equal(f"Buffer copyout of {size} x {dtype.short_name}", executing.name, bytes(out), raw)
    assert_array(f"Buffer.numpy() of {size} x {dtype.short_name}", executing.name,
                 ref.bits_of(buf.numpy(), dtype), ref.bits_of(values, dtype))


@pytest.mark.tg_op("Buffer views")
@pytest.mark.parametrize("offset", [256, 8])
def test_buffer_views(executing: Target, offset: int) -> None:
    """Buffer.view reads and writes a slice of its base (when the allocator has offset)."""
    if not executing.device.allocator.supports_offset:
        pytest.skip(f"{executing.name}'s allocator declares no offset, so Buffer.view is not available")
    first = offset // 4
    base = Buffer(executing.name, 128, dtypes.int32, initial_value=np.arange(128, dtype=np.int32).tobytes())
    view = base.view(4, dtypes.int32, offset)
    assert_array(f"Buffer.view(4, int32, offset {offset})", executing.name, view.numpy(),
                 np.arange(first, first + 4, dtype=np.int32))
    view.copyin(memoryview(bytearray(np.full(4, -1, dtype=np.int32).tobytes())))
    exp = np.arange(128, dtype=np.int32)
    exp[first:first + 4] = -1
    assert_array("base after writing its view", executing.name, base.numpy(), exp)
    as_bytes = base.view(8, dtypes.uint8, offset)
    assert_array("Buffer.view as uint8", executing.name, as_bytes.numpy(), exp.view(np.uint8)[offset:offset + 8])


@pytest.mark.tg_op("Buffer x1000")
def test_buffer_many_alloc_free_cycles(executing: Target) -> None:
    """1000 Buffers made, filled and dropped; memory accounting returns to where it was."""
    start = GlobalCounters.mem_used
    data = np.arange(257, dtype=np.float32)
    for _ in range(1000):
        buf = Buffer(executing.name, 257, dtypes.float32, initial_value=data.tobytes())
        del buf
    last = Buffer(executing.name, 257, dtypes.float32, initial_value=data.tobytes())
    assert_array("Buffer after 1000 alloc/free cycles", executing.name, last.numpy(), data)
    del last
    assert GlobalCounters.mem_used == start, f"GlobalCounters.mem_used is {GlobalCounters.mem_used}, was {start}"
