"""Pooling and reduction: average_pool2d, max_pool2d, mean, and their backward ops."""

from __future__ import annotations

from .backward import geometry, input_backward
from .base import Builtin, OpDef


# ---- backward: the gradient of the input, with the forward's pooling attrs; max pool reads its input (int8 as it
# is: only the argmax matters), mean its axes

def _avg_pool_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, attrs=geometry(op))


def _max_pool_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[0],), attrs=geometry(op))


def _mean_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[1],), attrs=geometry(op))


_POOL = ("filter_h", "filter_w", "stride_h", "stride_w", "padding", "act")


OPS = (
    OpDef("average_pool2d", signature="x -> y", attrs=_POOL, tflite=(Builtin("AVERAGE_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first", backward=_avg_pool_backward),
    OpDef("max_pool2d", signature="x -> y", attrs=_POOL, tflite=(Builtin("MAX_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first", backward=_max_pool_backward),
    OpDef("mean", signature="x, axes -> y", attrs=("keep_dims",), tflite=(Builtin("MEAN", 2, 2),),
          differentiable=True, clamp_masked=True, backward=_mean_backward),
    OpDef("average_pool2d_grad", kind="backward", of="average_pool2d", signature="dz -> dx",
          attrs=("the forward's pooling attrs",)),
    OpDef("max_pool2d_grad", kind="backward", of="max_pool2d", signature="dz, x -> dx",
          attrs=("the forward's pooling attrs",)),
    OpDef("mean_grad", kind="backward", of="mean", signature="dy, axes -> dx", broadcasts=True),
)
