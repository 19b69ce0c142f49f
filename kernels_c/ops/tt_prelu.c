/* prelu: int8, float32 and fp16-mixed (alpha broadcast), and prelu_grad (conventions: ops/tt_logistic.c's header). */
#include "tt_broadcast.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* int8 PRELU (reference_ops::BroadcastPrelu4D): pos = QuantizeMultiplier(f32(s_x / s_y)), neg =
 * QuantizeMultiplier(f32(f32(s_x * s_alpha) / s_y)) on (x - z_x)(alpha - z_alpha). bc: x is operand a (full
 * shape), alpha operand b (broadcast). */
typedef struct {
    int32_t input_zero_point, alpha_zero_point, output_zero_point;
    int32_t multiplier_pos, shift_pos;
    int32_t multiplier_neg, shift_neg;
} tt_prelu_params_s8;
void tt_prelu_s8(const tt_prelu_params_s8 *p, const tt_broadcast *bc, const int8_t *x, const int8_t *alpha,
                 int8_t *y);
/* x >= 0 ? x : x * alpha (alpha broadcast, operand b of bc). */
void tt_prelu_f32(const tt_broadcast *bc, const float *x, const float *alpha, float *y);
/* fp16-mixed (OpDef.fp16_operands / fp16_output): x read as fp32 (xf) or fp16 (xh, widened: exact), y written as
 * fp32 (yf) or fp16 (yh, tt_prelu_f32's value rounded once on store); the other pointer of each pair is 0. y never
 * shares x's buffer (prelu is not in place). */
void tt_prelu_f16(const tt_broadcast *bc, const float *xf, const uint16_t *xh, const float *alpha, float *yf,
                  uint16_t *yh);
void tt_prelu_grad_f32(const tt_broadcast *bc, const float *dy, const float *x, const float *alpha, float *dx);
#endif /* TT_INTERFACE */

/* reference_ops::BroadcastPrelu4D: x (a_stride) against alpha broadcast (b_stride). The negative side multiplies
 * (x - z_x) (alpha - z_alpha), at most 255 * 255: no overflow. */
void tt_prelu_s8(const tt_prelu_params_s8 *p, const tt_broadcast *bc, const int8_t *x, const int8_t *alpha,
                 int8_t *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t xi = (int32_t)x[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)] - p->input_zero_point;
                    int32_t r;
                    if (xi >= 0) {
                        r = tt_multiply_by_quantized_multiplier(xi, p->multiplier_pos, (int)p->shift_pos);
                    } else {
                        const int32_t ai = (int32_t)alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)] -
                                           p->alpha_zero_point;
                        r = tt_multiply_by_quantized_multiplier(xi * ai, p->multiplier_neg, (int)p->shift_neg);
                    }
                    y[k++] = (int8_t)tt_clamp32(r + p->output_zero_point, -128, 127);
                }
            }
        }
    }
}

void tt_prelu_f32(const tt_broadcast *bc, const float *x, const float *alpha, float *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const float v = x[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)];
                    y[k++] = v >= 0.0f ? v : v * alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                }
            }
        }
    }
}

void tt_prelu_f16(const tt_broadcast *bc, const float *xf, const uint16_t *xh, const float *alpha, float *yf,
                  uint16_t *yh)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t a = TT_BC_OFF(bc->a_stride, i0, i1, i2, i3);
                    const float v = xh != 0 ? tt_f16_read(xh[a]) : xf[a];
                    const float r = v >= 0.0f ? v : v * alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                    if (yh != 0) {
                        yh[k] = tt_f16_narrow(r);
                    } else {
                        yf[k] = r;
                    }
                    ++k;
                }
            }
        }
    }
}

/* x > 0 ? dy : alpha * dy (the slope at the kink is alpha, as PyTorch); dy, x, dx full-shape (a_stride). */
void tt_prelu_grad_f32(const tt_broadcast *bc, const float *dy, const float *x, const float *alpha, float *dx)
{
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t k = TT_BC_OFF(bc->a_stride, i0, i1, i2, i3);
                    dx[k] = x[k] > 0.0f ? dy[k] : dy[k] * alpha[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                }
            }
        }
    }
}
