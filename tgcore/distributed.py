"""Data-parallel training on MPI: collectives on Tensors, a rank's share of a data set, and an optimizer wrapper that
averages gradients across ranks (the extra `tgcore[mpi]`: mpi4py and MPICH from pip; `import tgcore` never loads it).

    mpiexec -n 2 python train.py        # every rank runs the same program

    from tgcore import distributed as dist
    dist.init()
    dist.broadcast_parameters(params)                 # every rank starts from rank 0's weights
    opt = dist.DistributedOptimizer(nn.optim.Adam(params))
    ... loss.backward(); opt.step()                   # gradients averaged over the ranks, then the update

Where the tensor's device offers a Collective (plugin API 2.1, the `tg_collective` hook; CPU devices whose memory is
host memory do), MPI reads and writes the tensors' own memory: no copy to or from a host array. Elsewhere (and for
dtypes MPI has no type for, and with TGCORE_MPI_HOST_COPY=1) each tensor is realized, copied out, reduced by MPI on
the numpy buffer and copied back to a new tensor on its device, in its dtype. Every collective first compares the
tensor's shape and dtype across the ranks (so a mismatch is an error that names each rank's shape, not a hang or
garbage), and waits at most `TGCORE_MPI_TIMEOUT` seconds (default 300): a rank that died or hangs makes the others fail
with a clear error and end the job, instead of waiting forever. After `init()`, an exception that no one catches on any
rank prints its traceback and aborts the whole job, so the other ranks stop at once.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

try:
    from mpi4py import MPI
except ImportError as e:  # the extra is missing
    raise ImportError(
        "tgcore.distributed needs mpi4py and an MPI library: pip install './[mpi]' (mpi4py and mpich from pip)"
    ) from e

from tgcore.device import Buffer, Device
from tgcore.dtype import DType, dtypes
from tgcore.lazy import LazyBuffer
from tgcore.nn.state import safe_load, safe_load_metadata, safe_save
from tgcore.ops import LoadOps
from tgcore.tensor import Tensor

__all__ = [
    "DistributedError",
    "init",
    "rank",
    "world_size",
    "local_rank",
    "all_reduce",
    "broadcast",
    "all_gather",
    "barrier",
    "in_place_count",
    "DistributedSampler",
    "broadcast_parameters",
    "DistributedOptimizer",
    "save_checkpoint",
    "load_checkpoint",
]

TIMEOUT_ENV = "TGCORE_MPI_TIMEOUT"
HOST_COPY_ENV = "TGCORE_MPI_HOST_COPY"  # 1: copy through host arrays even where the device offers its memory in place
_REDUCE_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_SIGNATURE_LEN = 34  # ndim, up to 32 dims, a dtype code: a fixed-size int64 record per rank
_DTYPE_CODES = {dt.name: i for i, dt in enumerate(dtypes.fields().values())}
# the dtypes MPI reduces on a device's own memory (those with a numpy type MPI knows, bool excepted)
_IN_PLACE_DTYPES = frozenset(
    (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
     dtypes.float32, dtypes.float64)
)


class DistributedError(RuntimeError):
    """A collective that cannot complete: ranks disagree, or one of them stopped answering."""


class _State:
    comm: Optional[Any] = None
    local_rank = 0
    previous_excepthook: Any = None
    in_place = 0  # collectives (and gradient buckets) MPI ran on the devices' own memory: tests and the bench read it


def init(comm: Optional[Any] = None) -> None:
    """Join the job: rank, world size and local rank (the rank among this machine's processes) from MPI. Idempotent."""
    if _State.comm is not None:
        return
    _State.comm = comm if comm is not None else MPI.COMM_WORLD
    _State.local_rank = _State.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    if _State.comm.Get_size() > 1:  # one rank's uncaught exception ends the job, instead of leaving the others waiting
        _State.previous_excepthook = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def _abort_on_uncaught(kind: type, value: BaseException, tb: Any) -> None:
    _State.previous_excepthook(kind, value, tb)
    sys.stderr.write(f"tgcore.distributed: rank {rank()} raised {kind.__name__}; aborting the job\n")
    _abort()


def _abort() -> None:
    """End the whole job, after giving the launcher a moment to forward what this rank wrote (an abort kills the
    processes at once, and mpiexec may lose output still in its pipes)."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)
    _comm().Abort(1)


def _comm() -> Any:
    if _State.comm is None:
        raise RuntimeError("tgcore.distributed is not initialized: call tgcore.distributed.init() first")
    return _State.comm


def rank() -> int:
    return _comm().Get_rank()


def world_size() -> int:
    return _comm().Get_size()


def local_rank() -> int:
    _comm()
    return _State.local_rank


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "300")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


def _wait(request: Any, what: str) -> None:
    """Wait for a non-blocking collective; past the timeout, say so and end the job (the others wait on us)."""
    limit = _timeout()
    deadline, pause = time.monotonic() + limit, 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            message = (
                f"tgcore.distributed: rank {rank()}: {what} did not complete within {limit:g} s ({TIMEOUT_ENV}): "
                "another rank has died, hangs, or did not call it; aborting the job"
            )
            sys.stderr.write(message + "\n")
            _abort()
            raise DistributedError(message)  # (where Abort returns, as with a single process)
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


def _host_dtype(dt: DType) -> DType:
    """The dtype a tensor travels in: its own, or float32 for the ones numpy has no type for (bfloat16)."""
    return dt if dt.np is not None else dtypes.float32


def _signature(shape: tuple[int, ...], dt: DType) -> np.ndarray:
    if len(shape) > _SIGNATURE_LEN - 2:
        raise ValueError(f"tgcore.distributed supports tensors of at most {_SIGNATURE_LEN - 2} dimensions")
    sig = np.full(_SIGNATURE_LEN, -1, np.int64)
    sig[0], sig[1 : 1 + len(shape)], sig[-1] = len(shape), shape, _DTYPE_CODES.get(dt.name, -2)
    return sig


def _describe(sig: np.ndarray) -> str:
    names = {code: name for name, code in _DTYPE_CODES.items()}
    return f"{tuple(int(d) for d in sig[1 : 1 + sig[0]])} {names.get(int(sig[-1]), '?')}"


def _check_same(what: str, shape: tuple[int, ...], dt: DType) -> None:
    """Every rank passes the same shape and dtype, or a DistributedError that names each rank's."""
    comm = _comm()
    if comm.Get_size() == 1:
        return
    mine = _signature(shape, dt)
    everyone = np.empty((comm.Get_size(), _SIGNATURE_LEN), np.int64)
    _wait(comm.Iallgather(mine, everyone), f"{what} (comparing shapes)")
    if not (everyone == mine).all():
        listing = ", ".join(f"rank {r}: {_describe(s)}" for r, s in enumerate(everyone))
        raise DistributedError(f"{what}: the ranks passed tensors of different shapes or dtypes ({listing})")


def _to_host(t: Tensor) -> np.ndarray:
    if not all(isinstance(d, int) for d in t.shape):
        raise TypeError(f"tgcore.distributed needs tensors of concrete shapes, got {t.shape}")
    host = t.cast(_host_dtype(t.dtype)) if t.dtype.np is None else t
    return np.ascontiguousarray(host.numpy())


def _device_memory(buf: Buffer) -> Any:
    """What MPI reads and writes in place as realized buffer `buf`'s memory, from its device's Collective, as an mpi4py
    buffer spec ([memory, MPI datatype]); None when the memory must travel through a host array instead."""
    if _host_copy_forced() or buf.dtype not in _IN_PLACE_DTYPES:
        return None
    device = Device[buf.device]
    if (collective := device.collective) is None:
        return None
    if (memory := collective.mpi_buffer(device.allocator, buf._opaque, buf.nbytes)) is None:
        return None
    device.synchronize()  # (the kernels that wrote it are done before MPI reads it)
    return [memory, MPI._typedict[np.dtype(buf.dtype.np).char]]


def _host_copy_forced() -> bool:
    return os.environ.get(HOST_COPY_ENV, "").strip() not in ("", "0")


def in_place_count() -> int:
    """How many collectives of this process ran on the devices' own memory (no copy through a host array)."""
    return _State.in_place


def _realized(t: Tensor) -> Buffer:
    """The buffer of `t` realized with its own contiguous layout (t's own buffer when it is one already)."""
    buf = t.contiguous().realize().lazydata.base.realized
    assert buf is not None
    return buf


def _fresh(shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, Buffer]:
    """A new realized tensor of `shape` in like's dtype and device, with memory of its own (for MPI to write into)."""
    out = Tensor.empty(*shape, dtype=like.dtype, device=like.device).realize()
    buf = out.lazydata.base.realized
    assert buf is not None
    return out, buf


def _in_place(t: Tensor) -> bool:
    """Whether t's collective runs on its device's memory itself (see _device_memory); a sharded tensor does not."""
    return (
        isinstance(t.device, str)
        and t.dtype in _IN_PLACE_DTYPES
        and not _host_copy_forced()
        and Device[t.device].collective is not None
        and all(isinstance(d, int) for d in t.shape)
        and t.numel() > 0
    )


def _from_host(arr: np.ndarray, like: Tensor) -> Tensor:
    out = Tensor(arr, device=like.device, dtype=_host_dtype(like.dtype))
    return out if out.dtype == like.dtype else out.cast(like.dtype)


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
    """The elementwise sum, mean, max or min of `t` over every rank, on every rank (a new tensor, t's device/dtype)."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    if op == "mean" and not dtypes.is_float(t.dtype):
        raise TypeError(f"all_reduce mean needs a float tensor, got {t.dtype.name}: reduce with 'sum' and divide")
    _check_same(f"all_reduce({op})", tuple(t.shape), t.dtype)
    if _in_place(t):
        out, buf = _fresh(tuple(t.shape), t)
        src, dest = _device_memory(_realized(t)), _device_memory(buf)
        if src is not None and dest is not None:
            _wait(_comm().Iallreduce(src, dest, _REDUCE_OPS[op]), f"all_reduce({op})")
            _State.in_place += 1
            return out / world_size() if op == "mean" else out
    arr = _to_host(t)
    out = np.empty_like(arr)
    _wait(_comm().Iallreduce(arr, out, _REDUCE_OPS[op]), f"all_reduce({op})")
    if op == "mean":
        out = (out / world_size()).astype(arr.dtype)
    return _from_host(out, t)


def broadcast(t: Tensor, root: int = 0) -> Tensor:
    """Rank `root`'s values of `t` on every rank (every rank passes a tensor of the same shape and dtype)."""
    if not 0 <= root < world_size():
        raise ValueError(f"broadcast root {root} is not a rank of this job (0..{world_size() - 1})")
    _check_same("broadcast", tuple(t.shape), t.dtype)
    if _in_place(t):
        out, buf = _fresh(tuple(t.shape), t)
        if rank() == root:
            out.assign(t).realize()
        if (memory := _device_memory(buf)) is not None:
            _wait(_comm().Ibcast(memory, root=root), "broadcast")
            _State.in_place += 1
            return out
    arr = _to_host(t)
    _wait(_comm().Ibcast(arr, root=root), "broadcast")
    return _from_host(arr, t)


def all_gather(t: Tensor) -> Tensor:
    """Every rank's `t`, stacked along a new first axis in rank order: shape (world_size, *t.shape)."""
    _check_same("all_gather", tuple(t.shape), t.dtype)
    if _in_place(t):
        out, buf = _fresh((world_size(), *t.shape), t)
        src, dest = _device_memory(_realized(t)), _device_memory(buf)
        if src is not None and dest is not None:
            _wait(_comm().Iallgather(src, dest), "all_gather")
            _State.in_place += 1
            return out
    arr = _to_host(t)
    out = np.empty((world_size(), *arr.shape), arr.dtype)
    _wait(_comm().Iallgather(arr, out), "all_gather")
    return _from_host(out, t)


def barrier() -> None:
    """Wait until every rank has reached this point."""
    _wait(_comm().Ibarrier(), "barrier")


class DistributedSampler:
    """This rank's share of the indices 0..n-1: every rank the same count, a new shuffle each epoch (`set_epoch`),
    the same on every rank for one seed. Without drop_last the shares are padded by wrapping around the start."""

    def __init__(
        self,
        n: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"DistributedSampler needs at least one item, got {n}")
        self.world = _State.comm.Get_size() if world_size is None and _State.comm is not None else (world_size or 1)
        self.rank = (_State.comm.Get_rank() if _State.comm is not None else 0) if rank is None else rank
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world - 1}")
        if drop_last and n < self.world:
            raise ValueError(f"drop_last with {n} items over {self.world} ranks leaves every rank nothing")
        self.n, self.shuffle, self.seed, self.drop_last, self.epoch = n, shuffle, seed, drop_last, 0
        self.per_rank = n // self.world if drop_last else -(-n // self.world)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        if self.shuffle:  # the same order on every rank: seeded by (seed, epoch) alone
            order = np.random.default_rng((self.seed, self.epoch)).permutation(self.n)
        else:
            order = np.arange(self.n)
        total = self.per_rank * self.world
        order = order[:total] if self.drop_last else np.resize(order, total)  # (resize repeats from the start)
        return order[self.rank : total : self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.per_rank


def broadcast_parameters(params: Union[Sequence[Tensor], dict[str, Tensor]], root: int = 0) -> None:
    """Give every rank rank `root`'s values of `params` (a list of tensors or a state dict), in place."""
    tensors = list(params.values()) if isinstance(params, dict) else list(params)
    for t in tensors:
        t.assign(broadcast(t.detach(), root)).realize()


def _bucket_mean(flat: Tensor) -> Tensor:
    """The mean over the ranks of a 1-d tensor, as a node of the lazy graph (LoadOps.CUSTOM): it runs when the graph
    is realized, between the kernels that compute the gradients and those that read the mean, and a TinyJit replay runs
    it again in that place (the jit records it like a kernel), so a jitted training step reduces every step."""
    world, travel = world_size(), _host_dtype(flat.dtype)
    src = (flat.cast(travel) if travel != flat.dtype else flat).contiguous()
    n = int(flat.shape[0])

    def all_reduce_sum(out: Buffer, inp: Buffer) -> None:
        what = "DistributedOptimizer gradient reduction"
        if (dest := _device_memory(out)) is not None and (source := _device_memory(inp)) is not None:
            _wait(_comm().Iallreduce(source, dest, MPI.SUM), what)  # (the device's own memory: no copy)
            _State.in_place += 1
            return
        host = np.empty(n, travel.np)
        inp.copyout(memoryview(host).cast("B"))
        _wait(_comm().Iallreduce(MPI.IN_PLACE, host, MPI.SUM), what)
        out.copyin(memoryview(host).cast("B"))

    node = LazyBuffer.loadop(LoadOps.CUSTOM, (n,), travel, src.device, all_reduce_sum, (src.lazydata,))
    mean = Tensor(node, device=src.device, requires_grad=False) / world
    return mean if travel == flat.dtype else mean.cast(flat.dtype)


class DistributedOptimizer:
    """Wraps an optimizer: `step()` averages its parameters' gradients over the ranks, then steps.

    The gradients travel in buckets (all the gradients of one dtype concatenated, up to `bucket_bytes` a bucket), so a
    step makes a few large reductions instead of one per tensor. Each reduction is a node of the lazy graph between
    backward and update, so a TinyJit-captured training step that calls `step()` reduces on every replay."""

    def __init__(self, optimizer: Any, bucket_bytes: int = 25 * 2**20) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.optimizer, self.bucket_bytes = optimizer, bucket_bytes
        self._checked_layout: Optional[tuple[Any, ...]] = None
        self.reductions = 0  # how many reductions the last step made (the bench and tests read it)

    @property
    def params(self) -> list[Tensor]:
        return self.optimizer.params

    @property
    def lr(self) -> Tensor:
        return self.optimizer.lr

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def _buckets(self) -> list[list[Tensor]]:
        by_dtype: dict[DType, list[Tensor]] = {}
        for p in self.params:
            by_dtype.setdefault(p.grad.dtype, []).append(p)  # type: ignore[union-attr]
        buckets: list[list[Tensor]] = []
        for group in by_dtype.values():
            current: list[Tensor] = []
            size = 0
            for p in group:
                nbytes = p.grad.nbytes()  # type: ignore[union-attr]
                if current and size + nbytes > self.bucket_bytes:
                    buckets.append(current)
                    current, size = [], 0
                current.append(p)
                size += nbytes
            buckets.append(current)
        return buckets

    def reduce_gradients(self) -> None:
        """Replace every parameter's gradient by its mean over the ranks (lazily: see _bucket_mean)."""
        missing = [tuple(p.shape) for p in self.params if p.grad is None]
        if missing:
            raise RuntimeError(f"parameters of shapes {missing} have no gradient: call backward() before step()")
        layout = tuple((tuple(p.shape), p.grad.dtype.name) for p in self.params)  # type: ignore[union-attr]
        if layout != self._checked_layout:  # once per layout: every rank reduces the same gradients in one order
            _check_same("DistributedOptimizer (parameter count)", (len(layout),), dtypes.int32)
            for i, p in enumerate(self.params):
                _check_same(f"DistributedOptimizer (parameter {i})", tuple(p.shape), p.grad.dtype)  # type: ignore
            self._checked_layout = layout
        self.reductions = 0
        if world_size() == 1:  # the mean over one rank is the gradient itself
            return
        for bucket in self._buckets():
            grads = [p.grad.flatten() for p in bucket]  # type: ignore[union-attr]
            mean = _bucket_mean(Tensor.cat(*grads) if len(grads) > 1 else grads[0])
            self.reductions += 1
            at = 0
            for p in bucket:
                n = p.grad.numel()  # type: ignore[union-attr]
                p.grad = mean[at : at + n].reshape(p.shape)
                at += n

    def schedule_step(self) -> list[Tensor]:
        self.reduce_gradients()
        return self.optimizer.schedule_step()

    def step(self) -> None:
        Tensor.realize(*self.schedule_step())


def save_checkpoint(path: str, state_dict: dict[str, Tensor], step: int) -> None:
    """Rank 0 writes `state_dict` and the step number to `path` (safetensors, written beside it and renamed into
    place, so a crash never leaves half a checkpoint); every rank waits for it."""
    if _State.comm is None or rank() == 0:
        safe_save(state_dict, path, metadata={"tgcore.step": str(int(step))})
    if _State.comm is not None:
        barrier()


def load_checkpoint(path: str) -> Optional[tuple[dict[str, Tensor], int]]:
    """(the state dict, the step) saved at `path`, or None when there is no checkpoint there yet (a fresh start)."""
    if not os.path.exists(path):
        return None
    _, _, header = safe_load_metadata(path)
    text = (header.get("__metadata__") or {}).get("tgcore.step")
    if text is None or not str(text).isdigit():
        raise ValueError(f"{path!r} is not a checkpoint of tgcore.distributed: its metadata holds no step number")
    return safe_load(path), int(text)
