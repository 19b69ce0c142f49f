/* int8 1x1 convolution (no padding, any stride) for the native host build with AVX2 (tt_avx2.h).
 *
 * Why this shape: a pixel's output channels are independent sums over the same input channels, so the kernel
 * vectorises over output channels and needs no horizontal sum. For each pair of input channels (c, c+1) it
 * broadcasts the pixel's int16 pair (x[c] - z, x[c+1] - z) to every 32-bit lane and VPMADDWD multiplies it with
 * the pair's weights of 8 output channels and adds the two products into the channels' int32 sums. Up to 32
 * output channels (4 accumulators) stay in registers while a pixel's input channels stream past.
 *
 * The weights ([OC][C] int8) are repacked per call, one block of 32 output channels at a time, as int16
 * [C/2][32][2] (a zero tail for odd C and for a short last block) into a stack buffer of at most
 * TT_PW_AVX2_MAX_C * 64 bytes; all pixels then run against that block, which stays in L1/L2. Then tt_requant.h's
 * fast requantisation per lane (tt_rq8_apply). */
#ifndef TT_PW_S8_AVX2_H
#define TT_PW_S8_AVX2_H

#include "tt_avx2.h"

#if TT_HOST_AVX2

#define TT_PW_AVX2_MAX_C 1024 /* input-channel bound: the packed block is 64 * C bytes, the pixel's pairs 2 * C */
#define TT_PW_AVX2_BLOCK 32   /* output channels per block: 4 x 8 int32 lanes */

/* One pixel's outputs of a block of nv * 8 channels (nv a constant 1..4 at each call, so the unused
 * accumulators vanish): sums from bias, pairs xz (C2 of them) against the packed block wp, requantised. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void tt_pw_avx2_pixel(int nv, const int16_t *xz, int32_t C2, const int16_t *wp, const __m256i *bias,
                                    const tt_rq8 *rq, __m256i lo, __m256i hi, int8_t *yp, int32_t n)
{
    __m256i a0 = bias[0], a1 = bias[1], a2 = bias[2], a3 = bias[3];
    int32_t c, k;
    for (c = 0; c < C2; ++c, wp += 2 * TT_PW_AVX2_BLOCK) {
        int32_t pair;
        __m256i xv;
        memcpy(&pair, xz + 2 * c, 4);
        xv = _mm256_set1_epi32(pair);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(xv, _mm256_loadu_si256((const __m256i *)(const void *)wp)));
        if (nv > 1) {
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(xv, _mm256_loadu_si256((const __m256i *)(const void *)(wp + 16))));
        }
        if (nv > 2) {
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(xv, _mm256_loadu_si256((const __m256i *)(const void *)(wp + 32))));
        }
        if (nv > 3) {
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(xv, _mm256_loadu_si256((const __m256i *)(const void *)(wp + 48))));
        }
    }
    for (k = 0; k < nv; ++k) {
        const __m256i a = k == 0 ? a0 : k == 1 ? a1 : k == 2 ? a2 : a3;
        const __m128i o = tt_avx2_narrow8(tt_rq8_apply(&rq[k], a, lo, hi));
        if (n >= 8 * (k + 1)) {
            _mm_storel_epi64((__m128i *)(void *)(yp + 8 * k), o);
        } else {
            int8_t tmp[16];
            _mm_storeu_si128((__m128i *)(void *)tmp, o);
            memcpy(yp + 8 * k, tmp, (size_t)(n - 8 * k));
        }
    }
}

/* The pixel's pairs (x[c] - z) as int16, a zero after an odd last channel. */
static inline void tt_pw_avx2_pairs(const int8_t *xp, int32_t C, __m256i z16, int16_t zin, int16_t *xz)
{
    int32_t c = 0;
    for (; c + 16 <= C; c += 16) {
        const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(xp + c)));
        _mm256_storeu_si256((__m256i *)(void *)(xz + c), _mm256_sub_epi16(v, z16));
    }
    for (; c < C; ++c) {
        xz[c] = (int16_t)(xp[c] - zin);
    }
    xz[C] = 0;
}

/* Weight pairs (w[c], w[c+1]) of block rows [j0, j1), pairs [p0, C2), as two int16 in one 32-bit word of the
 * packed block (zero for rows j >= n and for the missing partner of an odd last channel). */
static inline void tt_pw_avx2_pack_rows(const int8_t *w, int32_t C, int32_t b0, int32_t n, int32_t j0, int32_t j1,
                                        int32_t p0, int16_t *wp)
{
    const int32_t C2 = (C + 1) / 2;
    int32_t j, c;
    for (j = j0; j < j1; ++j) {
        const int8_t *wr = w + (int64_t)(b0 + (j < n ? j : 0)) * C;
        for (c = p0; c < C2; ++c) {
            const int32_t w0 = j < n ? wr[2 * c] : 0, w1 = j < n && 2 * c + 1 < C ? wr[2 * c + 1] : 0;
            const uint32_t pair = (uint32_t)(uint16_t)(int16_t)w0 | (uint32_t)(uint16_t)(int16_t)w1 << 16;
            memcpy(wp + ((int64_t)c * TT_PW_AVX2_BLOCK + j) * 2, &pair, 4);
        }
    }
}

/* The block of output channels [b0, b0 + n) as int16 [C2][32][2]. The repacking is a transpose (pairs of input
 * channels become rows), so eight full rows and 16 channels at a time go through an 8x8 transpose of 32-bit
 * pairs in registers; the rest (channel tail, rows past n) word by word. Per call, so no state outlives it: at
 * the small late-layer images the scalar transpose cost as much as the convolution itself. */
static inline void tt_pw_avx2_pack(const int8_t *w, int32_t C, int32_t b0, int32_t n, int16_t *wp)
{
    const int32_t C16 = C & ~15;
    int32_t j0, c, k;
    for (j0 = 0; j0 < TT_PW_AVX2_BLOCK; j0 += 8) {
        if (j0 + 8 > n) {
            tt_pw_avx2_pack_rows(w, C, b0, n, j0, j0 + 8, 0, wp);
            continue;
        }
        for (c = 0; c < C16; c += 16) {
            __m256i r[8], t[8], u[8];
            for (k = 0; k < 8; ++k) { /* row j0 + k: pairs c/2 .. c/2 + 7 as int32 lanes */
                r[k] = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(const void *)(w + (int64_t)(b0 + j0 + k) * C + c)));
            }
            for (k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
            }
            for (k = 0; k < 8; k += 4) { /* u[k + i]: pair i (| i + 4) of rows k .. k + 3 */
                u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
                u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
                u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
                u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
            }
            for (k = 0; k < 4; ++k) { /* pair k and pair k + 4 of the eight rows */
                _mm256_storeu_si256((__m256i *)(void *)(wp + ((int64_t)(c / 2 + k) * TT_PW_AVX2_BLOCK + j0) * 2),
                                    _mm256_permute2x128_si256(u[k], u[k + 4], 0x20));
                _mm256_storeu_si256((__m256i *)(void *)(wp + ((int64_t)(c / 2 + k + 4) * TT_PW_AVX2_BLOCK + j0) * 2),
                                    _mm256_permute2x128_si256(u[k], u[k + 4], 0x31));
            }
        }
        tt_pw_avx2_pack_rows(w, C, b0, n, j0, j0 + 8, C16 / 2, wp);
    }
}

/* tt_conv2d_s8 when the shape fits: 1x1, no padding, in_c <= TT_PW_AVX2_MAX_C, every output channel's
 * requantisation in the fast form. 1 when done, 0 when the portable kernel must run (nothing written). */
static int tt_pw_s8_avx2(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                         const int32_t *bias, int8_t *y)
{
    const int32_t C = d->in_c, OC = d->out_c, C2 = (C + 1) / 2;
    const __m256i z16 = _mm256_set1_epi16((int16_t)q->input_zero_point);
    const __m256i lo = _mm256_set1_epi32(q->act_min), hi = _mm256_set1_epi32(q->act_max);
    int16_t wp[TT_PW_AVX2_MAX_C / 2 * 2 * TT_PW_AVX2_BLOCK];
    int16_t xz[TT_PW_AVX2_MAX_C + 16];
    int32_t o, b0, j, k, bi, oy, ox;
    if (!(d->k_h == 1 && d->k_w == 1 && d->pad_top == 0 && d->pad_left == 0 && C >= 1 &&
          C <= TT_PW_AVX2_MAX_C && OC >= 1 && d->stride_h >= 1 && d->stride_w >= 1 &&
          (d->out_h - 1) * d->stride_h < d->in_h && (d->out_w - 1) * d->stride_w < d->in_w)) {
        return 0;
    }
    for (o = 0; o < OC; ++o) {
        tt_requant1 r = tt_requant_channel(q, o);
        tt_requant_fast f;
        if (!tt_requant_fast_init(&f, &r)) {
            return 0;
        }
    }
    for (b0 = 0; b0 < OC; b0 += TT_PW_AVX2_BLOCK) {
        const int32_t n = OC - b0 < TT_PW_AVX2_BLOCK ? OC - b0 : TT_PW_AVX2_BLOCK, nv = (n + 7) / 8;
        __m256i vb[4];
        tt_rq8 rq[4];
        tt_pw_avx2_pack(w, C, b0, n, wp);
        for (k = 0; k < 4; ++k) {
            int32_t bb[8];
            tt_requant_fast f[8];
            for (j = 0; j < 8; ++j) {
                const int32_t oc = b0 + 8 * k + j;
                memset(&f[j], 0, sizeof f[j]);
                bb[j] = oc < b0 + n && bias != 0 ? bias[oc] : 0;
                if (oc < b0 + n) {
                    tt_requant1 r = tt_requant_channel(q, oc);
                    tt_requant_fast_init(&f[j], &r);
                }
            }
            vb[k] = _mm256_loadu_si256((const __m256i *)(const void *)bb);
            rq[k] = tt_rq8_make(f);
        }
        for (bi = 0; bi < d->batches; ++bi) {
            for (oy = 0; oy < d->out_h; ++oy) {
                for (ox = 0; ox < d->out_w; ++ox) {
                    const int8_t *xp = x + (((int64_t)bi * d->in_h + (int64_t)oy * d->stride_h) * d->in_w +
                                            (int64_t)ox * d->stride_w) * C;
                    int8_t *yp = y + (((int64_t)bi * d->out_h + oy) * d->out_w + ox) * OC + b0;
                    tt_pw_avx2_pairs(xp, C, z16, (int16_t)q->input_zero_point, xz);
                    switch (nv) { /* constant nv per call: each case compiles its own accumulator set */
                    case 1: tt_pw_avx2_pixel(1, xz, C2, wp, vb, rq, lo, hi, yp, n); break;
                    case 2: tt_pw_avx2_pixel(2, xz, C2, wp, vb, rq, lo, hi, yp, n); break;
                    case 3: tt_pw_avx2_pixel(3, xz, C2, wp, vb, rq, lo, hi, yp, n); break;
                    default: tt_pw_avx2_pixel(4, xz, C2, wp, vb, rq, lo, hi, yp, n); break;
                    }
                }
            }
        }
    }
    return 1;
}

#endif /* TT_HOST_AVX2 */

#endif /* TT_PW_S8_AVX2_H */
