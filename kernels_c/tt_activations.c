/* Activations added for converter models: LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU, PRELU, int8 and float32, and
 * their backward (grad_ops.logistic_grad, tanh_grad, hard_swish_grad, leaky_relu_grad, prelu_grad).
 *
 * int8 follows the executor's default mode (fc_requant="fixed_point"), i.e. TFLite Micro: LOGISTIC / TANH through
 * gemmlowp fixed point (int8_arith.logistic_int8_fixed / tanh_int8_fixed), HARD_SWISH in 16-bit fixed point
 * (int8_arith.hard_swish_int8), LEAKY_RELU and PRELU with two requantizations. Every multiplier is computed by
 * codegen (stages/int8_arith.py); the kernels only do the integer work, so they are bit-exact with the executor.
 * y may equal x in every element-wise kernel here (each element is read before it is written). */
#include "tt_gemmlowp.h"
#include "tt_kernels.h"
#include "tt_math.h"

/* ---- LOGISTIC / TANH ----------------------------------------------------------------------------------------- */

static inline int32_t tt_neg32(int32_t a) { return tt_wrap_sub32(0, a); }

/* gemmlowp::logistic(FixedPoint<int32, 4>) -> Q0.31 (int8_arith.gemmlowp_logistic). */
static int32_t tt_gemmlowp_logistic_q4(int32_t a)
{
    int32_t abs_a, on_positive;
    if (a == 0) {
        return (int32_t)1 << 30;
    }
    abs_a = a > 0 ? a : tt_neg32(a);
    on_positive = tt_one_over_one_plus_x_for_x_in_0_1(tt_exp_on_negative_values(tt_neg32(abs_a), 4));
    return a > 0 ? on_positive : tt_wrap_sub32(TT_INT32_MAX, on_positive);
}

/* gemmlowp::tanh(FixedPoint<int32, 4>) -> Q0.31 (int8_arith.gemmlowp_tanh): e^{2n} for n = -|a| is
 * exp_on_negative_values of the same raw value read with 5 integer bits. */
static int32_t tt_gemmlowp_tanh_q4(int32_t a)
{
    int32_t t;
    if (a == 0) {
        return 0;
    }
    t = tt_one_minus_x_over_one_plus_x_for_x_in_0_1(tt_exp_on_negative_values(a < 0 ? a : tt_neg32(a), 5));
    return a < 0 ? tt_neg32(t) : t;
}

void tt_logistic_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                    const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = (int32_t)x[i] - input_zero_point;
        int32_t out;
        if (v <= -radius) {
            out = -128;
        } else if (v >= radius) {
            out = 127;
        } else {
            const int32_t q4 = tt_multiply_by_quantized_multiplier(v, multiplier, (int)left_shift);
            out = tt_clamp32(tt_rounding_divide_by_pot(tt_gemmlowp_logistic_q4(q4), 31 - 8) - 128, -128, 127);
        }
        y[i] = (int8_t)out;
    }
}

void tt_tanh_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = (int32_t)x[i] - input_zero_point;
        int32_t out;
        if (v <= -radius) {
            out = -128;
        } else if (v >= radius) {
            out = 127;
        } else {
            const int32_t q4 = tt_multiply_by_quantized_multiplier(v, multiplier, (int)left_shift);
            out = tt_clamp32(tt_rounding_divide_by_pot(tt_gemmlowp_tanh_q4(q4), 31 - 7), -128, 127);
        }
        y[i] = (int8_t)out;
    }
}

/* reference_ops::Logistic (executor._logistic): 1 above 16.619047, exp(x) below -9, else 1 / (1 + exp(-x)). */
void tt_logistic_f32(int32_t n, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        float r;
        if (v > 16.619047164916992188f) {
            r = 1.0f;
        } else if (v < -9.0f) {
            r = tt_expf(v);
        } else {
            r = 1.0f / (1.0f + tt_expf(-v));
        }
        y[i] = r;
    }
}

void tt_tanh_f32(int32_t n, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = tt_tanhf(x[i]);
    }
}

/* ---- HARD_SWISH (reference_ops::HardSwish<int8_t>, int8_arith.hard_swish_int8) ------------------------------- */

static inline int32_t tt_wrap16(int32_t x) { return (int32_t)(int16_t)(uint16_t)(uint32_t)x; }

static inline int32_t tt_sat16(int64_t x)
{
    return x < -32768 ? -32768 : (x > 32767 ? 32767 : (int32_t)x);
}

/* gemmlowp SaturatingRoundingDoublingHighMul<int16_t> (C division truncates, as the reference). */
static inline int32_t tt_srdhm16(int32_t a, int32_t b)
{
    int32_t ab;
    if (a == b && a == -32768) {
        return 32767;
    }
    ab = a * b;
    return tt_wrap16((ab + (ab >= 0 ? (1 << 14) : (1 - (1 << 14)))) / (1 << 15));
}

/* reference_ops::SaturatingDoublingHighMul (int16, truncating: SQDMULH). */
static inline int32_t tt_sdhm16(int32_t a, int32_t b)
{
    if (a == b && a == -32768) {
        return 32767;
    }
    return tt_wrap16((a * b) / (1 << 15));
}

void tt_hard_swish_s8(const tt_hard_swish_params_s8 *p, int32_t n, const int8_t *x, int8_t *y)
{
    const int32_t re = p->reluish_multiplier_exponent;
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = tt_wrap16((int32_t)x[i] - p->input_zero_point);
        const int32_t hires = tt_wrap16(v * (1 << 7));
        const int32_t preshift_out = tt_srdhm16(hires, p->output_multiplier_fixedpoint_int16);
        int32_t reluish = hires, pre, out;
        if (re > 0) {
            reluish = tt_sat16((int64_t)reluish * ((int64_t)1 << (re - 1)));
        }
        reluish = tt_srdhm16(reluish, p->reluish_multiplier_fixedpoint_int16);
        if (re > 0) {
            reluish = tt_sat16((int64_t)reluish * 2);
        }
        if (re < 0) {
            reluish = tt_rounding_divide_by_pot(reluish, (int)-re);
        }
        /* (reluish + 2^15) / 2: the sum is >= 0, so the shift is a floor division as in the reference. */
        reluish = tt_wrap16((reluish + (1 << 15)) >> 1);
        pre = tt_sdhm16(reluish, preshift_out);
        out = tt_wrap16(tt_rounding_divide_by_pot(pre, (int)-p->output_multiplier_exponent) + p->output_zero_point);
        y[i] = (int8_t)tt_clamp32(out, -128, 127);
    }
}

/* reference_ops::HardSwish float: x * min(6, max(0, x + 3)) / 6, in this order. */
void tt_hard_swish_f32(int32_t n, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        float r = v + 3.0f;
        r = r > 0.0f ? r : 0.0f;
        r = r < 6.0f ? r : 6.0f;
        y[i] = (v * r) / 6.0f;
    }
}

/* ---- LEAKY_RELU / PRELU -------------------------------------------------------------------------------------- */

/* reference_ops::QuantizeLeakyRelu: x - z_in >= 0 rescaled by (m_identity, s_identity), below by (m_alpha, s_alpha). */
void tt_leaky_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier_identity,
                      int32_t shift_identity, int32_t multiplier_alpha, int32_t shift_alpha, const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = (int32_t)x[i] - input_zero_point;
        const int32_t r = v >= 0 ? tt_multiply_by_quantized_multiplier(v, multiplier_identity, (int)shift_identity)
                                 : tt_multiply_by_quantized_multiplier(v, multiplier_alpha, (int)shift_alpha);
        y[i] = (int8_t)tt_clamp32(r + output_zero_point, -128, 127);
    }
}

void tt_leaky_relu_f32(int32_t n, float alpha, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : v * alpha;
    }
}

#define TT_BC_OFF(s, i0, i1, i2, i3) ((i0) * (s)[0] + (i1) * (s)[1] + (i2) * (s)[2] + (i3) * (s)[3])

/* reference_ops::BroadcastPrelu4D: x (a_stride) against alpha broadcast (b_stride). The negative side multiplies
 * (x - z_x) (alpha - z_alpha), at most 255 * 255: no overflow. */
void tt_prelu_s8(const tt_prelu_params_s8 *p, const tt_broadcast *bc, const int8_t *x, const int8_t *alpha,
                 int8_t *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t xi = (int32_t)x[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)] - p->input_zero_point;
                    int32_t r;
                    if (xi >= 0) {
                        r = tt_multiply_by_quantized_multiplier(xi, p->multiplier_pos, (int)p->shift_pos);
                    } else {
                        const int32_t ai = (int32_t)alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)] -
                                           p->alpha_zero_point;
                        r = tt_multiply_by_quantized_multiplier(xi * ai, p->multiplier_neg, (int)p->shift_neg);
                    }
                    y[k++] = (int8_t)tt_clamp32(r + p->output_zero_point, -128, 127);
                }
            }
        }
    }
}

void tt_prelu_f32(const tt_broadcast *bc, const float *x, const float *alpha, float *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const float v = x[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)];
                    y[k++] = v >= 0.0f ? v : v * alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                }
            }
        }
    }
}

/* ---- backward (from the forward output y: logistic, tanh; from the input x: the rest) ------------------------ */

/* dy * (1 - y) * y, left to right like grad_ops.logistic_grad. dx may be dy. */
void tt_logistic_grad_f32(int32_t n, const float *dy, const float *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = dy[i] * (1.0f - y[i]) * y[i];
    }
}

void tt_tanh_grad_f32(int32_t n, const float *dy, const float *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
    }
}

/* 0 for x <= -3, dy for x >= 3, dy * (x / 3 + 1/2) between (PyTorch's kinks, grad_ops.hard_swish_grad). */
void tt_hard_swish_grad_f32(int32_t n, const float *dy, const float *x, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        dx[i] = v <= -3.0f ? 0.0f : (v < 3.0f ? dy[i] * (v / 3.0f + 0.5f) : dy[i]);
    }
}

void tt_leaky_relu_grad_f32(int32_t n, float alpha, const float *dy, const float *x, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = x[i] > 0.0f ? dy[i] : dy[i] * alpha;
    }
}

/* x > 0 ? dy : alpha * dy (the slope at the kink is alpha, as PyTorch); dy, x, dx full-shape (a_stride). */
void tt_prelu_grad_f32(const tt_broadcast *bc, const float *dy, const float *x, const float *alpha, float *dx)
{
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t k = TT_BC_OFF(bc->a_stride, i0, i1, i2, i3);
                    dx[k] = x[k] > 0.0f ? dy[k] : dy[k] * alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                }
            }
        }
    }
}
