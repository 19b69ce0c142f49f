"""TRANSPOSE (rank <= 4) and its backward: pure data movement, so int8 keeps the input's parameters and the gradient
is the transpose by the inverse permutation.

    y[i_0, ..., i_{r-1}] = x[j],   j[perm[k]] = i_k        (numpy: y = x.transpose(perm))

IR operands as in the file (x, perm: a constant int32 vector); the reader resolves `perm` into an attr. The batch
axis stays first (perm[0] == 0): a buffer of B samples is then B transposed samples, as the kernels assume.
"""

from __future__ import annotations

import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions

from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops.backward import input_backward
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype
from tinytrain.stages.ops.movement import forward_call, grad_call

MAX_RANK = 4   # the kernel's view (kernels_c/ops/tt_transpose.c)


def _perm(attrs: dict) -> list[int]:
    return [int(p) for p in attrs["perm"]]


def inverse(perm: list[int]) -> list[int]:
    return [int(k) for k in np.argsort(perm)]


# ---- numpy: forward (float and int8 alike) and backward

def _forward(ctx) -> list[np.ndarray]:
    return [np.ascontiguousarray(ctx.x(0).transpose(_perm(ctx.attrs)))]


def _run_grad(op, v, shape, tensor):
    return [np.ascontiguousarray(v(0).transpose(inverse(_perm(op.attrs)))).astype(np.float32)]


def _backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, attrs={"perm": _perm(op.attrs)})


# ---- .tflite options

def _read(c) -> dict:
    x, p = c.ins[0], c.ins[1]
    if p is None or p.data is None:
        raise c.err("the permutation operand must be a constant")
    perm = [int(k) for k in np.asarray(p.data).reshape(-1)]
    rank = len(x.shape)
    if sorted(perm) != list(range(rank)):
        raise c.err(f"perm {perm} is not a permutation of the input's {rank} axes")
    if rank > MAX_RANK or perm[0] != 0:
        raise c.err(f"perm {perm}: only rank <= {MAX_RANK} with the batch axis first is supported")
    return {"perm": perm}


def _write(b, op):
    tflite.TransposeOptionsStart(b)
    return BuiltinOptions.TransposeOptions, tflite.TransposeOptionsEnd(b)


# ---- C (gen: codegen's generator); kernels_c/ops/tt_transpose.c

def _args(gen, x: str, perm: list[int]) -> str:
    """x's shape and perm as rank-4 tables (lower ranks: leading axes of extent 1 that stay in place)."""
    shape = [int(d) for d in gen.g.tensors[x].shape]
    lead = MAX_RANK - len(shape)
    shape4 = [1] * lead + shape
    perm4 = list(range(lead)) + [lead + k for k in perm]
    return (f"{gen.const_table('tt_tp_shape', 'int32_t', shape4)}, "
            f"{gen.const_table('tt_tp_perm', 'int32_t', perm4)}")


def _c(gen, op: Op) -> list[str]:
    return forward_call(gen, op, "tt_transpose", _args(gen, op.inputs[0], _perm(op.attrs)))


def _c_grad(gen, op: Op) -> list[str]:
    """dx = dy transposed by the inverse permutation (the f32 forward kernel on dy's shape)."""
    return grad_call(gen, op, "tt_transpose_f32", _args(gen, op.inputs[0], inverse(_perm(op.attrs))))


OPS = (
    OpDef("transpose", signature="x, perm -> y", attrs=("perm",),
          note="rank <= 4, batch axis first (perm[0] = 0); int8 keeps the input's parameters",
          tflite=(Builtin("TRANSPOSE", 2, 2),), read_options=_read, write_options=_write,
          version=version_by_dtype({"int8": 2}), differentiable=True, shared_qparams="first",
          forward=_forward, backward=_backward, c=_c),
    OpDef("transpose_grad", kind="backward", of="transpose", signature="dy -> dx", attrs=("perm",),
          note="dy transposed by the inverse permutation", c=_c_grad, run=_run_grad),
)
