/* Helium (MVE) versions of tt_f16.c's fp16 <-> fp32 conversions and Inf/NaN scans, for `target.kernels: mve`
 * (TT_USE_MVE=1) on a core with MVE. tt_f16.c includes this file and sends its array functions here; the scalar
 * tt_f16_to_f32 / tt_f32_to_f16 stay the portable reference (tests/test_m55_f16.py compares the two in QEMU on all
 * 65,536 fp16 values and 2.7 million fp32 values).
 *
 * Which Helium floating point may be used, and why (the Armv8.1-M ARM's pseudocode, DDI0553, as QEMU 7.2's
 * target/arm/mve_helper.c implements it and as tests/test_m55.py observes): MVE floating-point instructions run
 * under StandardFPSCRValue(), not FPSCR: round to nearest even, default NaN (DN = 1) and flush-to-zero for single
 * precision (FZ = 1) whatever FPSCR.FZ says; only FPSCR.FZ16 and AHP are taken from FPSCR. So fp32 vector
 * arithmetic (VADD/VMUL/VFMA.F32) flushes subnormal inputs and results to zero and no FPSCR setting avoids it: the
 * scalar FPU and the host keep subnormals, so fp32 vector arithmetic would change bits and is not used anywhere
 * (the board compiles with +nomve.fp for that reason).
 *
 * The conversions between half and single precision (VCVTB.F16.F32, VCVTB.F32.F16) are the exception that is safe:
 *  - FZ16 does not apply to conversions, so fp16 subnormal inputs and results are kept, rounded to nearest even, and
 *    overflow gives +-Inf: the same as tt_f32_to_f16's integer rounding;
 *  - FZ = 1 flushes an fp32 subnormal *input* to a zero of the same sign, which converts to +-0 - what tt_f32_to_f16
 *    returns anyway, since every fp32 subnormal is below half the smallest fp16 subnormal (2^-25);
 *  - DN = 1 turns every NaN into the default NaN (0x7E00 / 0x7FC00000), losing the sign and payload that tt_f16.c
 *    keeps. So NaN lanes are redone in integer vector code with tt_f16.c's formula and selected with VPSEL.
 * AHP (alternative half precision) is 0 at reset and nothing here sets it; with AHP = 1 the results would differ,
 * which the exhaustive QEMU test would show.
 *
 * How the two VCVTs are emitted: as instruction words (.inst.w), from inline assembly that names the registers gcc
 * chose. binutils 2.40's assembler encodes `vcvtb.f32.f16 q0, q2` with D-register numbers (as if q2 were d4: it runs
 * q4), and the arm_mve.h intrinsics go through the same assembler, so their results are wrong (seen in QEMU: zeros).
 * The encoding (Armv8.1-M ARM, VCVTB/VCVTT between half and single precision, T1): 0xEE3F0E01 (f32 -> f16) and
 * 0xFE3F0E01 (f16 -> f32), Qd in bits 15:13 of the second halfword, Qm in bits 3:1, bit 12 = 0 for the bottom half.
 * This also means no MVE floating point is enabled for the compiler anywhere (the board keeps +nomve.fp): the
 * instruction words are the only floating-point vector instructions in the firmware.
 *
 * The Inf/NaN scans look at the exponent bits only, with integer instructions (a running VMAX of them). Compares
 * are against vectors, not the _n (scalar) forms: gcc 12 stops with an internal error on vcmpeqq_n_u32 with a
 * constant operand. */
#ifndef TT_F16_MVE_H
#define TT_F16_MVE_H

#include <stdint.h>

#define TT_F16_MVE 1

#include <arm_mve.h>

/* "%q0" names one of q0..q7; this sets the assembler symbol `sym` to its number. */
#define TT_MVE_QNUM(sym, reg)                                                                                   \
    ".ifc " reg ",q0\n.set " sym ",0\n.endif\n.ifc " reg ",q1\n.set " sym ",1\n.endif\n"                               \
    ".ifc " reg ",q2\n.set " sym ",2\n.endif\n.ifc " reg ",q3\n.set " sym ",3\n.endif\n"                               \
    ".ifc " reg ",q4\n.set " sym ",4\n.endif\n.ifc " reg ",q5\n.set " sym ",5\n.endif\n"                               \
    ".ifc " reg ",q6\n.set " sym ",6\n.endif\n.ifc " reg ",q7\n.set " sym ",7\n.endif\n"

/* VCVTB.F16.F32 Qd, Qm: the low half of each 32-bit lane of d = fp16(m's lane); the high halves keep d's (zero). */
static inline uint32x4_t tt_mve_vcvtb_f16_f32(uint32x4_t m)
{
    uint32x4_t d = vdupq_n_u32(0);
    __asm__(TT_MVE_QNUM("tt_qd", "%q0") TT_MVE_QNUM("tt_qm", "%q1")
            ".inst.w 0xee3f0e01 | (tt_qd << 13) | (tt_qm << 1)" : "+w"(d) : "w"(m));
    return d;
}

/* VCVTB.F32.F16 Qd, Qm: each 32-bit lane of d = float(the fp16 in the low half of m's lane). */
static inline uint32x4_t tt_mve_vcvtb_f32_f16(uint32x4_t m)
{
    uint32x4_t d;
    __asm__(TT_MVE_QNUM("tt_qd", "%q0") TT_MVE_QNUM("tt_qm", "%q1")
            ".inst.w 0xfe3f0e01 | (tt_qd << 13) | (tt_qm << 1)" : "=w"(d) : "w"(m));
    return d;
}

/* NaN lanes of fp32 bit patterns: |x| above the Inf pattern. */
static inline mve_pred16_t tt_f32_nan_lanes_mve(uint32x4_t xb)
{
    return vcmphiq_u32(vandq_u32(xb, vdupq_n_u32(0x7FFFFFFFu)), vdupq_n_u32(0x7F800000u));
}

/* tt_f32_to_f16's NaN: sign | 0x7C00 | 0x200 (quiet) | the top 9 payload bits. */
static inline uint32x4_t tt_f32_to_f16_nan_mve(uint32x4_t xb)
{
    return vorrq_u32(vorrq_u32(vandq_u32(vshrq_n_u32(xb, 16), vdupq_n_u32(0x8000u)), vdupq_n_u32(0x7E00u)),
                     vshrq_n_u32(vandq_u32(xb, vdupq_n_u32(0x7FFFFFu)), 13));
}

/* tt_f16_to_f32's NaN: sign | 0x7F800000 | payload << 13 (a signalling NaN stays signalling). */
static inline uint32x4_t tt_f16_to_f32_nan_mve(uint32x4_t hb)
{
    return vorrq_u32(vorrq_u32(vshlq_n_u32(vandq_u32(hb, vdupq_n_u32(0x8000u)), 16), vdupq_n_u32(0x7F800000u)),
                     vshlq_n_u32(vandq_u32(hb, vdupq_n_u32(0x3FFu)), 13));
}

/* Four fp32 bit patterns to fp16 bit patterns, one per 32-bit lane (high halves zero). The NaN fix-up runs only
 * for a vector that has a NaN (Inf is converted right by the instruction). */
static inline uint32x4_t tt_f32_to_f16x4_mve(uint32x4_t xb)
{
    const uint32x4_t h = tt_mve_vcvtb_f16_f32(xb);
    const mve_pred16_t nan = tt_f32_nan_lanes_mve(xb);
    return nan ? vpselq_u32(tt_f32_to_f16_nan_mve(xb), h, nan) : h;
}

/* Four fp16 bit patterns (low halves of the lanes, high halves zero) to fp32 bit patterns. */
static inline uint32x4_t tt_f16_to_f32x4_mve(uint32x4_t hb)
{
    const uint32x4_t f = tt_mve_vcvtb_f32_f16(hb);
    const mve_pred16_t nan = vcmphiq_u32(vandq_u32(hb, vdupq_n_u32(0x7FFFu)), vdupq_n_u32(0x7C00u));
    return nan ? vpselq_u32(tt_f16_to_f32_nan_mve(hb), f, nan) : f;
}

/* y[i] = fp16(x[i]) for i < n - n % 4 (the caller does the rest). Reads 16 bytes before writing 8 at half the offset,
 * so y may start where x does. */
static inline uint32_t tt_cast_f32_f16_mve(uint32_t n, const float *x, uint16_t *y)
{
    uint32_t i;
    for (i = 0; i + 4u <= n; i += 4u) {
        vstrhq_u32(y + i, tt_f32_to_f16x4_mve(vldrwq_u32((const uint32_t *)(const void *)(x + i))));
    }
    return i;
}

/* y[i] = float(x[i]) for the four elements from i. */
static inline void tt_f16x4_to_f32_mve(const uint16_t *x, float *y)
{
    vstrwq_u32((uint32_t *)(void *)y, tt_f16_to_f32x4_mve(vldrhq_u32(x)));
}

/* y[i] = float(fp16(x[i])) for i < n - n % 4. Only a NaN input gives a NaN in between, so one test covers both
 * fix-ups. */
static inline uint32_t tt_round_f16_mve(uint32_t n, const float *x, float *y)
{
    uint32_t i;
    for (i = 0; i + 4u <= n; i += 4u) {
        const uint32x4_t xb = vldrwq_u32((const uint32_t *)(const void *)(x + i));
        const mve_pred16_t nan = tt_f32_nan_lanes_mve(xb);
        uint32x4_t h = tt_mve_vcvtb_f16_f32(xb), f;
        if (nan) {
            h = vpselq_u32(tt_f32_to_f16_nan_mve(xb), h, nan);
            f = vpselq_u32(tt_f16_to_f32_nan_mve(h), tt_mve_vcvtb_f32_f16(h), nan);
        } else {
            f = tt_mve_vcvtb_f32_f16(h);
        }
        vstrwq_u32((uint32_t *)(void *)(y + i), f);
    }
    return i;
}

/* 1 when some halfword of the n16 at h, masked with its lane's `field`, equals it in a lane that `lanes` selects
 * (predicate bits): the largest masked field over the array, one VMAX per eight halfwords; the tail is loaded with
 * zeros in the inactive lanes. One scan serves both widths: an fp16 value's exponent is its halfword's bits 10-14,
 * an fp32 value's is bits 7-14 of its upper (odd, little-endian) halfword. */
static inline int tt_all_ones_field_mve(uint32_t n16, const uint16_t *h, uint16x8_t field, mve_pred16_t lanes)
{
    uint16x8_t m = vdupq_n_u16(0);
    uint32_t i;
    for (i = 0; i + 8u <= n16; i += 8u) {
        m = vmaxq_u16(m, vandq_u16(vld1q_u16(h + i), field));
    }
    if (i < n16) {
        m = vmaxq_u16(m, vandq_u16(vldrhq_z_u16(h + i, vctp16q(n16 - i)), field));
    }
    return (vcmpeqq_u16(m, field) & lanes) != 0;
}

/* 1 when any of the n fp16 values has exponent 31 (Inf, NaN). */
static inline int tt_nonfinite_f16_mve(uint32_t n, const uint16_t *g)
{
    return tt_all_ones_field_mve(n, g, vdupq_n_u16(0x7C00u), 0xFFFFu);
}

/* 1 when any of the n fp32 values has exponent 255: the odd halfwords' 0x7F80 (even lanes: field 0, not tested). */
static inline int tt_nonfinite_f32_mve(uint32_t n, const float *g)
{
    const uint16x8_t field = vreinterpretq_u16_u32(vdupq_n_u32(0x7F800000u));
    return tt_all_ones_field_mve(2u * n, (const uint16_t *)(const void *)g, field, 0xCCCCu);
}

#endif /* TT_F16_MVE_H */
