/* Losses with their gradients, float32 (grad_ops.softmax_ce_loss, mse_loss; losses.bce_logits_loss, huber_loss). */
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

/* One element's loss of y against target t; writes its gradient, already divided by the per-sample count `per`. */
typedef float (*tt_elem_loss)(float y, float t, float per, float param, float *grad);

/* The per-element losses below: per sample the mean over its elements, summed over the samples. */
static float tt_mean_loss(int32_t samples, int32_t per_sample, tt_elem_loss elem, float param, const float *y,
                          const float *target, float *dy)
{
    int32_t s, i;
    float loss = 0.0f;
    const float per = (float)per_sample;
    for (s = 0; s < samples; ++s) {
        float acc = 0.0f;
        for (i = 0; i < per_sample; ++i) {
            const int32_t k = s * per_sample + i;
            acc += elem(y[k], target[k], per, param, &dy[k]);
        }
        loss += acc / per;
    }
    return loss;
}

static float tt_mse_elem(float y, float t, float per, float param, float *grad)
{
    const float diff = y - t;
    (void)param;
    *grad = 2.0f * diff / per;
    return diff * diff;
}

float tt_mse_f32(int32_t samples, int32_t per_sample, const float *y, const float *target, float *dy)
{
    return tt_mean_loss(samples, per_sample, tt_mse_elem, 0.0f, y, target, dy);
}

/* Binary cross-entropy with logits (stages/train/losses.py bce_logits_loss): per element
 * max(z, 0) - z t + log(1 + e^-|z|); dz = (sigmoid(z) - t) / per with sigmoid from the same e = e^-|z| (stable
 * for any z). */
static float tt_bce_logits_elem(float v, float t, float per, float param, float *grad)
{
    const float e = tt_expf(v >= 0.0f ? -v : v);
    const float sig = v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    (void)param;
    *grad = (sig - t) / per;
    return ((v > 0.0f ? v : 0.0f) - v * t) + tt_logf(1.0f + e);
}

float tt_bce_logits_f32(int32_t samples, int32_t per_sample, const float *z, const float *target, float *dz)
{
    return tt_mean_loss(samples, per_sample, tt_bce_logits_elem, 0.0f, z, target, dz);
}

/* Huber loss (stages/train/losses.py huber_loss, PyTorch HuberLoss): per element of d = y - t, 0.5 d^2 where
 * |d| <= delta, else delta (|d| - delta / 2); dy = clamp(d, -delta, delta) / per. */
static float tt_huber_elem(float y, float t, float per, float delta, float *grad)
{
    const float d = y - t;
    const float a = d < 0.0f ? -d : d;
    *grad = (d > delta ? delta : (d < -delta ? -delta : d)) / per;
    return a <= delta ? (0.5f * d) * d : delta * (a - 0.5f * delta);
}

float tt_huber_f32(int32_t samples, int32_t per_sample, float delta, const float *y, const float *target, float *dy)
{
    return tt_mean_loss(samples, per_sample, tt_huber_elem, delta, y, target, dy);
}

/* A head's weight (stages/train/losses.py weighted): its loss and gradient times w, float32. */
float tt_loss_weight_f32(int32_t n, float w, float loss, float *grad)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        grad[i] = grad[i] * w;
    }
    return loss * w;
}
