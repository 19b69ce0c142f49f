"""The contribution analysis' measurement: float fine-tuning of one plan, scored on held-out train samples.

`make_measure(graph, ds, settings, loss)` returns `measure(plan) -> {value: ...}`: the int8 graph dequantized to
float (`dequantize_graph`), the plan fine-tuned with SGD, batch 1, for `settings.steps` steps on a seeded tuning
split of the TRAIN data, and scored on a disjoint held-out split (`holdout_split`). What is trained and scored is
the build's task (`Task`, from the data and train.loss / train.outputs):
  classification  cross-entropy; value "accuracy": top-1 on the held-out samples
  regression      mse; value "mse": per sample the mean over the outputs, then the mean over the samples
  outputs         the heads of train.outputs (several outputs, each with its loss and weight, stages/train/losses.py);
                  value "loss": the spec's total weighted loss over the trained heads (per sample the sum of
                  weight x the head's loss, then the mean over the samples), the quantity training lowers
A diverged run (non-finite predictions) scores inf (regression, outputs) or counts as wrong (classification).
The ops before the first trained layer are run once per sample set and cached (frozen_prefix.py); float conv2d,
depthwise and 1x1 gradients use fast_float.py.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.golden import fast_float
from tinytrain.stages.planning.frozen_prefix import FrozenPrefix
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.quant.dequantize import dequantize_graph
from tinytrain.stages.train.losses import DROPS, Head, heads_from
from tinytrain.stages.planning.train_plan import TrainPlan

EVAL_BATCH = 64
Measure = Callable[[TrainPlan | None], dict[str, float]]


class ContributionError(UserError):
    """Contribution analysis cannot run on this model or data."""


@dataclass(frozen=True)
class AnalysisSettings:
    samples: int = 256
    eval_samples: int = 256
    steps: int | None = None
    learning_rate: float = 0.01
    seed: int = 0
    max_layers: int | None = None

    @classmethod
    def from_spec(cls, spec: Any) -> "AnalysisSettings":
        if spec is None:
            return cls()
        d = spec if isinstance(spec, dict) else spec.model_dump()
        return cls(**{k: d[k] for k in asdict(cls()) if k in d})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def unit_json(self) -> dict[str, Any]:
        """What changes a unit's result: not max_layers (it only says which units exist)."""
        d = asdict(self)
        d.pop("max_layers")
        return d


# ---- the task: what a unit trains and how it is scored ---------------------------------------------------------

@dataclass
class Task:
    """What the analysis trains and scores for a build: `kind` classification / regression / outputs; `loss`,
    build_training_graph's (a loss name, or the heads of train.outputs named by the float graph's tensors);
    `y` the train split's targets (class labels, float rows [N, K], or the heads' target rows back to back)."""

    kind: str
    loss: str | list[Head]
    y: np.ndarray
    heads: list[Head] | None = None
    data: Any = None        # the dataset the targets are of (single-output tasks: after single_target)

    @property
    def value(self) -> str:
        return {"classification": "accuracy", "regression": "mse", "outputs": "loss"}[self.kind]

    def key_json(self) -> Any:
        """What, besides the data, changes a unit of this task: the heads trained (names, losses, weights)."""
        return None if self.heads is None else [[h.name, h.loss, h.weight] for h in self.heads]


def task_of(graph: Graph, ds, loss: Any = None) -> Task:
    """The Task of `graph` (int8 or float: output names are the quantize graph's) trained on `ds` with `loss`
    (train.loss, a list of heads from train.outputs, or None: the data decides). Checks that the data and the loss
    agree (`check_model`: that the model's output fits them)."""
    from tinytrain.stages.train.data import single_target, target_rows

    if isinstance(loss, (list, tuple)):
        heads = heads_from(list(loss), list(graph.outputs))
        layout = [{"output": h.name, "loss": h.loss, "shape": list(graph.tensors[h.name].shape)} for h in heads]
        y, _ = target_rows(ds, layout)
        return Task("outputs", heads, y, heads)
    if getattr(ds, "task", None) == "outputs":      # one output trained with train.loss from named-output data
        ds = single_target(ds, classification=(loss or "cross_entropy") == "cross_entropy")
    check_task(ds, loss)
    if ds.regression:
        return Task("regression", "mse", ds.y_train, data=ds)
    return Task("classification", "cross_entropy", ds.y_train, data=ds)


def check_model(graph: Graph, task: Task) -> None:
    """The model's input and output fit the task's data: one value per regression target, a class vector with a
    class per label (named outputs were checked against their heads by task_of)."""
    from tinytrain.stages.train.data import check_compatible

    if task.heads is not None:
        return
    in_shape = graph.tensors[graph.inputs[0]].shape
    if task.kind == "regression":
        check_compatible(task.data, in_shape, outputs_per_sample(graph))
        return
    k = num_classes(graph)
    if k is None:
        raise ContributionError("scheme auto scores options by classification accuracy, but the model's output "
                                f"{graph.tensors[graph.outputs[0]].shape} is not a class vector",
                                hint="use scheme manual, last_k or bias_only for this model, or for a model that "
                                     "predicts values: data.task: regression with train.loss: mse")
    check_compatible(task.data, in_shape, k)


def holdout_split(ds, settings: AnalysisSettings, y: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_tune, y_tune, x_eval, y_eval): disjoint, seeded subsets of the TRAIN split (targets `y`, default the
    data's y_train)."""
    y = ds.y_train if y is None else y
    n = len(ds.x_train)
    if n < 2:
        raise ContributionError(f"contribution analysis needs at least 2 train samples, the data has {n}")
    want = settings.samples + settings.eval_samples
    n_eval = settings.eval_samples if n >= want else max(1, round(n * settings.eval_samples / want))
    n_tune = min(settings.samples, n - n_eval)
    perm = np.random.default_rng(settings.seed).permutation(n)
    ev, tu = np.sort(perm[:n_eval]), np.sort(perm[n_eval:n_eval + n_tune])
    return ds.x_train[tu], y[tu], ds.x_train[ev], y[ev]


def num_classes(graph: Graph) -> int | None:
    shape = graph.tensors[graph.outputs[0]].shape
    return int(shape[-1]) if len(graph.outputs) == 1 and len(shape) in (1, 2) and shape[-1] > 1 else None


def outputs_per_sample(graph: Graph) -> int:
    """Values the (single) output holds per sample: the regression targets it must match."""
    if len(graph.outputs) != 1:
        raise ContributionError(f"regression data (data.task: regression) gives one target array, but the model "
                                f"has {len(graph.outputs)} outputs ({', '.join(graph.outputs)})",
                                hint="name the outputs to train in train.outputs, with data.task: outputs (one "
                                     "y_<output> array each)")
    shape = [int(d) for d in graph.tensors[graph.outputs[0]].shape]
    return int(np.prod(shape[1:] if len(shape) > 1 else shape, dtype=np.int64))


def check_task(ds, loss: str | None) -> None:
    """The data's task and the build's training loss must agree (emulate-run refuses the mix too): regression
    targets train with mse, class labels with cross_entropy. `loss` None: not known here (the contribution stage
    does not read it) — the data decides."""
    if loss is None:
        return
    if loss == "mse" and not ds.regression:
        raise ContributionError("train.loss is mse, but the data are class labels: scheme auto would score options "
                                "by the MSE of float targets the data does not have",
                                hint="for regression set data.task: regression (npz with float y [N, outputs]); "
                                     "for classification use train.loss: cross_entropy")
    if loss != "mse" and ds.regression:
        raise ContributionError(f"data.task is regression (float targets), but train.loss is {loss}: regression "
                                "trains (and scheme auto scores options) with the mse loss",
                                hint="set train.loss: mse")


# ---- the measurement ---------------------------------------------------------------------------------------------

def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread. The analysis trains with batch 1: its products are small,
    and a second BLAS thread only spins waiting for work — on a busy 2-core machine (MobileNetV2, a 21-layer bias
    unit) that costs 8x the CPU time and 6x the wall time of one thread, for the same result."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def make_measure(graph: Graph, ds, settings: AnalysisSettings, loss: Any = None) -> Measure:
    """The real measurement: float fine-tuning of `plan` on the tuning split, scored on the eval split (see the
    module docstring; `loss` as for task_of)."""
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.golden.train_step import train

    task = task_of(graph, ds, loss)
    check_model(graph, task)
    fg = dequantize_graph(graph)
    heads = _float_heads(graph, fg, task)
    x_tu, y_tu, x_ev, y_ev = holdout_split(ds, settings, task.y)
    steps = settings.steps or len(x_tu)
    opt = OptimizerSpec(kind="sgd", learning_rate=settings.learning_rate)
    train_loss = heads if heads is not None else task.loss
    # The ops before a unit's first trained layer compute the same values in every unit: run them once per sample
    # (batched) and train / score only the suffix from the deepest single-tensor cut before that layer.
    prefix = FrozenPrefix(fg, {"tune": x_tu, "eval": x_ev})

    def measure(plan: TrainPlan | None) -> dict[str, float]:
        with one_blas_thread():
            return _measure(plan)

    def warm() -> None:
        """Fill the frozen prefix's cached activations of both sample sets now (as a unit would, on one BLAS
        thread: the same bits): contribution.parallel_measure's workers then share them instead of each filling
        its own."""
        with one_blas_thread():
            for which in ("tune", "eval"):
                prefix.activations(prefix.cuts[-1], which)

    measure.warm = warm  # type: ignore[attr-defined]

    def _measure(plan: TrainPlan | None) -> dict[str, float]:
        params: dict[str, np.ndarray] = {}
        out: dict[str, float] = {}
        trained = [] if plan is None else [_weight_of(fg, lp.layer) for lp in plan.layers]
        cut = prefix.cut_before(prefix.first_trained_op(trained))
        sg = prefix.suffix(cut)
        if plan is not None:
            tg = build_training_graph(sg, plan, train_loss, opt, 1)
            with np.errstate(all="ignore"):       # a diverging run overflows; it is scored, not reported
                losses, state = train(tg, prefix.activations(cut, "tune"), y_tu, steps=steps, seed=settings.seed,
                                      forward_op=fast_float.run_op, backward_op=fast_float.backward_op)
            params = {n: state[n] for n in tg.meta["train"]["trained"]}
            tail = losses[-max(1, len(losses) // 10):]
            if np.all(np.isfinite(tail)):         # a diverged run is scored by its (poor) result; JSON has no NaN
                out["train_loss"] = float(np.mean(tail))
        x = prefix.activations(cut, "eval")
        if task.kind == "outputs":
            out["loss"] = evaluate_heads(sg, params, x, y_ev, heads)
        elif task.kind == "regression":
            out["mse"] = evaluate_mse(sg, params, x, y_ev)
        else:
            out["accuracy"] = evaluate(sg, params, x, y_ev)
        return out

    return measure


def _float_heads(graph: Graph, fg: Graph, task: Task) -> list[Head] | None:
    """The task's heads named by the float graph's outputs (dequantize_graph drops a final DEQUANTIZE, so an
    output may be named by its int8 source there)."""
    if task.heads is None:
        return None
    name = dict(zip(graph.outputs, fg.outputs))
    return [Head(name[h.name], h.loss, h.weight) for h in task.heads]


def _weight_of(fg: Graph, layer: int | str) -> str:
    """A plan layer's weight tensor name (plans here name layers by weight tensor; an op index also works)."""
    return fg.ops[layer].inputs[1] if isinstance(layer, int) else layer


def _with_params(fg: Graph, params: dict[str, np.ndarray], outputs: list[str] | None = None) -> Graph:
    g = Graph(tensors=dict(fg.tensors), ops=fg.ops, inputs=fg.inputs, outputs=outputs or fg.outputs, meta=fg.meta)
    for name, arr in params.items():
        g.tensors[name] = copy.copy(fg.tensors[name])
        g.tensors[name].data = np.asarray(arr, np.float32)
    return g


def evaluate(fg: Graph, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of float graph `fg` with `params` (tensor name -> array) substituted."""
    g = _with_params(fg, params)
    correct = 0
    for i in range(0, len(x), EVAL_BATCH):
        outs = fast_float.run_graph(g, {g.inputs[0]: x[i:i + EVAL_BATCH].astype(np.float32)})
        pred = np.asarray(outs[g.outputs[0]]).reshape(len(x[i:i + EVAL_BATCH]), -1)
        if not np.all(np.isfinite(pred)):
            continue      # a diverged run: count its samples as wrong
        correct += int(np.sum(np.argmax(pred, axis=1) == y[i:i + EVAL_BATCH]))
    return correct / max(1, len(x))


def evaluate_mse(fg: Graph, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of float graph `fg` with `params` substituted: per sample the mean over its outputs (the
    mse loss's and the device's test MSE's definition), then the mean over the samples; inf when any prediction
    (or the result) is not finite (a diverged run)."""
    return evaluate_heads(fg, params, x, y, [Head(fg.outputs[0], "mse")])


def evaluate_heads(fg: Graph, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                   heads: list[Head]) -> float:
    """The total weighted loss of `heads` (the losses of stages/train/losses.py, in float64) of float graph `fg` with
    `params` substituted, per sample, averaged over the samples; `y` the heads' target rows back to back (a class
    index as one value). A loss on logits reads the input of the head's final softmax / logistic, as training
    does. inf when any prediction (or the result) is not finite (a diverged run)."""
    producer = {t: op for op in fg.ops for t in op.outputs}
    reads = []
    for h in heads:
        op = producer.get(h.name)
        drop = DROPS.get(h.loss)
        reads.append(op.inputs[0] if op is not None and drop is not None and op.type == drop else h.name)
    g = _with_params(fg, params, list(dict.fromkeys(reads)))
    total = 0.0
    with np.errstate(all="ignore"):
        for i in range(0, len(x), EVAL_BATCH):
            n = len(x[i:i + EVAL_BATCH])
            outs = fast_float.run_graph(g, {g.inputs[0]: x[i:i + EVAL_BATCH].astype(np.float32)})
            t = np.asarray(y[i:i + EVAL_BATCH], np.float64).reshape(n, -1)
            off = 0
            for h, r in zip(heads, reads):
                pred = np.asarray(outs[r], np.float64).reshape(n, -1)
                if not np.all(np.isfinite(pred)):
                    return float("inf")
                width = 1 if h.loss == "cross_entropy" else pred.shape[1]
                total += h.weight * float(np.sum(_per_sample_loss(h.loss, pred, t[:, off:off + width])))
                off += width
        value = total / max(1, len(x))
    return value if math.isfinite(value) else float("inf")


def _per_sample_loss(loss: str, z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per-sample loss [n] (float64) of predictions z [n, m] against targets t ([n, m]; a class index [n, 1])."""
    if loss == "cross_entropy":
        m = z.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.sum(np.exp(z - m), axis=1))
        return lse - z[np.arange(len(z)), t[:, 0].astype(np.int64)]
    d = z - t
    if loss == "mse":
        return np.mean(d * d, axis=1)
    if loss == "bce":
        return np.mean(np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z))), axis=1)
    if loss == "huber":
        from tinytrain.stages.train.losses import HUBER_DELTA
        a = np.abs(d)
        return np.mean(np.where(a <= HUBER_DELTA, 0.5 * d * d, HUBER_DELTA * (a - 0.5 * HUBER_DELTA)), axis=1)
    raise ContributionError(f"contribution analysis cannot score loss {loss!r}")
