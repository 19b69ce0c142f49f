/* Backward of data movement and activations, float32 (grad_ops.pad_grad, concatenation_grad, act_grad,
 * softmax_grad, grad_sum). */
#include "tt_kernels.h"

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

void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        int keep;
        switch (act) {
        case TT_ACT_RELU:
            keep = y[i] > 0.0f;
            break;
        case TT_ACT_RELU6:
            keep = y[i] > 0.0f && y[i] < 6.0f;
            break;
        case TT_ACT_RELU_N1_TO_1:
            keep = y[i] > -1.0f && y[i] < 1.0f;
            break;
        default:
            keep = 1;
            break;
        }
        dx[i] = keep ? dy[i] : 0.0f;
    }
}

void tt_softmax_grad_f32(int32_t rows, int32_t depth, float beta, const float *dy, const float *y, float *dx)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        const float *dyr = dy + r * depth;
        const float *yr = y + r * depth;
        float *dxr = dx + r * depth;
        float s = 0.0f;
        for (c = 0; c < depth; ++c) {
            s += dyr[c] * yr[c];
        }
        for (c = 0; c < depth; ++c) {
            dxr[c] = beta * yr[c] * (dyr[c] - s);
        }
    }
}

void tt_accumulate_f32(int32_t n, float *acc, const float *g)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        acc[i] += g[i];
    }
}
