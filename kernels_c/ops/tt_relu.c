/* relu and relu6 (the standalone clamps): int8 requantize-and-clamp, float32 clamp, fp16-mixed forms. */
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
/* fp16-mixed (issue 13, OpDef.fp16_operands / fp16_output): x read as fp32 (xf) or fp16 (xh, widened: exact), y
 * written as fp32 (yf) or fp16 (yh, rounded once on store): the bits of tt_clamp_f32 on the widened x followed by
 * tt_round_f16. The other pointer of each pair is 0. y may start where x does in every form: a y no wider than x is
 * written behind what is read (ascending), an fp32 y over an fp16 x from the end (element i covers x's 2i, 2i + 1,
 * already read). */
void tt_clamp_f16(int32_t n, float lo, float hi, const float *xf, const uint16_t *xh, float *yf, uint16_t *yh);
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

void tt_clamp_f16(int32_t n, float lo, float hi, const float *xf, const uint16_t *xh, float *yf, uint16_t *yh)
{
    int32_t i;
    if (xh != 0 && yf != 0) { /* widening: from the end, so that in place each y covers x already read */
        for (i = n - 1; i >= 0; --i) {
            yf[i] = tt_act_clamp(tt_f16_read(xh[i]), lo, hi);
        }
    } else if (xh != 0) {
        for (i = 0; i < n; ++i) {
            yh[i] = tt_f16_narrow(tt_act_clamp(tt_f16_read(xh[i]), lo, hi));
        }
    } else if (yh != 0) {
        for (i = 0; i < n; ++i) {
            yh[i] = tt_f16_narrow(tt_act_clamp(xf[i], lo, hi));
        }
    } else {
        tt_clamp_f32(n, lo, hi, xf, yf);
    }
}
