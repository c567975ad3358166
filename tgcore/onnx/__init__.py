"""ONNX models on any tgcore device (`pip install tgcore[onnx]`; nothing here is imported by `import tgcore`).

model = OnnxModel("model.onnx", device=name)   # any tgcore device; None: the default device
outputs = model(input=np.zeros((1, 3, 224, 224), np.float32))   # {output name: Tensor}
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Optional, Union

import numpy as np

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError as e:  # pragma: no cover (the extra is missing)
    raise ImportError("tgcore.onnx needs the onnx package: pip install 'tgcore[onnx]'") from e

from tgcore.device import Device
from tgcore.engine.jit import JitError, TinyJit
from tgcore.helpers import DEBUG, JIT
from tgcore.onnx import dynamic, external, lowbit
from tgcore.onnx import ops as _ops  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_ml as _ops_ml  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_preview as _ops_preview  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_random as _ops_random  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_recent as _ops_recent  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_spatial as _ops_spatial  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_text as _ops_text  # noqa: F401 (registers the operators)
from tgcore.onnx import ops_training as _ops_training  # noqa: F401 (registers the operators)
from tgcore.onnx.errors import NotSymbolic, OnnxError, UnsupportedOp
from tgcore.onnx.registry import (
    DOMAINS,
    REGISTRY,
    Known,
    Node,
    lookup,
    onnx_to_dtype,
    to_numpy,
    to_tensor,
)
from tgcore.shape.symbolic import Variable
from tgcore.tensor import Tensor

__all__ = ["OnnxModel", "OnnxError", "UnsupportedOp", "REGISTRY", "run_node"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Attributes as Python values; graphs stay GraphProtos, tensors stay TensorProtos (read where used)."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        out[a.name] = v
    return out


def _domain_opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The versions the model imports of the other domains tgcore runs (registry.DOMAINS), by domain."""
    return {imp.domain: imp.version for imp in model.opset_import if imp.domain in DOMAINS and imp.domain}


def _opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            return imp.version
    others = _domain_opsets(model)
    if others and all(n.domain in others for n in model.graph.node):
        return 1  # (a model of another domain's operators only, such as a training step: no default-domain node)
    imported = ", ".join(f"{imp.domain!r} version {imp.version}" for imp in model.opset_import) or "none"
    foreign = sorted({f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in _DEFAULT_DOMAINS})
    uses = f"; its nodes use {', '.join(foreign[:8])}{' ...' if len(foreign) > 8 else ''}" if foreign else ""
    raise OnnxError(
        f"the model imports no opset of the default ONNX domain (it imports {imported}){uses}: tgcore runs the "
        f"operators of ONNX's default domain and of {', '.join(repr(d) for d in DOMAINS if d)} only"
    )


def _is_dtype_refusal(e: TypeError) -> bool:
    """Whether `e` is the lazy graph's refusal of a dtype the device does not claim (tgcore.lazy._check_dtype)."""
    return str(e).startswith("device ") and " does not support " in str(e)


class _Graph:
    """Runs one GraphProto node by node; subgraphs (If) run through the same loop with the outer values visible."""

    def __init__(self, opset: int, device: str, known: Known, domains: Optional[dict[str, int]] = None) -> None:
        self.opset, self.device, self.known = opset, device, known
        self.domains = domains or {}  # the other domains' imported versions (registry.DOMAINS)

    def run(self, graph: onnx.GraphProto, values: dict[str, Tensor]) -> list[Tensor]:
        env = dict(values)
        for init in graph.initializer:  # (a subgraph's own initializers)
            if init.name not in env:
                arr = numpy_helper.to_array(init)
                env[init.name] = self.known.put(to_tensor(arr, self.device), arr)
        for i, node in enumerate(graph.node):
            outs = self._node(node, env, lambda values, i=i: self._rerun(graph.node, i, env, values))
            for name, t in zip(node.output, outs):
                if name:  # (None: an output not produced, or an empty optional)
                    env[name] = t
        return [env[o.name] for o in graph.output]

    def _node(self, node: onnx.NodeProto, env: dict[str, Tensor], rerun: Any = None) -> list[Optional[Tensor]]:
        """One node's outputs, its inputs read from `env` (`rerun`: Node.rerun)."""
        opset = self.opset
        if node.domain in _DEFAULT_DOMAINS:
            fn = lookup(node.op_type, opset)
        elif node.domain in self.domains:
            opset = self.domains[node.domain]
            fn = lookup(node.op_type, opset, node.domain)
        else:
            supported = ", ".join(repr(d) for d in DOMAINS if d)
            why = f"domain {node.domain!r} is not supported, only ONNX's default and {supported}"
            if node.domain in DOMAINS:
                why = f"the model does not import domain {node.domain!r}, which its node uses"
            raise UnsupportedOp(node.op_type, None, why)
        try:
            inputs = [env[i] if i else None for i in node.input]
        except KeyError as e:
            raise OnnxError(f"node {node.name or node.op_type} reads {e.args[0]!r}, which nothing produced") from e
        n = Node(node.op_type, opset, inputs, _attrs(node), self.device, len(node.output), self.known)
        n.run_graph = lambda g, extra, env=env: self.run(g, {**env, **extra})
        n.rerun = rerun
        if self.known.symbolic:  # (walking with symbolic sizes: only where the node is known to take them)
            if any(isinstance(v, onnx.GraphProto) for v in n.attrs.values()):
                raise NotSymbolic(f"{node.op_type} runs a subgraph")
            dynamic.check(n)
        try:
            out = fn(n)
        except TypeError as e:
            if not _is_dtype_refusal(e):
                raise
            name = f" {node.name!r}" if node.name else ""
            raise UnsupportedOp(node.op_type, opset, f"node{name} needs a dtype its device lacks: {e}") from e
        outs = [out] if isinstance(out, Tensor) else list(out)
        return lowbit.keep_types(node.op_type, inputs, outs)  # (ops that move values keep a low-bit type)

    def _rerun(
        self, nodes: Any, end: int, env: dict[str, Tensor], values: dict[str, Tensor]
    ) -> tuple[dict[str, Tensor], set[str]]:
        """Node.rerun for the node at `end` of `nodes`: those before it that read `values` (or what they compute) run
        again, in graph order, on `env` with `values` in place."""
        sub, changed = {**env, **values}, set(values)
        for node in itertools.islice(nodes, end):  # (in graph order: a node's sources come before it)
            if any(i in changed for i in node.input):
                for name, t in zip(node.output, self._node(node, sub)):
                    if name:
                        sub[name] = t
                        changed.add(name)
        return sub, changed


class OnnxModel:
    """An ONNX model loaded for a tgcore device: call it with inputs by name, get outputs by name.

    The model is checked with onnx's checker; initializers become tensors on `device` once. Initializers in external
    files (a model given by its path) are checked and read lazily, at the first run that needs them.

    An input dimension declared without a value (a dim_param such as "batch") is a symbolic Variable: one recording of
    the graph's kernels serves every size of it from 1 to `dynamic_max` (sizes share a recording within tiers: 1-16,
    17-32, 33-64, ...; see tgcore/onnx/dynamic.py); a size called more than dynamic.HOT_CALLS times gets a recording of
    its own, with kernels optimized for its shapes. A graph that cannot run with symbolic sizes (`symbolic_fallback`
    says why), a size past `dynamic_max`, or `dynamic_max=0` gets a recording per input shape instead."""

    def __init__(
        self,
        model: Union[str, os.PathLike, bytes, onnx.ModelProto],
        device: Optional[str] = None,
        check: bool = True,
        jit: bool = True,
        dynamic_max: int = dynamic.DEFAULT_LIMIT,
    ) -> None:
        # external data (initializers in files beside the model) is read lazily, from the model's folder only
        path: Optional[str] = None
        folder: Optional[str] = None
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            model = onnx.load(path, load_external_data=False)
            folder = os.path.dirname(os.path.abspath(path))
        elif isinstance(model, bytes):
            model = onnx.load_from_string(model)
        elif not isinstance(model, onnx.ModelProto):
            raise TypeError(f"OnnxModel takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")
        if check:  # (by path where there is one: the checker finds external data files from the model's folder)
            onnx.checker.check_model(model if path is None else path)
        self.proto, self.opset, self.domains = model, _opset_of(model), _domain_opsets(model)
        self.device = Device.canonicalize(device)
        self.known = Known()
        graph = model.graph
        self.initializers: dict[str, Tensor] = {}
        for init in graph.initializer:
            if external.is_external(init):
                if folder is None:
                    raise OnnxError(
                        f"initializer {init.name!r} is stored in an external file: pass the model's path to OnnxModel "
                        "(its folder is where the file is looked for), or load the proto with its external data"
                    )
                self.initializers[init.name] = external.load(init, folder, self.device)
                continue
            arr = numpy_helper.to_array(init)
            try:
                tensor = to_tensor(arr, self.device).realize()
            except TypeError as e:
                if not _is_dtype_refusal(e):
                    raise
                raise UnsupportedOp("(initializer)", self.opset, f"initializer {init.name!r}: {e}") from e
            self.initializers[init.name] = self.known.put(tensor, arr)
        self.input_names = [i.name for i in graph.input if i.name not in self.initializers]
        self.output_names = [o.name for o in graph.output]
        self._input_types = {i.name: i.type for i in graph.input}
        # by input signature (names, shapes, dtypes): the recorded kernels of the graph, or None where it cannot be
        # replayed (it reads computed values to the host, or returns sequences or empty optionals)
        self.jit = jit
        self._replays: dict[tuple[Any, ...], Optional[_Replay]] = {}
        # per input, per axis: the Variable of a dynamic dimension (None: a static one); symbolic recordings are kept
        # in _replays too, keyed by the dimensions' names and tiers
        self.dynamic_max = dynamic_max
        self._dims = dynamic.input_dims(graph, self.input_names) if dynamic_max > 0 else {}
        self._not_symbolic: set[tuple[Any, ...]] = set()  # signatures (names, not sizes) that run concretely
        self.symbolic_fallback: Optional[str] = None  # why the last call that could not run symbolically did not
        self._calls: dict[tuple[Any, ...], int] = {}  # calls by input signature (concrete sizes), for _hot

    def _as_tensor(self, name: str, value: Any) -> Any:
        """A tensor; a list (an ONNX sequence) of them; None (an empty optional)."""
        if value is None:
            return None
        if isinstance(value, list):
            return [self._as_tensor(name, v) for v in value]
        tt = self._input_types.get(name)
        while tt is not None and tt.HasField("optional_type"):
            tt = tt.optional_type.elem_type
        elem = tt.tensor_type.elem_type if tt is not None and tt.HasField("tensor_type") else 0
        if elem in lowbit.LOWBIT:  # (float8, int4, ...: an ml_dtypes array, carried as a tgcore dtype)
            return lowbit.check_input(name, value, lowbit.LOWBIT[elem], self.device)
        if isinstance(value, Tensor):
            return value if value.device == self.device else value.to(self.device)
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind in "SU":
            raise UnsupportedOp("(input)", self.opset, f"input {name!r} holds strings, which tgcore has no dtype for")
        if elem:
            onnx_to_dtype(elem, "(input)", self.opset)  # says which type is unsupported
        return to_tensor(arr, self.device)

    def __call__(self, inputs: Optional[dict[str, Any]] = None, **kwargs: Any) -> dict[str, Tensor]:
        feed = {**(inputs or {}), **kwargs}
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise OnnxError(f"missing inputs {missing}; the model takes {self.input_names}")
        unknown = [n for n in feed if n not in self.input_names and n not in self.initializers]
        if unknown:
            raise OnnxError(f"unknown inputs {unknown}; the model takes {self.input_names}")
        given = {n: self._as_tensor(n, v) for n, v in feed.items()}
        if self.jit and JIT.value and all(isinstance(t, Tensor) and n in self.input_names for n, t in given.items()):
            signature = tuple((n, t.shape, t.dtype, t.device) for n, t in sorted(given.items()))
            if not self._dims or self._hot(signature):
                return self._replayed(signature, given)
            outs, unsure = self._symbolic_call(given)
            if outs is not None:
                return outs
            outs = self._replayed(signature, given)  # (raises where the input is at fault: the symbolic walk was not)
            if unsure is not None:
                self._not_symbolic.add(unsure)
            return outs
        return {name: _realized(t) for name, t in zip(self.output_names, self._run(given)[0])}

    def _hot(self, signature: tuple[Any, ...]) -> bool:
        """Whether this input signature has a recording of its own shapes, or is called often enough to get one
        (dynamic.HOT_CALLS): a kernel made for one size still runs somewhat faster than the symbolic one (its sizes
        are constants, its replay binds no Variables), which pays back the recording for a size called again and
        again."""
        if (replay := self._replays.get(signature)) is not None and replay.jit.cnt >= 2:
            return True
        if len(self._calls) >= 4096 and signature not in self._calls:  # (many sizes seen: forget the counts)
            self._calls.clear()
        self._calls[signature] = calls = self._calls.get(signature, 0) + 1
        return calls > dynamic.HOT_CALLS

    def _replayed(self, signature: tuple[Any, ...], given: dict[str, Tensor]) -> dict[str, Any]:
        """The outputs from the recording for this input signature (concrete shapes), or of a plain run."""
        if signature not in self._replays:
            self._new_replay(signature, symbolic=False)
        if (replay := self._replays[signature]) is not None:
            outs = replay(given)
            if not replay.static:  # (found on its first run, a plain one: its outputs are right)
                self._replays[signature] = None
            return outs
        return {name: _realized(t) for name, t in zip(self.output_names, self._run(given)[0])}

    def _symbolic_call(self, given: dict[str, Tensor]) -> tuple[Optional[dict[str, Tensor]], Optional[tuple[Any, ...]]]:
        """(the outputs from the recording whose Variables stand for the dynamic dimensions, None) or, where this call
        runs with concrete shapes, (None, the signature to run concretely from now on if that run succeeds: an error
        of the symbolic walk other than NotSymbolic may be the input's). A graph found not to run symbolically is not
        walked symbolically again, at any size."""
        if (bound := dynamic.bind(given, self._dims, self.dynamic_max)) is None:
            return None, None
        key, symbolic, var_vals = bound
        if key[1] in self._not_symbolic:
            return None, None
        if (replay := self._replays.get(key)) is None:
            replay = self._new_replay(key, symbolic=True)
        try:
            return replay.run_symbolic(symbolic, var_vals), None
        except Exception as e:  # noqa: BLE001 (any error of a symbolic run: the concrete run decides)
            self.symbolic_fallback = f"{type(e).__name__}: {e}"
            if DEBUG.value >= 1:
                print(f"onnx: this call runs with concrete shapes: {self.symbolic_fallback}")
            if replay.jit.cnt >= 2 and not isinstance(e, NotSymbolic):  # (a replay that failed: the input's fault)
                return None, None
            self._replays.pop(key, None)
            if isinstance(e, NotSymbolic):
                self._not_symbolic.add(key[1])
                return None, None
            return None, key[1]

    def _new_replay(self, key: tuple[Any, ...], symbolic: bool) -> _Replay:
        """A recording kept under `key`; past _MAX_REPLAYS of them, the oldest one's kernels go."""
        if len(self._replays) >= _MAX_REPLAYS:
            self._replays.pop(next(iter(self._replays)))
        replay = self._replays[key] = _Replay(self, symbolic=symbolic)
        return replay

    def _run(self, given: dict[str, Any], symbolic: bool = False) -> tuple[list[Any], Known]:
        """The graph's outputs (lazy) for the given inputs, and what it knew of their values on the host."""
        known = Known(self.known)
        known.symbolic = symbolic
        graph = _Graph(self.opset, self.device, known, self.domains)
        return graph.run(self.proto.graph, {**self.initializers, **given}), known


# the input signatures whose kernels an OnnxModel keeps recorded at once
_MAX_REPLAYS = 16


class _Replay:
    """The kernels of an OnnxModel's graph for one input signature, recorded by a TinyJit: the first call walks the
    graph, the second records its kernels, later ones launch them without walking it. A graph that reads a computed
    value to the host (its kernels could change with the input values) is found on the first call (`static` goes
    False) and is not recorded. Outputs are copied out of the recording's buffers, which the next call overwrites.

    A symbolic replay takes inputs of symbolic shapes: its walk raises NotSymbolic where the graph needs concrete ones,
    and its outputs are copied out at the shape the Variables' values give them."""

    def __init__(self, model: OnnxModel, symbolic: bool = False) -> None:
        self.model, self.static, self.symbolic = model, True, symbolic
        self.jit = TinyJit(self._graph)

    def _graph(self, **given: Tensor) -> list[Tensor]:
        outs, known = self.model._run(given, self.symbolic)
        inputs = {id(t.lazydata.base) for t in given.values()}
        if self.symbolic:
            if not all(type(t) is Tensor for t in outs):
                raise NotSymbolic("an output is a sequence, an empty optional or of a low-bit type")
            if any(id(t.lazydata.base) in inputs for t in outs):
                raise NotSymbolic("an output is an input")
            return [t.contiguous() for t in outs]  # (each its own buffer: copied out by its first elements)
        if (
            known.computed_reads
            or not all(isinstance(t, Tensor) for t in outs)
            or any(id(t.lazydata.base) in inputs for t in outs)  # (a replay would return the recorded input)
        ):
            self.static = False
        return outs

    def run_symbolic(self, given: dict[str, Tensor], var_vals: dict[Variable, int]) -> dict[str, Tensor]:
        """The outputs for inputs of symbolic shapes whose Variables take `var_vals`."""
        try:
            outs = self.jit(**given)
        except JitError as e:
            raise NotSymbolic(str(e)) from e
        return {name: dynamic.concrete(t, var_vals) for name, t in zip(self.model.output_names, outs)}

    def __call__(self, given: dict[str, Tensor]) -> dict[str, Any]:
        try:
            outs = self.jit(**given)
        except JitError:  # (a graph that runs no kernel: outputs that are initializers)
            self.static = False
            return {name: _realized(t) for name, t in zip(self.model.output_names, self.model._run(given)[0])}
        names = self.model.output_names
        if self.jit.cnt < 2 or not self.static:  # (a plain run, this thread's first: its outputs are its own)
            return {name: _realized(t) for name, t in zip(names, outs)}
        return {name: t.clone().realize() for name, t in zip(names, outs)}


def _realized(value: Any) -> Any:
    if isinstance(value, list):
        return [_realized(v) for v in value]
    return None if value is None else value.realize()


def run_node(
    node: onnx.NodeProto, inputs: list[Any], opset: Optional[int] = None, device: Optional[str] = None
) -> list[np.ndarray]:
    """One node on numpy inputs (by position), at `opset` (the installed onnx's newest by default)."""
    opset = opset or onnx.defs.onnx_opset_version()
    dev = Device.canonicalize(device)
    env = {name: to_tensor(np.asarray(v), dev) for name, v in zip(node.input, inputs) if name}
    graph = helper.make_graph([node], "node", [], [helper.make_value_info(o, onnx.TypeProto()) for o in node.output])
    # (the other domains at the newest version of theirs that tgcore implements an operator of)
    others = {d: max(v for versions in ops.values() for v in versions) for d, ops in DOMAINS.items() if d and ops}
    return [to_numpy(t) for t in _Graph(opset, dev, Known(), others).run(graph, env)]
