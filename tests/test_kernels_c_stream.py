"""kernels_c: the in-place depthwise input gradient and the streamed weight gradient -> update, against the plain
kernels, byte for byte (C harness below, compiled for the host with ASan + UBSan like tests/test_kernels_c.py).

- tt_depthwise_conv2d_grad_input{,_qw}_f32_inplace (dx written over dz through one channel of scratch) ==
  tt_depthwise_conv2d_grad_input{,_qw}_f32, for batches 1..3, strides 1..2, dilations, SAME/VALID, dx smaller or
  larger than dz, filters beyond the qw kernel's tap list (> 49 taps).
- Streaming "weight gradient -> optimizer update" over blocks of output channels (conv2d 1x1 and 3x3 trained on an
  input-channel slice k < in_c, fully connected) or of taps (depthwise): tt_*_grad_weight_f32_range / _taps, then
  tt_qas_update / tt_sgd_f32 / tt_adam_f32 (...) on the block's rows with the pointer offsets of the call
  sequence documented in tt_kernels.h, gives the weights, optimizer state, master copy and PRNG state of one
  whole grad-weight call followed by one whole update (QAS int8 nearest / stochastic / master copy with SGD,
  momentum, Adam; float SGD, momentum, Adam, RMSprop), over two steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.cross_compile import KERNEL_SOURCE_GLOBS

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]
HOST_FLAGS = CFLAGS + ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tt_kernels.h"
#include "tt_train_ops.h"

static uint32_t seed = 2463534242u;
static int fails = 0, checks = 0;
static long moved = 0;

static float frand(void) /* [-1, 1) */
{
    return (float)(tt_xorshift32(&seed) >> 8) * (1.0f / 8388608.0f) - 1.0f;
}
static int32_t irand(int32_t lo, int32_t hi) /* [lo, hi] */
{
    return lo + (int32_t)(tt_xorshift32(&seed) % (uint32_t)(hi - lo + 1));
}
static void *zalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (p == 0) {
        exit(3);
    }
    return p;
}
static float *frands(size_t n)
{
    float *p = zalloc(4 * n);
    size_t i;
    for (i = 0; i < n; ++i) {
        p[i] = frand();
    }
    return p;
}
static void check(int ok, const char *what, int case_no)
{
    ++checks;
    if (!ok) {
        ++fails;
        fprintf(stderr, "MISMATCH %s (case %d)\n", what, case_no);
    }
}

/* ---- in-place depthwise input gradient ---------------------------------------------------------------------- */
static void dw_inplace_case(int case_no)
{
    tt_conv_dims d;
    const int32_t same = irand(0, 1), big = case_no % 13 == 12;
    size_t n_dy, n_dx, n_buf, t, taps;
    float *dy, *w, *dq_scale, *ref, *ref_q, *buf, *scratch;
    int8_t *wq;
    int32_t *zp;
    d.batches = irand(1, 3);
    d.in_h = irand(1, 9);
    d.in_w = irand(1, 9);
    d.in_c = irand(1, 11);
    d.k_h = big ? 8 : irand(1, 4);
    d.k_w = big ? 7 : irand(1, 4);
    d.stride_h = irand(1, 2);
    d.stride_w = irand(1, 2);
    d.dilation_h = irand(1, 2);
    d.dilation_w = irand(1, 2);
    d.depth_multiplier = 1;
    d.out_c = d.in_c;
    if (case_no % 3 == 0) { /* the case memplan shares: stride 1, SAME */
        d.stride_h = d.stride_w = 1;
    }
    if (case_no % 6 == 3) { /* MobileNetV2's: 3x3, undilated (the register-tap rows of the in-place kernel) */
        d.k_h = d.k_w = 3;
        d.dilation_h = d.dilation_w = 1;
    }
    tt_out_size_and_pad(same || case_no % 3 == 0, d.in_h, d.k_h, d.stride_h, d.dilation_h, &d.out_h, &d.pad_top);
    tt_out_size_and_pad(same || case_no % 3 == 0, d.in_w, d.k_w, d.stride_w, d.dilation_w, &d.out_w, &d.pad_left);
    if (d.out_h < 1 || d.out_w < 1) {
        return;
    }
    taps = (size_t)(d.k_h * d.k_w);
    n_dy = (size_t)(d.batches * d.out_h * d.out_w * d.in_c);
    n_dx = (size_t)(d.batches * d.in_h * d.in_w * d.in_c);
    n_buf = n_dy > n_dx ? n_dy : n_dx;
    dy = frands(n_dy);
    w = frands(taps * (size_t)d.in_c);
    wq = zalloc(taps * (size_t)d.in_c);
    dq_scale = zalloc(4 * (size_t)d.in_c);
    zp = zalloc(4 * (size_t)d.in_c);
    for (t = 0; t < taps * (size_t)d.in_c; ++t) {
        wq[t] = (int8_t)irand(-127, 127);
    }
    for (t = 0; t < (size_t)d.in_c; ++t) {
        dq_scale[t] = 0.001f + 0.05f * (frand() + 1.0f);
        zp[t] = irand(-3, 3);
    }
    ref = zalloc(4 * n_dx);
    ref_q = zalloc(4 * n_dx);
    buf = zalloc(4 * n_buf);
    scratch = zalloc(4 * (size_t)(d.in_h * d.in_w));
    tt_depthwise_conv2d_grad_input_f32(&d, dy, w, ref);
    tt_depthwise_conv2d_grad_input_qw_f32(&d, dy, wq, dq_scale, zp, ref_q);

    memcpy(buf, dy, 4 * n_dy);
    tt_depthwise_conv2d_grad_input_f32_inplace(&d, buf, w, scratch);
    check(memcmp(buf, ref, 4 * n_dx) == 0, "dw grad input f32 in place", case_no);
    memset(buf, 0, 4 * n_buf);
    memcpy(buf, dy, 4 * n_dy);
    tt_depthwise_conv2d_grad_input_qw_f32_inplace(&d, buf, wq, dq_scale, zp, scratch);
    check(memcmp(buf, ref_q, 4 * n_dx) == 0, "dw grad input qw in place", case_no);
    free(dy); free(w); free(wq); free(dq_scale); free(zp); free(ref); free(ref_q); free(buf); free(scratch);
}

/* ---- streamed weight gradient -> update ---------------------------------------------------------------------- */
enum { UPD_QAS = 0, UPD_SGD = 1, UPD_MOMENTUM = 2, UPD_ADAM = 3, UPD_RMSPROP = 4 };

typedef struct {
    int upd;           /* UPD_* */
    tt_opt_kind kind;  /* QAS optimizer */
    tt_rounding rounding;
    int master;
} upd_cfg;

/* The layer: a weight of `units` blocks of rows_per_unit rows each (conv: output channels of KH*KW rows; FC:
 * output channels of 1 row; depthwise: taps of 1 row), cols columns, the first n trained. */
typedef struct {
    int what; /* 0 conv2d, 1 fully connected, 2 depthwise */
    tt_conv_dims d;
    int32_t rows_fc, depth_fc, k;
    int32_t units, rows_per_unit, cols, n;
    int32_t rpc, scale_count; /* tt_qas_update's rows_per_channel and scale count */
    const float *dy, *x;
} layer;

/* gradient rows of units [u0, u1) into g (g points at the first of them) */
static void grad_rows(const layer *L, int32_t u0, int32_t u1, float *g)
{
    if (L->what == 0) {
        tt_conv2d_grad_weight_f32_range(&L->d, L->k, u0, u1, L->dy, L->x, g);
    } else if (L->what == 1) {
        tt_fully_connected_grad_weight_f32_range(L->rows_fc, L->depth_fc, L->units, L->k, u0, u1, L->dy, L->x, g);
    } else {
        tt_depthwise_conv2d_grad_weight_f32_taps(&L->d, L->k, u0, u1, L->dy, L->x, g);
    }
}
static void grad_whole(const layer *L, float *g)
{
    if (L->what == 0) {
        tt_conv2d_grad_weight_f32(&L->d, L->k, L->dy, L->x, g);
    } else if (L->what == 1) {
        tt_fully_connected_grad_weight_f32(L->rows_fc, L->depth_fc, L->units, L->k, L->dy, L->x, g);
    } else {
        tt_depthwise_conv2d_grad_weight_f32(&L->d, L->k, L->dy, L->x, g);
    }
}

/* The update of units [u0, u1) from their gradient rows g (the call sequence of tt_kernels.h): row r0 =
 * u0 * rows_per_unit; param + r0 * cols, state / master + r0 * n, per-output-channel scales + u0 (a per-tensor
 * scale or per-column scales, rows_per_channel 0: unchanged); rows (u1 - u0) * rows_per_unit. */
static void update_rows(const layer *L, const upd_cfg *u, const tt_qas_params *qp, const tt_adam_params *ap,
                        int32_t u0, int32_t u1, const float *scale, void *param, const float *g, float *s0,
                        float *s1, float *m, uint32_t *rng)
{
    const int32_t r0 = u0 * L->rows_per_unit, rows = (u1 - u0) * L->rows_per_unit;
    const size_t po = (size_t)r0 * (size_t)L->cols, so = (size_t)r0 * (size_t)L->n;
    if (u->upd == UPD_QAS) {
        const float *sc = (L->rpc > 0 && L->scale_count != 1) ? scale + u0 : scale;
        tt_qas_update(qp, rows, L->cols, L->n, L->rpc, L->scale_count, sc, (int8_t *)param + po, 0, g,
                      qp->kind != TT_OPT_SGD ? s0 + so : 0, qp->kind == TT_OPT_ADAM ? s1 + so : 0,
                      u->master ? m + so : 0, (u->rounding == TT_ROUND_STOCHASTIC && !u->master) ? rng : 0);
    } else {
        const tt_slice sl = {rows, L->cols, L->n};
        float *w = (float *)param + po;
        if (u->upd == UPD_SGD) {
            const tt_sgd_params p = {0.05f, 0.5f, 1e-3f};
            tt_sgd_f32(&sl, &p, w, g);
        } else if (u->upd == UPD_MOMENTUM) {
            const tt_momentum_params p = {0.05f, 0.9f, 0.5f, 0.0f};
            tt_momentum_f32(&sl, &p, w, g, s0 + so);
        } else if (u->upd == UPD_ADAM) {
            tt_adam_f32(&sl, ap, w, g, s0 + so, s1 + so);
        } else {
            const tt_rmsprop_params p = {0.01f, 0.99f, (float)(1.0 - 0.99), 1e-7f, 0.5f, 0.0f};
            tt_rmsprop_f32(&sl, &p, w, g, s0 + so);
        }
    }
}

static void stream_case(const layer *L, const upd_cfg *u, int case_no)
{
    const int32_t rows = L->units * L->rows_per_unit, ne = rows * L->n, np = rows * L->cols;
    const int32_t n_scale = L->scale_count;
    const size_t esz = u->upd == UPD_QAS ? 1 : 4;
    float *scale = zalloc(4 * (size_t)n_scale), *g = zalloc(4 * (size_t)ne), *gb = zalloc(4 * (size_t)ne);
    void *p[2], *p0;
    float *s0[2], *s1[2], *m[2];
    uint32_t rng[2];
    tt_qas_params qp;
    int32_t i, pass, step;
    p[0] = zalloc(esz * (size_t)np);
    for (i = 0; i < n_scale; ++i) {
        scale[i] = 0.004f + 0.01f * (frand() + 1.0f);
    }
    for (i = 0; i < np; ++i) {
        if (esz == 1) {
            ((int8_t *)p[0])[i] = (int8_t)irand(-127, 127);
        } else {
            ((float *)p[0])[i] = frand();
        }
    }
    p[1] = zalloc(esz * (size_t)np);
    memcpy(p[1], p[0], esz * (size_t)np);
    p0 = zalloc(esz * (size_t)np);
    memcpy(p0, p[0], esz * (size_t)np);
    for (pass = 0; pass < 2; ++pass) {
        s0[pass] = zalloc(4 * (size_t)ne);
        s1[pass] = zalloc(4 * (size_t)ne);
        m[pass] = zalloc(4 * (size_t)ne);
        for (i = 0; i < ne && esz == 1; ++i) { /* the master copy starts at the int value */
            const int32_t r = i / L->n, j = i % L->n;
            m[pass][i] = (float)((int8_t *)p[pass])[r * L->cols + j];
        }
        rng[pass] = 0x9e3779b9u;
    }
    memset(&qp, 0, sizeof qp);
    qp.kind = u->kind;
    qp.qas = 1;
    qp.rounding = u->rounding;
    qp.lo = -127;
    qp.hi = 127;
    qp.batch_scale = 0.5f;
    qp.lr = 0.05f;
    qp.weight_decay = 1e-3f;
    qp.momentum = 0.9f;
    for (step = 1; step <= 2; ++step) {
        tt_adam_params ap;
        tt_adam_prepare(0.05, 0.9, 0.999, 1e-7, step, 0.5f, 1e-3f, &ap);
        qp.one_minus_beta1 = ap.one_minus_beta1;
        qp.beta2 = ap.beta2;
        qp.one_minus_beta2 = ap.one_minus_beta2;
        qp.lr_over_bc1 = ap.lr_over_bc1;
        qp.sqrt_bc2 = ap.sqrt_bc2;
        qp.eps = ap.eps;
        /* pass 0: the whole gradient, then one update of every row */
        grad_whole(L, g);
        update_rows(L, u, &qp, &ap, 0, L->units, scale, p[0], g, s0[0], s1[0], m[0], &rng[0]);
        /* pass 1: blocks of 1..3 units, each gradient block updated at once (gb reused: the blocks' rows) */
        {
            int32_t u0 = 0;
            while (u0 < L->units) {
                int32_t u1 = u0 + irand(1, 3);
                u1 = u1 > L->units ? L->units : u1;
                grad_rows(L, u0, u1, gb);
                check(memcmp(gb, g + (size_t)u0 * (size_t)L->rows_per_unit * (size_t)L->n,
                             4 * (size_t)((u1 - u0) * L->rows_per_unit * L->n)) == 0, "gradient block", case_no);
                update_rows(L, u, &qp, &ap, u0, u1, scale, p[1], gb, s0[1], s1[1], m[1], &rng[1]);
                u0 = u1;
            }
        }
    }
    check(memcmp(p[0], p[1], esz * (size_t)np) == 0, "streamed parameter", case_no);
    check(memcmp(s0[0], s0[1], 4 * (size_t)ne) == 0 && memcmp(s1[0], s1[1], 4 * (size_t)ne) == 0,
          "streamed optimizer state", case_no);
    check(memcmp(m[0], m[1], 4 * (size_t)ne) == 0 && rng[0] == rng[1], "streamed master / PRNG", case_no);
    for (i = 0; i < np * (int32_t)esz; ++i) { /* the updates really moved parameters (no vacuous comparison) */
        moved += ((const char *)p[0])[i] != ((const char *)p0)[i];
    }
    for (pass = 0; pass < 2; ++pass) {
        free(p[pass]); free(s0[pass]); free(s1[pass]); free(m[pass]);
    }
    free(p0); free(scale); free(g); free(gb);
}

int main(void)
{
    static const upd_cfg cfgs[] = {
        {UPD_QAS, TT_OPT_SGD, TT_ROUND_NEAREST, 0},      {UPD_QAS, TT_OPT_SGD, TT_ROUND_STOCHASTIC, 0},
        {UPD_QAS, TT_OPT_MOMENTUM, TT_ROUND_STOCHASTIC, 0}, {UPD_QAS, TT_OPT_ADAM, TT_ROUND_NEAREST, 0},
        {UPD_QAS, TT_OPT_ADAM, TT_ROUND_STOCHASTIC, 0},  {UPD_QAS, TT_OPT_SGD, TT_ROUND_NEAREST, 1},
        {UPD_SGD, TT_OPT_SGD, TT_ROUND_NEAREST, 0},      {UPD_MOMENTUM, TT_OPT_SGD, TT_ROUND_NEAREST, 0},
        {UPD_ADAM, TT_OPT_SGD, TT_ROUND_NEAREST, 0},     {UPD_RMSPROP, TT_OPT_SGD, TT_ROUND_NEAREST, 0},
    };
    const int n_cfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    int c, what, ci, case_no = 0;
    for (c = 0; c < 240; ++c) {
        dw_inplace_case(c);
    }
    for (what = 0; what < 4; ++what) { /* conv 1x1, conv 3x3, fully connected, depthwise */
        for (c = 0; c < 3; ++c) {
            for (ci = 0; ci < n_cfg; ++ci) {
                layer L;
                float *dy, *x;
                const int32_t per_tensor = c == 2;
                memset(&L, 0, sizeof L);
                if (what <= 1 || what == 3) {
                    tt_conv_dims *d = &L.d;
                    const int32_t kk = what == 0 ? 1 : 3;
                    d->batches = irand(1, 2);
                    d->in_h = irand(3, 7);
                    d->in_w = irand(3, 7);
                    d->in_c = irand(2, 9);
                    d->k_h = d->k_w = kk;
                    d->stride_h = d->stride_w = irand(1, 2);
                    d->dilation_h = d->dilation_w = 1;
                    d->depth_multiplier = what == 3 ? irand(1, 2) : 1;
                    d->out_c = what == 3 ? d->in_c * d->depth_multiplier : irand(1, 9);
                    tt_out_size_and_pad(1, d->in_h, kk, d->stride_h, 1, &d->out_h, &d->pad_top);
                    tt_out_size_and_pad(1, d->in_w, kk, d->stride_w, 1, &d->out_w, &d->pad_left);
                    L.k = irand(1, d->in_c - 1); /* a trained input-channel slice k < in_c */
                    dy = frands((size_t)(d->batches * d->out_h * d->out_w * d->out_c));
                    x = frands((size_t)(d->batches * d->in_h * d->in_w * d->in_c));
                    if (what == 3) {
                        L.what = 2;
                        L.units = kk * kk;
                        L.rows_per_unit = 1;
                        L.cols = d->out_c;
                        L.n = L.k * d->depth_multiplier;
                        L.rpc = 0;
                        L.scale_count = d->out_c;
                    } else {
                        L.what = 0;
                        L.units = d->out_c;
                        L.rows_per_unit = kk * kk;
                        L.cols = d->in_c;
                        L.n = L.k;
                        L.rpc = kk * kk;
                        L.scale_count = per_tensor ? 1 : d->out_c;
                    }
                } else {
                    L.what = 1;
                    L.rows_fc = irand(1, 3);
                    L.depth_fc = irand(2, 20);
                    L.units = irand(1, 10);
                    L.k = c == 1 ? L.depth_fc : irand(1, L.depth_fc - 1);
                    L.rows_per_unit = 1;
                    L.cols = L.depth_fc;
                    L.n = L.k;
                    L.rpc = 1;
                    L.scale_count = per_tensor ? 1 : L.units;
                    dy = frands((size_t)(L.rows_fc * L.units));
                    x = frands((size_t)(L.rows_fc * L.depth_fc));
                }
                L.dy = dy;
                L.x = x;
                stream_case(&L, &cfgs[ci], case_no++);
                free(dy);
                free(x);
            }
        }
    }
    printf("%d checks %ld moved, %d failed\n", checks, moved, fails);
    return fails != 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    tmp = tmp_path_factory.mktemp("ttstream")
    src = tmp / "stream.c"
    src.write_text(HARNESS)
    exe = tmp / "stream"
    cmd = [cc, *HOST_FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", *[str(p) for g in KERNEL_SOURCE_GLOBS for p in sorted(KDIR.glob(g))], str(src), "-lm", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"host build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return exe


def test_inplace_dw_grad_input_and_streamed_updates_are_bit_identical(harness):
    res = subprocess.run([str(harness)], capture_output=True, text=True, env={**os.environ})
    assert res.returncode == 0, res.stdout + res.stderr
    words = res.stdout.split()
    n_checks, n_moved = int(words[0]), int(words[2])
    assert n_checks > 500 and n_moved > 1000 and res.stdout.strip().endswith(" 0 failed")
