/* Kernels of the generated training program beyond tt_kernels.h (declarations and rules: tt_train_ops.h). */
#include "tt_train_ops.h"

#include <math.h>

/* ---- in-place depthwise (depth multiplier 1) ----------------------------------------------------------------
 * Output channel c reads only input channel c, and output element (pixel p, channel c) sits at p*C + c, an
 * element of channel c of the input too: so once channel c's outputs are all in scratch, copying them over the
 * buffer destroys no input another channel still needs, whatever the stride. */
void tt_depthwise_conv2d_s8_inplace(const tt_conv_dims *d, const tt_requant_s8 *q, int8_t *xy, const int8_t *w,
                                    const int32_t *bias, int8_t *scratch)
{
    int32_t b, c, p;
    const int32_t C = d->in_c, n_out = d->out_h * d->out_w;
    for (b = 0; b < d->batches; ++b) {
        const int8_t *x = xy + b * d->in_h * d->in_w * C;
        int8_t *y = xy + b * n_out * C;
        for (c = 0; c < C; ++c) {
            tt_depthwise_channel_s8(d, q, x + c, w + c, bias != 0 ? bias[c] : 0, c, scratch, 1);
            for (p = 0; p < n_out; ++p) {
                y[p * C + c] = scratch[p];
            }
        }
    }
}

void tt_depthwise_conv2d_f32_inplace(const tt_conv_dims *d, float act_min, float act_max, float *xy,
                                     const float *w, const float *bias, float *scratch)
{
    int32_t b, c, oy, ox, ky, kx;
    const int32_t C = d->in_c;
    for (b = 0; b < d->batches; ++b) {
        const float *x = xy + b * d->in_h * d->in_w * C;
        float *y = xy + b * d->out_h * d->out_w * C;
        for (c = 0; c < C; ++c) {
            for (oy = 0; oy < d->out_h; ++oy) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                for (ox = 0; ox < d->out_w; ++ox) {
                    const int32_t ix0 = ox * d->stride_w - d->pad_left;
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
                            acc += x[(iy * d->in_w + ix) * C + c] * w[(ky * d->k_w + kx) * C + c];
                        }
                    }
                    if (bias != 0) {
                        acc += bias[c];
                    }
                    if (acc < act_min) {
                        acc = act_min;
                    }
                    if (acc > act_max) {
                        acc = act_max;
                    }
                    scratch[oy * d->out_w + ox] = acc;
                }
            }
            for (oy = 0; oy < d->out_h * d->out_w; ++oy) {
                y[oy * C + c] = scratch[oy];
            }
        }
    }
}

/* ---- element-wise ------------------------------------------------------------------------------------------- */

void tt_sum_f32(int32_t n_inputs, const float *const *xs, int32_t n, float *y)
{
    int32_t i, j;
    for (i = 0; i < n; ++i) {
        float s = xs[0][i];
        for (j = 1; j < n_inputs; ++j) {
            s += xs[j][i];
        }
        y[i] = s;
    }
}

void tt_int8_clamp_grad_f32(int32_t n, int32_t lo, int32_t hi, const float *dy, const int8_t *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = ((int32_t)y[i] > lo && (int32_t)y[i] < hi) ? dy[i] : 0.0f;
    }
}

void tt_dequantize_slice_s8_f32(int32_t rows, int32_t depth, int32_t k, float scale, int32_t zero_point,
                                const int8_t *x, float *y)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < k; ++c) {
            y[r * k + c] = (float)((int32_t)x[r * depth + c] - zero_point) * scale;
        }
    }
}

void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx)
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
                    int32_t best_i = -1, best = 0;
                    for (ky = 0; ky < d->filter_h; ++ky) {
                        const int32_t iy = iy0 + ky;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->filter_w; ++kx) {
                            const int32_t ix = ix0 + kx;
                            int32_t idx;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            idx = ((b * d->in_h + iy) * d->in_w + ix) * d->channels + c;
                            if (best_i < 0 || (int32_t)x[idx] > best) {
                                best = x[idx];
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

int32_t tt_argmax_s8(int32_t n, const int8_t *x)
{
    int32_t i, best = 0;
    for (i = 1; i < n; ++i) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

int32_t tt_argmax_f32(int32_t n, const float *x)
{
    int32_t i, best = 0;
    for (i = 1; i < n; ++i) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

/* ---- QAS update ----------------------------------------------------------------------------------------------
 * Per element, in the order of stages/qas.py (each line one float32 rounding, as numpy does it). */
#define TT_DELTA_LIMIT 1099511627776.0f /* 2^40 */

static inline float tt_clip_delta(float v)
{
    if (v < -TT_DELTA_LIMIT) {
        return -TT_DELTA_LIMIT;
    }
    if (v > TT_DELTA_LIMIT) {
        return TT_DELTA_LIMIT;
    }
    return v;
}

/* round half away from zero of |v| <= 2^40 (qas.round_nearest: trunc, then the exact fraction). */
static inline int64_t tt_round_away(float v)
{
    const int64_t t = (int64_t)v;
    const float frac = v - (float)t;
    return t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
}

static inline int64_t tt_floor64(float v)
{
    const int64_t t = (int64_t)v;
    return ((float)t > v) ? t - 1 : t;
}

void tt_qas_update(const tt_qas_params *p, int32_t rows, int32_t cols, int32_t n, int32_t rows_per_channel,
                   int32_t scale_count, const float *scale, void *param, int32_t is_int32, const float *g,
                   float *state0, float *state1, float *master, uint32_t *rng)
{
    int32_t r, j;
    int8_t *p8 = (int8_t *)param;
    int32_t *p32 = (int32_t *)param;
    for (r = 0; r < rows; ++r) {
        for (j = 0; j < n; ++j) {
            const int32_t k = r * n + j;
            const int32_t at = r * cols + j;
            const int32_t ch = scale_count == 1 ? 0 : (rows_per_channel > 0 ? r / rows_per_channel : j);
            const float s = scale[ch];
            const int64_t cur_int = is_int32 ? (int64_t)p32[at] : (int64_t)p8[at];
            const float cur = master != 0 ? master[k] : (float)cur_int;
            float gg = g[k] * p->batch_scale;
            float d, delta;
            int64_t v;
            if (p->qas) {
                if (p->weight_decay != 0.0f) {
                    gg = gg + p->weight_decay * (s * cur);
                }
            } else {
                gg = gg * s;
                if (p->weight_decay != 0.0f) {
                    gg = gg + p->weight_decay * cur;
                }
            }
            switch (p->kind) {
            case TT_OPT_MOMENTUM:
                state0[k] = state0[k] * p->momentum;
                state0[k] = state0[k] + gg;
                d = p->lr * state0[k];
                break;
            case TT_OPT_ADAM: {
                float denom;
                state0[k] = state0[k] + (gg - state0[k]) * p->one_minus_beta1;
                state1[k] = state1[k] * p->beta2;
                state1[k] = state1[k] + p->one_minus_beta2 * gg * gg;
                denom = sqrtf(state1[k]) / p->sqrt_bc2 + p->eps;
                d = p->lr_over_bc1 * state0[k] / denom;
                break;
            }
            case TT_OPT_RMSPROP:
                state0[k] = state0[k] * p->alpha;
                state0[k] = state0[k] + p->one_minus_alpha * gg * gg;
                d = p->lr * gg / (sqrtf(state0[k]) + p->eps);
                break;
            default:
                d = p->lr * gg;
                break;
            }
            delta = p->qas ? (-d) / s : -d;
            if (master != 0) {
                master[k] = master[k] + delta;
                v = master[k] != master[k] ? cur_int : tt_round_away(tt_clip_delta(master[k]));
            } else if (delta != delta) {
                v = cur_int; /* NaN: the parameter keeps its value (the loss check stops training) */
            } else if (p->rounding == TT_ROUND_STOCHASTIC) {
                const float u = (float)(tt_xorshift32(rng) >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
                v = cur_int + tt_floor64(tt_clip_delta(delta) + u);
            } else {
                v = cur_int + tt_round_away(tt_clip_delta(delta));
            }
            if (v < p->lo) {
                v = p->lo;
            }
            if (v > p->hi) {
                v = p->hi;
            }
            if (is_int32) {
                p32[at] = (int32_t)v;
            } else {
                p8[at] = (int8_t)v;
            }
        }
    }
}
