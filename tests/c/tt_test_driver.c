/* Host test driver for kernels_c (tests/test_kernels_c.py).
 *
 * Usage: tt_test_driver CASE_FILE...   For each case file writes CASE_FILE.out.
 * Case file (little-endian): char op[32] (NUL-padded); int32 ni, int32 ints[ni]; int32 nf, float64 floats[nf];
 * int32 nb, then nb times: int32 nbytes, bytes. Every buffer gets its own exact-size allocation so that
 * AddressSanitizer catches any out-of-bounds access; an empty buffer is passed as NULL. After the op, every
 * buffer (inputs included, so in-place updates come back) is written to CASE_FILE.out as int32 nbytes, bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tt_kernels.h"
#include "tt_mask.h"
#include "tt_train_ops.h"

#define MAX_BUF 64
#define MAX_INT 256
#define MAX_FLT 32

static char op[33];
static int32_t ni, nf, nb;
static int32_t I[MAX_INT];
static double F[MAX_FLT];
static void *B[MAX_BUF];
static int32_t NB[MAX_BUF];

static void die(const char *msg, const char *arg)
{
    fprintf(stderr, "tt_test_driver: %s %s\n", msg, arg ? arg : "");
    exit(2);
}

static void rd(FILE *f, void *p, size_t n)
{
    if (n && fread(p, 1, n, f) != n) {
        die("short read", op);
    }
}

static void conv_dims(tt_conv_dims *d, const int32_t *v)
{
    d->batches = v[0]; d->in_h = v[1]; d->in_w = v[2]; d->in_c = v[3];
    d->out_h = v[4]; d->out_w = v[5]; d->out_c = v[6]; d->k_h = v[7]; d->k_w = v[8];
    d->stride_h = v[9]; d->stride_w = v[10]; d->dilation_h = v[11]; d->dilation_w = v[12];
    d->pad_top = v[13]; d->pad_left = v[14]; d->depth_multiplier = v[15];
}

static void pool_dims(tt_pool_dims *d, const int32_t *v)
{
    d->batches = v[0]; d->in_h = v[1]; d->in_w = v[2]; d->channels = v[3];
    d->out_h = v[4]; d->out_w = v[5]; d->filter_h = v[6]; d->filter_w = v[7];
    d->stride_h = v[8]; d->stride_w = v[9]; d->pad_top = v[10]; d->pad_left = v[11];
}

static tt_resize_params resize_params(const int32_t *v)
{
    tt_resize_params p;
    p.batches = v[0]; p.in_h = v[1]; p.in_w = v[2]; p.channels = v[3]; p.out_h = v[4]; p.out_w = v[5];
    p.align_corners = v[6]; p.half_pixel_centers = v[7];
    return p;
}

static tt_requant_s8 requant(const int32_t *v, const void *mult, const void *shift)
{
    tt_requant_s8 q;
    q.input_zero_point = v[0]; q.output_zero_point = v[1]; q.act_min = v[2]; q.act_max = v[3];
    q.per_channel = v[4]; q.multiplier = (const int32_t *)mult; q.shift = (const int32_t *)shift;
    return q;
}

static inline tt_slice slice3(const int32_t *v)
{
    tt_slice s;
    s.rows = v[0]; s.cols = v[1]; s.n = v[2];
    return s;
}

/* v: shape[4], a_stride[4], b_stride[4] */
static tt_broadcast bcast(const int32_t *v)
{
    tt_broadcast b;
    int32_t d;
    for (d = 0; d < 4; ++d) {
        b.shape[d] = v[d]; b.a_stride[d] = v[4 + d]; b.b_stride[d] = v[8 + d];
    }
    return b;
}

/* v: in_shape[4], out_shape[4], start[4], stride[4] */
static tt_strided_slice_params slice_params(const int32_t *v)
{
    tt_strided_slice_params p;
    int32_t d;
    for (d = 0; d < 4; ++d) {
        p.in_shape[d] = v[d]; p.out_shape[d] = v[4 + d]; p.start[d] = v[8 + d]; p.stride[d] = v[12 + d];
    }
    return p;
}

#define S8(k) ((int8_t *)B[k])
#define I32(k) ((int32_t *)B[k])
#define F32(k) ((float *)B[k])
#define U32(k) ((uint32_t *)B[k])

/* One function per kernel variant the tests call, grouped by op; KERNELS (below) maps the case file's name to it. */

/* ints: dims, requant; buffers: x, w, b, mult, shift, y (conv2d_s8 and depthwise_conv2d_s8) */
static void run_conv_s8(void (*kernel)(const tt_conv_dims *, const tt_requant_s8 *, const int8_t *, const int8_t *,
                                       const int32_t *, int8_t *))
{
    tt_conv_dims cd;
    tt_requant_s8 q;
    conv_dims(&cd, I);
    q = requant(I + 16, B[3], B[4]);
    kernel(&cd, &q, S8(0), S8(1), I32(2), S8(5));
}

static void k_conv2d_s8(void)
{
    run_conv_s8(tt_conv2d_s8);
}

static void k_depthwise_conv2d_s8(void)
{
    run_conv_s8(tt_depthwise_conv2d_s8);
}

static void k_conv2d_s8_split(void) /* ints: dims, requant, n; buffers: x, w, b, mult, shift, y, w_slice */
{
    tt_conv_dims cd;
    tt_requant_s8 q;
    conv_dims(&cd, I);
    q = requant(I + 16, B[3], B[4]);
    tt_conv2d_s8_split(&cd, &q, S8(0), S8(1), S8(6), I[21], I32(2), S8(5));
}

static void k_depthwise_conv2d_s8_inplace(void) /* buffers: xy, w, b, mult, shift, scratch */
{
    tt_conv_dims cd;
    tt_requant_s8 q;
    conv_dims(&cd, I);
    q = requant(I + 16, B[3], B[4]);
    tt_depthwise_conv2d_s8_inplace(&cd, &q, S8(0), S8(1), I32(2), S8(5));
}

static void k_conv2d_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_conv2d_f32(&cd, (float)F[0], (float)F[1], F32(0), F32(1), F32(2), F32(3));
}

static void k_depthwise_conv2d_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_depthwise_conv2d_f32(&cd, (float)F[0], (float)F[1], F32(0), F32(1), F32(2), F32(3));
}

static void k_fully_connected_s8(void)
{
    tt_requant_s8 q;
    q = requant(I + 3, B[3], B[4]);
    tt_fully_connected_s8(I[0], I[1], I[2], &q, S8(0), S8(1), I32(2), S8(5));
}

static void k_fully_connected_f32(void)
{
    tt_fully_connected_f32(I[0], I[1], I[2], (float)F[0], (float)F[1], F32(0), F32(1), F32(2), F32(3));
}

static void k_add_s8(void)
{
    tt_add_params_s8 p;
    p.input1_zero_point = I[0]; p.input2_zero_point = I[1]; p.output_zero_point = I[2]; p.left_shift = I[3];
    p.input1_multiplier = I[4]; p.input1_shift = I[5]; p.input2_multiplier = I[6]; p.input2_shift = I[7];
    p.output_multiplier = I[8]; p.output_shift = I[9]; p.act_min = I[10]; p.act_max = I[11];
    tt_add_s8(&p, I[12], S8(0), S8(1), S8(2));
}

static void k_add_f32(void)
{
    tt_add_f32(I[0], (float)F[0], (float)F[1], F32(0), F32(1), F32(2));
}

static void k_average_pool2d_s8(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_average_pool2d_s8(&pd, I[12], I[13], S8(0), S8(1));
}

static void k_max_pool2d_s8(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_max_pool2d_s8(&pd, I[12], I[13], S8(0), S8(1));
}

static void k_average_pool2d_f32(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_average_pool2d_f32(&pd, (float)F[0], (float)F[1], F32(0), F32(1));
}

static void k_max_pool2d_f32(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_max_pool2d_f32(&pd, (float)F[0], (float)F[1], F32(0), F32(1));
}

static void k_mean_s8(void)
{
    tt_mean_params_s8 p;
    p.input_zero_point = I[0]; p.output_zero_point = I[1]; p.multiplier = I[2]; p.shift = I[3];
    tt_mean_hw_s8(&p, I[4], I[5], I[6], I[7], S8(0), S8(1));
}

static void k_mean_f32(void)
{
    tt_mean_hw_f32(I[0], I[1], I[2], I[3], F32(0), F32(1));
}

static void k_softmax_s8(void)
{
    tt_softmax_s8(I[0], I[1], I[2], I[3], I[4], S8(0), S8(1));
}

static void k_softmax_f32(void)
{
    tt_softmax_f32(I[0], I[1], (float)F[0], F32(0), F32(1));
}

static void k_relu_s8(void)
{
    tt_relu_s8(I[0], I[1], I[2], I[3], I[4], I[5], I[6], S8(0), S8(1));
}

static void k_clamp_f32(void)
{
    tt_clamp_f32(I[0], (float)F[0], (float)F[1], F32(0), F32(1));
}

static void k_quantize_f32_s8(void)
{
    tt_quantize_f32_s8(I[0], (float)F[0], I[1], F32(0), S8(1));
}

static void k_requantize_s8(void)
{
    tt_requantize_s8(I[0], I[1], I[2], I[3], I[4], S8(0), S8(1));
}

static void k_dequantize_s8_f32(void)
{
    tt_dequantize_s8_f32(I[0], (float)F[0], I[1], S8(0), F32(1));
}

static void k_dequantize_per_channel_s8_f32(void)
{
    tt_dequantize_per_channel_s8_f32(I[0], I[1], I[2], F32(0), I32(1), S8(2), F32(3));
}

static void k_pad_s8(void)
{
    tt_pad_s8(I, I + 4, (int8_t)I[12], S8(0), S8(1));
}

static void k_pad_f32(void)
{
    tt_pad_f32(I, I + 4, (float)F[0], F32(0), F32(1));
}

static void k_concatenation_s8(void)
{
    int32_t i;
    const int8_t *ins[MAX_BUF];
    tt_concat_params_s8 p;
    const int32_t n = I[0];
    for (i = 0; i < n; ++i) {
        ins[i] = S8(2 + i);
    }
    p.input_scale = F32(0); p.input_zero_point = I32(1); p.output_scale = (float)F[0];
    p.output_zero_point = I[3]; p.act_min = I[4]; p.act_max = I[5];
    tt_concatenation_s8(n, ins, I + 6, I[1], I[2] ? &p : 0, S8(2 + n));
}

static void k_concatenation_f32(void)
{
    int32_t i;
    const float *ins[MAX_BUF];
    const int32_t n = I[0];
    for (i = 0; i < n; ++i) {
        ins[i] = F32(i);
    }
    tt_concatenation_f32(n, ins, I + 2, I[1], (float)F[0], (float)F[1], F32(n));
}

static void k_copy_s8(void)
{
    tt_copy_s8(I[0], S8(0), S8(1));
}

static void k_copy_f32(void)
{
    tt_copy_f32(I[0], F32(0), F32(1));
}

/* ints: add params (12), broadcast (12); buffers: a, b, y (add_s8_broadcast and sub_s8) */
static void run_add_sub_s8(void (*kernel)(const tt_add_params_s8 *, const tt_broadcast *, const int8_t *,
                                          const int8_t *, int8_t *))
{
    tt_add_params_s8 p;
    tt_broadcast bc = bcast(I + 12);
    p.input1_zero_point = I[0]; p.input2_zero_point = I[1]; p.output_zero_point = I[2]; p.left_shift = I[3];
    p.input1_multiplier = I[4]; p.input1_shift = I[5]; p.input2_multiplier = I[6]; p.input2_shift = I[7];
    p.output_multiplier = I[8]; p.output_shift = I[9]; p.act_min = I[10]; p.act_max = I[11];
    kernel(&p, &bc, S8(0), S8(1), S8(2));
}

static void k_add_s8_broadcast(void)
{
    run_add_sub_s8(tt_add_s8_broadcast);
}

static void k_sub_s8(void)
{
    run_add_sub_s8(tt_sub_s8);
}

static void k_mul_s8(void)
{
    tt_mul_params_s8 p;
    tt_broadcast bc = bcast(I + 7);
    p.input1_zero_point = I[0]; p.input2_zero_point = I[1]; p.output_zero_point = I[2]; p.multiplier = I[3];
    p.shift = I[4]; p.act_min = I[5]; p.act_max = I[6];
    tt_mul_s8(&p, &bc, S8(0), S8(1), S8(2));
}

/* ints: broadcast; floats: act_min, act_max; buffers: a, b, y (add_f32_broadcast, sub_f32, mul_f32) */
static void run_binary_f32(void (*kernel)(const tt_broadcast *, float, float, const float *, const float *, float *))
{
    tt_broadcast bc = bcast(I);
    kernel(&bc, (float)F[0], (float)F[1], F32(0), F32(1), F32(2));
}

static void k_add_f32_broadcast(void)
{
    run_binary_f32(tt_add_f32_broadcast);
}

static void k_sub_f32(void)
{
    run_binary_f32(tt_sub_f32);
}

static void k_mul_f32(void)
{
    run_binary_f32(tt_mul_f32);
}

static void k_logistic_s8(void)
{
    tt_logistic_s8(I[0], I[1], I[2], I[3], I[4], S8(0), S8(1));
}

static void k_tanh_s8(void)
{
    tt_tanh_s8(I[0], I[1], I[2], I[3], I[4], S8(0), S8(1));
}

static void k_hard_swish_s8(void)
{
    tt_hard_swish_params_s8 p;
    p.input_zero_point = I[1]; p.output_zero_point = I[2]; p.output_multiplier_fixedpoint_int16 = I[3];
    p.output_multiplier_exponent = I[4]; p.reluish_multiplier_fixedpoint_int16 = I[5];
    p.reluish_multiplier_exponent = I[6];
    tt_hard_swish_s8(&p, I[0], S8(0), S8(1));
}

static void k_leaky_relu_s8(void)
{
    tt_leaky_relu_s8(I[0], I[1], I[2], I[3], I[4], I[5], I[6], S8(0), S8(1));
}

static void k_prelu_s8(void)
{
    tt_prelu_params_s8 p;
    tt_broadcast bc = bcast(I + 7);
    p.input_zero_point = I[0]; p.alpha_zero_point = I[1]; p.output_zero_point = I[2];
    p.multiplier_pos = I[3]; p.shift_pos = I[4]; p.multiplier_neg = I[5]; p.shift_neg = I[6];
    tt_prelu_s8(&p, &bc, S8(0), S8(1), S8(2));
}

static void k_logistic_f32(void)
{
    tt_logistic_f32(I[0], F32(0), F32(1));
}

static void k_tanh_f32(void)
{
    tt_tanh_f32(I[0], F32(0), F32(1));
}

static void k_hard_swish_f32(void)
{
    tt_hard_swish_f32(I[0], F32(0), F32(1));
}

static void k_leaky_relu_f32(void)
{
    tt_leaky_relu_f32(I[0], (float)F[0], F32(0), F32(1));
}

static void k_prelu_f32(void)
{
    tt_broadcast bc = bcast(I);
    tt_prelu_f32(&bc, F32(0), F32(1), F32(2));
}

static void k_strided_slice_s8(void)
{
    tt_strided_slice_params p = slice_params(I);
    tt_strided_slice_s8(&p, S8(0), S8(1));
}

static void k_strided_slice_f32(void)
{
    tt_strided_slice_params p = slice_params(I);
    tt_strided_slice_f32(&p, F32(0), F32(1));
}

static void k_resize_bilinear_s8(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_bilinear_s8(&p, S8(0), S8(1));
}

static void k_resize_bilinear_f32(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_bilinear_f32(&p, F32(0), F32(1));
}

static void k_resize_nearest_s8(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_nearest_s8(&p, S8(0), S8(1));
}

static void k_resize_nearest_f32(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_nearest_f32(&p, F32(0), F32(1));
}

static void k_out_size_and_pad(void)
{
    tt_out_size_and_pad(I[0], I[1], I[2], I[3], I[4], I32(0), I32(0) + 1);
}

#ifndef TT_DRIVER_FORWARD_ONLY
static void k_conv2d_grad_input_qw_f32(void) /* ints: dims, n; buffers: dy, w, w_slice, scale, zp, dx */
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_conv2d_grad_input_qw_f32(&cd, F32(0), S8(1), S8(2), I[16], F32(3), I32(4), F32(5));
}

/* ints: pixels, in_c, o0, o1, n, com given; buffers: dy [pixels, o1-o0], com, w, w_slice, scale, zp, dx */
static void k_conv2d_gi_qw_f32_oc(void)
{
    tt_conv2d_grad_input_qw_f32_oc(I[0], I[1], I[2], I[3], F32(0), I[5] ? F32(1) : 0, S8(2), S8(3), I[4], F32(4),
                                   I32(5), F32(6));
}

static void k_dw_conv2d_grad_input_qw_f32(void) /* (op names: < 32 chars) buffers: dy, w, scale, zp, dx */
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_depthwise_conv2d_grad_input_qw_f32(&cd, F32(0), S8(1), F32(2), I32(3), F32(4));
}

static void k_transpose_conv_s8(void) /* ints: dims, requant; buffers: x, w, b, mult, shift, y */
{
    tt_conv_dims cd;
    tt_requant_s8 q;
    conv_dims(&cd, I);
    q = requant(I + 16, B[3], B[4]);
    tt_transpose_conv_s8(&cd, &q, S8(0), S8(1), I32(2), S8(5));
}

static void k_transpose_conv_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_transpose_conv_f32(&cd, (float)F[0], (float)F[1], F32(0), F32(1), F32(2), F32(3));
}

static void k_transpose_conv_grad_input_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_transpose_conv_grad_input_f32(&cd, F32(0), F32(1), F32(2));
}

static void k_transpose_conv_grad_weight_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_transpose_conv_grad_weight_f32(&cd, I[16], F32(0), F32(1), F32(2));
}

static void k_conv2d_grad_input_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_conv2d_grad_input_f32(&cd, F32(0), F32(1), F32(2));
}

static void k_conv2d_grad_weight_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_conv2d_grad_weight_f32(&cd, I[16], F32(0), F32(1), F32(2));
}

static void k_conv2d_grad_weight_qx_f32(void) /* ints: dims, k, o0, o1, zero point; buffers: dy, x, scale, dw */
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_conv2d_grad_weight_qx_f32_range(&cd, I[16], I[17], I[18], F32(0), S8(1), F32(2)[0], I[19], F32(3));
}

static void k_depthwise_conv2d_grad_input_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_depthwise_conv2d_grad_input_f32(&cd, F32(0), F32(1), F32(2));
}

static void k_depthwise_conv2d_grad_weight_f32(void)
{
    tt_conv_dims cd;
    conv_dims(&cd, I);
    tt_depthwise_conv2d_grad_weight_f32(&cd, I[16], F32(0), F32(1), F32(2));
}

static void k_fully_connected_grad_input_f32(void)
{
    tt_fully_connected_grad_input_f32(I[0], I[1], I[2], F32(0), F32(1), F32(2));
}

static void k_fc_grad_input_qw_f32(void) /* ints: rows, depth, out_c; buffers: dy, w, scale, zp, dx */
{
    tt_fully_connected_grad_input_qw_f32(I[0], I[1], I[2], F32(0), S8(1), F32(2), I32(3), F32(4));
}

static void k_fully_connected_grad_weight_f32(void)
{
    tt_fully_connected_grad_weight_f32(I[0], I[1], I[2], I[3], F32(0), F32(1), F32(2));
}

static void k_bias_grad_f32(void)
{
    tt_bias_grad_f32(I[0], I[1], F32(0), F32(1));
}

static void k_average_pool2d_grad_f32(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_average_pool2d_grad_f32(&pd, F32(0), F32(1));
}

static void k_max_pool2d_grad_f32(void)
{
    tt_pool_dims pd;
    pool_dims(&pd, I);
    tt_max_pool2d_grad_f32(&pd, F32(0), F32(1), F32(2));
}

static void k_mean_hw_grad_f32(void)
{
    tt_mean_hw_grad_f32(I[0], I[1], I[2], I[3], F32(0), F32(1));
}

static void k_pad_grad_f32(void)
{
    tt_pad_grad_f32(I, I + 4, F32(0), F32(1));
}

static void k_concatenation_grad_f32(void)
{
    int32_t i;
    float *outs[MAX_BUF];
    const int32_t n = I[0];
    for (i = 0; i < n; ++i) {
        outs[i] = F32(1 + i);
    }
    tt_concatenation_grad_f32(n, I + 2, I[1], F32(0), outs);
}

static void k_act_grad_f32(void)
{
    tt_act_grad_f32(I[0], (tt_act)I[1], F32(0), F32(1), F32(2));
}

static void k_softmax_grad_f32(void)
{
    tt_softmax_grad_f32(I[0], I[1], (float)F[0], F32(0), F32(1), F32(2));
}

static void k_unbroadcast_f32(void)
{
    tt_broadcast bc = bcast(I + 1);
    tt_unbroadcast_f32(&bc, (float)F[0], F32(0), F32(1), I[0]);
}

static void k_mul_grad_f32(void)
{
    tt_broadcast bc = bcast(I + 1);
    tt_mul_grad_f32(&bc, F32(0), F32(1), F32(2), I[0]);
}

static void k_logistic_grad_f32(void)
{
    tt_logistic_grad_f32(I[0], F32(0), F32(1), F32(2));
}

static void k_tanh_grad_f32(void)
{
    tt_tanh_grad_f32(I[0], F32(0), F32(1), F32(2));
}

static void k_hard_swish_grad_f32(void)
{
    tt_hard_swish_grad_f32(I[0], F32(0), F32(1), F32(2));
}

static void k_int8_clamp_grad_f32(void) /* ints: n, lo, hi; buffers: dy, y (int8), dx */
{
    tt_int8_clamp_grad_f32(I[0], I[1], I[2], F32(0), S8(1), F32(2));
}

static void k_mask_grad_f32(void) /* ints: n, bit_offset; buffers: mask, dy, dz */
{
    tt_mask_grad_f32(I[0], I[1], (const uint8_t *)B[0], F32(1), F32(2));
}

static void k_leaky_relu_grad_f32(void)
{
    tt_leaky_relu_grad_f32(I[0], (float)F[0], F32(0), F32(1), F32(2));
}

static void k_prelu_grad_f32(void)
{
    tt_broadcast bc = bcast(I);
    tt_prelu_grad_f32(&bc, F32(0), F32(1), F32(2), F32(3));
}

static void k_resize_bilinear_grad_f32(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_bilinear_grad_f32(&p, F32(0), F32(1));
}

static void k_resize_nearest_grad_f32(void)
{
    tt_resize_params p = resize_params(I);
    tt_resize_nearest_grad_f32(&p, F32(0), F32(1));
}

static void k_strided_slice_grad_f32(void)
{
    tt_strided_slice_params p = slice_params(I);
    tt_strided_slice_grad_f32(&p, F32(0), F32(1));
}

static void k_accumulate_f32(void)
{
    tt_accumulate_f32(I[0], F32(0), F32(1));
}

static void k_softmax_cross_entropy_f32(void)
{
    F32(3)[0] = tt_softmax_cross_entropy_f32(I[0], I[1], F32(0), I32(1), F32(2));
}

static void k_mse_f32(void)
{
    F32(3)[0] = tt_mse_f32(I[0], I[1], F32(0), F32(1), F32(2));
}

static void k_sgd_f32(void)
{
    tt_slice s = slice3(I);
    tt_sgd_params p;
    p.lr = (float)F[0]; p.scale = (float)F[1]; p.weight_decay = (float)F[2];
    tt_sgd_f32(&s, &p, F32(0), F32(1));
}

static void k_momentum_f32(void)
{
    tt_slice s = slice3(I);
    tt_momentum_params p;
    p.lr = (float)F[0]; p.momentum = (float)F[1]; p.scale = (float)F[2]; p.weight_decay = (float)F[3];
    tt_momentum_f32(&s, &p, F32(0), F32(1), F32(2));
}

static void k_adam_f32(void)
{
    tt_slice s = slice3(I);
    tt_adam_params p;
    tt_adam_prepare(F[0], F[1], F[2], F[3], I[3], (float)F[4], (float)F[5], &p);
    tt_adam_f32(&s, &p, F32(0), F32(1), F32(2), F32(3));
}

static void k_rmsprop_f32(void)
{
    tt_slice s = slice3(I);
    tt_rmsprop_params p;
    p.lr = (float)F[0]; p.alpha = (float)F[1]; p.one_minus_alpha = (float)F[2]; p.eps = (float)F[3];
    p.scale = (float)F[4]; p.weight_decay = (float)F[5];
    tt_rmsprop_f32(&s, &p, F32(0), F32(1), F32(2));
}

static void k_qas_s8(void)
{
    tt_qas_layout l;
    float factor[4096];
    l.s = slice3(I);
    l.rows_per_channel = I[3];
    l.rounding = (tt_rounding)I[4];
    if (I[5] > 4096) {
        die("too many channels", op);
    }
    tt_qas_factors(I[5], (float)F[0], F32(0), 1.0f, factor);
    tt_qas_update_s8(&l, factor, S8(1), F32(2), F32(3), U32(4));
}

static void k_qas_bias_s32(void)
{
    float factor[4096];
    if (I[0] > 4096) {
        die("too many channels", op);
    }
    tt_qas_factors(I[0], (float)F[0], F32(0), (float)F[1], factor);
    tt_qas_update_bias_s32(I[0], (tt_rounding)I[1], factor, I32(1), F32(2), F32(3), U32(4));
}

static void k_xorshift32(void)
{
    int32_t i;
    for (i = 0; i < I[0]; ++i) {
        U32(1)[i] = tt_xorshift32(U32(0));
    }
}

#endif

/* The dispatch table: one line per kernel variant the tests call. `op` is the IR op whose kernels_c/ops/tt_<op>.c
 * file holds the kernel (or, for support code that is no op, its kernels_c/ file's concern); `name` is what the
 * case file says. tests/test_kernels_c_layout.py checks that every op with C code has its lines here. */
typedef struct {
    const char *op;
    const char *name;
    void (*run)(void);
} tt_driver_op;

static const tt_driver_op KERNELS[] = {
    {"conv2d", "conv2d_s8", k_conv2d_s8},
    {"conv2d", "conv2d_s8_split", k_conv2d_s8_split},
    {"conv2d", "conv2d_f32", k_conv2d_f32},
    {"depthwise_conv2d", "depthwise_conv2d_s8", k_depthwise_conv2d_s8},
    {"depthwise_conv2d", "depthwise_conv2d_s8_inplace", k_depthwise_conv2d_s8_inplace},
    {"depthwise_conv2d", "depthwise_conv2d_f32", k_depthwise_conv2d_f32},
    {"fully_connected", "fully_connected_s8", k_fully_connected_s8},
    {"fully_connected", "fully_connected_f32", k_fully_connected_f32},
    {"add", "add_s8", k_add_s8},
    {"add", "add_f32", k_add_f32},
    {"add", "add_s8_broadcast", k_add_s8_broadcast},
    {"add", "add_f32_broadcast", k_add_f32_broadcast},
    {"sub", "sub_s8", k_sub_s8},
    {"sub", "sub_f32", k_sub_f32},
    {"mul", "mul_s8", k_mul_s8},
    {"mul", "mul_f32", k_mul_f32},
    {"average_pool2d", "average_pool2d_s8", k_average_pool2d_s8},
    {"average_pool2d", "average_pool2d_f32", k_average_pool2d_f32},
    {"max_pool2d", "max_pool2d_s8", k_max_pool2d_s8},
    {"max_pool2d", "max_pool2d_f32", k_max_pool2d_f32},
    {"mean", "mean_s8", k_mean_s8},
    {"mean", "mean_f32", k_mean_f32},
    {"softmax", "softmax_s8", k_softmax_s8},
    {"softmax", "softmax_f32", k_softmax_f32},
    {"relu", "relu_s8", k_relu_s8},
    {"relu", "clamp_f32", k_clamp_f32},
    {"quantize", "quantize_f32_s8", k_quantize_f32_s8},
    {"quantize", "requantize_s8", k_requantize_s8},
    {"dequantize", "dequantize_s8_f32", k_dequantize_s8_f32},
    {"dequantize", "dequantize_per_channel_s8_f32", k_dequantize_per_channel_s8_f32},
    {"pad", "pad_s8", k_pad_s8},
    {"pad", "pad_f32", k_pad_f32},
    {"concatenation", "concatenation_s8", k_concatenation_s8},
    {"concatenation", "concatenation_f32", k_concatenation_f32},
    {"reshape", "copy_s8", k_copy_s8},
    {"reshape", "copy_f32", k_copy_f32},
    {"logistic", "logistic_s8", k_logistic_s8},
    {"logistic", "logistic_f32", k_logistic_f32},
    {"tanh", "tanh_s8", k_tanh_s8},
    {"tanh", "tanh_f32", k_tanh_f32},
    {"hard_swish", "hard_swish_s8", k_hard_swish_s8},
    {"hard_swish", "hard_swish_f32", k_hard_swish_f32},
    {"leaky_relu", "leaky_relu_s8", k_leaky_relu_s8},
    {"leaky_relu", "leaky_relu_f32", k_leaky_relu_f32},
    {"prelu", "prelu_s8", k_prelu_s8},
    {"prelu", "prelu_f32", k_prelu_f32},
    {"strided_slice", "strided_slice_s8", k_strided_slice_s8},
    {"strided_slice", "strided_slice_f32", k_strided_slice_f32},
    {"resize_bilinear", "resize_bilinear_s8", k_resize_bilinear_s8},
    {"resize_bilinear", "resize_bilinear_f32", k_resize_bilinear_f32},
    {"resize_nearest_neighbor", "resize_nearest_s8", k_resize_nearest_s8},
    {"resize_nearest_neighbor", "resize_nearest_f32", k_resize_nearest_f32},
    {"geometry", "out_size_and_pad", k_out_size_and_pad},
#ifndef TT_DRIVER_FORWARD_ONLY
    {"conv2d", "conv2d_grad_input_f32", k_conv2d_grad_input_f32},
    {"conv2d", "conv2d_grad_input_qw_f32", k_conv2d_grad_input_qw_f32},
    {"conv2d", "conv2d_gi_qw_f32_oc", k_conv2d_gi_qw_f32_oc},
    {"conv2d", "conv2d_grad_weight_f32", k_conv2d_grad_weight_f32},
    {"conv2d", "conv2d_grad_weight_qx_f32", k_conv2d_grad_weight_qx_f32},
    {"depthwise_conv2d", "depthwise_conv2d_grad_input_f32", k_depthwise_conv2d_grad_input_f32},
    {"depthwise_conv2d", "dw_conv2d_grad_input_qw_f32", k_dw_conv2d_grad_input_qw_f32},
    {"depthwise_conv2d", "depthwise_conv2d_grad_weight_f32", k_depthwise_conv2d_grad_weight_f32},
    {"transpose_conv", "transpose_conv_s8", k_transpose_conv_s8},
    {"transpose_conv", "transpose_conv_f32", k_transpose_conv_f32},
    {"transpose_conv", "transpose_conv_grad_input_f32", k_transpose_conv_grad_input_f32},
    {"transpose_conv", "transpose_conv_grad_weight_f32", k_transpose_conv_grad_weight_f32},
    {"fully_connected", "fully_connected_grad_input_f32", k_fully_connected_grad_input_f32},
    {"fully_connected", "fc_grad_input_qw_f32", k_fc_grad_input_qw_f32},
    {"fully_connected", "fully_connected_grad_weight_f32", k_fully_connected_grad_weight_f32},
    {"bias_grad", "bias_grad_f32", k_bias_grad_f32},
    {"average_pool2d", "average_pool2d_grad_f32", k_average_pool2d_grad_f32},
    {"max_pool2d", "max_pool2d_grad_f32", k_max_pool2d_grad_f32},
    {"mean", "mean_hw_grad_f32", k_mean_hw_grad_f32},
    {"pad", "pad_grad_f32", k_pad_grad_f32},
    {"concatenation", "concatenation_grad_f32", k_concatenation_grad_f32},
    {"act_grad", "act_grad_f32", k_act_grad_f32},
    {"int8_clamp_grad", "int8_clamp_grad_f32", k_int8_clamp_grad_f32},
    {"mask_grad", "mask_grad_f32", k_mask_grad_f32},
    {"softmax", "softmax_grad_f32", k_softmax_grad_f32},
    {"add", "unbroadcast_f32", k_unbroadcast_f32},
    {"mul", "mul_grad_f32", k_mul_grad_f32},
    {"logistic", "logistic_grad_f32", k_logistic_grad_f32},
    {"tanh", "tanh_grad_f32", k_tanh_grad_f32},
    {"hard_swish", "hard_swish_grad_f32", k_hard_swish_grad_f32},
    {"leaky_relu", "leaky_relu_grad_f32", k_leaky_relu_grad_f32},
    {"prelu", "prelu_grad_f32", k_prelu_grad_f32},
    {"resize_bilinear", "resize_bilinear_grad_f32", k_resize_bilinear_grad_f32},
    {"resize_nearest_neighbor", "resize_nearest_grad_f32", k_resize_nearest_grad_f32},
    {"strided_slice", "strided_slice_grad_f32", k_strided_slice_grad_f32},
    {"grad_accumulate", "accumulate_f32", k_accumulate_f32},
    {"loss", "softmax_cross_entropy_f32", k_softmax_cross_entropy_f32},
    {"loss", "mse_f32", k_mse_f32},
    {"optimizer", "sgd_f32", k_sgd_f32},
    {"optimizer", "momentum_f32", k_momentum_f32},
    {"optimizer", "adam_f32", k_adam_f32},
    {"optimizer", "rmsprop_f32", k_rmsprop_f32},
    {"qas", "qas_s8", k_qas_s8},
    {"qas", "qas_bias_s32", k_qas_bias_s32},
    {"qas", "xorshift32", k_xorshift32},
#endif
};

static void run(void)
{
    size_t k;
    for (k = 0; k < sizeof KERNELS / sizeof KERNELS[0]; ++k) {
        if (strcmp(op, KERNELS[k].name) == 0) {
            KERNELS[k].run();
            return;
        }
    }
    die("unknown op", op);
}

int main(int argc, char **argv)
{
    int a;
    int32_t k;
    for (a = 1; a < argc; ++a) {
        char out_path[4096];
        FILE *f = fopen(argv[a], "rb");
        if (!f) {
            die("cannot open", argv[a]);
        }
        memset(op, 0, sizeof op);
        rd(f, op, 32);
        rd(f, &ni, 4);
        if (ni < 0 || ni > MAX_INT) {
            die("too many ints", op);
        }
        rd(f, I, (size_t)ni * 4);
        rd(f, &nf, 4);
        if (nf < 0 || nf > MAX_FLT) {
            die("too many floats", op);
        }
        rd(f, F, (size_t)nf * 8);
        rd(f, &nb, 4);
        if (nb < 0 || nb > MAX_BUF) {
            die("too many buffers", op);
        }
        for (k = 0; k < nb; ++k) {
            rd(f, &NB[k], 4);
            B[k] = 0;
            if (NB[k] > 0) {
                B[k] = malloc((size_t)NB[k]);
                if (!B[k]) {
                    die("out of memory", op);
                }
                rd(f, B[k], (size_t)NB[k]);
            }
        }
        fclose(f);
        run();
        snprintf(out_path, sizeof out_path, "%s.out", argv[a]);
        f = fopen(out_path, "wb");
        if (!f) {
            die("cannot write", out_path);
        }
        for (k = 0; k < nb; ++k) {
            fwrite(&NB[k], 4, 1, f);
            if (NB[k] > 0) {
                fwrite(B[k], 1, (size_t)NB[k], f);
            }
            free(B[k]);
        }
        fclose(f);
    }
    return 0;
}
