"""softmax and its backward op."""

from __future__ import annotations

from .backward import unary_backward
from .base import Builtin, OpDef


def _softmax_backward(bb, op, i, dz):
    """softmax_grad reads the forward output (real-valued)."""
    unary_backward(bb, op, i, dz, reads="y", attrs={"beta": float(op.attrs.get("beta", 1.0))})


OPS = (
    OpDef("softmax", signature="x -> y", attrs=("beta",), tflite=(Builtin("SOFTMAX", 1, 1),),
          differentiable=True, fixed_output=(1.0 / 256.0, -128), backward=_softmax_backward),
    OpDef("softmax_grad", kind="backward", of="softmax", signature="dy, y -> dx", attrs=("beta",)),
)
