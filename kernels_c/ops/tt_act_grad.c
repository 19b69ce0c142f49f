/* act_grad: the straight-through mask of a fused activation, from the forward output, float32. */
#include "tt_kernels.h"
#include "tt_f16.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_float_mve.h" /* target.kernels: mve - integer compares and VPSEL, the same bits */
#endif

#ifdef TT_INTERFACE
/* Straight-through mask from the forward *output* y: relu y>0, relu6 0<y<6, relu_n1_to_1 -1<y<1 (dx may be dy). */
void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx);
/* The same from an fp16 forward output y (fp16-mixed's saved activation itself, widened where it is compared:
 * exact, so the bits of tt_cast_f16_f32 followed by tt_act_grad_f32, without the fp32 copy). */
void tt_act_grad_hy_f32(int32_t n, tt_act act, const float *dy, const uint16_t *y, float *dx);
/* fp16-mixed (issue 13): dy, y and dx each fp32 or fp16 (the f32 / f16 pointer pair of each, the other 0): dy and y
 * widened where they are read (exact), dx rounded once as it is stored: the bits of tt_act_grad_f32 between
 * tt_cast_f16_f32 and tt_round_f16 (a kept fp16 dy is copied as its bits, a dropped one is +0). dx may start where
 * dy or y does: an fp32 dx over an fp16 operand is written from the end, any other pair behind what it reads. */
void tt_act_grad_f16(int32_t n, tt_act act, const float *dyf, const uint16_t *dyh, const float *yf,
                     const uint16_t *yh, float *dxf, uint16_t *dxh);
#endif /* TT_INTERFACE */

static int tt_act_keep(tt_act act, float v)
{
    switch (act) {
    case TT_ACT_RELU:
        return v > 0.0f;
    case TT_ACT_RELU6:
        return v > 0.0f && v < 6.0f;
    case TT_ACT_RELU_N1_TO_1:
        return v > -1.0f && v < 1.0f;
    default:
        return 1;
    }
}

/* y is fp32 (yf) or fp16 (yh, read where it is compared: exact). Inlined into both entry points with one of them 0. */
static inline void tt_act_grad_any(int32_t n, tt_act act, const float *dy, const float *yf, const uint16_t *yh,
                                   float *dx)
{
    int32_t i;
#ifdef TT_FLOAT_MVE
    tt_act_grad_mve(n, (int)act, dy, yh != 0 ? (const void *)yh : (const void *)yf, yh != 0, dx);
    return;
#endif
    for (i = 0; i < n; ++i) {
        dx[i] = tt_act_keep(act, yh != 0 ? tt_f16_read(yh[i]) : yf[i]) ? dy[i] : 0.0f;
    }
}

void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx)
{
    tt_act_grad_any(n, act, dy, y, 0, dx);
}

void tt_act_grad_hy_f32(int32_t n, tt_act act, const float *dy, const uint16_t *y, float *dx)
{
    tt_act_grad_any(n, act, dy, 0, y, dx);
}

/* One loop per form (inlined with the unused pointers constant 0). `back`: walk from the last element (an fp32 dx
 * written over an fp16 operand would overwrite elements 2i and 2i + 1 before they are read going forward). */
static inline __attribute__((always_inline)) void tt_act_grad_walk(int32_t n, tt_act act, const float *dyf,
                                                                   const uint16_t *dyh, const float *yf,
                                                                   const uint16_t *yh, float *dxf, uint16_t *dxh,
                                                                   int back)
{
    int32_t k;
    for (k = 0; k < n; ++k) {
        const int32_t i = back ? n - 1 - k : k;
        const int keep = tt_act_keep(act, yh != 0 ? tt_f16_read(yh[i]) : yf[i]);
        if (dxh != 0) {
            dxh[i] = !keep ? (uint16_t)0u : dyh != 0 ? dyh[i] : tt_f16_narrow(dyf[i]);
        } else {
            dxf[i] = !keep ? 0.0f : dyh != 0 ? tt_f16_read(dyh[i]) : dyf[i];
        }
    }
}

void tt_act_grad_f16(int32_t n, tt_act act, const float *dyf, const uint16_t *dyh, const float *yf,
                     const uint16_t *yh, float *dxf, uint16_t *dxh)
{
    if (dxh != 0) {   /* an fp16 dx is never wider than what it may be written over: forward */
        if (dyh != 0) {
            if (yh != 0) {
                tt_act_grad_walk(n, act, 0, dyh, 0, yh, 0, dxh, 0);
            } else {
                tt_act_grad_walk(n, act, 0, dyh, yf, 0, 0, dxh, 0);
            }
        } else if (yh != 0) {
            tt_act_grad_walk(n, act, dyf, 0, 0, yh, 0, dxh, 0);
        } else {
            tt_act_grad_walk(n, act, dyf, 0, yf, 0, 0, dxh, 0);
        }
    } else if (dyh != 0) {
        if (yh != 0) {
            tt_act_grad_walk(n, act, 0, dyh, 0, yh, dxf, 0, 1);
        } else {
            tt_act_grad_walk(n, act, 0, dyh, yf, 0, dxf, 0, 1);
        }
    } else {
        tt_act_grad_any(n, act, dyf, yf, yh, dxf);   /* fp32 dy and dx: tt_act_grad_f32 / _hy_f32 */
    }
}
