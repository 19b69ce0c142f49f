/* fp32 vector arithmetic on Helium with the portable kernels' bits, for fp16-mixed's dot products under
 * `target.kernels: mve` (TT_USE_MVE=1, Cortex-M55).
 *
 * The obstacle (tt_f16_mve.h's comment): MVE floating point runs under StandardFPSCRValue(), so single-precision
 * vector arithmetic flushes subnormal inputs and results to zero and returns the default NaN, whatever FPSCR says.
 * The scalar FPU and the host keep subnormals. So a vector kernel may only run where no lane can see a subnormal;
 * then FZ changes nothing, and a lane that adds its products in the portable kernel's order (one VMUL and one VADD per
 * product, never a fused VFMA: -ffp-contract=off makes the portable code round twice) gives its bits.
 *
 * Why no subnormal can appear (the argument every kernel here relies on). Let G(q) be the fp32 values that are
 * integer multiples of q.
 *  - Every fp16 value, widened, is in G(2^-24) (the smallest fp16 subnormal).
 *  - An fp32 value that is +-0 or has |v| >= 2^-79 (biased exponent >= 48) is in G(2^-102): its ulp is >= 2^-102.
 *  - Exact products: G(2^-24) x G(2^-102) and G(2^-24) x G(2^-24) lie in G(2^-126).
 *  - Exact sums of G(2^-126) values lie in G(2^-126), and rounding to nearest fp32 maps G(2^-126) into itself (a
 *    multiple of 2^-126 below 2^-102 has at most 24 significant bits, so it is exact; above, the ulp is >= 2^-126).
 *  - A nonzero element of G(2^-126) has |v| >= 2^-126: it is normal.
 * So when one factor of every product is an fp16 value and the other an fp16 value or a TT_FVEC_OK fp32 value (below),
 * and every accumulator starts at +-0 or a TT_FVEC_OK / fp16 value, every operand and every rounded result of the vector
 * VMUL / VADD is zero or normal: the flush never fires, the rounding (to nearest even) is the scalar FPU's, and each
 * lane computes exactly what the portable loop computes. Infinities arise (overflow) and combine the same way. A NaN
 * made by the arithmetic (Inf - Inf, 0 x Inf) is the default NaN on both sides; only a NaN *operand's* sign and payload
 * can be lost (the default NaN comes out). fp16-mixed skips every step whose gradients hold a NaN and no comparison
 * sees a NaN's sign or payload, so weights, losses and counters stay the same bits; kernels therefore also refuse
 * non-finite fp32 operands (tt_fvec_ok), which keeps the tensors themselves identical whenever the weights are finite.
 *
 * Where the condition does not hold (a weight below 2^-79 that is not zero, or a non-finite one), the kernel runs
 * its portable loop: the check is one integer pass over the fp32 operand, small next to the products that use it.
 *
 * Compiling: the board keeps +nomve.fp (gcc -O2 would auto-vectorize plain float loops with flushing instructions),
 * and arm_mve.h cannot be included twice with different targets in one translation unit (its integer intrinsics then
 * refuse to inline into +nomve.fp functions). So the fp32 vector kernels live in translation units of their own,
 * kernels_c/tt_fvec_*.c, each of which includes this header FIRST: it switches the whole unit to MVE floating point
 * with the auto-vectorizer off, so the only float vector instructions in the firmware are the intrinsics written in
 * those files. The op files call them through plain C prototypes (tt_fvec_*.h) and run their portable loop when a
 * kernel returns 0 (its operands fail tt_fvec_ok). Every other target compiles those units to nothing. The
 * half-to-single widening is tt_f16_mve.h's instruction word (binutils 2.40 encodes vcvtb's Q registers wrongly). */
#ifndef TT_FVEC_MVE_H
#define TT_FVEC_MVE_H

#if !(defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE))
#error "tt_fvec_mve.h is for target.kernels: mve on a core with MVE (include it under that condition only)"
#endif

#pragma GCC target("arch=armv8.1-m.main+mve.fp+fp.dp")
#pragma GCC optimize("no-tree-vectorize", "no-tree-slp-vectorize")

#include <arm_mve.h>
#include <stdint.h>

#include "tt_f16_mve.h"

/* 1 when every one of v[0..n) is +-0 or finite with |v| >= 2^-79 (biased exponent 48..254): the fp32 operands the
 * argument above allows. Integer MVE: the exponent field of each lane, compared with the bounds. */
static inline int32_t tt_fvec_ok(const float *v, int32_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)v;
    const uint32x4_t emask = vdupq_n_u32(0x7F800000u), lo = vdupq_n_u32(48u << 23), inf = vdupq_n_u32(0x7F800000u);
    const uint32x4_t zero = vdupq_n_u32(0);
    uint32x4_t bad = zero;
    int32_t i = 0;
    for (; i < n; i += 4) {
        const mve_pred16_t p = vctp32q((uint32_t)(n - i));
        const uint32x4_t e = vandq_u32(vldrwq_z_u32(u + i, p), emask);
        const uint32x4_t mag = vandq_u32(vldrwq_z_u32(u + i, p), vdupq_n_u32(0x7FFFFFFFu));
        /* bad lane: nonzero magnitude with a small exponent, or the Inf/NaN exponent */
        const mve_pred16_t small = vcmphiq_u32(lo, e) & vcmphiq_u32(mag, zero) & p;
        const mve_pred16_t nonfinite = vcmpcsq_u32(e, inf) & p;
        bad = vorrq_u32(bad, vpselq_u32(vdupq_n_u32(1), zero, (mve_pred16_t)(small | nonfinite)));
    }
    return vmaxvq_u32(0, bad) == 0;
}

/* Four fp16 values at x[0..3] as four fp32 lanes (exact): VLDRH.U32 puts each in the low half of a lane, VCVTB widens. */
static inline float32x4_t tt_fvec_ld_h4(const uint16_t *x)
{
    return vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(vldrhq_u32(x)));
}

/* The first n (1..3) of them, the other lanes +0. */
static inline float32x4_t tt_fvec_ld_h4_z(const uint16_t *x, int32_t n)
{
    return vreinterpretq_f32_u32(tt_mve_vcvtb_f32_f16(vldrhq_z_u32(x, vctp32q((uint32_t)n))));
}

#endif
