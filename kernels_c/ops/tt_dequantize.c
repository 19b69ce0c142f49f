/* dequantize: int8 -> float32, per tensor and per channel. */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* DEQUANTIZE: (float)((double)scale * (x - zp)), per tensor. */
void tt_dequantize_s8_f32(int32_t n, float scale, int32_t zero_point, const int8_t *x, float *y);
/* Per channel along an axis: x viewed as [outer, channels, inner]. */
void tt_dequantize_per_channel_s8_f32(int32_t outer, int32_t channels, int32_t inner, const float *scale,
                                      const int32_t *zero_point, const int8_t *x, float *y);
#endif /* TT_INTERFACE */

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
