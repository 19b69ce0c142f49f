/* Float32 optimizer updates, in place on the trained slice (grad_ops.sgd_update, momentum_update, adam_update,
 * rmsprop_update = PyTorch's single-tensor formulas). Element-wise expressions are evaluated in the same order
 * and with the same float32 constants as grad_ops, so results agree bit for bit (no FMA). */
#include "tt_kernels.h"

#include <math.h>

#include "tt_opt_step.h"

/* w -= STEP over the trained slice of s (rows x the first n of cols): STEP is the step of one element from gg, its
 * prepared gradient, and k, its index in the compact [rows, n] gradient and optimizer state. */
#define TT_SLICE_UPDATE(STEP)                                                                                      \
    do {                                                                                                           \
        int32_t r, j;                                                                                              \
        for (r = 0; r < s->rows; ++r) {                                                                            \
            for (j = 0; j < s->n; ++j) {                                                                           \
                float *wp = w + r * s->cols + j;                                                                   \
                const int32_t k = r * s->n + j;                                                                    \
                const float gg = tt_grad(g[k], p->scale, p->weight_decay, *wp);                                    \
                (void)k;                                                                                           \
                *wp = *wp - (STEP);                                                                                \
            }                                                                                                      \
        }                                                                                                          \
    } while (0)

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
    TT_SLICE_UPDATE(p->lr * gg);
}

/* The steps: tt_opt_step.h (the state changes in place). */
void tt_momentum_f32(const tt_slice *s, const tt_momentum_params *p, float *w, const float *g, float *buf)
{
    TT_SLICE_UPDATE(tt_momentum_step(gg, &buf[k], p->momentum, p->lr));
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
    TT_SLICE_UPDATE(tt_adam_step(gg, &m[k], &v[k], p->one_minus_beta1, p->beta2, p->one_minus_beta2, p->lr_over_bc1,
                                 p->sqrt_bc2, p->eps));
}

void tt_rmsprop_f32(const tt_slice *s, const tt_rmsprop_params *p, float *w, const float *g, float *sq)
{
    TT_SLICE_UPDATE(tt_rmsprop_step(gg, &sq[k], p->alpha, p->one_minus_alpha, p->lr, p->eps));
}
