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

/* The in-image taps of a forward output whose top-left tap reads input (iy0, ix0): filter rows [ky0, ky1) and columns
 * [kx0, kx1), a rectangle (the taps outside the image are the ones padding skips); k4 = {ky0, ky1, kx0, kx1}. */
TT_CONV_INLINE void tt_tap_window(const tt_conv_dims *d, int32_t iy0, int32_t ix0, int32_t *k4)
{
    int32_t ky0 = 0, ky1 = d->k_h, kx0 = 0, kx1 = d->k_w;
    while (ky0 < ky1 && iy0 + ky0 * d->dilation_h < 0) {
        ++ky0;
    }
    while (ky1 > ky0 && iy0 + (ky1 - 1) * d->dilation_h >= d->in_h) {
        --ky1;
    }
    while (kx0 < kx1 && ix0 + kx0 * d->dilation_w < 0) {
        ++kx0;
    }
    while (kx1 > kx0 && ix0 + (kx1 - 1) * d->dilation_w >= d->in_w) {
        --kx1;
    }
    k4[0] = ky0;
    k4[1] = ky1;
    k4[2] = kx0;
    k4[3] = kx1;
}

/* The weight gradients' walk over the outputs that read the input through one filter tap (conv2d's and
 * depthwise_conv2d's): row by row (batch, then output row), each row a run of n outputs from output pixel dy_px
 * whose inputs start at input pixel x_px and step by x_step pixels (pixel indices over the whole batched tensor).
 * Only taps inside the image are walked, so the kernels need no bounds checks; the order of the outputs is the
 * reference's (batch, output y, output x), so every sum sees its additions in the same order. */
typedef struct {
    int32_t n, x_step, dy_px, x_px;
    int32_t oy, oy_lo, oy_hi, left, dy_row, x_row, dy_skip, x_skip;
} tt_tap_walk;

TT_CONV_INLINE void tt_tap_walk_init(const tt_conv_dims *d, int32_t ky, int32_t kx, tt_tap_walk *w)
{
    int32_t ox_lo, ox_hi;
    const int32_t offy = ky * d->dilation_h - d->pad_top, offx = kx * d->dilation_w - d->pad_left;
    tt_interior(d->out_h, d->in_h, d->stride_h, -offy, 1, 1, &w->oy_lo, &w->oy_hi);
    tt_interior(d->out_w, d->in_w, d->stride_w, -offx, 1, 1, &ox_lo, &ox_hi);
    w->n = ox_hi - ox_lo;
    w->x_step = d->stride_w;
    w->left = w->n > 0 ? d->batches * (w->oy_hi - w->oy_lo) : 0;
    w->dy_row = d->out_w;
    w->x_row = d->stride_h * d->in_w;
    w->dy_skip = (d->out_h - (w->oy_hi - w->oy_lo)) * d->out_w;
    w->x_skip = d->in_h * d->in_w - (w->oy_hi - w->oy_lo) * w->x_row;
    /* one row before the first: tt_tap_walk_next steps onto it */
    w->oy = w->oy_lo - 1;
    w->dy_px = w->oy_lo * d->out_w + ox_lo - w->dy_row;
    w->x_px = (w->oy_lo * d->stride_h + offy) * d->in_w + ox_lo * d->stride_w + offx - w->x_row;
}

/* Steps onto the next row: 1, or 0 after the last. */
TT_CONV_INLINE int tt_tap_walk_next(tt_tap_walk *w)
{
    if (w->left == 0) {
        return 0;
    }
    --w->left;
    if (++w->oy == w->oy_hi) {
        w->oy = w->oy_lo;
        w->dy_px += w->dy_skip;
        w->x_px += w->x_skip;
    }
    w->dy_px += w->dy_row;
    w->x_px += w->x_row;
    return 1;
}

#if defined(__GNUC__)
#define TT_GI_INLINE static inline __attribute__((always_inline))
#else
#define TT_GI_INLINE static inline
#endif

#endif /* TT_CONV_COMMON_H */
