#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_mve.h"

#include <string.h>

#include "tt_fvec_conv.h"

/* fp16-mixed's forward conv2d on Helium: ops/tt_conv2d.c's tt_conv_hx_walk (x fp16) and tt_conv_f32_walk (x fp32,
 * y fp16) with the same bits, for `target.kernels: mve`.
 *
 * Lanes are four output pixels of one output row (a 1x1 stride-1 conv's whole image is one row: its pixels are
 * contiguous in x and y), and one vector accumulator per output channel, four channels per block: per input channel
 * one gather loads the four pixels' x (VLDRH gather + VCVTB for fp16, VLDRW gather for fp32), and each channel's
 * weight, the same for the four lanes, is a scalar operand (VMUL.F32 Qd, Qn, Rm): one gather serves four channels,
 * one weight load four pixels. Each lane adds its products with one VMUL and one VADD in the portable loop's order
 * (filter y, filter x, input channel; the trained slice's channels [0, n) first, then [n, in_c) of the whole
 * weight) from +0, then + bias, the clamp (compare and select, as tt_act_clamp, NaN kept) and the store (fp32, or
 * fp16 by tt_f16_mve.h's VCVTB: tt_f16_narrow's bits, tt_fc_out says why no NaN fix-up is needed). A tap outside the
 * image (padding, lanes past the row's end) loads +0 into its lanes: the product is +-0, and adding +-0 leaves an
 * accumulator that starts at +0 unchanged (it can never be -0: a sum is -0 only when both addends are), which is the
 * portable loop's skipping.
 *
 * Why the bits are the portable ones (tt_fvec_mve.h's argument, G(q) = the integer multiples of q; this file checks
 * its own, equivalent or wider, condition with one integer pass per operand, tt_fc_emin):
 *  - x fp16 (tt_fvec_conv2d_hx): x is in G(2^-24); every weight is +-0 or finite with biased exponent >= 48
 *    (tt_fvec_ok's condition), so in G(2^-102); the products and their sums are in G(2^-126).
 *  - x fp32 (tt_fvec_conv2d_fx_hy, the stem: its x is the input image, not fp16-valued): a nonzero finite fp32 value
 *    with biased exponent e >= 1 is in G(2^(e - 150)). With ex, ew the smallest exponents of nonzero x and weights,
 *    both >= 1 (no subnormal operand, which the vector unit would flush on input) and ex + ew >= 174, every product
 *    is in G(2^(ex + ew - 300)), within G(2^-126). (The fp16 case is this rule with ex = 126: fp16 is G(2^-24).)
 *  - the bias, added to each sum, is +-0 or has exponent >= 24 (in G(2^-126)); the clamp bounds are not subnormal
 *    (the vector compares would flush them).
 * Then every operand and rounded result of the VMULs and VADDs is zero or normal, flush-to-zero never fires and
 * each lane's rounding is the scalar FPU's. Where the condition fails (a weight below 2^-79, a subnormal or
 * non-finite operand, ...) the function returns 0 and the caller runs its portable loop. An fp16 NaN in x comes out
 * as the default NaN (tt_fvec_mve.h: fp16-mixed skips such steps). */

#define TT_FC_INLINE static inline __attribute__((always_inline))

/* The smallest biased exponent of a nonzero element of v[0, n) (255 when there is none), or 0 when one is subnormal,
 * infinite or NaN. Integer MVE, three operations per four values: |v| << 1 puts the exponent in the top byte; its
 * minimum less one skips the zeros (0 - 1 is the largest value), its maximum finds Inf/NaN. */
static int32_t tt_fc_emin(const float *v, int32_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)v;
    const uint32x4_t one = vdupq_n_u32(1u);
    uint32x4_t lo = vdupq_n_u32(0xFFFFFFFFu), hi = vdupq_n_u32(0u);
    uint32_t l, h;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t m2 = vshlq_n_u32(vldrwq_u32(u + i), 1);
        lo = vminq_u32(lo, vsubq_u32(m2, one));
        hi = vmaxq_u32(hi, m2);
    }
    if (i < n) {                                   /* the inactive lanes load 0: neutral for both */
        const uint32x4_t m2 = vshlq_n_u32(vldrwq_z_u32(u + i, vctp32q((uint32_t)(n - i))), 1);
        lo = vminq_u32(lo, vsubq_u32(m2, one));
        hi = vmaxq_u32(hi, m2);
    }
    l = vminvq_u32(0xFFFFFFFFu, lo);
    h = vmaxvq_u32(0u, hi);
    if (h >= 0xFF000000u) {
        return 0;
    }
    return l == 0xFFFFFFFFu ? 255 : (int32_t)((l + 1u) >> 24);
}

/* The smallest exponent over the weights the conv reads: the whole weight and, with a trained slice, the slice. */
static int32_t tt_fc_emin_w(const tt_conv_dims *d, const float *w, const float *w_slice, int32_t n)
{
    const int32_t rows = d->out_c * d->k_h * d->k_w;
    int32_t e, r;
    if (n <= 0 || w_slice == w) {
        return tt_fc_emin(w, rows * d->in_c);
    }
    /* a trained slice: the kernel reads its n channels from w_slice and only channels [n, in_c) of each row of w, so
     * a value of w's first n columns (the pretrained frozen copy, never read) must not turn Helium off */
    e = tt_fc_emin(w_slice, rows * n);
    for (r = 0; r < rows && n < d->in_c; ++r) {
        const int32_t er = tt_fc_emin(w + r * d->in_c + n, d->in_c - n);
        e = er < e ? er : e;
    }
    return e;
}

static int tt_fc_subnormal(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x7F800000u) == 0u && (u & 0x7FFFFFu) != 0u;
}

/* The bias and clamp condition (top of the file). */
static int tt_fc_tail_ok(const tt_conv_dims *d, float act_min, float act_max, const float *bias)
{
    return !tt_fc_subnormal(act_min) && !tt_fc_subnormal(act_max) && (bias == 0 || tt_fc_emin(bias, d->out_c) >= 24);
}

/* acc[k] (k < K) += x * w over input channels [c0, c1) of one tap, x gathered at offs from xh (half) or xf in the
 * lanes of p (full: all four), the weight of channel k at wp[k * step + ic]. */
TT_FC_INLINE void tt_fc_chans(int half, const uint16_t *xh, const float *xf, uint32x4_t offs, mve_pred16_t p, int full,
                              const float *wp, int32_t step, int32_t c0, int32_t c1, int32_t K, float32x4_t *acc)
{
    int32_t ic, k;
    for (ic = c0; ic < c1; ++ic) {
        float32x4_t xv;
        if (half) {
            const uint32x4_t hv = full ? vldrhq_gather_shifted_offset_u32(xh + ic, offs)
                                       : vldrhq_gather_shifted_offset_z_u32(xh + ic, offs, p);
            xv = vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(hv));
        } else {
            xv = full ? vldrwq_gather_shifted_offset_f32(xf + ic, offs)
                      : vldrwq_gather_shifted_offset_z_f32(xf + ic, offs, p);
        }
#pragma GCC unroll 4
        for (k = 0; k < K; ++k) {
            acc[k] = vaddq_f32(acc[k], vmulq_n_f32(xv, wp[k * step + ic]));
        }
    }
}

/* The sums of output channels [oc, oc + K) at the output pixels of `live` whose input columns are ix0's lanes (row
 * origin iy0, batch b), in the portable order: taps (ky, kx), the slice's channels then the rest. */
TT_FC_INLINE void tt_fc_sums(int half, const tt_conv_dims *d, const uint16_t *xh, const float *xf, const float *w,
                             const float *w_slice, int32_t n, int32_t oc, int32_t K, int32_t b, int32_t iy0,
                             int32x4_t ix0, mve_pred16_t live, float32x4_t *out)
{
    const int32_t ss = d->k_h * d->k_w * n, sw = d->k_h * d->k_w * d->in_c;
    const int32x4_t zero = vdupq_n_s32(0), width = vdupq_n_s32(d->in_w);
    float32x4_t acc[4];
    int32_t ky, kx, k;
#pragma GCC unroll 4
    for (k = 0; k < K; ++k) {
        acc[k] = vdupq_n_f32(0.0f);
    }
    for (ky = 0; ky < d->k_h; ++ky) {
        const int32_t iy = iy0 + ky * d->dilation_h;
        int32_t row;
        if (iy < 0 || iy >= d->in_h) {
            continue;
        }
        row = (b * d->in_h + iy) * d->in_w * d->in_c;
        for (kx = 0; kx < d->k_w; ++kx) {
            const int32x4_t ix = vaddq_n_s32(ix0, kx * d->dilation_w);
            const mve_pred16_t p = live & vcmpgeq_s32(ix, zero) & vcmpgtq_s32(width, ix);
            const uint32x4_t offs = vreinterpretq_u32_s32(vmulq_n_s32(vpselq_s32(ix, zero, p), d->in_c));
            const int32_t tap = (oc * d->k_h + ky) * d->k_w + kx;
            const uint16_t *xhr = half ? xh + row : 0;
            const float *xfr = half ? 0 : xf + row;
            if (p == 0xFFFFu) {
                tt_fc_chans(half, xhr, xfr, offs, p, 1, w_slice + tap * n, ss, 0, n, K, acc);
                tt_fc_chans(half, xhr, xfr, offs, p, 1, w + tap * d->in_c, sw, n, d->in_c, K, acc);
            } else if (p != 0) {
                tt_fc_chans(half, xhr, xfr, offs, p, 0, w_slice + tap * n, ss, 0, n, K, acc);
                tt_fc_chans(half, xhr, xfr, offs, p, 0, w + tap * d->in_c, sw, n, d->in_c, K, acc);
            }
        }
    }
#pragma GCC unroll 4
    for (k = 0; k < K; ++k) {
        out[k] = acc[k];
    }
}

/* One function per (x kind, block size): the blocked loop above, compiled once each. */
#define TT_FC_SUMS(name, HALF, K)                                                                                 \
    static void name(const tt_conv_dims *d, const uint16_t *xh, const float *xf, const float *w,                 \
                     const float *w_slice, int32_t n, int32_t oc, int32_t b, int32_t iy0, int32x4_t ix0,         \
                     mve_pred16_t live, float32x4_t *out)                                                         \
    {                                                                                                             \
        tt_fc_sums(HALF, d, xh, xf, w, w_slice, n, oc, K, b, iy0, ix0, live, out);                               \
    }
TT_FC_SUMS(tt_fc_sums_h1, 1, 1)
TT_FC_SUMS(tt_fc_sums_h2, 1, 2)
TT_FC_SUMS(tt_fc_sums_h3, 1, 3)
TT_FC_SUMS(tt_fc_sums_h4, 1, 4)
TT_FC_SUMS(tt_fc_sums_f1, 0, 1)
TT_FC_SUMS(tt_fc_sums_f2, 0, 2)
TT_FC_SUMS(tt_fc_sums_f3, 0, 3)
TT_FC_SUMS(tt_fc_sums_f4, 0, 4)
#undef TT_FC_SUMS

/* The block's sums by direct calls (a switch, not a table of function pointers: the stack bound,
 * stages/device/stack_bound.py, cannot follow an indirect call and would fall back to the board's default stack). */
static void tt_fc_sums_k(int half, int32_t K, const tt_conv_dims *d, const uint16_t *xh, const float *xf,
                         const float *w, const float *w_slice, int32_t n, int32_t oc, int32_t b, int32_t iy0,
                         int32x4_t ix0, mve_pred16_t live, float32x4_t *out)
{
    switch (half * 4 + K) {
    case 1: tt_fc_sums_f1(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 2: tt_fc_sums_f2(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 3: tt_fc_sums_f3(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 4: tt_fc_sums_f4(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 5: tt_fc_sums_h1(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 6: tt_fc_sums_h2(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    case 7: tt_fc_sums_h3(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    default: tt_fc_sums_h4(d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, out); break;
    }
}

/* tt_conv_out for K channels at the lanes of `live`: + bias, the clamp, the store (fp32 to yf or fp16 to yh) at
 * element at + k of each lane's pixel (yoffs: the pixels' distances). */
TT_FC_INLINE void tt_fc_out(const float32x4_t *acc, int32_t K, const float *bias, int32_t oc, float32x4_t lo,
                            float32x4_t hi, float *yf, uint16_t *yh, int32_t at, uint32x4_t yoffs, mve_pred16_t live)
{
    int32_t k;
    for (k = 0; k < K; ++k) {
        float32x4_t v = acc[k];
        if (bias != 0) {
            v = vaddq_n_f32(v, bias[oc + k]);
        }
        /* lo > v, not v < lo: a vector LT (N != V) holds for unordered operands, GT (as C's < and >) does not,
         * so a NaN passes the clamp as in tt_act_clamp. Each bound a VPT and a predicated VMOV (gcc's VPSEL form
         * moves every compare's predicate through a core register: VMRS, VMSR; tt_fvec_dw.c does the same). */
        __asm__("vpt.f32 gt, %q1, %q0\n\tvmovt %q0, %q1\n\tvpt.f32 gt, %q0, %q2\n\tvmovt %q0, %q2"
                : "+w"(v)
                : "w"(lo), "w"(hi)
                : "p0");
        if (yh != 0) {
            /* VCVTB alone: a NaN lane here is Helium's default NaN (vector arithmetic made it or replaced an x
             * NaN's payload; a NaN bound is never selected), which VCVTB and tt_f16_narrow both make 0x7E00, so
             * tt_f32_to_f16x4_mve's NaN fix-up would change nothing */
            vstrhq_scatter_shifted_offset_p_u32(yh + at + k, yoffs, tt_mve_vcvtb_f16_f32(vreinterpretq_u32_f32(v)),
                                                live);
        } else {
            vstrwq_scatter_shifted_offset_p_f32(yf + at + k, yoffs, v, live);
        }
    }
}

/* A 1x1 conv's sums of output channels [oc, oc + 4) at four in-image pixels (x at xh / xf + offs, the lanes'
 * distances; ws, w: the channels' slice and whole-weight rows): tt_fc_sums' sums without its tap bookkeeping (one
 * tap, every lane in the image). A function of its own per x kind, so that its loop keeps the accumulators in
 * registers (inlined into the caller, the clamp and store vectors crowded them out). */
TT_FC_INLINE void tt_fc_pw(int half, const uint16_t *xh, const float *xf, uint32x4_t offs, const float *ws, int32_t n,
                           const float *w, int32_t in_c, float32x4_t *out)
{
    float32x4_t acc[4];
    acc[0] = acc[1] = acc[2] = acc[3] = vdupq_n_f32(0.0f);
    tt_fc_chans(half, xh, xf, offs, 0xFFFFu, 1, ws, n, 0, n, 4, acc);
    tt_fc_chans(half, xh, xf, offs, 0xFFFFu, 1, w, in_c, n, in_c, 4, acc);
    out[0] = acc[0];
    out[1] = acc[1];
    out[2] = acc[2];
    out[3] = acc[3];
}

static __attribute__((noinline)) void tt_fc_pw_h(const uint16_t *xh, uint32x4_t offs, const float *ws, int32_t n,
                                                 const float *w, int32_t in_c, float32x4_t *out)
{
    tt_fc_pw(1, xh, 0, offs, ws, n, w, in_c, out);
}

static __attribute__((noinline)) void tt_fc_pw_f(const float *xf, uint32x4_t offs, const float *ws, int32_t n,
                                                 const float *w, int32_t in_c, float32x4_t *out)
{
    tt_fc_pw(0, 0, xf, offs, ws, n, w, in_c, out);
}

/* The whole conv: output rows, four pixels at a time, output channels four at a time (then the last out_c % 4). */
TT_FC_INLINE void tt_fc_run(const tt_conv_dims *d0, float act_min, float act_max, const uint16_t *xh,
                            const float *xf, const float *w, const float *w_slice, int32_t n, const float *bias,
                            float *yf, uint16_t *yh)
{
    const float32x4_t lo = vdupq_n_f32(act_min), hi = vdupq_n_f32(act_max);
    tt_conv_dims d = *d0;
    uint32x4_t yoffs, xoffs;
    int32x4_t lane;
    int32_t b, oy, ox, oc, pw;
    if (d.k_h == 1 && d.k_w == 1 && d.stride_h == 1 && d.stride_w == 1 && d.pad_top == 0 && d.pad_left == 0 &&
        d.in_h == d.out_h && d.in_w == d.out_w) {
        /* every pixel's x and y are contiguous: one row of them, so only the image's last block is partial */
        d.in_w = d.out_w = d.batches * d.out_h * d.out_w;
        d.in_h = d.out_h = d.batches = 1;
    }
    /* 1x1 with every output pixel's input in the image: full blocks take tt_fc_pw */
    pw = d.k_h == 1 && d.k_w == 1 && d.pad_top == 0 && d.pad_left == 0 && (d.out_h - 1) * d.stride_h < d.in_h &&
         (d.out_w - 1) * d.stride_w < d.in_w;
    yoffs = vmulq_n_u32(vidupq_n_u32(0u, 1), (uint32_t)d.out_c);
    lane = vmulq_n_s32(vreinterpretq_s32_u32(vidupq_n_u32(0u, 1)), d.stride_w);
    xoffs = vreinterpretq_u32_s32(vmulq_n_s32(lane, d.in_c));
    for (b = 0; b < d.batches; ++b) {
        for (oy = 0; oy < d.out_h; ++oy) {
            const int32_t iy0 = oy * d.stride_h - d.pad_top;
            for (ox = 0; ox < d.out_w; ox += 4) {
                const mve_pred16_t live = vctp32q((uint32_t)(d.out_w - ox));
                const int32x4_t ix0 = vaddq_n_s32(lane, ox * d.stride_w - d.pad_left);
                const int32_t at = ((b * d.out_h + oy) * d.out_w + ox) * d.out_c;
                float32x4_t acc[4];
                oc = 0;
                if (pw && d.out_w - ox >= 4) {   /* 1x1, four pixels in the image: the channel blocks of four */
                    const int32_t px = ((b * d.in_h + iy0) * d.in_w + ox * d.stride_w) * d.in_c;
                    for (; oc + 4 <= d.out_c; oc += 4) {
                        if (xh != 0) {
                            tt_fc_pw_h(xh + px, xoffs, w_slice + oc * n, n, w + oc * d.in_c, d.in_c, acc);
                        } else {
                            tt_fc_pw_f(xf + px, xoffs, w_slice + oc * n, n, w + oc * d.in_c, d.in_c, acc);
                        }
                        tt_fc_out(acc, 4, bias, oc, lo, hi, yf, yh, at + oc, yoffs, live);
                    }
                }
                for (; oc < d.out_c; oc += 4) {
                    const int32_t K = d.out_c - oc < 4 ? d.out_c - oc : 4;
                    tt_fc_sums_k(xh != 0, K, &d, xh, xf, w, w_slice, n, oc, b, iy0, ix0, live, acc);
                    tt_fc_out(acc, K, bias, oc, lo, hi, yf, yh, at + oc, yoffs, live);
                }
            }
        }
    }
}

int32_t tt_fvec_conv2d_wcheck(const tt_conv_dims *d, float act_min, float act_max, const float *w,
                              const float *w_slice, int32_t n, const float *bias)
{
    return tt_fc_tail_ok(d, act_min, act_max, bias) ? tt_fc_emin_w(d, w, w_slice, n) : 0;
}

int32_t tt_fvec_conv2d_hx_ew(int32_t ew, const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                             const float *w, const float *w_slice, int32_t n, const float *bias, float *yf,
                             uint16_t *yh)
{
    if (ew < 48) {
        return 0;
    }
    if (yh != 0) {
        tt_fc_run(d, act_min, act_max, x, 0, w, w_slice, n, bias, 0, yh);
    } else {
        tt_fc_run(d, act_min, act_max, x, 0, w, w_slice, n, bias, yf, 0);
    }
    return 1;
}

int32_t tt_fvec_conv2d_fx_hy_ew(int32_t ew, const tt_conv_dims *d, float act_min, float act_max, const float *x,
                                const float *w, const float *w_slice, int32_t n, const float *bias, uint16_t *y)
{
    const int32_t ex = tt_fc_emin(x, d->batches * d->in_h * d->in_w * d->in_c);
    if (ex < 1 || ew < 1 || ex + ew < 174) {
        return 0;
    }
    tt_fc_run(d, act_min, act_max, 0, x, w, w_slice, n, bias, 0, y);
    return 1;
}

int32_t tt_fvec_conv2d_hx(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                          const float *w_slice, int32_t n, const float *bias, float *yf, uint16_t *yh)
{
    return tt_fvec_conv2d_hx_ew(tt_fvec_conv2d_wcheck(d, act_min, act_max, w, w_slice, n, bias), d, act_min, act_max,
                                x, w, w_slice, n, bias, yf, yh);
}

int32_t tt_fvec_conv2d_fx_hy(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *w_slice, int32_t n, const float *bias, uint16_t *y)
{
    return tt_fvec_conv2d_fx_hy_ew(tt_fvec_conv2d_wcheck(d, act_min, act_max, w, w_slice, n, bias), d, act_min,
                                   act_max, x, w, w_slice, n, bias, y);
}

#else
typedef int tt_fvec_conv_unused;
#endif
