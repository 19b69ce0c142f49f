"""Resizes: resize_bilinear, resize_nearest_neighbor, and their backward ops. The int8 kernels interpolate raw
values with the input's parameters (so the output shares them) and never clamp."""

from __future__ import annotations

from .backward import input_backward
from .base import Builtin, OpDef

_ATTRS = ("align_corners", "half_pixel_centers")


def _resize_backward(bb, op, i, dz):
    """dz scattered back to the source pixels (the int8 resizes never clamp: no mask)."""
    input_backward(bb, op, i, dz, attrs={k: bool(op.attrs.get(k, False)) for k in _ATTRS})


OPS = (
    OpDef("resize_bilinear", signature="x, size -> y", attrs=_ATTRS,
          note="NHWC; size a constant int32[2] = the output's H, W; int8 keeps the input's parameters",
          tflite=(Builtin("RESIZE_BILINEAR", 2, 2),), differentiable=True, shared_qparams="first",
          backward=_resize_backward),
    OpDef("resize_nearest_neighbor", signature="x, size -> y", attrs=_ATTRS,
          note="as resize_bilinear; a copy of the chosen source pixels",
          tflite=(Builtin("RESIZE_NEAREST_NEIGHBOR", 2, 2),), differentiable=True, shared_qparams="first",
          backward=_resize_backward),
    OpDef("resize_bilinear_grad", kind="backward", of="resize_bilinear", signature="dy -> dx", attrs=_ATTRS,
          note="dy scattered to the four source pixels with the float forward's weights"),
    OpDef("resize_nearest_neighbor_grad", kind="backward", of="resize_nearest_neighbor", signature="dy -> dx",
          attrs=_ATTRS, note="dy summed into the copied source pixel"),
)
