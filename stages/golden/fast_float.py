"""A fast float forward for the contribution analysis: FLOAT conv2d as one BLAS product (im2col), depthwise as one
multiply-add per tap on preallocated buffers, every other op on the reference executor's kernels.

The reference executor's float conv2d accumulates input channel by input channel, in TFLite Micro's order, so that
float models match the device bit for bit; that costs a numpy pass per input channel and tap, which dominates the
analysis' fine-tuning runs (MobileNetV2: ~60 % of a unit's time). The analysis needs float fine-tuning, not the
device's float rounding order (its units stand in for int8 + QAS training; DESIGN's golden model is untouched):
here a conv2d is one matrix product, whose sums differ from the reference's in the last bits only.

    outs = run_op(graph, op, values, index=i, n=batch)   # a drop-in for executor.run_op
    outs = run_graph(graph, {input: x})                  # graph outputs, batched
    outs = backward_op(op, v)                            # 1x1 conv gradients as 2-D products, else None

The same holds for the backward of 1x1 convolutions (most of MobileNetV2's): grad_ops multiplies 4-D views in the
golden model's order; here they are 2-D BLAS products.
"""

from __future__ import annotations

import numpy as np

from tinytrain.stages import ops
from tinytrain.stages.golden import forward as ref_exec
from tinytrain.stages.golden.kernel_common import float_act
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Graph, Op

_ACT = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def _is_float(graph: Graph, op: Op) -> bool:
    return all(graph.tensors[t].dtype == "float32" for t in (*op.inputs[:2], op.outputs[0]) if t is not None)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict) -> np.ndarray:
    """Float CONV_2D (NHWC, weights OHWI) by im2col and one matrix product; padding and the fused activation as
    the reference executor's."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    o, kh, kw, ci = w.shape
    n, h, wd, _ = x.shape
    sh, sw = int(attrs["stride_h"]), int(attrs["stride_w"])
    dh, dw = int(attrs.get("dilation_h", 1)), int(attrs.get("dilation_w", 1))
    oh, pt = out_size_and_pad(attrs["padding"], h, kh, sh, dh)
    ow, pl = out_size_and_pad(attrs["padding"], wd, kw, sw, dw)
    if kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and (oh, ow) == (h, wd):
        cols = x.reshape(-1, ci)
    else:
        xp = _padded(x, kh, kw, attrs)[0]
        taps = [xp[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw, :]
                for ky in range(kh) for kx in range(kw)]
        cols = np.concatenate(taps, axis=-1).reshape(-1, kh * kw * ci)
    y = cols @ w.reshape(o, -1).T
    if b is not None:
        y += np.asarray(b, np.float32)
    lo, hi = _ACT[attrs.get("act", "none")]
    if lo is not None or hi is not None:
        np.clip(y, lo, hi, out=y)
    return y.reshape(n, oh, ow, o).astype(np.float32, copy=False)


def _padded(x: np.ndarray, kh: int, kw: int, attrs: dict) -> tuple[np.ndarray, int, int, int, int, int, int]:
    """(x zero-padded so that every tap of every output is in range, oh, ow, sh, sw, dh, dw)."""
    n, h, wd, c = x.shape
    sh, sw = int(attrs["stride_h"]), int(attrs["stride_w"])
    dh, dw = int(attrs.get("dilation_h", 1)), int(attrs.get("dilation_w", 1))
    oh, pt = out_size_and_pad(attrs["padding"], h, kh, sh, dh)
    ow, pl = out_size_and_pad(attrs["padding"], wd, kw, sw, dw)
    need_h, need_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    if pt == pl == 0 and need_h <= h and need_w <= wd:
        return x, oh, ow, sh, sw, dh, dw
    xp = np.zeros((n, max(need_h, pt + h), max(need_w, pl + wd), c), np.float32)
    xp[:, pt:pt + h, pl:pl + wd, :] = x
    return xp, oh, ow, sh, sw, dh, dw


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict) -> np.ndarray:
    """Float DEPTHWISE_CONV_2D (weights 1HWO, multiplier M: output channel c·M + m reads input channel c) as one
    multiply-add per tap on preallocated buffers; padding and the fused activation as the reference executor's."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    _, kh, kw, o = w.shape
    c = x.shape[3]
    if o % c:
        raise ValueError(f"depthwise filter has {o} channels for {c} input channels")
    if o != c:
        x = np.repeat(x, o // c, axis=-1)
    xp, oh, ow, sh, sw, dh, dw = _padded(x, kh, kw, attrs)
    acc = np.zeros((x.shape[0], oh, ow, o), np.float32)
    tmp = np.empty_like(acc)
    for ky in range(kh):
        for kx in range(kw):
            tap = xp[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw, :]
            np.multiply(tap, w[0, ky, kx], out=tmp)
            acc += tmp
    if b is not None:
        acc += np.asarray(b, np.float32)
    lo, hi = _ACT[attrs.get("act", "none")]
    if lo is not None or hi is not None:
        np.clip(acc, lo, hi, out=acc)
    return acc


def fully_connected(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, act: str) -> np.ndarray:
    """Float FULLY_CONNECTED rows [R, O], bit for bit the reference kernel's: it adds the products x[:, d]·w[:, d]
    one input index d after another in float32 (a numpy pass per d: 1280 of them for MobileNetV2's classifier);
    np.add.accumulate adds in that same order, in one call (it is sequential by definition, unlike np.sum's
    pairwise sums)."""
    o, depth = w.shape
    rows = np.asarray(x, np.float32).reshape(-1, depth)
    prod = rows.T[:, :, None] * np.asarray(w, np.float32).T[:, None, :]       # [depth, R, O], float32 products
    if depth:
        prod[0] += np.float32(0)      # the reference starts from +0: a first product of -0 sums to +0 there too
    acc = np.add.accumulate(prod, axis=0, dtype=np.float32)[-1] if depth else np.zeros((len(rows), o), np.float32)
    if b is not None:
        acc = acc + np.asarray(b, np.float32)
    return float_act(acc, act).astype(np.float32)


def _fc_fast(graph: Graph, op: Op, values: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """fully_connected on the float path with the reference's output shape rules, or None (the caller runs the
    reference: quantized, or an input that does not split into rows)."""
    if not _is_float(graph, op) or op.attrs.get("act", "none") not in _ACT:
        return None
    x, w = np.asarray(values[op.inputs[0]]), values[op.inputs[1]]
    b = values[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] is not None else None
    o, depth = w.shape
    if not depth or x.size % depth:
        return None
    out = fully_connected(x, w, b, op.attrs.get("act", "none"))
    if op.attrs.get("keep_num_dims"):
        return [out.reshape(x.shape[:-1] + (o,))]
    target = (x.shape[0],) + tuple(graph.tensors[op.outputs[0]].shape[1:])
    return [out.reshape(target) if out.size == int(np.prod(target)) else out]


def _bias(op: Op, values: dict[str, np.ndarray]) -> np.ndarray | None:
    return values[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] is not None else None


def _depthwise_fast(graph: Graph, op: Op, values: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    if not _is_float(graph, op) or op.attrs.get("act", "none") not in _ACT:
        return None
    return [depthwise_conv2d(values[op.inputs[0]], values[op.inputs[1]], _bias(op, values), op.attrs)]


def _conv_fast(graph: Graph, op: Op, values: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    if not _is_float(graph, op) or op.attrs.get("act", "none") not in _ACT:
        return None
    w = values[op.inputs[1]]
    if np.asarray(values[op.inputs[0]]).shape[-1] != w.shape[-1]:     # grouped: the reference's message
        return None
    return [conv2d(values[op.inputs[0]], w, _bias(op, values), op.attrs)]


# OpDef.fast_float -> the fast forward of the ops with that trait (None from it: run the reference's kernel)
_FAST = {"fc": _fc_fast, "depthwise": _depthwise_fast, "conv": _conv_fast}


def run_op(graph: Graph, op: Op, values: dict[str, np.ndarray], *, index: int = 0, n: int = 1) -> list[np.ndarray]:
    fast = _FAST.get(ops.REGISTRY[op.type].fast_float)
    out = fast(graph, op, values) if fast is not None else None
    if out is not None:
        return out
    return ref_exec.run_op(graph, op, values, index=index, n=n)


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs on batched `feeds` (input name -> array, batch first)."""
    values: dict[str, np.ndarray] = {t.name: t.data for t in graph.constants()}
    values.update({k: np.asarray(v) for k, v in feeds.items()})
    n = int(np.asarray(next(iter(feeds.values()))).shape[0])
    for i, op in enumerate(graph.ops):
        for name, arr in zip(op.outputs, run_op(graph, op, values, index=i, n=n)):
            values[name] = np.asarray(arr)
    return {k: values[k] for k in graph.outputs}


def _pointwise(op: Op) -> bool:
    a = op.attrs
    return (int(a.get("stride_h", 1)) == int(a.get("stride_w", 1)) == 1
            and int(a.get("dilation_h", 1)) == int(a.get("dilation_w", 1)) == 1)


def _grad_input_1x1(op: Op, v) -> list[np.ndarray] | None:
    dy, w = np.asarray(v(0), np.float32), np.asarray(v(1), np.float32)
    o, kh, kw, ci = w.shape
    if kh != 1 or kw != 1:
        return None
    return [(dy.reshape(-1, o) @ w.reshape(o, ci)).reshape(*dy.shape[:-1], ci)]


def _grad_weight_1x1(op: Op, v) -> list[np.ndarray] | None:
    o, kh, kw, ci = (int(d) for d in op.attrs["w_shape"])
    if kh != 1 or kw != 1:
        return None
    dy, x = np.asarray(v(0), np.float32), np.asarray(v(1), np.float32)
    k = ci if op.attrs.get("in_channels") is None else int(op.attrs["in_channels"])
    d2 = np.ascontiguousarray(dy.reshape(-1, o).T)
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1])[:, :k])
    return [(d2 @ x2).reshape(o, 1, 1, k)]


# OpDef.fast_float -> the 2-D product of a 1x1 conv's gradient op (operands dz, w / dz, x)
_FAST_GRAD = {"pointwise_grad_input": _grad_input_1x1, "pointwise_grad_weight": _grad_weight_1x1}


def backward_op(op: Op, v) -> list[np.ndarray] | None:
    """The input / weight gradient of a 1x1, stride-1 convolution (OpDef.fast_float) as one 2-D product (`v(j)`:
    the op's j-th input value); None for every other op (the caller runs grad_ops')."""
    fast = _FAST_GRAD.get(ops.REGISTRY[op.type].fast_float)
    if fast is None or not _pointwise(op):
        return None
    return fast(op, v)
