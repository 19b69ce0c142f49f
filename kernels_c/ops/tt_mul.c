/* mul: int8 and float32 with broadcasting, and mul_grad. */
#include "tt_broadcast.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* MUL: y = z_y + MultiplyByQuantizedMultiplier((a - z_a)(b - z_b), QuantizeMultiplier(s_a * s_b / s_y)), the
 * ratio in double of the float32 scales (TFLite Micro's CalculateOpDataMul), clamped to the fused act's range. */
typedef struct {
    int32_t input1_zero_point, input2_zero_point, output_zero_point;
    int32_t multiplier, shift;
    int32_t act_min, act_max;
} tt_mul_params_s8;
void tt_mul_s8(const tt_mul_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y);
void tt_mul_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y);
/* mul_grad: d = unbroadcast(dy * other) to d's shape (a_stride: d's strides, b_stride: other's). */
void tt_mul_grad_f32(const tt_broadcast *bc, const float *dy, const float *other, float *d, int32_t d_size);
/* fp16-mixed (issue 13): tt_mul_grad_f32 with dy, other and d each fp32 or fp16 (the f32 / f16 pointer pair of
 * each, the other 0): dy and other widened where they are read (exact), each product dy * other in fp32, each d
 * element of a reduced operand summed in fp32 in tt_mul_grad_f32's order (its positions in dy's row-major order,
 * from +0), and d rounded once as it is stored: the bits of tt_mul_grad_f32 between tt_cast_f16_f32 and
 * tt_round_f16. d never shares its buffer with dy or other (mul_grad is not an in-place op). */
void tt_mul_grad_f16(const tt_broadcast *bc, const float *dyf, const uint16_t *dyh, const float *of,
                     const uint16_t *oh, float *df, uint16_t *dh, int32_t d_size);
#endif /* TT_INTERFACE */

/* mul.cc / reference_integer_ops::MulElementwise (executor._mul, TFLite Micro's multiplier): one requantization
 * of the int32 product (|product| <= 255 * 255, no overflow). */
void tt_mul_s8(const tt_mul_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < bc->shape[0]; ++i0) {
        for (i1 = 0; i1 < bc->shape[1]; ++i1) {
            for (i2 = 0; i2 < bc->shape[2]; ++i2) {
                for (i3 = 0; i3 < bc->shape[3]; ++i3) {
                    const int32_t av = (int32_t)a[TT_BC_OFF(bc->a_stride, i0, i1, i2, i3)] - p->input1_zero_point;
                    const int32_t bv = (int32_t)b[TT_BC_OFF(bc->b_stride, i0, i1, i2, i3)] - p->input2_zero_point;
                    const int32_t raw = tt_multiply_by_quantized_multiplier(av * bv, p->multiplier, (int)p->shift) +
                                        p->output_zero_point;
                    y[k++] = (int8_t)tt_clamp32(raw, p->act_min, p->act_max);
                }
            }
        }
    }
}

void tt_mul_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y)
{
    tt_binary_f32(2, bc, act_min, act_max, a, b, y);
}

void tt_mul_grad_f32(const tt_broadcast *bc, const float *dy, const float *other, float *d, int32_t d_size)
{
    tt_reduce_to_operand_f32(bc, 1.0f, dy, other, d, d_size);
}

void tt_mul_grad_f16(const tt_broadcast *bc, const float *dyf, const uint16_t *dyh, const float *of,
                     const uint16_t *oh, float *df, uint16_t *dh, int32_t d_size)
{
    tt_reduce_to_operand_f16(bc, 1.0f, dyf, dyh, of, oh, df, dh, d_size);   /* 1 * dy is dy: the same products */
}
