/* relu and relu6 (the standalone clamps): int8 requantize-and-clamp, float32 clamp. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* Standalone RELU / RELU6 (activations.cc QuantizedReluX): requantize from the input's to the output's params
 * (multiplier/shift = QuantizeMultiplier(s_x / s_y)) and clamp to [qlo, qhi] (int8_arith.relu_op_range). */
void tt_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier, int32_t shift,
                int32_t qlo, int32_t qhi, const int8_t *x, int8_t *y);
/* RELU / RELU6 / any clamp, element-wise (y may equal x). */
void tt_clamp_f32(int32_t n, float lo, float hi, const float *x, float *y);
/* fp16-mixed (issue 13): tt_clamp_f32 writing an fp16 y, rounded once on store (the bits of tt_clamp_f32 +
 * tt_round_f16); y may start where x does (it writes behind what it reads). */
void tt_clamp_f32_hy(int32_t n, float lo, float hi, const float *x, uint16_t *y);
#endif /* TT_INTERFACE */

/* activations.cc QuantizedReluX, as executor._relu_common. */
void tt_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier, int32_t shift,
                int32_t qlo, int32_t qhi, const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = output_zero_point +
                          tt_multiply_by_quantized_multiplier((int32_t)x[i] - input_zero_point, multiplier, (int)shift);
        y[i] = (int8_t)tt_clamp32(v, qlo, qhi);
    }
}

void tt_clamp_f32(int32_t n, float lo, float hi, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = tt_act_clamp(x[i], lo, hi);
    }
}

void tt_clamp_f32_hy(int32_t n, float lo, float hi, const float *x, uint16_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = tt_f16_narrow(tt_act_clamp(x[i], lo, hi));
    }
}
