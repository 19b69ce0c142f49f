/* quantize: float32 -> int8 and int8 -> int8 (requantize). */
#include "tt_kernels.h"

#include <math.h>

#ifdef TT_INTERFACE
/* QUANTIZE float -> int8: AffineQuantize, roundf(x / scale) (float32 division, ties away) + zp, clamped. */
void tt_quantize_f32_s8(int32_t n, float scale, int32_t zero_point, const float *x, int8_t *y);
/* QUANTIZE int8 -> int8: MultiplyByQuantizedMultiplier(x - z_in, QuantizeMultiplier(s_in / s_out)) + z_out. */
void tt_requantize_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier,
                      int32_t shift, const int8_t *x, int8_t *y);
#endif /* TT_INTERFACE */

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
