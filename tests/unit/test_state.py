"""tgcore.nn.state: safetensors files, state dicts, and PyTorch checkpoints read without torch.

PyTorch checkpoints are built here without torch (a small pickle writer that emits torch's globals and persistent
ids); where torch is installed, the same checks also run on files that torch itself wrote.
"""

from __future__ import annotations

import collections
import inspect
import io
import json
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import pytest

import tgcore.nn.state as nn_state
from tgcore import Tensor, dtypes
from tgcore.dtype import DType
from tgcore.nn import BatchNorm2d, Embedding, Linear
from tgcore.nn.state import (
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    torch_load,
)

# ***** safetensors *****

ALL_DTYPES: list[tuple[DType, np.ndarray]] = [
    (dtypes.bool, np.array([True, False, True])),
    (dtypes.int8, np.array([-128, 0, 127], np.int8)),
    (dtypes.uint8, np.array([0, 7, 255], np.uint8)),
    (dtypes.int16, np.array([[-32768, 5], [6, 32767]], np.int16)),
    (dtypes.uint16, np.array([0, 65535], np.uint16)),
    (dtypes.int32, np.array([-(2**31), 2**31 - 1], np.int32)),
    (dtypes.uint32, np.array([0, 2**32 - 1], np.uint32)),
    (dtypes.int64, np.array([-(2**63), 2**63 - 1], np.int64)),
    (dtypes.uint64, np.array([0, 2**64 - 1], np.uint64)),
    (dtypes.float16, np.array([1.5, -65504.0, 0.0], np.float16)),
    (dtypes.bfloat16, np.array([1.5, -2.25, 3.0e38], np.float32)),
    (dtypes.float32, np.arange(12, dtype=np.float32).reshape(2, 3, 2)),
    (dtypes.float64, np.array([np.pi, -np.e], np.float64)),
]


def _tensor(dt: DType, arr: np.ndarray) -> Tensor:
    return Tensor(arr, dtype=dt)


def _raw_safetensors(header: dict[str, Any], data: bytes, header_len: Optional[int] = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if header_len is None else header_len) + text + data


def test_safe_save_load_round_trip_every_dtype(tmp_path: Path) -> None:
    tensors = {f"t{i}_{dt.short_name}": _tensor(dt, arr) for i, (dt, arr) in enumerate(ALL_DTYPES)}
    tensors["empty"] = Tensor.zeros(0, 3)
    tensors["scalar"] = Tensor(2.5)
    fn = tmp_path / "model.safetensors"
    safe_save(tensors, str(fn), metadata={"format": "pt"})
    loaded = safe_load(str(fn))
    assert list(loaded) == list(tensors)
    for k, t in tensors.items():
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape, k
        np.testing.assert_array_equal(loaded[k].numpy(), t.numpy(), err_msg=k)
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert fn.stat().st_mode & 0o777 == 0o666 & ~umask  # the mode of any new file, not the temporary file's 0o600


def test_safe_save_writes_the_safetensors_layout(tmp_path: Path) -> None:
    fn = tmp_path / "x.safetensors"
    safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([[7]], dtype=dtypes.int16)}, fn, metadata={"k": "v"})
    raw = fn.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0  # the data section starts aligned
    header = json.loads(raw[8 : 8 + n])
    assert header == {
        "__metadata__": {"k": "v"},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I16", "shape": [1, 1], "data_offsets": [8, 10]},
    }
    assert raw[8 + n :] == struct.pack("<2f", 1.0, 2.0) + struct.pack("<h", 7)


def test_safe_load_reads_a_file_written_by_hand(tmp_path: Path) -> None:
    data = struct.pack("<4e", 1, 2, 3, 4) + struct.pack("<2H", 0x3FC0, 0xC010)  # f16 then bf16 (1.5, -2.25)
    header = {
        "__metadata__": {"source": "by hand"},
        "bf": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]},
        "h": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},
    }
    fn = tmp_path / "hand.safetensors"
    fn.write_bytes(_raw_safetensors(header, data))
    loaded = safe_load(fn)
    assert list(loaded) == ["bf", "h"]
    np.testing.assert_array_equal(loaded["h"].numpy(), [[1, 2], [3, 4]])
    assert loaded["bf"].dtype == dtypes.bfloat16
    np.testing.assert_array_equal(loaded["bf"].numpy(), [1.5, -2.25])
    t, json_len, meta = safe_load_metadata(str(fn))
    assert json_len == len(json.dumps(header)) and meta == header
    assert t.dtype == dtypes.uint8 and t.shape == (8 + json_len + len(data),)
    # a tensor of the file's bytes works in place of the path
    assert safe_load(t)["h"].numpy().tolist() == [[1, 2], [3, 4]]


def test_bfloat16_loads_as_float32_where_the_device_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = tmp_path / "bf.safetensors"
    header = {"bf": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}
    fn.write_bytes(_raw_safetensors(header, struct.pack("<3H", 0x3FC0, 0xC010, 0x7F80)))
    monkeypatch.setattr(nn_state, "_default_device_has", lambda dt: False)
    t = safe_load(fn)["bf"]
    assert t.dtype == dtypes.float32
    np.testing.assert_array_equal(t.numpy(), [1.5, -2.25, np.inf])


def test_safe_load_gives_disk_views_that_read_the_file_when_used(tmp_path: Path) -> None:
    fn = tmp_path / "lazy.safetensors"
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[7, -8]], np.int16)
    safe_save({"a": Tensor(a), "b": Tensor(b)}, fn)
    loaded = safe_load(fn)
    for name, want in (("a", a), ("b", b)):
        t = loaded[name]
        assert t.device == f"DISK:{fn}" and t.shape == want.shape, name
    raw, json_len, _ = safe_load_metadata(fn)
    assert raw.device == f"DISK:{fn}" and raw.shape == (fn.stat().st_size,)
    # the data changes in the file after loading: the tensors read it when used, not at safe_load
    mm = np.memmap(fn, np.float32, "r+", offset=8 + json_len, shape=(6,))
    mm[:] = -mm
    mm.flush()
    for device in ("PYTHON", "PYTHON:1"):
        got = loaded["a"].to(device)
        assert got.device == device
        np.testing.assert_array_equal(got.numpy(), -a)
    np.testing.assert_array_equal(loaded["b"].numpy(), b)
    np.testing.assert_array_equal(loaded["a"][1].numpy(), -a[1])


def test_safe_load_of_a_file_inside_a_bigger_file(tmp_path: Path) -> None:
    inner = tmp_path / "inner.safetensors"
    safe_save({"w": Tensor(np.arange(5, dtype=np.int64))}, inner)
    outer = tmp_path / "outer.bin"
    outer.write_bytes(b"prefix!" + inner.read_bytes() + b"suffix")
    data = Tensor.empty(outer.stat().st_size, dtype=dtypes.uint8, device=f"disk:{outer}")
    view = data[7 : 7 + inner.stat().st_size]  # a DISK tensor at byte 7 of another file
    loaded = safe_load(view)
    assert loaded["w"].device == f"DISK:{outer}"
    np.testing.assert_array_equal(loaded["w"].numpy(), np.arange(5))


def test_safe_save_over_a_loaded_file(tmp_path: Path) -> None:
    fn = tmp_path / "ckpt.safetensors"
    safe_save({"w": Tensor([1.0, 2.0]), "b": Tensor([3.0])}, fn)
    old = safe_load(fn)
    safe_save({"w": old["w"].to("PYTHON") * 10, "b": old["b"]}, fn)  # reads the old file while writing the new one
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"]
    new = safe_load(fn)
    np.testing.assert_array_equal(new["w"].numpy(), [10.0, 20.0])
    np.testing.assert_array_equal(new["b"].numpy(), [3.0])
    np.testing.assert_array_equal(old["w"].numpy(), [1.0, 2.0])  # a loaded tensor keeps the file it was loaded from


def test_safe_load_of_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safe_load(tmp_path / "missing.safetensors")
    assert not (tmp_path / "missing.safetensors").exists()


BAD_HEADERS = [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, b"\0" * 8, "begin <= end <="),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "needs 12"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-4, 4]}}, b"\0" * 8, "begin <= end <="),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "non-negative"),
    ({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "data_offsets"),
    (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        b"\0" * 12,
        "overlap",
    ),
    ([1, 2], b"", "not an object"),
]


@pytest.mark.parametrize("header,data,message", BAD_HEADERS)
def test_safe_load_rejects_bad_headers(tmp_path: Path, header: Any, data: bytes, message: str) -> None:
    fn = tmp_path / "bad.safetensors"
    fn.write_bytes(_raw_safetensors(header, data))
    with pytest.raises(ValueError, match=message):
        safe_load(fn)


def test_safe_load_rejects_bad_lengths(tmp_path: Path) -> None:
    fn = tmp_path / "bad.safetensors"
    fn.write_bytes(b"\1\2\3")
    with pytest.raises(ValueError, match="fewer than the 8-byte"):
        safe_load(fn)
    fn.write_bytes(_raw_safetensors({}, b"", header_len=1 << 40))
    with pytest.raises(ValueError, match="header claims"):
        safe_load(fn)
    fn.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        safe_load_metadata(fn)


def test_safe_save_failure_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = tmp_path / "w.safetensors"
    safe_save({"a": Tensor([1.0])}, fn)
    before = fn.read_bytes()

    def explode(t: Tensor) -> bytes:
        raise OSError("disk full")

    monkeypatch.setattr(nn_state, "_tensor_to_file_bytes", explode)
    with pytest.raises(OSError, match="disk full"):
        safe_save({"a": Tensor([2.0]), "b": Tensor([3.0])}, fn)
    assert fn.read_bytes() == before and os.listdir(tmp_path) == ["w.safetensors"]
    with pytest.raises(ValueError, match="__metadata__"):
        safe_save({"__metadata__": Tensor([1.0])}, fn)
    with pytest.raises(TypeError, match="needs Tensors"):
        safe_save({"a": np.zeros(2)}, fn)  # type: ignore[dict-item]


# ***** state dicts *****


class Point(NamedTuple):
    x: Tensor
    y: int


class Block:
    def __init__(self) -> None:
        self.lin = Linear(3, 2)
        self.norm = BatchNorm2d(2)
        self.name = "block"


class Net:
    def __init__(self) -> None:
        self.blocks = [Block(), Block()]
        self.heads = {"cls": Linear(2, 4, bias=False)}
        self.extra = collections.OrderedDict(scale=Tensor([1.0]))
        self.point = Point(Tensor([0.0]), 3)
        self.emb = Embedding(5, 2)
        self.me = self  # a cycle must not loop forever
        self.module = np  # modules are not walked


NET_KEYS = [
    "blocks.0.lin.weight",
    "blocks.0.lin.bias",
    "blocks.0.norm.weight",
    "blocks.0.norm.bias",
    "blocks.0.norm.running_mean",
    "blocks.0.norm.running_var",
    "blocks.0.norm.num_batches_tracked",
    "blocks.1.lin.weight",
    "blocks.1.lin.bias",
    "blocks.1.norm.weight",
    "blocks.1.norm.bias",
    "blocks.1.norm.running_mean",
    "blocks.1.norm.running_var",
    "blocks.1.norm.num_batches_tracked",
    "heads.cls.weight",
    "extra.scale",
    "point.x",
    "emb.weight",
]


def test_get_state_dict_keys_and_parameters() -> None:
    net = Net()
    net.emb(Tensor([[1, 2]])).realize()  # using a layer must not add tensors to its state
    sd = get_state_dict(net)
    assert list(sd) == NET_KEYS
    assert sd["blocks.1.lin.weight"] is net.blocks[1].lin.weight
    assert get_parameters(net) == list(sd.values())
    assert list(get_state_dict([Tensor([1.0]), {"a": Tensor([2.0])}], prefix="p.")) == ["p.0", "p.1.a"]
    t = Tensor([1.0])
    assert list(get_state_dict(t, prefix="w.").items()) == [("w", t)]


def test_load_state_dict_round_trip_through_safetensors(tmp_path: Path) -> None:
    src, dst = Net(), Net()
    fn = tmp_path / "net.safetensors"
    safe_save(get_state_dict(src), fn)
    loaded = safe_load(fn)
    assert all(t.device == f"DISK:{fn}" for t in loaded.values())
    load_state_dict(dst, loaded, verbose=False)  # copied from the file to the model's devices
    assert all(t.device == "PYTHON" for t in get_state_dict(dst).values())
    for (k, a), b in zip(get_state_dict(src).items(), get_state_dict(dst).values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)


def test_load_state_dict_errors_leave_the_model_unchanged() -> None:
    model = Block()
    before = {k: v.numpy() for k, v in get_state_dict(model).items()}
    good = {k: Tensor(np.full(v.shape, 7, np.float32)) for k, v in before.items()}
    missing = {k: v for k, v in good.items() if k != "lin.bias"}
    with pytest.raises(KeyError, match="lin.bias"):
        load_state_dict(model, missing, verbose=False)
    wrong_shape = {**good, "lin.weight": Tensor.zeros(3, 2)}
    with pytest.raises(ValueError, match=r"lin.weight: the state dict has shape \(3, 2\), the model \(2, 3\)"):
        load_state_dict(model, wrong_shape, verbose=False)
    with pytest.raises(ValueError, match="expected a Tensor"):
        load_state_dict(model, {**good, "lin.bias": np.zeros(2)}, verbose=False)  # type: ignore[dict-item]
    for k, v in get_state_dict(model).items():
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
    # non-strict: missing keys keep their values; unexpected keys are ignored
    load_state_dict(model, {**missing, "unused": Tensor([1.0])}, strict=False, verbose=False)
    assert model.lin.bias is not None
    np.testing.assert_array_equal(model.lin.bias.numpy(), before["lin.bias"])
    np.testing.assert_array_equal(model.lin.weight.numpy(), np.full((2, 3), 7))


def test_load_state_dict_consume_and_scalar_counters() -> None:
    model = BatchNorm2d(3)
    sd = {k: Tensor(np.ones(v.shape, np.float32)) for k, v in get_state_dict(model).items()}
    sd["num_batches_tracked"] = Tensor(np.array(5, np.int64))  # PyTorch stores this counter as a 0-d int64
    load_state_dict(model, sd, consume=True, verbose=False)
    assert sd == {}
    assert model.num_batches_tracked.shape == (1,) and model.num_batches_tracked.numpy().tolist() == [5]


# ***** PyTorch checkpoints, written without torch *****


@dataclass(frozen=True)
class Global:
    """A global reference (module.name) in the pickle, as torch writes it."""

    module: str
    name: str

    def __call__(self) -> None:
        raise AssertionError("only a marker")


@dataclass(frozen=True)
class Call:
    """func(*args) in the pickle (REDUCE)."""

    func: Global
    args: tuple


class TorchLikePickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes Global and Call markers as GLOBAL and REDUCE opcodes, and storage references as persistent ids."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, StorageRef) else None

    def save_global_marker(self, obj: Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def save_call(self, obj: Call) -> None:
        self.save(obj.func)
        self.save(obj.args)
        self.write(pickle.REDUCE)

    dispatch[Global] = save_global_marker
    dispatch[Call] = save_call


@dataclass(frozen=True)
class StorageRef:
    pid: tuple


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    TorchLikePickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


STORAGE_NAMES = {
    np.dtype(np.float32): "FloatStorage",
    np.dtype(np.float64): "DoubleStorage",
    np.dtype(np.float16): "HalfStorage",
    np.dtype(np.int64): "LongStorage",
    np.dtype(np.int32): "IntStorage",
    np.dtype(np.int16): "ShortStorage",
    np.dtype(np.int8): "CharStorage",
    np.dtype(np.uint8): "ByteStorage",
    np.dtype(np.bool_): "BoolStorage",
}


class CheckpointWriter:
    """Builds the object graph of a torch.save call: tensors become _rebuild_tensor_v2 calls on storages."""

    def __init__(self, legacy: bool = False, big_endian: bool = False) -> None:
        self.legacy, self.order = legacy, ">" if big_endian else "<"
        self.storages: dict[str, tuple[str, bytes, int]] = {}  # key -> (storage name, bytes, numel)

    def storage(self, flat: np.ndarray, name: Optional[str] = None) -> StorageRef:
        key = str(len(self.storages))
        name = name or STORAGE_NAMES[flat.dtype]
        self.storages[key] = (name, flat.astype(flat.dtype.newbyteorder(self.order)).tobytes(), flat.size)
        pid = ("storage", Global("torch", name), key, "cpu", flat.size) + ((None,) if self.legacy else ())
        return StorageRef(pid)

    def tensor(self, storage: StorageRef, offset: int, size: tuple, stride: tuple) -> Call:
        hooks = Call(Global("collections", "OrderedDict"), ())
        return Call(Global("torch._utils", "_rebuild_tensor_v2"), (storage, offset, size, stride, False, hooks))

    def array(self, arr: np.ndarray) -> Call:
        """A contiguous tensor holding arr."""
        return self.tensor(self.storage(arr.reshape(-1)), 0, arr.shape, tuple(s // arr.itemsize for s in arr.strides))

    def save(self, obj: Any, path: Path) -> None:
        if self.legacy:
            keys = list(self.storages)
            parts = [
                pickle.dumps(0x1950A86A20F9469CFC6C, 2),
                pickle.dumps(1001, 2),
                pickle.dumps({"little_endian": self.order == "<"}, 2),
                dumps(obj),
                pickle.dumps(keys, 2),
            ]
            for k in keys:
                _, raw, numel = self.storages[k]
                parts += [struct.pack(f"{self.order}q", numel), raw]
            path.write_bytes(b"".join(parts))
        else:
            with zipfile.ZipFile(path, "w") as zf:
                zf.writestr("ckpt/data.pkl", dumps(obj))
                zf.writestr("ckpt/byteorder", "little" if self.order == "<" else "big")
                for k, (_, raw, _) in self.storages.items():
                    zf.writestr(f"ckpt/data/{k}", raw)
                zf.writestr("ckpt/version", "3\n")


def _reference_checkpoint(w: CheckpointWriter) -> tuple[Any, dict[str, np.ndarray]]:
    """A checkpoint with the layouts torch writes: contiguous, permuted, sliced and shared storages, every dtype."""
    base = np.arange(24, dtype=np.float32)
    shared = w.storage(base)
    want = {
        "conv.weight": np.linspace(-1, 1, 54, dtype=np.float32).reshape(3, 2, 3, 3),
        "half": np.array([1.5, -2.0], np.float16),
        "double": np.array([[np.pi]], np.float64),
        "long": np.array([-(2**40), 3], np.int64),
        "int": np.array([7], np.int32),
        "short": np.array([-3], np.int16),
        "char": np.array([-128, 127], np.int8),
        "byte": np.array([255], np.uint8),
        "bool": np.array([True, False]),
        "counter": np.array(12, np.int64),
    }
    obj: dict[str, Any] = {k: w.array(v) for k, v in want.items()}
    # a (4, 2, 3) permutation of a (2, 3, 4) tensor, a strided slice at an offset, and an expanded view
    obj["permuted"] = w.tensor(shared, 0, (4, 2, 3), (1, 12, 4))
    want["permuted"] = base.reshape(2, 3, 4).transpose(2, 0, 1)
    obj["sliced"] = w.tensor(shared, 5, (3, 2), (6, 2))
    want["sliced"] = base[5:].copy()[np.arange(3)[:, None] * 6 + np.arange(2)[None, :] * 2]
    obj["expanded"] = w.tensor(shared, 2, (2, 3), (0, 1))
    want["expanded"] = np.broadcast_to(base[2:5], (2, 3))
    bf16 = w.storage(np.array([0x3FC0, 0xC010], np.uint16), name="BFloat16Storage")
    obj["bf16"] = w.tensor(bf16, 0, (2,), (1,))
    want["bf16"] = np.array([1.5, -2.25], np.float32)
    no_hooks = Call(Global("collections", "OrderedDict"), ())
    obj["param"] = Call(Global("torch._utils", "_rebuild_parameter"), (w.array(np.ones(2, np.float32)), True, no_hooks))
    want["param"] = np.ones(2, np.float32)
    top = {
        "state_dict": Call(Global("collections", "OrderedDict"), ([[k, v] for k, v in obj.items()],)),
        "epoch": 3,
        "history": [1.5, (2, "x")],
    }
    return top, want


@pytest.mark.parametrize("big_endian", [False, True], ids=["little", "big"])
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_load_without_torch(tmp_path: Path, legacy: bool, big_endian: bool) -> None:
    w = CheckpointWriter(legacy, big_endian)
    obj, want = _reference_checkpoint(w)
    fn = tmp_path / "ckpt.pt"
    w.save(obj, fn)
    got = torch_load(fn)
    assert got["epoch"] == 3 and got["history"] == [1.5, (2, "x")]
    sd = got["state_dict"]
    assert isinstance(sd, collections.OrderedDict) and list(sd) == list(want)
    for k, v in want.items():
        assert sd[k].shape == v.shape, k
        np.testing.assert_array_equal(sd[k].numpy(), v, err_msg=k)
    assert sd["bf16"].dtype == dtypes.bfloat16 and sd["long"].dtype == dtypes.int64 and sd["bool"].dtype == dtypes.bool


def _malicious(tmp_path: Path, func: Global, args: tuple, legacy: bool = False) -> Path:
    w = CheckpointWriter(legacy)
    fn = tmp_path / "evil.pt"
    w.save({"weight": w.array(np.ones(2, np.float32)), "payload": Call(func, args)}, fn)
    return fn


@pytest.mark.parametrize(
    "func",
    [
        Global("os", "system"),
        Global("builtins", "eval"),
        Global("torch.storage", "_load_from_bytes"),
        Global("torch.nn.modules.linear", "Linear"),
        Global("numpy.core.multiarray", "_reconstruct"),
    ],
)
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_load_refuses_globals_off_the_allow_list(tmp_path: Path, func: Global, legacy: bool) -> None:
    marker = tmp_path / "pwned"
    fn = _malicious(tmp_path, func, (f"touch {marker}",), legacy)
    with pytest.raises(pickle.UnpicklingError, match=f"'{func.module}.{func.name}'.*allow-list"):
        torch_load(fn)
    assert not marker.exists()


def test_torch_load_checks_layouts_and_data(tmp_path: Path) -> None:
    fn = tmp_path / "bad.pt"
    w = CheckpointWriter()
    st = w.storage(np.zeros(6, np.float32))
    w.save({"x": w.tensor(st, 2, (2, 3), (3, 1))}, fn)  # reads element 7 of 6
    with pytest.raises(ValueError, match="reads element 7 of storage '0', which has 6"):
        torch_load(fn)
    w = CheckpointWriter()
    w.save({"x": w.tensor(w.storage(np.zeros(4, np.float32)), -1, (2,), (1,))}, fn)
    with pytest.raises(ValueError, match="negative tensor layout"):
        torch_load(fn)
    w = CheckpointWriter()
    ref = w.storage(np.zeros(4, np.float32))
    w.storages["0"] = ("FloatStorage", b"\0" * 8, 4)  # the data is shorter than the storage
    w.save({"x": w.tensor(ref, 0, (4,), (1,))}, fn)
    with pytest.raises(ValueError, match="has 8 bytes, but 4 elements"):
        torch_load(fn)
    w = CheckpointWriter()
    ref = w.storage(np.arange(2, dtype=np.float32))
    w.storages["0"] = ("FloatStorage", np.arange(2, dtype=np.float32).tobytes() + b"\0" * 4096, 2)  # longer: fine
    w.save({"x": w.tensor(ref, 0, (2,), (1,))}, fn)
    assert torch_load(fn)["x"].numpy().tolist() == [0.0, 1.0]
    w = CheckpointWriter()
    w.save({"x": Call(Global("torch._utils", "_rebuild_tensor_v2"), ("not a storage", 0, (1,), (1,)))}, fn)
    with pytest.raises(ValueError, match="not a storage"):
        torch_load(fn)
    fn.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        torch_load(fn)
    w = CheckpointWriter(legacy=True)
    w.save({"x": w.array(np.ones(4, np.float32))}, fn)
    fn.write_bytes(fn.read_bytes()[:-3])  # truncated inside the data
    with pytest.raises(ValueError, match="ends inside storage '0'"):
        torch_load(fn)


# ***** the same, on files written by torch itself *****


def test_torch_load_reads_files_written_by_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    sd: dict[str, Any] = dict(torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3)).state_dict())
    sd["permuted"] = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).permute(2, 0, 1)
    sd["sliced"] = torch.arange(30, dtype=torch.int16).reshape(5, 6)[1:4:2, ::3]
    sd["expanded"] = torch.arange(3, dtype=torch.float64).expand(2, 3)
    sd["bf16"] = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    sd["half"] = torch.tensor([0.5], dtype=torch.float16)
    sd["small_ints"] = [torch.tensor([-1], dtype=torch.int8), torch.tensor([200], dtype=torch.uint8)]
    sd["bool"] = torch.tensor([True, False])
    sd["param"] = torch.nn.Parameter(torch.ones(2))
    for legacy in (False, True):
        fn = tmp_path / f"torch_{legacy}.pt"
        torch.save(sd, fn, _use_new_zipfile_serialization=not legacy)
        got = torch_load(fn)
        assert list(got) == list(sd)
        pairs = [(k, got[k], v) for k, v in sd.items() if k != "small_ints"]
        pairs += [("small_ints", a, b) for a, b in zip(got["small_ints"], sd["small_ints"])]
        for k, g, v in pairs:
            want = v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
            assert g.shape == tuple(v.shape), k
            np.testing.assert_array_equal(g.numpy(), want, err_msg=k)


def test_torch_load_refuses_a_pickled_module_written_by_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    fn = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), fn)
    with pytest.raises(pickle.UnpicklingError, match="'torch.nn.modules.linear.Linear'"):
        torch_load(fn)


STATE_SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "safe_load": [("fn", None)],
    "safe_load_metadata": [("fn", None)],
    "safe_save": [("tensors", None), ("fn", None), ("metadata", None)],
    "get_state_dict": [("obj", None), ("prefix", ""), ("tensor_type", Tensor)],
    "get_parameters": [("obj", None)],
    "load_state_dict": [("model", None), ("state_dict", None), ("strict", True), ("verbose", True), ("consume", False)],
    "torch_load": [("fn", None)],
}


@pytest.mark.parametrize("name", sorted(STATE_SIGNATURES))
def test_signatures_match_tinygrad(name: str) -> None:
    params = list(inspect.signature(getattr(nn_state, name)).parameters.values())
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == STATE_SIGNATURES[name]


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_load_state_dict_from_safetensors_into_a_sharded_model(tmp_path: Path, axis: Optional[int]) -> None:
    from tgcore.multi import MultiLazyBuffer

    devices = ("PYTHON", "PYTHON:1")
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    fn = tmp_path / "lin.safetensors"
    safe_save({"weight": Tensor(weight), "bias": Tensor([1.0, 2.0, 3.0, 4.0])}, fn)
    model = Linear(3, 4)
    model.weight.shard_(devices, axis=axis)  # axis 1 shards columns: views of the file that are not one run of bytes
    assert model.bias is not None
    load_state_dict(model, safe_load(fn), verbose=False)
    assert isinstance(model.weight.lazydata, MultiLazyBuffer) and model.weight.device == devices
    np.testing.assert_array_equal(model.weight.numpy(), weight)
    np.testing.assert_array_equal(model.bias.numpy(), [1, 2, 3, 4])
    assert model.bias.device == "PYTHON"


@pytest.mark.parametrize("axis", [None, 0])
def test_load_state_dict_into_a_sharded_model(axis: Optional[int]) -> None:
    from tgcore.multi import MultiLazyBuffer

    devices = ("PYTHON", "PYTHON:1")
    model = Linear(3, 4)
    model.weight.shard_(devices, axis=axis)
    assert model.bias is not None
    model.bias.shard_(devices)
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    load_state_dict(model, {"weight": Tensor(weight), "bias": Tensor([1.0, 2.0, 3.0, 4.0])}, verbose=False)
    assert isinstance(model.weight.lazydata, MultiLazyBuffer) and model.weight.lazydata.axis == axis
    assert model.weight.device == devices
    np.testing.assert_array_equal(model.weight.numpy(), weight)
    x = Tensor.ones(1, 3).shard(devices)
    np.testing.assert_array_equal(model(x).numpy(), [weight.sum(1) + [1, 2, 3, 4]])
