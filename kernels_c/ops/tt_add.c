/* add: int8 and float32, equal shapes and broadcast, and add_grad (tt_unbroadcast_f32, also sub_grad's kernel).
 *
 * Element-wise binary ops with numpy broadcasting (ADD, SUB, MUL), int8 and float32, and their backward
 * (grad_ops.unbroadcast / sub_grad / mul_grad). Shapes travel as tt_broadcast: the output's rank-4 shape and each
 * operand's element strides (0 along an axis the operand is broadcast over), computed by codegen. */
#include "tt_act_clamp.h"
#include "tt_broadcast.h"
#include "tt_f16.h"
#include "tt_requant.h"

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
 * tt_add_f32 between tt_cast_f16_f32 and tt_round_f16). Equal shapes; y may start where a or b does (an fp32
 * result over an fp16 operand is written from the end, any other pair behind what it reads). */
void tt_add_f16(int32_t n, float act_min, float act_max, const float *af, const uint16_t *ah, const float *bf,
                const uint16_t *bh, float *yf, uint16_t *yh);
/* tt_add_f16 with broadcasting (tt_add_f32_broadcast's loop, the same sums): y may start where an operand of y's
 * shape does (an fp32 y over an fp16 one is written from the end), never over a broadcast operand (codegen refuses
 * that plan). */
void tt_add_f16_broadcast(const tt_broadcast *bc, float act_min, float act_max, const float *af, const uint16_t *ah,
                          const float *bf, const uint16_t *bh, float *yf, uint16_t *yh);
/* tt_unbroadcast_f32 with dy and dx each fp32 or fp16 (the f32 / f16 pointer pair of each, the other 0): dy widened
 * where it is read (exact), each dx element summed in fp32 in tt_unbroadcast_f32's order (its positions in dy's
 * row-major order, from +0) and rounded once as it is stored. dx_size == dy's size: a (signed) copy, where dx may
 * be dy (an fp32 dx over an fp16 dy is written from the end). */
void tt_unbroadcast_f16(const tt_broadcast *bc, float sign, const float *dyf, const uint16_t *dyh, float *dxf,
                        uint16_t *dxh, int32_t dx_size);
/* tt_reduce_to_operand_f32 (tt_broadcast.h) with each operand fp32 or fp16 (pointer pairs, the other 0; other may be
 * absent): v = sign * dy[k] (* other), each dx element's sum in fp32 from +0 in dy's row-major order (a register per
 * element: its broadcast axes are the inner loops), rounded once as it is stored; dx_size == dy's size: dx = v.
 * add_grad / sub_grad (tt_unbroadcast_f16) and mul_grad (tt_mul_grad_f16) reduce through it. dx shares no buffer
 * with dy or other. */
void tt_reduce_to_operand_f16(const tt_broadcast *bc, float sign, const float *dyf, const uint16_t *dyh,
                              const float *of, const uint16_t *oh, float *dxf, uint16_t *dxh, int32_t dx_size);
#endif /* TT_INTERFACE */

#if TT_SIMD
/* tt_requant_mmx_apply with the sign term's mask a constant where inlined (signed: c.neg != 0). */
#define TT_ADD_MM(c, signed, x2) (tt_smmlar((x2), (c).multiplier, (signed) ? (c).h + ((x2) >> 31) : (c).h) >> (c).e)

/* One element: the operands' doubled shifted differences v = 2 (x - z) 2^20 (|x - z| <= 255: |v| < 2^29), their
 * rescaled values r (|r| <= |v| / 2 + 1, so the doubled sum 2 (r1 + r2) fits int32 too), the output's
 * requantization with its zero point (a shift e >= 1: its sign term always), the clamp. v as (x << 21) - (z << 21)
 * in unsigned arithmetic: one RSB with a shifted operand, and the value of the signed product. */
#define TT_ADD1(i)                                                                                                \
    do {                                                                                                          \
        const int32_t v1 = (int32_t)(((uint32_t)(int32_t)a[i] << 21) - zs1);                                      \
        const int32_t v2 = (int32_t)(((uint32_t)(int32_t)b[i] << 21) - zs2);                                      \
        const int32_t s2 = 2 * (TT_ADD_MM(c1, sg1, v1) + TT_ADD_MM(c2, sg2, v2));                                 \
        const int32_t v = TT_ADD_MM(co, 1, s2);                                                                   \
        y[i] = (int8_t)(full ? tt_ssat8(v) : tt_clamp32(v, lo, hi));                                              \
    } while (0)

/* The elements of tt_add_s8 (left_shift 20) with the constants in registers; sg1 / sg2: the operands' shifts are
 * not 0 (constants here, so the sign term costs nothing when it is absent); full: the clamp is int8's range (one
 * SSAT). Four elements per pass (fewer loop branches). */
static inline __attribute__((always_inline)) void tt_add_s8_mm(const tt_requant_mmx *pc1, const tt_requant_mmx *pc2,
                                                               const tt_requant_mmx *pco, uint32_t zs1, uint32_t zs2,
                                                               int sg1, int sg2, int32_t lo, int32_t hi, int full,
                                                               int32_t n, const int8_t *a, const int8_t *b,
                                                               int8_t *y)
{
    const tt_requant_mmx c1 = *pc1, c2 = *pc2, co = *pco;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        TT_ADD1(i);
        TT_ADD1(i + 1);
        TT_ADD1(i + 2);
        TT_ADD1(i + 3);
    }
    for (; i < n; ++i) {
        TT_ADD1(i);
    }
}
#undef TT_ADD1

/* tt_add_s8_mm with the shift signs and the clamp as constants: operand 1 is the one with shift 0 when only one
 * is (the sum r1 + r2 is symmetric), so three sign cases, each with and without the int8 range. */
static void tt_add_s8_fast(const tt_requant_mmx *c1, const tt_requant_mmx *c2, const tt_requant_mmx *co, int32_t z1,
                           int32_t z2, int32_t lo, int32_t hi, int32_t n, const int8_t *a, const int8_t *b, int8_t *y)
{
    const uint32_t zs1 = (uint32_t)z1 << 21, zs2 = (uint32_t)z2 << 21;
    const int full = lo == -128 && hi == 127;
    if (c1->neg && !c2->neg) {
        tt_add_s8_fast(c2, c1, co, z2, z1, lo, hi, n, b, a, y);
    } else if (c1->neg) {
        if (full) {
            tt_add_s8_mm(c1, c2, co, zs1, zs2, 1, 1, lo, hi, 1, n, a, b, y);
        } else {
            tt_add_s8_mm(c1, c2, co, zs1, zs2, 1, 1, lo, hi, 0, n, a, b, y);
        }
    } else if (c2->neg) {
        if (full) {
            tt_add_s8_mm(c1, c2, co, zs1, zs2, 0, 1, lo, hi, 1, n, a, b, y);
        } else {
            tt_add_s8_mm(c1, c2, co, zs1, zs2, 0, 1, lo, hi, 0, n, a, b, y);
        }
    } else if (full) {
        tt_add_s8_mm(c1, c2, co, zs1, zs2, 0, 0, lo, hi, 1, n, a, b, y);
    } else {
        tt_add_s8_mm(c1, c2, co, zs1, zs2, 0, 0, lo, hi, 0, n, a, b, y);
    }
}
#endif

/* add.cc / reference_integer_ops::AddElementwise (8-bit general path), as executor._add. */
void tt_add_s8(const tt_add_params_s8 *p, int32_t n, const int8_t *a, const int8_t *b, int8_t *y)
{
    int32_t i;
#if TT_SIMD
    {
        tt_requant_mmx c1, c2, co;
        if (p->left_shift == 20 && tt_requant_mmx_init(&c1, p->input1_multiplier, p->input1_shift, 0) &&
            tt_requant_mmx_init(&c2, p->input2_multiplier, p->input2_shift, 0) &&
            tt_requant_mmx_init(&co, p->output_multiplier, p->output_shift, p->output_zero_point) && co.e > 0) {
            tt_add_s8_fast(&c1, &c2, &co, p->input1_zero_point, p->input2_zero_point, p->act_min, p->act_max, n, a,
                           b, y);
            return;
        }
    }
#endif
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

/* The fp16-mixed adds' result: the activation clamp, then stored in fp32 (yf) or rounded once to fp16 (yh). */
static inline void tt_add_f16_out(float v, float act_min, float act_max, float *yf, uint16_t *yh, int32_t i)
{
    v = tt_act_clamp(v, act_min, act_max);
    if (yh != 0) {
        yh[i] = tt_f16_narrow(v);
    } else {
        yf[i] = v;
    }
}

void tt_add_f16(int32_t n, float act_min, float act_max, const float *af, const uint16_t *ah, const float *bf,
                const uint16_t *bh, float *yf, uint16_t *yh)
{
    /* An fp32 result written over an fp16 operand runs from the end: y[i] covers that operand's elements 2i and
     * 2i + 1, which a forward loop would not have read yet (a narrower or equal result writes behind what it reads) */
    const int32_t back = yf != 0 && (ah != 0 || bh != 0);
    int32_t k;
    for (k = 0; k < n; ++k) {
        const int32_t i = back ? n - 1 - k : k;
        float v = (ah != 0 ? tt_f16_read(ah[i]) : af[i]) + (bh != 0 ? tt_f16_read(bh[i]) : bf[i]);
        tt_add_f16_out(v, act_min, act_max, yf, yh, i);
    }
}

/* Element k of the output (row-major over bc->shape) at its 4-D index: the operands' offsets follow from it. */
static inline void tt_bc_index(const tt_broadcast *bc, int32_t k, int32_t idx[4])
{
    idx[3] = k % bc->shape[3];
    k /= bc->shape[3];
    idx[2] = k % bc->shape[2];
    k /= bc->shape[2];
    idx[1] = k % bc->shape[1];
    idx[0] = k / bc->shape[1];
}

void tt_add_f16_broadcast(const tt_broadcast *bc, float act_min, float act_max, const float *af, const uint16_t *ah,
                          const float *bf, const uint16_t *bh, float *yf, uint16_t *yh)
{
    const int32_t n = bc->shape[0] * bc->shape[1] * bc->shape[2] * bc->shape[3];
    const int32_t back = yf != 0 && (ah != 0 || bh != 0);   /* as tt_add_f16 */
    int32_t k;
    for (k = 0; k < n; ++k) {
        const int32_t i = back ? n - 1 - k : k;
        int32_t x[4];
        int32_t ja, jb;
        float v;
        tt_bc_index(bc, i, x);
        ja = TT_BC_OFF(bc->a_stride, x[0], x[1], x[2], x[3]);
        jb = TT_BC_OFF(bc->b_stride, x[0], x[1], x[2], x[3]);
        v = (ah != 0 ? tt_f16_read(ah[ja]) : af[ja]) + (bh != 0 ? tt_f16_read(bh[jb]) : bf[jb]);
        tt_add_f16_out(v, act_min, act_max, yf, yh, i);
    }
}

void tt_unbroadcast_f16(const tt_broadcast *bc, float sign, const float *dyf, const uint16_t *dyh, float *dxf,
                        uint16_t *dxh, int32_t dx_size)
{
    const int32_t total = bc->shape[0] * bc->shape[1] * bc->shape[2] * bc->shape[3];
    if (dx_size == total) {   /* a (signed) copy: dx[i] = sign * dy[i], as tt_unbroadcast_f32 writes it */
        const int32_t back = dxf != 0 && dyh != 0;
        int32_t k;
        for (k = 0; k < total; ++k) {
            const int32_t i = back ? total - 1 - k : k;
            if (dxh != 0 && dyh != 0 && sign == 1.0f) {
                dxh[i] = dyh[i];   /* 1 * an fp16 value rounds back to its bits */
                continue;
            }
            {
                const float v = sign * (dyh != 0 ? tt_f16_read(dyh[i]) : dyf[i]);
                if (dxh != 0) {
                    dxh[i] = tt_f16_narrow(v);
                } else {
                    dxf[i] = v;
                }
            }
        }
        return;
    }
    tt_reduce_to_operand_f16(bc, sign, dyf, dyh, 0, 0, dxf, dxh, dx_size);
}

void tt_reduce_to_operand_f16(const tt_broadcast *bc, float sign, const float *dyf, const uint16_t *dyh,
                              const float *of, const uint16_t *oh, float *dxf, uint16_t *dxh, int32_t dx_size)
{
    const int32_t total = bc->shape[0] * bc->shape[1] * bc->shape[2] * bc->shape[3];
    const int32_t other = of != 0 || oh != 0;
    int32_t on[4], in[4], d, o0, o1, o2, o3, i0, i1, i2, i3;
    /* each dx element's sum in a register: its dy positions in row-major order are the broadcast axes' (inner
     * loops) under the kept axes' (outer loops), the order tt_reduce_to_operand_f32 adds them in */
    for (d = 0; d < 4; ++d) {
        const int32_t bcast = dx_size != total && bc->a_stride[d] == 0 && bc->shape[d] > 1;
        on[d] = bcast ? 1 : bc->shape[d];
        in[d] = bcast ? bc->shape[d] : 1;
    }
    for (o0 = 0; o0 < on[0]; ++o0) {
        for (o1 = 0; o1 < on[1]; ++o1) {
            for (o2 = 0; o2 < on[2]; ++o2) {
                for (o3 = 0; o3 < on[3]; ++o3) {
                    const int32_t j = TT_BC_OFF(bc->a_stride, o0, o1, o2, o3);
                    float acc = 0.0f;
                    for (i0 = 0; i0 < in[0]; ++i0) {
                        for (i1 = 0; i1 < in[1]; ++i1) {
                            for (i2 = 0; i2 < in[2]; ++i2) {
                                for (i3 = 0; i3 < in[3]; ++i3) {
                                    const int32_t k = ((((o0 + i0) * bc->shape[1] + (o1 + i1)) * bc->shape[2] +
                                                        (o2 + i2)) * bc->shape[3]) + (o3 + i3);
                                    float v = sign * (dyh != 0 ? tt_f16_read(dyh[k]) : dyf[k]);
                                    if (other) {
                                        const int32_t jb = TT_BC_OFF(bc->b_stride, o0 + i0, o1 + i1, o2 + i2,
                                                                     o3 + i3);
                                        v = v * (oh != 0 ? tt_f16_read(oh[jb]) : of[jb]);
                                    }
                                    if (dx_size == total) {   /* one term: the value itself, as the fp32 kernel's
                                                                 direct store (no +0 that would turn -0 into +0) */
                                        acc = v;
                                    } else {
                                        acc += v;
                                    }
                                }
                            }
                        }
                    }
                    if (dxh != 0) {
                        dxh[j] = tt_f16_narrow(acc);
                    } else {
                        dxf[j] = acc;
                    }
                }
            }
        }
    }
}
