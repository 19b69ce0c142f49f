"""Runs a training IR (stages/autodiff.py) with numpy: the golden model the generated C must match (DESIGN §5).

    state = init_state(train_graph)                       # trained weights, optimizer state, accumulators
    loss = train_step(train_graph, state, x_batch, y_batch, runtime)   # one update; state changes in place
    losses = train(train_graph, x, y, runtime, steps=..., epochs=..., seed=...)

A step runs the sample phase once per sample of the batch (batch dim 1, as the firmware does) and the step phase
once. Forward ops run on the reference executor's kernels (stages/golden/forward.py), so training sees the very forward
that inference does; every other op (backward, loss, mask, accumulation, update) runs its op module's numpy kernel
(stages/ops/, OpDef.run, on stages/golden/grad_ops.py's and stages/quant/qas.py's functions): this module only dispatches.

Int8 training graphs run the same way: the int8 forward on the executor's int8 kernels (bit-exact), float inputs
quantized as QUANTIZE does, the fp32 backward and the QAS updates as their ops' kernels; `runtime["seed"]`
seeds the stochastic-rounding PRNG streams (train() passes its own seed unless runtime has one).

`runtime` carries the runtime values the update ops reference (`lr_ref="runtime.learning_rate"` etc.); missing
keys take meta["train"]["runtime_defaults"].
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np

from tinytrain.stages.golden import forward as fwd_exec
from tinytrain.stages.golden import fp16 as fp16_ref
from tinytrain.stages import ops
from tinytrain.stages.quant import qas
from tinytrain.stages.model.ir import Graph, Op

_FORWARD_OPS = frozenset(fwd_exec.supported_ops())
# Graph precisions whose backward runs in the C kernels' order of operations by default (run_sample). Measured
# (tests/test_hidden_stream.py, int8 Adam): numpy's pairwise sums moved one bias gradient by 8 ulps, and Adam's
# step of ~3,300 bias units then rounded to the other integer.
EXACT_PRECISIONS = ("fp16-mixed", "int8")


def numpy_backward(op: Op, v) -> None:
    """A `backward_op` that lets every op's own numpy kernel run: for probes that need the golden model's
    arithmetic only up to last-bit sums (faster than the C-order loops on large layers)."""
    return None

__all__ = ["init_state", "run_sample", "train_step", "train", "TrainingError", "numpy_backward"]


class TrainingError(fwd_exec.ExecutionError):
    """The training graph cannot be run as given."""


def init_state(train_graph: Graph, runtime: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Writable copies of every tensor the step phase changes (trained parameters, optimizer state, accumulators,
    QAS master copies), with the stochastic-rounding PRNG states seeded from runtime["seed"] (default 0)."""
    meta = _meta(train_graph)
    q = meta.get("qas", {})
    names = (list(meta["trained"]) + list(meta["accumulators"]) + list(meta["optimizer_state"])
             + list(q.get("master_copies", {}).values()))
    state = {n: np.array(train_graph.tensors[n].data, copy=True) for n in names}
    seed = int((runtime or {}).get("seed", meta["runtime_defaults"].get("seed", 0)))
    for op in train_graph.ops:
        if op.type in _QAS_UPDATES and op.attrs.get("rounding") == "stochastic" and not op.attrs.get("master"):
            state[op.inputs[-1]][...] = np.array(qas.seed_state(seed, int(op.attrs["stream"])), np.uint32).view(np.int32)
    return state


def _meta(g: Graph) -> dict[str, Any]:
    m = g.meta.get("train")
    if not m:
        raise TrainingError("not a training graph (no meta['train']); build it with autodiff.build_training_graph")
    return m


def _forward(g: Graph, op: Op, index: int, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    return fwd_exec.run_op(g, op, values, index=index, n=1)


def _runtime_value(op: Op, key: str, runtime: dict[str, Any], defaults: dict[str, Any]) -> float:
    ref = op.attrs.get(f"{key}_ref")
    if ref is None:
        return 0.0 if key == "weight_decay" else float(defaults[key])
    name = ref.split(".", 1)[1] if ref.startswith("runtime.") else ref
    if name in runtime:
        return float(runtime[name])
    if name in defaults:
        return float(defaults[name])
    raise TrainingError(f"op {op.type}: runtime value {name!r} is not given and has no default")


def _backward(op: Op, v: Callable[[int], np.ndarray], shape: Callable[[str], list[int]],
              tensor: Callable[[str], Any] | None = None) -> list[np.ndarray]:
    """A sample-phase op that is no forward op: its op module's kernel (stages/ops/, OpDef.run)."""
    d = ops.REGISTRY.get(op.type)
    if d is None or d.run is None:
        raise NotImplementedError(f"training executor: no kernel for op {op.type!r}")
    return d.run(op, v, shape, tensor)


def _shape_fn(g: Graph):
    def shape(name: str) -> list[int]:
        # The sample phase runs batch 1, so declared shapes are the run's shapes.
        return list(g.tensors[name].shape)
    return shape


_QAS_UPDATES = ops.QAS_UPDATE_OPS


def _update(op: Op, values: dict[str, np.ndarray], runtime: dict, defaults: dict) -> None:
    """One op of the step phase (an update, Adam's step counter): its op module's kernel changes `values`' state
    arrays in place, reading the op's runtime hyper-parameters from `runtime` (missing: `defaults`)."""
    d = ops.REGISTRY.get(op.type)
    if d is None or d.run is None:
        raise NotImplementedError(f"training executor: op {op.type!r} in the step phase")
    skip = op.attrs.get("skip_if")
    if skip is not None and int(values[skip]) != 0:
        return  # fp16-mixed: a gradient overflowed, the step is skipped (stages/train/fp16_mixed.py)
    outs = d.run(op, lambda j: values[op.inputs[j]], None, None, lambda k: _runtime_value(op, k, runtime, defaults))
    # ops that make a new value (fp16-mixed's check and unscale) return it; updates change their state in place
    for name, arr in zip(op.outputs, outs or []):
        values[name] = np.asarray(arr)


_qas_update = _update   # stages/quant/update_check.py runs the QAS updates one by one


def run_sample(g: Graph, state: dict[str, np.ndarray], x1: np.ndarray, y1: np.ndarray,
               forward_op: Callable | None = None, backward_op: Callable | None = None) -> dict[str, np.ndarray]:
    """The sample phase on one sample (x1, y1 with a batch dim of 1): every tensor's value (forward activations,
    loss, gradients; accumulators change in place in `state`). train_step runs it once per sample. `forward_op`
    (default: the reference executor's run_op) runs the forward ops, e.g. the analysis' fast_float.run_op;
    `backward_op(op, v)` may take over a backward op (None: grad_ops runs it), e.g. fast_float.backward_op."""
    meta = _meta(g)
    if backward_op is None and meta.get("precision") in EXACT_PRECISIONS:
        # fp16 rounds every result, and an int8/int32 update rounds its step: a last-bit difference in an fp32
        # gradient sum can move either rounding, so the sums must be the C's, bit for bit (fp16_exact.py)
        from tinytrain.stages.golden.fp16_exact import backward_op as exact
        backward_op = exact(g)
    x_name = [n for n in g.inputs if n != meta["label_input"]]
    if len(x_name) != 1:
        raise NotImplementedError("training executor: models with several inputs")
    x_name, lab_name = x_name[0], meta["label_input"]
    lab_t = g.tensors[lab_name]
    split = int(meta["sample_ops"])
    shape = _shape_fn(g)
    tensor = g.tensors.__getitem__
    values = {t.name: t.data for t in g.constants()}
    values.update(state)
    values[x_name] = _feed(np.asarray(x1), g.tensors[x_name])
    values[lab_name] = np.asarray(y1).astype(lab_t.dtype).reshape([1] + list(lab_t.shape[1:]))
    fp16 = meta.get("precision") == "fp16-mixed"
    for i, op in enumerate(g.ops[:split]):
        # fp16-mixed: a kernel reads an fp16 tensor widened (exact) and writes an fp16 one rounded once (the C's
        # fp16-reading / fp16-writing kernels: OpDef.fp16_operands, fp16_output), around its fp32 arithmetic
        vals = _widened(op, values) if fp16 else values
        if op.type in _FORWARD_OPS:
            outs = _forward(g, op, i, vals) if forward_op is None else forward_op(g, op, vals, index=i, n=1)
        else:
            v = lambda j, op=op: vals[op.inputs[j]]  # noqa: E731
            outs = backward_op(op, v) if backward_op is not None else None
            if outs is None:
                outs = _backward(op, v, shape, tensor)
        for name, arr in zip(op.outputs, outs):
            arr = np.asarray(arr)
            if fp16 and g.tensors[name].dtype == "float16" and arr.dtype == np.float32:
                arr = fp16_ref.to_f16(arr)
            values[name] = arr
    return values


def _widened(op: Op, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`values` with op's fp16 inputs widened to float32 (exact), for a kernel that computes in fp32."""
    wide = {t: fp16_ref.to_f32(values[t]) for t in op.inputs
            if t is not None and t in values and getattr(values[t], "dtype", None) == np.float16}
    return collections.ChainMap(wide, values) if wide else values


def train_step(train_graph: Graph, state: dict[str, np.ndarray], x_batch: np.ndarray, y_batch: np.ndarray,
               runtime: dict[str, Any] | None = None, forward_op: Callable | None = None,
               backward_op: Callable | None = None) -> float:
    """One optimizer step on a batch (its size must be the graph's batch_size); returns the batch's mean loss."""
    g = train_graph
    meta = _meta(g)
    runtime = dict(runtime or {})
    defaults = meta["runtime_defaults"]
    bsz = int(meta["batch_size"])
    x_batch, y_batch = np.asarray(x_batch), np.asarray(y_batch)
    if x_batch.shape[0] != bsz or y_batch.shape[0] != bsz:
        raise TrainingError(f"the training graph was built for batches of {bsz}; got {x_batch.shape[0]} inputs "
                            f"and {y_batch.shape[0]} labels")
    total = np.float32(0)
    for s in range(bsz):
        values = run_sample(g, state, x_batch[s:s + 1], y_batch[s:s + 1], forward_op, backward_op)
        total += values[meta["loss_tensor"]]
        last = values
    split = int(meta["sample_ops"])
    for op in g.ops[split:]:
        _update(op, last, runtime, defaults)
    return float(total / np.float32(bsz))


def _feed(x: np.ndarray, t) -> np.ndarray:
    """The model input: float samples as they are; for an int8 input, float samples are quantized as the
    QUANTIZE op does (round half away from zero, clamp), integer samples taken as already quantized."""
    x = np.asarray(x)
    if t.dtype != "int8":
        return x.astype(np.float32)
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int8)
    s, z = float(t.quant.scale[0]), int(t.quant.zero_point[0])
    q = (x.astype(np.float32) / np.float32(s)).astype(np.float32)
    return np.clip(qas.round_nearest(q) + z, -128, 127).astype(np.int8)


def train(train_graph: Graph, x: np.ndarray, y: np.ndarray, runtime: dict[str, Any] | None = None, *,
          steps: int | None = None, epochs: int | None = None, seed: int = 0, shuffle: bool = True,
          state: dict[str, np.ndarray] | None = None,
          forward_op: Callable | None = None,
          backward_op: Callable | None = None) -> tuple[list[float], dict[str, np.ndarray]]:
    """Train for `steps` batches or `epochs` passes (batches in a seeded permutation per epoch; a last partial
    batch is dropped, the graph's batch size is fixed). Returns (loss per step, final state)."""
    meta = _meta(train_graph)
    bsz = int(meta["batch_size"])
    n = int(np.asarray(x).shape[0])
    if n < bsz:
        raise TrainingError(f"{n} samples are fewer than one batch of {bsz}")
    if (steps is None) == (epochs is None):
        raise TrainingError("give exactly one of steps and epochs")
    per_epoch = n // bsz
    total = steps if steps is not None else epochs * per_epoch
    rng = np.random.default_rng(seed)
    state = init_state(train_graph, {"seed": seed, **(runtime or {})}) if state is None else state
    losses: list[float] = []
    order = np.arange(n)
    for k in range(total):
        j = k % per_epoch
        if j == 0 and shuffle:
            order = rng.permutation(n)
        idx = order[j * bsz:(j + 1) * bsz]
        losses.append(train_step(train_graph, state, np.asarray(x)[idx], np.asarray(y)[idx], runtime, forward_op,
                                 backward_op))
    return losses, state
