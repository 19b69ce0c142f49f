/* average_pool2d: int8 and float32, and average_pool2d_grad.
 *
 * average_pool2d, max_pool2d and mean over H,W; int8 and float32 (executor._average_pool2d, _max_pool2d, _mean).
 * Windows are visited row by row (filter y, then filter x) like the reference kernels; out-of-image taps are
 * skipped and the average divides by the number of in-image taps. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"
#include "tt_pool_window.h"

#ifdef TT_INTERFACE
/* reference_integer_ops::AveragePool: sum of in-image taps / their count, rounded half away from zero. */
void tt_average_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);
void tt_average_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
void tt_average_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, float *dx);
#endif /* TT_INTERFACE */

void tt_average_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y)
{
    int32_t b, oy, ox, c, iy, ix;
    tt_pool_window w;
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        const int32_t count = tt_pool_window_count(&w);
        int32_t acc = 0, avg;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            acc += x[TT_POOL_IN(d, b, iy, ix, c)];
        }
        /* Round half away from zero with C's truncating division (reference AveragePool). */
        avg = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
        y[TT_POOL_OUT(d, b, oy, ox, c)] = (int8_t)tt_clamp32(avg, act_min, act_max);
    }
}

void tt_average_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y)
{
    int32_t b, oy, ox, c, iy, ix;
    tt_pool_window w;
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        float acc = 0.0f;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            acc += x[TT_POOL_IN(d, b, iy, ix, c)];
        }
        y[TT_POOL_OUT(d, b, oy, ox, c)] = tt_act_clamp(acc / (float)tt_pool_window_count(&w), act_min, act_max);
    }
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
                        tt_pool_window win;
                        float count;
                        const float *dyp;
                        float *dxp;
                        if (ix < 0 || ix >= d->in_w) {
                            continue;
                        }
                        win = tt_pool_window_at(d, oy, ox);
                        count = (float)tt_pool_window_count(&win);
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
