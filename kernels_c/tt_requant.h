/* Per-output-channel requantization constants of conv / depthwise, hoisted out of the pixel loops (internal to the
 * kernel library). tt_requant_apply(r, acc) == tt_multiply_by_quantized_multiplier(acc, m, s) + z_y, clamped: the
 * same operations, with the channel's table lookups and the shift's sign split done once per channel instead of
 * once per output element. */
#ifndef TT_REQUANT_H
#define TT_REQUANT_H

#include "tt_kernels.h"

typedef struct {
    int32_t multiplier;
    int left, right; /* shift > 0: left shift of the accumulator; shift <= 0: rounding right shift by -shift */
    int32_t zero_point, lo, hi;
} tt_requant1;

static inline tt_requant1 tt_requant_channel(const tt_requant_s8 *q, int32_t oc)
{
    tt_requant1 r;
    const int32_t i = q->per_channel ? oc : 0;
    const int shift = (int)q->shift[i];
    r.multiplier = q->multiplier[i];
    r.left = shift > 0 ? shift : 0;
    r.right = shift > 0 ? 0 : -shift;
    r.zero_point = q->output_zero_point;
    r.lo = q->act_min;
    r.hi = q->act_max;
    return r;
}

static inline int8_t tt_requant_apply(const tt_requant1 *r, int32_t acc)
{
    const int32_t v = tt_rounding_divide_by_pot(tt_srdhm(tt_wrap_shl32(acc, r->left), r->multiplier), r->right) +
                      r->zero_point;
    return (int8_t)tt_clamp32(v, r->lo, r->hi);
}

#endif /* TT_REQUANT_H */
