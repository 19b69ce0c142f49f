/* average_pool2d, max_pool2d and mean over H,W; int8 and float32 (executor._average_pool2d, _max_pool2d, _mean).
 * Windows are visited row by row (filter y, then filter x) like the reference kernels; out-of-image taps are
 * skipped and the average divides by the number of in-image taps. */
#include "tt_kernels.h"

#include <float.h>

static inline float tt_clampf(float v, float lo, float hi)
{
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

void tt_average_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y)
{
    int32_t b, oy, ox, c, ky, kx;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                for (c = 0; c < d->channels; ++c) {
                    int32_t acc = 0, count = 0, avg;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            acc += x[((b * d->in_h + iy) * d->in_w + ix) * d->channels + c];
                            ++count;
                        }
                    }
                    /* Round half away from zero with C's truncating division (reference AveragePool). */
                    avg = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
                    y[((b * d->out_h + oy) * d->out_w + ox) * d->channels + c] =
                        (int8_t)tt_clamp32(avg, act_min, act_max);
                }
            }
        }
    }
}

void tt_max_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y)
{
    int32_t b, oy, ox, c, ky, kx;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                for (c = 0; c < d->channels; ++c) {
                    int32_t best = -128;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            int32_t v;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            v = x[((b * d->in_h + iy) * d->in_w + ix) * d->channels + c];
                            if (v > best) {
                                best = v;
                            }
                        }
                    }
                    y[((b * d->out_h + oy) * d->out_w + ox) * d->channels + c] =
                        (int8_t)tt_clamp32(best, act_min, act_max);
                }
            }
        }
    }
}

/* reference_ops::QuantizedMeanOrSum (executor._quantized_mean): sum in int32, minus z_in * count, then the
 * multiplier that already holds 1/count, + z_out, clamped to int8 (no fused activation). */
void tt_mean_hw_s8(const tt_mean_params_s8 *p, int32_t batches, int32_t h, int32_t w, int32_t c, const int8_t *x,
                   int8_t *y)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        for (ch = 0; ch < c; ++ch) {
            int32_t total = 0, v;
            for (i = 0; i < count; ++i) {
                total += x[(b * count + i) * c + ch];
            }
            total = tt_wrap_sub32(total, (int32_t)((uint32_t)p->input_zero_point * (uint32_t)count));
            v = tt_multiply_by_quantized_multiplier(total, p->multiplier, (int)p->shift) + p->output_zero_point;
            y[b * c + ch] = (int8_t)tt_clamp32(v, -128, 127);
        }
    }
}

void tt_average_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y)
{
    int32_t b, oy, ox, c, ky, kx;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                for (c = 0; c < d->channels; ++c) {
                    float acc = 0.0f, count = 0.0f;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            acc += x[((b * d->in_h + iy) * d->in_w + ix) * d->channels + c];
                            count += 1.0f;
                        }
                    }
                    y[((b * d->out_h + oy) * d->out_w + ox) * d->channels + c] =
                        tt_clampf(acc / count, act_min, act_max);
                }
            }
        }
    }
}

/* The executor pads with -FLT_MAX (np.finfo(float32).min), so a window that reaches past the image never
 * yields less than -FLT_MAX; we reproduce that by starting such windows at -FLT_MAX. */
void tt_max_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y)
{
    int32_t b, oy, ox, c, ky, kx;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                const int32_t clipped = iy0 < 0 || ix0 < 0 || iy0 + d->filter_h > d->in_h ||
                                        ix0 + d->filter_w > d->in_w;
                for (c = 0; c < d->channels; ++c) {
                    float best = -FLT_MAX; /* replaced by the first tap unless the window is clipped */
                    int32_t first = 1;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            float v;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            v = x[((b * d->in_h + iy) * d->in_w + ix) * d->channels + c];
                            if ((first && !clipped) || v > best) {
                                best = v;
                            }
                            first = 0;
                        }
                    }
                    y[((b * d->out_h + oy) * d->out_w + ox) * d->channels + c] =
                        tt_clampf(best, act_min, act_max);
                }
            }
        }
    }
}

/* ReduceSumImpl order: a sequential float32 sum over the H*W positions, then / count (executor._mean). */
void tt_mean_hw_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *x, float *y)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        float *yb = y + b * c;
        for (ch = 0; ch < c; ++ch) {
            yb[ch] = 0.0f;
        }
        for (i = 0; i < count; ++i) {
            const float *xp = x + (b * count + i) * c;
            for (ch = 0; ch < c; ++ch) {
                yb[ch] += xp[ch];
            }
        }
        for (ch = 0; ch < c; ++ch) {
            yb[ch] = yb[ch] / (float)count;
        }
    }
}
