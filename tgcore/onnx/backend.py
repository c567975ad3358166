"""tgcore as an onnx.backend Backend, so onnx's own BackendTest (and any tool written for that interface) runs on it.

ONNX names devices by strings such as CPU: "CPU" is tgcore's default device (DEVICE=NAME picks it), any other
string is read as a tgcore device name (with an instance, NAME:1)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from tgcore.device import Device
from tgcore.onnx import OnnxModel
from tgcore.onnx import run_node as _run_node
from tgcore.onnx.registry import to_numpy


def tgcore_device(device: str) -> str:
    """The tgcore device an onnx device name stands for."""
    return Device.DEFAULT if device.upper() == "CPU" else Device.canonicalize(device)


class TgcoreRep(BackendRep):
    """A prepared model: run() takes inputs by position (or a dict by name), returns outputs in the graph's order."""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feed = dict(zip(self.model.input_names, inputs))
        outs = self.model(feed)
        return tuple(_host(outs[name]) for name in self.model.output_names)


def _host(value: Any) -> Any:
    """numpy arrays out: a sequence as a list of them, an empty optional as None."""
    if isinstance(value, list):
        return [_host(v) for v in value]
    return None if value is None else to_numpy(value)


class TgcoreBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TgcoreRep:
        return TgcoreRep(OnnxModel(model, device=tgcore_device(device)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[Any],
        device: str = "CPU",
        outputs_info: Optional[Sequence[Any]] = None,
        **kwargs: Any,
    ) -> tuple:
        return tuple(_run_node(node, list(inputs), kwargs.get("opset_version"), tgcore_device(device)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device.status(tgcore_device(device)) is None
        except Exception:  # an unknown device name: not supported
            return False


prepare = TgcoreBackend.prepare
run_model = TgcoreBackend.run_model
run_node = TgcoreBackend.run_node
supports_device = TgcoreBackend.supports_device
