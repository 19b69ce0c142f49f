"""Resizes: resize_bilinear, resize_nearest_neighbor, and their backward ops. The int8 kernels interpolate raw
values with the input's parameters (so the output shares them) and never clamp."""

from __future__ import annotations

from .. import grad_ops as go
from ..c_literals import CodegenError
from ..ir import Op
from .backward import input_backward
from .base import Builtin, OpDef, input_dtype

_ATTRS = ("align_corners", "half_pixel_centers")


def _resize_backward(bb, op, i, dz):
    """dz scattered back to the source pixels (the int8 resizes never clamp: no mask)."""
    input_backward(bb, op, i, dz, attrs={k: bool(op.attrs.get(k, False)) for k in _ATTRS})

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


def _c_resize(gen, op: Op, kind: str) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    if gen.same_place(x, y):
        raise CodegenError(f"{op.type} {y!r} planned in place over its input (the kernel cannot)")
    p = _c_resize_params(gen, x, y, op.attrs)
    suffix = "s8" if gen.is_int8(x) else "f32"
    return [f"tt_resize_{kind}_{suffix}(&{p}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_resize_bilinear(gen, op: Op) -> list[str]:
    return _c_resize(gen, op, "bilinear")


def _c_resize_nearest_neighbor(gen, op: Op) -> list[str]:
    return _c_resize(gen, op, "nearest")


def _c_resize_grad(gen, op: Op, kind: str) -> list[str]:
    dy, dx = op.inputs[0], op.outputs[0]
    if gen.same_place(dy, dx):
        raise CodegenError(f"{op.type} {dx!r} planned in place over dy (the kernel cannot)")
    p = _c_resize_params(gen, dx, dy, op.attrs)
    return [f"tt_resize_{kind}_grad_f32(&{p}, {gen.loc(dy)}, {gen.loc(dx)});"]


def _c_resize_bilinear_grad(gen, op: Op) -> list[str]:
    return _c_resize_grad(gen, op, "bilinear")


def _c_resize_nearest_neighbor_grad(gen, op: Op) -> list[str]:
    return _c_resize_grad(gen, op, "nearest")


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
          backward=_resize_backward, c=_c_resize_bilinear, version=_bilinear_version),
    OpDef("resize_nearest_neighbor", signature="x, size -> y", attrs=_ATTRS,
          note="as resize_bilinear; a copy of the chosen source pixels",
          tflite=(Builtin("RESIZE_NEAREST_NEIGHBOR", 2, 2),), differentiable=True, shared_qparams="first",
          backward=_resize_backward, c=_c_resize_nearest_neighbor, version=_nearest_version),
    OpDef("resize_bilinear_grad", kind="backward", of="resize_bilinear", signature="dy -> dx", attrs=_ATTRS,
          note="dy scattered to the four source pixels with the float forward's weights", c=_c_resize_bilinear_grad,
          run=_run_resize_bilinear_grad),
    OpDef("resize_nearest_neighbor_grad", kind="backward", of="resize_nearest_neighbor", signature="dy -> dx",
          attrs=_ATTRS, note="dy summed into the copied source pixel", c=_c_resize_nearest_neighbor_grad,
          run=_run_resize_nearest_neighbor_grad),
)
