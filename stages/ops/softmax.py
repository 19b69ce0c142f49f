"""softmax and its backward op."""

from __future__ import annotations

from .base import Builtin, OpDef

OPS = (
    OpDef("softmax", signature="x -> y", attrs=("beta",), tflite=(Builtin("SOFTMAX", 1, 1),),
          differentiable=True, fixed_output=(1.0 / 256.0, -128)),
    OpDef("softmax_grad", kind="backward", of="softmax", signature="dy, y -> dx", attrs=("beta",)),
)
