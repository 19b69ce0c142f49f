"""Fold BatchNorm (and any per-channel affine) into the conv / depthwise / fully-connected op before it.

An unfused float graph carries inference BatchNorm as `y = x * m + a` with constant per-channel m, a
(ops `mul` and `add` with a constant operand) right after a linear op. Folding gives
    W'[c] = W[c] * m[c],   b'[c] = b[c] * m[c] + a[c]
which is the same function in exact arithmetic; int8 then quantizes the folded weights, as the TFLite
converter does. Folding also keeps int8 honest: a separate MUL/ADD would need its own activation
range right where BN's rescaling makes ranges worst.

A standalone ReLU/ReLU6 right after a linear op (with no fused activation) is fused into it too: in
int8 a fused clamp costs nothing while a separate op adds a requantization step.

A `sub` of a constant per-channel vector (y - a) folds as an add of -a. A `mul`/`add`/`sub` that cannot
be folded (BatchNorm right on the input, a vector that is not per output channel, an operand shared with
another op) stays in the graph and is quantized as an ordinary int8 op.
"""

from __future__ import annotations

import copy

import numpy as np

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, Tensor

LINEAR_OPS = ops.BN_FOLD_OPS   # the layers a BatchNorm after them folds into (the op registry's trait)
FUSABLE_ACTS = {"relu": "relu", "relu6": "relu6"}


def out_channel_axis(op_type: str) -> int:
    """Axis of the weight tensor that indexes output channels (TFLite layout)."""
    return ops.REGISTRY[op_type].out_channel_axis


def fold(graph: Graph) -> tuple[Graph, list[str]]:
    """Return a folded copy of `graph` and one note per fold done."""
    g = copy.deepcopy(graph)
    notes: list[str] = []
    changed = True
    while changed:
        changed = False
        for i, op in enumerate(g.ops):
            note = _try_fold_after(g, i) if op.type in LINEAR_OPS else None
            if note:
                notes.append(note)
                changed = True
                break
    return g, notes


def _per_channel(g: Graph, name: str, channels: int) -> np.ndarray | None:
    """The constant `name` as a [channels] vector if it broadcasts along the last axis only."""
    t = g.tensors.get(name)
    if t is None or t.data is None or t.dtype not in ("float32", "float16"):
        return None
    d = np.asarray(t.data, dtype=np.float32)
    if d.size == 1:
        return np.full(channels, float(d.reshape(())), np.float32)
    if d.shape[-1] == channels and d.size == channels:
        return d.reshape(channels)
    return None


def _try_fold_after(g: Graph, i: int) -> str | None:
    op = g.ops[i]
    if op.attrs.get("act", "none") != "none":
        return None
    y = op.outputs[0]
    if y in g.outputs:
        return None
    users = g.consumers().get(y, [])
    if len(users) != 1:
        return None
    nxt = g.ops[users[0]]
    w = g.tensors[op.inputs[1]]
    if w.data is None or w.dtype != "float32":
        return None
    axis = out_channel_axis(op.type)
    channels = w.shape[axis]

    if nxt.type in FUSABLE_ACTS:
        op.attrs["act"] = FUSABLE_ACTS[nxt.type]
        _bypass(g, users[0], y)
        return f"fused {nxt.type} into {op.type} -> {nxt.outputs[0]}"

    how = ops.REGISTRY[nxt.type].bn_affine   # the op's fold rule, if it is a BatchNorm step
    if how is None or len(nxt.inputs) != 2 or nxt.inputs[0] == nxt.inputs[1]:
        return None
    if how == "unshift" and nxt.inputs[0] != y:
        return None  # a - y negates the layer: foldable, but not what BatchNorm exports; left as an op
    other = nxt.inputs[1] if nxt.inputs[0] == y else nxt.inputs[0]
    vec = _per_channel(g, other, channels)
    if vec is None:
        return None
    bias = _bias_of(g, i, channels)
    shape = [1] * w.data.ndim
    shape[axis] = channels
    if how == "scale":
        w.data = (w.data * vec.reshape(shape)).astype(np.float32)
        bias.data = (bias.data * vec).astype(np.float32)
    elif how == "unshift":
        bias.data = (bias.data - vec).astype(np.float32)
    else:
        bias.data = (bias.data + vec).astype(np.float32)
    op.attrs["act"] = nxt.attrs.get("act", "none")
    _bypass(g, users[0], y)
    return f"folded {nxt.type} by {other} into {op.type} -> {op.outputs[0]}"


def _bias_of(g: Graph, i: int, channels: int) -> Tensor:
    """The op's float bias tensor, created (zeros) when the op has none. A bias shared with another
    op is copied first so that folding changes this op only."""
    op = g.ops[i]
    name = op.inputs[2] if len(op.inputs) > 2 else None
    users = g.consumers().get(name, []) if name else []
    if name is None or len(users) > 1:
        base = op.outputs[0] + "/bias"
        new = base
        k = 1
        while new in g.tensors:
            new, k = f"{base}{k}", k + 1
        old = np.asarray(g.tensors[name].data, np.float32) if name else np.zeros(channels, np.float32)
        g.tensors[new] = Tensor(name=new, shape=[channels], dtype="float32", role="bias", data=old.copy())
        while len(op.inputs) < 3:
            op.inputs.append(None)
        op.inputs[2] = new
        name = new
    t = g.tensors[name]
    t.data = np.asarray(t.data, np.float32)
    return t


def _bypass(g: Graph, k: int, y: str) -> None:
    """Remove op k (which reads y and writes z): the op before it now writes z directly, so the
    tensor names downstream (and the graph outputs) stay as they were."""
    nxt = g.ops[k]
    z = nxt.outputs[0]
    prod = g.producers()[y]
    g.ops[prod].outputs[0] = z
    del g.ops[k]
    if y not in g.consumers() and y not in g.outputs:
        g.tensors.pop(y, None)
    for name in [n for n in nxt.inputs if n and n != y]:
        if g.tensors.get(name) is not None and g.tensors[name].data is not None and name not in g.consumers():
            g.tensors.pop(name)
