"""Initializers stored outside the model file (ONNX external data): checked, then read lazily through the DISK device.

Each external tensor names a file (`location`, relative to the model's folder), an `offset` and a `length`. Nothing
the file names is trusted: the location must stay inside the model's folder (no absolute path, no `..`, no symlink
out of it), offset and length must be whole numbers inside the file, and the length must be the tensor's size. The
tensor is then a view of the file's bytes on DISK, copied to the model's device when a run first reads it (and kept
there), so loading costs nothing but the checks, and no host copy of the weights stays around.
"""

from __future__ import annotations

import os

import onnx

from tgcore.dtype import DType, dtypes
from tgcore.helpers import prod
from tgcore.onnx.errors import OnnxError
from tgcore.onnx.registry import onnx_to_dtype
from tgcore.tensor import Tensor


def is_external(init: onnx.TensorProto) -> bool:
    return init.data_location == onnx.TensorProto.EXTERNAL


def _entries(init: onnx.TensorProto) -> dict[str, str]:
    entries = {e.key: e.value for e in init.external_data}
    unknown = set(entries) - {"location", "offset", "length", "checksum", "basepath"}
    if unknown:
        raise OnnxError(f"initializer {init.name!r}: unknown external data keys {sorted(unknown)}")
    if not entries.get("location"):
        raise OnnxError(f"initializer {init.name!r} is stored externally but names no location")
    return entries


def _whole(init: onnx.TensorProto, key: str, text: str) -> int:
    if not text.isdigit():
        raise OnnxError(f"initializer {init.name!r}: external data {key} {text!r} is not a whole number >= 0")
    return int(text)


def resolve(init: onnx.TensorProto, folder: str) -> tuple[str, int, int, DType]:
    """(the real path of the file, offset, length, dtype) of an external initializer, each checked against `folder`."""
    entries = _entries(init)
    location = entries["location"]
    if os.path.isabs(location) or "\x00" in location:
        raise OnnxError(
            f"initializer {init.name!r}: external data location {location!r} must be a path relative to the "
            "model's folder"
        )
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise OnnxError(
            f"initializer {init.name!r}: external data location {location!r} leads outside the model's folder "
            f"{root!r}; a model may only read files beside it"
        )
    if not os.path.isfile(path):
        raise OnnxError(f"initializer {init.name!r}: external data file {location!r} is not in {root!r}")
    size = os.path.getsize(path)
    offset = _whole(init, "offset", entries.get("offset", "0"))
    dtype = onnx_to_dtype(init.data_type, "(initializer)")
    if any(d < 0 for d in init.dims):
        raise OnnxError(f"initializer {init.name!r} has a negative dimension: {list(init.dims)}")
    want = prod(init.dims) * dtype.itemsize
    length = _whole(init, "length", entries["length"]) if "length" in entries else want
    if length != want:
        raise OnnxError(
            f"initializer {init.name!r}: external data length {length} is not its size {want} bytes "
            f"({list(init.dims)} of {dtype.name})"
        )
    if offset + length > size:
        raise OnnxError(
            f"initializer {init.name!r}: bytes {offset}..{offset + length} of {location!r} are past its end "
            f"({size} bytes)"
        )
    return path, offset, length, dtype


def load(init: onnx.TensorProto, folder: str, device: str) -> Tensor:
    """The external initializer as a lazy tensor on `device`: a checked view of the file, read at first use."""
    path, offset, length, dtype = resolve(init, folder)
    shape = tuple(init.dims)
    if length == 0:
        return Tensor.zeros(*shape, dtype=dtype, device=device).contiguous()
    data = Tensor.empty(os.path.getsize(path), dtype=dtypes.uint8, device=f"disk:{path}")
    return data[offset : offset + length].bitcast(dtype).reshape(shape).to(device)
