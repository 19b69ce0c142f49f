/* Helium fp32-vector weight gradients of fp16-mixed (conv2d and fully connected) for `target.kernels: mve` on a
 * core with MVE: kernels_c/tt_fvec_gw.c. Each returns 1 when it wrote the result (the portable kernel's bits), 0
 * when an fp32 operand fails the condition of tt_fvec_mve.h and the caller must run its portable loop. Other
 * targets compile tt_fvec_gw.c to nothing: include this header under the same condition only. */
#ifndef TT_FVEC_GW_H
#define TT_FVEC_GW_H

#include <stdint.h>

#include "tt_kernels.h"

/* conv2d weight gradient of output channels [o0, o1), first k input channels (dw [o1-o0, KH, KW, k]): the bits of
 * ops/tt_conv2d.c's tt_gw_walk. dy is fp32 (dyf) or fp16 (dyh), x fp32 (xf) or fp16 (xh), the other pointer of each
 * pair 0; at least one of dy and x is fp16. */
int32_t tt_fvec_gw_conv(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                        const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw);

/* fully connected weight gradient rows [o0, o1) (dw [o1-o0, k] = dy[:, o]^T x[:, :k], each sum in row order): the
 * bits of ops/tt_fully_connected.c's tt_fc_grad_weight_impl; operands as tt_fvec_gw_conv's. */
int32_t tt_fvec_gw_fc(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0, int32_t o1,
                      const float *dyf, const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw);

#if defined(TT_FVEC_GW_TEST)
/* tests/test_fvec_gw.py only: tt_fvec_gw_conv without its operand check, to show that the check is needed. */
void tt_fvec_gw_conv_unchecked(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                               const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw);
#endif

#endif
