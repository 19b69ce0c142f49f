"""Runs a training IR (stages/autodiff.py) with numpy: the golden model the generated C must match (DESIGN §5).

    state = init_state(train_graph)                       # trained weights, optimizer state, accumulators
    loss = train_step(train_graph, state, x_batch, y_batch, runtime)   # one update; state changes in place
    losses = train(train_graph, x, y, runtime, steps=..., epochs=..., seed=...)

A step runs the sample phase once per sample of the batch (batch dim 1, as the firmware does) and the step phase
once. Forward ops run on the reference executor's kernels (stages/executor.py), so training sees the very forward
that inference does; backward, loss and update ops run on stages/grad_ops.py.

Int8 training graphs run the same way: the int8 forward on the executor's int8 kernels (bit-exact), float inputs
quantized as QUANTIZE does, the fp32 backward on grad_ops, the QAS updates on stages/qas.py; `runtime["seed"]`
seeds the stochastic-rounding PRNG streams (train() passes its own seed unless runtime has one).

`runtime` carries the runtime values the update ops reference (`lr_ref="runtime.learning_rate"` etc.); missing
keys take meta["train"]["runtime_defaults"].
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tinytrain.stages import executor as fwd_exec
from tinytrain.stages import grad_ops as go
from tinytrain.stages import qas
from tinytrain.stages.ir import Graph, Op
from tinytrain.stages.losses import LOSS_OPS, loss_sum, run_loss_op

_FORWARD_OPS = frozenset(fwd_exec.supported_ops())

__all__ = ["init_state", "run_sample", "train_step", "train", "TrainingError"]


class TrainingError(fwd_exec.ExecutionError):
    """The training graph cannot be run as given."""


LOSS_OP_TYPES = frozenset(LOSS_OPS.values())


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


def _dequantize_slice(x: np.ndarray, t, a: dict) -> np.ndarray:
    """x[..., :channels] (FC: the first `channels` columns of x's rows of `depth`) as float32
    (q − zero_point)·scale: one float32 multiply, which equals the reference Dequantize's
    float(double(scale)·(q − zp)) since (q − zp) has 9 bits and the double product is exact."""
    if t.quant is None or t.quant.per_channel:
        raise TrainingError(f"dequantize_slice of {t.name!r} needs a per-tensor quantized activation")
    k = int(a["channels"])
    x = np.asarray(x)
    rows = x.reshape(-1, int(a["depth"])) if "depth" in a else x
    q = rows[..., :k].astype(np.int32) - np.int32(t.quant.zero_point[0])
    return (q.astype(np.float32) * np.float32(t.quant.scale[0])).astype(np.float32)


def _backward(op: Op, v: Callable[[int], np.ndarray], shape: Callable[[str], list[int]],
              tensor: Callable[[str], Any] | None = None) -> list[np.ndarray]:
    a, t = op.attrs, op.type
    if t == "act_grad":
        return [go.act_grad(v(0), v(1), a["act"])]
    if t == "conv2d_grad_input":
        return [go.conv2d_grad_input(v(0), v(1), shape(op.outputs[0]), a)]
    if t == "conv2d_grad_weight":
        return [go.conv2d_grad_weight(v(0), v(1), _wshape(op, shape), a, a.get("in_channels"))]
    if t == "transpose_conv_grad_input":
        return [go.transpose_conv_grad_input(v(0), v(1), shape(op.outputs[0]), a)]
    if t == "transpose_conv_grad_weight":
        return [go.transpose_conv_grad_weight(v(0), v(1), _wshape(op, shape), a, a.get("in_channels"))]
    if t == "depthwise_conv2d_grad_input":
        return [go.depthwise_conv2d_grad_input(v(0), v(1), shape(op.outputs[0]), a)]
    if t == "depthwise_conv2d_grad_weight":
        return [go.depthwise_conv2d_grad_weight(v(0), v(1), _wshape(op, shape), a, a.get("in_channels"),
                                                a.get("multiplier"))]
    if t == "fully_connected_grad_input":
        return [go.fully_connected_grad_input(v(0), v(1), shape(op.outputs[0]))]
    if t == "fully_connected_grad_weight":
        return [go.fully_connected_grad_weight(v(0), v(1), _wshape(op, shape), a.get("in_channels"))]
    if t == "bias_grad":
        return [go.bias_grad(v(0))]
    if t == "add_grad":
        return [go.unbroadcast(v(0), shape(o)) for o in op.outputs]
    if t == "average_pool2d_grad":
        return [go.average_pool2d_grad(v(0), shape(op.outputs[0]), a)]
    if t == "max_pool2d_grad":
        return [go.max_pool2d_grad(v(0), v(1), a)]
    if t == "mean_grad":
        return [go.mean_grad(v(0), shape(op.outputs[0]), v(1))]
    if t == "reshape_grad":
        return [go.reshape_grad(v(0), shape(op.outputs[0]))]
    if t == "pad_grad":
        return [go.pad_grad(v(0), v(1))]
    if t == "concatenation_grad":
        parts = go.concatenation_grad(v(0), a["sizes"], a["axis"])
        return [parts[j] for j in a["which"]]
    if t == "softmax_grad":
        return [go.softmax_grad(v(0), v(1), a.get("beta", 1.0))]
    if t == "mul_grad":
        return [go.mul_grad(v(0), v(1), shape(op.outputs[0]))]
    if t == "sub_grad":
        return [go.sub_grad(v(0), shape(o), -1.0 if j == 1 else 1.0) for o, j in zip(op.outputs, a["which"])]
    if t == "logistic_grad":
        return [go.logistic_grad(v(0), v(1))]
    if t == "tanh_grad":
        return [go.tanh_grad(v(0), v(1))]
    if t == "hard_swish_grad":
        return [go.hard_swish_grad(v(0), v(1))]
    if t == "leaky_relu_grad":
        return [go.leaky_relu_grad(v(0), v(1), a["alpha"])]
    if t == "prelu_grad":
        return [go.prelu_grad(v(0), v(1), v(2))]
    if t == "strided_slice_grad":
        return [go.strided_slice_grad(v(0), shape(op.outputs[0]), a["starts"], a["stops"], a["strides"])]
    if t in ("resize_bilinear_grad", "resize_nearest_neighbor_grad"):
        fn = go.resize_bilinear_grad if t == "resize_bilinear_grad" else go.resize_nearest_neighbor_grad
        return [fn(v(0), shape(op.outputs[0]), a)]
    if t == "int8_clamp_grad":
        y = np.asarray(v(1))
        return [np.where((y > a["lo"]) & (y < a["hi"]), go._f32(v(0)), np.float32(0)).astype(np.float32)]
    if t == "clamp_mask":
        return [go.clamp_mask(v(0), a["lo"], a.get("hi"))]
    if t == "mask_grad":
        return [go.mask_grad(v(0), v(1))]
    if t == "dequantize_slice":
        return [_dequantize_slice(v(0), tensor(op.inputs[0]), a)]
    if t == "grad_accumulate":
        return [go.grad_sum([v(j) for j in range(len(op.inputs))])]
    if t in LOSS_OP_TYPES:
        return run_loss_op(op, v, tensor)
    if t == "loss_sum":
        return [loss_sum([v(j) for j in range(len(op.inputs))])]
    raise NotImplementedError(f"training executor: no kernel for op {t!r}")


def _wshape(op: Op, shape: Callable[[str], list[int]]) -> list[int]:
    """The full weight shape; the gradient holds a slice of its last axis."""
    return list(op.attrs["w_shape"])


def _shape_fn(g: Graph):
    def shape(name: str) -> list[int]:
        # The sample phase runs batch 1, so declared shapes are the run's shapes.
        return list(g.tensors[name].shape)
    return shape


def _update(op: Op, values: dict[str, np.ndarray], runtime: dict, defaults: dict) -> None:
    a = op.attrs
    r = lambda k: _runtime_value(op, k, runtime, defaults)  # noqa: E731
    w, gname = values[op.inputs[0]], op.inputs[1]
    g = values[gname]
    scale = 1.0 / float(a.get("batch_size", 1))
    n = a.get("n")
    wd = r("weight_decay") if "weight_decay_ref" in a else 0.0
    if op.type == "sgd_update":
        go.sgd_update(w, g, r("learning_rate"), scale, wd, n)
    elif op.type == "momentum_update":
        go.momentum_update(w, g, values[op.inputs[2]], r("learning_rate"), r("momentum"), scale, wd, n)
    elif op.type == "adam_update":
        step = int(values[op.inputs[4]])
        go.adam_update(w, g, values[op.inputs[2]], values[op.inputs[3]], step, r("learning_rate"), r("beta1"),
                       r("beta2"), r("eps"), scale, wd, n)
    elif op.type == "rmsprop_update":
        go.rmsprop_update(w, g, values[op.inputs[2]], r("learning_rate"), r("alpha"), r("eps"), scale, wd, n)
    else:
        raise NotImplementedError(f"training executor: no kernel for op {op.type!r}")
    if a.get("reset_grad"):
        g[...] = 0


_FLOAT_UPDATES = ("sgd_update", "momentum_update", "adam_update", "rmsprop_update")
_QAS_UPDATES = ("qas_sgd_update", "qas_momentum_update", "qas_adam_update", "qas_rmsprop_update")
_UPDATES = _FLOAT_UPDATES + _QAS_UPDATES


def _qas_update(op: Op, values: dict[str, np.ndarray], runtime: dict, defaults: dict) -> None:
    """qas_<kind>_update(p, g, scale, *state[, step][, master][, prng]) -> p, *state[, master][, prng]."""
    a = op.attrs
    kind = op.type[len("qas_"):-len("_update")]
    r = lambda k: _runtime_value(op, k, runtime, defaults)  # noqa: E731
    keys = {"sgd": [], "momentum": ["momentum"], "adam": ["beta1", "beta2", "eps"], "rmsprop": ["alpha", "eps"]}
    hp = {k: r(k) for k in ["learning_rate"] + keys[kind]}
    hp["weight_decay"] = r("weight_decay") if "weight_decay_ref" in a else 0.0
    ins = op.inputs
    ns = qas.STATE_COUNT[kind]
    state = [values[ins[3 + j]] for j in range(ns)]
    pos = 3 + ns
    step = 0
    if kind == "adam":
        step = int(values[ins[pos]])
        pos += 1
    master = None
    if a.get("master"):
        master = values[ins[pos]]
        pos += 1
    prng = values[ins[pos]] if a.get("rounding") == "stochastic" and master is None else None
    g = values[ins[1]]
    qas.qas_update(kind, values[ins[0]], g, values[ins[2]], axis=int(a["axis"]), n=a.get("n"), state=state, hp=hp,
                   step=step, batch_size=int(a.get("batch_size", 1)), qas=bool(a.get("qas", True)),
                   rounding=a.get("rounding", "nearest"), bounds=tuple(a["bounds"]), master=master, prng=prng)
    if a.get("reset_grad"):
        g[...] = 0


def run_sample(g: Graph, state: dict[str, np.ndarray], x1: np.ndarray, y1: np.ndarray) -> dict[str, np.ndarray]:
    """The sample phase on one sample (x1, y1 with a batch dim of 1): every tensor's value (forward activations,
    loss, gradients; accumulators change in place in `state`). train_step runs it once per sample."""
    meta = _meta(g)
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
    for i, op in enumerate(g.ops[:split]):
        if op.type == "batch_accumulate":
            values[op.inputs[0]] += values[op.inputs[1]]
            continue
        if op.type in _FORWARD_OPS:
            outs = _forward(g, op, i, values)
        else:
            outs = _backward(op, lambda j, op=op: values[op.inputs[j]], shape, tensor)
        for name, arr in zip(op.outputs, outs):
            values[name] = np.asarray(arr)
    return values


def train_step(train_graph: Graph, state: dict[str, np.ndarray], x_batch: np.ndarray, y_batch: np.ndarray,
               runtime: dict[str, Any] | None = None) -> float:
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
        values = run_sample(g, state, x_batch[s:s + 1], y_batch[s:s + 1])
        total += values[meta["loss_tensor"]]
        last = values
    split = int(meta["sample_ops"])
    for op in g.ops[split:]:
        if op.type == "step_counter":
            state[op.inputs[0]][...] += 1
        elif op.type in _QAS_UPDATES:
            _qas_update(op, last, runtime, defaults)
        elif op.type in _UPDATES:
            _update(op, last, runtime, defaults)
        else:
            raise NotImplementedError(f"training executor: op {op.type!r} in the step phase")
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
          state: dict[str, np.ndarray] | None = None) -> tuple[list[float], dict[str, np.ndarray]]:
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
        losses.append(train_step(train_graph, state, np.asarray(x)[idx], np.asarray(y)[idx], runtime))
    return losses, state
