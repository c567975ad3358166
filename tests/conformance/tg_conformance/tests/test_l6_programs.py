"""Level 6, programs: small whole models on the device, against references written in plain numpy.

An MLP trained with SGD and with Adam (under TinyJit), a CNN with BatchNorm in training mode trained with Adam, a
transformer block forward and backward, and GPT-2- and LLaMA-style decoders generating greedily with a KV cache,
the decode steps under TinyJit with a symbolic `start_pos`. Where the device does not execute (--compile-only,
--render-only), each program runs on a host device instead and every kernel it launched is rendered (and compiled)
for the device under test (`tg_conformance.capture`).

Float results are compared norm-wise: the largest error of a tensor may be `atol + rtol * max|expected|`, from the
device's declared float32 tolerance with rtol widened by PROGRAM_RTOL_FACTOR for the rounding a whole program
accumulates. Tokens must be the same; every greedy token of the references wins by a margin that no difference
within that tolerance can overturn (checked, not assumed).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

from tg_conformance import program_reference as ref
from tg_conformance import programs as prog
from tg_conformance.capture import run_program
from tg_conformance.kernels import compile_pool
from tg_conformance.target import Target
from tgcore.dtype import DType, dtypes

F32 = [pytest.param(dtypes.float32, id="f32")]
PROGRAM_RTOL_FACTOR = 10
MAX_LISTED = 8
# the seeds of the weights and data; the decoders' were picked for greedy tokens that win by a wide margin
MLP_SEED, MLP_DATA_SEED, CNN_SEED, CNN_DATA_SEED, BLOCK_SEED = 1, 2, 3, 4, 5
GPT2_SEED, LLAMA_SEED = 12, 14
PROMPT = [1, 7, 22, 5, 40]


@pytest.fixture(scope="module", autouse=True)
def _compile_pool() -> Iterator[None]:
    """In compile-only mode the programs' kernels are compiled on the pool's threads; its threads end with the level."""
    yield
    compile_pool.close()


def program_tolerance(target: Target) -> tuple[float, float]:
    """(atol, rtol) for a whole program's float32 results on the target."""
    atol, rtol = target.tolerance(dtypes.float32)
    return atol, rtol * PROGRAM_RTOL_FACTOR


def tensor_problems(what: str, got: dict[str, Any], exp: dict[str, Any], tol: tuple[float, float]) -> list[str]:
    """A line for each tensor of `exp` whose largest error is beyond atol + rtol * max|expected|."""
    atol, rtol = tol
    lines = []
    for name, e in exp.items():
        if name not in got:
            lines.append(f"{what} {name}: missing from the result")
            continue
        g, e = np.asarray(got[name], np.float64), np.asarray(e, np.float64)
        if g.shape != e.shape:
            lines.append(f"{what} {name}: shape {g.shape}, expected {e.shape}")
            continue
        err = np.abs(g - e)
        allowed = atol + rtol * float(np.abs(e).max(initial=0.0))
        if not np.all(err <= allowed):  # NaN fails too
            i = np.unravel_index(np.nanargmax(np.where(np.isnan(err), np.inf, err)), err.shape) if err.ndim else ()
            where = f" at {tuple(int(x) for x in i)}" if err.ndim else ""
            lines.append(f"{what} {name}: largest error {float(err.max()):.3g} > allowed {allowed:.3g}{where}: "
                         f"expected {float(e[i]):.8g}, got {float(g[i]):.8g}")
    return lines


def fail_if(problems: list[str], header: str) -> None:
    if problems:
        shown = problems[:MAX_LISTED] + ([f"... and {len(problems) - MAX_LISTED} more"]
                                         if len(problems) > MAX_LISTED else [])
        pytest.fail(header + "\n" + "\n".join(shown), pytrace=False)


def _losses(values: list[float]) -> dict[str, np.ndarray]:
    return {f"loss of step {i}": np.float64(v) for i, v in enumerate(values)}


# ***** training *****

@pytest.mark.tg_op("MLP training")
@pytest.mark.parametrize("op", ["SGD", "Adam"])  # the optimizer (as `op`, it names the row of the report's table)
@pytest.mark.parametrize("dtype", F32)
def test_mlp_training(target: Target, op: str, dtype: DType) -> None:
    """Linear -> ReLU -> Linear with cross-entropy; a TinyJit'd step per batch (SGD with momentum and weight decay,
    or Adam); each step's loss and the parameters after the last step."""
    target.require(dtype)
    optimizer = op.lower()
    weights = prog.mlp_weights(MLP_SEED)
    batches = prog.classification_batches(MLP_DATA_SEED, prog.MLP_STEPS, (prog.MLP_BATCH, prog.MLP_SHAPE[0]),
                                          prog.MLP_SHAPE[2])
    got = run_program(target, lambda dev: prog.train_mlp(dev, optimizer, weights, batches), f"MLP with {optimizer}")
    if got is None:
        return
    state = ref.SGDState(**prog.SGD_ARGS) if optimizer == "sgd" else ref.AdamState(**prog.ADAM_ARGS)
    exp_losses, exp_params = ref.train_mlp(weights, batches, state)
    tol = program_tolerance(target)
    problems = tensor_problems("MLP", _losses(got[0]), _losses(exp_losses), tol)
    problems += tensor_problems("MLP", got[1], exp_params, tol)
    fail_if(problems, f"MLP trained with {optimizer} for {len(batches)} steps on {target.name} (atol={tol[0]:g}, "
                      f"rtol={tol[1]:g} of each tensor's largest value):")


@pytest.mark.tg_op("CNN training")
@pytest.mark.parametrize("dtype", F32)
def test_cnn_training(target: Target, dtype: DType) -> None:
    """Conv2d -> BatchNorm2d (training: batch statistics, running statistics updated) -> ReLU -> max-pool -> Linear,
    cross-entropy, Adam; each step's loss, the parameters and the BatchNorm's running statistics after the steps."""
    target.require(dtype)
    weights = prog.cnn_weights(CNN_SEED)
    batches = prog.classification_batches(CNN_DATA_SEED, prog.CNN_STEPS, prog.CNN_INPUT, prog.CNN_CLASSES)
    got = run_program(target, lambda dev: prog.train_cnn(dev, weights, batches), "CNN")
    if got is None:
        return
    exp_losses, exp_state = ref.train_cnn(weights, batches, ref.AdamState(**prog.ADAM_ARGS), prog.BN_MOMENTUM,
                                          prog.BN_EPS)
    tol = program_tolerance(target)
    problems = tensor_problems("CNN", _losses(got[0]), _losses(exp_losses), tol)
    problems += tensor_problems("CNN", got[1], exp_state, tol)
    fail_if(problems, f"CNN trained with Adam for {len(batches)} steps on {target.name} (atol={tol[0]:g}, "
                      f"rtol={tol[1]:g} of each tensor's largest value):")


@pytest.mark.tg_op("transformer block")
@pytest.mark.parametrize("dtype", F32)
def test_transformer_block_forward_backward(target: Target, dtype: DType) -> None:
    """LayerNorm, causal multi-head self-attention, GELU MLP, residuals: the output and the gradient of
    sum(output * upstream) with respect to every parameter and to the input."""
    target.require(dtype)
    weights, x, upstream = prog.block_weights(BLOCK_SEED)
    got = run_program(target, lambda dev: prog.block_forward_backward(dev, weights, x, upstream),
                      "transformer block")
    if got is None:
        return
    exp_out, exp_grads = ref.block_forward_backward(ref.f64(weights), x.astype(np.float64), prog.BLOCK_HEADS,
                                                    upstream.astype(np.float64))
    tol = program_tolerance(target)
    problems = tensor_problems("block", {"output": got[0]}, {"output": exp_out}, tol)
    problems += tensor_problems("block gradient of", got[1], exp_grads, tol)
    fail_if(problems, f"transformer block forward and backward on {target.name} (atol={tol[0]:g}, rtol={tol[1]:g} of "
                      "each tensor's largest value):")


# ***** decoders *****

def check_generation(target: Target, name: str, gen: prog.Generation, recomputed: np.ndarray,
                     reference_logits: Callable[[list[int]], np.ndarray]) -> None:
    """The generated tokens are numpy's greedy ones; each step's logits match numpy's and recomputing the whole
    sequence without the cache, both on the sequence the device generated."""
    tol = program_tolerance(target)
    atol, rtol = tol
    exp_tokens, exp_logits = ref.greedy(reference_logits, PROMPT, prog.NEW_TOKENS)
    for step, logits in enumerate(exp_logits):  # a defect of the suite, not of the device: fail on every device
        need = 2 * (atol + rtol * float(np.abs(logits).max()))
        assert ref.top2_margin(logits) > need, (
            f"{name} reference: step {step}'s top two logits are {ref.top2_margin(logits):.3g} apart, less than the "
            f"{need:.3g} that differences within the tolerance could close: pick another seed")
    assert gen.jit_kernels > 0, f"{name}: the decode steps ran no kernel under TinyJit"
    sequence = PROMPT + gen.tokens[:-1]
    numpy_rows = reference_logits(sequence)[len(PROMPT) - 1:]
    recomputed_rows = recomputed[len(PROMPT) - 1:]
    problems = []
    if gen.tokens != exp_tokens:
        first = next(i for i, (a, b) in enumerate(zip(gen.tokens, exp_tokens)) if a != b)
        problems.append(f"tokens differ from step {first} ({'the prompt' if first == 0 else 'a decode step'}): "
                        f"got {gen.tokens}, expected {exp_tokens}")
    cached, whole = [], []
    for step, logits in enumerate(gen.logits):
        where = "prompt" if step == 0 else f"decode step {step} (start_pos={len(PROMPT) + step - 1})"
        expected = {"logits": numpy_rows[step]}
        cached += tensor_problems(where, {"logits": logits}, expected, tol)
        whole += tensor_problems(f"recomputing the sequence of {where} without the cache:",
                                 {"logits": recomputed_rows[step]}, expected, tol)
    if cached and not whole:
        problems.append("recomputing every sequence whole (no cache, no jit) matches numpy: what differs is the "
                        "generation (the KV cache written through shrink().assign(), TinyJit, the symbolic start_pos)")
    problems += cached + whole
    fail_if(problems, f"{name} generating {prog.NEW_TOKENS} tokens greedily from {PROMPT} on {target.name} (atol="
                      f"{atol:g}, rtol={rtol:g} of the largest logit; logits on the sequence the device generated):")


@pytest.mark.tg_op("GPT-2 decoder")
@pytest.mark.parametrize("dtype", F32)
def test_gpt2_greedy_generation(target: Target, dtype: DType) -> None:
    """GPT-2 style: learned position embeddings, the decode token a bound Variable picked by a symbolic shrink, keys
    and values as the cached positions concatenated with the new one."""
    target.require(dtype)
    cfg, weights = prog.GPT2_CONFIG, prog.gpt2_weights(GPT2_SEED)

    def program(dev: str) -> tuple[prog.Generation, np.ndarray]:
        gen = prog.generate_gpt2(dev, weights, PROMPT)
        return gen, prog.recompute_logits(prog.GPT2, cfg, dev, weights, PROMPT + gen.tokens[:-1])

    got = run_program(target, program, "GPT-2 decoder")
    if got is not None:
        check_generation(target, "GPT-2 decoder", *got, lambda seq: ref.gpt2_logits(ref.f64(weights), cfg, seq))


@pytest.mark.tg_op("LLaMA decoder")
@pytest.mark.parametrize("dtype", F32)
def test_llama_greedy_generation(target: Target, dtype: DType) -> None:
    """LLaMA style: RMSNorm, rotary embeddings, grouped-query attention (n_kv_heads < n_heads), a SiLU-gated FFN,
    keys and values read from the cache up to and including the new position."""
    target.require(dtype)
    cfg, weights = prog.LLAMA_CONFIG, prog.llama_weights(LLAMA_SEED)

    def program(dev: str) -> tuple[prog.Generation, np.ndarray]:
        gen = prog.generate_llama(dev, weights, PROMPT)
        return gen, prog.recompute_logits(prog.Llama, cfg, dev, weights, PROMPT + gen.tokens[:-1])

    got = run_program(target, program, "LLaMA decoder")
    if got is not None:
        check_generation(target, "LLaMA decoder", *got, lambda seq: ref.llama_logits(ref.f64(weights), cfg, seq))
