"""Pooling and reduction: average_pool2d, max_pool2d, mean, and their backward ops; their numpy float and int8
kernels (the executor's), the backward emission and the C of the forward and gradient calls."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import FLOAT_BOUNDS, CodegenError, flit
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import float_act, qparams
from tinytrain.stages.ops.backward import geometry, input_backward
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype
from tinytrain.stages.ops.layer_common import padded, spatial, tap


# ---- backward: the gradient of the input, with the forward's pooling attrs; max pool reads its input (int8 as it
# is: only the argmax matters), mean its axes

def _avg_pool_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, attrs=geometry(op))


def _max_pool_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[0],), attrs=geometry(op))


def _mean_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[1],), attrs=geometry(op))


_POOL = ("filter_h", "filter_w", "stride_h", "stride_w", "padding", "act")

# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _pool_windows(ctx, x: np.ndarray, pad_value):
    a = ctx.attrs
    kh, kw = int(a["filter_h"]), int(a["filter_w"])
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    oh, ow, pt, pl = spatial(ctx, x, kh, kw, sh, sw)
    xp, mask = padded(x, oh, ow, pt, pl, kh, kw, sh, sw, 1, 1, pad_value)
    # Row by row over the window, as the reference loops (filter_y, filter_x).
    for ky in range(kh):
        for kx in range(kw):
            yield tap(xp, ky, kx, oh, ow, sh, sw, 1, 1), tap(mask, ky, kx, oh, ow, sh, sw, 1, 1)[None, :, :, None]


def _average_pool2d(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        acc = count = 0
        for patch, valid in _pool_windows(ctx, x.astype(np.int64), 0):
            acc = acc + patch
            count = count + valid.astype(np.int64)
        count = np.broadcast_to(count, acc.shape)
        half = count // 2
        # reference_integer_ops::AveragePool: round half away from zero with C's truncating division.
        avg = np.where(acc > 0, (acc + half) // count, -((half - acc) // count))
        lo, hi = ia.activation_range(act, *qparams(ctx.tout()))
        return [np.clip(avg, lo, hi).astype(np.int8)]
    acc = count = None
    for patch, valid in _pool_windows(ctx, x.astype(np.float32), 0.0):
        acc = patch.copy() if acc is None else acc + patch  # out-of-image taps add +0.0: a no-op
        count = valid.astype(np.float32) if count is None else count + valid
    return [float_act((acc / count).astype(np.float32), act)]


def _max_pool2d(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        out = None
        for patch, valid in _pool_windows(ctx, x.astype(np.int64), -128):
            out = patch if out is None else np.maximum(out, patch)
        lo, hi = ia.activation_range(act, *qparams(ctx.tout()))
        return [np.clip(out, lo, hi).astype(np.int8)]
    low = np.finfo(np.float32).min
    out = None
    for patch, valid in _pool_windows(ctx, x.astype(np.float32), low):
        out = patch if out is None else np.maximum(out, patch)
    return [float_act(out, act).astype(np.float32)]


def _mean(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    axes_arr = ctx.x(1)
    if axes_arr is None:
        raise ValueError("MEAN needs a constant axes operand")
    rank = x.ndim
    axes = sorted({int(a) % rank for a in np.asarray(axes_arr).reshape(-1)})
    if 0 in axes:
        raise NotImplementedError("MEAN over the batch axis (the result would depend on the batch size)")
    keep = [d for d in range(rank) if d not in axes]
    moved = np.transpose(x, keep + axes)
    outer = moved.shape[:len(keep)]
    count = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    flat = moved.reshape(outer + (count,))
    y_t = ctx.tout()
    if ctx.quantized():
        s_in, z_in = qparams(ctx.tin(0))
        s_out, z_out = qparams(y_t)
        total = ia.wrap32(flat.astype(np.int64).sum(axis=-1))
        out = _quantized_mean(total, count, s_in, z_in, s_out, z_out)
    else:
        # ReduceSumImpl visits the input in row-major order: a sequential float32 sum over the reduced positions.
        acc = np.zeros(outer, dtype=np.float32)
        ff = flat.astype(np.float32)
        for r in range(count):
            acc += ff[..., r]
        out = (acc / np.float32(count)).astype(np.float32)
    return [out.reshape((x.shape[0],) + tuple(y_t.shape[1:]))]


def mean_params(count: int, s_in: float, s_out: float) -> tuple[int, int]:
    """reduce.cc PrepareMeanOrSum's (multiplier, shift) of s_in / s_out with the 1/count folded in by an int64
    division; the shift is clamped so the result stays a valid MultiplyByQuantizedMultiplier operand (one
    computation for the numpy kernel and the C)."""
    mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
    extra = min(count.bit_length() - 1, 32, 31 + shift)
    mult = int((mult << extra) // count) if extra >= 0 else int((mult >> -extra) // count)
    return mult, shift - extra


def _quantized_mean(total: np.ndarray, count: int, s_in: float, z_in: int, s_out: float, z_out: int) -> np.ndarray:
    """reference_ops::QuantizedMeanOrSum (integer version): the sum relative to the zero point, rescaled by
    mean_params."""
    mult, shift = mean_params(count, s_in, s_out)
    shifted_sum = ia.wrap32(total - z_in * count)
    out = ia.multiply_by_quantized_multiplier(shifted_sum, mult, shift) + z_out
    return np.clip(out, -128, 127).astype(np.int8)


# ---- C (gen: codegen's generator)

def _c_pool_dims(gen, op: Op, x: str) -> str:
    a = op.attrs
    xs = gen.g.tensors[x].shape
    kh, kw, sh, sw = int(a["filter_h"]), int(a["filter_w"]), int(a["stride_h"]), int(a["stride_w"])
    oh, pt = out_size_and_pad(a["padding"], xs[1], kh, sh, 1)
    ow, pl = out_size_and_pad(a["padding"], xs[2], kw, sw, 1)
    name = gen.uid("tt_pd")
    gen.globals.append(f"static const tt_pool_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {oh}, {ow}, "
                        f"{kh}, {kw}, {sh}, {sw}, {pt}, {pl}}};")
    return name


def _c_pool(gen, op: Op, kind: str) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    d = _c_pool_dims(gen, op, x)
    act = op.attrs.get("act", "none")
    if gen.is_int8(x):
        lo, hi = ia.activation_range(act, *gen.qp(y))
        return [f"tt_{kind}_s8(&{d}, {lo}, {hi}, {gen.loc(x)}, {gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    if kind == "max_pool2d" and (fp16_io.is_f16(gen, x) or gen.g.tensors[y].dtype == "float16"):
        # fp16-mixed: OpDef.fp16_operands / fp16_output (max_pool2d only)
        return [f"tt_max_pool2d_f16(&{d}, {flit(lo)}, {flit(hi)}, {fp16_io.pair(gen, x)}, "
                f"{fp16_io.pair(gen, y, True)});"]
    return [f"tt_{kind}_f32(&{d}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_average_pool2d(gen, op: Op) -> list[str]:
    return _c_pool(gen, op, "average_pool2d")


def _c_max_pool2d(gen, op: Op) -> list[str]:
    return _c_pool(gen, op, "max_pool2d")


def _c_mean_axes(gen, op: Op) -> tuple[int, int, int, int]:
    x = op.inputs[0]
    xs = gen.g.tensors[x].shape
    axes = sorted({int(v) % len(xs) for v in np.asarray(gen.g.tensors[op.inputs[1]].data).reshape(-1)})
    if len(xs) != 4 or axes != [1, 2]:
        raise CodegenError(f"mean over axes {axes} of a rank-{len(xs)} tensor (only H, W of NHWC)")
    return xs[0], xs[1], xs[2], xs[3]


def _c_mean(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    b, h, w, c = _c_mean_axes(gen, op)
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_out, z_out = gen.qp(y)
        mult, shift = mean_params(h * w, s_in, s_out)
        name = gen.uid("tt_mp")
        gen.globals.append(f"static const tt_mean_params_s8 {name} = {{{z_in}, {z_out}, {mult}, {shift}}};")
        return [f"tt_mean_hw_s8(&{name}, {b}, {h}, {w}, {c}, {gen.loc(x)}, {gen.loc(y)});"]
    if fp16_io.is_f16(gen, x):   # fp16-mixed: x widened as it is read (OpDef.fp16_operands)
        return [f"tt_mean_hw_hx_f32({b}, {h}, {w}, {c}, {fp16_io.loc(gen, x)}, {gen.loc(y)});"]
    return [f"tt_mean_hw_f32({b}, {h}, {w}, {c}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_average_pool2d_grad(gen, op: Op) -> list[str]:
    dy, dx = op.inputs[0], op.outputs[0]
    d = _c_pool_dims(gen, op, dx)
    return [f"tt_average_pool2d_grad_f32(&{d}, {gen.loc(dy)}, {gen.loc(dx)});"]


def _c_max_pool2d_grad(gen, op: Op) -> list[str]:
    dy, x, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    d = _c_pool_dims(gen, op, x)
    if gen.is_int8(x):
        return [f"tt_max_pool2d_grad_s8(&{d}, {gen.loc(dy)}, {gen.loc(x)}, {gen.loc(dx)});"]
    if fp16_io.is_f16(gen, dy):   # fp16-mixed: an fp16 dy (OpDef.fp16_operands), widened where it is added
        return [f"tt_max_pool2d_grad_hdy(&{d}, {fp16_io.loc(gen, dy)}, {fp16_io.pair(gen, x)}, {gen.loc(dx)});"]
    if x in gen.fused:   # fp16-mixed: the saved fp16 input itself (planning/fp16_memory.fused_widen)
        return [f"tt_max_pool2d_grad_f16(&{d}, {gen.loc(dy)}, {gen.loc(gen.fused[x])}, {gen.loc(dx)});"]
    return [f"tt_max_pool2d_grad_f32(&{d}, {gen.loc(dy)}, {gen.loc(x)}, {gen.loc(dx)});"]


def _c_mean_grad(gen, op: Op) -> list[str]:
    dy, dx = op.inputs[0], op.outputs[0]
    xs = gen.g.tensors[dx].shape
    axes = sorted({int(v) % len(xs) for v in np.asarray(gen.g.tensors[op.inputs[1]].data).reshape(-1)})
    if len(xs) != 4 or axes != [1, 2]:
        raise CodegenError("mean_grad other than over H, W")
    if fp16_io.is_f16(gen, dy):   # fp16-mixed: dy widened as it is read (OpDef.fp16_operands), dx either
        return [f"tt_mean_hw_grad_f16({xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {fp16_io.pair(gen, dy)}, "
                f"{fp16_io.pair(gen, dx, True)});"]
    fn = "tt_mean_hw_grad_f32_hy" if gen.g.tensors[dx].dtype == "float16" else "tt_mean_hw_grad_f32"
    return [f"{fn}({xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {gen.loc(dy)}, {gen.loc(dx)});"]


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_average_pool2d_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.average_pool2d_grad(v(0), shape(op.outputs[0]), a)]


def _run_max_pool2d_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.max_pool2d_grad(v(0), v(1), a)]


def _run_mean_grad(op, v, shape, tensor):
    return [go.mean_grad(v(0), shape(op.outputs[0]), v(1))]


# ---- TFLite op versions (op_version.cc)


OPS = (
    OpDef("average_pool2d", row_stream="pool", signature="x -> y", attrs=_POOL, tflite=(Builtin("AVERAGE_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first", forward=_average_pool2d, backward=_avg_pool_backward,
          c=_c_average_pool2d, version=version_by_dtype({"int8": 2, "int16": 3})),
    OpDef("max_pool2d", row_stream="pool", signature="x -> y", attrs=_POOL, tflite=(Builtin("MAX_POOL_2D", 1, 1),),
          differentiable=True, shared_qparams="first", forward=_max_pool2d, backward=_max_pool_backward,
          c=_c_max_pool2d, version=version_by_dtype({"int8": 2, "int16": 3}), fp16_operands=(0,), fp16_output=True),
    OpDef("mean", signature="x, axes -> y", attrs=("keep_dims",), tflite=(Builtin("MEAN", 2, 2),),
          differentiable=True, clamp_masked=True, forward=_mean, backward=_mean_backward, fp16_operands=(0,),
          c=_c_mean, version=version_by_dtype({"int8": 2, "int16": 3})),
    OpDef("average_pool2d_grad", kind="backward", of="average_pool2d", signature="dz -> dx",
          attrs=("the forward's pooling attrs",), c=_c_average_pool2d_grad, run=_run_average_pool2d_grad),
    OpDef("max_pool2d_grad", kind="backward", of="max_pool2d", signature="dz, x -> dx",
          attrs=("the forward's pooling attrs",), fp16_operands=(0, 1), c=_c_max_pool2d_grad,
          run=_run_max_pool2d_grad),
    OpDef("mean_grad", kind="backward", of="mean", signature="dy, axes -> dx", broadcasts=True, c=_c_mean_grad,
          run=_run_mean_grad, fp16_operands=(0,), fp16_output=True),
)
