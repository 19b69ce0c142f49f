/* Helium fp32-vector conv2d input gradient for fp16-mixed (kernels_c/tt_fvec_gi.c; `target.kernels: mve` on a core
 * with MVE only: everywhere else that unit is empty and nothing includes this header).
 *
 * dx[p, ic] of a float-weight conv, with dy fp32 (dy) or fp16 (dyh, the other pointer null) and dx fp32 (dxf) or
 * fp16 (dxh, rounded once on store): the bits of ops/tt_conv2d.c's tt_gi_walk / tt_gi_walk_hdx on the same operands.
 * w / w_slice / n as tt_conv2d_grad_input_f32_split (channels [0, n) from the slice [O,KH,KW,n], the rest from w). */
#ifndef TT_FVEC_GI_H
#define TT_FVEC_GI_H

#include <stdint.h>

#include "tt_kernels.h"

/* Runs the Helium walk and returns 1 when the operands allow it (tt_fvec_gi.c's proof); returns 0 having written
 * nothing otherwise, and the caller runs its portable loop. */
int32_t tt_fvec_gi(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const float *w, const float *w_slice,
                   int32_t n, float *dxf, uint16_t *dxh);

/* 1 when the weights the walk reads allow an fp16 dy (every one +-0 or finite with |w| >= 2^-79): for a caller that
 * runs the same weight many times (the positions stream), which then calls tt_fvec_gi_run itself. */
int32_t tt_fvec_gi_w_ok_hdy(const tt_conv_dims *d, const float *w, const float *w_slice, int32_t n);

/* The Helium walk with no operand check: only after tt_fvec_gi_w_ok_hdy said 1 for this weight and an fp16 dy (the
 * tests also run it unchecked to show that the check is needed). */
void tt_fvec_gi_run(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const float *w, const float *w_slice,
                    int32_t n, float *dxf, uint16_t *dxh);

#endif
