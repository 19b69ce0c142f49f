/* Element-wise ops: add, relu/relu6 (standalone), quantize / requantize / dequantize; int8 and float32. */
#include "tt_kernels.h"

#include <math.h>

/* add.cc / reference_integer_ops::AddElementwise (8-bit general path), as executor._add. */
void tt_add_s8(const tt_add_params_s8 *p, int32_t n, const int8_t *a, const int8_t *b, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        /* |x - z| <= 255, times 2^20 < 2^31: the shift cannot overflow. */
        const int32_t v1 = tt_wrap_shl32((int32_t)a[i] - p->input1_zero_point, (int)p->left_shift);
        const int32_t v2 = tt_wrap_shl32((int32_t)b[i] - p->input2_zero_point, (int)p->left_shift);
        const int32_t r1 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(v1, p->input1_multiplier,
                                                                                    (int)p->input1_shift);
        const int32_t r2 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(v2, p->input2_multiplier,
                                                                                    (int)p->input2_shift);
        const int32_t raw = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(
                                tt_wrap_add32(r1, r2), p->output_multiplier, (int)p->output_shift) +
                            p->output_zero_point;
        y[i] = (int8_t)tt_clamp32(raw, p->act_min, p->act_max);
    }
}

void tt_add_f32(int32_t n, float act_min, float act_max, const float *a, const float *b, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        float v = a[i] + b[i];
        if (v < act_min) {
            v = act_min;
        }
        if (v > act_max) {
            v = act_max;
        }
        y[i] = v;
    }
}

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
        float v = x[i];
        if (v < lo) {
            v = lo;
        }
        if (v > hi) {
            v = hi;
        }
        y[i] = v;
    }
}

/* reference_ops::AffineQuantize: TfLiteRound(x / scale) + zp in float32; roundf rounds ties away from zero like
 * TfLiteRound (executor._round_half_away_f32). The value is clamped in float before the int conversion so that
 * huge or infinite inputs stay defined (same result as clamping after). NaN maps to the zero point + 0. */
void tt_quantize_f32_s8(int32_t n, float scale, int32_t zero_point, const float *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        float r = roundf(x[i] / scale);
        int32_t v;
        if (r != r) {
            r = 0.0f;
        }
        if (r < -512.0f) {
            r = -512.0f;
        }
        if (r > 512.0f) {
            r = 512.0f;
        }
        v = (int32_t)r + zero_point;
        y[i] = (int8_t)tt_clamp32(v, -128, 127);
    }
}

void tt_requantize_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier,
                      int32_t shift, const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = tt_multiply_by_quantized_multiplier((int32_t)x[i] - input_zero_point, multiplier,
                                                              (int)shift) +
                          output_zero_point;
        y[i] = (int8_t)tt_clamp32(v, -128, 127);
    }
}

/* reference_ops::Dequantize: static_cast<float>(double(scale) * (x - zp)). */
void tt_dequantize_s8_f32(int32_t n, float scale, int32_t zero_point, const int8_t *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = (float)((double)scale * (double)((int32_t)x[i] - zero_point));
    }
}

void tt_dequantize_per_channel_s8_f32(int32_t outer, int32_t channels, int32_t inner, const float *scale,
                                      const int32_t *zero_point, const int8_t *x, float *y)
{
    int32_t o, c, i;
    for (o = 0; o < outer; ++o) {
        for (c = 0; c < channels; ++c) {
            const int32_t base = (o * channels + c) * inner;
            for (i = 0; i < inner; ++i) {
                y[base + i] = (float)((double)scale[c] * (double)((int32_t)x[base + i] - zero_point[c]));
            }
        }
    }
}
