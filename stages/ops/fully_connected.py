"""fully_connected and its backward ops."""

from __future__ import annotations

import numpy as np

from .base import Builtin, OpDef


def _fc_macs(graph, op) -> int:
    """Each output element sums I products (the weight's inner dimension)."""
    w = graph.tensors[op.inputs[1]].shape
    return int(np.prod(graph.tensors[op.outputs[0]].shape, dtype=np.int64)) * int(w[-1])


OPS = (
    OpDef("fully_connected", signature="x, w[O,I], b? -> y", attrs=("act", "keep_num_dims"),
          tflite=(Builtin("FULLY_CONNECTED", 2, 3),), layer=True, bn_fold=True, out_channel_axis=0,
          differentiable=True, clamp_masked=True, macs=_fc_macs),
    OpDef("fully_connected_grad_input", kind="backward", of="fully_connected", signature="dz, w -> dx",
          grad_input=True),
    OpDef("fully_connected_grad_weight", kind="backward", of="fully_connected", signature="dz, x -> dw",
          attrs=("in_channels",), channel_stream=True),
)
