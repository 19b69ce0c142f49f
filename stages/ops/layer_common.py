"""What the numpy kernels of the sliding-window and weighted ops share (conv_kernels.py, fully_connected.py,
pooling.py): the output geometry and padded taps of a window, and the per-channel requantization of a layer."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Tensor
from tinytrain.stages.golden.kernel_common import qparams


# ---- sliding windows (ctx: executor._Ctx)

def spatial(ctx, x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1):
    """(out_h, out_w, pad_top, pad_left) of a window over x [N, H, W, C] with the op's padding."""
    h, w = x.shape[1], x.shape[2]
    oh, pt = out_size_and_pad(ctx.attrs["padding"], h, kh, sh, dh)
    ow, pl = out_size_and_pad(ctx.attrs["padding"], w, kw, sw, dw)
    return oh, ow, pt, pl


def padded(x: np.ndarray, oh: int, ow: int, pt: int, pl: int, kh: int, kw: int, sh: int, sw: int,
           dh: int, dw: int, value) -> tuple[np.ndarray, np.ndarray]:
    """x padded so that every tap of every output position is in range, and a matching validity mask [H', W']."""
    h, w = x.shape[1], x.shape[2]
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    pb, pr = max(need_h - h - pt, 0), max(need_w - w - pl, 0)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=value)
    mask = np.pad(np.ones((h, w), dtype=bool), ((pt, pb), (pl, pr)), constant_values=False)
    return xp, mask


def tap(a: np.ndarray, ky: int, kx: int, oh: int, ow: int, sh: int, sw: int, dh: int, dw: int) -> np.ndarray:
    """The input (or mask) element under window tap (ky, kx) for every output position."""
    y0, x0 = ky * dh, kx * dw
    if a.ndim == 2:
        return a[y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw]
    return a[:, y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]


def conv_geometry(ctx, x: np.ndarray, kh: int, kw: int):
    """(oh, ow, pt, pl, sh, sw, dh, dw) of a convolution from its attrs."""
    a = ctx.attrs
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
    oh, ow, pt, pl = spatial(ctx, x, kh, kw, sh, sw, dh, dw)
    return oh, ow, pt, pl, sh, sw, dh, dw


# ---- int8 layers

def channel_multipliers(x_t: Tensor, w_t: Tensor, y_t: Tensor, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-output-channel (multiplier, shift) of s_in * s_w[c] / s_out (int8_arith.channel_multipliers)."""
    s_in, _ = qparams(x_t)
    s_out, _ = qparams(y_t)
    if w_t.quant is None:
        raise ValueError(f"int8 weights {w_t.name!r} have no quantization parameters")
    scales = list(w_t.quant.scale)
    if len(scales) not in (1, channels):
        raise ValueError(f"weights {w_t.name!r} have {len(scales)} scales for {channels} output channels")
    return ia.channel_multipliers(s_in, scales, s_out, channels)


def weight_zp(w_t: Tensor, channels: int) -> np.ndarray:
    """The weights' zero point per output channel (0 without quantization parameters)."""
    zps = list(w_t.quant.zero_point) if w_t.quant else [0]
    if len(zps) == 1:
        zps = zps * channels
    return np.array(zps, dtype=np.int64)
