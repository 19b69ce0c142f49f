"""Conversions between int8 and float: quantize, dequantize, and the backward's dequantize_slice."""

from __future__ import annotations

from .base import Builtin, OpDef

OPS = (
    # quantize requantizes (float -> int8, or int8 -> int8) and clamps to the int8 range.
    OpDef("quantize", signature="x -> y", note="float->int8, or int8->int8 requantize",
          tflite=(Builtin("QUANTIZE", 1, 1),), clamp_masked=True, conversion=True),
    OpDef("dequantize", signature="x -> y", note="int8/float16 -> float32", tflite=(Builtin("DEQUANTIZE", 1, 1),),
          conversion=True),
    OpDef("dequantize_slice", kind="aux", signature="x_q -> x_f", attrs=("channels", "depth"),
          note="the saved int8 input of a weight gradient, only its trained slice x[..., :k], as float32"),
)
