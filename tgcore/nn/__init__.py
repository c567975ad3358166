"""Neural network layers, with tinygrad 0.9.0's names, constructor arguments, defaults and parameter shapes.

A layer is a plain object whose Tensor attributes are its parameters (see tgcore.nn.state.get_state_dict);
calling it applies the layer.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import tgcore.function as F
from tgcore.errors import ShapeError
from tgcore.helpers import all_int, prod
from tgcore.nn import optim, state  # noqa: F401  (tinygrad exposes them as nn.optim and nn.state)
from tgcore.tensor import Tensor, _gathers, _index_outside, _with_check

__all__ = [
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Embedding",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "LayerNorm2d",
    "Linear",
    "optim",
    "state",
]


def _concrete(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """shape, checked to hold no symbolic dimension."""
    if not all_int(shape):
        raise ValueError(f"this layer needs a concrete shape, got the symbolic shape {shape}")
    return shape


def _channel_shape(x: Tensor) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel vector against x, whose axis 1 is the channel axis."""
    return (1, -1) + (1,) * (x.ndim - 2)


class Linear:
    """y = x @ weight.T + bias; weight (out_features, in_features) and bias uniform in +-1/sqrt(in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        # kaiming_uniform with a=sqrt(5) is torch's default: uniform in +-1/sqrt(in_features)
        self.weight = Tensor.kaiming_uniform(out_features, in_features, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_features)
        self.bias: Optional[Tensor] = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
    """2D convolution of (N, in_channels, H, W) inputs; weight (out_channels, in_channels // groups, *kernel_size).

    `kernel_size` may also be a tuple of any length: one entry per spatial axis (Conv1d uses one).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, tuple[int, ...]],
        stride: Union[int, tuple[int, ...]] = 1,
        padding: Union[int, tuple[int, ...]] = 0,
        dilation: Union[int, tuple[int, ...]] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})"
            )
        self.kernel_size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.weight = self.initialize_weight(out_channels, in_channels, groups)
        bound = 1 / math.sqrt(prod(_concrete(self.weight.shape[1:])))
        self.bias: Optional[Tensor] = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(
            self.weight, self.bias, padding=self.padding, stride=self.stride, dilation=self.dilation, groups=self.groups
        )

    def initialize_weight(self, out_channels: int, in_channels: int, groups: int) -> Tensor:
        return Tensor.kaiming_uniform(out_channels, in_channels // groups, *self.kernel_size, a=math.sqrt(5))


class Conv1d(Conv2d):
    """1D convolution of (N, in_channels, L) inputs; weight (out_channels, in_channels // groups, kernel_size)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, tuple[int]],
        stride: Union[int, tuple[int]] = 1,
        padding: Union[int, tuple[int]] = 0,
        dilation: Union[int, tuple[int]] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        kernel = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        super().__init__(in_channels, out_channels, kernel, stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
    """2D transposed convolution; weight (in_channels, out_channels // groups, *kernel_size), as in torch."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, tuple[int, ...]],
        stride: Union[int, tuple[int, ...]] = 1,
        padding: Union[int, tuple[int, ...]] = 0,
        output_padding: Union[int, tuple[int, ...]] = 0,
        dilation: Union[int, tuple[int, ...]] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        self.output_padding = output_padding

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight,
            self.bias,
            padding=self.padding,
            output_padding=self.output_padding,
            stride=self.stride,
            dilation=self.dilation,
            groups=self.groups,
        )

    def initialize_weight(self, out_channels: int, in_channels: int, groups: int) -> Tensor:
        return Tensor.kaiming_uniform(in_channels, out_channels // groups, *self.kernel_size, a=math.sqrt(5))


class ConvTranspose1d(ConvTranspose2d):
    """1D transposed convolution; weight (in_channels, out_channels // groups, kernel_size)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Union[int, tuple[int]],
        stride: Union[int, tuple[int]] = 1,
        padding: Union[int, tuple[int]] = 0,
        output_padding: Union[int, tuple[int]] = 0,
        dilation: Union[int, tuple[int]] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        kernel = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        super().__init__(in_channels, out_channels, kernel, stride, padding, output_padding, dilation, groups, bias)


class BatchNorm2d:
    """Batch normalization over axis 1 of (N, C, ...) inputs.

    In training mode (Tensor.training) it normalizes with the batch's statistics and, if track_running_stats,
    updates running_mean and running_var (unbiased) with `momentum`; otherwise it uses the running statistics.
    """

    def __init__(
        self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1
    ) -> None:
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Optional[Tensor] = Tensor.ones(sz) if affine else None
        self.bias: Optional[Tensor] = Tensor.zeros(sz) if affine else None
        self.running_mean = Tensor.zeros(sz, requires_grad=False)
        self.running_var = Tensor.ones(sz, requires_grad=False)
        self.num_batches_tracked = Tensor.zeros(1, requires_grad=False)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise ShapeError(f"BatchNorm2d needs an input of shape (N, C, ...), got {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))
        if Tensor.training:
            batch_mean = x.mean(axis=axes)
            # the mean is detached in the variance: d(var)/d(mean) is 0 anyway, and this keeps the graph small
            centered = x - batch_mean.detach().reshape(_channel_shape(x))
            batch_var = (centered * centered).mean(axis=axes)
            # 1 / sqrt, as in inference below (and in torch): pow(-0.5) was a float64 log2 and exp2 for every element
            # of the backward's kernels, and its gradient another pow (bench h's CNN training step: 267 -> 121 ms)
            batch_invstd = batch_var.add(self.eps).rsqrt()
            if self.track_running_stats:
                # momentum with Bessel's correction: numel / (numel - C) = m / (m - 1) for m values per channel
                numel = prod(_concrete(x.shape))
                var_scale = self.momentum * numel / (numel - x.shape[1]) if numel > x.shape[1] else self.momentum
                self.running_mean.assign(
                    ((1 - self.momentum) * self.running_mean + self.momentum * batch_mean.detach()).cast(
                        self.running_mean.dtype
                    )
                )
                self.running_var.assign(
                    ((1 - self.momentum) * self.running_var + var_scale * batch_var.detach()).cast(
                        self.running_var.dtype
                    )
                )
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            batch_mean = self.running_mean
            batch_invstd = self.running_var.reshape(_channel_shape(x)).expand(x.shape).add(self.eps).rsqrt()
        return x.batchnorm(self.weight, self.bias, batch_mean, batch_invstd)


class GroupNorm:
    """Group normalization: the channels of (N, C, ...) inputs are split into num_groups, each normalized alone."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        if num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight: Optional[Tensor] = Tensor.ones(num_channels) if affine else None
        self.bias: Optional[Tensor] = Tensor.zeros(num_channels) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return x
        return x * self.weight.reshape(_channel_shape(x)) + self.bias.reshape(_channel_shape(x))


class InstanceNorm:
    """Instance normalization: every channel of every sample of (N, C, ...) inputs is normalized alone."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        self.num_features, self.eps = num_features, eps
        self.weight: Optional[Tensor] = Tensor.ones(num_features) if affine else None
        self.bias: Optional[Tensor] = Tensor.zeros(num_features) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], self.num_features, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return x
        return x * self.weight.reshape(_channel_shape(x)) + self.bias.reshape(_channel_shape(x))


class LayerNorm:
    """Layer normalization over the last len(normalized_shape) axes, with an elementwise affine of that shape."""

    def __init__(
        self, normalized_shape: Union[int, tuple[int, ...]], eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight: Optional[Tensor] = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
        self.bias: Optional[Tensor] = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-len(self.normalized_shape) :]) != self.normalized_shape:
            raise ShapeError(
                f"the last axes of the input {x.shape} must be the normalized shape {self.normalized_shape}"
            )
        x = x.layernorm(eps=self.eps, axis=self.axis)
        if self.weight is None or self.bias is None:
            return x
        return x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel axis of (N, C, H, W) inputs."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Embedding:
    """A lookup table: integer indices of any shape -> rows of weight (vocab_size, embed_size)."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        if idx.numel() == 0:
            return Tensor.zeros(*idx.shape, self.embed_sz, dtype=self.weight.dtype, device=self.weight.device)
        bad = _index_outside(idx, 0, self.vocab_sz)
        message = f"Embedding index out of range for {self.vocab_sz} rows"
        k, dim = idx.ndim, self.embed_sz
        out_shape = (*idx.shape, 1, dim)
        if _gathers(self.weight, idx, out_shape):
            # each row loaded at its index: the table seen as (1, ..., 1, vocab, dim), broadcast over the indices
            table = self.weight.reshape((1,) * k + (self.vocab_sz, dim))
            index = idx.reshape((*idx.shape, 1, 1))._broadcast_to(out_shape)
            out = F.Gather.apply(table, index, axis=k).reshape((*idx.shape, dim))
            return _with_check(out, bad, message)
        # else (a sharded table, float indices) a row is picked by a one-hot mask (where, not multiply, so inf/NaN in
        # other rows cannot leak in); the arange is not stored on the layer so that it never shows up in the state dict
        vocab = Tensor.arange(self.vocab_sz, requires_grad=False, device=self.weight.device).reshape(self.vocab_sz, 1)
        hit = idx.reshape(*idx.shape, 1, 1) == vocab
        out = hit.where(self.weight, 0).sum(-2)
        return _with_check(out, bad, message)
