/* The native host build's AVX2 kernel set (issue 14: "a host-only kernel set with SIMD that gives identical bits").
 *
 * TT_HOST_AVX2 is 1 on the host board (TT_USE_HOST_SIMD=1) when the compiler targets AVX2: the host board compiles
 * with -march=x86-64-v3 where the build machine runs it (boards.HOST_ISA_PROBE), so a machine without AVX2 builds
 * the SSE2 / portable kernels instead. Never on a device build (TT_SIMD) nor in the Cortex-M cross-compile.
 *
 * The kernels (tt_dw_s8_avx2.h, tt_pw_s8_avx2.h) are integer arithmetic only: the same int32 sums as the portable
 * loops in another order (no sum can overflow, see ops/tt_conv2d.c's header), then tt_requant.h's fast
 * requantisation lane by lane, so their bytes equal the portable kernels' by construction (and by test:
 * tests/test_host_avx2.py). Each returns 0 when a shape or a channel's requantisation does not fit it, and its
 * portable kernel runs instead. This file's own tt_mask_grad_bits_f32 (the hidden stream's mask gradient) does no
 * arithmetic on floats: it selects each float's bits or +0 by its mask bit. No global state: scratch lives on the
 * stack with a stated bound. */
#ifndef TT_AVX2_H
#define TT_AVX2_H

#include "tt_simd.h"

#if TT_HOST_SIMD && defined(__AVX2__)
#define TT_HOST_AVX2 1
#else
#define TT_HOST_AVX2 0
#endif

#if TT_HOST_AVX2
#include <immintrin.h>
#include "tt_requant.h"

/* tt_requant_fast of eight int32 lanes: per lane t = x*m + k - [x<0]*2^31 in int64, result (t >> 32) >> sh, then
 * the activation clamp. AVX2 multiplies only the even 32-bit lanes into 64 bits (vpmuldq), so the even and the
 * odd lanes take one multiply each and k is kept split the same way (k_even: lanes 0, 2, 4, 6 as int64). */
typedef struct {
    __m256i m, sh, k_even, k_odd;
} tt_rq8;

/* The constants of lanes j = 0..7 from f[j] (a lane with no channel behind it may hold zeros: its result is
 * never stored). */
static inline tt_rq8 tt_rq8_make(const tt_requant_fast f[8])
{
    int32_t m[8], sh[8];
    int64_t ke[4], ko[4];
    int j;
    tt_rq8 r;
    for (j = 0; j < 8; ++j) {
        m[j] = f[j].multiplier;
        sh[j] = f[j].sh;
        if (j & 1) {
            ko[j / 2] = f[j].k;
        } else {
            ke[j / 2] = f[j].k;
        }
    }
    r.m = _mm256_loadu_si256((const __m256i *)(const void *)m);
    r.sh = _mm256_loadu_si256((const __m256i *)(const void *)sh);
    r.k_even = _mm256_loadu_si256((const __m256i *)(const void *)ke);
    r.k_odd = _mm256_loadu_si256((const __m256i *)(const void *)ko);
    return r;
}

static inline __m256i tt_rq8_apply(const tt_rq8 *r, __m256i acc, __m256i lo, __m256i hi)
{
    /* [x<0]*2^31 of each lane, placed in the low word of its 64-bit product: the sign bit of the lane itself for
     * the even lanes, of the lane shifted down 32 bits for the odd ones */
    const __m256i sign_bit = _mm256_set1_epi64x(0x80000000LL);
    const __m256i neg = _mm256_srai_epi32(acc, 31);
    __m256i te = _mm256_add_epi64(_mm256_mul_epi32(acc, r->m), r->k_even);
    __m256i to = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(acc, 32), _mm256_srli_epi64(r->m, 32)),
                                  r->k_odd);
    __m256i v;
    te = _mm256_sub_epi64(te, _mm256_and_si256(neg, sign_bit));
    to = _mm256_sub_epi64(to, _mm256_and_si256(_mm256_srli_epi64(neg, 32), sign_bit));
    /* the high words: even lanes moved down, odd lanes already in place */
    v = _mm256_blend_epi32(_mm256_srli_epi64(te, 32), to, 0xAA);
    v = _mm256_srav_epi32(v, r->sh);
    return _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
}

/* Eight int32 lanes already in [-128, 127] as eight int8 (the saturating packs change nothing). */
static inline __m128i tt_avx2_narrow8(__m256i v)
{
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packs_epi16(p16, p16);
}

/* tt_hs_mask_grad_f32 (tt_hidden_stream.c): dz[p] = bit ? dy[p] : +0, as the bits of dy ANDed with 0 - bit. The
 * same bits (a kept -0, NaN or Inf is copied, a dropped element is +0) without the data-dependent branch, which
 * mispredicts on ReLU masks. Host only: the Cortex-M builds keep the portable loop, whose instruction counts the
 * device tests pin. */
static inline void tt_mask_grad_bits_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy,
                                         float *dz)
{
    int32_t p;
    for (p = 0; p < P; ++p) {
        const uint32_t b = (uint32_t)p * (uint32_t)C + (uint32_t)c;
        uint32_t u;
        memcpy(&u, dy + p, 4);
        u &= 0u - ((uint32_t)(mask[b >> 3] >> (b & 7u)) & 1u);
        memcpy(dz + p, &u, 4);
    }
}
#endif /* TT_HOST_AVX2 */

#endif /* TT_AVX2_H */
