/* max_pool2d: int8 and float32, and max_pool2d_grad (float or int8 forward input); conventions:
 * ops/tt_average_pool2d.c's header. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"

#include <float.h>

#ifdef TT_INTERFACE
void tt_max_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);
void tt_max_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
/* All of dy goes to the window's first maximum in row-major tap order (strict >). */
void tt_max_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, const float *x, float *dx);
/* the same with the int8 forward input (ties: first maximum in row-major tap order, strict >) */
void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx);
#endif /* TT_INTERFACE */

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
                        tt_act_clamp(best, act_min, act_max);
                }
            }
        }
    }
}

/* The forward input of a max pool is float32 or int8; int8 -> float is exact and keeps the order, so one window
 * search serves both and picks the same tap. */
static float tt__pool_in(const void *x, int32_t idx, int32_t is_s8)
{
    return is_s8 ? (float)((const int8_t *)x)[idx] : ((const float *)x)[idx];
}

/* All of dy goes to the window's first maximum in row-major tap order (strict >: ties keep the earlier tap),
 * as TFLite and PyTorch pick it. */
static void tt__max_pool2d_grad(const tt_pool_dims *d, const float *dy, const void *x, int32_t is_s8, float *dx)
{
    int32_t i, b, oy, ox, c, ky, kx;
    const int32_t n_in = d->batches * d->in_h * d->in_w * d->channels;
    for (i = 0; i < n_in; ++i) {
        dx[i] = 0.0f;
    }
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                for (c = 0; c < d->channels; ++c) {
                    int32_t best_i = -1;
                    float best = 0.0f;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            int32_t idx;
                            float v;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            idx = ((b * d->in_h + iy) * d->in_w + ix) * d->channels + c;
                            v = tt__pool_in(x, idx, is_s8);
                            if (best_i < 0 || v > best) {
                                best = v;
                                best_i = idx;
                            }
                        }
                    }
                    if (best_i >= 0) {
                        dx[best_i] += dy[((b * d->out_h + oy) * d->out_w + ox) * d->channels + c];
                    }
                }
            }
        }
    }
}

void tt_max_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, const float *x, float *dx)
{
    tt__max_pool2d_grad(d, dy, x, 0, dx);
}

void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx)
{
    tt__max_pool2d_grad(d, dy, x, 1, dx);
}
