/* Helium fp32-vector runs of fp16-mixed's depthwise kernels (ops/tt_depthwise_conv2d.c's hx_hy forward and
 * hdy_hdx input gradient) for `target.kernels: mve` on the Cortex-M55; kernels_c/tt_fvec_dw.c says why they give
 * the portable loops' bits. Only included (and only defined) where TT_USE_MVE is on and the core has MVE. */
#ifndef TT_FVEC_DW_H
#define TT_FVEC_DW_H

#include <stdint.h>

/* Most taps one run adds per lane (its tap table lives on the caller's stack: 8 bytes a tap). A 3x3 filter needs 9,
 * a 4x4 one 16; the input gradient of a larger filter, or the forward one, takes the portable loop. */
#define TT_FVEC_DW_TAPS 16

/* 1 when the vector runs may serve a call: every weight w[0..nw) and bias[0..nb) (bias 0: none) passes tt_fvec_ok
 * (+-0 or finite with |v| >= 2^-79), and the clamp bounds lo, hi are +-0, normal or infinite (not NaN, not
 * subnormal: the vector compare would flush a subnormal bound). 0: the caller runs its portable loop. */
int32_t tt_fvec_dw_ok(const float *w, int32_t nw, const float *bias, int32_t nb, float lo, float hi);

/* n lanes (pixels of one channel), lane i reading the fp16 values src[off[t] + i * lstep] (t < nt) and writing
 * out[i * ostep]: s = +0, then s += float(src[off[t] + i * lstep]) * wt[t] for t = 0 .. nt - 1 (a VMUL then a VADD
 * per tap, in t order: the portable loop's sum when the table lists its taps in its order); then
 * v = bias ? s + *bias : s; with clamp, v = tt_act_clamp(v, lo, hi); out = tt_f16_narrow(v).
 * The caller has checked the weights, the bias and the bounds with tt_fvec_dw_ok; nt <= TT_FVEC_DW_TAPS, off >= 0. */
void tt_fvec_dw_run(const uint16_t *src, const int32_t *off, const float *wt, int32_t nt, int32_t lstep, int32_t n,
                    const float *bias, int32_t clamp, float lo, float hi, uint16_t *out, int32_t ostep);

/* dst[i * stride] = src[i] for i < n (the in-place kernels' copy of one channel from scratch). */
void tt_fvec_dw_put(const uint16_t *src, int32_t n, uint16_t *dst, int32_t stride);

#endif /* TT_FVEC_DW_H */
