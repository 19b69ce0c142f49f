/* The ACLE SIMD32 helpers of the DSP kernels (Cortex-M4/M7/M33 with the DSP extension), one place for the switch.
 *
 * TT_SIMD is 1 when the build asks for the DSP kernels (TT_USE_DSP=1, target.kernels: dsp) and the core has them
 * (__ARM_FEATURE_DSP, __ARM_FEATURE_SIMD32); the kernels then take their SIMD paths, which give the portable C's
 * bits (integer sums in another order, never overflowing int32). On the host, tests define the feature macros and
 * put tests/c/acle_host/ (plain-C SXTB16 / SXTAB16 / SMLAD) first on the include path, so the same SIMD code runs
 * under ASan / UBSan and is compared with the portable kernels. */
#ifndef TT_SIMD_H
#define TT_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(TT_USE_DSP) && TT_USE_DSP && defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>
#define TT_SIMD 1
#else
#define TT_SIMD 0
#endif

/* TT_HOST_SIMD: the native host build (board `host`, which defines TT_USE_HOST_SIMD=1) on an x86-64 build machine
 * takes SSE2 int8 inner products (tt_dot.h). SSE2 is part of every x86-64 CPU, so no -march flag is needed and
 * the cache key stays independent of the build machine's CPU. Integer sums in another order: the portable
 * loops' bits. */
#if !TT_SIMD && defined(TT_USE_HOST_SIMD) && TT_USE_HOST_SIMD && defined(__SSE2__)
#include <emmintrin.h>
#define TT_HOST_SIMD 1
#else
#define TT_HOST_SIMD 0
#endif

#if TT_SIMD
/* One unaligned 32-bit load (a single LDR on M4/M7). */
static inline uint32_t tt_ld32(const int8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Bytes 0 and 2 of v sign-extended to the two int16 lanes. */
static inline int16x2_t tt_sx02(uint32_t v)
{
    return __sxtb16((int8x4_t)v);
}

/* Bytes 1 and 3 of v sign-extended to the two int16 lanes: SXTB16 with its free ROR #8 operand (GCC does not fold
 * the rotate into the intrinsic by itself, so the target gets it spelled out). */
static inline int16x2_t tt_sx13(uint32_t v)
{
#if defined(__arm__) && defined(__GNUC__)
    int16x2_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
#else
    return __sxtb16((int8x4_t)((v >> 8) | (v << 24)));
#endif
}

/* a plus bytes 1 and 3 of v sign-extended, lane by lane (SXTAB16 with its ROR #8 operand, spelled out as for
 * tt_sx13). */
static inline int16x2_t tt_sxtab16_13(int16x2_t a, uint32_t v)
{
#if defined(__arm__) && defined(__GNUC__)
    int16x2_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(v));
    return r;
#else
    return __sxtab16(a, (int8x4_t)((v >> 8) | (v << 24)));
#endif
}

/* Two int16 lanes from two small integers (|v| < 2^15): lo in bits 0-15, hi in 16-31 (one PKHBT). */
static inline int16x2_t tt_pack16(int32_t lo, int32_t hi)
{
    return (int16x2_t)(((uint32_t)lo & 0xFFFFu) | ((uint32_t)hi << 16));
}
#endif

/* TT_VFP_PAIRS: the DSP build on a core with a single-precision FPU loads and stores float pairs with one
 * VLDM / VSTM (the M7 moves 64 bits per issue slot; GCC never merges two VLDRs by itself). x and y must be register
 * variables bound to two consecutive S registers (register float x __asm__("s16"), y __asm__("s17")). Plain loads
 * and stores of the same words: the bits of the C they replace. TT_VLD2 / TT_VST2 step p past the pair, TT_VLD2_AT
 * leaves it. */
#if TT_SIMD && defined(__arm__) && defined(__GNUC__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define TT_VFP_PAIRS 1
#define TT_VLD2(p, x, y) __asm__ volatile("vldmia %0!, {%1, %2}" : "+r"(p), "=t"(x), "=t"(y) : : "memory")
#define TT_VLD2_AT(p, x, y) __asm__ volatile("vldmia %2, {%0, %1}" : "=t"(x), "=t"(y) : "r"(p) : "memory")
#define TT_VST2(p, x, y) __asm__ volatile("vstmia %0!, {%1, %2}" : "+r"(p) : "t"(x), "t"(y) : "memory")
#else
#define TT_VFP_PAIRS 0
#endif

#endif /* TT_SIMD_H */

