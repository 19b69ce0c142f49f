/* softmax, int8 (reference_ops::Softmax<int8_t, int8_t>, gemmlowp fixed-point exp and reciprocal) and float32.
 * The int8 path is a line-by-line port of int8_arith.softmax_int8 and its gemmlowp helpers. */
#include "tt_kernels.h"
#include "tt_math.h"

#include <math.h>

/* exp(a) for a in [-1/4, 0), Q0.31 in and out (gemmlowp constants). */
static int32_t tt_exp_on_interval_between_negative_one_quarter_and_0_excl(int32_t a)
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

/* gemmlowp exp_on_negative_values for FixedPoint<int32, integer_bits> a <= 0; result Q0.31. */
static int32_t tt_exp_on_negative_values(int32_t a, int integer_bits)
{
    static const int32_t barrel_exponent[7] = {-2, -1, 0, 1, 2, 3, 4};
    static const int32_t barrel_multiplier[7] = {1672461947, 1302514674, 790015084, 290630308,
                                                 39332535,   720401,     243};
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

/* gemmlowp one_over_one_plus_x_for_x_in_0_1: Newton-Raphson in Q2.29, result Q0.31. */
static int32_t tt_one_over_one_plus_x_for_x_in_0_1(int32_t a)
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
    return tt_saturating_rounding_multiply_by_pot(x, 1);
}

void tt_softmax_s8(int32_t rows, int32_t depth, int32_t input_multiplier, int32_t input_left_shift,
                   int32_t diff_min, const int8_t *x, int8_t *y)
{
    const int scaled_diff_integer_bits = 5;
    const int accumulation_integer_bits = 12;
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        const int8_t *xr = x + r * depth;
        int8_t *yr = y + r * depth;
        int32_t max_in_row = -128;
        int32_t sum_of_exps = 0;
        int32_t shifted_scale, num_bits_over_unit, exponent;
        int headroom_plus_one;
        for (c = 0; c < depth; ++c) {
            if (xr[c] > max_in_row) {
                max_in_row = xr[c];
            }
        }
        for (c = 0; c < depth; ++c) {
            const int32_t diff = (int32_t)xr[c] - max_in_row;
            if (diff >= diff_min) {
                const int32_t rescaled =
                    tt_multiply_by_quantized_multiplier_greater_than_one(diff, input_multiplier, (int)input_left_shift);
                const int32_t e = tt_exp_on_negative_values(rescaled, scaled_diff_integer_bits);
                /* Rescale<12> of Q0.31, then the fixed-point + (int32, wraps). */
                sum_of_exps = tt_wrap_add32(sum_of_exps,
                                            tt_saturating_rounding_multiply_by_pot(e, -accumulation_integer_bits));
            }
        }
        /* GetReciprocal(sum, 12). The row max always contributes exp(0) >> 12 = 2^19, so sum > 0 and the
         * shift below is < 32. */
        headroom_plus_one = tt_count_leading_zeros32((uint32_t)sum_of_exps);
        num_bits_over_unit = accumulation_integer_bits - headroom_plus_one;
        shifted_scale = tt_one_over_one_plus_x_for_x_in_0_1(
            (int32_t)(((uint32_t)sum_of_exps << (headroom_plus_one & 31)) - 0x80000000u));
        exponent = num_bits_over_unit + 31 - 8;
        for (c = 0; c < depth; ++c) {
            const int32_t diff = (int32_t)xr[c] - max_in_row;
            if (diff >= diff_min) {
                const int32_t rescaled =
                    tt_multiply_by_quantized_multiplier_greater_than_one(diff, input_multiplier, (int)input_left_shift);
                const int32_t e = tt_exp_on_negative_values(rescaled, scaled_diff_integer_bits);
                const int32_t unsat = tt_rounding_divide_by_pot(tt_srdhm(shifted_scale, e), (int)exponent);
                yr[c] = (int8_t)tt_clamp32(unsat - 128, -128, 127);
            } else {
                yr[c] = -128;
            }
        }
    }
}

/* executor._softmax float path: e = exp((x - max) * beta) in float32, an in-order sum, e / sum. */
void tt_softmax_f32(int32_t rows, int32_t depth, float beta, const float *x, float *y)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        const float *xr = x + r * depth;
        float *yr = y + r * depth;
        float mx = xr[0], total = 0.0f;
        for (c = 1; c < depth; ++c) {
            if (xr[c] > mx) {
                mx = xr[c];
            }
        }
        for (c = 0; c < depth; ++c) {
            yr[c] = tt_expf((xr[c] - mx) * beta);
            total += yr[c];
        }
        for (c = 0; c < depth; ++c) {
            yr[c] = yr[c] / total;
        }
    }
}
