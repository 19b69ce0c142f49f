/* concatenation: int8 (with requantization) and float32, and concatenation_grad. */
#include "tt_act_clamp.h"
#include "tt_kernels.h"

#include <math.h>
#include <string.h>

#ifdef TT_INTERFACE
/* CONCATENATION: tensors viewed as [outer, inner_i] with inner_i = axis extent * product of the later dims.
 * q == NULL: every input has the output's parameters and there is no fused activation (a pure copy).
 * Otherwise inputs with different (scale, zero point) are rescaled as ConcatenationWithScaling does (float32
 * math: scale = s_i * (1/s_o), bias = -z_i * scale, roundf(x*scale + bias) + z_o), then the act clamp. */
typedef struct {
    const float *input_scale;
    const int32_t *input_zero_point;
    float output_scale;
    int32_t output_zero_point;
    int32_t act_min, act_max;
} tt_concat_params_s8;
void tt_concatenation_s8(int32_t n_inputs, const int8_t *const *inputs, const int32_t *inner_sizes, int32_t outer,
                         const tt_concat_params_s8 *q, int8_t *y);
void tt_concatenation_f32(int32_t n_inputs, const float *const *inputs, const int32_t *inner_sizes, int32_t outer,
                          float act_min, float act_max, float *y);
/* dxs[i] == NULL: input i needs no gradient and is skipped. */
void tt_concatenation_grad_f32(int32_t n_inputs, const int32_t *inner_sizes, int32_t outer, const float *dy,
                               float *const *dxs);
#endif /* TT_INTERFACE */

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
                yo[j] = tt_act_clamp(xi[j], act_min, act_max);
            }
            yo += len;
        }
    }
}

void tt_concatenation_grad_f32(int32_t n_inputs, const int32_t *inner_sizes, int32_t outer, const float *dy,
                               float *const *dxs)
{
    int32_t o, i, j;
    for (o = 0; o < outer; ++o) {
        for (i = 0; i < n_inputs; ++i) {
            const int32_t len = inner_sizes[i];
            /* A NULL destination is an input that needs no gradient (autodiff prunes it): skipped. */
            if (dxs[i] != 0) {
                float *dst = dxs[i] + o * len;
                for (j = 0; j < len; ++j) {
                    dst[j] = dy[j];
                }
            }
            dy += len;
        }
    }
}
