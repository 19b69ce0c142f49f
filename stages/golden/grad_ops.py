"""Numpy kernels of the backward ops, losses and optimizer updates (DESIGN §6: fp32 end to end for float models).

Every kernel is a pure function of arrays and op attrs; `train_executor` maps the training IR's op types onto them.
They compute in float32 like the forward kernels, so that a float model trains as the firmware will; the tests
check them against float64 central differences and the whole loop against PyTorch (float32).

Activations carry a leading batch dim N (the training executor feeds one sample at a time, N = 1, but nothing here
depends on it). Layout NHWC; weights as in the IR: conv [O,KH,KW,I], depthwise [1,KH,KW,C*M], FC [O,I].

Channel-sliced weight gradients (sparse update, DESIGN §6): `k` is the number of leading *input* channels whose
weights are trained; the gradient has that many channels on the weight's last axis (depthwise: k·M, the output
channels fed by input channels [0, k)).

Geometry is TFLite's (kernels/padding.h): SAME puts total//2 before and the odd extra pixel after.
"""

from __future__ import annotations

import numpy as np

from tinytrain.stages.model.geometry import out_size_and_pad

F32 = np.float32


# ---- geometry --------------------------------------------------------------------------------------------------

class _Geo:
    """Where each tap of a strided, dilated window lands in the padded input."""

    def __init__(self, in_hw: tuple[int, int], kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, padding: str):
        self.h, self.w = in_hw
        self.kh, self.kw, self.sh, self.sw, self.dh, self.dw = kh, kw, sh, sw, dh, dw
        self.oh, self.pt = out_size_and_pad(padding, self.h, kh, sh, dh)
        self.ow, self.pl = out_size_and_pad(padding, self.w, kw, sw, dw)
        need_h = (self.oh - 1) * sh + (kh - 1) * dh + 1
        need_w = (self.ow - 1) * sw + (kw - 1) * dw + 1
        # The padded extent covers every tap; taps past the image on either side read padding.
        self.hp = max(need_h, self.pt + self.h)
        self.wp = max(need_w, self.pl + self.w)

    def pad(self, x: np.ndarray, value=0.0) -> np.ndarray:
        return np.pad(x, ((0, 0), (self.pt, self.hp - self.h - self.pt), (self.pl, self.wp - self.w - self.pl), (0, 0)),
                      constant_values=value)

    def crop(self, xp: np.ndarray) -> np.ndarray:
        return xp[:, self.pt:self.pt + self.h, self.pl:self.pl + self.w, :]

    def tap(self, ky: int, kx: int) -> tuple[slice, slice]:
        y0, x0 = ky * self.dh, kx * self.dw
        return (slice(y0, y0 + (self.oh - 1) * self.sh + 1, self.sh), slice(x0, x0 + (self.ow - 1) * self.sw + 1, self.sw))

    def taps(self):
        for ky in range(self.kh):
            for kx in range(self.kw):
                yield ky, kx, self.tap(ky, kx)


def _conv_geo(x_shape, kh, kw, attrs) -> _Geo:
    return _Geo((x_shape[1], x_shape[2]), kh, kw, int(attrs["stride_h"]), int(attrs["stride_w"]),
                int(attrs.get("dilation_h", 1)), int(attrs.get("dilation_w", 1)), attrs["padding"])


def _pool_geo(x_shape, attrs) -> _Geo:
    return _Geo((x_shape[1], x_shape[2]), int(attrs["filter_h"]), int(attrs["filter_w"]),
                int(attrs["stride_h"]), int(attrs["stride_w"]), 1, 1, attrs["padding"])


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=F32)


# ---- activations -----------------------------------------------------------------------------------------------

def act_grad(dy: np.ndarray, y: np.ndarray, act: str) -> np.ndarray:
    """Gradient through a (fused) activation, masked by the forward *output*: zero where the forward clamped
    (straight-through inside the range). Matches PyTorch's relu (result > 0) and hardtanh (min < x < max)."""
    dy, y = _f32(dy), _f32(y)
    if act == "none":
        return dy
    if act == "relu":
        mask = y > 0
    elif act == "relu6":
        mask = (y > 0) & (y < 6)
    elif act == "relu_n1_to_1":
        mask = (y > -1) & (y < 1)
    elif act == "tanh":
        return tanh_grad(dy, y)
    else:
        raise NotImplementedError(f"gradient of activation {act!r}")
    return np.where(mask, dy, F32(0)).astype(F32)


# ---- 1-bit activation masks (autodiff's clamp_mask / mask_grad) ---------------------------------------------------

def clamp_mask(y: np.ndarray, lo, hi=None) -> np.ndarray:
    """Bit i (LSB first: byte i // 8, bit i % 8) of the packed uint8[ceil(n/8)] result is 1 where lo < y.flat[i]
    (and y.flat[i] < hi; hi None: no upper bound), i.e. where the gradient passes. int8 y compares as integers
    (int8_clamp_grad's test), float y in float32 (act_grad's: NaN gives 0, +inf passes an unbounded hi)."""
    y = np.asarray(y).reshape(-1)
    if np.issubdtype(y.dtype, np.integer):
        v = y.astype(np.int64)
        keep = v > int(lo)
        if hi is not None:
            keep &= v < int(hi)
    else:
        v = y.astype(F32)
        keep = v > F32(lo)
        if hi is not None:
            keep &= v < F32(hi)
    return np.packbits(keep, bitorder="little")


def mask_grad(dy: np.ndarray, mask: np.ndarray, bit_offset: int = 0) -> np.ndarray:
    """dz = dy where the mask's bit (bit_offset + i for element i of dy) is set, else 0.0f."""
    dy = _f32(dy)
    n = dy.size
    bits = np.unpackbits(np.asarray(mask, np.uint8).reshape(-1), count=bit_offset + n, bitorder="little")
    keep = bits[bit_offset:].astype(bool).reshape(dy.shape)
    return np.where(keep, dy, F32(0)).astype(F32)


def softmax_grad(dy: np.ndarray, y: np.ndarray, beta: float = 1.0) -> np.ndarray:
    """y = softmax(beta·x) along the last axis: dx = beta · y · (dy − Σ dy·y)."""
    dy, y = _f32(dy), _f32(y)
    s = (dy * y).sum(axis=-1, keepdims=True, dtype=F32)
    return (F32(beta) * y * (dy - s)).astype(F32)


def logistic_grad(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y = σ(x), from the forward *output*: dx = dy·(1 − y)·y (PyTorch's sigmoid_backward, in its order)."""
    dy, y = _f32(dy), _f32(y)
    return (dy * (F32(1) - y) * y).astype(F32)


def tanh_grad(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y = tanh(x), from the forward output: dx = dy·(1 − y²). (PyTorch fuses 1 − y·y into one FMA; plain float32
    differs from it by an ulp on some elements, far below the loss-curve tolerance.)"""
    dy, y = _f32(dy), _f32(y)
    return (dy * (F32(1) - y * y)).astype(F32)


def hard_swish_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y = x·relu6(x + 3)/6, from the forward *input*: 0 for x ≤ −3, 1 for x ≥ 3, x/3 + 1/2 between. The kinks
    take PyTorch's (2.x hardswish_backward) choices: the open interval (−3, 3) is linear, so dx(−3) = 0 and
    dx(3) = dy, and the middle is computed as dy·(x/3 + 0.5) exactly as it does (bit-equal)."""
    dy, x = _f32(dy), _f32(x)
    mid = dy * (x / F32(3) + F32(0.5))
    return np.where(x <= F32(-3), F32(0), np.where(x < F32(3), mid, dy)).astype(F32)


def leaky_relu_grad(dy: np.ndarray, x: np.ndarray, alpha: float) -> np.ndarray:
    """y = x > 0 ? x : αx: dx = dy where x > 0, α·dy elsewhere (x = 0 takes α, as the forward and PyTorch)."""
    dy, x = _f32(dy), _f32(x)
    return np.where(x > F32(0), dy, dy * F32(alpha)).astype(F32)


def prelu_grad(dy: np.ndarray, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """y = x ≥ 0 ? x : α·x with α broadcast over x (per channel, or per position without the batch axis): the
    input gradient only, α being a constant of the model (never trained in our plans). At x = 0, where the
    function has its kink, the slope is α as in PyTorch's prelu backward (x > 0 ? dy : α·dy)."""
    dy, x, alpha = _f32(dy), _f32(x), _f32(alpha)
    return np.where(x > F32(0), dy, dy * alpha).astype(F32)


# ---- convolution family ----------------------------------------------------------------------------------------

def conv2d_grad_input(dy: np.ndarray, w: np.ndarray, x_shape, attrs) -> np.ndarray:
    """dL/dx of conv2d (dy is the gradient of the pre-activation output)."""
    dy, w = _f32(dy), _f32(w)
    o, kh, kw, ci = w.shape
    g = _conv_geo(x_shape, kh, kw, attrs)
    dxp = np.zeros((x_shape[0], g.hp, g.wp, ci), dtype=F32)
    # A 1x1 kernel's one tap is the whole weight: numpy multiplies its (O, CI) reshape ~10x faster than the
    # [:, 0, 0, :] view of the 4-D array (MobileNetV2's 1x1 convs), with the same bits (checked on 460 random
    # conv shapes against the slice form).
    flat = w.reshape(o, ci) if kh == kw == 1 else None
    for ky, kx, (sy, sx) in g.taps():
        dxp[:, sy, sx, :] += dy @ (flat if flat is not None else w[:, ky, kx, :])
    return np.ascontiguousarray(g.crop(dxp))


def conv2d_grad_weight(dy: np.ndarray, x: np.ndarray, w_shape, attrs, k: int | None = None) -> np.ndarray:
    """dL/dw[O,KH,KW,:k] of conv2d: the first k input channels only (all when k is None)."""
    dy, x = _f32(dy), _f32(x)
    o, kh, kw, ci = w_shape
    k = ci if k is None else int(k)
    g = _conv_geo(x.shape, kh, kw, attrs)
    xp = g.pad(x[..., :k])
    d2 = dy.reshape(-1, o)
    dw = np.zeros((o, kh, kw, k), dtype=F32)
    for ky, kx, (sy, sx) in g.taps():
        dw[:, ky, kx, :] = d2.T @ xp[:, sy, sx, :].reshape(-1, k)
    return dw


def _tconv_geo(x_shape, y_shape, kh: int, kw: int, attrs) -> tuple[int, int, int, int, int, int]:
    """(stride_h, stride_w, pad_top, pad_left, full_h, full_w) of transpose_conv: the executor's geometry, and the
    size of the zero-padded output buffer in which every tap of every input pixel lies."""
    sh, sw = int(attrs["stride_h"]), int(attrs["stride_w"])
    _, pt = out_size_and_pad(attrs["padding"], int(y_shape[1]), kh, sh)
    _, pl = out_size_and_pad(attrs["padding"], int(y_shape[2]), kw, sw)
    h, w = int(x_shape[1]), int(x_shape[2])
    return sh, sw, pt, pl, max((h - 1) * sh + kh, pt + int(y_shape[1])), max((w - 1) * sw + kw, pl + int(y_shape[2]))


def _tconv_dy_padded(dy: np.ndarray, pt: int, pl: int, full_h: int, full_w: int) -> np.ndarray:
    out = np.zeros((dy.shape[0], full_h, full_w, dy.shape[3]), dtype=F32)
    out[:, pt:pt + dy.shape[1], pl:pl + dy.shape[2], :] = dy
    return out


def transpose_conv_grad_input(dy: np.ndarray, w: np.ndarray, x_shape, attrs) -> np.ndarray:
    """dL/dx of transpose_conv (dy: the gradient of the pre-activation output): the forward convolution of the
    same geometry, dx[iy, ix, i] = sum over ky, kx, o of dy[iy*s - pad + ky, ix*s - pad + kx, o] * w[o, ky, kx, i]
    (taps outside dy read 0)."""
    dy, w = _f32(dy), _f32(w)
    o, kh, kw, ci = w.shape
    sh, sw, pt, pl, fh, fw = _tconv_geo(x_shape, dy.shape, kh, kw, attrs)
    h, wd = int(x_shape[1]), int(x_shape[2])
    dp = _tconv_dy_padded(dy, pt, pl, fh, fw)
    dx = np.zeros((dy.shape[0], h, wd, ci), dtype=F32)
    for ky in range(kh):
        for kx in range(kw):
            dx += dp[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :] @ w[:, ky, kx, :]
    return dx


def transpose_conv_grad_weight(dy: np.ndarray, x: np.ndarray, w_shape, attrs, k: int | None = None) -> np.ndarray:
    """dL/dw[O,KH,KW,:k] of transpose_conv (the first k input channels; all when k is None): dw[o, ky, kx, i] =
    sum over the batch and input pixels of x[iy, ix, i] * dy[iy*s - pad + ky, ix*s - pad + kx, o]. The bias
    gradient is bias_grad (the sum of dy over everything but the channel)."""
    dy, x = _f32(dy), _f32(x)
    o, kh, kw, ci = w_shape
    k = ci if k is None else int(k)
    sh, sw, pt, pl, fh, fw = _tconv_geo(x.shape, dy.shape, kh, kw, attrs)
    h, wd = x.shape[1], x.shape[2]
    dp = _tconv_dy_padded(dy, pt, pl, fh, fw)
    xs = x[..., :k].reshape(-1, k)
    dw = np.zeros((o, kh, kw, k), dtype=F32)
    for ky in range(kh):
        for kx in range(kw):
            tap = dp[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :].reshape(-1, o)
            dw[:, ky, kx, :] = tap.T @ xs
    return dw


def _dw_mult(c_in: int, o: int) -> int:
    if o % c_in:
        raise ValueError(f"depthwise filter has {o} channels for {c_in} input channels")
    return o // c_in


def depthwise_conv2d_grad_input(dy: np.ndarray, w: np.ndarray, x_shape, attrs) -> np.ndarray:
    dy, w = _f32(dy), _f32(w)
    _, kh, kw, o = w.shape
    c = x_shape[3]
    m = _dw_mult(c, o)
    g = _conv_geo(x_shape, kh, kw, attrs)
    dxp = np.zeros((x_shape[0], g.hp, g.wp, o), dtype=F32)
    for ky, kx, (sy, sx) in g.taps():
        dxp[:, sy, sx, :] += dy * w[0, ky, kx, :]
    # Output channel ic·M + m reads input channel ic: fold the multiplier back.
    return np.ascontiguousarray(g.crop(dxp).reshape(x_shape[0], g.h, g.w, c, m).sum(axis=-1, dtype=F32))


def depthwise_conv2d_grad_weight(dy: np.ndarray, x: np.ndarray, w_shape, attrs, k: int | None = None,
                                 multiplier: int | None = None) -> np.ndarray:
    """dL/dw[1,KH,KW,:k·M]: the filters fed by the first k input channels. x may hold only those k channels
    (int8 training dequantizes just the trained slice); then `multiplier` (M) must be given, since x's depth no
    longer tells it."""
    dy, x = _f32(dy), _f32(x)
    _, kh, kw, o = w_shape
    c = x.shape[3]
    m = int(multiplier) if multiplier else _dw_mult(c, o)
    k = c if k is None else int(k)
    n_out = k * m
    g = _conv_geo(x.shape, kh, kw, attrs)
    xp = g.pad(np.repeat(x[..., :k], m, axis=-1))
    d = dy[..., :n_out]
    dw = np.zeros((1, kh, kw, n_out), dtype=F32)
    for ky, kx, (sy, sx) in g.taps():
        dw[0, ky, kx, :] = (d * xp[:, sy, sx, :]).reshape(-1, n_out).sum(axis=0, dtype=F32)
    return dw


def fully_connected_grad_input(dy: np.ndarray, w: np.ndarray, x_shape) -> np.ndarray:
    dy, w = _f32(dy), _f32(w)
    return (dy.reshape(-1, w.shape[0]) @ w).reshape(x_shape).astype(F32)


def fully_connected_grad_weight(dy: np.ndarray, x: np.ndarray, w_shape, k: int | None = None) -> np.ndarray:
    """x: the FC's input (any shape that flattens to rows of `depth`), or already its rows' first k columns
    (int8 training dequantizes just the trained slice): rows are counted from dy."""
    dy, x = _f32(dy), _f32(x)
    o, depth = w_shape
    k = depth if k is None else int(k)
    d2 = dy.reshape(-1, o)
    return (d2.T @ x.reshape(d2.shape[0], -1)[:, :k]).astype(F32)


def bias_grad(dy: np.ndarray) -> np.ndarray:
    """Sum over everything but the channel (last) axis, the batch included."""
    dy = _f32(dy)
    return dy.reshape(-1, dy.shape[-1]).sum(axis=0, dtype=F32)


# ---- element-wise, pooling, data movement ----------------------------------------------------------------------

def unbroadcast(dy: np.ndarray, shape) -> np.ndarray:
    """The gradient of an input that was broadcast up to dy's shape (ADD with a smaller operand)."""
    dy = _f32(dy)
    shape = tuple(shape)
    while dy.ndim > len(shape):
        dy = dy.sum(axis=0, dtype=F32)
    for ax, n in enumerate(shape):
        if n == 1 and dy.shape[ax] != 1:
            dy = dy.sum(axis=ax, keepdims=True, dtype=F32)
    return dy


def mul_grad(dy: np.ndarray, other: np.ndarray, shape) -> np.ndarray:
    """y = a·b: the gradient of one operand, unbroadcast(dy·other) to that operand's shape (the other operand is
    read at its own, possibly smaller, shape and broadcast)."""
    return unbroadcast(_f32(dy) * _f32(other), shape)


def sub_grad(dy: np.ndarray, shape, sign: float) -> np.ndarray:
    """y = a − b: +dy for a, −dy for b (sign), unbroadcast to the operand's shape."""
    g = unbroadcast(dy, shape)
    return g if sign > 0 else (-g).astype(F32)


def strided_slice_grad(dy: np.ndarray, x_shape, starts, stops, strides) -> np.ndarray:
    """Scatter dy into zeros of x's shape at start:stop:step per axis (axis 0, the batch, is taken whole as in the
    forward; a negative step runs backwards and stop −1 means past index 0, as the reader resolved them). dy may
    lack the shrunk axes (shrink_axis_mask): each holds one index, so a reshape restores them."""
    dy = _f32(dy)
    x_shape = (dy.shape[0],) + tuple(int(d) for d in x_shape)[1:]  # the run's batch, not the declared one
    idx = [np.arange(x_shape[0])] + [np.arange(int(starts[ax]), int(stops[ax]), int(strides[ax]))
                                     for ax in range(1, len(x_shape))]
    dx = np.zeros(x_shape, dtype=F32)
    # Indices within one axis are distinct (a strided range), so assignment is a scatter without collisions.
    dx[np.ix_(*idx)] = dy.reshape([len(i) for i in idx])
    return dx


def resize_bilinear_grad(dy: np.ndarray, x_shape, attrs) -> np.ndarray:
    """Backward of the float RESIZE_BILINEAR (executor._resize_bilinear): each output pixel's dy goes back to its
    four source pixels with the forward's float32 weights wy·wx (PyTorch's upsample_bilinear2d backward for the
    matching coordinate mapping: align_corners=True, or half_pixel_centers = PyTorch's align_corners=False).
    Accumulated in float32, output rows then columns in order (tt_resize_bilinear_grad_f32 does the same)."""
    from tinytrain.stages.ops.resize import resize_bilinear_axis
    dy = _f32(dy)
    n, oh, ow, c = dy.shape
    ih, iw = int(x_shape[1]), int(x_shape[2])
    al, hp = bool(attrs.get("align_corners", False)), bool(attrs.get("half_pixel_centers", False))
    y0, y1, wy0, wy1 = resize_bilinear_axis(ih, oh, al, hp)
    x0, x1, wx0, wx1 = resize_bilinear_axis(iw, ow, al, hp)
    dx = np.zeros((n, ih * iw, c), dtype=F32)
    for oy in range(oh):
        # One row's 4·ow contributions in (ox, tap) order; np.add.at adds repeated targets in that order.
        tgt = np.stack([y0[oy] * iw + x0, y1[oy] * iw + x0, y0[oy] * iw + x1, y1[oy] * iw + x1], axis=1).reshape(-1)
        # (dy · wy) · wx in float32, the forward's product order.
        g = (dy[:, oy, :, None, :] * np.stack([wy0[oy], wy1[oy], wy0[oy], wy1[oy]]).astype(F32)[None, None, :, None]
             ).astype(F32) * np.stack([wx0, wx0, wx1, wx1], axis=1)[None, :, :, None]
        np.add.at(dx, (slice(None), tgt), g.astype(F32).reshape(n, -1, c))
    return dx.reshape(n, ih, iw, c)


def resize_nearest_neighbor_grad(dy: np.ndarray, x_shape, attrs) -> np.ndarray:
    """Backward of RESIZE_NEAREST_NEIGHBOR: each output pixel's dy is summed into the source pixel it copied
    (float32, output rows then columns in order)."""
    from tinytrain.stages.ops.resize import resize_nearest_axis
    dy = _f32(dy)
    n, oh, ow, c = dy.shape
    ih, iw = int(x_shape[1]), int(x_shape[2])
    al, hp = bool(attrs.get("align_corners", False)), bool(attrs.get("half_pixel_centers", False))
    iy, ix = resize_nearest_axis(ih, oh, al, hp), resize_nearest_axis(iw, ow, al, hp)
    dx = np.zeros((n, ih * iw, c), dtype=F32)
    for oy in range(oh):
        np.add.at(dx, (slice(None), iy[oy] * iw + ix), dy[:, oy])
    return dx.reshape(n, ih, iw, c)


def average_pool2d_grad(dy: np.ndarray, x_shape, attrs) -> np.ndarray:
    """Each output spreads dy/count over its window; count is the number of in-image taps (TFLite's divisor)."""
    dy = _f32(dy)
    g = _pool_geo(x_shape, attrs)
    valid = g.pad(np.ones((1, g.h, g.w, 1), dtype=F32))
    count = np.zeros((1, g.oh, g.ow, 1), dtype=F32)
    for _, _, (sy, sx) in g.taps():
        count += valid[:, sy, sx, :]
    share = dy / count
    dxp = np.zeros((x_shape[0], g.hp, g.wp, x_shape[3]), dtype=F32)
    for _, _, (sy, sx) in g.taps():
        dxp[:, sy, sx, :] += share
    return np.ascontiguousarray(g.crop(dxp))


def max_pool2d_grad(dy: np.ndarray, x: np.ndarray, attrs) -> np.ndarray:
    """All of dy goes to the window's first maximum in row-major tap order (TFLite and PyTorch pick it)."""
    dy, x = _f32(dy), _f32(x)
    g = _pool_geo(x.shape, attrs)
    xp = g.pad(x, value=-np.inf)
    best = np.full((x.shape[0], g.oh, g.ow, x.shape[3]), -np.inf, dtype=F32)
    arg = np.zeros(best.shape, dtype=np.int64)
    taps = list(g.taps())
    for t, (_, _, (sy, sx)) in enumerate(taps):
        v = xp[:, sy, sx, :]
        better = v > best  # strict: ties keep the earlier tap
        best = np.where(better, v, best)
        arg = np.where(better, t, arg)
    dxp = np.zeros_like(xp, dtype=F32)
    for t, (_, _, (sy, sx)) in enumerate(taps):
        dxp[:, sy, sx, :] += np.where(arg == t, dy, F32(0))
    return np.ascontiguousarray(g.crop(dxp))


def mean_grad(dy: np.ndarray, x_shape, axes) -> np.ndarray:
    x_shape = tuple(x_shape)
    rank = len(x_shape)
    axes = sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})
    count = int(np.prod([x_shape[a] for a in axes], dtype=np.int64))
    keep = [1 if d in axes else x_shape[d] for d in range(rank)]
    g = _f32(dy).reshape(keep) / F32(count)
    return np.broadcast_to(g, x_shape).astype(F32)


def reshape_grad(dy: np.ndarray, x_shape) -> np.ndarray:
    return _f32(dy).reshape(tuple(x_shape))


def pad_grad(dy: np.ndarray, paddings) -> np.ndarray:
    p = np.asarray(paddings).reshape(dy.ndim, 2).astype(np.int64)
    idx = tuple(slice(int(a), dy.shape[d] - int(b)) for d, (a, b) in enumerate(p))
    return np.ascontiguousarray(_f32(dy)[idx])


def concatenation_grad(dy: np.ndarray, sizes: list[int], axis: int) -> list[np.ndarray]:
    """Split dy back into the inputs' extents along `axis`."""
    dy = _f32(dy)
    cuts = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(dy, cuts, axis=axis)]


def grad_sum(grads: list[np.ndarray]) -> np.ndarray:
    """Gradient of a tensor read by several ops: the sum of each reader's contribution (in reader order)."""
    out = _f32(grads[0]).copy()
    for g in grads[1:]:
        out += _f32(g)
    return out


# ---- losses (per sample; the batch mean is the update's 1/B) ---------------------------------------------------

def softmax_ce_loss(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fused softmax + cross-entropy with integer labels, summed over the rows given (the caller divides by
    the batch). Stable: log-sum-exp around the row max. Returns (loss[()], dlogits)."""
    z = _f32(logits)
    z2 = z.reshape(-1, z.shape[-1])
    lab = np.asarray(labels).reshape(-1).astype(np.int64)
    if lab.shape[0] != z2.shape[0]:
        raise ValueError(f"{lab.shape[0]} labels for {z2.shape[0]} rows of logits")
    if (lab < 0).any() or (lab >= z2.shape[1]).any():
        raise ValueError(f"labels outside [0, {z2.shape[1]})")
    sh = z2 - z2.max(axis=-1, keepdims=True)
    e = np.exp(sh).astype(F32)
    s = e.sum(axis=-1, keepdims=True, dtype=F32)
    rows = np.arange(z2.shape[0])
    loss = (np.log(s[:, 0]) - sh[rows, lab]).astype(F32).sum(dtype=F32)
    d = (e / s).astype(F32)
    d[rows, lab] -= F32(1)
    return np.asarray(loss, dtype=F32), d.reshape(z.shape)


def mse_loss(y: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: mean over the sample's elements of (y − t)², summed over the samples given; with the
    update's 1/B this is PyTorch's MSELoss(reduction='mean') over the batch (every sample has as many
    elements). Returns (loss[()], dy)."""
    y, t = _f32(y), _f32(target).reshape(np.shape(y))
    per = int(np.prod(y.shape[1:], dtype=np.int64)) if y.ndim > 1 else 1
    diff = (y - t).astype(F32)
    loss = ((diff * diff).reshape(y.shape[0], -1).sum(axis=1, dtype=F32) / F32(per)).sum(dtype=F32)
    return np.asarray(loss, dtype=F32), (F32(2) * diff / F32(per)).astype(F32)


# ---- optimizer updates (in place on the trained slice [..., :n] of the last axis) ------------------------------
# PyTorch's exact formulas (torch/optim/*.py, single-tensor, foreach=False, no weight decay unless given).
# Each optimizer is split in two: `*_step` updates its fp32 state and returns the fp32 step d (the parameter
# moves by −d), and the float update applies it. The int8 updates (stages/quant/qas.py) reuse the very same `*_step`
# functions and only change how −d reaches the integer parameter, so float and int8 training share one
# definition of every optimizer.

def _slice(n: int | None):
    return (Ellipsis,) if n is None else (Ellipsis, slice(0, int(n)))


def prepare_grad(g: np.ndarray, scale: float, weight_decay: float = 0.0, w: np.ndarray | None = None) -> np.ndarray:
    """gg = g·(1/B) (+ wd·w): float32, in this order."""
    gg = _f32(g) * F32(scale)
    if weight_decay:
        gg = gg + F32(weight_decay) * w
    return gg


def sgd_step(gg: np.ndarray, lr: float) -> np.ndarray:
    return F32(lr) * gg


def momentum_step(gg: np.ndarray, buf: np.ndarray, lr: float, momentum: float) -> np.ndarray:
    buf *= F32(momentum)
    buf += gg
    return F32(lr) * buf


def adam_step(gg: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float, beta1: float, beta2: float,
              eps: float) -> np.ndarray:
    m += (gg - m) * F32(1 - beta1)
    v *= F32(beta2)
    v += F32(1 - beta2) * gg * gg
    bc1 = 1 - beta1 ** step
    bc2 = 1 - beta2 ** step
    denom = np.sqrt(v) / F32(np.sqrt(bc2)) + F32(eps)
    return F32(lr / bc1) * m / denom


def rmsprop_step(gg: np.ndarray, sq: np.ndarray, lr: float, alpha: float, eps: float) -> np.ndarray:
    sq *= F32(alpha)
    sq += F32(1 - alpha) * gg * gg
    return F32(lr) * gg / (np.sqrt(sq) + F32(eps))


def sgd_update(w: np.ndarray, g: np.ndarray, lr: float, scale: float = 1.0, weight_decay: float = 0.0,
               n: int | None = None) -> None:
    s = _slice(n)
    w[s] -= sgd_step(prepare_grad(g, scale, weight_decay, w[s]), lr)


def momentum_update(w: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: float, momentum: float, scale: float = 1.0,
                    weight_decay: float = 0.0, n: int | None = None) -> None:
    """torch.optim.SGD(momentum, dampening=0, nesterov=False): buf = μ·buf + g (buf starts at 0, so the first
    step's buf = g as PyTorch's clone); w −= lr·buf."""
    s = _slice(n)
    w[s] -= momentum_step(prepare_grad(g, scale, weight_decay, w[s]), buf, lr, momentum)


def adam_update(w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float, beta1: float,
                beta2: float, eps: float, scale: float = 1.0, weight_decay: float = 0.0, n: int | None = None) -> None:
    """torch.optim.Adam: m, v lerps; w −= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps); `step` counts from 1."""
    s = _slice(n)
    w[s] -= adam_step(prepare_grad(g, scale, weight_decay, w[s]), m, v, step, lr, beta1, beta2, eps)


def rmsprop_update(w: np.ndarray, g: np.ndarray, sq: np.ndarray, lr: float, alpha: float, eps: float,
                   scale: float = 1.0, weight_decay: float = 0.0, n: int | None = None) -> None:
    """torch.optim.RMSprop(centered=False, momentum=0): sq = α·sq + (1−α)·g²; w −= lr · g / (sqrt(sq) + eps)."""
    s = _slice(n)
    w[s] -= rmsprop_step(prepare_grad(g, scale, weight_decay, w[s]), sq, lr, alpha, eps)
