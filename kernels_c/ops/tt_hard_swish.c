/* hard_swish: int8 (16-bit fixed point) and float32, and hard_swish_grad (conventions: ops/tt_logistic.c's
 * header). */
#include "tt_kernels.h"
#include "tt_math.h"

#ifdef TT_INTERFACE
/* int8 HARD_SWISH: reference_ops::HardSwish<int8_t>, 16-bit fixed point; the Q0.15 multipliers and exponents are
 * int8_arith.hard_swish_params(s_in, s_out). */
typedef struct {
    int32_t input_zero_point, output_zero_point;
    int32_t output_multiplier_fixedpoint_int16, output_multiplier_exponent;
    int32_t reluish_multiplier_fixedpoint_int16, reluish_multiplier_exponent;
} tt_hard_swish_params_s8;
void tt_hard_swish_s8(const tt_hard_swish_params_s8 *p, int32_t n, const int8_t *x, int8_t *y);
/* x * min(6, max(0, x + 3)) / 6. */
void tt_hard_swish_f32(int32_t n, const float *x, float *y);
/* From the forward input x: hard_swish 0 / dy (x/3 + 1/2) / dy at x <= -3 / between / x >= 3; leaky_relu and prelu
 * x > 0 ? dy : alpha dy (prelu: alpha operand b of bc, x / dy / dx operand a). dx may be dy. */
void tt_hard_swish_grad_f32(int32_t n, const float *dy, const float *x, float *dx);
#endif /* TT_INTERFACE */

/* ---- HARD_SWISH (reference_ops::HardSwish<int8_t>, int8_arith.hard_swish_int8) ------------------------------- */

static inline int32_t tt_wrap16(int32_t x) { return (int32_t)(int16_t)(uint16_t)(uint32_t)x; }

static inline int32_t tt_sat16(int64_t x)
{
    return x < -32768 ? -32768 : (x > 32767 ? 32767 : (int32_t)x);
}

/* gemmlowp SaturatingRoundingDoublingHighMul<int16_t> (C division truncates, as the reference). */
static inline int32_t tt_srdhm16(int32_t a, int32_t b)
{
    int32_t ab;
    if (a == b && a == -32768) {
        return 32767;
    }
    ab = a * b;
    return tt_wrap16((ab + (ab >= 0 ? (1 << 14) : (1 - (1 << 14)))) / (1 << 15));
}

/* reference_ops::SaturatingDoublingHighMul (int16, truncating: SQDMULH). */
static inline int32_t tt_sdhm16(int32_t a, int32_t b)
{
    if (a == b && a == -32768) {
        return 32767;
    }
    return tt_wrap16((a * b) / (1 << 15));
}

void tt_hard_swish_s8(const tt_hard_swish_params_s8 *p, int32_t n, const int8_t *x, int8_t *y)
{
    const int32_t re = p->reluish_multiplier_exponent;
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t v = tt_wrap16((int32_t)x[i] - p->input_zero_point);
        const int32_t hires = tt_wrap16(v * (1 << 7));
        const int32_t preshift_out = tt_srdhm16(hires, p->output_multiplier_fixedpoint_int16);
        int32_t reluish = hires, pre, out;
        if (re > 0) {
            reluish = tt_sat16((int64_t)reluish * ((int64_t)1 << (re - 1)));
        }
        reluish = tt_srdhm16(reluish, p->reluish_multiplier_fixedpoint_int16);
        if (re > 0) {
            reluish = tt_sat16((int64_t)reluish * 2);
        }
        if (re < 0) {
            reluish = tt_rounding_divide_by_pot(reluish, (int)-re);
        }
        /* (reluish + 2^15) / 2: the sum is >= 0, so the shift is a floor division as in the reference. */
        reluish = tt_wrap16((reluish + (1 << 15)) >> 1);
        pre = tt_sdhm16(reluish, preshift_out);
        out = tt_wrap16(tt_rounding_divide_by_pot(pre, (int)-p->output_multiplier_exponent) + p->output_zero_point);
        y[i] = (int8_t)tt_clamp32(out, -128, 127);
    }
}

/* reference_ops::HardSwish float: x * min(6, max(0, x + 3)) / 6, in this order. */
void tt_hard_swish_f32(int32_t n, const float *x, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        float r = v + 3.0f;
        r = r > 0.0f ? r : 0.0f;
        r = r < 6.0f ? r : 6.0f;
        y[i] = (v * r) / 6.0f;
    }
}

/* 0 for x <= -3, dy for x >= 3, dy * (x / 3 + 1/2) between (PyTorch's kinks, grad_ops.hard_swish_grad). */
void tt_hard_swish_grad_f32(int32_t n, const float *dy, const float *x, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const float v = x[i];
        dx[i] = v <= -3.0f ? 0.0f : (v < 3.0f ? dy[i] * (v / 3.0f + 0.5f) : dy[i]);
    }
}
