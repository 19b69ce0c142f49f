/* tinytrain kernel library: portable C99 kernels for on-device training (DESIGN §6, §7).
 *
 * Layout (kernels_c/README.md): the kernels of IR op <op> (int8, float32 and its backward) are in ops/tt_<op>.c;
 * shared inner loops in the headers of kernels_c/; support code that is no op (losses, optimizers, QAS) in the
 * .c files of kernels_c/. Each op file declares its own kernels (and the parameter structs only it uses) in its
 * `#ifdef TT_INTERFACE` block; stages/c_emit/ops_header.py gathers those blocks into the generated tt_ops.h, included
 * below after the types several op files share. Adding an op therefore edits no header.
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

/* numpy broadcasting of a binary op on a rank-4 view (lower ranks: leading 1s, aligned to the right as numpy
 * does): the output's shape and, per operand, the element stride of each axis (0 where the operand has extent 1
 * and is broadcast). Codegen computes it. The output is written contiguously in row-major order. */
typedef struct {
    int32_t shape[4];
    int32_t a_stride[4];
    int32_t b_stride[4];
} tt_broadcast;

/* RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR (ops/tt_resize_bilinear.c, ops/tt_resize_nearest_neighbor.c;
 * executor._resize_bilinear / _resize_nearest_neighbor), NHWC x [batches, in_h, in_w, channels] -> y [batches,
 * out_h, out_w, channels]; int8 keeps the input's quantization (bilinear: TFLite's Q10 ResizeBilinearInteger). y
 * must not overlap x. The backward takes the forward's params: dy has the output's shape, dx (zeroed by the kernel)
 * the input's. */
typedef struct {
    int32_t batches, in_h, in_w, channels, out_h, out_w;
    int32_t align_corners, half_pixel_centers;
} tt_resize_params;

/* ---- the op files' kernels (kernels_c/ops/tt_<op>.c, each file's TT_INTERFACE block) ------------------------ */

/* The float32 kernels' act_min/act_max: the fused activation's float bounds (-INFINITY/INFINITY for none,
 * 0/INFINITY relu, 0/6 relu6, -1/1 relu_n1_to_1); the clamp is max then min like the executor's _float_act. */

#include "tt_ops.h"
#include "tt_hidden_stream.h"

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

#ifdef __cplusplus
}
#endif

#endif /* TT_KERNELS_H */
