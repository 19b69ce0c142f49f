"""Helium fp32-vector forward conv2d for fp16-mixed (kernels_c/tt_fvec_conv.c, `target.kernels: mve`): the three
float forward kernels that read an fp16 x or write an fp16 y (tt_conv2d_hx_f32_split, tt_conv2d_hx_hy_split and the
fp32-x tt_conv2d_f32_split_hy), built with and without Helium for the Cortex-M55 and run in QEMU on random shapes
(1x1 / 3x3 / 1x3 / 5x5, stride 1 and 2, dilation, padding, channel counts that are not multiples of 4, trained slices
n < in_c, batches, bias or none, clamps) with fp16 x holding subnormals, +-0, large values and Inf, and weights at
the 2^-79 bound. The Helium build's bytes must be the portable build's, which numpy's float32 loop in the kernels'
order gives too; the vector path must have run where the operands allow it and declined where they do not; and the
vector loop run without its operand check gives different bits on those operands (the check is needed)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")

HX_F32, HX_HY, FX_HY = 0, 1, 2     # the kernel a case runs: x fp16 / y fp32, x and y fp16, x fp32 / y fp16
KERNELS = ["ops/tt_conv2d.c", "tt_fvec_conv.c", "tt_f16.c"]

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_kernels.h"
#include "tt_platform.h"

static uint32_t buf32[60 * 1024], out32[12 * 1024], rep32[4 * 1024];
#define buf ((uint8_t *)buf32)

#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#define HELIUM 1
#include "tt_fvec_conv.h"
static uint32_t raw32[14 * 1024], tmp32[4 * 1024];
/* raw.c: the vector loop without its operand check */
void tt_raw_hx(const tt_conv_dims *d, float lo, float hi, const uint16_t *x, const float *w, const float *ws, int32_t n,
               const float *bias, float *yf, uint16_t *yh);
void tt_raw_fx_hy(const tt_conv_dims *d, float lo, float hi, const float *x, const float *w, const float *ws, int32_t n,
                  const float *bias, uint16_t *y);
#endif

static int32_t rd32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static uint32_t pad4(uint32_t n) { return (n + 3u) & ~3u; }

int tt_main(void) {
    long size = tt_read_file("cases.bin", buf, sizeof buf32);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf);
    uint32_t k = 0;
#ifdef HELIUM
    uint32_t r = 0;
#endif
    const uint8_t *p = buf + 4;
    for (int32_t c = 0; c < cases; ++c) {
        tt_conv_dims d;
        const int32_t kind = rd32(p), n = rd32(p + 68), has_bias = rd32(p + 72);
        float lo, hi;
        memcpy(&d, p + 4, sizeof d);
        memcpy(&lo, p + 76, 4);
        memcpy(&hi, p + 80, 4);
        p += 84;
        const uint32_t xn = (uint32_t)(d.batches * d.in_h * d.in_w * d.in_c), rows = (uint32_t)(d.out_c * d.k_h * d.k_w);
        const uint32_t yn = (uint32_t)(d.batches * d.out_h * d.out_w * d.out_c);
        const void *x = p;
        p += pad4(xn * (kind == 2 ? 4u : 2u));
        const float *w = (const float *)(const void *)p, *ws = w;
        p += rows * (uint32_t)d.in_c * 4u;
        if (n > 0) { ws = (const float *)(const void *)p; p += rows * (uint32_t)n * 4u; }
        const float *bias = has_bias ? (const float *)(const void *)p : 0;
        p += has_bias ? (uint32_t)d.out_c * 4u : 0u;
        const uint32_t yb = pad4(yn * (kind == 0 ? 4u : 2u));
        uint8_t *y = (uint8_t *)out32 + k;
        if (kind == 0) tt_conv2d_hx_f32_split(&d, lo, hi, x, w, ws, n, bias, (float *)(void *)y);
        else if (kind == 1) tt_conv2d_hx_hy_split(&d, lo, hi, x, w, ws, n, bias, (uint16_t *)(void *)y);
        else tt_conv2d_f32_split_hy(&d, lo, hi, x, w, ws, n, bias, (uint16_t *)(void *)y);
        k += yb;
        /* a row stream's form (_rep): the weight check at the first call, its answer kept for the second; both
         * write what the plain kernel wrote */
        int32_t ok = -1;
        for (int32_t t = 0; t < 2; ++t) {
            memset(rep32, 0xA5, yb);
            if (kind == 0) tt_conv2d_hx_f32_split_rep(&d, lo, hi, x, w, ws, n, bias, &ok, (float *)(void *)rep32);
            else if (kind == 1)
                tt_conv2d_hx_hy_split_rep(&d, lo, hi, x, w, ws, n, bias, &ok, (uint16_t *)(void *)rep32);
            else tt_conv2d_f32_split_hy_rep(&d, lo, hi, x, w, ws, n, bias, &ok, (uint16_t *)(void *)rep32);
            if (memcmp(rep32, y, yn * (kind == 0 ? 4u : 2u)) != 0) tt_fail("a _rep kernel wrote other bytes");
        }
#ifdef HELIUM
        int32_t ran;
        uint8_t *yr = (uint8_t *)raw32 + r + 4;
        if (kind == 0) ran = tt_fvec_conv2d_hx(&d, lo, hi, x, w, ws, n, bias, (float *)(void *)tmp32, 0);
        else if (kind == 1) ran = tt_fvec_conv2d_hx(&d, lo, hi, x, w, ws, n, bias, 0, (uint16_t *)(void *)tmp32);
        else ran = tt_fvec_conv2d_fx_hy(&d, lo, hi, x, w, ws, n, bias, (uint16_t *)(void *)tmp32);
        if (kind == 0) tt_raw_hx(&d, lo, hi, x, w, ws, n, bias, (float *)(void *)yr, 0);
        else if (kind == 1) tt_raw_hx(&d, lo, hi, x, w, ws, n, bias, 0, (uint16_t *)(void *)yr);
        else tt_raw_fx_hy(&d, lo, hi, x, w, ws, n, bias, (uint16_t *)(void *)yr);
        memcpy((uint8_t *)raw32 + r, &ran, 4);
        r += 4u + yb;
#endif
    }
#ifdef HELIUM
    if (tt_write_file("raw.bin", raw32, r) != 0) return 1;
#endif
    return tt_write_file("out.bin", out32, k) == 0 ? 0 : 1;
}
"""

# tt_fc_run unguarded: tt_fvec_conv.c compiled again inside this unit (its functions are static), its public
# functions renamed so that they do not clash with the library's.
RAW = r"""
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#define tt_fvec_conv2d_hx tt_raw_checked_hx
#define tt_fvec_conv2d_fx_hy tt_raw_checked_fx_hy
#define tt_fvec_conv2d_wcheck tt_raw_wcheck
#define tt_fvec_conv2d_hx_ew tt_raw_hx_ew
#define tt_fvec_conv2d_fx_hy_ew tt_raw_fx_hy_ew
#include "tt_fvec_conv.c"
void tt_raw_hx(const tt_conv_dims *d, float lo, float hi, const uint16_t *x, const float *w, const float *ws, int32_t n,
               const float *bias, float *yf, uint16_t *yh);
void tt_raw_fx_hy(const tt_conv_dims *d, float lo, float hi, const float *x, const float *w, const float *ws, int32_t n,
                  const float *bias, uint16_t *y);
void tt_raw_hx(const tt_conv_dims *d, float lo, float hi, const uint16_t *x, const float *w, const float *ws, int32_t n,
               const float *bias, float *yf, uint16_t *yh)
{
    tt_fc_run(d, lo, hi, x, 0, w, ws, n, bias, yf, yh);
}
void tt_raw_fx_hy(const tt_conv_dims *d, float lo, float hi, const float *x, const float *w, const float *ws, int32_t n,
                  const float *bias, uint16_t *y)
{
    tt_fc_run(d, lo, hi, 0, x, w, ws, n, bias, 0, y);
}
#else
typedef int tt_raw_unused;
#endif
"""

BOUND = np.float32(2.0 ** -79)   # the smallest weight magnitude the fp16-x kernels take (biased exponent 48)


class Case:
    def __init__(self, kind, dims, x, w, ws, n, bias, lo, hi, ran, differs=False):
        self.kind, self.dims, self.x, self.w, self.ws, self.n = kind, dims, x, w, ws, n
        self.bias, self.lo, self.hi, self.ran, self.differs = bias, np.float32(lo), np.float32(hi), ran, differs

    def blob(self) -> bytes:
        d = self.dims
        head = struct.pack("<i16i2i2f", self.kind, d["b"], d["ih"], d["iw"], d["ic"], d["oh"], d["ow"], d["oc"],
                           d["kh"], d["kw"], d["sh"], d["sw"], d["dh"], d["dw"], d["pt"], d["pl"], 1, self.n,
                           int(self.bias is not None), self.lo, self.hi)
        xb = self.x.tobytes()
        parts = [head, xb + bytes(-len(xb) % 4), self.w.tobytes()]
        if self.n > 0:
            parts.append(self.ws.tobytes())
        if self.bias is not None:
            parts.append(self.bias.tobytes())
        return b"".join(parts)

    def y_bytes(self) -> int:
        d = self.dims
        nbytes = d["b"] * d["oh"] * d["ow"] * d["oc"] * (4 if self.kind == HX_F32 else 2)
        return nbytes + (-nbytes % 4)

    def numpy(self) -> np.ndarray:
        """The portable kernels' float32 loop: acc = 0, += x * w per in-image tap (filter y, filter x, the slice's
        channels [0, n) then [n, in_c)), one rounding per product and per sum, + bias, the clamp, the store."""
        d = self.dims
        x = self.x.astype(np.float32)
        acc = np.zeros((d["b"], d["oh"], d["ow"], d["oc"]), np.float32)
        oy, ox = np.arange(d["oh"]), np.arange(d["ow"])
        with np.errstate(all="ignore"):
            for ky in range(d["kh"]):
                iy = oy * d["sh"] - d["pt"] + ky * d["dh"]
                for kx in range(d["kw"]):
                    ix = ox * d["sw"] - d["pl"] + kx * d["dw"]
                    valid = ((iy >= 0) & (iy < d["ih"]))[:, None] & ((ix >= 0) & (ix < d["iw"]))[None, :]
                    xs = x[:, np.clip(iy, 0, d["ih"] - 1)][:, :, np.clip(ix, 0, d["iw"] - 1)]
                    for ic in range(d["ic"]):
                        wv = self.ws[:, ky, kx, ic] if ic < self.n else self.w[:, ky, kx, ic]
                        acc = np.where(valid[None, :, :, None], acc + xs[..., ic:ic + 1] * wv, acc)
            if self.bias is not None:
                acc = acc + self.bias
            acc = np.where(acc < self.lo, self.lo, acc)
            acc = np.where(acc > self.hi, self.hi, acc)
            return acc if self.kind == HX_F32 else acc.astype(np.float16)


def _dims(rng, k, stride, dil, pad, ic, oc, big=False):
    kh, kw = k
    b = int(rng.integers(1, 3))
    ih, iw = (int(rng.integers(3, 8)), int(rng.integers(5, 14))) if big else \
        (int(rng.integers(1, 7)), int(rng.integers(1, 10)))
    ih, iw = max(ih, (kh - 1) * dil + 1 - 2 * pad), max(iw, (kw - 1) * dil + 1 - 2 * pad)
    pt, pl = (int(rng.integers(0, pad + 1)), int(rng.integers(0, pad + 1))) if pad else (0, 0)
    oh = (ih + pt + int(rng.integers(0, pt + 1)) - dil * (kh - 1) - 1) // stride + 1
    ow = (iw + pl + int(rng.integers(0, pl + 1)) - dil * (kw - 1) - 1) // stride + 1
    return dict(b=b, ih=ih, iw=iw, ic=ic, oh=max(oh, 1), ow=max(ow, 1), oc=oc, kh=kh, kw=kw, sh=stride, sw=stride,
                dh=dil, dw=dil, pt=pt, pl=pl)


def _f16x(rng, shape, inf=False):
    """fp16 x: normal values of mixed magnitude, subnormals, +-0, large values (and +-Inf)."""
    v = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 4, shape))).astype(np.float16)
    u = rng.random(shape)
    sub = (rng.integers(1, 1024, shape) | (rng.integers(0, 2, shape) << 15)).astype(np.uint16).view(np.float16)
    v = np.where(u < 0.1, sub, v)
    v = np.where((u >= 0.1) & (u < 0.15), np.where(u < 0.125, np.float16(0.0), np.float16(-0.0)), v)
    v = np.where((u >= 0.15) & (u < 0.2), (rng.uniform(1000, 65504, shape) * rng.choice([-1, 1], shape)), v)
    if inf:
        v = np.where((u >= 0.2) & (u < 0.23), np.float16(np.inf) * rng.choice([-1, 1], shape), v)
    return v.astype(np.float16)


def _weights(rng, shape, floor=BOUND):
    """fp32 weights: normal, +-0, and magnitudes at and just above `floor`."""
    w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
    u = rng.random(shape)
    w = np.where(u < 0.05, np.float32(0.0), w)
    w = np.where((u >= 0.05) & (u < 0.08), np.float32(-0.0), w)
    w = np.where((u >= 0.08) & (u < 0.11), floor * rng.choice([-1, 1], shape) * rng.choice([1.0, 1.5, 1.9], shape), w)
    return w.astype(np.float32)


def _cases(seed: int = 13) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    shapes = [((1, 1), 1, 1, 0, True), ((1, 1), 2, 1, 0, True), ((3, 3), 1, 1, 1, False), ((3, 3), 2, 1, 1, False),
              ((1, 3), 1, 1, 1, False), ((3, 3), 1, 2, 2, False), ((5, 5), 2, 1, 2, False), ((3, 3), 2, 1, 0, True)]
    bounds = [(0.0, 6.0), (-np.inf, np.inf), (-1.0, 1.0), (0.0, np.inf)]
    for i in range(24):
        kind = (HX_F32, HX_HY, FX_HY)[i % 3]
        k, stride, dil, pad, big = shapes[i % len(shapes)]
        ic, oc = int(rng.integers(1, 20)), int(rng.integers(1, 22))
        if i % 4 == 0:
            ic, oc = int(rng.integers(8, 20)), 16 + int(rng.integers(0, 3))   # full blocks and a tail
        d = _dims(rng, k, stride, dil, pad, ic, oc, big)
        n = int(rng.integers(1, ic)) if ic > 1 and i % 2 else 0
        wshape = (oc, k[0], k[1], ic)
        if kind == FX_HY:   # fp32 x (the stem's input): exponents >= 2^-60 with weights >= 2^-20: 67 + 107 >= 174
            x = (rng.standard_normal((d["b"], d["ih"], d["iw"], ic)) * 0.7).astype(np.float32)
            x = np.where(rng.random(x.shape) < 0.1, np.float32(2.0 ** -60) * rng.choice([-1, 1], x.shape), x)
            x = np.where(rng.random(x.shape) < 0.05, np.float32(0.0), x).astype(np.float32)
            w, ws = _weights(rng, wshape, np.float32(2.0 ** -20)), _weights(rng, (oc, k[0], k[1], n), np.float32(2.0 ** -20))
        else:
            x = _f16x(rng, (d["b"], d["ih"], d["iw"], ic), inf=i % 5 == 2)
            w, ws = _weights(rng, wshape), _weights(rng, (oc, k[0], k[1], n))
        bias = None if i % 3 == 1 else (rng.standard_normal(oc) * 0.5).astype(np.float32)
        if bias is not None and i % 2:
            bias[0], bias[-1] = np.float32(2.0 ** -103), np.float32(-0.0)   # the bias bound (exponent 24), -0
        lo, hi = bounds[i % len(bounds)]
        cases.append(Case(kind, d, x, w, ws, n, bias, lo, hi, ran=1))
    for kind, stride in ((HX_HY, 1), (HX_F32, 2)):   # 1x1 blocks of four pixels and channels with a trained slice
        d = dict(b=1, ih=4, iw=9, ic=13, oh=4 // stride, ow=(9 + stride - 1) // stride, oc=12, kh=1, kw=1, sh=stride,
                 sw=stride, dh=1, dw=1, pt=0, pl=0)
        bias = (rng.standard_normal(12) * 0.5).astype(np.float32)
        cases.append(Case(kind, d, _f16x(rng, (1, 4, 9, 13)), _weights(rng, (12, 1, 1, 13)),
                          _weights(rng, (12, 1, 1, 5)), 5, bias, 0.0, 6.0, ran=1))
    # with a trained slice the whole weight's first n columns are never read: a subnormal or an Inf there (the
    # pretrained frozen copy) must not turn Helium off
    d = dict(b=1, ih=4, iw=9, ic=13, oh=4, ow=9, oc=12, kh=1, kw=1, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0)
    w_unread = _weights(rng, (12, 1, 1, 13))
    w_unread[0, 0, 0, 0], w_unread[5, 0, 0, 4] = np.float32(1e-40), np.float32(np.inf)
    cases.append(Case(HX_HY, d, _f16x(rng, (1, 4, 9, 13)), w_unread, _weights(rng, (12, 1, 1, 5)), 5, None, 0.0, 6.0,
                      ran=1))
    cases += _declined(rng)
    return cases


def _declined(rng) -> list[Case]:
    """Operands outside the condition: the vector path must decline (and the portable loop give the bits)."""
    out = []
    d = dict(b=1, ih=3, iw=6, ic=5, oh=3, ow=6, oc=6, kh=1, kw=1, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0)
    w = _weights(rng, (6, 1, 1, 5))
    x = np.full((1, 3, 6, 5), 1.0, np.float16)
    # x zero but for one channel, so that each sum is one product: a tiny normal weight whose products with a small x
    # are fp32 subnormals (flushed on Helium), y fp32
    x1 = np.zeros((1, 3, 6, 5), np.float16)
    x1[..., 1] = np.float16(2.0 ** -20)
    w1 = w.copy()
    w1[:, 0, 0, 1] = np.float32(1e-33)
    out.append(Case(HX_F32, d, x1, w1, w1, 0, None, -np.inf, np.inf, ran=0, differs=True))
    # a subnormal weight (flushed as an operand) times a large x, y fp32; and in the trained slice only
    w2 = w.copy()
    w2[:, 0, 0, 0] = np.float32(1e-40)
    x2 = np.zeros((1, 3, 6, 5), np.float16)
    x2[..., 0] = np.float16(30000.0)
    out.append(Case(HX_F32, d, x2, w2, w2, 0, None, -np.inf, np.inf, ran=0, differs=True))
    ws = _weights(rng, (6, 1, 1, 2))
    ws[:, 0, 0, 0] = np.float32(-1e-40)
    out.append(Case(HX_F32, d, x2, w, ws, 2, None, -np.inf, np.inf, ran=0, differs=True))
    # y fp16 hides a subnormal difference, but not Inf x a flushed weight: Inf (clamped to 6) on the FPU, NaN
    # (Inf x 0) on Helium
    x3 = x.copy()
    x3[..., 0] = np.float16(np.inf)
    out.append(Case(HX_HY, d, x3, w2, w2, 0, None, 0.0, 6.0, ran=0, differs=True))
    # just below the bound, a non-finite weight, a bias of exponent 23, a subnormal clamp bound
    w4 = w.copy()
    w4[0, 0, 0, 0] = np.float32(2.0 ** -79) * np.float32(0.75)
    out.append(Case(HX_HY, d, x, w4, w4, 0, None, 0.0, 6.0, ran=0))
    w5 = w.copy()
    w5[2, 0, 0, 3] = np.float32(np.inf)
    out.append(Case(HX_F32, d, x, w5, w5, 0, None, -np.inf, np.inf, ran=0))
    b6 = (rng.standard_normal(6) * 0.5).astype(np.float32)
    b6[3] = np.float32(2.0 ** -104)
    out.append(Case(HX_HY, d, x, w, w, 0, b6, 0.0, 6.0, ran=0))
    out.append(Case(HX_F32, d, x, w, w, 0, None, np.float32(1e-40), np.inf, ran=0))
    # fp32 x: a subnormal x times a huge weight is an fp16 normal on the FPU, 0 on Helium
    xf = (rng.standard_normal((1, 3, 6, 5)) * 0.5).astype(np.float32)
    xf[0, 1, 2, :] = 0.0
    xf[0, 1, 2, 0] = np.float32(1e-40)
    wf = _weights(rng, (6, 1, 1, 5), np.float32(0.01))
    wf[:, 0, 0, 0] = np.float32(2.0 ** 120)
    out.append(Case(FX_HY, d, xf, wf, wf, 0, None, -np.inf, np.inf, ran=0, differs=True))
    # fp32 x: exponents 67 (x 2^-60) + 106 (w 2^-21) = 173 < 174 declines, 67 + 107 runs
    xb = np.full((1, 3, 6, 5), 0.5, np.float32)
    xb[0, 0, 0, 0] = np.float32(2.0 ** -60)
    for e, ran in ((-21, 0), (-20, 1)):
        wb = _weights(rng, (6, 1, 1, 5), np.float32(0.01))
        wb[0, 0, 0, 0] = np.float32(2.0 ** e)
        out.append(Case(FX_HY, d, xb, wb, wb, 0, None, -np.inf, np.inf, ran=ran))
    # fp32 x with an Inf
    xi = xb.copy()
    xi[0, 2, 5, 4] = np.float32(-np.inf)
    wi = _weights(rng, (6, 1, 1, 5), np.float32(0.01))
    out.append(Case(FX_HY, d, xi, wi, wi, 0, None, -np.inf, np.inf, ran=0))
    return out


def _blob(cases) -> bytes:
    blob = struct.pack("<i", len(cases)) + b"".join(c.blob() for c in cases)
    assert len(blob) <= 60 * 1024 * 4
    return blob


def _split(data: bytes, cases, flags: bool):
    out, at = [], 0
    for c in cases:
        f = None
        if flags:
            f = struct.unpack_from("<i", data, at)[0]
            at += 4
        n = c.y_bytes()
        out.append((f, data[at:at + n]))
        at += n
    assert at == len(data)
    return out


def _same(got: bytes, want: np.ndarray) -> bool:
    """Byte-equal to numpy's result, NaN lanes equal to NaN lanes (numpy's NaN bits are the host's)."""
    bits = np.uint32 if want.dtype == np.float32 else np.uint16
    g = np.frombuffer(got[:want.nbytes], want.dtype).reshape(want.shape)
    return bool(np.all((g.view(bits) == want.view(bits)) | (np.isnan(g) & np.isnan(want))))


def _run(tmp: Path, defines: dict[str, str], blob: bytes) -> dict[str, bytes]:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    tag = "mve" if defines else "portable"
    prog = tmp / f"prog-{tag}"
    prog.mkdir()
    (prog / "conv.c").write_text(PROG)
    (prog / "raw.c").write_text(RAW)
    b = get_board(BOARD)
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=KERNELS, defines=defines)
    files = run_firmware(b, built.elf, tmp / f"run-{tag}", {"cases.bin": blob}, timeout_s=120).files
    return {**files, "elf": built.elf}


def _float_vector_ops(elf: Path) -> dict[str, set[str]]:
    """Function -> the floating-point vector instructions (Q-register operands) in it."""
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(elf)], capture_output=True,
                         text=True, check=True).stdout
    out: dict[str, set[str]] = {}
    for part in re.split(r"\n(?=[0-9a-f]+ <)", dis):
        m = re.match(r"[0-9a-f]+ <(\w+)>:", part)
        ops = set(re.findall(r"\t(v\w+)\.[fF](?:16|32)[.\w]*\s+q\d", part))
        if m and ops:
            out[m.group(1)] = ops
    return out


@needs_arm
def test_helium_forward_conv_equals_the_portable_kernels_in_qemu(tmp_path):
    cases = _cases()
    blob = _blob(cases)
    mve = _run(tmp_path, {"TT_USE_MVE": "1"}, blob)
    port = _run(tmp_path, {}, blob)
    assert "raw.bin" not in port
    assert mve["out.bin"] == port["out.bin"]                      # Helium against the portable kernels, byte for byte
    for c, (_, y) in zip(cases, _split(port["out.bin"], cases, False)):
        assert _same(y, c.numpy()), c.dims                         # and both against numpy's float32 loop
    raw = _split(mve["raw.bin"], cases, True)
    for c, (ran, y), (_, yp) in zip(cases, raw, _split(port["out.bin"], cases, False)):
        assert ran == c.ran, (c.kind, c.dims)                      # the vector path ran exactly where it may
        if c.ran:
            assert y == yp                                         # (the unguarded loop is the same loop)
        elif c.differs:
            assert y != yp, (c.kind, c.dims)                       # without the check these bits would change
    assert sum(c.ran for c in cases) >= 20 and sum(c.differs for c in cases) >= 5
    # float vector instructions only in the hand-written units, and there one VMUL and one VADD per product, never a
    # fused VFMA (the portable C rounds twice); the portable build has none
    ops = _float_vector_ops(mve["elf"])
    assert ops and all(f.startswith(("tt_fc_", "tt_fvec_", "tt_raw_")) for f in ops), ops
    allowed = {"vmul", "vadd", "vcmp", "vcvtb"}
    assert set().union(*ops.values()) <= allowed | {a + p for a in allowed for p in "te"}, ops  # (t/e: predicated)
    assert {"vmul", "vadd"} <= set().union(*ops.values())
    assert not _float_vector_ops(port["elf"])
