"""python -m tgcore.onnx MODEL.onnx [--device NAME] [--input name=file.npy ...] [--bench N]

Runs a model once (inputs from .npy files; missing ones are zeros of the declared shape, dynamic dimensions 1) and
prints each output's shape, dtype and first values; --bench N times N further runs."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from tgcore.device import Device
from tgcore.onnx import OnnxModel


def _zeros_for(vi: onnx.ValueInfoProto) -> np.ndarray:
    tt = vi.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
    return np.zeros(shape, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgcore.onnx", description="run an ONNX model on a tgcore device")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--device", default=None, help="tgcore device (default: the default device)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a .npy file")
    p.add_argument("--bench", type=int, default=0, metavar="N", help="time N runs after the first")
    args = p.parse_args(argv)
    model = OnnxModel(args.model, device=args.device)
    feed: dict[str, np.ndarray] = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            p.error(f"--input takes NAME=FILE.npy, got {item!r}")
        feed[name] = np.load(path)
    for vi in model.proto.graph.input:
        if vi.name in model.input_names and vi.name not in feed:
            feed[vi.name] = _zeros_for(vi)
    outs = model(feed)
    print(f"{args.model} on {Device.canonicalize(args.device)} (opset {model.opset})")
    for name, t in outs.items():
        v = t.numpy()
        print(f"  {name}: shape {v.shape} {v.dtype} {np.array2string(v.reshape(-1)[:6], precision=4)}")
    if args.bench > 0:
        times = []
        for _ in range(args.bench):
            st = time.perf_counter()
            for t in model(feed).values():
                t.numpy()
            times.append(time.perf_counter() - st)
        print(f"  {args.bench} runs: median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
