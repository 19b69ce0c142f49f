"""Analytic memory model of sparse-update options, in bytes (DESIGN §3, §6).

The search in `sparse-plan` prices thousands of candidate plans, so it cannot run the exact planner of the
`reorder` stage (stages/memplan.py) on each; this model is a fast estimate with the same ingredients, meant to be
an upper bound of the reordered peak (it ignores in-place reuse that reorder finds). All sizes come from the
graph's own tensors: int8 activations and weights count 1 byte per element, int32 biases 4, fp32 everything
else 4 (a float model's activations and weights count 4).

Training memory of a plan = bias/region term + one weight term per layer whose weights train:

  region term of the earliest trained layer e (for the `auto` search: "the last k layers' biases")
    activations          max(forward peak, gradient peak). The forward peak is the largest live set of
                         activations of the inference schedule (graph input included). The gradient peak is the
                         largest live set of fp32 activation-gradient buffers when backward runs in reverse op
                         order from the loss down to e: a gradient buffer lives from its first contribution
                         (fan-out contributions accumulate in place) until the op that produced the tensor has
                         consumed it; the ReLU mask is applied in place. Forward transients and gradient buffers are
                         never live at the same time (backward starts once the forward is done), hence the max.
    saved activations    what backward ops below the loss read besides gradients: the output y of every op with
                         a fused or standalone ReLU/ReLU6 between the loss and e (its mask; stored as the
                         activation, int8 for int8 models — a 1-bit mask would cut this 8x), max-pool inputs,
                         and non-final softmax outputs, each once.
    bias parameters      per trained bias of C_out channels: the SRAM copy (int32: 4 bytes, as stored), the fp32
                         gradient, optimizer state (fp32 x 0 sgd, 1 momentum, 2 adam, 1 rmsprop), an fp32
                         accumulator when batch_size > 1, an fp32 master copy when qas.master_copy.
  weight term of layer l at ratio r, n = ceil(r·C_in) input channels (the first ones, DESIGN §6):
    saved input          the first n channels of the layer's input activation, kept from forward to backward
                         (dW only needs those channels): H·W·n elements (fully connected: n) at the activation's
                         itemsize.
    trainable copy       the trained weight slice (O·KH·KW·n for conv2d, KH·KW·n·M for depthwise, O·n for fully
                         connected) copied to SRAM at the weight's itemsize; frozen weights stay in flash.
    gradient, state      fp32 gradient of the slice, optimizer state, accumulator and master copy as for biases.

Why this shape: for a fixed earliest layer e every weight term is independent of the others, so
total = region(e) + sum of weight terms is additive and an exact knapsack over it is possible (plan_search.py).
What it does not count: the optimizer's step counter (4 bytes for Adam), labels (4 bytes), code and stack
(those are the board's `runtime_reserve_bytes`), and savings from reordering (reorder reports the exact peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from tinytrain.stages.ir import Graph
from tinytrain.stages.train_plan import RATIOS, TrainPlan, _has_bias, _in_channels

FP32 = 4
OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "adam": 2, "rmsprop": 1}
WEIGHT_RATIOS = tuple(r for r in RATIOS if r > 0)
_INT_PARAMS = ("int8", "int16", "int32", "uint8")


@dataclass(frozen=True)
class MemorySettings:
    """What besides the plan changes training memory (autodiff's and the optimizer's choices)."""

    optimizer: str = "sgd"
    batch_size: int = 1
    master_copy: bool = False

    def __post_init__(self):
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"unknown optimizer {self.optimizer!r}")

    def to_json(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "batch_size": int(self.batch_size), "master_copy": bool(self.master_copy)}


@dataclass(frozen=True)
class Layer:
    """A trainable layer of the graph."""

    op_index: int
    type: str
    weight: str
    bias: str | None
    c_in: int
    c_out: int
    name: str          # short, readable: the weight tensor's name up to the first ';'

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op_index, "type": self.type, "name": self.name, "weight": self.weight,
                "bias": self.bias, "c_in": self.c_in, "c_out": self.c_out}


def channels(c_in: int, ratio: float) -> int:
    """Input channels trained at `ratio` (the rule of train_plan.resolve)."""
    return int(math.ceil(ratio * c_in - 1e-9))


def short_name(name: str) -> str:
    return name.split(";")[0]


def _numel(shape: Iterable[int]) -> int:
    return int(np.prod(list(shape), dtype=np.int64))


class MemoryModel:
    """Memory of every option of one graph under one MemorySettings."""

    def __init__(self, graph: Graph, settings: MemorySettings = MemorySettings()):
        self.g = graph
        self.s = settings
        self.layers = [self._layer(i) for i in TrainPlan.trainable_ops(graph)]
        self.by_op = {lay.op_index: lay for lay in self.layers}
        self._consumers = graph.consumers()
        self._head_ops = self._loss_head()
        self.forward_peak = self._forward_peak()
        self._region_cache: dict[int, dict[str, int]] = {}

    # ---- per-element costs ---------------------------------------------------------------------------
    def _per_param(self, dtype: str) -> dict[str, int]:
        """Bytes per trained parameter element, by component."""
        st = OPTIMIZER_STATE[self.s.optimizer]
        return {"copy": int(np.dtype(dtype).itemsize),
                "gradient": FP32,
                "optimizer_state": FP32 * st,
                "accumulator": FP32 if self.s.batch_size > 1 else 0,
                "master_copy": FP32 if self.s.master_copy and dtype in _INT_PARAMS else 0}

    def _layer(self, i: int) -> Layer:
        op = self.g.ops[i]
        w = self.g.tensors[op.inputs[1]]
        y = self.g.tensors[op.outputs[0]]
        return Layer(i, op.type, w.name, op.inputs[2] if _has_bias(self.g, i) else None, _in_channels(self.g, i),
                     int(y.shape[-1]), short_name(w.name))

    # ---- weight option ----------------------------------------------------------------------------------
    def weight_cost(self, op_index: int, ratio: float) -> dict[str, int]:
        """Bytes of training layer `op_index`'s weights at `ratio` (0 -> all zero)."""
        lay = self.by_op[op_index]
        n = channels(lay.c_in, ratio)
        w = self.g.tensors[lay.weight]
        x = self.g.tensors[self.g.ops[op_index].inputs[0]]
        n_w = _numel(w.shape) // lay.c_in * n
        n_x = _numel(x.shape) // int(x.shape[-1]) * n
        per = self._per_param(w.dtype)
        out = {"channels": n, "params": n_w,
               "saved_input": n_x * int(np.dtype(x.dtype).itemsize),
               "weight_copy": n_w * per["copy"], "gradient": n_w * per["gradient"],
               "optimizer_state": n_w * per["optimizer_state"], "accumulator": n_w * per["accumulator"],
               "master_copy": n_w * per["master_copy"]}
        out["total"] = sum(v for k, v in out.items() if k not in ("channels", "params"))
        return out

    def bias_param_cost(self, op_index: int) -> dict[str, int]:
        lay = self.by_op[op_index]
        if lay.bias is None:
            return {"params": 0, "total": 0}
        b = self.g.tensors[lay.bias]
        n = _numel(b.shape)
        per = self._per_param(b.dtype)
        out = {"params": n, **{("bias_copy" if k == "copy" else k): n * v for k, v in per.items()}}
        out["total"] = sum(v for k, v in out.items() if k != "params")
        return out

    # ---- region (gradient flow down to the earliest trained layer) -------------------------------------
    def region_cost(self, earliest: int) -> dict[str, int]:
        """Activations (max of forward and gradient peaks) and saved activations when the gradient flows from
        the loss down to op `earliest` and every trainable op at or after it may be trained."""
        if earliest not in self._region_cache:
            trained = {lay.op_index for lay in self.layers if lay.op_index >= earliest}
            grad_peak, saved = self._backward(trained)
            self._region_cache[earliest] = {"forward_peak": self.forward_peak, "gradient_peak": grad_peak,
                                            "activations": max(self.forward_peak, grad_peak),
                                            "saved_activations": saved}
        return dict(self._region_cache[earliest])

    def bias_option(self, k: int) -> dict[str, Any]:
        """The `auto` search's bias option: biases of the last k trainable layers (their gradients flow down to
        the k-th last layer)."""
        chosen = self.layers[len(self.layers) - k:]
        region = self.region_cost(chosen[0].op_index)
        params = sum(self.bias_param_cost(lay.op_index)["total"] for lay in chosen)
        total = region["activations"] + region["saved_activations"] + params
        return {"k": k, "earliest_op": chosen[0].op_index, "earliest": chosen[0].name,
                "biases": sum(lay.bias is not None for lay in chosen), **region, "bias_params": params,
                "total": total}

    # ---- a whole plan ---------------------------------------------------------------------------------------
    def estimate(self, plan: TrainPlan) -> dict[str, Any]:
        """Breakdown and total of an arbitrary (resolved) plan."""
        layers = plan.resolve(self.g)
        trained_ops = [r.op_index for r in layers if r.train_bias or r.in_channels > 0]
        if not trained_ops:
            return {"total": 0, "activations": 0, "saved_activations": 0, "bias_params": 0, "weights": 0,
                    "per_layer": []}
        region = self._region_for(set(trained_ops))
        rows = []
        for r in layers:
            b = self.bias_param_cost(r.op_index)["total"] if r.train_bias else 0
            w = self.weight_cost(r.op_index, r.weight_ratio) if r.in_channels > 0 else {"total": 0, "channels": 0}
            rows.append({"op": r.op_index, "name": self.by_op[r.op_index].name, "bias": b,
                         "weight_ratio": r.weight_ratio, "channels": w["channels"], "weight": w["total"]})
        bias = sum(row["bias"] for row in rows)
        weights = sum(row["weight"] for row in rows)
        total = region["activations"] + region["saved_activations"] + bias + weights
        return {"total": int(total), **region, "bias_params": bias, "weights": weights, "per_layer": rows}

    def _region_for(self, trained: set[int]) -> dict[str, int]:
        grad_peak, saved = self._backward(trained)
        return {"forward_peak": self.forward_peak, "gradient_peak": grad_peak,
                "activations": max(self.forward_peak, grad_peak), "saved_activations": saved}

    def table(self) -> dict[str, Any]:
        """Memory of every option (memory.json)."""
        return {
            "settings": self.s.to_json(),
            "forward_peak": self.forward_peak,
            "layers": [lay.to_json() for lay in self.layers],
            "bias_options": [self.bias_option(k) for k in range(1, len(self.layers) + 1)],
            "weight_options": [{"op": lay.op_index, "name": lay.name, "ratio": r, **self.weight_cost(lay.op_index, r)}
                               for lay in self.layers for r in WEIGHT_RATIOS],
        }

    # ---- schedules ------------------------------------------------------------------------------------------
    def _act_bytes(self, name: str, fp32: bool = False) -> int:
        t = self.g.tensors[name]
        return _numel(t.shape) * (FP32 if fp32 else int(np.dtype(t.dtype).itemsize))

    def _is_activation(self, name: str | None) -> bool:
        return name is not None and self.g.tensors[name].data is None

    def _forward_peak(self) -> int:
        last_use: dict[str, int] = {}
        for i, op in enumerate(self.g.ops):
            for t in op.inputs:
                if self._is_activation(t):
                    last_use[t] = i
        live = {t: self._act_bytes(t) for t in self.g.inputs if self._is_activation(t)}
        peak = sum(live.values())
        outputs = set(self.g.outputs)
        for i, op in enumerate(self.g.ops):
            for t in op.outputs:
                live[t] = self._act_bytes(t)
            peak = max(peak, sum(live.values()))
            for t in [t for t in op.inputs if self._is_activation(t)]:
                if last_use.get(t) == i and t not in outputs:
                    live.pop(t, None)
        return int(peak)

    def _loss_head(self) -> set[int]:
        """Ops that training drops: a final softmax (the fused cross-entropy takes the logits)."""
        out = self.g.outputs[0] if self.g.outputs else None
        prod = self.g.producers()
        if out in prod and self.g.ops[prod[out]].type == "softmax":
            return {prod[out]}
        return set()

    def _backward(self, trained: set[int]) -> tuple[int, int]:
        """(gradient peak, saved activation bytes) of backward in reverse op order, as autodiff emits it."""
        params = {self.g.ops[i].inputs[k] for i in trained for k in (1, 2)
                  if len(self.g.ops[i].inputs) > k and self.g.ops[i].inputs[k]}
        needs: set[str] = set()
        op_needs = []
        for i, op in enumerate(self.g.ops):
            n = i not in self._head_ops and (i in trained or any(t in needs or t in params for t in op.inputs if t))
            op_needs.append(n)
            if n:
                needs.update(op.outputs)
        head = self.g.outputs[0]
        if self._head_ops:
            head = self.g.ops[next(iter(self._head_ops))].inputs[0]
        live: dict[str, int] = {head: self._act_bytes(head, fp32=True)} if head in needs else {}
        peak = sum(live.values())
        saved: set[str] = set()
        for i in range(len(self.g.ops) - 1, -1, -1):
            op = self.g.ops[i]
            if not op_needs[i] or op.outputs[0] not in live:
                continue
            y = op.outputs[0]
            if op.attrs.get("act", "none") != "none" or op.type in ("relu", "relu6", "softmax"):
                saved.add(y)
            if op.type == "max_pool2d":
                saved.add(op.inputs[0])
            if op.type in ("conv2d", "depthwise_conv2d", "fully_connected"):
                grad_ins = [op.inputs[0]]          # w and b gradients are parameter terms
            elif op.type in ("mean", "reshape", "pad"):
                grad_ins = [op.inputs[0]]          # axes / shape / paddings are constants
            else:
                grad_ins = [t for t in op.inputs if t]
            for t in grad_ins:
                if t in needs and t not in live and self._is_activation(t):
                    live[t] = self._act_bytes(t, fp32=True)
            peak = max(peak, sum(live.values()))
            for t in op.outputs:
                live.pop(t, None)
        saved_bytes = sum(self._act_bytes(t) for t in saved if self._is_activation(t))
        return int(peak), int(saved_bytes)


def kb(n: float) -> str:
    """Bytes as KB (1024) with one decimal, the unit budgets are given in."""
    return f"{n / 1024:.1f} KB"
