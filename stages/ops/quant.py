"""Conversions between int8 and float: quantize, dequantize, and the backward's dequantize_slice; their C (a
dequantize the input-gradient kernels fuse emits none: memplan.fused_dequantize)."""

from __future__ import annotations

from .. import int8_arith as ia
from ..c_literals import flit, numel
from ..ir import Op
from .base import Builtin, OpDef, version_by_dtype
from .train_kernels import run_dequantize_slice

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


OPS = (
    # quantize requantizes (float -> int8, or int8 -> int8) and clamps to the int8 range.
    OpDef("quantize", signature="x -> y", note="float->int8, or int8->int8 requantize",
          tflite=(Builtin("QUANTIZE", 1, 1),), clamp_masked=True, conversion=True, c=_c_quantize,
          version=version_by_dtype({"int8": 2, "int16": 2, "uint8": 2})),
    OpDef("dequantize", signature="x -> y", note="int8/float16 -> float32", tflite=(Builtin("DEQUANTIZE", 1, 1),),
          conversion=True, c=_c_dequantize, version=version_by_dtype({"float16": 3, "int8": 2, "int16": 4})),
    OpDef("dequantize_slice", kind="aux", signature="x_q -> x_f", attrs=("channels", "depth"),
          note="the saved int8 input of a weight gradient, only its trained slice x[..., :k], as float32",
          c=_c_dequantize_slice, run=run_dequantize_slice),
)
