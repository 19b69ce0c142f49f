/* RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (reference_ops::ResizeBilinear / ResizeBilinearInteger /
 * ResizeNearestNeighbor; executor._resize_bilinear, executor._resize_nearest_neighbor) and their float backward
 * (grad_ops.resize_bilinear_grad, grad_ops.resize_nearest_neighbor_grad), NHWC.
 *
 * float: per axis v = (i + 0.5f) * scale - 0.5f (half pixel) or i * scale, scale = in / out, or (in - 1) / (out - 1)
 * with align_corners and out > 1, all in float; lo = max(floor(v), 0), hi = min(ceil(v), in - 1), weights
 * (1 - (v - lo), v - lo); y = x00 wy0 wx0 + x10 wy1 wx0 + x01 wy0 wx1 + x11 wy1 wx1, each product (x * wy) * wx,
 * summed left to right (bit-identical to the reference compiled without FMA contraction).
 * int8: the same in Q10 integers (ResizeBilinearInteger, what TFLite Micro and LiteRT BUILTIN_REF run): an int64
 * sum of the four products, + or - 2^19 by its sign, divided by 2^20 toward zero. Raw int8 values are
 * interpolated: the output has the input's quantization.
 * nearest: (i + offset) * scale in float, rounded half away from zero (align_corners) or floored; at most in - 1. */
#include "tt_resize_common.h"

#include <stddef.h>

#ifdef TT_INTERFACE
void tt_resize_bilinear_s8(const tt_resize_params *p, const int8_t *x, int8_t *y);
void tt_resize_bilinear_f32(const tt_resize_params *p, const float *x, float *y);
void tt_resize_bilinear_grad_f32(const tt_resize_params *p, const float *dy, float *dx);
#endif /* TT_INTERFACE */

/* The float taps of every output pixel, used both ways: grad == 0 gathers them from x = src into y = dst (the
 * forward), grad != 0 scatters dy = src into dx = dst (the gradient; dst zeroed first). */
static void tt_bilinear_f32(const tt_resize_params *p, const float *src, float *dst, int grad)
{
    const int32_t c = p->channels, iw = p->in_w;
    const float sy = tt_resize_scale(p->in_h, p->out_h, p->align_corners);
    const float sx = tt_resize_scale(p->in_w, p->out_w, p->align_corners);
    int32_t b, oy, ox, k, i;
    for (b = 0; b < p->batches; ++b) {
        const size_t image = (size_t)b * p->in_h * iw * c;
        for (oy = 0; oy < p->out_h; ++oy) {
            int32_t y0, y1;
            float wy0, wy1;
            tt_bilinear_axis(oy, sy, p->half_pixel_centers, p->in_h, &y0, &y1, &wy0, &wy1);
            for (ox = 0; ox < p->out_w; ++ox) {
                int32_t x0, x1;
                float wx0, wx1;
                size_t off[4];
                tt_bilinear_axis(ox, sx, p->half_pixel_centers, iw, &x0, &x1, &wx0, &wx1);
                tt_bilinear_corners(y0, y1, x0, x1, iw, c, off);
                for (i = 0; i < 4; ++i) {
                    off[i] += image;
                }
                if (grad) {
                    for (k = 0; k < c; ++k) {
                        const float g = src[k];
                        dst[off[0] + k] += g * wy0 * wx0;
                        dst[off[1] + k] += g * wy1 * wx0;
                        dst[off[2] + k] += g * wy0 * wx1;
                        dst[off[3] + k] += g * wy1 * wx1;
                    }
                    src += c;
                } else {
                    for (k = 0; k < c; ++k) {
                        float t = src[off[0] + k] * wy0 * wx0;
                        t = t + src[off[1] + k] * wy1 * wx0;
                        t = t + src[off[2] + k] * wy0 * wx1;
                        t = t + src[off[3] + k] * wy1 * wx1;
                        dst[k] = t;
                    }
                    dst += c;
                }
            }
        }
    }
}

void tt_resize_bilinear_f32(const tt_resize_params *p, const float *x, float *y)
{
    tt_bilinear_f32(p, x, y, 0);
}

void tt_resize_bilinear_s8(const tt_resize_params *p, const int8_t *x, int8_t *y)
{
    const int32_t c = p->channels, iw = p->in_w;
    const int32_t sy = tt_scale_10(p->in_h, p->out_h, p->align_corners);
    const int32_t sx = tt_scale_10(p->in_w, p->out_w, p->align_corners);
    int32_t b, oy, ox, k;
    for (b = 0; b < p->batches; ++b) {
        const int8_t *xb = x + (size_t)b * p->in_h * iw * c;
        for (oy = 0; oy < p->out_h; ++oy) {
            int32_t y0, y1, wy0, wy1;
            tt_bilinear_axis_q10(oy, sy, p->half_pixel_centers, p->in_h, &y0, &y1, &wy0, &wy1);
            for (ox = 0; ox < p->out_w; ++ox) {
                int32_t x0, x1, wx0, wx1;
                size_t off[4];
                tt_bilinear_axis_q10(ox, sx, p->half_pixel_centers, iw, &x0, &x1, &wx0, &wx1);
                tt_bilinear_corners(y0, y1, x0, x1, iw, c, off);
                for (k = 0; k < c; ++k) {
                    int64_t acc = (int64_t)xb[off[0] + k] * wy0 * wx0 + (int64_t)xb[off[1] + k] * wy1 * wx0 +
                                  (int64_t)xb[off[2] + k] * wy0 * wx1 + (int64_t)xb[off[3] + k] * wy1 * wx1;
                    acc += acc > 0 ? ((int64_t)1 << 19) : -((int64_t)1 << 19);
                    /* division by 2^20 toward zero, without a 64-bit divide */
                    acc = acc >= 0 ? (acc >> 20) : -((-acc) >> 20);
                    *y++ = (int8_t)acc;
                }
            }
        }
    }
}

void tt_resize_bilinear_grad_f32(const tt_resize_params *p, const float *dy, float *dx)
{
    tt_resize_grad_zero(p, dx);
    tt_bilinear_f32(p, dy, dx, 1);
}
