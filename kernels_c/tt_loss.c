/* Losses with their gradients, float32 (grad_ops.softmax_ce_loss, mse_loss). */
#include "tt_kernels.h"
#include "tt_math.h"

#include <math.h>

/* Stable: log-sum-exp around the row max; loss = sum over rows of log(sum e) - (z[label] - max). */
float tt_softmax_cross_entropy_f32(int32_t rows, int32_t depth, const float *logits, const int32_t *labels,
                                   float *dlogits)
{
    int32_t r, c;
    float loss = 0.0f;
    for (r = 0; r < rows; ++r) {
        const float *z = logits + r * depth;
        float *d = dlogits + r * depth;
        float mx = z[0], s = 0.0f;
        const int32_t lab = labels[r];
        for (c = 1; c < depth; ++c) {
            if (z[c] > mx) {
                mx = z[c];
            }
        }
        for (c = 0; c < depth; ++c) {
            d[c] = tt_expf(z[c] - mx);
            s += d[c];
        }
        loss += tt_logf(s) - (z[lab] - mx);
        for (c = 0; c < depth; ++c) {
            d[c] = d[c] / s;
        }
        d[lab] -= 1.0f;
    }
    return loss;
}

float tt_mse_f32(int32_t samples, int32_t per_sample, const float *y, const float *target, float *dy)
{
    int32_t s, i;
    float loss = 0.0f;
    const float per = (float)per_sample;
    for (s = 0; s < samples; ++s) {
        float acc = 0.0f;
        for (i = 0; i < per_sample; ++i) {
            const int32_t k = s * per_sample + i;
            const float diff = y[k] - target[k];
            acc += diff * diff;
            dy[k] = 2.0f * diff / per;
        }
        loss += acc / per;
    }
    return loss;
}
