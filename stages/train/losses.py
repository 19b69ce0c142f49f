"""Training losses: which output(s) are trained with which loss, and the numpy golden model of each loss op.

A training run trains one or more *heads*: model outputs, each with a loss and a weight (spec `train.outputs`,
e.g. `[{name: scores, loss: bce}, {name: boxes, loss: mse, weight: 0.1}]`). Without `train.outputs` the model's
single output is the one head, with `train.loss` and weight 1: the single-output case is the one-element list.

Losses (per sample: the loss of one sample; the update divides by the batch, PyTorch's mean reduction):
  cross_entropy  softmax_ce_loss   fused softmax + cross-entropy on an integer class (the head's final softmax
                                   is dropped from the training forward); needs >= 2 classes on the last axis
  mse            mse_loss          mean over the sample's elements of (y - t)^2
  bce            bce_logits_loss   binary cross-entropy with logits, mean over the sample's elements (PyTorch
                                   BCEWithLogitsLoss); a final LOGISTIC of the head is dropped like the softmax
  huber          huber_loss        mean over the elements of 0.5 d^2 (|d| <= delta) or delta (|d| - delta / 2),
                                   delta = 1 (PyTorch HuberLoss); d = y - t

Loss op attrs (absent = the single-output default, so single-output training graphs keep their bytes):
  weight   the head's weight: loss and gradient are multiplied by it (float32) after the loss kernel
  offset   the head's first value in the shared target row (several heads: one float32 target tensor
           `train/target` [1, K] holds every head's targets back to back, a class index as one float)
`loss_sum(l0, l1, ...) -> loss` adds the heads' weighted losses in head order (several heads only).

The C kernels are kernels_c/tt_loss.c, with the same operation order (float32, -ffp-contract=off).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.stages import ops
from tinytrain.stages.ops.training import LOSS_SUM

F32 = np.float32
# The loss names and their ops are the registry's (stages/ops/training.py: OpDef.loss; OpDef.dropped_by).
LOSS_OPS = ops.LOSS_OPS
LOSSES = tuple(LOSS_OPS)
HUBER_DELTA = 1.0
# The activation a loss on logits drops from the end of its head (it is for inference only).
DROPS = ops.LOSS_DROPS


class LossError(UserError):
    """train.outputs / train.loss cannot train this model's outputs."""


@dataclass(frozen=True)
class Head:
    """One trained output: the model output tensor `name`, its loss and weight."""

    name: str
    loss: str
    weight: float = 1.0


def heads_from(loss: Any, outputs: list[str]) -> list[Head]:
    """The heads to train: `loss` is a loss name (the model's single output, weight 1) or a list of heads
    (Head, or mappings with name, loss and optional weight, as the spec's train.outputs)."""
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise LossError(f"unknown loss {loss!r}", hint=f"choose one of {', '.join(LOSSES)}")
        if len(outputs) != 1:
            raise LossError(f"the model has {len(outputs)} outputs ({', '.join(outputs)}): name the one(s) to train "
                            f"in train.outputs",
                            hint=f"e.g. train.outputs: [{{name: {outputs[0]}, loss: {loss}}}]")
        return [Head(outputs[0], loss)]
    heads = [h if isinstance(h, Head) else Head(str(_get(h, "name")), str(_get(h, "loss")),
                                                 float(_get(h, "weight", 1.0)))
             for h in loss]
    if not heads:
        raise LossError("train.outputs is empty: name at least one output to train")
    seen: set[str] = set()
    for h in heads:
        if h.loss not in LOSSES:
            raise LossError(f"output {h.name!r}: unknown loss {h.loss!r}", hint=f"choose one of {', '.join(LOSSES)}")
        if h.name not in outputs:
            near = difflib.get_close_matches(h.name, outputs, n=1)
            raise LossError(f"train.outputs names {h.name!r}, which is not an output of the model "
                            f"(outputs: {', '.join(outputs)})",
                            hint=f"did you mean {near[0]!r}?" if near else None)
        if h.name in seen:
            raise LossError(f"train.outputs names {h.name!r} twice")
        if not (np.isfinite(h.weight) and h.weight > 0):
            raise LossError(f"output {h.name!r}: weight must be a positive number, got {h.weight}")
        seen.add(h.name)
    return heads


def loss_config(config: Any) -> str | list[Head]:
    """What build_training_graph trains for a stage's config slice: the heads of `train.outputs` when given, else
    `train.loss` (default cross_entropy) on the model's single output."""
    outs = config.get("train.outputs")
    if outs:
        return [Head(str(_get(o, "name")), str(_get(o, "loss")), float(_get(o, "weight", 1.0))) for o in outs]
    return str(config.get("train.loss") or "cross_entropy")


def _get(h: Any, key: str, default: Any = None) -> Any:
    v = h.get(key, default) if isinstance(h, dict) else getattr(h, key, default)
    if v is None:
        raise LossError(f"train.outputs entry {h!r} has no {key}")
    return v


def check_fits(head: Head, dtype: str, shape: list[int], producer: str | None) -> None:
    """A loss must fit its output: real values (float32, or int8 with a scale), a class axis for cross-entropy,
    logits (not probabilities) for bce."""
    what = f"output {head.name!r} ({dtype} {list(shape)})"
    if dtype not in ("float32", "int8"):
        raise LossError(f"loss {head.loss} does not fit {what}: losses train real-valued outputs (float32 or int8), "
                        f"not {dtype}", hint="train the tensor that produces it")
    if head.loss == "cross_entropy" and (not shape or int(shape[-1]) < 2):
        raise LossError(f"loss cross_entropy does not fit {what}: it needs class scores on the last axis (>= 2)",
                        hint="use bce for a single logit, or mse / huber for values")
    # Losses on logits must not read another logit loss's probabilities (mse / huber may: e.g. the Brier score on
    # a softmax).
    other = next((loss for loss, act in DROPS.items() if act == producer), None)
    if head.loss in DROPS and other is not None and other != head.loss:
        raise LossError(f"loss {head.loss} does not fit {what}: it is a {producer}'s probabilities, {head.loss} takes "
                        f"logits", hint=f"use {other} for a {producer} output")


def target_size(loss: str, shape: list[int]) -> int:
    """Floats a head takes in the shared target row of one sample: one class index, or one value per element."""
    n = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else int(np.prod(shape, dtype=np.int64))
    return 1 if loss == "cross_entropy" else n


# ---- golden model -------------------------------------------------------------------------------------------

def _rows(y: np.ndarray) -> tuple[int, int]:
    return (int(y.shape[0]), int(np.prod(y.shape[1:], dtype=np.int64))) if y.ndim > 1 else (1, int(y.size))


def bce_logits_loss(z: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: mean over its elements of max(z, 0) - z t + log(1 + e^-|z|) (stable for any z), summed over
    the samples; dz = (sigmoid(z) - t) / per with sigmoid from the same e^-|z|. Float32 in tt_bce_logits_f32's
    order (the loss of one sample is summed sequentially)."""
    z = np.asarray(z, F32)
    t = np.asarray(target, F32).reshape(z.shape)
    rows, per = _rows(z)
    e = np.exp(-np.abs(z)).astype(F32)
    one = F32(1)
    terms = (np.maximum(z, F32(0)) - (z * t).astype(F32) + np.log((one + e).astype(F32)).astype(F32)).astype(F32)
    s = np.where(z >= 0, one / (one + e), e / (one + e)).astype(F32)
    dz = ((s - t).astype(F32) / F32(per)).astype(F32)
    return _sum_rows(terms, rows, per), dz


def huber_loss(y: np.ndarray, target: np.ndarray, delta: float = HUBER_DELTA) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: mean over its elements of 0.5 d^2 where |d| <= delta, else delta (|d| - delta / 2); summed over
    the samples; dy = clip(d, -delta, delta) / per."""
    y = np.asarray(y, F32)
    t = np.asarray(target, F32).reshape(y.shape)
    rows, per = _rows(y)
    dl = F32(delta)
    d = (y - t).astype(F32)
    a = np.abs(d)
    terms = np.where(a <= dl, (F32(0.5) * d).astype(F32) * d, dl * (a - F32(0.5) * dl).astype(F32)).astype(F32)
    dy = (np.clip(d, -dl, dl) / F32(per)).astype(F32)
    return _sum_rows(terms, rows, per), dy


def _sum_rows(terms: np.ndarray, rows: int, per: int) -> np.ndarray:
    """sum over rows of (sequential sum of the row's terms) / per, in float32 (the C kernels' order)."""
    t = terms.reshape(rows, per)
    loss = F32(0)
    for r in range(rows):
        acc = F32(0)
        for v in t[r]:
            acc = F32(acc + v)
        loss = F32(loss + F32(acc / F32(per)))
    return np.asarray(loss, F32)


def weighted(loss: np.ndarray, grad: np.ndarray, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """A head's weight applied after its loss kernel: float32 products (codegen emits the same)."""
    w = F32(weight)
    return np.asarray(F32(loss) * w, F32), (np.asarray(grad, F32) * w).astype(F32)


def loss_sum(parts: list[np.ndarray]) -> np.ndarray:
    total = F32(0)
    for p in parts:
        total = F32(total + F32(p))
    return np.asarray(total, F32)


def run_loss_op(op: Any, v, kernel, class_target: bool = False) -> list[np.ndarray]:
    """The golden model of a loss op (its numpy `kernel(pred, target) -> (loss, grad)`, the op module's) with its
    offset and weight attrs; `v(j)` is the value of input j. `class_target`: the head's target is one class index
    (a float in a shared target row: several heads)."""
    pred, target = np.asarray(v(0)), np.asarray(v(1))
    off = op.attrs.get("offset")
    if off is not None:  # several heads: this head's slice of the shared target row
        n = 1 if class_target else target_size("mse", list(pred.shape))
        target = target.reshape(-1)[int(off):int(off) + n]
        if class_target:
            target = target.astype(np.int32)
    loss, grad = kernel(pred, target)
    if "weight" in op.attrs:
        loss, grad = weighted(loss, grad, float(op.attrs["weight"]))
    return [loss, grad]


# ---- the training graph's heads (used by stages/autodiff.py) -------------------------------------------------

def head_tensors(g: Any, fwd: list, heads: list[Head]) -> tuple[dict[str, str], set[int]]:
    """(output -> the tensor its loss reads, the forward ops dropped): a float-I/O model's final dequantize of an
    int8 head and an inference-only softmax / logistic before a loss on logits are dropped; each head is checked
    against its loss."""
    readers: dict[str, int] = {}
    for op in fwd:
        for t in op.inputs:
            if t is not None:
                readers[t] = readers.get(t, 0) + 1
    producers = {t: i for i, op in enumerate(fwd) for t in op.outputs}
    head_of: dict[str, str] = {}
    drop: set[int] = set()

    def droppable(i: int | None, kind: str) -> bool:
        return i is not None and fwd[i].type == kind and readers.get(fwd[i].outputs[0], 0) == 0

    def conversion(i: int | None) -> bool:
        return i is not None and fwd[i].type in ops.CONVERSION_OPS and readers.get(fwd[i].outputs[0], 0) == 0

    for h in heads:
        t = h.name
        i = producers.get(t)
        if conversion(i) and g.tensors[fwd[i].inputs[0]].dtype == "int8":  # (int8 in: a dequantize)
            # Float I/O (quantize.io: float): the loss dequantizes the int8 head itself.
            drop.add(i)
            t = fwd[i].inputs[0]
            i = producers.get(t)
        check_fits(h, g.tensors[t].dtype, list(g.tensors[t].shape), fwd[i].type if i is not None else None)
        if DROPS.get(h.loss) and droppable(i, DROPS[h.loss]):
            op = fwd[i]
            if float(op.attrs.get("beta", 1.0)) != 1.0:  # softmax's (a logistic has no beta)
                raise NotImplementedError("cross-entropy on a softmax with beta != 1")
            drop.add(i)
            t = op.inputs[0]
        head_of[h.name] = t
    return head_of, drop


def prepare_heads(g: Any, fwd: list, heads: list[Head]) -> tuple[list, dict[str, str]]:
    """The training forward for `heads`: the ops head_tensors keeps, then those that reach no trained head are
    pruned (outputs not trained cost nothing). Returns (ops, output -> tensor)."""
    head_of, drop = head_tensors(g, fwd, heads)
    kept = [op for i, op in enumerate(fwd) if i not in drop]
    live = set(head_of.values())
    out, pruned = [], []
    for op in reversed(kept):
        if any(o in live for o in op.outputs):
            out.append(op)
            live.update(x for x in op.inputs if x is not None)
        else:
            pruned.append(op)
    used = {t for op in out for t in op.inputs + op.outputs if t is not None} | set(g.inputs)
    for op in pruned:  # their tensors (an untrained output's weights and activations) leave the program
        for t in op.inputs + op.outputs:
            if t is not None and t not in used:
                g.tensors.pop(t, None)
    return out[::-1], head_of


def target_input(heads: list[Head], shapes: dict[str, list[int]]) -> tuple[str, list[int], str]:
    """(name, shape, dtype) of the training step's target input, given each head's shape (the tensor its loss
    reads). One head: `train/labels` int32 [1] (cross_entropy) or `train/target` shaped like the head. Several: one
    float32 row `train/target` [1, K] holding every head's targets back to back (target_size)."""
    if len(heads) == 1:
        h = heads[0]
        return ("train/labels", [1], "int32") if h.loss == "cross_entropy" else \
            ("train/target", list(shapes[h.name]), "float32")
    return "train/target", [1, sum(target_size(h.loss, shapes[h.name]) for h in heads)], "float32"


def emit_losses(b: Any, heads: list[Head], head_of: dict[str, str], deq: Any,
                contrib: dict[str, list[str]]) -> tuple[str, str, str]:
    """The loss ops of `heads` into builder `b` (autodiff's _Builder), int8 heads dequantized by `deq`
    (backward.Dequantizer); each head's gradient goes to `contrib`.
    One head: `train/labels` int32 [1] (cross_entropy) or `train/target` shaped like the head, the loss op writes
    `train/loss`. Several: one float32 target row `train/target` [1, K], per head a loss op with its offset,
    then loss_sum. Returns (target input, loss tensor, the first head's float prediction)."""
    g = b.g
    single = len(heads) == 1
    # The loss reads real values: an int8 head is dequantized first (its gradient is that of the real value).
    ins = [deq.real_now(head_of[h.name]) for h in heads]
    loss_t = b.tensor("train/loss", [], role="output")
    name, shape, dtype = target_input(heads, {h.name: list(g.tensors[head_of[h.name]].shape) for h in heads})
    lab = b.tensor(name, shape, role="input", dtype=dtype)
    parts, off = [], 0
    for h, x in zip(heads, ins):
        t = head_of[h.name]
        attrs: dict[str, Any] = {}
        if not single:
            attrs["offset"] = off
            off += target_size(h.loss, list(g.tensors[t].shape))
        if h.weight != 1.0:
            attrs["weight"] = float(h.weight)
        out = loss_t if single else b.tensor(f"train/loss/{h.name}", [], role="activation")
        grad = b.tensor(f"grad/{t}" if single else f"grad/{t}#loss", g.tensors[t])
        contrib.setdefault(t, []).append(grad)
        b.emit(LOSS_OPS[h.loss], [x, lab], [out, grad], **attrs)
        parts.append(out)
    if not single:
        b.emit(LOSS_SUM, parts, [loss_t])
    return lab, loss_t, ins[0]
