/* Fixed-point primitives of TFLite's reference kernels (gemmlowp fixedpoint.h, internal/common.h), portable C99.
 *
 * Bit-identical to tinytrain.stages.golden.int8_arith (the numpy golden model), which mirrors the default TFLite build
 * (no TFLITE_SINGLE_ROUNDING: the "double rounding" path TFLite Micro also runs).
 *
 * Wrapping int32 arithmetic: where the reference C++ lets an int32 overflow (and int8_arith wraps explicitly),
 * we compute in uint32 and convert back. Unsigned arithmetic never has undefined behaviour, and the conversion
 * of an out-of-range uint32 to int32 is implementation-defined (modulo 2^32 on every compiler we target: gcc,
 * clang, arm-none-eabi-gcc), so the sanitizers stay quiet and the result equals int8_arith.wrap32.
 */
#ifndef TT_FIXEDPOINT_H
#define TT_FIXEDPOINT_H

#include <stdint.h>

#define TT_INT32_MIN ((int32_t)(-2147483647 - 1))
#define TT_INT32_MAX ((int32_t)2147483647)

static inline int32_t tt_wrap_add32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static inline int32_t tt_wrap_sub32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
/* x * 2^s with s in 0..31, wrapping like an int32 multiply (int8_arith: wrap32(x * (1 << s))). */
static inline int32_t tt_wrap_shl32(int32_t x, int s) { return (int32_t)((uint32_t)x << s); }

static inline int32_t tt_min32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t tt_max32(int32_t a, int32_t b) { return a > b ? a : b; }

/* gemmlowp SaturatingRoundingDoublingHighMul: (a*b + nudge) / 2^31 with C's truncating division, nudge
 * +2^30 for a non-negative product and 1-2^30 otherwise; INT32_MIN*INT32_MIN saturates to INT32_MAX. */
static inline int32_t tt_srdhm(int32_t a, int32_t b)
{
    int64_t ab;
    if (a == b && a == TT_INT32_MIN) {
        return TT_INT32_MAX;
    }
    ab = (int64_t)a * (int64_t)b;
    /* The reference's truncating (ab + nudge) / 2^31 equals the floor (arithmetic shift) of (ab + 2^30) / 2^31 for
     * both signs: for ab < 0, trunc(v / 2^31) = floor((v + 2^31 - 1) / 2^31) with v = ab + 1 - 2^30 < 0, and
     * v + 2^31 - 1 = ab + 2^30. One add and one shift instead of a sign test and a 64-bit division fix-up: this
     * runs once per int8 output of every conv. Arithmetic right shift of a negative int64: see RDBPOT below. */
    return (int32_t)((ab + ((int64_t)1 << 30)) >> 31);
}

/* gemmlowp RoundingDivideByPOT: arithmetic right shift rounding to nearest, ties away from zero
 * (the threshold is one larger for negative x). exponent in 0..31. Right shift of a negative int32 is
 * implementation-defined in C99 but arithmetic on every target we build for (as gemmlowp itself assumes). */
static inline int32_t tt_rounding_divide_by_pot(int32_t x, int exponent)
{
    const int32_t mask = (int32_t)(((int64_t)1 << exponent) - 1);
    const int32_t remainder = x & mask;
    const int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

/* MultiplyByQuantizedMultiplier (double rounding): shift > 0 is a left shift of x (int32, wraps), then SRDHM,
 * then RoundingDivideByPOT by -shift when shift < 0. shift in -31..31. */
static inline int32_t tt_multiply_by_quantized_multiplier(int32_t x, int32_t multiplier, int shift)
{
    const int left = shift > 0 ? shift : 0;
    const int right = shift > 0 ? 0 : -shift;
    return tt_rounding_divide_by_pot(tt_srdhm(tt_wrap_shl32(x, left), multiplier), right);
}

/* ADD's MultiplyByQuantizedMultiplierSmallerThanOneExp: RDBPOT(SRDHM(x, m), -left_shift), left_shift <= 0. */
static inline int32_t tt_multiply_by_quantized_multiplier_smaller_than_one_exp(int32_t x, int32_t multiplier,
                                                                               int left_shift)
{
    return tt_rounding_divide_by_pot(tt_srdhm(x, multiplier), -left_shift);
}

/* SOFTMAX's MultiplyByQuantizedMultiplierGreaterThanOne: SRDHM(x * 2^left_shift (wrapping), m). */
static inline int32_t tt_multiply_by_quantized_multiplier_greater_than_one(int32_t x, int32_t multiplier,
                                                                          int left_shift)
{
    return tt_srdhm(tt_wrap_shl32(x, left_shift), multiplier);
}

/* gemmlowp SaturatingRoundingMultiplyByPOT<exponent>: rounding right shift for exponent < 0, saturating left
 * shift for exponent > 0. exponent in -31..31. */
static inline int32_t tt_saturating_rounding_multiply_by_pot(int32_t x, int exponent)
{
    int32_t threshold;
    if (exponent == 0) {
        return x;
    }
    if (exponent < 0) {
        return tt_rounding_divide_by_pot(x, -exponent);
    }
    threshold = (int32_t)(((int64_t)1 << (31 - exponent)) - 1);
    if (x > threshold) {
        return TT_INT32_MAX;
    }
    if (x < -threshold) {
        return TT_INT32_MIN;
    }
    return tt_wrap_shl32(x, exponent);
}

/* gemmlowp RoundingHalfSum<int32>: (a + b +- 1) / 2 in int64, truncating. */
static inline int32_t tt_rounding_half_sum(int32_t a, int32_t b)
{
    const int64_t s = (int64_t)a + (int64_t)b;
    const int64_t sign = s >= 0 ? 1 : -1;
    return (int32_t)((s + sign) / 2);
}

/* CountLeadingZeros of the uint32 bit pattern; 32 for 0. */
static inline int tt_count_leading_zeros32(uint32_t u)
{
    int n = 0;
    if (u == 0u) {
        return 32;
    }
    while ((u & 0x80000000u) == 0u) {
        u <<= 1;
        ++n;
    }
    return n;
}

/* The fused-activation clamp in the output's integer space, after adding the output zero point. */
static inline int32_t tt_clamp32(int32_t v, int32_t lo, int32_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

#endif /* TT_FIXEDPOINT_H */
