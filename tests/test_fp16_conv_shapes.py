"""The fp16 conv2d forward (tt_conv2d_hx_*_split: four output channels per widened input) and the depthwise fp16
kernels (forward, input gradient, in place) against their fp32 kernels fed the widened inputs, the result rounded by
numpy (what they are defined as), bit for bit, on random geometries: kernel 1 / 3 / 5 / 9, stride 1 / 2, dilation,
padding, output channel counts that are not multiples of 4, a trained channel slice n of 0, some or all channels,
depth multipliers, and inputs with fp16 subnormals, zeros of both signs and large values."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from kernel_lib import host_kernel_lib  # noqa: E402 (tests/ is on sys.path)

KDIR = Path(__file__).resolve().parents[1] / "kernels_c"


def _lib(tmp: Path):
    out = tmp / "libconvh.so"
    return host_kernel_lib(out, ["ops/tt_conv2d.c", "ops/tt_depthwise_conv2d.c", "tt_common.c"])


def _p(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _geom(rng):
    k = int(rng.choice([1, 3, 3, 5, 9]))                  # 9: wider than the depthwise gradient's tap lists
    s, dil = int(rng.integers(1, 3)), int(rng.choice([1, 1, 2]))
    h, w = int(rng.integers(k, k + 6)), int(rng.integers(k, k + 6))
    pad = int(rng.integers(0, k // 2 + 1)) * dil           # up to 'same' padding: border outputs see few taps
    oh = (h + 2 * pad - dil * (k - 1) - 1) // s + 1
    ow = (w + 2 * pad - dil * (k - 1) - 1) // s + 1
    return k, s, dil, h, w, pad, max(oh, 1), max(ow, 1)


def _x16(rng, shape):
    x = (rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 300.0], size=shape)).astype(np.float16)
    x.flat[rng.integers(0, x.size, size=max(1, x.size // 10))] = np.float16(-0.0)
    return x


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_fp16_conv_and_depthwise_kernels_equal_the_fp32_ones_rounded(tmp_path):
    lib = _lib(tmp_path)
    f = ctypes.c_float
    rng = np.random.default_rng(13)
    for case in range(60):
        k, s, dil, h, w, pad, oh, ow = _geom(rng)
        b = int(rng.integers(1, 3))
        ci, co = int(rng.integers(1, 12)), int(rng.integers(1, 14))
        n = int(rng.choice([0, ci, int(rng.integers(0, ci + 1))]))
        lo, hi = (0.0, 6.0) if case % 3 == 0 else (-np.inf, np.inf)
        dims = (ctypes.c_int32 * 16)(b, h, w, ci, oh, ow, co, k, k, s, s, dil, dil, pad, pad, 1)
        x = _x16(rng, (b, h, w, ci))
        wt = rng.standard_normal((co, k, k, ci)).astype(np.float32)
        ws = np.ascontiguousarray(wt[..., :n])              # the trained slice, its own array
        wfull = wt.copy()
        wfull[..., :n] = 1e30                               # channels [0, n) must come from the slice
        bias = rng.standard_normal(co).astype(np.float32)
        want = np.zeros((b, oh, ow, co), np.float32)
        lib.tt_conv2d_f32_split(dims, f(lo), f(hi), _p(x.astype(np.float32)), _p(wfull), _p(ws), n, _p(bias),
                                _p(want))
        got = np.zeros_like(want)
        lib.tt_conv2d_hx_f32_split(dims, f(lo), f(hi), _p(x), _p(wfull), _p(ws), n, _p(bias), _p(got))
        assert got.tobytes() == want.tobytes(), case
        gh = np.zeros(want.shape, np.float16)
        lib.tt_conv2d_hx_hy_split(dims, f(lo), f(hi), _p(x), _p(wfull), _p(ws), n, _p(bias), _p(gh))
        assert gh.tobytes() == want.astype(np.float16).tobytes(), case

        # depthwise: the forward and the input gradient, out of place and in place (multiplier 1, same size)
        m = int(rng.choice([1, 1, 2]))
        dco = ci * m
        dd = (ctypes.c_int32 * 16)(b, h, w, ci, oh, ow, dco, k, k, s, s, dil, dil, pad, pad, m)
        dwt = rng.standard_normal((1, k, k, dco)).astype(np.float32)
        dbias = rng.standard_normal(dco).astype(np.float32)
        want = np.zeros((b, oh, ow, dco), np.float32)
        lib.tt_depthwise_conv2d_f32(dd, f(lo), f(hi), _p(x.astype(np.float32)), _p(dwt), _p(dbias), _p(want))
        gh = np.zeros(want.shape, np.float16)
        lib.tt_depthwise_conv2d_hx_hy(dd, f(lo), f(hi), _p(x), _p(dwt), _p(dbias), _p(gh))
        assert gh.tobytes() == want.astype(np.float16).tobytes(), case
        dy = _x16(rng, (b, oh, ow, dco))
        want = np.zeros((b, h, w, ci), np.float32)
        lib.tt_depthwise_conv2d_grad_input_f32(dd, _p(dy.astype(np.float32)), _p(dwt), _p(want))
        gh = np.zeros(want.shape, np.float16)
        lib.tt_depthwise_conv2d_grad_input_hdy_hdx(dd, _p(dy), _p(dwt), _p(gh))
        assert gh.tobytes() == want.astype(np.float16).tobytes(), case
        if m == 1:
            both = np.zeros(max(dy.size, gh.size), np.float16)
            both[:dy.size] = dy.ravel()
            scr = np.zeros(max(h * w, oh * ow), np.float16)
            lib.tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(dd, _p(both), _p(dwt), _p(scr))
            assert both[:gh.size].tobytes() == gh.tobytes(), case
            both = np.zeros(max(x.size, oh * ow * dco * b), np.float16)
            both[:x.size] = x.ravel()
            fw = np.zeros((b, oh, ow, dco), np.float16)
            lib.tt_depthwise_conv2d_hx_hy(dd, f(lo), f(hi), _p(x), _p(dwt), _p(dbias), _p(fw))
            lib.tt_depthwise_conv2d_hx_hy_inplace(dd, f(lo), f(hi), _p(both), _p(dwt), _p(dbias), _p(scr))
            assert both[:fw.size].tobytes() == fw.tobytes(), case
