"""Models exported from torch (torch.onnx with onnxscript, the dynamo exporter) run on tgcore.onnx and match torch:
a small ResNet (convolutions, BatchNorm folded by the exporter, residual adds, pooling, Gemm) and a two-layer causal
transformer language model (embeddings, LayerNormalization, scaled dot-product attention, GELU); exported with a
dynamic batch dimension (the transformer also with a dynamic sequence length), each runs every size from one
recording."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
nn, F = torch.nn, torch.nn.functional

from tgcore.onnx import OnnxModel  # noqa: E402


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):  # noqa: ANN001, ANN201
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class _ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        self.layers = nn.Sequential(_Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):  # noqa: ANN001, ANN201
        b, t, d = x.shape
        q, k, v = (
            z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, -1)
        )
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _LM(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2, ctx: int = 16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.layers = nn.ModuleList([_Layer(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx):  # noqa: ANN001, ANN201
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


def _export(model: nn.Module, example: torch.Tensor, dynamic: Optional[dict[int, str]] = None):  # noqa: ANN202
    """The ONNX model; `dynamic` names the example's dynamic axes ({0: "batch"}), which become dim_params."""
    shapes = (
        ({a: torch.export.Dim(name, min=2 if a else 1, max=64) for a, name in dynamic.items()},) if dynamic else None
    )
    return torch.onnx.export(model, (example,), dynamo=True, verbose=False, dynamic_shapes=shapes).model_proto


def _run(proto, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    model = OnnxModel(proto)
    assert len(model.input_names) == 1 and len(model.output_names) == 1
    return model(**{model.input_names[0]: x})[model.output_names[0]].numpy()


def test_exported_resnet_matches_torch() -> None:
    torch.manual_seed(0)
    model = _ResNet().eval()
    for m in model.modules():  # statistics and affine parts away from the identity, so BatchNorm is really tested
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    x = torch.randn(2, 3, 64, 64)
    proto = _export(model, x)
    assert {"Conv", "MaxPool", "Add", "Gemm"} <= {n.op_type for n in proto.graph.node}
    with torch.no_grad():
        want = model(x).numpy()
    got = _run(proto, x.numpy())
    assert got.shape == want.shape == (2, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_exported_causal_transformer_matches_torch() -> None:
    torch.manual_seed(0)
    model = _LM().eval()
    idx = torch.randint(0, 100, (2, 16))
    proto = _export(model, idx)
    assert {"Gather", "LayerNormalization", "Softmax", "MatMul"} <= {n.op_type for n in proto.graph.node}
    with torch.no_grad():
        want = model(idx).numpy()
    got = _run(proto, idx.numpy())
    assert got.shape == want.shape == (2, 16, 100)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # causal: changing the last token leaves every earlier position's logits as they were
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % 100
    got2 = _run(proto, idx2.numpy())
    np.testing.assert_allclose(got2[:, :-1], got[:, :-1], rtol=1e-5, atol=1e-5)
    assert np.abs(got2[:, -1] - got[:, -1]).max() > 1e-3


def _resnet() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _ResNet().eval(), torch.randn(2, 3, 32, 32)


def _lm() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _LM().eval(), torch.randint(0, 100, (2, 16))


def _lm_prompt() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _LM().eval(), torch.randint(0, 100, (1, 8))


@pytest.mark.parametrize(
    "make, dynamic, shapes",
    [
        (_resnet, {0: "batch"}, [(3, 3, 32, 32), (1, 3, 32, 32)]),
        (_lm, {0: "batch"}, [(3, 16), (1, 16)]),
        (_lm_prompt, {1: "seq"}, [(1, 5), (1, 16)]),  # (positions from a Range of it, a causal mask of its size)
    ],
    ids=["resnet-batch", "transformer-batch", "transformer-seq"],
)
def test_exported_with_a_dynamic_axis_one_recording_serves_each_size(make, dynamic, shapes) -> None:  # noqa: ANN001
    """torch exports a dynamic axis as a dim_param (and the reshapes that read it as Shape -> Slice -> Concat chains):
    each of two sizes, then each again, matches torch, and the graph is walked twice in all (a plain run, the
    recording)."""
    model, example = make()
    proto = _export(model, example, dynamic)
    assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim if d.dim_param]
    onnx_model = OnnxModel(proto)
    walks = [0]
    run = onnx_model._run

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        walks[0] += 1
        return run(*args, **kwargs)

    onnx_model._run = counting
    name, out = onnx_model.input_names[0], onnx_model.output_names[0]
    for shape in shapes + shapes:
        x = torch.randn(shape) if example.is_floating_point() else torch.randint(0, 100, shape)
        with torch.no_grad():
            want = model(x).numpy()
        got = onnx_model(**{name: x.numpy()})[out].numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert walks[0] == 2, onnx_model.symbolic_fallback
