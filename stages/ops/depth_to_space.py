"""DEPTH_TO_SPACE (NHWC, TFLite's DCR order) and its backward: pure data movement, so int8 keeps the input's
parameters and the gradient is the inverse permutation (space_to_depth of dy).

    y[n, h*k + i, w*k + j, c] = x[n, h, w, (i*k + j)*C_out + c],   C_out = C_in / k^2,  k = block_size
"""

from __future__ import annotations

import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions

from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops.backward import input_backward
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype
from tinytrain.stages.ops.movement import forward_call, grad_call


def block(attrs: dict) -> int:
    """The op's block size k (depth_to_space and its inverse, space_to_depth)."""
    return int(attrs["block_size"])


# ---- numpy: forward (float and int8 alike) and backward

def depth_to_space(x: np.ndarray, k: int) -> np.ndarray:
    n, h, w, c = x.shape
    return x.reshape(n, h, w, k, k, c // (k * k)).transpose(0, 1, 3, 2, 4, 5).reshape(n, h * k, w * k, c // (k * k))


def space_to_depth(y: np.ndarray, k: int) -> np.ndarray:
    n, hk, wk, c = y.shape
    return y.reshape(n, hk // k, k, wk // k, k, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, hk // k, wk // k, k * k * c)


def kernels(move, inverse):
    """The numpy forward, the training executor's gradient kernel and the backward emission of a block op that moves
    data by `move` and whose gradient is `inverse` of dy (depth_to_space and space_to_depth: each the other's)."""
    def forward(ctx) -> list[np.ndarray]:
        return [move(ctx.x(0), block(ctx.attrs))]

    def run_grad(op, v, shape, tensor):
        return [inverse(v(0), block(op.attrs)).astype(np.float32)]

    def backward(bb, op, i, dz):
        input_backward(bb, op, i, dz, attrs={"block_size": block(op.attrs)})
    return forward, run_grad, backward


_forward, _run_grad, _backward = kernels(depth_to_space, space_to_depth)


# ---- .tflite options

def _read(c) -> dict:
    k = int(c.options(tflite.DepthToSpaceOptions, BuiltinOptions.DepthToSpaceOptions).BlockSize())
    c.rank("input", c.ins[0], 4)
    if k < 1 or c.ins[0].shape[3] % (k * k):
        raise c.err(f"block_size {k} does not divide the input's {c.ins[0].shape[3]} channels into k^2 groups")
    return {"block_size": k}


def _write(b, op):
    tflite.DepthToSpaceOptionsStart(b)
    tflite.DepthToSpaceOptionsAddBlockSize(b, block(op.attrs))
    return BuiltinOptions.DepthToSpaceOptions, tflite.DepthToSpaceOptionsEnd(b)


# ---- C (gen: codegen's generator); kernels_c/ops/tt_depth_to_space.c

def dims(gen, x: str, k: int) -> str:
    """The C kernels' leading arguments: x's NHWC dims and k (the kernels of both block ops take them)."""
    n, h, w, c = (int(d) for d in gen.g.tensors[x].shape)
    return f"{n}, {h}, {w}, {c}, {k}"


def _c(gen, op: Op) -> list[str]:
    return forward_call(gen, op, "tt_depth_to_space", dims(gen, op.inputs[0], block(op.attrs)))


def _c_grad(gen, op: Op) -> list[str]:
    """dx = space_to_depth(dy): the space_to_depth forward kernel (kernels_c/ops/tt_space_to_depth.c) on dy."""
    return grad_call(gen, op, "tt_space_to_depth_f32", dims(gen, op.inputs[0], block(op.attrs)))


OPS = (
    OpDef("depth_to_space", signature="x[N,H,W,C] -> y[N,H*k,W*k,C/k^2]", attrs=("block_size",),
          note="TFLite's DCR order; int8 keeps the input's parameters",
          tflite=(Builtin("DEPTH_TO_SPACE", 1, 1),), read_options=_read, write_options=_write,
          version=version_by_dtype({"int8": 2}), differentiable=True, shared_qparams="first",
          forward=_forward, backward=_backward, c=_c),
    OpDef("depth_to_space_grad", kind="backward", of="depth_to_space", signature="dy -> dx", attrs=("block_size",),
          note="space_to_depth of dy", c=_c_grad, run=_run_grad),
)
