/* pad: int8 and float32, and pad_grad. */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* PAD of a rank-4 tensor (lower ranks: leading 1s). pads[2*d], pads[2*d+1] = before, after of dim d. */
void tt_pad_s8(const int32_t in_shape[4], const int32_t pads[8], int8_t value, const int8_t *x, int8_t *y);
void tt_pad_f32(const int32_t in_shape[4], const int32_t pads[8], float value, const float *x, float *y);
/* in_shape is the forward input's (dx's) shape; dy has the padded shape. */
void tt_pad_grad_f32(const int32_t in_shape[4], const int32_t pads[8], const float *dy, float *dx);
#endif /* TT_INTERFACE */

/* Rank-4 PAD; quantized PAD pads with the output zero point, float with 0.0 (the caller passes `value`). */
#define TT_PAD_BODY                                                                                                \
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];                                                           \
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];                                                           \
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];                                                           \
    const int32_t o0 = in_shape[0] + pads[0] + pads[1];                                                           \
    int32_t i0, i1, i2, i3;                                                                                        \
    for (i0 = 0; i0 < o0; ++i0) {                                                                                  \
        const int32_t s0 = i0 - pads[0];                                                                           \
        for (i1 = 0; i1 < o1; ++i1) {                                                                              \
            const int32_t s1 = i1 - pads[2];                                                                       \
            for (i2 = 0; i2 < o2; ++i2) {                                                                          \
                const int32_t s2 = i2 - pads[4];                                                                   \
                const int32_t row_in = s0 >= 0 && s0 < in_shape[0] && s1 >= 0 && s1 < in_shape[1] && s2 >= 0 &&    \
                                       s2 < in_shape[2];                                                           \
                for (i3 = 0; i3 < o3; ++i3) {                                                                      \
                    const int32_t s3 = i3 - pads[6];                                                               \
                    const int32_t o = ((i0 * o1 + i1) * o2 + i2) * o3 + i3;                                        \
                    if (row_in && s3 >= 0 && s3 < in_shape[3]) {                                                   \
                        y[o] = x[((s0 * in_shape[1] + s1) * in_shape[2] + s2) * in_shape[3] + s3];                 \
                    } else {                                                                                       \
                        y[o] = value;                                                                              \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

void tt_pad_s8(const int32_t in_shape[4], const int32_t pads[8], int8_t value, const int8_t *x, int8_t *y)
{
    TT_PAD_BODY
}

void tt_pad_f32(const int32_t in_shape[4], const int32_t pads[8], float value, const float *x, float *y)
{
    TT_PAD_BODY
}

#undef TT_PAD_BODY

void tt_pad_grad_f32(const int32_t in_shape[4], const int32_t pads[8], const float *dy, float *dx)
{
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < in_shape[0]; ++i0) {
        for (i1 = 0; i1 < in_shape[1]; ++i1) {
            for (i2 = 0; i2 < in_shape[2]; ++i2) {
                const float *src = dy + (((i0 + pads[0]) * o1 + i1 + pads[2]) * o2 + i2 + pads[4]) * o3 + pads[6];
                float *dst = dx + ((i0 * in_shape[1] + i1) * in_shape[2] + i2) * in_shape[3];
                for (i3 = 0; i3 < in_shape[3]; ++i3) {
                    dst[i3] = src[i3];
                }
            }
        }
    }
}
