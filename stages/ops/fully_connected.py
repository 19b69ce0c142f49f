"""fully_connected and its backward ops."""

from __future__ import annotations

import numpy as np

from .. import grad_ops as go
from . import fc_grad
from .backward import LayerBackward
from .base import Builtin, OpDef, input_dtype


def _fc_macs(graph, op) -> int:
    """Each output element sums I products (the weight's inner dimension)."""
    w = graph.tensors[op.inputs[1]].shape
    return int(np.prod(graph.tensors[op.outputs[0]].shape, dtype=np.int64)) * int(w[-1])


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_fully_connected_grad_input(op, v, shape, tensor):
    return [go.fully_connected_grad_input(v(0), v(1), shape(op.outputs[0]))]


def _run_fully_connected_grad_weight(op, v, shape, tensor):
    a = op.attrs
    return [go.fully_connected_grad_weight(v(0), v(1), list(a["w_shape"]), a.get("in_channels"))]


# ---- TFLite op versions (op_version.cc)

def _fc_version(graph, op) -> int:
    if op.attrs.get("keep_num_dims"):
        return 5
    return {"int8": 4, "int16": 7}.get(input_dtype(graph, op), 1)


OPS = (
    OpDef("fully_connected", signature="x, w[O,I], b? -> y", attrs=("act", "keep_num_dims"),
          tflite=(Builtin("FULLY_CONNECTED", 2, 3),), layer=True, bn_fold=True, out_channel_axis=0,
          differentiable=True, clamp_masked=True, macs=_fc_macs, version=_fc_version,
          backward=LayerBackward(flat=True)),
    OpDef("fully_connected_grad_input", kind="backward", of="fully_connected", signature="dz, w -> dx",
          grad_input=True, run=_run_fully_connected_grad_input, c=fc_grad.c_fully_connected_grad_input),
    OpDef("fully_connected_grad_weight", kind="backward", of="fully_connected", signature="dz, x -> dw",
          attrs=("in_channels",), channel_stream=True, run=_run_fully_connected_grad_weight, c=fc_grad.c_fully_connected_grad_weight),
)
