/* mean over H and W: int8 and float32, and mean_grad. */
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

/* dx = dy / count at every position; dx fp32 (dxf) or fp16 (dxh: that quotient rounded once on store). */
static inline void tt_mean_hw_grad_any(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy,
                                       float *dxf, uint16_t *dxh)
{
    int32_t b, i, ch;
    const int32_t count = h * w;
    for (b = 0; b < batches; ++b) {
        for (i = 0; i < count; ++i) {
            for (ch = 0; ch < c; ++ch) {
                const float v = dy[b * c + ch] / (float)count;
                if (dxh != 0) {
                    dxh[(b * count + i) * c + ch] = tt_f16_narrow(v);
                } else {
                    dxf[(b * count + i) * c + ch] = v;
                }
            }
        }
    }
}

void tt_mean_hw_grad_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, float *dx)
{
    tt_mean_hw_grad_any(batches, h, w, c, dy, dx, 0);
}

void tt_mean_hw_grad_f32_hy(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, uint16_t *dx)
{
#ifdef TT_F16_MVE_OPS
    tt_mean_hw_grad_hy_mve(batches, h, w, c, dy, dx);
#else
    tt_mean_hw_grad_any(batches, h, w, c, dy, 0, dx);
#endif
}

void tt_mean_hw_grad_positions_f32_hy(int32_t positions, int32_t count, int32_t c, const float *dy, uint16_t *dx)
{
    int32_t i, ch;
    for (i = 0; i < positions; ++i) {
        for (ch = 0; ch < c; ++ch) {
            dx[i * c + ch] = tt_f16_narrow(dy[ch] / (float)count);
        }
    }
}
