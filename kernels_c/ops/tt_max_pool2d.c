/* max_pool2d: int8, float32 and fp16-mixed, and max_pool2d_grad (float or int8 forward input); conventions:
 * ops/tt_average_pool2d.c's header. */
#include "tt_act_clamp.h"
#include "tt_f16.h"
#include "tt_kernels.h"
#include "tt_pool_window.h"

#include <float.h>

#ifdef TT_INTERFACE
void tt_max_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);
void tt_max_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
/* fp16-mixed (OpDef.fp16_operands / fp16_output): x read as fp32 (xf) or fp16 (xh, widened where it is compared:
 * exact, the order kept), y written as fp32 (yf) or fp16 (yh, rounded once on store): the bits of tt_max_pool2d_f32
 * on the widened x followed by tt_round_f16. The other pointer of each pair is 0; y never shares x's buffer. */
void tt_max_pool2d_f16(const tt_pool_dims *d, float act_min, float act_max, const float *xf, const uint16_t *xh,
                       float *yf, uint16_t *yh);
/* All of dy goes to the window's first maximum in row-major tap order (strict >). */
void tt_max_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, const float *x, float *dx);
/* the same with the int8 forward input (ties: first maximum in row-major tap order, strict >) */
void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx);
/* the same with an fp16 forward input (fp16-mixed's saved activation itself: widened where it is compared, exact) */
void tt_max_pool2d_grad_f16(const tt_pool_dims *d, const float *dy, const uint16_t *x, float *dx);
/* fp16-mixed: an fp16 dy (widened where it is added: exact, the fp32 sums of tt_max_pool2d_grad_f32 in the same
 * order) with a float forward input, fp32 (xf) or fp16 (xh; the other 0); dx fp32 (overlapping windows sum into it). */
void tt_max_pool2d_grad_hdy(const tt_pool_dims *d, const uint16_t *dy, const float *xf, const uint16_t *xh,
                            float *dx);
#endif /* TT_INTERFACE */

void tt_max_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y)
{
    int32_t b, oy, ox, c, iy, ix;
    tt_pool_window w;
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        int32_t best = -128;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            const int32_t v = x[TT_POOL_IN(d, b, iy, ix, c)];
            best = v > best ? v : best;
        }
        y[TT_POOL_OUT(d, b, oy, ox, c)] = (int8_t)tt_clamp32(best, act_min, act_max);
    }
}

/* The executor pads with -FLT_MAX (np.finfo(float32).min), so a window that reaches past the image never
 * yields less than -FLT_MAX; we reproduce that by starting such windows at -FLT_MAX. */
void tt_max_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y)
{
    int32_t b, oy, ox, c, iy, ix;
    tt_pool_window w;
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        float best = -FLT_MAX; /* replaced by the first tap unless the window is clipped */
        int32_t first = 1;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            const float v = x[TT_POOL_IN(d, b, iy, ix, c)];
            if ((first && !w.clipped) || v > best) {
                best = v;
            }
            first = 0;
        }
        y[TT_POOL_OUT(d, b, oy, ox, c)] = tt_act_clamp(best, act_min, act_max);
    }
}

void tt_max_pool2d_f16(const tt_pool_dims *d, float act_min, float act_max, const float *xf, const uint16_t *xh,
                       float *yf, uint16_t *yh)
{
    int32_t b, oy, ox, c, iy, ix;
    tt_pool_window w;
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        float best = -FLT_MAX; /* as tt_max_pool2d_f32 */
        int32_t first = 1;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            const int32_t idx = TT_POOL_IN(d, b, iy, ix, c);
            const float v = xh != 0 ? tt_f16_read(xh[idx]) : xf[idx];
            if ((first && !w.clipped) || v > best) {
                best = v;
            }
            first = 0;
        }
        best = tt_act_clamp(best, act_min, act_max);
        if (yh != 0) {
            yh[TT_POOL_OUT(d, b, oy, ox, c)] = tt_f16_narrow(best);
        } else {
            yf[TT_POOL_OUT(d, b, oy, ox, c)] = best;
        }
    }
}

/* The forward input of a max pool is float32, int8 or fp16 (kind 0, 1, 2); int8 -> float and fp16 -> float are
 * exact and keep the order, so one window search serves all and picks the same tap. */
static float tt__pool_in(const void *x, int32_t idx, int32_t kind)
{
    return kind == 1 ? (float)((const int8_t *)x)[idx]
           : kind == 2 ? tt_f16_read(((const uint16_t *)x)[idx]) : ((const float *)x)[idx];
}

/* All of dy goes to the window's first maximum in row-major tap order (strict >: ties keep the earlier tap),
 * as TFLite and PyTorch pick it. */
static void tt__max_pool2d_grad(const tt_pool_dims *d, const float *dy, const uint16_t *dyh, const void *x,
                                int32_t kind, float *dx)
{
    int32_t i, b, oy, ox, c, iy, ix;
    tt_pool_window w;
    const int32_t n_in = d->batches * d->in_h * d->in_w * d->channels;
    for (i = 0; i < n_in; ++i) {
        dx[i] = 0.0f;
    }
    TT_POOL_FOR_EACH_OUTPUT(d, b, oy, ox, c, w) {
        int32_t best_i = -1;
        float best = 0.0f;
        TT_POOL_FOR_EACH_TAP(w, iy, ix) {
            const int32_t idx = TT_POOL_IN(d, b, iy, ix, c);
            const float v = tt__pool_in(x, idx, kind);
            if (best_i < 0 || v > best) {
                best = v;
                best_i = idx;
            }
        }
        if (best_i >= 0) {
            const int32_t o = TT_POOL_OUT(d, b, oy, ox, c);
            dx[best_i] += dyh != 0 ? tt_f16_read(dyh[o]) : dy[o];
        }
    }
}

void tt_max_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, const float *x, float *dx)
{
    tt__max_pool2d_grad(d, dy, 0, x, 0, dx);
}

void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx)
{
    tt__max_pool2d_grad(d, dy, 0, x, 1, dx);
}

void tt_max_pool2d_grad_f16(const tt_pool_dims *d, const float *dy, const uint16_t *x, float *dx)
{
    tt__max_pool2d_grad(d, dy, 0, x, 2, dx);
}

void tt_max_pool2d_grad_hdy(const tt_pool_dims *d, const uint16_t *dy, const float *xf, const uint16_t *xh,
                            float *dx)
{
    if (xh != 0) {
        tt__max_pool2d_grad(d, 0, dy, xh, 2, dx);
    } else {
        tt__max_pool2d_grad(d, 0, dy, xf, 0, dx);
    }
}
