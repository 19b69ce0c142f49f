/* The broadcasting loops shared by add, sub and mul (ops/tt_add.c, tt_sub.c, tt_mul.c; TT_BC_OFF also by
 * tt_prelu.c). static inline: each op file inlines the loop into its entry points with the op kind / sign a
 * constant. */
#ifndef TT_BROADCAST_H
#define TT_BROADCAST_H

#include "tt_kernels.h"

/* The flat offsets of operand a and b for the output element (i0, i1, i2, i3). */
#define TT_BC_OFF(s, i0, i1, i2, i3) ((i0) * (s)[0] + (i1) * (s)[1] + (i2) * (s)[2] + (i3) * (s)[3])

/* add.cc / sub.cc 8-bit general path (executor._add_or_sub): both operands shifted up by left_shift and rescaled
 * to a common scale, summed or subtracted (int32, wraps as the reference), rescaled to the output, clamped. */
static inline void tt_add_sub_s8(const tt_add_params_s8 *p, const tt_broadcast *bc, int32_t sign, const int8_t *a,
                          const int8_t *b, int8_t *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t av = a[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)];
                    const int32_t bv = b[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                    const int32_t v1 = tt_wrap_shl32(av - p->input1_zero_point, (int)p->left_shift);
                    const int32_t v2 = tt_wrap_shl32(bv - p->input2_zero_point, (int)p->left_shift);
                    const int32_t r1 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(
                        v1, p->input1_multiplier, (int)p->input1_shift);
                    const int32_t r2 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(
                        v2, p->input2_multiplier, (int)p->input2_shift);
                    const int32_t s = sign > 0 ? tt_wrap_add32(r1, r2) : tt_wrap_sub32(r1, r2);
                    const int32_t raw = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(
                                            s, p->output_multiplier, (int)p->output_shift) +
                                        p->output_zero_point;
                    y[k++] = (int8_t)tt_clamp32(raw, p->act_min, p->act_max);
                }
            }
        }
    }
}

/* float32: the op, then the fused activation's clamp (max then min, as executor._float_act). kind 0 add, 1 sub,
 * 2 mul. */
static inline void tt_binary_f32(int kind, const tt_broadcast *bc, float act_min, float act_max, const float *a,
                          const float *b, float *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const float av = a[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)];
                    const float bv = b[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                    float v = kind == 0 ? av + bv : (kind == 1 ? av - bv : av * bv);
                    if (v < act_min) {
                        v = act_min;
                    }
                    if (v > act_max) {
                        v = act_max;
                    }
                    y[k++] = v;
                }
            }
        }
    }
}

/* ---- backward ---------------------------------------------------------------------------------------------- */

/* Shared by unbroadcast and mul_grad: dx[a(i)] (+)= sign * dy[i] (* other[b(i)]). A dx of the output's size is
 * written directly, element by element (dx may then be dy); a smaller one is zeroed and accumulated over the
 * broadcast positions in row-major order of dy. */
static inline void tt_reduce_to_operand_f32(const tt_broadcast *bc, float sign, const float *dy, const float *other,
                                     float *dx, int32_t dx_size)
{
    const int32_t total = bc->shape[0] * bc->shape[1] * bc->shape[2] * bc->shape[3];
    const int direct = dx_size == total;
    int32_t i0, i1, i2, i3, k = 0;
    if (!direct) {
        for (i0 = 0; i0 < dx_size; ++i0) {
            dx[i0] = 0.0f;
        }
    }
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t j = TT_BC_OFF(bc->a_stride, i0, i1, i2, i3);
                    float v = sign * dy[k++];
                    if (other != 0) {
                        v = v * other[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)];
                    }
                    if (direct) {
                        dx[j] = v;
                    } else {
                        dx[j] += v;
                    }
                }
            }
        }
    }
}

#endif /* TT_BROADCAST_H */
