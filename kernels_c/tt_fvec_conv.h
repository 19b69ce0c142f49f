/* Helium fp32-vector forward conv2d for fp16-mixed (`target.kernels: mve`, TT_USE_MVE=1): the sums of
 * ops/tt_conv2d.c's tt_conv_hx_walk / tt_conv_f32_walk with the portable bits, four output pixels per vector
 * (tt_fvec_conv.c explains why the bits are the same and when it declines). Each returns 1 when it wrote y, 0 when its
 * operands fail the condition (the caller then runs its portable loop); on other targets the functions do not exist
 * and the op file does not call them. */
#ifndef TT_FVEC_CONV_H
#define TT_FVEC_CONV_H

#include <stdint.h>

#include "tt_kernels.h"

/* tt_conv2d_hx_f32_split (yh null) / tt_conv2d_hx_hy_split (yf null): x fp16. */
int32_t tt_fvec_conv2d_hx(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                          const float *w_slice, int32_t n, const float *bias, float *yf, uint16_t *yh);
/* tt_conv2d_f32_split_hy: x fp32 (not fp16-valued, so x's exponents are checked as well as w's), y fp16. */
int32_t tt_fvec_conv2d_fx_hy(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *w_slice, int32_t n, const float *bias, uint16_t *y);

/* The two above in halves, for a caller that runs the same weight again and again (a row stream: codegen's
 * tt_conv2d_*_rep, the weight checked at the stream's first call): tt_fvec_conv2d_wcheck is the weight, bias and
 * clamp part of the check (the smallest biased exponent of the weights, 0 when the bias, the clamp bounds or a weight
 * refuse), the _ew functions take its answer, check the rest (x fp32: x's exponents) and run (1) or decline (0). */
int32_t tt_fvec_conv2d_wcheck(const tt_conv_dims *d, float act_min, float act_max, const float *w,
                              const float *w_slice, int32_t n, const float *bias);
int32_t tt_fvec_conv2d_hx_ew(int32_t ew, const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                             const float *w, const float *w_slice, int32_t n, const float *bias, float *yf,
                             uint16_t *yh);
int32_t tt_fvec_conv2d_fx_hy_ew(int32_t ew, const tt_conv_dims *d, float act_min, float act_max, const float *x,
                                const float *w, const float *w_slice, int32_t n, const float *bias, uint16_t *y);

#endif /* TT_FVEC_CONV_H */
