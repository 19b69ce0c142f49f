/* Hidden-channel streams: see tt_hidden_stream.h and stages/planning/channel_stream.py. */
#include "tt_conv_taps.h"
#include "tt_kernels.h"
#include "tt_avx2.h"

#define TT_HS_MAX_TAPS 64

/* w(k, c): weight element [k, c] of a [K, C] (1x1) weight, float or int8 (split: input channels [0, n) in the
 * trained slice, wpart for a float weight, part for an int8 one; n = 0: not split). */
static inline float tt_hs_w(const float *w, const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                            int32_t C, int32_t k, int32_t c, float scale, int32_t zero_point)
{
    if (w != 0) {
        return c < n ? wpart[k * n + c] : w[k * C + c];
    }
    return tt_dq(c < n ? part[k * n + c] : wq[k * C + c], zero_point, scale);
}

void tt_hs_pw_grad_in_f32(int32_t P, int32_t K, int32_t C, int32_t c, const float *dz, const float *w,
                          const float *wpart, const int8_t *wq, const int8_t *part, int32_t n, const float *scale,
                          const int32_t *zero_point, float *dh)
{
    int32_t p, k;
    float wk[TT_HS_MAX_TAPS];
    if (K <= TT_HS_MAX_TAPS) {
        /* the column dequantized once: the same float per (k, c) as per element */
        for (k = 0; k < K; ++k) {
            wk[k] = tt_hs_w(w, wpart, wq, part, n, C, k, c, w != 0 ? 1.0f : scale[k], w != 0 ? 0 : zero_point[k]);
        }
        /* four pixels at a time share each weight load; each keeps its own sum over k in order */
        for (p = 0; p + 4 <= P; p += 4) {
            const float *g0 = dz + p * K, *g1 = g0 + K, *g2 = g1 + K, *g3 = g2 + K;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (k = 0; k < K; ++k) {
                const float v = wk[k];
                s0 += g0[k] * v;
                s1 += g1[k] * v;
                s2 += g2[k] * v;
                s3 += g3[k] * v;
            }
            dh[p] = 0.0f + s0;
            dh[p + 1] = 0.0f + s1;
            dh[p + 2] = 0.0f + s2;
            dh[p + 3] = 0.0f + s3;
        }
        for (; p < P; ++p) {
            const float *g = dz + p * K;
            float s = 0.0f;
            for (k = 0; k < K; ++k) {
                s += g[k] * wk[k];
            }
            dh[p] = 0.0f + s;
        }
        return;
    }
    for (p = 0; p < P; ++p) {
        const float *g = dz + p * K;
        float s = 0.0f;
        for (k = 0; k < K; ++k) {
            s += g[k] * tt_hs_w(w, wpart, wq, part, n, C, k, c, w != 0 ? 1.0f : scale[k], w != 0 ? 0 : zero_point[k]);
        }
        dh[p] = 0.0f + s;
    }
}

void tt_hs_pw_grad_in_acc_f32(int32_t P, int32_t IC, int32_t c, const float *dh, const float *w,
                              const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                              const float *scale, const int32_t *zero_point,
                              float *dx)
{
    int32_t p, i;
    const float sc = w != 0 ? 1.0f : scale[c];
    const int32_t z = w != 0 ? 0 : zero_point[c];
    float wr[TT_HS_MAX_TAPS];
    if (IC <= TT_HS_MAX_TAPS) {
        /* row c dequantized once (the same float per element as the whole kernel's) */
        for (i = 0; i < IC; ++i) {
            wr[i] = w != 0 ? (i < n ? wpart[c * n + i] : w[c * IC + i])
                           : tt_dq(i < n ? part[c * n + i] : wq[c * IC + i], z, sc);
        }
        /* four pixels at a time share each weight load (every element still gets one add per channel) */
        for (p = 0; p + 4 <= P; p += 4) {
            const float g0 = dh[p], g1 = dh[p + 1], g2 = dh[p + 2], g3 = dh[p + 3];
            float *d0 = dx + p * IC, *d1 = d0 + IC, *d2 = d1 + IC, *d3 = d2 + IC;
            for (i = 0; i < IC; ++i) {
                const float v = wr[i];
                d0[i] += g0 * v;
                d1[i] += g1 * v;
                d2[i] += g2 * v;
                d3[i] += g3 * v;
            }
        }
        for (; p < P; ++p) {
            const float g = dh[p];
            float *d = dx + p * IC;
            for (i = 0; i < IC; ++i) {
                d[i] += g * wr[i];
            }
        }
        return;
    }
    for (p = 0; p < P; ++p) {
        const float g = dh[p];
        float *d = dx + p * IC;
        for (i = 0; i < IC; ++i) {
            /* weight [C, IC]: row c; the split part holds input channels [0, n) of each row */
            const float v = w != 0 ? (i < n ? wpart[c * n + i] : w[c * IC + i])
                                   : tt_dq(i < n ? part[c * n + i] : wq[c * IC + i], z, sc);
            d[i] += g * v;
        }
    }
}

void tt_hs_dw_taps(int32_t taps, int32_t C, int32_t c, const float *w, const int8_t *wq, const float *scale,
                   const int32_t *zero_point, float *wc)
{
    int32_t t;
    for (t = 0; t < taps && t < TT_HS_MAX_TAPS; ++t) {
        wc[t] = w != 0 ? w[t * C + c] : tt_dq(wq[t * C + c], zero_point[c], scale[c]);
    }
}

void tt_hs_dw_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *wc, float *dx)
{
    int32_t iy, ix, ky, kx;
    if (d->stride_h == 1 && d->stride_w == 1) {
        /* stride 1: the output coordinate of a tap needs no division; the taps still run in (ky, kx) order */
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                float total = 0.0f, s = 0.0f;
                for (ky = 0; ky < d->k_h; ++ky) {
                    const int32_t oy = iy + d->pad_top - ky * d->dilation_h;
                    const float *row, *wrow;
                    if (oy < 0 || oy >= d->out_h) {
                        continue;
                    }
                    row = dy + oy * d->out_w;
                    wrow = wc + ky * d->k_w;
                    for (kx = 0; kx < d->k_w; ++kx) {
                        const int32_t ox = ix + d->pad_left - kx * d->dilation_w;
                        if (ox >= 0 && ox < d->out_w) {
                            s += row[ox] * wrow[kx];
                        }
                    }
                }
                total += s;
                dx[iy * d->in_w + ix] = total;
            }
        }
        return;
    }
    for (iy = 0; iy < d->in_h; ++iy) {
        for (ix = 0; ix < d->in_w; ++ix) {
            float total = 0.0f, s = 0.0f;
            for (ky = 0; ky < d->k_h; ++ky) {
                const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                if (oy < 0) {
                    continue;
                }
                for (kx = 0; kx < d->k_w; ++kx) {
                    const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                    if (ox < 0) {
                        continue;
                    }
                    s += dy[oy * d->out_w + ox] * wc[ky * d->k_w + kx];
                }
            }
            total += s;
            dx[iy * d->in_w + ix] = total;
        }
    }
}

void tt_hs_mask_grad_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy, float *dz)
{
#if TT_HOST_AVX2 /* the host build's branch-free select (same bits) */
    tt_mask_grad_bits_f32(P, C, c, mask, dy, dz);
    return;
#endif
    int32_t p;
    for (p = 0; p < P; ++p) {
        const uint32_t b = (uint32_t)p * (uint32_t)C + (uint32_t)c;
        dz[p] = ((mask[b >> 3] >> (b & 7u)) & 1u) ? dy[p] : 0.0f;
    }
}

void tt_hs_int8_clamp_grad_f32(int32_t P, int32_t C, int32_t c, int32_t lo, int32_t hi, const float *dy,
                               const int8_t *y, float *dx)
{
    int32_t p;
    for (p = 0; p < P; ++p) {
        const int32_t v = (int32_t)y[p * C + c];
        dx[p] = (v > lo && v < hi) ? dy[p] : 0.0f;
    }
}
