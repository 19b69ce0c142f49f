"""The hidden-channel stream's per-channel kernels against numpy, bit for bit, on the host under ASan + UBSan.

- tt_hs_mask_grad_f32 (channel c of a 1-bit mask; with its bias sum: tt_hs_mask_bias_grad_f32) and tt_hs_pw_grad_in_acc_f32 (channel c's share of the 1x1 input
  gradient, zero gradients skipped): numpy's float32 select and multiply-add.
- tt_hs_pw_grad_in_mask_f32 (the stream's start and first mask in one, the masked pixels not computed): numpy's
  float32 sums.
- tt_conv2d_grad_weight_qx_f32_range (1x1, one output row) and the stream's float-copy pair tt_hs_dequant_rows +
  tt_hs_pw_grad_w_f32: numpy's float32 sum over the pixels in order.
- tt_depthwise_conv2d_grad_input_channel_f32 (its own paths for SAME 3x3 stride 1 and any 3x3 stride 2, and the
  general walk): the golden model's depthwise_conv2d_grad_input (stages/golden/grad_ops.py adds dy * w tap after tap
  in (filter y, filter x) order onto zeros, in float32: the C kernel's sum, term for term), channel by channel, for
  float taps and int8 taps (dequantized as tt_dq does), pixel strides, the `add` form (out + s).

The C side reads the cases numpy wrote and writes what the kernel returned; the expected bits come from numpy only.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.model.geometry import out_size_and_pad

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
FLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O1", "-g",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
F32 = np.float32

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "tt_kernels.h"
#include "tt_hidden_stream.h"
static int32_t rd_i(FILE *f) { int32_t v; if (fread(&v, 4, 1, f) != 1) exit(3); return v; }
static void *rd(FILE *f, size_t n) { void *p = malloc(n ? n : 1); if (n && fread(p, 1, n, f) != n) exit(3); return p; }
int main(int argc, char **argv)
{
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    int32_t n, i;
    if (argc != 3 || !in || !out) return 2;
    n = rd_i(in);
    for (i = 0; i < n; ++i) {
        tt_conv_dims d;
        int32_t *dd = (int32_t *)&d, j, c, os, add, q, npx, z, kind = rd_i(in);
        float sc, *dy, *w, *dx;
        int8_t *wq;
        if (kind == 1) { /* mask: P, C, c, mask bytes, dy */
            int32_t P = rd_i(in), C = rd_i(in), cc = rd_i(in);
            float db = 0.0f;
            uint8_t *m = rd(in, (size_t)((P * C + 7) / 8));
            dy = rd(in, 4u * (size_t)P);
            dx = malloc(4u * (size_t)P);
            tt_hs_mask_grad_f32(P, C, cc, m, dy, dx);
            fwrite(dx, 4, (size_t)P, out);
            tt_hs_mask_bias_grad_f32(P, C, cc, m, dy, dx, &db); /* the same plane and its sum */
            fwrite(dx, 4, (size_t)P, out);
            fwrite(&db, 4, 1, out);
            free(m); free(dy); free(dx);
            continue;
        }
        if (kind == 2) { /* 1x1 input gradient accumulated: P, IC, c, C, n, dh, wq [C, IC], part [C, n], scale, zp, dx */
            int32_t P = rd_i(in), IC = rd_i(in), cc = rd_i(in), C = rd_i(in), n = rd_i(in);
            float *dh = rd(in, 4u * (size_t)P), *scale;
            int8_t *part;
            int32_t *zp;
            wq = rd(in, (size_t)(C * IC));
            part = rd(in, (size_t)(C * n));
            scale = rd(in, 4u * (size_t)C);
            zp = rd(in, 4u * (size_t)C);
            dx = rd(in, 4u * (size_t)(P * IC));
            tt_hs_pw_grad_in_acc_f32(P, IC, cc, dh, 0, 0, wq, n ? part : 0, n, scale, zp, dx);
            fwrite(dx, 4, (size_t)(P * IC), out);
            free(dh); free(wq); free(part); free(scale); free(zp); free(dx);
            continue;
        }
        if (kind == 4) { /* 1x1 input gradient of channel c, masked, with its sum: P, K, C, c, dz, wq [K, C], scale, zp, mask */
            int32_t P = rd_i(in), K = rd_i(in), C = rd_i(in), cc = rd_i(in);
            float *dz = rd(in, 4u * (size_t)(P * K)), *scale, *dh = malloc(4u * (size_t)P), db = 0.0f;
            int32_t *zp;
            uint8_t *m;
            wq = rd(in, (size_t)(K * C));
            scale = rd(in, 4u * (size_t)K);
            zp = rd(in, 4u * (size_t)K);
            m = rd(in, (size_t)((P * C + 7) / 8));
            tt_hs_pw_grad_in_mask_f32(P, K, C, cc, dz, 0, 0, wq, 0, 0, scale, zp, m, dh, &db);
            fwrite(dh, 4, (size_t)P, out);
            fwrite(&db, 4, 1, out);
            free(dz); free(scale); free(dh); free(zp); free(m); free(wq);
            continue;
        }
        if (kind == 3) { /* 1x1 weight gradient row: P, IC, k, z, scale, dh, x [P, IC] */
            int32_t P = rd_i(in), IC = rd_i(in), k = rd_i(in), zz = rd_i(in);
            float s1, *dh, *xf, *dw;
            int8_t *x;
            const tt_conv_dims g = {1, 1, P, IC, 1, P, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1};
            if (fread(&s1, 4, 1, in) != 1) return 3;
            dh = rd(in, 4u * (size_t)P);
            x = rd(in, (size_t)(P * IC));
            xf = malloc(4u * (size_t)(P * k + 1));
            dw = malloc(4u * (size_t)(k + 1));
            tt_conv2d_grad_weight_qx_f32_range(&g, k, 0, 1, dh, x, s1, zz, dw);
            fwrite(dw, 4, (size_t)k, out);
            tt_hs_dequant_rows(P, IC, k, x, s1, zz, xf);
            tt_hs_pw_grad_w_f32(P, k, dh, xf, dw);
            fwrite(dw, 4, (size_t)k, out);
            free(dh); free(x); free(xf); free(dw);
            continue;
        }
        for (j = 0; j < 16; ++j) dd[j] = rd_i(in);
        c = rd_i(in); os = rd_i(in); add = rd_i(in); q = rd_i(in); z = rd_i(in);
        if (fread(&sc, 4, 1, in) != 1) return 3;
        npx = d.in_h * d.in_w;
        dy = rd(in, 4u * (size_t)(d.out_h * d.out_w * d.out_c));
        w = rd(in, 4u * (size_t)(d.k_h * d.k_w * d.out_c));
        wq = rd(in, (size_t)(d.k_h * d.k_w * d.out_c));
        dx = rd(in, 4u * (size_t)(npx * os));
        if (q) tt_depthwise_conv2d_grad_input_channel_f32(&d, dy + c, 0, 0, wq + c, z, sc, dx, os, add);
        else tt_depthwise_conv2d_grad_input_channel_f32(&d, dy + c, w + c, d.out_c, 0, 0, 0.0f, dx, os, add);
        fwrite(dx, 4, (size_t)(npx * os), out);
        free(dy); free(w); free(wq); free(dx);
    }
    fclose(in);
    fclose(out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    d = tmp_path_factory.mktemp("hs_kernels")
    (d / "drv.c").write_text(DRIVER)
    exe = d / "drv"
    srcs = [KDIR / "ops" / "tt_depthwise_conv2d.c", KDIR / "ops" / "tt_conv2d.c", KDIR / "tt_common.c",
            KDIR / "tt_f16.c", KDIR / "tt_hidden_stream.c"]
    cmd = [cc, *FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", *map(str, srcs), str(d / "drv.c"), "-lm",
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return exe


def _values(rng, n) -> np.ndarray:
    """Random float32 of either sign with some +0 and -0 (masked gradients), so the sums' zero signs matter."""
    v = rng.standard_normal(n).astype(F32)
    v[rng.random(n) < 0.15] = 0.0
    v[rng.random(n) < 0.05] = -0.0
    return v


def _run(driver, tmp_path, cases, blob) -> list[np.ndarray]:
    (tmp_path / "in.bin").write_bytes(np.int32(len(cases)).tobytes() + b"".join(blob))
    subprocess.run([str(driver), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    got = np.frombuffer((tmp_path / "out.bin").read_bytes(), F32)
    assert got.size == sum(w.size for w, _ in cases)
    out, at = [], 0
    for want, _ in cases:
        out.append(got[at:at + want.size])
        at += want.size
    return out


def _check(driver, tmp_path, cases, blob) -> None:
    for got, (want, info) in zip(_run(driver, tmp_path, cases, blob), cases):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=str(info))


def test_hidden_mask_matches_numpy_bits(driver, tmp_path):
    """tt_hs_mask_grad_f32: channel c of a 1-bit masked gradient (bit p * C + c, LSB first); dy kept bit for bit
    (-0, NaN) or +0. C a multiple of 8 (one bit position, no branch) and not. tt_hs_mask_bias_grad_f32: the same
    plane and its sum in pixel order (the bias gradient)."""
    rng = np.random.default_rng(15)
    cases, blob = [], []
    for i in range(60):
        P, C = int(rng.integers(1, 70)), 8 * int(rng.integers(1, 40)) if i % 2 else int(rng.integers(1, 50))
        c = int(rng.integers(0, C))
        bits = rng.integers(0, 2, size=P * C).astype(np.uint8)
        dy = _values(rng, P)
        dy[rng.random(P) < 0.05] = np.nan
        keep = bits.reshape(P, C)[:, c].astype(bool)
        plane = np.where(keep, dy, F32(0.0)).astype(F32)
        total = F32(0.0)
        for v in plane:  # the bias gradient's sum: pixel order, float32
            total = F32(total + v)
        want = np.concatenate([plane, plane, np.array([total], F32)])
        blob += [np.array([1, P, C, c], np.int32).tobytes(), np.packbits(bits, bitorder="little").tobytes(),
                 dy.tobytes()]
        cases.append((want, (P, C, c)))
    _check(driver, tmp_path, cases, blob)


def test_hidden_input_gradient_accumulation_matches_numpy_bits(driver, tmp_path):
    """tt_hs_pw_grad_in_acc_f32 with int8 weights (whole or split): channel c's share dx[p, i] += dh[p] * w(c, i)
    added onto dx as numpy adds it in float32; dh with many +-0 (masked: those pixels are skipped) and dx as the
    stream leaves it between channels (never -0)."""
    rng = np.random.default_rng(16)
    cases, blob = [], []
    for i in range(60):
        P, IC, C = int(rng.integers(1, 150)), int(rng.integers(1, 70)), int(rng.integers(1, 9))
        c, n = int(rng.integers(0, C)), (int(rng.integers(1, IC + 1)) if i % 3 == 0 else 0)
        dh = _values(rng, P)
        dh[rng.random(P) < 0.4] = 0.0
        wq = rng.integers(-128, 128, size=(C, IC)).astype(np.int8)
        part = rng.integers(-128, 128, size=(C, n)).astype(np.int8)
        scale = rng.uniform(0.01, 0.1, size=C).astype(F32)
        zp = rng.integers(-3, 4, size=C).astype(np.int32)
        dx = _values(rng, P * IC)
        dx[dx == 0] = 0.0  # never -0 (dx starts at +0 and a sum never makes -0 from a +0 start)
        row = wq[c].copy()
        row[:n] = part[c]
        wr = (row.astype(np.int32) - zp[c]).astype(F32) * scale[c]
        want = (dx.reshape(P, IC) + dh.reshape(P, 1) * wr.reshape(1, IC)).astype(F32).reshape(-1)
        blob += [np.array([2, P, IC, c, C, n], np.int32).tobytes(), dh.tobytes(), wq.tobytes(), part.tobytes(),
                 scale.tobytes(), zp.tobytes(), dx.tobytes()]
        cases.append((want, (P, IC, c, n)))
    _check(driver, tmp_path, cases, blob)


def test_pointwise_weight_gradient_row_matches_numpy_bits(driver, tmp_path):
    """Row o of a 1x1 weight gradient with int8 input x: tt_conv2d_grad_weight_qx_f32_range on a one-channel dz and
    the hidden stream's tt_hs_dequant_rows + tt_hs_pw_grad_w_f32 both give dw[c] = 0 + sum over pixels, in order,
    of dh[p] * ((float)(x[p, c] - z) * scale) as numpy sums it in float32 (dh with many +-0: skipped pixels)."""
    rng = np.random.default_rng(17)
    cases, blob = [], []
    for i in range(40):
        P, IC = int(rng.integers(1, 150)), int(rng.integers(1, 70))
        k, z, sc = int(rng.integers(0, IC + 1)), int(rng.integers(-4, 5)), F32(rng.uniform(0.01, 0.1))
        dh = _values(rng, P)
        dh[rng.random(P) < 0.4] = 0.0
        x = rng.integers(-128, 128, size=(P, IC)).astype(np.int8)
        xdq = (x[:, :k].astype(np.int32) - z).astype(F32) * sc
        acc = np.zeros(k, F32)
        for p in range(P):
            acc = (acc + dh[p] * xdq[p]).astype(F32)
        blob += [np.array([3, P, IC, k, z], np.int32).tobytes(), np.array([sc], F32).tobytes(), dh.tobytes(),
                 x.tobytes()]
        cases.append((np.concatenate([acc, acc]), (P, IC, k)))
    _check(driver, tmp_path, cases, blob)


def test_masked_pointwise_input_gradient_matches_numpy_bits(driver, tmp_path):
    """tt_hs_pw_grad_in_mask_f32: channel c of the 1x1 input gradient (int8 weight [K, C] dequantized per output
    channel k), 0 + the sum over k in order, for the pixels whose mask bit is set, +0 for the others, and the
    plane's sum in pixel order: numpy's float32 loops."""
    rng = np.random.default_rng(18)
    cases, blob = [], []
    for i in range(40):
        P, K, C = int(rng.integers(1, 150)), int(rng.integers(1, 70)), int(rng.integers(1, 20))
        c = int(rng.integers(0, C))
        dz = _values(rng, P * K)
        wq = rng.integers(-128, 128, size=(K, C)).astype(np.int8)
        scale = rng.uniform(0.01, 0.1, size=K).astype(F32)
        zp = rng.integers(-3, 4, size=K).astype(np.int32)
        bits = (rng.random(P * C) < 0.6).astype(np.uint8)
        col = (wq[:, c].astype(np.int32) - zp).astype(F32) * scale
        s = np.zeros(P, F32)
        for k in range(K):
            s = (s + dz.reshape(P, K)[:, k] * col[k]).astype(F32)
        plane = np.where(bits.reshape(P, C)[:, c].astype(bool), (F32(0.0) + s).astype(F32), F32(0.0))
        total = F32(0.0)
        for v in plane:
            total = F32(total + v)
        blob += [np.array([4, P, K, C, c], np.int32).tobytes(), dz.tobytes(), wq.tobytes(), scale.tobytes(),
                 zp.tobytes(), np.packbits(bits, bitorder="little").tobytes()]
        cases.append((np.concatenate([plane, np.array([total], F32)]), (P, K, C, c)))
    _check(driver, tmp_path, cases, blob)


def test_depthwise_channel_input_gradient_matches_numpy_bits(driver, tmp_path):
    rng = np.random.default_rng(14)
    cases, blob = [], []
    for i in range(160):
        kh, kw = (3, 3) if i % 5 else (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        s = 1 + i % 2 if i % 7 else 3
        dil = 2 if i % 11 == 0 else 1
        h, w = int(rng.integers(1, 11)), int(rng.integers(1, 11))
        padding = "same" if i % 4 else "valid"
        if h - (kh - 1) * dil < 1 or w - (kw - 1) * dil < 1:
            padding = "same"
        oh, pt = out_size_and_pad(padding, h, kh, s, dil)
        ow, pl = out_size_and_pad(padding, w, kw, s, dil)
        ch = int(rng.integers(1, 4))
        c, os_, add, q = int(rng.integers(0, ch)), int(rng.integers(1, 3)), int(i % 3 == 0), int(i % 2)
        dims = [1, h, w, ch, oh, ow, ch, kh, kw, s, s, dil, dil, pt, pl, 1]
        dy = _values(rng, oh * ow * ch)
        wf = _values(rng, kh * kw * ch)
        wq = rng.integers(-128, 128, size=kh * kw * ch).astype(np.int8)
        z, sc = int(rng.integers(-3, 4)), F32(rng.uniform(0.01, 0.1))
        dx0 = _values(rng, h * w * os_)
        blob += [np.array([0] + dims + [c, os_, add, q, z], np.int32).tobytes(), np.array([sc], F32).tobytes(),
                 dy.tobytes(), wf.tobytes(), wq.tobytes(), dx0.tobytes()]
        # the taps of channel c as the kernel reads them: float, or int8 dequantized (tt_dq: float(q - z) * scale)
        taps = ((wq.reshape(-1, ch)[:, c].astype(np.int32) - z).astype(F32) * sc if q
                else wf.reshape(-1, ch)[:, c]).astype(F32)
        attrs = dict(stride_h=s, stride_w=s, dilation_h=dil, dilation_w=dil, padding=padding)
        g = go.depthwise_conv2d_grad_input(dy.reshape(1, oh, ow, ch)[..., c:c + 1], taps.reshape(1, kh, kw, 1),
                                           (1, h, w, 1), attrs).reshape(-1)
        want = dx0.copy()
        plane = want.reshape(h * w, os_)[:, 0]
        want.reshape(h * w, os_)[:, 0] = (plane + g if add else F32(0.0) + g).astype(F32)
        cases.append((want, (h, w, kh, kw, s, dil, padding, add, q)))
    _check(driver, tmp_path, cases, blob)
    assert {(k[2], k[4]) for _, k in cases} >= {(3, 1), (3, 2)}  # both 3x3 paths ran
