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

/* dx[i] = keep(y[i]) ? dy[i] : +0.0f for TT_ACT_RELU (1), TT_ACT_RELU6 (2), TT_ACT_RELU_N1_TO_1 (3), else dy[i].
 * Element i is read before it is written, so dx may be dy or y. */
static inline void tt_act_grad_f32_mve(int32_t n, int act, const float *dy, const float *y, float *dx)
{
    const int32_t *yb = (const int32_t *)(const void *)y;
    const uint32_t *gb = (const uint32_t *)(const void *)dy;
    uint32_t *db = (uint32_t *)(void *)dx;
    const uint32x4_t zero = vdupq_n_u32(0);
    const int32x4_t szero = vdupq_n_s32(0);
    int32_t i;
    for (i = 0; i < n; i += 4) {
        const mve_pred16_t t = vctp32q((uint32_t)(n - i));
        const int32x4_t s = vldrwq_z_s32(yb + i, t);
        mve_pred16_t keep;
        switch (act) {
        case 1:
            keep = vcmpleq_m_s32(s, vdupq_n_s32(0x7F800000), vcmpgtq_s32(s, szero));
            break;
        case 2:
            keep = vcmpltq_m_s32(s, vdupq_n_s32(0x40C00000), vcmpgtq_s32(s, szero));
            break;
        case 3:
            keep = vcmphiq_u32(vdupq_n_u32(0x3F800000u), vandq_u32(vreinterpretq_u32_s32(s), vdupq_n_u32(0x7FFFFFFFu)));
            break;
        default:
            keep = 0xFFFFu;
            break;
        }
        vstrwq_p_u32(db + i, vpselq_u32(vldrwq_z_u32(gb + i, t), zero, keep), t);
    }
}

/* The same from an fp16 y (fp16-mixed's saved activation, tt_act_grad_hy_f32), its halfwords zero-extended into the
 * 32-bit lanes (h = the bits, unsigned): y > 0 <=> 0 < h <= 0x7C00; 0 < y < 6 <=> 0 < h < 0x4600 (6.0 in fp16);
 * -1 < y < 1 <=> (h & 0x7FFF) < 0x3C00 (1.0); negatives and NaNs fail as above. dx may be dy. */
static inline void tt_act_grad_hy_f32_mve(int32_t n, int act, const float *dy, const uint16_t *y, float *dx)
{
    const uint32_t *gb = (const uint32_t *)(const void *)dy;
    uint32_t *db = (uint32_t *)(void *)dx;
    const uint32x4_t zero = vdupq_n_u32(0);
    int32_t i;
    for (i = 0; i < n; i += 4) {
        const mve_pred16_t t = vctp32q((uint32_t)(n - i));
        const uint32x4_t h = vldrhq_z_u32(y + i, t);
        mve_pred16_t keep;
        switch (act) {
        case 1:
            keep = vcmpcsq_m_u32(vdupq_n_u32(0x7C00u), h, vcmphiq_u32(h, zero));
            break;
        case 2:
            keep = vcmphiq_m_u32(vdupq_n_u32(0x4600u), h, vcmphiq_u32(h, zero));
            break;
        case 3:
            keep = vcmphiq_u32(vdupq_n_u32(0x3C00u), vandq_u32(h, vdupq_n_u32(0x7FFFu)));
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
 * that hold bits of the n elements. dz may be dy. */
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
            const mve_pred16_t t = vctp32q((uint32_t)left);
            const mve_pred16_t keep = tt_mve_nibble_pred[(bits >> sh) & 0xFu];
            vstrwq_p_u32(db + i, vpselq_u32(vldrwq_z_u32(gb + i, t), zero, keep), t);
        }
    }
}

#endif /* TT_FLOAT_MVE_H */
