#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_mve.h"
/* The conv2d input gradient of fp16-mixed on Helium (tt_fvec_gi.h): ops/tt_conv2d.c's tt_gi_walk_hdx (and
 * tt_gi_walk with a float weight) with four consecutive input channels in the four lanes of a vector.
 *
 * The order, lane by lane, is the portable one: for each input pixel and input channel, acc = 0; for each in-image
 * tap in (filter y, filter x) order, s = 0, then s += dy[p', o] * w[o, tap, ic] for o = 0, 1, ... (one VMUL, then
 * one VADD: the portable code is compiled without contraction), then acc += s; dx = acc (fp32) or its fp16 rounding
 * (VCVTB, tt_f16_narrow's bits: see the store). Only which channels share a pass differs (blocks of 32 channels that
 * never straddle n, four per vector, the lanes beyond a block's end predicated off), which changes no element's
 * operations.
 *
 * Why the lanes give the portable bits (tt_fvec_mve.h's argument, G(q) = the integer multiples of q):
 *  - fp16 dy (hdy): every dy is fp16-valued (G(2^-24)); the walk runs only when every weight it reads is +-0 or
 *    finite with |w| >= 2^-79 (G(2^-102)): each exact product is in G(2^-126).
 *  - fp32 dy: neither factor is fp16-valued, so the check is on both: no non-finite and no subnormal value in dy or
 *    in the weights read, and e_dy + e_w >= 151 for the smallest biased exponents of their nonzero values. Then a
 *    nonzero exact product has |dy * w| >= 2^(e_dy - 127) * 2^(e_w - 127) >= 2^-103; 2^-103 is an fp32 value, so
 *    the rounded product is >= 2^-103 too, and an fp32 value that large has an ulp >= 2^-126: every rounded product
 *    is in G(2^-126). (Two tt_fvec_ok operands would not do: 2^-79 * 2^-79 is subnormal.)
 * The accumulators s and acc start at +0 and add rounded products, then s values: sums of G(2^-126) values are in
 * G(2^-126) and rounding to nearest keeps them there; a nonzero element of G(2^-126) is normal. So no operand or
 * result of a vector VMUL / VADD is subnormal, MVE's flush-to-zero never fires and each lane rounds like the scalar
 * FPU. No start value comes from memory (dx is written, never accumulated into). Infinities (overflow, or an fp16
 * dy that is +-Inf) combine the same way; a NaN the arithmetic makes is the default NaN on both sides; a NaN dy
 * operand loses its payload here (tt_fvec_mve.h: fp16-mixed skips such steps, no compare sees a NaN's bits).
 *
 * The checks are integer passes (tt_fvec_gi_scan) over the weights the walk reads and, for an fp32 dy, over dy:
 * the weight pass is one load per weight, the walk one per weight and input pixel (the positions stream, one input
 * pixel per call, checks once per stream through tt_fvec_gi_w_ok_hdy). */
#include "tt_conv_taps.h"
#include "tt_f16.h"
#include "tt_fvec_gi.h"

#define TT_FVEC_GI_C 32 /* input channels of one pixel summed at a time (acc and s on the stack) */
#define TT_FVEC_GI_O 64 /* output channels of an fp16 dy widened at a time */

/* Smallest biased exponents the checks require: a weight with an fp16 dy; dy and weight together with an fp32 dy. */
#define TT_FVEC_GI_EW_HDY 48
#define TT_FVEC_GI_ESUM 151

/* Fold v[0..len) into the running scan: lo = min over (|v| bits << 1) - 1 (a zero becomes 0xFFFFFFFF, the lanes past
 * len load as zero), hi = max of |v| bits << 1 (the sign shifted out; exponent 255 puts 0xFF in the top byte). */
static inline void tt_fvec_gi_scan(const float *v, int32_t len, uint32x4_t *lo, uint32x4_t *hi)
{
    const uint32_t *u = (const uint32_t *)(const void *)v;
    uint32x4_t l = *lo, h = *hi;
    int32_t i;
    for (i = 0; i < len; i += 4) {
        const uint32x4_t m = vshlq_n_u32(vldrwq_z_u32(u + i, vctp32q((uint32_t)(len - i))), 1);
        l = vminq_u32(l, vsubq_u32(m, vdupq_n_u32(1)));
        h = vmaxq_u32(h, m);
    }
    *lo = l;
    *hi = h;
}

/* The scan's answer: -1 when a value is Inf or NaN, else the smallest biased exponent of a nonzero value (0: a
 * subnormal), 255 when every value is zero. */
static int32_t tt_fvec_gi_emin(uint32x4_t lo, uint32x4_t hi)
{
    const uint32_t mn = vminvq_u32(0xFFFFFFFFu, lo);
    if (vmaxvq_u32(0, hi) >= 0xFF000000u) {
        return -1;
    }
    return mn == 0xFFFFFFFFu ? 255 : (int32_t)((mn + 1u) >> 24);
}

/* tt_fvec_gi_emin of the weights the walk reads: the slice's rows [O*KH*KW, n) and channels [n, in_c) of w's. */
static int32_t tt_fvec_gi_w_emin(const tt_conv_dims *d, const float *w, const float *w_slice, int32_t n)
{
    const int32_t rows = d->out_c * d->k_h * d->k_w, in_c = d->in_c;
    uint32x4_t lo = vdupq_n_u32(0xFFFFFFFFu), hi = vdupq_n_u32(0);
    int32_t r;
    if (n > 0) {
        tt_fvec_gi_scan(w_slice, rows * n, &lo, &hi);
    }
    if (n == 0) {
        tt_fvec_gi_scan(w, rows * in_c, &lo, &hi);
    } else if (n < in_c) {
        for (r = 0; r < rows; ++r) {
            tt_fvec_gi_scan(w + r * in_c + n, in_c - n, &lo, &hi);
        }
    }
    return tt_fvec_gi_emin(lo, hi);
}

int32_t tt_fvec_gi_w_ok_hdy(const tt_conv_dims *d, const float *w, const float *w_slice, int32_t n)
{
    return tt_fvec_gi_w_emin(d, w, w_slice, n) >= TT_FVEC_GI_EW_HDY;
}

/* s[0..nc) += sum over o < no, in order, of g[o] * wp[o * stride + 0..nc): nv vectors (nc in (4 nv - 4, 4 nv]) kept in
 * registers across the o loop; `full` (nc == 4 nv): no predicate. Always inlined with constant nv and full. */
static inline __attribute__((always_inline)) void tt_fvec_gi_chunk(float *s, int32_t nc, const float *g, int32_t no,
                                                                   const float *wp, int32_t stride, const int nv,
                                                                   const int full)
{
    const mve_pred16_t pl = vctp32q((uint32_t)(nc - 4 * (nv - 1))); /* the last vector's lanes */
    float32x4_t s0, s1 = vdupq_n_f32(0.0f), s2 = vdupq_n_f32(0.0f), s3 = vdupq_n_f32(0.0f);
    int32_t o;
#define TT_FVEC_GI_LD(k, p) ((full || nv - 1 != (k)) ? vldrwq_f32((p) + 4 * (k)) : vldrwq_z_f32((p) + 4 * (k), pl))
    s0 = TT_FVEC_GI_LD(0, s);
    if (nv > 1) {
        s1 = TT_FVEC_GI_LD(1, s);
    }
    if (nv > 2) {
        s2 = TT_FVEC_GI_LD(2, s);
    }
    if (nv > 3) {
        s3 = TT_FVEC_GI_LD(3, s);
    }
    for (o = 0; o < no; ++o, wp += stride) {
        const float gv = g[o];
        s0 = vaddq_f32(s0, vmulq_n_f32(TT_FVEC_GI_LD(0, wp), gv));
        if (nv > 1) {
            s1 = vaddq_f32(s1, vmulq_n_f32(TT_FVEC_GI_LD(1, wp), gv));
        }
        if (nv > 2) {
            s2 = vaddq_f32(s2, vmulq_n_f32(TT_FVEC_GI_LD(2, wp), gv));
        }
        if (nv > 3) {
            s3 = vaddq_f32(s3, vmulq_n_f32(TT_FVEC_GI_LD(3, wp), gv));
        }
    }
#undef TT_FVEC_GI_LD
#define TT_FVEC_GI_ST(k, v)                                                                                            \
    ((full || nv - 1 != (k)) ? vstrwq_f32(s + 4 * (k), (v)) : vstrwq_p_f32(s + 4 * (k), (v), pl))
    TT_FVEC_GI_ST(0, s0);
    if (nv > 1) {
        TT_FVEC_GI_ST(1, s1);
    }
    if (nv > 2) {
        TT_FVEC_GI_ST(2, s2);
    }
    if (nv > 3) {
        TT_FVEC_GI_ST(3, s3);
    }
#undef TT_FVEC_GI_ST
}

/* The sums of channels [0, nc) of a block (nc <= TT_FVEC_GI_C) over o-block g[0..no): sixteen channels at a time. */
static void tt_fvec_gi_sums(float *s, int32_t nc, const float *g, int32_t no, const float *wp, int32_t stride)
{
    int32_t j;
    for (j = 0; j + 16 <= nc; j += 16) {
        tt_fvec_gi_chunk(s + j, 16, g, no, wp + j, stride, 4, 1);
    }
    switch ((nc - j + 3) / 4 * 2 + ((nc - j) % 4 == 0)) { /* the rest: vectors * 2 + (whole vectors) */
    case 2: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 1, 0); break;
    case 3: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 1, 1); break;
    case 4: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 2, 0); break;
    case 5: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 2, 1); break;
    case 6: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 3, 0); break;
    case 7: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 3, 1); break;
    case 8: tt_fvec_gi_chunk(s + j, nc - j, g, no, wp + j, stride, 4, 0); break;
    default: break; /* nothing left */
    }
}

/* g[0..no) = the fp16 values h[0..no) widened (exact) */
static inline void tt_fvec_gi_widen(float *g, const uint16_t *h, int32_t no)
{
    int32_t i;
    for (i = 0; i < no; i += 4) {
        vstrwq_f32(g + i, tt_fvec_ld_h4_z(h + i, no - i < 4 ? no - i : 4));
    }
}

/* v[0..nc) = +0 */
static inline void tt_fvec_gi_zero(float *v, int32_t nc)
{
    int32_t i;
    for (i = 0; i < nc; i += 4) {
        vstrwq_p_f32(v + i, vdupq_n_f32(0.0f), vctp32q((uint32_t)(nc - i)));
    }
}

void tt_fvec_gi_run(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const float *w, const float *w_slice,
                    int32_t n, float *dxf, uint16_t *dxh)
{
    float acc[TT_FVEC_GI_C], s[TT_FVEC_GI_C], gw[TT_FVEC_GI_O];
    const int32_t taps = d->k_h * d->k_w, in_c = d->in_c, out_c = d->out_c;
    /* one tap and at most TT_FVEC_GI_O output channels (a 1x1 conv): an fp16 dy pixel is widened once for all the
     * pixel's channel blocks rather than once per block */
    const int32_t once = dyh != 0 && taps == 1 && out_c <= TT_FVEC_GI_O;
    int32_t b, iy, ix, c0, nc, ky, kx, o0, no, i;
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                const int32_t at_dx = ((b * d->in_h + iy) * d->in_w + ix) * in_c;
                if (once) {
                    const int32_t oy = tt_src_out(iy, d->pad_top, 0, d->dilation_h, d->stride_h, d->out_h);
                    const int32_t ox = tt_src_out(ix, d->pad_left, 0, d->dilation_w, d->stride_w, d->out_w);
                    if (oy >= 0 && ox >= 0) {
                        tt_fvec_gi_widen(gw, dyh + ((b * d->out_h + oy) * d->out_w + ox) * out_c, out_c);
                    }
                }
                for (c0 = 0; c0 < in_c; c0 += nc) {
                    /* channels [0, n) live in the trained slice, the rest in the whole weight: a block is in one */
                    const int32_t lim = c0 < n ? n : in_c, rowlen = c0 < n ? n : in_c;
                    const float *wb = (c0 < n ? w_slice : w) + c0;
                    const int32_t stride = taps * rowlen;
                    nc = lim - c0 > TT_FVEC_GI_C ? TT_FVEC_GI_C : lim - c0;
                    int32_t first = 1;
                    tt_fvec_gi_zero(acc, nc);
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                        if (oy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                            const int32_t tap = ky * d->k_w + kx;
                            const int32_t at_dy = ((b * d->out_h + oy) * d->out_w + ox) * out_c;
                            if (ox < 0) {
                                continue;
                            }
                            /* the first in-image tap sums straight into acc (+0): acc = 0 + s is s, s never being
                             * -0 (it starts at +0, and a sum is -0 only when both addends are) */
                            float *const sp = first ? acc : s;
                            if (!first) {
                                tt_fvec_gi_zero(s, nc);
                            }
                            for (o0 = 0; o0 < out_c; o0 += no) {
                                const float *g = gw;
                                if (dyh != 0) { /* widened TT_FVEC_GI_O at a time (exact) */
                                    no = out_c - o0 > TT_FVEC_GI_O ? TT_FVEC_GI_O : out_c - o0;
                                    if (!once) {
                                        tt_fvec_gi_widen(gw, dyh + at_dy + o0, no);
                                    }
                                } else {
                                    no = out_c - o0;
                                    g = dy + at_dy + o0;
                                }
                                tt_fvec_gi_sums(sp, nc, g, no, wb + (o0 * taps + tap) * rowlen, stride);
                            }
                            for (i = 0; !first && i < nc; i += 4) {
                                const mve_pred16_t p = vctp32q((uint32_t)(nc - i));
                                vstrwq_p_f32(acc + i, vaddq_f32(vldrwq_z_f32(acc + i, p), vldrwq_z_f32(s + i, p)), p);
                            }
                            first = 0;
                        }
                    }
                    if (dxh != 0) {
                        /* VCVTB.F16.F32: tt_f16_narrow's bits on every lane here (a NaN lane can only be Helium's
                         * default NaN, which both narrow to 0x7E00; FZ16 does not apply: tt_fvec_dw.c's header) */
                        for (i = 0; i < nc; i += 4) {
                            const mve_pred16_t p = vctp32q((uint32_t)(nc - i));
                            vstrhq_p_u32(dxh + at_dx + c0 + i,
                                         tt_mve_vcvtb_f16_f32(vreinterpretq_u32_f32(vldrwq_z_f32(acc + i, p))), p);
                        }
                    } else {
                        for (i = 0; i < nc; i += 4) {
                            const mve_pred16_t p = vctp32q((uint32_t)(nc - i));
                            vstrwq_p_f32(dxf + at_dx + c0 + i, vldrwq_z_f32(acc + i, p), p);
                        }
                    }
                }
            }
        }
    }
}

int32_t tt_fvec_gi(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const float *w, const float *w_slice,
                   int32_t n, float *dxf, uint16_t *dxh)
{
    const int32_t ew = tt_fvec_gi_w_emin(d, w, w_slice, n);
    if (dyh != 0) {
        if (ew < TT_FVEC_GI_EW_HDY) {
            return 0;
        }
    } else {
        uint32x4_t lo = vdupq_n_u32(0xFFFFFFFFu), hi = vdupq_n_u32(0);
        int32_t edy;
        tt_fvec_gi_scan(dy, d->batches * d->out_h * d->out_w * d->out_c, &lo, &hi);
        edy = tt_fvec_gi_emin(lo, hi);
        if (ew < 1 || edy < 1 || ew + edy < TT_FVEC_GI_ESUM) {
            return 0;
        }
    }
    tt_fvec_gi_run(d, dy, dyh, w, w_slice, n, dxf, dxh);
    return 1;
}
#else
typedef int tt_fvec_gi_unused;
#endif
