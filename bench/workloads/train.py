"""f. One training step of an MLP 784-512-512-10 (ReLU) on a batch of 128, softmax cross-entropy, Adam (lr 1e-3):
milliseconds per step, plain and under TinyJit, and peak memory.

A step is zero_grad, forward, loss, backward and the Adam update, with the loss and every updated parameter
realized (tgcore, tinygrad: `Tensor.realize(loss, *opt.schedule_step())`, then the device synchronized).
Every runner starts from the same weights and trains on the same batch for the same number of steps, checked
against a float64 numpy run of the same training: the loss of the first three steps and the weights after the
first step closely, the later losses within 2% and the final weights within the 2 lr a step that Adam can move
them. Later steps cannot be held closer: Adam scales every update to about lr whatever the gradient's size, so a
weight whose gradient is near float32 rounding noise (cancelling sums, a ReLU input within rounding of 0) takes a
full step in a direction the rounding decides, and two correct float32 runs drift apart (seen: tgcore and tinygrad
agree to 1e-7 with each other and end 0.6% off the float64 loss after 12 steps). numpy's own figure is a
hand-written float32 forward, backward and Adam.

Memory, two figures. "peak live buffers": the most bytes of tensors alive at once during the run (model, optimizer
state, batch and every intermediate), over what was alive before it: for tgcore and tinygrad the high-water mark of
GlobalCounters.mem_used (memory their allocator keeps cached for reuse is not counted), for numpy the peak of
tracemalloc in a separate untimed run of two steps; torch has no such counter on the CPU. "peak RSS growth": the
process's peak resident memory (Linux VmHWM, reset when the plain run starts) over its resident memory then, for
every runner. It depends on what earlier workloads left in the allocators' caches (a framework that reuses freed
memory grows little) and includes one-time costs (torch's thread pools, a compiler's own memory), so it is shown
without a ratio. Both cover building the model and all the run's steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import numpy as np

from bench.harness import Case, Context, Measured, PeakMemory, check, median, peak_memory
from bench.runners import Runner

TITLE = "train MLP"
TINY = False
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
WARMUP_STEPS = 3  # TinyJit runs the function on its first call, records on the second, replays from the third


def _data(sizes: tuple[int, ...], batch: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Initial weights and biases (W1, b1, W2, b2, ...; torch's default init) and one batch of inputs and labels."""
    rng = np.random.default_rng(4)
    params: list[np.ndarray] = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        bound = 1 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    x = rng.random((batch, sizes[0]), dtype=np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int32)
    return params, x, y


class NumpyMLP:
    """A hand-written MLP with softmax cross-entropy and Adam in numpy, in the dtype of its parameters."""

    def __init__(self, params: list[np.ndarray], dtype: type) -> None:
        self.params: list[np.ndarray] = [p.astype(dtype) for p in params]
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.t = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        x = x.astype(self.params[0].dtype)
        acts, zs = [x], []
        n_layers = len(self.params) // 2
        for i in range(n_layers):
            z = acts[-1] @ self.params[2 * i].T + self.params[2 * i + 1]
            zs.append(z)
            acts.append(np.maximum(z, 0) if i < n_layers - 1 else z)
        logits = acts[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(y))
        loss = float(np.mean(log_sum[:, 0] - shifted[rows, y]))
        grad = np.exp(shifted - log_sum)
        grad[rows, y] -= 1
        grad /= len(y)
        grads: list[np.ndarray] = [np.empty(0)] * len(self.params)
        for i in reversed(range(n_layers)):
            grads[2 * i] = grad.T @ acts[i]
            grads[2 * i + 1] = grad.sum(axis=0)
            if i:
                grad = (grad @ self.params[2 * i]) * (zs[i - 1] > 0)
        self.t += 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= B1
            m += (1 - B1) * g
            v *= B2
            v += (1 - B2) * g * g
            m_hat = m / (1 - B1**self.t)
            v_hat = v / (1 - B2**self.t)
            p -= LR * m_hat / (np.sqrt(v_hat) + EPS)
        return loss


@contextmanager
def _default_device(runner: Runner) -> Iterator[None]:
    """nn.Linear makes its initial weights on the default device: make that the runner's while the model is built."""
    device = runner.lib.Device
    before = device.DEFAULT
    device.DEFAULT = runner.device
    try:
        yield
    finally:
        device.DEFAULT = before


def _lazy_trainer(runner: Runner, params: list[np.ndarray], x_np: np.ndarray, y_np: np.ndarray, jit: bool) -> tuple:
    lib = runner.lib
    with _default_device(runner):
        layers = [lib.Linear(w.shape[1], w.shape[0]) for w in params[::2]]
    for layer, w, b in zip(layers, params[::2], params[1::2]):
        layer.weight, layer.bias = lib.Tensor(w, device=runner.device), lib.Tensor(b, device=runner.device)
    opt = lib.Adam([t for layer in layers for t in (layer.weight, layer.bias)], lr=LR, eps=EPS)
    x, y = runner.put(x_np), runner.put(y_np)

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        h = x
        for i, layer in enumerate(layers):
            h = layer(h)
            if i < len(layers) - 1:
                h = h.relu()
        loss = h.sparse_categorical_crossentropy(y)
        loss.backward()
        lib.Tensor.realize(loss, *opt.schedule_step())
        return loss

    fn = lib.TinyJit(step) if jit else step

    def run_step() -> Any:
        return fn(x, y)

    def weights() -> list[np.ndarray]:
        return [t.numpy() for layer in layers for t in (layer.weight, layer.bias)]

    return run_step, lambda loss: float(loss.numpy()), weights


def _torch_trainer(runner: Runner, params: list[np.ndarray], x_np: np.ndarray, y_np: np.ndarray) -> tuple:
    torch = runner.torch
    layers = [torch.nn.Linear(w.shape[1], w.shape[0]) for w in params[::2]]
    with torch.no_grad():
        for layer, w, b in zip(layers, params[::2], params[1::2]):
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1])
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(B1, B2), eps=EPS)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np.astype(np.int64))

    def run_step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def weights() -> list[np.ndarray]:
        return [t.detach().numpy().copy() for layer in layers for t in (layer.weight, layer.bias)]

    return run_step, lambda loss: float(loss.item()), weights


def _numpy_trainer(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple:
    model = NumpyMLP(params, np.float32)
    return (lambda: model.step(x, y)), float, (lambda: [p.copy() for p in model.params])


def _train(
    runner: Runner, data: tuple, steps: int, jit: bool, trace_numpy: bool = False
) -> tuple[list[float], list[float], list[list[np.ndarray]], PeakMemory]:
    """Seconds of each step, the loss of each step, the weights after the first and the last step, and the peak
    memory of the whole run."""
    params, x, y = data
    with peak_memory(runner, trace_numpy) as peak:
        if runner.lazy:
            run_step, loss_value, weights = _lazy_trainer(runner, params, x, y, jit)
        elif runner.framework == "torch":
            run_step, loss_value, weights = _torch_trainer(runner, params, x, y)
        else:
            run_step, loss_value, weights = _numpy_trainer(params, x, y)
        before = getattr(runner.lib.Tensor, "training", None) if runner.lazy else None
        if runner.lazy:
            runner.lib.Tensor.training = True
        times: list[float] = []
        losses: list[float] = []
        snapshots: list[list[np.ndarray]] = []
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = run_step()
                runner.sync()
                times.append(time.perf_counter() - t0)
                losses.append(loss_value(loss))  # outside the timing: reading the loss is not part of the step
                if not snapshots:
                    snapshots.append(weights())
        finally:
            if runner.lazy:
                runner.lib.Tensor.training = before
        snapshots.append(weights())
    return times, losses, snapshots, peak


def _compare(
    losses: list[float], weights: list[list[np.ndarray]], ref_losses: list[float], ref_weights: list[list[np.ndarray]]
) -> Optional[str]:
    """What disagrees with the float64 reference, or None (see the module's docstring for the tolerances)."""
    expected = np.array(ref_losses)
    close = np.arange(len(expected)) < 3  # the losses that depend on the first two updates only
    tolerance = np.where(close, 1e-5 + 1e-4 * np.abs(expected), 1e-3 + 2e-2 * np.abs(expected))
    if (bad := check(np.array(losses), expected, rtol=0.0, atol=tolerance)) is not None:
        return f"loss per step (index 0 = step 1): {bad}"
    for after, atol in ((0, LR / 4), (-1, 2 * LR * len(losses))):
        for i, (got, expected) in enumerate(zip(weights[after], ref_weights[after])):
            if (bad := check(got, expected, rtol=1e-4, atol=atol)) is not None:
                which = "weight" if i % 2 == 0 else "bias"
                return f"{which} of layer {i // 2 + 1} after step {1 if after == 0 else len(losses)}: {bad}"
    return None


def run(ctx: Context) -> None:
    sizes, batch = ((784, 64, 64, 10), 32) if ctx.quick else ((784, 512, 512, 10), 128)
    steps = WARMUP_STEPS + (2 if ctx.quick else 10)
    data = _data(sizes, batch)
    reference = NumpyMLP(data[0], np.float64)
    ref_losses: list[float] = []
    ref_weights: list[list[np.ndarray]] = []
    for step in range(steps):
        ref_losses.append(reference.step(data[1], data[2]))
        if step in (0, steps - 1):
            ref_weights.append([p.copy() for p in reference.params])
    label = f"{'-'.join(map(str, sizes))} B={batch}"
    memory: dict[tuple[str, str], PeakMemory] = {}

    def body(runner: Runner, jit: bool) -> Callable[[], Measured]:
        def measured() -> Measured:
            times, losses, weights, peak = _train(runner, data, steps, jit)
            if runner.framework == "numpy":  # its live arrays, from tracemalloc, which must not run while timing
                peak.live_bytes = _train(runner, data, 2, jit, trace_numpy=True)[3].live_bytes
            memory[(runner.name, "TinyJit" if jit else "plain")] = peak
            timed = times[WARMUP_STEPS:]
            extra = {"first_step_s": times[0], "steps": steps, **peak.as_dict()}
            return Measured(median(timed) * 1e3, timed, _compare(losses, weights, ref_losses, ref_weights), extra)

        return measured

    plain = Case("f", TITLE, f"{label} plain", "ms/step", higher_is_better=False)
    for runner in ctx.runners:
        ctx.attempt(plain, runner, body(runner, jit=False))
    jitted = Case("f", TITLE, f"{label} TinyJit", "ms/step", higher_is_better=False)
    for runner in ctx.runners:
        if runner.lazy:
            ctx.attempt(jitted, runner, body(runner, jit=True))
    rows = [
        ("plain", "peak live buffers", "live_bytes", True),
        ("TinyJit", "peak live buffers", "live_bytes", True),
        ("plain", "peak RSS growth", "rss_growth_bytes", False),
    ]
    for mode, what, attribute, compare in rows:
        case = Case("f", TITLE, f"{mode}: {what}", "MB", higher_is_better=False, compare=compare)
        for runner in ctx.runners:
            peak = memory.get((runner.name, mode))
            if peak is not None and (value := getattr(peak, attribute)) is not None:
                ctx.figure(case, runner, value / 1e6)
