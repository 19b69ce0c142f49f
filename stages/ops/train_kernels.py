"""numpy kernels (OpDef.run) of the training-only ops that keep state: the batch accumulation, Adam's step counter,
the float and QAS updates; and of dequantize_slice (the saved int8 input of a weight gradient). The training
executor (stages/golden/train_step.py) only dispatches to them.

Ops of the step phase (kind "update", step_counter) and batch_accumulate change their state inputs in place and
return no outputs; an update reads its runtime hyper-parameters through `hp(key)` (learning_rate, momentum,
beta1, beta2, eps, alpha, weight_decay: the executor resolves the op's `<key>_ref` attrs against the run's runtime
values and the graph's defaults).
"""

from __future__ import annotations

import numpy as np

from tinytrain.pipeline.errors import ModelError

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.quant import qas


def run_dequantize_slice(op, v, shape, tensor):
    """x[..., :channels] (FC: the first `channels` columns of x's rows of `depth`) as float32
    (q − zero_point)·scale: one float32 multiply, which equals the reference Dequantize's
    float(double(scale)·(q − zp)) since (q − zp) has 9 bits and the double product is exact."""
    a = op.attrs
    t = tensor(op.inputs[0])
    if t.quant is None or t.quant.per_channel:
        raise ModelError(f"dequantize_slice of {t.name!r} needs a per-tensor quantized activation")
    k = int(a["channels"])
    x = np.asarray(v(0))
    rows = x.reshape(-1, int(a["depth"])) if "depth" in a else x
    q = rows[..., :k].astype(np.int32) - np.int32(t.quant.zero_point[0])
    return [(q.astype(np.float32) * np.float32(t.quant.scale[0])).astype(np.float32)]


def run_batch_accumulate(op, v, shape, tensor):
    """acc += g, in place (the accumulator is state)."""
    acc = v(0)
    acc += v(1)
    return []


def run_step_counter(op, v, shape, tensor, hp=None):
    step = v(0)
    step[...] += 1
    return []


def float_update(kind: str):
    """<kind>_update(w, g, *state[, step]) -> w, *state: grad_ops' update of the trained slice w[..., :n], g divided
    by batch_size, the gradient zeroed after use when reset_grad."""
    def run(op, v, shape, tensor, hp):
        a = op.attrs
        w, g = v(0), v(1)
        scale = 1.0 / float(a.get("batch_size", 1))
        n = a.get("n")
        wd = hp("weight_decay") if "weight_decay_ref" in a else 0.0
        if kind == "sgd":
            go.sgd_update(w, g, hp("learning_rate"), scale, wd, n)
        elif kind == "momentum":
            go.momentum_update(w, g, v(2), hp("learning_rate"), hp("momentum"), scale, wd, n)
        elif kind == "adam":
            go.adam_update(w, g, v(2), v(3), int(v(4)), hp("learning_rate"), hp("beta1"), hp("beta2"), hp("eps"),
                           scale, wd, n)
        else:
            go.rmsprop_update(w, g, v(2), hp("learning_rate"), hp("alpha"), hp("eps"), scale, wd, n)
        if a.get("reset_grad"):
            g[...] = 0
        return []
    return run


_HYPER = {"sgd": [], "momentum": ["momentum"], "adam": ["beta1", "beta2", "eps"], "rmsprop": ["alpha", "eps"]}


def qas_update(kind: str):
    """qas_<kind>_update(p, g, scale, *state[, step][, master][, prng]) -> p, *state[, master][, prng]
    (stages/quant/qas.py)."""
    def run(op, v, shape, tensor, hp):
        a = op.attrs
        h = {k: hp(k) for k in ["learning_rate"] + _HYPER[kind]}
        h["weight_decay"] = hp("weight_decay") if "weight_decay_ref" in a else 0.0
        ns = qas.STATE_COUNT[kind]
        state = [v(3 + j) for j in range(ns)]
        pos = 3 + ns
        step = 0
        if kind == "adam":
            step = int(v(pos))
            pos += 1
        master = None
        if a.get("master"):
            master = v(pos)
            pos += 1
        prng = v(pos) if a.get("rounding") == "stochastic" and master is None else None
        g = v(1)
        qas.qas_update(kind, v(0), g, v(2), axis=int(a["axis"]), n=a.get("n"), state=state, hp=h, step=step,
                       batch_size=int(a.get("batch_size", 1)), qas=bool(a.get("qas", True)),
                       rounding=a.get("rounding", "nearest"), bounds=tuple(a["bounds"]), master=master, prng=prng)
        if a.get("reset_grad"):
            g[...] = 0
        return []
    return run
