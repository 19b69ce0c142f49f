/* average_pool2d: int8 and float32, and average_pool2d_grad.
 *
 * average_pool2d, max_pool2d and mean over H,W; int8 and float32 (executor._average_pool2d, _max_pool2d, _mean).
 * Windows are visited row by row (filter y, then filter x) like the reference kernels; out-of-image taps are
 * skipped and the average divides by the number of in-image taps. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* reference_integer_ops::AveragePool: sum of in-image taps / their count, rounded half away from zero. */
void tt_average_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);
void tt_average_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
void tt_average_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, float *dx);
#endif /* TT_INTERFACE */

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
                        tt_act_clamp(acc / count, act_min, act_max);
                }
            }
        }
    }
}

static int32_t tt_window_count(const tt_pool_dims *d, int32_t iy0, int32_t ix0)
{
    int32_t y0 = iy0 < 0 ? 0 : iy0, x0 = ix0 < 0 ? 0 : ix0;
    int32_t y1 = iy0 + d->filter_h, x1 = ix0 + d->filter_w;
    if (y1 > d->in_h) {
        y1 = d->in_h;
    }
    if (x1 > d->in_w) {
        x1 = d->in_w;
    }
    return (y1 - y0) * (x1 - x0);
}

/* Each output spreads dy / count (count = in-image taps, TFLite's divisor) over its window; taps outer like
 * grad_ops, so every dx element receives its shares in tap order. */
void tt_average_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, float *dx)
{
    int32_t i, b, oy, ox, c, ky, kx;
    const int32_t n_in = d->batches * d->in_h * d->in_w * d->channels;
    for (i = 0; i < n_in; ++i) {
        dx[i] = 0.0f;
    }
    for (ky = 0; ky < d->filter_h; ++ky) {
        for (kx = 0; kx < d->filter_w; ++kx) {
            for (b = 0; b < d->batches; ++b) {
                for (oy = 0; oy < d->out_h; ++oy) {
                    const int32_t iy0 = oy * d->stride_h - d->pad_top;
                    const int32_t iy = iy0 + ky;
                    if (iy < 0 || iy >= d->in_h) {
                        continue;
                    }
                    for (ox = 0; ox < d->out_w; ++ox) {
                        const int32_t ix0 = ox * d->stride_w - d->pad_left;
                        const int32_t ix = ix0 + kx;
                        float count;
                        const float *dyp;
                        float *dxp;
                        if (ix < 0 || ix >= d->in_w) {
                            continue;
                        }
                        count = (float)tt_window_count(d, iy0, ix0);
                        dyp = dy + ((b * d->out_h + oy) * d->out_w + ox) * d->channels;
                        dxp = dx + ((b * d->in_h + iy) * d->in_w + ix) * d->channels;
                        for (c = 0; c < d->channels; ++c) {
                            dxp[c] += dyp[c] / count;
                        }
                    }
                }
            }
        }
    }
}
