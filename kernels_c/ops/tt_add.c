/* add: int8 and float32, equal shapes and broadcast, and add_grad (tt_unbroadcast_f32, also sub_grad's kernel).
 *
 * Element-wise binary ops with numpy broadcasting (ADD, SUB, MUL), int8 and float32, and their backward
 * (grad_ops.unbroadcast / sub_grad / mul_grad). Shapes travel as tt_broadcast: the output's rank-4 shape and each
 * operand's element strides (0 along an axis the operand is broadcast over), computed by codegen. */
#include "tt_broadcast.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* Element-wise, equal shapes (n elements). */
void tt_add_s8(const tt_add_params_s8 *p, int32_t n, const int8_t *a, const int8_t *b, int8_t *y);
/* ADD with broadcasting (equal shapes: tt_add_s8) and SUB (sub.cc: ADD's general path with the rescaled second
 * operand subtracted; PrepareGeneralSubOp computes the same parameters as add.cc). */
void tt_add_s8_broadcast(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b,
                         int8_t *y);
void tt_add_f32_broadcast(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b,
                          float *y);
void tt_add_f32(int32_t n, float act_min, float act_max, const float *a, const float *b, float *y);
/* The gradient of an operand broadcast up to dy's shape (add_grad / sub_grad: sign +1 / -1): dx[a(i)] += sign *
 * dy[i] over bc's output positions (a_stride: dx's strides, 0 on the broadcast axes); dx has dx_size elements.
 * When dx has dy's size it is a (signed) copy and dx may be dy; otherwise dx is zeroed first. */
void tt_unbroadcast_f32(const tt_broadcast *bc, float sign, const float *dy, float *dx, int32_t dx_size);
/* fp16-mixed (issue 13): tt_add_f32 with each operand and the result fp32 or fp16 (the f32 / f16 pointer pair of
 * each, the other 0): operands widened where they are read, the result rounded once as it is stored (the bits of
 * tt_add_f32 between tt_cast_f16_f32 and tt_round_f16). Equal shapes; y may start where a or b does (it writes
 * behind what it reads). */
void tt_add_f16(int32_t n, float act_min, float act_max, const float *af, const uint16_t *ah, const float *bf,
                const uint16_t *bh, float *yf, uint16_t *yh);
#endif /* TT_INTERFACE */

/* add.cc / reference_integer_ops::AddElementwise (8-bit general path), as executor._add. */
void tt_add_s8(const tt_add_params_s8 *p, int32_t n, const int8_t *a, const int8_t *b, int8_t *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        /* |x - z| <= 255, times 2^20 < 2^31: the shift cannot overflow. */
        const int32_t v1 = tt_wrap_shl32((int32_t)a[i] - p->input1_zero_point, (int)p->left_shift);
        const int32_t v2 = tt_wrap_shl32((int32_t)b[i] - p->input2_zero_point, (int)p->left_shift);
        const int32_t r1 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(v1, p->input1_multiplier,
                                                                                    (int)p->input1_shift);
        const int32_t r2 = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(v2, p->input2_multiplier,
                                                                                    (int)p->input2_shift);
        const int32_t raw = tt_multiply_by_quantized_multiplier_smaller_than_one_exp(
                                tt_wrap_add32(r1, r2), p->output_multiplier, (int)p->output_shift) +
                            p->output_zero_point;
        y[i] = (int8_t)tt_clamp32(raw, p->act_min, p->act_max);
    }
}

void tt_add_f32(int32_t n, float act_min, float act_max, const float *a, const float *b, float *y)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        float v = a[i] + b[i];
        if (v < act_min) {
            v = act_min;
        }
        if (v > act_max) {
            v = act_max;
        }
        y[i] = v;
    }
}

void tt_add_s8_broadcast(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b,
                         int8_t *y)
{
    tt_add_sub_s8(p, bc, 1, a, b, y);
}

void tt_add_f32_broadcast(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b,
                          float *y)
{
    tt_binary_f32(0, bc, act_min, act_max, a, b, y);
}

void tt_unbroadcast_f32(const tt_broadcast *bc, float sign, const float *dy, float *dx, int32_t dx_size)
{
    tt_reduce_to_operand_f32(bc, sign, dy, 0, dx, dx_size);
}

void tt_add_f16(int32_t n, float act_min, float act_max, const float *af, const uint16_t *ah, const float *bf,
                const uint16_t *bh, float *yf, uint16_t *yh)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        float v = (ah != 0 ? tt_f16_read(ah[i]) : af[i]) + (bh != 0 ? tt_f16_read(bh[i]) : bf[i]);
        if (v < act_min) {
            v = act_min;
        }
        if (v > act_max) {
            v = act_max;
        }
        if (yh != 0) {
            yh[i] = tt_f16_narrow(v);
        } else {
            yf[i] = v;
        }
    }
}
