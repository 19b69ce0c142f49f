/* Host stand-in for the few ACLE SIMD32 intrinsics the DSP kernels use (kernels_c/tt_simd.h), written from the Arm
 * ARM definitions of SXTAB16, SXTB16, SMLAD, SMLABB and SMLATT, so that the DSP code path can be unit-tested on the host under the
 * sanitizers (tests/test_kernels_c.py builds a second driver with it). Not for target builds. */
#ifndef TT_HOST_ARM_ACLE_H
#define TT_HOST_ARM_ACLE_H

#include <stdint.h>

typedef int32_t int8x4_t;
typedef int32_t int16x2_t;

static inline uint32_t tt_host_lanes(int32_t lo, int32_t hi)
{
    return ((uint32_t)(uint16_t)lo) | ((uint32_t)(uint16_t)hi << 16);
}

static inline int32_t tt_host_lane(int16x2_t v, int hi)
{
    return (int32_t)(int16_t)(uint16_t)((uint32_t)v >> (hi ? 16 : 0));
}

/* SXTAB16: each halfword of a plus the sign-extended byte 0 (low) / byte 2 (high) of b, modulo 2^16. */
static inline int16x2_t __sxtab16(int16x2_t a, int8x4_t b)
{
    const uint32_t ub = (uint32_t)b;
    const int32_t b0 = (int8_t)(uint8_t)(ub & 0xFFu), b2 = (int8_t)(uint8_t)((ub >> 16) & 0xFFu);
    return (int16x2_t)tt_host_lanes(tt_host_lane(a, 0) + b0, tt_host_lane(a, 1) + b2);
}

static inline int16x2_t __sxtb16(int8x4_t b)
{
    return __sxtab16(0, b);
}

/* SMLAD: c + lo(a) * lo(b) + hi(a) * hi(b), wrapping (the Q flag is not modelled). */
static inline int32_t __smlad(int16x2_t a, int16x2_t b, int32_t c)
{
    const int64_t s = (int64_t)c + (int64_t)tt_host_lane(a, 0) * tt_host_lane(b, 0) +
                      (int64_t)tt_host_lane(a, 1) * tt_host_lane(b, 1);
    return (int32_t)(uint32_t)(uint64_t)s;
}

/* SMLABB / SMLATT: c + the product of the bottom (top) halfwords of a and b, wrapping (Q flag not modelled). */
static inline int32_t __smlabb(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)(uint32_t)((uint64_t)(int64_t)c + (uint64_t)(int64_t)(tt_host_lane(a, 0) * tt_host_lane(b, 0)));
}

static inline int32_t __smlatt(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)(uint32_t)((uint64_t)(int64_t)c + (uint64_t)(int64_t)(tt_host_lane(a, 1) * tt_host_lane(b, 1)));
}

/* SMLABT / SMLATB: bottom of a times top of b, top of a times bottom of b. */
static inline int32_t __smlabt(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)(uint32_t)((uint64_t)(int64_t)c + (uint64_t)(int64_t)(tt_host_lane(a, 0) * tt_host_lane(b, 1)));
}

static inline int32_t __smlatb(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)(uint32_t)((uint64_t)(int64_t)c + (uint64_t)(int64_t)(tt_host_lane(a, 1) * tt_host_lane(b, 0)));
}

#endif /* TT_HOST_ARM_ACLE_H */
