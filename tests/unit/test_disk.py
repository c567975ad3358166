"""The DISK device: tensors in memory-mapped files, checked against the bytes numpy reads and writes on disk."""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Device, Tensor, dtypes
from tgcore.lazy import LazyBuffer
from tgcore.nn.state import safe_load
from tgcore.runtime import disk

# the compute devices a DISK tensor is copied to and from: PYTHON always, CLANG where it is installed and works
COMPUTE = ["PYTHON"] + (["CLANG"] if "CLANG" in Device.available() else [])


def disk_name(path: Path) -> str:
    return f"disk:{path}"


def exact(t: Tensor, want: np.ndarray) -> None:
    got = t.numpy()
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


# ***** names and registration *****


def test_device_names_keep_the_path_as_written(tmp_path: Path) -> None:
    assert Device.canonicalize("disk:/tmp/X") == "DISK:/tmp/X"
    assert Device.canonicalize("Disk:rel/Mixed:Case") == "DISK:rel/Mixed:Case"
    assert Device.canonicalize("disk:0") == "DISK:0"  # a file named 0, not instance 0
    assert Device.canonicalize("python:0") == "PYTHON" and Device.canonicalize("python:2") == "PYTHON:2"
    upper, lower = tmp_path / "Data.bin", tmp_path / "data.bin"
    Tensor(np.arange(3, dtype=np.int32)).to(disk_name(upper)).realize()
    Tensor(np.arange(5, dtype=np.int32)).to(disk_name(lower)).realize()
    assert upper.stat().st_size == 12 and lower.stat().st_size == 20  # two files (on a case-sensitive file system)
    assert Tensor.empty(3, dtype=dtypes.int32, device=disk_name(upper)).device == f"DISK:{upper}"


def test_disk_is_a_storage_device_never_the_default() -> None:
    spec = Device.specs()["DISK"]
    assert spec.storage_only and spec.path_instances
    assert "DISK" not in Device.available() and Device.DEFAULT != "DISK"
    assert Device.status("DISK") is None  # usable: it needs only its allocator
    env = {**os.environ, "TGCORE_PLUGIN_AUTOLOAD": "0", "DISK": "1"}
    env.pop("DEVICE", None)
    out = subprocess.run(
        [sys.executable, "-m", "tgcore", "devices"], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert "DISK" in out and "default device: PYTHON" in out


# ***** writing files *****

ODD_ARRAYS = [
    np.arange(7, dtype=np.int8) - 3,
    np.linspace(-2, 2, 13).astype(np.float16),
    np.arange(15, dtype=np.float64).reshape(3, 5) / 7,
    np.array([True, False, True]),
    np.array([2**63 - 1, -(2**63), 5], dtype=np.int64),
    np.arange(1, dtype=np.uint32),
]


@pytest.mark.parametrize("arr", ODD_ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
@pytest.mark.parametrize("device", COMPUTE)
def test_to_disk_writes_the_bytes_and_reads_them_back(tmp_path: Path, arr: np.ndarray, device: str) -> None:
    fn = tmp_path / "t.bin"
    t = Tensor(arr, device=device).to(disk_name(fn))
    assert t.device == f"DISK:{fn}"
    exact(t, arr)  # (reading realizes the copy)
    assert fn.read_bytes() == arr.tobytes()
    back = t.to(device)
    assert back.device == Device.canonicalize(device)
    exact(back, arr)
    exact(back + back, arr + arr)  # the copy is an ordinary tensor of the compute device


def test_bfloat16_on_disk(tmp_path: Path) -> None:
    fn = tmp_path / "bf.bin"
    t = Tensor([1.5, -2.25, 3.0], dtype=dtypes.bfloat16).to(disk_name(fn))
    exact(t, np.array([1.5, -2.25, 3.0], np.float32))
    assert np.fromfile(fn, np.uint16).tolist() == [0x3FC0, 0xC010, 0x4040]


def test_tensor_made_on_disk_directly(tmp_path: Path) -> None:
    fn = tmp_path / "direct.bin"
    t = Tensor([[1, 2, 3], [4, 5, 6]], dtype=dtypes.int16, device=disk_name(fn))
    assert np.fromfile(fn, np.int16).tolist() == [1, 2, 3, 4, 5, 6]
    exact(t, np.array([[1, 2, 3], [4, 5, 6]], np.int16))


def test_empty_names_a_file_that_a_write_creates_and_sizes(tmp_path: Path) -> None:
    fn = tmp_path / "sub" / "new.bin"
    fn.parent.mkdir()
    t = Tensor.empty(4, 4, dtype=dtypes.float32, device=disk_name(fn))
    assert t.shape == (4, 4) and t.dtype == dtypes.float32
    t.realize()
    assert not fn.exists()  # naming a file makes none: the first write does
    t[1:3] = Tensor(np.full((2, 4), 2.5, np.float32))
    assert fn.stat().st_size == 64  # the whole tensor, though only rows 1 and 2 were written
    want = np.zeros((4, 4), np.float32)
    want[1:3] = 2.5
    np.testing.assert_array_equal(np.fromfile(fn, np.float32).reshape(4, 4), want)
    exact(t, want)


def test_writes_grow_a_short_file_and_never_shrink_one(tmp_path: Path) -> None:
    fn = tmp_path / "grow.bin"
    fn.write_bytes(b"\x01\x02\x03")
    t = Tensor.empty(2, dtype=dtypes.int32, device=disk_name(fn))
    t[1] = 7
    assert fn.read_bytes() == b"\x01\x02\x03\x00" + struct.pack("<i", 7)
    Tensor(np.array([9], np.int8)).to(disk_name(fn)).realize()  # a short write leaves the rest of the file
    assert fn.read_bytes() == b"\x09\x02\x03\x00" + struct.pack("<i", 7)


def test_assign_and_setitem_write_into_the_file(tmp_path: Path) -> None:
    fn = tmp_path / "rw.bin"
    np.arange(20, dtype=np.float32).tofile(fn)
    want = np.arange(20, dtype=np.float32).reshape(4, 5)
    t = Tensor.empty(4, 5, dtype=dtypes.float32, device=disk_name(fn))

    t[1:3].assign(Tensor(np.full((2, 5), -1, np.float32)))
    want[1:3] = -1
    t[3] = Tensor(np.arange(100, 105, dtype=np.float32))  # a row from a tensor
    want[3] = np.arange(100, 105)
    t[0, 1:4] = 8  # a scalar, broadcast
    want[0, 1:4] = 8
    t[2, 4] = 0.5
    want[2, 4] = 0.5
    t[0] = [1, 2, 3, 4, 5]  # type: ignore[assignment]  # data (ints), cast to the tensor's dtype
    want[0] = [1, 2, 3, 4, 5]
    assert t.assign(Tensor(want * 2)) is t  # the whole tensor
    want *= 2
    np.testing.assert_array_equal(np.memmap(fn, np.float32, "r", shape=(4, 5)), want)
    exact(t, want)
    exact(t[1:3], want[1:3])


@pytest.mark.parametrize("device", COMPUTE)
def test_assign_from_any_device_and_from_another_file(tmp_path: Path, device: str) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    t = Tensor(np.zeros(6, np.int32)).to(disk_name(a)).realize()
    src = Tensor(np.arange(6, dtype=np.int32)).to(disk_name(b)).realize()
    t[0:3] = Tensor(np.array([7, 8, 9], np.int32), device=device)
    t[3:6] = src[0:3]  # DISK to DISK
    assert np.fromfile(a, np.int32).tolist() == [7, 8, 9, 0, 1, 2]
    t[1:6] = t[0:5]  # overlapping ranges of one file: the value is read before it is written
    assert np.fromfile(a, np.int32).tolist() == [7, 7, 8, 9, 0, 1]
    t[0:2] = (Tensor([1, 1], dtype=dtypes.int32, device=device) + 4).cast(dtypes.int32)  # a computed value
    assert np.fromfile(a, np.int32).tolist() == [5, 5, 8, 9, 0, 1]


def test_assign_to_a_file_not_yet_written(tmp_path: Path) -> None:
    fn = tmp_path / "late.bin"
    t = Tensor(np.arange(4, dtype=np.uint8)).to(disk_name(fn))  # the copy has not run yet
    t[2:4] = 200
    assert fn.read_bytes() == bytes([0, 1, 200, 200])  # the copy landed first, the assignment over it


@pytest.mark.parametrize("device", COMPUTE)
def test_copy_disk_to_device_to_disk(tmp_path: Path, device: str) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    arr = (np.arange(35, dtype=np.float32).reshape(5, 7) - 17) / 3
    arr.tofile(src)
    on_device = Tensor.empty(5, 7, dtype=dtypes.float32, device=disk_name(src)).to(device)
    exact(on_device, arr)
    (on_device * 2).to(disk_name(dst)).realize()
    np.testing.assert_array_equal(np.fromfile(dst, np.float32).reshape(5, 7), arr * 2)
    Tensor.empty(5, 7, dtype=dtypes.float32, device=disk_name(dst)).to(disk_name(src)).realize()  # file to file
    np.testing.assert_array_equal(np.fromfile(src, np.float32).reshape(5, 7), arr * 2)


# ***** views: slices, reshapes and bitcasts of the same bytes *****


def test_slices_are_views_of_the_file(tmp_path: Path) -> None:
    fn = tmp_path / "v.bin"
    arr = np.arange(24, dtype=np.int32)
    arr.tofile(fn)
    t = Tensor.empty(24, dtype=dtypes.int32, device=disk_name(fn))
    rows = t.reshape(4, 6)
    part, row, one = rows[1:3], rows[2], rows[3, 5]
    exact(part, arr.reshape(4, 6)[1:3])
    exact(row, arr.reshape(4, 6)[2])
    exact(one, np.array(23, np.int32))
    exact(rows[1:3].reshape(3, 4)[1:], arr[6:18].reshape(3, 4)[1:])
    view, file = part.contiguous().lazydata, t.lazydata
    assert isinstance(view, LazyBuffer) and isinstance(file, LazyBuffer)
    assert view.base.buffer.base is file.base.buffer and view.base.buffer.offset == 6 * 4  # at byte 24: no copy
    mm = np.memmap(fn, np.int32, "r+")
    mm[6:18] = -mm[6:18]  # written behind tgcore's back: every view reads the file anew
    mm.flush()
    exact(part, -arr.reshape(4, 6)[1:3])
    exact(row, -arr.reshape(4, 6)[2])


def test_a_tensor_at_an_odd_byte_offset(tmp_path: Path) -> None:
    fn = tmp_path / "offset.bin"
    values = np.array([1.25, -3.5, 1e30], np.float32)
    fn.write_bytes(b"abc" + values.tobytes() + b"tail!")  # the floats start at byte 3, unaligned
    raw = Tensor.empty(fn.stat().st_size, dtype=dtypes.uint8, device=disk_name(fn))
    floats = raw[3:15].bitcast(dtypes.float32)
    assert floats.shape == (3,)
    exact(floats, values)
    for device in COMPUTE:
        exact(floats.to(device), values)
    assert raw[15:].numpy().tobytes() == b"tail!"
    floats[1] = 2.0
    assert fn.read_bytes() == b"abc" + np.array([1.25, 2.0, 1e30], np.float32).tobytes() + b"tail!"


def test_bitcast_to_smaller_and_larger_items(tmp_path: Path) -> None:
    fn = tmp_path / "b.bin"
    arr = np.array([[1.5, -2.0], [np.pi, 1e-3]], np.float64)
    t = Tensor(arr).to(disk_name(fn)).realize()
    exact(t.bitcast(dtypes.uint8), arr.view(np.uint8))  # (2, 16)
    exact(t.bitcast(dtypes.int32), arr.view(np.int32))  # (2, 4)
    exact(t.bitcast(dtypes.int64), arr.view(np.int64))  # same size
    exact(t[1].bitcast(dtypes.float16), arr[1].view(np.float16))
    small = t.bitcast(dtypes.uint16)
    exact(small.bitcast(dtypes.float64), arr)  # and back
    exact(small.reshape(-1)[4:12].bitcast(dtypes.float64), arr.reshape(-1)[1:3])  # larger items from a slice
    exact(t.reshape(-1).bitcast(dtypes.uint8)[8:16].bitcast(dtypes.float32), arr.reshape(-1)[1:2].view(np.float32))
    t.bitcast(dtypes.uint8)[0, 0:8] = Tensor(np.array([7.0]).view(np.uint8))  # writes through a bitcast view
    assert np.fromfile(fn, np.float64)[0] == 7.0


def test_bitcast_sizes_that_do_not_fit_raise(tmp_path: Path) -> None:
    fn = tmp_path / "b.bin"
    t = Tensor(np.arange(6, dtype=np.uint8)).to(disk_name(fn)).realize()
    with pytest.raises(ValueError, match="holds 6 bytes, not a whole number of 4-byte items"):
        t.bitcast(dtypes.float32)
    with pytest.raises(ValueError, match="0-d"):
        t[2].bitcast(dtypes.int16)
    exact(t[2:4].bitcast(dtypes.uint16), np.arange(6, dtype=np.uint8)[2:4].view(np.uint16))


NON_CONTIGUOUS_VIEWS: list[tuple[str, Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = [
    ("column", lambda t: t[:, 1], lambda a: a[:, 1]),
    ("permute", lambda t: t.permute(1, 0), lambda a: a.transpose(1, 0)),
    ("strided_flip", lambda t: t[::2, ::-1], lambda a: a[::2, ::-1]),
    ("transposed_slice", lambda t: t.T[1:3], lambda a: a.T[1:3]),
    ("rows_of_slices", lambda t: t.reshape(2, 6)[:, 1:5].reshape(8), lambda a: a.reshape(2, 6)[:, 1:5].reshape(8)),
    ("expand", lambda t: t[1:, 1:3].reshape(2, 2, 1).expand(2, 2, 3), lambda a: np.repeat(a[1:, 1:3, None], 3, 2)),
    ("pad", lambda t: t.pad(((1, 0), (0, 2))), lambda a: np.pad(a, ((1, 0), (0, 2)))),
]


@pytest.mark.parametrize("name,view,np_view", NON_CONTIGUOUS_VIEWS, ids=[v[0] for v in NON_CONTIGUOUS_VIEWS])
@pytest.mark.parametrize("device", COMPUTE)
def test_views_that_are_not_one_run_of_bytes_copy_to_a_device(
    tmp_path: Path, name: str, view: Callable[[Any], Any], np_view: Callable[[np.ndarray], np.ndarray], device: str
) -> None:
    fn = tmp_path / "nc.bin"
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr.tofile(fn)
    t = Tensor.empty(3, 4, dtype=dtypes.float32, device=disk_name(fn))
    exact(view(t).to(device), np.ascontiguousarray(np_view(arr)))


def test_views_disk_cannot_hand_out_raise_and_say_what_to_do(tmp_path: Path) -> None:
    fn = tmp_path / "nc.bin"
    np.arange(12, dtype=np.float32).tofile(fn)
    before = fn.read_bytes()
    t = Tensor.empty(3, 4, dtype=dtypes.float32, device=disk_name(fn))
    with pytest.raises(ValueError, match=r"contiguous.*Copy it to a compute device first, e\.g\. t\.to\('PYTHON'\)"):
        t[:, 1].numpy()
    with pytest.raises(ValueError, match="assign to a view"):
        t[:, 1] = 0
    with pytest.raises(ValueError, match="assign to a view"):
        t.T.assign(Tensor.zeros(4, 3))
    with pytest.raises(ValueError, match="bitcast a view"):
        t[:, 1:3].bitcast(dtypes.uint8)
    with pytest.raises(IndexError, match="indexing with lists or tensors needs one"):
        t[[0, 2]] = 1
    with pytest.raises(IndexError, match="indexing with lists or tensors needs one"):
        t[0, [1, 3]].to("PYTHON")
    with pytest.raises(ValueError, match="cannot draw random numbers"):
        Tensor.rand(3, device=t.device)
    with pytest.raises(ValueError, match="same shape and dtype"):
        t.assign(Tensor.zeros(4, 3))
    with pytest.raises(ValueError, match="broadcast"):
        t[0] = Tensor.zeros(3)
    assert fn.read_bytes() == before  # nothing was written


@pytest.mark.parametrize(
    "compute",
    [
        lambda t: t + 1,
        lambda t: t.sum(),
        lambda t: t.cast(dtypes.int32),
        lambda t: t.exp()[1:2],
        lambda t: t.max(axis=0),
    ],
    ids=["add", "sum", "cast", "exp_slice", "max"],
)
def test_arithmetic_on_disk_raises_and_says_to_copy_first(tmp_path: Path, compute: Callable[[Any], Any]) -> None:
    fn = tmp_path / "a.bin"
    np.arange(12, dtype=np.float32).tofile(fn)
    t = Tensor.empty(3, 4, dtype=dtypes.float32, device=disk_name(fn))
    with pytest.raises(RuntimeError, match="only holds data and runs no kernels.*copy the data to a compute device"):
        compute(t).numpy()
    with pytest.raises(RuntimeError, match="runs no kernels"):
        compute(t).to("PYTHON").realize()
    on_device = compute(t.to("PYTHON")).numpy()  # the same computation, after a copy, works
    np.testing.assert_array_equal(on_device, compute(Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))).numpy())


def test_constants_cannot_live_on_disk(tmp_path: Path) -> None:
    name = disk_name(tmp_path / "c.bin")
    with pytest.raises(ValueError, match="cannot hold a constant"):
        Tensor.zeros(3, device=name).numpy()
    with pytest.raises(RuntimeError, match="runs no kernels"):
        Tensor.full((2,), 3.0, device=name).realize()
    assert not (tmp_path / "c.bin").exists()
    exact(Tensor.ones(3, device=name).to("PYTHON"), np.ones(3, np.float32))  # a constant moves as a constant


# ***** bad files *****


def test_reading_a_missing_or_short_file_raises(tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError, match="no such file"):
        Tensor.empty(4, device=disk_name(missing)).numpy()
    with pytest.raises(FileNotFoundError, match="no such file"):
        Tensor.empty(4, device=disk_name(missing)).to("PYTHON").realize()
    assert not missing.exists()  # reading made no file
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="the file has 10 bytes, but the tensor needs bytes 0..16"):
        Tensor.empty(4, dtype=dtypes.float32, device=disk_name(short)).numpy()
    exact(Tensor.empty(4, dtype=dtypes.float32, device=disk_name(short))[:2], np.zeros(2, np.float32))  # what fits
    with pytest.raises(IsADirectoryError, match="cannot read DISK:.*Is a directory"):
        Tensor.empty(4, device=disk_name(tmp_path)).numpy()
    with pytest.raises(FileNotFoundError, match="cannot create the file"):
        Tensor([1.0]).to(disk_name(tmp_path / "no" / "such" / "dir.bin")).realize()
    with pytest.raises(ValueError, match="names no file"):
        Tensor.empty(4, device="disk").numpy()


def test_a_file_cut_short_after_opening_raises_instead_of_crashing(tmp_path: Path) -> None:
    fn = tmp_path / "cut.bin"
    np.arange(16, dtype=np.float32).tofile(fn)
    t = Tensor.empty(16, dtype=dtypes.float32, device=disk_name(fn))
    exact(t, np.arange(16, dtype=np.float32))  # mapped
    os.truncate(fn, 8)  # another program shortens the file: the mapped pages past its end are gone
    with pytest.raises(ValueError, match="the file was cut to 8 bytes since it was opened"):
        t[4:8].numpy()
    exact(t[0:2], np.array([0.0, 1.0], np.float32))


def test_a_replaced_file_is_read_anew_by_new_tensors(tmp_path: Path) -> None:
    fn = tmp_path / "r.bin"
    np.arange(4, dtype=np.int32).tofile(fn)
    old = Tensor.empty(4, dtype=dtypes.int32, device=disk_name(fn))
    exact(old, np.arange(4, dtype=np.int32))
    tmp = tmp_path / "r.tmp"
    np.arange(10, 14, dtype=np.int32).tofile(tmp)
    os.replace(tmp, fn)  # as safe_save writes: a new file renamed over the old one
    exact(Tensor.empty(4, dtype=dtypes.int32, device=disk_name(fn)), np.arange(10, 14, dtype=np.int32))
    exact(old, np.arange(4, dtype=np.int32))  # a tensor that read the old file goes on reading it
    exact(old[1:3], np.arange(1, 3, dtype=np.int32))


def test_a_read_only_file_is_read_and_refuses_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = tmp_path / "ro.bin"
    np.arange(4, dtype=np.int16).tofile(fn)
    real_open = os.open

    def read_only_open(path: Any, flags: int, *args: Any) -> int:
        if os.fspath(path) == str(fn) and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", str(fn))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only_open)
    t = Tensor.empty(4, dtype=dtypes.int16, device=disk_name(fn))
    exact(t.to("PYTHON"), np.arange(4, dtype=np.int16))
    with pytest.raises(PermissionError, match=r"cannot write DISK:.*ro\.bin: Permission denied"):
        t[0] = 5
    assert np.fromfile(fn, np.int16).tolist() == [0, 1, 2, 3]


# ***** memory: opening maps, reading touches only what is asked *****


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _sparse_safetensors(fn: Path, big: int, small: np.ndarray) -> None:
    """A safetensors file of a `big`-byte uint8 tensor that is a hole (no disk blocks, reads as zeros), then `small`."""
    header = {
        "big": {"dtype": "U8", "shape": [big], "data_offsets": [0, big]},
        "small": {"dtype": "F32", "shape": list(small.shape), "data_offsets": [big, big + small.nbytes]},
    }
    text = json.dumps(header).encode()
    with open(fn, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.seek(8 + len(text) + big)
        f.write(small.tobytes())


def _open_and_copy_parts(fn: Path) -> tuple[Tensor, Tensor, np.ndarray]:
    tensors = safe_load(fn)
    on_device = tensors["small"].to("PYTHON").realize()
    tail = tensors["big"][-4096:].to("PYTHON").realize()
    raw = Tensor.empty(fn.stat().st_size, dtype=dtypes.uint8, device=disk_name(fn))
    return on_device, tail, raw[-16:].bitcast(dtypes.float32).numpy()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident set size from /proc")
def test_a_big_sparse_file_is_opened_without_reading_it(tmp_path: Path) -> None:
    small = np.array([[1.0, -2.0], [3.5, 4.25]], np.float32)
    _sparse_safetensors(tmp_path / "warm.safetensors", 1 << 16, small)
    _open_and_copy_parts(tmp_path / "warm.safetensors")  # the same work on a small file first: imports, kernels, caches
    big = 512 << 20
    fn = tmp_path / "big.safetensors"
    _sparse_safetensors(fn, big, small)
    gc.collect()
    before = _rss_bytes()
    on_device, tail, last = _open_and_copy_parts(fn)
    grown = _rss_bytes() - before
    assert grown < 16 << 20, f"opening a {big >> 20} MB file grew the resident set by {grown >> 20} MB"
    exact(on_device, small)
    exact(tail, np.zeros(4096, np.uint8))
    np.testing.assert_array_equal(last, small.reshape(-1))


def test_the_mapping_goes_with_the_last_tensor_over_it(tmp_path: Path) -> None:
    fn = tmp_path / "m.bin"
    Tensor(np.arange(4, dtype=np.int32)).to(disk_name(fn)).realize()
    t = Tensor.empty(4, dtype=dtypes.int32, device=disk_name(fn))
    exact(t[1:3], np.array([1, 2], np.int32))
    allocator = Device[f"DISK:{fn}"].allocator
    assert isinstance(allocator, disk.DiskAllocator) and allocator._current is not None
    assert allocator._current() is not None
    del t
    gc.collect()
    assert allocator._current() is None  # unmapped: no tensor uses the file any more
