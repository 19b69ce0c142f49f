/* resize_nearest_neighbor: int8 and float32, and resize_nearest_neighbor_grad (conventions:
 * ops/tt_resize_bilinear.c's header). */
#include "tt_resize_common.h"

#include <stddef.h>

#ifdef TT_INTERFACE
void tt_resize_nearest_s8(const tt_resize_params *p, const int8_t *x, int8_t *y);
void tt_resize_nearest_f32(const tt_resize_params *p, const float *x, float *y);
void tt_resize_nearest_grad_f32(const tt_resize_params *p, const float *dy, float *dx);
#endif /* TT_INTERFACE */

#define TT_RESIZE_NEAREST(T)                                                                                 \
    const int32_t c = p->channels, iw = p->in_w;                                                             \
    const float sy = tt_resize_scale(p->in_h, p->out_h, p->align_corners);                                   \
    const float sx = tt_resize_scale(p->in_w, p->out_w, p->align_corners);                                   \
    int32_t b, oy, ox, k;                                                                                    \
    for (b = 0; b < p->batches; ++b) {                                                                       \
        const T *xb = x + (size_t)b * p->in_h * iw * c;                                                      \
        for (oy = 0; oy < p->out_h; ++oy) {                                                                  \
            int32_t iy = tt_nearest_axis(oy, sy, p->align_corners, p->half_pixel_centers, p->in_h);          \
            for (ox = 0; ox < p->out_w; ++ox) {                                                              \
                int32_t ix = tt_nearest_axis(ox, sx, p->align_corners, p->half_pixel_centers, iw);           \
                const T *src = xb + ((size_t)iy * iw + ix) * c;                                              \
                for (k = 0; k < c; ++k) {                                                                    \
                    *y++ = src[k];                                                                           \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

void tt_resize_nearest_s8(const tt_resize_params *p, const int8_t *x, int8_t *y)
{
    TT_RESIZE_NEAREST(int8_t)
}

void tt_resize_nearest_f32(const tt_resize_params *p, const float *x, float *y)
{
    TT_RESIZE_NEAREST(float)
}

void tt_resize_nearest_grad_f32(const tt_resize_params *p, const float *dy, float *dx)
{
    const int32_t c = p->channels, iw = p->in_w;
    const float sy = tt_resize_scale(p->in_h, p->out_h, p->align_corners);
    const float sx = tt_resize_scale(p->in_w, p->out_w, p->align_corners);
    int32_t b, oy, ox, k;
    tt_resize_grad_zero(p, dx);
    for (b = 0; b < p->batches; ++b) {
        float *db = dx + (size_t)b * p->in_h * iw * c;
        for (oy = 0; oy < p->out_h; ++oy) {
            int32_t iy = tt_nearest_axis(oy, sy, p->align_corners, p->half_pixel_centers, p->in_h);
            for (ox = 0; ox < p->out_w; ++ox) {
                int32_t ix = tt_nearest_axis(ox, sx, p->align_corners, p->half_pixel_centers, iw);
                float *q = db + ((size_t)iy * iw + ix) * c;
                for (k = 0; k < c; ++k) {
                    q[k] += dy[k];
                }
                dy += c;
            }
        }
    }
}
