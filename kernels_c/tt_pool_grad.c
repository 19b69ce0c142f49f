/* Backward of average_pool2d, max_pool2d, mean over H,W (grad_ops.average_pool2d_grad, max_pool2d_grad,
 * mean_grad). */
#include "tt_kernels.h"

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

void tt_mean_hw_grad_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, float *dx)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        for (i = 0; i < count; ++i) {
            for (ch = 0; ch < c; ++ch) {
                dx[(b * count + i) * c + ch] = dy[b * c + ch] / (float)count;
            }
        }
    }
}
