/* Hidden-channel streams: see tt_hidden_stream.h and stages/planning/channel_stream.py. */
#include <string.h>

#include "tt_conv_taps.h"
#include "tt_kernels.h"
#include "tt_simd.h"
#include "tt_avx2.h"

#define TT_HS_MAX_TAPS 64

/* w(k, c): weight element [k, c] of a [K, C] (1x1) weight, float or int8 (split: input channels [0, n) in the
 * trained slice, wpart for a float weight, part for an int8 one; n = 0: not split). */
static inline float tt_hs_w(const float *w, const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                            int32_t C, int32_t k, int32_t c, float scale, int32_t zero_point)
{
    if (w != 0) {
        return c < n ? wpart[k * n + c] : w[k * C + c];
    }
    return tt_dq(c < n ? part[k * n + c] : wq[k * C + c], zero_point, scale);
}


/* Row j of a listed block: row j itself, or row ix[j] when the rows are listed (ix != 0); the row walkers below. */
#define TT_HS_IX(j) (ix != 0 ? (int32_t)ix[j] : (j))
#if TT_VFP_PAIRS
/* Eight rows j (row j at q + j * n, or at q + ix[j] * n with g[ix[j]]) against the vector v[0 .. n), two elements
 * per pass, each row's pair and v's in one VLDM, eight sums in registers. dh != 0: dh[j] = 0 + sum over i, in order, of row_j[i] * v[i] (the 1x1 input
 * gradient); dh == 0: row_j[i] += g[j] * v[i], stored back with one VSTM per pair (the accumulated one). Inlined
 * into each caller with dh a constant, so each gets its own loop. */
#define TT_HS_ROW(j, x0, x1)                                                                                        \
    do {                                                                                                          \
        if (dh != 0) {                                                                                            \
            TT_VLD2(r##j, x0, x1);                                                                                \
            s##j += x0 * v0;                                                                                      \
            s##j += x1 * v1;                                                                                      \
        } else {                                                                                                  \
            TT_VLD2_AT(r##j, x0, x1);                                                                             \
            x0 += g##j * v0;                                                                                      \
            x1 += g##j * v1;                                                                                      \
            TT_VST2(r##j, x0, x1);                                                                                \
        }                                                                                                         \
    } while (0)
#define TT_HS_TAIL(j) (dh != 0 ? (void)(s##j += *r##j * w) : (void)(*r##j += g##j * w))
static inline __attribute__((always_inline)) void tt_hs_rows8(float *q, int32_t n, const float *v, const float *g,
                                                             float *dh, const uint8_t *ix)
{
    float *r0 = q + TT_HS_IX(0) * n, *r1 = q + TT_HS_IX(1) * n, *r2 = q + TT_HS_IX(2) * n, *r3 = q + TT_HS_IX(3) * n;
    float *r4 = q + TT_HS_IX(4) * n, *r5 = q + TT_HS_IX(5) * n, *r6 = q + TT_HS_IX(6) * n, *r7 = q + TT_HS_IX(7) * n;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    const float g0 = g[TT_HS_IX(0)], g1 = g[TT_HS_IX(1)], g2 = g[TT_HS_IX(2)], g3 = g[TT_HS_IX(3)];
    const float g4 = g[TT_HS_IX(4)], g5 = g[TT_HS_IX(5)], g6 = g[TT_HS_IX(6)], g7 = g[TT_HS_IX(7)];
    int32_t i;
    for (i = 0; i + 2 <= n; i += 2) {
        register float v0 __asm__("s14"), v1 __asm__("s15"), a0 __asm__("s16"), a1 __asm__("s17");
        register float b0 __asm__("s18"), b1 __asm__("s19"), c0 __asm__("s20"), c1 __asm__("s21");
        register float e0 __asm__("s22"), e1 __asm__("s23"), f0 __asm__("s24"), f1 __asm__("s25");
        register float h0 __asm__("s26"), h1 __asm__("s27"), k0 __asm__("s28"), k1 __asm__("s29");
        register float m0 __asm__("s30"), m1 __asm__("s31");
        TT_VLD2(v, v0, v1);
        TT_HS_ROW(0, a0, a1);
        TT_HS_ROW(1, b0, b1);
        TT_HS_ROW(2, c0, c1);
        TT_HS_ROW(3, e0, e1);
        TT_HS_ROW(4, f0, f1);
        TT_HS_ROW(5, h0, h1);
        TT_HS_ROW(6, k0, k1);
        TT_HS_ROW(7, m0, m1);
    }
    if (i < n) {
        const float w = *v;
        TT_HS_TAIL(0);
        TT_HS_TAIL(1);
        TT_HS_TAIL(2);
        TT_HS_TAIL(3);
        TT_HS_TAIL(4);
        TT_HS_TAIL(5);
        TT_HS_TAIL(6);
        TT_HS_TAIL(7);
    }
    if (dh != 0) {
        dh[0] = 0.0f + s0;
        dh[1] = 0.0f + s1;
        dh[2] = 0.0f + s2;
        dh[3] = 0.0f + s3;
        dh[4] = 0.0f + s4;
        dh[5] = 0.0f + s5;
        dh[6] = 0.0f + s6;
        dh[7] = 0.0f + s7;
    }
}
#undef TT_HS_ROW
#undef TT_HS_TAIL
#endif

/* Column c of the weight as K floats (K <= TT_HS_MAX_TAPS), dequantized once: the same float per (k, c) as the
 * whole kernel's per element. */
static void tt_hs_column(int32_t K, int32_t C, int32_t c, const float *w, const float *wpart, const int8_t *wq,
                         const int8_t *part, int32_t n, const float *scale, const int32_t *zero_point, float *wk)
{
    int32_t k;
    if (w == 0 && n == 0) {
        const int8_t *q = wq + c;
        for (k = 0; k < K; ++k, q += C) {
            wk[k] = tt_dq(*q, zero_point[k], scale[k]);
        }
    } else {
        for (k = 0; k < K; ++k) {
            wk[k] = tt_hs_w(w, wpart, wq, part, n, C, k, c, w != 0 ? 1.0f : scale[k], w != 0 ? 0 : zero_point[k]);
        }
    }
}

/* dh[r] = 0 + the sum over k, in order, of q[r, k] * v[k] (rows of K elements) for four rows r sharing each load of v:
 * r = j for j < 4, or r = ix[j] when listed (ix a constant null or not once inlined). */
static inline __attribute__((always_inline)) void tt_hs_dots4(const float *q, int32_t K, const float *v,
                                                             const uint8_t *ix, float *dh)
{
    const float *g0 = q + TT_HS_IX(0) * K, *g1 = q + TT_HS_IX(1) * K, *g2 = q + TT_HS_IX(2) * K;
    const float *g3 = q + TT_HS_IX(3) * K;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int32_t k;
    for (k = 0; k < K; ++k) {
        const float w = v[k];
        s0 += g0[k] * w;
        s1 += g1[k] * w;
        s2 += g2[k] * w;
        s3 += g3[k] * w;
    }
    dh[TT_HS_IX(0)] = 0.0f + s0;
    dh[TT_HS_IX(1)] = 0.0f + s1;
    dh[TT_HS_IX(2)] = 0.0f + s2;
    dh[TT_HS_IX(3)] = 0.0f + s3;
}

/* 0 + the sum over k, in order, of g[k] * v[k]. */
static inline __attribute__((always_inline)) float tt_hs_dot1(const float *g, int32_t K, const float *v)
{
    float s = 0.0f;
    int32_t k;
    for (k = 0; k < K; ++k) {
        s += g[k] * v[k];
    }
    return 0.0f + s;
}

void tt_hs_pw_grad_in_f32(int32_t P, int32_t K, int32_t C, int32_t c, const float *dz, const float *w,
                          const float *wpart, const int8_t *wq, const int8_t *part, int32_t n, const float *scale,
                          const int32_t *zero_point, float *dh)
{
    int32_t p, k;
    float wk[TT_HS_MAX_TAPS];
    if (K <= TT_HS_MAX_TAPS) {
        tt_hs_column(K, C, c, w, wpart, wq, part, n, scale, zero_point, wk);
        p = 0;
#if TT_VFP_PAIRS
        for (; p + 8 <= P; p += 8) {
            tt_hs_rows8((float *)(uintptr_t)(dz + p * K), K, wk, dh + p, dh + p, 0); /* read only: dh != 0 */
        }
#endif
        /* four pixels at a time share each weight load; each keeps its own sum over k in order */
        for (; p + 4 <= P; p += 4) {
            tt_hs_dots4(dz + p * K, K, wk, 0, dh + p);
        }
        for (; p < P; ++p) {
            dh[p] = tt_hs_dot1(dz + p * K, K, wk);
        }
        return;
    }
    for (p = 0; p < P; ++p) {
        const float *g = dz + p * K;
        float s = 0.0f;
        for (k = 0; k < K; ++k) {
            s += g[k] * tt_hs_w(w, wpart, wq, part, n, C, k, c, w != 0 ? 1.0f : scale[k], w != 0 ? 0 : zero_point[k]);
        }
        dh[p] = 0.0f + s;
    }
}


/* Rows of q (n elements each) += g[row] * v[i], four rows a pass sharing each load of v (each element still gets one
 * add): rows j of q (g[j]) for j < 4, or rows ix[j] when listed (ix a constant null or not once inlined). */
static inline __attribute__((always_inline)) void tt_hs_rows4(float *q, int32_t n, const float *v, const float *g,
                                                             const uint8_t *ix)
{
    const float g0 = g[TT_HS_IX(0)], g1 = g[TT_HS_IX(1)], g2 = g[TT_HS_IX(2)], g3 = g[TT_HS_IX(3)];
    float *d0 = q + TT_HS_IX(0) * n, *d1 = q + TT_HS_IX(1) * n, *d2 = q + TT_HS_IX(2) * n, *d3 = q + TT_HS_IX(3) * n;
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float w = v[i];
        d0[i] += g0 * w;
        d1[i] += g1 * w;
        d2[i] += g2 * w;
        d3[i] += g3 * w;
    }
}

/* One row d (n elements) += g * v[i]. */
static inline __attribute__((always_inline)) void tt_hs_row1(float *d, int32_t n, const float *v, float g)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        d[i] += g * v[i];
    }
}

/* Lists in nz, in order, the offsets i of g[0, m) whose value is not +-0; returns how many. */
static inline __attribute__((always_inline)) int32_t tt_hs_list_nz(const float *g, int32_t m, uint8_t *nz)
{
    int32_t i, n = 0;
    for (i = 0; i < m; ++i) {
        uint32_t u;
        memcpy(&u, g + i, 4);
        nz[n] = (uint8_t)i;
        n += (u << 1) != 0u; /* not +-0 */
    }
    return n;
}

/* tt_hs_pw_grad_in_acc_f32's rows with a finite weight row wr (int8 dequantized): a pixel whose gradient is +-0
 * adds +-0 to each of its dx elements, which leaves them as they are (dx starts at +0 and an IEEE sum of two
 * values never gives -0 unless both are -0, so dx is never -0; NaN and Inf stay), so such pixels are skipped. The
 * others go through in order, listed TT_HS_CHUNK at a time, eight (four, one) rows per pass. */
#define TT_HS_CHUNK 64
static void tt_hs_acc_nz(int32_t P, int32_t IC, const float *dh, const float *wr, float *dx)
{
    uint8_t nz[TT_HS_CHUNK];
    int32_t pc, j, n;
    for (pc = 0; pc < P; pc += TT_HS_CHUNK) {
        const int32_t pe = P - pc > TT_HS_CHUNK ? pc + TT_HS_CHUNK : P;
        const float *g = dh + pc;
        float *q = dx + pc * IC;
        n = tt_hs_list_nz(g, pe - pc, nz);
        j = 0;
#if TT_VFP_PAIRS
        for (; j + 8 <= n; j += 8) {
            tt_hs_rows8(q, IC, wr, g, 0, nz + j);
        }
#endif
        for (; j + 4 <= n; j += 4) {
            tt_hs_rows4(q, IC, wr, g, nz + j);
        }
        for (; j < n; ++j) {
            tt_hs_row1(q + nz[j] * IC, IC, wr, g[nz[j]]);
        }
    }
}

void tt_hs_pw_grad_in_acc_f32(int32_t P, int32_t IC, int32_t c, const float *dh, const float *w,
                              const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                              const float *scale, const int32_t *zero_point,
                              float *dx)
{
    int32_t p, i;
    const float sc = w != 0 ? 1.0f : scale[c];
    const int32_t z = w != 0 ? 0 : zero_point[c];
    float wr[TT_HS_MAX_TAPS];
    if (IC <= TT_HS_MAX_TAPS) {
        /* row c dequantized once (the same float per element as the whole kernel's) */
        for (i = 0; i < IC && w == 0 && n == 0; ++i) {
            wr[i] = tt_dq(wq[c * IC + i], z, sc);
        }
        for (; i < IC; ++i) {
            wr[i] = w != 0 ? (i < n ? wpart[c * n + i] : w[c * IC + i])
                           : tt_dq(i < n ? part[c * n + i] : wq[c * IC + i], z, sc);
        }
        if (w == 0) {
            tt_hs_acc_nz(P, IC, dh, wr, dx);
            return;
        }
        p = 0;
#if TT_VFP_PAIRS
        for (; p + 8 <= P; p += 8) {
            tt_hs_rows8(dx + p * IC, IC, wr, dh + p, 0, 0);
        }
#endif
        /* four pixels at a time share each weight load (every element still gets one add per channel) */
        for (; p + 4 <= P; p += 4) {
            tt_hs_rows4(dx + p * IC, IC, wr, dh + p, 0);
        }
        for (; p < P; ++p) {
            tt_hs_row1(dx + p * IC, IC, wr, dh[p]);
        }
        return;
    }
    for (p = 0; p < P; ++p) {
        const float g = dh[p];
        float *d = dx + p * IC;
        for (i = 0; i < IC; ++i) {
            /* weight [C, IC]: row c; the split part holds input channels [0, n) of each row */
            const float v = w != 0 ? (i < n ? wpart[c * n + i] : w[c * IC + i])
                                   : tt_dq(i < n ? part[c * n + i] : wq[c * IC + i], z, sc);
            d[i] += g * v;
        }
    }
}

void tt_hs_dw_taps(int32_t taps, int32_t C, int32_t c, const float *w, const int8_t *wq, const float *scale,
                   const int32_t *zero_point, float *wc)
{
    int32_t t;
    const int32_t n = taps < TT_HS_MAX_TAPS ? taps : TT_HS_MAX_TAPS;
    if (w != 0) {
        for (t = 0; t < n; ++t) {
            wc[t] = w[t * C + c];
        }
    } else {
        const int32_t z = zero_point[c];
        const float sc = scale[c];
        const int8_t *q = wq + c;
        for (t = 0; t < n; ++t, q += C) {
            wc[t] = tt_dq(*q, z, sc);
        }
    }
}

/* The mask of channel c (tt_hs_mask_grad_f32) and, when db != 0 (a constant once inlined), its sum db[0] = 0 + the
 * masked values in pixel order, as tt_bias_grad_f32 sums one channel (s = 0, s += dz[p]; db = s). */
static inline __attribute__((always_inline)) void tt_hs_mask_walk(int32_t P, int32_t C, int32_t c,
                                                                  const uint8_t *mask, const float *dy, float *dz,
                                                                  float *db)
{
    int32_t p;
    uint32_t b = (uint32_t)c; /* the bit of element p * C + c */
    float s = 0.0f;
    if ((C & 7) == 0) {
        /* every element's bit sits at c & 7 of its byte, C / 8 bytes apart: dy's bits kept or cleared (+0) by a
         * mask of all ones / zeros made from the bit, no branch; four elements per pass */
        const uint8_t *m = mask + (c >> 3);
        const int32_t step = C >> 3, up = 31 - (c & 7);
#define TT_HS_MASK1(j)                                                                                               \
    do {                                                                                                          \
        uint32_t u;                                                                                               \
        memcpy(&u, dy + p + (j), 4);                                                                              \
        u &= (uint32_t)((int32_t)((uint32_t)m[(j) * step] << up) >> 31);                                          \
        memcpy(dz + p + (j), &u, 4);                                                                              \
        if (db != 0) {                                                                                            \
            float v;                                                                                              \
            memcpy(&v, &u, 4);                                                                                    \
            s += v;                                                                                               \
        }                                                                                                         \
    } while (0)
        for (p = 0; p + 4 <= P; p += 4, m += 4 * step) {
            TT_HS_MASK1(0);
            TT_HS_MASK1(1);
            TT_HS_MASK1(2);
            TT_HS_MASK1(3);
        }
        for (; p < P; ++p, m += step) {
            TT_HS_MASK1(0);
        }
#undef TT_HS_MASK1
    } else {
        for (p = 0; p < P; ++p, b += (uint32_t)C) {
            dz[p] = ((mask[b >> 3] >> (b & 7u)) & 1u) ? dy[p] : 0.0f;
            if (db != 0) {
                s += dz[p];
            }
        }
    }
    if (db != 0) {
        db[0] = s;
    }
}

void tt_hs_mask_grad_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy, float *dz)
{
#if TT_HOST_AVX2 /* the host build's branch-free select (same bits) */
    tt_mask_grad_bits_f32(P, C, c, mask, dy, dz);
#else
    tt_hs_mask_walk(P, C, c, mask, dy, dz, 0);
#endif
}

void tt_hs_mask_bias_grad_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy, float *dz,
                              float *db)
{
    tt_hs_mask_walk(P, C, c, mask, dy, dz, db);
}

void tt_hs_int8_clamp_grad_f32(int32_t P, int32_t C, int32_t c, int32_t lo, int32_t hi, const float *dy,
                               const int8_t *y, float *dx)
{
    int32_t p;
    const int8_t *yc = y + c;
    for (p = 0; p < P; ++p, yc += C) {
        const int32_t v = (int32_t)*yc;
        dx[p] = (v > lo && v < hi) ? dy[p] : 0.0f;
    }
}

void tt_hs_dequant_rows(int32_t P, int32_t IC, int32_t k, const int8_t *x, float scale, int32_t zero_point,
                        float *xf)
{
    int32_t p, c;
    for (p = 0; p < P; ++p, x += IC, xf += k) {
        for (c = 0; c < k; ++c) {
            xf[c] = (float)((int32_t)x[c] - zero_point) * scale;
        }
    }
}

/* Sixteen (eight, four, one) sums per pass over the listed pixels, each over the pixels in order. */
#define TT_HS_GW_BLOCK(W, M)                                                                                         \
    for (; c + (W) <= k; c += (W)) {                                                                              \
        M(TT_HS_GW_DECL)                                                                                          \
        for (j = 0; j < n; ++j) {                                                                                 \
            const float g = dh[pc + nz[j]];                                                                       \
            const float *xr = xf + (pc + nz[j]) * k + c;                                                          \
            M(TT_HS_GW_MAC)                                                                                       \
        }                                                                                                         \
        M(TT_HS_GW_PUT)                                                                                           \
    }
#define TT_HS_GW_DECL(i) float a##i = first ? 0.0f : dw[c + (i)];
#define TT_HS_GW_MAC(i) a##i += g * xr[i];
#define TT_HS_GW_PUT(i) dw[c + (i)] = a##i;
#define TT_HS_GW16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define TT_HS_GW8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define TT_HS_GW4(M) M(0) M(1) M(2) M(3)
#define TT_HS_GW1(M) M(0)
void tt_hs_pw_grad_w_f32(int32_t P, int32_t k, const float *dh, const float *xf, float *dw)
{
    uint8_t nz[TT_HS_CHUNK];
    int32_t pc, c, j, n;
    for (pc = 0; pc < P; pc += TT_HS_CHUNK) {
        const int32_t pe = P - pc > TT_HS_CHUNK ? pc + TT_HS_CHUNK : P;
        const int first = pc == 0;
        n = tt_hs_list_nz(dh + pc, pe - pc, nz);
        if (n == 0 && !first) {
            continue;
        }
        c = 0;
        TT_HS_GW_BLOCK(16, TT_HS_GW16)
        TT_HS_GW_BLOCK(8, TT_HS_GW8)
        TT_HS_GW_BLOCK(4, TT_HS_GW4)
        TT_HS_GW_BLOCK(1, TT_HS_GW1)
    }
}
#undef TT_HS_GW_BLOCK
#undef TT_HS_GW_DECL
#undef TT_HS_GW_MAC
#undef TT_HS_GW_PUT
#undef TT_HS_GW16
#undef TT_HS_GW8
#undef TT_HS_GW4
#undef TT_HS_GW1

void tt_hs_pw_grad_in_mask_f32(int32_t P, int32_t K, int32_t C, int32_t c, const float *dz, const float *w,
                               const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                               const float *scale, const int32_t *zero_point, const uint8_t *mask, float *dh,
                               float *db)
{
    float wk[TT_HS_MAX_TAPS];
    uint8_t on[TT_HS_CHUNK];
    int32_t pc, p, j, m;
    if (K > TT_HS_MAX_TAPS) {
        tt_hs_pw_grad_in_f32(P, K, C, c, dz, w, wpart, wq, part, n, scale, zero_point, dh);
        tt_hs_mask_walk(P, C, c, mask, dh, dh, db);
        return;
    }
    tt_hs_column(K, C, c, w, wpart, wq, part, n, scale, zero_point, wk);
    for (pc = 0; pc < P; pc += TT_HS_CHUNK) {
        const int32_t pe = P - pc > TT_HS_CHUNK ? pc + TT_HS_CHUNK : P;
        const float *q = dz + pc * K;
        uint32_t b = (uint32_t)pc * (uint32_t)C + (uint32_t)c; /* the mask bit of element p * C + c */
        m = 0;
        for (p = pc; p < pe; ++p, b += (uint32_t)C) {
            on[m] = (uint8_t)(p - pc);
            m += (mask[b >> 3] >> (b & 7u)) & 1u;
            dh[p] = 0.0f; /* masked out: what mask_grad writes */
        }
        j = 0;
#if TT_VFP_PAIRS
        for (; j + 8 <= m; j += 8) {
            float t[8];
            int32_t k;
            tt_hs_rows8((float *)(uintptr_t)q, K, wk, q, t, on + j); /* read only: dh != 0 */
            for (k = 0; k < 8; ++k) {
                dh[pc + on[j + k]] = t[k];
            }
        }
#endif
        for (; j + 4 <= m; j += 4) { /* four listed pixels share each weight load, each its own sum in order */
            tt_hs_dots4(q, K, wk, on + j, dh + pc);
        }
        for (; j < m; ++j) {
            dh[pc + on[j]] = tt_hs_dot1(q + on[j] * K, K, wk);
        }
    }
    if (db != 0) {
        float s = 0.0f;
        for (p = 0; p < P; ++p) {
            s += dh[p];
        }
        db[0] = s;
    }
}
