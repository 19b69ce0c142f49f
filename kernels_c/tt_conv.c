/* Forward conv2d and depthwise_conv2d, int8 (per-channel) and float32.
 *
 * int8: reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel. Out-of-image taps are skipped, which
 * equals padding (x - z_x) with 0 (the executor's formulation). Accumulation in int32 like the reference; the
 * numpy model wraps the int64 sum to int32, identical whenever the C sum does not overflow (it cannot for any
 * layer with fewer than 2^16 taps per output: |(x - z) * w| <= 255 * 128).
 * float32: acc = 0, += x*w in the order filter y, filter x, input channel (the executor's loop order), then
 * + bias, then the activation clamp. */
#include "tt_kernels.h"
#include "tt_dot.h"

static inline int32_t tt_requant_one(const tt_requant_s8 *q, int32_t acc, int32_t oc)
{
    const int32_t i = q->per_channel ? oc : 0;
    int32_t v = tt_multiply_by_quantized_multiplier(acc, q->multiplier[i], (int)q->shift[i]);
    v += q->output_zero_point;
    return tt_clamp32(v, q->act_min, q->act_max);
}

static inline float tt_act_clamp(float v, float lo, float hi)
{
    /* np.maximum then np.minimum, as executor._float_act. */
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

static void tt_conv2d_s8_impl(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                              const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y)
{
    int32_t b, oy, ox, oc, ky, kx;
    const int32_t zin = q->input_zero_point;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                int8_t *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ++oc) {
                    int32_t acc = 0;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t iy = iy0 + ky * d->dilation_h;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ix = ix0 + kx * d->dilation_w;
                            const int8_t *xp;
                            const int8_t *wp;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            xp = x + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                            wp = w + ((oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
                            if (n > 0) {
                                /* int32 addition is associative: the two partial sums equal the whole one */
                                acc += tt_dot_s8(xp, w_slice + ((oc * d->k_h + ky) * d->k_w + kx) * n, n, zin);
                            }
                            acc += tt_dot_s8(xp + n, wp + n, d->in_c - n, zin);
                        }
                    }
                    if (bias != 0) {
                        acc += bias[oc];
                    }
                    yp[oc] = (int8_t)tt_requant_one(q, acc, oc);
                }
            }
        }
    }
}

void tt_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                  const int32_t *bias, int8_t *y)
{
    tt_conv2d_s8_impl(d, q, x, w, 0, 0, bias, y);
}

void tt_conv2d_s8_split(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                        const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y)
{
    tt_conv2d_s8_impl(d, q, x, w, w_slice, n, bias, y);
}

void tt_depthwise_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                            const int32_t *bias, int8_t *y)
{
    int32_t b, oy, ox, ic, m, ky, kx;
    const int32_t zin = q->input_zero_point;
    const int32_t mult = d->depth_multiplier;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                int8_t *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (ic = 0; ic < d->in_c; ++ic) {
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        int32_t acc = 0;
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t iy = iy0 + ky * d->dilation_h;
                            if (iy < 0 || iy >= d->in_h) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ix = ix0 + kx * d->dilation_w;
                                if (ix < 0 || ix >= d->in_w) {
                                    continue;
                                }
                                acc += ((int32_t)x[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] - zin) *
                                       (int32_t)w[(ky * d->k_w + kx) * d->out_c + oc];
                            }
                        }
                        if (bias != 0) {
                            acc += bias[oc];
                        }
                        yp[oc] = (int8_t)tt_requant_one(q, acc, oc);
                    }
                }
            }
        }
    }
}

void tt_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                   const float *bias, float *y)
{
    int32_t b, oy, ox, oc, ky, kx, ic;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                float *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ++oc) {
                    float acc = 0.0f;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t iy = iy0 + ky * d->dilation_h;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ix = ix0 + kx * d->dilation_w;
                            const float *xp;
                            const float *wp;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            xp = x + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                            wp = w + ((oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
                            for (ic = 0; ic < d->in_c; ++ic) {
                                acc += xp[ic] * wp[ic];
                            }
                        }
                    }
                    if (bias != 0) {
                        acc += bias[oc];
                    }
                    yp[oc] = tt_act_clamp(acc, act_min, act_max);
                }
            }
        }
    }
}

void tt_depthwise_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *bias, float *y)
{
    int32_t b, oy, ox, ic, m, ky, kx;
    const int32_t mult = d->depth_multiplier;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                float *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (ic = 0; ic < d->in_c; ++ic) {
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        float acc = 0.0f;
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t iy = iy0 + ky * d->dilation_h;
                            if (iy < 0 || iy >= d->in_h) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ix = ix0 + kx * d->dilation_w;
                                if (ix < 0 || ix >= d->in_w) {
                                    continue;
                                }
                                acc += x[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] *
                                       w[(ky * d->k_w + kx) * d->out_c + oc];
                            }
                        }
                        if (bias != 0) {
                            acc += bias[oc];
                        }
                        yp[oc] = tt_act_clamp(acc, act_min, act_max);
                    }
                }
            }
        }
    }
}
