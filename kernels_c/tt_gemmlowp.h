/* tt_gemmlowp.h: gemmlowp's fixed-point transcendental helpers (fixedpoint.h), shared by int8 SOFTMAX and the
 * int8 LOGISTIC / TANH of TFLite Micro (reference_integer_ops). Line-by-line ports of the numpy golden model
 * (stages/golden/int8_arith.py: exp_on_negative_values, one_over_one_plus_x_for_x_in_0_1,
 * one_minus_x_over_one_plus_x_for_x_in_0_1), bit-identical to it. FixedPoint<int32, k> values are carried as their
 * raw int32. Header-only (static inline) so each kernel file gets its own copy and nothing is exported. */
#ifndef TT_GEMMLOWP_H
#define TT_GEMMLOWP_H

#include <stdint.h>

#include "tt_fixedpoint.h"

/* Wrapping negation (the logistic / tanh kernels' sign flip). */
static inline int32_t tt_neg32(int32_t a) { return tt_wrap_sub32(0, a); }

/* exp(a) for a in [-1/4, 0), Q0.31 in and out (gemmlowp constants). */
static inline int32_t tt_exp_on_interval_between_negative_one_quarter_and_0_excl(int32_t a)
{
    const int32_t constant_term = 1895147668;   /* exp(-1/8) */
    const int32_t constant_1_over_3 = 715827883; /* 1/3 */
    const int32_t x = tt_wrap_add32(a, (int32_t)1 << 28);
    const int32_t x2 = tt_srdhm(x, x);
    const int32_t x3 = tt_srdhm(x2, x);
    const int32_t x4 = tt_srdhm(x2, x2);
    const int32_t x4_over_4 = tt_saturating_rounding_multiply_by_pot(x4, -2);
    const int32_t inner = tt_wrap_add32(tt_srdhm(tt_wrap_add32(x4_over_4, x3), constant_1_over_3), x2);
    const int32_t poly = tt_saturating_rounding_multiply_by_pot(inner, -1);
    return tt_wrap_add32(constant_term, tt_srdhm(constant_term, tt_wrap_add32(x, poly)));
}

/* gemmlowp exp_on_negative_values for FixedPoint<int32, integer_bits> a <= 0; result Q0.31. The barrel shifter's
 * multipliers are exp(-2^k) in Q0.31 for k = -2..4 (gemmlowp: ..., 720401, 242; the last is round(2^31 e^-16)). */
static inline int32_t tt_exp_on_negative_values(int32_t a, int integer_bits)
{
    static const int32_t barrel_exponent[7] = {-2, -1, 0, 1, 2, 3, 4};
    static const int32_t barrel_multiplier[7] = {1672461947, 1302514674, 790015084, 290630308,
                                                 39332535,   720401,     242};
    const int frac_bits = 31 - integer_bits;
    const int32_t one_quarter = (int32_t)1 << (frac_bits - 2);
    const int32_t mask = one_quarter - 1;
    const int32_t a_mod_quarter_minus_one_quarter = tt_wrap_sub32(a & mask, one_quarter);
    int32_t result = tt_exp_on_interval_between_negative_one_quarter_and_0_excl(
        tt_saturating_rounding_multiply_by_pot(a_mod_quarter_minus_one_quarter, integer_bits));
    const int32_t remainder = tt_wrap_sub32(a_mod_quarter_minus_one_quarter, a);
    int i;
    for (i = 0; i < 7; ++i) {
        const int exponent = (int)barrel_exponent[i];
        if (integer_bits > exponent) {
            const uint32_t bit = (uint32_t)1 << (frac_bits + exponent);
            if (((uint32_t)remainder & bit) != 0u) {
                result = tt_srdhm(result, barrel_multiplier[i]);
            }
        }
    }
    if (integer_bits > 5) {
        const int32_t clamp = -((int32_t)1 << (36 - integer_bits)); /* -32.0 */
        if (a < clamp) {
            result = 0;
        }
    }
    return a == 0 ? TT_INT32_MAX : result;
}

/* gemmlowp's Newton-Raphson reciprocal shared by the two functions below: three steps towards
 * 1 / half_denominator = 2 / (1 + a) for a in [0, 1] (Q0.31), the estimate kept in Q2.29. */
static inline int32_t tt_newton_one_over_half_denominator(int32_t a)
{
    const int32_t half_denominator = tt_rounding_half_sum(a, TT_INT32_MAX);
    const int32_t constant_48_over_17 = 1515870810;
    const int32_t constant_neg_32_over_17 = -1010580540;
    const int32_t one_q2 = (int32_t)1 << 29;
    int32_t x = tt_wrap_add32(constant_48_over_17, tt_srdhm(half_denominator, constant_neg_32_over_17));
    int i;
    for (i = 0; i < 3; ++i) {
        const int32_t half_denominator_times_x = tt_srdhm(half_denominator, x);
        const int32_t one_minus = tt_wrap_sub32(one_q2, half_denominator_times_x);
        x = tt_wrap_add32(x, tt_saturating_rounding_multiply_by_pot(tt_srdhm(x, one_minus), 2));
    }
    return x;
}

/* gemmlowp one_over_one_plus_x_for_x_in_0_1: result Q0.31 (ExactMulByPot<-1> then Rescale<0>). */
static inline int32_t tt_one_over_one_plus_x_for_x_in_0_1(int32_t a)
{
    return tt_saturating_rounding_multiply_by_pot(tt_newton_one_over_half_denominator(a), 1);
}

/* gemmlowp one_minus_x_over_one_plus_x_for_x_in_0_1: (x - One) in Q2.29, then Rescale<0> (a saturating shift
 * by 2); result Q0.31. */
static inline int32_t tt_one_minus_x_over_one_plus_x_for_x_in_0_1(int32_t a)
{
    return tt_saturating_rounding_multiply_by_pot(
        tt_wrap_sub32(tt_newton_one_over_half_denominator(a), (int32_t)1 << 29), 2);
}

#endif /* TT_GEMMLOWP_H */
