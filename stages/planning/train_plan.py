"""What to train: per trainable layer, its bias on/off and the ratio of its weights' input channels (DESIGN §3, §6).

The sparse-plan stage will write this as `plan.json`; autodiff reads it. A layer is named by its op index in the
graph or by its weight tensor's name (names survive re-quantization, indices survive renames; either works); also
"#5"/"5", its output tensor, or the weight name's part before the first ';' (the spec's manual naming).
A ratio r trains input channels [0, ceil(r·C_in)).

JSON: {"version": 1, "layers": [{"layer": 5, "bias": true, "weight_ratio": 0.125}, ...]}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.ops import FROZEN_ONLY_OPS, REGISTRY, TRAINABLE_OPS  # the op registry's layer traits

RATIOS = (0.0, 0.125, 0.25, 0.5, 1.0)
PLAN_VERSION = 1


class PlanError(UserError):
    """The plan names a layer that does not exist or asks for something the layer does not have."""


@dataclass
class LayerPlan:
    layer: int | str
    bias: bool = False
    weight_ratio: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "bias": bool(self.bias), "weight_ratio": float(self.weight_ratio)}


@dataclass
class ResolvedLayer:
    op_index: int
    weight: str
    bias_tensor: str | None
    train_bias: bool
    weight_ratio: float
    # Input channels whose weights train: ceil(r · C_in) (0 = frozen weights).
    in_channels: int


@dataclass
class TrainPlan:
    layers: list[LayerPlan] = field(default_factory=list)

    # ---- helpers: the fixed schemes --------------------------------------------------------------------------
    @staticmethod
    def trainable_ops(graph: Graph) -> list[int]:
        # A stateful model unrolled over a sequence (stages/model/state.py) shares the parameters of the layers that feed
        # its state with the earlier invocations, which the gradient does not reach: those stay frozen.
        shared = set(graph.meta.get("unrolled", {}).get("shared_parameters", []))
        return [i for i, op in enumerate(graph.ops) if op.type in TRAINABLE_OPS and len(op.inputs) > 1
                and op.inputs[1] is not None and graph.tensors[op.inputs[1]].data is not None
                and op.inputs[1] not in shared]

    @classmethod
    def full(cls, graph: Graph) -> "TrainPlan":
        return cls([LayerPlan(i, bias=_has_bias(graph, i), weight_ratio=1.0) for i in cls.trainable_ops(graph)])

    @classmethod
    def last_k(cls, graph: Graph, k: int) -> "TrainPlan":
        """Weights and biases of the last k trainable layers."""
        ops = cls.trainable_ops(graph)
        if k < 0:
            raise PlanError(f"last_k needs k >= 0 (got {k})")
        chosen = ops[len(ops) - k:] if k else []
        return cls([LayerPlan(i, bias=_has_bias(graph, i), weight_ratio=1.0) for i in chosen])

    @classmethod
    def bias_only(cls, graph: Graph, last: int | None = None) -> "TrainPlan":
        """Biases only (of the last `last` layers that have one, or of all)."""
        ops = [i for i in cls.trainable_ops(graph) if _has_bias(graph, i)]
        if last is not None:
            ops = ops[len(ops) - last:] if last else []
        return cls([LayerPlan(i, bias=True, weight_ratio=0.0) for i in ops])

    # ---- JSON ------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "layers": [lp.to_json() for lp in self.layers]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "TrainPlan":
        if doc.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise PlanError(f"plan version {doc.get('version')} is not {PLAN_VERSION}")
        layers = []
        for d in doc.get("layers", []):
            ratio = d.get("weight_ratio", 0.0)
            if isinstance(ratio, str):  # "1/8" is friendlier to write by hand
                ratio = float(Fraction(ratio))
            layers.append(LayerPlan(d["layer"], bool(d.get("bias", False)), float(ratio)))
        return cls(layers)

    @classmethod
    def loads(cls, text: str) -> "TrainPlan":
        return cls.from_json(json.loads(text))

    # ---- resolution against a graph --------------------------------------------------------------------------
    def resolve(self, graph: Graph) -> list[ResolvedLayer]:
        """Check the plan against `graph` and name what it trains; errors say what would fit."""
        trainable = self.trainable_ops(graph)
        by_weight = {graph.ops[i].inputs[1]: i for i in trainable}
        out: list[ResolvedLayer] = []
        seen: set[int] = set()
        by_name = _names(graph, trainable)
        for lp in self.layers:
            if isinstance(lp.layer, str) and lp.layer in by_weight:
                idx = by_weight[lp.layer]
            elif isinstance(lp.layer, int) and not isinstance(lp.layer, bool) and lp.layer in trainable:
                idx = lp.layer
            elif isinstance(lp.layer, str) and lp.layer in by_name:
                idx = by_name[lp.layer]
            elif _frozen_only(graph, lp.layer) is not None:
                j = _frozen_only(graph, lp.layer)
                raise PlanError(f"plan names layer {lp.layer!r} (op {j} {graph.ops[j].type}, TRANSPOSE_CONV), whose "
                                f"weights and bias cannot be trained yet: it stays frozen (gradients flow through "
                                f"it to the layers below)",
                                hint="trainable layers (op index: weight): "
                                     + ", ".join(f"{i}: {graph.ops[i].inputs[1]}" for i in trainable))
            else:
                raise PlanError(f"plan names layer {lp.layer!r}, which is not a trainable layer of the model",
                                hint="trainable layers (op index: weight): "
                                     + ", ".join(f"{i}: {graph.ops[i].inputs[1]}" for i in trainable))
            if idx in seen:
                raise PlanError(f"plan names layer {lp.layer!r} (op {idx}) twice")
            seen.add(idx)
            if not any(math.isclose(lp.weight_ratio, r) for r in RATIOS):
                raise PlanError(f"weight ratio {lp.weight_ratio} of layer {lp.layer!r} is not one of "
                                f"0, 1/8, 1/4, 1/2, 1")
            op = graph.ops[idx]
            has_b = _has_bias(graph, idx)
            if lp.bias and not has_b:
                raise PlanError(f"layer {lp.layer!r} (op {idx} {op.type}) has no bias to train")
            w = graph.tensors[op.inputs[1]]
            c_in = _in_channels(graph, idx)
            k = math.ceil(lp.weight_ratio * c_in - 1e-9)
            out.append(ResolvedLayer(idx, w.name, op.inputs[2] if has_b else None, bool(lp.bias),
                                     float(lp.weight_ratio), int(k)))
        return sorted(out, key=lambda r: r.op_index)


def _names(graph: Graph, trainable: list[int]) -> dict[str, int]:
    """The other names the spec allows for a layer (pipeline/spec.py UpdateSpec.layers): "5" or "#5" (op index),
    its output tensor, its weight tensor's name before the first ';' (the converter joins fused names with ';');
    a short name that two layers share is left out rather than guessed."""
    out: dict[str, int] = {}
    clash: set[str] = set()
    for i in trainable:
        op = graph.ops[i]
        for name in (str(i), f"#{i}", op.outputs[0], op.inputs[1].split(";")[0]):
            if name in out and out[name] != i:
                clash.add(name)
            out[name] = i
    return {k: v for k, v in out.items() if k not in clash}


def _frozen_only(graph: Graph, layer: Any) -> int | None:
    """Op index of a FROZEN_ONLY_OPS layer that `layer` names (as resolve's names), else None."""
    ops = [i for i, op in enumerate(graph.ops) if op.type in FROZEN_ONLY_OPS]
    if isinstance(layer, int) and not isinstance(layer, bool):
        return layer if layer in ops else None
    for i in ops:
        op = graph.ops[i]
        w = op.inputs[1] or ""
        if layer in (str(i), f"#{i}", op.outputs[0], w, w.split(";")[0]):
            return i
    return None


def _has_bias(graph: Graph, i: int) -> bool:
    op = graph.ops[i]
    return len(op.inputs) > 2 and op.inputs[2] is not None and graph.tensors[op.inputs[2]].data is not None


def outputs_last(graph: Graph, op) -> bool:
    """A layer whose weights hold its output channels on their last axis (the registry's out_channel_axis: the
    depthwise [1,KH,KW,C*M]): its input channels are then the input's, and each feeds C*M / C filters."""
    return REGISTRY[op.type].out_channel_axis == len(graph.tensors[op.inputs[1]].shape) - 1


def _in_channels(graph: Graph, i: int) -> int:
    op = graph.ops[i]
    w = graph.tensors[op.inputs[1]]
    if outputs_last(graph, op):
        return int(graph.tensors[op.inputs[0]].shape[-1])
    return int(w.shape[-1])
