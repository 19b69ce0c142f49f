"""softmax and its backward op: the numpy float and int8 kernel (the executor's), the backward emission and the C."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import qparams
from tinytrain.stages.ops.backward import unary_backward
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype


def _softmax_backward(bb, op, i, dz):
    """softmax_grad reads the forward output (real-valued)."""
    unary_backward(bb, op, i, dz, reads="y", attrs={"beta": float(op.attrs.get("beta", 1.0))})


# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _softmax(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    beta = float(ctx.attrs.get("beta", 1.0))
    if ctx.quantized():
        s_in, _ = qparams(ctx.tin(0))
        s_out, z_out = qparams(ctx.tout())
        if z_out != -128 or abs(s_out - 1 / 256) > 0.001 / 256:
            raise ValueError(f"int8 softmax output must have scale 1/256 and zero point -128 "
                             f"(got {s_out}, {z_out})")
        mult, left_shift, diff_min = ia.softmax_params(beta, s_in)
        return [ia.softmax_int8(x, mult, left_shift, diff_min)]
    xf = x.astype(np.float32)
    mx = xf.max(axis=-1, keepdims=True)
    e = np.exp((xf - mx) * np.float32(beta)).astype(np.float32)
    total = np.zeros(xf.shape[:-1] + (1,), dtype=np.float32)
    for c in range(xf.shape[-1]):  # the reference sums in order
        total += e[..., c:c + 1]
    return [(e / total).astype(np.float32)]


# ---- C (gen: codegen's generator)

def _c_softmax(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    xs = gen.g.tensors[x].shape
    depth = xs[-1]
    rows = numel(xs) // depth
    beta = float(op.attrs.get("beta", 1.0))
    if gen.is_int8(x):
        m, ls, dmin = ia.softmax_params(beta, gen.qp(x)[0])
        return [f"tt_softmax_s8({rows}, {depth}, {m}, {ls}, {dmin}, {gen.loc(x)}, {gen.loc(y)});"]
    return [f"tt_softmax_f32({rows}, {depth}, {flit(beta)}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_softmax_grad(gen, op: Op) -> list[str]:
    dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    ys = gen.g.tensors[y].shape
    return [f"tt_softmax_grad_f32({numel(ys) // ys[-1]}, {ys[-1]}, {flit(op.attrs.get('beta', 1.0))}, "
            f"{gen.loc(dy)}, {gen.loc(y)}, {gen.loc(dx)});"]


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_softmax_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.softmax_grad(v(0), v(1), a.get("beta", 1.0))]


# ---- TFLite op versions (op_version.cc)


OPS = (
    OpDef("softmax", signature="x -> y", attrs=("beta",), tflite=(Builtin("SOFTMAX", 1, 1),),
          differentiable=True, fixed_output=(1.0 / 256.0, -128), dropped_by="cross_entropy", forward=_softmax,
          backward=_softmax_backward,
          c=_c_softmax,
          version=version_by_dtype({"int8": 2, "int16": 3})),
    OpDef("softmax_grad", kind="backward", of="softmax", signature="dy, y -> dx", attrs=("beta",), c=_c_softmax_grad,
          run=_run_softmax_grad),
)
