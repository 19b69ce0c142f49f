/* Helium (Armv8.1-M MVE) versions of tt_dot.h's int8 inner products, for `target.kernels: mve` (TT_USE_MVE=1) on a
 * core with MVE (Cortex-M55: __ARM_FEATURE_MVE). tt_dot.h includes this file after its own definitions; the macros at
 * the end then send the kernels' calls here, while `(tt_dot_s8)(...)` still reaches the reference loop (the test
 * tests/test_m55.py compares the two that way).
 *
 * Sixteen int8 taps per instruction: VMLADAVA.S8 multiplies the 16 byte lanes of x and w and adds all 16 products to a
 * 32-bit scalar accumulator; VADDVA.S8 adds the 16 lanes themselves. The last partial vector is predicated (VCTP8 +
 * zeroing loads), so no byte is read past n and the inactive lanes add nothing.
 *
 * Why the bits are the portable loop's: every product is exact (int8 x int8 fits 16 bits) and integer addition is
 * associative, so summing in another order gives the same int32 as long as the sum fits, which it does for every
 * layer we run (< 2^16 taps, the same bound tt_dot.h's DSP path relies on). tt_dot_s8's zero point is applied once,
 * as sum(x*w) - z*sum(w) (the same integer as sum((x-z)*w)), computed in uint32 so that no C signed overflow can
 * occur on the way; the vector instructions themselves wrap modulo 2^32. */
#ifndef TT_DOT_MVE_H
#define TT_DOT_MVE_H

#include <arm_mve.h>
#include <stdint.h>

#define TT_DOT_MVE 1

static inline int32_t tt_dot_s8_mve(const int8_t *x, const int8_t *w, int32_t n, int32_t x_zero_point)
{
    int32_t dot = 0, wsum = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const int8x16_t wv = vld1q_s8(w + i);
        dot = vmladavaq_s8(dot, vld1q_s8(x + i), wv);
        wsum = vaddvaq_s8(wsum, wv);
    }
    if (i < n) { /* the tail: lanes >= n - i are loaded as 0 and add nothing */
        const mve_pred16_t p = vctp8q((uint32_t)(n - i));
        const int8x16_t wv = vldrbq_z_s8(w + i, p);
        dot = vmladavaq_s8(dot, vldrbq_z_s8(x + i, p), wv);
        wsum = vaddvaq_s8(wsum, wv);
    }
    return (int32_t)((uint32_t)dot - (uint32_t)x_zero_point * (uint32_t)wsum);
}

/* Four weight rows `ws` bytes apart against one input run (no zero point), tt_dot.h's signature: each x vector is
 * loaded once for the four rows. */
static inline void tt_dot4_raw_s8_mve(const int8_t *x, const int8_t *w0, int32_t ws, int32_t n, int32_t acc[4])
{
    const int8_t *w1 = w0 + ws, *w2 = w0 + 2 * ws, *w3 = w0 + 3 * ws;
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], i = 0;
    for (; i + 16 <= n; i += 16) {
        const int8x16_t xv = vld1q_s8(x + i);
        a0 = vmladavaq_s8(a0, xv, vld1q_s8(w0 + i));
        a1 = vmladavaq_s8(a1, xv, vld1q_s8(w1 + i));
        a2 = vmladavaq_s8(a2, xv, vld1q_s8(w2 + i));
        a3 = vmladavaq_s8(a3, xv, vld1q_s8(w3 + i));
    }
    if (i < n) {
        const mve_pred16_t p = vctp8q((uint32_t)(n - i));
        const int8x16_t xv = vldrbq_z_s8(x + i, p);
        a0 = vmladavaq_s8(a0, xv, vldrbq_z_s8(w0 + i, p));
        a1 = vmladavaq_s8(a1, xv, vldrbq_z_s8(w1 + i, p));
        a2 = vmladavaq_s8(a2, xv, vldrbq_z_s8(w2 + i, p));
        a3 = vmladavaq_s8(a3, xv, vldrbq_z_s8(w3 + i, p));
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* One weight row (no zero point). */
static inline int32_t tt_dot1_raw_s8_mve(const int8_t *x, const int8_t *w, int32_t n)
{
    int32_t acc = 0, i = 0;
    for (; i + 16 <= n; i += 16) acc = vmladavaq_s8(acc, vld1q_s8(x + i), vld1q_s8(w + i));
    if (i < n) {
        const mve_pred16_t p = vctp8q((uint32_t)(n - i));
        acc = vmladavaq_s8(acc, vldrbq_z_s8(x + i, p), vldrbq_z_s8(w + i, p));
    }
    return acc;
}

/* Function-like, so that a parenthesised name - (tt_dot_s8)(...) - still calls tt_dot.h's reference loop. */
#define tt_dot_s8(...) tt_dot_s8_mve(__VA_ARGS__)
#define tt_dot4_raw_s8(...) tt_dot4_raw_s8_mve(__VA_ARGS__)
#define tt_dot1_raw_s8(...) tt_dot1_raw_s8_mve(__VA_ARGS__)

#endif /* TT_DOT_MVE_H */
