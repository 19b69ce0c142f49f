"""SPACE_TO_DEPTH (NHWC, TFLite's order, reference_ops::SpaceToDepth) and its backward: pure data movement, so int8
keeps the input's parameters and the gradient is the inverse permutation, depth_to_space of dy. Models stack k x k
pixel blocks into channels with it ahead of a convolution (MobileDet's stem, YOLO's "focus" layer).

    y[n, h, w, (i*k + j)*C + c] = x[n, h*k + i, w*k + j, c],   k = block_size, H and W multiples of k
"""

from __future__ import annotations

import tflite
from tflite.BuiltinOptions import BuiltinOptions

from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype
from tinytrain.stages.ops.depth_to_space import block, depth_to_space, dims, kernels, space_to_depth
from tinytrain.stages.ops.movement import forward_call, grad_call


# ---- numpy: forward (float and int8 alike) and backward

_forward, _run_grad, _backward = kernels(space_to_depth, depth_to_space)


# ---- .tflite options

def _read(c) -> dict:
    k = int(c.options(tflite.SpaceToDepthOptions, BuiltinOptions.SpaceToDepthOptions).BlockSize())
    c.rank("input", c.ins[0], 4)
    _, h, w, _ = c.ins[0].shape
    if k < 1 or h % k or w % k:
        raise c.err(f"block_size {k} does not divide the input's height {h} and width {w}")
    return {"block_size": k}


def _write(b, op):
    tflite.SpaceToDepthOptionsStart(b)
    tflite.SpaceToDepthOptionsAddBlockSize(b, block(op.attrs))
    return BuiltinOptions.SpaceToDepthOptions, tflite.SpaceToDepthOptionsEnd(b)


# ---- C (gen: codegen's generator); kernels_c/ops/tt_space_to_depth.c

def _c(gen, op: Op) -> list[str]:
    return forward_call(gen, op, "tt_space_to_depth", dims(gen, op.inputs[0], block(op.attrs)))


def _c_grad(gen, op: Op) -> list[str]:
    """dx = depth_to_space(dy): the depth_to_space forward kernel (kernels_c/ops/tt_depth_to_space.c) on dy."""
    return grad_call(gen, op, "tt_depth_to_space_f32", dims(gen, op.inputs[0], block(op.attrs)))


OPS = (
    OpDef("space_to_depth", signature="x[N,H,W,C] -> y[N,H/k,W/k,C*k^2]", attrs=("block_size",),
          note="TFLite's order; int8 keeps the input's parameters",
          tflite=(Builtin("SPACE_TO_DEPTH", 1, 1),), read_options=_read, write_options=_write,
          version=version_by_dtype({"int8": 2}), differentiable=True, shared_qparams="first",
          forward=_forward, backward=_backward, c=_c),
    OpDef("space_to_depth_grad", kind="backward", of="space_to_depth", signature="dy -> dx", attrs=("block_size",),
          note="depth_to_space of dy", c=_c_grad, run=_run_grad),
)
