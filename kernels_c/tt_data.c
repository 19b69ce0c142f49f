/* Data movement: pad, concatenation, reshape copy (executor._pad, _concatenation, _reshape). */
#include "tt_kernels.h"

#include <math.h>
#include <string.h>

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

void tt_concatenation_s8(int32_t n_inputs, const int8_t *const *inputs, const int32_t *inner_sizes, int32_t outer,
                         const tt_concat_params_s8 *q, int8_t *y)
{
    int32_t total = 0, o, i, j;
    for (i = 0; i < n_inputs; ++i) {
        total += inner_sizes[i];
    }
    for (o = 0; o < outer; ++o) {
        int8_t *yo = y + o * total;
        for (i = 0; i < n_inputs; ++i) {
            const int32_t len = inner_sizes[i];
            const int8_t *xi = inputs[i] + o * len;
            if (q == 0) {
                memcpy(yo, xi, (size_t)len);
            } else if (q->input_scale[i] == q->output_scale && q->input_zero_point[i] == q->output_zero_point) {
                for (j = 0; j < len; ++j) {
                    yo[j] = (int8_t)tt_clamp32(xi[j], q->act_min, q->act_max);
                }
            } else {
                /* reference_ops::ConcatenationWithScaling, float32 (executor._concatenation). */
                const float inv = 1.0f / q->output_scale;
                const float scale = q->input_scale[i] * inv;
                const float bias = (float)(-q->input_zero_point[i]) * scale;
                for (j = 0; j < len; ++j) {
                    const float r = roundf((float)xi[j] * scale + bias);
                    int32_t v = (r < -1024.0f ? -1024 : (r > 1024.0f ? 1024 : (int32_t)r)) + q->output_zero_point;
                    v = tt_clamp32(v, -128, 127);
                    yo[j] = (int8_t)tt_clamp32(v, q->act_min, q->act_max);
                }
            }
            yo += len;
        }
    }
}

void tt_concatenation_f32(int32_t n_inputs, const float *const *inputs, const int32_t *inner_sizes, int32_t outer,
                          float act_min, float act_max, float *y)
{
    int32_t total = 0, o, i, j;
    for (i = 0; i < n_inputs; ++i) {
        total += inner_sizes[i];
    }
    for (o = 0; o < outer; ++o) {
        float *yo = y + o * total;
        for (i = 0; i < n_inputs; ++i) {
            const int32_t len = inner_sizes[i];
            const float *xi = inputs[i] + o * len;
            for (j = 0; j < len; ++j) {
                float v = xi[j];
                if (v < act_min) {
                    v = act_min;
                }
                if (v > act_max) {
                    v = act_max;
                }
                yo[j] = v;
            }
            yo += len;
        }
    }
}

void tt_copy_s8(int32_t n, const int8_t *x, int8_t *y)
{
    if (x != y) {
        memmove(y, x, (size_t)n);
    }
}

void tt_copy_f32(int32_t n, const float *x, float *y)
{
    if (x != y) {
        memmove(y, x, (size_t)n * sizeof(float));
    }
}
