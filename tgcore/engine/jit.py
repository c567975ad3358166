"""TinyJit: record the kernels a function runs, then replay them without building or walking the lazy graph.

The first call runs the function normally. The second call runs it again while recording every kernel launch
(with its buffers). Later calls swap the new inputs' buffers into the recording and launch the recorded kernels
directly. Inputs must keep their shapes, dtypes and devices; symbolic Variables passed as arguments may change.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from tgcore.device import Buffer
from tgcore.engine import realize
from tgcore.engine.realize import ExecItem, raise_if_counted
from tgcore.engine.runner import CompiledRunner
from tgcore.helpers import DEBUG, JIT, GlobalCounters
from tgcore.shape.symbolic import Variable

ReturnType = TypeVar("ReturnType")


class JitError(RuntimeError):
    """A jitted function was called in a way its recording cannot serve."""


@dataclass(frozen=True)
class _InputSignature:
    shape: tuple[Any, ...]
    dtype: Any
    device: str


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "lazydata") and hasattr(v, "realize")


def _tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensor arguments: positional ones in order, then keyword ones by name (so any keyword order replays)."""
    return [v for v in (*args, *(kwargs[k] for k in sorted(kwargs))) if _is_tensor(v)]


def _tensors_out(ret: Any) -> list[Any]:
    """The tensors a function returned, alone or in (nested) tuples, lists and dict values."""
    out, stack = [], [ret]
    while stack:
        v = stack.pop()
        if _is_tensor(v):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    return out


def _layout(t: Any) -> Any:
    """How a tensor argument reads its memory: its tracker with the Variables unbound (a base's is contiguous)."""
    lb = t.lazydata
    lbs = getattr(lb, "lbs", None)
    return tuple(x.st.unbind()[0] for x in lbs) if lbs is not None else lb.st.unbind()[0]


def _check_distinct(tensors: list[Any], name: str) -> None:
    """Raise JitError if two tensor arguments share memory: a replay could give each its own buffer only by chance."""
    seen: dict[int, int] = {}
    for i, t in enumerate(tensors):
        lb = t.lazydata
        for x in getattr(lb, "lbs", [lb]):
            j = seen.setdefault(id(x.base), i)
            if j != i:
                raise JitError(
                    f"{name} got the same tensor (or views of one memory) as tensor arguments {j} and {i}: a jitted "
                    "function needs distinct inputs (pass a .contiguous().realize() copy of one)"
                )


def _plain(v: Any) -> Any:
    """A tensor whose data is its own realized contiguous buffer (the jit swaps such buffers on replay)."""
    if not _is_tensor(v):
        return v
    v.realize()
    lb = v.lazydata
    # a contiguous view of a realized buffer (e.g. reshaped to a symbolic shape) is used as it is
    return v if lb.base.realized is not None and lb.st.contiguous else v.contiguous().realize()


def _variables_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Variable, int]:
    """The values of the symbolic Variables passed as arguments or bound in the shapes of tensor arguments."""
    out = {}
    for t in _tensors_in(args, kwargs):
        out.update(t.lazydata.st.var_vals)
    for v in (*args, *kwargs.values()):
        if isinstance(v, Variable):
            if v.val is None:
                raise JitError(
                    f"symbolic variable {v.expr} passed to a jitted function must be bound: use .bind(value)"
                )
            var, val = v.unbind()
            out[var] = val
    return out


class TinyJit(Generic[ReturnType]):
    """Decorator: `@TinyJit def step(x): ...`; captures on the second call, replays from the third.

    Each thread that calls it gets a recording of its own (its own output tensors and intermediate buffers; the
    compiled kernels are shared), so calls from several threads at once give each its own, right, results."""

    def __init__(self, fxn: Callable[..., ReturnType]) -> None:
        self.fxn = fxn
        self._threads = threading.local()
        functools.update_wrapper(self, fxn)

    def _recording(self) -> _Recording[ReturnType]:
        """This thread's recording."""
        rec = getattr(self._threads, "recording", None)
        if rec is None:
            rec = self._threads.recording = _Recording(self.fxn)
        return rec

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        return self._recording()(*args, **kwargs)

    def reset(self) -> None:
        """Forget the recordings (of every thread); the next call runs the function again."""
        self._threads = threading.local()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return functools.partial(self.__call__, obj) if obj is not None else self

    def __getattr__(self, name: str) -> Any:  # jit_cache, cnt, ...: this thread's recording's
        if name.startswith("__") or name in ("fxn", "_threads"):
            raise AttributeError(name)
        return getattr(self._recording(), name)


class _Recording(Generic[ReturnType]):
    """One thread's recording of a jitted function: the warm-up, the capture, then replays."""

    def __init__(self, fxn: Callable[..., ReturnType]) -> None:
        self.fxn = fxn
        self.reset()

    def reset(self) -> None:
        """Forget the recording; the next call runs the function again."""
        self.cnt = 0
        self.jit_cache: list[ExecItem] = []
        # (exec item, buffer position, input): the buffer of that input goes there
        self.input_places: list[tuple[int, int, int]] = []
        self.launches: list[tuple[Any, Any]] = []
        self.signature: list[_InputSignature] = []
        self.has_checks = False
        self.layouts: list[Any] = []
        self.plain_inputs = False  # whether every recorded input was its own contiguous buffer (the fast replay)
        self.ret: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        if self.cnt == 2 and JIT.value and self.plain_inputs and (fast := _realized_inputs(args, kwargs)) is not None:
            return self._replay_buffers(*fast)
        layouts = [_layout(t) for t in _tensors_in(args, kwargs)]
        args = tuple(_plain(a) for a in args)
        kwargs = {k: _plain(v) for k, v in kwargs.items()}
        tensors = _tensors_in(args, kwargs)
        var_vals = _variables_in(args, kwargs)
        if not JIT:
            return self.fxn(*args, **kwargs)
        _check_distinct(tensors, self._name)
        if self.cnt == 0:
            self.cnt = 1
            return self._run_and_realize(args, kwargs)
        if self.cnt == 1:
            ret = self._capture(args, kwargs, tensors)
            self.layouts = layouts
            self.plain_inputs = all(lay == _layout(t) for lay, t in zip(layouts, tensors))
            return ret
        if layouts != self.layouts:
            raise JitError(
                f"{self._name} was recorded for inputs that read their memory as "
                f"{[lay for lay in self.layouts]} but got {[lay for lay in layouts]}: pass tensors of the same layout "
                "(e.g. .contiguous() ones), or call .reset() to record again"
            )
        return self._replay(tensors, var_vals)

    @property
    def _name(self) -> str:
        return f"jitted function {getattr(self.fxn, '__name__', '?')}"

    def _run_and_realize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReturnType:
        ret = self.fxn(*args, **kwargs)
        outs = _tensors_out(ret)
        if outs:
            outs[0].realize(*outs[1:])
        return ret

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[Any]) -> ReturnType:
        recorded: list[ExecItem] = []
        stack = realize._capturing.__dict__.setdefault("stack", [])  # this thread's
        stack.append(lambda ei, vv: recorded.append(ei))
        try:
            self.ret = self._run_and_realize(args, kwargs)
        finally:
            stack.pop()
        if not recorded:
            raise JitError(f"{getattr(self.fxn, '__name__', 'the function')} ran no kernel: nothing to jit")
        buffers = {id(t.lazydata.base.realized): i for i, t in enumerate(tensors)}
        self.jit_cache = recorded
        self.has_checks = any(ei.check is not None for ei in recorded)
        self.input_places = []
        for j, ei in enumerate(recorded):
            for k, b in enumerate(ei.bufs):
                if id(b) in buffers:
                    self.input_places.append((j, k, buffers[id(b)]))
        self.signature = [_InputSignature(t.shape, t.dtype, t.device) for t in tensors]
        self.exact_signature = [(t.shape, t.dtype, t.device) for t in tensors]
        compiled = [ei.prg for ei in recorded if isinstance(ei.prg, CompiledRunner)]
        self.counts = (len(compiled), sum(p.op_estimate for p in compiled), sum(p.mem_estimate for p in compiled))
        # what a replay calls per item: a plain CPU launch goes straight to the device's program with the buffers'
        # memory (CompiledRunner.__call__ would do the same, one Python call later); anything else through run()
        self.launches = [
            (ei.prg.clprg, ei.bufs) if isinstance(ei.prg, CompiledRunner) and ei.prg.plain_launch else (None, ei)
            for ei in recorded
        ]
        self.cnt = 2
        return self.ret

    def _replay_buffers(self, lbs: list[Any], var_vals: dict[Variable, int]) -> ReturnType:
        """The replay of plain realized inputs: launch the recorded programs directly, without the lazy graph."""
        if len(lbs) > 1 and len({id(lb) for lb in lbs}) != len(lbs):
            _check_distinct([_TensorView(lb) for lb in lbs], self._name)
        # one list comparison (tuples compare items by identity first: no DType.__eq__ call for the same dtype)
        if [(lb.shape, lb.dtype, lb.device) for lb in lbs] != self.exact_signature:
            return self._replay([_TensorView(lb) for lb in lbs], var_vals)  # symbolic shapes, or a wrong call
        cache = self.jit_cache
        for j, k, i in self.input_places:
            cache[j].bufs[k] = lbs[i].realized
        if DEBUG.value >= 2:  # (ExecItem.run prints)
            for ei in cache:
                ei.run(var_vals)
            return self.ret
        if self.has_checks:  # each check's count read back right after its kernel, before anything reads the data
            for (prg, bufs), ei in zip(self.launches, cache):
                if prg is not None:
                    prg(*[b._opaque for b in bufs])
                else:
                    ei.prg(ei.bufs, var_vals)
                if ei.check is not None:
                    raise_if_counted(ei.bufs[0], ei.check)
        else:
            for prg, bufs in self.launches:
                if prg is not None:
                    prg(*[b._opaque for b in bufs])
                else:
                    bufs.prg(bufs.bufs, var_vals)
        n, ops, mem = self.counts
        GlobalCounters.kernel_count += n
        GlobalCounters.global_ops += ops
        GlobalCounters.global_mem += mem
        return self.ret

    def _replay(self, tensors: list[Any], var_vals: dict[Variable, int]) -> ReturnType:
        signature = [_InputSignature(t.shape, t.dtype, t.device) for t in tensors]
        if len(signature) != len(self.signature) or any(
            a.dtype != b.dtype or a.device != b.device or not _shape_compatible(a.shape, b.shape)
            for a, b in zip(signature, self.signature)
        ):
            raise JitError(
                f"jitted function was recorded for inputs {_describe(self.signature)} but got {_describe(signature)}: "
                "shapes, dtypes and devices must stay the same (use a symbolic Variable for a changing size, or "
                "call .reset() to record again)"
            )
        bufs: list[Buffer] = [t.lazydata.base.realized for t in tensors]
        for j, k, i in self.input_places:
            self.jit_cache[j].bufs[k] = bufs[i]
        for ei in self.jit_cache:
            ei.run(var_vals)
        return self.ret


def _realized_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[tuple[list[Any], dict[Variable, int]]]:
    """The LazyBuffers of the tensor arguments and the values of the Variables, when every tensor is already its
    own realized contiguous buffer (else None: the slow path realizes them)."""
    if len(args) == 1 and not kwargs:  # one tensor argument (the common call): no loop
        lb = getattr(args[0], "lazydata", None)
        if (
            lb is not None
            and getattr(lb, "_base", True) is None
            and lb.realized is not None
            and hasattr(args[0], "realize")
        ):
            return [lb], {}
    lbs: list[Any] = []
    var_vals: dict[Variable, int] = {}
    for v in (*args, *(kwargs[k] for k in sorted(kwargs))) if kwargs else args:
        if (lb := getattr(v, "lazydata", None)) is not None and hasattr(v, "realize"):  # a tensor
            if getattr(lb, "_base", True) is not None or lb.realized is None:
                return None
            lbs.append(lb)
        elif isinstance(v, Variable):
            if v.val is None:
                return None
            var, val = v.unbind()
            var_vals[var] = val
    return lbs, var_vals


@dataclass(frozen=True)
class _TensorView:
    """What _replay reads of a tensor, for a LazyBuffer."""

    lazydata: Any

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.lazydata.shape

    @property
    def dtype(self) -> Any:
        return self.lazydata.dtype

    @property
    def device(self) -> str:
        return self.lazydata.device


def _shape_compatible(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x == y or not isinstance(x, int) or not isinstance(y, int) for x, y in zip(a, b))


def _describe(sig: list[_InputSignature]) -> str:
    return ", ".join(f"{s.shape} {s.dtype} {s.device}" for s in sig) or "no tensors"
