/* tanh: int8 and float32, and tanh_grad (conventions: ops/tt_logistic.c's header). */
#include "tt_sigmoid_s8.h"
#include "tt_kernels.h"
#include "tt_math.h"

#ifdef TT_INTERFACE
/* int8 TANH (output (1/128, 0)): the parameters and saturation as tt_logistic_s8's; float tanh; tanh_grad from the
 * forward output y: dy (1 - y^2), dx may be dy. */
void tt_tanh_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                const int8_t *x, int8_t *y);
void tt_tanh_f32(int32_t n, const float *x, float *y);
void tt_tanh_grad_f32(int32_t n, const float *dy, const float *y, float *dx);
#endif /* TT_INTERFACE */

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

void tt_tanh_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                const int8_t *x, int8_t *y)
{
    tt_sigmoid_like_s8(n, input_zero_point, multiplier, left_shift, radius, tt_gemmlowp_tanh_q4, 31 - 7, 0, x, y);
}

void tt_tanh_f32(int32_t n, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = tt_tanhf(x[i]);
    }
}

void tt_tanh_grad_f32(int32_t n, const float *dy, const float *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
    }
}
