/* conv2d: int8 (plain and split weight) and float32 forward, and its backward conv2d_grad_input (float and
 * int8-weight) and conv2d_grad_weight (whole, output-channel range, int8 input).
 *
 * Forward (also ops/tt_depthwise_conv2d.c): conv2d and depthwise_conv2d, int8 (per-channel) and float32.
 *
 * int8: reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel. Out-of-image taps are skipped, which
 * equals padding (x - z_x) with 0 (the executor's formulation). Accumulation in int32 like the reference; the
 * numpy model wraps the int64 sum to int32, identical whenever the C sum does not overflow (it cannot for any
 * layer with fewer than 2^16 taps per output: |(x - z) * w| <= 255 * 128).
 * float32: acc = 0, += x*w in the order filter y, filter x, input channel (the executor's loop order), then
 * + bias, then the activation clamp.
 *
 * Backward: conv2d and depthwise_conv2d in float32 (grad_ops.conv2d_grad_*, depthwise_conv2d_grad_*).
 *
 * dy is the gradient of the pre-activation output. Input gradients are gathered: each dx element sums its taps
 * in (filter y, filter x) order, as grad_ops accumulates one tap after the other; weight gradients sum over the
 * batch and output positions. Out-of-image taps (padding) contribute nothing, which is what cropping the padded
 * gradient in grad_ops does. Partial weight gradients (sparse update) cover input channels [0, k) only and are
 * stored compact: conv [O,KH,KW,k], depthwise [1,KH,KW,k*M]. */
#include <string.h>

#include "tt_kernels.h"
#include "tt_dot.h"
#include "tt_requant.h"
#include "tt_train_ops.h"
#include "tt_conv_common.h"
#include "tt_f16.h"
#include "tt_pw_s8_avx2.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_conv.h"   /* fp16-mixed's forward sums on Helium, the portable bits (tt_fvec_conv.c) */
#define TT_FVEC_CONV 1
#endif

#ifdef TT_INTERFACE
/* y[B,OH,OW,O] = requant(sum (x - z_x) * w + bias). bias may be NULL. int32 accumulation (never overflows for
 * depth < 2^16 taps; the numpy model wraps the same way). */
void tt_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                  const int32_t *bias, int8_t *y);
/* conv2d with a split weight (sparse update, DESIGN §6): input channels [0, n) of every filter row come from the
 * compact trained slice w_slice [O,KH,KW,n] (SRAM), channels [n, in_c) from the whole frozen weight w [O,KH,KW,in_c]
 * (flash; its first n channels are stale and never read). Same result as tt_conv2d_s8 on the merged weight. */
void tt_conv2d_s8_split(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                        const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y);
void tt_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                   const float *bias, float *y);
/* float32 conv2d with a split weight (w_slice [O,KH,KW,n] for input channels [0, n), w for the rest, as
 * tt_conv2d_s8_split): the bits of tt_conv2d_f32 on the merged weight (the same sums in the same order). */
void tt_conv2d_f32_split(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                         const float *w_slice, int32_t n, const float *bias, float *y);
/* dy is the gradient of the pre-activation output (apply tt_act_grad_f32 first). dx is overwritten. */
void tt_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
/* The same reading a split weight (w_slice / n as tt_conv2d_f32_split): the bits of the merged weight's call. */
void tt_conv2d_grad_input_f32_split(const tt_conv_dims *d, const float *dy, const float *w, const float *w_slice,
                                    int32_t n, float *dx);
/* dw [O,KH,KW,k]: the first k input channels only (k = in_c: the full gradient). */
void tt_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw);
/* Output channels [o0, o1) only: dw [o1-o0,KH,KW,k] holds the rows of o0.. (dw[(o-o0)*KH*KW*k ...]); the bits of
 * those rows of the whole call (which is this with [0, out_c)). For streaming grad-weight -> update per channel. */
void tt_conv2d_grad_weight_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                     const float *x, float *dw);
/* The same three input gradients reading an int8 weight and dequantizing each element where the float kernels read
 * it: f32(q - zero_point[c]) * scale[c] with c the output channel (conv, FC: axis 0; depthwise: axis 3), which is
 * bit-equal to tt_dequantize_per_channel_s8_f32 (an int times a float32 is exact in double), with the same
 * accumulation order; so no fp32 copy of the weight is needed (memplan.fused_dequantize). conv2d also takes a
 * split weight (w_slice / n as tt_conv2d_s8_split; w_slice 0 and n 0: w alone). */
void tt_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w, const int8_t *w_slice,
                                 int32_t n, const float *scale, const int32_t *zero_point, float *dx);
/* The 1x1 stride-1 unpadded case of tt_conv2d_grad_input_qw_f32 (dx [pixels, in_c]) over output channels [o0, o1)
 * only: dy [pixels, o1 - o0] holds their gradients; the sums start at 0 when o0 is 0, else they continue from dx.
 * Calls for consecutive ranges covering [0, out_c) give the bits of the whole call (the positions stream: a block
 * of output channels of every position at a time). com: 0, or a gradient row [o1 - o0] of which every nonzero
 * dy[p, o] is likely a copy (the broadcast mean gradient; only a speed hint: any dy gives the same bits). */
void tt_conv2d_grad_input_qw_f32_oc(int32_t pixels, int32_t in_c, int32_t o0, int32_t o1, const float *dy,
                                    const float *com, const int8_t *w, const int8_t *w_slice, int32_t n,
                                    const float *scale, const int32_t *zero_point, float *dx);
/* conv2d weight gradient of output channels [o0, o1) reading the int8 input x (per-tensor scale / zero point,
 * d->in_c channels of which the first k are trained) and dequantizing each element where it is used: bits of
 * dequantize_slice followed by tt_conv2d_grad_weight_f32_range (ops/tt_conv2d.c). */
void tt_conv2d_grad_weight_qx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                        const int8_t *x, float scale, int32_t zero_point, float *dw);
/* The same reading an fp16 input x (fp16-mixed: the saved activation itself) and widening each element where it is
 * used (exact), so no fp32 copy of it exists: the bits of tt_cast_f16_f32 followed by tt_conv2d_grad_weight_f32_range. */
void tt_conv2d_grad_weight_hx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                        const uint16_t *x, float *dw);
/* fp16-mixed (issue 13): tt_conv2d_f32_split writing each result as fp16 (binary16 bits), rounded once on store:
 * the bits of tt_conv2d_f32_split followed by tt_round_f16, without the fp32 result ever existing (w_slice w, n 0:
 * the whole weight). */
void tt_conv2d_f32_split_hy(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                            const float *w_slice, int32_t n, const float *bias, uint16_t *y);
/* tt_conv2d_grad_input_f32_split reading an fp16 dy (fp16-mixed), widened where it is used (exact): the bits of
 * tt_cast_f16_f32 followed by it, without the fp32 copy of dy (w_slice w, n 0: the whole weight). */
void tt_conv2d_grad_input_hdy_f32_split(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                        const float *w_slice, int32_t n, float *dx);
/* tt_conv2d_grad_input_f32_split (dy fp32) / tt_conv2d_grad_input_hdy_f32_split (dy fp16) writing an fp16 dx, each
 * element's sum rounded once on store: the bits of the fp32-dx kernel followed by tt_round_f16, with no fp32 dx. */
void tt_conv2d_grad_input_f32_split_hdx(const tt_conv_dims *d, const float *dy, const float *w, const float *w_slice,
                                        int32_t n, uint16_t *dx);
void tt_conv2d_grad_input_hdy_split_hdx(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                        const float *w_slice, int32_t n, uint16_t *dx);
/* tt_conv2d_grad_input_hdy_split_hdx / _hdy_f32_split called again and again with the same weight (the positions
 * stream: one input pixel per call; a const weight: every step): *w_ok is -1 at the first call and keeps what the
 * kernel learnt about the weight for the next. */
void tt_conv2d_grad_input_hdy_f32_split_rep(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                            const float *w_slice, int32_t n, int32_t *w_ok, float *dx);
void tt_conv2d_grad_input_hdy_split_hdx_rep(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                            const float *w_slice, int32_t n, int32_t *w_ok, uint16_t *dx);
/* tt_conv2d_grad_weight_f32_range / _hx_f32_range reading an fp16 dy (fp16-mixed: a gradient its kernel wrote as
 * fp16), widened where it is used: the same sums in the same order. */
void tt_conv2d_grad_weight_hdy_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const uint16_t *dy,
                                         const float *x, float *dw);
void tt_conv2d_grad_weight_hdy_hx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1,
                                            const uint16_t *dy, const uint16_t *x, float *dw);
/* tt_conv2d_f32_split reading an fp16 x (widened where it is used: exact), writing y in fp32 or (_hy) in fp16,
 * rounded once on store: the bits of tt_cast_f16_f32 + tt_conv2d_f32_split (+ tt_round_f16) with no fp32 x. */
void tt_conv2d_hx_f32_split(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                            const float *w_slice, int32_t n, const float *bias, float *y);
void tt_conv2d_hx_hy_split(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                           const float *w_slice, int32_t n, const float *bias, uint16_t *y);
/* The three fp16 forms above called again and again with the same weight, bias and clamp (a row stream:
 * codegen.stream_rows, a few rows per call): *w_ok is -1 at the stream's first call and keeps the Helium kernel's
 * weight check (tt_fvec_conv2d_wcheck) for the others. Elsewhere, the plain kernels. */
void tt_conv2d_f32_split_hy_rep(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                                const float *w_slice, int32_t n, const float *bias, int32_t *w_ok, uint16_t *y);
void tt_conv2d_hx_f32_split_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                                const float *w, const float *w_slice, int32_t n, const float *bias, int32_t *w_ok,
                                float *y);
void tt_conv2d_hx_hy_split_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                               const float *w, const float *w_slice, int32_t n, const float *bias, int32_t *w_ok,
                               uint16_t *y);
#endif /* TT_INTERFACE */

/* One block of up to four output channels: weight rows (the split kernel's slice rows for input channels [0, n)),
 * the constant added to an interior output's raw sum (bias - z_x * sum w) and to a border output's reference sum
 * (bias), and the requantization. */
typedef struct {
    const int8_t *w[4];
    const int8_t *ws[4];
    int32_t add[4];
    int32_t bias[4];
    tt_requant_fast f[4];
    tt_requant_mm mm[4];
    const tt_requant_s8 *q; /* the slow path (fast == 0, never seen in practice) recomputes channel oc0 + j's */
    int32_t oc0, nb, fast;
    int32_t mm_ok; /* 1: every channel takes tt_requant_mm (its sums doubled fit int32); 2: and the range is int8's */
} tt_conv_block;

static int8_t tt_block_slow(const tt_conv_block *bk, int32_t j, int32_t v)
{
    const tt_requant1 r = tt_requant_channel(bk->q, bk->oc0 + j);
    return tt_requant_apply(&r, v);
}

/* Raw products of a run of n input bytes with four weight rows ws bytes apart: acc_j += sum x[i] * w_j[i]. */
TT_CONV_INLINE void tt_run4(const int8_t *x, const int8_t *w0, int32_t ws, int32_t n, int32_t *a0, int32_t *a1,
                            int32_t *a2, int32_t *a3)
{
#if TT_DOT_DSP || TT_HOST_SIMD
    int32_t acc[4];
    acc[0] = *a0;
    acc[1] = *a1;
    acc[2] = *a2;
    acc[3] = *a3;
    tt_dot4_raw_s8(x, w0, ws, n, acc);
    *a0 = acc[0];
    *a1 = acc[1];
    *a2 = acc[2];
    *a3 = acc[3];
#else
    {
        /* pointer post-increments: one load per weight byte, one per input byte, nothing else but the loop test */
        const int8_t *w1 = w0 + ws, *w2 = w1 + ws, *w3 = w2 + ws;
        int32_t s0 = *a0, s1 = *a1, s2 = *a2, s3 = *a3;
        const int8_t *const e = x + n;
        while (x < e) {
            const int32_t xv = *x++;
            s0 += xv * *w0++;
            s1 += xv * *w1++;
            s2 += xv * *w2++;
            s3 += xv * *w3++;
        }
        *a0 = s0;
        *a1 = s1;
        *a2 = s2;
        *a3 = s3;
    }
#endif
}

/* Requantizes and stores the four interior sums of a full block. */
/* One output by tt_requant_mm: x = sum + add, doubled. */
#define TT_MM1(bk, j, x) tt_requant_mm_apply((bk)->mm[j].h, (bk)->mm[j].multiplier, (bk)->mm[j].e, 2 * (x))

TT_CONV_INLINE void tt_store4(const tt_conv_block *bk, int32_t lo, int32_t hi, int32_t a0, int32_t a1, int32_t a2,
                              int32_t a3, int8_t *yp)
{
#if TT_SIMD
    if (bk->mm_ok == 2) {
        yp[0] = (int8_t)tt_ssat8(TT_MM1(bk, 0, a0 + bk->add[0]));
        yp[1] = (int8_t)tt_ssat8(TT_MM1(bk, 1, a1 + bk->add[1]));
        yp[2] = (int8_t)tt_ssat8(TT_MM1(bk, 2, a2 + bk->add[2]));
        yp[3] = (int8_t)tt_ssat8(TT_MM1(bk, 3, a3 + bk->add[3]));
        return;
    }
    if (bk->mm_ok) {
        yp[0] = (int8_t)tt_clamp32(TT_MM1(bk, 0, a0 + bk->add[0]), lo, hi);
        yp[1] = (int8_t)tt_clamp32(TT_MM1(bk, 1, a1 + bk->add[1]), lo, hi);
        yp[2] = (int8_t)tt_clamp32(TT_MM1(bk, 2, a2 + bk->add[2]), lo, hi);
        yp[3] = (int8_t)tt_clamp32(TT_MM1(bk, 3, a3 + bk->add[3]), lo, hi);
        return;
    }
#endif
    if (bk->fast) {
        yp[0] = (int8_t)tt_clamp32(tt_requant_fast_apply(bk->f[0].k, bk->f[0].multiplier, bk->f[0].sh, a0 + bk->add[0]),
                                   lo, hi);
        yp[1] = (int8_t)tt_clamp32(tt_requant_fast_apply(bk->f[1].k, bk->f[1].multiplier, bk->f[1].sh, a1 + bk->add[1]),
                                   lo, hi);
        yp[2] = (int8_t)tt_clamp32(tt_requant_fast_apply(bk->f[2].k, bk->f[2].multiplier, bk->f[2].sh, a2 + bk->add[2]),
                                   lo, hi);
        yp[3] = (int8_t)tt_clamp32(tt_requant_fast_apply(bk->f[3].k, bk->f[3].multiplier, bk->f[3].sh, a3 + bk->add[3]),
                                   lo, hi);
    } else {
        yp[0] = tt_block_slow(bk, 0, a0 + bk->add[0]);
        yp[1] = tt_block_slow(bk, 1, a1 + bk->add[1]);
        yp[2] = tt_block_slow(bk, 2, a2 + bk->add[2]);
        yp[3] = tt_block_slow(bk, 3, a3 + bk->add[3]);
    }
}

TT_CONV_INLINE int8_t tt_store1(const tt_conv_block *bk, int32_t j, int32_t lo, int32_t hi, int32_t v)
{
#if TT_SIMD
    if (bk->mm_ok) {
        return (int8_t)tt_clamp32(TT_MM1(bk, j, v), lo, hi);
    }
#endif
    if (bk->fast) {
        return (int8_t)tt_clamp32(tt_requant_fast_apply(bk->f[j].k, bk->f[j].multiplier, bk->f[j].sh, v), lo, hi);
    }
    return tt_block_slow(bk, j, v);
}

#if TT_SIMD && defined(__arm__) && defined(__GNUC__) && defined(__OPTIMIZE__)
#define TT_PW4_ASM 1
/* The pixel loop of tt_pointwise4 for a whole weight (no split), C % 4 == 0 and the one-SMMLAR requantization to
 * the int8 range, written out: per pixel the four dot products of tt_dot4_raw_s8's loop (26 instructions per
 * four input channels), then per channel one LDM of {add, h, multiplier, e} and seven instructions (sum + add,
 * doubled; SMMLAR; shift; SSAT; store). In C (GCC) the block's constants were reloaded field by field and the
 * sums moved through the stack between the dot product and the store: ~34 instructions per output of an
 * 8-channel input against ~26 here. r0 x, r1 the block's row 0, r2 the row stride, r3 words left, r4-r7 the sums,
 * r8-r11 temporaries, r12 / lr the constants and the output; the rest of the state in the frame f. */
typedef struct {
    int32_t qw;         /* C / 4 */
    int32_t C;          /* bytes of a weight row read per pixel (w0 goes back by it) */
    int32_t xadj;       /* xstep - C: x after a pixel's words to the next pixel */
    const int32_t *tab; /* 4 x {add, h, multiplier, e} */
    int8_t *y;
    int32_t ystep;
    int32_t count;
    const int8_t *x;
    const int8_t *w0;
    int32_t ws;
} tt_pw4_frame;

__attribute__((naked, noinline)) static void tt_pw4_run(__attribute__((unused)) tt_pw4_frame *f)
{
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "sub    sp, sp, #8\n\t"
        "str    r0, [sp]\n\t"
        "ldr    r1, [r0, #32]\n\t"
        "ldr    r2, [r0, #36]\n\t"
        "ldr    r0, [r0, #28]\n\t"
        "2:\n\t"
        "movs   r4, #0\n\t"
        "movs   r5, #0\n\t"
        "movs   r6, #0\n\t"
        "movs   r7, #0\n\t"
        "ldr    r12, [sp]\n\t"
        "ldr    r3, [r12]\n\t"
        "1:\n\t"
        "ldr    r8, [r0], #4\n\t"
        "ldr    r10, [r1, r2]\n\t"
        "sxtb16 r9, r8, ror #8\n\t"
        "sxtb16 r8, r8\n\t"
        "sxtb16 r11, r10\n\t"
        "sxtb16 r10, r10, ror #8\n\t"
        "smlad  r5, r8, r11, r5\n\t"
        "smlad  r5, r9, r10, r5\n\t"
        "ldr    r10, [r1, r2, lsl #1]\n\t"
        "sxtb16 r11, r10\n\t"
        "sxtb16 r10, r10, ror #8\n\t"
        "smlad  r6, r8, r11, r6\n\t"
        "smlad  r6, r9, r10, r6\n\t"
        "add    r10, r1, r2, lsl #1\n\t"
        "ldr    r10, [r10, r2]\n\t"
        "sxtb16 r11, r10\n\t"
        "sxtb16 r10, r10, ror #8\n\t"
        "smlad  r7, r8, r11, r7\n\t"
        "smlad  r7, r9, r10, r7\n\t"
        "ldr    r10, [r1], #4\n\t"
        "sxtb16 r11, r10\n\t"
        "sxtb16 r10, r10, ror #8\n\t"
        "smlad  r4, r8, r11, r4\n\t"
        "smlad  r4, r9, r10, r4\n\t"
        "subs   r3, r3, #1\n\t"
        "bne    1b\n\t"
        "ldr    r3, [r12, #4]\n\t"
        "sub    r1, r1, r3\n\t"
        "ldr    r3, [r12, #8]\n\t"
        "add    r0, r0, r3\n\t"
        "ldr    lr, [r12, #16]\n\t"
        "ldr    r12, [r12, #12]\n\t"
        "ldm    r12!, {r8, r9, r10, r11}\n\t"
        "add    r4, r4, r8\n\t"
        "add    r4, r4, r4\n\t"
        "add    r9, r9, r4, asr #31\n\t"
        "smmlar r9, r4, r10, r9\n\t"
        "asr    r9, r9, r11\n\t"
        "ssat   r9, #8, r9\n\t"
        "strb   r9, [lr]\n\t"
        "ldm    r12!, {r8, r9, r10, r11}\n\t"
        "add    r5, r5, r8\n\t"
        "add    r5, r5, r5\n\t"
        "add    r9, r9, r5, asr #31\n\t"
        "smmlar r9, r5, r10, r9\n\t"
        "asr    r9, r9, r11\n\t"
        "ssat   r9, #8, r9\n\t"
        "strb   r9, [lr, #1]\n\t"
        "ldm    r12!, {r8, r9, r10, r11}\n\t"
        "add    r6, r6, r8\n\t"
        "add    r6, r6, r6\n\t"
        "add    r9, r9, r6, asr #31\n\t"
        "smmlar r9, r6, r10, r9\n\t"
        "asr    r9, r9, r11\n\t"
        "ssat   r9, #8, r9\n\t"
        "strb   r9, [lr, #2]\n\t"
        "ldm    r12!, {r8, r9, r10, r11}\n\t"
        "add    r7, r7, r8\n\t"
        "add    r7, r7, r7\n\t"
        "add    r9, r9, r7, asr #31\n\t"
        "smmlar r9, r7, r10, r9\n\t"
        "asr    r9, r9, r11\n\t"
        "ssat   r9, #8, r9\n\t"
        "strb   r9, [lr, #3]\n\t"
        "ldr    r12, [sp]\n\t"
        "ldr    r3, [r12, #20]\n\t"
        "add    lr, lr, r3\n\t"
        "str    lr, [r12, #16]\n\t"
        "ldr    r3, [r12, #24]\n\t"
        "subs   r3, r3, #1\n\t"
        "str    r3, [r12, #24]\n\t"
        "bne    2b\n\t"
        "add    sp, sp, #8\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}

/* Two pixels x two output channels per pass, for pixels `C` bytes apart (1x1 at stride 1, the stem's im2col buffer)
 * whose two weight rows are also `C` bytes apart: one register holds both offsets, which leaves enough registers for
 * both pixels' sign-extended words. Per four input channels 22 instructions for 16 MACs (tt_pw4_run: 26 for 16):
 * each weight word is loaded and sign-extended once for two pixels, each input word once for two channels; the
 * word loop is unrolled twice (an odd count enters at its second half). The sums start at the channels' `add`
 * constants (one LDM per pass instead of four zeroings and four adds); per output channel one LDM of
 * {h, multiplier, e} serves both pixels. The frame is copied onto the stack (SP-relative loads, no frame pointer).
 * r0 x (pixel 1 at [r0, r2]), r1 row 0 (row 1 at [r1, r2]), r2 C, r3 word pairs left, r4/r5 pixel 0's channels
 * 0/1, r6/r7 pixel 1's, r8-r11 the pixels' even / odd int16 lanes, r12 / lr a weight word's lanes. Same
 * requantization as tt_pw4_run (the one-SMMLAR form, int8 range). */
typedef struct {
    int32_t qw;         /* C / 4 */
    int32_t C;          /* pixel stride = weight row stride, bytes */
    int32_t add[2];
    int8_t *y;
    int32_t ystep;
    int32_t pairs;
    const int8_t *x;
    const int8_t *w0;
    const int32_t *hme; /* {h, multiplier, e} of channel 0, then of channel 1 */
} tt_pw22_frame;

#define TT_PW22_OUT(acc, st)                                                                                  \
    "add    " acc ", " acc ", " acc "\n\t"                                                                    \
    "add    r11, r8, " acc ", asr #31\n\t"                                                                    \
    "smmlar r11, " acc ", r9, r11\n\t"                                                                         \
    "asr    r11, r11, r10\n\t"                                                                                \
    "ssat   r11, #8, r11\n\t"                                                                                 \
    "strb   r11, " st "\n\t"

#define TT_PW22_WORD                                                                                          \
    "ldr    r10, [r0, r2]\n\t"                                                                                \
    "ldr    r8, [r0], #4\n\t"                                                                                 \
    "sxtb16 r9, r8, ror #8\n\t"                                                                               \
    "sxtb16 r8, r8\n\t"                                                                                       \
    "sxtb16 r11, r10, ror #8\n\t"                                                                             \
    "sxtb16 r10, r10\n\t"                                                                                     \
    "ldr    r12, [r1, r2]\n\t"                                                                                \
    "sxtb16 lr, r12\n\t"                                                                                      \
    "sxtb16 r12, r12, ror #8\n\t"                                                                             \
    "smlad  r5, r8, lr, r5\n\t"                                                                               \
    "smlad  r7, r10, lr, r7\n\t"                                                                              \
    "smlad  r5, r9, r12, r5\n\t"                                                                              \
    "smlad  r7, r11, r12, r7\n\t"                                                                             \
    "ldr    r12, [r1], #4\n\t"                                                                                \
    "sxtb16 lr, r12\n\t"                                                                                      \
    "sxtb16 r12, r12, ror #8\n\t"                                                                             \
    "smlad  r4, r8, lr, r4\n\t"                                                                               \
    "smlad  r6, r10, lr, r6\n\t"                                                                              \
    "smlad  r4, r9, r12, r4\n\t"                                                                              \
    "smlad  r6, r11, r12, r6\n\t"

__attribute__((naked, noinline)) static void tt_pw22_run(__attribute__((unused)) const tt_pw22_frame *f)
{
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "sub    sp, sp, #44\n\t"
        "ldm    r0, {r1, r2, r3, r4, r5, r6, r7, r8, r9, r10}\n\t"
        "mov    r12, sp\n\t" /* STM through a copy of SP: stack_bound reads an STM based on SP as moving it */
        "stm    r12, {r1, r2, r3, r4, r5, r6, r7, r8, r9, r10}\n\t"
        "mov    r0, r8\n\t"
        "mov    r1, r9\n\t"
        "2:\n\t"
        "ldrd   r4, r5, [sp, #8]\n\t"
        "mov    r6, r4\n\t"
        "mov    r7, r5\n\t"
        "ldr    r3, [sp]\n\t"
        "lsrs   r3, r3, #1\n\t"
        "adc    r3, r3, #0\n\t"
        "bcs    5f\n\t"
        "1:\n\t"
        TT_PW22_WORD
        "5:\n\t"
        TT_PW22_WORD
        "subs   r3, r3, #1\n\t"
        "bne    1b\n\t"
        "sub    r1, r1, r2\n\t"
        "add    r0, r0, r2\n\t"
        "ldr    r12, [sp, #36]\n\t"
        "ldrd   lr, r3, [sp, #16]\n\t"
        "ldm    r12!, {r8, r9, r10}\n\t"
        TT_PW22_OUT("r4", "[lr]")
        TT_PW22_OUT("r6", "[lr, r3]")
        "ldm    r12, {r8, r9, r10}\n\t"
        TT_PW22_OUT("r5", "[lr, #1]")
        "add    r12, lr, #1\n\t"
        TT_PW22_OUT("r7", "[r12, r3]")
        "add    lr, lr, r3, lsl #1\n\t"
        "str    lr, [sp, #16]\n\t"
        "ldr    r3, [sp, #24]\n\t"
        "subs   r3, r3, #1\n\t"
        "str    r3, [sp, #24]\n\t"
        "bne    2b\n\t"
        "add    sp, sp, #44\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}
#undef TT_PW22_WORD

/* Eight input channels (the first expand conv of MobileNet-like networks): one output channel over `count` pixels 8
 * bytes apart, its eight weights held in four registers as int16 lanes, doubled (|2w| <= 256), so the SMLADs give
 * the doubled sum the one-SMMLAR requantization takes, started at 2 * add. Per output 18 instructions for 8 MACs
 * (two loads, four SXTB16, four SMLAD, the requantization, the store and the loop), against ~26 through
 * tt_pw22_run, whose per-pass set-up outweighs its two words. r0 / r1 the pixel's words, r2 the sum, r3 x, r4-r7
 * the weight lanes {w0, w2}, {w1, w3}, {w4, w6}, {w5, w7}, r8 2 * add, r9 h, r10 multiplier, r11 e, r12 y, lr the
 * output step; the end of x on the stack. */
typedef struct {
    int32_t w[4];
    int32_t add2, h, multiplier, e;
    int8_t *y;
    int32_t ystep;
    const int8_t *x, *x_end;
} tt_pw1c8_frame;

__attribute__((naked, noinline)) static void tt_pw1c8_run(__attribute__((unused)) const tt_pw1c8_frame *f)
{
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "sub    sp, sp, #4\n\t"
        "ldm    r0!, {r4, r5, r6, r7, r8, r9, r10, r11, r12, lr}\n\t"
        "ldr    r3, [r0]\n\t"
        "ldr    r1, [r0, #4]\n\t"
        "str    r1, [sp]\n\t"
        "1:\n\t"
        "ldr    r0, [r3], #4\n\t"
        "ldr    r1, [r3], #4\n\t"
        "sxtb16 r2, r0\n\t"
        "smlad  r2, r2, r4, r8\n\t"
        "sxtb16 r0, r0, ror #8\n\t"
        "smlad  r2, r0, r5, r2\n\t"
        "sxtb16 r0, r1\n\t"
        "smlad  r2, r0, r6, r2\n\t"
        "sxtb16 r1, r1, ror #8\n\t"
        "smlad  r2, r1, r7, r2\n\t"
        "add    r0, r9, r2, asr #31\n\t"
        "smmlar r0, r2, r10, r0\n\t"
        "asr    r0, r0, r11\n\t"
        "ssat   r0, #8, r0\n\t"
        "strb   r0, [r12]\n\t"
        "add    r12, r12, lr\n\t"
        "ldr    r1, [sp]\n\t"
        "cmp    r3, r1\n\t"
        "bne    1b\n\t"
        "add    sp, sp, #4\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}

/* A full block of four channels over `count` (>= 1) pixels of eight channels, 8 bytes apart, through tt_pw1c8_run. */
static void tt_pw4c8(const tt_conv_block *bk, const int8_t *x, int32_t count, int8_t *y, int32_t ystep)
{
    int32_t j, i;
    tt_pw1c8_frame f;
    for (j = 0; j < 4; ++j) {
        const int8_t *w = bk->w[j];
        for (i = 0; i < 4; ++i) { /* lanes {0, 2}, {1, 3}, {4, 6}, {5, 7} */
            const int32_t k = (i >> 1) * 4 + (i & 1);
            f.w[i] = (int32_t)tt_pack16(2 * w[k], 2 * w[k + 2]);
        }
        f.add2 = 2 * bk->add[j];
        f.h = bk->mm[j].h;
        f.multiplier = bk->mm[j].multiplier;
        f.e = bk->mm[j].e;
        f.y = y + j;
        f.ystep = ystep;
        f.x = x;
        f.x_end = x + 8 * count;
        tt_pw1c8_run(&f);
    }
}
#undef TT_PW22_OUT

/* A whole 1x1 conv of eight input channels (the first expand conv of MobileNet-like networks, row by row in a row
 * stream) with the pixel outside and the output channels inside: each pixel's eight bytes are sign-extended once
 * into four registers less the zero point (SXTAB16), then per output channel one LDM of eight table words {w lanes
 * {0, 2}, {1, 3}, {4, 6}, {5, 7} doubled, 2 bias, h, multiplier, e}, four SMLAD (the doubled sum, started at
 * 2 bias), the one-SMMLAR requantization and a post-incremented store: ~14.5 cycles per output on the M7 model
 * against 20 through tt_pw1c8_run, whose per-channel calls also cost a frame each. The channels' loop (two a pass;
 * an odd count enters the second half) needs no counter: the last channel's e carries bit 8 (ASR by a register
 * reads its low byte only). Channels in chunks of TT_PWC8_CHUNK (the 768-byte table on the stack; the pixel is
 * extended again per chunk). r0 / r3 / r8-r12 / lr the table words, r1 the table, r2 y, r4-r7 the pixel's lanes;
 * the frame's address at [sp]. */
#define TT_PWC8_CHUNK 24

typedef struct {
    const int8_t *x;    /* the next pixel */
    int32_t xstep;
    int8_t *y;          /* the first output of the chunk's channels */
    int32_t yadj;       /* OC - the chunk's channels: y after a pixel's outputs to the next pixel's */
    int32_t count;      /* pixels left */
    const int32_t *tab; /* 8 words per channel */
    int32_t odd;        /* the chunk's channel count is odd: the loop (two channels a pass) enters its second half */
    uint32_t zoff;      /* -z_x in both int16 lanes: SXTAB16 gives the pixel's lanes minus the zero point */
} tt_pwc8_frame;

/* One output channel of tt_pwc8_run. */
#define TT_PWC8_CHANNEL                                                                                       \
    "ldm    r1!, {r0, r3, r8, r9, r10, r11, r12, lr}\n\t"                                                     \
    "smlad  r10, r4, r0, r10\n\t"                                                                             \
    "smlad  r10, r5, r3, r10\n\t"                                                                             \
    "smlad  r10, r6, r8, r10\n\t"                                                                             \
    "smlad  r10, r7, r9, r10\n\t"                                                                             \
    "add    r11, r11, r10, asr #31\n\t"                                                                       \
    "smmlar r11, r10, r12, r11\n\t"                                                                           \
    "asr    r11, r11, lr\n\t"                                                                                 \
    "ssat   r11, #8, r11\n\t"                                                                                 \
    "strb   r11, [r2], #1\n\t"

__attribute__((naked, noinline)) static void tt_pwc8_run(__attribute__((unused)) tt_pwc8_frame *f)
{
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "sub    sp, sp, #4\n\t"
        "str    r0, [sp]\n\t"
        "ldr    r2, [r0, #8]\n\t"
        "2:\n\t"
        "ldr    r1, [r0]\n\t"
        "ldr    r8, [r1]\n\t"
        "ldr    r9, [r1, #4]\n\t"
        "ldr    r3, [r0, #4]\n\t"
        "add    r1, r1, r3\n\t"
        "str    r1, [r0]\n\t"
        "ldr    r10, [r0, #28]\n\t"
        "sxtab16 r4, r10, r8\n\t"
        "sxtab16 r5, r10, r8, ror #8\n\t"
        "sxtab16 r6, r10, r9\n\t"
        "sxtab16 r7, r10, r9, ror #8\n\t"
        "ldr    r1, [r0, #20]\n\t"
        "ldr    r3, [r0, #24]\n\t"
        "cbnz   r3, 5f\n\t"
        "1:\n\t"
        TT_PWC8_CHANNEL
        "5:\n\t"
        TT_PWC8_CHANNEL
        "tst    lr, #256\n\t"
        "beq    1b\n\t"
        "ldr    r0, [sp]\n\t"
        "ldr    r3, [r0, #12]\n\t"
        "add    r2, r2, r3\n\t"
        "ldr    r3, [r0, #16]\n\t"
        "subs   r3, r3, #1\n\t"
        "str    r3, [r0, #16]\n\t"
        "bne    2b\n\t"
        "add    sp, sp, #4\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}
#undef TT_PWC8_CHANNEL

/* tt_conv2d_s8 of a whole 1x1 conv over `pixels` contiguous pixels of eight input channels through tt_pwc8_run, when
 * every output channel has the one-SMMLAR requantization to the int8 range (the conditions of tt_conv2d_s8_core's
 * mm_ok == 2, with |bias| < 2^28); 0 otherwise, after which the caller computes every output (the input is not the
 * output's memory, so outputs already written are written again with the same bits). */
static int tt_pwc8(const tt_requant_s8 *q, int32_t OC, int32_t pixels, const int8_t *x, const int8_t *w,
                   const int32_t *bias, int8_t *y)
{
    int32_t tab[8 * TT_PWC8_CHUNK];
    const uint32_t zoff = (uint32_t)(uint16_t)(-q->input_zero_point) * 0x00010001u;
    int32_t oc, c0;
    tt_pwc8_frame f;
    if (q->act_min != -128 || q->act_max != 127 || pixels < 1) {
        return 0;
    }
    for (c0 = 0; c0 < OC; c0 += TT_PWC8_CHUNK) {
        const int32_t nc = OC - c0 < TT_PWC8_CHUNK ? OC - c0 : TT_PWC8_CHUNK;
        for (oc = c0; oc < c0 + nc; ++oc) {
            const tt_requant1 r = tt_requant_channel(q, oc);
            const int32_t b = bias != 0 ? bias[oc] : 0;
            const uint32_t lo4 = tt_ld32(w + 8 * oc), hi4 = tt_ld32(w + 8 * oc + 4);
            int32_t *t = tab + 8 * (oc - c0);
            tt_requant_mm mm;
            /* |b| < 2^28 keeps the doubled sum b + sum (x - z) w (|sum| < 2^18) in int32. A channel without the
             * form: nothing more here, and the caller's blocks write every output again (the same bits) */
            if (!tt_requant_mm_init(&mm, &r) || b <= -(1 << 28) || b >= (1 << 28)) {
                return 0;
            }
            /* lanes {0, 2}, {1, 3}, {4, 6}, {5, 7}, doubled: a shift of both lanes, the low lane's top bit cleared
             * out of the high lane's (even) bit 0 */
            t[0] = (int32_t)(((uint32_t)tt_sx02(lo4) << 1) & 0xFFFEFFFFu);
            t[1] = (int32_t)(((uint32_t)tt_sx13(lo4) << 1) & 0xFFFEFFFFu);
            t[2] = (int32_t)(((uint32_t)tt_sx02(hi4) << 1) & 0xFFFEFFFFu);
            t[3] = (int32_t)(((uint32_t)tt_sx13(hi4) << 1) & 0xFFFEFFFFu);
            t[4] = 2 * b;
            t[5] = mm.h;
            t[6] = mm.multiplier;
            t[7] = mm.e | (oc == c0 + nc - 1 ? 256 : 0);
        }
        f.x = x;
        f.xstep = 8;
        f.y = y + c0;
        f.yadj = OC - nc;
        f.count = pixels;
        f.tab = tab;
        f.odd = nc & 1;
        f.zoff = zoff;
        tt_pwc8_run(&f);
    }
    return 1;
}
#else
#define TT_PW4_ASM 0
#endif

#if TT_PW4_ASM
/* count pixels (input rows of C bytes, C % 4 == 0, `xstep` apart) against the block's four weight rows (w0, `ws`
 * apart) through tt_pw4_run; outputs `ystep` apart. */
static void tt_pw4(const tt_conv_block *bk, const int8_t *x, int32_t xstep, int32_t C, const int8_t *w0, int32_t ws,
                   int32_t count, int8_t *y, int32_t ystep)
{
    int32_t tab[16], j;
    tt_pw4_frame f;
    if (xstep == C && ws == C && count >= 2) {
        /* pairs of pixels through tt_pw22_run, channels 0-1 then 2-3; an odd last pixel below */
        tt_pw22_frame g;
        const int32_t pairs = count >> 1;
        for (j = 0; j < 4; j += 2) {
            int32_t t2[6];
            t2[0] = bk->mm[j].h;
            t2[1] = bk->mm[j].multiplier;
            t2[2] = bk->mm[j].e;
            t2[3] = bk->mm[j + 1].h;
            t2[4] = bk->mm[j + 1].multiplier;
            t2[5] = bk->mm[j + 1].e;
            g.qw = C >> 2;
            g.C = C;
            g.add[0] = bk->add[j];
            g.add[1] = bk->add[j + 1];
            g.hme = t2;
            g.y = y + j;
            g.ystep = ystep;
            g.pairs = pairs;
            g.x = x;
            g.w0 = w0 + j * ws;
            tt_pw22_run(&g);
        }
        if ((count & 1) == 0) {
            return;
        }
        x += 2 * pairs * xstep;
        y += 2 * pairs * ystep;
        count = 1;
    }
    for (j = 0; j < 4; ++j) {
        tab[4 * j] = bk->add[j];
        tab[4 * j + 1] = bk->mm[j].h;
        tab[4 * j + 2] = bk->mm[j].multiplier;
        tab[4 * j + 3] = bk->mm[j].e;
    }
    f.qw = C >> 2;
    f.C = C;
    f.xadj = xstep - C;
    f.tab = tab;
    f.y = y;
    f.ystep = ystep;
    f.count = count;
    f.x = x;
    f.w0 = w0;
    f.ws = ws;
    tt_pw4_run(&f);
}

/* One pixel x four output channels with the block's weights widened once per call: tt_pw4w_fill writes the four
 * weight rows as int16 lanes into a table on the stack ({w0, w2}, {w1, w3} of channel 0, then of channels 1-3, per
 * four input channels), so the pixel loop extends only the input: per four input channels one LDR and two SXTAB16
 * of x (which also subtract z_x: the sums are the reference's sum (x - z_x) * w, so no weight sums are needed), two
 * LDM of four lane words (2 cycles each on the M7's 64-bit bus) and eight SMLAD, against the six loads and eight
 * SXTB16 per sixteen MACs of tt_pw22_run. The word loop is unrolled four times (a count not a multiple of 4 enters
 * it past the first count % 4 bodies: three conditional branches); the zero point's lanes sit in r3 during it (the
 * frame's address is kept at [sp]). The sums start at the channels' biases (one LDM); per channel {h, multiplier,
 * e} come with two LDM of six and the requantization is tt_pw4_run's (doubled sum, SMMLAR, shift, SSAT). Table:
 * 4 biases, 8 C / 4 lane words, 12 requantization words. r0 x, r1 the table, r2 passes left, r3 the frame (the
 * zero point's lanes in the loop), r4-r7 the sums, r8 / r9 the input's lanes, r10-r12 / lr weight lanes (the
 * requantization's constants after the loop). Up to 192 input channels in one part: a 1.6 KB table, which keeps
 * the MobileNetV2 firmware's stack bound where it was (a deeper chain elsewhere sets it). */
#define TT_PW4W_MAXC 192

typedef struct {
    const int8_t *x;    /* the next pixel */
    int32_t xadj;       /* xstep - C: x after a pixel's words to the next pixel */
    int8_t *y;
    int32_t ystep;
    uintptr_t end;      /* y's address after the last pixel (tt_pw4w_raw_run: the pixels left) */
    const int32_t *tab; /* 4 biases (doubled for run2), 2 C lane words, 4 x {h, multiplier, e} */
    int32_t iters;      /* passes of the word loop: (C / 4 + 3) / 4 */
    uint32_t entry;     /* C / 4 << 30: one LSLS #1 sets N to its bit 0 and C to its bit 1 (the loop's entry) */
    int32_t *sums;      /* a deep input's partial sums, 4 per pixel (tt_pw4w_raw_run writes, tt_pw4w_fin_run reads) */
    uint32_t zoff;      /* -z_x in both int16 lanes: SXTAB16 gives the input's lanes minus its zero point */
} tt_pw4w_frame;

#define TT_PW4W_WORD                                                                                          \
    "ldr    r8, [r0], #4\n\t"                                                                                 \
    "ldm    r1!, {r10, r11, r12, lr}\n\t"                                                                     \
    "sxtab16 r9, r3, r8, ror #8\n\t"                                                                          \
    "sxtab16 r8, r3, r8\n\t"                                                                                  \
    "smlad  r4, r8, r10, r4\n\t"                                                                              \
    "smlad  r4, r9, r11, r4\n\t"                                                                              \
    "smlad  r5, r8, r12, r5\n\t"                                                                              \
    "smlad  r5, r9, lr, r5\n\t"                                                                               \
    "ldm    r1!, {r10, r11, r12, lr}\n\t"                                                                     \
    "smlad  r6, r8, r10, r6\n\t"                                                                              \
    "smlad  r6, r9, r11, r6\n\t"                                                                              \
    "smlad  r7, r8, r12, r7\n\t"                                                                              \
    "smlad  r7, r9, lr, r7\n\t"

/* The sum acc doubled, its constants h / m / e in three registers, the byte stored at st. */
#define TT_PW4W_OUT(acc, h, m, e, st)                                                                         \
    "add    " acc ", " acc ", " acc "\n\t"                                                                    \
    TT_PW4W_OUT2(acc, h, m, e, st)

/* The same for a sum that is already doubled (the weights' lanes and the biases doubled in the table). */
#define TT_PW4W_OUT2(acc, h, m, e, st)                                                                        \
    "add    " h ", " h ", " acc ", asr #31\n\t"                                                               \
    "smmlar " h ", " acc ", " m ", " h "\n\t"                                                                 \
    "asr    " h ", " h ", " e "\n\t"                                                                          \
    "ssat   " h ", #8, " h "\n\t"                                                                             \
    "strb   " h ", " st "\n\t"

/* The word loop over qw words (r2 its count, r0 x, r1 the weight lanes): unrolled four times, entered by three
 * conditional branches on the count's low bits. */
#define TT_PW4W_LOOP                                                                                          \
    "ldrd   r2, r9, [r3, #24]\n\t"                                                                            \
    "lsls   r9, r9, #1\n\t" /* N: bit 0 of the word count, C: bit 1 */                                       \
    "ldr    r3, [r3, #36]\n\t" /* the zero point's lanes (the frame's address back from [sp] after) */       \
    "bhi    6f\n\t"                                                                                           \
    "bcs    7f\n\t"                                                                                           \
    "bmi    8f\n\t"                                                                                           \
    "1:\n\t"                                                                                                  \
    TT_PW4W_WORD                                                                                              \
    "6:\n\t"                                                                                                  \
    TT_PW4W_WORD                                                                                              \
    "7:\n\t"                                                                                                  \
    TT_PW4W_WORD                                                                                              \
    "8:\n\t"                                                                                                  \
    TT_PW4W_WORD                                                                                              \
    "subs   r2, r2, #1\n\t"                                                                                   \
    "bne    1b\n\t"                                                                                           \
    "ldr    r3, [sp]\n\t"

/* After the loop (r1 at the table's requantization words): the four outputs, y and x to the next pixel's; the next
 * pixel until y reaches the end. */
#define TT_PW4W_STORE(OUT)                                                                                    \
    "ldm    r1!, {r8, r9, r10, r11, r12, lr}\n\t"                                                             \
    "ldr    r2, [r3, #8]\n\t"                                                                                 \
    OUT("r4", "r8", "r9", "r10", "[r2]")                                                                      \
    OUT("r5", "r11", "r12", "lr", "[r2, #1]")                                                                 \
    "ldm    r1, {r8, r9, r10, r11, r12, lr}\n\t"                                                              \
    OUT("r6", "r8", "r9", "r10", "[r2, #2]")                                                                  \
    OUT("r7", "r11", "r12", "lr", "[r2, #3]")                                                                 \
    "ldrd   r1, r8, [r3, #12]\n\t"                                                                            \
    "add    r2, r2, r1\n\t"                                                                                   \
    "str    r2, [r3, #8]\n\t"                                                                                 \
    "ldr    r1, [r3, #4]\n\t"                                                                                 \
    "add    r0, r0, r1\n\t"                                                                                   \
    "cmp    r2, r8\n\t"                                                                                       \
    "bne    2b\n\t"

/* tt_pw4w_raw_run: x to the next pixel; the next pixel while any is left. */
#define TT_PW4W_NEXT                                                                                          \
    "ldr    r1, [r3, #4]\n\t"                                                                                 \
    "add    r0, r0, r1\n\t"                                                                                   \
    "ldr    r2, [r3, #16]\n\t"                                                                                \
    "subs   r2, r2, #1\n\t"                                                                                   \
    "str    r2, [r3, #16]\n\t"                                                                                \
    "bne    2b\n\t"

/* The four pixel loops' common frame: registers saved, the frame pointer kept at [sp], the pixel count in r0, the
 * loop label and the table pointer in r1; and the way out. */
#define TT_PW4W_ENTER                                                                                             \
    "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"                                                          \
    "sub    sp, sp, #8\n\t"                                                                                       \
    "str    r0, [sp]\n\t"                                                                                         \
    "mov    r3, r0\n\t"                                                                                           \
    "ldr    r0, [r3]\n\t"                                                                                         \
    "2:\n\t"                                                                                                      \
    "ldr    r1, [r3, #20]\n\t"
#define TT_PW4W_LEAVE                                                                                             \
    "add    sp, sp, #8\n\t"                                                                                       \
    "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t"

/* The whole input per pixel: sums from the biases, the outputs stored. */
__attribute__((naked, noinline)) static void tt_pw4w_run(__attribute__((unused)) tt_pw4w_frame *f)
{
    __asm__ volatile(
        TT_PW4W_ENTER
        "ldm    r1!, {r4, r5, r6, r7}\n\t"
        TT_PW4W_LOOP
        TT_PW4W_STORE(TT_PW4W_OUT)
        TT_PW4W_LEAVE);
}

/* tt_pw4w_run over a table whose lanes and biases are doubled (the sums arrive doubled: one ADD less per output). */
__attribute__((naked, noinline)) static void tt_pw4w_run2(__attribute__((unused)) tt_pw4w_frame *f)
{
    __asm__ volatile(
        TT_PW4W_ENTER
        "ldm    r1!, {r4, r5, r6, r7}\n\t"
        TT_PW4W_LOOP
        TT_PW4W_STORE(TT_PW4W_OUT2)
        TT_PW4W_LEAVE);
}

/* The first part of a deep input: sums from the biases, written to f->sums (four per pixel). */
__attribute__((naked, noinline)) static void tt_pw4w_raw_run(__attribute__((unused)) tt_pw4w_frame *f)
{
    __asm__ volatile(
        TT_PW4W_ENTER
        "ldm    r1!, {r4, r5, r6, r7}\n\t"
        TT_PW4W_LOOP
        "ldr    r8, [r3, #32]\n\t"
        "stm    r8!, {r4, r5, r6, r7}\n\t"
        "str    r8, [r3, #32]\n\t"
        TT_PW4W_NEXT
        TT_PW4W_LEAVE);
}

/* The second part: sums from f->sums, the outputs stored. */
__attribute__((naked, noinline)) static void tt_pw4w_fin_run(__attribute__((unused)) tt_pw4w_frame *f)
{
    __asm__ volatile(
        TT_PW4W_ENTER
        "add    r1, r1, #16\n\t"
        "ldr    r8, [r3, #32]\n\t"
        "ldm    r8!, {r4, r5, r6, r7}\n\t"
        "str    r8, [r3, #32]\n\t"
        TT_PW4W_LOOP
        TT_PW4W_STORE(TT_PW4W_OUT)
        TT_PW4W_LEAVE);
}
#undef TT_PW4W_ENTER
#undef TT_PW4W_LEAVE
#undef TT_PW4W_LOOP
#undef TT_PW4W_STORE
#undef TT_PW4W_NEXT
#undef TT_PW4W_WORD
#undef TT_PW4W_OUT
#undef TT_PW4W_OUT2

/* Two int16 lanes doubled (|2w| <= 256): both shifted, the low lane's top bit cleared out of the high lane's bit 0
 * (0 in a doubled value). */
#define TT_DBL16(v) ((int32_t)(((uint32_t)(v) << 1) & 0xFFFEFFFFu))

static inline __attribute__((always_inline)) int32_t *
tt_pw4w_widen_as(int32_t *d, const int8_t *w0, const int8_t *w1, const int8_t *w2, const int8_t *w3, int32_t words,
                 int dbl)
{
    for (; words > 0; --words, d += 8) {
        const uint32_t a = tt_ld32(w0), b = tt_ld32(w1), c = tt_ld32(w2), e = tt_ld32(w3);
        w0 += 4;
        w1 += 4;
        w2 += 4;
        w3 += 4;
        d[0] = dbl ? TT_DBL16(tt_sx02(a)) : (int32_t)tt_sx02(a);
        d[1] = dbl ? TT_DBL16(tt_sx13(a)) : (int32_t)tt_sx13(a);
        d[2] = dbl ? TT_DBL16(tt_sx02(b)) : (int32_t)tt_sx02(b);
        d[3] = dbl ? TT_DBL16(tt_sx13(b)) : (int32_t)tt_sx13(b);
        d[4] = dbl ? TT_DBL16(tt_sx02(c)) : (int32_t)tt_sx02(c);
        d[5] = dbl ? TT_DBL16(tt_sx13(c)) : (int32_t)tt_sx13(c);
        d[6] = dbl ? TT_DBL16(tt_sx02(e)) : (int32_t)tt_sx02(e);
        d[7] = dbl ? TT_DBL16(tt_sx13(e)) : (int32_t)tt_sx13(e);
    }
    return d;
}

/* `words` words of four rows widened into lane words at d (per word: row 0's {0, 2}, {1, 3}, then rows 1-3's),
 * doubled when dbl; the end of what was written. */
static int32_t *tt_pw4w_widen(int32_t *d, const int8_t *w0, const int8_t *w1, const int8_t *w2, const int8_t *w3,
                              int32_t words, int dbl)
{
    return dbl ? tt_pw4w_widen_as(d, w0, w1, w2, w3, words, 1) : tt_pw4w_widen_as(d, w0, w1, w2, w3, words, 0);
}

/* The table of tt_pw4w_run for input channels [k0, k1) (multiples of 4) of the block's four rows (a split weight's
 * rows: channels [0, n) from bk->ws): the biases, the lane words, the requantization words; dbl: lanes and biases
 * doubled, for tt_pw4w_run2 (|2 bias| < 2^30: mm_ok's bound). */
static void tt_pw4w_fill(const tt_conv_block *bk, int32_t n, int32_t k0, int32_t k1, int32_t *tab, int dbl)
{
    int32_t *d = tab + 4;
    int32_t j, k = k0;
    if (k < n) {
        const int32_t whole = (k1 < n ? k1 : n) & ~3; /* the slice's whole words */
        if (whole > k) {
            d = tt_pw4w_widen(d, bk->ws[0] + k, bk->ws[1] + k, bk->ws[2] + k, bk->ws[3] + k, (whole - k) >> 2,
                              dbl);
            k = whole;
        }
        if (k < n && k < k1) { /* the word across the split */
            for (j = 0; j < 4; ++j) {
                uint32_t ww = 0;
                int32_t b;
                for (b = 0; b < 4; ++b) {
                    ww |= (uint32_t)(uint8_t)(k + b < n ? bk->ws[j][k + b] : bk->w[j][k + b]) << (8 * b);
                }
                *d++ = dbl ? TT_DBL16(tt_sx02(ww)) : (int32_t)tt_sx02(ww);
                *d++ = dbl ? TT_DBL16(tt_sx13(ww)) : (int32_t)tt_sx13(ww);
            }
            k += 4;
        }
    }
    if (k < k1) {
        d = tt_pw4w_widen(d, bk->w[0] + k, bk->w[1] + k, bk->w[2] + k, bk->w[3] + k, (k1 - k) >> 2, dbl);
    }
    for (j = 0; j < 4; ++j) {
        tab[j] = dbl ? 2 * bk->bias[j] : bk->bias[j];
        *d++ = bk->mm[j].h;
        *d++ = bk->mm[j].multiplier;
        *d++ = bk->mm[j].e;
    }
}

/* Pixels per pass of a deep input (its partial sums on the stack). */
#define TT_PW4W_GROUP 16

/* count (>= 1) pixels of C (C % 4 == 0, 4 <= C <= 2 TT_PW4W_MAXC) input bytes `xstep` apart against the block's four
 * weight rows (the block's mm_ok == 2; a split weight's rows: input channels [0, n) from bk->ws), outputs `ystep`
 * apart, through tt_pw4w_run; a deeper input than the table holds in two parts (the first part's sums kept per
 * pixel, TT_PW4W_GROUP pixels at a time: integer sums in another order, the same bits). */
static void tt_pw4w(const tt_conv_block *bk, int32_t n, const int8_t *x, int32_t xstep, int32_t C, int32_t count,
                    int8_t *y, int32_t ystep)
{
    int32_t tab[4 + 2 * TT_PW4W_MAXC + 12];
    tt_pw4w_frame f;
    f.xadj = xstep - C;
    f.ystep = ystep;
    f.tab = tab;
    f.sums = 0;
    f.zoff = (uint32_t)(uint16_t)(-bk->q->input_zero_point) * 0x00010001u;
    if (C <= TT_PW4W_MAXC) {
        /* doubling the table costs ~4 C instructions, and saves 4 per pixel */
        const int dbl = count > C;
        tt_pw4w_fill(bk, n, 0, C, tab, dbl);
        f.x = x;
        f.y = y;
        f.end = (uintptr_t)y + (uintptr_t)(count * ystep);
        f.iters = ((C >> 2) + 3) >> 2;
        f.entry = (uint32_t)(C >> 2) << 30;
        if (dbl) {
            tt_pw4w_run2(&f);
        } else {
            tt_pw4w_run(&f);
        }
    } else {
        const int32_t h = ((C >> 1) + 3) & ~3; /* the first part's channels: [0, h), then [h, C) */
        int32_t sums[4 * TT_PW4W_GROUP], p0;
        for (p0 = 0; p0 < count; p0 += TT_PW4W_GROUP) {
            const int32_t np = count - p0 < TT_PW4W_GROUP ? count - p0 : TT_PW4W_GROUP;
            tt_pw4w_fill(bk, n, 0, h, tab, 0);
            f.x = x + p0 * xstep;
            f.xadj = xstep - h;
            f.end = (uintptr_t)np;
            f.iters = ((h >> 2) + 3) >> 2;
            f.entry = (uint32_t)(h >> 2) << 30;
            f.sums = sums;
            tt_pw4w_raw_run(&f);
            tt_pw4w_fill(bk, n, h, C, tab, 0);
            f.x = x + p0 * xstep + h;
            f.xadj = xstep - (C - h);
            f.y = y + p0 * ystep;
            f.end = (uintptr_t)f.y + (uintptr_t)(np * ystep);
            f.iters = (((C - h) >> 2) + 3) >> 2;
            f.entry = (uint32_t)((C - h) >> 2) << 30;
            f.sums = sums;
            tt_pw4w_fin_run(&f);
        }
    }
}

/* A k_h x k_w conv's interior run through tt_pw4 (im2col): each output's filter rows (contiguous: no split, no
 * dilation along x) copied side by side into a small buffer, zero-padded to whole words, the block's four weight
 * rows padded alike (zero products: the same sums). TT_I2C_K bytes per output at most; TT_I2C_P outputs per pass. */
#define TT_I2C_K 32
#define TT_I2C_P 8

/* The filter rows of np outputs (`xstep` apart; kh rows of `row` bytes, `xrow` apart) side by side into slots of
 * kp bytes. Word copies written as loops: GCC's loop-distribution would turn them into memcpy calls, which cost
 * more than the few words each moves, hence the attribute. */
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns"))) static void
tt_i2c_fill(int8_t *dst, int32_t kp, const int8_t *x, int32_t xstep, int32_t np, int32_t kh, int32_t row, int32_t xrow)
{
    int32_t p, ky, n;
    for (p = 0; p < np; ++p, dst += kp, x += xstep) {
        int8_t *d = dst;
        for (ky = 0; ky < kh; ++ky) {
            const int8_t *s = x + ky * xrow;
            for (n = row; n >= 4; n -= 4, d += 4, s += 4) {
                uint32_t v;
                memcpy(&v, s, 4);
                memcpy(d, &v, 4);
            }
            if (n & 2) { /* the tail without a loop: a halfword, then a byte */
                uint16_t h;
                memcpy(&h, s, 2);
                memcpy(d, &h, 2);
                d += 2;
                s += 2;
            }
            if (n & 1) {
                *d++ = *s;
            }
        }
    }
}

static inline void tt_i2c_zero_tail(int8_t *slot, int32_t kp)
{
    const uint32_t z = 0;
    memcpy(slot + kp - 4, &z, 4);
}
#endif

/* A run of `count` interior outputs of a full block (k_h x k_w filter), input pixels `xstep` bytes apart, output
 * pixels consecutive: per tap, input channels [0, n) with the slice rows and [n, in_c) with the frozen rows; a
 * whole filter row is one contiguous run when there is no split and no dilation along x. */
TT_CONV_NOINLINE void tt_conv_run4(const tt_geom *g, const tt_conv_block *bk, int32_t n, int32_t lo, int32_t hi,
                                   const int8_t *x, int32_t xstep, int32_t count, int8_t *y)
{
    const int32_t C = g->in_c, KH = g->k_h, KW = g->k_w, row = KW * C, xrow = g->dil_h * g->in_w * C;
    const int32_t xtap = g->dil_w * C, OC = g->out_c, contiguous = n == 0 && g->dil_w == 1;
    const int8_t *w0 = bk->w[0];
    const int32_t K = KH * row, S = KH * KW * n; /* the block's rows: whole weight, slice */
    int32_t p, ky, kx;
#if TT_PW4_ASM
    if (contiguous && bk->mm_ok == 2 && K <= TT_I2C_K) {
        const int32_t Kp = (K + 3) & ~3;
        int8_t wbuf[4 * TT_I2C_K], xbuf[TT_I2C_P * TT_I2C_K];
        int32_t j, p0;
        for (j = 0; j < 4; ++j) {
            tt_i2c_zero_tail(wbuf + j * Kp, Kp);
            tt_i2c_fill(wbuf + j * Kp, Kp, bk->w[j], 0, 1, 1, K, 0);
        }
        for (p = 0; p < TT_I2C_P; ++p) {
            tt_i2c_zero_tail(xbuf + p * Kp, Kp);
        }
        for (p0 = 0; p0 < count; p0 += TT_I2C_P) {
            const int32_t np = count - p0 < TT_I2C_P ? count - p0 : TT_I2C_P;
            tt_i2c_fill(xbuf, Kp, x + p0 * xstep, xstep, np, KH, row, xrow);
            tt_pw4(bk, xbuf, Kp, Kp, wbuf, Kp, np, y + p0 * OC, OC);
        }
        return;
    }
#endif
    for (p = 0; p < count; ++p) {
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (ky = 0; ky < KH; ++ky) {
            const int8_t *xp = x + ky * xrow;
            const int32_t wo = ky * row;
            if (contiguous) {
                tt_run4(xp, w0 + wo, K, row, &a0, &a1, &a2, &a3);
            } else {
                for (kx = 0; kx < KW; ++kx) {
                    const int32_t o = wo + kx * C + n, os = (ky * KW + kx) * n;
                    const int8_t *xt = xp + kx * xtap;
                    if (n > 0) {
                        tt_run4(xt, bk->ws[0] + os, S, n, &a0, &a1, &a2, &a3);
                    }
                    tt_run4(xt + n, w0 + o, K, C - n, &a0, &a1, &a2, &a3);
                }
            }
        }
        tt_store4(bk, lo, hi, a0, a1, a2, a3, y);
        x += xstep;
        y += OC;
    }
}

/* Raw sum of an interior output for one channel of a block. */
static int32_t tt_conv_interior1(const tt_geom *g, const tt_conv_block *bk, int32_t j, int32_t n, const int8_t *x0)
{
    const int32_t C = g->in_c, xrow = g->dil_h * g->in_w * C, xtap = g->dil_w * C;
    int32_t s = 0, ky, kx;
    for (ky = 0; ky < g->k_h; ++ky) {
        for (kx = 0; kx < g->k_w; ++kx) {
            const int32_t o = (ky * g->k_w + kx) * C, os = (ky * g->k_w + kx) * n;
            const int8_t *xt = x0 + ky * xrow + kx * xtap;
            if (n > 0) {
                s += tt_dot1_raw_s8(xt, bk->ws[j] + os, n);
            }
            s += tt_dot1_raw_s8(xt + n, bk->w[j] + o + n, C - n);
        }
    }
    return s;
}

/* A border output (some taps outside the image): the reference formulation, (x - z_x) * w over in-image taps. */
static int32_t tt_conv_border(const tt_geom *g, const int8_t *xb, const int8_t *wr, const int8_t *wsr, int32_t n,
                              int32_t oy, int32_t ox, int32_t zin)
{
    int32_t ky, kx, acc = 0;
    const int32_t iy0 = oy * g->stride_h - g->pad_top, ix0 = ox * g->stride_w - g->pad_left, C = g->in_c;
    for (ky = 0; ky < g->k_h; ++ky) {
        const int32_t iy = iy0 + ky * g->dil_h;
        if (iy < 0 || iy >= g->in_h) {
            continue;
        }
        for (kx = 0; kx < g->k_w; ++kx) {
            const int32_t ix = ix0 + kx * g->dil_w, t = ky * g->k_w + kx;
            const int8_t *xp = xb + (iy * g->in_w + ix) * C;
            if (ix < 0 || ix >= g->in_w) {
                continue;
            }
            if (n > 0) {
                acc += tt_dot_s8(xp, wsr + t * n, n, zin);
            }
            acc += tt_dot_s8(xp + n, wr + t * C + n, C - n, zin);
        }
    }
    return acc;
}

/* 1x1 conv, four output channels, over `count` pixels spaced `xstep` input bytes apart (output pixels are
 * consecutive): the channel block's constants stay put while the pixels stream by. */

TT_CONV_NOINLINE void tt_pointwise4(const tt_conv_block *bk, int32_t C, int32_t n, int32_t OC, int32_t lo, int32_t hi,
                          const int8_t *x, int32_t xstep, int32_t count, int8_t *y)
{
    const int8_t *w0 = bk->w[0] + n, *s0 = bk->ws[0];
    const int32_t rest = C - n;
    int32_t p;
#if TT_PW4_ASM
    if (bk->mm_ok == 2 && n == 0 && C == 8 && xstep == 8 && count > 0) {
        tt_pw4c8(bk, x, count, y, OC);
        return;
    }
    if (bk->mm_ok == 2 && (C & 3) == 0 && C > 0 && C <= 2 * TT_PW4W_MAXC && count > 1) {
        /* the widened weights' pass (a split weight's rows widened from its two parts) */
        tt_pw4w(bk, n, x, xstep, C, count, y, OC);
        return;
    }
    if (bk->mm_ok == 2 && n == 0 && (C & 3) == 0 && C > 0 && count > 0) { /* one pixel, or C > 2 TT_PW4W_MAXC */
        tt_pw4(bk, x, xstep, C, w0, C, count, y, OC);
        return;
    }
#endif
    for (p = 0; p < count; ++p) {
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        if (n > 0) {
            tt_run4(x, s0, n, n, &a0, &a1, &a2, &a3);
        }
        tt_run4(x + n, w0, C, rest, &a0, &a1, &a2, &a3);
        tt_store4(bk, lo, hi, a0, a1, a2, a3, y);
        x += xstep;
        y += OC;
    }
}

/* The sum of channel j's weights over the block's filter (a split weight: input channels [0, n) from its slice). */
static int32_t tt_block_wsum(const tt_geom *g, const tt_conv_block *bk, int32_t j, int32_t n)
{
    const int32_t taps = g->k_h * g->k_w;
    int32_t sw = 0, t;
    if (n == 0) {
        return tt_sum_s8(bk->w[j], taps * g->in_c);
    }
    for (t = 0; t < taps; ++t) {
        sw += tt_sum_s8(bk->ws[j] + t * n, n) + tt_sum_s8(bk->w[j] + t * g->in_c + n, g->in_c - n);
    }
    return sw;
}

#if TT_PW4_ASM
/* ---- small-K convs by rows of im2col (the stem: 3x3 over 3 channels) ------------------------------------------
 * A conv whose filter window is at most TT_I2C_K bytes (no split, no dilation along x, whole blocks of four output
 * channels, the int8 range), output row by output row: the windows of a pass of outputs are copied once, border
 * outputs included (their taps outside the image hold z_x), widened to int16 lanes once (SXTB16: each window word
 * as its bytes 0/2 and 1/3), and every pair of output channels then runs tt_i2c22_run over them with its weights
 * widened alike at set-up. The sum over all taps of x * w plus bias - z_x * (sum w) is the reference's sum of
 * (x - z_x) * w over the in-image taps (the padding's z_x * w cancel): the same int32, the same bits, with no
 * per-output reference loop at the border, each window copied and widened once for all channels, and no
 * sign-extension in the MAC loop (11 instructions per window word for two outputs x two channels, 16 MACs). */
#define TT_I2C_PASS 8    /* outputs per pass (even) */
#define TT_I2C_CH 16     /* output channels set up together (their windows shared) */

/* Two outputs x two channels over int16 windows, the int8 range (tt_requant_mm, one SMMLAR): per pixel pair and
 * window word one LDM of the pair's four widened words, two LDRD of the channels' and eight SMLAD. The sums start
 * at the channels' constants (bias - z_x * sum w); per pair the four outputs are requantized as tt_store4 does
 * (doubled, SMMLAR with h - [x < 0], shift, SSAT) and stored, pixel 1's first (ystep 0 lets an odd last pixel's
 * dummy partner be overwritten). r1 x, r2 w, r3 words left, r4-r7 the sums (pixel 0 / 1, channel 0 / 1), r8-r11
 * the window words, r12 / lr a channel's weight words; the frame pointer at [sp]. */
typedef struct {
    const int16_t *x; /* 0: per pixel pair and window word: p0 (bytes 0/2), p0 (1/3), p1 (0/2), p1 (1/3) */
    const int16_t *w; /* 4: per window word: c0 (0/2), c0 (1/3), c1 (0/2), c1 (1/3) */
    int32_t words;    /* 8: window words */
    int32_t pairs;    /* 12: pixel pairs left */
    int8_t *y;        /* 16: pixel 0's output of channel 0 (channel 1 the next byte) */
    int32_t ystep;    /* 20: bytes from pixel 0's outputs to pixel 1's, and half the step to the next pair */
    int32_t add[2];   /* 24: the channels' constants */
    int32_t hme[6];   /* 32: {h, multiplier, e} of channel 0, then of channel 1 */
} tt_i2c22_frame;

#define TT_I2C22_OUT(acc, addr)                                                                               \
    "add    " acc ", " acc ", " acc "\n\t"                                                                    \
    "add    r11, r8, " acc ", asr #31\n\t"                                                                    \
    "smmlar r11, " acc ", r9, r11\n\t"                                                                         \
    "asr    r11, r11, r10\n\t"                                                                                \
    "ssat   r11, #8, r11\n\t"                                                                                 \
    "strb   r11, " addr "\n\t"

__attribute__((naked, noinline)) static void tt_i2c22_run(__attribute__((unused)) tt_i2c22_frame *f)
{
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "sub    sp, sp, #8\n\t"
        "str    r0, [sp]\n\t"
        "ldr    r1, [r0]\n\t"
        "2:\n\t"
        "ldr    r12, [sp]\n\t"
        "ldr    r2, [r12, #4]\n\t"
        "ldr    r3, [r12, #8]\n\t"
        "ldrd   r4, r5, [r12, #24]\n\t"
        "mov    r6, r4\n\t"
        "mov    r7, r5\n\t"
        "1:\n\t"
        "ldm    r1!, {r8, r9, r10, r11}\n\t"
        "ldrd   r12, lr, [r2], #8\n\t"
        "smlad  r4, r8, r12, r4\n\t"
        "smlad  r4, r9, lr, r4\n\t"
        "smlad  r6, r10, r12, r6\n\t"
        "smlad  r6, r11, lr, r6\n\t"
        "ldrd   r12, lr, [r2], #8\n\t"
        "smlad  r5, r8, r12, r5\n\t"
        "smlad  r5, r9, lr, r5\n\t"
        "smlad  r7, r10, r12, r7\n\t"
        "smlad  r7, r11, lr, r7\n\t"
        "subs   r3, r3, #1\n\t"
        "bne    1b\n\t"
        "ldr    r12, [sp]\n\t"
        "ldr    lr, [r12, #16]\n\t"
        "ldr    r3, [r12, #20]\n\t"
        "add    r12, r12, #32\n\t"
        "ldm    r12!, {r8, r9, r10}\n\t"
        "add    r2, lr, r3\n\t"
        TT_I2C22_OUT("r6", "[r2]")
        TT_I2C22_OUT("r4", "[lr]")
        "ldm    r12, {r8, r9, r10}\n\t"
        TT_I2C22_OUT("r7", "[r2, #1]")
        TT_I2C22_OUT("r5", "[lr, #1]")
        "ldr    r12, [sp]\n\t"
        "add    lr, lr, r3, lsl #1\n\t"
        "str    lr, [r12, #16]\n\t"
        "ldr    r3, [r12, #12]\n\t"
        "subs   r3, r3, #1\n\t"
        "str    r3, [r12, #12]\n\t"
        "bne    2b\n\t"
        "add    sp, sp, #8\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}
#undef TT_I2C22_OUT

/* The window of output (oy, ox) with bounds checks into dst (K bytes; z_x outside the image). Byte loops (a tap
 * is a few channels: no library calls). */
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns"))) static void tt_i2c_pad_px(const tt_geom *g, const int8_t *xb, int32_t oy, int32_t ox, int8_t zin, int8_t *dst)
{
    const int32_t C = g->in_c, iy0 = oy * g->stride_h - g->pad_top, ix0 = ox * g->stride_w - g->pad_left;
    int32_t ky, kx;
    for (ky = 0; ky < g->k_h; ++ky) {
        const int32_t iy = iy0 + ky * g->dil_h;
        for (kx = 0; kx < g->k_w; ++kx, dst += C) {
            const int32_t ix = ix0 + kx;
            int32_t c;
            if (iy < 0 || iy >= g->in_h || ix < 0 || ix >= g->in_w) {
                for (c = 0; c < C; ++c) {
                    dst[c] = zin;
                }
            } else {
                const int8_t *const src = xb + (iy * g->in_w + ix) * C;
                for (c = 0; c < C; ++c) {
                    dst[c] = src[c];
                }
            }
        }
    }
}

/* Windows of `n` outputs (Kp bytes each, n even) widened into tt_i2c22_run's pixel-pair layout. */
static void tt_i2c_widen_x(const int8_t *src, int32_t Kp, int32_t n, int16_t *dst)
{
    const int32_t words = Kp >> 2;
    int32_t p, k;
    for (p = 0; p < n; p += 2, src += 2 * Kp) {
        for (k = 0; k < words; ++k, dst += 8) {
            const uint32_t u = tt_ld32(src + 4 * k), v = tt_ld32(src + Kp + 4 * k);
            const int16x2_t w4[4] = {tt_sx02(u), tt_sx13(u), tt_sx02(v), tt_sx13(v)};
            memcpy(dst, w4, sizeof w4);
        }
    }
}

/* Whether tt_i2c_rows takes the conv (before anything is written): the geometry, and every channel's
 * requantization in tt_i2c22_run's form (tt_requant_mm, the int8 range, |bias| small enough for the doubled
 * sums). */
static int tt_i2c_rows_fit(const tt_geom *g, const tt_requant_s8 *q, const int32_t *bias)
{
    const int32_t K = g->k_h * g->k_w * g->in_c;
    int32_t oc;
    if (g->k_h * g->k_w == 1 || g->dil_w != 1 || K > TT_I2C_K || (g->out_c & 3) != 0 || q->act_min != -128 ||
        q->act_max != 127 || g->out_w <= 0) {
        return 0;
    }
    for (oc = 0; oc < g->out_c; ++oc) {
        const tt_requant1 r = tt_requant_channel(q, oc);
        const int32_t b = bias != 0 ? bias[oc] : 0;
        tt_requant_mm mm;
        /* |bias - z_x * sum w| < 2^29 follows: |z_x * sum w| <= 128 * 128 * TT_I2C_K < 2^28 */
        if (!tt_requant_mm_init(&mm, &r) || b <= -(1 << 28) || b >= (1 << 28)) {
            return 0;
        }
    }
    return 1;
}

/* The conv of tt_conv2d_s8 (no split) when tt_i2c_rows_fit says so. */
static void tt_i2c_rows(const tt_conv_dims *d, const tt_geom *g, const tt_requant_s8 *q, const int8_t *x,
                        const int8_t *w, const int32_t *bias, int8_t *y)
{
    const int32_t C = g->in_c, KH = g->k_h, row = g->k_w * C, K = KH * row, Kp = (K + 3) & ~3, OC = g->out_c;
    const int32_t xrow = g->dil_h * g->in_w * C, xstep = g->stride_w * C, words = Kp >> 2;
    const int32_t zin = q->input_zero_point;
    int8_t win[(TT_I2C_PASS + 1) * TT_I2C_K];           /* the pass's windows (an odd pass's dummy is a slot < PASS) */
    /* word-aligned by request, not by gcc's habit: tt_i2c22_run reads them with LDM / LDRD, which fault otherwise */
    int16_t xs[TT_I2C_PASS * TT_I2C_K] __attribute__((aligned(4)));  /* widened: one int16 per window byte */
    int16_t ws[TT_I2C_CH * TT_I2C_K] __attribute__((aligned(4)));    /* the weights, widened, by channel pairs */
    int32_t cst[TT_I2C_CH][4];                           /* add, h, multiplier, e */
    tt_i2c22_frame f;
    int32_t oy_lo, oy_hi, ox_lo, ox_hi, oc0, nch, j, k, b, oy, p0, p;
    tt_interior(g->out_h, g->in_h, g->stride_h, g->pad_top, g->k_h, g->dil_h, &oy_lo, &oy_hi);
    tt_interior(g->out_w, g->in_w, g->stride_w, g->pad_left, g->k_w, 1, &ox_lo, &ox_hi);
    memset(win, 0, sizeof win); /* the windows' tails past K stay zero (a dummy may hold an old window: its outputs
                                 * are overwritten) */
    f.words = words;
    f.ystep = OC;
    for (oc0 = 0; oc0 < OC; oc0 += TT_I2C_CH) {
        nch = OC - oc0 < TT_I2C_CH ? OC - oc0 : TT_I2C_CH;
        for (j = 0; j < nch; ++j) {
            const int32_t oc = oc0 + j;
            const tt_requant1 r = tt_requant_channel(q, oc);
            const int8_t *const wr = w + oc * K;
            int16_t *const wd = ws + (j >> 1) * 8 * words + (j & 1) * 4;
            int8_t wp[TT_I2C_K];
            tt_requant_mm mm;
            (void)tt_requant_mm_init(&mm, &r); /* checked by tt_i2c_rows_fit */
            cst[j][0] = (bias != 0 ? bias[oc] : 0) - zin * tt_sum_s8(wr, K);
            cst[j][1] = mm.h;
            cst[j][2] = mm.multiplier;
            cst[j][3] = mm.e;
            memset(wp, 0, sizeof wp);
            memcpy(wp, wr, (size_t)K);
            for (k = 0; k < words; ++k) {
                const uint32_t u = tt_ld32(wp + 4 * k);
                const int16x2_t w2[2] = {tt_sx02(u), tt_sx13(u)};
                memcpy(wd + 8 * k, w2, sizeof w2);
            }
        }
        for (b = 0; b < d->batches; ++b) {
            const int8_t *const xb = x + b * g->in_h * g->in_w * C;
            for (oy = 0; oy < g->out_h; ++oy) {
                const int32_t row_in = oy >= oy_lo && oy < oy_hi;
                int8_t *const yrow = y + ((b * g->out_h + oy) * g->out_w) * OC + oc0;
                for (p0 = 0; p0 < g->out_w; p0 += TT_I2C_PASS) {
                    const int32_t np = g->out_w - p0 < TT_I2C_PASS ? g->out_w - p0 : TT_I2C_PASS;
                    const int32_t a = row_in && ox_lo > p0 ? ox_lo : p0;               /* interior run [a, e) */
                    const int32_t e = row_in ? (ox_hi < p0 + np ? ox_hi : p0 + np) : a;
                    for (p = p0; p < p0 + np; ++p) {
                        if (p < a || p >= e) {
                            tt_i2c_pad_px(g, xb, oy, p, (int8_t)zin, win + (p - p0) * Kp);
                        } else {
                            tt_i2c_fill(win + (p - p0) * Kp, Kp,
                                        xb + ((oy * g->stride_h - g->pad_top) * g->in_w + p * g->stride_w -
                                              g->pad_left) * C,
                                        xstep, e - p, KH, row, xrow);
                            p = e - 1;
                        }
                    }
                    tt_i2c_widen_x(win, Kp, (np + 1) & ~1, xs);
                    for (j = 0; j < nch; j += 2) {
                        f.w = ws + (j >> 1) * 8 * words;
                        f.add[0] = cst[j][0];
                        f.add[1] = cst[j + 1][0];
                        memcpy(f.hme, &cst[j][1], 3 * sizeof(int32_t));
                        memcpy(f.hme + 3, &cst[j + 1][1], 3 * sizeof(int32_t));
                        f.x = xs;
                        f.y = yrow + p0 * OC + j;
                        f.pairs = np >> 1;
                        if (f.pairs > 0) {
                            tt_i2c22_run(&f);
                        }
                        if (np & 1) { /* the odd last output with the zero dummy: its outputs overwritten */
                            f.x = xs + (np >> 1) * 8 * words;
                            f.pairs = 1;
                            f.ystep = 0;
                            tt_i2c22_run(&f);
                            f.ystep = OC;
                        }
                    }
                }
            }
        }
    }
}
#endif

/* int8 conv, output channels in blocks of four (each input byte loaded once per block, the block's constants
 * hoisted out of the pixel loops) and the input zero point taken out of the inner loop: for an interior output,
 * sum (x - z) * w = sum x * w - z * sum w, with sum w of a channel computed once per call. Integer sums: any order
 * gives the reference's result bit for bit (no int32 overflow for < 2^16 taps, as tt_kernels.h states). Border
 * outputs run the reference loop. n > 0: input channels [0, n) of every tap come from w_slice [O,KH,KW,n]. */
TT_CONV_INLINE void tt_conv2d_s8_core(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                              const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y)
{
    const tt_geom g = tt_geom_of(d);
    const int32_t batches = d->batches, taps = g.k_h * g.k_w, K = taps * g.in_c, OC = g.out_c;
    const int32_t zin = q->input_zero_point, lo = q->act_min, hi = q->act_max;
    const int32_t in_plane = g.in_h * g.in_w * g.in_c, out_plane = g.out_h * g.out_w * OC;
    const int32_t pointwise = g.k_h == 1 && g.k_w == 1;
    /* a 1x1 conv at stride 1 without padding: input pixel p makes output pixel p, both planes contiguous */
    const int32_t whole = pointwise && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0 &&
                          g.in_h == g.out_h && g.in_w == g.out_w;
#if TT_PW4_ASM
    /* full blocks of a whole 1x1 conv that tt_pointwise4 hands to tt_pw4w, which subtracts z_x from the input and
     * starts at the biases: their weight sums (the adds) are computed only if the block turns out not to go there */
    const int32_t pw_bias = whole && (g.in_c & 3) == 0 && g.in_c != 8 && g.in_c <= 2 * TT_PW4W_MAXC &&
                            batches * g.out_h * g.out_w > 1 && lo == -128 && hi == 127;
#else
    const int32_t pw_bias = 0;
#endif
    int32_t oy_lo, oy_hi, ox_lo, ox_hi, oc0, b, oy, ox, j, skip;
    tt_conv_block bk;
#if TT_PW4_ASM
    if (n <= 0 && tt_i2c_rows_fit(&g, q, bias)) {
        tt_i2c_rows(d, &g, q, x, w, bias, y);
        return;
    }
#endif
    tt_interior(g.out_h, g.in_h, g.stride_h, g.pad_top, g.k_h, g.dil_h, &oy_lo, &oy_hi);
    tt_interior(g.out_w, g.in_w, g.stride_w, g.pad_left, g.k_w, g.dil_w, &ox_lo, &ox_hi);
    if (n <= 0) {
        n = 0;
        w_slice = w;
    }
#if TT_PW4_ASM
    if (whole && n == 0 && g.in_c == 8 && tt_pwc8(q, OC, batches * g.out_h * g.out_w, x, w, bias, y)) {
        return;
    }
#endif
    for (oc0 = 0; oc0 < OC; oc0 += 4) {
        bk.nb = OC - oc0 < 4 ? OC - oc0 : 4;
        bk.q = q;
        bk.oc0 = oc0;
        bk.fast = 1;
        /* the DSP build's one-SMMLAR requantization (elsewhere its int64 emulation costs more than the fast form)
         * when the doubled sums fit int32: |raw or reference sum| <= K * 2^15 (|x - z_x| <= 255, |w| <= 128) */
        bk.mm_ok = TT_SIMD && K < (1 << 14);
        skip = pw_bias && bk.nb == 4;
        for (j = 0; j < 4; ++j) {
            const int32_t oc = oc0 + (j < bk.nb ? j : 0); /* a short last block repeats its first row, unused */
            bk.w[j] = w + oc * K;
            bk.ws[j] = w_slice + oc * taps * n;
            bk.bias[j] = bias != 0 ? bias[oc] : 0;
            bk.add[j] = skip ? bk.bias[j] : bk.bias[j] - zin * tt_block_wsum(&g, &bk, j, n);
            if (bk.mm_ok) { /* off from the start in the portable build: no set-up it never reads */
                const tt_requant1 r = tt_requant_channel(q, oc);
                bk.mm_ok = tt_requant_mm_init(&bk.mm[j], &r) && bk.add[j] > -(1 << 29) && bk.add[j] < (1 << 29) &&
                           bk.bias[j] > -(1 << 29) && bk.bias[j] < (1 << 29);
            }
        }
        if (!bk.mm_ok) { /* the fast form is read only without tt_requant_mm (tt_store4 / tt_store1) */
            for (j = 0; j < 4; ++j) {
                const tt_requant1 r = tt_requant_channel(q, oc0 + (j < bk.nb ? j : 0));
                bk.fast &= tt_requant_fast_init(&bk.f[j], &r);
            }
        }
        if (bk.mm_ok && lo == -128 && hi == 127) {
            bk.mm_ok = 2;
        }
        if (skip && bk.mm_ok != 2) { /* not for tt_pw4w after all: the adds its paths read */
            for (j = 0; j < 4; ++j) {
                bk.add[j] = bk.bias[j] - zin * tt_block_wsum(&g, &bk, j, n);
            }
        }
        if (whole && bk.nb == 4) {
            /* every pixel of every image in one run: the per-row calls' set-up once per block */
            tt_pointwise4(&bk, g.in_c, n, OC, lo, hi, x, g.in_c, batches * g.out_h * g.out_w, y + oc0);
            continue;
        }
        for (b = 0; b < batches; ++b) {
            const int8_t *xb = x + b * in_plane;
            int8_t *yb = y + b * out_plane + oc0;
            for (oy = 0; oy < g.out_h; ++oy) {
                const int32_t iy0 = oy * g.stride_h - g.pad_top;
                const int32_t row_in = oy >= oy_lo && oy < oy_hi;
                int8_t *yrow = yb + oy * g.out_w * OC;
                const int32_t a_lo = row_in ? ox_lo : g.out_w, a_hi = row_in ? ox_hi : g.out_w;
                for (ox = 0; ox < g.out_w; ++ox) {
                    int8_t *yp = yrow + ox * OC;
                    if (ox == a_lo && bk.nb == 4 && a_hi > a_lo) {
                        /* the interior run of the row in one go */
                        const int8_t *x0 = xb + (iy0 * g.in_w + ox * g.stride_w - g.pad_left) * g.in_c;
                        if (pointwise) {
                            tt_pointwise4(&bk, g.in_c, n, OC, lo, hi, x0, g.stride_w * g.in_c, a_hi - a_lo, yp);
                        } else {
                            tt_conv_run4(&g, &bk, n, lo, hi, x0, g.stride_w * g.in_c, a_hi - a_lo, yp);
                        }
                        ox = a_hi - 1;
                    } else if (ox >= a_lo && ox < a_hi) {
                        const int8_t *x0 = xb + (iy0 * g.in_w + ox * g.stride_w - g.pad_left) * g.in_c;
                        for (j = 0; j < bk.nb; ++j) {
                            yp[j] = tt_store1(&bk, j, lo, hi, tt_conv_interior1(&g, &bk, j, n, x0) + bk.add[j]);
                        }
                    } else {
                        for (j = 0; j < bk.nb; ++j) {
                            yp[j] = tt_store1(&bk, j, lo, hi,
                                              tt_conv_border(&g, xb, bk.w[j], bk.ws[j], n, oy, ox, zin) + bk.bias[j]);
                        }
                    }
                }
            }
        }
    }
}

void tt_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                  const int32_t *bias, int8_t *y)
{
#if TT_HOST_AVX2 /* the host build's AVX2 kernel (same bytes), when the shape fits it */
    if (tt_pw_s8_avx2(d, q, x, w, bias, y)) {
        return;
    }
#endif
    tt_conv2d_s8_core(d, q, x, w, w, 0, bias, y);
}

void tt_conv2d_s8_split(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                        const int8_t *w_slice, int32_t n, const int32_t *bias, int8_t *y)
{
    tt_conv2d_s8_core(d, q, x, w, w_slice, n, bias, y);
}

void tt_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                   const float *bias, float *y)
{
    tt_conv2d_f32_split(d, act_min, act_max, x, w, w, 0, bias, y);
}

/* One element of a float tensor held in fp32 (f) or fp16 (h, widened where it is read): inlined with one of the two
 * pointers constant null, so each caller compiles to the plain read of its own kind. */
TT_CONV_INLINE float tt_f_or_h(const float *f, const uint16_t *h, int32_t i)
{
    return h != 0 ? tt_f16_read(h[i]) : f[i];
}

/* Output channel oc's sum at one output pixel (input origin iy0, ix0): acc = 0, += x * w over the in-image taps in
 * (filter y, filter x, input channel) order, input channels [0, n) of filter row (oc, ky, kx) from w_slice,
 * [n, in_c) from w. x is fp32 (xf) or fp16 (xh), read through tt_f_or_h with the other pointer null. */
TT_CONV_INLINE float tt_conv_px1(const tt_conv_dims *d, int32_t b, int32_t iy0, int32_t ix0, const float *xf,
                                 const uint16_t *xh, const float *w, const float *w_slice, int32_t n, int32_t oc)
{
    float acc = 0.0f;
    int32_t ky, kx, ic;
    for (ky = 0; ky < d->k_h; ++ky) {
        const int32_t iy = iy0 + ky * d->dilation_h;
        if (iy < 0 || iy >= d->in_h) {
            continue;
        }
        for (kx = 0; kx < d->k_w; ++kx) {
            const int32_t ix = ix0 + kx * d->dilation_w;
            const int32_t at = ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
            const float *xfp = 0, *wp;
            const uint16_t *xhp = 0;
            if (ix < 0 || ix >= d->in_w) {
                continue;
            }
            if (xh != 0) {
                xhp = xh + at;
            } else {
                xfp = xf + at;
            }
            wp = w_slice + ((oc * d->k_h + ky) * d->k_w + kx) * n;
            for (ic = 0; ic < n; ++ic) {
                acc += tt_f_or_h(xfp, xhp, ic) * wp[ic];
            }
            wp = w + ((oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
            for (ic = n; ic < d->in_c; ++ic) {
                acc += tt_f_or_h(xfp, xhp, ic) * wp[ic];
            }
        }
    }
    return acc;
}

/* A float forward conv's tail for the output element at of channel oc: + bias (if any), the clamp, then stored in fp32
 * (yf) or rounded once to fp16 (yh); inlined with one of the two null, so each kernel keeps only its own store. */
TT_CONV_INLINE void tt_conv_out(float v, const float *bias, int32_t oc, float act_min, float act_max, float *yf,
                                uint16_t *yh, int32_t at)
{
    if (bias != 0) {
        v += bias[oc];
    }
    v = tt_act_clamp(v, act_min, act_max);
    if (yh != 0) {
        yh[at] = tt_f16_narrow(v);
    } else {
        yf[at] = v;
    }
}

/* The fp32-input forward conv: each output channel's sum by tt_conv_px1, then tt_conv_out. */
TT_CONV_INLINE void tt_conv_f32_walk(const tt_conv_dims *d, float act_min, float act_max, const float *x,
                                     const float *w, const float *w_slice, int32_t n, const float *bias, float *yf,
                                     uint16_t *yh)
{
    int32_t b, oy, ox, oc;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                const int32_t yp = ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ++oc) {
                    tt_conv_out(tt_conv_px1(d, b, iy0, ix0, x, 0, w, w_slice, n, oc), bias, oc, act_min, act_max, yf,
                                yh, yp + oc);
                }
            }
        }
    }
}

void tt_conv2d_f32_split(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                         const float *w_slice, int32_t n, const float *bias, float *y)
{
    tt_conv_f32_walk(d, act_min, act_max, x, w, w_slice, n, bias, y, 0);
}

void tt_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx)
{
    tt_conv2d_grad_input_f32_split(d, dy, w, w, 0, dx);
}

void tt_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x, float *dw)
{
    tt_conv2d_grad_weight_f32_range(d, k, 0, d->out_c, dy, x, dw);
}

/* Zero-gradient skipping (the note above tt_gi1x1_dense). */
#define TT_NZ_CHUNK 128

TT_GI_INLINE uint32_t tt_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Nonzero test without an FPU compare: +-0 are the only floats whose bits are zero after the sign. */
#define TT_NZ(bits) (((bits) << 1) != 0u)

/* Output channels [o0, o1): each output channel's gradient is its own sum (nothing is shared between channels),
 * so any split of [0, out_c) gives the bits of the whole call. The input is fp32 (xf) or int8 (xq, dequantized
 * where it is used: (float)(x - zero_point) * scale, the value dequantize_slice would have stored). */
/* 1x1, stride 1, no padding (pixel p of x feeds pixel p of dy): dw[o, c] = 0, += dy[p, o] * x[p, c] over the
 * pixels in order, as the general loop below; the sums of eight (then four, then one) channels stay in registers
 * over the pixels instead of being loaded and stored per product: the same float32 operations in the same order. */
TT_GI_INLINE float tt_gw_x(const float *xf, const int8_t *xq, const uint16_t *xh, int32_t i, float scale,
                           int32_t zero_point)
{
    return xq != 0 ? (float)((int32_t)xq[i] - zero_point) * scale : xh != 0 ? tt_f16_read(xh[i]) : xf[i];
}

TT_GI_INLINE void tt_gw1x1(int32_t P, int32_t O, int32_t IC, int32_t k, int32_t o0, int32_t o1, const float *dy,
                           const float *xf, const int8_t *xq, const uint16_t *xh, float scale, int32_t zero_point,
                           float *dw)
{
    /* Pixels where dy[p, o] is +-0 are skipped, the sums keep their bits (see the note above tt_gi1x1_dense: every x here
     * is finite when it is dequantized from int8; a float x could be inf or NaN, so only xq skips). */
    uint8_t nz[TT_NZ_CHUNK];
    int32_t o, c, pc, j, n;
    for (o = o0; o < o1; ++o) {
        float *dwp = dw + (o - o0) * k;
        const float *g = dy + o;
        for (pc = 0; pc < P; pc += TT_NZ_CHUNK) {
            const int32_t pe = P - pc > TT_NZ_CHUNK ? pc + TT_NZ_CHUNK : P;
            const int first = pc == 0;
            int32_t p;
            n = 0;
            for (p = pc; p < pe; ++p) {
                if (xq == 0 || TT_NZ(tt_fbits(g[p * O]))) {
                    nz[n++] = (uint8_t)(p - pc);
                }
            }
            if (n == 0 && !first) {
                continue;
            }
            c = 0;
            if (xq != 0) {
                /* int8 x: sixteen sums per pass over the listed pixels (the list and row walk cost per pixel is
                 * shared by twice the channels); each sum sees the same products in the same order */
                const int32_t z = zero_point;
                for (; c + 16 <= k; c += 16) {
#define TT_GW16_V(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define TT_GW16_DECL(i) float b##i = first ? 0.0f : dwp[c + (i)];
#define TT_GW16_MAC(i) b##i += gp * ((float)((int32_t)xr[i] - z) * scale);
#define TT_GW16_PUT(i) dwp[c + (i)] = b##i;
                    TT_GW16_V(TT_GW16_DECL)
                    for (j = 0; j < n; ++j) {
                        const int32_t pp = pc + nz[j];
                        const float gp = g[pp * O];
                        const int8_t *xr = xq + pp * IC + c;
                        TT_GW16_V(TT_GW16_MAC)
                    }
                    TT_GW16_V(TT_GW16_PUT)
#undef TT_GW16_V
#undef TT_GW16_DECL
#undef TT_GW16_MAC
#undef TT_GW16_PUT
                }
            }
            for (; c + 8 <= k; c += 8) {
                float a0, a1, a2, a3, a4, a5, a6, a7;
                if (first) {
                    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0f;
                } else {
                    a0 = dwp[c]; a1 = dwp[c + 1]; a2 = dwp[c + 2]; a3 = dwp[c + 3];
                    a4 = dwp[c + 4]; a5 = dwp[c + 5]; a6 = dwp[c + 6]; a7 = dwp[c + 7];
                }
#define TT_GW8_STEP(pp)                                                                                       \
    do {                                                                                                      \
        const float gp = g[(pp) * O];                                                                         \
        const int32_t i = (pp) * IC + c;                                                                      \
        a0 += gp * tt_gw_x(xf, xq, xh, i, scale, zero_point);                                                     \
        a1 += gp * tt_gw_x(xf, xq, xh, i + 1, scale, zero_point);                                                 \
        a2 += gp * tt_gw_x(xf, xq, xh, i + 2, scale, zero_point);                                                 \
        a3 += gp * tt_gw_x(xf, xq, xh, i + 3, scale, zero_point);                                                 \
        a4 += gp * tt_gw_x(xf, xq, xh, i + 4, scale, zero_point);                                                 \
        a5 += gp * tt_gw_x(xf, xq, xh, i + 5, scale, zero_point);                                                 \
        a6 += gp * tt_gw_x(xf, xq, xh, i + 6, scale, zero_point);                                                 \
        a7 += gp * tt_gw_x(xf, xq, xh, i + 7, scale, zero_point);                                                 \
    } while (0)
                if (n == pe - pc) { /* dense chunk: the plain loop, no list */
                    for (j = pc; j < pe; ++j) {
                        TT_GW8_STEP(j);
                    }
                } else {
                    for (j = 0; j < n; ++j) {
                        TT_GW8_STEP(pc + nz[j]);
                    }
                }
#undef TT_GW8_STEP
                dwp[c] = a0; dwp[c + 1] = a1; dwp[c + 2] = a2; dwp[c + 3] = a3;
                dwp[c + 4] = a4; dwp[c + 5] = a5; dwp[c + 6] = a6; dwp[c + 7] = a7;
            }
            for (; c + 4 <= k; c += 4) {
                float a0, a1, a2, a3;
                if (first) {
                    a0 = a1 = a2 = a3 = 0.0f;
                } else {
                    a0 = dwp[c]; a1 = dwp[c + 1]; a2 = dwp[c + 2]; a3 = dwp[c + 3];
                }
                for (j = 0; j < n; ++j) {
                    const int32_t pp = pc + nz[j];
                    const float gp = g[pp * O];
                    const int32_t i = pp * IC + c;
                    a0 += gp * tt_gw_x(xf, xq, xh, i, scale, zero_point);
                    a1 += gp * tt_gw_x(xf, xq, xh, i + 1, scale, zero_point);
                    a2 += gp * tt_gw_x(xf, xq, xh, i + 2, scale, zero_point);
                    a3 += gp * tt_gw_x(xf, xq, xh, i + 3, scale, zero_point);
                }
                dwp[c] = a0; dwp[c + 1] = a1; dwp[c + 2] = a2; dwp[c + 3] = a3;
            }
            for (; c < k; ++c) {
                float a0 = first ? 0.0f : dwp[c];
                for (j = 0; j < n; ++j) {
                    const int32_t pp = pc + nz[j];
                    a0 += g[pp * O] * tt_gw_x(xf, xq, xh, pp * IC + c, scale, zero_point);
                }
                dwp[c] = a0;
            }
        }
    }
}

/* The weight gradients with an fp16 dy or x run Helium's fp32 vectors under `target.kernels: mve` (tt_fvec_gw.c: the
 * same bits; 0 when an fp32 operand fails its check, and the portable loop runs). */
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_gw.h"
#define TT_FVEC_GW 1
#else
#define TT_FVEC_GW 0
#endif

/* dw[c] += g * x[at + c] for c < k, x float, int8 (dequantized) or fp16 (widened): one loop per kind. */
TT_GI_INLINE void tt_gw_row(float *dw, int32_t k, float g, const float *xf, const int8_t *xq, const uint16_t *xh,
                            int32_t at, float scale, int32_t zero_point)
{
    int32_t c;
    if (xq != 0) {
        for (c = 0; c < k; ++c) {
            dw[c] += g * ((float)((int32_t)xq[at + c] - zero_point) * scale);
        }
    } else if (xh != 0) {
        for (c = 0; c < k; ++c) {
            dw[c] += g * tt_f16_read(xh[at + c]);
        }
    } else {
        for (c = 0; c < k; ++c) {
            dw[c] += g * xf[at + c];
        }
    }
}

/* The weight gradient's general walk: dw[o, tap, c] = 0, += dy[p, o] * x[p', c] over the tap's pixels in order
 * (tt_tap_walk), for output channels [o0, o1). dy is fp32 (dyf) or fp16 (dyh, widened once per pixel where it is
 * read), through tt_f_or_h with the other pointer constant null; x as tt_gw_row takes it. */
TT_GI_INLINE void tt_gw_walk(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dyf,
                             const uint16_t *dyh, const float *xf, const int8_t *xq, const uint16_t *xh, float scale,
                             int32_t zero_point, float *dw)
{
    int32_t o, ky, kx, c;
    for (o = o0; o < o1; ++o) {
        for (ky = 0; ky < d->k_h; ++ky) {
            for (kx = 0; kx < d->k_w; ++kx) {
                float *dwp = dw + (((o - o0) * d->k_h + ky) * d->k_w + kx) * k;
                tt_tap_walk tw;
                for (c = 0; c < k; ++c) {
                    dwp[c] = 0.0f;
                }
                tt_tap_walk_init(d, ky, kx, &tw);
                while (tt_tap_walk_next(&tw)) {
                    const int32_t xs = tw.x_step * d->in_c;
                    int32_t i, g = tw.dy_px * d->out_c + o, at = tw.x_px * d->in_c;
                    for (i = 0; i < tw.n; ++i, g += d->out_c, at += xs) {
                        tt_gw_row(dwp, k, tt_f_or_h(dyf, dyh, g), xf, xq, xh, at, scale, zero_point);
                    }
                }
            }
        }
    }
}

static void tt_conv2d_grad_weight_impl(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                       const float *xf, const int8_t *xq, const uint16_t *xh, float scale,
                                       int32_t zero_point, float *dw)
{
    if (d->k_h == 1 && d->k_w == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_top == 0 &&
        d->pad_left == 0 && d->out_h == d->in_h && d->out_w == d->in_w) {
        const int32_t P = d->batches * d->in_h * d->in_w;
        if (xq != 0) {
            tt_gw1x1(P, d->out_c, d->in_c, k, o0, o1, dy, 0, xq, 0, scale, zero_point, dw);
        } else {
            tt_gw1x1(P, d->out_c, d->in_c, k, o0, o1, dy, xf, 0, xh, 1.0f, 0, dw);
        }
        return;
    }
    tt_gw_walk(d, k, o0, o1, dy, 0, xf, xq, xh, scale, zero_point, dw);
}

void tt_conv2d_grad_weight_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                     const float *x, float *dw)
{
    tt_conv2d_grad_weight_impl(d, k, o0, o1, dy, x, 0, 0, 1.0f, 0, dw);
}

void tt_conv2d_grad_weight_hx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                        const uint16_t *x, float *dw)
{
#if TT_FVEC_GW
    if (tt_fvec_gw_conv(d, k, o0, o1, dy, 0, 0, x, dw)) {
        return;
    }
#endif
    tt_conv2d_grad_weight_impl(d, k, o0, o1, dy, 0, 0, x, 1.0f, 0, dw);
}

void tt_conv2d_grad_weight_qx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const float *dy,
                                        const int8_t *x, float scale, int32_t zero_point, float *dw)
{
    tt_conv2d_grad_weight_impl(d, k, o0, o1, dy, 0, x, 0, scale, zero_point, dw);
}

/* ---- 1x1, stride 1, no padding: input pixel p reads output pixel p only ---------------------------------------
 * dx[p, ic] = 0 + s with s = sum over o, in order, of dy[p, o] * dq(w[o, ic]) (the general loop below with its
 * single tap). Calls may cover a range [o0, o1) of the output channels: the sums start at 0 at channel 0, else
 * they continue from dx (consecutive ranges give the bits of the whole).
 * zz: all zero points are 0 (f32(q - 0) * s == f32(q) * s: the subtraction is dropped).
 *
 * Zero gradients are skipped (ReLU6 masks zero much of dy): for g = +-0 and a finite v (every dequantized weight
 * is finite) g * v is +-0, and adding +-0 to a sum that started at +0 leaves its bits unchanged (such a sum is
 * never -0: x + -x rounds to +0 and +0 + -0 is +0). So only listed output channels (nonzero somewhere) are summed.
 *
 * Dense form (tt_gi1x1_dense): blocks of four pixels x four input channels keep sixteen sums in registers and share
 * each dequantized weight between the four pixels; the output channels are scanned in chunks of TT_NZ_CHUNK into a
 * list of the nonzero ones (a few bytes of stack); the sums carry over between chunks in dx.
 *
 * Broadcast form (tt_gi1x1_bcast, the positions stream of a global average pool's gradient, MobileNetV2's head:
 * every pixel's gradient is a masked copy of one row com): a block of TT_GI_OB output channels x TT_GI_CB input
 * channels is dequantized once into a stack buffer for up to TT_GI_PB pixels, and when the block's nonzero
 * gradients all have com's bits the buffer holds the products com[o] * dq(w) themselves, so each pixel only adds
 * the rows its gradient keeps (the same float32 products: g * v with g == com[o]); each pixel keeps TT_GI_CB sums
 * in registers over its list and carries them to the next block in dx. */
#define TT_GI_OB 16
#define TT_GI_CB 8
#define TT_GI_PB 16
#define TT_GI_PB4 4

TT_GI_INLINE float tt_dqz(int8_t q, int32_t z, float sc, const int zz)
{
    return zz ? (float)(int32_t)q * sc : (float)((int32_t)q - z) * sc;
}

/* Offsets (from oc) of the output channels in [oc, oe) where any of the np (1 or 4) gradient rows is nonzero. */
TT_GI_INLINE int32_t tt_nz_list(const float *g0, const float *g1, const float *g2, const float *g3, int32_t np,
                                int32_t oc, int32_t oe, uint8_t *nz)
{
    int32_t o, n = 0;
    if (np == 4) {
        for (o = oc; o < oe; ++o) {
            if (TT_NZ(tt_fbits(g0[o]) | tt_fbits(g1[o]) | tt_fbits(g2[o]) | tt_fbits(g3[o]))) {
                nz[n++] = (uint8_t)(o - oc);
            }
        }
    } else {
        for (o = oc; o < oe; ++o) {
            if (TT_NZ(tt_fbits(g0[o]))) {
                nz[n++] = (uint8_t)(o - oc);
            }
        }
    }
    return n;
}


/* One pixel (g0: its dy row, d0: its dx row), output channels oc + nz[0..n) of a chunk, input channels [c0, c1)
 * of one weight part (wb: its channel c0 of output channel 0, stride: bytes per output channel): eight input
 * channels per pass over the listed output channels (dense: the chunk's size; a full list runs as the plain loop);
 * first: the chunk is the first (sums start at 0, else they continue from dx). */
TT_GI_INLINE void tt_gi1x1_px(const float *g0, float *d0, int32_t oc, const uint8_t *nz, int32_t n, int32_t dense,
                              int first,
                              int32_t c0, int32_t c1, const int8_t *wb, int32_t stride, const float *scale,
                              const int32_t *zero_point, const int zz)
{
    int32_t ic, j;
    for (ic = c0; ic + 8 <= c1; ic += 8) {
        float a0, a1, a2, a3, a4, a5, a6, a7;
        const int8_t *wc = wb + (ic - c0) + oc * stride;
        if (first) {
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0f;
        } else {
            a0 = d0[ic]; a1 = d0[ic + 1]; a2 = d0[ic + 2]; a3 = d0[ic + 3];
            a4 = d0[ic + 4]; a5 = d0[ic + 5]; a6 = d0[ic + 6]; a7 = d0[ic + 7];
        }
#define TT_GI1_STEP(o, wo)                                                                                    \
    do {                                                                                                      \
        const float sc = scale[o], g = g0[o];                                                                 \
        const int32_t z = zz ? 0 : zero_point[o];                                                             \
        a0 += g * tt_dqz((wo)[0], z, sc, zz);                                                                 \
        a1 += g * tt_dqz((wo)[1], z, sc, zz);                                                                 \
        a2 += g * tt_dqz((wo)[2], z, sc, zz);                                                                 \
        a3 += g * tt_dqz((wo)[3], z, sc, zz);                                                                 \
        a4 += g * tt_dqz((wo)[4], z, sc, zz);                                                                 \
        a5 += g * tt_dqz((wo)[5], z, sc, zz);                                                                 \
        a6 += g * tt_dqz((wo)[6], z, sc, zz);                                                                 \
        a7 += g * tt_dqz((wo)[7], z, sc, zz);                                                                 \
    } while (0)
        if (n == dense) {
            const int8_t *wo = wc;
            for (j = oc; j < oc + n; ++j, wo += stride) {
                TT_GI1_STEP(j, wo);
            }
        } else {
            for (j = 0; j < n; ++j) {
                const int32_t o = oc + nz[j];
                const int8_t *wo = wc + nz[j] * stride;
                TT_GI1_STEP(o, wo);
            }
        }
#undef TT_GI1_STEP
        d0[ic] = a0; d0[ic + 1] = a1; d0[ic + 2] = a2; d0[ic + 3] = a3;
        d0[ic + 4] = a4; d0[ic + 5] = a5; d0[ic + 6] = a6; d0[ic + 7] = a7;
    }
    for (; ic < c1; ++ic) {
        float a = first ? 0.0f : d0[ic];
        const int8_t *wc = wb + (ic - c0) + oc * stride;
        for (j = 0; j < n; ++j) {
            const int32_t o = oc + nz[j];
            a += g0[o] * tt_dqz(wc[nz[j] * stride], zz ? 0 : zero_point[o], scale[o], zz);
        }
        d0[ic] = a;
    }
}

/* Input channels [c0, c1) of one weight part for pixels [p0, p1) of dy / dx. Four pixels share a pass over the
 * output channels nonzero at any of them; when the gradients are so sparse that the four single-pixel lists hold
 * fewer than twice the entries of their union (a single-pixel pass costs about half a four-pixel one per listed
 * channel), each pixel takes its own pass instead. Either way each sum sees its nonzero products in order. */
TT_GI_INLINE void tt_gi1x1_dense(int32_t p0, int32_t p1, int32_t c0, int32_t c1, int32_t O, int32_t dys, int cont,
                                 int32_t IC, const float *dy, const int8_t *wb, int32_t stride, const float *scale,
                                 const int32_t *zero_point, float *dx, const int zz)
{
    uint8_t nz[TT_NZ_CHUNK];
    int32_t p = p0, ic, oc, j, n, q;
    for (; p + 4 <= p1; p += 4) {
        const float *g0 = dy + p * dys, *g1 = g0 + dys, *g2 = g1 + dys, *g3 = g2 + dys;
        float *d0 = dx + p * IC, *d1 = d0 + IC, *d2 = d1 + IC, *d3 = d2 + IC;
        for (oc = 0; oc < O; oc += TT_NZ_CHUNK) {
            const int32_t oe = O - oc > TT_NZ_CHUNK ? oc + TT_NZ_CHUNK : O;
            const int first = oc == 0 && !cont;
            int32_t singles = 0;
            n = 0;
            for (j = oc; j < oe; ++j) {
                const int32_t k = TT_NZ(tt_fbits(g0[j])) + TT_NZ(tt_fbits(g1[j])) + TT_NZ(tt_fbits(g2[j])) +
                                  TT_NZ(tt_fbits(g3[j]));
                singles += k;
                if (k != 0) {
                    nz[n++] = (uint8_t)(j - oc);
                }
            }
            if (n == 0 && !first) {
                continue;
            }
            if (singles < 2 * n) {
                for (q = 0; q < 4; ++q) {
                    const float *gq = g0 + q * dys;
                    const int32_t nq = tt_nz_list(gq, gq, gq, gq, 1, oc, oe, nz);
                    if (nq > 0 || first) {
                        tt_gi1x1_px(gq, d0 + q * IC, oc, nz, nq, oe - oc, first, c0, c1, wb, stride, scale,
                                    zero_point, zz);
                    }
                }
                continue;
            }
            for (ic = c0; ic + 4 <= c1; ic += 4) {
                float a0, a1, a2, a3, b0, b1, b2, b3, e0, e1, e2, e3, f0, f1, f2, f3;
                const int8_t *wc = wb + (ic - c0) + oc * stride;
                if (first) {
                    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = e0 = e1 = e2 = e3 = f0 = f1 = f2 = f3 = 0.0f;
                } else {
                    a0 = d0[ic]; a1 = d0[ic + 1]; a2 = d0[ic + 2]; a3 = d0[ic + 3];
                    b0 = d1[ic]; b1 = d1[ic + 1]; b2 = d1[ic + 2]; b3 = d1[ic + 3];
                    e0 = d2[ic]; e1 = d2[ic + 1]; e2 = d2[ic + 2]; e3 = d2[ic + 3];
                    f0 = d3[ic]; f1 = d3[ic + 1]; f2 = d3[ic + 2]; f3 = d3[ic + 3];
                }
#define TT_GI4_STEP(o, wo)                                                                                    \
    do {                                                                                                      \
        const float sc = scale[o];                                                                            \
        const int32_t z = zz ? 0 : zero_point[o];                                                             \
        const float v0 = tt_dqz((wo)[0], z, sc, zz), v1 = tt_dqz((wo)[1], z, sc, zz);                         \
        const float v2 = tt_dqz((wo)[2], z, sc, zz), v3 = tt_dqz((wo)[3], z, sc, zz);                         \
        float g = g0[o];                                                                                      \
        a0 += g * v0; a1 += g * v1; a2 += g * v2; a3 += g * v3;                                               \
        g = g1[o];                                                                                            \
        b0 += g * v0; b1 += g * v1; b2 += g * v2; b3 += g * v3;                                               \
        g = g2[o];                                                                                            \
        e0 += g * v0; e1 += g * v1; e2 += g * v2; e3 += g * v3;                                               \
        g = g3[o];                                                                                            \
        f0 += g * v0; f1 += g * v1; f2 += g * v2; f3 += g * v3;                                               \
    } while (0)
                if (n == oe - oc) { /* dense chunk: the plain loop, no list */
                    const int8_t *wo = wc;
                    for (j = oc; j < oe; ++j, wo += stride) {
                        TT_GI4_STEP(j, wo);
                    }
                } else {
                    for (j = 0; j < n; ++j) {
                        const int32_t o = oc + nz[j];
                        const int8_t *wo = wc + nz[j] * stride;
                        TT_GI4_STEP(o, wo);
                    }
                }
#undef TT_GI4_STEP
                d0[ic] = a0; d0[ic + 1] = a1; d0[ic + 2] = a2; d0[ic + 3] = a3;
                d1[ic] = b0; d1[ic + 1] = b1; d1[ic + 2] = b2; d1[ic + 3] = b3;
                d2[ic] = e0; d2[ic + 1] = e1; d2[ic + 2] = e2; d2[ic + 3] = e3;
                d3[ic] = f0; d3[ic + 1] = f1; d3[ic + 2] = f2; d3[ic + 3] = f3;
            }
            for (; ic < c1; ++ic) {
                float a = first ? 0.0f : d0[ic], bb = first ? 0.0f : d1[ic];
                float e = first ? 0.0f : d2[ic], f = first ? 0.0f : d3[ic];
                const int8_t *wc = wb + (ic - c0) + oc * stride;
                for (j = 0; j < n; ++j) {
                    const int32_t o = oc + nz[j];
                    const float v = tt_dqz(wc[nz[j] * stride], zz ? 0 : zero_point[o], scale[o], zz);
                    a += g0[o] * v;
                    bb += g1[o] * v;
                    e += g2[o] * v;
                    f += g3[o] * v;
                }
                d0[ic] = a;
                d1[ic] = bb;
                d2[ic] = e;
                d3[ic] = f;
            }
        }
    }
    /* Single pixels (MobileNetV2's classifier streams its input gradient one position at a time). */
    for (; p < p1; ++p) {
        const float *g0 = dy + p * dys;
        float *d0 = dx + p * IC;
        for (oc = 0; oc < O; oc += TT_NZ_CHUNK) {
            const int32_t oe = O - oc > TT_NZ_CHUNK ? oc + TT_NZ_CHUNK : O;
            const int first = oc == 0 && !cont;
            n = tt_nz_list(g0, g0, g0, g0, 1, oc, oe, nz);
            if (n > 0 || first) {
                tt_gi1x1_px(g0, d0, oc, nz, n, oe - oc, first, c0, c1, wb, stride, scale, zero_point, zz);
            }
        }
    }
}

/* The DSP build on a core with single-precision VFP (Cortex-M4F/M7): the sums of tt_gi1x1_sums8 in hand-written
 * loops that move eight floats per VLDM / VSTM (the compiler issues one VLDR per float): the same VMUL / VADD, in
 * the same order, on the same values. */
#if TT_SIMD && defined(__ARM_FP) && (__ARM_FP & 4) && defined(__thumb2__)
#define TT_GI_VFP_ASM 1
static const float tt_gi_zero8[8]; /* +0.0f: the sums' start */

/* The loop both share: s0-s7 start from src; for each listed channel j = lp[t] (row = r + 32 j bytes), GET runs
 * with j in %[row] (mul: loads gp[j] into s16), the row is loaded into s8-s15, SCALE runs (mul: s8-s15 *= s16), and
 * s8-s15 are added to s0-s7; s0-s7 are stored to d. Operands: lp, n (counted down), row, src, r, d. */
#define TT_GI_ROWS8_ASM(GET, SCALE)                                                                             \
    "vldmia   %[src], {s0-s7}\n\t"                                                                              \
    "1:\n\t"                                                                                                    \
    "ldrb     %[row], [%[lp]], #1\n\t" GET                                                                      \
    "add      %[row], %[r], %[row], lsl #5\n\t"                                                                 \
    "vldmia   %[row], {s8-s15}\n\t" SCALE                                                                       \
    "vadd.f32 s0, s0, s8\n\tvadd.f32 s1, s1, s9\n\tvadd.f32 s2, s2, s10\n\tvadd.f32 s3, s3, s11\n\t"             \
    "vadd.f32 s4, s4, s12\n\tvadd.f32 s5, s5, s13\n\tvadd.f32 s6, s6, s14\n\tvadd.f32 s7, s7, s15\n\t"           \
    "subs     %[n], %[n], #1\n\t"                                                                               \
    "bne      1b\n\t"                                                                                           \
    "vstmia   %[d], {s0-s7}\n\t"
#define TT_GI_ROWS8_CLOBBERS \
    "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14", "s15", "memory", "cc"

/* d[0..8) = (first ? 0 : d) + r[lp[t]] rows summed in list order (n >= 1). */
static inline void tt_gi_add_rows8(float *d, const uint8_t *lp, int32_t n, const float *r, int first)
{
    const float *src = first ? tt_gi_zero8 : d;
    const float *row;
    __asm__ volatile(TT_GI_ROWS8_ASM("", "")
                     : [lp] "+r"(lp), [n] "+r"(n), [row] "=&r"(row)
                     : [src] "r"(src), [r] "r"(r), [d] "r"(d)
                     : TT_GI_ROWS8_CLOBBERS);
}

/* d[0..8) = (first ? 0 : d) + gp[j] * r[j] rows, j = lp[t] in list order (n >= 1). */
static inline void tt_gi_mul_rows8(float *d, const float *gp, const uint8_t *lp, int32_t n, const float *r,
                                   int first)
{
    const float *src = first ? tt_gi_zero8 : d;
    const float *row, *g;
    __asm__ volatile(TT_GI_ROWS8_ASM("add      %[g], %[gp], %[row], lsl #2\n\t"
                                     "vldr     s16, [%[g]]\n\t",
                                     "vmul.f32 s8, s16, s8\n\tvmul.f32 s9, s16, s9\n\t"
                                     "vmul.f32 s10, s16, s10\n\tvmul.f32 s11, s16, s11\n\t"
                                     "vmul.f32 s12, s16, s12\n\tvmul.f32 s13, s16, s13\n\t"
                                     "vmul.f32 s14, s16, s14\n\tvmul.f32 s15, s16, s15\n\t")
                     : [lp] "+r"(lp), [n] "+r"(n), [row] "=&r"(row), [g] "=&r"(g)
                     : [src] "r"(src), [r] "r"(r), [d] "r"(d), [gp] "r"(gp)
                     : TT_GI_ROWS8_CLOBBERS, "s16");
}
#else
#define TT_GI_VFP_ASM 0
#endif

/* TT_GI_CB sums of one pixel over its listed output channels (lp / n: the list; r: the block's rows, dequantized
 * weights times the pixel's gradient gp (mul) or already multiplied by it (the broadcast row's products)). */
TT_GI_INLINE void tt_gi1x1_sums8(float *d, const float *gp, const uint8_t *lp, int32_t n, const float *r, int first,
                                 const int mul)
{
#if TT_GI_VFP_ASM
    if (mul) {
        tt_gi_mul_rows8(d, gp, lp, n, r, first);
    } else {
        tt_gi_add_rows8(d, lp, n, r, first);
    }
#else
    float a0, a1, a2, a3, a4, a5, a6, a7;
    int32_t t;
    if (first) {
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0f;
    } else {
        a0 = d[0]; a1 = d[1]; a2 = d[2]; a3 = d[3]; a4 = d[4]; a5 = d[5]; a6 = d[6]; a7 = d[7];
    }
    for (t = 0; t < n; ++t) {
        const int32_t j = lp[t];
        const float *vr = r + j * TT_GI_CB;
        if (mul) {
            const float g = gp[j];
            a0 += g * vr[0]; a1 += g * vr[1]; a2 += g * vr[2]; a3 += g * vr[3];
            a4 += g * vr[4]; a5 += g * vr[5]; a6 += g * vr[6]; a7 += g * vr[7];
        } else {
            a0 += vr[0]; a1 += vr[1]; a2 += vr[2]; a3 += vr[3];
            a4 += vr[4]; a5 += vr[5]; a6 += vr[6]; a7 += vr[7];
        }
    }
    d[0] = a0; d[1] = a1; d[2] = a2; d[3] = a3; d[4] = a4; d[5] = a5; d[6] = a6; d[7] = a7;
#endif
}

/* The broadcast form (com given): pixels [0, P) in blocks of TT_GI_PB, output channels [o0, o1) in blocks of
 * TT_GI_OB, input channels [c0, c1) of one weight part (wb / stride as tt_gi1x1_dense) in blocks of TT_GI_CB. Each
 * pixel lists the block's output channels where its gradient is nonzero; when every listed gradient of every pixel
 * of the block has com's bits (a masked copy of the row), the buffer holds com[o] * dq(w[o, ic]) once for all of
 * them and each pixel only adds; otherwise it holds dq(w[o, ic]) and each pixel multiplies by its own gradient.
 * The same float32 products and sums in the same order either way (the note above). */
TT_GI_INLINE void tt_gi1x1_bcast(int32_t P, int32_t c0, int32_t c1, int32_t o0, int32_t o1, int32_t dys, int32_t IC,
                                 const float *dy, const float *com, const int8_t *wb, int32_t stride,
                                 const float *scale, const int32_t *zero_point, float *dx)
{
    float r[TT_GI_OB * TT_GI_CB];
    uint8_t nz[TT_GI_PB * TT_GI_OB], cnt[TT_GI_PB], used[TT_GI_OB];
    int32_t pb, ob, ic, j, t, p, k;
    for (pb = 0; pb < P; pb += TT_GI_PB) {
        const int32_t np = P - pb < TT_GI_PB ? P - pb : TT_GI_PB;
        for (ob = o0; ob < o1; ob += TT_GI_OB) {
            const int32_t no = o1 - ob < TT_GI_OB ? o1 - ob : TT_GI_OB;
            const int first = ob == 0;
            const float *cr = com + (ob - o0);
            uint32_t all = 0, other = 0;
            int32_t nu = 0;
            for (p = 0; p < np; ++p) {
                const float *gp = dy + (pb + p) * dys + (ob - o0);
                uint8_t *lp = nz + p * TT_GI_OB;
                int32_t n = 0;
                for (j = 0; j < no; ++j) {
                    const uint32_t b = tt_fbits(gp[j]);
                    if (TT_NZ(b)) {
                        lp[n++] = (uint8_t)j;
                        all |= 1u << j;
                        other |= b ^ tt_fbits(cr[j]);
                    }
                }
                cnt[p] = (uint8_t)n;
            }
            if (all == 0 && !first) {
                continue;
            }
            for (j = 0; j < no; ++j) {
                if ((all >> j) & 1u) {
                    used[nu++] = (uint8_t)j;
                }
            }
            for (ic = c0; ic < c1; ic += TT_GI_CB) {
                const int32_t nc = c1 - ic < TT_GI_CB ? c1 - ic : TT_GI_CB;
                for (t = 0; t < nu; ++t) {
                    const int32_t o = ob + used[t];
                    const int8_t *wr = wb + o * stride + (ic - c0);
                    float *rr = r + used[t] * TT_GI_CB;
                    const float sc = scale[o], g = cr[used[t]];
                    const int32_t z = zero_point[o];
                    if (nc == TT_GI_CB) {
                        float e0, e1, e2, e3, e4, e5, e6, e7;
                        if (z == 0) { /* f32(q - 0) * s == f32(q) * s: the row without the subtractions */
                            e0 = tt_dqz(wr[0], 0, sc, 1); e1 = tt_dqz(wr[1], 0, sc, 1);
                            e2 = tt_dqz(wr[2], 0, sc, 1); e3 = tt_dqz(wr[3], 0, sc, 1);
                            e4 = tt_dqz(wr[4], 0, sc, 1); e5 = tt_dqz(wr[5], 0, sc, 1);
                            e6 = tt_dqz(wr[6], 0, sc, 1); e7 = tt_dqz(wr[7], 0, sc, 1);
                        } else {
                            e0 = tt_dq(wr[0], z, sc); e1 = tt_dq(wr[1], z, sc); e2 = tt_dq(wr[2], z, sc);
                            e3 = tt_dq(wr[3], z, sc); e4 = tt_dq(wr[4], z, sc); e5 = tt_dq(wr[5], z, sc);
                            e6 = tt_dq(wr[6], z, sc); e7 = tt_dq(wr[7], z, sc);
                        }
                        if (other == 0) {
                            e0 = g * e0; e1 = g * e1; e2 = g * e2; e3 = g * e3;
                            e4 = g * e4; e5 = g * e5; e6 = g * e6; e7 = g * e7;
                        }
                        rr[0] = e0; rr[1] = e1; rr[2] = e2; rr[3] = e3;
                        rr[4] = e4; rr[5] = e5; rr[6] = e6; rr[7] = e7;
                    } else {
                        for (k = 0; k < nc; ++k) {
                            rr[k] = other == 0 ? g * tt_dq(wr[k], z, sc) : tt_dq(wr[k], z, sc);
                        }
                    }
                }
                for (p = 0; p < np; ++p) {
                    float *d = dx + (pb + p) * IC + ic;
                    const float *gp = dy + (pb + p) * dys + (ob - o0);
                    const uint8_t *lp = nz + p * TT_GI_OB;
                    const int32_t n = cnt[p];
                    if (n == 0) {
                        if (first) {
                            for (k = 0; k < nc; ++k) {
                                d[k] = 0.0f;
                            }
                        }
                    } else if (nc == TT_GI_CB) {
                        if (other == 0) {
                            tt_gi1x1_sums8(d, gp, lp, n, r, first, 0);
                        } else {
                            tt_gi1x1_sums8(d, gp, lp, n, r, first, 1);
                        }
                    } else {
                        for (k = 0; k < nc; ++k) {
                            float a = first ? 0.0f : d[k];
                            for (t = 0; t < n; ++t) {
                                const float *rr = r + lp[t] * TT_GI_CB;
                                a += other == 0 ? rr[k] : gp[lp[t]] * rr[k];
                            }
                            d[k] = a;
                        }
                    }
                }
            }
        }
    }
}

/* Output channels [o0, o1) of the 1x1 input gradient in the dense form (o0 0 and o1 O: the whole;
 * tt_conv2d_grad_input_qw_f32_oc): dy rows dys floats apart hold channels from o0 on; the sums start at 0 when o0
 * is 0, else continue from dx. */
static void tt_gi1x1(int32_t P, int32_t IC, int32_t o0, int32_t o1, int32_t dys, const float *dy, const int8_t *w,
                     const int8_t *w_slice, int32_t n, const float *scale, const int32_t *zero_point, float *dx)
{
    const int32_t O = o1 - o0;
    const int cont = o0 != 0;
    int32_t o, zz = 1;
    for (o = o0; o < o1; ++o) {
        zz = zz && zero_point[o] == 0;
    }
    /* the weight part's rows, scales and zero points from output channel o0 on */
    if (zz) {
        if (n > 0) {
            tt_gi1x1_dense(0, P, 0, n, O, dys, cont, IC, dy, w_slice + o0 * n, n, scale + o0, zero_point + o0, dx,
                           1);
        }
        tt_gi1x1_dense(0, P, n, IC, O, dys, cont, IC, dy, w + n + o0 * IC, IC, scale + o0, zero_point + o0, dx, 1);
    } else {
        if (n > 0) {
            tt_gi1x1_dense(0, P, 0, n, O, dys, cont, IC, dy, w_slice + o0 * n, n, scale + o0, zero_point + o0, dx,
                           0);
        }
        tt_gi1x1_dense(0, P, n, IC, O, dys, cont, IC, dy, w + n + o0 * IC, IC, scale + o0, zero_point + o0, dx, 0);
    }
}

/* One weight of either kind (tt_gi_walk's constant qw names it; the other pointer is null). */
TT_GI_INLINE float tt_gi_w(const int qw, const float *wf, const int8_t *wq, int32_t i, const float *scale,
                           const int32_t *zero_point, int32_t o)
{
    return qw ? tt_dq(wq[i], zero_point[o], scale[o]) : wf[i];
}

/* The next output channel's row (only the pointer of the weight's kind moves: the other is null). */
#define TT_GI_NEXT(qw, wf, wq, stride) ((qw) ? (void)((wq) += (stride)) : (void)((wf) += (stride)))

/* The input gradient's tap walk, written once for a float weight and an int8 one (dequantized per element by tt_dq
 * where it is read, the int8 kernels' 1x1 stride-1 case through tt_gi1x1): w / w_slice are of the kind the
 * constant qw names, so the always-inlined walker compiles to the plain loop of each (tt_gi_w and TT_GI_NEXT touch
 * only that kind's pointer; the other stays null). The bits of the loops it replaces. dx[p, ic] = 0, then
 * per tap in (filter y, filter x) order += s with s = sum over o, in order, of dy[p', o] * w[o, tap, ic]; channels
 * [0, n) read the trained slice [O,KH,KW,n], the rest the whole weight. Four input channels share a pass over o
 * (the loads of dy, scale and zero point): each keeps its own sum in order, the same float32 operations as one at
 * a time. */
TT_GI_INLINE void tt_gi_walk(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const void *w,
                             const void *w_slice, int32_t n, const float *scale, const int32_t *zero_point, float *dx,
                             const int qw)
{
    int32_t b, iy, ix, ic, ky, kx, o;
    const int32_t taps = d->k_h * d->k_w;
    if (qw && taps == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_top == 0 && d->pad_left == 0 &&
        d->out_h == d->in_h && d->out_w == d->in_w) {
        tt_gi1x1(d->batches * d->in_h * d->in_w, d->in_c, 0, d->out_c, d->out_c, dy, (const int8_t *)w,
                 (const int8_t *)w_slice, n, scale, zero_point, dx);
        return;
    }
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                float *dxp = dx + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                for (ic = 0; ic < d->in_c; ++ic) {
                    dxp[ic] = 0.0f;
                }
                for (ky = 0; ky < d->k_h; ++ky) {
                    const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                    if (oy < 0) {
                        continue;
                    }
                    for (kx = 0; kx < d->k_w; ++kx) {
                        const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                        const int32_t tap = ky * d->k_w + kx;
                        const int32_t at_dy = ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                        const float *dyp = 0;
                        const uint16_t *dyhp = 0;
                        if (ox < 0) {
                            continue;
                        }
                        if (dyh != 0) {
                            dyhp = dyh + at_dy;
                        } else {
                            dyp = dy + at_dy;
                        }
                        ic = 0;
                        while (ic < d->in_c) {
                            /* channels [0, n) live in the trained slice, the rest in the whole weight */
                            const int32_t in_slice = ic < n;
                            const int32_t lim = in_slice ? n : d->in_c;
                            const int32_t at = in_slice ? tap * n + ic : tap * d->in_c + ic;
                            const void *wp = in_slice ? w_slice : w;
                            const float *wfb = qw ? 0 : (const float *)wp + at;
                            const int8_t *wqb = qw ? (const int8_t *)wp + at : 0;
                            const int32_t stride = taps * (in_slice ? n : d->in_c);
                            if (ic + 4 <= lim) {
                                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                                for (o = 0; o < d->out_c; ++o) {
                                    const float g = tt_f_or_h(dyp, dyhp, o);
                                    s0 += g * tt_gi_w(qw, wfb, wqb, 0, scale, zero_point, o);
                                    s1 += g * tt_gi_w(qw, wfb, wqb, 1, scale, zero_point, o);
                                    s2 += g * tt_gi_w(qw, wfb, wqb, 2, scale, zero_point, o);
                                    s3 += g * tt_gi_w(qw, wfb, wqb, 3, scale, zero_point, o);
                                    TT_GI_NEXT(qw, wfb, wqb, stride);
                                }
                                dxp[ic] += s0;
                                dxp[ic + 1] += s1;
                                dxp[ic + 2] += s2;
                                dxp[ic + 3] += s3;
                                ic += 4;
                            } else {
                                float s = 0.0f;
                                for (o = 0; o < d->out_c; ++o) {
                                    s += tt_f_or_h(dyp, dyhp, o) * tt_gi_w(qw, wfb, wqb, 0, scale, zero_point, o);
                                    TT_GI_NEXT(qw, wfb, wqb, stride);
                                }
                                dxp[ic] += s;
                                ic += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

void tt_conv2d_grad_input_f32_split(const tt_conv_dims *d, const float *dy, const float *w, const float *w_slice,
                                    int32_t n, float *dx)
{
    tt_gi_walk(d, dy, 0, w, w_slice, n, 0, 0, dx, 0);
}

void tt_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w, const int8_t *w_slice,
                                 int32_t n, const float *scale, const int32_t *zero_point, float *dx)
{
    tt_gi_walk(d, dy, 0, w, w_slice, n, scale, zero_point, dx, 1);
}

/* The broadcast form over both weight parts; its own frame (not inlined: the stack bound takes the deepest of it and
 * tt_gi1x1, not their sum). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void tt_gi1x1_bc(int32_t pixels, int32_t in_c, int32_t o0, int32_t o1, const float *dy, const float *com,
                        const int8_t *w, const int8_t *w_slice, int32_t n, const float *scale,
                        const int32_t *zero_point, float *dx)
{
    int32_t part;
    for (part = n > 0 ? 0 : 1; part < 2; ++part) { /* the trained slice's channels [0, n), then the rest */
        tt_gi1x1_bcast(pixels, part ? n : 0, part ? in_c : n, o0, o1, o1 - o0, in_c, dy, com, part ? w + n : w_slice,
                       part ? in_c : n, scale, zero_point, dx);
    }
}

void tt_conv2d_grad_input_qw_f32_oc(int32_t pixels, int32_t in_c, int32_t o0, int32_t o1, const float *dy,
                                    const float *com, const int8_t *w, const int8_t *w_slice, int32_t n,
                                    const float *scale, const int32_t *zero_point, float *dx)
{
    if (com == 0 || pixels < TT_GI_PB4) { /* no broadcast row, or too few pixels to reuse a dequantized block */
        tt_gi1x1(pixels, in_c, o0, o1, o1 - o0, dy, w, w_slice, n, scale, zero_point, dx);
    } else {
        tt_gi1x1_bc(pixels, in_c, o0, o1, dy, com, w, w_slice, n, scale, zero_point, dx);
    }
}

/* tt_conv2d_f32_split's sums in the same order, each result rounded once to fp16 as it is stored: what the fp32
 * kernel followed by tt_round_f16 gives, in 2 bytes. */
void tt_conv2d_f32_split_hy(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                            const float *w_slice, int32_t n, const float *bias, uint16_t *y)
{
#ifdef TT_FVEC_CONV
    if (tt_fvec_conv2d_fx_hy(d, act_min, act_max, x, w, w_slice, n, bias, y)) {
        return;
    }
#endif
    tt_conv_f32_walk(d, act_min, act_max, x, w, w_slice, n, bias, 0, y);
}

void tt_conv2d_f32_split_hy_rep(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                                const float *w_slice, int32_t n, const float *bias, int32_t *w_ok, uint16_t *y)
{
#ifdef TT_FVEC_CONV
    if (*w_ok < 0) {
        *w_ok = tt_fvec_conv2d_wcheck(d, act_min, act_max, w, w_slice, n, bias);
    }
    if (tt_fvec_conv2d_fx_hy_ew(*w_ok, d, act_min, act_max, x, w, w_slice, n, bias, y)) {   /* x checked per call */
        return;
    }
#else
    (void)w_ok;
#endif
    tt_conv_f32_walk(d, act_min, act_max, x, w, w_slice, n, bias, 0, y);
}

#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_gi.h" /* the fp16-mixed input gradients on Helium, where their operands allow it */
#define TT_FVEC_GI 1
#endif

/* The float input gradient of an fp16 output gradient: tt_gi_walk reading dy widened per element (the bits of
 * tt_conv2d_grad_input_f32_split on the widened dy). */
void tt_conv2d_grad_input_hdy_f32_split(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                        const float *w_slice, int32_t n, float *dx)
{
#ifdef TT_FVEC_GI
    if (tt_fvec_gi(d, 0, dy, w, w_slice, n, dx, 0)) {
        return;
    }
#endif
    tt_gi_walk(d, 0, dy, w, w_slice, n, 0, 0, dx, 0);
}

void tt_conv2d_grad_input_hdy_f32_split_rep(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                            const float *w_slice, int32_t n, int32_t *w_ok, float *dx)
{
#ifdef TT_FVEC_GI
    if (*w_ok < 0) {
        *w_ok = tt_fvec_gi_w_ok_hdy(d, w, w_slice, n);
    }
    if (*w_ok) {
        tt_fvec_gi_run(d, 0, dy, w, w_slice, n, dx, 0);
        return;
    }
#else
    (void)w_ok;
#endif
    tt_gi_walk(d, 0, dy, w, w_slice, n, 0, 0, dx, 0);
}

/* ---- fp16-mixed: input gradients written as fp16, weight gradients of an fp16 dy (issue 13) -----------------
 * The input gradient's sums of tt_gi_walk (float weight) for a block of at most TT_GI_HDX input channels of one
 * input pixel at a time, kept in fp32 until every tap has been added and then rounded once as they are stored:
 * dx[p, ic] = 0, then per tap in (filter y, filter x) order += s with s = sum over o, in order, of
 * dy[p', o] * w[o, tap, ic] (dy fp32, or fp16 widened once per tap into blocks of TT_GI_HDY floats). Each
 * element's operations are tt_gi_walk's; only which elements share a pass differs, which changes no bits. */
#define TT_GI_HDX 32
#define TT_GI_HDY 64

TT_GI_INLINE void tt_gi_walk_hdx(const tt_conv_dims *d, const float *dy, const uint16_t *dyh, const float *w,
                                 const float *w_slice, int32_t n, uint16_t *dx)
{
    float acc[TT_GI_HDX], s[TT_GI_HDX], gw[TT_GI_HDY];
    int32_t b, iy, ix, ic, c0, c1, ky, kx, o, o0, o1;
    const int32_t taps = d->k_h * d->k_w;
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                uint16_t *dxp = dx + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                for (c0 = 0; c0 < d->in_c; c0 = c1) {
                    c1 = d->in_c - c0 > TT_GI_HDX ? c0 + TT_GI_HDX : d->in_c;
                    for (ic = c0; ic < c1; ++ic) {
                        acc[ic - c0] = 0.0f;
                    }
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                        if (oy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                            const int32_t tap = ky * d->k_w + kx;
                            const int32_t at_dy = ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                            if (ox < 0) {
                                continue;
                            }
                            for (ic = c0; ic < c1; ++ic) {
                                s[ic - c0] = 0.0f;
                            }
                            for (o0 = 0; o0 < d->out_c; o0 = o1) {
                                const float *g;
                                o1 = d->out_c - o0 > TT_GI_HDY ? o0 + TT_GI_HDY : d->out_c;
                                if (dyh != 0) {
                                    for (o = o0; o < o1; ++o) {
                                        gw[o - o0] = tt_f16_read(dyh[at_dy + o]);
                                    }
                                    g = gw;
                                } else {
                                    g = dy + at_dy + o0;
                                }
                                for (ic = c0; ic < c1; ++ic) {
                                    /* channels [0, n) live in the trained slice, the rest in the whole weight */
                                    const int32_t in_slice = ic < n;
                                    const int32_t stride = taps * (in_slice ? n : d->in_c);
                                    const float *wp = (in_slice ? w_slice + tap * n + ic : w + tap * d->in_c + ic) +
                                                      o0 * stride;
                                    float t = s[ic - c0];
                                    for (o = 0; o < o1 - o0; ++o, wp += stride) {
                                        t += g[o] * *wp;
                                    }
                                    s[ic - c0] = t;
                                }
                            }
                            for (ic = c0; ic < c1; ++ic) {
                                acc[ic - c0] += s[ic - c0];
                            }
                        }
                    }
                    for (ic = c0; ic < c1; ++ic) {
                        dxp[ic] = tt_f16_narrow(acc[ic - c0]);
                    }
                }
            }
        }
    }
}

void tt_conv2d_grad_input_f32_split_hdx(const tt_conv_dims *d, const float *dy, const float *w, const float *w_slice,
                                        int32_t n, uint16_t *dx)
{
#ifdef TT_FVEC_GI
    if (tt_fvec_gi(d, dy, 0, w, w_slice, n, 0, dx)) {
        return;
    }
#endif
    tt_gi_walk_hdx(d, dy, 0, w, w_slice, n, dx);
}

void tt_conv2d_grad_input_hdy_split_hdx(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                        const float *w_slice, int32_t n, uint16_t *dx)
{
#ifdef TT_FVEC_GI
    if (tt_fvec_gi(d, 0, dy, w, w_slice, n, 0, dx)) {
        return;
    }
#endif
    tt_gi_walk_hdx(d, 0, dy, w, w_slice, n, dx);
}

/* The positions stream's call, once per input pixel with the same weight: the weight's check for the Helium walk
 * runs at the first call and *w_ok (-1 before it) keeps its answer for the others. Elsewhere, the portable walk. */
void tt_conv2d_grad_input_hdy_split_hdx_rep(const tt_conv_dims *d, const uint16_t *dy, const float *w,
                                            const float *w_slice, int32_t n, int32_t *w_ok, uint16_t *dx)
{
#ifdef TT_FVEC_GI
    if (*w_ok < 0) {
        *w_ok = tt_fvec_gi_w_ok_hdy(d, w, w_slice, n);
    }
    if (*w_ok) {
        tt_fvec_gi_run(d, 0, dy, w, w_slice, n, 0, dx);
        return;
    }
#else
    (void)w_ok;
#endif
    tt_gi_walk_hdx(d, 0, dy, w, w_slice, n, dx);
}

/* The weight gradient of output channels [o0, o1) with dy fp16: dw[o, tap, c] = 0, += dy[p, o] * x[p', c] over the
 * tap's pixels in order (tt_gw_walk), dy widened once per pixel where it is read; x fp32 or fp16. The
 * 1x1 stride-1 fast path of tt_conv2d_grad_weight_impl adds the same products in the same pixel order (a float x
 * skips no pixel), so this gives its bits too. */
void tt_conv2d_grad_weight_hdy_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1, const uint16_t *dy,
                                         const float *x, float *dw)
{
#if TT_FVEC_GW
    if (tt_fvec_gw_conv(d, k, o0, o1, 0, dy, x, 0, dw)) {
        return;
    }
#endif
    tt_gw_walk(d, k, o0, o1, 0, dy, x, 0, 0, 1.0f, 0, dw);
}

void tt_conv2d_grad_weight_hdy_hx_f32_range(const tt_conv_dims *d, int32_t k, int32_t o0, int32_t o1,
                                            const uint16_t *dy, const uint16_t *x, float *dw)
{
#if TT_FVEC_GW
    if (tt_fvec_gw_conv(d, k, o0, o1, 0, dy, 0, x, dw)) {
        return;
    }
#endif
    tt_gw_walk(d, k, o0, o1, 0, dy, 0, 0, x, 1.0f, 0, dw);
}

/* tt_conv_f32_walk with x fp16: acc = 0, += x * w over the in-image taps in (filter y, filter x, input channel)
 * order (the trained slice's channels [0, n) first), + bias, the clamp; stored in fp32 (yf) or rounded once in
 * fp16 (yh). Four output channels at a time: each input is widened once into a register and goes into four
 * accumulators, each of which adds its own products in the order above (the same bits as one channel at a time). No
 * stack field: a field of widened inputs (1 KB before) cost more SRAM than fp16's smaller arena gave back, and the
 * blocked loop widens a quarter as often as per product, with one load fewer per product than the field. */
TT_CONV_INLINE void tt_conv_hx_px(const tt_conv_dims *d, int32_t b, int32_t iy0, int32_t ix0, const uint16_t *x,
                                  const float *w, const float *w_slice, int32_t n, int32_t oc, float acc[4])
{
    const int32_t ss = d->k_h * d->k_w * n, sw = d->k_h * d->k_w * d->in_c;   /* per-channel weight strides */
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int32_t ky, kx, ic;
    for (ky = 0; ky < d->k_h; ++ky) {
        const int32_t iy = iy0 + ky * d->dilation_h;
        if (iy < 0 || iy >= d->in_h) {
            continue;
        }
        for (kx = 0; kx < d->k_w; ++kx) {
            const int32_t ix = ix0 + kx * d->dilation_w;
            const uint16_t *xp;
            const float *wp;
            if (ix < 0 || ix >= d->in_w) {
                continue;
            }
            xp = x + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
            wp = w_slice + ((oc * d->k_h + ky) * d->k_w + kx) * n;
            for (ic = 0; ic < n; ++ic) {
                const float v = tt_f16_read(xp[ic]);
                a0 += v * wp[ic];
                a1 += v * wp[ic + ss];
                a2 += v * wp[ic + 2 * ss];
                a3 += v * wp[ic + 3 * ss];
            }
            wp = w + ((oc * d->k_h + ky) * d->k_w + kx) * d->in_c;
            for (ic = n; ic < d->in_c; ++ic) {
                const float v = tt_f16_read(xp[ic]);
                a0 += v * wp[ic];
                a1 += v * wp[ic + sw];
                a2 += v * wp[ic + 2 * sw];
                a3 += v * wp[ic + 3 * sw];
            }
        }
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

TT_CONV_INLINE void tt_conv_hx_walk(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                                    const float *w, const float *w_slice, int32_t n, const float *bias, float *yf,
                                    uint16_t *yh)
{
    int32_t b, oy, ox, oc, j;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                const int32_t yp = ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (oc = 0; oc < d->out_c; ) {
                    float acc[4];
                    int32_t nb = 4;
                    if (d->out_c - oc >= 4) {
                        tt_conv_hx_px(d, b, iy0, ix0, x, w, w_slice, n, oc, acc);
                    } else {                                   /* the last out_c % 4 channels, one at a time */
                        nb = 1;
                        acc[0] = tt_conv_px1(d, b, iy0, ix0, 0, x, w, w_slice, n, oc);
                    }
                    for (j = 0; j < nb; ++j, ++oc) {
                        tt_conv_out(acc[j], bias, oc, act_min, act_max, yf, yh, yp + oc);
                    }
                }
            }
        }
    }
}

void tt_conv2d_hx_f32_split(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                            const float *w_slice, int32_t n, const float *bias, float *y)
{
#ifdef TT_FVEC_CONV
    if (tt_fvec_conv2d_hx(d, act_min, act_max, x, w, w_slice, n, bias, y, 0)) {
        return;
    }
#endif
    tt_conv_hx_walk(d, act_min, act_max, x, w, w_slice, n, bias, y, 0);
}

void tt_conv2d_hx_hy_split(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                           const float *w_slice, int32_t n, const float *bias, uint16_t *y)
{
#ifdef TT_FVEC_CONV
    if (tt_fvec_conv2d_hx(d, act_min, act_max, x, w, w_slice, n, bias, 0, y)) {
        return;
    }
#endif
    tt_conv_hx_walk(d, act_min, act_max, x, w, w_slice, n, bias, 0, y);
}

void tt_conv2d_hx_f32_split_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                                const float *w, const float *w_slice, int32_t n, const float *bias, int32_t *w_ok,
                                float *y)
{
#ifdef TT_FVEC_CONV
    if (*w_ok < 0) {
        *w_ok = tt_fvec_conv2d_wcheck(d, act_min, act_max, w, w_slice, n, bias);
    }
    if (tt_fvec_conv2d_hx_ew(*w_ok, d, act_min, act_max, x, w, w_slice, n, bias, y, 0)) {
        return;
    }
#else
    (void)w_ok;
#endif
    tt_conv_hx_walk(d, act_min, act_max, x, w, w_slice, n, bias, y, 0);
}

void tt_conv2d_hx_hy_split_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                               const float *w, const float *w_slice, int32_t n, const float *bias, int32_t *w_ok,
                               uint16_t *y)
{
#ifdef TT_FVEC_CONV
    if (*w_ok < 0) {
        *w_ok = tt_fvec_conv2d_wcheck(d, act_min, act_max, w, w_slice, n, bias);
    }
    if (tt_fvec_conv2d_hx_ew(*w_ok, d, act_min, act_max, x, w, w_slice, n, bias, 0, y)) {
        return;
    }
#else
    (void)w_ok;
#endif
    tt_conv_hx_walk(d, act_min, act_max, x, w, w_slice, n, bias, 0, y);
}
