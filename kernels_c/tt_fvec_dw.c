#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_mve.h"
/* Helium runs of fp16-mixed's depthwise forward (fp16 x, fp16 y) and input gradient (fp16 dy, fp16 dx) for
 * `target.kernels: mve` (tt_fvec_dw.h has the interface; ops/tt_depthwise_conv2d.c builds the tap tables and runs
 * the border pixels with its portable code).
 *
 * Lanes are pixels of ONE channel (four consecutive outputs along x, or four input pixels of one stride phase),
 * read with halfword gathers: the in-place kernels compute one channel at a time into one channel of scratch (their
 * memory contract), and a channel's pixels are in_c elements apart. A tap's weight is one scalar for all four lanes
 * (VMUL.F32 Qd, Qn, Rm).
 *
 * Why the bits are the portable loops' (tt_fvec_mve.h's argument, checked for this kernel):
 *  - every product is fp16 x (widened exactly by VCVTB, which keeps fp16 subnormals) times an fp32 weight that
 *    passed tt_fvec_ok, and each lane's sum starts at +0: so every operand and every rounded product and sum is zero
 *    or normal (in G(2^-126)) and Helium's flush-to-zero never fires; one VMUL and one VADD per tap, taps in the
 *    order of the caller's table, which lists the portable loop's order (ops/tt_depthwise_conv2d.c);
 *  - the bias passed tt_fvec_ok, so s + bias is in G(2^-126) too;
 *  - the clamp compares a zero / normal / infinite / default-NaN lane with bounds that tt_fvec_dw_ok found zero,
 *    normal or infinite, so no compare sees a subnormal; a NaN lane fails both compares and stays, as in
 *    tt_act_clamp; the selected bound is the bound's own bits;
 *  - the narrowing is VCVTB.F16.F32 (tt_f16_mve.h: FZ16 does not apply, nearest even, overflow to Inf). Its only
 *    difference from tt_f16_narrow is a NaN's sign and payload, and a NaN lane here can only be a result of Helium
 *    arithmetic, i.e. the default NaN (0x7FC00000), which both narrow to 0x7E00 (tt_f32_to_f16x4_mve's fix-up would
 *    change nothing). A NaN fp16 *input* loses its payload (the default NaN comes out): tt_fvec_mve.h says why
 *    fp16-mixed does not see that.
 * The input gradient's `total = 0 + s` (depth multiplier 1) is s itself: s starts at +0, and in round to nearest a
 * sum is -0 only when both addends are, so s is never -0, and 0 + s = s for every other s. */

#include "tt_fvec_dw.h"

/* +-0, normal or infinite: the clamp bounds a vector compare sees as they are. */
static int32_t tt_fvec_dw_bound_ok(float f)
{
    uint32_t b;
    __builtin_memcpy(&b, &f, 4);
    b &= 0x7FFFFFFFu;
    return b == 0u || (b >= 0x00800000u && b <= 0x7F800000u);
}

int32_t tt_fvec_dw_ok(const float *w, int32_t nw, const float *bias, int32_t nb, float lo, float hi)
{
    return tt_fvec_dw_bound_ok(lo) && tt_fvec_dw_bound_ok(hi) && tt_fvec_ok(w, nw) &&
           (bias == 0 || tt_fvec_ok(bias, nb));
}

/* One lane vector's sum: s = +0, += widen(gather) * wt[t] in t order (p: the active lanes, inactive ones read
 * nothing and sum +0). */
static inline float32x4_t tt_fvec_dw_sum(const uint16_t *src, const int32_t *off, const float *wt, int32_t nt,
                                         uint32x4_t lofs, mve_pred16_t p)
{
    float32x4_t s = vdupq_n_f32(0.0f);
    int32_t t;
    for (t = 0; t < nt; ++t) {
        const uint32x4_t h = vldrhq_gather_shifted_offset_z_u32(src + off[t], lofs, p);
        s = vaddq_f32(s, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h)), wt[t]));
    }
    return s;
}

/* Two full lane vectors (8 lanes: the second starts 4 * lstep further), each tap's weight read once. */
static inline void tt_fvec_dw_sum8(const uint16_t *src, const int32_t *off, const float *wt, int32_t nt,
                                   uint32x4_t lofs, int32_t l4, float32x4_t *s0, float32x4_t *s1)
{
    float32x4_t a = vdupq_n_f32(0.0f), b = vdupq_n_f32(0.0f);
    int32_t t;
    for (t = 0; t < nt; ++t) {
        const uint16_t *p = src + off[t];
        const float w = wt[t];
        const uint32x4_t h0 = vldrhq_gather_shifted_offset_u32(p, lofs);
        const uint32x4_t h1 = vldrhq_gather_shifted_offset_u32(p + l4, lofs);
        a = vaddq_f32(a, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h0)), w));
        b = vaddq_f32(b, vmulq_n_f32(vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(h1)), w));
    }
    *s0 = a;
    *s1 = b;
}

/* Bias, clamp, narrowing and store of one lane vector (p: the active lanes). */
static inline void tt_fvec_dw_out(float32x4_t v, const float *bias, int32_t clamp, float32x4_t lo, float32x4_t hi,
                                  uint16_t *out, int32_t ostep, uint32x4_t oofs, mve_pred16_t p)
{
    uint32x4_t h;
    if (bias != 0) {
        v = vaddq_n_f32(v, *bias);
    }
    if (clamp) {
        /* v < lo as lo > v: the LT condition is true for unordered operands (N != V), GT is not */
        v = vpselq_f32(lo, v, vcmpgtq_f32(lo, v));
        v = vpselq_f32(hi, v, vcmpgtq_f32(v, hi));
    }
    h = tt_mve_vcvtb_f16_f32(vreinterpretq_u32_f32(v));
    if (p == 0xFFFFu && ostep == 1) {
        vstrhq_u32(out, h);
    } else if (p == 0xFFFFu) {
        vstrhq_scatter_shifted_offset_u32(out, oofs, h);
    } else if (ostep == 1) {
        vstrhq_p_u32(out, h, p);
    } else {
        vstrhq_scatter_shifted_offset_p_u32(out, oofs, h, p);
    }
}

void tt_fvec_dw_run(const uint16_t *src, const int32_t *off, const float *wt, int32_t nt, int32_t lstep, int32_t n,
                    const float *bias, int32_t clamp, float lo, float hi, uint16_t *out, int32_t ostep)
{
    const uint32x4_t lane = vidupq_n_u32(0u, 1);
    const uint32x4_t lofs = vmulq_n_u32(lane, (uint32_t)lstep), oofs = vmulq_n_u32(lane, (uint32_t)ostep);
    const float32x4_t lov = vdupq_n_f32(lo), hiv = vdupq_n_f32(hi);
    const mve_pred16_t all = 0xFFFFu;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t s0, s1;
        tt_fvec_dw_sum8(src + i * lstep, off, wt, nt, lofs, 4 * lstep, &s0, &s1);
        tt_fvec_dw_out(s0, bias, clamp, lov, hiv, out + i * ostep, ostep, oofs, all);
        tt_fvec_dw_out(s1, bias, clamp, lov, hiv, out + (i + 4) * ostep, ostep, oofs, all);
    }
    for (; i < n; i += 4) {
        const mve_pred16_t p = vctp32q((uint32_t)(n - i));
        tt_fvec_dw_out(tt_fvec_dw_sum(src + i * lstep, off, wt, nt, lofs, p), bias, clamp, lov, hiv,
                       out + i * ostep, ostep, oofs, p);
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
