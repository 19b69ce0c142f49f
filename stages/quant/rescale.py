"""Weights that are free to move (issue 17, item 2): wider scales, chosen at plan time, for trained int8 weights that
training would push past ±127.

Post-training quantisation gives each output channel the scale s_c = max|w_c| / 127: the weights fill their range
exactly, so a trained channel cannot grow at all. A classifier head that learns new classes starts with small rows
(the digits example: scale 0.0021, so |w| ≤ 0.27), and fp32 training moves its weights up to 14 times past that
(momentum 0.9, lr 0.01); the int8 weights stop at ±127 and the logits at the ends of the output's calibrated range.

The choice (`choose`), from sparse-plan's update probe (stages/quant/update_check.py): for every trained int8 weight
the probe follows each element's free trajectory (its start plus every Δ the update computed, no clamp) and records
per output channel the largest |value| it reached, in int8 steps (`reach`). A channel whose reach passes 127 gets
the factor k_c = the smallest power of two with 127·k_c ≥ reach (the round-up is the head-room). The layer's int8
output, whose range the weights' growth widens too, is measured rather than inferred: the probe runs again on the
graph with those weights widened (free to move now) and counts, for every factor ×2^j, the share of the output's
values that would still clamp (update_check._OutputReach); the output gets the smallest factor at which none
clamps (`output_factor`). (Its widest channel's factor was the rule before: one runaway channel then coarsened every
value of the layer.)

The rewrite (`apply`), on the int8 graph before autodiff, so the golden model and the generated C (both take every
requantisation from the graph's scales) stay bit-exact to each other without a change to either:
  weight   s_c' = s_c·k_c, q' = round_half_away(q / k_c) (|q'| ≤ 127 since |q| ≤ 127, k ≥ 1);
  output   s' = s·k_out, the zero point kept (so real 0 stays exact); the tensors that must share its int8
           parameters (reshape, pooling, concatenation: SHARED_PARAM_OPS) follow, so every op that reads or
           writes them requantises with the new scale;
  biases   of every layer whose input scale or weight scale changed: s_b' = float32(s_in'·s_w'[c]) (TFLite's int8
           spec: a bias's scale is the input's times the weight's) and b' = round(b·s_b / s_b').
The rescaled graph computes the same function within the rounding of the wider steps (log2 k bits fewer for the
channel, one step of the output); tests/test_rescale.py pins it against the numpy golden model.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, QuantParams

MAX_FACTOR = 64           # at most 6 bits of a channel's precision traded for range
QMAX = 127

__all__ = ["choose", "apply", "factor_for", "output_factor", "MAX_FACTOR", "text", "summary_suffix"]


def factor_for(reach: float) -> int:
    """The smallest power of two k with 127·k ≥ reach (1 when the range holds it), at most MAX_FACTOR."""
    if not reach > QMAX:
        return 1
    return int(min(MAX_FACTOR, 2 ** math.ceil(math.log2(reach / QMAX))))


def choose(graph: Graph, tensors: dict[str, dict[str, Any]],
           widened: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """{weights: {name: [k per channel]}, outputs: {name: k}}: the weights' factors from the probe's per-tensor
    `reach` (`tensors`, the probe of `graph`), the outputs' from `widened`'s `output_over` (the probe of the graph
    with those weights widened, update_check.probe(output_reach=True)); only the tensors that need a wider scale
    appear, and no output without `widened`."""
    weights: dict[str, list[int]] = {}
    outputs: dict[str, int] = {}
    for name, t in tensors.items():
        if "reach" not in t:
            continue
        k = [factor_for(r) for r in t["reach"]]
        if max(k) == 1:
            continue
        weights[name] = k
        over = ((widened or {}).get(name) or {}).get("output_over")
        layer = next(op for op in graph.ops if op.type in ops.LAYER_OPS and op.inputs[1] == name)
        out = layer.outputs[0]
        if over and graph.tensors[out].dtype == "int8" and graph.tensors[out].quant is not None:
            k_out = output_factor(over)
            if k_out > 1:
                outputs[out] = max(outputs.get(out, 1), k_out)
    # An output whose parameters are fixed by its consumers or producers (softmax's 1/256, a graph input) or
    # shared with a tensor no widening may touch keeps its scale: `apply` skips it and says so.
    return {"weights": weights, "outputs": {o: k for o, k in outputs.items() if _group(graph, o) is not None}}


def output_factor(over: list[float]) -> int:
    """The smallest power of two k whose scale ×k holds every output value the probe saw (`over[j]`: the share that
    clamps at ×2^j), at most MAX_FACTOR: the weights' rule (`factor_for`) for the layer's output. Measured on digits
    momentum: the `full` plan's first conv needs ×2, where its widest weight channel's ×64 (the rule before) left
    99 % of its ReLU outputs at 0 and the network at chance; the `auto` head's logits need ×8 (×32 before), and
    allowing a few clamps there (×4 leaves 0.04 % clamped) cost 6.5 points over 16 sample orders: a wrong logit
    clamped at the top gets no gradient (the straight-through mask), so nothing pulls it down."""
    for j, share in enumerate(over):
        if share == 0:
            return 2 ** j
    return MAX_FACTOR


def _group(graph: Graph, name: str) -> list[str] | None:
    """The tensors that must share `name`'s int8 parameters (through SHARED_PARAM_OPS, both ways), or None when one
    of them has parameters fixed by an op (FIXED_OUTPUT_PARAMS) or is a graph input."""
    members, todo = {name}, [name]
    while todo:
        t = todo.pop()
        for op in graph.ops:
            if op.type not in ops.SHARED_PARAM_OPS:
                continue
            shared = list(op.inputs) if ops.REGISTRY[op.type].shared_qparams == "all" else list(op.inputs[:1])
            tied = [x for x in shared if x] + list(op.outputs[:1])
            if t in tied:
                for x in tied:
                    if x not in members and graph.tensors[x].quant is not None:
                        members.add(x)
                        todo.append(x)
    for op in graph.ops:
        if op.type in ops.FIXED_OUTPUT_PARAMS and op.outputs[0] in members:
            return None
    if members & set(graph.inputs):
        return None
    return sorted(members)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def apply(graph: Graph, choice: dict[str, Any] | None) -> Graph:
    """A copy of `graph` with the chosen wider scales (see the module docstring); `graph` itself when there is
    nothing to change."""
    if not choice or not (choice.get("weights") or choice.get("outputs")):
        return graph
    g = Graph(tensors=dict(graph.tensors), ops=graph.ops, inputs=graph.inputs, outputs=graph.outputs,
              meta=graph.meta)

    def own(name: str):
        if g.tensors[name] is graph.tensors[name]:
            g.tensors[name] = copy.deepcopy(graph.tensors[name])
        return g.tensors[name]

    for name, k in choice.get("weights", {}).items():
        t = own(name)
        q = t.quant
        kk = np.asarray(k, np.float64)
        if len(q.scale) == 1:          # per-tensor weights: one factor, the largest
            kk = np.array([kk.max()])
        shape = [1] * t.data.ndim
        if len(kk) > 1:
            shape[q.axis] = -1
        v = np.asarray(t.data, np.float64) / kk.reshape(shape)
        t.data = np.clip(_round_half_away(v), -QMAX, QMAX).astype(np.int8)
        t.quant = QuantParams([float(np.float32(s * f)) for s, f in zip(q.scale, kk)], list(q.zero_point), q.axis)
    for name, k in choice.get("outputs", {}).items():
        for member in _group(graph, name) or []:
            t = own(member)
            t.quant = QuantParams([float(np.float32(s * k)) for s in t.quant.scale], list(t.quant.zero_point),
                                  t.quant.axis)
    # Every layer whose input or weight scale moved: its bias's scale is the product again, its values follow.
    for op in g.ops:
        if op.type not in ops.LAYER_OPS or len(op.inputs) < 3 or not op.inputs[2]:
            continue
        x, w, b = (g.tensors[n] for n in op.inputs[:3])
        if x.quant is None or w.quant is None or b.quant is None or b.dtype != "int32":
            continue
        if x is graph.tensors[op.inputs[0]] and w is graph.tensors[op.inputs[1]]:
            continue
        old = np.broadcast_to(np.asarray(b.quant.scale, np.float64), b.data.shape)
        sw = np.broadcast_to(np.asarray(w.quant.scale, np.float64), b.data.shape)
        new = (np.float64(x.quant.scale[0]) * sw).astype(np.float32).astype(np.float64)
        t = own(op.inputs[2])
        v = np.asarray(t.data, np.float64) * old / new
        t.data = np.clip(_round_half_away(v), -(2**31 - 1), 2**31 - 1).astype(np.int32)
        t.quant = QuantParams([float(s) for s in new], [0] * len(new), 0)
    return g


# ---- readable forms ----------------------------------------------------------------------------------------------

def text(choice: dict[str, Any] | None, graph_scales: dict[str, Any] | None = None) -> str:
    """plan.txt's lines: which tensors got a wider scale, by how much."""
    if not choice:
        return ""
    if not choice.get("weights") and not choice.get("outputs"):
        return "weight range: no trained int8 weight reached past ±127 in the probe (scales kept)\n"
    lines = ["weight range (head-room for trained int8 weights the probe moved past ±127; scales ×k, values /k):"]
    for name, k in choice.get("weights", {}).items():
        wide = [f"{f}" for f in k]
        lines.append(f"  {name}: channels ×{{{', '.join(sorted(set(wide), key=int))}}} "
                     f"({sum(f > 1 for f in k)} of {len(k)} channels widened)")
    for name, k in choice.get("outputs", {}).items():
        lines.append(f"  {name} (its output): ×{k}")
    return "\n".join(lines) + "\n"


def summary_suffix(choice: dict[str, Any] | None) -> str:
    if not choice or not choice.get("weights"):
        return ""
    n = sum(sum(f > 1 for f in k) for k in choice["weights"].values())
    top = max(max(k) for k in choice["weights"].values())
    return f"; {n} trained channels rescaled (up to ×{top}) for head-room"


def planned(graph: Graph, train_plan: Any) -> Graph:
    """`graph` with the scales sparse-plan chose (train_plan.json's `rescale`; the path may be None or absent):
    what autodiff trains and emulate-run exports."""
    import json
    from pathlib import Path

    if train_plan is None or not Path(train_plan).exists():
        return graph
    return apply(graph, json.loads(Path(train_plan).read_text()).get("rescale"))
