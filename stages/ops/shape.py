"""Data movement: reshape, pad, concatenation, strided_slice, and their backward ops: their numpy float and int8
kernels (the executor's), the backward emission and the C of the forward and gradient calls."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import FLOAT_BOUNDS, CodegenError, flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import float_act, qparams
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.ops.backward import input_backward
from tinytrain.stages.ops.base import Builtin, OpDef, input_dtype, output_dtype, version_by_dtype
from tinytrain.stages.ops.movement import forward_call, grad_call


# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _reshape(ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    new_shape = list(ctx.attrs.get("new_shape") or ctx.tout().shape)
    return [x.reshape([x.shape[0]] + new_shape[1:])]


def _pad(ctx) -> list[np.ndarray]:
    x, paddings = ctx.x(0), ctx.x(1)
    if paddings is None:
        raise ValueError("PAD needs a constant paddings operand")
    p = np.asarray(paddings).reshape(x.ndim, 2).astype(np.int64)
    if p[0].any():
        raise NotImplementedError("PAD of the batch axis")
    if (p < 0).any():
        raise ValueError("negative paddings")
    # Quantized PAD pads with the output zero point (the real value 0); float pads with 0.0.
    value = qparams(ctx.tout())[1] if ctx.quantized() else 0.0
    return [np.pad(x, [tuple(r) for r in p], constant_values=value).astype(x.dtype)]


def _concatenation(ctx) -> list[np.ndarray]:
    names = [n for n in ctx.op.inputs if n is not None]
    xs = [ctx.values[n] for n in names]
    axis = int(ctx.attrs.get("axis", -1)) % xs[0].ndim
    if axis == 0:
        raise NotImplementedError("CONCATENATION along the batch axis")
    act = ctx.attrs.get("act", "none")
    n = max(x.shape[0] for x in xs)
    xs = [np.broadcast_to(x, (n,) + x.shape[1:]) if x.shape[0] != n else x for x in xs]
    if ctx.tout().dtype == "int8":
        so, zo = qparams(ctx.tout())
        parts = []
        for name, x in zip(names, xs):
            si, zi = qparams(ctx.graph.tensors[name])
            if si == so and zi == zo:
                parts.append(x.astype(np.int64))
            else:
                # reference_ops::ConcatenationWithScaling (float math; LiteRT's and TFLM's int8 kernels require
                # equal parameters and never get here, the converter guarantees them).
                inv = np.float32(1.0) / np.float32(so)
                scale = np.float32(np.float32(si) * inv)
                bias = np.float32(np.float32(-zi) * scale)
                q = ia.round_half_away_array((x.astype(np.float32) * scale + bias).astype(np.float32)) + zo
                parts.append(np.clip(q, -128, 127))
        out = np.concatenate(parts, axis=axis)
        lo, hi = ia.activation_range(act, so, zo)
        return [np.clip(out, lo, hi).astype(np.int8)]
    out = np.concatenate([x.astype(np.float32) for x in xs], axis=axis)
    return [float_act(out, act).astype(np.float32)]


def _strided_slice(ctx) -> list[np.ndarray]:
    """reference_ops::StridedSlice: a copy of the selected elements (int8 keeps the input's parameters). The
    reader resolved begin/end/masks into per-axis (start, stop, step); axis 0 (the batch) is always whole."""
    x = ctx.x(0)
    a = ctx.attrs
    out = x
    for ax in range(1, x.ndim):
        idx = np.arange(int(a["starts"][ax]), int(a["stops"][ax]), int(a["strides"][ax]))
        out = np.take(out, idx, axis=ax)
    y_t = ctx.tout()
    return [out.reshape((x.shape[0],) + tuple(y_t.shape[1:]))]


# ---- backward: dz moved back to the input's place (pad: reads the paddings; concatenation: one share per operand)

def _reshape_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz)


def _pad_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[1],))


def _concatenation_backward(bb, op, i, dz):
    ins = [n for n in op.inputs if n is not None]
    axis = int(op.attrs.get("axis", -1)) % len(bb.g.tensors[op.outputs[0]].shape)
    outs = [bb.share(n, i) for n in ins]
    if any(outs):
        bb.emit("concatenation_grad", [dz], [o for o in outs if o], axis=axis,
                sizes=[int(bb.g.tensors[n].shape[axis]) for n in ins], which=[j for j, o in enumerate(outs) if o])


def _strided_slice_backward(bb, op, i, dz):
    a = op.attrs
    input_backward(bb, op, i, dz, attrs=dict(starts=[int(v) for v in a["starts"]], stops=[int(v) for v in a["stops"]],
                                             strides=[int(v) for v in a["strides"]]))


# ---- C (gen: codegen's generator)

def _c_reshape(gen, op: Op) -> list[str]:
    return gen.copy_call(op.inputs[0], op.outputs[0])


def _c_reshape_grad(gen, op: Op) -> list[str]:
    return gen.copy_call(op.inputs[0], op.outputs[0])


def _c_pads(gen, x: str, p: str) -> tuple[str, str]:
    xs = list(gen.g.tensors[x].shape)
    pads = np.asarray(gen.g.tensors[p].data).reshape(len(xs), 2).astype(int).tolist()
    while len(xs) < 4:
        xs.insert(0, 1)
        pads.insert(0, [0, 0])
    shp = gen.const_table("tt_shape", "int32_t", xs)
    pd = gen.const_table("tt_pads", "int32_t", [v for pr in pads for v in pr])
    return shp, pd


def _c_pad(gen, op: Op) -> list[str]:
    x, p, y = op.inputs[0], op.inputs[1], op.outputs[0]
    shp, pd = _c_pads(gen, x, p)
    if gen.is_int8(x):
        return [f"tt_pad_s8({shp}, {pd}, {gen.qp(y)[1]}, {gen.loc(x)}, {gen.loc(y)});"]
    if fp16_io.is_f16(gen, x) or gen.g.tensors[y].dtype == "float16":   # fp16-mixed: OpDef.fp16_operands / _output
        return [f"tt_pad_f16({shp}, {pd}, 0.0f, {fp16_io.pair(gen, x)}, {fp16_io.pair(gen, y, True)});"]
    return [f"tt_pad_f32({shp}, {pd}, 0.0f, {gen.loc(x)}, {gen.loc(y)});"]


def _c_pad_grad(gen, op: Op) -> list[str]:
    dy, p, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    shp, pd = _c_pads(gen, dx, p)
    if fp16_io.is_f16(gen, dy) or gen.g.tensors[dx].dtype == "float16":   # fp16-mixed: fp16 gradients
        return [f"tt_pad_grad_f16({shp}, {pd}, {fp16_io.pair(gen, dy)}, {fp16_io.pair(gen, dx, True)});"]
    return [f"tt_pad_grad_f32({shp}, {pd}, {gen.loc(dy)}, {gen.loc(dx)});"]


def _c_concat_geo(gen, names: list[str], axis: int, out: str) -> tuple[str, int]:
    ys = gen.g.tensors[out].shape
    axis %= len(ys)
    outer = numel(ys[:axis])
    inner = [numel(gen.g.tensors[n].shape[axis:]) for n in names]
    return gen.const_table("tt_inner", "int32_t", inner), outer


def _c_concatenation(gen, op: Op) -> list[str]:
    names = [n for n in op.inputs if n is not None]
    y = op.outputs[0]
    inner, outer = _c_concat_geo(gen, names, int(op.attrs.get("axis", -1)), y)
    act = op.attrs.get("act", "none")
    ptrs = gen.uid("tt_in")
    ct = gen.ctype(y)
    lines = [f"{{ const {ct} *const {ptrs}[{len(names)}] = {{{', '.join(gen.loc(n) for n in names)}}};"]
    if gen.is_int8(y):
        so, zo = gen.qp(y)
        same = all(gen.qp(n) == (so, zo) for n in names) and act == "none"
        q = "0"
        if not same:
            sc = gen.const_table("tt_cs", "float", [gen.qp(n)[0] for n in names])
            zp = gen.const_table("tt_cz", "int32_t", [gen.qp(n)[1] for n in names])
            lo, hi = ia.activation_range(act, so, zo)
            q = gen.uid("tt_cq")
            gen.globals.append(f"static const tt_concat_params_s8 {q} = {{{sc}, {zp}, {flit(so)}, {zo}, "
                                f"{lo}, {hi}}};")
            q = "&" + q
        lines.append(f"  tt_concatenation_s8({len(names)}, {ptrs}, {inner}, {outer}, {q}, {gen.loc(y)}); }}")
    else:
        lo, hi = FLOAT_BOUNDS[act]
        lines.append(f"  tt_concatenation_f32({len(names)}, {ptrs}, {inner}, {outer}, {flit(lo)}, {flit(hi)}, "
                     f"{gen.loc(y)}); }}")
    return lines


def _c_concatenation_grad(gen, op: Op) -> list[str]:
    dy = op.inputs[0]
    sizes, axis, which = op.attrs["sizes"], int(op.attrs["axis"]), op.attrs["which"]
    ys = gen.g.tensors[dy].shape
    axis %= len(ys)
    outer = numel(ys[:axis])
    rest = numel(ys[axis + 1:])
    inner = gen.const_table("tt_inner", "int32_t", [int(s) * rest for s in sizes])
    # Parts that need no gradient (not in `which`) get NULL: the kernel skips them.
    dst = ["0"] * len(sizes)
    for j, name in zip(which, op.outputs):
        dst[int(j)] = gen.loc(name)
    ptrs = gen.uid("tt_out")
    return [f"{{ float *const {ptrs}[{len(sizes)}] = {{{', '.join(dst)}}};",
            f"  tt_concatenation_grad_f32({len(sizes)}, {inner}, {outer}, {gen.loc(dy)}, {ptrs}); }}"]


def _c_slice_params(gen, x: str, y: str, attrs: dict) -> str:
    """tt_strided_slice_params: x's rank-4 view; axis 0 (the batch) whole as in the executor, the others the
    reader's resolved (start, stop, step); a shrunk axis has extent 1."""
    xs = [int(d) for d in gen.g.tensors[x].shape]
    if len(xs) > 4:
        raise CodegenError(f"strided_slice of a rank-{len(xs)} tensor (at most 4)")
    ext, start, stride = [xs[0]], [0], [1]
    for ax in range(1, len(xs)):
        a, b, st = int(attrs["starts"][ax]), int(attrs["stops"][ax]), int(attrs["strides"][ax])
        ext.append(len(range(a, b, st)))
        start.append(a)
        stride.append(st)
    if numel(ext) != numel(gen.g.tensors[y].shape):
        raise CodegenError(f"strided_slice {y!r}: {ext} does not match the output {gen.g.tensors[y].shape}")
    k = 4 - len(xs)
    xs, ext, start, stride = [1] * k + xs, [1] * k + ext, [0] * k + start, [1] * k + stride
    name = gen.uid("tt_ss")
    gen.globals.append(f"static const tt_strided_slice_params {name} = {{{{{', '.join(map(str, xs))}}}, "
                        f"{{{', '.join(map(str, ext))}}}, {{{', '.join(map(str, start))}}}, "
                        f"{{{', '.join(map(str, stride))}}}}};")
    return name


def _c_strided_slice(gen, op: Op) -> list[str]:
    p = _c_slice_params(gen, op.inputs[0], op.outputs[0], op.attrs)
    return forward_call(gen, op, "tt_strided_slice", f"&{p}")


def _c_strided_slice_grad(gen, op: Op) -> list[str]:
    p = _c_slice_params(gen, op.outputs[0], op.inputs[0], op.attrs)
    return grad_call(gen, op, "tt_strided_slice_grad_f32", f"&{p}")


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_reshape_grad(op, v, shape, tensor):
    return [go.reshape_grad(v(0), shape(op.outputs[0]))]


def _run_pad_grad(op, v, shape, tensor):
    return [go.pad_grad(v(0), v(1))]


def _run_concatenation_grad(op, v, shape, tensor):
    a = op.attrs
    parts = go.concatenation_grad(v(0), a["sizes"], a["axis"])
    return [parts[j] for j in a["which"]]


def _run_strided_slice_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.strided_slice_grad(v(0), shape(op.outputs[0]), a["starts"], a["stops"], a["strides"])]


# ---- TFLite op versions (op_version.cc)

def _strided_slice_version(graph, op) -> int:
    if op.attrs.get("offset"):
        return 7
    return {"int8": 2, "int16": 4}.get(input_dtype(graph, op), 1)


PAD = OpDef("pad", row_stream="local", signature="x, paddings[N,2] -> y",
            tflite=(Builtin("PAD", 2, 2), Builtin("PADV2", 2, 3)), differentiable=True, shared_qparams="first",
            forward=_pad, backward=_pad_backward, c=_c_pad, version=version_by_dtype({"int8": 2, "int16": 3}),
            fp16_operands=(0,), fp16_output=True)
STRIDED_SLICE = OpDef("strided_slice", signature="x, begin, end, strides -> y",
                      attrs=("starts", "stops", "strides", "begin_mask", "end_mask", "ellipsis_mask",
                             "new_axis_mask", "shrink_axis_mask", "offset"),
                      note="starts/stops/strides per axis, resolved by the reader with TFLite's "
                           "StartForAxis/StopForAxis against the static shape (a negative stride stops before "
                           "`stops`, -1 meaning past index 0); the masks and offset as in the file, for the writer; "
                           "axis 0 is always taken whole",
                      tflite=(Builtin("STRIDED_SLICE", 4, 4),), differentiable=True, shared_qparams="first",
                      forward=_strided_slice, backward=_strided_slice_backward, c=_c_strided_slice,
                      version=_strided_slice_version)

OPS = (
    OpDef("reshape", signature="x, shape? -> y", attrs=("new_shape",),
          note="new_shape is the output shape, always present", tflite=(Builtin("RESHAPE", 1, 2),),
          differentiable=True, shared_qparams="first", in_place="any", forward=_reshape,
          backward=_reshape_backward, c=_c_reshape),
    PAD,
    OpDef("concatenation", signature="x0, x1, ... -> y", attrs=("axis", "act"),
          tflite=(Builtin("CONCATENATION", 1, 1 << 16),), differentiable=True, shared_qparams="all",
          const_operands_per_tensor=True, forward=_concatenation, backward=_concatenation_backward,
          c=_c_concatenation, version=version_by_dtype({"int8": 2, "int16": 3}, of=output_dtype)),
    STRIDED_SLICE,
    OpDef("reshape_grad", kind="backward", of="reshape", signature="dy -> dx", in_place="any", c=_c_reshape_grad,
          run=_run_reshape_grad),
    OpDef("pad_grad", kind="backward", of="pad", signature="dy, paddings -> dx", c=_c_pad_grad, run=_run_pad_grad,
          fp16_operands=(0,), fp16_output=True),
    OpDef("concatenation_grad", kind="backward", of="concatenation", signature="dz -> dx0?, dx1?, ...",
          attrs=("axis", "sizes", "which"), c=_c_concatenation_grad, run=_run_concatenation_grad),
    OpDef("strided_slice_grad", kind="backward", of="strided_slice", signature="dy -> dx",
          attrs=("starts", "stops", "strides"), note="dy scattered into zeros of x's shape", c=_c_strided_slice_grad,
          run=_run_strided_slice_grad),
)
