/* The two per-tap helpers of the input gradients, shared by the conv kernels (through tt_conv_common.h) and the
 * hidden-channel streams (tt_hidden_stream.c, tt_dq): the output coordinate an input-gradient tap reads and the
 * dequantization of one int8 weight. static inline: each file keeps its own inlined copy. */
#ifndef TT_CONV_TAPS_H
#define TT_CONV_TAPS_H

#include "tt_kernels.h"

/* Output coordinate that reads input coordinate i through tap k, or -1. */
static inline int32_t tt_src_out(int32_t i, int32_t pad, int32_t k, int32_t dil, int32_t stride, int32_t out_size)
{
    const int32_t t = i + pad - k * dil;
    int32_t o;
    if (t < 0 || t % stride != 0) {
        return -1;
    }
    o = t / stride;
    return o < out_size ? o : -1;
}

/* An int8 weight dequantized per element, as the input gradients with int8 weights read it (the float kernels'
 * loops and accumulation order; only the weight load differs). */
static inline float tt_dq(int8_t q, int32_t zero_point, float scale)
{
    return (float)((int32_t)q - zero_point) * scale;
}

#endif /* TT_CONV_TAPS_H */
