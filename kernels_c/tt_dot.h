/* The int8 inner product of conv2d / fully_connected: sum over i of (x[i] - x_zero_point) * w[i].
 *
 * Portable C99 by default. With TT_USE_DSP=1 on a core with the DSP extension (Cortex-M4/M7/M33:
 * __ARM_FEATURE_DSP and __ARM_FEATURE_SIMD32), four taps at a time go through ACLE SIMD: SXTAB16 sign-extends
 * bytes 0/2 (and, after a rotate by 8, bytes 1/3) to int16 lanes while adding -zero_point (|x - z| <= 255 fits an
 * int16 lane), SXTB16 does the same for the weights, and SMLAD adds both lane products to the int32
 * accumulator. Integer addition is associative and the sum never overflows int32 for any layer we run
 * (< 2^16 taps), so the result is identical to the portable loop (and to the numpy golden model) bit for bit.
 * This is the CMSIS-NN arm_nn_mat_mult / read_and_pad technique. The native host build (TT_HOST_SIMD, tt_simd.h)
 * does the same eight taps at a time with SSE2 (sign-extend to int16, PMADDWD into int32 lanes). */
#ifndef TT_DOT_H
#define TT_DOT_H

#include <stdint.h>
#include <string.h>

#include "tt_simd.h"

#define TT_DOT_DSP TT_SIMD

#if TT_HOST_SIMD
/* Eight int8 at p sign-extended to eight int16 lanes (SSE2 has no PMOVSXBW: interleave with the sign bytes). */
static inline __m128i tt_sse_s8x8(const int8_t *p)
{
    const __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm_unpacklo_epi8(v, _mm_cmpgt_epi8(_mm_setzero_si128(), v));
}

/* The sum of the four int32 lanes. */
static inline int32_t tt_sse_hsum(__m128i v)
{
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
    return _mm_cvtsi128_si32(v);
}
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
            xw = tt_ld32(x + i);
            ww = tt_ld32(w + i);
            x02 = __sxtab16(off, (int8x4_t)xw);
            x13 = __sxtab16(off, (int8x4_t)((xw >> 8) | (xw << 24)));
            w02 = tt_sx02(ww);
            w13 = tt_sx13(ww);
            acc = __smlad(x02, w02, acc);
            acc = __smlad(x13, w13, acc);
        }
    }
#elif TT_HOST_SIMD
    if (n >= 8) {
        const __m128i z = _mm_set1_epi16((int16_t)x_zero_point); /* |x - z| <= 255: an int16 lane */
        __m128i s = _mm_setzero_si128();
        for (; i + 8 <= n; i += 8) {
            s = _mm_add_epi32(s, _mm_madd_epi16(_mm_sub_epi16(tt_sse_s8x8(x + i), z), tt_sse_s8x8(w + i)));
        }
        acc = tt_sse_hsum(s);
    }
#endif
    for (; i < n; ++i) {
        acc += ((int32_t)x[i] - x_zero_point) * (int32_t)w[i];
    }
    return acc;
}

/* The raw products of one input run with four weight rows `ws` bytes apart (w0, w0 + ws, w0 + 2 ws, w0 + 3 ws):
 * acc[j] += sum over i of x[i] * w_j[i] (no zero point: the conv kernels subtract z_x * sum(w_j) once per output,
 * exact in int32 since the whole sum fits). Each x byte is loaded once for four output channels. DSP: four taps
 * per word, as tt_dot_s8, the rotate folded into SXTB16; the rows addressed from one pointer and one stride
 * leave the loop's values in registers. */
static inline void tt_dot4_raw_s8(const int8_t *x, const int8_t *w0, int32_t ws, int32_t n, int32_t acc[4])
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    int32_t r = n;
    const int32_t ws2 = 2 * ws;
    const int8_t *w3 = w0 + 3 * ws;
#if TT_DOT_DSP && defined(__arm__) && defined(__GNUC__) && defined(__OPTIMIZE__)
    int32_t q = n >> 2;
    r = n & 3;
    if (q > 0) {
        /* The loop of the C version below written out: GCC's register allocation spilled pointers and sums of it
         * to the stack inside the loop (8 extra loads/stores per word); by hand it is 26 instructions per 16 MACs:
         * one load of x, two SXTB16 of it, and per row a load, two SXTB16 and two SMLAD. Rows 1..3 are addressed
         * off row 0 ([w0, ws], [w0, ws, lsl #1], one ADD for row 3), so the loop needs 12 registers (13 did not
         * always leave GCC enough around it). */
        w3 += 4 * q;
        uint32_t t0, t1, t2, t3;
        __asm__ volatile(
            "1:\n\t"
            "ldr    %[t0], [%[x]], #4\n\t"
            "ldr    %[t2], [%[w0], %[ws]]\n\t"
            "sxtb16 %[t1], %[t0], ror #8\n\t"
            "sxtb16 %[t0], %[t0]\n\t"
            "sxtb16 %[t3], %[t2]\n\t"
            "sxtb16 %[t2], %[t2], ror #8\n\t"
            "smlad  %[a1], %[t0], %[t3], %[a1]\n\t"
            "smlad  %[a1], %[t1], %[t2], %[a1]\n\t"
            "ldr    %[t2], [%[w0], %[ws], lsl #1]\n\t"
            "sxtb16 %[t3], %[t2]\n\t"
            "sxtb16 %[t2], %[t2], ror #8\n\t"
            "smlad  %[a2], %[t0], %[t3], %[a2]\n\t"
            "smlad  %[a2], %[t1], %[t2], %[a2]\n\t"
            "add    %[t2], %[w0], %[ws], lsl #1\n\t"
            "ldr    %[t2], [%[t2], %[ws]]\n\t"
            "sxtb16 %[t3], %[t2]\n\t"
            "sxtb16 %[t2], %[t2], ror #8\n\t"
            "smlad  %[a3], %[t0], %[t3], %[a3]\n\t"
            "smlad  %[a3], %[t1], %[t2], %[a3]\n\t"
            "ldr    %[t2], [%[w0]], #4\n\t"
            "sxtb16 %[t3], %[t2]\n\t"
            "sxtb16 %[t2], %[t2], ror #8\n\t"
            "smlad  %[a0], %[t0], %[t3], %[a0]\n\t"
            "smlad  %[a0], %[t1], %[t2], %[a0]\n\t"
            "subs   %[q], %[q], #1\n\t"
            "bne    1b\n\t"
            : [x] "+r"(x), [w0] "+r"(w0), [q] "+r"(q), [a0] "+r"(a0), [a1] "+r"(a1),
              [a2] "+r"(a2), [a3] "+r"(a3), [t0] "=&r"(t0), [t1] "=&r"(t1), [t2] "=&r"(t2), [t3] "=&r"(t3)
            : [ws] "r"(ws)
            : "cc", "memory");
    }
#elif TT_DOT_DSP
    int32_t q = n >> 2;
    r = n & 3;
    while (q-- > 0) {
        const uint32_t xw = tt_ld32(x);
        const int16x2_t x02 = tt_sx02(xw), x13 = tt_sx13(xw);
        uint32_t ww;
        x += 4;
        ww = tt_ld32(w0);
        a0 = __smlad(x02, tt_sx02(ww), a0);
        a0 = __smlad(x13, tt_sx13(ww), a0);
        ww = tt_ld32(w0 + ws);
        a1 = __smlad(x02, tt_sx02(ww), a1);
        a1 = __smlad(x13, tt_sx13(ww), a1);
        ww = tt_ld32(w0 + ws2);
        w0 += 4;
        a2 = __smlad(x02, tt_sx02(ww), a2);
        a2 = __smlad(x13, tt_sx13(ww), a2);
        ww = tt_ld32(w3);
        w3 += 4;
        a3 = __smlad(x02, tt_sx02(ww), a3);
        a3 = __smlad(x13, tt_sx13(ww), a3);
    }
#elif TT_HOST_SIMD
    if (n >= 8) {
        __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
        int32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m128i xv = tt_sse_s8x8(x + i);
            s0 = _mm_add_epi32(s0, _mm_madd_epi16(xv, tt_sse_s8x8(w0 + i)));
            s1 = _mm_add_epi32(s1, _mm_madd_epi16(xv, tt_sse_s8x8(w0 + ws + i)));
            s2 = _mm_add_epi32(s2, _mm_madd_epi16(xv, tt_sse_s8x8(w0 + ws2 + i)));
            s3 = _mm_add_epi32(s3, _mm_madd_epi16(xv, tt_sse_s8x8(w3 + i)));
        }
        a0 += tt_sse_hsum(s0);
        a1 += tt_sse_hsum(s1);
        a2 += tt_sse_hsum(s2);
        a3 += tt_sse_hsum(s3);
        x += i;
        w0 += i;
        w3 += i;
        r = n - i;
    }
#endif
    while (r-- > 0) {
        const int32_t xv = *x++;
        a0 += xv * w0[0];
        a1 += xv * w0[ws];
        a2 += xv * w0[ws2];
        a3 += xv * *w3++;
        ++w0;
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
    int32_t r = n;
#if TT_DOT_DSP
    int32_t q = n >> 2;
    r = n & 3;
    while (q-- > 0) {
        const uint32_t xw = tt_ld32(x), ww = tt_ld32(w);
        x += 4;
        w += 4;
        acc = __smlad(tt_sx02(xw), tt_sx02(ww), acc);
        acc = __smlad(tt_sx13(xw), tt_sx13(ww), acc);
    }
#elif TT_HOST_SIMD
    if (n >= 8) {
        __m128i s = _mm_setzero_si128();
        int32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            s = _mm_add_epi32(s, _mm_madd_epi16(tt_sse_s8x8(x + i), tt_sse_s8x8(w + i)));
        }
        acc = tt_sse_hsum(s);
        x += i;
        w += i;
        r = n - i;
    }
#endif
    while (r-- > 0) {
        acc += (int32_t)*x++ * (int32_t)*w++;
    }
    return acc;
}

/* sum over i of w[i] (a weight row's sum, for the conv kernels' zero-point term). DSP: two SXTAB16 per word add
 * bytes 0/2 and 1/3 into int16 lanes (|lane| <= 128 per word: exact for up to 255 words, then the lanes are added
 * into the int32 sum with SMLAD against (1, 1)); integer sums in another order, the same result. */
static inline int32_t tt_sum_s8(const int8_t *w, int32_t n)
{
    int32_t s = 0, i = 0;
#if TT_DOT_DSP
    while (n - i >= 4) {
        const int32_t words = (n - i) >> 2, e = i + 4 * (words > 255 ? 255 : words);
        int16x2_t a = 0, b = 0;
        for (; i < e; i += 4) {
            const uint32_t v = tt_ld32(w + i);
            a = __sxtab16(a, (int8x4_t)v);
            b = tt_sxtab16_13(b, v);
        }
        s = __smlad(a, (int16x2_t)0x00010001, __smlad(b, (int16x2_t)0x00010001, s));
    }
#endif
    for (; i < n; ++i) {
        s += w[i];
    }
    return s;
}

/* target.kernels: mve - Helium versions replace the three dot products above (not tt_sum_s8) for the code that
 * includes this file. */
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_dot_mve.h"
#endif

#endif /* TT_DOT_H */
