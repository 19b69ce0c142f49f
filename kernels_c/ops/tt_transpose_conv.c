/* TRANSPOSE_CONV forward (int8 per channel, float32) and float32 backward (stages/executor._transpose_conv,
 * stages/grad_ops.transpose_conv_grad_*).
 *
 * Geometry (tt_conv_dims): in_* is the op's input x [B,in_h,in_w,in_c], out_* its output y [B,out_h,out_w,out_c],
 * w [out_c,k_h,k_w,in_c]; pad_top/pad_left as ComputePaddingHeightWidth with y as the conv's input
 * (executor.transpose_conv_geometry); dilation and depth_multiplier are ignored. Input pixel (iy, ix) reaches output
 * (iy*stride - pad + ky, ix*stride - pad + kx).
 *
 * The reference kernels scatter into a zeroed int32 (int8) / float (float32) output-sized scratch. These gather
 * instead, so no scratch buffer is needed: for each output element, the taps whose input pixel exists.
 * int8: the int32 sum of (x - z_x) * w over those taps plus the bias, requantized per channel and clamped to the
 * fused activation's range. Integer sums wrap modulo 2^32 in any order, so the result is the reference's bit for
 * bit. float32: the taps are summed from 0.0f in the reference's order for that element (input row, input column,
 * input channel ascending = ky, kx descending), then + bias, then the clamp: bit-equal to the executor and to
 * reference_ops::TransposeConv. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"
#include "tt_requant.h"

#ifdef TT_INTERFACE
/* TRANSPOSE_CONV (ops/tt_transpose_conv.c): x [B,in_h,in_w,in_c] -> y [B,out_h,out_w,out_c], w [out_c,k_h,k_w,in_c],
 * pad_top/pad_left from y's size (executor.transpose_conv_geometry); dilation / depth_multiplier ignored. int8:
 * requant as conv2d (bit-exact with the reference's int32 scratch); float: the reference's per-element order. The
 * backward: dx = the conv2d of dy with w of the same geometry; dw [out_c,k_h,k_w,k] (first k input channels). */
void tt_transpose_conv_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                          const int32_t *bias, int8_t *y);
void tt_transpose_conv_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                           const float *bias, float *y);
void tt_transpose_conv_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
void tt_transpose_conv_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw);
#endif /* TT_INTERFACE */

/* First tap index of a stride-aligned axis: the taps k with (o + pad - k) % s == 0 and 0 <= (o + pad - k) / s < n
 * are k = r, r + s, ... with r = (o + pad) % s; returns the input index of tap k (or -1 when outside). */
static inline int32_t tt_tc_src(int32_t o, int32_t pad, int32_t k, int32_t s, int32_t n)
{
    const int32_t t = o + pad - k;
    if (t < 0 || t % s != 0) {
        return -1;
    }
    return t / s < n ? t / s : -1;
}

void tt_transpose_conv_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                          const int32_t *bias, int8_t *y)
{
    int32_t b, oy, ox, oc, ky, kx, c;
    const int32_t zin = q->input_zero_point;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                int8_t *yp = y + (((int64_t)b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ++oc) {
                    uint32_t acc = 0u; /* wraps like the reference's int32 scratch */
                    int32_t v, i;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t iy = tt_tc_src(oy, d->pad_top, ky, d->stride_h, d->in_h);
                        if (iy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ix = tt_tc_src(ox, d->pad_left, kx, d->stride_w, d->in_w);
                            const int8_t *xp, *wp;
                            if (ix < 0) {
                                continue;
                            }
                            xp = x + (((int64_t)b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                            wp = w + (((int64_t)oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
                            for (c = 0; c < d->in_c; ++c) {
                                acc += (uint32_t)(((int32_t)xp[c] - zin) * (int32_t)wp[c]);
                            }
                        }
                    }
                    if (bias) {
                        acc += (uint32_t)bias[oc];
                    }
                    i = q->per_channel ? oc : 0;
                    v = tt_multiply_by_quantized_multiplier((int32_t)acc, q->multiplier[i], (int)q->shift[i]);
                    v += q->output_zero_point;
                    yp[oc] = (int8_t)tt_clamp32(v, q->act_min, q->act_max);
                }
            }
        }
    }
}

void tt_transpose_conv_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                           const float *bias, float *y)
{
    int32_t b, oy, ox, oc, ky, kx, c;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                float *yp = y + (((int64_t)b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ++oc) {
                    float acc = 0.0f;
                    for (ky = d->k_h - 1; ky >= 0; --ky) {
                        const int32_t iy = tt_tc_src(oy, d->pad_top, ky, d->stride_h, d->in_h);
                        if (iy < 0) {
                            continue;
                        }
                        for (kx = d->k_w - 1; kx >= 0; --kx) {
                            const int32_t ix = tt_tc_src(ox, d->pad_left, kx, d->stride_w, d->in_w);
                            const float *xp, *wp;
                            if (ix < 0) {
                                continue;
                            }
                            xp = x + (((int64_t)b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                            wp = w + (((int64_t)oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
                            for (c = 0; c < d->in_c; ++c) {
                                acc += xp[c] * wp[c];
                            }
                        }
                    }
                    if (bias) {
                        acc += bias[oc];
                    }
                    yp[oc] = tt_act_clamp(acc, act_min, act_max);
                }
            }
        }
    }
}

void tt_transpose_conv_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx)
{
    int32_t b, iy, ix, c, ky, kx, o;
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                float *dp = dx + (((int64_t)b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                for (c = 0; c < d->in_c; ++c) {
                    float acc = 0.0f;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t oy = iy * d->stride_h - d->pad_top + ky;
                        if (oy < 0 || oy >= d->out_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ox = ix * d->stride_w - d->pad_left + kx;
                            const float *gp;
                            if (ox < 0 || ox >= d->out_w) {
                                continue;
                            }
                            gp = dy + (((int64_t)b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                            for (o = 0; o < d->out_c; ++o) {
                                acc += gp[o] * w[(((int64_t)o * d->k_h + ky) * d->k_w + kx) * d->in_c + c];
                            }
                        }
                    }
                    dp[c] = acc;
                }
            }
        }
    }
}

void tt_transpose_conv_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw)
{
    int32_t o, ky, kx, c, b, iy, ix;
    for (o = 0; o < d->out_c; ++o) {
        for (ky = 0; ky < d->k_h; ++ky) {
            for (kx = 0; kx < d->k_w; ++kx) {
                float *wp = dw + (((int64_t)o * d->k_h + ky) * d->k_w + kx) * k;
                for (c = 0; c < k; ++c) {
                    float acc = 0.0f;
                    for (b = 0; b < d->batches; ++b) {
                        for (iy = 0; iy < d->in_h; ++iy) {
                            const int32_t oy = iy * d->stride_h - d->pad_top + ky;
                            if (oy < 0 || oy >= d->out_h) {
                                continue;
                            }
                            for (ix = 0; ix < d->in_w; ++ix) {
                                const int32_t ox = ix * d->stride_w - d->pad_left + kx;
                                if (ox < 0 || ox >= d->out_w) {
                                    continue;
                                }
                                acc += x[(((int64_t)b * d->in_h + iy) * d->in_w + ix) * d->in_c + c] *
                                       dy[(((int64_t)b * d->out_h + oy) * d->out_w + ox) * d->out_c + o];
                            }
                        }
                    }
                    wp[c] = acc;
                }
            }
        }
    }
}
