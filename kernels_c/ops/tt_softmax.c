/* softmax, int8 (reference_ops::Softmax<int8_t, int8_t>, gemmlowp fixed-point exp and reciprocal) and float32.
 * The int8 path is a line-by-line port of int8_arith.softmax_int8; the gemmlowp helpers are in tt_gemmlowp.h.
 * softmax_grad: from the forward output. */
#include "tt_gemmlowp.h"
#include "tt_kernels.h"
#include "tt_math.h"

#include <math.h>

#ifdef TT_INTERFACE
/* reference_ops::Softmax<int8, int8> over the last axis; output scale 1/256, zero point -128. The parameters are
 * int8_arith.softmax_params(beta, s_x). */
void tt_softmax_s8(int32_t rows, int32_t depth, int32_t input_multiplier, int32_t input_left_shift,
                   int32_t diff_min, const int8_t *x, int8_t *y);
void tt_softmax_f32(int32_t rows, int32_t depth, float beta, const float *x, float *y);
/* y = softmax(beta x): dx = beta * y * (dy - sum(dy*y)). */
void tt_softmax_grad_f32(int32_t rows, int32_t depth, float beta, const float *dy, const float *y, float *dx);
#endif /* TT_INTERFACE */

/* exp(x - max) in Q0.31 of a difference from the row's max (diff_min <= diff <= 0): the difference rescaled to
 * Q5.26 (5 integer bits), then gemmlowp's exp_on_negative_values. */
static int32_t tt_softmax_exp(int32_t diff, int32_t input_multiplier, int32_t input_left_shift)
{
    const int scaled_diff_integer_bits = 5;
    const int32_t rescaled =
        tt_multiply_by_quantized_multiplier_greater_than_one(diff, input_multiplier, (int)input_left_shift);
    return tt_exp_on_negative_values(rescaled, scaled_diff_integer_bits);
}

void tt_softmax_s8(int32_t rows, int32_t depth, int32_t input_multiplier, int32_t input_left_shift,
                   int32_t diff_min, const int8_t *x, int8_t *y)
{
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
                const int32_t e = tt_softmax_exp(diff, input_multiplier, input_left_shift);
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
                const int32_t e = tt_softmax_exp(diff, input_multiplier, input_left_shift);
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

void tt_softmax_grad_f32(int32_t rows, int32_t depth, float beta, const float *dy, const float *y, float *dx)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        const float *dyr = dy + r * depth;
        const float *yr = y + r * depth;
        float *dxr = dx + r * depth;
        float s = 0.0f;
        for (c = 0; c < depth; ++c) {
            s += dyr[c] * yr[c];
        }
        for (c = 0; c < depth; ++c) {
            dxr[c] = beta * yr[c] * (dyr[c] - s);
        }
    }
}
