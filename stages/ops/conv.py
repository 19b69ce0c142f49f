"""Convolutions: conv2d, depthwise_conv2d, transpose_conv, and the backward ops autodiff emits for them (the
forward's numpy kernels and C: conv_forward.py)."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.ops import conv_forward as fw
from tinytrain.stages.ops import conv_grad as cg
from tinytrain.stages.ops.backward import LayerBackward
from tinytrain.stages.ops.base import Builtin, OpDef, input_dtype

# MediaPipe's custom transpose convolution with a bias (read as transpose_conv, written as TRANSPOSE_CONV).
MEDIAPIPE_TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"
_GEOMETRY = ("stride_h", "stride_w", "dilation_h", "dilation_w", "padding")


def _out_elems(graph, op) -> int:
    return int(np.prod(graph.tensors[op.outputs[0]].shape, dtype=np.int64))


def _conv_macs(graph, op) -> int:
    """Each output element sums KH*KW*I products."""
    w = graph.tensors[op.inputs[1]].shape
    return _out_elems(graph, op) * int(w[1] * w[2] * w[3])


def _depthwise_macs(graph, op) -> int:
    """Each output element sums KH*KW products."""
    w = graph.tensors[op.inputs[1]].shape
    return _out_elems(graph, op) * int(w[1] * w[2])


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_conv2d_grad_input(op, v, shape, tensor):
    a = op.attrs
    return [go.conv2d_grad_input(v(0), v(1), shape(op.outputs[0]), a)]


def _run_conv2d_grad_weight(op, v, shape, tensor):
    a = op.attrs
    return [go.conv2d_grad_weight(v(0), v(1), list(a["w_shape"]), a, a.get("in_channels"))]


def _run_transpose_conv_grad_input(op, v, shape, tensor):
    a = op.attrs
    return [go.transpose_conv_grad_input(v(0), v(1), shape(op.outputs[0]), a)]


def _run_transpose_conv_grad_weight(op, v, shape, tensor):
    a = op.attrs
    return [go.transpose_conv_grad_weight(v(0), v(1), list(a["w_shape"]), a, a.get("in_channels"))]


def _run_depthwise_conv2d_grad_input(op, v, shape, tensor):
    a = op.attrs
    return [go.depthwise_conv2d_grad_input(v(0), v(1), shape(op.outputs[0]), a)]


def _run_depthwise_conv2d_grad_weight(op, v, shape, tensor):
    a = op.attrs
    return [go.depthwise_conv2d_grad_weight(v(0), v(1), list(a["w_shape"]), a, a.get("in_channels"),
                                            a.get("multiplier"))]


# ---- TFLite op versions (op_version.cc)

def _dilated(op) -> bool:
    return op.attrs.get("dilation_h", 1) != 1 or op.attrs.get("dilation_w", 1) != 1


def _conv_version(graph, op) -> int:
    x = input_dtype(graph, op)
    return {"int16": 4, "int8": 3}.get(x) or (2 if _dilated(op) else 1)


def _depthwise_version(graph, op) -> int:
    x = input_dtype(graph, op)
    return {"int16": 5, "int8": 3}.get(x) or (2 if _dilated(op) else 1)


def _transpose_conv_version(graph, op) -> int:
    """4 with a fused activation, 3 with a bias, 2 for int8 (the converter writes 4)."""
    if op.attrs.get("act", "none") != "none":
        return 4
    if len(op.inputs) > 2 and op.inputs[2] is not None:
        return 3
    return 2 if input_dtype(graph, op) == "int8" else 1


CONV2D = OpDef("conv2d", signature="x, w[O,KH,KW,I], b? -> y", attrs=_GEOMETRY + ("act",),
               tflite=(Builtin("CONV_2D", 2, 3),), bias_required=True, layer=True, bn_fold=True,
               out_channel_axis=0, differentiable=True, clamp_masked=True, row_stream="conv", macs=_conv_macs,
               version=_conv_version, split_weight=1, fast_float="conv", forward=fw.conv2d, c=fw.c_conv2d,
               backward=LayerBackward(), fp16_output=True, fp16_operands=(0,))
TRANSPOSE_CONV = OpDef("transpose_conv", signature="x, w[O,KH,KW,I], b?, output_shape -> y",
                       attrs=("stride_h", "stride_w", "padding", "act"),
                       note="TFLite TRANSPOSE_CONV; the file's operand order is output_shape, w, x, b: the reader "
                            "reorders to the layer order, the writer back; output_shape is an int32[4] constant "
                            "equal to y's shape; padding as conv2d with y as the conv's input",
                       tflite=(Builtin("TRANSPOSE_CONV", 3, 4),
                               Builtin(MEDIAPIPE_TRANSPOSE_CONV_BIAS, 3, 3, custom=True)),
                       file_operands=(2, 1, 3, 0),   # TFLite's [output_shape, w, x, b?]
                       layer=True, frozen_only=True, out_channel_axis=0, differentiable=True, clamp_masked=True,
                       version=_transpose_conv_version, forward=fw.transpose_conv, c=fw.c_transpose_conv,
                       backward=LayerBackward())
CONV2D_GRAD_INPUT = OpDef("conv2d_grad_input", kind="backward", of="conv2d", signature="dz, w -> dx",
                          attrs=("the forward's geometry",), grad_input=True, split_weight=1, hidden_role="mix",
                          fast_float="pointwise_grad_input", run=_run_conv2d_grad_input, c=cg.c_conv2d_grad_input,
                          fp16_operands=(0,), fp16_output=True)
CONV2D_GRAD_WEIGHT = OpDef("conv2d_grad_weight", kind="backward", of="conv2d", signature="dz, x -> dw",
                           attrs=("geometry", "in_channels", "w_shape"), note="k = in_channels: dw is w[..., :k]",
                           channel_stream=True, fused_input=True, hidden_role="weight", fp16_operands=(0, 1),
                           fast_float="pointwise_grad_weight",
                           run=_run_conv2d_grad_weight, c=cg.c_conv2d_grad_weight)

OPS = (
    CONV2D,
    OpDef("depthwise_conv2d", signature="x, w[1,KH,KW,O], b? -> y",
          attrs=_GEOMETRY + ("depth_multiplier", "act"),
          tflite=(Builtin("DEPTHWISE_CONV_2D", 2, 3),), bias_required=True, layer=True, bn_fold=True,
          out_channel_axis=3, differentiable=True, clamp_masked=True, row_stream="conv", macs=_depthwise_macs,
          # TinyEngine's scheme: one output channel into a scratch buffer, copied over the input channel it came
          # from (multiplier 1 only: memplan checks it).
          in_place="channel", version=_depthwise_version, fast_float="depthwise", forward=fw.depthwise_conv2d,
          c=fw.c_depthwise_conv2d, fp16_operands=(0,), fp16_output=True,
          backward=LayerBackward(depthwise=True)),
    TRANSPOSE_CONV,
    # ---- backward
    CONV2D_GRAD_INPUT,
    CONV2D_GRAD_WEIGHT,
    OpDef("depthwise_conv2d_grad_input", kind="backward", of="depthwise_conv2d", signature="dz, w -> dx",
          attrs=("geometry", "depth_multiplier"), grad_input=True,
          # dx channel c depends on dz channel c only: the forward's channel-by-channel scheme
          in_place="channel", hidden_role="channel", run=_run_depthwise_conv2d_grad_input,
          c=cg.c_depthwise_conv2d_grad_input, fp16_operands=(0,), fp16_output=True),
    OpDef("depthwise_conv2d_grad_weight", kind="backward", of="depthwise_conv2d", signature="dz, x -> dw",
          attrs=("geometry", "in_channels"), note="dw is w[..., :k*M]", fp16_operands=(0, 1),
          run=_run_depthwise_conv2d_grad_weight, c=cg.c_depthwise_conv2d_grad_weight),
    OpDef("transpose_conv_grad_input", kind="backward", of="transpose_conv", signature="dz, w -> dx",
          attrs=("the forward's attrs",), note="the conv2d of dz with w of the same geometry",
          run=_run_transpose_conv_grad_input, c=cg.c_transpose_conv_grad_input),
    OpDef("transpose_conv_grad_weight", kind="backward", of="transpose_conv", signature="dz, x -> dw",
          attrs=("as conv2d_grad_weight",), run=_run_transpose_conv_grad_weight, c=cg.c_transpose_conv_grad_weight),
)
