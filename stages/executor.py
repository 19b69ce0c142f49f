"""The numpy reference executor: runs any forward IR graph (DESIGN §5, §6), float32 or int8.

    run_graph(graph, feeds, keep_intermediates=False) -> {tensor name: array}

Activations carry a leading batch dimension of any size N (the IR's own dim 0 is the batch the model file was
made with, usually 1); every op works on all N samples at once and no result depends on N. Constants (weights,
biases, shape operands) have no batch dimension, and neither does anything computed from constants only (e.g. a
DEQUANTIZE of float16 weights).

Arithmetic is that of TFLite's reference kernels (`tensorflow/lite/kernels/internal/reference/`), which is also
what TFLite Micro runs:
  - int8: integer accumulation, per-channel requantization with QuantizeMultiplier /
    MultiplyByQuantizedMultiplier (double rounding), fused activations as clamps in the output's int space;
    the fixed-point helpers live in `int8_arith`. Bit-exact against LiteRT's BUILTIN_REF resolver.
  - float32: every accumulation runs in float32 in the reference kernels' loop order (filter y, filter x, input
    channel; pooling windows row by row), so results match the reference bit for bit on the fixtures (SOFTMAX
    aside: numpy's exp and libm's expf differ in the last bit, < 4e-7 relative) and do not depend on the batch
    size (a BLAS matmul would change its blocking with N).
  - int8 FULLY_CONNECTED: LiteRT's reference kernel rescales in double, TFLite Micro in fixed point; int8
    RELU/RELU6/MUL multipliers and LOGISTIC/TANH also differ in detail; see `run_graph(fc_requant=...)`. TFLite Micro's int8 RELU6 ignores the output quantization (a TFLM quirk we do
    not copy: we follow LiteRT's QuantizedReluX, which requantizes).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages import int8_arith as ia
from tinytrain.stages.ir import Graph, Op, Tensor
from tinytrain.stages.kernel_common import float_act as _float_act
from tinytrain.stages.kernel_common import qparams as _qp
from tinytrain.stages.ops import FORWARD_OPS, REGISTRY
from tinytrain.stages.geometry import out_size_and_pad

__all__ = ["run_graph", "run_op", "supported_ops", "ExecutionError", "FC_REQUANT_MODES"]


class ExecutionError(ModelError):
    """The graph cannot be run as given (bad feeds, a construct the executor does not support)."""


def supported_ops() -> list[str]:
    return sorted(_KERNELS)


FC_REQUANT_MODES = ("fixed_point", "litert_double")


def run_graph(graph: Graph, feeds: dict[str, np.ndarray], keep_intermediates: bool = False, *,
              fc_requant: str = "fixed_point") -> dict[str, np.ndarray]:
    """Run `graph` on `feeds` (graph input name -> array with a leading batch dim).

    Returns the graph outputs, or with keep_intermediates every non-constant tensor (inputs included).

    fc_requant picks how an int8 FULLY_CONNECTED rescales its int32 accumulator:
      "fixed_point"   (default) MultiplyByQuantizedMultiplier, double rounding: TFLite Micro's kernel and the
                      reference_integer_ops fixed-point overload, i.e. what the generated C runs on the MCU;
      "litert_double" round(double(acc) * s_in * s_w / s_out): what LiteRT's BUILTIN_REF FULLY_CONNECTED runs
                      (fully_connected.cc FullyConnected[PerChannel]Int8<kReference> call the float-scale
                      overload). The two differ by 1 LSB on near-ties.
    The same switch picks LiteRT's or TFLite Micro's arithmetic wherever else the two runtimes differ: int8
    RELU/RELU6 and MUL form their multiplier from float (LiteRT) or double (TFLM) scale ratios, and int8
    LOGISTIC/TANH are a float-filled lookup table in LiteRT, gemmlowp fixed point in TFLM (the two agreed on
    every input of every scale we swept). Every other op is the same in both."""
    if fc_requant not in FC_REQUANT_MODES:
        raise ValueError(f"fc_requant must be one of {FC_REQUANT_MODES}, got {fc_requant!r}")
    values: dict[str, np.ndarray] = {}
    batched: set[str] = set()
    for t in graph.constants():
        values[t.name] = t.data
    n = _check_feeds(graph, feeds, values, batched)
    for i, op in enumerate(graph.ops):
        kernel = _KERNELS.get(op.type)
        if kernel is None:
            raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else i,
                                     where="the reference executor",
                                     hint=f"the executor runs: {', '.join(supported_ops())}")
        for name in op.inputs:
            if name is not None and name not in values:
                raise ExecutionError(f"op #{i} {op.type} reads {name!r}, which has no value")
        ctx = _Ctx(graph, op, i, values, n, fc_requant)
        try:
            outs = kernel(ctx)
        except (ValueError, NotImplementedError) as e:
            raise ExecutionError(f"op #{i} {op.type} ({op.outputs[0]}): {e}") from None
        is_batched = any(name in batched for name in op.inputs if name is not None)
        for name, arr in zip(op.outputs, outs):
            t = graph.tensors[name]
            arr = np.asarray(arr)
            if arr.dtype != np.dtype(t.dtype):
                raise ExecutionError(f"op #{i} {op.type} produced {arr.dtype} for {name!r}, declared {t.dtype}")
            want = ([n] + list(t.shape[1:])) if is_batched else list(t.shape)
            if list(arr.shape) != want:
                raise ExecutionError(f"op #{i} {op.type} produced shape {list(arr.shape)} for {name!r}, "
                                     f"expected {want}")
            values[name] = arr
            if is_batched:
                batched.add(name)
    if keep_intermediates:
        return {k: v for k, v in values.items() if graph.tensors[k].data is None}
    return {k: values[k] for k in graph.outputs}


def run_op(graph: Graph, op: Op, values: dict[str, np.ndarray], *, index: int = 0, n: int = 1,
           fc_requant: str = "fixed_point") -> list[np.ndarray]:
    """Run one forward op on `values` (tensor name -> array, constants included): its outputs, in order.
    For callers that schedule ops themselves (the training executor); no shape checks beyond the kernel's."""
    kernel = _KERNELS.get(op.type)
    if kernel is None:
        raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else index,
                                 where="the reference executor")
    return kernel(_Ctx(graph, op, index, values, n, fc_requant))


def _check_feeds(graph: Graph, feeds: dict[str, np.ndarray], values: dict, batched: set) -> int:
    missing = [k for k in graph.inputs if k not in feeds]
    extra = [k for k in feeds if k not in graph.inputs]
    if missing or extra:
        raise ExecutionError(f"feeds do not match the graph inputs {graph.inputs}: "
                             f"missing {missing}, unexpected {extra}")
    n = None
    for name in graph.inputs:
        t = graph.tensors[name]
        arr = np.asarray(feeds[name])
        if list(arr.shape[1:]) != list(t.shape[1:]) or arr.ndim != len(t.shape):
            raise ExecutionError(f"input {name!r}: got shape {list(arr.shape)}, expected [N, "
                                 f"{', '.join(str(d) for d in t.shape[1:])}] (batch first)")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise ExecutionError(f"inputs disagree on the batch size ({n} vs {arr.shape[0]} for {name!r})")
        if t.dtype in ("int8", "int16", "int32", "uint8"):
            if not np.issubdtype(arr.dtype, np.integer):
                raise ExecutionError(f"input {name!r} is {t.dtype}: feed integers (quantize first), got {arr.dtype}")
            info = np.iinfo(t.dtype)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise ExecutionError(f"input {name!r}: values outside the {t.dtype} range")
        arr = arr.astype(t.dtype, copy=False)
        values[name] = arr
        batched.add(name)
    return int(n or 0)


class _Ctx:
    def __init__(self, graph: Graph, op: Op, index: int, values: dict[str, np.ndarray], n: int,
                 fc_requant: str = "fixed_point"):
        self.graph, self.op, self.index, self.values, self.n = graph, op, index, values, n
        self.fc_requant = fc_requant
        self.attrs: dict[str, Any] = op.attrs

    def x(self, i: int = 0) -> np.ndarray | None:
        name = self.op.inputs[i] if i < len(self.op.inputs) else None
        return None if name is None else self.values[name]

    def tin(self, i: int = 0) -> Tensor | None:
        name = self.op.inputs[i] if i < len(self.op.inputs) else None
        return None if name is None else self.graph.tensors[name]

    def tout(self, i: int = 0) -> Tensor:
        return self.graph.tensors[self.op.outputs[i]]

    def quantized(self) -> bool:
        return self.tin(0).dtype == "int8"


# ---- quantization parameters --------------------------------------------------------------------

def _channel_multipliers(x_t: Tensor, w_t: Tensor, y_t: Tensor, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """PopulateConvolutionQuantizationParams / FC per-channel Prepare: for each output channel,
    QuantizeMultiplier(double(s_in) * double(s_w[c]) / double(s_out)); a per-tensor filter scale is broadcast."""
    s_in, _ = _qp(x_t)
    s_out, _ = _qp(y_t)
    if w_t.quant is None:
        raise ValueError(f"int8 weights {w_t.name!r} have no quantization parameters")
    scales = list(w_t.quant.scale)
    if len(scales) == 1:
        scales = scales * channels
    if len(scales) != channels:
        raise ValueError(f"weights {w_t.name!r} have {len(scales)} scales for {channels} output channels")
    pairs = [ia.quantize_multiplier(float(s_in) * float(s) / float(s_out)) for s in scales]
    return (np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64))


def _round_half_away_f32(q: np.ndarray) -> np.ndarray:
    """TfLiteRound on float32 values: ties away from zero (np.round would round ties to even)."""
    t = np.trunc(q)
    frac = q - t  # exact in float32
    return (t + (frac >= 0.5) - (frac <= -0.5)).astype(np.int64)


# ---- spatial helpers ----------------------------------------------------------------------------

def _spatial(ctx: _Ctx, x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1):
    h, w = x.shape[1], x.shape[2]
    oh, pt = out_size_and_pad(ctx.attrs["padding"], h, kh, sh, dh)
    ow, pl = out_size_and_pad(ctx.attrs["padding"], w, kw, sw, dw)
    return oh, ow, pt, pl


def _padded(x: np.ndarray, oh: int, ow: int, pt: int, pl: int, kh: int, kw: int, sh: int, sw: int,
            dh: int, dw: int, value) -> tuple[np.ndarray, np.ndarray]:
    """x padded so that every tap of every output position is in range, and a matching validity mask [H', W']."""
    h, w = x.shape[1], x.shape[2]
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    pb, pr = max(need_h - h - pt, 0), max(need_w - w - pl, 0)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=value)
    mask = np.pad(np.ones((h, w), dtype=bool), ((pt, pb), (pl, pr)), constant_values=False)
    return xp, mask


def _tap(a: np.ndarray, ky: int, kx: int, oh: int, ow: int, sh: int, sw: int, dh: int, dw: int) -> np.ndarray:
    y0, x0 = ky * dh, kx * dw
    if a.ndim == 2:
        return a[y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw]
    return a[:, y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]


def _conv_geometry(ctx: _Ctx, x: np.ndarray, kh: int, kw: int):
    a = ctx.attrs
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
    oh, ow, pt, pl = _spatial(ctx, x, kh, kw, sh, sw, dh, dw)
    return oh, ow, pt, pl, sh, sw, dh, dw


# ---- convolution family -------------------------------------------------------------------------

def _conv2d(ctx: _Ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, kh, kw, ci = w.shape
    if x.shape[3] != ci:
        raise NotImplementedError(f"grouped convolution (input depth {x.shape[3]}, filter depth {ci})")
    oh, ow, pt, pl, sh, sw, dh, dw = _conv_geometry(ctx, x, kh, kw)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        x_t, w_t, y_t = ctx.tin(0), ctx.tin(1), ctx.tout()
        _, zin = _qp(x_t)
        _, zout = _qp(y_t)
        # Skipped out-of-image taps == taps on (input - zero point) padded with 0.
        xs = x.astype(np.int64) - zin
        xp, _ = _padded(xs, oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0)
        cols = np.concatenate([_tap(xp, ky, kx, oh, ow, sh, sw, dh, dw)
                               for ky in range(kh) for kx in range(kw)], axis=-1)
        wz = w.astype(np.int64) - _weight_zp(w_t, o)[:, None, None, None]
        acc = _exact_matmul(cols, wz.reshape(o, -1).T)
        if b is not None:
            acc = acc + b.astype(np.int64)
        mult, shift = _channel_multipliers(x_t, w_t, y_t, o)
        lo, hi = ia.activation_range(act, *_qp(y_t))
        return [ia.requantize(ia.wrap32(acc), mult, shift, zout, lo, hi).astype(np.int8)]
    xp, _ = _padded(x.astype(np.float32), oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0.0)
    wf = w.astype(np.float32)
    acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.float32)
    for ky in range(kh):
        for kx in range(kw):
            patch = _tap(xp, ky, kx, oh, ow, sh, sw, dh, dw)
            for c in range(ci):
                acc += patch[..., c:c + 1] * wf[:, ky, kx, c]
    if b is not None:
        acc = acc + b.astype(np.float32)
    return [_float_act(acc, act).astype(np.float32)]


def _depthwise_conv2d(ctx: _Ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    _, kh, kw, o = w.shape
    c_in = x.shape[3]
    mult = int(ctx.attrs.get("depth_multiplier", o // max(c_in, 1)) or 1)
    if o != c_in * mult:
        # Newer converters may write depth_multiplier 0/1 and let the filter shape decide.
        if o % c_in:
            raise ValueError(f"depthwise filter has {o} channels for {c_in} input channels")
        mult = o // c_in
    src = np.arange(o) // mult  # output channel ic * mult + m reads input channel ic
    oh, ow, pt, pl, sh, sw, dh, dw = _conv_geometry(ctx, x, kh, kw)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        x_t, w_t, y_t = ctx.tin(0), ctx.tin(1), ctx.tout()
        _, zin = _qp(x_t)
        _, zout = _qp(y_t)
        xs = (x.astype(np.int64) - zin)[..., src]
        xp, _ = _padded(xs, oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0)
        wz = w[0].astype(np.int64) - _weight_zp(w_t, o)
        acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.int64)
        for ky in range(kh):
            for kx in range(kw):
                acc += _tap(xp, ky, kx, oh, ow, sh, sw, dh, dw) * wz[ky, kx]
        if b is not None:
            acc = acc + b.astype(np.int64)
        m, s = _channel_multipliers(x_t, w_t, y_t, o)
        lo, hi = ia.activation_range(act, *_qp(y_t))
        return [ia.requantize(ia.wrap32(acc), m, s, zout, lo, hi).astype(np.int8)]
    xp, _ = _padded(x.astype(np.float32)[..., src], oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0.0)
    wf = w[0].astype(np.float32)
    acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.float32)
    for ky in range(kh):
        for kx in range(kw):
            acc += _tap(xp, ky, kx, oh, ow, sh, sw, dh, dw) * wf[ky, kx]
    if b is not None:
        acc = acc + b.astype(np.float32)
    return [_float_act(acc, act).astype(np.float32)]


def transpose_conv_geometry(attrs: dict, x_shape, y_shape, kh: int, kw: int) -> tuple[int, int, int, int]:
    """(stride_h, stride_w, pad_top, pad_left) of TRANSPOSE_CONV: ComputePaddingHeightWidth with the op's *output*
    as the convolution's input (transpose_conv.cc / TFLM Prepare), dilation 1; the odd SAME pixel lies after."""
    sh, sw = int(attrs["stride_h"]), int(attrs["stride_w"])
    _, pt = out_size_and_pad(attrs["padding"], int(y_shape[1]), kh, sh)
    _, pl = out_size_and_pad(attrs["padding"], int(y_shape[2]), kw, sw)
    return sh, sw, pt, pl


def _transpose_conv(ctx: _Ctx) -> list[np.ndarray]:
    """reference_ops::TransposeConv (float) / reference_integer_ops::TransposeConv (int8, per channel): every input
    pixel scatters x * w[:, ky, kx, :] into the output at (iy*s - pad + ky, ix*s - pad + kx); taps outside the
    output are dropped; then bias, requantization (int8) and the activation clamp.
    float: accumulated in float32 in the reference's order for each output element (input row, input column,
    input channel ascending, i.e. ky and kx descending), starting from 0, bias added last: bit-equal to the
    reference. int8: the int32 scratch sum (exact here, wrapped to int32 like the reference's), per-channel
    MultiplyByQuantizedMultiplier, then the fused activation's quantized range as conv2d (older TFLite Micro and
    LiteRT sources passed kTfLiteActNone and clamped to the int8 range only; the runtimes we test against, LiteRT
    2.x and TFLite Micro, clamp to the activation: tests/test_transpose_conv.py checks both on a range wider than
    RELU6's). LiteRT and TFLite Micro agree on every case tested, so there is no runtime switch."""
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, kh, kw, ci = w.shape
    if x.shape[3] != ci:
        raise ValueError(f"filter depth {ci} differs from the input depth {x.shape[3]}")
    y_t = ctx.tout()
    oh, ow = int(y_t.shape[1]), int(y_t.shape[2])
    sh, sw, pt, pl = transpose_conv_geometry(ctx.attrs, x.shape, y_t.shape, kh, kw)
    n, h, wd = x.shape[0], x.shape[1], x.shape[2]
    # Output buffer with every tap in range: rows [-pt, ...) of the output start at row 0 here.
    full_h = max((h - 1) * sh + kh, pt + oh)
    full_w = max((wd - 1) * sw + kw, pl + ow)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        x_t, w_t = ctx.tin(0), ctx.tin(1)
        _, zin = _qp(x_t)
        _, zout = _qp(y_t)
        xs = x.astype(np.int64) - zin
        wz = w.astype(np.int64)  # reference_integer_ops::TransposeConv applies no filter offset
        acc = np.zeros((n, full_h, full_w, o), dtype=np.int64)
        for ky in range(kh):
            for kx in range(kw):
                acc[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :] += xs @ wz[:, ky, kx, :].T
        acc = ia.wrap32(acc[:, pt:pt + oh, pl:pl + ow, :])
        if b is not None:
            acc = ia.wrap32(acc + b.astype(np.int64))
        mult, shift = _channel_multipliers(x_t, w_t, y_t, o)
        lo, hi = ia.activation_range(act, *_qp(y_t))
        return [ia.requantize(acc, mult, shift, zout, lo, hi).astype(np.int8)]
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    acc = np.zeros((n, full_h, full_w, o), dtype=np.float32)
    for ky in range(kh - 1, -1, -1):
        for kx in range(kw - 1, -1, -1):
            dst = acc[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :]
            for c in range(ci):
                dst += xf[..., c:c + 1] * wf[:, ky, kx, c]
    acc = np.ascontiguousarray(acc[:, pt:pt + oh, pl:pl + ow, :])
    if b is not None:
        acc = acc + b.astype(np.float32)
    return [_float_act(acc, act).astype(np.float32)]


def _fully_connected(ctx: _Ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, depth = w.shape
    if x.size % depth:
        raise ValueError(f"input of {x.size} elements does not split into rows of {depth}")
    rows = x.reshape(-1, depth)
    act = ctx.attrs.get("act", "none")
    y_t = ctx.tout()
    if ctx.quantized():
        x_t, w_t = ctx.tin(0), ctx.tin(1)
        _, zin = _qp(x_t)
        _, zout = _qp(y_t)
        wz = w.astype(np.int64) - _weight_zp(w_t, o)[:, None]
        acc = _exact_matmul(rows.astype(np.int64) - zin, wz.T)
        if b is not None:
            acc = acc + b.astype(np.int64)
        lo, hi = ia.activation_range(act, *_qp(y_t))
        if ctx.fc_requant == "litert_double":
            out = _fc_requant_double(ia.wrap32(acc), x_t, w_t, y_t, o, zout, lo, hi)
        else:
            # Per-tensor (GetQuantizedConvolutionMultipler) and per-channel Prepare compute the same expression.
            mult, shift = _channel_multipliers(x_t, w_t, y_t, o)
            out = ia.requantize(ia.wrap32(acc), mult, shift, zout, lo, hi).astype(np.int8)
    else:
        xf, wf = rows.astype(np.float32), w.astype(np.float32)
        acc = np.zeros((rows.shape[0], o), dtype=np.float32)
        for d in range(depth):
            acc += xf[:, d:d + 1] * wf[:, d]
        if b is not None:
            acc = acc + b.astype(np.float32)
        out = _float_act(acc, act).astype(np.float32)
    if ctx.attrs.get("keep_num_dims"):
        return [out.reshape(x.shape[:-1] + (o,))]
    target = (x.shape[0],) + tuple(y_t.shape[1:])
    return [out.reshape(target) if out.size == int(np.prod(target)) else out]


def _fc_requant_double(acc: np.ndarray, x_t: Tensor, w_t: Tensor, y_t: Tensor, channels: int, zout: int,
                       lo: int, hi: int) -> np.ndarray:
    """LiteRT's reference FULLY_CONNECTED rescale (reference_integer_ops::FullyConnected[PerChannel], the
    float-scale overloads): static_cast<int32_t>(round(double(acc) * effective_output_scale)), with the scale
    double(s_in) * double(s_w[c]) / double(s_out) and C's round (ties away from zero)."""
    s_in, _ = _qp(x_t)
    s_out, _ = _qp(y_t)
    scales = list(w_t.quant.scale)
    scales = scales * channels if len(scales) == 1 else scales
    eff = np.array([float(s_in) * float(s) / float(s_out) for s in scales], dtype=np.float64)
    v = acc.astype(np.float64) * eff
    t = np.trunc(v)
    frac = v - t  # exact in double
    r = (t + (frac >= 0.5) - (frac <= -0.5)).astype(np.int64)
    return np.clip(r + zout, lo, hi).astype(np.int8)


def _weight_zp(w_t: Tensor, channels: int) -> np.ndarray:
    zps = list(w_t.quant.zero_point) if w_t.quant else [0]
    if len(zps) == 1:
        zps = zps * channels
    return np.array(zps, dtype=np.int64)


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer matmul through float64 BLAS: every product is below 2^16 and every partial sum below 2^53 for
    any layer a microcontroller runs (< 2^37 terms), so the float64 result is exact whatever the order."""
    if a.shape[-1] >= (1 << 36):
        raise ValueError("accumulation depth too large for exact float64 integer matmul")
    return np.rint(a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)


# ---- element-wise and pooling -------------------------------------------------------------------

def _pool_windows(ctx: _Ctx, x: np.ndarray, pad_value):
    a = ctx.attrs
    kh, kw = int(a["filter_h"]), int(a["filter_w"])
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    oh, ow, pt, pl = _spatial(ctx, x, kh, kw, sh, sw)
    xp, mask = _padded(x, oh, ow, pt, pl, kh, kw, sh, sw, 1, 1, pad_value)
    # Row by row over the window, as the reference loops (filter_y, filter_x).
    for ky in range(kh):
        for kx in range(kw):
            yield _tap(xp, ky, kx, oh, ow, sh, sw, 1, 1), _tap(mask, ky, kx, oh, ow, sh, sw, 1, 1)[None, :, :, None]


def _average_pool2d(ctx: _Ctx) -> list[np.ndarray]:
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
        lo, hi = ia.activation_range(act, *_qp(ctx.tout()))
        return [np.clip(avg, lo, hi).astype(np.int8)]
    acc = count = None
    for patch, valid in _pool_windows(ctx, x.astype(np.float32), 0.0):
        acc = patch.copy() if acc is None else acc + patch  # out-of-image taps add +0.0: a no-op
        count = valid.astype(np.float32) if count is None else count + valid
    return [_float_act((acc / count).astype(np.float32), act)]


def _max_pool2d(ctx: _Ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        out = None
        for patch, valid in _pool_windows(ctx, x.astype(np.int64), -128):
            out = patch if out is None else np.maximum(out, patch)
        lo, hi = ia.activation_range(act, *_qp(ctx.tout()))
        return [np.clip(out, lo, hi).astype(np.int8)]
    low = np.finfo(np.float32).min
    out = None
    for patch, valid in _pool_windows(ctx, x.astype(np.float32), low):
        out = patch if out is None else np.maximum(out, patch)
    return [_float_act(out, act).astype(np.float32)]


def _mean(ctx: _Ctx) -> list[np.ndarray]:
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
        s_in, z_in = _qp(ctx.tin(0))
        s_out, z_out = _qp(y_t)
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


def _quantized_mean(total: np.ndarray, count: int, s_in: float, z_in: int, s_out: float, z_out: int) -> np.ndarray:
    """reference_ops::QuantizedMeanOrSum (integer version; reduce.cc PrepareMeanOrSum computes the multiplier of
    s_in / s_out): the 1/count is folded into the multiplier with an int64 division, the shift is clamped so the
    result stays a valid MultiplyByQuantizedMultiplier operand, and the sum is taken relative to the zero point."""
    mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
    extra = min(count.bit_length() - 1, 32, 31 + shift)
    mult = int((mult << extra) // count) if extra >= 0 else int((mult >> -extra) // count)
    shift -= extra
    shifted_sum = ia.wrap32(total - z_in * count)
    out = ia.multiply_by_quantized_multiplier(shifted_sum, mult, shift) + z_out
    return np.clip(out, -128, 127).astype(np.int8)


def _softmax(ctx: _Ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    beta = float(ctx.attrs.get("beta", 1.0))
    if ctx.quantized():
        s_in, _ = _qp(ctx.tin(0))
        s_out, z_out = _qp(ctx.tout())
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


def _relu_common(ctx: _Ctx, lo: float, hi: float | None) -> list[np.ndarray]:
    x = ctx.x(0)
    if ctx.quantized():
        # activations.cc QuantizedReluX: RELU/RELU6 requantize from the input's to the output's parameters
        # (the converter gives them different ones), then clamp. LiteRT's ReluPrepare divides the two float
        # scales in float (`input->params.scale / output->params.scale`) and only then widens to double;
        # TFLite Micro divides in double. The quotients round to different Q0.31 mantissas for some scale
        # pairs (and then differ by an LSB on some inputs), so fc_requant="litert_double" takes LiteRT's.
        s_in, z_in = _qp(ctx.tin(0))
        s_out, z_out = _qp(ctx.tout())
        if ctx.fc_requant == "litert_double":
            mult, shift = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
        else:
            mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
        qlo, qhi = ia.relu_op_range(lo, hi, s_out, z_out)
        y = z_out + ia.multiply_by_quantized_multiplier(x.astype(np.int64) - z_in, mult, shift)
        return [np.clip(y, qlo, qhi).astype(np.int8)]
    y = np.maximum(x.astype(np.float32), np.float32(lo))
    if hi is not None:
        y = np.minimum(y, np.float32(hi))
    return [y.astype(np.float32)]


def _relu(ctx: _Ctx) -> list[np.ndarray]:
    return _relu_common(ctx, 0.0, None)


def _relu6(ctx: _Ctx) -> list[np.ndarray]:
    return _relu_common(ctx, 0.0, 6.0)


def _strided_slice(ctx: _Ctx) -> list[np.ndarray]:
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


def _resize_out_hw(ctx: _Ctx) -> tuple[int, int]:
    y_t = ctx.tout()
    return int(y_t.shape[1]), int(y_t.shape[2])


def _resize_bilinear(ctx: _Ctx) -> list[np.ndarray]:
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


def _resize_nearest_neighbor(ctx: _Ctx) -> list[np.ndarray]:
    """reference_ops::ResizeNearestNeighbor: a copy of the chosen source pixels (int8 keeps the input's
    parameters)."""
    x = ctx.x(0)
    a = ctx.attrs
    align, half = bool(a.get("align_corners", False)), bool(a.get("half_pixel_centers", False))
    oh, ow = _resize_out_hw(ctx)
    iy = resize_nearest_axis(x.shape[1], oh, align, half)
    ix = resize_nearest_axis(x.shape[2], ow, align, half)
    return [x[:, iy][:, :, ix]]


def _reshape(ctx: _Ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    new_shape = list(ctx.attrs.get("new_shape") or ctx.tout().shape)
    return [x.reshape([x.shape[0]] + new_shape[1:])]


def _pad(ctx: _Ctx) -> list[np.ndarray]:
    x, paddings = ctx.x(0), ctx.x(1)
    if paddings is None:
        raise ValueError("PAD needs a constant paddings operand")
    p = np.asarray(paddings).reshape(x.ndim, 2).astype(np.int64)
    if p[0].any():
        raise NotImplementedError("PAD of the batch axis")
    if (p < 0).any():
        raise ValueError("negative paddings")
    # Quantized PAD pads with the output zero point (the real value 0); float pads with 0.0.
    value = _qp(ctx.tout())[1] if ctx.quantized() else 0.0
    return [np.pad(x, [tuple(r) for r in p], constant_values=value).astype(x.dtype)]


def _concatenation(ctx: _Ctx) -> list[np.ndarray]:
    names = [n for n in ctx.op.inputs if n is not None]
    xs = [ctx.values[n] for n in names]
    axis = int(ctx.attrs.get("axis", -1)) % xs[0].ndim
    if axis == 0:
        raise NotImplementedError("CONCATENATION along the batch axis")
    act = ctx.attrs.get("act", "none")
    n = max(x.shape[0] for x in xs)
    xs = [np.broadcast_to(x, (n,) + x.shape[1:]) if x.shape[0] != n else x for x in xs]
    if ctx.tout().dtype == "int8":
        so, zo = _qp(ctx.tout())
        parts = []
        for name, x in zip(names, xs):
            si, zi = _qp(ctx.graph.tensors[name])
            if si == so and zi == zo:
                parts.append(x.astype(np.int64))
            else:
                # reference_ops::ConcatenationWithScaling (float math; LiteRT's and TFLM's int8 kernels require
                # equal parameters and never get here, the converter guarantees them).
                inv = np.float32(1.0) / np.float32(so)
                scale = np.float32(np.float32(si) * inv)
                bias = np.float32(np.float32(-zi) * scale)
                q = _round_half_away_f32((x.astype(np.float32) * scale + bias).astype(np.float32)) + zo
                parts.append(np.clip(q, -128, 127))
        out = np.concatenate(parts, axis=axis)
        lo, hi = ia.activation_range(act, so, zo)
        return [np.clip(out, lo, hi).astype(np.int8)]
    out = np.concatenate([x.astype(np.float32) for x in xs], axis=axis)
    return [_float_act(out, act).astype(np.float32)]


def _quantize(ctx: _Ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    x_t, y_t = ctx.tin(0), ctx.tout()
    if y_t.dtype != "int8":
        raise NotImplementedError(f"QUANTIZE to {y_t.dtype}")
    so, zo = _qp(y_t)
    if x_t.dtype == "float32":
        # reference_ops::AffineQuantize: TfLiteRound(val / static_cast<float>(scale)) + zero_point, clamped.
        q = (x.astype(np.float32) / np.float32(so)).astype(np.float32)
        return [np.clip(_round_half_away_f32(q) + zo, -128, 127).astype(np.int8)]
    if x_t.dtype == "int8":
        # quantize.cc int8 -> int8: Requantize with QuantizeMultiplier(double(s_in) / double(s_out)).
        si, zi = _qp(x_t)
        mult, shift = ia.quantize_multiplier(float(si) / float(so))
        y = ia.multiply_by_quantized_multiplier(x.astype(np.int64) - zi, mult, shift) + zo
        return [np.clip(y, -128, 127).astype(np.int8)]
    raise NotImplementedError(f"QUANTIZE from {x_t.dtype}")


def _dequantize(ctx: _Ctx) -> list[np.ndarray]:
    x = ctx.x(0)
    x_t = ctx.tin(0)
    if x_t.dtype == "float16":
        return [x.astype(np.float32)]
    if x_t.dtype == "int8":
        if x_t.quant is None:
            raise ValueError(f"int8 tensor {x_t.name!r} has no quantization parameters")
        scale = np.asarray(x_t.quant.scale, dtype=np.float64)
        zp = np.asarray(x_t.quant.zero_point, dtype=np.int64)
        if x_t.quant.per_channel:
            shape = [1] * x.ndim
            shape[x_t.quant.axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        # reference_ops::Dequantize: static_cast<float>(double scale * (val - zero_point)).
        return [(scale * (x.astype(np.int64) - zp)).astype(np.float32)]
    raise NotImplementedError(f"DEQUANTIZE from {x_t.dtype}")


# Every forward op of the registry has its kernel: its op module's (OpDef.forward), or here, named `_<op>` (a missing
# one fails at import).
_KERNELS: dict[str, Callable[[_Ctx], list[np.ndarray]]] = {
    name: REGISTRY[name].forward or globals()["_" + name] for name in FORWARD_OPS}
