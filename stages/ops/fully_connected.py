"""fully_connected and its backward ops; its numpy float and int8 kernel (the executor's) and the C of its call."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import FLOAT_BOUNDS, flit, numel
from tinytrain.stages.model.ir import Op, Tensor
from tinytrain.stages.golden.kernel_common import float_act, qparams
from tinytrain.stages.ops import fc_grad
from tinytrain.stages.ops.backward import LayerBackward
from tinytrain.stages.ops.base import Builtin, OpDef, input_dtype
from tinytrain.stages.ops.layer_common import channel_multipliers, weight_zp


def _fc_macs(graph, op) -> int:
    """Each output element sums I products (the weight's inner dimension)."""
    w = graph.tensors[op.inputs[1]].shape
    return int(np.prod(graph.tensors[op.outputs[0]].shape, dtype=np.int64)) * int(w[-1])


# ---- numpy forward (ctx: executor._Ctx)

def _fully_connected(ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, depth = w.shape
    if x.size % depth:
        raise ValueError(f"input of {x.size} elements does not split into rows of {depth}")
    rows = x.reshape(-1, depth)
    act = ctx.attrs.get("act", "none")
    y_t = ctx.tout()
    if ctx.quantized():
        x_t, w_t = ctx.tin(0), ctx.tin(1)
        _, zin = qparams(x_t)
        _, zout = qparams(y_t)
        wz = w.astype(np.int64) - weight_zp(w_t, o)[:, None]
        acc = ia.exact_matmul(rows.astype(np.int64) - zin, wz.T)
        if b is not None:
            acc = acc + b.astype(np.int64)
        lo, hi = ia.activation_range(act, *qparams(y_t))
        if ctx.fc_requant == "litert_double":
            out = _fc_requant_double(ia.wrap32(acc), x_t, w_t, y_t, o, zout, lo, hi)
        else:
            # Per-tensor (GetQuantizedConvolutionMultipler) and per-channel Prepare compute the same expression.
            mult, shift = channel_multipliers(x_t, w_t, y_t, o)
            out = ia.requantize(ia.wrap32(acc), mult, shift, zout, lo, hi).astype(np.int8)
    else:
        xf, wf = rows.astype(np.float32), w.astype(np.float32)
        acc = np.zeros((rows.shape[0], o), dtype=np.float32)
        for d in range(depth):
            acc += xf[:, d:d + 1] * wf[:, d]
        if b is not None:
            acc = acc + b.astype(np.float32)
        out = float_act(acc, act).astype(np.float32)
    if ctx.attrs.get("keep_num_dims"):
        return [out.reshape(x.shape[:-1] + (o,))]
    target = (x.shape[0],) + tuple(y_t.shape[1:])
    return [out.reshape(target) if out.size == int(np.prod(target)) else out]


def _fc_requant_double(acc: np.ndarray, x_t: Tensor, w_t: Tensor, y_t: Tensor, channels: int, zout: int,
                       lo: int, hi: int) -> np.ndarray:
    """LiteRT's reference FULLY_CONNECTED rescale (reference_integer_ops::FullyConnected[PerChannel], the
    float-scale overloads): static_cast<int32_t>(round(double(acc) * effective_output_scale)), with the scale
    double(s_in) * double(s_w[c]) / double(s_out) and C's round (ties away from zero)."""
    s_in, _ = qparams(x_t)
    s_out, _ = qparams(y_t)
    scales = list(w_t.quant.scale)
    scales = scales * channels if len(scales) == 1 else scales
    eff = np.array([float(s_in) * float(s) / float(s_out) for s in scales], dtype=np.float64)
    r = ia.round_half_away_array(acc.astype(np.float64) * eff)
    return np.clip(r + zout, lo, hi).astype(np.int8)

# ---- C (gen: codegen's generator)

def _c_fully_connected(gen, op: Op) -> list[str]:
    x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
    y = op.outputs[0]
    o, depth = gen.g.tensors[w].shape
    rows = numel(gen.g.tensors[x].shape) // depth
    bias = gen.loc(b) if b else "0"
    act = op.attrs.get("act", "none")
    if gen.is_int8(x):
        q = gen.requant(x, w, y, act, o)
        return [f"tt_fully_connected_s8({rows}, {depth}, {o}, &{q}, {gen.loc(x)}, {gen.loc(w)}, {bias}, "
                f"{gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    return [f"tt_fully_connected_f32({rows}, {depth}, {o}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, "
            f"{gen.loc(w)}, {bias}, {gen.loc(y)});"]


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_fully_connected_grad_input(op, v, shape, tensor):
    return [go.fully_connected_grad_input(v(0), v(1), shape(op.outputs[0]))]


def _run_fully_connected_grad_weight(op, v, shape, tensor):
    a = op.attrs
    return [go.fully_connected_grad_weight(v(0), v(1), list(a["w_shape"]), a.get("in_channels"))]


# ---- TFLite op versions (op_version.cc)

def _fc_version(graph, op) -> int:
    if op.attrs.get("keep_num_dims"):
        return 5
    return {"int8": 4, "int16": 7}.get(input_dtype(graph, op), 1)


FULLY_CONNECTED_GRAD_INPUT = OpDef("fully_connected_grad_input", kind="backward", of="fully_connected",
                                   signature="dz, w -> dx", grad_input=True, run=_run_fully_connected_grad_input,
                                   c=fc_grad.c_fully_connected_grad_input, fp16_operands=(0,), fp16_output=True)
FULLY_CONNECTED_GRAD_WEIGHT = OpDef("fully_connected_grad_weight", kind="backward", of="fully_connected",
                                    signature="dz, x -> dw", attrs=("in_channels",), channel_stream=True,
                                    fp16_operands=(0, 1),
                                    run=_run_fully_connected_grad_weight, c=fc_grad.c_fully_connected_grad_weight)

OPS = (
    OpDef("fully_connected", signature="x, w[O,I], b? -> y", attrs=("act", "keep_num_dims"),
          tflite=(Builtin("FULLY_CONNECTED", 2, 3),), layer=True, bn_fold=True, out_channel_axis=0,
          differentiable=True, clamp_masked=True, macs=_fc_macs, version=_fc_version, fast_float="fc",
          forward=_fully_connected,
          c=_c_fully_connected, backward=LayerBackward(flat=True)),
    FULLY_CONNECTED_GRAD_INPUT,
    FULLY_CONNECTED_GRAD_WEIGHT,
)
