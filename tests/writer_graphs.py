"""Hand-built IR graphs, one or more per op type, float and int8, for the .tflite writer tests.

Built directly in the IR (never from a file) so that the writer is tested on graphs the reader never
produced, as quantize and the weight export will make them. Each case also carries its feeds and,
for float graphs, the expected outputs from a small numpy reference of TFLite's semantics (so that a
wrongly written option, e.g. swapped strides, shows up as wrong numbers, not only as a crash).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor


@dataclass
class Case:
    name: str
    graph: Graph
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray] = field(default_factory=dict)   # float cases only


class _B:
    """Tiny graph builder: names tensors t0, t1, ... in creation order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.inputs: list[str] = []

    def t(self, shape, dtype="float32", q=None, data=None, role="activation", name=None) -> str:
        name = name or f"t{len(self.tensors)}"
        self.tensors[name] = Tensor(name, list(shape), dtype, role=role, quant=q, data=data)
        return name

    def input(self, shape, dtype="float32", q=None) -> str:
        n = self.t(shape, dtype, q, role="input")
        self.inputs.append(n)
        return n

    def const(self, arr: np.ndarray, q=None, role="weight") -> str:
        return self.t(arr.shape, str(arr.dtype), q, data=arr, role=role)

    def op(self, type_, inputs, out_shape, dtype="float32", q=None, **attrs) -> str:
        out = self.t(out_shape, dtype, q)
        self.ops.append(Op(type_, list(inputs), [out], attrs))
        return out

    def graph(self, outputs: list[str]) -> Graph:
        for o in outputs:
            self.tensors[o].role = "output"
        g = Graph(self.tensors, self.ops, self.inputs, outputs)
        g.validate()
        return g

    def normal(self, *shape) -> np.ndarray:
        return self.rng.normal(size=shape).astype(np.float32)

    def int8(self, *shape) -> np.ndarray:
        return self.rng.integers(-128, 128, size=shape, dtype=np.int8)


def _aq(scale: float, zp: int) -> QuantParams:
    return QuantParams([scale], [zp], 0)


# ---- numpy reference of TFLite float semantics -------------------------------------------------

def _pads(n_in, k, stride, dil, padding):
    if padding == "valid":
        return (n_in - (k - 1) * dil - 1) // stride + 1, 0
    out = -(-n_in // stride)
    return out, max((out - 1) * stride + (k - 1) * dil + 1 - n_in, 0) // 2


def _windows(x, kh, kw, sh, sw, dh, dw, padding, fill=0.0):
    """[N,OH,OW,KH,KW,C] patches and the validity mask (for pooling, which ignores padding)."""
    n, h, w, c = x.shape
    oh, ph = _pads(h, kh, sh, dh, padding)
    ow, pw = _pads(w, kw, sw, dw, padding)
    big_h, big_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    xp = np.full((n, ph + max(big_h, h) + 1, pw + max(big_w, w) + 1, c), fill, np.float64)
    xp[:, ph:ph + h, pw:pw + w] = x
    mask = np.zeros(xp.shape[1:3], bool)
    mask[ph:ph + h, pw:pw + w] = True
    iy = (np.arange(oh) * sh)[:, None, None, None] + (np.arange(kh) * dh)[None, None, :, None]
    ix = (np.arange(ow) * sw)[None, :, None, None] + (np.arange(kw) * dw)[None, None, None, :]
    return xp[:, iy, ix], mask[iy, ix]


def _act(y, act):
    return {"none": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6)}[act]


def ref_conv(x, w, b, a):
    p, _ = _windows(x, w.shape[1], w.shape[2], a["stride_h"], a["stride_w"], a["dilation_h"], a["dilation_w"],
                    a["padding"])
    y = np.einsum("nhwijc,oijc->nhwo", p, w.astype(np.float64))
    return _act(y + (0 if b is None else b), a["act"])


def ref_dwconv(x, w, b, a):
    p, _ = _windows(x, w.shape[1], w.shape[2], a["stride_h"], a["stride_w"], a["dilation_h"], a["dilation_w"],
                    a["padding"])
    p = np.repeat(p, a["depth_multiplier"], axis=-1)
    y = np.einsum("nhwijc,ijc->nhwc", p, w[0].astype(np.float64))
    return _act(y + (0 if b is None else b), a["act"])


def ref_pool(x, a, kind):
    p, m = _windows(x, a["filter_h"], a["filter_w"], a["stride_h"], a["stride_w"], 1, 1, a["padding"])
    m = m[None, :, :, :, :, None]
    if kind == "max":
        y = np.where(m, p, -np.inf).max(axis=(3, 4))
    else:
        y = (p * m).sum(axis=(3, 4)) / m.sum(axis=(3, 4))
    return _act(y, a["act"])


def ref_softmax(x, beta):
    z = beta * (x - x.max(axis=-1, keepdims=True))
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


# ---- cases ---------------------------------------------------------------------------------------

def float_cases() -> list[Case]:
    return [_conv_f(), _conv_nobias_dilated_f(), _dwconv_f(), _fc_f(), _fc_keepdims_nobias_f(), _add_f(),
            _pools_f(), _mean_f(), _reshape_f(), _softmax_f(), _relu_pad_concat_f(), _f16_weights(), _prelu_slice_f(), _act_arith_f(),
            _resize_f(), _tconv_f()]


def int8_cases() -> list[Case]:
    return [_conv_i8(), _dwconv_nobias_i8(), _dwconv_i8(), _fc_i8(), _add_i8(), _pools_i8(), _mean_i8(), _reshape_softmax_i8(),
            _relu_pad_concat_i8(), _quant_roundtrip(), _prelu_slice_i8(), _act_arith_i8(), _resize_i8(), _tconv_i8()]


def all_cases() -> list[Case]:
    return float_cases() + int8_cases()


def _conv_f() -> Case:
    b = _B(1)
    x = b.input([2, 7, 6, 3])
    w, bias = b.normal(4, 3, 2, 3), b.normal(4)
    a = dict(stride_h=2, stride_w=1, dilation_h=1, dilation_w=1, padding="same", act="relu")
    y = b.op("conv2d", [x, b.const(w), b.const(bias, role="bias")], [2, 4, 6, 4], **a)
    feeds = {x: b.normal(2, 7, 6, 3)}
    return Case("conv2d_f32", b.graph([y]), feeds, {y: ref_conv(feeds[x], w, bias, a)})


def _conv_nobias_dilated_f() -> Case:
    b = _B(2)
    x = b.input([1, 9, 8, 2])
    w = b.normal(3, 3, 3, 2)
    a = dict(stride_h=1, stride_w=1, dilation_h=2, dilation_w=1, padding="valid", act="relu6")
    y = b.op("conv2d", [x, b.const(w), None], [1, 5, 6, 3], **a)
    feeds = {x: b.normal(1, 9, 8, 2) * 3}
    return Case("conv2d_nobias_dilated_f32", b.graph([y]), feeds, {y: ref_conv(feeds[x], w, None, a)})


def _dwconv_f() -> Case:
    b = _B(3)
    x = b.input([1, 8, 8, 3])
    w, bias = b.normal(1, 3, 3, 6), b.normal(6)
    a = dict(stride_h=2, stride_w=2, dilation_h=1, dilation_w=1, padding="same", depth_multiplier=2, act="none")
    y = b.op("depthwise_conv2d", [x, b.const(w), b.const(bias, role="bias")], [1, 4, 4, 6], **a)
    feeds = {x: b.normal(1, 8, 8, 3)}
    return Case("depthwise_conv2d_f32", b.graph([y]), feeds, {y: ref_dwconv(feeds[x], w, bias, a)})


def _fc_f() -> Case:
    b = _B(4)
    x = b.input([3, 10])
    w, bias = b.normal(5, 10), b.normal(5)
    y = b.op("fully_connected", [x, b.const(w), b.const(bias, role="bias")], [3, 5], act="relu", keep_num_dims=False)
    feeds = {x: b.normal(3, 10)}
    return Case("fully_connected_f32", b.graph([y]), feeds, {y: np.maximum(feeds[x] @ w.T + bias, 0)})


def _fc_keepdims_nobias_f() -> Case:
    b = _B(5)
    x = b.input([2, 3, 4])
    w = b.normal(6, 4)
    y = b.op("fully_connected", [x, b.const(w), None], [2, 3, 6], act="none", keep_num_dims=True)
    feeds = {x: b.normal(2, 3, 4)}
    return Case("fully_connected_keepdims_f32", b.graph([y]), feeds, {y: feeds[x] @ w.T})


def _add_f() -> Case:
    b = _B(6)
    x0, x1 = b.input([1, 4, 4, 3]), b.input([1, 4, 4, 3])
    y = b.op("add", [x0, x1], [1, 4, 4, 3], act="relu6")
    feeds = {x0: b.normal(1, 4, 4, 3) * 4, x1: b.normal(1, 4, 4, 3) * 4}
    return Case("add_f32", b.graph([y]), feeds, {y: np.clip(feeds[x0] + feeds[x1], 0, 6)})


def _pools_f() -> Case:
    b = _B(7)
    x = b.input([1, 7, 7, 2])
    aa = dict(filter_h=3, filter_w=2, stride_h=2, stride_w=2, padding="same", act="none")
    am = dict(filter_h=2, filter_w=3, stride_h=1, stride_w=2, padding="valid", act="relu")
    ya = b.op("average_pool2d", [x], [1, 4, 4, 2], **aa)
    ym = b.op("max_pool2d", [x], [1, 6, 3, 2], **am)
    feeds = {x: b.normal(1, 7, 7, 2)}
    return Case("pools_f32", b.graph([ya, ym]), feeds,
                {ya: ref_pool(feeds[x], aa, "avg"), ym: ref_pool(feeds[x], am, "max")})


def _mean_f() -> Case:
    b = _B(8)
    x = b.input([2, 5, 4, 3])
    axes = b.const(np.array([1, 2], np.int32), role="constant")
    y1 = b.op("mean", [x, axes], [2, 1, 1, 3], keep_dims=True)
    y2 = b.op("mean", [x, axes], [2, 3], keep_dims=False)
    feeds = {x: b.normal(2, 5, 4, 3)}
    m = feeds[x].astype(np.float64).mean(axis=(1, 2))
    return Case("mean_f32", b.graph([y1, y2]), feeds, {y1: m[:, None, None, :], y2: m})


def _reshape_f() -> Case:
    b = _B(9)
    x = b.input([1, 2, 3, 4])
    shape = b.const(np.array([1, 24], np.int32), role="constant")
    y1 = b.op("reshape", [x, shape], [1, 24], new_shape=[1, 24])
    y2 = b.op("reshape", [y1], [1, 4, 6], new_shape=[1, 4, 6])
    feeds = {x: b.normal(1, 2, 3, 4)}
    return Case("reshape_f32", b.graph([y2]), feeds, {y2: feeds[x].reshape(1, 4, 6)})


def _softmax_f() -> Case:
    b = _B(10)
    x = b.input([3, 7])
    y = b.op("softmax", [x], [3, 7], beta=0.5)
    feeds = {x: b.normal(3, 7) * 3}
    return Case("softmax_f32", b.graph([y]), feeds, {y: ref_softmax(feeds[x].astype(np.float64), 0.5)})


def _relu_pad_concat_f() -> Case:
    b = _B(11)
    x = b.input([1, 3, 3, 2])
    r = b.op("relu", [x], [1, 3, 3, 2])
    r6 = b.op("relu6", [x], [1, 3, 3, 2])
    pads = b.const(np.array([[0, 0], [1, 0], [0, 2], [0, 0]], np.int32), role="constant")
    p = b.op("pad", [r, pads], [1, 4, 5, 2])
    rp = b.op("pad", [r6, pads], [1, 4, 5, 2])
    y = b.op("concatenation", [p, rp, p], [1, 4, 5, 6], axis=3, act="none")
    feeds = {x: b.normal(1, 3, 3, 2) * 5}
    pr = np.pad(np.maximum(feeds[x], 0), [[0, 0], [1, 0], [0, 2], [0, 0]])
    pr6 = np.pad(np.clip(feeds[x], 0, 6), [[0, 0], [1, 0], [0, 2], [0, 0]])
    return Case("relu_pad_concat_f32", b.graph([y]), feeds, {y: np.concatenate([pr, pr6, pr], axis=3)})


def _f16_weights() -> Case:
    b = _B(12)
    x = b.input([2, 6])
    w16 = b.normal(3, 6).astype(np.float16)
    wf = b.op("dequantize", [b.const(w16)], [3, 6])
    y = b.op("fully_connected", [x, wf, None], [2, 3], act="none", keep_num_dims=False)
    feeds = {x: b.normal(2, 6)}
    return Case("float16_weights", b.graph([y]), feeds, {y: feeds[x] @ w16.astype(np.float32).T})


# ---- int8 ----------------------------------------------------------------------------------------

def _pc_weights(b: _B, shape, axis) -> tuple[np.ndarray, QuantParams]:
    n = shape[axis]
    scales = list(b.rng.uniform(0.005, 0.03, n))
    return b.int8(*shape).clip(-127, 127), QuantParams(scales, [0] * n, axis)


def _bias(b: _B, s_in: float, wq: QuantParams) -> tuple[np.ndarray, QuantParams]:
    n = len(wq.scale)
    scales = [s_in * s for s in wq.scale]
    return b.rng.integers(-2000, 2000, n).astype(np.int32), QuantParams(scales, [0] * n, 0)


def _conv_i8() -> Case:
    b = _B(21)
    qi, qo = _aq(0.05, -3), _aq(0.1, 5)
    x = b.input([1, 6, 6, 3], "int8", qi)
    w, wq = _pc_weights(b, (4, 3, 3, 3), 0)
    bias, bq = _bias(b, 0.05, wq)
    y = b.op("conv2d", [x, b.const(w, wq), b.const(bias, bq, role="bias")], [1, 3, 3, 4], "int8", qo,
             stride_h=2, stride_w=2, dilation_h=1, dilation_w=1, padding="same", act="relu")
    return Case("conv2d_i8", b.graph([y]), {x: b.int8(1, 6, 6, 3)})


def _dwconv_i8() -> Case:
    b = _B(22)
    qi, qo = _aq(0.04, 10), _aq(0.08, -7)
    x = b.input([1, 5, 5, 4], "int8", qi)
    w, wq = _pc_weights(b, (1, 3, 3, 4), 3)
    bias, bq = _bias(b, 0.04, wq)
    y = b.op("depthwise_conv2d", [x, b.const(w, wq), b.const(bias, bq, role="bias")], [1, 5, 5, 4], "int8", qo,
             stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="same", depth_multiplier=1, act="relu6")
    return Case("depthwise_conv2d_i8", b.graph([y]), {x: b.int8(1, 5, 5, 4)})


def _dwconv_nobias_i8() -> Case:
    b = _B(30)
    qi, qo = _aq(0.04, -20), _aq(0.03, 1)
    x = b.input([1, 4, 4, 2], "int8", qi)
    w, wq = _pc_weights(b, (1, 2, 2, 4), 3)
    y = b.op("depthwise_conv2d", [x, b.const(w, wq)], [1, 3, 3, 4], "int8", qo,
             stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="valid", depth_multiplier=2, act="none")
    return Case("depthwise_conv2d_nobias_i8", b.graph([y]), {x: b.int8(1, 4, 4, 2)})


def _fc_i8() -> Case:
    b = _B(23)
    qi, qo = _aq(0.03, -128), _aq(0.2, 3)
    x = b.input([2, 12], "int8", qi)
    w = b.int8(5, 12).clip(-127, 127)
    wq = _aq(0.02, 0)
    bias = b.rng.integers(-500, 500, 5).astype(np.int32)
    y = b.op("fully_connected", [x, b.const(w, wq), b.const(bias, _aq(0.03 * 0.02, 0), role="bias")], [2, 5],
             "int8", qo, act="none", keep_num_dims=False)
    return Case("fully_connected_i8", b.graph([y]), {x: b.int8(2, 12)})


def _add_i8() -> Case:
    b = _B(24)
    x0 = b.input([1, 3, 3, 2], "int8", _aq(0.05, 2))
    x1 = b.input([1, 3, 3, 2], "int8", _aq(0.07, -9))
    y = b.op("add", [x0, x1], [1, 3, 3, 2], "int8", _aq(0.1, -1), act="relu")
    return Case("add_i8", b.graph([y]), {x0: b.int8(1, 3, 3, 2), x1: b.int8(1, 3, 3, 2)})


def _pools_i8() -> Case:
    b = _B(25)
    q = _aq(0.05, -4)
    x = b.input([1, 6, 6, 3], "int8", q)
    ya = b.op("average_pool2d", [x], [1, 3, 3, 3], "int8", q,
              filter_h=2, filter_w=2, stride_h=2, stride_w=2, padding="valid", act="none")
    ym = b.op("max_pool2d", [x], [1, 3, 3, 3], "int8", q,
              filter_h=3, filter_w=3, stride_h=2, stride_w=2, padding="same", act="none")
    return Case("pools_i8", b.graph([ya, ym]), {x: b.int8(1, 6, 6, 3)})


def _mean_i8() -> Case:
    b = _B(26)
    x = b.input([1, 4, 4, 5], "int8", _aq(0.05, 3))
    axes = b.const(np.array([1, 2], np.int32), role="constant")
    y = b.op("mean", [x, axes], [1, 1, 1, 5], "int8", _aq(0.02, -2), keep_dims=True)
    return Case("mean_i8", b.graph([y]), {x: b.int8(1, 4, 4, 5)})


def _reshape_softmax_i8() -> Case:
    b = _B(27)
    q = _aq(0.1, 4)
    x = b.input([1, 2, 5], "int8", q)
    shape = b.const(np.array([1, 10], np.int32), role="constant")
    r = b.op("reshape", [x, shape], [1, 10], "int8", q, new_shape=[1, 10])
    y = b.op("softmax", [r], [1, 10], "int8", _aq(1 / 256, -128), beta=1.0)
    return Case("reshape_softmax_i8", b.graph([y]), {x: b.int8(1, 2, 5)})


def _relu_pad_concat_i8() -> Case:
    b = _B(28)
    q = _aq(0.05, -10)
    x = b.input([1, 3, 3, 2], "int8", q)
    r = b.op("relu", [x], [1, 3, 3, 2], "int8", q)
    r6 = b.op("relu6", [x], [1, 3, 3, 2], "int8", q)
    pads = b.const(np.array([[0, 0], [1, 1], [0, 1], [0, 0]], np.int32), role="constant")
    p = b.op("pad", [r, pads], [1, 5, 4, 2], "int8", q)
    p6 = b.op("pad", [r6, pads], [1, 5, 4, 2], "int8", q)
    y = b.op("concatenation", [p, p6], [1, 5, 4, 4], "int8", q, axis=-1, act="none")
    return Case("relu_pad_concat_i8", b.graph([y]), {x: b.int8(1, 3, 3, 2)})


def _quant_roundtrip() -> Case:
    b = _B(29)
    x = b.input([2, 8])
    q = b.op("quantize", [x], [2, 8], "int8", _aq(0.02, 7))
    rq = b.op("quantize", [q], [2, 8], "int8", _aq(0.05, -3))
    y = b.op("dequantize", [rq], [2, 8])
    return Case("quantize_dequantize", b.graph([y]), {x: b.normal(2, 8)})


def _slice(b: _B, x: str, begin, end, steps, out_shape, dtype="float32", q=None, **attrs) -> str:
    ops = [b.const(np.array(v, np.int32), role="constant") for v in (begin, end, steps)]
    return b.op("strided_slice", [x] + ops, out_shape, dtype, q, **attrs)


def _prelu_slice_f() -> Case:
    # x[:, 1:4:2, ::-1, 1] (stride 2, stride -1 via masks, shrink): starts/stops as the reader resolves them.
    b = _B(40)
    x = b.input([1, 4, 3, 2])
    alpha = b.const(b.normal(1, 1, 2), role="constant")
    p = b.op("prelu", [x, alpha], [1, 4, 3, 2])
    y = _slice(b, p, [0, 1, 0, 1], [1, 4, 0, 2], [1, 2, -1, 1], [1, 2, 3], starts=[0, 1, 2, 1],
               stops=[1, 4, -1, 2], strides=[1, 2, -1, 1], begin_mask=4, end_mask=4, shrink_axis_mask=8)
    feeds = {x: b.normal(1, 4, 3, 2)}
    a = b.tensors[alpha].data
    ref = np.where(feeds[x] >= 0, feeds[x], feeds[x] * a)[:, 1:4:2, ::-1, 1]
    return Case("prelu_slice_f", b.graph([y]), feeds, {y: ref})


def _prelu_slice_i8() -> Case:
    b = _B(41)
    x = b.input([1, 4, 3, 2], "int8", _aq(0.05, 3))
    alpha = b.const(b.int8(1, 1, 2), _aq(0.01, -20), role="constant")
    p = b.op("prelu", [x, alpha], [1, 4, 3, 2], "int8", _aq(0.04, -5))
    y = _slice(b, p, [0, 0, 1, 0], [1, 4, 3, 2], [1, 1, 1, 1], [1, 4, 2, 2], "int8", _aq(0.04, -5),
               starts=[0, 0, 1, 0], stops=[1, 4, 3, 2], strides=[1, 1, 1, 1])
    return Case("prelu_slice_i8", b.graph([y]), {x: b.int8(1, 4, 3, 2)})


def _act_arith_f() -> Case:
    """MUL (fused RELU) of two activations, SUB of a broadcast constant (fused RELU6), LOGISTIC, TANH,
    HARD_SWISH, LEAKY_RELU (a wrongly written alpha or fused activation changes the numbers)."""
    b = _B(42)
    x0, x1 = b.input([1, 3, 4, 2]), b.input([1, 3, 4, 2])
    c = b.normal(2)
    m = b.op("mul", [x0, x1], [1, 3, 4, 2], act="relu")
    sb = b.op("sub", [m, b.const(c, role="constant")], [1, 3, 4, 2], act="relu6")
    lg = b.op("logistic", [x0], [1, 3, 4, 2])
    th = b.op("tanh", [x1], [1, 3, 4, 2])
    hs = b.op("hard_swish", [x0], [1, 3, 4, 2])
    lr = b.op("leaky_relu", [x1], [1, 3, 4, 2], alpha=0.25)
    feeds = {x0: b.normal(1, 3, 4, 2) * 3, x1: b.normal(1, 3, 4, 2) * 3}
    a0, a1 = feeds[x0].astype(np.float64), feeds[x1].astype(np.float64)
    return Case("act_arith_f32", b.graph([sb, lg, th, hs, lr]), feeds, {
        sb: np.clip(np.maximum(a0 * a1, 0) - c, 0, 6), lg: 1 / (1 + np.exp(-a0)), th: np.tanh(a1),
        hs: a0 * np.clip(a0 + 3, 0, 6) / 6, lr: np.where(a1 > 0, a1, 0.25 * a1)})


def _act_arith_i8() -> Case:
    b = _B(43)
    q0, q1 = _aq(0.05, 3), _aq(0.04, -7)
    x0, x1 = b.input([1, 3, 4, 2], "int8", q0), b.input([1, 3, 4, 2], "int8", q1)
    c = b.const(b.int8(2), _aq(0.03, 10), role="constant")
    m = b.op("mul", [x0, c], [1, 3, 4, 2], "int8", _aq(0.02, -5), act="none")
    sb = b.op("sub", [m, x1], [1, 3, 4, 2], "int8", _aq(0.09, 2), act="relu")
    lg = b.op("logistic", [x0], [1, 3, 4, 2], "int8", _aq(1 / 256, -128))
    th = b.op("tanh", [x1], [1, 3, 4, 2], "int8", _aq(1 / 128, 0))
    hs = b.op("hard_swish", [x0], [1, 3, 4, 2], "int8", _aq(0.03, -90))
    lr = b.op("leaky_relu", [x1], [1, 3, 4, 2], "int8", _aq(0.03, 40), alpha=0.25)
    return Case("act_arith_i8", b.graph([sb, lg, th, hs, lr]), {x0: b.int8(1, 3, 4, 2), x1: b.int8(1, 3, 4, 2)})


def _ref_resize(x: np.ndarray, out_hw, op: str, align: bool, half: bool) -> np.ndarray:
    """TFLite's coordinate mapping in float64 (bilinear: the four-tap blend; nearest: floor, or round with
    align_corners)."""
    idx = []
    for ax, o in ((1, out_hw[0]), (2, out_hw[1])):
        n = x.shape[ax]
        scale = (n - 1) / (o - 1) if align and o > 1 else n / o
        v = (np.arange(o) + 0.5) * scale - 0.5 if (half and op == "resize_bilinear") else \
            (np.arange(o) + (0.5 if half else 0.0)) * scale
        idx.append((v, n))
    if op == "resize_nearest_neighbor":
        iy, ix = ((np.minimum(np.floor(v + 0.5) if align else np.floor(v), n - 1).astype(int)) for v, n in idx)
        return x[:, iy][:, :, ix]
    (vy, ny), (vx, nx) = idx
    y0, x0 = np.maximum(np.floor(vy), 0).astype(int), np.maximum(np.floor(vx), 0).astype(int)
    y1, x1 = np.minimum(np.ceil(vy), ny - 1).astype(int), np.minimum(np.ceil(vx), nx - 1).astype(int)
    wy, wx = (vy - y0)[:, None, None], (vx - x0)[None, :, None]
    return (x[:, y0][:, :, x0] * (1 - wy) * (1 - wx) + x[:, y1][:, :, x0] * wy * (1 - wx)
            + x[:, y0][:, :, x1] * (1 - wy) * wx + x[:, y1][:, :, x1] * wy * wx)


def _resize_f() -> Case:
    """RESIZE_BILINEAR with half_pixel_centers (up) and align_corners (down), RESIZE_NEAREST_NEIGHBOR with
    align_corners and neither option: a wrongly written flag or size moves the numbers."""
    b = _B(44)
    x = b.input([1, 3, 4, 2])
    size = lambda h, w: b.const(np.array([h, w], np.int32), role="constant")  # noqa: E731
    specs = [("resize_bilinear", (6, 8), False, True), ("resize_bilinear", (2, 3), True, False),
             ("resize_nearest_neighbor", (5, 7), True, False), ("resize_nearest_neighbor", (7, 9), False, False)]
    outs = [b.op(t, [x, size(*hw)], [1, hw[0], hw[1], 2], align_corners=al, half_pixel_centers=hp)
            for t, hw, al, hp in specs]
    feeds = {x: b.normal(1, 3, 4, 2)}
    xf = feeds[x].astype(np.float64)
    return Case("resize_f32", b.graph(outs), feeds,
                {o: _ref_resize(xf, hw, t, al, hp) for o, (t, hw, al, hp) in zip(outs, specs)})


def _resize_i8() -> Case:
    b = _B(45)
    q = _aq(0.05, -4)
    x = b.input([1, 3, 4, 2], "int8", q)
    s1 = b.const(np.array([7, 5], np.int32), role="constant")
    s2 = b.const(np.array([2, 9], np.int32), role="constant")
    y1 = b.op("resize_bilinear", [x, s1], [1, 7, 5, 2], "int8", q, align_corners=False, half_pixel_centers=True)
    y2 = b.op("resize_nearest_neighbor", [x, s2], [1, 2, 9, 2], "int8", q, align_corners=False,
              half_pixel_centers=True)
    return Case("resize_i8", b.graph([y1, y2]), {x: b.int8(1, 3, 4, 2)})


# ---- transpose_conv (tests/test_transpose_conv.py has the full set) -----------------------------------------------

def _ref_tconv(x, w, b, sh, sw, pt, pl, oh, ow):
    y = np.zeros((x.shape[0], oh, ow, w.shape[0]))
    for iy in range(x.shape[1]):
        for ix in range(x.shape[2]):
            for ky in range(w.shape[1]):
                for kx in range(w.shape[2]):
                    oy, ox = iy * sh - pt + ky, ix * sw - pl + kx
                    if 0 <= oy < oh and 0 <= ox < ow:
                        y[:, oy, ox, :] += x[:, iy, ix, :] @ w[:, ky, kx, :].T
    return y + b


def _tconv_f() -> Case:
    """Stride 2 SAME (pad 0 before, the odd pixel after), ReLU; the IR order x, w, b, output_shape."""
    b = _B(41)
    x = b.input([1, 3, 2, 2])
    w = b.normal(3, 3, 3, 2)
    bias = b.normal(3)
    os_ = b.const(np.array([1, 6, 4, 3], np.int32), role="constant")
    y = b.op("transpose_conv", [x, b.const(w), b.const(bias, role="bias"), os_], [1, 6, 4, 3],
             stride_h=2, stride_w=2, padding="same", act="relu")
    feeds = {x: b.normal(1, 3, 2, 2)}
    return Case("transpose_conv_f32", b.graph([y]), feeds,
                {y: np.maximum(_ref_tconv(feeds[x], w, bias, 2, 2, 0, 0, 6, 4), 0)})


def _tconv_i8() -> Case:
    b = _B(42)
    x = b.input([1, 3, 3, 2], "int8", _aq(0.05, 4))
    w, wq = _pc_weights(b, (3, 2, 2, 2), 0)
    os_ = b.const(np.array([1, 4, 4, 3], np.int32), role="constant")
    y = b.op("transpose_conv", [x, b.const(w, wq), None, os_], [1, 4, 4, 3], "int8", _aq(0.02, -7),
             stride_h=1, stride_w=1, padding="valid", act="none")
    return Case("transpose_conv_nobias_i8", b.graph([y]), {x: b.int8(1, 3, 3, 2)})
