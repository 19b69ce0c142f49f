/* The element-wise pieces every parameter update shares, written once: the float optimizers (tt_optim.c), the QAS
 * update of the training program (tt_train_ops.c) and tt_qas_update_s8 (tt_qas.c).
 *
 * The optimizer steps are PyTorch's single-tensor formulas as stages/golden/grad_ops.py writes them (sgd_step,
 * momentum_step, adam_step, rmsprop_step): from the prepared gradient gg they update the state in place and return
 * the step d, which the float updates subtract (w = w - d) and the QAS update carries into the integer domain.
 * Each line is one float32 rounding in grad_ops' order (the kernels build with -ffp-contract=off: no FMA). */
#ifndef TT_OPT_STEP_H
#define TT_OPT_STEP_H

#include <math.h>
#include <stdint.h>

#include "tt_math.h" /* tt_floor32 */

/* buf = momentum * buf + gg (buf starts at 0: the first step gives buf = gg, PyTorch's clone); d = lr * buf. */
static inline float tt_momentum_step(float gg, float *buf, float momentum, float lr)
{
    float b = *buf * momentum;
    b = b + gg;
    *buf = b;
    return lr * b;
}

/* m = m + (gg - m)(1 - b1); v = b2 v + (1 - b2) gg^2; d = (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), with
 * lr_over_bc1 and sqrt_bc2 made per step by tt_adam_prepare (double, then float32). */
static inline float tt_adam_step(float gg, float *m, float *v, float one_minus_beta1, float beta2,
                                 float one_minus_beta2, float lr_over_bc1, float sqrt_bc2, float eps)
{
    float mm = *m, vv = *v;
    mm = mm + (gg - mm) * one_minus_beta1;
    vv = vv * beta2;
    vv = vv + one_minus_beta2 * gg * gg;
    *m = mm;
    *v = vv;
    return lr_over_bc1 * mm / (sqrtf(vv) / sqrt_bc2 + eps);
}

/* sq = alpha sq + (1 - alpha) gg^2; d = lr gg / (sqrt(sq) + eps). */
static inline float tt_rmsprop_step(float gg, float *sq, float alpha, float one_minus_alpha, float lr, float eps)
{
    float s = *sq * alpha;
    s = s + one_minus_alpha * gg * gg;
    *sq = s;
    return lr * gg / (sqrtf(s) + eps);
}

/* One xorshift32 step (Marsaglia 2003, shifts 13/17/5; stages/quant/qas.py), on a register copy of the state. */
static inline uint32_t tt_xorshift32_next(uint32_t x)
{
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

/* The stochastic rounding's u = (x >> 8) * 2^-24 of a PRNG state x: 24 random bits, exact in float32, in [0, 1). */
#define TT_U24_SCALE 5.9604644775390625e-08f /* 2^-24 */
static inline float tt_uniform24(uint32_t x)
{
    return (float)(x >> 8) * TT_U24_SCALE;
}

#endif /* TT_OPT_STEP_H */
