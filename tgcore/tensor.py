"""Tensor: the user-facing array with autograd, in the API of tinygrad 0.9.0."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import string
from typing import Any, Callable, ClassVar, Iterable, Optional, Sequence, Union

import numpy as np

import tgcore.function as F
from tgcore import storage
from tgcore.device import Buffer, Device
from tgcore.dtype import ConstType, DType, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from tgcore.engine.realize import run_schedule
from tgcore.engine.schedule import ScheduleItem, create_schedule_with_vars
from tgcore.errors import AxisError, IndexOutOfRangeError, InvalidValueError, ShapeError
from tgcore.function import Function
from tgcore.helpers import ENGINE_LOCK, ContextVar, all_int, argfix, flatten, make_pair, prod
from tgcore.lazy import LazyBuffer
from tgcore.multi import MultiLazyBuffer
from tgcore.ops import BinaryOps, LoadOps, ReduceOps
from tgcore.registry import plugins
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import Node, NumNode, Variable, sint, sym_infer

__all__ = ["Tensor", "Function"]


def _np_for(dt: DType) -> type:
    return np.float32 if dt == dtypes.bfloat16 else dt.np  # type: ignore[return-value]


def _from_python(data: Any, dtype: Optional[DType]) -> np.ndarray:
    """A numpy array of `dtype` from nested lists/tuples or scalars, checking the nesting is rectangular."""
    dt = dtype or dtypes.from_py(data)
    try:
        arr = np.array(data, dtype=_np_for(dt)) if dt != dtypes.bool else np.array(data, dtype=np.bool_)
    except ValueError as e:
        raise ValueError(f"cannot make a tensor from {type(data).__name__}: {e}") from e
    if arr.dtype == object:
        raise ValueError("cannot make a tensor from a ragged nested list: every row must have the same length")
    return arr


# a convolution with at least this many output positions (batch x spatial) reads its weights laid out with the output
# channel innermost (see Tensor._conv_forward); with fewer the copy costs more than the gathers it saves (CLANG,
# batch 1: 512->512 3x3 at 7x7 6.9 -> 2.5 ms without it, 1024->2048 1x1 13 -> 3.4 ms, 128->128 at 28x28 2.4 -> 2.3 ms)
CONV_RELAYOUT_POSITIONS = 2048
# output channels (of a group) from which a conv's weight gradient reads the output's gradient channels last
CONV_VECTOR_CHANNELS = 8
# a depthwise conv's output positions, flattened over rows of the padded width, are computed in runs of this many (the
# widest vector of any CPU target), so a kernel's vectors along them never straddle the end (see _conv_depthwise_flat)
DEPTHWISE_FLAT_RUN = 16
DEPTHWISE_FLAT_STRIDES = {(1, 1), (2, 2)}
# a padded stride-1 conv of at most this many input channels reads a padded copy of its input (see Tensor._conv_forward)
CONV_PREPAD_CHANNELS = 16


def _window_positions(n: sint, k: int, stride: int, dilation: int) -> sint:
    """The positions of a window of k taps (dilation, stride) along an axis of size n; a window that does not fit
    raises."""
    o = (n - dilation * (k - 1) - 1) // stride + 1
    if k < 1 or stride < 1 or dilation < 1 or o < 1:
        raise ShapeError(
            f"a window of {k} taps (dilation {dilation}, stride {stride}) does not fit an axis of size {n}"
        )
    return o


def _unrecorded(out: LazyBuffer, *inputs: Tensor) -> Tensor:
    """The Tensor of an op's result built without its Function (nothing recorded for backward), made as
    Function.apply makes one: requires_grad True where an input requires a gradient, else None where one has not
    said, else False."""
    needs = [t.requires_grad for t in inputs]
    ret = Tensor.__new__(Tensor)
    ret.lazydata, ret.grad, ret._ctx = out, None, None
    ret.requires_grad = True if any(needs) else None if None in needs else False
    return ret


def _conv_relayout(per_group: sint, positions: sint) -> bool:
    """Whether a conv copies its weights with the output channel innermost, each call: the conv kernel then loads a
    vector of output channels at once instead of gathering them (CLANG conv2d 64->64 at 56x56: 3.0 -> 2.0 ms with the
    copy); worth it where the kernel reads each weight often."""
    return per_group > 1 and (not isinstance(positions, int) or positions >= CONV_RELAYOUT_POSITIONS)


class Tensor:
    """A lazily evaluated n-dimensional array on a device, with reverse-mode autograd."""

    __slots__ = "lazydata", "requires_grad", "grad", "_ctx"
    __deletable__ = ("_ctx",)
    training: ClassVar[bool] = False
    no_grad: ClassVar[bool] = False

    def __init__(
        self,
        data: Union[None, ConstType, list, tuple, LazyBuffer, np.ndarray, bytes, Variable, Tensor],
        device: Optional[str] = None,
        dtype: Optional[Union[DType, str]] = None,
        requires_grad: Optional[bool] = None,
    ) -> None:
        dt = to_dtype(dtype) if dtype is not None else None
        self.grad: Optional[Tensor] = None
        self.requires_grad: Optional[bool] = requires_grad
        self._ctx: Optional[Function] = None
        if isinstance(data, Tensor):
            data = data.lazydata
        if isinstance(data, MultiLazyBuffer) or isinstance(device, (tuple, list)):
            self.lazydata = _multi_lazydata(data, device, dt)
            return
        if isinstance(data, LazyBuffer):  # (its device is the tensor's: the default device is not looked up)
            if dt is not None and dt != data.dtype:
                raise TypeError(f"a LazyBuffer of {data.dtype} cannot become a tensor of {dt}; use .cast()")
            self.lazydata = data
            return
        device = Device.canonicalize(device)
        if data is None:
            lb = LazyBuffer.loadop(LoadOps.EMPTY, (0,), dt or dtypes.default_float, device)
        elif isinstance(data, Variable):  # a symbolic scalar, bound when a kernel runs
            lb = LazyBuffer.loadop(LoadOps.CONST, (), dt or dtypes.int32, device, data)
        elif isinstance(data, (bool, int, float, np.generic)) and not isinstance(data, np.ndarray):
            dt = dt or dtypes.from_py(data.item() if isinstance(data, np.generic) else data)
            lb = LazyBuffer.loadop(LoadOps.CONST, (), dt, device, data.item() if isinstance(data, np.generic) else data)
        elif isinstance(data, bytes):
            lb = LazyBuffer.fromcpu(np.frombuffer(data, np.uint8), device, dtypes.uint8)
        elif isinstance(data, (list, tuple)):
            arr = _from_python(data, dt)
            target = dt or (dtypes.from_py(data) if arr.size else dtypes.default_float)
            lb = LazyBuffer.fromcpu(arr, device, dtypes.from_np(arr.dtype))
            if lb.dtype != target:  # bfloat16 has no numpy type: its values arrive as float32
                lb = lb.cast(target)
        elif isinstance(data, np.ndarray):
            if data.dtype == object:
                raise TypeError("cannot make a tensor from a numpy array of Python objects")
            src_dt = dtypes.from_np(data.dtype)
            lb = LazyBuffer.fromcpu(data, device, src_dt)
            if dt is not None and dt != src_dt:
                lb = lb.cast(dt)
        else:
            raise TypeError(
                f"cannot make a tensor from {type(data).__name__}: expected a number, a (nested) list, "
                "a numpy array, bytes or a LazyBuffer"
            )
        if lb.device != device and device is not None:
            lb = lb.copy_to_device(device)
        self.lazydata = lb

    def __repr__(self) -> str:
        grad = self.grad.lazydata if self.grad is not None else None
        return f"<Tensor {self.lazydata!r} on {self.device} with grad {grad!r}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor is ambiguous; use .item() or compare explicitly")

    def __getattr__(self, name: str) -> Any:
        """tinygrad's device shortcuts, for every registered device: t.python() is t.to("PYTHON")."""
        if not name.startswith("_") and name.upper() in Device.specs():
            return functools.partial(self.to, name.upper())
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return int(self.shape[0])

    # ***** properties *****

    @property
    def device(self) -> str:
        return self.lazydata.device

    @property
    def shape(self) -> tuple[sint, ...]:
        return self.lazydata.shape

    @property
    def dtype(self) -> DType:
        return self.lazydata.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> sint:
        return prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return int(self.numel()) * self.element_size()

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def size(self, dim: Optional[int] = None) -> Union[sint, tuple[sint, ...]]:
        """The shape, or the size of axis `dim`."""
        return self.shape if dim is None else self.shape[self._resolve_dim(dim)]

    @property
    def T(self) -> Tensor:
        """The first two axes swapped (tinygrad's); a tensor of fewer than 2 dimensions itself (numpy's, torch's)."""
        return self.transpose() if self.ndim >= 2 else self

    class train(contextlib.ContextDecorator):
        """`with Tensor.train():` or `@Tensor.train()`: set Tensor.training to `mode` inside, restore it after."""

        flag = "training"

        def __init__(self, mode: bool = True) -> None:
            self.mode = mode

        def __enter__(self) -> None:
            self.prev = getattr(Tensor, self.flag)
            setattr(Tensor, self.flag, self.mode)

        def __exit__(self, *exc: Any) -> None:
            setattr(Tensor, self.flag, self.prev)

    class inference_mode(train):
        """`with Tensor.inference_mode():` or as a decorator: set Tensor.no_grad to `mode` inside, restore it after."""

        flag = "no_grad"

    # ***** realization *****

    def schedule_with_vars(self, *lst: Tensor) -> tuple[list[ScheduleItem], dict[Variable, int]]:
        if not lst and type(self.lazydata) is LazyBuffer:  # one tensor on one device: the common case
            return create_schedule_with_vars([self.lazydata])
        lbs = [
            lb
            for x in (self, *lst)
            for lb in (x.lazydata.lbs if isinstance(x.lazydata, MultiLazyBuffer) else [x.lazydata])
        ]
        return create_schedule_with_vars(lbs)

    def schedule(self, *lst: Tensor) -> list[ScheduleItem]:
        return self.schedule_with_vars(*lst)[0]

    def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
        """Compute this tensor (and `lst`) now (`do_update_stats` is accepted for tinygrad; stats are always kept)."""
        with ENGINE_LOCK:
            run_schedule(*self.schedule_with_vars(*lst))
        return self

    def contiguous(self) -> Tensor:
        return F.Contiguous.apply(self)

    def clone(self) -> Tensor:
        """A copy in memory of its own (as torch's clone; contiguous() keeps a contiguous tensor's memory); gradients
        flow through it."""
        return F.Clone.apply(self)

    def contiguous_backward(self) -> Tensor:
        return F.ContiguousBackward.apply(self)

    def detach(self) -> Tensor:
        return Tensor(self.lazydata, device=self.device, requires_grad=False)

    def _buffer(self) -> Buffer:
        if isinstance(self.lazydata, MultiLazyBuffer):
            return self.to(self.lazydata.device[0])._buffer()
        x = self.cast(self.dtype.scalar()).contiguous().realize()
        buf = x.lazydata.base.realized
        assert buf is not None
        return buf

    def numpy(self) -> np.ndarray:
        """A numpy copy of the data (bfloat16 comes back as float32)."""
        if not all_int(self.shape):
            raise ValueError(f"cannot make a numpy array of a symbolic shape {self.shape}")
        if 0 in self.shape:
            return np.zeros(self.shape, dtype=_np_for(self.dtype))
        return self._buffer().numpy().reshape(self.shape)

    def data(self) -> memoryview:
        """The data as a memoryview of the tensor's shape."""
        arr = self.numpy()
        if not arr.ndim or not arr.size:
            return memoryview(arr)
        return memoryview(np.ascontiguousarray(arr)).cast("B").cast(arr.dtype.char, arr.shape)

    def item(self) -> ConstType:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor of one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: Optional[Union[str, tuple[str, ...]]]) -> Tensor:
        """This tensor on `device` (the same tensor when it is already there); a tuple of devices replicates it."""
        if isinstance(device, (tuple, list)):
            return self.shard(device)
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        if isinstance(self.lazydata, MultiLazyBuffer):
            ret = Tensor(self.lazydata.copy_to_device(device), device, requires_grad=self.requires_grad)
        else:
            ret = F.Copy.apply(self, device=device)  # the gradient flows back to this device
        if self.grad is not None:
            ret.grad = self.grad.to(device)
        return ret

    def shard(self, devices: Sequence[str], axis: Optional[int] = None) -> Tensor:
        """This tensor split along `axis` over `devices` (replicated on each when axis is None)."""
        if isinstance(self.lazydata, MultiLazyBuffer):
            raise ValueError(f"tensor is already sharded over {self.device}; gather it with .to(device) first")
        canonical = tuple(Device.canonicalize(d) for d in devices)
        if len(set(canonical)) != len(canonical) or not canonical:
            raise ValueError(f"shard needs distinct devices, got {tuple(devices)}")
        ax = self._resolve_dim(axis) if axis is not None else None
        mlb = MultiLazyBuffer.from_sharded(self.lazydata, canonical, ax)
        return Tensor(mlb, device=canonical, requires_grad=self.requires_grad)

    def shard_(self, devices: Sequence[str], axis: Optional[int] = None) -> Tensor:
        """Shard this tensor in place."""
        self.lazydata = self.shard(devices, axis).lazydata
        return self

    def to_(self, device: Optional[str]) -> Tensor:
        """Move this tensor to `device` in place."""
        moved = self.to(device)
        self.lazydata, self.grad = moved.lazydata, moved.grad
        return self

    def assign(self, x: Any) -> Tensor:
        """Write `x` into this tensor's memory (shapes, dtypes and devices must match).

        A tensor that is a view of another one's memory (a reshape, permute, shrink, flip or slice of it) writes
        through into that memory at once, as in numpy and torch: the other tensor, and every view of it, see the new
        values (a base not computed yet is computed first). A pad or an expand is not a view of memory (numpy and
        torch make a new array): its tensor alone takes the new value. Assigning into a tensor of its own memory
        that is computed is lazy: the write happens when it is realized."""
        if type(self.lazydata) is LazyBuffer and Device.storage_only(self.lazydata.device):  # written now, any device
            return storage.assign(self, x)
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape or x.dtype != self.dtype or x.device != self.device:
            raise ShapeError(
                f"assign needs the same shape, dtype and device: target {self.shape} {self.dtype} "
                f"{self.device}, value {x.shape} {x.dtype} {x.device}"
            )
        if self.lazydata is x.lazydata:
            return self
        if isinstance(self.lazydata, MultiLazyBuffer):
            self.lazydata = self.lazydata.assign(x.lazydata) if self.lazydata.realized else x.lazydata
            return self
        lb = self.lazydata
        if lb._base is not None:
            if lb.writes_through():
                _write_through(lb, x.lazydata)
            else:
                self.lazydata = x.lazydata
            return self
        if lb.realized is None:
            self.lazydata = x.lazydata
            return self
        src = x.lazydata
        if _assign_hazard(src, lb):  # computed apart first, so no kernel reads what it overwrites
            src = src.contiguous()
        self.lazydata = lb.assign(src)
        return self

    def replace(self, x: Tensor) -> Tensor:
        """Make this tensor hold `x`'s data (same shape)."""
        if x.shape != self.shape:
            raise ShapeError(f"replace needs the same shape, got {x.shape} for {self.shape}")
        self.lazydata = x.lazydata
        return self

    # ***** creation *****

    @staticmethod
    def _loadop(
        op: LoadOps,
        shape: tuple[sint, ...],
        device: Optional[str] = None,
        dtype: Optional[Union[DType, str]] = None,
        arg: Any = None,
        **kwargs: Any,
    ) -> Tensor:
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return Tensor(LazyBuffer.loadop(op, shape, dt, Device.canonicalize(device), arg), device, dt, **kwargs)

    @staticmethod
    def empty(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor._loadop(LoadOps.EMPTY, _shape(shape), **kwargs)

    @staticmethod
    def full(shape: Union[sint, tuple[sint, ...]], fill_value: ConstType, **kwargs: Any) -> Tensor:
        shape = _shape((shape,) if isinstance(shape, int) else tuple(shape))
        dtype = to_dtype(kwargs.pop("dtype", None) or dtypes.from_py(fill_value))
        if isinstance(fill_value, np.generic):
            fill_value = fill_value.item()
        if not isinstance(fill_value, (bool, int, float)):
            raise TypeError(f"full needs a number to fill with, got {type(fill_value).__name__}")
        if isinstance(kwargs.get("device"), (tuple, list)):  # replicated on several devices
            return Tensor(fill_value, dtype=dtype, **kwargs).reshape((1,) * len(shape)).expand(shape)
        # a constant of the whole shape, not a broadcast of one element: a tensor of its own memory (computed if it is
        # ever written into), so a view of it writes through as any other tensor's does
        return Tensor._loadop(LoadOps.CONST, shape, dtype=dtype, arg=dtypes.as_const(fill_value, dtype), **kwargs)

    @staticmethod
    def zeros(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(_shape(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})

    @staticmethod
    def ones(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(_shape(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})

    @staticmethod
    def arange(start: ConstType, stop: Optional[ConstType] = None, step: ConstType = 1, **kwargs: Any) -> Tensor:
        """Evenly spaced values in [start, stop)."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange step must not be 0")
        dtype = kwargs.pop("dtype", None) or (
            dtypes.default_float if any(isinstance(x, float) for x in (start, stop, step)) else dtypes.default_int
        )
        arr = np.arange(start, stop, step, dtype=_np_for(to_dtype(dtype)))
        return Tensor(arr, dtype=dtype, **kwargs)

    @staticmethod
    def eye(dim: int, **kwargs: Any) -> Tensor:
        if dim < 0:
            raise ValueError(f"eye needs dim >= 0, got {dim}")
        return (
            Tensor.ones((dim, 1), **kwargs).pad((None, (0, dim))).flatten().shrink(((0, dim * dim),)).reshape(dim, dim)
        )

    def full_like(self, fill_value: ConstType, **kwargs: Any) -> Tensor:
        return Tensor.full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kwargs})

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    # ***** random numbers *****
    # Threefry-2x32 (20 rounds) is counter based: each 32-bit word is a pure function of (seed, call number, index),
    # computed by a kernel on the tensor's device from integer adds, xors and shifts, so every device draws the same
    # bits for a seed. The call number lives in a small buffer on the device that each draw bumps in place, so a
    # TinyJit replay draws fresh numbers too.
    _seed: ClassVar[int] = 0
    _rng_counters: ClassVar[dict[str, Tensor]] = {}

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Restart every random stream from `seed`."""
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError(f"manual_seed needs an int, got {type(seed).__name__}")
        Tensor._seed, Tensor._rng_counters = int(seed), {}

    @staticmethod
    def _random_bits(n: int, device: str, key: Optional[int] = None) -> Tensor:
        """`n` fresh uniformly distributed uint32 words on `device`, under the generator's 64-bit `key` (default: the
        seed of manual_seed; an ONNX node's own seed picks another stream: tgcore/onnx/ops_random.py)."""
        if Device.storage_only(device):  # (its counter would be written into the file, then no kernel could run)
            raise ValueError(
                f"{device} holds data and runs no kernels, so it cannot draw random numbers: draw them on a compute "
                f"device and copy them, e.g. Tensor.rand(...).to({device!r})"
            )
        if n >= 2**33:
            raise ValueError(f"cannot draw {n} random numbers at once: at most 2**33 - 1")
        with ENGINE_LOCK:  # one draw's number per call, whatever other threads draw meanwhile
            counter = Tensor._rng_counters.get(device)
            if counter is None:
                counter = Tensor._rng_counters[device] = Tensor(np.zeros(1, np.uint32), device=device)
            counter.assign(counter + 1)
            call = counter - 1  # this draw's number, in a buffer the next draw does not touch
            call.realize(counter)  # one schedule: its two kernels compile at once (engine/realize.py)
        # word i is the first word of counter i for i < pairs, the second of counter i - pairs after: computed as
        # (2, pairs) words in a kernel of their own, each column one counter's two (the optimizer gives a column's two
        # lanes the rounds once: Kernel._shared_lanes), picked by row, and read from memory by what uses them; a cat
        # of the two halves, fused into its reader, padded every constant of the rounds into a select and ran each
        # counter's rounds twice (2.4M words: 41 -> 10 ms)
        pairs = (n + 1) // 2
        counter = _uint32_range(pairs, device).reshape(1, pairs).expand(2, pairs)
        x0, x1 = _threefry2x32(counter, call.reshape(1, 1).expand(2, pairs), Tensor._seed if key is None else key)
        second = Tensor(np.array([[False], [True]]), device=device).expand(2, pairs)
        return second.where(x1, x0).contiguous().flatten().shrink(((0, n),))

    @staticmethod
    def _random_leaf(out: Tensor, device: str, requires_grad: Optional[bool]) -> Tensor:
        return Tensor(out.lazydata, device=device, requires_grad=requires_grad)

    @staticmethod
    def rand(
        *shape: Any,
        device: Optional[str] = None,
        dtype: Optional[Union[DType, str]] = None,
        requires_grad: Optional[bool] = None,
    ) -> Tensor:
        """Uniform in [0, 1): every value is a multiple of 2**-m, m the dtype's mantissa bits (+1)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if not dtypes.is_float(dt):  # drawn as float32 and cast, as tinygrad 0.9.0 does (an int is 0, a bool True)
            out = Tensor.rand(*shape, device=device, dtype=dtypes.float32).cast(dt)
            return Tensor._random_leaf(out, out.device, requires_grad)
        s, dev = _shape(shape), Device.canonicalize(device)
        if not all_int(s):
            raise ValueError(f"rand needs a concrete shape, got {s}")
        n = prod(s)
        if n == 0:
            return Tensor.zeros(s, dtype=dt, device=dev, requires_grad=requires_grad)
        return Tensor._random_leaf(Tensor._uniform_draw(s, dev, dt), dev, requires_grad)

    @staticmethod
    def _uniform_draw(shape: tuple[int, ...], device: str, dt: DType, key: Optional[int] = None) -> Tensor:
        """rand's values (`dt` a float dtype, `shape` not empty) under the generator's `key` (see _random_bits)."""
        bits = _RAND_BITS[dt]
        words = Tensor._random_bits(prod(shape), device, key)
        return ((words if bits == 32 else words >> (32 - bits)).cast(dt) * (2.0**-bits)).reshape(shape)

    @staticmethod
    def _normal_draw(shape: tuple[int, ...], device: str, dt: DType, key: Optional[int] = None) -> Tensor:
        """randn's values in `dt` (Box-Muller on two uniform draws) under the generator's `key` (see _random_bits)."""
        if prod(shape) == 0:
            return Tensor.zeros(shape, dtype=dt, device=device)
        u = Tensor._uniform_draw((2, *shape), device, dtypes.float64 if dt == dtypes.float64 else dtypes.float32, key)
        # cos and log from + - * / and bit operations only (every device rounds those the same), so a seed draws
        # the same bits on every device: the device's own SIN and LOG2 may differ in the last bit
        return (_cos_2pi(u[0]) * (_log_positive(1 - u[1]) * -2).sqrt()).cast(dt)

    @staticmethod
    def randn(*shape: Any, dtype: Optional[Union[DType, str]] = None, **kwargs: Any) -> Tensor:
        """Standard normal (Box-Muller on two uniform draws)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        requires_grad = kwargs.pop("requires_grad", None)
        dev = Device.canonicalize(kwargs.pop("device", None))
        if kwargs:
            raise TypeError(f"randn got unexpected arguments {sorted(kwargs)}")
        s = _shape(shape)
        if not all_int(s):
            raise ValueError(f"randn needs a concrete shape, got {s}")
        return Tensor._random_leaf(Tensor._normal_draw(s, dev, dt), dev, requires_grad)

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
        """Normal with the given mean and standard deviation."""
        requires_grad = kwargs.pop("requires_grad", None)
        dt = kwargs.get("dtype")
        z = Tensor.randn(*shape, **kwargs)
        out = (z * std + mean).cast(z.dtype if dt is None else to_dtype(dt))
        return Tensor._random_leaf(out, z.device, requires_grad)

    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, **kwargs: Any) -> Tensor:
        """Integers uniform in [low, high) (int32 unless `dtype` says otherwise)."""
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.int32)
        requires_grad = kwargs.pop("requires_grad", None)
        dev = Device.canonicalize(kwargs.pop("device", None))
        if kwargs:
            raise TypeError(f"randint got unexpected arguments {sorted(kwargs)}")
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (low, high)):
            raise TypeError(f"randint needs integer bounds, got low={low!r} high={high!r}")
        if high <= low or high - low > 2**32:
            raise ValueError(f"randint needs low < high and high - low <= 2**32, got low={low} high={high}")
        if not dtypes.is_int(dt):  # drawn as integers and cast, as tinygrad 0.9.0 does
            wide = dtypes.int32 if -(2**31) <= low and high - 1 < 2**31 else dtypes.int64
            out = Tensor.randint(*shape, low=low, high=high, dtype=wide, device=dev).cast(dt)
            return Tensor._random_leaf(out, dev, requires_grad)
        if low < dtypes.min(dt) or high - 1 > dtypes.max(dt):
            raise ValueError(f"randint range [{low}, {high}) does not fit in {dt}")
        s = _shape(shape)
        if prod(s) == 0:
            return Tensor.zeros(s, dtype=dt, device=dev, requires_grad=requires_grad)
        words = Tensor._random_bits(prod(s), dev)
        span = high - low
        # wrapping arithmetic in dt is exact here: the true result fits in dt
        out = (words if span == 2**32 else words % span).cast(dt) + int(low)
        return Tensor._random_leaf(out.reshape(s), dev, requires_grad)

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Tensor:
        """Uniform in [low, high)."""
        dtype = kwargs.pop("dtype", dtypes.default_float)
        requires_grad = kwargs.pop("requires_grad", None)
        r = Tensor.rand(*shape, **kwargs)
        return Tensor._random_leaf(((high - low) * r + low).cast(dtype), r.device, requires_grad)

    @staticmethod
    def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
        bound = prod(_shape(shape)) ** -0.5
        return Tensor.uniform(*shape, low=-bound, high=bound, **kwargs)

    @staticmethod
    def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        """Uniform with Glorot's bound sqrt(6 / (fan_in + fan_out))."""
        s = _shape(shape)
        bound = (6 / (s[0] + prod(s[1:]))) ** 0.5
        return Tensor.uniform(*s, low=-bound, high=bound, **kwargs)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw category indices (int32) in proportion to the weights on the last axis (1-d or 2-d self)."""
        if not 1 <= self.ndim <= 2 or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(
                f"multinomial needs 1-d or 2-d weights and num_samples >= 1, got {self.shape}, {num_samples}"
            )
        if not replacement and num_samples != 1:
            raise ValueError("multinomial without replacement draws only one sample (as in tinygrad 0.9.0)")
        weights = self.unsqueeze(0) if self.ndim == 1 else self
        if dtypes.is_float(weights.dtype):
            invalid = ((weights < 0) | (weights != weights) | (weights.abs() == math.inf)).sum(1) > 0
        else:
            invalid = (weights < 0).sum(1) > 0
        invalid = invalid | (weights.float().sum(1) <= 0)
        cdf = weights.float().cumsum(1)
        cdf = cdf / cdf[:, -1:]
        u = Tensor.rand(weights.shape[0], num_samples, 1, device=self.device)
        # the index is how many cumulative bounds the draw passes; a draw that passes them all takes the last
        idx = (u >= cdf.unsqueeze(1)).sum(2).minimum(self.shape[-1] - 1).cast(dtypes.int32)
        idx = _with_check(
            idx, invalid, "multinomial needs finite, non-negative weights with a positive sum in every row",
            InvalidValueError,
        )
        return Tensor(idx.lazydata if self.ndim == 2 else idx[0].lazydata, device=self.device)

    @staticmethod
    def from_node(y: Node, **kwargs: Any) -> Tensor:
        """A 0-d tensor holding the symbolic (or plain) integer `y`."""
        if isinstance(y, (int, Variable)):
            return Tensor(y, **kwargs, requires_grad=False)
        if isinstance(y, NumNode):
            return Tensor(y.b, **kwargs, requires_grad=False)
        raise TypeError(f"from_node needs an int, a NumNode or a Variable, got {type(y).__name__}")

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """Normal with He initialization's standard deviation for a leaky ReLU of slope `a`."""
        s = _shape(shape)
        std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(prod(s[1:]))
        return Tensor.normal(*s, mean=0.0, std=std, **kwargs)

    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        s = _shape(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(prod(s[1:]))
        return Tensor.uniform(*s, low=-bound, high=bound, **kwargs)

    # ***** autograd *****

    def _deepwalk(self) -> list[Tensor]:
        order: list[Tensor] = []
        visited: set[int] = set()
        stack: list[tuple[Tensor, bool]] = [(self, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if id(node) in visited:
                continue
            visited.add(id(node))
            stack.append((node, True))
            if node._ctx is not None:
                for p in node._ctx.parents:
                    if id(p) not in visited:
                        stack.append((p, False))
        return order

    def backward(self, gradient: Optional[Tensor] = None) -> Tensor:
        """Accumulate d(self)/d(x) into x.grad for every x that requires grad."""
        if self._ctx is None and self.requires_grad is False:
            # (requires_grad None: nothing said either way, as a model's weights before an optimizer takes them;
            # tinygrad then does nothing, and so does this)
            raise RuntimeError(
                "backward() of a tensor that does not require grad: nothing it was computed from requires grad "
                "(set requires_grad=True on the inputs to differentiate; comparisons and bitwise ops pass no gradient)"
            )
        if gradient is None:
            if self.shape != ():
                raise ShapeError(f"backward without a gradient needs a scalar, got shape {self.shape}")
            gradient = Tensor(1.0, dtype=self.dtype, device=self.device, requires_grad=False)
        if gradient.shape != self.shape:
            raise ShapeError(f"gradient shape {gradient.shape} does not match tensor shape {self.shape}")
        self.grad = gradient
        for t0 in reversed(self._deepwalk()):
            if t0.grad is None or t0._ctx is None:
                continue
            grads = t0._ctx.backward(t0.grad.lazydata)
            grads = [
                Tensor(g, device=self.device, requires_grad=False) if g is not None else None
                for g in ([grads] if len(t0._ctx.parents) == 1 else grads)
            ]
            for t, g in zip(t0._ctx.parents, grads):
                if g is not None and t.requires_grad:
                    if g.shape != t.shape:
                        raise RuntimeError(f"internal error: grad shape {g.shape} != tensor shape {t.shape}")
                    t.grad = g if t.grad is None else (t.grad + g)
            del t0._ctx
            t0._ctx = None
        return self

    # ***** movement *****

    def reshape(self, shape: Any, *args: Any) -> Tensor:
        new_shape = argfix(shape, *args)
        if all(type(s) is int and s >= 0 for s in new_shape) and all(type(s) is int for s in self.shape):
            # plain sizes on both sides (the common call): nothing to infer, the sizes multiply out directly
            if prod(new_shape) != prod(self.shape):
                raise ShapeError(
                    f"cannot reshape a tensor of shape {self.shape} ({self.numel()} elements) to {new_shape}"
                )
            return F.Reshape.apply(self, shape=tuple(new_shape)) if tuple(new_shape) != self.shape else self
        for s in new_shape:
            if (s is not None and not isinstance(s, (int, np.integer, Node))) or isinstance(s, (bool, np.bool_)):
                raise TypeError(f"reshape sizes must be ints (or -1, None, a Variable), got {new_shape!r}")
        new_shape = tuple(int(s) if isinstance(s, np.integer) else s for s in new_shape)
        if sum(1 for s in new_shape if s == -1) > 1:
            raise ShapeError(f"reshape can infer only one dimension, got {new_shape}")
        if any(s is not None and not isinstance(s, Node) and s < -1 for s in new_shape):
            raise ShapeError(f"reshape sizes must be >= 0 (or -1 for one inferred size), got {new_shape}")
        resolved = []
        for i, s in enumerate(new_shape):
            if s is None:
                resolved.append(self.shape[i])
            elif s == -1:
                known = prod(
                    [x for x in new_shape if x not in (-1, None)]
                    + [self.shape[j] for j, x in enumerate(new_shape) if x is None]
                )
                resolved.append(self.numel() // known if known else 0)
            else:
                resolved.append(s)
        if _bound_size(resolved) != _bound_size(self.shape):  # symbolic sizes compare at their bound values
            raise ShapeError(f"cannot reshape a tensor of shape {self.shape} ({self.numel()} elements) to {new_shape}")
        return F.Reshape.apply(self, shape=tuple(resolved)) if tuple(resolved) != self.shape else self

    def view(self, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def expand(self, shape: Any, *args: Any) -> Tensor:
        new_shape = argfix(shape, *args)
        if len(new_shape) < self.ndim:
            raise ShapeError(f"cannot expand shape {self.shape} to fewer dimensions {new_shape}")
        x = self.reshape((1,) * (len(new_shape) - self.ndim) + self.shape) if len(new_shape) > self.ndim else self
        target = tuple(xs if s == -1 else s for xs, s in zip(x.shape, new_shape))
        for xs, s in zip(x.shape, target):
            if xs != s and xs != 1:
                raise ShapeError(f"cannot expand shape {self.shape} to {new_shape}: only axes of size 1 can grow")
        return F.Expand.apply(x, shape=target) if target != x.shape else x

    def permute(self, order: Any, *args: Any) -> Tensor:
        order_t = tuple(self._resolve_dim(d) for d in argfix(order, *args))
        if len(order_t) != self.ndim:
            raise ShapeError(f"permute needs one axis per dimension ({self.ndim}), got {order_t}")
        if sorted(order_t) != list(range(self.ndim)):
            raise AxisError(f"permute needs a permutation of the {self.ndim} axes, got {order_t}")
        return F.Permute.apply(self, order=order_t)

    def flip(self, axis: Any, *args: Any) -> Tensor:
        axes = tuple(self._resolve_dim(a) for a in argfix(axis, *args))
        if len(set(axes)) != len(axes):
            raise AxisError(f"flip got a repeated axis in {axes}")
        return F.Flip.apply(self, axis=axes)

    def shrink(self, arg: tuple[Optional[tuple[sint, sint]], ...]) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink needs one (begin, end) per axis ({self.ndim}), got {arg}")
        full = tuple(x if x is not None else (0, s) for x, s in zip(arg, self.shape))
        for (b, e), s in zip(full, self.shape):
            if not (0 <= b <= e <= s):
                raise ShapeError(f"shrink {arg} is out of bounds for shape {self.shape}")
        return F.Shrink.apply(self, arg=full) if any(x != (0, s) for x, s in zip(full, self.shape)) else self

    def pad(self, arg: Sequence[Optional[tuple[int, int]]], value: float = 0.0) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"pad needs one (before, after) per axis ({self.ndim}), got {arg}")
        full = tuple(x if x is not None else (0, 0) for x in arg)
        if all(p == (0, 0) for p in full):
            return self
        if any(b < 0 or a < 0 for b, a in full):  # negative padding trims
            self = self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(full, self.shape)))
            full = tuple((max(b, 0), max(a, 0)) for b, a in full)
        ret = F.Pad.apply(self, arg=full)
        if value == 0:
            return ret
        mask = F.Pad.apply(Tensor.ones_like(self, dtype=dtypes.bool), arg=full)
        return mask.where(ret, value).cast(self.dtype)  # numpy's: the fill value takes the tensor's dtype

    def _resolve_dim(self, dim: int, outer: bool = False) -> int:
        n = self.ndim + int(outer)
        if not -max(1, n) <= dim < max(1, n):
            raise AxisError(f"dimension {dim} is out of range for a tensor of {self.ndim} dimensions")
        return dim + n if dim < 0 else dim

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        d0, d1 = self._resolve_dim(dim0), self._resolve_dim(dim1)
        order[d0], order[d1] = order[d1], order[d0]
        return self.permute(order)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
        if s > e:
            raise AxisError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes: tuple[int, ...]) -> Tensor:
        d = self._resolve_dim(dim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def squeeze(self, dim: Optional[int] = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if self.ndim == 0:
            return self
        d = self._resolve_dim(dim)
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = self._resolve_dim(dim, outer=True)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def _index_plan(self, indices: Any) -> _IndexPlan:
        """Parse an index into the movement ops of its basic part and the index tensors of its advanced part."""
        idx = list(indices) if isinstance(indices, tuple) else [indices]
        ellipses = [k for k, i in enumerate(idx) if i is Ellipsis]
        if len(ellipses) > 1:
            raise IndexError("an index can only have a single ellipsis")
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices for a tensor of {self.ndim} dimensions")
        if ellipses:
            e = ellipses[0]
            idx[e : e + 1] = [slice(None)] * (self.ndim - n_real)
        else:
            idx += [slice(None)] * (self.ndim - n_real)
        plan = _IndexPlan()
        # numpy's rule for where the broadcast index axes go: in place of the advanced indices (ints count as such
        # once there is an array) if those stand together, else first
        advanced_at = [k for k, i in enumerate(idx) if i is not None and not isinstance(i, slice)]
        has_array = any(isinstance(idx[k], (Tensor, list, tuple, np.ndarray)) for k in advanced_at)
        plan.front = has_array and advanced_at != list(range(advanced_at[0], advanced_at[0] + len(advanced_at)))
        dim = 0
        for i in idx:
            if i is None:
                plan.out_shape.append(1)
                continue
            size = self.shape[dim]
            step = 1
            if isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)):
                j = int(i) + size if i < 0 else int(i)
                if not 0 <= j < size:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
                plan.shrink.append((j, j + 1))
            elif isinstance(i, slice):
                start, stop, step = i.indices(size)
                n = len(range(start, stop, step))
                if step > 0:
                    plan.shrink.append((start, start + (n - 1) * step + 1) if n else (0, 0))
                else:
                    plan.shrink.append((start + (n - 1) * step, start + 1) if n else (0, 0))
                plan.out_shape.append(n)
            elif isinstance(i, (Tensor, list, tuple, np.ndarray)):
                plan.shrink.append((0, size))
                plan.out_shape.append(size)
                plan.advanced.append((len(plan.out_shape) - 1, self._index_tensor(i, dim, size)))
            else:
                raise IndexError(
                    f"cannot index with {type(i).__name__}: expected int, slice, None, Ellipsis, a list of ints "
                    "or an integer Tensor"
                )
            plan.flips.append(step < 0)
            plan.strides.append(abs(step))
            dim += 1
        return plan

    def _index_tensor(self, i: Any, dim: int, size: sint) -> Tensor:
        """An index list/array/Tensor for axis `dim` as an integer tensor with negative indices wrapped."""
        if Device.storage_only(self.device):  # (an index tensor made on it would be written into its file)
            raise IndexError(
                f"{self.device} holds data and runs no kernels, and indexing with lists or tensors needs one: use "
                "ints and slices, or copy the tensor to a compute device first"
            )
        if isinstance(i, Tensor):
            if not dtypes.is_int(i.dtype):
                raise IndexError(
                    f"tensor index on axis {dim} must hold integers, got {i.dtype} (boolean masks are not supported: "
                    "use Tensor.where or masked_fill)"
                )
            if i.device != self.device:
                raise IndexError(f"index tensor is on {i.device}, the tensor on {self.device}")
            if size == 0 and i.numel() != 0:
                raise IndexOutOfRangeError(f"index into axis {dim} of size 0: no index is in range")
            i = _index_wide_enough(i, size)
            wrapped = i if dtypes.is_unsigned(i.dtype) else (i < 0).where(i + size, i)
            if isinstance(size, int):  # checked on the device when the result is realized
                bad = _index_outside(i, -size, size)
                wrapped = _with_check(wrapped, bad, f"index out of bounds for axis {dim} with size {size}")
            return wrapped
        arr = np.asarray(i)
        if arr.dtype == np.bool_:
            raise IndexError(f"boolean mask index on axis {dim} is not supported: use Tensor.where or masked_fill")
        if arr.size == 0:
            arr = arr.astype(np.int32)
        if not np.issubdtype(arr.dtype, np.integer):
            raise IndexError(f"index list on axis {dim} must hold integers, got {arr.dtype}")
        if ((arr < -size) | (arr >= size)).any():
            raise IndexError(f"index {arr.tolist()} is out of bounds for axis {dim} with size {size}")
        return Tensor(np.where(arr < 0, arr + size, arr).astype(np.int32), device=self.device)

    def _basic_index(self, plan: _IndexPlan) -> Tensor:
        x = self.shrink(tuple(plan.shrink)) if plan.shrink else self
        if any(plan.flips):
            x = x.flip(tuple(d for d, f in enumerate(plan.flips) if f))
        if any(k != 1 for k in plan.strides):  # every k-th element: a view of the same memory, as numpy's
            x = F.Stride.apply(x, arg=tuple(plan.strides))
        return x.reshape(tuple(plan.out_shape))

    def _unindex(self, plan: _IndexPlan, v: Tensor) -> Tensor:
        """The inverse of _basic_index: `v` (of the indexed shape) placed into this shape, zero elsewhere."""
        strided = [(b - a + k - 1) // k for (a, b), k in zip(plan.shrink, plan.strides)]
        v = v.reshape(tuple(strided))
        if any(k != 1 for k in plan.strides):
            v = v.reshape(tuple(flatten([(n, 1) for n in strided])))
            v = v.pad(tuple(flatten([(None, (0, k - 1)) for k in plan.strides])))
            v = v.reshape(tuple(n * k for n, k in zip(strided, plan.strides)))
            v = v.shrink(tuple((0, b - a) for a, b in plan.shrink))
        if any(plan.flips):
            v = v.flip(tuple(d for d, f in enumerate(plan.flips) if f))
        return v.pad(tuple((a, s - b) for (a, b), s in zip(plan.shrink, self.shape)))

    def _advanced_index(self, advanced: list[tuple[int, Tensor]], front: bool = False) -> Tensor:
        """Select with integer index tensors on axes `advanced`, one axis at a time: a load at the index (Gather)
        where the tensors allow it, else a one-hot mask reduced away. The lookups run in the result's own axis order,
        so the kernel writes the result as it is laid out (`table[ids]`: each id's row copied whole, in vectors) and
        no permute of it follows."""
        dims, index = [d for d, _ in advanced], [t for _, t in advanced]
        b_shape = _broadcast_shape(*[t.shape for t in index])
        rest = [d for d in range(self.ndim) if d not in dims]
        # the broadcast index axes stand where the indexed axes were if those were adjacent, else first (numpy's rule)
        first = dims[0] if not front and dims == list(range(dims[0], dims[0] + len(dims))) else 0
        # x: the rest axes before that place, the index axes (size 1 until the first lookup), the indexed axes left,
        # the other rest axes; each lookup picks along the first indexed axis left and drops it
        x = self.permute(rest[:first] + dims + rest[first:])
        x = x.reshape(x.shape[:first] + (1,) * len(b_shape) + x.shape[first:])
        axis = first + len(b_shape)
        for d, t in zip(dims, index):
            size, tail = self.shape[d], tuple(x.shape[axis + 1 :])
            # the index, of the index axes, broadcast over the others (size 1 on the one it picks along)
            shape = tuple(x.shape[:first]) + b_shape + (1,) + tail
            if _gathers(x, t, shape):
                idx = t._broadcast_to(b_shape).reshape((1,) * first + b_shape + (1,) * (1 + len(tail)))
                x = F.Gather.apply(x, idx._broadcast_to(shape), axis=axis)
                x = F.Reshape.apply(x, shape=shape[:axis] + shape[axis + 1 :])
                continue
            hit = t._broadcast_to(b_shape).unsqueeze(-1) == Tensor.arange(size, device=self.device)
            hit = hit.reshape(b_shape + (size,) + (1,) * len(tail))
            x = hit.where(x, 0).sum(axis).cast(self.dtype)
        return x

    def __getitem__(self, indices: Any) -> Tensor:
        """numpy indexing: ints, slices (any step), None, Ellipsis, and lists or integer Tensors (advanced)."""
        plan = self._index_plan(indices)
        x = self._basic_index(plan)
        return x._advanced_index(plan.advanced, plan.front) if plan.advanced else x

    def __setitem__(self, indices: Any, v: Union[Tensor, ConstType]) -> None:
        """Write `v` (broadcast, cast to this dtype) into the indexed part: in place when this tensor is realized."""
        if type(self.lazydata) is LazyBuffer and Device.storage_only(self.lazydata.device):  # into the file, now
            storage.setitem(self, indices, v)
            return
        if self.requires_grad:
            raise NotImplementedError("setitem on a tensor that requires grad is not supported: use where or pad")
        plan = self._index_plan(indices)
        if plan.advanced:
            raise NotImplementedError("setitem with list or Tensor indices is not supported (as in tinygrad 0.9.0)")
        val = v if isinstance(v, Tensor) else Tensor(v, device=self.device, dtype=self.dtype)
        if val.device != self.device:
            raise ValueError(f"setitem value is on {val.device}, the tensor on {self.device}")
        out_shape = tuple(plan.out_shape)
        if _broadcast_shape(val.shape, out_shape) != out_shape:
            raise ShapeError(f"cannot assign a value of shape {val.shape} to an index of shape {out_shape}")
        val = val.cast(self.dtype)._broadcast_to(out_shape)
        lb = self.lazydata
        if isinstance(lb, LazyBuffer) and lb.writes_through():
            # in place, in this tensor's memory (its base's, for a view): every view of that memory sees the write
            target = self._basic_index(plan).lazydata
            if target.writes_through() and target.base is lb.base:
                _write_through(target, val.lazydata)
                return
            mask = self._unindex(plan, Tensor.ones(out_shape, dtype=dtypes.bool, device=self.device))
            _write_through(lb, mask.where(self._unindex(plan, val), self).lazydata)
            return
        # a pad or expand of another tensor (or a sharded tensor): no memory of its own to write into
        mask = self._unindex(plan, Tensor.ones(out_shape, dtype=dtypes.bool, device=self.device))
        new = mask.where(self._unindex(plan, val), self).detach()
        if isinstance(lb, MultiLazyBuffer) and lb.realized:
            self.assign(new).realize()
        else:
            self.lazydata = new.lazydata

    def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
        d = self._resolve_dim(dim)
        tensors = [self, *args]
        for t in args:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise ShapeError(f"cat needs equal shapes except on axis {d}, got {[x.shape for x in tensors]}")
        if len(tensors) > _CAT_GROUP:
            # a tree of cats of at most _CAT_GROUP tensors each, every group computed once: a kernel that adds n
            # padded parts does n reads per element, so one cat of 5,000 tensors would do 5,000
            groups = [
                Tensor.cat(*tensors[i : i + _CAT_GROUP], dim=d).contiguous()
                for i in range(0, len(tensors), _CAT_GROUP)
            ]
            return groups[0].cat(*groups[1:], dim=d)
        offsets = [0]
        for t in tensors:
            offsets.append(offsets[-1] + t.shape[d])
        total = offsets[-1]
        parts = [
            t.pad(tuple((offsets[i], total - offsets[i + 1]) if ax == d else None for ax in range(self.ndim)))
            for i, t in enumerate(tensors)
        ]
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out

    def stack(self: Union[Tensor, Sequence[Tensor]], *args: Tensor, dim: int = 0) -> Tensor:
        """Join tensors of one shape along a new axis: `a.stack(b)`, `Tensor.stack(a, b)` or `Tensor.stack([a, b])`."""
        tensors: list[Tensor] = [*self, *args] if isinstance(self, (list, tuple)) else [self, *args]  # type: ignore[list-item]
        if not tensors:
            raise ShapeError("stack needs at least one tensor")
        first, *rest = [t.unsqueeze(dim) for t in tensors]
        return first.cat(*rest, dim=dim)

    def repeat(self, repeats: Any, *args: Any) -> Tensor:
        """Tile the tensor `repeats[i]` times along axis i (numpy's tile; new leading axes when repeats is longer)."""
        repeats = argfix(repeats, *args)
        if len(repeats) < self.ndim or any(not isinstance(r, int) or r < 0 for r in repeats):
            raise ShapeError(f"repeat needs one count >= 0 per axis (at least {self.ndim}), got {repeats}")
        base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        new_shape = [x for r, s in zip(repeats, base.shape) for x in (1, s)]
        expanded = [x for r, s in zip(repeats, base.shape) for x in (r, s)]
        return base.reshape(new_shape).expand(expanded).reshape([r * s for r, s in zip(repeats, base.shape)])

    def split(self, sizes: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
        """Cut axis `dim` into pieces of `sizes` (an int: equal pieces, the last one smaller)."""
        d = self._resolve_dim(dim)
        n = self.shape[d]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise ValueError(f"split size must be > 0, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, max(int(n), 1), sizes)]
        sizes = list(sizes)
        if any(not isinstance(x, int) or x < 0 for x in sizes) or sum(sizes) != n:
            raise ShapeError(f"split sizes {sizes} must be >= 0 and add up to {n}, the size of axis {d}")
        offsets = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
        return tuple(
            self.shrink(tuple((offsets[k], offsets[k + 1]) if a == d else None for a in range(self.ndim)))
            for k in range(len(sizes))
        )

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        """Cut axis `dim` into `chunks` pieces of ceil(size / chunks) (fewer when they run out)."""
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunk needs chunks > 0, got {chunks}")
        n = self.shape[self._resolve_dim(dim)]
        return list(self.split(max(1, -(-int(n) // chunks)), dim))

    def pad2d(self, padding: Sequence[int], value: float = 0.0) -> Tensor:
        """Pad (or trim, where negative) the last axes: (left, right, top, bottom, ...) like torch's F.pad."""
        if len(padding) % 2 or len(padding) > 2 * self.ndim:
            raise ShapeError(f"pad2d needs pairs of (before, after) for at most {self.ndim} axes, got {padding}")
        pairs: list[Optional[tuple[int, int]]] = [(padding[k], padding[k + 1]) for k in range(0, len(padding), 2)]
        return self.pad(tuple([None] * (self.ndim - len(pairs)) + pairs[::-1]), value)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather; differentiable in self)."""
        d = self._resolve_dim(dim)
        if not isinstance(index, Tensor) or not dtypes.is_int(index.dtype):
            raise TypeError(f"gather needs an integer index Tensor, got {getattr(index, 'dtype', type(index))}")
        if index.ndim != self.ndim or any(i > s for a, (i, s) in enumerate(zip(index.shape, self.shape)) if a != d):
            raise ShapeError(f"gather index of shape {index.shape} does not fit tensor of shape {self.shape} on {d}")
        n = self.shape[d]
        x = self.shrink(tuple(None if a == d else (0, i) for a, i in enumerate(index.shape)))
        index = _index_wide_enough(index, n)
        idx = index if dtypes.is_unsigned(index.dtype) else (index < 0).where(index + n, index)
        if _gathers(x, idx, index.shape):  # a load at the index
            out = F.Gather.apply(x, idx, axis=d)
        else:
            x = x.unsqueeze(-1).transpose(d, -1)  # axis d moves last, a size-1 axis takes its place
            hit = idx.unsqueeze(-1) == Tensor.arange(n, device=self.device)
            out = hit.where(x, 0).sum(-1).cast(self.dtype)
        return _with_check(out, _index_outside(index, -n, n), f"gather index out of bounds for axis {d} with size {n}")

    def masked_fill(self, mask: Tensor, value: Union[Tensor, ConstType]) -> Tensor:
        """`value` where `mask` is True, else self."""
        return mask.where(value, self)

    # ***** reductions *****

    def _reduce(
        self, fxn: type[Function], axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False
    ) -> Tensor:
        axes = self._reduce_axes(axis)
        if self.ndim == 0:
            return self
        if (Tensor.no_grad or not self.requires_grad) and type(self.lazydata) is LazyBuffer:
            # nothing to record for backward: the reduce (and the reshape dropping its axes) on the LazyBuffer, the
            # same graph as the Functions' without them (a 1024 x 1024 row sum's 14 -> 11.5 us of Python)
            # (a Function whose forward is the reduce alone names its op: made here without its context object)
            op = getattr(fxn, "reduce_op", None)
            out = self.lazydata.r(op, axes) if op is not None else fxn.forward_only(self.lazydata, axis=axes)
            if not keepdim and (shape := tuple(s for i, s in enumerate(self.shape) if i not in axes)) != out.shape:
                out = out.reshape(shape)
            return _unrecorded(out, self)
        ret = fxn.apply(self, axis=axes)
        if keepdim:
            return ret
        # the reduced axes (size 1 in ret) dropped: the same elements, so no check of the shape is needed
        shape = tuple(s for i, s in enumerate(self.shape) if i not in axes)
        return F.Reshape.apply(ret, shape=shape) if shape != ret.shape else ret

    def _reduce_axes(self, axis: Optional[Union[int, Sequence[int]]]) -> tuple[int, ...]:
        """The axes a reduction over `axis` (None: every axis) covers, resolved; a repeated axis raises, as numpy's."""
        ndim = len(self.lazydata.shape)
        if axis is None:
            return tuple(range(ndim))
        if type(axis) is int and ndim and -ndim <= axis < ndim:  # (the common case, without the general checks)
            return (axis + ndim if axis < 0 else axis,)
        if not isinstance(axis, (int, np.integer, tuple, list)):
            raise TypeError(f"axis must be an int or a tuple of ints, got {type(axis).__name__} {axis!r}")
        named = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        for a in named:
            if not isinstance(a, (int, np.integer)) or isinstance(a, (bool, np.bool_)):
                raise TypeError(f"an axis must be an int, got {type(a).__name__} in axis={axis!r}")
        axes = tuple(self._resolve_dim(int(a)) for a in named)
        if self.ndim == 0:  # axis 0 or -1 of a 0-d tensor is the tensor itself (tinygrad's and torch's rule)
            return ()
        if len(set(axes)) != len(axes):
            raise AxisError(f"axis {axis!r} names an axis twice (shape {self.shape})")
        return axes

    def sum(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, acc_dtype: Optional[DType] = None
    ) -> Tensor:
        """Sum over `axis` (all axes by default), accumulating in a wide enough dtype: as tinygrad, bool and integers
        narrower than 32 bits in (u)int32, except where the count summed could pass its range (over 2**31 bools, over
        16.9M uint8 values, ...): then in (u)int64, as numpy, never a wrapped total."""
        dt = self.lazydata.dtype
        acc = acc_dtype or sum_acc_dtype(dt)
        if acc_dtype is None and dt.itemsize < 4 and not dtypes.is_float(dt):
            count = prod(self.shape[a] for a in self._reduce_axes(axis))
            most = count if isinstance(count, int) else count.max  # (a symbolic count: its largest value)
            largest = max(abs(int(dtypes.min(self.dtype))), int(dtypes.max(self.dtype)))
            if not isinstance(most, int) or most * largest > int(dtypes.max(acc)):
                acc = dtypes.uint64 if dtypes.is_unsigned(acc) else dtypes.int64
        ret = self.cast(acc)._reduce(F.Sum, axis, keepdim)
        if acc is not dt and acc_dtype is None and dt in (dtypes.float16, dtypes.bfloat16):
            return ret.cast(dt)
        return ret

    def max(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        """The largest element over `axis` (all axes by default); NaN wins. An axis of size 0 has no largest element:
        ValueError, as numpy raises (sum and mean of nothing are 0 and NaN, as there)."""
        if any(self.shape[a] == 0 for a in self._reduce_axes(axis)):
            raise ValueError(f"max over an axis of size 0 (shape {self.shape}, axis {axis}): it has no largest element")
        return self._reduce(F.Max, axis, keepdim)

    def min(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        """The smallest element over `axis` (all axes by default); NaN wins; an axis of size 0 raises ValueError."""
        if any(self.shape[a] == 0 for a in self._reduce_axes(axis)):
            raise ValueError(f"min over an axis of size 0 (shape {self.shape}, axis {axis}): it has no smallest one")
        if dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            return ~((~self).max(axis=axis, keepdim=keepdim))
        return -((-self).max(axis=axis, keepdim=keepdim))

    def mean(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        # float16 and bfloat16 are summed and divided in float32 (as numpy's mean): their sum may not fit their range
        is_float = dtypes.is_float(self.dtype)
        out = self.sum(axis=axis, keepdim=keepdim, acc_dtype=sum_acc_dtype(self.dtype) if is_float else None)
        count = prod(self.shape) // prod(out.shape) if prod(out.shape) else 0
        output_dtype = self.dtype if is_float else dtypes.float32
        return out.cast(least_upper_dtype(out.dtype, dtypes.float32)).div(count).cast(output_dtype)

    def var(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1
    ) -> Tensor:
        squares = (self - self.mean(axis=axis, keepdim=True)).square().sum(axis=axis, keepdim=keepdim)
        count = prod(self.shape) // prod(squares.shape) if prod(squares.shape) else 0
        return squares.div(max(0, count - correction))

    def std(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1
    ) -> Tensor:
        v = self.var(axis, keepdim, correction)
        # sqrt of a zero variance has an infinite slope: torch's gradient there is 0, not NaN
        zero = (v == 0).detach()
        return zero.where(0, zero.where(1, v).sqrt())

    def _softmax(self, axis: int) -> tuple[Tensor, Tensor, Tensor]:
        if self.ndim and self.shape[self._resolve_dim(axis)] == 0:  # nothing to normalize: empty results
            empty = self.cast(least_upper_float(self.dtype))
            return empty, empty, empty.sum(axis=axis, keepdim=True)
        m = self - self.max(axis=axis, keepdim=True)
        e = m.exp()
        return m, e, e.sum(axis=axis, keepdim=True)

    def softmax(self, axis: int = -1) -> Tensor:
        _, e, ss = self._softmax(axis)
        return e.div(ss)

    def log_softmax(self, axis: int = -1) -> Tensor:
        m, _, ss = self._softmax(axis)
        return m - ss.log()

    def logsumexp(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) computed stably; an infinite max is not subtracted (so inf stays inf, -inf stays -inf)."""
        if any(self.shape[a] == 0 for a in self._reduce_axes(axis)):  # the log of an empty sum: -inf, as numpy's
            return self.cast(least_upper_float(self.dtype)).sum(axis=axis, keepdim=keepdim).log()
        m = self.max(axis=axis, keepdim=True)
        m = (m.abs() == math.inf).where(0, m).detach()
        ret = (self - m).exp().sum(axis=axis, keepdim=True).log() + m
        return ret if keepdim else ret.reshape(self.max(axis=axis).shape)

    def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum along `axis` (of the flattened tensor when None)."""
        if axis is None:
            flat = self.flatten().argmax(0)
            return flat.reshape((1,) * self.ndim) if keepdim else flat
        ax = self._resolve_dim(axis)
        if self.ndim == 0:  # the one element is the largest (tinygrad's and torch's answer)
            return Tensor(0, dtype=dtypes.int32, device=self.device)
        n = self.shape[ax]
        is_max = (self == self.max(axis=ax, keepdim=True)) | (self != self)  # NaN is the max, as in numpy
        idx = Tensor.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape(
            (n,) + (1,) * (self.ndim - ax - 1)
        )
        return (n - (is_max * idx).max(axis=ax, keepdim=keepdim)).cast(dtypes.int32)

    def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
        return (
            (-self).argmax(axis=axis, keepdim=keepdim)
            if dtypes.is_float(self.dtype)
            else (~self).argmax(axis=axis, keepdim=keepdim)
        )

    def cumsum(self, axis: int = 0) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        ax = self._resolve_dim(axis)
        x = self.transpose(ax, -1)
        n = x.shape[-1]
        if n == 0:
            return self
        lower = Tensor.ones(n, n, dtype=dtypes.bool, device=self.device).tril()
        ret = lower.where(x.unsqueeze(-2), 0).sum(-1)  # where, not a multiply: inf * 0 would be NaN
        return ret.transpose(ax, -1)

    def _cumsum(self, axis: int = 0, _first_zero: bool = False) -> Tensor:
        """cumsum along `axis`; with _first_zero the sums before each element (0 first), as tinygrad 0.9.0's helper."""
        out = self.cumsum(axis)
        if not _first_zero or self.ndim == 0:
            return out
        ax = self._resolve_dim(axis)
        n = self.shape[ax]
        return out.pad(tuple((1, -1) if a == ax else None for a in range(self.ndim))) if n else out

    def triu(self, k: int = 0) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"triu needs a tensor of at least 2 dimensions, got shape {self.shape}")
        r, c = self.shape[-2], self.shape[-1]
        rows = Tensor.arange(r, device=self.device).unsqueeze(1)
        cols = Tensor.arange(c, device=self.device).unsqueeze(0)
        return (cols - rows >= k).where(self, 0).cast(self.dtype)

    def tril(self, k: int = 0) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"tril needs a tensor of at least 2 dimensions, got shape {self.shape}")
        r, c = self.shape[-2], self.shape[-1]
        rows = Tensor.arange(r, device=self.device).unsqueeze(1)
        cols = Tensor.arange(c, device=self.device).unsqueeze(0)
        return (cols - rows <= k).where(self, 0).cast(self.dtype)

    # ***** processing *****

    def dot(self, w: Tensor, acc_dtype: Optional[DType] = None) -> Tensor:
        """Matrix product with numpy's rules for 1-d and batched operands."""
        n1, n2 = self.ndim, w.ndim
        if n1 == 0 or n2 == 0:
            raise ShapeError(f"dot needs tensors of at least 1 dimension, got {self.shape} and {w.shape}")
        if self.shape[-1] != w.shape[-min(n2, 2)]:
            raise ShapeError(
                f"dot: shapes {self.shape} and {w.shape} do not align ({self.shape[-1]} != {w.shape[-min(n2, 2)]})"
            )
        if (
            acc_dtype is None
            and self.dtype is w.dtype
            and self.dtype in dtypes._float_set
            and type(self.lazydata) is LazyBuffer
            and type(w.lazydata) is LazyBuffer
            and self.device == w.device
            and all_int(self.shape)
            and all_int(w.shape)
        ):
            return self._dot_chain(w)
        x = self.reshape(*self.shape[:-1], *[1] * min(n1 - 1, n2 - 1, 1), self.shape[-1])
        w = w.reshape(*w.shape[:-2], *[1] * min(n1 - 1, n2 - 1, 1), *w.shape[-min(n2, 2) :]).transpose(-1, -min(n2, 2))
        out_dtype = least_upper_dtype(x.dtype, w.dtype)
        return (x * w).sum(-1, acc_dtype=acc_dtype).cast(acc_dtype or out_dtype)

    def _dot_chain(self, w: Tensor) -> Tensor:
        """dot of two float tensors of one dtype as one Function (F.Chain) of the steps the general path applies one
        by one (reshapes, the transpose, the broadcast, the product, the sum and its casts): the same graph, forward
        and backward, for a fraction of the Python. The steps depend on the shapes and the dtype alone: planned once."""
        key = (self.shape, w.shape, self.dtype)
        if (plan := _DOT_PLANS.get(key)) is None:
            if len(_DOT_PLANS) >= 1024:
                _DOT_PLANS.clear()
            plan = _DOT_PLANS[key] = self._dot_plan(w)
        if Tensor.no_grad or not (self.requires_grad or w.requires_grad):
            # nothing to record for backward: the steps on the LazyBuffers themselves, without a Function for each
            # (the same graph; a 128 x 128 product's 34 -> 24 us of Python). Each input's steps end in one view of its
            # base, which depends on its own view alone: kept per pair of trackers, the views are made in one step
            # each (24 -> 17 us)
            x, y = self.lazydata, w.lazydata
            views_key = (key, x.st, y.st)
            if (views := _DOT_VIEWS.get(views_key)) is not None:
                x, y = x.base._view(views[0]), y.base._view(views[1])
            else:
                x, y = _dot_views(plan[0], x, y)
                if x.size:  # (an empty product's steps make no views of the inputs)
                    if len(_DOT_VIEWS) >= 4096:
                        _DOT_VIEWS.clear()
                    _DOT_VIEWS[views_key] = (x.st, y.st)
            out = x.e(BinaryOps.MUL, y)
            for step, kwargs in plan[1]:
                out = _LAZY_STEPS[step](out, kwargs)
            return _unrecorded(out, self, w)
        return F.Chain.apply(self, w, branches=plan[0], join=F.Mul, tail=plan[1])

    def _dot_plan(self, w: Tensor) -> tuple[Any, Any]:
        n1, n2 = self.ndim, w.ndim
        ones = (1,) * min(n1 - 1, n2 - 1, 1)
        x_shape = (*self.shape[:-1], *ones, self.shape[-1])
        w_shape = (*w.shape[:-2], *ones, *w.shape[-min(n2, 2) :])
        x_steps: list[tuple[type[Function], dict[str, Any]]] = []
        w_steps: list[tuple[type[Function], dict[str, Any]]] = []
        if x_shape != self.shape:
            x_steps.append((F.Reshape, {"shape": x_shape}))
        if w_shape != w.shape:
            w_steps.append((F.Reshape, {"shape": w_shape}))
        order = list(range(len(w_shape)))
        order[-1], order[-min(n2, 2)] = order[-min(n2, 2)], order[-1]
        w_steps.append((F.Permute, {"order": tuple(order)}))
        w_shape = tuple(w_shape[i] for i in order)
        if x_shape != w_shape:  # (_broadcasted's broadcast: a reshape to the rank, then an expand)
            shape = _broadcast_shape(x_shape, w_shape)
            for steps, s in ((x_steps, x_shape), (w_steps, w_shape)):
                if len(s) < len(shape):
                    s = (1,) * (len(shape) - len(s)) + s
                    steps.append((F.Reshape, {"shape": s}))
                if s != shape:
                    steps.append((F.Expand, {"shape": shape}))
        else:
            shape = x_shape
        acc, dt = sum_acc_dtype(self.dtype), self.dtype
        tail: list[tuple[type[Function], dict[str, Any]]] = [(F.Cast, {"dtype": acc})] if acc != dt else []
        tail += [(F.Sum, {"axis": (len(shape) - 1,)}), (F.Reshape, {"shape": shape[:-1]})]
        if dt in (dtypes.float16, dtypes.bfloat16):
            tail.append((F.Cast, {"dtype": dt}))
        return (tuple(x_steps), tuple(w_steps)), tuple(tail)

    def matmul(self, x: Tensor, reverse: bool = False, acc_dtype: Optional[DType] = None) -> Tensor:
        return x.dot(self, acc_dtype) if reverse else self.dot(x, acc_dtype)

    def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        x = self.mul(weight) if weight.ndim == 1 else self.dot(weight)
        return x.add(bias) if bias is not None else x

    def sequential(self, ll: Iterable[Callable[[Tensor], Tensor]]) -> Tensor:
        x = self
        for f in ll:
            x = f(x)
        return x

    @staticmethod
    def einsum(formula: str, *raw_xs: Any, acc_dtype: Optional[DType] = None) -> Tensor:
        """Einstein summation as numpy's: "ij,jk->ik", implicit output, repeated letters (diagonals), "..."."""
        xs: list[Tensor] = (
            list(raw_xs[0]) if len(raw_xs) == 1 and isinstance(raw_xs[0], (list, tuple)) else list(raw_xs)
        )
        formula = formula.replace(" ", "")
        lhs, arrow, rhs = formula.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(xs) or not xs:
            raise ValueError(f"einsum {formula!r} names {len(terms)} operands, got {len(xs)} tensors")
        free = [c for c in string.ascii_letters if c not in formula]
        n_ell = max((x.ndim - len(t.replace("...", "")) for t, x in zip(terms, xs) if "..." in t), default=0)
        ell = "".join(free[: max(n_ell, 0)])
        terms = [
            t.replace("...", ell[len(ell) - (x.ndim - len(t) + 3) :]) if "..." in t else t for t, x in zip(terms, xs)
        ]
        letters = "".join(terms)
        if arrow:
            if ell and "..." not in rhs:
                raise ValueError(f"einsum {formula!r}: the output must keep the '...' axes (as numpy's)")
            out = rhs.replace("...", ell)
        else:
            out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
        sizes: dict[str, sint] = {}
        for t, x in zip(terms, xs):
            if not t.isalpha() or len(t) != x.ndim:
                raise ShapeError(f"einsum term {t!r} does not fit a tensor of shape {x.shape}")
            for c, n in zip(t, x.shape):
                if sizes.get(c, n) != n and n != 1 and not (c in ell and sizes[c] == 1):
                    raise ShapeError(f"einsum: index {c!r} has sizes {sizes[c]} and {n} in {formula!r}")
                sizes[c] = n if sizes.get(c, 1) == 1 else sizes[c]
        if len(set(out)) != len(out) or any(c not in sizes for c in out):
            raise ValueError(f"einsum output {rhs!r} must name distinct indices of the inputs")
        order = list(out) + sorted(set(sizes) - set(out))  # output indices first: the rest are summed away
        aligned = []
        for t, x in zip(terms, xs):
            while len(set(t)) != len(t):  # a repeated index takes the diagonal
                c = next(c for c in t if t.count(c) > 1)
                a1, a2 = t.index(c), t.index(c, t.index(c) + 1)
                x, t = x._diagonal(a1, a2), t[:a1] + t[a1 + 1 : a2] + t[a2 + 1 :] + c
            present = sorted(t, key=order.index)
            x = x.permute([t.index(c) for c in present])
            aligned.append(x.reshape(tuple(x.shape[present.index(c)] if c in t else 1 for c in order)))
        prod_ = functools.reduce(Tensor.mul, aligned)
        summed = tuple(range(len(out), len(order)))
        ret = prod_.sum(summed, acc_dtype=acc_dtype) if summed else prod_
        return ret.cast(acc_dtype or least_upper_dtype(*[x.dtype for x in xs]))

    def _diagonal(self, a1: int, a2: int) -> Tensor:
        """The diagonal of axes a1 and a2 (same size n) as the last axis."""
        n = self.shape[a1]
        x = self.permute([a for a in range(self.ndim) if a not in (a1, a2)] + [a1, a2])
        x = x.flatten(-2).pad(tuple([None] * (x.ndim - 2)) + ((0, n),))
        return x.reshape(x.shape[:-1] + (n, n + 1)).shrink(tuple([None] * (x.ndim - 1) + [None, (0, 1)]))[..., 0]

    # ***** sliding windows: pooling and convolution *****

    def _window(self, ax: int, k: int, stride: int, dilation: int) -> Tensor:
        """Axis `ax` (size n) becomes the window positions; a new last axis holds each window's k taps."""
        n = self.shape[ax]
        o = _window_positions(n, k, stride, dilation)
        if not self.requires_grad and type(self.lazydata) is LazyBuffer and isinstance(n, int):
            # no gradient flows: the windows as one view (ShapeTracker.window), affine in the position and the tap,
            # where the chain below is a pile of views whose index divides (ResNet's stride-2 3x3 max pool of a
            # 2 x 64 x 114 x 114 map on one core: 12.2 -> 1.0 ms)
            lb = self.lazydata
            return Tensor(lb._view(lb.st.window(ax, k, stride, dilation)), device=self.device, requires_grad=False)
        m = self.ndim - 1
        x = self.permute([a for a in range(self.ndim) if a != ax] + [ax])
        # k copies of the axis laid end to end, read in rows of n + dilation: row j starts at tap j's offset
        copies = -(-k * (n + dilation) // n)
        x = x.unsqueeze(-2).expand(x.shape[:-1] + (copies, n)).flatten(-2)
        x = x.shrink(tuple([None] * m + [(0, k * (n + dilation))])).reshape(x.shape[:-1] + (k, n + dilation))
        x = x.shrink(tuple([None] * (m + 1) + [(0, (o - 1) * stride + 1)]))
        if stride > 1:
            x = x.pad(tuple([None] * (m + 1) + [(0, stride - 1)])).reshape(x.shape[:-1] + (o, stride))[..., 0]
        return x.permute(list(range(ax)) + [m + 1] + list(range(ax, m)) + [m])

    def _pool(self, kernel: tuple[int, ...], stride: Union[int, tuple[int, ...]] = 1, dilation: Any = 1) -> Tensor:
        """Windows over the last len(kernel) axes: (..., *spatial) -> (..., *positions, *kernel)."""
        nk = len(kernel)
        if self.ndim < nk:
            raise ShapeError(f"a {nk}-d window needs a tensor of at least {nk} dimensions, got shape {self.shape}")
        strides, dilations = make_pair(stride, nk), make_pair(dilation, nk)
        if len(strides) != nk or len(dilations) != nk:
            raise ValueError(f"stride {stride} and dilation {dilation} must be ints or {nk}-tuples")
        x = self
        for i, (k, st, d) in enumerate(zip(kernel, strides, dilations)):
            x = x._window(self.ndim - nk + i, k, st, d)
        return x

    def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1) -> Tensor:
        k = make_pair(kernel_size)
        return self._pool(k, k if stride is None else stride, dilation).mean(tuple(range(-len(k), 0)))

    def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1) -> Tensor:
        k = make_pair(kernel_size)
        return self._pool(k, k if stride is None else stride, dilation).max(tuple(range(-len(k), 0)))

    def conv2d(
        self,
        weight: Tensor,
        bias: Optional[Tensor] = None,
        groups: int = 1,
        stride: Any = 1,
        dilation: Any = 1,
        padding: Any = 0,
        acc_dtype: Optional[DType] = None,
    ) -> Tensor:
        """Cross-correlation of (N, Cin, *spatial) with weight (Cout, Cin/groups, *kernel), any number of spatial axes.

        padding: an int, one per spatial axis, or (left, right, top, bottom, ...) pairs from the last axis back."""
        nd = weight.ndim - 2
        if nd < 1 or self.ndim != weight.ndim:
            raise ShapeError(
                f"conv2d needs input (N, C, *spatial) and weight (Cout, C/groups, *kernel) of the same rank, "
                f"got {self.shape} and {weight.shape}"
            )
        if isinstance(padding, int):
            pads = [(padding, padding)] * nd
        elif len(padding) == nd:
            pads = [(p, p) for p in padding]
        elif len(padding) == 2 * nd:
            pads = [(padding[k], padding[k + 1]) for k in range(0, 2 * nd, 2)][::-1]
        else:
            raise ValueError(f"conv2d padding must be an int, {nd} ints or {2 * nd} ints, got {padding}")
        return self._conv(weight, bias, groups, stride, dilation, pads, acc_dtype)

    def _conv(
        self,
        weight: Tensor,
        bias: Optional[Tensor],
        groups: int,
        stride: Any,
        dilation: Any,
        pads: list[tuple[int, int]],
        acc_dtype: Optional[DType],
    ) -> Tensor:
        cin_all, (cout, cin), kernel = self.shape[1], weight.shape[:2], weight.shape[2:]
        if groups < 1 or groups * cin != cin_all or cout % groups:
            raise ShapeError(
                f"conv2d: input channels {cin_all} must equal groups ({groups}) x weight channels ({cin}), and "
                f"output channels {cout} must divide by groups"
            )
        args = dict(groups=groups, stride=stride, dilation=dilation, pads=tuple(pads), acc_dtype=acc_dtype)
        if (
            (self.requires_grad or weight.requires_grad)
            and not Tensor.no_grad
            and type(self.lazydata) is LazyBuffer
            and type(weight.lazydata) is LazyBuffer
            and all_int(self.shape)
            and all_int(weight.shape)
        ):
            out = _Conv.apply(self, weight, **args)  # the gradients as convolutions, not through the windows' views
        else:
            out = self._conv_forward(weight, **args)
        return out if bias is None else out + bias.reshape(1, -1, *([1] * len(kernel)))

    def _conv_forward(
        self,
        weight: Tensor,
        groups: int,
        stride: Any,
        dilation: Any,
        pads: tuple[tuple[int, int], ...],
        acc_dtype: Optional[DType],
    ) -> Tensor:
        """The convolution as windows times weights, summed (the checks done by _conv)."""
        (bs, _), (cout, cin), kernel = self.shape[:2], weight.shape[:2], weight.shape[2:]
        nd = len(kernel)
        if (strides := self._depthwise_flat_strides(weight, groups, stride, dilation, pads)) is not None:
            return self._conv_depthwise_flat(weight, strides, pads, acc_dtype)
        flat_pads = [p for pad in pads for p in pad]
        prepad = (
            groups == 1
            and cin <= CONV_PREPAD_CHANNELS
            and any(flat_pads)
            and min(flat_pads) >= 0
            and all(s == 1 for s in make_pair(stride, nd))
            and all_int(self.shape)
        )
        if (
            acc_dtype is None
            and self.dtype is weight.dtype
            and self.dtype in (dtypes.float32, dtypes.float64)
            and type(self.lazydata) is LazyBuffer
            and type(weight.lazydata) is LazyBuffer
            and self.device == weight.device
            and all_int(self.shape)
            and all_int(weight.shape)
            and min(flat_pads, default=0) >= 0
        ):
            return self._conv_lazy(weight, groups, stride, dilation, pads, prepad)
        src = self
        if prepad:
            # few input channels: the windows of a padded copy load whole vectors along the rows, where the padding's
            # masks kept each tap a masked scalar (batch 32, one AVX-512 core, 32 x 32: 3 -> 16 channels 1.57 -> 0.32
            # ms, 16 -> 16 2.9 -> 1.7 ms, the copy included; with 32 channels and more, or a stride, the masked windows
            # were as fast or faster)
            src, pads = self.pad(((0, 0), (0, 0), *pads)).contiguous(), tuple((0, 0) for _ in pads)
        x = src._conv_windows(kernel, groups, stride, dilation, pads)
        out_sp = x.shape[4 : 4 + nd]
        if _conv_relayout(cout // groups, bs * prod(out_sp)):  # (the weights with the output channel innermost)
            weight = weight.permute(*range(1, nd + 2), 0).contiguous().permute(nd + 1, *range(nd + 1))
        w = weight.reshape(1, groups, cout // groups, cin, *([1] * nd), *kernel)
        axes = (3, *range(4 + nd, 4 + 2 * nd))
        out = (x * w).sum(axes, acc_dtype=acc_dtype).cast(acc_dtype or least_upper_dtype(x.dtype, w.dtype))
        return out.reshape(bs, cout, *out_sp)

    def _conv_lazy(
        self,
        weight: Tensor,
        groups: int,
        stride: Any,
        dilation: Any,
        pads: tuple[tuple[int, int], ...],
        prepad: bool,
    ) -> Tensor:
        """_conv_forward's graph (the same LazyBuffers, so the same kernels) built on the LazyBuffers directly, without
        a Tensor and a Function per step: for float32 and float64 operands of one dtype, int shapes and no negative
        padding, where no gradient is recorded (a 64 -> 64 conv at 56 x 56: 116 -> 47 us of Python; ResNet-50's graph of
        a plain inference 14.0 -> 10.8 ms)."""
        bs, (cout, cin), kernel = self.shape[0], weight.shape[:2], weight.shape[2:]
        nd = len(kernel)
        x, w = self.lazydata, weight.lazydata
        if prepad:
            x, pads = x.pad(((0, 0), (0, 0), *pads)).contiguous(), tuple((0, 0) for _ in pads)
        if any(p != (0, 0) for p in pads):
            x = x.pad(((0, 0), (0, 0), *pads))
        strides, dilations = make_pair(stride, nd), make_pair(dilation, nd)
        if len(strides) != nd or len(dilations) != nd:
            raise ValueError(f"stride {stride} and dilation {dilation} must be ints or {nd}-tuples")
        out_sp = []
        for i, (k, st, d) in enumerate(zip(kernel, strides, dilations)):
            out_sp.append(_window_positions(x.shape[2 + i], k, st, d))
            x = x._view(x.st.window(2 + i, k, st, d))
        x = x.reshape((bs, groups, 1, cin, *out_sp, *kernel))
        if _conv_relayout(cout // groups, bs * prod(out_sp)):
            w = w.permute((*range(1, nd + 2), 0)).contiguous().permute((nd + 1, *range(nd + 1)))
        w = w.reshape((1, groups, cout // groups, cin, *([1] * nd), *kernel))
        shape = (bs, groups, cout // groups, cin, *out_sp, *kernel)
        x, w = (v if v.shape == shape else v.expand(shape) for v in (x, w))
        out = x.e(BinaryOps.MUL, w).r(ReduceOps.SUM, (3, *range(4 + nd, 4 + 2 * nd)))
        return _unrecorded(out.reshape((bs, cout, *out_sp)), self, weight)

    def _depthwise_flat_strides(
        self, weight: Tensor, groups: int, stride: Any, dilation: Any, pads: tuple[tuple[int, int], ...]
    ) -> Optional[tuple[int, int]]:
        """The strides of a conv that _conv_depthwise_flat runs (a depthwise 2-d conv of stride 1 or 2, more than 9
        taps or output rows no multiple of 4 wide), else None."""
        (cout, cin), kernel = weight.shape[:2], weight.shape[2:]
        if len(kernel) != 2 or cin != 1 or not groups == cout == self.shape[1]:
            return None
        strides, dilations = tuple(make_pair(stride, 2)), tuple(make_pair(dilation, 2))
        if strides not in DEPTHWISE_FLAT_STRIDES or dilations != (1, 1) or any(p < 0 for pad in pads for p in pad):
            return None
        if not (all_int(self.shape) and all_int(weight.shape) and type(self.lazydata) is LazyBuffer):
            return None
        wo = (self.shape[3] + sum(pads[1]) - kernel[1]) // strides[1] + 1
        return strides if prod(kernel) > 9 or wo % 4 else None

    def _conv_depthwise_flat(
        self,
        weight: Tensor,
        strides: tuple[int, int],
        pads: tuple[tuple[int, int], ...],
        acc_dtype: Optional[DType],
    ) -> Tensor:
        """A depthwise 2-d conv as a stencil over each channel's padded map read as one flat row: output position
        (y, x) of a map padded to width wq sits at y * wq + x, and tap (i, j) reads the padded input at that plus
        i * wq + j, so consecutive positions read consecutive inputs with no bounds check, and a kernel loads them as
        whole vectors even where a map's width (7, 14) is no multiple of the vector's. The wq - wo positions at each
        row's end are computed and dropped. Through the 2-d windows instead, each tap's load is masked at the border
        and a vector along a row of 7 or 14 outputs must be gathered lane by lane (EfficientNet-B0's 1152 channels at
        7x7 with 5x5 taps, one AVX-512 core: 727 -> 328 us; 672 at 14x14: 1960 -> 226 us; 240 at 28x28: 3983 -> 355
        us; 3x3 taps, 480 at 14x14: 271 -> 91 us). A 3x3 conv whose output rows are a multiple of 4 wide keeps the
        2-d windows, whose vectors along the rows then load whole (96 at 28x28: 79 us, 118 through here; 32 at
        112x112: 368 against 588), as _conv_forward chooses.

        A stride s splits the padded input into s x s phases (the rows and columns of each remainder mod s), each a
        stride-1 stencil of ceil(k / s) taps a side with its share of the weights (zeros past the kernel's edge);
        the phases are one more axis of the sum."""
        (bs, ch, h, w), (kh, kw), (sh, sw) = self.shape, weight.shape[2:], strides
        (top, bottom), (left, right) = pads
        ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
        if ho < 1 or wo < 1:
            raise ShapeError(f"a {kh}x{kw} kernel does not fit the padded {h + top + bottom}x{w + left + right} input")
        qh, qw = -(-kh // sh), -(-kw // sw)  # each phase's taps
        wq = wo + qw - 1  # each phase's map width
        run = -(-ho * wq // DEPTHWISE_FLAT_RUN) * DEPTHWISE_FLAT_RUN  # the positions computed, whole runs of them
        # each phase's rows, with rows of zeros below the map so that the last run's taps read inside it
        hq = ho + qh - 1 + -(-(run - ho * wq + qw - 1) // wq)
        # the padded input cut or padded with zeros to sh*hq x sw*wq: what lies past the conv's own padding is read
        # by the phases' zero weights alone
        xp = self.pad(((0, 0), (0, 0), (top, max(0, sh * hq - h - top)), (left, max(0, sw * wq - w - left))))
        xp = xp.shrink((None, None, (0, sh * hq), (0, sw * wq))).reshape(bs, ch, hq, sh, wq, sw)
        flat = xp.permute(0, 1, 3, 5, 2, 4).contiguous().reshape(bs, ch, sh * sw, hq * wq)
        windows = flat._window(3, qh, 1, wq)._window(3, qw, 1, 1).shrink((None, None, None, (0, run), None, None))
        wt = weight.reshape(ch, kh, kw).pad((None, (0, sh * qh - kh), (0, sw * qw - kw)))
        wt = wt.reshape(ch, qh, sh, qw, sw).permute(0, 2, 4, 1, 3).reshape(1, ch, sh * sw, 1, qh, qw)
        out = (windows * wt).sum((2, 4, 5), acc_dtype=acc_dtype)
        out = out.cast(acc_dtype or least_upper_dtype(self.dtype, weight.dtype))
        out = out.shrink((None, None, (0, ho * wq))).reshape(bs, ch, ho, wq).shrink((None, None, None, (0, wo)))
        return out.contiguous()

    def _conv_windows(
        self, kernel: tuple[int, ...], groups: int, stride: Any, dilation: Any, pads: Sequence[tuple[int, int]]
    ) -> Tensor:
        """The padded input's windows, grouped: (N, groups, 1, Cin / groups, *out, *kernel)."""
        x = self.pad(((0, 0), (0, 0), *pads))._pool(kernel, stride, dilation)  # (N, Cin, *out, *kernel)
        return x.reshape(x.shape[0], groups, 1, x.shape[1] // groups, *x.shape[2:])

    def conv_transpose2d(
        self,
        weight: Tensor,
        bias: Optional[Tensor] = None,
        groups: int = 1,
        stride: Any = 1,
        dilation: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
    ) -> Tensor:
        """The transpose (gradient) of conv2d: input (N, Cin, *spatial), weight (Cin, Cout/groups, *kernel)."""
        kernel = weight.shape[2:]
        nd = len(kernel)
        cin = weight.shape[0]
        if self.ndim != weight.ndim or self.shape[1] != cin or groups < 1 or cin % groups:
            raise ShapeError(
                f"conv_transpose2d: input {self.shape} and weight {weight.shape} with groups={groups} "
                "do not fit: weight is (Cin, Cout/groups, *kernel)"
            )
        strides, dils = make_pair(stride, nd), make_pair(dilation, nd)
        pads, out_pads = make_pair(padding, nd), make_pair(output_padding, nd)
        if any(op >= max(s, d) or op < 0 for op, s, d in zip(out_pads, strides, dils)):
            raise ValueError(f"output_padding {output_padding} must be >= 0 and smaller than the stride or dilation")
        full = [d * (k - 1) - p for k, d, p in zip(kernel, dils, pads)]
        return self._conv_transpose(weight, bias, groups, strides, dils, [(f, f + op) for f, op in zip(full, out_pads)])

    def _conv_transpose(
        self,
        weight: Tensor,
        bias: Optional[Tensor],
        groups: int,
        strides: tuple[int, ...],
        dils: tuple[int, ...],
        pads: list[tuple[int, int]],
    ) -> Tensor:
        """conv_transpose2d as a convolution: the input spread by the strides (zeros between neighbours), padded by
        `pads` (negative trims), convolved with the weight flipped and its two channel axes swapped."""
        kernel = weight.shape[2:]
        nd = len(kernel)
        cin, rcout = weight.shape[:2]
        if any(s > 1 for s in strides) and all(d == 1 for d in dils) and all_int(self.shape + weight.shape):
            out = self._conv_transpose_phases(weight, groups, strides, pads)
            return out if bias is None else out + bias.reshape(1, -1, *([1] * nd))
        w = weight.reshape(groups, cin // groups, rcout, *kernel).transpose(1, 2)
        w = w.reshape(groups * rcout, cin // groups, *kernel).flip(tuple(range(2, 2 + nd)))
        x = self
        for i, s in enumerate(strides):  # spread the input: s - 1 zeros between neighbours
            if s > 1:
                ax, n = 2 + i, self.shape[2 + i]
                x = x.unsqueeze(ax + 1).pad(tuple((0, s - 1) if a == ax + 1 else None for a in range(x.ndim + 1)))
                x = x.flatten(ax, ax + 1)
                x = x.shrink(tuple((0, (n - 1) * s + 1) if a == ax else None for a in range(x.ndim)))
        return x._conv(w, bias, groups, 1, dils, pads, None)

    def _conv_transpose_phases(
        self, weight: Tensor, groups: int, strides: tuple[int, ...], pads: list[tuple[int, int]]
    ) -> Tensor:
        """A strided conv_transpose (no dilation) as one stride-1 conv_transpose of every output phase at once.
        Output position q = i * s + j gets input i through tap j, so the outputs of remainder r = q mod s read only
        the taps r, r + s, r + 2s, ...: phase r is a stride-1 conv_transpose with that sub-kernel of ceil(k / s) taps
        (zeros past the kernel's edge). The phases with any tap (r < k) become more output channels of one conv, then
        interleave (those with none are zeros). Through the input spread with s - 1 zeros between neighbours instead,
        s^nd - 1 of every s^nd products are zeros (the stride-2 input gradient of a 16 -> 32 3x3 conv at batch 32, 16 x
        16, on one AVX-512 core: 6.5 -> 3.1 ms; of its 1x1 shortcut: 3.1 -> 0.43 ms). `pads` are those of the spread
        form (before and after the spread input)."""
        kernel = weight.shape[2:]
        nd, (cin, rcout), sp = len(kernel), weight.shape[:2], self.shape[2:]
        taps = [-(-k // s) for k, s in zip(kernel, strides)]
        live = [min(k, s) for k, s in zip(kernel, strides)]  # the remainders with taps
        w = weight.pad((None, None, *[(0, t * s - k) for t, s, k in zip(taps, strides, kernel)]))
        w = w.reshape(cin, rcout, *flatten((t, s) for t, s in zip(taps, strides)))
        w = w.shrink((None, None, *flatten((None, (0, n)) for n in live)))  # (cin, rcout, t0, r0, t1, r1, ...)
        w = w.permute(0, *range(3, 2 + 2 * nd, 2), 1, *range(2, 2 + 2 * nd, 2)).reshape(cin, -1, *taps)
        full = self._conv_transpose(w, None, groups, (1,) * nd, (1,) * nd, [(t - 1, t - 1) for t in taps])
        m = full.shape[2:]  # n + taps - 1 positions a phase
        out = full.reshape(full.shape[0], groups, *live, rcout, *m)
        out = out.pad((None, None, *[(0, s - n) for s, n in zip(strides, live)], None, *([None] * nd)))
        out = out.permute(0, 1, 2 + nd, *flatten((3 + nd + i, 2 + i) for i in range(nd)))
        out = out.reshape(out.shape[0], groups * rcout, *[a * s for a, s in zip(m, strides)])
        # the spread form's output p is this one's p + (k - 1) - before, up to (n - 1) * s + 1 + after (the spread
        # input's end and its padding after): cut (or pad with zeros) to that
        window = [
            (before + 1 - k, (n - 1) * s + 1 + after - length)
            for n, s, k, (before, after), length in zip(sp, strides, kernel, pads, out.shape[2:])
        ]
        return out.pad((None, None, *window))

    # ***** normalization, dropout, attention, losses *****

    def layernorm(self, axis: Union[int, Sequence[int]] = -1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis` (no affine part)."""
        y = self - self.mean(axis, keepdim=True)
        return y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()

    def batchnorm(
        self,
        weight: Optional[Tensor],
        bias: Optional[Tensor],
        mean: Tensor,
        invstd: Tensor,
        axis: Union[int, tuple[int, ...]] = 1,
    ) -> Tensor:
        """(x - mean) * invstd * weight + bias, the statistics laid along `axis`."""
        axes = tuple(self._resolve_dim(a) for a in ((axis,) if isinstance(axis, int) else axis))
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        ret = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return ret + bias.reshape(shape) if bias is not None else ret

    def dropout(self, p: float = 0.5) -> Tensor:
        """In training, zero each element with probability p and scale the rest by 1/(1-p); else the identity."""
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not Tensor.training or p == 0:
            return self
        keep = Tensor.rand(*self.shape, device=self.device) >= p
        return keep.where(self * (1 / (1 - p) if p < 1 else 1.0), 0)

    def scaled_dot_product_attention(
        self,
        key: Tensor,
        value: Tensor,
        attn_mask: Optional[Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
    ) -> Tensor:
        """softmax(q k^T / sqrt(d) + mask) v; a bool mask keeps where True, a float mask is added."""
        if is_causal:
            if attn_mask is not None:
                raise ValueError("scaled_dot_product_attention takes attn_mask or is_causal, not both")
            attn_mask = Tensor.ones(self.shape[-2], key.shape[-2], dtype=dtypes.bool, device=self.device).tril()
        qk = self.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(self.shape[-1]))
        if attn_mask is not None:
            qk = attn_mask.where(qk, -math.inf) if attn_mask.dtype == dtypes.bool else qk + attn_mask
        return qk.softmax(-1).dropout(dropout_p) @ value

    def binary_crossentropy(self, y: Tensor) -> Tensor:
        """Mean of -(y log p + (1 - y) log(1 - p)) for probabilities p = self."""
        return (-y * self.log() - (1 - y) * (1 - self).log()).mean()

    def binary_crossentropy_logits(self, y: Tensor) -> Tensor:
        """binary_crossentropy of sigmoid(self), computed stably from the logits."""
        return (self.maximum(0) - y * self + (1 + (-self.abs()).exp()).log()).mean()

    def one_hot(self, num_classes: int) -> Tensor:
        """1 at each value's position along a new last axis of `num_classes` (int32)."""
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"one_hot needs num_classes >= 1, got {num_classes!r}")
        hit, _, bad = _label_masks(self, num_classes, None, self.device)
        if dtypes.is_float(self.dtype):  # (tinygrad takes float labels: each must be a whole number)
            bad = bad | (self != self.trunc())
        msg = f"one_hot class values must be whole numbers in [0, {num_classes})"
        return _with_check(hit.cast(dtypes.default_int), bad, msg)

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0
    ) -> Tensor:
        """Mean cross-entropy of logits `self` (N, C) against integer labels Y (N,)."""
        log_probs = self.log_softmax()
        classes = self.shape[-1]
        labels, mask, bad = _label_masks(Y, classes, ignore_index, self.device)
        assert mask is not None  # (an ignore_index was given)
        # the labels' log-probabilities picked by a select, not a product: a -inf elsewhere (a logit of -inf) stays
        # out of the sum, as in torch, instead of making it NaN
        picked = labels.where(log_probs, 0)
        if label_smoothing == 0:  # (no smoothing term to build)
            loss = -picked.sum() / mask.sum()
        else:
            smoothing = label_smoothing * (log_probs.mean(-1) * mask).sum()
            loss = -((1 - label_smoothing) * picked.sum() + smoothing) / mask.sum()
        return _with_check(loss, bad, f"a label is out of range for {classes} classes (ignore_index={ignore_index})")

    # ***** unary math *****

    def neg(self) -> Tensor:
        if self.dtype == dtypes.bool:  # numpy and torch refuse it
            raise TypeError("negation of a bool tensor is not defined: use ~ (logical not) or .logical_not()")
        return F.Neg.apply(self)

    def logical_not(self) -> Tensor:
        return F.Eq.apply(*self._broadcasted(False))

    def log(self) -> Tensor:
        return F.Log.apply(self.cast(least_upper_float(self.dtype)))

    def log2(self) -> Tensor:
        return F.Log2.apply(self.cast(least_upper_float(self.dtype)))

    def exp(self) -> Tensor:
        return F.Exp.apply(self.cast(least_upper_float(self.dtype)))

    def exp2(self) -> Tensor:
        return F.Exp2.apply(self.cast(least_upper_float(self.dtype)))

    def sqrt(self) -> Tensor:
        return F.Sqrt.apply(self.cast(least_upper_float(self.dtype)))

    def rsqrt(self) -> Tensor:
        """1 / sqrt(x), with IEEE's values at -0.0 (-inf) and -inf (NaN)."""
        return self.sqrt().reciprocal()

    def sin(self) -> Tensor:
        return F.Sin.apply(self.cast(least_upper_float(self.dtype)))

    def cos(self) -> Tensor:
        return F.Cos.apply(self.cast(least_upper_float(self.dtype)))

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def relu(self) -> Tensor:
        return F.Relu.apply(self)

    def sigmoid(self) -> Tensor:
        return F.Sigmoid.apply(self.cast(least_upper_float(self.dtype)))

    def tanh(self) -> Tensor:
        return F.Tanh.apply(self.cast(least_upper_float(self.dtype)))

    def expm1(self) -> Tensor:
        """exp(x) - 1, accurate for x near 0 too (numpy's expm1)."""
        return F.Expm1.apply(self.cast(least_upper_float(self.dtype)))

    def log1p(self) -> Tensor:
        """log(1 + x), accurate for x near 0 too (numpy's log1p)."""
        return F.Log1p.apply(self.cast(least_upper_float(self.dtype)))

    def gelu(self) -> Tensor:
        return 0.5 * self * (1 + (self * 0.7978845608 * (1 + 0.044715 * self * self)).tanh())

    def lerp(self, end: Union[Tensor, ConstType], weight: Union[Tensor, ConstType]) -> Tensor:
        """self + (end - self) * weight."""
        return self + (end - self) * weight

    def leakyrelu(self, neg_slope: float = 0.01) -> Tensor:
        return self.relu() - (-neg_slope * self).relu()

    def reciprocal(self) -> Tensor:
        return F.Reciprocal.apply(self.cast(least_upper_float(self.dtype)))

    def square(self) -> Tensor:
        return self * self

    def abs(self) -> Tensor:
        if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
            return self
        if dtypes.is_int(self.dtype):  # numpy's: the most negative value stays as it is
            return (self < 0).where(-self, self)
        return self.relu() + (-self).relu()

    def sign(self) -> Tensor:
        return F.Sign.apply(self)

    def clip(self, min_: Optional[ConstType] = None, max_: Optional[ConstType] = None) -> Tensor:
        if min_ is None and max_ is None:
            raise ValueError("clip needs at least one of min_ and max_")
        x = self.maximum(min_) if min_ is not None else self
        return x.minimum(max_) if max_ is not None else x

    def _step(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """fn(self) for a step function fn (integer in, itself out): the gradient is 0, like torch's."""
        if not dtypes.is_float(self.dtype):
            return self
        return F.ZeroGradient.apply(self, value=fn(self.detach()).lazydata)

    def trunc(self) -> Tensor:
        """Round toward zero (NaN and inf stay as they are)."""

        def trunc(x: Tensor) -> Tensor:
            # values this large are integers already
            keep = (x.abs() >= 2 ** (23 if x.dtype != dtypes.float64 else 52)) | (x != x)
            return keep.where(x, x.cast(dtypes.int64).cast(x.dtype))

        return self._step(trunc)

    def floor(self) -> Tensor:
        return self._step(lambda x: (x < (b := x.trunc())).where(b - 1, b))

    def ceil(self) -> Tensor:
        return self._step(lambda x: (x > (b := x.trunc())).where(b + 1, b))

    def round(self) -> Tensor:
        """Round to the nearest integer, halves to even (numpy's round)."""

        def half_to_even(x: Tensor) -> Tensor:
            f = x.floor()
            frac = x - f  # exact: floor(x) is within 1 of x
            odd = (f - (f * 0.5).floor() * 2) == 1
            return (frac > 0.5).where(f + 1, (frac < 0.5).where(f, odd.where(f + 1, f)))

        return self._step(half_to_even)

    def relu6(self) -> Tensor:
        return self.relu() - (self - 6).relu()

    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
        return self.clip(min_val, max_val)

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        return (alpha * self + beta).relu() - (alpha * self + beta - 1).relu()

    def hardswish(self) -> Tensor:
        return self * (self + 3).relu6() * (1 / 6)

    def elu(self, alpha: float = 1.0) -> Tensor:
        return self.relu() + alpha * self.minimum(0).expm1()

    def celu(self, alpha: float = 1.0) -> Tensor:
        return self.maximum(0) + alpha * (self / alpha).minimum(0).expm1()

    def quick_gelu(self) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def swish(self) -> Tensor:
        return self.silu()

    def softplus(self, beta: float = 1) -> Tensor:
        """log(1 + exp(beta * x)) / beta, computed without overflow for large x."""
        bx = (self if beta == 1 else self * beta).cast(least_upper_float(self.dtype))
        out = F.Softplus.apply(bx)  # max(bx, 0) + log1p(exp(-|bx|)): exp(bx) itself for very negative bx
        return out if beta == 1 else out * (1 / beta)

    def mish(self) -> Tensor:
        return self * self.softplus().tanh()

    def softsign(self) -> Tensor:
        return self / (1 + self.abs())

    def sinh(self) -> Tensor:
        return F.Sinh.apply(self.cast(least_upper_float(self.dtype)))

    def cosh(self) -> Tensor:
        return F.Cosh.apply(self.cast(least_upper_float(self.dtype)))

    def atanh(self) -> Tensor:
        # odd: computed on |x| as log1p(2|x| / (1 - |x|)) / 2, where neither 1 + ... nor log cancels
        neg = self < 0
        a = neg.where(-self, self)
        ret = (2 * a / (1 - a)).log1p() / 2
        return neg.where(-ret, ret)

    def asinh(self) -> Tensor:
        # odd: computed on |x|, where x + sqrt(x^2 + 1) does not cancel; log(2|x|) where x^2 would overflow
        # each branch only sees inputs it is selected for, so the other's gradient is 0, not 0 * inf
        neg = self < 0
        a = neg.where(-self, self)
        big = a > 1e18
        small = big.where(0, a)
        # log(a + sqrt(a^2 + 1)) as log1p(a + a^2 / (1 + sqrt(a^2 + 1))): no cancellation near 0
        sq = small.square()
        ret = big.where(a.maximum(1).log() + math.log(2), (small + sq / (1 + (sq + 1).sqrt())).log1p())
        return neg.where(-ret, ret)

    def acosh(self) -> Tensor:
        big = self > 1e18
        small = big.where(2, self)
        # log(x + sqrt(x^2 - 1)) as log1p((x - 1) + sqrt((x - 1)(x + 1))): accurate near 1, where x - 1 is exact
        t = small - 1
        return big.where(self.maximum(1).log() + math.log(2), (t + (t * (small + 1)).sqrt()).log1p())

    # ***** binary math *****

    def _broadcasted(
        self, y: Union[Tensor, ConstType], reverse: bool = False, match_dtype: bool = True
    ) -> tuple[Tensor, Tensor]:
        x: Tensor = self
        if not isinstance(y, Tensor):
            xlb, yt = x.lazydata, type(y)
            x_dtype = xlb.dtype
            if yt is float or yt is int or yt is bool:
                pass
            elif isinstance(y, (bool, int, float, np.generic)):
                y = y.item() if isinstance(y, np.generic) else y
            else:
                raise TypeError(f"cannot combine a Tensor with {type(y).__name__}")
            if isinstance(y, float) and x_dtype not in dtypes._float_set:
                y_dtype = dtypes.default_float
            # (the name first: a str compare costs no Python call, DType.__eq__ does)
            elif x_dtype.name == "bool" and x_dtype == dtypes.bool and isinstance(y, int) and not isinstance(y, bool):
                y_dtype = dtypes.default_int
            else:
                y_dtype = x_dtype
            if y_dtype is x_dtype and isinstance(xlb, LazyBuffer):  # fast path: the constant at x's shape
                const = Tensor.__new__(Tensor)
                const.lazydata, const.requires_grad, const.grad, const._ctx = (
                    xlb.const(dtypes.as_const(y, y_dtype)),
                    False,
                    None,
                    None,
                )
                return (const, x) if reverse else (x, const)
            y = Tensor(dtypes.as_const(y, y_dtype), device=x.device, dtype=y_dtype, requires_grad=False)
        if x.device != y.device:
            raise ValueError(f"operands are on different devices: {x.device} and {y.device}")
        if match_dtype and x.dtype != y.dtype:
            out = least_upper_dtype(x.dtype, y.dtype)
            x, y = x.cast(out), y.cast(out)
        if reverse:
            x, y = y, x
        if x.shape == y.shape:
            return x, y
        shape = _broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[sint, ...]) -> Tensor:
        """This tensor broadcast to `shape`, which _broadcast_shape made from it (leading axes of size 1 added, axes
        of size 1 expanded): reshape and expand as one Function."""
        if self.shape == shape:
            return self
        tail = shape[len(shape) - self.ndim :]
        if len(shape) < self.ndim or any(a != b and a != 1 for a, b in zip(self.shape, tail)):
            raise ShapeError(f"cannot broadcast shape {self.shape} to {shape}")
        return F.BroadcastTo.apply(self, shape=shape)

    def add(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Add.apply(*self._broadcasted(x, reverse))

    def sub(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype == dtypes.bool:  # numpy and torch refuse it
            raise TypeError("subtraction of bool tensors is not defined: use ^ (xor) or logical operators")
        return F.Sub.apply(a, b)

    def mul(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Mul.apply(*self._broadcasted(x, reverse))

    def div(self, x: Union[Tensor, ConstType], reverse: bool = False, upcast: bool = True) -> Tensor:
        """True division (integers are promoted to float), or C-style truncating integer division if not upcast."""
        a, b = self._broadcasted(x, reverse)
        if upcast:
            a, b = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(b.dtype))
        return F.Div.apply(a, b)

    def _divmod(self, x: Union[Tensor, ConstType], reverse: bool) -> tuple[Tensor, Tensor]:
        """(a // b, a % b) with numpy's rounding toward negative infinity; integer division by 0 gives (0, 0)."""
        a, b = self._broadcasted(x, reverse)
        rem = F.Mod.apply(a, b)  # truncated: the sign of a
        adjust = (rem != 0) & ((rem < 0) != (b < 0))  # floor is one below the truncated quotient
        if not dtypes.is_float(a.dtype):
            q = F.Div.apply(a, b)
            if dtypes.is_unsigned(a.dtype):
                return q, rem
            return q - adjust.cast(a.dtype), adjust.where(rem + b, rem)
        div = ((a - rem) / b).detach() - adjust.cast(a.dtype)
        floor = div.floor()
        rounded = (div - floor > 0.5).where(floor + 1, floor)
        quotient = (b == 0).where(a / b, (div != 0).where(rounded, (a / b) * 0))
        modulo = adjust.where(rem + b, (rem == 0).where((b < 0).where(-0.0, 0.0), rem))
        return quotient, modulo

    def floordiv(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        """Division rounded toward negative infinity (numpy's //)."""
        return self._divmod(x, reverse)[0]

    def mod(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor (numpy's %)."""
        return self._divmod(x, reverse)[1]

    def pow(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        """self ** x; an integer tensor to a Python int power stays an integer (exact, wrapping like numpy)."""
        if not reverse and dtypes.is_int(self.dtype) and isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            if x < 0:
                raise ValueError(f"integers to negative integer powers are not allowed (got ** {x}); use floats")
            ret, square, n = self.ones_like(), self, int(x)
            while n:  # binary exponentiation
                ret, square, n = (ret * square if n & 1 else ret), (square * square if n > 1 else square), n >> 1
            return ret
        if (
            not reverse
            and dtypes.is_float(self.dtype)
            and isinstance(x, (int, float, np.integer, np.floating))
            and not isinstance(x, bool)
            and float(x) in (-1.0, 0.0, 1.0, 2.0, 3.0, 4.0)
        ):
            # small integer powers as products, as numpy computes squares and reciprocals (exact to the last bit
            # for 2 and -1); 0 gives 1 everywhere, NaN included
            n = int(x)
            if n == 0:
                return F.ZeroGradient.apply(self, value=self.ones_like().lazydata)
            if n < 0:
                return self.reciprocal()
            if n <= 2:
                return self if n == 1 else self * self
            return self * self * self if n == 3 else self.square().square()
        base, exponent = self._broadcasted(x, reverse)
        if dtypes.is_int(base.dtype):  # an integer to integer powers stays exact, wrapping as numpy's
            return base._int_power(exponent)
        if not dtypes.is_float(base.dtype):
            base, exponent = base.cast(dtypes.default_float), exponent.cast(dtypes.default_float)
        if not (base.requires_grad or exponent.requires_grad):
            return base._power(exponent)
        # the derivatives torch gives, NaN for a negative base to a non-integer power included (through the
        # composition below, that branch would pass no gradient at all)
        b, e = base.detach(), exponent.detach()
        value = b._power(e)
        dx = (e == 0).where(0, e * b._power(e - 1)) if base.requires_grad else value
        dy = ((b == 0) & (e >= 0)).where(0, value * b.log()) if exponent.requires_grad else value
        return F.PowerGradient.apply(base, exponent, value=value.lazydata, dx=dx.lazydata, dy=dy.lazydata)

    def _int_power(self, exponent: Tensor) -> Tensor:
        """self ** exponent for integer tensors of one shape and dtype: square and multiply over the exponent's bits
        (a negative exponent raises when realized, as numpy's)."""
        ret, square = self.ones_like(), self
        for bit in range(exponent.dtype.itemsize * 8 - (0 if dtypes.is_unsigned(exponent.dtype) else 1)):
            ret = ((exponent >> bit) & 1).cast(dtypes.bool).where(ret * square, ret)
            square = square * square
        if dtypes.is_unsigned(exponent.dtype):
            return ret
        return _with_check(ret, exponent < 0, "integers to negative integer powers are not allowed", InvalidValueError)

    def _power(self, exponent: Tensor) -> Tensor:
        """self ** exponent of float tensors of one shape and dtype, without a gradient of its own."""
        base = self
        # |b|^e through exp and log, with the sign fixed for negative bases and integer exponents. The product
        # e * log|b| is rounded, and exp turns its error into a relative one as large as the product (~25 ulp for
        # float32 powers of 1e5): so it is formed in the next wider float the device has
        wide = _WIDER_FLOAT.get(base.dtype)
        devices = base.device if isinstance(base.device, tuple) else (base.device,)
        if wide is not None and all(wide in Device[d].spec.dtypes for d in devices):
            mag = (exponent.cast(wide) * base.cast(wide).abs().log()).exp().cast(base.dtype)
        else:
            mag = (exponent * base.abs().log()).exp()
        odd = (exponent - 2 * (exponent / 2).floor()) == 1
        is_int = exponent == exponent.trunc()
        neg = base < 0
        signed = neg.where(is_int.where(odd.where(-mag, mag), math.nan), mag)
        return ((base == 0) * (exponent == 0)).where(1.0, signed).cast(base.dtype)

    def maximum(self, x: Union[Tensor, ConstType]) -> Tensor:
        """Elementwise max; NaN wins like numpy's maximum, and a tie splits the gradient."""
        a, b = self._broadcasted(x)
        if dtypes.is_float(a.dtype):
            return F.Maximum.apply(a, b)
        return (a < b).detach().where(b, a)

    def minimum(self, x: Union[Tensor, ConstType]) -> Tensor:
        """Elementwise min; NaN wins like numpy's minimum, and a tie splits the gradient."""
        a, b = self._broadcasted(x)
        if a.dtype == dtypes.bool:
            return a * b
        if dtypes.is_int(a.dtype):  # negation is not an order reversal for unsigned (or the minimum signed) values
            return (a < b).detach().where(a, b)
        return -((-a).maximum(-b))

    def where(self, x: Union[Tensor, ConstType], y: Union[Tensor, ConstType]) -> Tensor:
        cond = self.cast(dtypes.bool)
        if isinstance(x, Tensor):
            x, y = x._broadcasted(y)
        elif isinstance(y, Tensor):
            y, x = y._broadcasted(x)
        else:
            x, y = Tensor(x, device=self.device)._broadcasted(y)
        shape = _broadcast_shape(cond.shape, x.shape)
        return F.Where.apply(cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape))

    def _bitwise(self, x: Union[Tensor, ConstType], op: BinaryOps, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if not (dtypes.is_int(a.dtype) or a.dtype == dtypes.bool):
            raise TypeError(f"{op.name.lower()} needs integer or bool tensors, got {a.dtype}")
        return F.Bitwise.apply(a, b, op=op)

    def xor(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        """Bitwise exclusive or of integers or bools."""
        return self._bitwise(x, BinaryOps.XOR, reverse)

    def bitwise_and(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return self._bitwise(x, BinaryOps.AND, reverse)

    def bitwise_or(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return self._bitwise(x, BinaryOps.OR, reverse)

    def _shift(self, x: Union[Tensor, ConstType], op: BinaryOps, reverse: bool) -> Tensor:
        a, b = self._broadcasted(x, reverse)  # a negative amount shifts everything out, as numpy's and torch's
        if a.dtype == dtypes.bool:  # numpy shifts bools as integers
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if not dtypes.is_int(a.dtype):
            raise TypeError(f"shifts need integer or bool tensors, got {a.dtype}")
        return F.Bitwise.apply(a, b, op=op)

    def lshift(self, x: Union[Tensor, int], reverse: bool = False) -> Tensor:
        """Shift the bits left (numpy's <<); shifting by the bit width or more gives 0."""
        return self._shift(x, BinaryOps.SHL, reverse)

    def rshift(self, x: Union[Tensor, int], reverse: bool = False) -> Tensor:
        """Shift the bits right (numpy's >>): arithmetic for signed integers, so -8 >> 1 is -4."""
        return self._shift(x, BinaryOps.SHR, reverse)

    def __invert__(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        if not dtypes.is_int(self.dtype):
            raise TypeError(f"~ needs a bool or integer tensor, got {self.dtype}")
        return self.xor(dtypes.max(self.dtype) if dtypes.is_unsigned(self.dtype) else -1)

    def _cmp_lt(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Less.apply(*self._broadcasted(x, reverse))

    def __lt__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return self._cmp_lt(x)

    def __gt__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return self._cmp_lt(x, reverse=True)

    def __ge__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return (self < x).logical_not() if not self._has_nan_risk(x) else (self > x) | (self == x)

    def __le__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return (self > x).logical_not() if not self._has_nan_risk(x) else (self < x) | (self == x)

    def _has_nan_risk(self, x: Any) -> bool:
        return (
            dtypes.is_float(self.dtype) or (isinstance(x, Tensor) and dtypes.is_float(x.dtype)) or isinstance(x, float)
        )

    def __eq__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return F.Eq.apply(*self._broadcasted(x))

    def __ne__(self, x: Union[Tensor, ConstType]) -> Tensor:  # type: ignore[override]
        return (self == x).logical_not()

    def __or__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.bitwise_or(x)

    def __and__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.bitwise_and(x)

    def __ror__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.bitwise_or(x, reverse=True)

    def __rand__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.bitwise_and(x, reverse=True)

    def __lshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.lshift(x)

    def __rshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.rshift(x)

    def __rlshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.lshift(x, reverse=True)

    def __rrshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.rshift(x, reverse=True)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __add__(self, x: Any) -> Tensor:
        return self.add(x)

    def __sub__(self, x: Any) -> Tensor:
        return self.sub(x)

    def __mul__(self, x: Any) -> Tensor:
        return self.mul(x)

    def __truediv__(self, x: Any) -> Tensor:
        return self.div(x)

    def __floordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x)

    def __mod__(self, x: Any) -> Tensor:
        return self.mod(x)

    def __pow__(self, x: Any) -> Tensor:
        return self.pow(x)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __xor__(self, x: Any) -> Tensor:
        return self.xor(x)

    def __radd__(self, x: Any) -> Tensor:
        return self.add(x, reverse=True)

    def __rsub__(self, x: Any) -> Tensor:
        return self.sub(x, reverse=True)

    def __rmul__(self, x: Any) -> Tensor:
        return self.mul(x, reverse=True)

    def __rtruediv__(self, x: Any) -> Tensor:
        return self.div(x, reverse=True)

    def __rfloordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x, reverse=True)

    def __rmod__(self, x: Any) -> Tensor:
        return self.mod(x, reverse=True)

    def __rpow__(self, x: Any) -> Tensor:
        return self.pow(x, reverse=True)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x, reverse=True)

    def __rxor__(self, x: Any) -> Tensor:
        return self.xor(x, reverse=True)

    def __iadd__(self, x: Any) -> Tensor:
        return self.assign(self.add(x))

    def __isub__(self, x: Any) -> Tensor:
        return self.assign(self.sub(x))

    def __imul__(self, x: Any) -> Tensor:
        return self.assign(self.mul(x))

    def __itruediv__(self, x: Any) -> Tensor:
        return self.assign(self.div(x))

    def __ifloordiv__(self, x: Any) -> Tensor:
        return self.assign(self.floordiv(x))

    def __imod__(self, x: Any) -> Tensor:
        return self.assign(self.mod(x))

    def __ipow__(self, x: Any) -> Tensor:
        return self.assign(self.pow(x))

    def __imatmul__(self, x: Tensor) -> Tensor:
        return self.assign(self.matmul(x))

    def __ixor__(self, x: Any) -> Tensor:
        return self.assign(self.xor(x))

    def __iand__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.assign(self.bitwise_and(x))

    def __ior__(self, x: Union[Tensor, ConstType]) -> Tensor:
        return self.assign(self.bitwise_or(x))

    def __ilshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.assign(self.lshift(x))

    def __irshift__(self, x: Union[Tensor, int]) -> Tensor:
        return self.assign(self.rshift(x))

    # ***** casting *****

    def cast(self, dtype: Union[DType, str]) -> Tensor:
        if dtype is self.lazydata.dtype:  # (the common no-op, without to_dtype and DType.__eq__)
            return self
        dt = to_dtype(dtype)
        return self if self.dtype == dt else F.Cast.apply(self, dtype=dt)

    def bitcast(self, dtype: Union[DType, str]) -> Tensor:
        dt = to_dtype(dtype)
        if self.requires_grad:
            raise RuntimeError("bitcast cannot be differentiated; detach() first")
        return self if self.dtype == dt else F.Cast.apply(self, dtype=dt, bitcast=True)

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)


_CAT_GROUP = 16  # the most tensors one cat kernel joins (Tensor.cat)
_RAND_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 32}
_THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _horner(x: Tensor, coefficients: list[float]) -> Tensor:
    """coefficients[0] + coefficients[1] * x + ..., in Horner's order."""
    out = x * coefficients[-1] + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        out = out * x + c
    return out


def _log_positive(v: Tensor) -> Tensor:
    """log(v) of a normal positive float32 or float64 v, from + - * / and bit operations alone: v = m * 2**e with m in
    [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1) in [-0.172, 0.172] (a few ulp from the exact
    value)."""
    wide = v.dtype == dtypes.float64
    ints, mantissa, bias = (dtypes.int64, 52, 1023) if wide else (dtypes.int32, 23, 127)
    bits = v.bitcast(ints)
    e = (bits >> mantissa) - bias
    m = ((bits & ((1 << mantissa) - 1)) | (bias << mantissa)).bitcast(v.dtype)  # in [1, 2)
    big = m > math.sqrt(2)
    m, e = big.where(m * 0.5, m), e + big.cast(ints)
    s = (m - 1) / (m + 1)
    series = _horner(s * s, [2 / (2 * k + 1) for k in range(11 if wide else 6)])  # 2 atanh(s) / s
    return e.cast(v.dtype) * math.log(2) + s * series


def _cos_2pi(u: Tensor) -> Tensor:
    """cos(2 pi u) for u in [0, 1), from + - * and comparisons alone: reduced exactly (u is a multiple of 2**-32 or
    coarser) to c in [0, 1/8], then a Taylor polynomial of cos(2 pi c) or sin(2 pi c)."""
    terms = 11 if u.dtype == dtypes.float64 else 7
    t = (u > 0.5).where(u - 1, u)  # (-1/2, 1/2]: cos is even, so |t|
    a = (t < 0).where(-t, t)
    flip = a > 0.25  # cos(2 pi a) = -cos(2 pi (1/2 - a))
    b = flip.where(0.5 - a, a)
    use_sin = b > 0.125  # cos(2 pi b) = sin(2 pi (1/4 - b))
    c = use_sin.where(0.25 - b, b)
    c2, w = c * c, 2 * math.pi
    cos = _horner(c2, [(-1) ** k * w ** (2 * k) / math.factorial(2 * k) for k in range(terms)])
    sin = c * _horner(c2, [(-1) ** k * w ** (2 * k + 1) / math.factorial(2 * k + 1) for k in range(terms)])
    r = use_sin.where(sin, cos)
    return flip.where(-r, r)


def _uint32_range(n: int, device: str) -> Tensor:
    """0, 1, ..., n-1 as uint32 on `device`, built from two short host ranges (about 2*sqrt(n) values)."""
    cols = math.isqrt(max(n - 1, 0)) + 1
    rows = -(-n // cols)
    high = Tensor(np.arange(rows, dtype=np.uint32) * np.uint32(cols), device=device).reshape(rows, 1)
    low = Tensor(np.arange(cols, dtype=np.uint32), device=device).reshape(1, cols)
    return (high + low).flatten().shrink(((0, n),))


def _threefry2x32(x0: Tensor, x1: Tensor, key: int) -> tuple[Tensor, Tensor]:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC 2011) of the uint32 counter pairs (x0, x1) under a 64-bit key.
    Built on the LazyBuffers (random bits have no gradient): its ~110 ops without a Tensor and a Function each, a
    third of a draw's Python (a model's weight initialization draws once per layer)."""
    if x0.dtype != dtypes.uint32 or x1.dtype != dtypes.uint32 or x0.shape != x1.shape:
        got = f"{x0.dtype} {x0.shape} and {x1.dtype} {x1.shape}"
        raise TypeError(f"threefry needs two uint32 tensors of one shape, got {got}")
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    a, b = x0.lazydata, x1.lazydata
    add, xor, bor, shl, shr = BinaryOps.ADD, BinaryOps.XOR, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR
    a, b = a.e(add, a.const(ks[0])), b.e(add, b.const(ks[1]))
    for r in range(20):
        a = a.e(add, b)
        rot = _THREEFRY_ROTATIONS[r % 8]
        b = b.e(shl, b.const(rot)).e(bor, b.e(shr, b.const(32 - rot))).e(xor, a)
        if r % 4 == 3:  # inject the key every four rounds
            i = r // 4 + 1
            a, b = a.e(add, a.const(ks[i % 3])), b.e(add, b.const((ks[(i + 1) % 3] + i) & 0xFFFFFFFF))
    return Tensor(a, device=x0.device), Tensor(b, device=x0.device)


@dataclasses.dataclass
class _IndexPlan:
    """An index, parsed: per axis the shrink, flip and stride of its basic part; the advanced index tensors."""

    shrink: list[tuple[sint, sint]] = dataclasses.field(default_factory=list)
    flips: list[bool] = dataclasses.field(default_factory=list)
    strides: list[int] = dataclasses.field(default_factory=list)
    out_shape: list[sint] = dataclasses.field(default_factory=list)
    advanced: list[tuple[int, Tensor]] = dataclasses.field(default_factory=list)
    front: bool = False  # the broadcast index axes go first (numpy: the advanced indices do not stand together)


# the float a float power is computed in (Tensor.pow), where the device has it
_WIDER_FLOAT = {dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32, dtypes.float32: dtypes.float64}


_REDUCE_OPS = frozenset(ReduceOps)  # (a set lookup hashes in C; `in` an Enum class runs Python code)
# bases the scheduler always computes in a kernel of their own (engine/schedule.py, _Graph._enter): a kernel that reads
# one reads its buffer, never what it was computed from (an optimizer's parameter update reads its new moments so)
_OWN_KERNEL = frozenset((LoadOps.ASSIGN, LoadOps.CONTIGUOUS, LoadOps.COPY, LoadOps.CUSTOM, LoadOps.EMPTY))


CHECK_DATA = ContextVar("CHECK_DATA", 1)  # 0: no checks of index and label values on the device (bench/ measures them)


def _index_wide_enough(index: Tensor, size: sint) -> Tensor:
    """A signed index whose dtype cannot hold size - 1 (int8 into 300 rows) in int32 (int64 for a size past int32),
    so that wrapping a negative one (index + size) is exact."""
    dt = index.dtype
    if dtypes.is_unsigned(dt) or not isinstance(size, int) or size - 1 <= dtypes.max(dt):
        return index
    return index.cast(dtypes.int32 if size - 1 <= dtypes.max(dtypes.int32) else dtypes.int64)


def _index_outside(index: Tensor, low: int, size: sint) -> Tensor:
    """Where an index is outside [low, size), compared exactly in its own dtype: a bound the dtype cannot reach is not
    compared (-3 in uint8 would be 253, 300 in uint8 44), and an index of floats as it is."""
    if not dtypes.is_int(index.dtype):
        return (index < low) | (index >= size)
    dt, parts = index.dtype, []
    if dtypes.min(dt) < low:
        parts.append(index < low)
    if isinstance(size, int) and size <= dtypes.max(dt):
        parts.append(index >= size)
    if not parts:
        return Tensor.full(index.shape, False, dtype=dtypes.bool, device=index.device)
    return parts[0] | parts[1] if len(parts) == 2 else parts[0]


def _gathers(x: Tensor, index: Tensor, shape: tuple[sint, ...]) -> bool:
    """Whether `index` picks from `x` by a load at the index (F.Gather) into a result of `shape`: both one device's
    plain (unsharded) tensors of int sizes, on a device that runs kernels, with something to read and to compute. The
    others (a sharded tensor, a symbolic size) take the one-hot form."""
    lb, ib = x.lazydata, index.lazydata
    return (
        type(lb) is LazyBuffer
        and type(ib) is LazyBuffer
        and dtypes.is_int(index.dtype)
        and all_int(x.shape)
        and all_int(shape)
        and x.numel() > 0
        and prod(shape) > 0
        and not Device.storage_only(lb.device)
    )


def _label_masks(
    Y: Tensor, classes: sint, ignore_index: Optional[int], device: Any
) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """For labels Y of `classes` classes: True at each counted label's class (Y's shape + (classes,)), True at each
    label counted (not ignore_index; None when there is none), and True at each counted label out of range. Labels
    need no gradient, so for integer labels of one device these are built on the LazyBuffers (the Tensor ops' graph,
    without a Tensor, a broadcast and a Function per op: they were most of a small model's loss), from an arange made
    once."""
    yl = Y.lazydata
    plain = type(yl) is LazyBuffer and yl.device == device and isinstance(classes, int) and all_int(yl.shape)
    if not plain or not dtypes.is_int(yl.dtype):
        hit = Y.unsqueeze(-1) == Tensor.arange(classes, device=device)
        out_of_range = (Y < 0) | (Y >= classes)
        if ignore_index is None:
            return hit, None, out_of_range
        mask = Y != ignore_index
        return hit & mask.unsqueeze(-1), mask, mask & out_of_range
    assert isinstance(yl, LazyBuffer) and isinstance(classes, int)  # (what `plain` says, for the type checker)
    dtype = least_upper_dtype(yl.dtype, dtypes.default_int)  # (as Y == arange(classes) would cast it)
    yl = yl.cast(dtype) if yl.dtype != dtype else yl
    shape, eq, both = yl.shape, BinaryOps.CMPEQ, BinaryOps.AND
    full = (*shape, classes)

    def negated(x: LazyBuffer) -> LazyBuffer:  # logical not, as Tensor.logical_not builds it
        return x.e(eq, x.const(False))

    def across(x: LazyBuffer) -> LazyBuffer:  # Y's shape -> (*Y's shape, classes)
        return x.reshape_expand((*shape, 1), full)

    key = (classes, dtype, device)
    if (ar := _ARANGES.get(key)) is None or ar.realized is None:
        if len(_ARANGES) >= 64:
            _ARANGES.clear()
        ar = _ARANGES[key] = LazyBuffer.fromcpu(np.arange(classes, dtype=_np_for(dtype)), device, dtype)
    hit = across(yl).e(eq, ar.reshape_expand((1,) * len(shape) + (classes,), full))
    out_of_range = yl.e(BinaryOps.CMPLT, yl.const(0)).e(BinaryOps.OR, negated(yl.e(BinaryOps.CMPLT, yl.const(classes))))
    if ignore_index is None:
        return _unrecorded(hit), None, _unrecorded(out_of_range)
    keep = negated(yl.e(eq, yl.const(ignore_index)))
    return _unrecorded(hit.e(both, across(keep))), _unrecorded(keep), _unrecorded(keep.e(both, out_of_range))


# the class numbers of _label_masks (sparse_categorical_crossentropy, one_hot) by (classes, dtype, device), made once
_ARANGES: dict[tuple[Any, ...], LazyBuffer] = {}
plugins.on_change.append(_ARANGES.clear)


def _with_check(out: Tensor, bad: Tensor, message: str, error: type = IndexOutOfRangeError) -> Tensor:
    """`out`, checked when it is realized: `bad` (True where the data is invalid) is counted first, on the device,
    and a count above 0 raises `error` before any kernel reads the invalid data (engine/schedule.py)."""
    lb = out.lazydata
    if not CHECK_DATA.value or not isinstance(lb, LazyBuffer) or bad.numel() == 0:
        return out
    count = bad.cast(dtypes.int32).sum()
    if count.lazydata.is_unrealized_const():  # known now
        if count.lazydata.base.arg:
            raise error(message)
        return out
    base = lb.base
    if base.realized is not None or base.op is LoadOps.CONST:  # no computation to attach to: count now
        if count.item():
            raise error(message)
        return out
    base.checks = (*base.checks, (count.lazydata, error, message))
    return out


def _write_through(target: LazyBuffer, value: LazyBuffer) -> None:
    """Write `value` into the memory `target` (a base, or a view that writes_through) reads, now: the target's base is
    computed first if it is not yet, so every tensor that reads that base sees the write."""
    with ENGINE_LOCK:
        base = target.base
        if base.realized is None:
            run_schedule(*create_schedule_with_vars([base]))
        if _assign_hazard(value, target):  # computed apart first, so the kernel reads nothing it overwrites
            value = value.contiguous()
        run_schedule(*create_schedule_with_vars([target.assign(value)]))


# Tensor._dot_chain's plans: (shapes, dtype) -> (the two inputs' steps, the steps after their product)
_DOT_PLANS: dict[tuple[Any, ...], tuple[Any, Any]] = {}
# and, for a product that records no gradient, (plan key, the inputs' trackers) -> the tracker of each input's last
# view of its base
_DOT_VIEWS: dict[tuple[Any, ...], tuple[ShapeTracker, ShapeTracker]] = {}
# each kind of a plan's step as its Function's forward does it, for a product that records no gradient. Written out
# rather than called through Function.forward_only, whose context objects cost a quarter of the product's graph
# (24 -> 30 us at 128 x 128); test_dot_chain compares the graphs with the recorded Chain's for every shape
_LAZY_STEPS: dict[type[Function], Callable[[LazyBuffer, dict[str, Any]], LazyBuffer]] = {
    F.Reshape: lambda x, kw: x.reshape(kw["shape"]),
    F.Permute: lambda x, kw: x.permute(kw["order"]),
    F.Expand: lambda x, kw: x.expand(kw["shape"]),
    F.Cast: lambda x, kw: x.cast(kw["dtype"]),
    F.Sum: lambda x, kw: x.r(ReduceOps.SUM, kw["axis"]),
}


def _dot_views(branches: Any, x: LazyBuffer, y: LazyBuffer) -> tuple[LazyBuffer, LazyBuffer]:
    """Each input of a product after its steps (reshapes, the permute, the broadcast), one step at a time."""
    for step, kwargs in branches[0]:
        x = _LAZY_STEPS[step](x, kwargs)
    for step, kwargs in branches[1]:
        y = _LAZY_STEPS[step](y, kwargs)
    return x, y


def _assign_hazard(src: LazyBuffer, target: LazyBuffer) -> bool:
    """Whether computing `src` in the kernel that writes `target` would read target at positions other than the one
    being written (through a moved view, or a reduction): then a kernel could overwrite data it has yet to read.
    What a reduce reads below another reduce is never in that kernel: the scheduler realizes a reduce that feeds a
    reduce on its own (engine/schedule.py, _Graph._try_fuse_reduce), and every kernel that reads the old target runs
    before the assign. So the walk stops there (a training step's update would otherwise walk the whole forward and
    backward graph again for every parameter, and copy every weight: its forward matmul reads it transposed), and at
    a base computed by a kernel of its own (_OWN_KERNEL: an Adam step's new moments, which the update reads)."""
    # whether each (base, below a reduce) reads the target, sources first: a loop, not recursion (graphs can be deeper
    # than Python's recursion limit), memoized by base (a graph that reuses nodes would make it exponential; the views
    # of one base share its answer). The first hazard found ends the walk: it runs for every assign of a training step
    if src is target:
        return False
    tbase = target._base or target
    root = src._base or src
    if root is tbase:
        return True
    if root.realized is not None:
        return False
    reduce_ops, own_kernel = _REDUCE_OPS, _OWN_KERNEL
    if src is root and root.op not in reduce_ops and _read_plainly_at_the_top(root, target, tbase):
        return False
    memo: dict[tuple[int, bool], bool] = {}
    stack: list[tuple[LazyBuffer, bool, bool]] = [(root, False, False)]  # (base, below a reduce, sources pushed)
    while stack:
        b, under, expanded = stack.pop()
        key = (id(b), under)
        if key in memo:
            continue
        below = under or b.op in reduce_ops
        if not expanded:
            stack.append((b, under, True))
            for s in b.srcs:
                if s is target:
                    continue
                sb = s._base or s
                if sb is tbase:  # the target's memory read through another view
                    return True
                if sb.realized is None and sb.op in own_kernel:  # computed before, by a kernel of its own: a buffer
                    if sb.buffer is tbase.buffer:  # (an assign into the target's memory)
                        return True
                    continue
                if sb.realized is None and not (below and sb.op in reduce_ops) and (id(sb), below) not in memo:
                    stack.append((sb, below, False))
            continue
        reads = False
        for s in b.srcs:
            if s is target:
                reads = True
                continue
            sb = s._base or s
            if sb.realized is None and sb.op not in own_kernel and not (below and sb.op in reduce_ops) and memo[
                (id(sb), below)
            ]:
                if s is not sb or sb.op in reduce_ops:  # read through a moved view, or by a reduction
                    return True
                reads = True
        memo[key] = reads
    return memo[(id(root), False)] and (src is not root or root.op in reduce_ops)


def _read_plainly_at_the_top(root: LazyBuffer, target: LazyBuffer, tbase: LazyBuffer) -> bool:
    """Whether every node not computed yet that reads the target's memory is the root itself or one of its sources
    that the root alone reads, each reading the target itself (not a view of it), each read unmoved and none a reduce:
    then nothing below the root can read the target, and no walk is needed (an optimizer's new moments: m * b1 + ...
    reads m at the top, and the gradient below it never reads m)."""
    for ref in tbase.__dict__.get("readers", ()):
        r = ref()
        if r is None or r.realized is not None:
            continue
        if any((s._base or s) is tbase and s is not target for s in r.srcs):
            return False  # (a view of the target's memory)
        if r is root:
            continue
        if r.op in _REDUCE_OPS or not any(s is r for s in root.srcs):
            return False
        if any((s._base or s) is r and s is not r for s in root.srcs):
            return False  # (read through a moved view)
        for rr in r.__dict__.get("readers", ()):
            if (other := rr()) is not None and other is not root and other.realized is None:
                return False  # (read by another node too: maybe by a reduce below the root)
    return True


def _shape(shape: tuple[Any, ...]) -> tuple[sint, ...]:
    """A shape from varargs or a single tuple, checked to be non-negative."""
    s = tuple(int(d) if isinstance(d, np.integer) else d for d in argfix(*shape))
    for d in s:
        if not isinstance(d, (int, Node)) or isinstance(d, bool):
            raise TypeError(f"shape dimensions must be ints (or Variables), got {s!r}")
        if isinstance(d, int) and d < 0:
            raise ValueError(f"shape dimensions must be >= 0, got {s}")
    return s


def _broadcast_shape(*shapes: tuple[sint, ...]) -> tuple[sint, ...]:
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {shapes} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _multi_lazydata(data: Any, devices: Any, dtype: Optional[DType]) -> MultiLazyBuffer:
    """The data of a tensor on several devices: a MultiLazyBuffer as given, or anything else replicated on each."""
    if isinstance(data, MultiLazyBuffer):
        if dtype is not None and dtype != data.dtype:
            raise TypeError(f"sharded data of {data.dtype} cannot become a tensor of {dtype}; use .cast()")
        return data
    canonical = tuple(Device.canonicalize(d) for d in devices)
    one = Tensor(data, device=canonical[0], dtype=dtype).lazydata
    return MultiLazyBuffer.from_sharded(one, canonical, None)


def _bound_size(shape: Sequence[sint]) -> int:
    """The number of elements of a shape whose symbolic sizes take their bound values."""
    return int(
        prod(
            [
                sym_infer(d, {v: v.val for v in d.vars() if v.val is not None}) if isinstance(d, Node) else d
                for d in shape
            ]
        )
    )


class _Conv(F.Function):
    """A convolution whose gradients are convolutions too: the input's a transposed convolution of the output's
    gradient (as torch computes it), the weight's the input's windows times that gradient, summed. Through the
    windows' views instead (pad, expand, reshape, shrink), the input's gradient is a sum over overlapping copies
    whose indexes need a division and a modulo per element: 8x slower for a 3x3 conv on CLANG."""

    def forward(self, x: LazyBuffer, w: LazyBuffer, **args: Any) -> LazyBuffer:
        self.x, self.w, self.args = x, w, args
        return Tensor(x)._conv_forward(Tensor(w), **args).lazydata

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        x, w, g = Tensor(self.x), Tensor(self.w), Tensor(grad_output)
        groups, pads = self.args["groups"], self.args["pads"]
        bs, (cout, cin), kernel = x.shape[0], w.shape[:2], w.shape[2:]
        nd = len(kernel)
        strides, dils = make_pair(self.args["stride"], nd), make_pair(self.args["dilation"], nd)
        out_sp = g.shape[2:]
        gx = gw = None
        if self.needs_input_grad[0]:
            # padded so the result has the input's size: (o - 1) * s + 1 spread positions, d * (k - 1) - pl before
            # them (pl > d * (k - 1) trims), and after them what reaches the input's end (positions past the last
            # window, when the size is not a multiple of the stride, get zeros)
            inner = [(d * (k - 1) - pl, n + pl - (o - 1) * s - 1) for o, s, d, k, n, (pl, _) in zip(
                out_sp, strides, dils, kernel, x.shape[2:], pads)]  # fmt: skip
            gx = g._conv_transpose(w, None, groups, strides, dils, inner).cast(x.dtype).lazydata
        if self.needs_input_grad[1]:
            xp = x._conv_windows(kernel, groups, strides, dils, pads)
            if cout // groups >= CONV_VECTOR_CHANNELS:
                # the output's gradient laid out channels last (a copy: a transpose costs one pass): the kernel then
                # loads a vector of output channels at once instead of gathering them a map apart (a 16 -> 16 3x3
                # conv's weight gradient at batch 32, 32 x 32, on one AVX2 core: 4.6 -> 2.2 ms with the copy)
                g = g.permute(0, *range(2, 2 + nd), 1).contiguous().permute(0, nd + 1, *range(1, nd + 1))
            gg = g.reshape(bs, groups, cout // groups, 1, *out_sp, *([1] * nd))
            gw = (xp * gg).sum((0, *range(4, 4 + nd))).reshape(cout, cin, *kernel).cast(w.dtype).lazydata
        return gx, gw
