/* mask_grad: dz = dy where the forward output's 1-bit mask (tt_mask.h, tt_mask.c) is set, else +0.
 * Byte-aligned runs of eight take the mask a byte at a time: a full byte copies, an empty one zeroes (dz may be
 * dy itself: every element is read before it is written). */
#include "tt_mask.h"
#include "tt_simd.h"
#include "tt_f16.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_float_mve.h" /* target.kernels: mve - VPSEL under the mask bits, the same bits */
#include "tt_f16_mve_ops.h"
#endif

void tt_mask_grad_f32(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dy, float *dz)
{
    int32_t i = 0, j;
    uint32_t b = (uint32_t)bit_offset;
#ifdef TT_FLOAT_MVE
    tt_mask_grad_f32_mve(n, bit_offset, mask, dy, dz);
    return;
#endif
    for (; i < n && (b & 7u) != 0u; ++i, ++b) {
        dz[i] = ((mask[b >> 3] >> (b & 7u)) & 1u) ? dy[i] : 0.0f;
    }
#if TT_HOST_SIMD
    /* The native host build: four elements per AND with the lanes of the mask nibble (all ones: dy's bits; zero:
     * +0.0f), the plain loop's results without its branches. */
    {
        static const uint32_t lanes[16][4] = {
            {0, 0, 0, 0}, {~0u, 0, 0, 0}, {0, ~0u, 0, 0}, {~0u, ~0u, 0, 0},
            {0, 0, ~0u, 0}, {~0u, 0, ~0u, 0}, {0, ~0u, ~0u, 0}, {~0u, ~0u, ~0u, 0},
            {0, 0, 0, ~0u}, {~0u, 0, 0, ~0u}, {0, ~0u, 0, ~0u}, {~0u, ~0u, 0, ~0u},
            {0, 0, ~0u, ~0u}, {~0u, 0, ~0u, ~0u}, {0, ~0u, ~0u, ~0u}, {~0u, ~0u, ~0u, ~0u}};
        for (; i + 8 <= n; i += 8, b += 8) {
            const uint32_t m = mask[b >> 3];
            const __m128 m0 = _mm_loadu_ps((const float *)(const void *)lanes[m & 15u]);
            const __m128 m1 = _mm_loadu_ps((const float *)(const void *)lanes[m >> 4]);
            const __m128 lo = _mm_and_ps(_mm_loadu_ps(dy + i), m0), hi = _mm_and_ps(_mm_loadu_ps(dy + i + 4), m1);
            _mm_storeu_ps(dz + i, lo);
            _mm_storeu_ps(dz + i + 4, hi);
        }
    }
#endif
    for (; i + 8 <= n; i += 8, b += 8) {
        const uint32_t m = mask[b >> 3];
        if (m == 0xFFu) {
            for (j = 0; j < 8; ++j) {
                dz[i + j] = dy[i + j];
            }
        } else if (m == 0u) {
            for (j = 0; j < 8; ++j) {
                dz[i + j] = 0.0f;
            }
        } else {
            for (j = 0; j < 8; ++j) {
                dz[i + j] = ((m >> j) & 1u) ? dy[i + j] : 0.0f;
            }
        }
    }
    for (; i < n; ++i, ++b) {
        dz[i] = ((mask[b >> 3] >> (b & 7u)) & 1u) ? dy[i] : 0.0f;
    }
}

/* Element by element: in place is safe where dz is no wider than dy (each element read before it is written); an fp32
 * dz over an fp16 dy would overwrite elements 2i, 2i + 1 unread, and is never planned (fp16_mixed.fp16_written keeps
 * a dy fp32 whose in-place reader writes fp32). A kept fp16 dy is copied
 * as its bits (widening and rounding back is the identity), a dropped one is +0. Inlined with each operand's other
 * pointer constant null, so every form below has its own loop without per-element tests. */
static inline __attribute__((always_inline)) void tt_mask_grad_walk(int32_t n, uint32_t b, const uint8_t *mask,
                                                                    const float *dyf, const uint16_t *dyh,
                                                                    float *dzf, uint16_t *dzh)
{
    int32_t i;
    for (i = 0; i < n; ++i, ++b) {
        const int keep = (int)((mask[b >> 3] >> (b & 7u)) & 1u);
        if (dzh != 0) {
            dzh[i] = !keep ? (uint16_t)0u : dyh != 0 ? dyh[i] : tt_f16_narrow(dyf[i]);
        } else {
            dzf[i] = !keep ? 0.0f : dyh != 0 ? tt_f16_read(dyh[i]) : dyf[i];
        }
    }
}

void tt_mask_grad_f16(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dyf, const uint16_t *dyh,
                      float *dzf, uint16_t *dzh)
{
    const uint32_t b = (uint32_t)bit_offset;
#ifdef TT_F16_MVE_OPS
    if (dzh != 0 || dyh != 0) {
        tt_mask_grad_f16_mve(n, bit_offset, mask, dyf, dyh, dzf, dzh);
        return;
    }
#endif
    if (dzh != 0 && dyh != 0) {
        tt_mask_grad_walk(n, b, mask, 0, dyh, 0, dzh);
    } else if (dzh != 0) {
        tt_mask_grad_walk(n, b, mask, dyf, 0, 0, dzh);
    } else if (dyh != 0) {
        tt_mask_grad_walk(n, b, mask, 0, dyh, dzf, 0);
    } else {
        tt_mask_grad_f32(n, bit_offset, mask, dyf, dzf);
    }
}
