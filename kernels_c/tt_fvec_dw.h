/* Helium fp32-vector depthwise kernels of fp16-mixed (ops/tt_depthwise_conv2d.c's hx_hy forward and hdy_hdx input
 * gradient) for `target.kernels: mve` on the Cortex-M55; kernels_c/tt_fvec_dw.c says why they give the portable
 * loops' bits. Included (and defined) only where TT_USE_MVE is on and the core has MVE. */
#ifndef TT_FVEC_DW_H
#define TT_FVEC_DW_H

#include <stdint.h>

#include "tt_kernels.h"

/* Most filter taps (k_h * k_w) the vector kernels take (so also most rows and columns): their tap tables live on the
 * stack of the forward's deepest call chain. A 3x3 filter has 9; larger filters take the portable loops. */
#define TT_FVEC_DW_TAPS 9

/* 1 when the vector kernels may serve a call with these operands: depth multiplier 1, at most TT_FVEC_DW_TAPS taps;
 * every weight (k_h * k_w * out_c) and bias (out_c; bias 0: none) passes tt_fvec_ok (+-0 or finite with
 * |v| >= 2^-79); the clamp bounds lo, hi are +-0, normal or infinite (not NaN, not subnormal: Helium's compare would
 * flush a subnormal bound). 0: the caller runs its portable loop. */
int32_t tt_fvec_dw_ok(const tt_conv_dims *d, const float *w, const float *bias, float lo, float hi);

/* One channel of tt_depthwise_conv2d_hx_hy (one batch): xc, wc, bc (0: no bias) point at the channel's first input
 * element, weight and bias; output pixel p goes to yc[p * ys]. The bits of the portable kernel. */
void tt_fvec_dw_hx_hy_channel(const tt_conv_dims *d, const uint16_t *xc, const float *wc, const float *bc, float lo,
                              float hi, uint16_t *yc, int32_t ys);

/* One channel of tt_depthwise_conv2d_grad_input_hdy_hdx (one batch): dyc, wc point at the channel's first output
 * gradient element and weight; input pixel p's gradient goes to out[p * os]. The bits of the portable kernel. */
void tt_fvec_dw_gi_channel(const tt_conv_dims *d, const uint16_t *dyc, const float *wc, uint16_t *out, int32_t os);

/* dst[i * stride] = src[i] for i < n (the in-place kernels' copy of one channel from scratch). */
void tt_fvec_dw_put(const uint16_t *src, int32_t n, uint16_t *dst, int32_t stride);

#endif /* TT_FVEC_DW_H */
