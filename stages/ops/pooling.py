"""Pooling and reduction: average_pool2d, max_pool2d, mean, and their backward ops."""

from __future__ import annotations

from .base import Builtin, OpDef

_POOL = ("filter_h", "filter_w", "stride_h", "stride_w", "padding", "act")

OPS = (
    OpDef("average_pool2d", signature="x -> y", attrs=_POOL, tflite=(Builtin("AVERAGE_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first"),
    OpDef("max_pool2d", signature="x -> y", attrs=_POOL, tflite=(Builtin("MAX_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first"),
    OpDef("mean", signature="x, axes -> y", attrs=("keep_dims",), tflite=(Builtin("MEAN", 2, 2),),
          differentiable=True, clamp_masked=True),
    OpDef("average_pool2d_grad", kind="backward", of="average_pool2d", signature="dz -> dx",
          attrs=("the forward's pooling attrs",)),
    OpDef("max_pool2d_grad", kind="backward", of="max_pool2d", signature="dz, x -> dx",
          attrs=("the forward's pooling attrs",)),
    OpDef("mean_grad", kind="backward", of="mean", signature="dy, axes -> dx"),
)
