/* 1-bit activation masks (declarations and layout: tt_mask.h). */
#include "tt_mask.h"
#include "tt_f16.h"
#include "tt_simd.h"

#include <float.h>
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_f16_mve_ops.h" /* target.kernels: mve - integer compares on the bits, the same bits */
#endif

#if TT_SIMD
/* k's bytes where the int8 lane of w lies in [c1, c2] (c1 / c2: the bound repeated in every byte), 0 elsewhere.
 * DSP: SSUB8 sets a lane's GE flag when its signed difference is >= 0 and SEL picks bytes by those flags, twice. */
static inline uint32_t tt_s8x4_in_range(uint32_t w, uint32_t c1, uint32_t c2, uint32_t k)
{
#if defined(__arm__) && defined(__GNUC__)
    uint32_t r, t;
    __asm__("ssub8 %1, %2, %3\n\t"
            "sel   %0, %4, %5\n\t"
            "ssub8 %1, %6, %2\n\t"
            "sel   %0, %0, %5"
            : "=&r"(r), "=&r"(t)
            : "r"(w), "r"(c1), "r"(k), "r"(0u), "r"(c2)
            : "cc");
    return r;
#else
    uint32_t r = 0;
    int s;
    for (s = 0; s < 32; s += 8) {
        const int32_t b = (int32_t)((w >> s) & 0xFFu) - (int32_t)((w >> s) & 0x80u) * 2;
        const int32_t a = (int32_t)(c1 & 0xFFu) - (int32_t)(c1 & 0x80u) * 2;
        const int32_t z = (int32_t)(c2 & 0xFFu) - (int32_t)(c2 & 0x80u) * 2;
        if (b >= a && b <= z) {
            r |= k & (0xFFu << s);
        }
    }
    return r;
#endif
}
#endif

void tt_clamp_mask_s8(int32_t n, int32_t lo, int32_t hi, const int8_t *y, uint8_t *mask)
{
    int32_t i = 0;
    int32_t j = 0;
#if TT_SIMD
    /* Eight elements per mask byte, four per word: lo < y < hi is y in [lo + 1, hi - 1] clipped to int8's range
     * (empty when lo >= 127 or hi <= -128: the loop below then writes the zeros). Each word's in-range bytes pick
     * their mask bit (bit k of byte k in the first word, bit 4 + k in the second); the bits of the eight bytes
     * are disjoint, so the multiply by 0x01010101 adds them into the top byte without a carry. */
    if (lo < 127 && hi > -128) {
        const uint32_t c1 = (uint32_t)(uint8_t)(lo + 1 < -128 ? -128 : lo + 1) * 0x01010101u;
        const uint32_t c2 = (uint32_t)(uint8_t)(hi - 1 > 127 ? 127 : hi - 1) * 0x01010101u;
        for (; i + 8 <= n; i += 8, ++j) {
            const uint32_t m = tt_s8x4_in_range(tt_ld32(y + i), c1, c2, 0x08040201u) |
                               tt_s8x4_in_range(tt_ld32(y + i + 4), c1, c2, 0x08040201u) << 4;
            mask[j] = (uint8_t)((m * 0x01010101u) >> 24);
        }
    }
#endif
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
#else
    tt_clamp_mask_walk(n, lo, hi, y, 0, mask);
#endif
}

void tt_clamp_mask_hy(int32_t n, float lo, float hi, const uint16_t *y, uint8_t *mask)
{
#ifdef TT_F16_MVE_OPS
    tt_clamp_mask_mve(n, lo, hi, 0, y, mask);
#else
    tt_clamp_mask_walk(n, lo, hi, 0, y, mask);
#endif
}
