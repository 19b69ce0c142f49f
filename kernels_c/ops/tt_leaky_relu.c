/* leaky_relu: int8 and float32, and leaky_relu_grad (conventions: ops/tt_logistic.c's header). */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* int8 LEAKY_RELU: x - z_in >= 0 requantized by QuantizeMultiplier(f32(s_in / s_out)), below by
 * QuantizeMultiplier(f32(f32(s_in * alpha) / s_out)) (LeakyReluPrepare's float ratios), + z_out, int8 range. */
void tt_leaky_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier_identity,
                      int32_t shift_identity, int32_t multiplier_alpha, int32_t shift_alpha, const int8_t *x,
                      int8_t *y);
/* x > 0 ? x : x * alpha. */
void tt_leaky_relu_f32(int32_t n, float alpha, const float *x, float *y);
void tt_leaky_relu_grad_f32(int32_t n, float alpha, const float *dy, const float *x, float *dx);
#endif /* TT_INTERFACE */

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

void tt_leaky_relu_grad_f32(int32_t n, float alpha, const float *dy, const float *x, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = x[i] > 0.0f ? dy[i] : dy[i] * alpha;
    }
}
