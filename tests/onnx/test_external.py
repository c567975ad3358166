"""Initializers in external data files: read lazily from the model's folder, and every location, offset and length a
file names checked before anything is read."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tgcore.onnx import OnnxError, OnnxModel  # noqa: E402

W = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 7
B = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def _saved(folder: str) -> str:
    """A MatMul + Add model whose two initializers live in weights.bin beside it."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def _rewrite(path: str, name: str, **entries: str) -> None:
    """Change the external data entries of initializer `name` (a hostile file)."""
    model = onnx.load(path, load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == name)
    for e in init.external_data:
        if e.key in entries:
            e.value = entries.pop(e.key)
    for key, value in entries.items():
        init.external_data.add(key=key, value=value)
    onnx.save_model(model, path)


def test_external_initializers_are_read_lazily_and_right(tmp_path) -> None:  # noqa: ANN001
    path = _saved(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "weights.bin"]
    model = OnnxModel(path)
    w = model.initializers["w"]
    assert w.lazydata.base.realized is None and id(w) not in model.known  # nothing read, no host copy
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]], np.float32)
    np.testing.assert_allclose(model(x=x)["y"].numpy(), x @ W + B, rtol=1e-6, atol=1e-6)
    assert w.device == model.device
    np.testing.assert_allclose(model(x=2 * x)["y"].numpy(), 2 * x @ W + B, rtol=1e-6, atol=1e-6)


def test_a_proto_without_its_external_data_says_to_pass_the_path(tmp_path) -> None:  # noqa: ANN001
    proto = onnx.load(_saved(str(tmp_path)), load_external_data=False)
    with pytest.raises(OnnxError, match="external file: pass the model's path"):
        OnnxModel(proto, check=False)


@pytest.mark.parametrize(
    "entries, message",
    [
        ({"location": "../outside.bin"}, "leads outside the model's folder"),
        ({"location": "/etc/passwd"}, "must be a path relative"),
        ({"location": "missing.bin"}, "is not in"),
        ({"offset": "40"}, "past its end"),
        ({"offset": "-4"}, "not a whole number"),
        ({"length": "8"}, "is not its size 48 bytes"),
        ({"length": "1e9"}, "not a whole number"),
    ],
)
def test_hostile_external_data_is_refused_before_reading(tmp_path, entries, message) -> None:  # noqa: ANN001
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\x00" * 4096)  # exists, but outside the model's folder
    path = _saved(str(folder))
    _rewrite(path, "w", **entries)
    with pytest.raises(OnnxError, match=message):
        OnnxModel(path, check=False)
    with pytest.raises(Exception):  # noqa: B017 (with the checker on, onnx's checker or tgcore's refuses it)
        OnnxModel(path)


def test_a_symlink_out_of_the_folder_is_refused(tmp_path) -> None:  # noqa: ANN001
    folder = tmp_path / "model"
    folder.mkdir()
    path = _saved(str(folder))
    (tmp_path / "elsewhere.bin").write_bytes((folder / "weights.bin").read_bytes())
    os.replace(folder / "weights.bin", tmp_path / "moved.bin")
    os.symlink(tmp_path / "elsewhere.bin", folder / "weights.bin")
    with pytest.raises(OnnxError, match="leads outside the model's folder"):
        OnnxModel(path, check=False)
