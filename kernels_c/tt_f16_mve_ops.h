/* Helium (MVE) versions of fp16-mixed's elementwise kernels, for `target.kernels: mve` (TT_USE_MVE=1) on a core
 * with MVE: the fp32 / fp16 activation clamp masks (tt_mask.c), the mask gradient's fp16 forms (ops/tt_mask_grad.c)
 * and the global mean's fp16 gradient broadcast (ops/tt_mean.c). Each portable function sends its work here from an
 * `#if TT_F16_MVE_OPS` line; the portable loops stay the reference (tests/test_m55_f16_ops.py runs both in QEMU on
 * random data and on every edge value and compares bytes).
 *
 * What these kernels compute, and so which Helium instructions give the portable bits:
 *  - the masks compare each value with two float bounds: done exactly on the bit patterns with integer compares
 *    (an order-preserving integer key per value, below);
 *  - the mask gradient selects an element or +0 (VPSEL), converting between fp16 and fp32 with tt_f16_mve.h's
 *    VCVTBs (their NaN lanes redone as the portable code does);
 *  - the mean's gradient is one quotient per channel, the same at every position: the quotients are computed once,
 *    by the portable expression, and the other positions are vector copies.
 * None of them does arithmetic on fp16 values, so none needs Helium's fp16 arithmetic (VADD/VMUL/VMAX.F16).
 *
 * When fp16 vector arithmetic would give the portable bits (for a kernel that has it; fp16-mixed's kernels keep
 * their arithmetic in fp32 by rule, and the dot products accumulate in fp32, so none does yet): an fp16 result of
 * ONE operation on fp16 operands, computed in fp32 and rounded to fp16 once (what the portable kernels do:
 * tt_f16_narrow(a op b) on widened operands), is the correctly rounded fp16 operation, i.e. what VADD.F16 / VSUB.F16 /
 * VMUL.F16 compute. For a product, the 11-bit significands multiply to at most 22 bits, exact in fp32's 24, and
 * every product of two fp16 values (2^-48 .. 2^32) is a normal fp32: the narrowing is the one rounding. For a sum or
 * difference, fp32's p' = 24 >= 2p + 2 = 24 bits (p = 11) make the double rounding innocuous (S. A. Figueroa, "When
 * is double rounding innocuous?", ACM SIGNUM Newsletter 30(3), 1995); and a result in fp16's subnormal range needs
 * no rounding at all (both operands are multiples of 2^-24, so is their sum, and below 2^-14 that is an fp16 value,
 * exact in fp32 too). Max / min / compare are exact. Conditions: FPSCR.FZ16 = 0 (Helium's fp16 instructions take FZ16 from FPSCR - the only flush setting MVE
 * honours, tt_f16_mve.h - and the board's startup clears it: kernels_c/boards/startup.c, tested by
 * tests/test_m55_f16_ops.py, which also checks VADD.F16 / VMUL.F16 against the widen-operate-narrow formula in QEMU on
 * random and edge operands); NaN lanes redone in integer code (MVE returns the default NaN 0x7E00, the portable
 * widen-operate-narrow an operand's payload); and Max/Min's +0 > -0 checked against the portable compare-and-select.
 * fp32 vector arithmetic stays out entirely (it always flushes single-precision subnormals).
 *
 * The order-preserving key: for an IEEE value with bit pattern b (sign bit S, magnitude bits m), key = S ? -m : m.
 * Keys increase with the value, +0 and -0 share key 0 (they compare equal), the keys of the fp16 values are the
 * consecutive integers -0x7C00 .. 0x7C00 (fp32: -0x7F800000 .. 0x7F800000), and a NaN's key lies outside that range
 * (positive NaNs above, negative below). So for a value v and a non-NaN float lo: v > lo <=> key(v) > key(lo), and
 * with an upper key at most key(+Inf) + 1 no NaN passes. For fp16 values and fp32 bounds, lo is replaced by the
 * largest fp16 value <= lo and hi by the smallest >= hi (no fp16 value lies between either pair, so the compares
 * are the same), found by a scalar round-to-nearest and one key step.
 *
 * The masks compare by lane arithmetic rather than VCMP (gcc 12 moves every predicate through a core register).
 * No floating-point vector instruction is emitted by the compiler (+nomve.fp); the conversions are tt_f16_mve.h's
 * instruction words. */
#ifndef TT_F16_MVE_OPS_H
#define TT_F16_MVE_OPS_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "tt_f16.h"
#include "tt_f16_mve.h"
#include "tt_float_mve.h"

#define TT_F16_MVE_OPS 1

/* ---- clamp masks ---------------------------------------------------------------------------------------------- */

/* The key of an fp32 bit pattern (as a scalar, for the bounds). */
static inline int32_t tt_key_f32(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (b & 0x80000000u) ? -(int32_t)(b & 0x7FFFFFFFu) : (int32_t)b;
}

static inline int32_t tt_key_f16(uint16_t h)
{
    return (h & 0x8000u) ? -(int32_t)(h & 0x7FFFu) : (int32_t)h;
}

/* The key of the largest fp16 value <= lo (lo not NaN). */
static inline int32_t tt_key_f16_below(float lo)
{
    const uint16_t h = tt_f16_narrow(lo);
    return tt_key_f16(h) - (tt_f16_widen(h) > lo ? 1 : 0);
}

/* The key of the smallest fp16 value >= hi (hi not NaN). */
static inline int32_t tt_key_f16_above(float hi)
{
    const uint16_t h = tt_f16_narrow(hi);
    return tt_key_f16(h) + (tt_f16_widen(h) < hi ? 1 : 0);
}

/* Lane weights 1, 2, 4, ...: the sum of those of the passing lanes (VADDV) is the byte of mask bits. */
static const uint16_t tt_mve_bit_weights16[8] = {1u, 2u, 4u, 8u, 16u, 32u, 64u, 128u};
static const uint32_t tt_mve_bit_weights32[8] = {1u, 2u, 4u, 8u, 16u, 32u, 64u, 128u};

/* The lanes' weights where klo < key < khi, else 0, for sign-magnitude patterns s. All lane arithmetic, no
 * predicates (gcc moves predicates through core registers at every use): key = (mag ^ t) - t with t = s >> 15 (0 or
 * -1) negates the magnitude of a negative value; key > klo <=> the saturating klo - key is negative (the keys of
 * NaNs reach +-0x7FFF, beyond the bounds' range, hence saturating). */
static inline uint16x8_t tt_key_between_w16(int16x8_t s, int16x8_t klo, int16x8_t khi, uint16x8_t w)
{
    const int16x8_t t = vshrq_n_s16(s, 15);
    const int16x8_t key = vsubq_s16(veorq_s16(vandq_s16(s, vdupq_n_s16(0x7FFF)), t), t);
    const int16x8_t in = vandq_s16(vshrq_n_s16(vqsubq_s16(klo, key), 15), vshrq_n_s16(vqsubq_s16(key, khi), 15));
    return vandq_u16(vreinterpretq_u16_s16(in), w);
}

static inline uint32x4_t tt_key_between_w32(int32x4_t s, int32x4_t klo, int32x4_t khi, uint32x4_t w)
{
    const int32x4_t t = vshrq_n_s32(s, 31);
    const int32x4_t key = vsubq_s32(veorq_s32(vandq_s32(s, vdupq_n_s32(0x7FFFFFFF)), t), t);
    const int32x4_t in = vandq_s32(vshrq_n_s32(vqsubq_s32(klo, key), 31), vshrq_n_s32(vqsubq_s32(key, khi), 31));
    return vandq_u32(vreinterpretq_u32_s32(in), w);
}

/* tt_clamp_mask_f32 / tt_clamp_mask_hy (tt_mask.c): bit i of mask (LSB first, ceil(n / 8) bytes, the last byte's
 * unused bits 0) = lo < y[i] < hi, or lo < y[i] when hi is above FLT_MAX (or NaN: the portable `hi <= FLT_MAX`
 * fails); y fp32 (yf) or fp16 (yh). A NaN y never passes; a NaN lo passes nothing. The last, partial byte is loaded
 * with zeros past n and its bits past n cleared. */
static inline void tt_clamp_mask_mve(int32_t n, float lo, float hi, const float *yf, const uint16_t *yh,
                                     uint8_t *mask)
{
    const int bounded = hi <= FLT_MAX;
    int32_t i, j;
    if (lo != lo) {                                     /* v > NaN is false for every v */
        memset(mask, 0, (size_t)((n + 7) / 8));
        return;
    }
    if (yh != 0) {
        const int16x8_t klo = vdupq_n_s16((int16_t)tt_key_f16_below(lo));
        const int16x8_t khi = vdupq_n_s16((int16_t)(bounded ? tt_key_f16_above(hi) : 0x7C01));
        const uint16x8_t w = vld1q_u16(tt_mve_bit_weights16);
        for (i = 0, j = 0; i + 8 <= n; i += 8, ++j) {
            mask[j] = (uint8_t)vaddvq_u16(tt_key_between_w16(vreinterpretq_s16_u16(vld1q_u16(yh + i)), klo, khi, w));
        }
        if (i < n) {
            const int16x8_t s = vreinterpretq_s16_u16(vldrhq_z_u16(yh + i, vctp16q((uint32_t)(n - i))));
            mask[j] = (uint8_t)(vaddvq_u16(tt_key_between_w16(s, klo, khi, w)) & ((1u << (n - i)) - 1u));
        }
        return;
    }
    {
        const int32x4_t klo = vdupq_n_s32(tt_key_f32(lo));
        const int32x4_t khi = vdupq_n_s32(bounded ? tt_key_f32(hi) : 0x7F800001);
        const uint32x4_t w0 = vld1q_u32(tt_mve_bit_weights32), w1 = vld1q_u32(tt_mve_bit_weights32 + 4);
        const int32_t *y = (const int32_t *)(const void *)yf;
        for (i = 0, j = 0; i + 8 <= n; i += 8, ++j) {
            const uint32_t b = vaddvq_u32(tt_key_between_w32(vld1q_s32(y + i), klo, khi, w0));
            mask[j] = (uint8_t)vaddvaq_u32(b, tt_key_between_w32(vld1q_s32(y + i + 4), klo, khi, w1));
        }
        if (i < n) {
            const int32x4_t s0 = vldrwq_z_s32(y + i, vctp32q((uint32_t)(n - i)));
            const int32x4_t s1 = vldrwq_z_s32(y + i + 4, vctp32q(n - i > 4 ? (uint32_t)(n - i - 4) : 0u));
            const uint32_t b = vaddvq_u32(tt_key_between_w32(s0, klo, khi, w0));
            mask[j] = (uint8_t)(vaddvaq_u32(b, tt_key_between_w32(s1, klo, khi, w1)) & ((1u << (n - i)) - 1u));
        }
    }
}

/* ---- mask gradient, fp16 forms ---------------------------------------------------------------------------------- */

/* The eight mask bits from bit b on (LSB first) of a mask that holds `left` more bits (reads no byte past them). */
static inline uint32_t tt_mask_bits8(const uint8_t *mask, uint32_t b, int32_t left)
{
    const uint32_t sh = b & 7u;
    uint32_t bits = mask[b >> 3];
    if (sh + (uint32_t)(left < 8 ? left : 8) > 8u) {
        bits |= (uint32_t)mask[(b >> 3) + 1u] << 8;
    }
    return (bits >> sh) & 0xFFu;
}

/* The predicate of eight 16-bit lanes from eight mask bits (bit k -> predicate bits 2k, 2k + 1). */
static inline mve_pred16_t tt_mve_byte_pred16(uint32_t x)
{
    x = (x | (x << 4)) & 0x0F0Fu;
    x = (x | (x << 2)) & 0x3333u;
    x = (x | (x << 1)) & 0x5555u;
    return (mve_pred16_t)(x | (x << 1));
}

/* float(h) for four fp16 values as tt_f16_read takes them: on this core one VCVTB each, which keeps payloads and
 * quiets a signalling NaN (FPSCR.DN = 0 for the scalar FPU); the vector VCVTB gives the default NaN, so NaN lanes are
 * the widening of the quieted value. */
static inline uint32x4_t tt_f16_read_x4_mve(uint32x4_t hb)
{
#if defined(TT_F16_PORTABLE)
    return tt_f16_to_f32x4_mve(hb);
#else
    const uint32x4_t f = tt_mve_vcvtb_f32_f16(hb);
    const mve_pred16_t nan = vcmphiq_u32(vandq_u32(hb, vdupq_n_u32(0x7FFFu)), vdupq_n_u32(0x7C00u));
    return nan ? vpselq_u32(tt_f16_to_f32_nan_mve(vorrq_u32(hb, vdupq_n_u32(0x200u))), f, nan) : f;
#endif
}

/* tt_mask_grad_f16 (ops/tt_mask_grad.c) for the three forms that involve fp16 (dyf xor dyh, dzf xor dzh given):
 * dz[i] = mask bit (bit_offset + i) ? dy[i] (widened or rounded to dz's type) : +0. Every element is read before it
 * is written where the portable loop allows dz to be dy (fp16 -> fp16, fp32 -> fp16 in place). Whole vectors
 * unpredicated, the last partial one under a tail predicate. */
static inline void tt_mask_grad_f16_mve(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dyf,
                                        const uint16_t *dyh, float *dzf, uint16_t *dzh)
{
    const uint32_t b0 = (uint32_t)bit_offset;
    int32_t i;
    if (dzh != 0 && dyh != 0) {                           /* a kept fp16 is copied as its bits */
        const uint16x8_t zero = vdupq_n_u16(0);
        for (i = 0; i + 8 <= n; i += 8) {
            const mve_pred16_t keep = tt_mve_byte_pred16(tt_mask_bits8(mask, b0 + (uint32_t)i, n - i));
            vst1q_u16(dzh + i, vpselq_u16(vld1q_u16(dyh + i), zero, keep));
        }
        if (i < n) {
            const mve_pred16_t t = vctp16q((uint32_t)(n - i));
            const mve_pred16_t keep = tt_mve_byte_pred16(tt_mask_bits8(mask, b0 + (uint32_t)i, n - i));
            vstrhq_p_u16(dzh + i, vpselq_u16(vldrhq_z_u16(dyh + i, t), zero, keep), t);
        }
        return;
    }
    {
        const uint32x4_t zero = vdupq_n_u32(0);
        for (i = 0; i < n; i += 4) {
            const int32_t left = n - i;
            const mve_pred16_t keep = tt_mve_nibble_pred[tt_mask_bits8(mask, b0 + (uint32_t)i, left < 4 ? left : 4)
                                                         & 0xFu];
            if (dzh != 0) {                               /* fp32 -> fp16: rounded once on store */
                const uint32_t *x = (const uint32_t *)(const void *)(dyf + i);
                if (left >= 4) {
                    vstrhq_u32(dzh + i, vpselq_u32(tt_f32_to_f16x4_mve(vldrwq_u32(x)), zero, keep));
                } else {
                    const mve_pred16_t t = vctp32q((uint32_t)left);
                    vstrhq_p_u32(dzh + i, vpselq_u32(tt_f32_to_f16x4_mve(vldrwq_z_u32(x, t)), zero, keep), t);
                }
            } else {                                      /* fp16 -> fp32: widened */
                uint32_t *z = (uint32_t *)(void *)(dzf + i);
                if (left >= 4) {
                    vstrwq_u32(z, vpselq_u32(tt_f16_read_x4_mve(vldrhq_u32(dyh + i)), zero, keep));
                } else {
                    const mve_pred16_t t = vctp32q((uint32_t)left);
                    vstrwq_p_u32(z, vpselq_u32(tt_f16_read_x4_mve(vldrhq_z_u32(dyh + i, t)), zero, keep), t);
                }
            }
        }
    }
}

/* ---- global mean gradient, fp16 result ------------------------------------------------------------------------- */

/* tt_mean_hw_grad_f32_hy (ops/tt_mean.c): dx[b, i, ch] = fp16(dy[b, ch] / count) at every position i: the first
 * position by the portable expression, the others copies of it, eight halfwords per vector. */
static inline void tt_mean_hw_grad_hy_mve(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy,
                                          uint16_t *dx)
{
    const int32_t count = h * w;
    int32_t b, i, ch;
    for (b = 0; b < batches && count > 0; ++b) {
        uint16_t *row0 = dx + (size_t)b * (size_t)count * (size_t)c;
        for (ch = 0; ch < c; ++ch) {
            row0[ch] = tt_f16_narrow(dy[b * c + ch] / (float)count);
        }
        for (i = 1; i < count; ++i) {
            uint16_t *row = row0 + (size_t)i * (size_t)c;
            for (ch = 0; ch + 8 <= c; ch += 8) {
                vst1q_u16(row + ch, vld1q_u16(row0 + ch));
            }
            if (ch < c) {
                const mve_pred16_t t = vctp16q((uint32_t)(c - ch));
                vstrhq_p_u16(row + ch, vldrhq_z_u16(row0 + ch, t), t);
            }
        }
    }
}

#endif /* TT_F16_MVE_OPS_H */
