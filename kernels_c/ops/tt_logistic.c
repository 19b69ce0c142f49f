/* logistic: int8 and float32, and logistic_grad.
 *
 * Activations added for converter models: LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU, PRELU, int8 and float32, and
 * their backward (grad_ops.logistic_grad, tanh_grad, hard_swish_grad, leaky_relu_grad, prelu_grad).
 *
 * int8 follows the executor's default mode (fc_requant="fixed_point"), i.e. TFLite Micro: LOGISTIC / TANH through
 * gemmlowp fixed point (int8_arith.logistic_int8_fixed / tanh_int8_fixed), HARD_SWISH in 16-bit fixed point
 * (int8_arith.hard_swish_int8), LEAKY_RELU and PRELU with two requantizations. Every multiplier is computed by
 * codegen (stages/golden/int8_arith.py); the kernels only do the integer work, so they are bit-exact with the executor.
 * y may equal x in every element-wise kernel here (each element is read before it is written). */
#include "tt_sigmoid_s8.h"
#include "tt_kernels.h"
#include "tt_math.h"

#ifdef TT_INTERFACE
/* int8 LOGISTIC (output (1/256, -128)) and TANH (output (1/128, 0)): TFLite Micro's reference_integer_ops, gemmlowp
 * fixed point. multiplier / left_shift / radius = int8_arith.logistic_tanh_params(s_in); |x - z_in| >= radius
 * saturates. */
void tt_logistic_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                    const int8_t *x, int8_t *y);
/* 1 above 16.619047, exp(x) below -9, else 1 / (1 + exp(-x)) (reference_ops::Logistic). */
void tt_logistic_f32(int32_t n, const float *x, float *y);
/* From the forward output y: logistic dy (1 - y) y; tanh dy (1 - y^2). dx may be dy. */
void tt_logistic_grad_f32(int32_t n, const float *dy, const float *y, float *dx);
#endif /* TT_INTERFACE */

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

void tt_logistic_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                    const int8_t *x, int8_t *y)
{
    tt_sigmoid_like_s8(n, input_zero_point, multiplier, left_shift, radius, tt_gemmlowp_logistic_q4, 31 - 8, -128, x, y);
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

/* ---- backward (from the forward output y: logistic, tanh; from the input x: the rest) ------------------------ */

/* dy * (1 - y) * y, left to right like grad_ops.logistic_grad. dx may be dy. */
void tt_logistic_grad_f32(int32_t n, const float *dy, const float *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = dy[i] * (1.0f - y[i]) * y[i];
    }
}
