#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_mve.h"
/* Helium fp32-vector weight gradients of fp16-mixed (tt_fvec_gw.h): conv2d's tt_gw_walk and the fully connected
 * tt_fc_grad_weight_impl, which is the same sum (a 1x1 conv over `rows` pixels).
 *
 * The portable loop: for each output channel o and tap, dw[o, tap, c] = +0, then += dy[p, o] * x[p', c] for every
 * pixel of the tap's walk (tt_tap_walk: rows in order, out-of-image taps not in it, no pixel skipped for a zero dy),
 * one product and one sum per step, rounded twice (-ffp-contract=off). Here four consecutive input channels c are
 * the lanes of a vector, up to sixteen channels (four accumulators) per pass over the walk, dy[p, o] widened once
 * per pixel and multiplied in as a scalar (VMUL.F32 Qd, Qn, Rm), then VADD: each lane adds exactly its channel's
 * products in the portable order, starting at +0.
 *
 * Why that gives the portable bits (tt_fvec_mve.h): every accumulator starts at +0 and every product has an fp16
 * factor; the other factor is fp16 too (fp16-mixed's dy and saved x: the products are in G(2^-48), no check), or an
 * fp32 operand that passes the check below (a fp32 dy column or fp32 x). So no lane ever holds a subnormal and
 * Helium's forced flush-to-zero changes nothing. NaN operands can come out as the default NaN (tt_fvec_mve.h). */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* tt_conv_common.h's statics that this unit does not call */
#include "tt_conv_common.h"
#pragma GCC diagnostic pop
#include "tt_f16.h"
#include "tt_fvec_gw.h"

#define TT_FVEC_GW_INLINE static inline __attribute__((always_inline))

/* 1 when dy[r * stride] for r < rows are all +-0 or finite with |v| >= 2^-79: tt_fvec_ok's condition on a strided
 * column, gathered four rows at a time. m = the magnitude's bits shifted left once: the value is allowed when m is 0
 * or 48 << 24 <= m < 255 << 24, i.e. when min(m - 1) (0 wraps to the maximum) >= (48 << 24) - 1 and max(m) is below
 * the Inf/NaN exponent. */
static int32_t tt_fvec_gw_ok_col(const float *v, int32_t rows, int32_t stride)
{
    const uint32_t *u = (const uint32_t *)(const void *)v;
    const uint32x4_t step = vdupq_n_u32((uint32_t)(4 * stride));
    uint32x4_t off = vmulq_n_u32(vidupq_n_u32(0u, 1), (uint32_t)stride);
    uint32x4_t lo = vdupq_n_u32(0xFFFFFFFFu), hi = vdupq_n_u32(0u);
    int32_t r;
    for (r = 0; r < rows; r += 4) {
        const mve_pred16_t p = vctp32q((uint32_t)(rows - r));
        const uint32x4_t m = vshlq_n_u32(vldrwq_gather_shifted_offset_z_u32(u, off, p), 1); /* idle lanes: 0 */
        lo = vminq_u32(lo, vsubq_u32(m, vdupq_n_u32(1u)));
        hi = vmaxq_u32(hi, m);
        off = vaddq_u32(off, step);
    }
    return vminvq_u32(0xFFFFFFFFu, lo) >= (48u << 24) - 1u && vmaxvq_u32(0u, hi) < (255u << 24);
}

/* The fp32 operands a call reads satisfy tt_fvec_mve.h's condition: dy's columns [o0, o1) of every output pixel
 * (rows dy_rows, dy_c channels), x's channels [0, k) of every input pixel (rows x_rows, x_c channels). Every pixel is
 * checked, read or not (a pixel no tap reads only makes the check stricter). */
static int32_t tt_fvec_gw_ok(const float *dyf, int32_t dy_rows, int32_t dy_c, int32_t o0, int32_t o1,
                             const float *xf, int32_t x_rows, int32_t x_c, int32_t k)
{
    int32_t i;
    if (dyf != 0) {
        if (o1 - o0 == dy_c) {
            if (!tt_fvec_ok(dyf, dy_rows * dy_c)) {
                return 0;
            }
        } else {
            for (i = o0; i < o1; ++i) {
                if (!tt_fvec_gw_ok_col(dyf + i, dy_rows, dy_c)) {
                    return 0;
                }
            }
        }
    }
    if (xf != 0) {
        if (k == x_c) {
            return tt_fvec_ok(xf, x_rows * x_c);
        }
        for (i = 0; i < x_rows; ++i) {
            if (!tt_fvec_ok(xf + i * x_c, k)) {
                return 0;
            }
        }
    }
    return 1;
}

/* The operands of a call: dy and x each fp32 (f) or fp16 (h), the other pointer 0. The kernels below take the kinds
 * as constants too (hdy, hx), so that each specialization compiles to the reads of its own kinds. */
typedef struct {
    const float *dyf;
    const uint16_t *dyh;
    const float *xf;
    const uint16_t *xh;
} tt_fvec_gw_ops;

/* dy[g] as the portable loop reads it (tt_f_or_h): exact. */
TT_FVEC_GW_INLINE float tt_fvec_gw_dy(const tt_fvec_gw_ops *op, const int hdy, int32_t g)
{
    return hdy ? tt_f16_read(op->dyh[g]) : op->dyf[g];
}

/* x[i .. i + 4) as four fp32 lanes (exact); unless full, the lanes p leaves idle read nothing and hold +0. */
TT_FVEC_GW_INLINE float32x4_t tt_fvec_gw_x(const tt_fvec_gw_ops *op, const int hx, int32_t i, const int full,
                                           mve_pred16_t p)
{
    if (hx) {
        return full ? tt_fvec_ld_h4(op->xh + i)
                    : vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(vldrhq_z_u32(op->xh + i, p)));
    }
    return full ? vldrwq_f32(op->xf + i) : vldrwq_z_f32(op->xf + i, p);
}

/* VCVTT.F32.F16 Qd, Qm: each 32-bit lane of d = float(the fp16 in the high half of m's lane). tt_f16_mve.h's
 * VCVTB with the T bit (bit 12 of the second halfword) set, emitted as an instruction word for the same reason. */
TT_FVEC_GW_INLINE uint32x4_t tt_fvec_gw_vcvtt_f32_f16(uint32x4_t m)
{
    uint32x4_t d;
    __asm__(TT_MVE_QNUM("tt_qd", "%q0") TT_MVE_QNUM("tt_qm", "%q1")
            ".inst.w 0xfe3f1e01 | (tt_qd << 13) | (tt_qm << 1)" : "=w"(d) : "w"(m));
    return d;
}

/* acc + dy * x: one VMUL (by the scalar) and one VADD, the portable `dw[c] += g * x` rounded twice. */
TT_FVEC_GW_INLINE float32x4_t tt_fvec_gw_mac(float32x4_t acc, float32x4_t x, float g)
{
    return vaddq_f32(acc, vmulq_n_f32(x, g));
}

/* The sums of one pass, up to four vectors of channels. */
typedef struct {
    float32x4_t a0, a1, a2, a3;
} tt_fvec_gw_acc;

/* n pixels of a run: dy[g], dy[g + gs], ... times x[at ..], x[at + xs ..], ... added to the pass's sums, pixel by
 * pixel; nv vectors of channels, the last one's lanes limited by p unless full. il (sixteen fp16 channels): each
 * eight come in one 128-bit load, widened by VCVTB (even channels: a0, a2) and VCVTT (odd: a1, a3), one load and
 * one conversion fewer per eight; every lane still holds one channel's sum. */
TT_FVEC_GW_INLINE void tt_fvec_gw_px(tt_fvec_gw_acc *acc, int32_t n, int32_t g, int32_t gs, int32_t at, int32_t xs,
                                     const tt_fvec_gw_ops *op, const int hdy, const int hx, const int nv,
                                     const int full, const int il, mve_pred16_t p)
{
    float32x4_t a0 = acc->a0, a1 = acc->a1, a2 = acc->a2, a3 = acc->a3;
    int32_t i;
    for (i = 0; i < n; ++i, g += gs, at += xs) {
        const float gv = tt_fvec_gw_dy(op, hdy, g);
        if (il) {
            const uint32x4_t h0 = vreinterpretq_u32_u16(vldrhq_u16(op->xh + at));
            const uint32x4_t h1 = vreinterpretq_u32_u16(vldrhq_u16(op->xh + at + 8));
            a0 = tt_fvec_gw_mac(a0, vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h0)), gv);
            a1 = tt_fvec_gw_mac(a1, vreinterpretq_f32_u32(tt_fvec_gw_vcvtt_f32_f16(h0)), gv);
            a2 = tt_fvec_gw_mac(a2, vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h1)), gv);
            a3 = tt_fvec_gw_mac(a3, vreinterpretq_f32_u32(tt_fvec_gw_vcvtt_f32_f16(h1)), gv);
        } else if (nv == 1) {
            a0 = tt_fvec_gw_mac(a0, tt_fvec_gw_x(op, hx, at, full, p), gv);
        } else if (nv == 2) {
            a0 = tt_fvec_gw_mac(a0, tt_fvec_gw_x(op, hx, at, 1, p), gv);
            a1 = tt_fvec_gw_mac(a1, tt_fvec_gw_x(op, hx, at + 4, full, p), gv);
        } else if (nv == 3) {
            a0 = tt_fvec_gw_mac(a0, tt_fvec_gw_x(op, hx, at, 1, p), gv);
            a1 = tt_fvec_gw_mac(a1, tt_fvec_gw_x(op, hx, at + 4, 1, p), gv);
            a2 = tt_fvec_gw_mac(a2, tt_fvec_gw_x(op, hx, at + 8, full, p), gv);
        } else {
            a0 = tt_fvec_gw_mac(a0, tt_fvec_gw_x(op, hx, at, 1, p), gv);
            a1 = tt_fvec_gw_mac(a1, tt_fvec_gw_x(op, hx, at + 4, 1, p), gv);
            a2 = tt_fvec_gw_mac(a2, tt_fvec_gw_x(op, hx, at + 8, 1, p), gv);
            a3 = tt_fvec_gw_mac(a3, tt_fvec_gw_x(op, hx, at + 12, full, p), gv);
        }
    }
    acc->a0 = a0;
    acc->a1 = a1;
    acc->a2 = a2;
    acc->a3 = a3;
}

/* One pass over tap (ky, kx)'s walk for output channel o: input channels [c0, c0 + 4 * nv), the last vector's lanes
 * limited to `last` (1..4; full: 4 and no predicate), written to dwp[c0 ..]. wide: x's rows hold all 4 * nv
 * channels (a slice k < in_c), so the last vector is loaded whole and only its store is limited (the lanes past k
 * compute on channels no result keeps). flat: a 1x1 stride-1 unpadded conv, whose walk is every pixel in order, run
 * as one row. */
TT_FVEC_GW_INLINE void tt_fvec_gw_pass(const tt_conv_dims *d, int32_t ky, int32_t kx, int32_t o,
                                       const tt_fvec_gw_ops *op, const int hdy, const int hx, int32_t c0,
                                       const int nv, const int full, const int wide, int32_t last, int flat,
                                       float *dwp)
{
    const int il = hx && nv == 4 && full;
    const int lfull = full || wide;
    const mve_pred16_t p = vctp32q((uint32_t)last);
    const int32_t ic = d->in_c, oc = d->out_c;
    tt_fvec_gw_acc acc;
    acc.a0 = vdupq_n_f32(0.0f);
    acc.a1 = acc.a0;
    acc.a2 = acc.a0;
    acc.a3 = acc.a0;
    if (flat) {
        tt_fvec_gw_px(&acc, d->batches * d->in_h * d->in_w, o, oc, c0, ic, op, hdy, hx, nv, lfull, il, p);
    } else {
        tt_tap_walk tw;
        tt_tap_walk_init(d, ky, kx, &tw);
        while (tt_tap_walk_next(&tw)) {
            tt_fvec_gw_px(&acc, tw.n, tw.dy_px * oc + o, oc, tw.x_px * ic + c0, tw.x_step * ic, op, hdy, hx, nv, lfull,
                          il, p);
        }
    }
    dwp += c0;
    if (il) {   /* channels back in order: VST2 interleaves the even and odd lanes */
        float32x4x2_t lo, hi;
        lo.val[0] = acc.a0;
        lo.val[1] = acc.a1;
        hi.val[0] = acc.a2;
        hi.val[1] = acc.a3;
        vst2q_f32(dwp, lo);
        vst2q_f32(dwp + 8, hi);
        return;
    }
    if (nv >= 2) {
        vstrwq_f32(dwp, acc.a0);
    }
    if (nv >= 3) {
        vstrwq_f32(dwp + 4, acc.a1);
    }
    if (nv >= 4) {
        vstrwq_f32(dwp + 8, acc.a2);
    }
    {
        const float32x4_t al = nv == 1 ? acc.a0 : nv == 2 ? acc.a1 : nv == 3 ? acc.a2 : acc.a3;
        if (full) {
            vstrwq_f32(dwp + 4 * (nv - 1), al);
        } else {
            vstrwq_p_f32(dwp + 4 * (nv - 1), al, p);
        }
    }
}

/* The last 1..15 channels of a tap in one pass of nv vectors (wide: see tt_fvec_gw_pass). */
TT_FVEC_GW_INLINE void tt_fvec_gw_rest(const tt_conv_dims *d, int32_t ky, int32_t kx, int32_t o,
                                       const tt_fvec_gw_ops *op, const int hdy, const int hx, int32_t c,
                                       const int nv, int32_t rest, int flat, float *dwp)
{
    if (c + 4 * nv <= d->in_c) {
        tt_fvec_gw_pass(d, ky, kx, o, op, hdy, hx, c, nv, 0, 1, rest - 4 * (nv - 1), flat, dwp);
    } else {
        tt_fvec_gw_pass(d, ky, kx, o, op, hdy, hx, c, nv, 0, 0, rest - 4 * (nv - 1), flat, dwp);
    }
}

/* Every channel of one tap: sixteen at a time, then the rest (1..15) in one pass of as many vectors as they need. */
TT_FVEC_GW_INLINE void tt_fvec_gw_tap(const tt_conv_dims *d, int32_t k, int32_t ky, int32_t kx, int32_t o,
                                      const tt_fvec_gw_ops *op, const int hdy, const int hx, int flat, float *dwp)
{
    int32_t c = 0, rest;
    for (; c + 16 <= k; c += 16) {
        tt_fvec_gw_pass(d, ky, kx, o, op, hdy, hx, c, 4, 1, 1, 4, flat, dwp);
    }
    rest = k - c;
    switch ((rest + 3) / 4) {
    case 1:
        tt_fvec_gw_rest(d, ky, kx, o, op, hdy, hx, c, 1, rest, flat, dwp);
        break;
    case 2:
        tt_fvec_gw_rest(d, ky, kx, o, op, hdy, hx, c, 2, rest, flat, dwp);
        break;
    case 3:
        tt_fvec_gw_rest(d, ky, kx, o, op, hdy, hx, c, 3, rest, flat, dwp);
        break;
    case 4:
        tt_fvec_gw_rest(d, ky, kx, o, op, hdy, hx, c, 4, rest, flat, dwp);
        break;
    default:
        break;
    }
}

/* The walk for operands of kinds hdy, hx (constants). */
TT_FVEC_GW_INLINE void tt_fvec_gw_walk(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1,
                                       const tt_fvec_gw_ops *op, const int hdy, const int hx, float *dw)
{
    const int flat = d->k_h == 1 && d->k_w == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_top == 0 &&
                     d->pad_left == 0 && d->out_h == d->in_h && d->out_w == d->in_w;
    int32_t o, ky, kx;
    for (o = o0; o < o1; ++o) {
        for (ky = 0; ky < d->k_h; ++ky) {
            for (kx = 0; kx < d->k_w; ++kx) {
                tt_fvec_gw_tap(d, k, ky, kx, o, op, hdy, hx, flat, dw + (((o - o0) * d->k_h + ky) * d->k_w + kx) * k);
            }
        }
    }
}

static void tt_fvec_gw_run(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                           const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw)
{
    const tt_fvec_gw_ops op = {dyf, dyh, xf, xh};
    if (dyh != 0 && xh != 0) {
        tt_fvec_gw_walk(d, k, o0, o1, &op, 1, 1, dw);
    } else if (dyh != 0) {
        tt_fvec_gw_walk(d, k, o0, o1, &op, 1, 0, dw);
    } else {
        tt_fvec_gw_walk(d, k, o0, o1, &op, 0, 1, dw);
    }
}

int32_t tt_fvec_gw_conv(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                        const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw)
{
    if (dyh == 0 && xh == 0) {
        return 0; /* two fp32 factors: their product can be subnormal whatever the check */
    }
    if (!tt_fvec_gw_ok(dyf, d->batches * d->out_h * d->out_w, d->out_c, o0, o1, xf, d->batches * d->in_h * d->in_w,
                       d->in_c, k)) {
        return 0;
    }
    tt_fvec_gw_run(d, k, o0, o1, dyf, dyh, xf, xh, dw);
    return 1;
}

int32_t tt_fvec_gw_fc(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0, int32_t o1,
                      const float *dyf, const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw)
{
    /* the rows as one image row of `rows` pixels: the 1x1 conv walk visits them in order */
    const tt_conv_dims d = {1, 1, rows, depth, 1, rows, out_c, 1, 1, 1, 1, 1, 1, 0, 0, 1};
    return tt_fvec_gw_conv(&d, k, o0, o1, dyf, dyh, xf, xh, dw);
}

#if defined(TT_FVEC_GW_TEST)
void tt_fvec_gw_conv_unchecked(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                               const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw)
{
    tt_fvec_gw_run(d, k, o0, o1, dyf, dyh, xf, xh, dw);
}
#endif

#else
typedef int tt_fvec_gw_unused;
#endif
