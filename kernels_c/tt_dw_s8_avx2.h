/* int8 3x3 depthwise convolution (depth multiplier 1) for the native host build with AVX2 (tt_avx2.h).
 *
 * Why this shape: the NHWC layout puts the channels of a pixel side by side, so one 16-byte load gives a tap of
 * 16 channels. Each tap is widened to int16 and the input zero point subtracted ((x - z) fits int16), two taps are
 * interleaved and VPMADDWD multiplies them with the two taps' weights and adds the pair into int32 lanes: the 9 taps
 * (plus a zero tenth) cost 5 multiply-adds per half. Out-of-image taps contribute 0, as the portable kernel's
 * skipped taps do. Then tt_requant.h's fast requantisation per lane (tt_rq8_apply). The portable kernel loops
 * channel by channel with scalar taps; this one computes every channel of a pixel at once.
 *
 * The interleave works within 128-bit halves (unpacklo: channels 0-3 | 8-11, unpackhi: 4-7 | 12-15), so the
 * weights, biases and requantisation constants are laid out in that order once per call, and the final packs
 * (32 -> 16 -> 8 bits) restore channel order 0..15.
 *
 * In place (y == x): output row r may overwrite the buffer once no later output row reads the input under it.
 * The rows wait in a ring of R rows on the stack and are written back when the next row to compute starts
 * reading past them (tt_dw_avx2_ring_rows finds R, and the call falls back when R rows do not fit the ring). */
#ifndef TT_DW_S8_AVX2_H
#define TT_DW_S8_AVX2_H

#include "tt_avx2.h"

#if TT_HOST_AVX2

#define TT_DW_AVX2_MAX_C 1024          /* channel bound of the per-call constants (40 KB of stack) */
#define TT_DW_AVX2_RING_BYTES 32768     /* the in-place row ring */

/* The constants of 16 channels in the interleaved lane order: tap pairs (2t, 2t+1) of the weights, biases and
 * requantisation of the low / high halves. */
typedef struct {
    __m256i w_lo[5], w_hi[5], b_lo, b_hi;
    tt_rq8 rq_lo, rq_hi;
} tt_dw16_consts;

/* Channel of lane j (0..7) of the low / high half of a group. */
static inline int32_t tt_dw16_lane_lo(int32_t j) { return j < 4 ? j : j + 4; }
static inline int32_t tt_dw16_lane_hi(int32_t j) { return j < 4 ? j + 4 : j + 8; }

/* Group c0's constants; 0 when a channel's requantisation has no fast form. */
static int tt_dw16_consts_make(tt_dw16_consts *g, const tt_requant_s8 *q, const int8_t *w, const int32_t *bias,
                               int32_t C, int32_t c0)
{
    int16_t lo[16], hi[16];
    int32_t blo[8], bhi[8];
    tt_requant_fast flo[8], fhi[8];
    int32_t t, j, k;
    for (t = 0; t < 5; ++t) {
        for (j = 0; j < 8; ++j) {
            for (k = 0; k < 2; ++k) {
                const int32_t tap = 2 * t + k, cl = c0 + tt_dw16_lane_lo(j), ch = c0 + tt_dw16_lane_hi(j);
                lo[2 * j + k] = (int16_t)(tap < 9 && cl < C ? w[tap * C + cl] : 0);
                hi[2 * j + k] = (int16_t)(tap < 9 && ch < C ? w[tap * C + ch] : 0);
            }
        }
        g->w_lo[t] = _mm256_loadu_si256((const __m256i *)(const void *)lo);
        g->w_hi[t] = _mm256_loadu_si256((const __m256i *)(const void *)hi);
    }
    for (j = 0; j < 8; ++j) {
        const int32_t cl = c0 + tt_dw16_lane_lo(j), ch = c0 + tt_dw16_lane_hi(j);
        tt_requant1 r;
        memset(&flo[j], 0, sizeof flo[j]);
        memset(&fhi[j], 0, sizeof fhi[j]);
        blo[j] = cl < C && bias != 0 ? bias[cl] : 0;
        bhi[j] = ch < C && bias != 0 ? bias[ch] : 0;
        if (cl < C) {
            r = tt_requant_channel(q, cl);
            if (!tt_requant_fast_init(&flo[j], &r)) {
                return 0;
            }
        }
        if (ch < C) {
            r = tt_requant_channel(q, ch);
            if (!tt_requant_fast_init(&fhi[j], &r)) {
                return 0;
            }
        }
    }
    g->b_lo = _mm256_loadu_si256((const __m256i *)(const void *)blo);
    g->b_hi = _mm256_loadu_si256((const __m256i *)(const void *)bhi);
    g->rq_lo = tt_rq8_make(flo);
    g->rq_hi = tt_rq8_make(fhi);
    return 1;
}

/* Rows the in-place ring must hold: the smallest R such that, for every output row oy >= R, row oy - R ends at
 * or before the first input byte row oy reads (rows are computed in order and that first byte only grows); 0
 * when R rows do not fit TT_DW_AVX2_RING_BYTES. */
static int32_t tt_dw_avx2_ring_rows(const tt_conv_dims *d)
{
    const int64_t row = (int64_t)d->out_w * d->in_c, in_row = (int64_t)d->in_w * d->in_c;
    int32_t R, oy;
    for (R = 1; (int64_t)R * row <= TT_DW_AVX2_RING_BYTES; ++R) {
        int ok = 1;
        for (oy = R; oy < d->out_h && ok; ++oy) {
            const int32_t iy = oy * d->stride_h - d->pad_top;
            ok = (int64_t)(oy - R + 1) * row <= (int64_t)(iy > 0 ? iy : 0) * in_row;
        }
        if (ok) {
            return R;
        }
    }
    return 0;
}

/* One output row (every channel) of batch image xb into dst (pixel stride C); lo, hi: the activation clamp. */
static void tt_dw16_row(const tt_conv_dims *d, const tt_dw16_consts *gs, __m256i z16, __m256i lo, __m256i hi,
                        const int8_t *xb, int32_t oy, int8_t *dst)
{
    const int32_t C = d->in_c, iy0 = oy * d->stride_h - d->pad_top;
    int32_t c0, ox, t;
    for (c0 = 0; c0 < C; c0 += 16) {
        const tt_dw16_consts *g = gs + c0 / 16;
        const int32_t n = C - c0 < 16 ? C - c0 : 16; /* a tail group (n < 16) loads and stores through tmp */
        for (ox = 0; ox < d->out_w; ++ox) {
            const int32_t ix0 = ox * d->stride_w - d->pad_left;
            int8_t *op = dst + (int64_t)ox * C + c0;
            __m256i v[10], al = g->b_lo, ah = g->b_hi;
            __m128i out;
            for (t = 0; t < 9; ++t) {
                const int32_t iy = iy0 + t / 3, ix = ix0 + t % 3;
                if (iy < 0 || iy >= d->in_h || ix < 0 || ix >= d->in_w) {
                    v[t] = _mm256_setzero_si256();
                } else {
                    const int8_t *p = xb + ((int64_t)iy * d->in_w + ix) * C + c0;
                    __m128i b8;
                    if (n == 16) {
                        b8 = _mm_loadu_si128((const __m128i *)(const void *)p);
                    } else {
                        int8_t tmp[16] = {0};
                        memcpy(tmp, p, (size_t)n);
                        b8 = _mm_loadu_si128((const __m128i *)(const void *)tmp);
                    }
                    v[t] = _mm256_sub_epi16(_mm256_cvtepi8_epi16(b8), z16);
                }
            }
            v[9] = _mm256_setzero_si256();
            for (t = 0; t < 5; ++t) {
                al = _mm256_add_epi32(al, _mm256_madd_epi16(_mm256_unpacklo_epi16(v[2 * t], v[2 * t + 1]),
                                                            g->w_lo[t]));
                ah = _mm256_add_epi32(ah, _mm256_madd_epi16(_mm256_unpackhi_epi16(v[2 * t], v[2 * t + 1]),
                                                            g->w_hi[t]));
            }
            al = tt_rq8_apply(&g->rq_lo, al, lo, hi);
            ah = tt_rq8_apply(&g->rq_hi, ah, lo, hi);
            {
                /* per 128-bit half: low channels 0-3 then high 4-7 | low 8-11 then high 12-15 */
                const __m256i p16 = _mm256_packs_epi32(al, ah);
                out = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
            }
            if (n == 16) {
                _mm_storeu_si128((__m128i *)(void *)op, out);
            } else {
                int8_t tmp[16];
                _mm_storeu_si128((__m128i *)(void *)tmp, out);
                memcpy(op, tmp, (size_t)n);
            }
        }
    }
}

/* tt_depthwise_conv2d_s8 (y != x) or tt_depthwise_conv2d_s8_inplace (y == x) when the shape fits: 3x3, no
 * dilation, depth multiplier 1, in_c <= TT_DW_AVX2_MAX_C, every channel's requantisation in the fast form; in
 * place also one batch and a ring that fits. 1 when done, 0 when the portable kernel must run (nothing written). */
static int tt_dw_s8_avx2(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                         const int32_t *bias, int8_t *y)
{
    const int32_t C = d->in_c, inplace = x == y;
    const int64_t row = (int64_t)d->out_w * C;
    const __m256i z16 = _mm256_set1_epi16((int16_t)q->input_zero_point);
    const __m256i lo = _mm256_set1_epi32(q->act_min), hi = _mm256_set1_epi32(q->act_max);
    tt_dw16_consts gs[(TT_DW_AVX2_MAX_C + 15) / 16];
    int8_t ring[TT_DW_AVX2_RING_BYTES];
    int32_t R = 0, b, oy, c0, r, flushed = 0;
    if (!(d->k_h == 3 && d->k_w == 3 && d->dilation_h == 1 && d->dilation_w == 1 && d->depth_multiplier == 1 &&
          d->in_c == d->out_c && C >= 1 && C <= TT_DW_AVX2_MAX_C && d->stride_h >= 1 && d->stride_w >= 1)) {
        return 0;
    }
    if (inplace && (d->batches != 1 || (R = tt_dw_avx2_ring_rows(d)) == 0)) {
        return 0;
    }
    for (c0 = 0; c0 < C; c0 += 16) {
        if (!tt_dw16_consts_make(&gs[c0 / 16], q, w, bias, C, c0)) {
            return 0;
        }
    }
    if (!inplace) {
        for (b = 0; b < d->batches; ++b) {
            const int8_t *xb = x + (int64_t)b * d->in_h * d->in_w * C;
            for (oy = 0; oy < d->out_h; ++oy) {
                tt_dw16_row(d, gs, z16, lo, hi, xb, oy, y + ((int64_t)b * d->out_h + oy) * row);
            }
        }
        return 1;
    }
    for (oy = 0; oy < d->out_h; ++oy) {
        const int32_t iy = oy * d->stride_h - d->pad_top;
        const int64_t first = (int64_t)(iy > 0 ? iy : 0) * d->in_w * C; /* first input byte row oy reads */
        /* write back the waiting rows that end at or before it (row oy - R among them: tt_dw_avx2_ring_rows) */
        for (; flushed < oy && (int64_t)(flushed + 1) * row <= first; ++flushed) {
            memcpy(y + flushed * row, ring + (flushed % R) * row, (size_t)row);
        }
        tt_dw16_row(d, gs, z16, lo, hi, x, oy, ring + (oy % R) * row);
    }
    for (r = flushed; r < d->out_h; ++r) {
        memcpy(y + r * row, ring + (r % R) * row, (size_t)row);
    }
    return 1;
}

#endif /* TT_HOST_AVX2 */

#endif /* TT_DW_S8_AVX2_H */
