/* The int8 inner product of conv2d / fully_connected: sum over i of (x[i] - x_zero_point) * w[i].
 *
 * Portable C99 by default. With TT_USE_DSP=1 on a core with the DSP extension (Cortex-M4/M7/M33:
 * __ARM_FEATURE_DSP and __ARM_FEATURE_SIMD32), four taps at a time go through ACLE SIMD: SXTAB16 sign-extends
 * bytes 0/2 (and, after a rotate by 8, bytes 1/3) to int16 lanes while adding -zero_point (|x - z| <= 255 fits an
 * int16 lane), SXTB16 does the same for the weights, and SMLAD adds both lane products to the int32
 * accumulator. Integer addition is associative and the sum never overflows int32 for any layer we run
 * (< 2^16 taps), so the result is identical to the portable loop (and to the numpy golden model) bit for bit.
 * This is the CMSIS-NN arm_nn_mat_mult / read_and_pad technique. */
#ifndef TT_DOT_H
#define TT_DOT_H

#include <stdint.h>
#include <string.h>

#if defined(TT_USE_DSP) && TT_USE_DSP && defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>
#define TT_DOT_DSP 1
#else
#define TT_DOT_DSP 0
#endif

static inline int32_t tt_dot_s8(const int8_t *x, const int8_t *w, int32_t n, int32_t x_zero_point)
{
    int32_t acc = 0;
    int32_t i = 0;
#if TT_DOT_DSP
    {
        const uint32_t neg = (uint32_t)(uint16_t)(int16_t)(-x_zero_point);
        const int16x2_t off = (int16x2_t)((neg << 16) | neg);
        for (; i + 4 <= n; i += 4) {
            uint32_t xw, ww;
            int16x2_t x02, x13, w02, w13;
            memcpy(&xw, x + i, 4); /* one unaligned LDR on M4/M7 */
            memcpy(&ww, w + i, 4);
            x02 = __sxtab16(off, (int8x4_t)xw);
            x13 = __sxtab16(off, (int8x4_t)((xw >> 8) | (xw << 24)));
            w02 = __sxtb16((int8x4_t)ww);
            w13 = __sxtb16((int8x4_t)((ww >> 8) | (ww << 24)));
            acc = __smlad(x02, w02, acc);
            acc = __smlad(x13, w13, acc);
        }
    }
#endif
    for (; i < n; ++i) {
        acc += ((int32_t)x[i] - x_zero_point) * (int32_t)w[i];
    }
    return acc;
}

/* The raw products of one input run with four weight rows at once: acc[j] += sum over i of x[i] * w_j[i] (no zero
 * point: the conv kernels subtract z_x * sum(w_j) once per output, exact in int32 since the whole sum fits).
 * Each x byte is loaded once for four output channels. DSP: four taps per word, as tt_dot_s8. */
static inline void tt_dot4_raw_s8(const int8_t *x, const int8_t *w0, const int8_t *w1, const int8_t *w2,
                                  const int8_t *w3, int32_t n, int32_t acc[4])
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    int32_t i = 0;
#if TT_DOT_DSP
    for (; i + 4 <= n; i += 4) {
        uint32_t xw, ww;
        int16x2_t x02, x13;
        memcpy(&xw, x + i, 4);
        x02 = __sxtb16((int8x4_t)xw);
        x13 = __sxtb16((int8x4_t)((xw >> 8) | (xw << 24)));
        memcpy(&ww, w0 + i, 4);
        a0 = __smlad(x02, __sxtb16((int8x4_t)ww), a0);
        a0 = __smlad(x13, __sxtb16((int8x4_t)((ww >> 8) | (ww << 24))), a0);
        memcpy(&ww, w1 + i, 4);
        a1 = __smlad(x02, __sxtb16((int8x4_t)ww), a1);
        a1 = __smlad(x13, __sxtb16((int8x4_t)((ww >> 8) | (ww << 24))), a1);
        memcpy(&ww, w2 + i, 4);
        a2 = __smlad(x02, __sxtb16((int8x4_t)ww), a2);
        a2 = __smlad(x13, __sxtb16((int8x4_t)((ww >> 8) | (ww << 24))), a2);
        memcpy(&ww, w3 + i, 4);
        a3 = __smlad(x02, __sxtb16((int8x4_t)ww), a3);
        a3 = __smlad(x13, __sxtb16((int8x4_t)((ww >> 8) | (ww << 24))), a3);
    }
#endif
    for (; i < n; ++i) {
        const int32_t xv = x[i];
        a0 += xv * w0[i];
        a1 += xv * w1[i];
        a2 += xv * w2[i];
        a3 += xv * w3[i];
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* One weight row: sum over i of x[i] * w[i] (no zero point). */
static inline int32_t tt_dot1_raw_s8(const int8_t *x, const int8_t *w, int32_t n)
{
    int32_t acc = 0;
    int32_t i = 0;
#if TT_DOT_DSP
    for (; i + 4 <= n; i += 4) {
        uint32_t xw, ww;
        memcpy(&xw, x + i, 4);
        memcpy(&ww, w + i, 4);
        acc = __smlad(__sxtb16((int8x4_t)xw), __sxtb16((int8x4_t)ww), acc);
        acc = __smlad(__sxtb16((int8x4_t)((xw >> 8) | (xw << 24))), __sxtb16((int8x4_t)((ww >> 8) | (ww << 24))),
                      acc);
    }
#endif
    for (; i < n; ++i) {
        acc += (int32_t)x[i] * (int32_t)w[i];
    }
    return acc;
}

/* target.kernels: mve - Helium versions replace the three functions above for the code that includes this file. */
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_dot_mve.h"
#endif

#endif /* TT_DOT_H */
