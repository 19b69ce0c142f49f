"""Activations: relu, relu6, logistic, tanh, hard_swish, leaky_relu, prelu, and their backward ops."""

from __future__ import annotations

from .base import Builtin, OpDef

OPS = (
    OpDef("relu", signature="x -> y", tflite=(Builtin("RELU", 1, 1),), differentiable=True,
          op_clamp=(0.0, None), in_place="any"),
    OpDef("relu6", signature="x -> y", tflite=(Builtin("RELU6", 1, 1),), differentiable=True,
          op_clamp=(0.0, 6.0), in_place="any"),
    OpDef("logistic", signature="x -> y", note="int8: output fixed at (1/256, -128)",
          tflite=(Builtin("LOGISTIC", 1, 1),), differentiable=True, fixed_output=(1.0 / 256.0, -128)),
    OpDef("tanh", signature="x -> y", note="int8: output fixed at (1/128, 0)", tflite=(Builtin("TANH", 1, 1),),
          differentiable=True, fixed_output=(1.0 / 128.0, 0)),
    OpDef("hard_swish", signature="x -> y", note="x * relu6(x + 3) / 6", tflite=(Builtin("HARD_SWISH", 1, 1),),
          differentiable=True, clamp_masked=True),
    OpDef("leaky_relu", signature="x -> y", attrs=("alpha",), note="y = x > 0 ? x : x * alpha",
          tflite=(Builtin("LEAKY_RELU", 1, 1),), differentiable=True, clamp_masked=True),
    OpDef("prelu", signature="x, alpha -> y",
          note="alpha constant, broadcast over x without the batch axis; y = x >= 0 ? x : x * alpha",
          tflite=(Builtin("PRELU", 2, 2),), differentiable=True, clamp_masked=True, const_operands_per_tensor=True),
    OpDef("logistic_grad", kind="backward", of="logistic", signature="dy, y -> dx", note="dy*(1 - y)*y"),
    OpDef("tanh_grad", kind="backward", of="tanh", signature="dy, y -> dx", note="dy*(1 - y^2)"),
    OpDef("hard_swish_grad", kind="backward", of="hard_swish", signature="dy, x -> dx"),
    OpDef("leaky_relu_grad", kind="backward", of="leaky_relu", signature="dy, x -> dx", attrs=("alpha",)),
    OpDef("prelu_grad", kind="backward", of="prelu", signature="dy, x, alpha -> dx",
          note="the input gradient only (alpha is a constant)"),
)
