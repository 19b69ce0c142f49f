/* tt_train_ops.h: kernels the generated training program needs besides tt_kernels.h (the in-place depthwise
 * convolution is declared in ops/tt_depthwise_conv2d.c's interface block) (stages/codegen.py).
 *
 *  - element-wise helpers of the training IR (multi-input gradient sum, int8 straight-through clamp mask,
 *    dequantize of a channel slice, max-pool backward reading the int8 forward input, argmax);
 *  - the int8/int32 parameter update of stages/quant/qas.py (qas_*_update ops), bit-exact with it.
 * Same conventions as tt_kernels.h. */
#ifndef TT_TRAIN_OPS_H
#define TT_TRAIN_OPS_H

#include <stdint.h>

#include "tt_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = ((x0 + x1) + x2) + ... element-wise; y may be any of the inputs (each element is read before written). */
void tt_sum_f32(int32_t n_inputs, const float *const *xs, int32_t n, float *y);
/* dx = lo < y < hi ? dy : 0 (y the int8 forward output). dx may be dy. */
void tt_int8_clamp_grad_f32(int32_t n, int32_t lo, int32_t hi, const float *dy, const int8_t *y, float *dx);
/* y[r, :k] = f32(x[r, :k] - zp) * scale for x viewed as [rows, depth] (dequantize_slice). */
void tt_dequantize_slice_s8_f32(int32_t rows, int32_t depth, int32_t k, float scale, int32_t zero_point,
                                const int8_t *x, float *y);
int32_t tt_argmax_s8(int32_t n, const int8_t *x);
int32_t tt_argmax_f32(int32_t n, const float *x);

/* ---- QAS update (stages/quant/qas.py qas_update; formulas in its docstring) -------------------------------------- */
typedef enum { TT_OPT_SGD = 0, TT_OPT_MOMENTUM = 1, TT_OPT_ADAM = 2, TT_OPT_RMSPROP = 3 } tt_opt_kind;

typedef struct {
    tt_opt_kind kind;
    int32_t qas;           /* 1: real-unit update (QAS), 0: naive integer update */
    tt_rounding rounding;  /* ignored with a master copy (always nearest) */
    int32_t lo, hi;        /* clamp of the integer parameter */
    float batch_scale;     /* f32(1 / B) */
    float lr, weight_decay;
    float momentum;                               /* momentum */
    float one_minus_beta1, beta2, one_minus_beta2; /* adam */
    float lr_over_bc1, sqrt_bc2;                  /* adam, per step */
    float alpha, one_minus_alpha;                 /* rmsprop */
    float eps;                                    /* adam, rmsprop */
} tt_qas_params;

/* p is [rows, cols] int8 (is_int32 == 0) or int32; the first n columns of every row train; g, state, master are
 * compact [rows, n]. The scale of element (r, j) is scale[rows_per_channel > 0 ? r / rows_per_channel : j]
 * (scale_count == 1: scale[0] for all). state0/state1: momentum buf / adam m, v / rmsprop square_avg (NULL when
 * unused). master: NULL or the fp32 master copy. rng: NULL or the xorshift32 state (stochastic rounding). */
void tt_qas_update(const tt_qas_params *p, int32_t rows, int32_t cols, int32_t n, int32_t rows_per_channel,
                   int32_t scale_count, const float *scale, void *param, int32_t is_int32, const float *g,
                   float *state0, float *state1, float *master, uint32_t *rng);

#ifdef __cplusplus
}
#endif

#endif /* TT_TRAIN_OPS_H */
