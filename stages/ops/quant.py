"""Conversions between int8 and float: quantize, dequantize, and the backward's dequantize_slice; the numpy kernels
of quantize and dequantize (the executor's) and the C of all three (a dequantize the input-gradient kernels fuse
emits none: memplan.fused_dequantize)."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import qparams
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype
from tinytrain.stages.ops.train_kernels import run_dequantize_slice

# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _quantize(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    x_t, y_t = ctx.tin(0), ctx.tout()
    if y_t.dtype != "int8":
        raise NotImplementedError(f"QUANTIZE to {y_t.dtype}")
    so, zo = qparams(y_t)
    if x_t.dtype == "float32":
        # reference_ops::AffineQuantize: TfLiteRound(val / static_cast<float>(scale)) + zero_point, clamped.
        q = (x.astype(np.float32) / np.float32(so)).astype(np.float32)
        return [np.clip(ia.round_half_away_array(q) + zo, -128, 127).astype(np.int8)]
    if x_t.dtype == "int8":
        # quantize.cc int8 -> int8: Requantize with QuantizeMultiplier(double(s_in) / double(s_out)).
        si, zi = qparams(x_t)
        mult, shift = ia.quantize_multiplier(float(si) / float(so))
        y = ia.multiply_by_quantized_multiplier(x.astype(np.int64) - zi, mult, shift) + zo
        return [np.clip(y, -128, 127).astype(np.int8)]
    raise NotImplementedError(f"QUANTIZE from {x_t.dtype}")


def _dequantize(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    x_t = ctx.tin(0)
    if x_t.dtype == "float16":
        return [x.astype(np.float32)]
    if x_t.dtype == "int8":
        if x_t.quant is None:
            raise ValueError(f"int8 tensor {x_t.name!r} has no quantization parameters")
        scale = np.asarray(x_t.quant.scale, dtype=np.float64)
        zp = np.asarray(x_t.quant.zero_point, dtype=np.int64)
        if x_t.quant.per_channel:
            shape = [1] * x.ndim
            shape[x_t.quant.axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        # reference_ops::Dequantize: static_cast<float>(double scale * (val - zero_point)).
        return [(scale * (x.astype(np.int64) - zp)).astype(np.float32)]
    raise NotImplementedError(f"DEQUANTIZE from {x_t.dtype}")


# ---- C (gen: codegen's generator)

def _c_quantize(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[x].shape)
    so, zo = gen.qp(y)
    if gen.g.tensors[x].dtype == "float32":
        return [f"tt_quantize_f32_s8({n}, {flit(so)}, {zo}, {gen.loc(x)}, {gen.loc(y)});"]
    si, zi = gen.qp(x)
    m, s = ia.quantize_multiplier(float(si) / float(so))
    return [f"tt_requantize_s8({n}, {zi}, {zo}, {m}, {s}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_dequantize(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    if y in gen.fused:
        return [f"/* fused: the input-gradient kernels dequantize {x.split(';')[0]} as they read it */"]
    t = gen.g.tensors[x]
    n = numel(t.shape)
    if t.quant.per_channel:
        ax = int(t.quant.axis) % len(t.shape)
        outer, ch, inner = numel(t.shape[:ax]), t.shape[ax], numel(t.shape[ax + 1:])
        sc = gen.const_table("tt_dqs", "float", t.quant.scale)
        zp = gen.const_table("tt_dqz", "int32_t", t.quant.zero_point)
        return [f"tt_dequantize_per_channel_s8_f32({outer}, {ch}, {inner}, {sc}, {zp}, {gen.loc(x)}, "
                f"{gen.loc(y)});"]
    s, z = gen.qp(x)
    return [f"tt_dequantize_s8_f32({n}, {flit(s)}, {z}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_dequantize_slice(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    t = gen.g.tensors[x]
    k = int(op.attrs["channels"])
    depth = int(op.attrs.get("depth", t.shape[-1]))
    rows = numel(t.shape) // depth
    s, z = gen.qp(x)
    if y in gen.fused:
        return [f"/* fused: the weight-gradient kernels dequantize {x.split(';')[0]} as they read it */"]
    return [f"tt_dequantize_slice_s8_f32({rows}, {depth}, {k}, {flit(s)}, {z}, {gen.loc(x)}, {gen.loc(y)});"]


# ---- TFLite op versions (op_version.cc)


# quantize requantizes (float -> int8, or int8 -> int8) and clamps to the int8 range. Named: ptq adds quantize /
# dequantize at an int8 graph's float boundaries, autodiff dequantize(_slice) for the backward's real values.
QUANTIZE = OpDef("quantize", signature="x -> y", note="float->int8, or int8->int8 requantize",
                 tflite=(Builtin("QUANTIZE", 1, 1),), clamp_masked=True, conversion=True, forward=_quantize,
                 c=_c_quantize, version=version_by_dtype({"int8": 2, "int16": 2, "uint8": 2}))
DEQUANTIZE = OpDef("dequantize", signature="x -> y", note="int8/float16 -> float32",
                   tflite=(Builtin("DEQUANTIZE", 1, 1),), conversion=True, unpacks_constants=True,
                   forward=_dequantize, c=_c_dequantize,
                   version=version_by_dtype({"float16": 3, "int8": 2, "int16": 4}))
DEQUANTIZE_SLICE = OpDef("dequantize_slice", kind="aux", signature="x_q -> x_f", attrs=("channels", "depth"),
                         note="the saved int8 input of a weight gradient, only its trained slice x[..., :k], as "
                              "float32",
                         c=_c_dequantize_slice, run=run_dequantize_slice)

OPS = (QUANTIZE, DEQUANTIZE, DEQUANTIZE_SLICE)
