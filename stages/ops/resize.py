"""Resizes: resize_bilinear, resize_nearest_neighbor, and their backward ops: the numpy float and int8 kernels (the
executor's; the per-axis source indices and weights are also the backward's, grad_ops), the backward emission and
the C. The int8 kernels interpolate raw values with the input's parameters (so the output shares them) and never
clamp."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.c_emit.literals import CodegenError
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops.backward import input_backward
from tinytrain.stages.ops.base import Builtin, OpDef, input_dtype
from tinytrain.stages.ops.movement import forward_call, grad_call

_ATTRS = ("align_corners", "half_pixel_centers")


def _resize_backward(bb, op, i, dz):
    """dz scattered back to the source pixels (the int8 resizes never clamp: no mask)."""
    input_backward(bb, op, i, dz, attrs={k: bool(op.attrs.get(k, False)) for k in _ATTRS})

# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def resize_bilinear_axis(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool):
    """reference_ops::ResizeBilinear along one axis, in float32 as the reference computes it: per output index the
    source pair (lo, hi) and the weights (1 - (v - lo), v - lo) of v = (i + 0.5) * scale - 0.5 (half pixel) or
    i * scale, scale = in / out or (in - 1) / (out - 1) with align_corners (out > 1). lo = max(floor(v), 0),
    hi = min(ceil(v), in - 1); a v below 0 gives lo = hi = 0 and weights that still sum to 1."""
    scale = np.float32(in_size) / np.float32(out_size)
    if align_corners and out_size > 1:
        scale = np.float32(in_size - 1) / np.float32(out_size - 1)
    i = np.arange(out_size, dtype=np.float32)
    v = ((i + np.float32(0.5)) * scale - np.float32(0.5)) if half_pixel_centers else i * scale
    v = v.astype(np.float32)
    lo = np.maximum(np.floor(v).astype(np.int64), 0)
    hi = np.minimum(np.ceil(v).astype(np.int64), in_size - 1)
    lo = np.minimum(lo, in_size - 1)  # never reached by in-range sizes; keeps a read inside the input
    w_hi = (v - lo.astype(np.float32)).astype(np.float32)
    w_lo = (np.float32(1) - w_hi).astype(np.float32)
    return lo, hi, w_lo, w_hi


def resize_bilinear_axis_int(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool):
    """reference_ops::ResizeBilinearInteger along one axis (TFLite Micro's int8 kernel; LiteRT BUILTIN_REF runs the
    same): scale_10 = round(1024 * in / out) (or (in - 1) / (out - 1) with align_corners), v_10 = i * scale_10
    (+ scale_10 / 2 - 512 with half pixel), lo = max(v_10 / 1024, 0), hi = min((v_10 + 1023) / 1024, in - 1), C
    division (toward zero). Returns lo, hi and the Q10 weights (1024 - (v_10 - 1024 lo), v_10 - 1024 lo)."""
    if align_corners and out_size > 1:
        s10 = (1024 * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        s10 = (1024 * in_size + out_size // 2) // out_size
    i = np.arange(out_size, dtype=np.int64)
    v = i * s10 + (s10 // 2 - 512 if half_pixel_centers else 0)
    lo = np.maximum(_cdiv(v, 1024), 0)
    hi = np.minimum(_cdiv(v + 1023, 1024), in_size - 1)
    lo = np.minimum(lo, in_size - 1)  # as in the float version
    w_hi = v - 1024 * lo
    return lo, hi, 1024 - w_hi, w_hi


def _cdiv(a: np.ndarray, b: int) -> np.ndarray:
    """C's integer division (truncates toward zero), b > 0."""
    return np.where(a >= 0, a // b, -((-a) // b))


def resize_nearest_axis(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    """reference_ops::GetNearestNeighbor per output index, in float32: (i + offset) * scale, rounded half away
    from zero with align_corners, floored otherwise; at most in - 1, and at least 0 with half pixel."""
    if align_corners and out_size > 1:
        scale = np.float32(in_size - 1) / np.float32(out_size - 1)
    else:
        scale = np.float32(in_size) / np.float32(out_size)
    off = np.float32(0.5 if half_pixel_centers else 0.0)
    v = ((np.arange(out_size, dtype=np.float32) + off) * scale).astype(np.float32)
    v64 = v.astype(np.float64)  # std::round (half away from zero), exact for any float32 in double
    idx = (np.sign(v64) * np.floor(np.abs(v64) + 0.5)) if align_corners else np.floor(v64)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    return np.maximum(idx, 0) if half_pixel_centers else idx


def _resize_out_hw(ctx) -> tuple[int, int]:
    y_t = ctx.tout()
    return int(y_t.shape[1]), int(y_t.shape[2])


def _resize_bilinear(ctx) -> list[np.ndarray]:
    """reference_ops::ResizeBilinear (float32: v00·wy0·wx0 + v10·wy1·wx0 + v01·wy0·wx1 + v11·wy1·wx1, left to
    right) and, for int8, reference_ops::ResizeBilinearInteger: Q10 weights, an int64 sum of the four products,
    rounded by ±2^19 away from zero and divided by 2^20 toward zero (the default double-rounding build; both
    TFLite Micro's and LiteRT BUILTIN_REF's int8 kernel). Raw int8 values are interpolated: the output keeps the
    input's (scale, zero point)."""
    x = ctx.x(0)
    a = ctx.attrs
    align, half = bool(a.get("align_corners", False)), bool(a.get("half_pixel_centers", False))
    ih, iw = x.shape[1], x.shape[2]
    oh, ow = _resize_out_hw(ctx)
    if ctx.quantized():
        y0, y1, wy0, wy1 = resize_bilinear_axis_int(ih, oh, align, half)
        x0, x1, wx0, wx1 = resize_bilinear_axis_int(iw, ow, align, half)
        xi = x.astype(np.int64)
        wy0, wy1 = wy0[None, :, None, None], wy1[None, :, None, None]
        wx0, wx1 = wx0[None, None, :, None], wx1[None, None, :, None]
        acc = (xi[:, y0][:, :, x0] * wy0 * wx0 + xi[:, y1][:, :, x0] * wy1 * wx0
               + xi[:, y0][:, :, x1] * wy0 * wx1 + xi[:, y1][:, :, x1] * wy1 * wx1)
        rnd = np.where(acc > 0, 1 << 19, -(1 << 19))
        return [_cdiv(acc + rnd, 1 << 20).astype(np.int8)]
    y0, y1, wy0, wy1 = resize_bilinear_axis(ih, oh, align, half)
    x0, x1, wx0, wx1 = resize_bilinear_axis(iw, ow, align, half)
    xf = x.astype(np.float32)
    wy0, wy1 = wy0[None, :, None, None], wy1[None, :, None, None]
    wx0, wx1 = wx0[None, None, :, None], wx1[None, None, :, None]
    t = xf[:, y0][:, :, x0] * wy0 * wx0
    t = t + xf[:, y1][:, :, x0] * wy1 * wx0
    t = t + xf[:, y0][:, :, x1] * wy0 * wx1
    t = t + xf[:, y1][:, :, x1] * wy1 * wx1
    return [t.astype(np.float32)]


def _resize_nearest_neighbor(ctx) -> list[np.ndarray]:
    """reference_ops::ResizeNearestNeighbor: a copy of the chosen source pixels (int8 keeps the input's
    parameters)."""
    x = ctx.x(0)
    a = ctx.attrs
    align, half = bool(a.get("align_corners", False)), bool(a.get("half_pixel_centers", False))
    oh, ow = _resize_out_hw(ctx)
    iy = resize_nearest_axis(x.shape[1], oh, align, half)
    ix = resize_nearest_axis(x.shape[2], ow, align, half)
    return [x[:, iy][:, :, ix]]


# ---- C (gen: codegen's generator)

def _c_resize_params(gen, x: str, y: str, attrs: dict) -> str:
    """tt_resize_params of a resize from x [N,H,W,C] to y [N,OH,OW,C] (the batch of the planned tensors)."""
    xs, ys = [int(d) for d in gen.g.tensors[x].shape], [int(d) for d in gen.g.tensors[y].shape]
    if len(xs) != 4 or len(ys) != 4 or xs[0] != ys[0] or xs[3] != ys[3]:
        raise CodegenError(f"resize {y!r}: shapes {xs} -> {ys} are not NHWC with equal batch and channels")
    name = gen.uid("tt_rs")
    gen.globals.append(f"static const tt_resize_params {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {ys[1]}, "
                        f"{ys[2]}, {int(bool(attrs.get('align_corners')))}, "
                        f"{int(bool(attrs.get('half_pixel_centers')))}}};")
    return name


def _c_resize(kind: str):
    """The C emitters (forward, gradient) of tt_resize_<kind>: the forward reads x into y, the gradient dy into dx,
    both with the forward's params."""
    def forward(gen, op: Op) -> list[str]:
        p = _c_resize_params(gen, op.inputs[0], op.outputs[0], op.attrs)
        return forward_call(gen, op, f"tt_resize_{kind}", f"&{p}")

    def grad(gen, op: Op) -> list[str]:
        p = _c_resize_params(gen, op.outputs[0], op.inputs[0], op.attrs)
        return grad_call(gen, op, f"tt_resize_{kind}_grad_f32", f"&{p}")
    return forward, grad


_c_resize_bilinear, _c_resize_bilinear_grad = _c_resize("bilinear")
_c_resize_nearest_neighbor, _c_resize_nearest_neighbor_grad = _c_resize("nearest")


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_resize_bilinear_grad(op, v, shape, tensor):
    return [go.resize_bilinear_grad(v(0), shape(op.outputs[0]), op.attrs)]


def _run_resize_nearest_neighbor_grad(op, v, shape, tensor):
    return [go.resize_nearest_neighbor_grad(v(0), shape(op.outputs[0]), op.attrs)]


# ---- TFLite op versions (op_version.cc)

def _resize_version(graph, op, align_corners_counts: bool) -> int:
    """int16 4; half_pixel_centers (nearest: or align_corners) 3; int8 2; else 1."""
    x = input_dtype(graph, op)
    if x == "int16":
        return 4
    if op.attrs.get("half_pixel_centers") or (align_corners_counts and op.attrs.get("align_corners")):
        return 3
    return 2 if x == "int8" else 1


def _bilinear_version(graph, op) -> int:
    return _resize_version(graph, op, False)


def _nearest_version(graph, op) -> int:
    return _resize_version(graph, op, True)


OPS = (
    OpDef("resize_bilinear", signature="x, size -> y", attrs=_ATTRS,
          note="NHWC; size a constant int32[2] = the output's H, W; int8 keeps the input's parameters",
          tflite=(Builtin("RESIZE_BILINEAR", 2, 2),), differentiable=True, shared_qparams="first",
          forward=_resize_bilinear, backward=_resize_backward, c=_c_resize_bilinear, version=_bilinear_version),
    OpDef("resize_nearest_neighbor", signature="x, size -> y", attrs=_ATTRS,
          note="as resize_bilinear; a copy of the chosen source pixels",
          tflite=(Builtin("RESIZE_NEAREST_NEIGHBOR", 2, 2),), differentiable=True, shared_qparams="first",
          forward=_resize_nearest_neighbor, backward=_resize_backward,
          c=_c_resize_nearest_neighbor, version=_nearest_version),
    OpDef("resize_bilinear_grad", kind="backward", of="resize_bilinear", signature="dy -> dx", attrs=_ATTRS,
          note="dy scattered to the four source pixels with the float forward's weights", c=_c_resize_bilinear_grad,
          run=_run_resize_bilinear_grad),
    OpDef("resize_nearest_neighbor_grad", kind="backward", of="resize_nearest_neighbor", signature="dy -> dx",
          attrs=_ATTRS, note="dy summed into the copied source pixel", c=_c_resize_nearest_neighbor_grad,
          run=_run_resize_nearest_neighbor_grad),
)
