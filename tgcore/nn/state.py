"""Model state: state dicts, safetensors files and PyTorch checkpoints.

Loading never runs code from a file: safetensors headers are parsed as JSON with every offset checked, and
PyTorch checkpoints are unpickled through an allow-list that can only rebuild tensors and containers.
safe_load gives DISK tensors (views of the memory-mapped file, read when used); torch_load reads the checkpoint into
tensors on the default device. load_state_dict copies each tensor to the device of the model's tensor.
bfloat16 data loads as float32 where the default device has no bfloat16.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import tarfile
import tempfile
import types
import zipfile
from dataclasses import dataclass
from typing import IO, Any, Optional, Union, cast

import numpy as np
from tqdm import tqdm

from tgcore.device import Device
from tgcore.dtype import DType, dtypes
from tgcore.helpers import CI, DEBUG, GlobalCounters, Timing, all_int, prod
from tgcore.multi import MultiLazyBuffer
from tgcore.tensor import Tensor

__all__ = [
    "safe_load",
    "safe_save",
    "safe_load_metadata",
    "get_state_dict",
    "get_parameters",
    "load_state_dict",
    "torch_load",
    "safe_dtypes",
    "inverse_safe_dtypes",
]

PathLike = Union[str, "os.PathLike[str]"]

# ***** raw bytes <-> numpy, for every dtype a file can hold *****


def _file_np_dtype(dt: DType) -> np.dtype:
    """The little-endian numpy dtype of `dt`'s bytes in a file (bfloat16 as its raw 16 bits, bool as bytes)."""
    if dt == dtypes.bfloat16:
        return np.dtype("<u2")
    if dt == dtypes.bool:
        return np.dtype(np.uint8)
    return np.dtype(dt.np).newbyteorder("<")


def _default_device_has(dt: DType) -> bool:
    return dt in Device[Device.DEFAULT].spec.dtypes


def _tensor_from_file_array(arr: np.ndarray, dt: DType) -> Tensor:
    """A tensor of dtype `dt` from an array of its file representation (see _file_np_dtype), copied.

    bfloat16 becomes float32 (exactly) on a default device that has no bfloat16, so that the weights can be used.
    """
    if dt == dtypes.bool:
        return Tensor(arr != 0)
    native = arr.astype(arr.dtype.newbyteorder("="), copy=True)
    if dt != dtypes.bfloat16:
        return Tensor(native)
    if _default_device_has(dtypes.bfloat16):
        return Tensor(native).bitcast(dt)
    return Tensor((native.astype(np.uint32) << 16).view(np.float32))


def _tensor_to_file_bytes(t: Tensor) -> bytes:
    """The little-endian bytes of a tensor's data, in row-major order."""
    t = t.detach()
    arr = t.bitcast(dtypes.uint16).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()
    return np.ascontiguousarray(arr, dtype=_file_np_dtype(t.dtype)).tobytes()


# ***** safetensors *****

safe_dtypes: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "I8": dtypes.int8,
    "U8": dtypes.uint8,
    "I16": dtypes.int16,
    "U16": dtypes.uint16,
    "I32": dtypes.int32,
    "U32": dtypes.uint32,
    "I64": dtypes.int64,
    "U64": dtypes.uint64,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
}
inverse_safe_dtypes: dict[DType, str] = {v: k for k, v in safe_dtypes.items()}


def _file_tensor(fn: Union[Tensor, PathLike]) -> tuple[Tensor, str]:
    """The bytes of a file as a 1-d uint8 DISK tensor (mapped, nothing read yet), or the given uint8 tensor; and a
    name for error messages."""
    if isinstance(fn, Tensor):
        if fn.dtype != dtypes.uint8 or fn.ndim != 1:
            raise ValueError(f"expected a 1-d uint8 tensor of a file's bytes, got {fn.dtype} of shape {fn.shape}")
        return fn, "the tensor"
    name = os.fspath(fn)
    size = os.path.getsize(name)  # (a missing file raises here, with its name)
    return Tensor.empty(size, dtype=dtypes.uint8, device=f"disk:{os.path.abspath(name)}"), repr(name)


def _read(data: Tensor, begin: int, end: int) -> bytes:
    """Bytes begin..end of a uint8 tensor (from a DISK tensor, only those bytes are read from the file)."""
    return data[begin:end].numpy().tobytes() if end > begin else b""


def _safetensors_header(data: Tensor, what: str) -> tuple[int, dict[str, Any]]:
    """(header length, header) of safetensors bytes, checking the length and that the header is a JSON object."""
    size = data.nbytes()
    if size < 8:
        raise ValueError(f"{what} is not a safetensors file: {size} bytes, fewer than the 8-byte header length")
    json_len = int.from_bytes(_read(data, 0, 8), "little")
    if json_len > size - 8:
        raise ValueError(
            f"{what} is not a valid safetensors file: its header claims {json_len} bytes but the file has only "
            f"{size - 8} after the length field (truncated or not a safetensors file)"
        )
    try:
        header = json.loads(_read(data, 8, 8 + json_len).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} is not a valid safetensors file: its header is not UTF-8 JSON ({e})") from e
    if not isinstance(header, dict):
        raise ValueError(
            f"{what} is not a valid safetensors file: its header is a {type(header).__name__}, not an object"
        )
    return json_len, header


def _safetensors_entries(header: dict[str, Any], data_len: int, what: str) -> list[tuple[str, DType, tuple, int, int]]:
    """(name, dtype, shape, begin, end) of each tensor in a header, with offsets checked against the data section."""
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        bad = f"{what}: tensor {name!r} has a bad header entry {info!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise ValueError(f"{bad}: expected an object with dtype, shape and data_offsets")
        if info["dtype"] not in safe_dtypes:
            raise ValueError(f"{bad}: unknown dtype, expected one of {sorted(safe_dtypes)}")
        shape, offsets = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise ValueError(f"{bad}: the shape must be a list of non-negative integers")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets):
            raise ValueError(f"{bad}: data_offsets must be [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise ValueError(f"{bad}: data_offsets must satisfy 0 <= begin <= end <= {data_len} (the data size)")
        dt = safe_dtypes[info["dtype"]]
        if end - begin != prod(shape) * dt.itemsize:
            raise ValueError(
                f"{bad}: it spans {end - begin} bytes but {info['dtype']} of shape {shape} needs "
                f"{prod(shape) * dt.itemsize}"
            )
        entries.append((name, dt, tuple(shape), begin, end))
    by_start = sorted((e for e in entries if e[4] > e[3]), key=lambda e: e[3])
    for prev, cur in zip(by_start, by_start[1:]):
        if cur[3] < prev[4]:
            raise ValueError(f"{what}: the data of tensors {prev[0]!r} and {cur[0]!r} overlap")
    return entries


def safe_load_metadata(fn: Union[Tensor, PathLike]) -> tuple[Tensor, int, Any]:
    """(the file's bytes as a uint8 tensor, the header length, the parsed JSON header) of a .safetensors file; for a
    path the tensor is on DISK, and only the header has been read."""
    data, what = _file_tensor(fn)
    json_len, header = _safetensors_header(data, what)
    return data, json_len, header


def _disk_entry(data: Tensor, dt: DType, shape: tuple, begin: int, end: int) -> Tensor:
    """One tensor of a safetensors file on DISK: a view of its bytes, read when it is used."""
    raw = data[begin:end]
    if dt == dtypes.bfloat16 and not _default_device_has(dtypes.bfloat16):
        # widened to float32 (exactly) on the default device, when first used: only this tensor's bytes are read
        bits = raw.bitcast(dtypes.uint16).to(Device.DEFAULT).cast(dtypes.uint32)
        return (bits << 16).bitcast(dtypes.float32).reshape(shape)
    return raw.bitcast(dt).reshape(shape)


def safe_load(fn: Union[Tensor, PathLike]) -> dict[str, Tensor]:
    """The tensors of a .safetensors file (a path, or its bytes as a uint8 tensor), by name, in file order.

    From a path (or a DISK tensor) each tensor is a DISK view of its bytes in one mapping of the file: nothing but the
    header is read until a tensor is used, so a file larger than memory can be opened and parts of it copied to a
    device (`safe_load(path)[name].to(device)` reads just that tensor). bool bytes are taken as stored, as in
    safetensors. From the bytes on another device the file is read once and each tensor copied.
    """
    data, what = _file_tensor(fn)
    json_len, header = _safetensors_header(data, what)
    start = 8 + json_len
    entries = _safetensors_entries(header, data.nbytes() - start, what)
    if isinstance(data.device, str) and Device.storage_only(data.device):
        return {name: _disk_entry(data, dt, shape, start + b, start + e) for name, dt, shape, b, e in entries}
    raw_bytes = data.numpy()  # bytes on a compute device: views of another item size need DISK, so copy each
    ret: dict[str, Tensor] = {}
    for name, dt, shape, begin, end in entries:
        raw = np.frombuffer(raw_bytes[start + begin : start + end], dtype=_file_np_dtype(dt)).reshape(shape)
        ret[name] = _tensor_from_file_array(raw, dt)
    return ret


def _new_file_mode() -> int:
    """The permissions open() gives a new file: 0o666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def safe_save(tensors: dict[str, Tensor], fn: PathLike, metadata: Optional[dict[str, Any]] = None) -> None:
    """Write tensors to a .safetensors file; written beside `fn` and renamed into place, so a failure leaves no
    half-written file."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor names must be strings other than '__metadata__', got {name!r}")
        if not isinstance(t, Tensor):
            raise TypeError(f"safe_save needs Tensors, got {type(t).__name__} for {name!r}")
        if t.dtype not in inverse_safe_dtypes:
            raise ValueError(
                f"{name!r} is {t.dtype}, which safetensors cannot hold; cast it to one of the dtypes in "
                "tgcore.nn.state.safe_dtypes"
            )
        if not all_int(t.shape):
            raise ValueError(f"{name!r} has a symbolic shape {t.shape}; only concrete shapes can be saved")
        header[name] = {
            "dtype": inverse_safe_dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes()],
        }
        offset += t.nbytes()
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text.encode("utf-8")) % 8) % 8)  # the data section starts 8-byte aligned
    encoded = text.encode("utf-8")
    path = os.fspath(fn)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        os.chmod(tmp, _new_file_mode())  # mkstemp makes the file private; give it the mode open() would
        with os.fdopen(fd, "wb") as f:
            f.write(len(encoded).to_bytes(8, "little"))
            f.write(encoded)
            for name, t in tensors.items():
                f.write(_tensor_to_file_bytes(t))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# ***** state dicts *****


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable from obj through attributes, lists, tuples and dicts, keyed by its path
    ("layers.0.weight")."""
    return _walk_state(obj, prefix, tensor_type, set())


def _walk_state(obj: Any, prefix: str, tensor_type: type, on_path: set[int]) -> dict[str, Tensor]:
    if isinstance(obj, tensor_type):
        return {prefix.strip("."): cast(Tensor, obj)}
    # modules and classes hold no model state; an object that contains itself would loop forever
    if isinstance(obj, (types.ModuleType, type)) or id(obj) in on_path:
        return {}
    if hasattr(obj, "_asdict"):  # namedtuple
        return _walk_state(obj._asdict(), prefix, tensor_type, on_path)
    if isinstance(obj, collections.OrderedDict):
        return _walk_state(dict(obj), prefix, tensor_type, on_path)
    if hasattr(obj, "__dict__"):
        obj_dict = obj.__dict__
        on_path.add(id(obj))
        try:
            return _walk_state(obj_dict, prefix, tensor_type, on_path) if isinstance(obj_dict, dict) else {}
        finally:
            on_path.discard(id(obj))
    state: dict[str, Tensor] = {}
    if isinstance(obj, (list, tuple, dict)):
        on_path.add(id(obj))
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            state.update(_walk_state(v, f"{prefix}{k}.", tensor_type, on_path))
        on_path.discard(id(obj))
    return state


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of get_state_dict(obj), in the same order."""
    return list(get_state_dict(obj).values())


def load_state_dict(
    model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = True, consume: bool = False
) -> None:
    """Replace the data of each tensor of `model` by the state_dict entry of the same key, moved to its device
    (or sharded over its devices, along the same axis, for a sharded tensor).

    Every key, type and shape is checked before any tensor changes: with strict, a key of the model missing from
    state_dict is an error (without it, that tensor is left as it is). Keys the model lacks are ignored, with a
    warning at DEBUG >= 1. A state_dict entry of shape () fits a tensor of shape (1,) and the other way round
    (PyTorch's BatchNorm num_batches_tracked). consume=True deletes each entry from state_dict once it is loaded.
    """
    model_state = get_state_dict(model)
    missing = [k for k in model_state if k not in state_dict]
    if strict and missing:
        raise KeyError(
            f"load_state_dict: {len(missing)} key(s) of the model are missing from the state dict: {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}; pass strict=False to leave those tensors as they are"
        )
    unexpected = sorted(state_dict.keys() - model_state.keys())
    if unexpected and DEBUG >= 1:
        print(f"WARNING: unused weights in state_dict {unexpected}")
    problems = []
    for k, v in model_state.items():
        if k not in state_dict:
            continue
        src = state_dict[k]
        if not isinstance(src, Tensor):
            problems.append(f"{k}: expected a Tensor, got {type(src).__name__}")
        elif src.shape != v.shape and not {tuple(src.shape), tuple(v.shape)} == {(), (1,)}:
            problems.append(f"{k}: the state dict has shape {src.shape}, the model {v.shape}")
    if problems:
        raise ValueError(f"load_state_dict: {len(problems)} tensor(s) do not fit the model: " + "; ".join(problems))
    start_mem = GlobalCounters.mem_used

    def loaded(elapsed_ns: int) -> str:
        mem = GlobalCounters.mem_used - start_mem
        return f", {mem / 1e9:.2f} GB loaded at {mem / max(elapsed_ns, 1):.2f} GB/s"

    with Timing("loaded weights in ", loaded, enabled=verbose):
        progress = tqdm(model_state.items(), disable=CI or not verbose)
        for k, v in progress:
            if k not in state_dict:
                if DEBUG >= 1:
                    print(f"WARNING: not loading {k}")
                continue
            progress.set_description(f"ram used: {GlobalCounters.mem_used / 1e9:5.2f} GB, {k:50s}")
            src = state_dict[k]
            src = src.reshape(v.shape) if src.shape != v.shape else src
            if isinstance(v.lazydata, MultiLazyBuffer):  # a sharded model tensor: the data is split the same way
                if not isinstance(src.lazydata, MultiLazyBuffer):
                    src = src.shard(v.lazydata.device, v.lazydata.axis)
            else:
                src = src.to(v.device)
            v.replace(src).realize()
            if consume:
                del state_dict[k]


# ***** PyTorch checkpoints *****

_TORCH_STORAGE_DTYPES: dict[str, DType] = {
    "FloatStorage": dtypes.float32,
    "DoubleStorage": dtypes.float64,
    "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16,
    "LongStorage": dtypes.int64,
    "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16,
    "CharStorage": dtypes.int8,
    "ByteStorage": dtypes.uint8,
    "BoolStorage": dtypes.bool,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


@dataclass(frozen=True)
class _StorageType:
    """What the checkpoint's torch.<X>Storage global becomes: only its element type."""

    name: str
    dtype: DType


class _Storage:
    """One storage of a checkpoint: its element type, size and, once read, its elements (a 1-d numpy array)."""

    def __init__(self, key: str, dtype: DType, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel
        self.array: Optional[np.ndarray] = None
        self.view_of: Optional[tuple[_Storage, int]] = None  # (root storage, element offset) for legacy views

    def elements(self) -> np.ndarray:
        if self.view_of is not None:
            root, offset = self.view_of
            return root.elements()[offset : offset + self.numel]
        if self.array is None:
            raise ValueError(f"torch_load: the checkpoint has no data for storage {self.key!r}")
        return self.array


@dataclass(eq=False)
class _PendingTensor:
    """A tensor named by the pickle, built once every storage has been read."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def build(self) -> Tensor:
        elements = self.storage.elements()
        if prod(self.size) == 0:
            return _tensor_from_file_array(np.zeros(self.size, dtype=elements.dtype), self.storage.dtype)
        view = np.lib.stride_tricks.as_strided(
            elements[self.offset :], shape=self.size, strides=[s * elements.itemsize for s in self.stride]
        )
        return _tensor_from_file_array(view, self.storage.dtype)


def _is_int(x: Any) -> bool:
    return type(x) is int


class _TorchLoader:
    """The state of one torch_load: the allow-listed globals, the storages seen, and the unpickler."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.storages: dict[str, _Storage] = {}
        self.allowed: dict[tuple[str, str], Any] = {
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor"): self._rebuild_tensor,
            ("torch._utils", "_rebuild_tensor_v2"): self._rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): self._rebuild_parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): self._rebuild_parameter,
        }
        for name, dt in _TORCH_STORAGE_DTYPES.items():
            self.allowed[("torch", name)] = _StorageType(name, dt)

    def unpickler(self, f: IO[bytes]) -> pickle.Unpickler:
        loader = self

        class RestrictedUnpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if (module, name) not in loader.allowed:
                    raise pickle.UnpicklingError(
                        f"torch_load: {loader.what} refers to the global '{module}.{name}', which is not on the "
                        "allow-list of names that rebuild tensors and containers; loading it could run code from the "
                        "file, so it is refused. Save a plain state dict (torch.save(model.state_dict(), ...)) or "
                        "convert the checkpoint to safetensors."
                    )
                return loader.allowed[(module, name)]

            def persistent_load(self, pid: Any) -> Any:
                return loader.persistent_load(pid)

        return RestrictedUnpickler(f, encoding="utf-8")

    def error(self, msg: str) -> ValueError:
        return ValueError(f"torch_load: {self.what}: {msg}")

    def storage(self, storage_type: Any, key: Any, numel: Any) -> _Storage:
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not _is_int(numel) or numel < 0:
            raise self.error(f"bad storage reference ({storage_type!r}, {key!r}, {numel!r})")
        if key not in self.storages:
            self.storages[key] = _Storage(key, storage_type.dtype, numel)
        st = self.storages[key]
        if st.dtype != storage_type.dtype or st.numel != numel:
            raise self.error(
                f"storage {key!r} is referenced as both {st.dtype}[{st.numel}] and {storage_type.dtype}[{numel}]"
            )
        return st

    def persistent_load(self, pid: Any) -> _Storage:
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            raise self.error(f"unknown persistent id {pid!r}; expected ('storage', type, key, location, numel)")
        st = self.storage(pid[1], pid[2], pid[4])
        if len(pid) == 6 and pid[5] is not None:  # legacy format: a view into the root storage, in elements
            view = pid[5]
            if not (
                isinstance(view, tuple)
                and len(view) == 3
                and isinstance(view[0], str)
                and _is_int(view[1])
                and _is_int(view[2])
                and 0 <= view[1]
                and view[1] + view[2] <= st.numel
            ):
                raise self.error(f"bad storage view {view!r} of storage {st.key!r} ({st.numel} elements)")
            key = f"{view[0]}@view"
            if key not in self.storages:
                self.storages[key] = _Storage(view[0], st.dtype, view[2])
                self.storages[key].view_of = (st, view[1])
            return self.storages[key]
        return st

    def _rebuild_tensor(self, storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> _PendingTensor:
        if not isinstance(storage, _Storage):
            raise self.error(f"a tensor is built from {type(storage).__name__}, not a storage")
        if not (
            _is_int(offset)
            and isinstance(size, tuple)
            and isinstance(stride, tuple)
            and len(size) == len(stride)
            and all(_is_int(s) for s in size + stride)
        ):
            raise self.error(f"bad tensor layout: offset {offset!r}, size {size!r}, stride {stride!r}")
        if offset < 0 or any(s < 0 for s in size + stride):
            raise self.error(f"negative tensor layout: offset {offset}, size {size}, stride {stride}")
        if prod(size) > 0:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= storage.numel:
                raise self.error(
                    f"a tensor of size {size}, stride {stride} at offset {offset} reads element {last} of "
                    f"storage {storage.key!r}, which has {storage.numel}"
                )
        return _PendingTensor(storage, offset, size, stride)

    def _rebuild_parameter(self, data: Any, *_: Any) -> Any:
        if not isinstance(data, _PendingTensor):
            raise self.error(f"a Parameter is built from {type(data).__name__}, not a tensor")
        return data

    def read_storage(self, key: str, raw: bytes, big_endian: bool = False) -> None:
        st = self.storages[key]
        nbytes = st.numel * st.dtype.itemsize
        if len(raw) < nbytes:
            raise self.error(
                f"storage {key!r} has {len(raw)} bytes, but {st.numel} elements of {st.dtype} need {nbytes}"
            )
        dt = _file_np_dtype(st.dtype)
        st.array = np.frombuffer(raw, dtype=dt.newbyteorder(">") if big_endian else dt, count=st.numel)

    def resolve(self, obj: Any, seen: Optional[set[int]] = None) -> Any:
        """obj with every pending tensor built, in place for lists and dicts."""
        seen = set() if seen is None else seen
        if isinstance(obj, _PendingTensor):
            return obj.build()
        if id(obj) in seen:
            return obj
        if isinstance(obj, dict):
            seen.add(id(obj))
            for k, v in obj.items():
                obj[k] = self.resolve(v, seen)
        elif isinstance(obj, list):
            seen.add(id(obj))
            for i, v in enumerate(obj):
                obj[i] = self.resolve(v, seen)
        elif isinstance(obj, tuple):
            return tuple(self.resolve(v, seen) for v in obj)
        return obj


def _zip_checkpoint(loader: _TorchLoader, zf: zipfile.ZipFile) -> Any:
    roots = [n[: -len("/data.pkl")] for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(roots) != 1:
        raise loader.error(f"expected one '<name>/data.pkl' in the zip archive, found {len(roots)}")
    root = roots[0]
    names = set(zf.namelist())
    big_endian = f"{root}/byteorder" in names and zf.read(f"{root}/byteorder").strip() == b"big"
    with zf.open(f"{root}/data.pkl") as f:
        result = loader.unpickler(f).load()
    for key, st in loader.storages.items():
        if st.view_of is not None:
            continue
        entry = f"{root}/data/{key}"
        if entry not in names:
            raise loader.error(f"the archive has no data for storage {key!r} (expected an entry {entry!r})")
        # read only what the storage needs: a crafted archive may declare a far larger (or compressed) entry
        with zf.open(entry) as f:
            loader.read_storage(key, f.read(st.numel * st.dtype.itemsize), big_endian)
    return result


def _read_exact(f: IO[bytes], n: int, loader: _TorchLoader, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise loader.error(f"the file ends inside {what} ({len(data)} of {n} bytes)")
    return data


def _legacy_checkpoint(loader: _TorchLoader, f: IO[bytes]) -> Any:
    try:
        magic = loader.unpickler(f).load()
    except Exception as e:
        raise loader.error(f"not a PyTorch checkpoint (zip or legacy format): {e}") from e
    if magic != _LEGACY_MAGIC:
        raise loader.error("not a PyTorch checkpoint: no zip archive and no legacy magic number")
    protocol = loader.unpickler(f).load()
    if protocol != _LEGACY_PROTOCOL:
        raise loader.error(f"unsupported legacy protocol version {protocol!r} (expected {_LEGACY_PROTOCOL})")
    sys_info = loader.unpickler(f).load()  # the endianness and type sizes of the machine that saved it
    big_endian = isinstance(sys_info, dict) and sys_info.get("little_endian") is False
    result = loader.unpickler(f).load()
    keys = loader.unpickler(f).load()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise loader.error("the list of storage keys is malformed")
    for key in keys:
        if key not in loader.storages:
            raise loader.error(f"the file has data for storage {key!r}, which no tensor refers to")
        st = loader.storages[key]
        size_field = _read_exact(f, 8, loader, f"the size of storage {key!r}")
        numel = int.from_bytes(size_field, "big" if big_endian else "little", signed=True)
        if numel != st.numel:
            raise loader.error(f"storage {key!r} holds {numel} elements, but the pickle says {st.numel}")
        raw = _read_exact(f, numel * st.dtype.itemsize, loader, f"storage {key!r}")
        loader.read_storage(key, raw, big_endian)
    return result


def torch_load(fn: PathLike) -> Any:
    """The object (usually a state dict) in a PyTorch checkpoint (.pt/.pth/.bin, zip or legacy format), with its
    tensors as tgcore Tensors. Needs no torch, and runs no code from the file: only tensors, storages and
    containers can be rebuilt; any other global is refused with an error that names it."""
    name = os.fspath(fn)
    loader = _TorchLoader(repr(name))
    if zipfile.is_zipfile(name):
        with zipfile.ZipFile(name) as zf:
            result = _zip_checkpoint(loader, zf)
    elif tarfile.is_tarfile(name):
        raise loader.error(
            "the tar checkpoint format of PyTorch <= 0.3 is not supported; re-save it with a newer torch"
        )
    else:
        with open(name, "rb") as f:
            result = _legacy_checkpoint(loader, f)
    return loader.resolve(result)
