"""Model state: state dicts, safetensors files and PyTorch checkpoints.

Loading never runs code from a file: safetensors headers are parsed as JSON with every field checked, and
PyTorch checkpoints are unpickled by a small machine of our own that can only rebuild tensors and containers.
safe_load gives DISK tensors (views of the memory-mapped file, read when used); torch_load reads the checkpoint into
tensors on the default device. load_state_dict copies each tensor to the device of the model's tensor.
bfloat16 data loads as float32 where the default device has no bfloat16.

A file cannot make a load take much more memory than the file's own size: what a load builds is charged, as it is
built, to a budget of TGCORE_LOAD_LIMIT (default 8) times the file's size, at least 64 MiB, and a file that asks for
more is refused with a ValueError that names the file, what needed the memory and the limit (TGCORE_LOAD_LIMIT=0
lifts it, for files one trusts). Fixed caps, which no file needs to pass: containers nest at most MAX_NESTING levels,
a tensor has at most MAX_DIMS dimensions, a safetensors header has at most 100 MB (as the format says).
safe_save writes a temporary file named after its target, this machine and its process, and renames it into place; a
later safe_save or safe_load of the same target removes the ones that killed writers left.
"""

from __future__ import annotations

import codecs
import collections
import json
import mmap
import os
import pickle
import reprlib
import struct
import tarfile
import types
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union, cast

import numpy as np

from tgcore.device import Device
from tgcore.dtype import DType, dtypes
from tgcore.helpers import CI, DEBUG, GlobalCounters, Timing, all_int, lock_temp, prod, remove_stale_temps, temp_beside
from tgcore.multi import MultiLazyBuffer
from tgcore.tensor import Tensor

try:
    import fcntl
except ImportError:  # (Windows: no advisory locks, so no writer can be told dead; temporary files are left alone)
    fcntl = None  # type: ignore[assignment]

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


# ***** what a file may make a load build *****

LOAD_LIMIT_VAR = "TGCORE_LOAD_LIMIT"
DEFAULT_LOAD_LIMIT = 8  # times the file's size: a checkpoint needs about its own size (its data, then the tensors')
LOAD_LIMIT_FLOOR = 64 << 20  # bytes any file may build, however small, for the objects around its data
MAX_NESTING = 100  # levels of containers in a checkpoint's objects (state dicts nest a few)
MAX_DIMS = 64  # dimensions of one tensor
SAFETENSORS_MAX_HEADER = 100_000_000  # bytes of a safetensors header, as the format caps it

# the memory of what a load builds, estimated (CPython, 64-bit, rounded up), in bytes
_OBJECT_BYTES = 96  # one object: a number, a string (and its characters), a container, a storage, a tensor
_REFERENCE_BYTES = 16  # one item of a list, tuple or set, or one slot of the pickle's stack
_ENTRY_BYTES = 64  # one key and value of a dict or of the pickle's memo
_TENSOR_BYTES = 2048  # one tensor of a checkpoint, apart from its data: its Tensor, LazyBuffer, ShapeTracker, views
_JSON_VALUE_BYTES = 64  # one value of a safetensors header
_SAFETENSORS_ENTRY_BYTES = 4096  # one tensor of a safetensors header: its JSON object and its DISK view


class LoadLimitError(ValueError):
    """A file refused because loading it would build more than TGCORE_LOAD_LIMIT times its size."""


def _load_limit_factor() -> int:
    """TGCORE_LOAD_LIMIT: the multiple of a file's size that loading it may build (0: no limit)."""
    text = os.environ.get(LOAD_LIMIT_VAR, "").strip()
    if not text:
        return DEFAULT_LOAD_LIMIT
    if not text.isdigit():
        raise ValueError(
            f"{LOAD_LIMIT_VAR}={text!r} is not a limit: expected a whole number >= 0, the multiple of a file's size "
            f"that loading it may take in memory (default {DEFAULT_LOAD_LIMIT}; 0 for no limit)"
        )
    return int(text)


class _LoadBudget:
    """The memory one load may build from a file: TGCORE_LOAD_LIMIT times its size, at least LOAD_LIMIT_FLOOR."""

    def __init__(self, caller: str, what: str, file_size: int) -> None:
        self.caller, self.what, self.file_size = caller, what, file_size
        self.factor = _load_limit_factor()
        self.limit: Optional[int] = max(self.factor * file_size, LOAD_LIMIT_FLOOR) if self.factor else None
        self.used = 0

    def charge(self, nbytes: int, what: str) -> None:
        """Count nbytes more, which `what` needs; refuse the file once the total passes the limit."""
        self.used += nbytes
        if self.limit is not None and self.used > self.limit:
            raise LoadLimitError(
                f"{self.caller}: {self.what}: {what} would take the memory built from this file to {self.used:,} "
                f"bytes, past its limit of {self.limit:,} ({LOAD_LIMIT_VAR}={self.factor} times the file's "
                f"{self.file_size:,} bytes, at least {LOAD_LIMIT_FLOOR:,}). A checkpoint needs about its own size; "
                "one that asks for far more is corrupt or crafted to exhaust memory (a zip bomb, a huge view of a "
                f"small storage, a pickle of many copies), so it is refused. If you trust the file, set "
                f"{LOAD_LIMIT_VAR} to a larger multiple (0 for no limit)"
            )


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


def _safetensors_header(data: Tensor, what: str, caller: str) -> tuple[int, dict[str, Any]]:
    """(header length, header) of safetensors bytes, checking the length, that the header is a JSON object, and that
    parsing it builds no more than the file's budget allows."""
    size = data.nbytes()
    if size < 8:
        raise ValueError(f"{what} is not a safetensors file: {size} bytes, fewer than the 8-byte header length")
    json_len = int.from_bytes(_read(data, 0, 8), "little")
    if json_len > SAFETENSORS_MAX_HEADER:
        raise ValueError(
            f"{what} is not a valid safetensors file: its header claims {json_len:,} bytes, more than the "
            f"{SAFETENSORS_MAX_HEADER:,} that the safetensors format allows (a corrupt or crafted file)"
        )
    if json_len > size - 8:
        raise ValueError(
            f"{what} is not a valid safetensors file: its header claims {json_len} bytes but the file has only "
            f"{size - 8} after the length field (truncated or not a safetensors file)"
        )
    budget = _LoadBudget(caller, what, size)
    raw = _read(data, 8, 8 + json_len)
    # bounded before parsing: each JSON value or key but the first opens a container or follows a comma or colon;
    # the text is held twice (bytes, str) and its strings' characters take up to as much again
    values = raw.count(b",") + raw.count(b":") + raw.count(b"{") + raw.count(b"[") + 1
    budget.charge(
        4 * json_len + values * _JSON_VALUE_BYTES,
        f"parsing its header ({json_len:,} bytes, up to {values:,} JSON values)",
    )

    def counted_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # every object of a valid header is a tensor but the header itself and its __metadata__
        budget.charge(_SAFETENSORS_ENTRY_BYTES, "its header's tensors (about 4 KiB each, parsed and viewed on DISK)")
        return dict(pairs)

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=counted_object)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} is not a valid safetensors file: its header is not UTF-8 JSON ({e})") from e
    except RecursionError as e:
        raise ValueError(
            f"{what} is not a valid safetensors file: its header nests JSON deeper than Python can parse; a header "
            "is one object of tensor entries"
        ) from e
    if not isinstance(header, dict):
        raise ValueError(
            f"{what} is not a valid safetensors file: its header is a {type(header).__name__}, not an object"
        )
    return json_len, header


def _check_metadata(metadata: Any, what: str) -> None:
    """Refuse a __metadata__ that is not a dict of str to str (null stands for none), as safetensors defines it."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError(
            f"{what}: __metadata__ must be an object of strings to strings, as the safetensors format defines it; "
            f"got {_short_repr(metadata)}"
        )


def _entry_problem(info: Any, data_len: int) -> Optional[str]:
    """What is wrong with one tensor's header entry, or None: every field's type, and its offsets in the data."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        return "expected an object with dtype, shape and data_offsets"
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in safe_dtypes:
        return f"unknown dtype, expected a string, one of {sorted(safe_dtypes)}"
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        return "the shape must be a list of non-negative integers"
    if len(shape) > MAX_DIMS:
        return f"the shape has {len(shape)} dimensions, more than the {MAX_DIMS} a tensor may have"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets):
        return "data_offsets must be [begin, end], two integers"
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        return f"data_offsets must satisfy 0 <= begin <= end <= {data_len} (the data size)"
    need = prod(shape) * safe_dtypes[dtype_name].itemsize
    if end - begin != need:
        return f"it spans {end - begin} bytes but {dtype_name} of shape {shape} needs {need}"
    return None


def _safetensors_entries(header: dict[str, Any], data_len: int, what: str) -> list[tuple[str, DType, tuple, int, int]]:
    """(name, dtype, shape, begin, end) of each tensor in a header, with every field's type checked and the offsets
    checked against the data section."""
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            _check_metadata(info, what)
            continue
        if (problem := _entry_problem(info, data_len)) is not None:
            raise ValueError(f"{what}: tensor {name!r} has a bad header entry {_short_repr(info)}: {problem}")
        begin, end = info["data_offsets"]
        entries.append((name, safe_dtypes[info["dtype"]], tuple(info["shape"]), begin, end))
    by_start = sorted((e for e in entries if e[4] > e[3]), key=lambda e: e[3])
    for prev, cur in zip(by_start, by_start[1:]):
        if cur[3] < prev[4]:
            raise ValueError(f"{what}: the data of tensors {prev[0]!r} and {cur[0]!r} overlap")
    return entries


def safe_load_metadata(fn: Union[Tensor, PathLike]) -> tuple[Tensor, int, Any]:
    """(the file's bytes as a uint8 tensor, the header length, the parsed JSON header) of a .safetensors file; for a
    path the tensor is on DISK, and only the header has been read."""
    data, what = _file_tensor(fn)
    json_len, header = _safetensors_header(data, what, "safe_load_metadata")
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
    safetensors. From the bytes on another device the file is read once and each tensor copied. A header that would
    build more than the file's budget (TGCORE_LOAD_LIMIT) is refused; see the module's docstring.
    """
    if not isinstance(fn, Tensor):
        remove_stale_temps(os.fspath(fn))
    data, what = _file_tensor(fn)
    json_len, header = _safetensors_header(data, what, "safe_load")
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


def safe_save(tensors: dict[str, Tensor], fn: PathLike, metadata: Optional[dict[str, Any]] = None) -> None:
    """Write tensors to a .safetensors file; written beside `fn` and renamed into place, so a failure leaves no
    half-written file, and a writer killed meanwhile leaves a temporary file that the next safe_save (or safe_load)
    of `fn` removes. metadata is a dict of str to str, as the format defines it."""
    _check_metadata(metadata, "safe_save")
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
    remove_stale_temps(path)
    fd, tmp = temp_beside(path)
    try:
        lock_temp(fd)
        with os.fdopen(fd, "wb") as f:
            f.write(len(encoded).to_bytes(8, "little"))
            f.write(encoded)
            for name, t in tensors.items():
                f.write(_tensor_to_file_bytes(t))
            f.flush()
            os.fsync(f.fileno())
            if fcntl is not None:  # renamed while locked (POSIX renames open files; Windows cannot)
                os.replace(tmp, path)
        if fcntl is None:
            os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
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
        from tqdm import tqdm  # (imported here, not with tgcore.nn: ~30 ms)

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
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}  # what torch and zip tools write
_ZIP_ENTRY_BYTES = 512  # the memory of one entry of a zip archive's directory, as zipfile holds it


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
            raise KeyError(self.key)  # (the loader says which file)
        return self.array


@dataclass(eq=False)
class _PendingTensor:
    """A tensor named by the pickle, built once every storage has been read."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def build(self) -> Tensor:
        """The tensor: its elements copied from the storage, except along broadcast axes (stride 0), which are read
        once and expanded, so that they take no memory, as in torch."""
        elements = self.storage.elements()
        if prod(self.size) == 0:
            return _tensor_from_file_array(np.zeros(self.size, dtype=elements.dtype), self.storage.dtype)
        compact = _compact_size(self.size, self.stride)
        view = np.lib.stride_tricks.as_strided(
            elements[self.offset :], shape=compact, strides=[s * elements.itemsize for s in self.stride]
        )
        t = _tensor_from_file_array(view, self.storage.dtype)
        return t if compact == self.size else t.expand(self.size)


def _compact_size(size: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """The size of a tensor's own elements: its broadcast axes (stride 0) read once."""
    return tuple(1 if st == 0 else n for n, st in zip(size, stride))


def _is_int(x: Any) -> bool:
    return type(x) is int


class _TorchLoader:
    """The state of one torch_load: the allow-listed globals, the storages seen, and the memory budget."""

    def __init__(self, what: str, budget: _LoadBudget) -> None:
        self.what, self.budget = what, budget
        self.storages: dict[str, _Storage] = {}
        # bound once, so that REDUCE can tell them by identity
        self.rebuilders = (self._rebuild_tensor, self._rebuild_parameter)
        self.allowed: dict[tuple[str, str], Any] = {
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor"): self.rebuilders[0],
            ("torch._utils", "_rebuild_tensor_v2"): self.rebuilders[0],
            ("torch._utils", "_rebuild_parameter"): self.rebuilders[1],
            ("torch._utils", "_rebuild_parameter_with_state"): self.rebuilders[1],
        }
        for name, dt in _TORCH_STORAGE_DTYPES.items():
            self.allowed[("torch", name)] = _StorageType(name, dt)

    def error(self, msg: str) -> ValueError:
        return ValueError(f"torch_load: {self.what}: {msg}")

    def find_global(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(
                f"torch_load: {self.what} refers to the global '{module}.{name}', which is not on the "
                "allow-list of names that rebuild tensors and containers; loading it could run code from the "
                "file, so it is refused. Save a plain state dict (torch.save(model.state_dict(), ...)) or "
                "convert the checkpoint to safetensors."
            )
        return self.allowed[(module, name)]

    def call(self, func: Any, args: Any) -> Any:
        """What REDUCE makes of func(*args): an OrderedDict or a tensor; any other call is refused."""
        if not isinstance(args, tuple):
            raise self.error(f"a call's arguments are a {type(args).__name__}, not a tuple")
        if func is collections.OrderedDict:
            return self._ordered_dict(args)
        if any(func is f for f in self.rebuilders):
            return func(*args)
        raise self.error(
            f"the pickle calls {_short_repr(func)}, which builds no tensor or container; a checkpoint calls only "
            "OrderedDict and torch's tensor rebuilders"
        )

    def _ordered_dict(self, args: tuple) -> collections.OrderedDict:
        if not args:
            self.budget.charge(_OBJECT_BYTES, "an OrderedDict")
            return collections.OrderedDict()
        items = args[0]
        if len(args) > 1 or not isinstance(items, (list, tuple, dict)):
            raise self.error(f"OrderedDict is called with {_short_repr(args)}; expected () or (a list of pairs,)")
        # a dict made from another copies it: charged for every entry, since one list may be copied many times
        self.budget.charge(_OBJECT_BYTES + len(items) * _ENTRY_BYTES, f"an OrderedDict of {len(items)} entries")
        if isinstance(items, dict):
            return collections.OrderedDict(items)
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in items):
            raise self.error(f"OrderedDict is called with {_short_repr(items)}; expected a list of (key, value) pairs")
        return collections.OrderedDict((p[0], p[1]) for p in items)

    def set_state(self, obj: Any, state: Any) -> None:
        """BUILD: only the attributes of an OrderedDict (the _metadata of a state dict) can be set."""
        if type(obj) is not collections.OrderedDict or not isinstance(state, dict):
            raise self.error(
                f"the pickle sets the state of a {type(obj).__name__} to a {type(state).__name__}; only attributes of "
                "an OrderedDict (a state dict's _metadata) can be set"
            )
        if not all(isinstance(k, str) for k in state):
            raise self.error(f"the attribute names of an OrderedDict must be strings, got {_short_repr(list(state))}")
        self.budget.charge(len(state) * _ENTRY_BYTES, f"{len(state)} attributes of an OrderedDict")
        obj.__dict__.update(state)

    def storage(self, storage_type: Any, key: Any, numel: Any) -> _Storage:
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not _is_int(numel) or numel < 0:
            raise self.error(f"bad storage reference {_short_repr((storage_type, key, numel))}")
        if key not in self.storages:
            # read whole, later: refused here, before anything is read, when it claims more than the file may build
            nbytes = numel * storage_type.dtype.itemsize
            self.budget.charge(
                _OBJECT_BYTES + nbytes, f"storage {key!r} of {numel} {storage_type.dtype.short_name} elements"
            )
            self.storages[key] = _Storage(key, storage_type.dtype, numel)
        st = self.storages[key]
        if st.dtype != storage_type.dtype or st.numel != numel:
            raise self.error(
                f"storage {key!r} is referenced as both {st.dtype}[{st.numel}] and {storage_type.dtype}[{numel}]"
            )
        return st

    def persistent_load(self, pid: Any) -> _Storage:
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            raise self.error(
                f"unknown persistent id {_short_repr(pid)}; expected ('storage', type, key, location, numel)"
            )
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
                and 0 <= view[2]
                and view[1] + view[2] <= st.numel
            ):
                raise self.error(f"bad storage view {_short_repr(view)} of storage {st.key!r} ({st.numel} elements)")
            key = f"{view[0]}@view"
            if key not in self.storages:
                self.budget.charge(_OBJECT_BYTES, f"storage view {key!r}")
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
            raise self.error(
                f"bad tensor layout: offset {_short_repr(offset)}, size {_short_repr(size)}, "
                f"stride {_short_repr(stride)}"
            )
        if offset < 0 or any(s < 0 for s in size + stride):
            raise self.error(f"negative tensor layout: offset {offset}, size {size}, stride {stride}")
        if len(size) > MAX_DIMS:
            raise self.error(f"a tensor has {len(size)} dimensions, more than the {MAX_DIMS} a tensor may have")
        numel = prod(size)
        if numel >= 1 << 63:
            raise self.error(f"a tensor of size {size} has {numel} elements, more than an int64 can count")
        if numel > 0:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= storage.numel:
                raise self.error(
                    f"a tensor of size {size}, stride {stride} at offset {offset} reads element {last} of "
                    f"storage {storage.key!r}, which has {storage.numel}"
                )
        # the tensor gets a copy of its elements (a broadcast axis, of stride 0, is read once): views that overlap
        # (strides smaller than the sizes they step over) copy more than their storage holds
        nbytes = prod(_compact_size(size, stride)) * storage.dtype.itemsize if numel else 0
        self.budget.charge(
            _TENSOR_BYTES + nbytes,
            f"a tensor of size {size}, stride {stride} of storage {storage.key!r} ({storage.numel} elements; a copy of "
            f"it takes {nbytes} bytes)",
        )
        return _PendingTensor(storage, offset, size, stride)

    def _rebuild_parameter(self, data: Any, *_: Any) -> Any:
        if not isinstance(data, _PendingTensor):
            raise self.error(f"a Parameter is built from {type(data).__name__}, not a tensor")
        return data

    def read_storage(self, key: str, raw: Any, offset: int = 0, big_endian: bool = False) -> None:
        """Storage `key`'s elements: its numel items of raw (bytes or a mapping of the file) from byte `offset`."""
        st = self.storages[key]
        nbytes = st.numel * st.dtype.itemsize
        if len(raw) - offset < nbytes:
            raise self.error(
                f"storage {key!r} has {len(raw) - offset} bytes, but {st.numel} elements of {st.dtype} need {nbytes}"
            )
        dt = _file_np_dtype(st.dtype)
        dt = dt.newbyteorder(">") if big_endian else dt
        st.array = np.frombuffer(raw, dtype=dt, count=st.numel, offset=offset)

    def load_pickle(self, data: Any, pos: int = 0) -> tuple[Any, int]:
        """The object of the pickle at byte `pos` of data, and the position after it."""
        return _PickleMachine(self, data, pos).load()

    def resolve(self, obj: Any) -> Any:
        """obj with every pending tensor built: lists and dicts changed in place, tuples and sets rebuilt where they
        hold a tensor. Iterative, and each object is visited once, so that an object the pickle refers to many times
        (memoized) stays one object; refuses nesting deeper than MAX_NESTING."""
        built: dict[int, tuple[Any, Any]] = {}  # id -> (object, what replaces it); keeps the object alive
        height: dict[int, int] = {}  # id -> levels of containers from here down, once done
        on_path: set[int] = set()
        reached_on_path: set[int] = set()  # objects reached again while being visited (a cycle)

        def final(x: Any) -> Any:
            if isinstance(x, _PendingTensor):
                if id(x) not in built:
                    try:
                        built[id(x)] = (x, x.build())
                    except KeyError as e:
                        raise self.error(f"the checkpoint has no data for storage {e.args[0]!r}") from None
                return built[id(x)][1]
            return built[id(x)][1] if id(x) in built else x

        work: list[tuple[Any, bool]] = [(obj, False)]
        while work:
            o, children_done = work.pop()
            oid = id(o)
            kids = _children(o)
            if kids is None:
                continue
            if not children_done:
                if oid in height:
                    continue
                if oid in on_path:
                    reached_on_path.add(oid)
                    continue
                on_path.add(oid)
                work.append((o, True))
                work.extend((k, False) for k in kids if isinstance(k, _CONTAINERS))
                continue
            on_path.discard(oid)
            levels = 1 + max((height.get(id(k), 0) for k in kids), default=0)
            if levels > MAX_NESTING:
                raise self.error(
                    f"its objects nest containers more than {MAX_NESTING} levels deep; a checkpoint nests a few "
                    "(a deeper one is corrupt or crafted to exhaust the stack of whatever walks it)"
                )
            height[oid] = levels
            if isinstance(o, (dict, list)):
                items = list(o.items()) if isinstance(o, dict) else list(enumerate(o))
                for k, v in items:
                    new = final(v)
                    if new is not v:
                        o[k] = new
                if isinstance(o, dict) and any(final(k) is not k for k in o):
                    raise self.error("a tensor is used as a dict key; a checkpoint's keys are names and numbers")
            elif isinstance(o, set):
                new_items = [final(k) for k in o]
                if any(n is not k for n, k in zip(new_items, o)):
                    o.clear()
                    o.update(new_items)
            else:  # tuple, frozenset: rebuilt if an item changes
                new_items = [final(k) for k in o]
                if any(n is not k for n, k in zip(new_items, o)):
                    if oid in reached_on_path:
                        raise self.error(
                            "a tuple that holds tensors contains itself (through a list or dict); such a cycle "
                            "cannot be rebuilt"
                        )
                    built[oid] = (o, type(o)(new_items))
        return final(obj)


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _children(o: Any) -> Optional[list[Any]]:
    """The objects a container holds (for an OrderedDict, also its attributes), or None for what is no container."""
    if isinstance(o, dict):
        kids = [*o.keys(), *o.values()]
        if type(o) is collections.OrderedDict and vars(o):
            kids.append(vars(o))
        return kids
    if isinstance(o, (list, tuple, set, frozenset)):
        return list(o)
    return None


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, 60, 60


def _short_repr(x: Any) -> str:
    """repr(x) cut short (a few levels and items): safe for objects a file built, however deep or large."""
    return _SHORT_REPR.repr(x)


_U1, _U2, _I4, _U4, _U8, _F8 = (struct.Struct(f) for f in ("<B", "<H", "<i", "<I", "<Q", ">d"))
_OPS_PER_CHARGE = 1024
_OPCODE_NAMES = {v[0]: k for k, v in vars(pickle).items() if k.isupper() and isinstance(v, bytes) and len(v) == 1}
_TRUNCATED = "the pickle ends inside an opcode (the file is truncated or corrupt)"


class _PickleMachine:
    """Runs the opcodes of one pickle without the pickle module's unpickler: it builds only numbers, strings, bytes,
    containers and the loader's allow-listed globals and storages.

    What it builds is charged to the load's budget as it goes; a memo reference (GET) stays a reference to the one
    object, never a copy; tuples and frozensets (which hashing walks recursively in C) may nest at most MAX_NESTING
    levels; an index or length from the file is checked against the data before it is used.
    """

    def __init__(self, loader: _TorchLoader, data: Any, pos: int) -> None:
        self.loader, self.data, self.pos = loader, data, pos
        self.charge = loader.budget.charge
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.nesting: dict[int, tuple[int, Any]] = {}  # id -> (levels, object) of tuples and frozensets that nest

    def load(self) -> tuple[Any, int]:
        """The pickle's object, and the position after its STOP opcode."""
        data, end, ops, start = self.data, len(self.data), 0, self.pos
        try:
            while True:
                start = self.pos
                if start >= end:
                    raise self.loader.error("the pickle ends before its STOP opcode (the file is truncated)")
                self.pos += 1
                op = _OP_TABLE[data[start]]
                if op is None:
                    raise self.unsupported(data[start])
                ops += 1
                if not ops % _OPS_PER_CHARGE:  # each opcode adds at most a slot to the stack or an item to a list
                    self.charge(_OPS_PER_CHARGE * _REFERENCE_BYTES, "the pickle's stack and the items of its lists")
                if op(self):
                    return self.stack.pop(), self.pos
        except (IndexError, KeyError, TypeError, struct.error, UnicodeDecodeError, OverflowError) as e:
            name = _OPCODE_NAMES.get(data[start], f"0x{data[start]:02x}") if start < end else "end"
            raise self.loader.error(f"malformed pickle at byte {start} (opcode {name}): {type(e).__name__}: {e}") from e

    def unsupported(self, code: int) -> ValueError:
        if code not in _OPCODE_NAMES:
            return self.loader.error(f"byte {self.pos - 1} of the pickle, 0x{code:02x}, is no pickle opcode")
        return self.loader.error(
            f"the pickle uses the opcode {_OPCODE_NAMES[code]}, which builds objects of classes or extensions; a "
            "checkpoint of tensors and containers does not need it, so it is refused"
        )

    # reading the opcodes' arguments

    def take(self, n: int) -> Any:
        start = self.pos
        if n < 0 or start + n > len(self.data):
            raise self.loader.error(_TRUNCATED)
        self.pos = start + n
        return self.data[start : start + n]

    def unpack(self, fmt: struct.Struct) -> Any:
        if self.pos + fmt.size > len(self.data):
            raise self.loader.error(_TRUNCATED)
        value = fmt.unpack_from(self.data, self.pos)[0]
        self.pos += fmt.size
        return value

    def line(self) -> bytes:
        nl = self.data.find(b"\n", self.pos)
        if nl < 0:
            raise self.loader.error(_TRUNCATED)
        text = self.data[self.pos : nl]
        self.pos = nl + 1
        return bytes(text)

    def text_number(self, kind: type) -> Any:
        return self.number(self.line(), kind)

    def number(self, text: bytes, kind: type) -> Any:
        try:
            return kind(text.rstrip(b"L") if kind is int else text)
        except ValueError as e:
            raise self.loader.error(f"the pickle has a malformed number {text[:40]!r}: {e}") from e

    def counted(self, n: int) -> Any:
        """n bytes of the data, charged before they are copied."""
        self.charge(_OBJECT_BYTES + max(n, 0), f"a string of {n} bytes")
        return self.take(n)

    # the stack

    def push(self, x: Any) -> None:
        self.stack.append(x)  # (charged by the opcode count, in load)

    def pop_mark(self) -> list[Any]:
        mark = self.marks.pop()
        items = self.stack[mark:]
        del self.stack[mark:]
        return items

    def pairs(self, items: list[Any]) -> list[tuple[Any, Any]]:
        if len(items) % 2:
            raise self.loader.error("the pickle sets dict items from an odd number of keys and values")
        self.charge(len(items) // 2 * _ENTRY_BYTES, f"a dict of {len(items) // 2} items")
        return list(zip(items[::2], items[1::2]))

    def target(self, kind: type) -> Any:
        obj = self.stack[-1]
        if not isinstance(obj, kind):
            raise self.loader.error(f"the pickle adds items to a {type(obj).__name__}, not a {kind.__name__}")
        return obj

    def hashed(self, kind: type, items: list[Any]) -> Any:
        """A tuple or frozenset of items, refused when it would nest more than MAX_NESTING levels."""
        levels = 1
        for item in items:
            if isinstance(item, (tuple, frozenset)):
                levels = max(levels, self.nesting[id(item)][0] + 1 if id(item) in self.nesting else 2)
        if levels > MAX_NESTING:
            raise self.loader.error(
                f"the pickle nests tuples more than {MAX_NESTING} levels deep; a checkpoint nests a few (hashing a "
                "deeper one would overflow the C stack)"
            )
        self.charge(_OBJECT_BYTES + len(items) * _REFERENCE_BYTES, f"a {kind.__name__} of {len(items)} items")
        obj = kind(items)
        if levels > 1:
            self.nesting[id(obj)] = (levels, obj)
        return obj

    def memoize(self, index: int) -> None:
        self.charge(_ENTRY_BYTES, "the pickle's memo")
        self.memo[index] = self.stack[-1]

    def recall(self, index: int) -> None:
        if index not in self.memo:
            raise self.loader.error(f"the pickle refers to memo entry {index}, which it never stored")
        self.push(self.memo[index])


def _op_proto(m: _PickleMachine) -> None:
    m.take(1)


def _op_frame(m: _PickleMachine) -> None:
    m.take(8)  # the data is all in memory (or mapped): frames need no reading ahead


def _op_stop(m: _PickleMachine) -> bool:
    if not m.stack:
        raise m.loader.error("the pickle stops with nothing on its stack")
    return True


def _op_pop(m: _PickleMachine) -> None:
    if m.marks and m.marks[-1] == len(m.stack):
        m.marks.pop()
    else:
        m.stack.pop()


def _op_pop_mark(m: _PickleMachine) -> None:
    m.pop_mark()


def _op_int(m: _PickleMachine) -> None:
    text = m.line()
    m.push(text == b"01" if text in (b"00", b"01") else m.number(text, int))  # (protocol 0 spells booleans so)


def _op_long(m: _PickleMachine, n: int) -> None:
    m.push(int.from_bytes(m.counted(n), "little", signed=True))


def _op_string(m: _PickleMachine) -> None:
    text = m.line()
    if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
        raise m.loader.error(f"the pickle has a malformed STRING {text[:40]!r}")
    m.charge(_OBJECT_BYTES + len(text), "a string")
    m.push(codecs.escape_decode(text[1:-1])[0].decode("utf-8"))


def _op_unicode(m: _PickleMachine) -> None:
    text = m.line()
    m.charge(_OBJECT_BYTES + 4 * len(text), "a string")
    m.push(text.decode("raw-unicode-escape"))


def _op_list(m: _PickleMachine) -> None:
    items = m.pop_mark()
    m.charge(_OBJECT_BYTES + len(items) * _REFERENCE_BYTES, f"a list of {len(items)} items")
    m.push(items)


def _op_appends(m: _PickleMachine) -> None:
    items = m.pop_mark()
    m.charge(len(items) * _REFERENCE_BYTES, f"{len(items)} list items")
    m.target(list).extend(items)


def _op_append(m: _PickleMachine) -> None:
    item = m.stack.pop()
    m.target(list).append(item)


def _op_dict(m: _PickleMachine) -> None:
    pairs = m.pairs(m.pop_mark())
    m.charge(_OBJECT_BYTES, "a dict")
    m.push(dict(pairs))


def _op_setitem(m: _PickleMachine) -> None:
    value, key = m.stack.pop(), m.stack.pop()
    m.charge(_ENTRY_BYTES, "a dict item")
    m.target(dict)[key] = value


def _op_setitems(m: _PickleMachine) -> None:
    pairs = m.pairs(m.pop_mark())
    m.target(dict).update(pairs)


def _op_additems(m: _PickleMachine) -> None:
    items = m.pop_mark()
    m.charge(len(items) * _ENTRY_BYTES, f"{len(items)} set items")
    m.target(set).update(items)


def _op_tuple_n(n: int) -> Callable[[_PickleMachine], None]:
    def op(m: _PickleMachine) -> None:
        if len(m.stack) - (m.marks[-1] if m.marks else 0) < n:
            raise m.loader.error(f"the pickle makes a tuple of {n} items from a stack of fewer")
        items = m.stack[len(m.stack) - n :] if n else []
        del m.stack[len(m.stack) - n :]
        m.push(m.hashed(tuple, items))

    return op


def _op_global(m: _PickleMachine) -> None:
    module, name = m.line().decode("utf-8"), m.line().decode("utf-8")
    m.push(m.loader.find_global(module, name))


def _op_stack_global(m: _PickleMachine) -> None:
    name, module = m.stack.pop(), m.stack.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise m.loader.error(f"STACK_GLOBAL names {_short_repr(module)}.{_short_repr(name)}, not two strings")
    m.push(m.loader.find_global(module, name))


def _op_reduce(m: _PickleMachine) -> None:
    args, func = m.stack.pop(), m.stack.pop()
    m.push(m.loader.call(func, args))


def _op_build(m: _PickleMachine) -> None:
    state = m.stack.pop()
    m.loader.set_state(m.stack[-1], state)


def _op_binpersid(m: _PickleMachine) -> None:
    m.push(m.loader.persistent_load(m.stack.pop()))


def _op_persid(m: _PickleMachine) -> None:
    m.push(m.loader.persistent_load(m.line().decode("ascii")))


def _op_empty(kind: type) -> Callable[[_PickleMachine], None]:
    def op(m: _PickleMachine) -> None:
        m.charge(_OBJECT_BYTES, f"a {kind.__name__}")
        m.push(kind())

    return op


def _op_const(value: Any) -> Callable[[_PickleMachine], None]:
    return lambda m: m.push(value)


def _op_unpacked(fmt: struct.Struct) -> Callable[[_PickleMachine], None]:
    return lambda m: m.push(m.unpack(fmt))


def _op_counted(length: struct.Struct, decode: Optional[Callable[[Any], Any]]) -> Callable[[_PickleMachine], None]:
    def op(m: _PickleMachine) -> None:
        raw = m.counted(m.unpack(length))
        m.push(decode(raw) if decode is not None else bytes(raw))

    return op


def _utf8(raw: Any) -> str:
    return bytes(raw).decode("utf-8", "surrogatepass")


def _op_long_counted(length: struct.Struct) -> Callable[[_PickleMachine], None]:
    return lambda m: _op_long(m, m.unpack(length))


_OPS: dict[int, Callable[[_PickleMachine], Optional[bool]]] = {
    pickle.PROTO[0]: _op_proto,
    pickle.FRAME[0]: _op_frame,
    pickle.STOP[0]: _op_stop,
    pickle.MARK[0]: lambda m: m.marks.append(len(m.stack)),
    pickle.POP[0]: _op_pop,
    pickle.POP_MARK[0]: _op_pop_mark,
    pickle.DUP[0]: lambda m: m.push(m.stack[-1]),
    pickle.NONE[0]: _op_const(None),
    pickle.NEWTRUE[0]: _op_const(True),
    pickle.NEWFALSE[0]: _op_const(False),
    pickle.INT[0]: _op_int,
    pickle.BININT[0]: _op_unpacked(_I4),
    pickle.BININT1[0]: _op_unpacked(_U1),
    pickle.BININT2[0]: _op_unpacked(_U2),
    pickle.LONG[0]: lambda m: m.push(m.text_number(int)),
    pickle.LONG1[0]: _op_long_counted(_U1),
    pickle.LONG4[0]: _op_long_counted(_I4),
    pickle.FLOAT[0]: lambda m: m.push(m.text_number(float)),
    pickle.BINFLOAT[0]: _op_unpacked(_F8),
    pickle.STRING[0]: _op_string,
    pickle.BINSTRING[0]: _op_counted(_I4, _utf8),
    pickle.SHORT_BINSTRING[0]: _op_counted(_U1, _utf8),
    pickle.BINBYTES[0]: _op_counted(_U4, None),
    pickle.SHORT_BINBYTES[0]: _op_counted(_U1, None),
    pickle.BINBYTES8[0]: _op_counted(_U8, None),
    pickle.BYTEARRAY8[0]: _op_counted(_U8, bytearray),
    pickle.UNICODE[0]: _op_unicode,
    pickle.BINUNICODE[0]: _op_counted(_U4, _utf8),
    pickle.SHORT_BINUNICODE[0]: _op_counted(_U1, _utf8),
    pickle.BINUNICODE8[0]: _op_counted(_U8, _utf8),
    pickle.EMPTY_LIST[0]: _op_empty(list),
    pickle.APPEND[0]: _op_append,
    pickle.APPENDS[0]: _op_appends,
    pickle.LIST[0]: _op_list,
    pickle.EMPTY_TUPLE[0]: lambda m: m.push(()),
    pickle.TUPLE[0]: lambda m: m.push(m.hashed(tuple, m.pop_mark())),
    pickle.TUPLE1[0]: _op_tuple_n(1),
    pickle.TUPLE2[0]: _op_tuple_n(2),
    pickle.TUPLE3[0]: _op_tuple_n(3),
    pickle.EMPTY_DICT[0]: _op_empty(dict),
    pickle.DICT[0]: _op_dict,
    pickle.SETITEM[0]: _op_setitem,
    pickle.SETITEMS[0]: _op_setitems,
    pickle.EMPTY_SET[0]: _op_empty(set),
    pickle.ADDITEMS[0]: _op_additems,
    pickle.FROZENSET[0]: lambda m: m.push(m.hashed(frozenset, m.pop_mark())),
    pickle.GLOBAL[0]: _op_global,
    pickle.STACK_GLOBAL[0]: _op_stack_global,
    pickle.REDUCE[0]: _op_reduce,
    pickle.BUILD[0]: _op_build,
    pickle.BINPERSID[0]: _op_binpersid,
    pickle.PERSID[0]: _op_persid,
    pickle.PUT[0]: lambda m: m.memoize(m.text_number(int)),
    pickle.BINPUT[0]: lambda m: m.memoize(m.unpack(_U1)),
    pickle.LONG_BINPUT[0]: lambda m: m.memoize(m.unpack(_U4)),
    pickle.MEMOIZE[0]: lambda m: m.memoize(len(m.memo)),
    pickle.GET[0]: lambda m: m.recall(m.text_number(int)),
    pickle.BINGET[0]: lambda m: m.recall(m.unpack(_U1)),
    pickle.LONG_BINGET[0]: lambda m: m.recall(m.unpack(_U4)),
}

_OP_TABLE: list[Optional[Callable[[_PickleMachine], Optional[bool]]]] = [_OPS.get(code) for code in range(256)]


def _zip_member(loader: _TorchLoader, zf: zipfile.ZipFile, name: str, nbytes: Optional[int] = None) -> bytes:
    """The first nbytes of an archive entry (all of it for None: refused when its size is over the budget)."""
    info = zf.getinfo(name)
    if info.flag_bits & 0x1:
        raise loader.error(f"the archive's entry {name!r} is encrypted; torch writes no encrypted entries")
    if info.compress_type not in _ZIP_METHODS:
        raise loader.error(
            f"the archive's entry {name!r} uses zip compression method {info.compress_type}; torch writes entries "
            f"uncompressed, and only {' or '.join(_ZIP_METHODS.values())} entries are read"
        )
    if nbytes is None:
        nbytes = info.file_size
        loader.budget.charge(_OBJECT_BYTES + nbytes, f"the archive's entry {name!r} of {nbytes} bytes (uncompressed)")
    try:
        with zf.open(info) as f:
            return f.read(nbytes)  # zipfile stops at the entry's size, whatever its compressed data would give
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise loader.error(f"the archive's entry {name!r} is corrupt: {e}") from e


def _zip_checkpoint(loader: _TorchLoader, zf: zipfile.ZipFile) -> Any:
    names = zf.namelist()
    loader.budget.charge(len(names) * _ZIP_ENTRY_BYTES, f"the archive's directory of {len(names)} entries")
    roots = [n[: -len("/data.pkl")] for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(roots) != 1:
        raise loader.error(f"expected one '<name>/data.pkl' in the zip archive, found {len(roots)}")
    root = roots[0]
    present = set(names)
    big_endian = f"{root}/byteorder" in present and _zip_member(loader, zf, f"{root}/byteorder", 16).strip() == b"big"
    result, _ = loader.load_pickle(_zip_member(loader, zf, f"{root}/data.pkl"))
    for key, st in loader.storages.items():
        if st.view_of is not None:
            continue
        entry = f"{root}/data/{key}"
        if entry not in present:
            raise loader.error(f"the archive has no data for storage {key!r} (expected an entry {entry!r})")
        # read only what the storage needs (charged when the pickle named it): an entry may declare more
        loader.read_storage(key, _zip_member(loader, zf, entry, st.numel * st.dtype.itemsize), 0, big_endian)
    return result


def _legacy_checkpoint(loader: _TorchLoader, data: mmap.mmap) -> Any:
    try:
        magic, pos = loader.load_pickle(data)
    except LoadLimitError:
        raise
    except (ValueError, pickle.UnpicklingError) as e:
        raise loader.error(f"not a PyTorch checkpoint (zip or legacy format): {e}") from e
    if magic != _LEGACY_MAGIC:
        raise loader.error("not a PyTorch checkpoint: no zip archive and no legacy magic number")
    protocol, pos = loader.load_pickle(data, pos)
    if protocol != _LEGACY_PROTOCOL:
        raise loader.error(f"unsupported legacy protocol version {_short_repr(protocol)} (expected {_LEGACY_PROTOCOL})")
    sys_info, pos = loader.load_pickle(data, pos)  # the endianness and type sizes of the machine that saved it
    big_endian = isinstance(sys_info, dict) and sys_info.get("little_endian") is False
    result, pos = loader.load_pickle(data, pos)
    keys, pos = loader.load_pickle(data, pos)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise loader.error("the list of storage keys is malformed")
    for key in keys:
        if key not in loader.storages:
            raise loader.error(f"the file has data for storage {key!r}, which no tensor refers to")
        st = loader.storages[key]
        if pos + 8 > len(data):
            raise loader.error(f"the file ends inside the size of storage {key!r}")
        numel = int.from_bytes(data[pos : pos + 8], "big" if big_endian else "little", signed=True)
        if numel != st.numel:
            raise loader.error(f"storage {key!r} holds {numel} elements, but the pickle says {st.numel}")
        pos += 8
        nbytes = numel * st.dtype.itemsize
        if pos + nbytes > len(data):
            raise loader.error(f"the file ends inside storage {key!r} ({len(data) - pos} of {nbytes} bytes)")
        loader.read_storage(key, data, pos, big_endian)  # a view of the mapped file: copied once, into the tensors
        pos += nbytes
    return result


def torch_load(fn: PathLike) -> Any:
    """The object (usually a state dict) in a PyTorch checkpoint (.pt/.pth/.bin, zip or legacy format), with its
    tensors as tgcore Tensors. Needs no torch, and runs no code from the file: only tensors, storages and
    containers can be rebuilt; any other global is refused with an error that names it. What the file may make it
    build is bounded (TGCORE_LOAD_LIMIT times the file's size, at least 64 MiB); a broadcast tensor (stride 0)
    loads as an expanded view of its elements."""
    name = os.fspath(fn)
    size = os.path.getsize(name)  # (a missing file raises here, with its name)
    loader = _TorchLoader(repr(name), _LoadBudget("torch_load", repr(name), size))
    if zipfile.is_zipfile(name):
        try:
            with zipfile.ZipFile(name) as zf:
                result = _zip_checkpoint(loader, zf)
        except zipfile.BadZipFile as e:
            raise loader.error(f"the zip archive is corrupt: {e}") from e
    elif tarfile.is_tarfile(name):
        raise loader.error(
            "the tar checkpoint format of PyTorch <= 0.3 is not supported; re-save it with a newer torch"
        )
    elif size == 0:
        raise loader.error("not a PyTorch checkpoint: the file is empty")
    else:
        with open(name, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # read where used; storages are views of it
        result = _legacy_checkpoint(loader, data)
    return loader.resolve(result)
