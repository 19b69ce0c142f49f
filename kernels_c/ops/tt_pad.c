/* pad: int8, float32 and fp16-mixed, and pad_grad (float32 and fp16-mixed). */
#include "tt_kernels.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* PAD of a rank-4 tensor (lower ranks: leading 1s). pads[2*d], pads[2*d+1] = before, after of dim d. */
void tt_pad_s8(const int32_t in_shape[4], const int32_t pads[8], int8_t value, const int8_t *x, int8_t *y);
void tt_pad_f32(const int32_t in_shape[4], const int32_t pads[8], float value, const float *x, float *y);
/* in_shape is the forward input's (dx's) shape; dy has the padded shape. */
void tt_pad_grad_f32(const int32_t in_shape[4], const int32_t pads[8], const float *dy, float *dx);
/* fp16-mixed (OpDef.fp16_operands / fp16_output): tt_pad_f32 and tt_pad_grad_f32 with each operand fp32 (the f
 * pointer) or fp16 (the h pointer; the other 0): an element is widened (exact) and, into an fp16 result, rounded once
 * (fp16 -> fp16 copies its bits: widening and rounding back is the identity), so the bits are the fp32 kernel's
 * followed by tt_round_f16. The result never shares the operand's buffer. */
void tt_pad_f16(const int32_t in_shape[4], const int32_t pads[8], float value, const float *xf, const uint16_t *xh,
                float *yf, uint16_t *yh);
void tt_pad_grad_f16(const int32_t in_shape[4], const int32_t pads[8], const float *dyf, const uint16_t *dyh,
                     float *dxf, uint16_t *dxh);
#endif /* TT_INTERFACE */

/* Rank-4 PAD; quantized PAD pads with the output zero point, float with 0.0 (the caller passes `value`). */
#define TT_PAD_BODY                                                                                                \
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];                                                           \
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];                                                           \
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];                                                           \
    const int32_t o0 = in_shape[0] + pads[0] + pads[1];                                                           \
    int32_t i0, i1, i2, i3;                                                                                        \
    for (i0 = 0; i0 < o0; ++i0) {                                                                                  \
        const int32_t s0 = i0 - pads[0];                                                                           \
        for (i1 = 0; i1 < o1; ++i1) {                                                                              \
            const int32_t s1 = i1 - pads[2];                                                                       \
            for (i2 = 0; i2 < o2; ++i2) {                                                                          \
                const int32_t s2 = i2 - pads[4];                                                                   \
                const int32_t row_in = s0 >= 0 && s0 < in_shape[0] && s1 >= 0 && s1 < in_shape[1] && s2 >= 0 &&    \
                                       s2 < in_shape[2];                                                           \
                for (i3 = 0; i3 < o3; ++i3) {                                                                      \
                    const int32_t s3 = i3 - pads[6];                                                               \
                    const int32_t o = ((i0 * o1 + i1) * o2 + i2) * o3 + i3;                                        \
                    if (row_in && s3 >= 0 && s3 < in_shape[3]) {                                                   \
                        y[o] = x[((s0 * in_shape[1] + s1) * in_shape[2] + s2) * in_shape[3] + s3];                 \
                    } else {                                                                                       \
                        y[o] = value;                                                                              \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

void tt_pad_s8(const int32_t in_shape[4], const int32_t pads[8], int8_t value, const int8_t *x, int8_t *y)
{
    TT_PAD_BODY
}

void tt_pad_f32(const int32_t in_shape[4], const int32_t pads[8], float value, const float *x, float *y)
{
    TT_PAD_BODY
}

#undef TT_PAD_BODY

void tt_pad_grad_f32(const int32_t in_shape[4], const int32_t pads[8], const float *dy, float *dx)
{
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < in_shape[0]; ++i0) {
        for (i1 = 0; i1 < in_shape[1]; ++i1) {
            for (i2 = 0; i2 < in_shape[2]; ++i2) {
                const float *src = dy + (((i0 + pads[0]) * o1 + i1 + pads[2]) * o2 + i2 + pads[4]) * o3 + pads[6];
                float *dst = dx + ((i0 * in_shape[1] + i1) * in_shape[2] + i2) * in_shape[3];
                for (i3 = 0; i3 < in_shape[3]; ++i3) {
                    dst[i3] = src[i3];
                }
            }
        }
    }
}

/* One element of an fp16-mixed copy: src[i] (fp32 or fp16) into dst[o] (fp32 or fp16). Inlined with each pair's
 * other pointer constant null, so every form below has its own loop without per-element tests. */
static inline __attribute__((always_inline)) void tt__pad_move(const float *sf, const uint16_t *sh, int32_t i,
                                                               float *df, uint16_t *dh, int32_t o)
{
    if (dh != 0) {
        dh[o] = sh != 0 ? sh[i] : tt_f16_narrow(sf[i]);
    } else {
        df[o] = sh != 0 ? tt_f16_read(sh[i]) : sf[i];
    }
}

static inline __attribute__((always_inline)) void tt__pad_walk(const int32_t in_shape[4], const int32_t pads[8],
                                                               float value, const float *xf, const uint16_t *xh,
                                                               float *yf, uint16_t *yh)
{
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];
    const int32_t o0 = in_shape[0] + pads[0] + pads[1];
    const uint16_t hv = tt_f16_narrow(value);
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < o0; ++i0) {
        const int32_t s0 = i0 - pads[0];
        for (i1 = 0; i1 < o1; ++i1) {
            const int32_t s1 = i1 - pads[2];
            for (i2 = 0; i2 < o2; ++i2) {
                const int32_t s2 = i2 - pads[4];
                const int32_t row_in = s0 >= 0 && s0 < in_shape[0] && s1 >= 0 && s1 < in_shape[1] && s2 >= 0 &&
                                       s2 < in_shape[2];
                for (i3 = 0; i3 < o3; ++i3) {
                    const int32_t s3 = i3 - pads[6];
                    const int32_t o = ((i0 * o1 + i1) * o2 + i2) * o3 + i3;
                    if (row_in && s3 >= 0 && s3 < in_shape[3]) {
                        tt__pad_move(xf, xh, ((s0 * in_shape[1] + s1) * in_shape[2] + s2) * in_shape[3] + s3, yf,
                                     yh, o);
                    } else if (yh != 0) {
                        yh[o] = hv;
                    } else {
                        yf[o] = value;
                    }
                }
            }
        }
    }
}

void tt_pad_f16(const int32_t in_shape[4], const int32_t pads[8], float value, const float *xf, const uint16_t *xh,
                float *yf, uint16_t *yh)
{
    if (xh != 0 && yh != 0) {
        tt__pad_walk(in_shape, pads, value, 0, xh, 0, yh);
    } else if (yh != 0) {
        tt__pad_walk(in_shape, pads, value, xf, 0, 0, yh);
    } else if (xh != 0) {
        tt__pad_walk(in_shape, pads, value, 0, xh, yf, 0);
    } else {
        tt_pad_f32(in_shape, pads, value, xf, yf);
    }
}

static inline __attribute__((always_inline)) void tt__pad_grad_walk(const int32_t in_shape[4], const int32_t pads[8],
                                                                    const float *dyf, const uint16_t *dyh,
                                                                    float *dxf, uint16_t *dxh)
{
    const int32_t o1 = in_shape[1] + pads[2] + pads[3];
    const int32_t o2 = in_shape[2] + pads[4] + pads[5];
    const int32_t o3 = in_shape[3] + pads[6] + pads[7];
    int32_t i0, i1, i2, i3;
    for (i0 = 0; i0 < in_shape[0]; ++i0) {
        for (i1 = 0; i1 < in_shape[1]; ++i1) {
            for (i2 = 0; i2 < in_shape[2]; ++i2) {
                const int32_t src = (((i0 + pads[0]) * o1 + i1 + pads[2]) * o2 + i2 + pads[4]) * o3 + pads[6];
                const int32_t dst = ((i0 * in_shape[1] + i1) * in_shape[2] + i2) * in_shape[3];
                for (i3 = 0; i3 < in_shape[3]; ++i3) {
                    tt__pad_move(dyf, dyh, src + i3, dxf, dxh, dst + i3);
                }
            }
        }
    }
}

void tt_pad_grad_f16(const int32_t in_shape[4], const int32_t pads[8], const float *dyf, const uint16_t *dyh,
                     float *dxf, uint16_t *dxh)
{
    if (dyh != 0 && dxh != 0) {
        tt__pad_grad_walk(in_shape, pads, 0, dyh, 0, dxh);
    } else if (dxh != 0) {
        tt__pad_grad_walk(in_shape, pads, dyf, 0, 0, dxh);
    } else if (dyh != 0) {
        tt__pad_grad_walk(in_shape, pads, 0, dyh, dxf, 0);
    } else {
        tt_pad_grad_f32(in_shape, pads, dyf, dxf);
    }
}
