"""Tensor: the user-facing array with autograd, in the API of tinygrad 0.9.0."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Iterable, Optional, Sequence, Union

import numpy as np

import tgcore.function as F
from tgcore.device import Buffer, Device
from tgcore.dtype import ConstType, DType, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from tgcore.engine.realize import run_schedule
from tgcore.engine.schedule import ScheduleItem, create_schedule_with_vars
from tgcore.function import Function
from tgcore.helpers import all_int, argfix, flatten, prod
from tgcore.lazy import LazyBuffer
from tgcore.ops import LoadOps
from tgcore.shape.symbolic import Variable, sint

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


class Tensor:
    """A lazily evaluated n-dimensional array on a device, with reverse-mode autograd."""

    __slots__ = "lazydata", "requires_grad", "grad", "_ctx"
    __deletable__ = ("_ctx",)
    training: ClassVar[bool] = False
    no_grad: ClassVar[bool] = False

    def __init__(
        self,
        data: Union[None, ConstType, list, tuple, LazyBuffer, np.ndarray, bytes, Tensor],
        device: Optional[str] = None,
        dtype: Optional[Union[DType, str]] = None,
        requires_grad: Optional[bool] = None,
    ) -> None:
        dt = to_dtype(dtype) if dtype is not None else None
        device = Device.canonicalize(device)
        self.grad: Optional[Tensor] = None
        self.requires_grad: Optional[bool] = requires_grad
        self._ctx: Optional[Function] = None
        if isinstance(data, Tensor):
            data = data.lazydata
        if isinstance(data, LazyBuffer):
            if dt is not None and dt != data.dtype:
                raise TypeError(f"a LazyBuffer of {data.dtype} cannot become a tensor of {dt}; use .cast()")
            lb = data
        elif data is None:
            lb = LazyBuffer.loadop(LoadOps.EMPTY, (0,), dt or dtypes.default_float, device)
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
        if lb.device != device and device is not None and not isinstance(data, LazyBuffer):
            lb = lb.copy_to_device(device)
        self.lazydata = lb

    def __repr__(self) -> str:
        grad = self.grad.lazydata if self.grad is not None else None
        return f"<Tensor {self.lazydata!r} on {self.device} with grad {grad!r}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor is ambiguous; use .item() or compare explicitly")

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

    @property
    def T(self) -> Tensor:
        return self.transpose()

    # ***** realization *****

    def schedule_with_vars(self, *lst: Tensor) -> tuple[list[ScheduleItem], dict[Variable, int]]:
        return create_schedule_with_vars([x.lazydata for x in (self, *lst)])

    def schedule(self, *lst: Tensor) -> list[ScheduleItem]:
        return self.schedule_with_vars(*lst)[0]

    def realize(self, *lst: Tensor) -> Tensor:
        """Compute this tensor (and `lst`) now."""
        run_schedule(*self.schedule_with_vars(*lst))
        return self

    def contiguous(self) -> Tensor:
        return F.Contiguous.apply(self)

    def contiguous_backward(self) -> Tensor:
        return F.ContiguousBackward.apply(self)

    def detach(self) -> Tensor:
        return Tensor(self.lazydata, device=self.device, requires_grad=False)

    def _buffer(self) -> Buffer:
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
        return memoryview(arr).cast(arr.dtype.char, arr.shape) if arr.ndim and arr.size else memoryview(arr)

    def item(self) -> ConstType:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor of one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: Optional[str]) -> Tensor:
        """This tensor on `device` (the same tensor when it is already there)."""
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        ret = Tensor(self.lazydata.copy_to_device(device), device, requires_grad=self.requires_grad)
        if self.grad is not None:
            ret.grad = self.grad.to(device)
        return ret

    def to_(self, device: Optional[str]) -> Tensor:
        """Move this tensor to `device` in place."""
        moved = self.to(device)
        self.lazydata, self.grad = moved.lazydata, moved.grad
        return self

    def assign(self, x: Any) -> Tensor:
        """Write `x` into this tensor's memory (shapes, dtypes and devices must match)."""
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape or x.dtype != self.dtype or x.device != self.device:
            raise ValueError(
                f"assign needs the same shape, dtype and device: target {self.shape} {self.dtype} "
                f"{self.device}, value {x.shape} {x.dtype} {x.device}"
            )
        if self.lazydata is x.lazydata:
            return self
        if self.lazydata.base.realized is None or self.lazydata.base is not self.lazydata:
            self.lazydata = x.lazydata
            return self
        self.lazydata = self.lazydata.assign(x.lazydata)
        return self

    def replace(self, x: Tensor) -> Tensor:
        """Make this tensor hold `x`'s data (same shape)."""
        if x.shape != self.shape:
            raise ValueError(f"replace needs the same shape, got {x.shape} for {self.shape}")
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
        dtype = kwargs.pop("dtype", None) or dtypes.from_py(fill_value)
        return Tensor(fill_value, dtype=dtype, **kwargs).reshape((1,) * len(shape)).expand(shape)

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

    # random numbers: a seeded generator on the host (reproducible for a given seed on every device)
    _seed: ClassVar[int] = 0
    _rng_counter: ClassVar[int] = 0

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        Tensor._seed, Tensor._rng_counter = seed, 0

    @staticmethod
    def _host_rng() -> np.random.Generator:
        Tensor._rng_counter += 1
        return np.random.Generator(np.random.Philox(key=Tensor._seed, counter=Tensor._rng_counter))

    @staticmethod
    def rand(*shape: Any, **kwargs: Any) -> Tensor:
        """Uniform in [0, 1)."""
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.default_float)
        arr = Tensor._host_rng().random(_shape(shape), dtype=np.float32)
        return Tensor(arr, **kwargs).cast(dt)

    @staticmethod
    def randn(*shape: Any, **kwargs: Any) -> Tensor:
        """Standard normal."""
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.default_float)
        arr = Tensor._host_rng().standard_normal(_shape(shape), dtype=np.float32)
        return Tensor(arr, **kwargs).cast(dt)

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Tensor:
        dtype = kwargs.pop("dtype", dtypes.default_float)
        return ((high - low) * Tensor.rand(*shape, **kwargs) + low).cast(dtype)

    @staticmethod
    def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs) * (prod(_shape(shape)) ** -0.5)

    @staticmethod
    def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        s = _shape(shape)
        return Tensor.uniform(*s, low=-1.0, high=1.0, **kwargs) * ((6 / (s[0] + prod(s[1:]))) ** 0.5)

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
        if gradient is None:
            if self.shape != ():
                raise ValueError(f"backward without a gradient needs a scalar, got shape {self.shape}")
            gradient = Tensor(1.0, dtype=self.dtype, device=self.device, requires_grad=False)
        if gradient.shape != self.shape:
            raise ValueError(f"gradient shape {gradient.shape} does not match tensor shape {self.shape}")
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
        if sum(1 for s in new_shape if s == -1) > 1:
            raise ValueError(f"reshape can infer only one dimension, got {new_shape}")
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
        if prod(resolved) != self.numel():
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} ({self.numel()} elements) to {new_shape}")
        return F.Reshape.apply(self, shape=tuple(resolved)) if tuple(resolved) != self.shape else self

    def view(self, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def expand(self, shape: Any, *args: Any) -> Tensor:
        new_shape = argfix(shape, *args)
        if len(new_shape) < self.ndim:
            raise ValueError(f"cannot expand shape {self.shape} to fewer dimensions {new_shape}")
        x = self.reshape((1,) * (len(new_shape) - self.ndim) + self.shape) if len(new_shape) > self.ndim else self
        target = tuple(xs if s == -1 else s for xs, s in zip(x.shape, new_shape))
        for xs, s in zip(x.shape, target):
            if xs != s and xs != 1:
                raise ValueError(f"cannot expand shape {self.shape} to {new_shape}: only axes of size 1 can grow")
        return F.Expand.apply(x, shape=target) if target != x.shape else x

    def permute(self, order: Any, *args: Any) -> Tensor:
        order_t = tuple(self._resolve_dim(d) for d in argfix(order, *args))
        if sorted(order_t) != list(range(self.ndim)):
            raise ValueError(f"permute needs a permutation of the {self.ndim} axes, got {order_t}")
        return F.Permute.apply(self, order=order_t)

    def flip(self, axis: Any, *args: Any) -> Tensor:
        axes = tuple(self._resolve_dim(a) for a in argfix(axis, *args))
        if len(set(axes)) != len(axes):
            raise ValueError(f"flip got a repeated axis in {axes}")
        return F.Flip.apply(self, axis=axes)

    def shrink(self, arg: tuple[Optional[tuple[sint, sint]], ...]) -> Tensor:
        if len(arg) != self.ndim:
            raise ValueError(f"shrink needs one (begin, end) per axis ({self.ndim}), got {arg}")
        full = tuple(x if x is not None else (0, s) for x, s in zip(arg, self.shape))
        for (b, e), s in zip(full, self.shape):
            if not (0 <= b <= e <= s):
                raise ValueError(f"shrink {arg} is out of bounds for shape {self.shape}")
        return F.Shrink.apply(self, arg=full) if any(x != (0, s) for x, s in zip(full, self.shape)) else self

    def pad(self, arg: Sequence[Optional[tuple[int, int]]], value: float = 0.0) -> Tensor:
        if len(arg) != self.ndim:
            raise ValueError(f"pad needs one (before, after) per axis ({self.ndim}), got {arg}")
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
        return mask.where(ret, value)

    def _resolve_dim(self, dim: int, outer: bool = False) -> int:
        n = self.ndim + int(outer)
        if not -max(1, n) <= dim < max(1, n):
            raise IndexError(f"dimension {dim} is out of range for a tensor of {self.ndim} dimensions")
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

    def __getitem__(self, indices: Any) -> Tensor:
        """Basic indexing: ints, slices (any step), None and Ellipsis."""
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
        x, dim, out_shape = self, 0, []
        shrink, flips, strides = [], [], []
        for i in idx:
            if i is None:
                out_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
                j = int(i) + size if i < 0 else int(i)
                if not 0 <= j < size:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
                shrink.append((j, j + 1))
                flips.append(False)
                strides.append(1)
            elif isinstance(i, slice):
                start, stop, step = i.indices(size)
                n = len(range(start, stop, step))
                if step > 0:
                    shrink.append((start, start + (n - 1) * step + 1) if n else (0, 0))
                else:
                    shrink.append((start + (n - 1) * step, start + 1) if n else (0, 0))
                flips.append(step < 0)
                strides.append(abs(step))
                out_shape.append(n)
            elif isinstance(i, Tensor):
                raise NotImplementedError("indexing with a Tensor (advanced indexing) is not supported yet")
            else:
                raise IndexError(f"cannot index with {type(i).__name__}: expected int, slice, None or Ellipsis")
            dim += 1
        x = x.shrink(tuple(shrink)) if shrink else x
        if any(flips):
            x = x.flip(tuple(d for d, f in enumerate(flips) if f))
        if any(s != 1 for s in strides):
            # take every k-th element: pad to a multiple of k, split the axis, keep index 0
            padded = [(0, (-int(s)) % k) if k > 1 else (0, 0) for s, k in zip(x.shape, strides)]
            x = x.pad(tuple(padded))
            split = flatten([(s // k, k) if k > 1 else (s, 1) for s, k in zip(x.shape, strides)])
            x = x.reshape(tuple(split)).shrink(
                tuple(flatten([((0, split[2 * d]), (0, 1)) for d in range(len(strides))]))
            )
        return x.reshape(tuple(out_shape))

    def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
        d = self._resolve_dim(dim)
        tensors = [self, *args]
        for t in args:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise ValueError(f"cat needs equal shapes except on axis {d}, got {[x.shape for x in tensors]}")
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

    @staticmethod
    def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
        first, *rest = [t.unsqueeze(dim) for t in tensors]
        return first.cat(*rest, dim=dim)

    def repeat(self, repeats: Sequence[int]) -> Tensor:
        base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        new_shape = [x for r, s in zip(repeats, base.shape) for x in (1, s)]
        expanded = [x for r, s in zip(repeats, base.shape) for x in (r, s)]
        return base.reshape(new_shape).expand(expanded).reshape([r * s for r, s in zip(repeats, base.shape)])

    # ***** reductions *****

    def _reduce(
        self, fxn: type[Function], axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False
    ) -> Tensor:
        axes = tuple(range(self.ndim)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(self._resolve_dim(a) for a in axes)
        if self.ndim == 0:
            return self
        ret = fxn.apply(self, axis=axes)
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, acc_dtype: Optional[DType] = None
    ) -> Tensor:
        """Sum over `axis` (all axes by default), accumulating in a wide enough dtype."""
        acc = acc_dtype or sum_acc_dtype(self.dtype)
        ret = self.cast(acc)._reduce(F.Sum, axis, keepdim)
        return ret.cast(self.dtype) if acc_dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else ret

    def max(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        return self._reduce(F.Max, axis, keepdim)

    def min(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        if dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            return ~((~self).max(axis=axis, keepdim=keepdim))
        return -((-self).max(axis=axis, keepdim=keepdim))

    def mean(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
        out = self.sum(axis=axis, keepdim=keepdim)
        count = prod(self.shape) // prod(out.shape) if prod(out.shape) else 0
        output_dtype = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
        return out.cast(output_dtype).div(count).cast(output_dtype)

    def var(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1
    ) -> Tensor:
        squares = (self - self.mean(axis=axis, keepdim=True)).square().sum(axis=axis, keepdim=keepdim)
        count = prod(self.shape) // prod(squares.shape) if prod(squares.shape) else 0
        return squares.div(max(0, count - correction))

    def std(
        self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1
    ) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def _softmax(self, axis: int) -> tuple[Tensor, Tensor, Tensor]:
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
        m = self.max(axis=axis, keepdim=True)
        ret = (self - m).exp().sum(axis=axis, keepdim=True).log() + m
        return ret if keepdim else ret.reshape(self.max(axis=axis).shape)

    def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum along `axis` (of the flattened tensor when None)."""
        if axis is None:
            return self.flatten().argmax(0)
        ax = self._resolve_dim(axis)
        n = self.shape[ax]
        is_max = self == self.max(axis=ax, keepdim=True)
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
        ret = (x.unsqueeze(-2) * lower.cast(x.dtype)).sum(-1)
        return ret.transpose(ax, -1)

    def triu(self, k: int = 0) -> Tensor:
        r, c = self.shape[-2], self.shape[-1]
        rows = Tensor.arange(r, device=self.device).unsqueeze(1)
        cols = Tensor.arange(c, device=self.device).unsqueeze(0)
        return (cols - rows >= k).where(self, 0).cast(self.dtype)

    def tril(self, k: int = 0) -> Tensor:
        r, c = self.shape[-2], self.shape[-1]
        rows = Tensor.arange(r, device=self.device).unsqueeze(1)
        cols = Tensor.arange(c, device=self.device).unsqueeze(0)
        return (cols - rows <= k).where(self, 0).cast(self.dtype)

    # ***** processing *****

    def dot(self, w: Tensor, acc_dtype: Optional[DType] = None) -> Tensor:
        """Matrix product with numpy's rules for 1-d and batched operands."""
        n1, n2 = self.ndim, w.ndim
        if n1 == 0 or n2 == 0:
            raise ValueError(f"dot needs tensors of at least 1 dimension, got {self.shape} and {w.shape}")
        if self.shape[-1] != w.shape[-min(n2, 2)]:
            raise ValueError(
                f"dot: shapes {self.shape} and {w.shape} do not align ({self.shape[-1]} != {w.shape[-min(n2, 2)]})"
            )
        x = self.reshape(*self.shape[:-1], *[1] * min(n1 - 1, n2 - 1, 1), self.shape[-1])
        w = w.reshape(*w.shape[:-2], *[1] * min(n1 - 1, n2 - 1, 1), *w.shape[-min(n2, 2) :]).transpose(-1, -min(n2, 2))
        out_dtype = least_upper_dtype(x.dtype, w.dtype)
        return (x * w).sum(-1, acc_dtype=acc_dtype).cast(acc_dtype or out_dtype)

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

    def one_hot(self, num_classes: int) -> Tensor:
        return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(dtypes.default_int)

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0
    ) -> Tensor:
        """Mean cross-entropy of logits `self` (N, C) against integer labels Y (N,)."""
        log_probs = self.log_softmax()
        mask = Y != ignore_index
        y = (Y.unsqueeze(-1) == Tensor.arange(self.shape[-1], device=self.device)) * mask.unsqueeze(-1)
        smoothing = label_smoothing * (log_probs.mean(-1) * mask).sum()
        return -((1 - label_smoothing) * (log_probs * y).sum() + smoothing) / mask.sum()

    # ***** unary math *****

    def neg(self) -> Tensor:
        return F.Neg.apply(self) if self.dtype != dtypes.bool else self.logical_not()

    def logical_not(self) -> Tensor:
        return F.Eq.apply(*self._broadcasted(False))

    def log(self) -> Tensor:
        return F.Log.apply(self.cast(least_upper_float(self.dtype)))

    def log2(self) -> Tensor:
        return self.log() / math.log(2)

    def exp(self) -> Tensor:
        return F.Exp.apply(self.cast(least_upper_float(self.dtype)))

    def exp2(self) -> Tensor:
        return F.Exp.apply(self.cast(least_upper_float(self.dtype)) * math.log(2))

    def sqrt(self) -> Tensor:
        return F.Sqrt.apply(self.cast(least_upper_float(self.dtype)))

    def rsqrt(self) -> Tensor:
        return self.reciprocal().sqrt()

    def sin(self) -> Tensor:
        return F.Sin.apply(self.cast(least_upper_float(self.dtype)))

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def relu(self) -> Tensor:
        return F.Relu.apply(self)

    def sigmoid(self) -> Tensor:
        return F.Sigmoid.apply(self.cast(least_upper_float(self.dtype)))

    def tanh(self) -> Tensor:
        return 2.0 * ((2.0 * self).sigmoid()) - 1.0

    def gelu(self) -> Tensor:
        return 0.5 * self * (1 + (self * 0.7978845608 * (1 + 0.044715 * self * self)).tanh())

    def leakyrelu(self, neg_slope: float = 0.01) -> Tensor:
        return self.relu() - (-neg_slope * self).relu()

    def reciprocal(self) -> Tensor:
        return F.Reciprocal.apply(self.cast(least_upper_float(self.dtype)))

    def square(self) -> Tensor:
        return self * self

    def abs(self) -> Tensor:
        return self.relu() + (-self).relu()

    def sign(self) -> Tensor:
        return F.Sign.apply(self)

    def clip(self, min_: Optional[ConstType] = None, max_: Optional[ConstType] = None) -> Tensor:
        if min_ is None and max_ is None:
            raise ValueError("clip needs at least one of min_ and max_")
        x = self.maximum(min_) if min_ is not None else self
        return x.minimum(max_) if max_ is not None else x

    def trunc(self) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self
        # values this large are integers already; NaN and inf stay as they are
        keep = (self.abs() >= 2 ** (23 if self.dtype != dtypes.float64 else 52)) | (self != self)
        return keep.where(self, self.cast(dtypes.int64).cast(self.dtype))

    def floor(self) -> Tensor:
        b = self.trunc()
        return (self < b).where(b - 1, b)

    def ceil(self) -> Tensor:
        b = self.trunc()
        return (self > b).where(b + 1, b)

    # ***** binary math *****

    def _broadcasted(
        self, y: Union[Tensor, ConstType], reverse: bool = False, match_dtype: bool = True
    ) -> tuple[Tensor, Tensor]:
        x: Tensor = self
        if not isinstance(y, Tensor):
            if not isinstance(y, (bool, int, float, np.generic)):
                raise TypeError(f"cannot combine a Tensor with {type(y).__name__}")
            y = y.item() if isinstance(y, np.generic) else y
            if isinstance(y, float) and not dtypes.is_float(x.dtype):
                y_dtype = dtypes.default_float
            elif isinstance(y, int) and not isinstance(y, bool) and x.dtype == dtypes.bool:
                y_dtype = dtypes.default_int
            else:
                y_dtype = x.dtype
            y = Tensor(dtypes.as_const(y, y_dtype), device=x.device, dtype=y_dtype, requires_grad=False)
        if x.device != y.device:
            raise ValueError(f"operands are on different devices: {x.device} and {y.device}")
        if match_dtype and x.dtype != y.dtype:
            out = least_upper_dtype(x.dtype, y.dtype)
            x, y = x.cast(out), y.cast(out)
        if reverse:
            x, y = y, x
        shape = _broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[sint, ...]) -> Tensor:
        if self.shape == shape:
            return self
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
        return x.expand(shape)

    def add(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Add.apply(*self._broadcasted(x, reverse))

    def sub(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Sub.apply(*self._broadcasted(x, reverse))

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
        base, exponent = self._broadcasted(x, reverse)
        if not dtypes.is_float(base.dtype):
            base, exponent = base.cast(dtypes.default_float), exponent.cast(dtypes.default_float)
        # |b|^e through exp and log, with the sign fixed for negative bases and integer exponents
        mag = (exponent * base.abs().log()).exp()
        odd = (exponent - 2 * (exponent / 2).floor()) == 1
        is_int = exponent == exponent.trunc()
        neg = base < 0
        signed = neg.where(is_int.where(odd.where(-mag, mag), math.nan), mag)
        return ((base == 0) * (exponent == 0)).where(1.0, signed).cast(base.dtype)

    def maximum(self, x: Union[Tensor, ConstType]) -> Tensor:
        """Elementwise max; NaN wins like numpy's maximum, and a tie splits the gradient."""
        a, b = self._broadcasted(x)
        tie = (a * 0.5 + b * 0.5).cast(a.dtype) if dtypes.is_float(a.dtype) else a
        return (a < b).detach().where(b, (a == b).detach().where(tie, (b != b).detach().where(b, a)))

    def minimum(self, x: Union[Tensor, ConstType]) -> Tensor:
        a, b = self._broadcasted(x)
        return -((-a).maximum(-b)) if a.dtype != dtypes.bool else a * b

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

    def xor(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
        return F.Xor.apply(*self._broadcasted(x, reverse))

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
        a, b = self._broadcasted(x)
        if a.dtype != dtypes.bool:
            raise TypeError(f"| is only supported on bool tensors here, got {a.dtype}")
        return (a.cast(dtypes.uint8) + b.cast(dtypes.uint8)) != 0

    def __and__(self, x: Union[Tensor, ConstType]) -> Tensor:
        a, b = self._broadcasted(x)
        if a.dtype != dtypes.bool:
            raise TypeError(f"& is only supported on bool tensors here, got {a.dtype}")
        return F.Mul.apply(a, b)

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

    # ***** casting *****

    def cast(self, dtype: Union[DType, str]) -> Tensor:
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


def _shape(shape: tuple[Any, ...]) -> tuple[sint, ...]:
    """A shape from varargs or a single tuple, checked to be non-negative."""
    s = argfix(*shape)
    for d in s:
        if isinstance(d, int) and d < 0:
            raise ValueError(f"shape dimensions must be >= 0, got {s}")
    return tuple(s)


def _broadcast_shape(*shapes: tuple[sint, ...]) -> tuple[sint, ...]:
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)
