/* Pooling windows, shared by ops/tt_average_pool2d.c and ops/tt_max_pool2d.c: every pooling kernel visits each
 * output element's window in the same way, so the visit is written once here and each kernel keeps only what it
 * does with the taps. Taps are visited row by row (filter y, then filter x) like the reference kernels; taps
 * outside the image are skipped. */
#ifndef TT_POOL_WINDOW_H
#define TT_POOL_WINDOW_H

#include "tt_kernels.h"

/* The in-image taps of one output position's window: input rows [y0, y1), columns [x0, x1); clipped != 0 when
 * the window reaches past the image (so it has fewer than filter_h * filter_w taps). */
typedef struct {
    int32_t y0, y1, x0, x1;
    int32_t clipped;
} tt_pool_window;

static inline tt_pool_window tt_pool_window_at(const tt_pool_dims *d, int32_t oy, int32_t ox)
{
    tt_pool_window w;
    const int32_t iy0 = oy * d->stride_h - d->pad_top;
    const int32_t ix0 = ox * d->stride_w - d->pad_left;
    w.y0 = iy0 < 0 ? 0 : iy0;
    w.x0 = ix0 < 0 ? 0 : ix0;
    w.y1 = iy0 + d->filter_h > d->in_h ? d->in_h : iy0 + d->filter_h;
    w.x1 = ix0 + d->filter_w > d->in_w ? d->in_w : ix0 + d->filter_w;
    w.clipped = iy0 < 0 || ix0 < 0 || iy0 + d->filter_h > d->in_h || ix0 + d->filter_w > d->in_w;
    return w;
}

/* The number of in-image taps (the average's divisor, TFLite's). */
static inline int32_t tt_pool_window_count(const tt_pool_window *w)
{
    return (w->y1 - w->y0) * (w->x1 - w->x0);
}

/* Index of element (b, iy, ix, c) of the input, and of (b, oy, ox, c) of the output (NHWC). */
#define TT_POOL_IN(d, b, iy, ix, c) ((((b) * (d)->in_h + (iy)) * (d)->in_w + (ix)) * (d)->channels + (c))
#define TT_POOL_OUT(d, b, oy, ox, c) ((((b) * (d)->out_h + (oy)) * (d)->out_w + (ox)) * (d)->channels + (c))

/* The statement after it runs once per output element (b, oy, ox, c) in row-major order, w its window. */
#define TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w)                                                                \
    for ((b) = 0; (b) < (d)->batches; ++(b))                                                                       \
        for ((oy) = 0; (oy) < (d)->out_h; ++(oy))                                                                  \
            for ((ox) = 0; (ox) < (d)->out_w && ((w) = tt_pool_window_at((d), (oy), (ox)), 1); ++(ox))             \
                for ((c) = 0; (c) < (d)->channels; ++(c))

/* The statement after it runs once per in-image tap (iy, ix) of window w, row by row. */
#define TT_POOL_FOR_EACH_TAP(w, iy, ix)                                                                            \
    for ((iy) = (w).y0; (iy) < (w).y1; ++(iy))                                                                     \
        for ((ix) = (w).x0; (ix) < (w).x1; ++(ix))

#endif /* TT_POOL_WINDOW_H */
