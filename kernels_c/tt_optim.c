/* Float32 optimizer updates, in place on the trained slice (grad_ops.sgd_update, momentum_update, adam_update,
 * rmsprop_update = PyTorch's single-tensor formulas). Element-wise expressions are evaluated in the same order
 * and with the same float32 constants as grad_ops, so results agree bit for bit (no FMA). */
#include "tt_kernels.h"

#include <math.h>

#define TT_SLICE_LOOP(s)                                                                                           \
    for (r = 0; r < (s)->rows; ++r)                                                                                \
        for (j = 0; j < (s)->n; ++j)

static inline float tt_grad(float g, float scale, float weight_decay, float w)
{
    float gg = g * scale;
    if (weight_decay != 0.0f) {
        gg = gg + weight_decay * w;
    }
    return gg;
}

void tt_sgd_f32(const tt_slice *s, const tt_sgd_params *p, float *w, const float *g)
{
    int32_t r, j;
    TT_SLICE_LOOP(s) {
        float *wp = w + r * s->cols + j;
        const float gg = tt_grad(g[r * s->n + j], p->scale, p->weight_decay, *wp);
        *wp = *wp - p->lr * gg;
    }
}

/* buf = momentum * buf + g (buf starts at 0: the first step gives buf = g, PyTorch's clone); w -= lr * buf. */
void tt_momentum_f32(const tt_slice *s, const tt_momentum_params *p, float *w, const float *g, float *buf)
{
    int32_t r, j;
    TT_SLICE_LOOP(s) {
        float *wp = w + r * s->cols + j;
        const int32_t k = r * s->n + j;
        const float gg = tt_grad(g[k], p->scale, p->weight_decay, *wp);
        buf[k] = buf[k] * p->momentum;
        buf[k] = buf[k] + gg;
        *wp = *wp - p->lr * buf[k];
    }
}

void tt_adam_prepare(double lr, double beta1, double beta2, double eps, int32_t step, float scale,
                     float weight_decay, tt_adam_params *p)
{
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    p->lr_over_bc1 = (float)(lr / bc1);
    p->one_minus_beta1 = (float)(1.0 - beta1);
    p->beta2 = (float)beta2;
    p->one_minus_beta2 = (float)(1.0 - beta2);
    p->sqrt_bc2 = (float)sqrt(bc2);
    p->eps = (float)eps;
    p->scale = scale;
    p->weight_decay = weight_decay;
}

void tt_adam_f32(const tt_slice *s, const tt_adam_params *p, float *w, const float *g, float *m, float *v)
{
    int32_t r, j;
    TT_SLICE_LOOP(s) {
        float *wp = w + r * s->cols + j;
        const int32_t k = r * s->n + j;
        const float gg = tt_grad(g[k], p->scale, p->weight_decay, *wp);
        float denom;
        m[k] = m[k] + (gg - m[k]) * p->one_minus_beta1;
        v[k] = v[k] * p->beta2;
        v[k] = v[k] + p->one_minus_beta2 * gg * gg;
        denom = sqrtf(v[k]) / p->sqrt_bc2 + p->eps;
        *wp = *wp - p->lr_over_bc1 * m[k] / denom;
    }
}

void tt_rmsprop_f32(const tt_slice *s, const tt_rmsprop_params *p, float *w, const float *g, float *sq)
{
    int32_t r, j;
    TT_SLICE_LOOP(s) {
        float *wp = w + r * s->cols + j;
        const int32_t k = r * s->n + j;
        const float gg = tt_grad(g[k], p->scale, p->weight_decay, *wp);
        sq[k] = sq[k] * p->alpha;
        sq[k] = sq[k] + p->one_minus_alpha * gg * gg;
        *wp = *wp - p->lr * gg / (sqrtf(sq[k]) + p->eps);
    }
}
