#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_mve.h"
/* Helium kernels of fp16-mixed's depthwise forward (fp16 x, fp16 y) and input gradient (fp16 dy, fp16 dx) for
 * `target.kernels: mve` (interface: tt_fvec_dw.h; ops/tt_depthwise_conv2d.c calls them per channel when
 * tt_fvec_dw_ok allows and runs its portable loops otherwise).
 *
 * Lanes are pixels of ONE channel: four consecutive outputs of an output row (forward), or four consecutive input
 * pixels of one stride phase of an input row (input gradient), read with halfword gathers (a channel's pixels are
 * in_c elements apart). One channel at a time is what the in-place kernels' memory contract allows (one channel of
 * scratch), and a row of lanes covers the small planes of the trained layers (4x4, 8x8) without scalar leftovers.
 * A tap's weight is one scalar for all lanes (VMUL.F32 Qd, Qn, Rm). Lanes whose tap falls outside the image (padding)
 * get that tap predicated off; lane vectors wholly inside run without predicates, two at a time.
 *
 * Why the bits are the portable loops' (tt_fvec_mve.h's argument, checked for this kernel):
 *  - every product is fp16 x (widened exactly by VCVTB, which keeps fp16 subnormals) times an fp32 weight that
 *    passed tt_fvec_ok, and each lane's sum starts at +0: so every operand and every rounded product and sum is zero
 *    or normal (in G(2^-126)) and Helium's flush-to-zero never fires; one VMUL and one VADD per tap, taps in the
 *    portable loop's order (the channel functions below say how their tables list them);
 *  - a tap the portable loop skips (outside the image) is a predicated-off gather here: the lane adds +0 * w = +-0
 *    (w finite), which leaves its sum unchanged because the sum is never -0 (it starts at +0, and in round to
 *    nearest a sum is -0 only when both addends are);
 *  - the bias is +-0 or finite with a biased exponent >= 24 (a multiple of 2^-126: its ulp is), so s + bias is in
 *    G(2^-126) too (the forward conv's bias rule);
 *  - the clamp compares a zero / normal / infinite / default-NaN lane with bounds that tt_fvec_dw_ok found zero,
 *    normal or infinite, so no compare sees a subnormal; a NaN lane fails both compares and stays, as in
 *    tt_act_clamp; the selected bound is the bound's own bits;
 *  - the narrowing is VCVTB.F16.F32 (tt_f16_mve.h: FZ16 does not apply, nearest even, overflow to Inf). Its only
 *    difference from tt_f16_narrow is a NaN's sign and payload, and a NaN lane here can only be a result of Helium
 *    arithmetic, i.e. the default NaN (0x7FC00000), which both narrow to 0x7E00 (tt_f32_to_f16x4_mve's fix-up would
 *    change nothing). A NaN fp16 *input* loses its payload (the default NaN comes out): tt_fvec_mve.h says why
 *    fp16-mixed does not see that.
 * The input gradient's `total = 0 + s` (depth multiplier 1) is s itself, s never being -0. */

#include "tt_fvec_dw.h"

/* +-0, normal or infinite: the clamp bounds a vector compare sees as they are. */
static int32_t tt_fvec_dw_bound_ok(float f)
{
    uint32_t b;
    __builtin_memcpy(&b, &f, 4);
    b &= 0x7FFFFFFFu;
    return b == 0u || (b >= 0x00800000u && b <= 0x7F800000u);
}

/* +-0 or finite with a biased exponent >= 24: a bias in G(2^-126) (a weight needs tt_fvec_ok's 48: it is a factor). */
static int32_t tt_fvec_dw_bias_ok(const float *bias, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        uint32_t b;
        __builtin_memcpy(&b, &bias[i], 4);
        b &= 0x7FFFFFFFu;
        if (b != 0u && (b < (24u << 23) || b >= 0x7F800000u)) {
            return 0;
        }
    }
    return 1;
}

int32_t tt_fvec_dw_ok(const tt_conv_dims *d, const float *w, const float *bias, float lo, float hi)
{
    const int32_t taps = d->k_h * d->k_w;
    return d->depth_multiplier == 1 && taps <= TT_FVEC_DW_TAPS && tt_fvec_dw_bound_ok(lo) && tt_fvec_dw_bound_ok(hi) &&
           tt_fvec_ok(w, taps * d->out_c) && (bias == 0 || tt_fvec_dw_bias_ok(bias, d->out_c));
}

/* p[k] as an address: a row's first tap may lie before the tensor (left / top padding); only in-image lanes are
 * read. */
static inline const uint16_t *tt_fvec_dw_at(const uint16_t *p, int32_t k)
{
    return (const uint16_t *)((uintptr_t)p + (uintptr_t)((intptr_t)k * 2));
}

/* A tap of a row of lanes: its element offset from the row's src and its weight, side by side (one pointer walks
 * them in the loops). */
typedef struct {
    int32_t off;
    float w;
} tt_fvec_dw_tap;

/* The rows of lanes of one channel (or stride phase) as a set of constants (tt_fvec_dw_rows' argument); src, tap, tc,
 * nt and out are lane row 0's, and the row function sets them for each row. */
typedef struct {
    const uint16_t *src;          /* lane 0's element of tap offset 0 */
    const tt_fvec_dw_tap *tap;    /* the taps, in the order each lane adds them */
    const int32_t *tc;            /* per tap: its column coordinate for lane 0 */
    int32_t nt, lstep;            /* taps; elements from one lane to the next */
    int32_t rows, n;              /* lane rows, lanes per row */
    int32_t rsrc, rout;           /* elements from one lane row to the next in src and out */
    /* the taps come in nlr listed rows of ntr taps; listed row j reaches lane row a iff rc[j] + a * rs < rlim
     * (unsigned), for a contiguous range of j (rc is monotonic) */
    const int32_t *rc;
    int32_t nlr, ntr, rs, rlim;
    int32_t col0, cstep, lim;     /* lane i's tap t is in the image iff (col0 + i * cstep + tc[t]) < lim (unsigned) */
    int32_t tcmin, tcspan;        /* min of tc over the taps, max - min */
    const float *bias;
    int32_t clamp;
    float lo, hi;
    uint16_t *out;
    int32_t ostep;
} tt_fvec_dw_rowp;

/* Bias, clamp, narrowing and store of one lane vector (p: the active lanes). */
static inline void tt_fvec_dw_out(const tt_fvec_dw_rowp *r, float32x4_t v, uint16_t *out, uint32x4_t oofs,
                                  mve_pred16_t p)
{
    uint32x4_t h;
    if (r->bias != 0) {
        v = vaddq_n_f32(v, *r->bias);
    }
    if (r->clamp) {
        /* tt_act_clamp: v < lo tested as lo > v (the LT condition is true for unordered operands, GT is not, so a NaN
         * lane stays), then v > hi; each a VPT and a predicated VMOV (the intrinsics' VPSEL would move each
         * predicate through a core register, tt_fvec_dw_gather_in says why) */
        const float32x4_t lo = vdupq_n_f32(r->lo), hi = vdupq_n_f32(r->hi);
        __asm__("vpt.f32 gt, %q1, %q0\n\tvmovt %q0, %q1\n\tvpt.f32 gt, %q0, %q2\n\tvmovt %q0, %q2"
                : "+w"(v)
                : "w"(lo), "w"(hi)
                : "p0");
    }
    h = tt_mve_vcvtb_f16_f32(vreinterpretq_u32_f32(v));
    if (p == 0xFFFFu && r->ostep == 1) {
        vstrhq_u32(out, h);
    } else if (p == 0xFFFFu) {
        vstrhq_scatter_shifted_offset_u32(out, oofs, h);
    } else if (r->ostep == 1) {
        vstrhq_p_u32(out, h, p);
    } else {
        vstrhq_scatter_shifted_offset_p_u32(out, oofs, h, p);
    }
}

/* One lane vector whose lanes may have taps outside the image: tap t is read (and added) in the lanes where
 * col + tc[t] < lim; elsewhere the gather gives +0 and the lane adds +-0, which leaves its sum as it is (the sum is
 * never -0: tt_fvec_dw.c's header) - the portable loops skip those taps. p: the active lanes. */
static inline float32x4_t tt_fvec_dw_sum_edge(const tt_fvec_dw_rowp *r, const uint16_t *src, uint32x4_t lofs,
                                              uint32x4_t col, mve_pred16_t p)
{
    const uint32x4_t lim = vdupq_n_u32((uint32_t)r->lim);
    float32x4_t s = vdupq_n_f32(0.0f);
    int32_t t;
    for (t = 0; t < r->nt; ++t) {
        const tt_fvec_dw_tap k = r->tap[t];
        /* (a predicated compare for a tail: an AND of predicates would take a trip through a core register) */
        const uint32x4_t c = vaddq_n_u32(col, (uint32_t)r->tc[t]);
        const mve_pred16_t in = p == 0xFFFFu ? vcmphiq_u32(lim, c) : vcmphiq_m_u32(lim, c, p);
        const uint32x4_t h = vldrhq_gather_shifted_offset_z_u32(tt_fvec_dw_at(src, k.off), lofs, in);
        s = vaddq_f32(s, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h)), k.w));
    }
    return s;
}

/* The gather of base[ofs] in the lanes where lim > c (unsigned), +0 in the others: one VPT (compare and predicate)
 * and the predicated gather (a false-predicated lane of a load is zeroed). Written out because gcc 12 moves every
 * compare's predicate through a core register (VMRS, SXTH, VMSR) before a VPST. Qd differs from the offset register
 * (early clobber: a gather with Qd = Qm is UNPREDICTABLE); VPR is clobbered (gcc's name for it: "p0"). */
static inline uint32x4_t tt_fvec_dw_gather_in(const uint16_t *base, uint32x4_t ofs, uint32x4_t lim, uint32x4_t c)
{
    uint32x4_t h;
    __asm__("vpt.u32 hi, %q2, %q3\n\tvldrht.u32 %q0, [%1, %q4, uxtw #1]"
            : "=&w"(h)
            : "r"(base), "w"(lim), "w"(c), "w"(ofs)
            : "memory", "p0");
    return h;
}

/* Two lane vectors (8 lanes at lane offsets lofs and lofs4, lane columns c0 and c0 + 4 * cstep) some of whose taps
 * fall outside the image, as tt_fvec_dw_sum_edge does them, each tap read once. The row's fields are copied to
 * locals (the gathers' memory clobber would reload them every tap). */
static inline void tt_fvec_dw_sum8_edge(const tt_fvec_dw_rowp *r, const uint16_t *src, uint32x4_t lofs,
                                        uint32x4_t lofs4, uint32x4_t c0, float32x4_t *s0, float32x4_t *s1)
{
    const uint32x4_t lim = vdupq_n_u32((uint32_t)r->lim);
    const uint32_t c4 = (uint32_t)(4 * r->cstep);
    const tt_fvec_dw_tap *k = r->tap, *e = r->tap + r->nt;
    const int32_t *tc = r->tc;
    float32x4_t a = vdupq_n_f32(0.0f), b = vdupq_n_f32(0.0f);
    for (; k < e; ++k, ++tc) {
        const uint16_t *q = tt_fvec_dw_at(src, k->off);
        const float w = k->w;
        const uint32x4_t c = vaddq_n_u32(c0, (uint32_t)*tc);
        const uint32x4_t h0 = tt_fvec_dw_gather_in(q, lofs, lim, c);
        const uint32x4_t h1 = tt_fvec_dw_gather_in(q, lofs4, lim, vaddq_n_u32(c, c4));
        a = vaddq_f32(a, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h0)), w));
        b = vaddq_f32(b, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h1)), w));
    }
    *s0 = a;
    *s1 = b;
}

/* One full lane vector (lane columns c0): tt_fvec_dw_sum8_edge's loop for four lanes. */
static inline float32x4_t tt_fvec_dw_sum4_edge(const tt_fvec_dw_rowp *r, const uint16_t *src, uint32x4_t lofs,
                                               uint32x4_t c0)
{
    const uint32x4_t lim = vdupq_n_u32((uint32_t)r->lim);
    const tt_fvec_dw_tap *k = r->tap, *e = r->tap + r->nt;
    const int32_t *tc = r->tc;
    float32x4_t a = vdupq_n_f32(0.0f);
    for (; k < e; ++k, ++tc) {
        const uint32x4_t c = vaddq_n_u32(c0, (uint32_t)*tc);
        const uint32x4_t h = tt_fvec_dw_gather_in(tt_fvec_dw_at(src, k->off), lofs, lim, c);
        a = vaddq_f32(a, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h)), k->w));
    }
    return a;
}

/* One full lane vector with every tap in the image. */
static inline float32x4_t tt_fvec_dw_sum4(const tt_fvec_dw_rowp *r, const uint16_t *src, uint32x4_t lofs)
{
    const tt_fvec_dw_tap *k = r->tap, *e = r->tap + r->nt;
    float32x4_t a = vdupq_n_f32(0.0f);
    for (; k < e; ++k) {
        const uint32x4_t h = vldrhq_gather_shifted_offset_u32(tt_fvec_dw_at(src, k->off), lofs);
        a = vaddq_f32(a, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h)), k->w));
    }
    return a;
}

/* Two lane vectors (8 lanes: lane offsets lofs and lofs4) with every tap in the image: each tap read once, no
 * predicates. */
static inline void tt_fvec_dw_sum8(const tt_fvec_dw_rowp *r, const uint16_t *src, uint32x4_t lofs, uint32x4_t lofs4,
                                   float32x4_t *s0, float32x4_t *s1)
{
    float32x4_t a = vdupq_n_f32(0.0f), b = vdupq_n_f32(0.0f);
    const tt_fvec_dw_tap *k = r->tap, *e = r->tap + r->nt;
    for (; k < e; ++k) {
        const uint16_t *q = tt_fvec_dw_at(src, k->off);
        const float w = k->w;
        const uint32x4_t h0 = vldrhq_gather_shifted_offset_u32(q, lofs);
        const uint32x4_t h1 = vldrhq_gather_shifted_offset_u32(q, lofs4);
        a = vaddq_f32(a, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h0)), w));
        b = vaddq_f32(b, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h1)), w));
    }
    *s0 = a;
    *s1 = b;
}

/* Every lane row of r: lane i of row a reads src[a * rsrc + off[t] + i * lstep] for its in-image taps (the listed
 * rows that reach row a), in t order, and writes out[a * rout + i * ostep]. The lane vectors and bounds are set up
 * once for all rows (a small plane has few lanes per row, so a set-up per row cost as much as its sums). */
static void tt_fvec_dw_rows(const tt_fvec_dw_rowp *r0)
{
    const uint32x4_t lane = vidupq_n_u32(0u, 1);
    const uint32x4_t lofs = vmulq_n_u32(lane, (uint32_t)r0->lstep), oofs = vmulq_n_u32(lane, (uint32_t)r0->ostep);
    const uint32x4_t lofs4 = vaddq_n_u32(lofs, (uint32_t)(4 * r0->lstep));
    const uint32x4_t cl = vmulq_n_u32(lane, (uint32_t)r0->cstep);
    /* a lane vector is inside when every lane's col + tcmin < lim - tcspan (unsigned: col + tcmin >= 0 too) */
    const uint32x4_t inner = vdupq_n_u32((uint32_t)(r0->lim - r0->tcspan > 0 ? r0->lim - r0->tcspan : 0));
    const int32_t n = r0->n;
    tt_fvec_dw_rowp row = *r0;
    const tt_fvec_dw_rowp *r = &row;
    int32_t a;
    for (a = 0; a < r0->rows; ++a) {
        int32_t j0 = 0, j1 = r0->nlr, i = 0;
        while (j0 < j1 && (uint32_t)(r0->rc[j0] + a * r0->rs) >= (uint32_t)r0->rlim) {
            ++j0;
        }
        while (j1 > j0 && (uint32_t)(r0->rc[j1 - 1] + a * r0->rs) >= (uint32_t)r0->rlim) {
            --j1;
        }
        row.src = tt_fvec_dw_at(r0->src, a * r0->rsrc);
        row.out = r0->out + a * r0->rout;
        row.tap = r0->tap + j0 * r0->ntr;
        row.tc = r0->tc + j0 * r0->ntr;
        row.nt = (j1 - j0) * r0->ntr;
        for (; i + 8 <= n; i += 8) {
            const uint16_t *src = tt_fvec_dw_at(r->src, i * r->lstep);
            const uint32x4_t c0 = vaddq_n_u32(cl, (uint32_t)(r->col0 + i * r->cstep));
            const uint32x4_t c1 = vaddq_n_u32(cl, (uint32_t)(r->col0 + (i + 4) * r->cstep));
            const mve_pred16_t in = vcmphiq_u32(inner, vaddq_n_u32(c0, (uint32_t)r->tcmin)) &
                                    vcmphiq_u32(inner, vaddq_n_u32(c1, (uint32_t)r->tcmin));
            float32x4_t s0, s1;
            if (in == 0xFFFFu) {
                tt_fvec_dw_sum8(r, src, lofs, lofs4, &s0, &s1);
            } else {
                tt_fvec_dw_sum8_edge(r, src, lofs, lofs4, c0, &s0, &s1);
            }
            tt_fvec_dw_out(r, s0, r->out + i * r->ostep, oofs, 0xFFFFu);
            tt_fvec_dw_out(r, s1, r->out + (i + 4) * r->ostep, oofs, 0xFFFFu);
        }
        if (i + 4 <= n) {
            const uint16_t *src = tt_fvec_dw_at(r->src, i * r->lstep);
            const uint32x4_t c0 = vaddq_n_u32(cl, (uint32_t)(r->col0 + i * r->cstep));
            const mve_pred16_t in = vcmphiq_u32(inner, vaddq_n_u32(c0, (uint32_t)r->tcmin));
            tt_fvec_dw_out(r, in == 0xFFFFu ? tt_fvec_dw_sum4(r, src, lofs) : tt_fvec_dw_sum4_edge(r, src, lofs, c0),
                           r->out + i * r->ostep, oofs, 0xFFFFu);
            i += 4;
        }
        if (i < n) {
            const mve_pred16_t p = vctp32q((uint32_t)(n - i));
            const uint32x4_t c = vaddq_n_u32(cl, (uint32_t)(r->col0 + i * r->cstep));
            tt_fvec_dw_out(r, tt_fvec_dw_sum_edge(r, tt_fvec_dw_at(r->src, i * r->lstep), lofs, c, p),
                           r->out + i * r->ostep, oofs, p);
        }
    }
}

/* The forward of one channel: output (oy, ox) is lane ox of row oy; its taps (ky, kx) in (filter y, filter x) order,
 * the filter rows outside the image left out of the row's tap range (ky outer in the table, so they are its ends),
 * the columns outside the image predicated off per lane: the taps and order of tt_dw_hx_hy_px / tt_dw_hx_hy_3x3. */
void tt_fvec_dw_hx_hy_channel(const tt_conv_dims *d, const uint16_t *xc, const float *wc, const float *bc, float lo,
                              float hi, uint16_t *yc, int32_t ys)
{
    const int32_t C = d->in_c, W = d->in_w, KW = d->k_w, KH = d->k_h, dh = d->dilation_h;
    tt_fvec_dw_tap tap[TT_FVEC_DW_TAPS];
    int32_t tc[TT_FVEC_DW_TAPS], rc[TT_FVEC_DW_TAPS];
    int32_t ky, kx;
    tt_fvec_dw_rowp r;
    for (ky = 0; ky < KH; ++ky) {
        rc[ky] = ky * dh - d->pad_top;   /* the input row of filter row ky for output row 0 */
        for (kx = 0; kx < KW; ++kx) {
            tap[ky * KW + kx].off = (ky * dh * W + kx * d->dilation_w) * C;
            tap[ky * KW + kx].w = wc[(ky * KW + kx) * C];
            tc[ky * KW + kx] = kx * d->dilation_w;
        }
    }
    r.lstep = d->stride_w * C;
    r.col0 = -d->pad_left;
    r.cstep = d->stride_w;
    r.lim = W;
    r.tcmin = 0;
    r.tcspan = (KW - 1) * d->dilation_w;
    r.bias = bc;
    r.clamp = 1;
    r.lo = lo;
    r.hi = hi;
    r.ostep = ys;
    /* output row oy: input rows from oy * stride_h - pad_top; the filter rows outside the image are left out of the
     * row's tap range (ky outer in the table, so they are its ends) */
    r.src = tt_fvec_dw_at(xc, (-d->pad_top * W - d->pad_left) * C);
    r.tap = tap;
    r.tc = tc;
    r.nt = KH * KW;
    r.out = yc;
    r.rows = d->out_h;
    r.n = d->out_w;
    r.rsrc = d->stride_h * W * C;
    r.rout = d->out_w * ys;
    r.rc = rc;
    r.nlr = KH;
    r.ntr = KW;
    r.rs = d->stride_h;
    r.rlim = d->in_h;
    tt_fvec_dw_rows(&r);
}

/* The input gradient of one channel, stride phase by stride phase: the input pixels (fy + a * S_h, fx + b * S_w) of
 * phase (fy, fx) are lane b of lane row a. The taps through which such a pixel can reach an output are the filter
 * rows ky with (fy + pad_top - ky * dil_h) divisible by S_h and the columns kx likewise (tt_dw_gi_list's test, the
 * same for the whole phase), reaching output (ty[ky] + a, tx[kx] + b); listed rows outer, both ascending: the order
 * of tt_dw_gi_list's lists and tt_dw_gi_hdy_hdx_px's loops. A row tap reaches an output row in [0, OH) for a
 * contiguous range of the list (ty falls as ky grows): the lane row's tap range; a column tap outside [0, OW) is
 * predicated off per lane. Depth multiplier 1: total = 0 + s = s (header). */
void tt_fvec_dw_gi_channel(const tt_conv_dims *d, const uint16_t *dyc, const float *wc, uint16_t *outc, int32_t os)
{
    const int32_t OC = d->out_c, OW = d->out_w, OH = d->out_h, KW = d->k_w, SH = d->stride_h, SW = d->stride_w;
    tt_fvec_dw_tap tap[TT_FVEC_DW_TAPS];
    int32_t tc[TT_FVEC_DW_TAPS];
    int32_t ty[TT_FVEC_DW_TAPS], tx[TT_FVEC_DW_TAPS], kxs[TT_FVEC_DW_TAPS];
    int32_t fy, fx, ky, kx, nfy, nfx, i, j;
    tt_fvec_dw_rowp r;
    r.lstep = OC;
    r.col0 = 0;
    r.cstep = 1;
    r.lim = OW;
    r.bias = 0;
    r.clamp = 0;
    r.lo = 0.0f;
    r.hi = 0.0f;
    r.ostep = SW * os;
    for (fy = 0; fy < SH && fy < d->in_h; ++fy) {
        for (fx = 0; fx < SW && fx < d->in_w; ++fx) {
            nfx = 0;
            for (kx = 0; kx < KW; ++kx) {
                const int32_t t = fx + d->pad_left - kx * d->dilation_w;
                if (t % SW == 0) {
                    tx[nfx] = t / SW;
                    kxs[nfx++] = kx;
                }
            }
            nfy = 0;
            for (ky = 0; ky < d->k_h; ++ky) {
                const int32_t t = fy + d->pad_top - ky * d->dilation_h;
                if (t % SH == 0) {
                    ty[nfy] = t / SH;
                    for (j = 0; j < nfx; ++j) {
                        i = nfy * nfx + j;
                        tap[i].off = (ty[nfy] * OW + tx[j]) * OC;
                        tap[i].w = wc[(ky * KW + kxs[j]) * OC];
                        tc[i] = tx[j];
                    }
                    ++nfy;
                }
            }
            r.tcmin = nfx > 0 ? tx[nfx - 1] : 0;
            r.tcspan = nfx > 0 ? tx[0] - tx[nfx - 1] : 0;
            /* lane row a: the listed rows with 0 <= ty + a < OH (ty falls as the list goes on: a contiguous range) */
            r.src = dyc;
            r.tap = tap;
            r.tc = tc;
            r.nt = nfy * nfx;
            r.out = outc + (fy * d->in_w + fx) * os;
            r.rows = (d->in_h - fy + SH - 1) / SH;
            r.n = (d->in_w - fx + SW - 1) / SW;
            r.rsrc = OW * OC;
            r.rout = SH * d->in_w * os;
            r.rc = ty;
            r.nlr = nfy;
            r.ntr = nfx;
            r.rs = 1;
            r.rlim = OH;
            tt_fvec_dw_rows(&r);
        }
    }
}

void tt_fvec_dw_put(const uint16_t *src, int32_t n, uint16_t *dst, int32_t stride)
{
    const uint32x4_t ofs = vmulq_n_u32(vidupq_n_u32(0u, 1), (uint32_t)stride);
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        vstrhq_scatter_shifted_offset_u32(dst + i * stride, ofs, vldrhq_u32(src + i));
    }
    if (i < n) {
        const mve_pred16_t p = vctp32q((uint32_t)(n - i));
        vstrhq_scatter_shifted_offset_p_u32(dst + i * stride, ofs, vldrhq_z_u32(src + i, p), p);
    }
}

#else
typedef int tt_fvec_dw_unused;
#endif
