/* 1-bit activation masks (declarations and layout: tt_mask.h). */
#include "tt_mask.h"
#include "tt_f16.h"

#include <float.h>
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_f16_mve_ops.h" /* target.kernels: mve - integer compares on the bits, the same bits */
#endif

void tt_clamp_mask_s8(int32_t n, int32_t lo, int32_t hi, const int8_t *y, uint8_t *mask)
{
    int32_t i = 0;
    int32_t j = 0;
    for (; i + 8 <= n; i += 8, ++j) {
        uint32_t bits = 0;
        int32_t k;
        for (k = 0; k < 8; ++k) {
            const int32_t v = (int32_t)y[i + k];
            bits |= (uint32_t)(v > lo && v < hi) << k;
        }
        mask[j] = (uint8_t)bits;
    }
    if (i < n) {
        uint32_t bits = 0;
        int32_t k;
        for (k = 0; i + k < n; ++k) {
            const int32_t v = (int32_t)y[i + k];
            bits |= (uint32_t)(v > lo && v < hi) << k;
        }
        mask[j] = (uint8_t)bits;
    }
}

/* One mask walk for fp32 (yf) and fp16 (yh) values: inlined with one of them null. hi above every finite float
 * (+INFINITY): no upper bound, so that +inf passes as in tt_act_grad_f32. */
static inline __attribute__((always_inline)) void tt_clamp_mask_walk(int32_t n, float lo, float hi,
                                                                     const float *yf, const uint16_t *yh,
                                                                     uint8_t *mask)
{
    const int bounded = hi <= FLT_MAX;
    int32_t i = 0;
    int32_t j = 0;
    for (; i < n; ++j) {
        uint32_t bits = 0;
        int32_t k;
        for (k = 0; k < 8 && i < n; ++k, ++i) {
            const float v = yh != 0 ? tt_f16_read(yh[i]) : yf[i];
            bits |= (uint32_t)(v > lo && (!bounded || v < hi)) << k;
        }
        mask[j] = (uint8_t)bits;
    }
}

void tt_clamp_mask_f32(int32_t n, float lo, float hi, const float *y, uint8_t *mask)
{
#ifdef TT_F16_MVE_OPS
    tt_clamp_mask_mve(n, lo, hi, y, 0, mask);
    return;
#endif
    tt_clamp_mask_walk(n, lo, hi, y, 0, mask);
}

void tt_clamp_mask_hy(int32_t n, float lo, float hi, const uint16_t *y, uint8_t *mask)
{
#ifdef TT_F16_MVE_OPS
    tt_clamp_mask_mve(n, lo, hi, 0, y, mask);
    return;
#endif
    tt_clamp_mask_walk(n, lo, hi, 0, y, mask);
}
