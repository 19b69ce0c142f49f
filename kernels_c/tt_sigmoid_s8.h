/* The int8 loop shared by LOGISTIC and TANH (ops/tt_logistic.c, ops/tt_tanh.c; TFLite Micro's
 * reference_integer_ops): the two differ only in gemmlowp's function and in how its Q0.31 result maps to the int8
 * output, so the loop is written once here. */
#ifndef TT_SIGMOID_S8_H
#define TT_SIGMOID_S8_H

#include "tt_gemmlowp.h"
#include "tt_kernels.h"

/* y = clamp(RoundingDivideByPOT(f(q), out_shift) + out_offset, -128, 127), q = MultiplyByQuantizedMultiplier(x -
 * z_in, multiplier, left_shift) in Q4.27; |x - z_in| >= radius saturates to -128 / 127. f maps Q4.27 to Q0.31.
 * static inline with f a constant: each op file compiles its own loop with f called directly. */
static inline void tt_sigmoid_like_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift,
                                      int32_t radius, int32_t (*f)(int32_t), int out_shift, int32_t out_offset,
                                      const int8_t *x, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = (int32_t)x[i] - input_zero_point;
        int32_t out;
        if (v <= -radius) {
            out = -128;
        } else if (v >= radius) {
            out = 127;
        } else {
            const int32_t q4 = tt_multiply_by_quantized_multiplier(v, multiplier, (int)left_shift);
            out = tt_clamp32(tt_rounding_divide_by_pot(f(q4), out_shift) + out_offset, -128, 127);
        }
        y[i] = (int8_t)out;
    }
}

#endif /* TT_SIGMOID_S8_H */
