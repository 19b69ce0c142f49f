/* Helium (MVE) versions of float32 backward kernels that select or copy values, for `target.kernels: mve`
 * (TT_USE_MVE=1) on a core with MVE: the activation straight-through mask (tt_act_grad.c, from an fp32 or an fp16
 * forward output) and the 1-bit mask
 * gradient (tt_mask_grad.c). The kernel files include this header and call these functions in small #if blocks; the
 * portable loops stay the reference (tests/test_m55_float.py runs both in QEMU on random shapes and compares bytes).
 *
 * Why only these, and only integer instructions: Helium's floating-point instructions run under the Armv8.1-M
 * "standard FPSCR value" (flush-to-zero for single precision whatever FPSCR.FZ says, default NaN), while the scalar
 * FPU and the host keep subnormals and NaN payloads (tt_f16_mve.h has the details). No FPSCR setting changes that,
 * so fp32 vector arithmetic (VADD/VMUL/VFMA.F32) cannot give the portable kernels' bits for subnormal operands or
 * results: it is not used. What is left are kernels whose result is one of their inputs or +0.0: float compares can
 * be done exactly on the bit patterns with integer compares, and the selection (VPSEL) moves bits unchanged.
 * The weight updates (tt_sgd_f32 ...) and the dot products of the backward are float arithmetic and stay scalar:
 * guarding vector results against flushed lanes (checking operands and results for subnormals, redoing those lanes)
 * costs about as many cycles on the dual-beat M55 (2 cycles per vector instruction) as the scalar loop it replaces.
 *
 * The compares, for y's bit pattern b (as int32 s, as uint32 u), all exact for +-0, subnormals, +-Inf and NaN:
 *   y > 0         <=>  0 < s <= 0x7F800000            (+0, negatives and NaNs fail; +Inf passes)
 *   0 < y < 6     <=>  0 < s <  0x40C00000            (6.0f = 0x40C00000)
 *   -1 < y < 1    <=>  (u & 0x7FFFFFFF) < 0x3F800000  (1.0f = 0x3F800000; NaNs are above)
 * Compares use vector operands, not the _n forms: gcc 12 stops with an internal error on vcmpq_n with a constant. */
#ifndef TT_FLOAT_MVE_H
#define TT_FLOAT_MVE_H

#include <arm_mve.h>
#include <stdint.h>

#define TT_FLOAT_MVE 1

/* dx[i] = keep(y[i]) ? dy[i] : +0.0f for TT_ACT_RELU (1), TT_ACT_RELU6 (2), TT_ACT_RELU_N1_TO_1 (3), else dy[i];
 * y is fp32 (half 0) or fp16 (half 1: fp16-mixed's saved activation, tt_act_grad_hy_f32), its bit patterns in
 * 32-bit lanes (fp16 zero-extended, so non-negative) compared as above with the format's constants: +Inf 0x7C00,
 * 6.0 0x4600, 1.0 0x3C00, magnitude mask 0x7FFF. Element i is read before it is written, so dx may be dy (or an
 * fp32 y). */
static inline void tt_act_grad_mve(int32_t n, int act, const float *dy, const void *y, int half, float *dx)
{
    const int32_t inf = half ? 0x7C00 : 0x7F800000, six = half ? 0x4600 : 0x40C00000;
    const uint32_t one = half ? 0x3C00u : 0x3F800000u, mag = half ? 0x7FFFu : 0x7FFFFFFFu;
    const uint32_t *gb = (const uint32_t *)(const void *)dy;
    uint32_t *db = (uint32_t *)(void *)dx;
    const uint32x4_t zero = vdupq_n_u32(0);
    const int32x4_t szero = vdupq_n_s32(0);
    int32_t i;
    for (i = 0; i < n; i += 4) {
        const mve_pred16_t t = vctp32q((uint32_t)(n - i));
        const int32x4_t s = half ? vreinterpretq_s32_u32(vldrhq_z_u32((const uint16_t *)y + i, t))
                                 : vldrwq_z_s32((const int32_t *)y + i, t);
        mve_pred16_t keep;
        switch (act) {
        case 1:
            keep = vcmpleq_m_s32(s, vdupq_n_s32(inf), vcmpgtq_s32(s, szero));
            break;
        case 2:
            keep = vcmpltq_m_s32(s, vdupq_n_s32(six), vcmpgtq_s32(s, szero));
            break;
        case 3:
            keep = vcmphiq_u32(vdupq_n_u32(one), vandq_u32(vreinterpretq_u32_s32(s), vdupq_n_u32(mag)));
            break;
        default:
            keep = 0xFFFFu;
            break;
        }
        vstrwq_p_u32(db + i, vpselq_u32(vldrwq_z_u32(gb + i, t), zero, keep), t);
    }
}

/* The predicate of four 32-bit lanes from four mask bits (bit k -> lane k: predicate bits 4k..4k+3). */
static const uint16_t tt_mve_nibble_pred[16] = {
    0x0000u, 0x000Fu, 0x00F0u, 0x00FFu, 0x0F00u, 0x0F0Fu, 0x0FF0u, 0x0FFFu,
    0xF000u, 0xF00Fu, 0xF0F0u, 0xF0FFu, 0xFF00u, 0xFF0Fu, 0xFFF0u, 0xFFFFu};

/* dz[i] = mask bit (bit_offset + i) ? dy[i] : +0.0f (tt_mask.h's LSB-first bit order). Reads only the mask bytes
 * that hold bits of the n elements. dz may be dy. Whole vectors unpredicated (a predicate that is not the select's
 * costs moves through core registers), the last partial one under a tail predicate. */
static inline void tt_mask_grad_f32_mve(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dy, float *dz)
{
    const uint32_t *gb = (const uint32_t *)(const void *)dy;
    uint32_t *db = (uint32_t *)(void *)dz;
    const uint32x4_t zero = vdupq_n_u32(0);
    int32_t i;
    for (i = 0; i < n; i += 4) {
        const uint32_t b = (uint32_t)bit_offset + (uint32_t)i, sh = b & 7u;
        const int32_t left = n - i;
        uint32_t bits = mask[b >> 3];
        if (sh + (uint32_t)(left < 4 ? left : 4) > 8u) {
            bits |= (uint32_t)mask[(b >> 3) + 1u] << 8;  /* the four bits cross into the next byte, which holds some */
        }
        {
            const mve_pred16_t keep = tt_mve_nibble_pred[(bits >> sh) & 0xFu];
            if (left >= 4) {
                vstrwq_u32(db + i, vpselq_u32(vldrwq_u32(gb + i), zero, keep));
            } else {
                const mve_pred16_t t = vctp32q((uint32_t)left);
                vstrwq_p_u32(db + i, vpselq_u32(vldrwq_z_u32(gb + i, t), zero, keep), t);
            }
        }
    }
}

#endif /* TT_FLOAT_MVE_H */
