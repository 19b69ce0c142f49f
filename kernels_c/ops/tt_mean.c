/* mean over H and W: int8 and float32, and mean_grad. */
#include <string.h>

#include "tt_kernels.h"
#include "tt_f16.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_f16_mve_ops.h" /* target.kernels: mve - the gradient's broadcast as vector copies, the same bits */
#endif

#ifdef TT_INTERFACE
/* MEAN over H and W of [B,H,W,C] -> [B,C]: QuantizedMeanOrSum; multiplier/shift already fold 1/count in
 * (executor._quantized_mean computes them). */
typedef struct {
    int32_t input_zero_point, output_zero_point;
    int32_t multiplier, shift;
} tt_mean_params_s8;
void tt_mean_hw_s8(const tt_mean_params_s8 *p, int32_t batches, int32_t h, int32_t w, int32_t c, const int8_t *x,
                   int8_t *y);
void tt_mean_hw_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *x, float *y);
void tt_mean_hw_grad_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, float *dx);
/* fp16-mixed (issue 13): the mean reading an fp16 x (widened where it is added: exact), and the gradient writing an
 * fp16 dx (rounded once on store): the bits of tt_cast_f16_f32 + tt_mean_hw_f32 and of tt_mean_hw_grad_f32 +
 * tt_round_f16, with no fp32 copy of the H*W-sized tensor. */
void tt_mean_hw_hx_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const uint16_t *x, float *y);
void tt_mean_hw_grad_f32_hy(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, uint16_t *dx);
/* The positions stream's tt_mean_hw_grad_positions_f32 (tt_stream.h) writing an fp16 dx, rounded once on store. */
void tt_mean_hw_grad_positions_f32_hy(int32_t positions, int32_t count, int32_t c, const float *dy, uint16_t *dx);
/* Both with dy and dx each fp32 or fp16 (the f32 / f16 pointer pair of each, the other 0): dy widened where it is
 * read (exact), dx rounded once on store: the bits of tt_cast_f16_f32 + the fp32 kernel + tt_round_f16. */
void tt_mean_hw_grad_f16(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dyf, const uint16_t *dyh,
                         float *dxf, uint16_t *dxh);
void tt_mean_hw_grad_positions_f16(int32_t positions, int32_t count, int32_t c, const float *dyf,
                                   const uint16_t *dyh, float *dxf, uint16_t *dxh);
#endif /* TT_INTERFACE */

/* reference_ops::QuantizedMeanOrSum (executor._quantized_mean): sum in int32, minus z_in * count, then the
 * multiplier that already holds 1/count, + z_out, clamped to int8 (no fused activation). */
void tt_mean_hw_s8(const tt_mean_params_s8 *p, int32_t batches, int32_t h, int32_t w, int32_t c, const int8_t *x,
                   int8_t *y)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        for (ch = 0; ch < c; ++ch) {
            int32_t total = 0, v;
            for (i = 0; i < count; ++i) {
                total += x[(b * count + i) * c + ch];
            }
            total = tt_wrap_sub32(total, (int32_t)((uint32_t)p->input_zero_point * (uint32_t)count));
            v = tt_multiply_by_quantized_multiplier(total, p->multiplier, (int)p->shift) + p->output_zero_point;
            y[b * c + ch] = (int8_t)tt_clamp32(v, -128, 127);
        }
    }
}

/* ReduceSumImpl order: a sequential float32 sum over the H*W positions, then / count (executor._mean). x is fp32
 * (xf) or fp16 (xh, widened where it is added); inlined into both entry points with the other 0. */
static inline void tt_mean_hw_any(int32_t batches, int32_t h, int32_t w, int32_t c, const float *xf,
                                  const uint16_t *xh, float *y)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        float *yb = y + b * c;
        for (ch = 0; ch < c; ++ch) {
            yb[ch] = 0.0f;
        }
        for (i = 0; i < count; ++i) {
            const int32_t at = (b * count + i) * c;
            for (ch = 0; ch < c; ++ch) {
                yb[ch] += xh != 0 ? tt_f16_read(xh[at + ch]) : xf[at + ch];
            }
        }
        for (ch = 0; ch < c; ++ch) {
            yb[ch] = yb[ch] / (float)count;
        }
    }
}

void tt_mean_hw_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *x, float *y)
{
    tt_mean_hw_any(batches, h, w, c, x, 0, y);
}

void tt_mean_hw_hx_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const uint16_t *x, float *y)
{
    tt_mean_hw_any(batches, h, w, c, 0, x, y);
}

/* dx[b, i, ch] = dy[b, ch] / count at every position i, dy and dx each fp32 or fp16 (dy widened where it is read,
 * dx rounded once as it is stored). The quotient is the same at every position: it is computed once per channel, by
 * the portable expression, into the first position, and the other positions are copies of its bits (the bits of a
 * division, and of a rounding, per element). */
static inline __attribute__((always_inline)) void tt_mean_hw_grad_any(int32_t batches, int32_t h, int32_t w,
                                                                      int32_t c, const float *dyf,
                                                                      const uint16_t *dyh, float *dxf,
                                                                      uint16_t *dxh)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches && count > 0; ++b) {
        const int32_t at = b * count * c;
        for (ch = 0; ch < c; ++ch) {
            const float v = (dyh != 0 ? tt_f16_read(dyh[b * c + ch]) : dyf[b * c + ch]) / (float)count;
            if (dxh != 0) {
                dxh[at + ch] = tt_f16_narrow(v);
            } else {
                dxf[at + ch] = v;
            }
        }
        for (i = 1; i < count; ++i) {
            if (dxh != 0) {
                memcpy(dxh + at + i * c, dxh + at, (size_t)c * sizeof(uint16_t));
            } else {
                memcpy(dxf + at + i * c, dxf + at, (size_t)c * sizeof(float));
            }
        }
    }
}

void tt_mean_hw_grad_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, float *dx)
{
    tt_mean_hw_grad_any(batches, h, w, c, dy, 0, dx, 0);
}

void tt_mean_hw_grad_f32_hy(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, uint16_t *dx)
{
#ifdef TT_F16_MVE_OPS
    tt_mean_hw_grad_hy_mve(batches, h, w, c, dy, dx);
#else
    tt_mean_hw_grad_any(batches, h, w, c, dy, 0, 0, dx);
#endif
}

void tt_mean_hw_grad_f16(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dyf, const uint16_t *dyh,
                         float *dxf, uint16_t *dxh)
{
    if (dyh == 0) {
        if (dxh != 0) {
            tt_mean_hw_grad_f32_hy(batches, h, w, c, dyf, dxh);
        } else {
            tt_mean_hw_grad_any(batches, h, w, c, dyf, 0, dxf, 0);
        }
    } else if (dxh != 0) {
        tt_mean_hw_grad_any(batches, h, w, c, 0, dyh, 0, dxh);
    } else {
        tt_mean_hw_grad_any(batches, h, w, c, 0, dyh, dxf, 0);
    }
}

/* The positions stream's gradient (tt_mean_hw_grad_positions_f32's, whose power-of-two count multiplies by the
 * exact 1 / count: the same bits as the division), dy fp32 or fp16, dx fp32 or fp16: the quotients once, into the
 * first position, the other positions copies. */
void tt_mean_hw_grad_positions_f16(int32_t positions, int32_t count, int32_t c, const float *dyf,
                                   const uint16_t *dyh, float *dxf, uint16_t *dxh)
{
    const float n = (float)count, r = 1.0f / n;
    const int pow2 = count > 0 && (count & (count - 1)) == 0 && count <= (1 << 24);
    int32_t i, ch;
    if (positions <= 0) {
        return;
    }
    for (ch = 0; ch < c; ++ch) {
        const float d = dyh != 0 ? tt_f16_read(dyh[ch]) : dyf[ch];
        const float v = pow2 ? d * r : d / n;
        if (dxh != 0) {
            dxh[ch] = tt_f16_narrow(v);
        } else {
            dxf[ch] = v;
        }
    }
    for (i = 1; i < positions; ++i) {
        if (dxh != 0) {
            memcpy(dxh + i * c, dxh, (size_t)c * sizeof(uint16_t));
        } else {
            memcpy(dxf + i * c, dxf, (size_t)c * sizeof(float));
        }
    }
}

void tt_mean_hw_grad_positions_f32_hy(int32_t positions, int32_t count, int32_t c, const float *dy, uint16_t *dx)
{
    tt_mean_hw_grad_positions_f16(positions, count, c, dy, 0, 0, dx);
}
