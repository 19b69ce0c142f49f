/* The source-coordinate helpers shared by resize_bilinear and resize_nearest_neighbor (ops/tt_resize_*.c).
 * Arithmetic: ops/tt_resize_bilinear.c's header. static inline: each op file keeps its own inlined copy. */
#ifndef TT_RESIZE_COMMON_H
#define TT_RESIZE_COMMON_H

#include "tt_kernels.h"
#include "tt_math.h" /* tt_floor32 */

#include <stddef.h>

static inline int32_t tt_ceil_i(float v)
{
    int32_t t = (int32_t)v;
    return ((float)t < v) ? t + 1 : t;
}

static inline float tt_resize_scale(int32_t in, int32_t out, int32_t align_corners)
{
    if (align_corners && out > 1) {
        return (float)(in - 1) / (float)(out - 1);
    }
    return (float)in / (float)out;
}

/* Source pair and weights of output index i along one axis (float). */
static inline void tt_bilinear_axis(int32_t i, float scale, int32_t half, int32_t in, int32_t *lo, int32_t *hi,
                             float *w_lo, float *w_hi)
{
    float v = half ? ((float)i + 0.5f) * scale - 0.5f : (float)i * scale;
    int32_t a = tt_floor32(v), b = tt_ceil_i(v);
    a = a < 0 ? 0 : a;
    a = a > in - 1 ? in - 1 : a;
    b = b > in - 1 ? in - 1 : b;
    *lo = a;
    *hi = b;
    *w_hi = v - (float)a;
    *w_lo = 1.0f - *w_hi;
}

/* Q10 scale of one axis (ResizeBilinearInteger). */
static inline int32_t tt_scale_10(int32_t in, int32_t out, int32_t align_corners)
{
    if (align_corners && out > 1) {
        return ((1 << 10) * (in - 1) + (out - 1) / 2) / (out - 1);
    }
    return ((1 << 10) * in + out / 2) / out;
}

static inline void tt_bilinear_axis_q10(int32_t i, int32_t s10, int32_t half, int32_t in, int32_t *lo, int32_t *hi,
                                 int32_t *w_lo, int32_t *w_hi)
{
    int32_t v = half ? i * s10 + s10 / 2 - (1 << 9) : i * s10;
    int32_t a = v / (1 << 10), b = (v + (1 << 10) - 1) / (1 << 10);
    a = a < 0 ? 0 : a;
    a = a > in - 1 ? in - 1 : a;
    b = b > in - 1 ? in - 1 : b;
    *lo = a;
    *hi = b;
    *w_hi = v - (1 << 10) * a;
    *w_lo = (1 << 10) - *w_hi;
}

static inline int32_t tt_nearest_axis(int32_t i, float scale, int32_t align, int32_t half, int32_t in)
{
    float v = ((float)i + (half ? 0.5f : 0.0f)) * scale;
    int32_t r;
    if (align) {
        /* std::round: v >= 0 here, and v + 0.5 is exact in double. */
        r = (int32_t)((double)v + 0.5);
    } else {
        r = tt_floor32(v);
    }
    r = r > in - 1 ? in - 1 : r;
    return (half && r < 0) ? 0 : r;
}

/* The element offsets of a bilinear sample's four corners in an NHWC image of width iw and c channels:
 * (y0, x0), (y1, x0), (y0, x1), (y1, x1), the order the sum takes them in. */
static inline void tt_bilinear_corners(int32_t y0, int32_t y1, int32_t x0, int32_t x1, int32_t iw, int32_t c,
                                       size_t off[4])
{
    off[0] = ((size_t)y0 * iw + x0) * c;
    off[1] = ((size_t)y1 * iw + x0) * c;
    off[2] = ((size_t)y0 * iw + x1) * c;
    off[3] = ((size_t)y1 * iw + x1) * c;
}

/* dx = 0 over a resize's whole input: its gradient scatters into it. */
static inline void tt_resize_grad_zero(const tt_resize_params *p, float *dx)
{
    const size_t n = (size_t)p->batches * p->in_h * p->in_w * p->channels;
    size_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = 0.0f;
    }
}

#endif /* TT_RESIZE_COMMON_H */
