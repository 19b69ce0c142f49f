/* Forward fully_connected, int8 (per-tensor or per-channel) and float32.
 *
 * int8: reference_integer_ops::FullyConnected with the fixed-point requantization (TFLite Micro's kernel; the
 * executor's default fc_requant="fixed_point"). float32: acc = 0, += x[d] * w[o, d] over d in order, + bias,
 * clamp (executor._fully_connected).
 *
 * Backward (grad_ops.fully_connected_grad_*): fully_connected_grad_input (float and int8 weight) and
 * fully_connected_grad_weight (whole and by output rows). */
#include "tt_kernels.h"
#include "tt_dot.h"
#include "tt_f16.h"
/* The fp16 weight gradients run Helium's fp32 vectors under `target.kernels: mve` (tt_fvec_gw.c: the same bits; 0
 * when an fp32 operand fails its check, and the portable loop runs). */
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_gw.h"
#define TT_FVEC_GW 1
#else
#define TT_FVEC_GW 0
#endif

#ifdef TT_INTERFACE
/* x viewed as [rows, depth], w [out_c, depth], y [rows, out_c] (fixed-point requantization, TFLM's path). */
void tt_fully_connected_s8(int32_t rows, int32_t depth, int32_t out_c, const tt_requant_s8 *q, const int8_t *x,
                           const int8_t *w, const int32_t *bias, int8_t *y);
void tt_fully_connected_f32(int32_t rows, int32_t depth, int32_t out_c, float act_min, float act_max,
                            const float *x, const float *w, const float *bias, float *y);
void tt_fully_connected_grad_input_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy, const float *w,
                                       float *dx);
/* The input gradient reading the int8 weight, dequantized where it is read (as tt_conv2d_grad_input_qw_f32:
 * bits of the dequantized weight's float kernel, no fp32 copy of the weight). */
void tt_fully_connected_grad_input_qw_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy,
                                          const int8_t *w, const float *scale, const int32_t *zero_point, float *dx);
/* dw [out_c, k]. */
void tt_fully_connected_grad_weight_f32(int32_t rows, int32_t depth, int32_t out_c, int32_t k, const float *dy,
                                        const float *x, float *dw);
/* Rows [o0, o1) only: dw [o1-o0, k] (dw points at row o0); bits of the whole call. */
void tt_fully_connected_grad_weight_f32_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                              int32_t o1, const float *dy, const float *x, float *dw);
/* The same reading an fp16 x (fp16-mixed's saved activation itself: no fp32 copy of it is made). */
void tt_fully_connected_grad_weight_hx_f32_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                                 int32_t o1, const float *dy, const uint16_t *x, float *dw);
/* fp16-mixed (issue 13): the input gradient with dy and / or dx fp16 (the f32 / f16 pointer pair of each, the other
 * 0): dy widened where it is read, dx rounded once as it is stored; the bits of tt_fully_connected_grad_input_f32
 * between tt_cast_f16_f32 and tt_round_f16. The weight gradient reading an fp16 dy (x fp32 or fp16, the other 0):
 * tt_fully_connected_grad_weight_f32_range's sums. */
void tt_fully_connected_grad_input_f16(int32_t rows, int32_t depth, int32_t out_c, const float *dyf,
                                       const uint16_t *dyh, const float *w, float *dxf, uint16_t *dxh);
void tt_fully_connected_grad_weight_hdy_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                              int32_t o1, const uint16_t *dy, const float *xf, const uint16_t *xh,
                                              float *dw);
#endif /* TT_INTERFACE */

void tt_fully_connected_s8(int32_t rows, int32_t depth, int32_t out_c, const tt_requant_s8 *q, const int8_t *x,
                           const int8_t *w, const int32_t *bias, int8_t *y)
{
    int32_t r, o;
    const int32_t zin = q->input_zero_point;
    for (r = 0; r < rows; ++r) {
        const int8_t *xr = x + r * depth;
        for (o = 0; o < out_c; ++o) {
            const int8_t *wr = w + o * depth;
            const int32_t i = q->per_channel ? o : 0;
            int32_t acc = tt_dot_s8(xr, wr, depth, zin);
            int32_t v;
            if (bias != 0) {
                acc += bias[o];
            }
            v = tt_multiply_by_quantized_multiplier(acc, q->multiplier[i], (int)q->shift[i]) + q->output_zero_point;
            y[r * out_c + o] = (int8_t)tt_clamp32(v, q->act_min, q->act_max);
        }
    }
}

void tt_fully_connected_f32(int32_t rows, int32_t depth, int32_t out_c, float act_min, float act_max,
                            const float *x, const float *w, const float *bias, float *y)
{
    int32_t r, o, k;
    for (r = 0; r < rows; ++r) {
        const float *xr = x + r * depth;
        for (o = 0; o < out_c; ++o) {
            const float *wr = w + o * depth;
            float acc = 0.0f;
            for (k = 0; k < depth; ++k) {
                acc += xr[k] * wr[k];
            }
            if (bias != 0) {
                acc += bias[o];
            }
            if (acc < act_min) {
                acc = act_min;
            }
            if (acc > act_max) {
                acc = act_max;
            }
            y[r * out_c + o] = acc;
        }
    }
}

void tt_fully_connected_grad_input_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy, const float *w,
                                       float *dx)
{
    int32_t r, d, o;
    for (r = 0; r < rows; ++r) {
        for (d = 0; d < depth; ++d) {
            float s = 0.0f;
            for (o = 0; o < out_c; ++o) {
                s += dy[r * out_c + o] * w[o * depth + d];
            }
            dx[r * depth + d] = s;
        }
    }
}

/* tt_fully_connected_grad_input_f32 on an int8 weight dequantized per element (tt_kernels.h): each dx[r, d] is
 * 0 + the products over o in order, which is the 1x1 conv input gradient of `rows` pixels (ops/tt_conv2d.c: its
 * blocked, zero-skipping loops keep that order). */
void tt_fully_connected_grad_input_qw_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy,
                                          const int8_t *w, const float *scale, const int32_t *zero_point, float *dx)
{
    tt_conv2d_grad_input_qw_f32_oc(rows, depth, 0, out_c, dy, 0, w, 0, 0, scale, zero_point, dx);
}

/* dw [out_c, k] = dy^T x[:, :k]. */
void tt_fully_connected_grad_weight_f32(int32_t rows, int32_t depth, int32_t out_c, int32_t k, const float *dy,
                                        const float *x, float *dw)
{
    tt_fully_connected_grad_weight_f32_range(rows, depth, out_c, k, 0, out_c, dy, x, dw);
}

/* Rows [o0, o1) of dw (each its own sums: any split gives the bits of the whole call); dw points at row o0.
 * Each element is ((0 + p_0) + p_1) + ... in r order; the loop over d is innermost so that it vectorises (the
 * common case is one row: dw = dy[o] * x). dy and x are each fp32 (dyf, xf) or fp16 (dyh, xh, widened where they
 * are used: exact, so the bits of the fp32 kernel on their fp32 copies); dy[r, o] is widened once per row. */
static void tt_fc_grad_weight_impl(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0, int32_t o1,
                                   const float *dyf, const uint16_t *dyh, const float *xf, const uint16_t *xh,
                                   float *dw)
{
    int32_t r, d, o;
    for (o = o0; o < o1; ++o) {
        float *row = dw + (o - o0) * k;
        for (d = 0; d < k; ++d) {
            row[d] = 0.0f;
        }
        for (r = 0; r < rows; ++r) {
            const float a = dyh != 0 ? tt_f16_read(dyh[r * out_c + o]) : dyf[r * out_c + o];
            if (xh != 0) {
                const uint16_t *xr = xh + r * depth;
                for (d = 0; d < k; ++d) {
                    row[d] += a * tt_f16_read(xr[d]);
                }
            } else {
                const float *xr = xf + r * depth;
                for (d = 0; d < k; ++d) {
                    row[d] += a * xr[d];
                }
            }
        }
    }
}

void tt_fully_connected_grad_weight_f32_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                              int32_t o1, const float *dy, const float *x, float *dw)
{
    tt_fc_grad_weight_impl(rows, depth, out_c, k, o0, o1, dy, 0, x, 0, dw);
}

void tt_fully_connected_grad_weight_hx_f32_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                                 int32_t o1, const float *dy, const uint16_t *x, float *dw)
{
#if TT_FVEC_GW
    if (tt_fvec_gw_fc(rows, depth, out_c, k, o0, o1, dy, 0, 0, x, dw)) {
        return;
    }
#endif
    tt_fc_grad_weight_impl(rows, depth, out_c, k, o0, o1, dy, 0, 0, x, dw);
}

/* ---- fp16-mixed (issue 13) -------------------------------------------------------------------------------- */

void tt_fully_connected_grad_input_f16(int32_t rows, int32_t depth, int32_t out_c, const float *dyf,
                                       const uint16_t *dyh, const float *w, float *dxf, uint16_t *dxh)
{
    int32_t r, d, o;
    for (r = 0; r < rows; ++r) {
        for (d = 0; d < depth; ++d) {
            float s = 0.0f;
            if (dyh != 0) {
                for (o = 0; o < out_c; ++o) {
                    s += tt_f16_read(dyh[r * out_c + o]) * w[o * depth + d];
                }
            } else {
                for (o = 0; o < out_c; ++o) {
                    s += dyf[r * out_c + o] * w[o * depth + d];
                }
            }
            if (dxh != 0) {
                dxh[r * depth + d] = tt_f16_narrow(s);
            } else {
                dxf[r * depth + d] = s;
            }
        }
    }
}

/* tt_fc_grad_weight_impl with an fp16 dy. */
void tt_fully_connected_grad_weight_hdy_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                              int32_t o1, const uint16_t *dy, const float *xf, const uint16_t *xh,
                                              float *dw)
{
#if TT_FVEC_GW
    if (tt_fvec_gw_fc(rows, depth, out_c, k, o0, o1, 0, dy, xf, xh, dw)) {
        return;
    }
#endif
    tt_fc_grad_weight_impl(rows, depth, out_c, k, o0, o1, 0, dy, xf, xh, dw);
}
