/* tinytrain kernel library: portable C99 kernels for on-device training (DESIGN §6, §7).
 *
 * Layout (kernels_c/README.md): the kernels of IR op <op> (int8, float32 and its backward) are in ops/tt_<op>.c;
 * shared inner loops in the headers of kernels_c/; support code that is no op (losses, optimizers, QAS) in the
 * .c files of kernels_c/. The prototypes of every op file are declared here.
 *
 * Conventions (TFLite Micro / CMSIS-NN style):
 *  - Layout NHWC. Weights as in the IR: conv [O,KH,KW,I], depthwise [1,KH,KW,C*M], fully connected [O,I].
 *  - No malloc, no static or hidden state: every buffer (inputs, outputs, optimizer state, PRNG state) is passed
 *    in. Sizes and quantization parameters travel in small structs that codegen emits as `static const`.
 *  - int8 forward is bit-identical to the numpy golden model (stages/golden/forward.py + stages/golden/int8_arith.py), i.e. to
 *    TFLite's reference kernels with double rounding. Zero points are passed as zero points (not negated
 *    "offsets"); weights are symmetric (zero point 0, TFLite int8 spec).
 *  - float32 kernels accumulate in the executor's / reference kernels' loop order (no FMA: build with
 *    -ffp-contract=off), so host and target agree bit for bit and the numpy model to ~1 ulp.
 *  - Backward kernels and optimizer updates mirror stages/golden/grad_ops.py; "k" / "n" is the number of leading input
 *    channels trained (sparse update, DESIGN §6): gradients of a partial slice are stored compact.
 *  - Activation buffers may hold a batch of `batches` samples; nothing depends on the batch size.
 *  - Build with -DTT_USE_DSP=1 on Cortex-M4/M7 to run the int8 conv / fully-connected inner products through ACLE
 *    SIMD (tt_dot.h); the results are identical to the portable C (tested on the host with emulated intrinsics).
 *
 * All parameter values that the numpy side computes in double (QuantizeMultiplier, activation ranges, softmax
 * input multiplier, mean multipliers, optimizer constants) are computed by the code generator in Python with
 * stages/golden/int8_arith.py and passed in: the kernels only do the integer / float32 work.
 */
#ifndef TT_KERNELS_H
#define TT_KERNELS_H

#include <stdint.h>

#include "tt_fixedpoint.h"
#include "tt_mask.h"
#include "tt_stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- geometry -------------------------------------------------------------------------------------------- */

/* Convolution / depthwise geometry. pad_top/pad_left are the "before" paddings of TFLite's
 * ComputePaddingWithOffset (total // 2); the odd extra SAME pixel lies after and is skipped like any
 * out-of-image tap. */
typedef struct {
    int32_t batches;
    int32_t in_h, in_w, in_c;
    int32_t out_h, out_w, out_c;
    int32_t k_h, k_w;
    int32_t stride_h, stride_w;
    int32_t dilation_h, dilation_w;
    int32_t pad_top, pad_left;
    int32_t depth_multiplier; /* depthwise only: out_c == in_c * depth_multiplier; ignored by conv2d */
} tt_conv_dims;

/* Pooling geometry (no dilation); channels are unchanged. */
typedef struct {
    int32_t batches;
    int32_t in_h, in_w, channels;
    int32_t out_h, out_w;
    int32_t filter_h, filter_w;
    int32_t stride_h, stride_w;
    int32_t pad_top, pad_left;
} tt_pool_dims;

/* ComputeOutSize + ComputePaddingWithOffset (kernels/padding.h). same != 0 for SAME, 0 for VALID. */
void tt_out_size_and_pad(int32_t same, int32_t in_size, int32_t filter, int32_t stride, int32_t dilation,
                         int32_t *out_size, int32_t *pad_before);

/* Fused / standalone activation kinds (for clamps in float and for the backward masks). */
typedef enum { TT_ACT_NONE = 0, TT_ACT_RELU = 1, TT_ACT_RELU6 = 2, TT_ACT_RELU_N1_TO_1 = 3 } tt_act;

/* ---- int8 forward ---------------------------------------------------------------------------------------- */

/* Requantization of conv / depthwise / fully connected (PopulateConvolutionQuantizationParams):
 * multiplier[c], shift[c] = QuantizeMultiplier(double(s_x) * double(s_w[c]) / double(s_y)); with
 * per_channel == 0 entry 0 serves every channel. act_min/act_max = CalculateActivationRangeQuantized. */
typedef struct {
    int32_t input_zero_point;
    int32_t output_zero_point;
    int32_t act_min, act_max;
    const int32_t *multiplier;
    const int32_t *shift;
    int32_t per_channel;
} tt_requant_s8;

/* y[B,OH,OW,O] = requant(sum (x - z_x) * w + bias). bias may be NULL. int32 accumulation (never overflows for
 * depth < 2^16 taps; the numpy model wraps the same way). */
void tt_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                  const int32_t *bias, int8_t *y);
/* conv2d with a split weight (sparse update, DESIGN §6): input channels [0, n) of every filter row come from the
 * compact trained slice w_slice [O,KH,KW,n] (SRAM), channels [n, in_c) from the whole frozen weight w [O,KH,KW,in_c]
 * (flash; its first n channels are stale and never read). Same result as tt_conv2d_s8 on the merged weight. */
void tt_conv2d_s8_split(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                        const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y);
/* Output channel ic*M + m reads input channel ic. */
void tt_depthwise_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                            const int32_t *bias, int8_t *y);
/* x viewed as [rows, depth], w [out_c, depth], y [rows, out_c] (fixed-point requantization, TFLM's path). */
void tt_fully_connected_s8(int32_t rows, int32_t depth, int32_t out_c, const tt_requant_s8 *q, const int8_t *x,
                           const int8_t *w, const int32_t *bias, int8_t *y);

/* add.cc 8-bit general path (left_shift 20); the shifts are the <= 0 exponents of
 * QuantizeMultiplierSmallerThanOneExp. */
typedef struct {
    int32_t input1_zero_point, input2_zero_point, output_zero_point;
    int32_t left_shift;
    int32_t input1_multiplier, input1_shift;
    int32_t input2_multiplier, input2_shift;
    int32_t output_multiplier, output_shift;
    int32_t act_min, act_max;
} tt_add_params_s8;
/* Element-wise, equal shapes (n elements). */
void tt_add_s8(const tt_add_params_s8 *p, int32_t n, const int8_t *a, const int8_t *b, int8_t *y);

/* reference_integer_ops::AveragePool: sum of in-image taps / their count, rounded half away from zero. */
void tt_average_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);
void tt_max_pool2d_s8(const tt_pool_dims *d, int32_t act_min, int32_t act_max, const int8_t *x, int8_t *y);

/* MEAN over H and W of [B,H,W,C] -> [B,C]: QuantizedMeanOrSum; multiplier/shift already fold 1/count in
 * (executor._quantized_mean computes them). */
typedef struct {
    int32_t input_zero_point, output_zero_point;
    int32_t multiplier, shift;
} tt_mean_params_s8;
void tt_mean_hw_s8(const tt_mean_params_s8 *p, int32_t batches, int32_t h, int32_t w, int32_t c, const int8_t *x,
                   int8_t *y);

/* reference_ops::Softmax<int8, int8> over the last axis; output scale 1/256, zero point -128. The parameters are
 * int8_arith.softmax_params(beta, s_x). */
void tt_softmax_s8(int32_t rows, int32_t depth, int32_t input_multiplier, int32_t input_left_shift,
                   int32_t diff_min, const int8_t *x, int8_t *y);

/* Standalone RELU / RELU6 (activations.cc QuantizedReluX): requantize from the input's to the output's params
 * (multiplier/shift = QuantizeMultiplier(s_x / s_y)) and clamp to [qlo, qhi] (int8_arith.relu_op_range). */
void tt_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier, int32_t shift,
                int32_t qlo, int32_t qhi, const int8_t *x, int8_t *y);

/* QUANTIZE float -> int8: AffineQuantize, roundf(x / scale) (float32 division, ties away) + zp, clamped. */
void tt_quantize_f32_s8(int32_t n, float scale, int32_t zero_point, const float *x, int8_t *y);
/* QUANTIZE int8 -> int8: MultiplyByQuantizedMultiplier(x - z_in, QuantizeMultiplier(s_in / s_out)) + z_out. */
void tt_requantize_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier,
                      int32_t shift, const int8_t *x, int8_t *y);
/* DEQUANTIZE: (float)((double)scale * (x - zp)), per tensor. */
void tt_dequantize_s8_f32(int32_t n, float scale, int32_t zero_point, const int8_t *x, float *y);
/* Per channel along an axis: x viewed as [outer, channels, inner]. */
void tt_dequantize_per_channel_s8_f32(int32_t outer, int32_t channels, int32_t inner, const float *scale,
                                      const int32_t *zero_point, const int8_t *x, float *y);

/* ---- broadcasting element-wise ops, more activations, strided slice (ops/tt_add.c ... ops/tt_strided_slice.c) */

/* numpy broadcasting of a binary op on a rank-4 view (lower ranks: leading 1s, aligned to the right as numpy
 * does): the output's shape and, per operand, the element stride of each axis (0 where the operand has extent 1
 * and is broadcast). Codegen computes it. The output is written contiguously in row-major order. */
typedef struct {
    int32_t shape[4];
    int32_t a_stride[4];
    int32_t b_stride[4];
} tt_broadcast;

/* ADD with broadcasting (equal shapes: tt_add_s8) and SUB (sub.cc: ADD's general path with the rescaled second
 * operand subtracted; PrepareGeneralSubOp computes the same parameters as add.cc). */
void tt_add_s8_broadcast(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b,
                         int8_t *y);
void tt_sub_s8(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y);

/* MUL: y = z_y + MultiplyByQuantizedMultiplier((a - z_a)(b - z_b), QuantizeMultiplier(s_a * s_b / s_y)), the
 * ratio in double of the float32 scales (TFLite Micro's CalculateOpDataMul), clamped to the fused act's range. */
typedef struct {
    int32_t input1_zero_point, input2_zero_point, output_zero_point;
    int32_t multiplier, shift;
    int32_t act_min, act_max;
} tt_mul_params_s8;
void tt_mul_s8(const tt_mul_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y);

/* int8 LOGISTIC (output (1/256, -128)) and TANH (output (1/128, 0)): TFLite Micro's reference_integer_ops, gemmlowp
 * fixed point. multiplier / left_shift / radius = int8_arith.logistic_tanh_params(s_in); |x - z_in| >= radius
 * saturates. */
void tt_logistic_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                    const int8_t *x, int8_t *y);
void tt_tanh_s8(int32_t n, int32_t input_zero_point, int32_t multiplier, int32_t left_shift, int32_t radius,
                const int8_t *x, int8_t *y);

/* int8 HARD_SWISH: reference_ops::HardSwish<int8_t>, 16-bit fixed point; the Q0.15 multipliers and exponents are
 * int8_arith.hard_swish_params(s_in, s_out). */
typedef struct {
    int32_t input_zero_point, output_zero_point;
    int32_t output_multiplier_fixedpoint_int16, output_multiplier_exponent;
    int32_t reluish_multiplier_fixedpoint_int16, reluish_multiplier_exponent;
} tt_hard_swish_params_s8;
void tt_hard_swish_s8(const tt_hard_swish_params_s8 *p, int32_t n, const int8_t *x, int8_t *y);

/* int8 LEAKY_RELU: x - z_in >= 0 requantized by QuantizeMultiplier(f32(s_in / s_out)), below by
 * QuantizeMultiplier(f32(f32(s_in * alpha) / s_out)) (LeakyReluPrepare's float ratios), + z_out, int8 range. */
void tt_leaky_relu_s8(int32_t n, int32_t input_zero_point, int32_t output_zero_point, int32_t multiplier_identity,
                      int32_t shift_identity, int32_t multiplier_alpha, int32_t shift_alpha, const int8_t *x,
                      int8_t *y);

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

/* STRIDED_SLICE on a rank-4 view: output element (i0..i3) reads input index start[d] + i_d * stride[d] per axis
 * (stride may be negative); out_shape holds the extents (a shrunk axis: 1). int8 keeps the input's parameters. */
typedef struct {
    int32_t in_shape[4];
    int32_t out_shape[4];
    int32_t start[4];
    int32_t stride[4];
} tt_strided_slice_params;
void tt_strided_slice_s8(const tt_strided_slice_params *p, const int8_t *x, int8_t *y);
void tt_strided_slice_f32(const tt_strided_slice_params *p, const float *x, float *y);

/* float32 (executor's float kernels; transcendental functions from tt_math.h, so host and target agree). */
void tt_add_f32_broadcast(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b,
                          float *y);
void tt_sub_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y);
void tt_mul_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y);
/* 1 above 16.619047, exp(x) below -9, else 1 / (1 + exp(-x)) (reference_ops::Logistic). */
void tt_logistic_f32(int32_t n, const float *x, float *y);
void tt_tanh_f32(int32_t n, const float *x, float *y);
/* x * min(6, max(0, x + 3)) / 6. */
void tt_hard_swish_f32(int32_t n, const float *x, float *y);
/* x > 0 ? x : x * alpha. */
void tt_leaky_relu_f32(int32_t n, float alpha, const float *x, float *y);
/* x >= 0 ? x : x * alpha (alpha broadcast, operand b of bc). */
void tt_prelu_f32(const tt_broadcast *bc, const float *x, const float *alpha, float *y);

/* ---- data movement (int8 and float32) -------------------------------------------------------------------- */

/* PAD of a rank-4 tensor (lower ranks: leading 1s). pads[2*d], pads[2*d+1] = before, after of dim d. */
void tt_pad_s8(const int32_t in_shape[4], const int32_t pads[8], int8_t value, const int8_t *x, int8_t *y);
void tt_pad_f32(const int32_t in_shape[4], const int32_t pads[8], float value, const float *x, float *y);

/* CONCATENATION: tensors viewed as [outer, inner_i] with inner_i = axis extent * product of the later dims.
 * q == NULL: every input has the output's parameters and there is no fused activation (a pure copy).
 * Otherwise inputs with different (scale, zero point) are rescaled as ConcatenationWithScaling does (float32
 * math: scale = s_i * (1/s_o), bias = -z_i * scale, roundf(x*scale + bias) + z_o), then the act clamp. */
typedef struct {
    const float *input_scale;
    const int32_t *input_zero_point;
    float output_scale;
    int32_t output_zero_point;
    int32_t act_min, act_max;
} tt_concat_params_s8;
void tt_concatenation_s8(int32_t n_inputs, const int8_t *const *inputs, const int32_t *inner_sizes, int32_t outer,
                         const tt_concat_params_s8 *q, int8_t *y);
void tt_concatenation_f32(int32_t n_inputs, const float *const *inputs, const int32_t *inner_sizes, int32_t outer,
                          float act_min, float act_max, float *y);

/* RESHAPE: a no-op when codegen aliases input and output; otherwise a copy (memmove: may overlap). */
void tt_copy_s8(int32_t n, const int8_t *x, int8_t *y);
void tt_copy_f32(int32_t n, const float *x, float *y);

/* ---- float32 forward ------------------------------------------------------------------------------------- */
/* act_min/act_max: the fused activation's float bounds (-INFINITY/INFINITY for none, 0/INFINITY relu, 0/6
 * relu6, -1/1 relu_n1_to_1); the clamp is max then min like the executor's _float_act. */

void tt_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                   const float *bias, float *y);
void tt_depthwise_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *bias, float *y);
/* TRANSPOSE_CONV (ops/tt_transpose_conv.c): x [B,in_h,in_w,in_c] -> y [B,out_h,out_w,out_c], w [out_c,k_h,k_w,in_c],
 * pad_top/pad_left from y's size (executor.transpose_conv_geometry); dilation / depth_multiplier ignored. int8:
 * requant as conv2d (bit-exact with the reference's int32 scratch); float: the reference's per-element order. The
 * backward: dx = the conv2d of dy with w of the same geometry; dw [out_c,k_h,k_w,k] (first k input channels). */
void tt_transpose_conv_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                          const int32_t *bias, int8_t *y);
void tt_transpose_conv_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                           const float *bias, float *y);
void tt_transpose_conv_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
void tt_transpose_conv_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw);
void tt_fully_connected_f32(int32_t rows, int32_t depth, int32_t out_c, float act_min, float act_max,
                            const float *x, const float *w, const float *bias, float *y);
void tt_add_f32(int32_t n, float act_min, float act_max, const float *a, const float *b, float *y);
void tt_average_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
void tt_max_pool2d_f32(const tt_pool_dims *d, float act_min, float act_max, const float *x, float *y);
void tt_mean_hw_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *x, float *y);
void tt_softmax_f32(int32_t rows, int32_t depth, float beta, const float *x, float *y);
/* RELU / RELU6 / any clamp, element-wise (y may equal x). */
void tt_clamp_f32(int32_t n, float lo, float hi, const float *x, float *y);

/* ---- float32 backward (stages/golden/grad_ops.py) --------------------------------------------------------------- */

/* dy is the gradient of the pre-activation output (apply tt_act_grad_f32 first). dx is overwritten. */
void tt_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
/* dw [O,KH,KW,k]: the first k input channels only (k = in_c: the full gradient). */
void tt_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw);
/* Output channels [o0, o1) only: dw [o1-o0,KH,KW,k] holds the rows of o0.. (dw[(o-o0)*KH*KW*k ...]); the bits of
 * those rows of the whole call (which is this with [0, out_c)). For streaming grad-weight -> update per channel. */
void tt_conv2d_grad_weight_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                     const float *x, float *dw);
void tt_depthwise_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
/* dw [1,KH,KW,k*M]: the filters fed by input channels [0, k). */
void tt_depthwise_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x,
                                         float *dw);
/* Taps [t0, t1) only (t = ky*KW + kx: the rows of the [KH*KW, k*M] gradient, channels last so an output-channel
 * range would not be contiguous): dw [t1-t0, k*M] holds rows t0..; bits of the whole call. */
void tt_depthwise_conv2d_grad_weight_f32_taps(const tt_conv_dims *d, int32_t k, int32_t t0, int32_t t1,
                                              const float *dy, const float *x, float *dw);
void tt_fully_connected_grad_input_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy, const float *w,
                                       float *dx);
/* The same three input gradients reading an int8 weight and dequantizing each element where the float kernels read
 * it: f32(q - zero_point[c]) * scale[c] with c the output channel (conv, FC: axis 0; depthwise: axis 3), which is
 * bit-equal to tt_dequantize_per_channel_s8_f32 (an int times a float32 is exact in double), with the same
 * accumulation order; so no fp32 copy of the weight is needed (memplan.fused_dequantize). conv2d also takes a
 * split weight (w_slice / n as tt_conv2d_s8_split; w_slice 0 and n 0: w alone). */
void tt_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w, const int8_t *w_slice,
                                 int32_t n, const float *scale, const int32_t *zero_point, float *dx);
void tt_depthwise_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w,
                                           const float *scale, const int32_t *zero_point, float *dx);
void tt_fully_connected_grad_input_qw_f32(int32_t rows, int32_t depth, int32_t out_c, const float *dy,
                                          const int8_t *w, const float *scale, const int32_t *zero_point, float *dx);
/* Depthwise input gradient written over its output gradient (depth multiplier 1; memplan's in-place
 * depthwise_conv2d_grad_input): dydx holds dz on entry and dx on return; scratch holds in_h*in_w floats. Channel
 * by channel like tt_depthwise_conv2d_f32_inplace; the bits of the out-of-place kernels. */
void tt_depthwise_conv2d_grad_input_f32_inplace(const tt_conv_dims *d, float *dydx, const float *w, float *scratch);
void tt_depthwise_conv2d_grad_input_qw_f32_inplace(const tt_conv_dims *d, float *dydx, const int8_t *w,
                                                   const float *scale, const int32_t *zero_point, float *scratch);
/* dw [out_c, k]. */
void tt_fully_connected_grad_weight_f32(int32_t rows, int32_t depth, int32_t out_c, int32_t k, const float *dy,
                                        const float *x, float *dw);
/* Rows [o0, o1) only: dw [o1-o0, k] (dw points at row o0); bits of the whole call. */
void tt_fully_connected_grad_weight_f32_range(int32_t rows, int32_t depth, int32_t out_c, int32_t k, int32_t o0,
                                              int32_t o1, const float *dy, const float *x, float *dw);
/* db[c] = sum over every row (batch and positions) of dy[row, c]. */
void tt_bias_grad_f32(int32_t rows, int32_t channels, const float *dy, float *db);
void tt_average_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, float *dx);
/* All of dy goes to the window's first maximum in row-major tap order (strict >). */
void tt_max_pool2d_grad_f32(const tt_pool_dims *d, const float *dy, const float *x, float *dx);
/* the same with the int8 forward input (ties: first maximum in row-major tap order, strict >) */
void tt_max_pool2d_grad_s8(const tt_pool_dims *d, const float *dy, const int8_t *x, float *dx);
void tt_mean_hw_grad_f32(int32_t batches, int32_t h, int32_t w, int32_t c, const float *dy, float *dx);
/* in_shape is the forward input's (dx's) shape; dy has the padded shape. */
void tt_pad_grad_f32(const int32_t in_shape[4], const int32_t pads[8], const float *dy, float *dx);
/* dxs[i] == NULL: input i needs no gradient and is skipped. */
void tt_concatenation_grad_f32(int32_t n_inputs, const int32_t *inner_sizes, int32_t outer, const float *dy,
                               float *const *dxs);
/* Straight-through mask from the forward *output* y: relu y>0, relu6 0<y<6, relu_n1_to_1 -1<y<1 (dx may be dy). */
void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx);
/* y = softmax(beta x): dx = beta * y * (dy - sum(dy*y)). */
void tt_softmax_grad_f32(int32_t rows, int32_t depth, float beta, const float *dy, const float *y, float *dx);
/* The gradient of an operand broadcast up to dy's shape (add_grad / sub_grad: sign +1 / -1): dx[a(i)] += sign *
 * dy[i] over bc's output positions (a_stride: dx's strides, 0 on the broadcast axes); dx has dx_size elements.
 * When dx has dy's size it is a (signed) copy and dx may be dy; otherwise dx is zeroed first. */
void tt_unbroadcast_f32(const tt_broadcast *bc, float sign, const float *dy, float *dx, int32_t dx_size);
/* mul_grad: d = unbroadcast(dy * other) to d's shape (a_stride: d's strides, b_stride: other's). */
void tt_mul_grad_f32(const tt_broadcast *bc, const float *dy, const float *other, float *d, int32_t d_size);
/* From the forward output y: logistic dy (1 - y) y; tanh dy (1 - y^2). dx may be dy. */
void tt_logistic_grad_f32(int32_t n, const float *dy, const float *y, float *dx);
void tt_tanh_grad_f32(int32_t n, const float *dy, const float *y, float *dx);
/* From the forward input x: hard_swish 0 / dy (x/3 + 1/2) / dy at x <= -3 / between / x >= 3; leaky_relu and prelu
 * x > 0 ? dy : alpha dy (prelu: alpha operand b of bc, x / dy / dx operand a). dx may be dy. */
void tt_hard_swish_grad_f32(int32_t n, const float *dy, const float *x, float *dx);
void tt_leaky_relu_grad_f32(int32_t n, float alpha, const float *dy, const float *x, float *dx);
void tt_prelu_grad_f32(const tt_broadcast *bc, const float *dy, const float *x, const float *alpha, float *dx);
/* dx (x's rank-4 shape p->in_shape) = 0 except the sliced positions, which get dy in order. */
void tt_strided_slice_grad_f32(const tt_strided_slice_params *p, const float *dy, float *dx);

/* RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR (ops/tt_resize_bilinear.c, ops/tt_resize_nearest_neighbor.c;
 * executor._resize_bilinear / _resize_nearest_neighbor), NHWC x [batches, in_h, in_w, channels] -> y [batches,
 * out_h, out_w, channels]; int8 keeps the input's quantization (bilinear: TFLite's Q10 ResizeBilinearInteger). y
 * must not overlap x. The backward takes the forward's params: dy has the output's shape, dx (zeroed by the kernel)
 * the input's. */
typedef struct {
    int32_t batches, in_h, in_w, channels, out_h, out_w;
    int32_t align_corners, half_pixel_centers;
} tt_resize_params;
void tt_resize_bilinear_s8(const tt_resize_params *p, const int8_t *x, int8_t *y);
void tt_resize_bilinear_f32(const tt_resize_params *p, const float *x, float *y);
void tt_resize_nearest_s8(const tt_resize_params *p, const int8_t *x, int8_t *y);
void tt_resize_nearest_f32(const tt_resize_params *p, const float *x, float *y);
void tt_resize_bilinear_grad_f32(const tt_resize_params *p, const float *dy, float *dx);
void tt_resize_nearest_grad_f32(const tt_resize_params *p, const float *dy, float *dx);
/* acc += g (gradient of a tensor read by several ops, in reader order). */
void tt_accumulate_f32(int32_t n, float *acc, const float *g);

/* ---- losses (summed over the rows given; the update's scale carries 1/B) ---------------------------------- */

/* Fused, stable softmax cross-entropy with integer labels. Returns the loss; dlogits = softmax - onehot. */
float tt_softmax_cross_entropy_f32(int32_t rows, int32_t depth, const float *logits, const int32_t *labels,
                                   float *dlogits);
/* Per sample the mean over its `per_sample` elements of (y - t)^2, summed over samples; dy = 2 (y - t) / per. */
float tt_mse_f32(int32_t samples, int32_t per_sample, const float *y, const float *target, float *dy);
float tt_bce_logits_f32(int32_t samples, int32_t per_sample, const float *z, const float *target, float *dz);
float tt_huber_f32(int32_t samples, int32_t per_sample, float delta, const float *y, const float *target, float *dy);
float tt_loss_weight_f32(int32_t n, float w, float loss, float *grad);

/* ---- optimizer updates (in place, partial-channel aware) ------------------------------------------------- */

/* w is [rows, cols]; the first n columns of every row are trained. Gradients and optimizer state are compact
 * [rows, n]. conv [O,KH,KW,I]: rows O*KH*KW, cols I; FC [O,I]: rows O; depthwise: rows KH*KW, cols C*M, n k*M. */
typedef struct {
    int32_t rows, cols, n;
} tt_slice;

/* Float32 constants, rounded exactly as grad_ops.py rounds them (F32(...) of the double expressions). */
typedef struct {
    float lr, scale, weight_decay;
} tt_sgd_params;
typedef struct {
    float lr, momentum, scale, weight_decay;
} tt_momentum_params;
typedef struct {
    float lr_over_bc1;     /* F32(lr / (1 - beta1^step)) */
    float one_minus_beta1; /* F32(1 - beta1) */
    float beta2;           /* F32(beta2) */
    float one_minus_beta2; /* F32(1 - beta2) */
    float sqrt_bc2;        /* F32(sqrt(1 - beta2^step)) */
    float eps, scale, weight_decay;
} tt_adam_params;
typedef struct {
    float lr, alpha, one_minus_alpha, eps, scale, weight_decay;
} tt_rmsprop_params;

void tt_sgd_f32(const tt_slice *s, const tt_sgd_params *p, float *w, const float *g);
void tt_momentum_f32(const tt_slice *s, const tt_momentum_params *p, float *w, const float *g, float *buf);
/* step counts from 1; the constants in double like grad_ops.adam_update (pow, sqrt of <math.h>). */
void tt_adam_prepare(double lr, double beta1, double beta2, double eps, int32_t step, float scale,
                     float weight_decay, tt_adam_params *p);
void tt_adam_f32(const tt_slice *s, const tt_adam_params *p, float *w, const float *g, float *m, float *v);
void tt_rmsprop_f32(const tt_slice *s, const tt_rmsprop_params *p, float *w, const float *g, float *sq);

/* ---- int8 QAS update (DESIGN §6) ------------------------------------------------------------------------- */
/* Real-unit SGD carried into the int domain: x = -(g * factor[c]) with factor[c] = lr / s_w[c] for weights and
 * lr / (s_x * s_w[c]) for biases (tt_qas_factors). Rounding of x:
 *   TT_ROUND_NEAREST:    floorf(x + 0.5f)   (ties up, documented rule; numpy mirror: np.floor(x + f32(.5)))
 *   TT_ROUND_STOCHASTIC: floorf(x + u), u = (tt_xorshift32(state) >> 8) * 2^-24, one draw per updated element
 *                        in row-major order of the compact gradient (weights), then per channel (biases).
 * Without a master copy: w = clamp(w + round(x)), int8 weights to [-127, 127], int32 biases to int32 range.
 * With an fp32 master copy (compact [rows, n], the int-domain value, initialised to (float)w): m = clamp(m + x),
 * w = round(m). NaN updates are skipped (w unchanged). */
typedef enum { TT_ROUND_NEAREST = 0, TT_ROUND_STOCHASTIC = 1 } tt_rounding;

typedef struct {
    tt_slice s;
    /* Output channel of an element: rows_per_channel > 0: row / rows_per_channel (conv: KH*KW, FC: 1);
     * rows_per_channel == 0: the column (depthwise [1,KH,KW,C*M]). */
    int32_t rows_per_channel;
    tt_rounding rounding;
} tt_qas_layout;

/* Marsaglia xorshift32 (13, 17, 5); *state must be non-zero. Returns the new state. */
uint32_t tt_xorshift32(uint32_t *state);
/* factor[c] = lr / (x_scale * w_scale[c]) in float32 (x_scale = 1.0f for weights). */
void tt_qas_factors(int32_t channels, float lr, const float *w_scale, float x_scale, float *factor);
void tt_qas_update_s8(const tt_qas_layout *l, const float *factor, int8_t *w, const float *g, float *master,
                      uint32_t *rng_state);
void tt_qas_update_bias_s32(int32_t channels, tt_rounding rounding, const float *factor, int32_t *b,
                            const float *g, float *master, uint32_t *rng_state);

/* conv2d weight gradient of output channels [o0, o1) reading the int8 input x (per-tensor scale / zero point,
 * d->in_c channels of which the first k are trained) and dequantizing each element where it is used: bits of
 * dequantize_slice followed by tt_conv2d_grad_weight_f32_range (ops/tt_conv2d.c). */
void tt_conv2d_grad_weight_qx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                        const int8_t *x, float scale, int32_t zero_point, float *dw);

/* DEPTH_TO_SPACE (ops/tt_depth_to_space.c; stages/ops/depth_to_space.py), NHWC, DCR order, dims of the input x
 * [batches, in_h, in_w, in_c], block k: y [batches, in_h*k, in_w*k, in_c/k^2]. grad: dx = space_to_depth(dy). */
void tt_depth_to_space_s8(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                          const int8_t *x, int8_t *y);
void tt_depth_to_space_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                           const float *x, float *y);
void tt_depth_to_space_grad_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                                const float *dy, float *dx);

/* SPLIT / SPLIT_V (ops/tt_split_even.c; stages/ops/split.py): x is `outer` runs of sum(inner) elements, part j gets
 * inner[j] of each run; grad: dx = the parts' gradients concatenated back, zeros for a NULL part. */
void tt_split_s8(int32_t parts, const int32_t *inner, int32_t outer, const int8_t *x, int8_t *const *y);
void tt_split_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *x, float *const *y);
void tt_split_grad_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *const *dy, float *dx);

#ifdef __cplusplus
}
#endif

#endif /* TT_KERNELS_H */
