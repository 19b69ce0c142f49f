/* Helpers shared by the conv2d and depthwise_conv2d kernels (ops/tt_conv2d.c, ops/tt_depthwise_conv2d.c): the
 * geometry in locals, the interior (no-padding) output range, the source output coordinate of an input-gradient
 * tap and the dequantization of one int8 weight (and, through tt_act_clamp.h, the float activation clamp).
 * Static: each kernel file gets its own copy (the two files use every function here). */
#ifndef TT_CONV_COMMON_H
#define TT_CONV_COMMON_H

#include "tt_act_clamp.h"
#include "tt_conv_taps.h"
#include "tt_kernels.h"

/* First and one-past-last output coordinate whose taps all lie inside the input (no padding, no bounds checks). */
static void tt_interior(int32_t out_size, int32_t in_size, int32_t stride, int32_t pad, int32_t k, int32_t dil,
                        int32_t *lo, int32_t *hi)
{
    int32_t a = 0, b = out_size;
    while (a < out_size && a * stride - pad < 0) {
        ++a;
    }
    while (b > a && (b - 1) * stride - pad + (k - 1) * dil >= in_size) {
        --b;
    }
    *lo = a;
    *hi = b;
}

#if defined(__GNUC__)
#define TT_CONV_INLINE static inline __attribute__((always_inline))
#define TT_CONV_NOINLINE static __attribute__((noinline))
#else
#define TT_CONV_INLINE static inline
#define TT_CONV_NOINLINE static
#endif

/* The geometry in locals: the kernels store int8 outputs, which may alias any memory as far as the compiler
 * knows, so fields read through the struct pointer would be reloaded after every store. */
typedef struct {
    int32_t in_h, in_w, in_c, out_h, out_w, out_c, k_h, k_w, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
} tt_geom;

static tt_geom tt_geom_of(const tt_conv_dims *d)
{
    tt_geom g;
    g.in_h = d->in_h;
    g.in_w = d->in_w;
    g.in_c = d->in_c;
    g.out_h = d->out_h;
    g.out_w = d->out_w;
    g.out_c = d->out_c;
    g.k_h = d->k_h;
    g.k_w = d->k_w;
    g.stride_h = d->stride_h;
    g.stride_w = d->stride_w;
    g.dil_h = d->dilation_h;
    g.dil_w = d->dilation_w;
    g.pad_top = d->pad_top;
    g.pad_left = d->pad_left;
    return g;
}

#if defined(__GNUC__)
#define TT_GI_INLINE static inline __attribute__((always_inline))
#else
#define TT_GI_INLINE static inline
#endif

#endif /* TT_CONV_COMMON_H */
