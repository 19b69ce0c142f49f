/* depthwise_conv2d: int8 and float32 forward (also in place, channel by channel), and its backward
 * depthwise_conv2d_grad_input (float and int8 weight, also in place) and depthwise_conv2d_grad_weight (whole
 * and by taps). Arithmetic conventions: ops/tt_conv2d.c's header. */
#include <string.h>

#include "tt_kernels.h"
#include "tt_dot.h"
#include "tt_requant.h"
#include "tt_train_ops.h"
#include "tt_conv_common.h"
#include "tt_simd.h"
#include "tt_f16.h"
#include "tt_dw_s8_avx2.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_dw.h"
/* fp16-mixed's depthwise forward and input gradient run on Helium where tt_fvec_dw_ok allows (tt_fvec_dw.c) */
#define TT_DW_FVEC(d, w, bias, lo, hi) tt_fvec_dw_ok(d, w, bias, lo, hi)
#else
#define TT_DW_FVEC(d, w, bias, lo, hi) 0
#endif

#ifdef TT_INTERFACE
/* Output channel ic*M + m reads input channel ic. */
void tt_depthwise_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                            const int32_t *bias, int8_t *y);
void tt_depthwise_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *bias, float *y);
void tt_depthwise_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx);
/* dw [1,KH,KW,k*M]: the filters fed by input channels [0, k). */
void tt_depthwise_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x,
                                         float *dw);
/* Taps [t0, t1) only (t = ky*KW + kx: the rows of the [KH*KW, k*M] gradient, channels last so an output-channel
 * range would not be contiguous): dw [t1-t0, k*M] holds rows t0..; bits of the whole call. */
void tt_depthwise_conv2d_grad_weight_f32_taps(const tt_conv_dims *d, int32_t k, int32_t t0, int32_t t1,
                                              const float *dy, const float *x, float *dw);
/* fp16-mixed (issue 13): the same gradient reading the saved fp16 input x itself, each element widened where it is
 * used (tt_f16_read: exact), so no fp32 copy of x is made; the bits of tt_depthwise_conv2d_grad_weight_f32 on the
 * widened input. */
void tt_depthwise_conv2d_grad_weight_hx_f32(const tt_conv_dims *d, int32_t k, const float *dy, const uint16_t *x,
                                            float *dw);
/* fp16-mixed: the same gradient reading an fp16 output gradient dy (each element widened where it is used: exact)
 * and x fp32 (xf) or fp16 (xh), the other 0: the bits of tt_depthwise_conv2d_grad_weight_f32 on the widened values,
 * with no fp32 copy of dy. */
void tt_depthwise_conv2d_grad_weight_hdy_f32(const tt_conv_dims *d, int32_t k, const uint16_t *dy, const float *xf,
                                             const uint16_t *xh, float *dw);
/* The input gradient reading the int8 weight, dequantized where it is read (as tt_conv2d_grad_input_qw_f32:
 * bits of the dequantized weight's float kernel, no fp32 copy of the weight). */
void tt_depthwise_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w,
                                           const float *scale, const int32_t *zero_point, float *dx);
/* Depthwise input gradient written over its output gradient (depth multiplier 1; memplan's in-place
 * depthwise_conv2d_grad_input): dydx holds dz on entry and dx on return; scratch holds in_h*in_w floats. Channel
 * by channel like tt_depthwise_conv2d_f32_inplace; the bits of the out-of-place kernels. */
void tt_depthwise_conv2d_grad_input_f32_inplace(const tt_conv_dims *d, float *dydx, const float *w, float *scratch);
void tt_depthwise_conv2d_grad_input_qw_f32_inplace(const tt_conv_dims *d, float *dydx, const int8_t *w,
                                                   const float *scale, const int32_t *zero_point, float *scratch);
/* One channel of a depth-multiplier-1 input gradient (the in-place kernels' and the hidden-channel streams'):
 * dyc points at the channel's first output-gradient element, pixel stride d->out_c (1 on a compact plane); the
 * taps are floats wc[tap * w_stride] or (wc 0) int8 wq[tap * d->out_c] dequantized with (z, sc) per element;
 * input pixel p gets out[p * os] = 0 + s (add: out[p * os] + s), s the sum over its taps in (filter y, filter x)
 * order of dy * w: the bits of tt_depthwise_conv2d_grad_input_f32 / _qw_f32 at that channel. */
void tt_depthwise_conv2d_grad_input_channel_f32(const tt_conv_dims *d, const float *dyc, const float *wc,
                                                 int32_t w_stride, const int8_t *wq, int32_t z, float sc, float *out,
                                                 int32_t os, int32_t add);
/* In place (TinyEngine's channel-by-channel scheme the memory plan counts: one output channel of scratch, then
 * copied over the input channel it came from; depth multiplier 1 only): */
/* y written over x (same buffer); scratch holds out_h*out_w elements. Same arithmetic as the out-of-place
 * kernels. */
void tt_depthwise_conv2d_s8_inplace(const tt_conv_dims *d, const tt_requant_s8 *q, int8_t *xy, const int8_t *w,
                                    const int32_t *bias, int8_t *scratch);
/* One channel of a depthwise conv with depth multiplier 1 (ops/tt_depthwise_conv2d.c): xc / wc point at channel c
 * of the batch's input and of the weight, output pixel p is written to out[p * out_stride]. */
void tt_depthwise_channel_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *xc, const int8_t *wc,
                             int32_t bias, int32_t c, int8_t *out, int32_t out_stride);
void tt_depthwise_conv2d_f32_inplace(const tt_conv_dims *d, float act_min, float act_max, float *xy,
                                     const float *w, const float *bias, float *scratch);
/* fp16-mixed (issue 13): the float forward reading an fp16 x (widened where it is used: exact) and writing an fp16 y
 * (each result rounded once on store), the bits of tt_cast_f16_f32 + tt_depthwise_conv2d_f32 + tt_round_f16 with
 * neither fp32 tensor made; in place (y over x, depth multiplier 1) through one channel of fp16 scratch
 * (out_h*out_w elements), as tt_depthwise_conv2d_f32_inplace. */
void tt_depthwise_conv2d_hx_hy(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                               const float *w, const float *bias, uint16_t *y);
/* tt_depthwise_conv2d_hx_hy called again and again with the same weight, bias and clamp (a row stream): *w_ok is -1
 * at the stream's first call and keeps tt_fvec_dw_ok's answer for the others. Elsewhere, the plain kernel. */
void tt_depthwise_conv2d_hx_hy_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                                   const float *w, const float *bias, int32_t *w_ok, uint16_t *y);
void tt_depthwise_conv2d_hx_hy_inplace(const tt_conv_dims *d, float act_min, float act_max, uint16_t *xy,
                                       const float *w, const float *bias, uint16_t *scratch);
/* The float input gradient reading an fp16 dy and writing an fp16 dx (rounded once on store): the bits of
 * tt_cast_f16_f32 + tt_depthwise_conv2d_grad_input_f32 + tt_round_f16; in place (dx over dy, depth multiplier 1)
 * through one channel of fp16 scratch (in_h*in_w elements), as tt_depthwise_conv2d_grad_input_f32_inplace. */
void tt_depthwise_conv2d_grad_input_hdy_hdx(const tt_conv_dims *d, const uint16_t *dy, const float *w, uint16_t *dx);
void tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(const tt_conv_dims *d, uint16_t *dydx, const float *w,
                                                    uint16_t *scratch);
#endif /* TT_INTERFACE */

static inline int32_t tt_requant_one(const tt_requant_s8 *q, int32_t acc, int32_t oc)
{
    const int32_t i = q->per_channel ? oc : 0;
    int32_t v = tt_multiply_by_quantized_multiplier(acc, q->multiplier[i], (int)q->shift[i]);
    v += q->output_zero_point;
    return tt_clamp32(v, q->act_min, q->act_max);
}

/* Outputs per chunk of tt_dw3x3_run: their raw sums wait in an int32 array on the stack (128 bytes). */
#define TT_DW_CHUNK 32

/* Raw sums of `count` outputs of one channel of a 3x3 depthwise conv: rows p0, p1, p2 of the first output's
 * top-left tap, taps C bytes apart along x, outputs `step` bytes apart. The nine weights are plain locals and
 * nothing else is live in the loop (the requantization runs afterwards over the chunk), which keeps the loop at
 * two instructions per tap plus the pointer steps. */
TT_CONV_INLINE void tt_dw3x3_sums(const int8_t *p0, const int8_t *p1, const int8_t *p2, int32_t C, int32_t step,
                                  int32_t count, const int32_t *w9, int32_t *acc)
{
    const int32_t w0 = w9[0], w1 = w9[1], w2 = w9[2], w3 = w9[3], w4 = w9[4], w5 = w9[5], w6 = w9[6];
    const int32_t w7 = w9[7], w8 = w9[8], C2 = 2 * C;
    int32_t *const e = acc + count;
    while (acc < e) {
        *acc++ = p0[0] * w0 + p0[C] * w1 + p0[C2] * w2 + p1[0] * w3 + p1[C] * w4 + p1[C2] * w5 + p2[0] * w6 +
                 p2[C] * w7 + p2[C2] * w8;
        p0 += step;
        p1 += step;
        p2 += step;
    }
}

/* A run of `count` outputs of one channel of a 3x3 depthwise conv without dilation whose columns are all in the
 * image: p0, p1, p2 are the three input rows of the first output at its left tap. A filter row outside the image
 * (top / bottom border) has zero weights in w9 and a row pointer at an in-image row, so it adds nothing; `add` is
 * bias - z_x * (sum of the weights of the in-image rows). Sums chunk by chunk, then requantized. */
TT_CONV_NOINLINE void tt_dw3x3_run(const int8_t *p0, const int8_t *p1, const int8_t *p2, int32_t C, int32_t step,
                                   int32_t count, const int32_t *w9, int32_t add, const tt_requant1 *r,
                                   const tt_requant_fast *f, int32_t fast, int8_t *out, int32_t out_stride)
{
    int32_t acc[TT_DW_CHUNK];
    const int32_t lo = r->lo, hi = r->hi;
    while (count > 0) {
        const int32_t n = count < TT_DW_CHUNK ? count : TT_DW_CHUNK;
        int32_t i;
        tt_dw3x3_sums(p0, p1, p2, C, step, n, w9, acc);
        if (fast) {
            const int64_t k = f->k;
            const int32_t m = f->multiplier;
            const int sh = f->sh;
            for (i = 0; i < n; ++i) {
                *out = (int8_t)tt_clamp32(tt_requant_fast_apply(k, m, sh, acc[i] + add), lo, hi);
                out += out_stride;
            }
        } else {
            for (i = 0; i < n; ++i) {
                *out = tt_requant_apply(r, acc[i] + add);
                out += out_stride;
            }
        }
        p0 += n * step;
        p1 += n * step;
        p2 += n * step;
        count -= n;
    }
}

/* One channel of a depth-multiplier-1 depthwise conv (shared with the in-place kernel, tt_train_ops.c): xc is the
 * batch's input at channel c (pixel stride in_c), wc the weight at channel c (tap stride out_c); output pixel p goes
 * to out[p * out_stride]. Interior outputs skip the bounds checks and take the zero point out of the taps
 * (sum (x - z) w = sum x w - z sum w, exact in int32); a 3x3 filter without dilation runs tt_dw3x3_run, its nine
 * weights in locals. Border outputs sum (x - z) w over their in-image taps (a rectangle of the filter). */
void tt_depthwise_channel_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *xc, const int8_t *wc,
                             int32_t bias, int32_t c, int8_t *out, int32_t out_stride)
{
    const tt_geom g = tt_geom_of(d);
    const int32_t C = g.in_c, WS = g.out_c, zin = q->input_zero_point, row = g.in_w * C;
    const tt_requant1 r = tt_requant_channel(q, c);
    const int32_t k3 = g.k_h == 3 && g.k_w == 3 && g.dil_h == 1 && g.dil_w == 1;
    const int32_t lo = r.lo, hi = r.hi;
    tt_requant_fast f;
    const int32_t fast = tt_requant_fast_init(&f, &r);
    int32_t oy_lo, oy_hi, ox_lo, ox_hi, oy, ox, ky, kx, sw = 0, add;
    int32_t w9[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    int32_t wz[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    int32_t rsum[3] = {0, 0, 0};
    int32_t rk0 = -1, rk1 = -1, radd = 0, rb = 0;
    const int32_t *rw = w9;
    tt_interior(g.out_h, g.in_h, g.stride_h, g.pad_top, g.k_h, g.dil_h, &oy_lo, &oy_hi);
    tt_interior(g.out_w, g.in_w, g.stride_w, g.pad_left, g.k_w, g.dil_w, &ox_lo, &ox_hi);
    for (ky = 0; ky < g.k_h * g.k_w; ++ky) {
        sw += wc[ky * WS];
    }
    add = bias - zin * sw;
    if (k3) {
        for (ky = 0; ky < 9; ++ky) {
            w9[ky] = wc[ky * WS];
            rsum[ky / 3] += w9[ky];
        }
    }
    for (oy = 0; oy < g.out_h; ++oy) {
        const int32_t iy0 = oy * g.stride_h - g.pad_top;
        const int32_t row_in = oy >= oy_lo && oy < oy_hi;
        const int32_t a_lo = row_in ? ox_lo : g.out_w, a_hi = row_in ? ox_hi : g.out_w;
        int8_t *op = out + oy * g.out_w * out_stride;
        int32_t ky0 = 0, ky1 = g.k_h, r_lo = g.out_w, r_hi = g.out_w;
        /* the in-image filter rows of this output row */
        while (ky0 < ky1 && iy0 + ky0 * g.dil_h < 0) {
            ++ky0;
        }
        while (ky1 > ky0 && iy0 + (ky1 - 1) * g.dil_h >= g.in_h) {
            --ky1;
        }
        if (k3 && ky0 == 0 && ky1 == 3 && ox_hi > ox_lo) {
            /* 3x3: the columns whose taps are all in the image run through tt_dw3x3_run */
            r_lo = ox_lo;
            r_hi = ox_hi;
            rw = w9;
            rb = add;
        } else if (k3 && ky1 > ky0 && ox_hi - ox_lo >= 8) {
            /* a wide top / bottom border row too, its outside filter rows' weights zeroed (rebuilt only when the
             * rows change: narrow rows keep the per-output border path, cheaper than the rebuild) */
            r_lo = ox_lo;
            r_hi = ox_hi;
            if (ky0 != rk0 || ky1 != rk1) {
                int32_t s = 0;
                for (ky = 0; ky < 9; ++ky) {
                    const int32_t in = ky / 3 >= ky0 && ky / 3 < ky1;
                    wz[ky] = in ? w9[ky] : 0;
                    s += in && ky % 3 == 0 ? rsum[ky / 3] : 0;
                }
                radd = bias - zin * s;
                rk0 = ky0;
                rk1 = ky1;
            }
            rw = wz;
            rb = radd;
        }
        for (ox = 0; ox < g.out_w; ++ox) {
            const int32_t ix0 = ox * g.stride_w - g.pad_left;
            int32_t acc = 0;
            if (ox == r_lo && r_hi > r_lo) {
                const int8_t *xb = xc + ix0 * C;
                const int32_t y0 = iy0 + (ky0 > 0 ? ky0 : 0);
                const int8_t *p0 = xb + (ky0 <= 0 ? iy0 : y0) * row;
                const int8_t *p1 = xb + (ky0 <= 1 && ky1 > 1 ? iy0 + 1 : y0) * row;
                const int8_t *p2 = xb + (ky1 > 2 ? iy0 + 2 : y0) * row;
                tt_dw3x3_run(p0, p1, p2, C, g.stride_w * C, r_hi - r_lo, rw, rb, &r, &f, fast,
                             op + ox * out_stride, out_stride);
                ox = r_hi - 1;
                continue;
            }
            if (ox >= a_lo && ox < a_hi) {
                const int8_t *p0 = xc + iy0 * row + ix0 * C;
                for (ky = 0; ky < g.k_h; ++ky) {
                    for (kx = 0; kx < g.k_w; ++kx) {
                        acc += p0[ky * g.dil_h * row + kx * g.dil_w * C] * wc[(ky * g.k_w + kx) * WS];
                    }
                }
                acc += add;
            } else if (k3) {
                /* per tap bounds checks on the three rows and columns, the weights in a small local table */
                const int32_t vx0 = ix0 >= 0 && ix0 < g.in_w, vx1 = ix0 + 1 >= 0 && ix0 + 1 < g.in_w;
                const int32_t vx2 = ix0 + 2 >= 0 && ix0 + 2 < g.in_w;
                for (ky = ky0; ky < ky1; ++ky) {
                    const int8_t *xr = xc + (iy0 + ky) * row + ix0 * C;
                    const int32_t *wr = w9 + 3 * ky;
                    if (vx0) {
                        acc += ((int32_t)xr[0] - zin) * wr[0];
                    }
                    if (vx1) {
                        acc += ((int32_t)xr[C] - zin) * wr[1];
                    }
                    if (vx2) {
                        acc += ((int32_t)xr[2 * C] - zin) * wr[2];
                    }
                }
                acc += bias;
            } else {
                /* the in-image taps: a rectangle of the filter (int32 sums: any order) */
                int32_t k4[4];
                tt_tap_window(d, iy0, ix0, k4);
                for (ky = k4[0]; ky < k4[1]; ++ky) {
                    const int8_t *xr = xc + (iy0 + ky * g.dil_h) * row + ix0 * C;
                    const int8_t *wr = wc + ky * g.k_w * WS;
                    for (kx = k4[2]; kx < k4[3]; ++kx) {
                        acc += ((int32_t)xr[kx * g.dil_w * C] - zin) * (int32_t)wr[kx * WS];
                    }
                }
                acc += bias;
            }
            op[ox * out_stride] = fast ? (int8_t)tt_clamp32(tt_requant_fast_apply(f.k, f.multiplier, f.sh, acc), lo, hi)
                                       : tt_requant_apply(&r, acc);
        }
    }
}

/* ---- 3x3 depth multiplier 1, channel by channel over int16 rows (the DSP build) ------------------------------
 * A channel's input rows are copied once into a ring of three int16 rows holding x - z_x (|x - z_x| <= 255), with
 * zeros where a tap falls outside the image: every output is then the reference's sum over its in-image taps of
 * (x - z_x) * w, border or not, with no bounds checks. A filter row's taps (w0, w1) and (w1, w2) sit packed in two
 * registers, so two neighbouring outputs of a stride-1 row take two word loads and four dual / single 16-bit MACs
 * (SMLAD, SMLABT, SMLATB) per filter row: 6 instructions for 6 MACs. Stride 2: three loads for two outputs.
 * Columns are done in strips of TT_DW16_STRIP outputs so the ring stays small whatever the width; within a strip a
 * row is copied once however many output rows read it. int32 sums of the same products: the reference's bits. */
#define TT_DW16_STRIP 32
#define TT_DW16_W (2 * TT_DW16_STRIP + 2) /* int16 per ring row: a strip's taps at stride 2, and one */

#if TT_SIMD
#define TT_ASM_ARG __attribute__((unused)) /* read by a naked body in r0-r3 */

/* Ring row `dst` (span columns from input column ix0) from input row iy of channel xc (pixel stride C). */
static void tt_dw16_fill(int16_t *dst, const int8_t *xc, int32_t C, int32_t in_h, int32_t in_w, int32_t iy,
                         int32_t ix0, int32_t span, int32_t zin)
{
    int32_t i = 0, a, b;
    dst[span] = 0; /* read, never used, by the stride-2 pair whose second output is the strip's last */
    if (iy < 0 || iy >= in_h) {
        memset(dst, 0, (size_t)span * sizeof(int16_t));
        return;
    }
    a = ix0 < 0 ? -ix0 : 0;                      /* first in-image column of the span */
    b = in_w - ix0 < span ? in_w - ix0 : span;   /* one past the last */
    for (; i < a; ++i) {
        dst[i] = 0;
    }
    {
        const int8_t *src = xc + ((int32_t)iy * in_w + ix0 + a) * C;
        int16_t *d = dst + a;
        int16_t *const e = dst + b;
        const int32_t C2 = 2 * C;
        while (d + 2 <= e) { /* two per pass: one packed word store */
            const uint32_t v = (uint32_t)tt_pack16((int32_t)src[0] - zin, (int32_t)src[C] - zin);
            memcpy(d, &v, 4);
            d += 2;
            src += C2;
        }
        if (d < e) {
            *d = (int16_t)((int32_t)*src - zin);
        }
    }
    for (i = b > a ? b : a; i < span; ++i) {
        dst[i] = 0;
    }
}

static inline int32_t tt_dw16_ld(const int16_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Raw sums of `pairs` pairs of neighbouring outputs of one ring strip: rows p0, p1, p2 (int16, from the pair's
 * first tap), a[0..5] the packed taps (w0, w1), (w1, w2) of filter rows 0, 1, 2; sums to acc[0 .. 2 * pairs).
 * s == 1: outputs one column apart (two word loads per filter row and pair); s == 2: two apart (three). */
#if defined(__arm__) && defined(__GNUC__) && defined(__OPTIMIZE__)
/* Written out (naked, all 14 registers its own): GCC's allocation of the C loop below spilled the six packed
 * weights to the stack and reloaded them per pair. r0-r2 the rows, r3 a word of a row, r4-r9 the weights, r10 acc,
 * r11 the pairs left, r12 / lr the two sums: 20 instructions per stride-1 pair (18 MACs), 21 at stride 2. */
/* Both loops: save r4-r11, load the six packed weights, acc and the pair count, start the first pair's first sum;
 * then store the pair's two sums and loop. */
#define TT_DW16_ENTER \
    "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t" \
    "ldm    r3, {r4, r5, r6, r7, r8, r9, r10, r11}\n\t" \
    "1:\n\t" \
    "ldr    r3, [r0], #4\n\t" \
    "smuad  r12, r3, r4\n\t"
#define TT_DW16_LEAVE \
    "strd   r12, lr, [r10], #8\n\t" \
    "subs   r11, r11, #1\n\t" \
    "bne    1b\n\t" \
    "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t"

__attribute__((naked, noinline)) static void tt_dw16_pairs1(TT_ASM_ARG const int16_t *p0, TT_ASM_ARG const int16_t *p1,
                                                              TT_ASM_ARG const int16_t *p2, TT_ASM_ARG const int32_t *args)
{
    __asm__ volatile(
        TT_DW16_ENTER
        "smultb lr, r3, r4\n\t"
        "ldr    r3, [r0]\n\t"
        "smlabt r12, r3, r5, r12\n\t"
        "smlad  lr, r3, r5, lr\n\t"
        "ldr    r3, [r1], #4\n\t"
        "smlad  r12, r3, r6, r12\n\t"
        "smlatb lr, r3, r6, lr\n\t"
        "ldr    r3, [r1]\n\t"
        "smlabt r12, r3, r7, r12\n\t"
        "smlad  lr, r3, r7, lr\n\t"
        "ldr    r3, [r2], #4\n\t"
        "smlad  r12, r3, r8, r12\n\t"
        "smlatb lr, r3, r8, lr\n\t"
        "ldr    r3, [r2]\n\t"
        "smlabt r12, r3, r9, r12\n\t"
        "smlad  lr, r3, r9, lr\n\t"
        TT_DW16_LEAVE);
}

__attribute__((naked, noinline)) static void tt_dw16_pairs2(TT_ASM_ARG const int16_t *p0, TT_ASM_ARG const int16_t *p1,
                                                              TT_ASM_ARG const int16_t *p2, TT_ASM_ARG const int32_t *args)
{
    __asm__ volatile(
        TT_DW16_ENTER
        "ldr    r3, [r0], #4\n\t"
        "smlabt r12, r3, r5, r12\n\t"
        "smuad  lr, r3, r4\n\t"
        "ldr    r3, [r0]\n\t"
        "smlabt lr, r3, r5, lr\n\t"
        "ldr    r3, [r1], #4\n\t"
        "smlad  r12, r3, r6, r12\n\t"
        "ldr    r3, [r1], #4\n\t"
        "smlabt r12, r3, r7, r12\n\t"
        "smlad  lr, r3, r6, lr\n\t"
        "ldr    r3, [r1]\n\t"
        "smlabt lr, r3, r7, lr\n\t"
        "ldr    r3, [r2], #4\n\t"
        "smlad  r12, r3, r8, r12\n\t"
        "ldr    r3, [r2], #4\n\t"
        "smlabt r12, r3, r9, r12\n\t"
        "smlad  lr, r3, r8, lr\n\t"
        "ldr    r3, [r2]\n\t"
        "smlabt lr, r3, r9, lr\n\t"
        TT_DW16_LEAVE);
}

static inline void tt_dw16_pairs(const int16_t *p0, const int16_t *p1, const int16_t *p2, const int32_t *a,
                                 int32_t s, int32_t pairs, int32_t *acc)
{
    int32_t args[8];
    memcpy(args, a, 6 * sizeof(int32_t));
    args[6] = (int32_t)(intptr_t)acc;
    args[7] = pairs;
    if (s == 1) {
        tt_dw16_pairs1(p0, p1, p2, args);
    } else {
        tt_dw16_pairs2(p0, p1, p2, args);
    }
}
#else
static inline void tt_dw16_pairs(const int16_t *p0, const int16_t *p1, const int16_t *p2, const int32_t *a,
                                 int32_t s, int32_t pairs, int32_t *acc)
{
    const int16_t *const rows[3] = {p0, p1, p2};
    int32_t i, ky;
    for (i = 0; i < pairs; ++i) {
        int32_t s0 = 0, s1 = 0;
        for (ky = 0; ky < 3; ++ky) {
            const int16_t *p = rows[ky] + 2 * s * i;
            const int32_t w01 = a[2 * ky], w12 = a[2 * ky + 1];
            if (s == 1) {
                s0 = __smlad(tt_dw16_ld(p), w01, s0);
                s1 = __smlatb(tt_dw16_ld(p), w01, s1);
                s0 = __smlabt(tt_dw16_ld(p + 2), w12, s0);
                s1 = __smlad(tt_dw16_ld(p + 2), w12, s1);
            } else {
                s0 = __smlad(tt_dw16_ld(p), w01, s0);
                s0 = __smlabt(tt_dw16_ld(p + 2), w12, s0);
                s1 = __smlad(tt_dw16_ld(p + 2), w01, s1);
                s1 = __smlabt(tt_dw16_ld(p + 4), w12, s1);
            }
        }
        acc[2 * i] = s0;
        acc[2 * i + 1] = s1;
    }
}
#endif

/* Requantizes n doubled sums acc[i] (+ 2 * bias) to out[i * stride]: c = {2 * bias, h, multiplier, e} of a
 * tt_requant_mm channel, the output range the full int8 one ([-128, 127]: one SSAT). */
#if defined(__arm__) && defined(__GNUC__) && defined(__OPTIMIZE__)
/* Written out, two outputs per pass (one LDRD of their sums, the second stored at [out, stride]): 8 instructions
 * per output, an odd n's first output alone (GCC's loop of the C below reloaded its constants from the stack).
 * n >= 1; acc word-aligned (LDRD). */
#define TT_RQ_OUT(acc, t, addr)                                                                               \
    "add    " acc ", " acc ", r5\n\t"                                                                         \
    "add    " t ", r6, " acc ", asr #31\n\t"                                                                  \
    "smmlar " t ", " acc ", r7, " t "\n\t"                                                                     \
    "asr    " t ", " t ", r8\n\t"                                                                              \
    "ssat   " t ", #8, " t "\n\t"                                                                              \
    "strb   " t ", " addr "\n\t"

__attribute__((naked, noinline)) static void tt_rq_run_s8(TT_ASM_ARG const int32_t *args)
{
    /* args: acc, out, stride, n, 2 * bias, h, multiplier, e */
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "ldm    r0, {r1, r2, r3, r4, r5, r6, r7, r8}\n\t"
        "tst    r4, #1\n\t"
        "beq    1f\n\t"
        "ldr    r0, [r1], #4\n\t"
        TT_RQ_OUT("r0", "r9", "[r2]")
        "add    r2, r2, r3\n\t"
        "subs   r4, r4, #1\n\t"
        "beq    2f\n\t"
        "1:\n\t"
        "ldrd   r0, r10, [r1], #8\n\t"
        TT_RQ_OUT("r0", "r9", "[r2]")
        TT_RQ_OUT("r10", "r11", "[r2, r3]")
        "add    r2, r2, r3, lsl #1\n\t"
        "subs   r4, r4, #2\n\t"
        "bne    1b\n\t"
        "2:\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}
#undef TT_RQ_OUT

static inline void tt_rq_run(const int32_t *acc, int8_t *out, int32_t stride, int32_t n, int32_t bias2,
                             const tt_requant_mm *o)
{
    int32_t args[8];
    if (n <= 0) { /* tt_rq_run_s8's loop takes n >= 1 (from 0 its count never ends) */
        return;
    }
    args[0] = (int32_t)(intptr_t)acc;
    args[1] = (int32_t)(intptr_t)out;
    args[2] = stride;
    args[3] = n;
    args[4] = bias2;
    args[5] = o->h;
    args[6] = o->multiplier;
    args[7] = o->e;
    tt_rq_run_s8(args);
}
#else
static inline void tt_rq_run(const int32_t *acc, int8_t *out, int32_t stride, int32_t n, int32_t bias2,
                             const tt_requant_mm *o)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        out[i * stride] = (int8_t)tt_clamp32(tt_requant_mm_apply(o->h, o->multiplier, o->e, acc[i] + bias2), -128, 127);
    }
}
#endif

/* A channel's requantization, chosen once: full (tt_rq_run: one SMMLAR and one SSAT), mm (the same with a
 * general clamp) or the reference's (the doubled sums halved, exactly: they are even). */
typedef struct {
    tt_requant_mm mm;
    const tt_requant1 *r;
    int32_t bias, lo, hi, fast, full;
} tt_dw16_rq;

static void tt_dw16_store(const tt_dw16_rq *q, const int32_t *acc, int32_t n, int8_t *op, int32_t out_stride)
{
    int32_t i;
    if (q->full) {
        tt_rq_run(acc, op, out_stride, n, 2 * q->bias, &q->mm);
    } else if (q->fast) {
        for (i = 0; i < n; ++i) {
            op[i * out_stride] = (int8_t)tt_clamp32(
                tt_requant_mm_apply(q->mm.h, q->mm.multiplier, q->mm.e, acc[i] + 2 * q->bias), q->lo, q->hi);
        }
    } else {
        for (i = 0; i < n; ++i) {
            op[i * out_stride] = tt_requant_apply(q->r, (acc[i] >> 1) + q->bias);
        }
    }
}

/* int16 of the ring (three rows of TT_DW16_W), which a small map's whole padded plane may take instead, and the
 * raw sums a pass leaves for the requantization. */
#define TT_DW16_BUF (3 * TT_DW16_W)
#define TT_DW16_ACC 96

/* A channel's set-up, made once per channel whatever the batch: the requantization (tt_dw16_rq) and the doubled
 * taps packed in pairs, (w0, w1) and (w1, w2) of each filter row. r must outlive the set-up (q.r points at it). */
typedef struct {
    tt_dw16_rq q;
    int32_t a[6];
} tt_dw16_setup;

/* zr: 0, or z_x when the rows hold raw x (tt_dw4_fill): the constant is then bias - z_x * (sum of the nine taps),
 * the sum taken from the taps loaded here. */
TT_CONV_INLINE void tt_dw16_set_up(const int8_t *wc, int32_t WS, int32_t bias, int32_t zr, const tt_requant1 *r,
                                   tt_dw16_setup *s)
{
    int32_t ky, sw = 0;
    for (ky = 0; ky < 3; ++ky) {
        /* doubled taps (|2w| <= 256 fits a lane): the sums come out doubled, as tt_requant_mm takes them */
        const int32_t w0 = 2 * wc[(3 * ky) * WS], w1 = 2 * wc[(3 * ky + 1) * WS], w2 = 2 * wc[(3 * ky + 2) * WS];
        s->a[2 * ky] = (int32_t)tt_pack16(w0, w1);
        s->a[2 * ky + 1] = (int32_t)tt_pack16(w1, w2);
        sw += w0 + w1 + w2;
    }
    bias -= zr * (sw >> 1);
    s->q.r = r;
    s->q.bias = bias;
    s->q.lo = r->lo;
    s->q.hi = r->hi;
    /* one SMMLAR (tt_requant_mm) when 2 * (sum + bias) fits: |sum| <= 9 * 255 * 256 / 2 < 2^20 */
    s->q.fast = tt_requant_mm_init(&s->q.mm, r) && bias > -(1 << 29) && bias < (1 << 29);
    s->q.full = s->q.fast && s->q.lo == -128 && s->q.hi == 127;
}

/* Whether tt_dw16_channel takes its small-map path: the channel's whole padded input plane fits the buffer (so it
 * is read in full before any output is written) and stride_h == stride_w. The last pair of that path reads up to
 * S * (2 * pairs - 1) + 5 <= rows * span + 6 int16 (zeroed slack). */
static int tt_dw16_small(const tt_geom *g)
{
    const int32_t span = (g->out_w - 1) * g->stride_w + 3, rows = (g->out_h - 1) * g->stride_h + 3;
    const int32_t pairs = ((g->out_h - 1) * span + g->out_w + 1) >> 1;
    return g->stride_h == g->stride_w && rows * span + 8 <= TT_DW16_BUF && 2 * pairs <= TT_DW16_ACC;
}

/* One channel: xc at channel c of the batch's input, su the channel's set-up, output pixel p to
 * out[p * out_stride]. 3x3, no dilation. A small map (its padded plane fits the buffer, stride_h == stride_w) is
 * copied whole, rows one after the other, and one pass of tt_dw16_pairs runs over the flattened plane (the
 * outputs that would straddle two rows are computed and dropped): no per-row overhead. Otherwise strips of
 * TT_DW16_STRIP outputs over a ring of three rows, per output row the pass over the strip, then the
 * requantization. */
static void tt_dw16_channel(const tt_geom *g, const int8_t *xc, const tt_dw16_setup *su, int32_t zin, int8_t *out,
                            int32_t out_stride)
{
    int16_t buf[TT_DW16_BUF];
    int32_t acc[TT_DW16_ACC];
    int32_t tag[3];
    const int32_t *const a = su->a, S = g->stride_w;
    const tt_dw16_rq *const q = &su->q;
    int32_t ky, ox0, oy;
    {
        const int32_t span = (g->out_w - 1) * S + 3, rows = (g->out_h - 1) * g->stride_h + 3;
        const int32_t count = (g->out_h - 1) * span + g->out_w, pairs = (count + 1) >> 1;
        if (tt_dw16_small(g)) {
            int32_t i;
            for (i = 0; i < rows; ++i) {
                tt_dw16_fill(buf + i * span, xc, g->in_c, g->in_h, g->in_w, i - g->pad_top, -g->pad_left, span, zin);
            }
            for (i = rows * span; i < rows * span + 8; ++i) {
                buf[i] = 0;
            }
            tt_dw16_pairs(buf, buf + span, buf + 2 * span, a, S, pairs, acc);
            for (oy = 0; oy < g->out_h; ++oy) {
                tt_dw16_store(q, acc + oy * span, g->out_w, out + oy * g->out_w * out_stride, out_stride);
            }
            return;
        }
    }
    for (ox0 = 0; ox0 < g->out_w; ox0 += TT_DW16_STRIP) {
        const int32_t nx = g->out_w - ox0 < TT_DW16_STRIP ? g->out_w - ox0 : TT_DW16_STRIP;
        const int32_t ix0 = ox0 * S - g->pad_left, span = (nx - 1) * S + 3;
        int32_t slot0 = 0; /* ring slot of input row iy: (iy - first row read) mod 3, kept as a running index */
        int32_t first = -g->pad_top;
        tag[0] = tag[1] = tag[2] = INT32_MIN;
        for (oy = 0; oy < g->out_h; ++oy) {
            const int32_t iy0 = oy * g->stride_h - g->pad_top;
            const int16_t *rw[3];
            while (first < iy0) { /* slide the slot index along to this output row's first input row */
                ++first;
                slot0 = slot0 == 2 ? 0 : slot0 + 1;
            }
            for (ky = 0; ky < 3; ++ky) {
                const int32_t iy = iy0 + ky, slot = slot0 + ky >= 3 ? slot0 + ky - 3 : slot0 + ky;
                int16_t *row = buf + slot * TT_DW16_W;
                if (tag[slot] != iy) {
                    tt_dw16_fill(row, xc, g->in_c, g->in_h, g->in_w, iy, ix0, span, zin);
                    tag[slot] = iy;
                }
                rw[ky] = row;
            }
            if (nx >= 2) {
                tt_dw16_pairs(rw[0], rw[1], rw[2], a, S, nx >> 1, acc);
            }
            if (nx & 1) {
                /* the odd last output: its three taps one by one (the ring ends at its last tap) */
                const int32_t o = (nx - 1) * S;
                int32_t s0 = 0;
                for (ky = 0; ky < 3; ++ky) {
                    s0 = __smlad(tt_dw16_ld(rw[ky] + o), a[2 * ky], s0);
                    s0 = __smlabt(rw[ky][o + 2], a[2 * ky + 1], s0);
                }
                acc[nx - 1] = s0;
            }
            tt_dw16_store(q, acc, nx, out + (oy * g->out_w + ox0) * out_stride, out_stride);
        }
    }
}

/* Whether tt_dw16_channel serves this geometry: 3x3, no dilation, depth multiplier 1, stride 1 or 2. */
static int tt_dw16_fits(const tt_conv_dims *d)
{
    return d->k_h == 3 && d->k_w == 3 && d->dilation_h == 1 && d->dilation_w == 1 && d->depth_multiplier == 1 &&
           (d->stride_w == 1 || d->stride_w == 2) && d->stride_h >= 1 && d->in_c == d->out_c;
}

/* Every channel of every batch; ip: y == x (in place), a channel's outputs wait in scratch (out_h*out_w bytes)
 * and are copied over it once made (tt_depthwise_conv2d_s8_inplace's scheme). */
static void tt_dw16_conv(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                         const int32_t *bias, int8_t *y, int8_t *scratch)
{
    const tt_geom g = tt_geom_of(d);
    const int32_t C = g.in_c, n_out = g.out_h * g.out_w;
    const int32_t small = tt_dw16_small(&g) && n_out <= g.in_h * g.in_w;
    int32_t b, c, p;
    for (c = 0; c < C; ++c) {
        const tt_requant1 r = tt_requant_channel(q, c);
        tt_dw16_setup su;
        tt_dw16_set_up(w + c, C, bias != 0 ? bias[c] : 0, 0, &r, &su);
        for (b = 0; b < d->batches; ++b) {
            const int8_t *xb = x + b * g.in_h * g.in_w * C;
            int8_t *yb = y + b * n_out * C;
            if (scratch == 0 || small) {
                /* in place, a small map's outputs go straight over the input: its plane of channel c is read in full
                 * first, and with n_out <= n_in they land on channel c of this batch or an earlier one */
                tt_dw16_channel(&g, xb + c, &su, q->input_zero_point, yb + c, C);
            } else {
                tt_dw16_channel(&g, xb + c, &su, q->input_zero_point, scratch, 1);
                for (p = 0; p < n_out; ++p) {
                    yb[p * C + c] = scratch[p];
                }
            }
        }
    }
}

/* ---- 3x3 depth multiplier 1, four channels at a time (the DSP build, in_c % 4 == 0) -----------------------------
 * tt_dw16_channel's pair loop and requantization, with the ring rows of a group of four channels converted
 * together: one word load takes a pixel's four channels (contiguous in NHWC), SXTB16 splits them into int16 lanes and
 * PKHBT / PKHTB regroup two neighbouring pixels per channel, ~2 instructions per element against a byte gather per
 * element (tt_dw16_fill), and the group's set-up, fill calls and loop bookkeeping are shared by four channels. The
 * ring holds raw x with z_x where a tap falls outside the image, and a channel's constant is bias - z_x * (sum of
 * its nine weights): every output is the reference's int32 sum of (x - z_x) * w over its in-image taps (the
 * padding's z_x * w cancel), the same bits. */
#define TT_DW4_RS TT_DW16_BUF /* int16 of one channel's ring (or small plane) in the group's buffer */

/* PKHBT lo(a) | lo(b) << 16 and PKHTB hi(a) >> 16 | hi(b): two pixels' int16 of one channel in a word (spelled out:
 * GCC builds them from a UXTH / AND and an ORR). */
static inline uint32_t tt_pkhbt(uint32_t a, uint32_t b)
{
#if defined(__arm__) && defined(__GNUC__)
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return (a & 0xFFFFu) | (b << 16);
#endif
}

static inline uint32_t tt_pkhtb(uint32_t a, uint32_t b)
{
#if defined(__arm__) && defined(__GNUC__)
    uint32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(b), "r"(a));
    return r;
#else
    return (a >> 16) | (b & 0xFFFF0000u);
#endif
}

/* Ring rows `dst` + j * TT_DW4_RS (channels c0 + j, j < 4; span columns from input column ix0) from input row iy;
 * xg: the batch's input at channel c0 (pixel stride C, C % 4 == 0). */
static void tt_dw4_fill(int16_t *dst, const int8_t *xg, int32_t C, int32_t in_h, int32_t in_w, int32_t iy,
                        int32_t ix0, int32_t span, int32_t zin)
{
    int16_t *const d1 = dst + TT_DW4_RS, *const d2 = d1 + TT_DW4_RS, *const d3 = d2 + TT_DW4_RS;
    const int16_t z = (int16_t)zin;
    int32_t i, a = span, b = span;
    dst[span] = d1[span] = d2[span] = d3[span] = 0; /* read, never used, as in tt_dw16_fill */
    if (iy >= 0 && iy < in_h) {
        a = ix0 < 0 ? (-ix0 < span ? -ix0 : span) : 0; /* first in-image column of the span */
        b = in_w - ix0 < span ? in_w - ix0 : span;      /* one past the last */
        b = b > a ? b : a;
    }
    for (i = 0; i < a; ++i) {
        dst[i] = d1[i] = d2[i] = d3[i] = z;
    }
    if (a < b) {
        const int8_t *src = xg + ((int32_t)iy * in_w + ix0 + a) * C;
        const int32_t C2 = 2 * C;
        if ((uintptr_t)(dst + i) & 2u) { /* one column first: the pairs' word stores aligned */
            dst[i] = src[0];
            d1[i] = src[1];
            d2[i] = src[2];
            d3[i] = src[3];
            ++i;
            src += C;
        }
        for (; i + 2 <= b; i += 2, src += C2) {
            const uint32_t u = tt_ld32(src), v = tt_ld32(src + C);
            const uint32_t e0 = (uint32_t)tt_sx02(u), o0 = (uint32_t)tt_sx13(u);
            const uint32_t e1 = (uint32_t)tt_sx02(v), o1 = (uint32_t)tt_sx13(v);
            const uint32_t c0 = tt_pkhbt(e0, e1), c2 = tt_pkhtb(e0, e1);
            const uint32_t c1 = tt_pkhbt(o0, o1), c3 = tt_pkhtb(o0, o1);
            memcpy(dst + i, &c0, 4);
            memcpy(d1 + i, &c1, 4);
            memcpy(d2 + i, &c2, 4);
            memcpy(d3 + i, &c3, 4);
        }
        if (i < b) {
            dst[i] = src[0];
            d1[i] = src[1];
            d2[i] = src[2];
            d3[i] = src[3];
            ++i;
        }
    }
    for (; i < span; ++i) {
        dst[i] = d1[i] = d2[i] = d3[i] = z;
    }
}

/* Whether tt_dw4_conv serves the geometry (beyond tt_dw16_fits): whole words of channels, and in place (y == x)
 * only where the outputs never land on input not yet read: a small map (its planes read in full first) or one strip
 * per row with out_w <= in_w and pad_top <= 2 (output row oy, written once input rows up to oy * s_h - pad_top + 2
 * are in the ring, ends at pixel (oy + 1) * out_w <= (oy * s_h - pad_top + 3) * in_w, where the rows still to be
 * read start; with several batches the outputs of batch b end before batch b + 1's input, n_out <= n_in). */
static int tt_dw4_fits(const tt_geom *g, int inplace)
{
    if ((g->in_c & 3) != 0) {
        return 0;
    }
    if (!inplace) {
        return 1;
    }
    if (g->out_h * g->out_w > g->in_h * g->in_w) {
        return 0;
    }
    return tt_dw16_small(g) || (g->out_w <= TT_DW16_STRIP && g->out_w <= g->in_w && g->pad_top <= 2);
}

/* One group of four channels of one batch: xg at channel c0 of the batch's input, su[j] channel c0 + j's set-up
 * (its constant the raw-x one above), output pixel p of channel c0 + j to out[p * C + j]. tt_dw16_channel's two
 * schemes (a small map as one padded plane, else strips over a ring of three rows), the rows filled for the four
 * channels at once. */
static void tt_dw4_group(const tt_geom *g, const int8_t *xg, const tt_dw16_setup *su, int32_t zin, int8_t *out)
{
    int16_t buf[4 * TT_DW4_RS];
    int32_t acc[TT_DW16_ACC];
    int32_t tag[3];
    const int32_t S = g->stride_w, C = g->in_c;
    int32_t ky, ox0, oy, j;
    if (tt_dw16_small(g)) {
        const int32_t span = (g->out_w - 1) * S + 3, rows = (g->out_h - 1) * g->stride_h + 3;
        const int32_t count = (g->out_h - 1) * span + g->out_w, pairs = (count + 1) >> 1;
        int32_t i;
        for (i = 0; i < rows; ++i) {
            tt_dw4_fill(buf + i * span, xg, C, g->in_h, g->in_w, i - g->pad_top, -g->pad_left, span, zin);
        }
        for (j = 0; j < 4; ++j) {
            int16_t *const p = buf + j * TT_DW4_RS;
            for (i = rows * span; i < rows * span + 8; ++i) {
                p[i] = 0;
            }
            tt_dw16_pairs(p, p + span, p + 2 * span, su[j].a, S, pairs, acc);
            for (oy = 0; oy < g->out_h; ++oy) {
                tt_dw16_store(&su[j].q, acc + oy * span, g->out_w, out + oy * g->out_w * C + j, C);
            }
        }
        return;
    }
    for (ox0 = 0; ox0 < g->out_w; ox0 += TT_DW16_STRIP) {
        const int32_t nx = g->out_w - ox0 < TT_DW16_STRIP ? g->out_w - ox0 : TT_DW16_STRIP;
        const int32_t ix0 = ox0 * S - g->pad_left, span = (nx - 1) * S + 3;
        int32_t slot0 = 0, first = -g->pad_top;
        tag[0] = tag[1] = tag[2] = INT32_MIN;
        for (oy = 0; oy < g->out_h; ++oy) {
            const int32_t iy0 = oy * g->stride_h - g->pad_top;
            int32_t sl[3];
            while (first < iy0) {
                ++first;
                slot0 = slot0 == 2 ? 0 : slot0 + 1;
            }
            for (ky = 0; ky < 3; ++ky) {
                const int32_t iy = iy0 + ky, slot = slot0 + ky >= 3 ? slot0 + ky - 3 : slot0 + ky;
                if (tag[slot] != iy) {
                    tt_dw4_fill(buf + slot * TT_DW16_W, xg, C, g->in_h, g->in_w, iy, ix0, span, zin);
                    tag[slot] = iy;
                }
                sl[ky] = slot * TT_DW16_W;
            }
            for (j = 0; j < 4; ++j) {
                const int16_t *const cb = buf + j * TT_DW4_RS;
                const int16_t *const r0 = cb + sl[0], *const r1 = cb + sl[1], *const r2 = cb + sl[2];
                const int32_t *const a = su[j].a;
                if (nx >= 2) {
                    tt_dw16_pairs(r0, r1, r2, a, S, nx >> 1, acc);
                }
                if (nx & 1) {
                    const int32_t o = (nx - 1) * S;
                    int32_t s0 = __smlad(tt_dw16_ld(r0 + o), a[0], 0);
                    s0 = __smlabt(r0[o + 2], a[1], s0);
                    s0 = __smlad(tt_dw16_ld(r1 + o), a[2], s0);
                    s0 = __smlabt(r1[o + 2], a[3], s0);
                    s0 = __smlad(tt_dw16_ld(r2 + o), a[4], s0);
                    s0 = __smlabt(r2[o + 2], a[5], s0);
                    acc[nx - 1] = s0;
                }
                tt_dw16_store(&su[j].q, acc, nx, out + (oy * g->out_w + ox0) * C + j, C);
            }
        }
    }
}

/* Every group of four channels of every batch (y may be x: tt_dw4_fits says when). */
static void tt_dw4_conv(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                        const int32_t *bias, int8_t *y)
{
    const tt_geom g = tt_geom_of(d);
    const int32_t C = g.in_c, n_in = g.in_h * g.in_w, n_out = g.out_h * g.out_w, zin = q->input_zero_point;
    int32_t b, c0, j;
    for (c0 = 0; c0 < C; c0 += 4) {
        tt_requant1 r[4];
        tt_dw16_setup su[4];
        for (j = 0; j < 4; ++j) {
            r[j] = tt_requant_channel(q, c0 + j);
            tt_dw16_set_up(w + c0 + j, C, bias != 0 ? bias[c0 + j] : 0, zin, &r[j], &su[j]);
        }
        for (b = 0; b < d->batches; ++b) {
            tt_dw4_group(&g, x + b * n_in * C + c0, su, zin, y + b * n_out * C + c0);
        }
    }
}
#endif

/* The general forward of one batch over input channels [c0, c1), int8 (xq, wq, bq, q, yq) or float (xf, wf, bf,
 * the activation range, yf): output (oy, ox, oc = ic * M + m) sums its in-image taps in (filter y, filter x) order
 * (int8: (x - z_x) * w in int32; float: acc = 0, += x * w), adds the bias (NULL: none) and is requantized /
 * clamped into y[(oy * out_w + ox) * ys + oc - c0 * M]. Inlined into each caller with the other type's pointers 0,
 * so each keeps its own branch-free loop. */
TT_CONV_INLINE void tt_dw_generic(const tt_conv_dims *d, int32_t c0, int32_t c1, const int8_t *xq, const int8_t *wq,
                                  const int32_t *bq, const tt_requant_s8 *q, int8_t *yq, const float *xf,
                                  const float *wf, const float *bf, float act_min, float act_max, float *yf, int32_t ys)
{
    int32_t oy, ox, ic, m, ky, kx;
    const int32_t zin = xq != 0 ? q->input_zero_point : 0, mult = d->depth_multiplier;
    for (oy = 0; oy < d->out_h; ++oy) {
        const int32_t iy0 = oy * d->stride_h - d->pad_top;
        for (ox = 0; ox < d->out_w; ++ox) {
            const int32_t ix0 = ox * d->stride_w - d->pad_left, yp = (oy * d->out_w + ox) * ys - c0 * mult;
            int32_t k4[4];
            tt_tap_window(d, iy0, ix0, k4);
            for (ic = c0; ic < c1; ++ic) {
                for (m = 0; m < mult; ++m) {
                    const int32_t oc = ic * mult + m;
                    int32_t acc = 0;
                    float facc = 0.0f;
                    for (ky = k4[0]; ky < k4[1]; ++ky) {
                        for (kx = k4[2]; kx < k4[3]; ++kx) {
                            const int32_t xi = ((iy0 + ky * d->dilation_h) * d->in_w + ix0 + kx * d->dilation_w) *
                                               d->in_c + ic;
                            const int32_t wi = (ky * d->k_w + kx) * d->out_c + oc;
                            if (xq != 0) {
                                acc += ((int32_t)xq[xi] - zin) * (int32_t)wq[wi];
                            } else {
                                facc += xf[xi] * wf[wi];
                            }
                        }
                    }
                    if (xq != 0) {
                        yq[yp + oc] = (int8_t)tt_requant_one(q, acc + (bq != 0 ? bq[oc] : 0), oc);
                    } else {
                        yf[yp + oc] = tt_act_clamp(bf != 0 ? facc + bf[oc] : facc, act_min, act_max);
                    }
                }
            }
        }
    }
}

void tt_depthwise_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                            const int32_t *bias, int8_t *y)
{
    int32_t b, ic;
#if TT_HOST_AVX2 /* the host build's AVX2 kernel (same bytes), when the shape fits it */
    if (tt_dw_s8_avx2(d, q, x, w, bias, y)) {
        return;
    }
#endif
#if TT_SIMD
    if (tt_dw16_fits(d)) {
        const tt_geom g = tt_geom_of(d);
        if (tt_dw4_fits(&g, 0)) {
            tt_dw4_conv(d, q, x, w, bias, y);
        } else {
            tt_dw16_conv(d, q, x, w, bias, y, 0);
        }
        return;
    }
#endif
    if (d->depth_multiplier == 1) {
        /* channel by channel through the fast per-channel kernel (each output is computed alike, in any order) */
        for (b = 0; b < d->batches; ++b) {
            for (ic = 0; ic < d->in_c; ++ic) {
                tt_depthwise_channel_s8(d, q, x + b * d->in_h * d->in_w * d->in_c + ic, w + ic,
                                        bias != 0 ? bias[ic] : 0, ic, y + b * d->out_h * d->out_w * d->out_c + ic,
                                        d->out_c);
            }
        }
        return;
    }
    for (b = 0; b < d->batches; ++b) {
        tt_dw_generic(d, 0, d->in_c, x + b * d->in_h * d->in_w * d->in_c, w, bias, q,
                      y + b * d->out_h * d->out_w * d->out_c, 0, 0, 0, 0.0f, 0.0f, 0, d->out_c);
    }
}

void tt_depthwise_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *bias, float *y)
{
    int32_t b;
    for (b = 0; b < d->batches; ++b) {
        tt_dw_generic(d, 0, d->in_c, 0, 0, 0, 0, 0, x + b * d->in_h * d->in_w * d->in_c, w, bias, act_min, act_max,
                      y + b * d->out_h * d->out_w * d->out_c, d->out_c);
    }
}

/* ---- in-place depthwise (depth multiplier 1) ----------------------------------------------------------------
 * Output channel c reads only input channel c, and output element (pixel p, channel c) sits at p*C + c, an
 * element of channel c of the input too: so once channel c's outputs are all in scratch, copying them over the
 * buffer destroys no input another channel still needs, whatever the stride. */
void tt_depthwise_conv2d_s8_inplace(const tt_conv_dims *d, const tt_requant_s8 *q, int8_t *xy, const int8_t *w,
                                    const int32_t *bias, int8_t *scratch)
{
#if TT_HOST_AVX2 /* the host build's AVX2 kernel (same bytes), when the shape fits it */
    if (tt_dw_s8_avx2(d, q, xy, w, bias, xy)) {
        return;
    }
#endif
    int32_t b, c, p;
    const int32_t C = d->in_c, n_out = d->out_h * d->out_w;
#if TT_SIMD
    if (tt_dw16_fits(d)) {
        const tt_geom g = tt_geom_of(d);
        if (tt_dw4_fits(&g, 1)) {
            tt_dw4_conv(d, q, xy, w, bias, xy);
        } else {
            tt_dw16_conv(d, q, xy, w, bias, xy, scratch);
        }
        return;
    }
#endif
    for (b = 0; b < d->batches; ++b) {
        const int8_t *x = xy + b * d->in_h * d->in_w * C;
        int8_t *y = xy + b * n_out * C;
        for (c = 0; c < C; ++c) {
            tt_depthwise_channel_s8(d, q, x + c, w + c, bias != 0 ? bias[c] : 0, c, scratch, 1);
            for (p = 0; p < n_out; ++p) {
                y[p * C + c] = scratch[p];
            }
        }
    }
}

void tt_depthwise_conv2d_f32_inplace(const tt_conv_dims *d, float act_min, float act_max, float *xy,
                                     const float *w, const float *bias, float *scratch)
{
    int32_t b, c, p;
    const int32_t C = d->in_c, n_out = d->out_h * d->out_w;
    for (b = 0; b < d->batches; ++b) {
        const float *x = xy + b * d->in_h * d->in_w * C;
        float *y = xy + b * n_out * C;
        for (c = 0; c < C; ++c) {
            tt_dw_generic(d, c, c + 1, 0, 0, 0, 0, 0, x, w, bias, act_min, act_max, scratch, 1);
            for (p = 0; p < n_out; ++p) {
                y[p * C + c] = scratch[p];
            }
        }
    }
}

void tt_depthwise_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x,
                                         float *dw)
{
    tt_depthwise_conv2d_grad_weight_f32_taps(d, k, 0, d->k_h * d->k_w, dy, x, dw);
}

/* x[i] from the fp32 input or the saved fp16 one, widened where it is read: inlined with the other pointer null. */
TT_CONV_INLINE float tt_dw_gw_x(const float *xf, const uint16_t *xh, int32_t i)
{
    return xh != 0 ? tt_f16_read(xh[i]) : xf[i];
}

/* dy[i] from the fp32 output gradient or the fp16 one, widened where it is read: inlined with the other pointer
 * null. */
TT_CONV_INLINE float tt_dw_gw_dy(const float *dyf, const uint16_t *dyh, int32_t i)
{
    return dyh != 0 ? tt_f16_read(dyh[i]) : dyf[i];
}

/* Taps [t0, t1) (t = ky * k_w + kx, the rows of the [KH*KW, k*M] gradient): each tap row is its own sum. dy is
 * fp32 (dyf) or fp16 (dyh), x fp32 (xf) or fp16 (xh), the other of each null: the same sums in the same order
 * every way. */
TT_CONV_INLINE void tt_dw_gw_walk(const tt_conv_dims *d, int32_t k, int32_t t0, int32_t t1, const float *dyf,
                                  const uint16_t *dyh, const float *xf, const uint16_t *xh, float *dw)
{
    int32_t t, oc, i;
    const int32_t mult = d->depth_multiplier, n_out = k * mult, OC = d->out_c, xs = d->stride_w * d->in_c;
    for (t = t0; t < t1; ++t) {
        float *dwp = dw + (t - t0) * n_out;
        tt_tap_walk tw;
        for (oc = 0; oc < n_out; ++oc) {
            dwp[oc] = 0.0f;
        }
        tt_tap_walk_init(d, t / d->k_w, t % d->k_w, &tw);
        while (tt_tap_walk_next(&tw)) {
            const float *dyp = dyh != 0 ? 0 : dyf + tw.dy_px * OC;
            const uint16_t *dyhp = dyh != 0 ? dyh + tw.dy_px * OC : 0;
            const float *xp = xh != 0 ? 0 : xf + tw.x_px * d->in_c;
            const uint16_t *xhp = xh != 0 ? xh + tw.x_px * d->in_c : 0;
            for (i = 0; i < tw.n; ++i) {
                if (mult == 1) {
                    for (oc = 0; oc < n_out; ++oc) {
                        dwp[oc] += tt_dw_gw_dy(dyp, dyhp, oc) * tt_dw_gw_x(xp, xhp, oc);
                    }
                } else {
                    for (oc = 0; oc < n_out; ++oc) {
                        dwp[oc] += tt_dw_gw_dy(dyp, dyhp, oc) * tt_dw_gw_x(xp, xhp, oc / mult);
                    }
                }
                if (dyh != 0) {
                    dyhp += OC;
                } else {
                    dyp += OC;
                }
                if (xh != 0) {
                    xhp += xs;
                } else {
                    xp += xs;
                }
            }
        }
    }
}

void tt_depthwise_conv2d_grad_weight_f32_taps(const tt_conv_dims *d, int32_t k, int32_t t0, int32_t t1,
                                              const float *dy, const float *x, float *dw)
{
    tt_dw_gw_walk(d, k, t0, t1, dy, 0, x, 0, dw);
}

/* ---- input gradient ----------------------------------------------------------------------------------------
 * Every kernel below runs one (input channel, multiplier) pair at a time through the one-channel kernel: input
 * element (iy, ix) gets s = 0, += dy * w over its taps in (filter y, filter x) order, skipping the taps that reach
 * no output, and total = 0 + s (the depth multiplier's later pairs: total + s, in m order, as grad_ops folds the
 * multiplier). The taps are found per input row (the filter rows, ky order) and per input pixel (the filter
 * columns, kx order) instead of per tap, and stride 1 needs no division; a 3-wide undilated filter's columns whose
 * three taps all reach an output run unrolled with the weights in registers. int8 weights are dequantized once
 * per channel (tt_dq, the value the per-element dequantization gives) when the filter has at most TT_DW_MAX_TAPS
 * taps. */
#define TT_DW_ROWS 8 /* filter rows / columns listed; a larger filter takes the per-tap search */
#define TT_DW_MAX_TAPS (TT_DW_ROWS * TT_DW_ROWS)

TT_CONV_INLINE void tt_dw_gi_put(float *o, float s, int32_t add)
{
    *o = (add ? *o : 0.0f) + s;
}

/* The filter taps k (in order, k < K) through which input coordinate i reaches an output, and those outputs (as
 * tt_src_out, at most one division per call instead of two per tap): their count. */
TT_CONV_INLINE int32_t tt_dw_gi_list(int32_t i, int32_t pad, int32_t K, int32_t dil, int32_t stride, int32_t out,
                                     int32_t *ks, int32_t *os)
{
    const int32_t t = i + pad; /* = q * stride + r for tap k, t - k * dil >= 0 */
    int32_t k, n = 0, q, r;
    if (t < 0) {
        return 0;
    }
    if (stride == 1) {
        /* no division: every tap whose output lies in [0, out) */
        for (k = 0; k < K && t - k * dil >= 0; ++k) {
            if (t - k * dil < out) {
                ks[n] = k;
                os[n] = t - k * dil;
                ++n;
            }
        }
        return n;
    }
    q = stride == 2 ? t >> 1 : t / stride; /* t >= 0 */
    r = t - q * stride;
    for (k = 0; k < K && q >= 0; ++k) {
        if (r == 0 && q < out) {
            ks[n] = k;
            os[n] = q;
            ++n;
        }
        r -= dil;
        while (r < 0) {
            r += stride;
            --q;
        }
    }
    return n;
}

/* One input row of a stride-1, 3-wide undilated filter: nr filter rows (a constant once inlined; rows 1 and 2 read
 * row 0 when absent and their code is dropped), dy rows rdy, taps rw[r][0], [ws], [2 * ws] in registers. The
 * columns whose three taps all reach an output [lo, hi) run unrolled; the others test each tap. */
#define TT_DW_GI_TAP(row, k, w)                                                                                     \
    do {                                                                                                          \
        if (ox0 - (k) >= 0 && ox0 - (k) < OW) {                                                                   \
            s += (row)[(ox0 - (k)) * C] * (w);                                                                    \
        }                                                                                                         \
    } while (0)
TT_CONV_INLINE void tt_dw_gi_row3(const float *const *rdy, const float *const *rw, int32_t ws, const int32_t nr,
                                  int32_t C, int32_t OW, int32_t pl, int32_t W, float *o, int32_t os, int32_t add)
{
    const float *r0 = rdy[0], *r1 = rdy[nr > 1 ? 1 : 0], *r2 = rdy[nr > 2 ? 2 : 0];
    const float *w0 = rw[0], *w1 = rw[nr > 1 ? 1 : 0], *w2 = rw[nr > 2 ? 2 : 0];
    const float a0 = w0[0], a1 = w0[ws], a2 = w0[2 * ws], b0 = w1[0], b1 = w1[ws], b2 = w1[2 * ws];
    const float c0 = w2[0], c1 = w2[ws], c2 = w2[2 * ws];
    int32_t ix, lo = 2 - pl > 0 ? 2 - pl : 0, hi = OW - pl < W ? OW - pl : W;
    lo = lo < W ? lo : W;
    hi = hi > lo ? hi : lo;
    for (ix = 0; ix < W; ++ix) {
        const int32_t ox0 = ix + pl;
        float s = 0.0f;
        if (ix == lo && hi > lo) {
            const float *p0 = r0 + ox0 * C, *p1 = r1 + ox0 * C, *p2 = r2 + ox0 * C;
            for (; ix < hi; ++ix, p0 += C, p1 += C, p2 += C) {
                float t = 0.0f;
                t += p0[0] * a0;
                t += p0[-C] * a1;
                t += p0[-2 * C] * a2;
                if (nr > 1) {
                    t += p1[0] * b0;
                    t += p1[-C] * b1;
                    t += p1[-2 * C] * b2;
                }
                if (nr > 2) {
                    t += p2[0] * c0;
                    t += p2[-C] * c1;
                    t += p2[-2 * C] * c2;
                }
                tt_dw_gi_put(o + ix * os, t, add);
            }
            --ix;
            continue;
        }
        TT_DW_GI_TAP(r0, 0, a0);
        TT_DW_GI_TAP(r0, 1, a1);
        TT_DW_GI_TAP(r0, 2, a2);
        if (nr > 1) {
            TT_DW_GI_TAP(r1, 0, b0);
            TT_DW_GI_TAP(r1, 1, b1);
            TT_DW_GI_TAP(r1, 2, b2);
        }
        if (nr > 2) {
            TT_DW_GI_TAP(r2, 0, c0);
            TT_DW_GI_TAP(r2, 1, c1);
            TT_DW_GI_TAP(r2, 2, c2);
        }
        tt_dw_gi_put(o + ix * os, s, add);
    }
}
#undef TT_DW_GI_TAP

/* ---- 3x3 undilated planes with paths of their own -------------------------------------------------------------
 * The sums of the general walk below, term for term, with the taps in registers and no search per pixel. A pixel's
 * sum starts at 0 and adds each term; with `add` 0 it starts at the first term instead: 0 + p differs from p only
 * when p is -0, and then only until a later term that is not -0 is added (the sum is then the same), and the store
 * 0 + s maps a final -0 to +0 either way. With `add` the store is out + s, which tells -0 from +0: the sum keeps
 * its 0 start there. */
#define TT_DW_S3_FIRST(x) (add ? 0.0f + (x) : (x))

/* SAME 3x3 stride 1 (pad 1, output the input's size): input pixel (iy, ix) reads output rows iy + 1, iy, iy - 1
 * (filter rows 0, 1, 2) and in each the columns ix + 1, ix, ix - 1 (filter columns 0, 1, 2), those inside the
 * plane, in that order. One input row: a, b, c the three output rows (a absent on the last input row, c on the
 * first: hasA / hasC, constants once inlined), w the nine taps. The row's first and last pixels drop their missing
 * column; the interior keeps each output row's last three columns in registers (one load per output row and
 * pixel), three pixels per pass so that the registers rotate by renaming. W >= 2. */
#define TT_DW_S3_TERMS(has, p, z, m, w0, w1, w2)                                                                    \
    if (has) {                                                                                                    \
        t += (p) * (w0);                                                                                          \
        t += (z) * (w1);                                                                                          \
        t += (m) * (w2);                                                                                          \
    }
#define TT_DW_S3_PIX(ix, am, az, ap, bm, bz, bp, cm, cz, cp)                                                        \
    do {                                                                                                          \
        float t = TT_DW_S3_FIRST(hasA ? (ap) * wa0 : (bp) * wb0);                                                 \
        if (hasA) {                                                                                               \
            t += (az) * wa1;                                                                                      \
            t += (am) * wa2;                                                                                      \
            t += (bp) * wb0;                                                                                      \
        }                                                                                                         \
        t += (bz) * wb1;                                                                                          \
        t += (bm) * wb2;                                                                                          \
        TT_DW_S3_TERMS(hasC, cp, cz, cm, wc0, wc1, wc2)                                                           \
        tt_dw_gi_put(o + (ix) * os, t, add);                                                                      \
    } while (0)
/* the row's last pixel: columns ix (z) and ix - 1 (m) */
#define TT_DW_S3_LAST(ix, am, az, bm, bz, cm, cz)                                                                   \
    do {                                                                                                          \
        float t = TT_DW_S3_FIRST(hasA ? (az) * wa1 : (bz) * wb1);                                                 \
        if (hasA) {                                                                                               \
            t += (am) * wa2;                                                                                      \
            t += (bz) * wb1;                                                                                      \
        }                                                                                                         \
        t += (bm) * wb2;                                                                                          \
        if (hasC) {                                                                                               \
            t += (cz) * wc1;                                                                                      \
            t += (cm) * wc2;                                                                                      \
        }                                                                                                         \
        tt_dw_gi_put(o + (ix) * os, t, add);                                                                      \
    } while (0)
#define TT_DW_S3_LOAD(ix, av, bv, cv)                                                                               \
    do {                                                                                                          \
        av = hasA ? a[(ix) * C] : 0.0f;                                                                           \
        bv = b[(ix) * C];                                                                                         \
        cv = hasC ? c[(ix) * C] : 0.0f;                                                                           \
    } while (0)
TT_CONV_INLINE void tt_dw_gi_same3_row(const float *a, const float *b, const float *c, const float *w, int32_t C,
                                       int32_t W, float *o, int32_t os, const int32_t add, const int32_t hasA,
                                       const int32_t hasC)
{
    const float wa0 = w[0], wa1 = w[1], wa2 = w[2], wb0 = w[3], wb1 = w[4], wb2 = w[5];
    const float wc0 = w[6], wc1 = w[7], wc2 = w[8];
    float am, az, ap, bm, bz, bp, cm, cz, cp;
    int32_t ix;
    TT_DW_S3_LOAD(0, am, bm, cm);
    TT_DW_S3_LOAD(1, az, bz, cz);
    {
        /* pixel 0: columns 1 (z) and 0 (m), no column -1 */
        float t = TT_DW_S3_FIRST(hasA ? az * wa0 : bz * wb0);
        if (hasA) {
            t += am * wa1;
            t += bz * wb0;
        }
        t += bm * wb1;
        if (hasC) {
            t += cz * wc0;
            t += cm * wc1;
        }
        tt_dw_gi_put(o, t, add);
    }
    /* from here (m, z) = columns (ix - 1, ix) */
    for (ix = 1; ix + 3 < W; ix += 3) {
        TT_DW_S3_LOAD(ix + 1, ap, bp, cp);
        TT_DW_S3_PIX(ix, am, az, ap, bm, bz, bp, cm, cz, cp);
        TT_DW_S3_LOAD(ix + 2, am, bm, cm);
        TT_DW_S3_PIX(ix + 1, az, ap, am, bz, bp, bm, cz, cp, cm);
        TT_DW_S3_LOAD(ix + 3, az, bz, cz);
        TT_DW_S3_PIX(ix + 2, ap, am, az, bp, bm, bz, cp, cm, cz);
    }
    if (ix == W - 1) {
        TT_DW_S3_LAST(ix, am, az, bm, bz, cm, cz);
    } else if (ix == W - 2) {
        TT_DW_S3_LOAD(ix + 1, ap, bp, cp);
        TT_DW_S3_PIX(ix, am, az, ap, bm, bz, bp, cm, cz, cp);
        TT_DW_S3_LAST(ix + 1, az, ap, bz, bp, cz, cp);
    } else {
        TT_DW_S3_LOAD(ix + 1, ap, bp, cp);
        TT_DW_S3_PIX(ix, am, az, ap, bm, bz, bp, cm, cz, cp);
        TT_DW_S3_LOAD(ix + 2, am, bm, cm);
        TT_DW_S3_PIX(ix + 1, az, ap, am, bz, bp, bm, cz, cp, cm);
        TT_DW_S3_LAST(ix + 2, ap, am, bp, bm, cp, cm);
    }
}
#undef TT_DW_S3_TERMS
#undef TT_DW_S3_PIX
#undef TT_DW_S3_LAST
#undef TT_DW_S3_LOAD

/* The SAME stride-1 plane (H, W >= 2), rows by the output rows they reach. */
TT_CONV_INLINE void tt_dw_gi_same3(const float *dyc, const float *w, int32_t C, int32_t H, int32_t W, float *out,
                                   int32_t os, const int32_t add)
{
    const int32_t rs = W * C;
    int32_t iy;
    tt_dw_gi_same3_row(dyc + rs, dyc, 0, w, C, W, out, os, add, 1, 0);
    for (iy = 1; iy < H - 1; ++iy) {
        tt_dw_gi_same3_row(dyc + (iy + 1) * rs, dyc + iy * rs, dyc + (iy - 1) * rs, w, C, W, out + iy * W * os, os,
                           add, 1, 1);
    }
    tt_dw_gi_same3_row(0, dyc + (H - 1) * rs, dyc + (H - 2) * rs, w, C, W, out + (H - 1) * W * os, os, add, 0, 1);
}

/* Stride 2, one input row: output rows ra (taps wa[0..2]) and, when two (a constant once inlined), rb (taps
 * wb[0..2]), in filter-row order. Input column ix at t = ix + pl reads, when t is even, output columns t / 2
 * (tap 0) and t / 2 - 1 (tap 2), when odd (t - 1) / 2 (tap 1), each where it lies in [0, OW): the list
 * tt_dw_gi_list gives, in its order, without a division per pixel. */
TT_CONV_INLINE void tt_dw_gi_s2_row(const float *ra, const float *wa, const float *rb, const float *wb,
                                    const int32_t two, int32_t C, int32_t OW, int32_t pl, int32_t W, float *o,
                                    int32_t os, const int32_t add)
{
    const float a0 = wa[0], a1 = wa[1], a2 = wa[2];
    const float b0 = two ? wb[0] : 0.0f, b1 = two ? wb[1] : 0.0f, b2 = two ? wb[2] : 0.0f;
    int32_t ix;
    for (ix = 0; ix < W; ++ix) {
        const int32_t t = ix + pl, j = t >> 1;
        float s = 0.0f;
        if (t & 1) {
            if (j < OW) {
                s += ra[j * C] * a1;
                if (two) {
                    s += rb[j * C] * b1;
                }
            }
        } else {
            const int32_t k0 = j < OW, k2 = j >= 1 && j <= OW;
            if (k0) {
                s += ra[j * C] * a0;
            }
            if (k2) {
                s += ra[(j - 1) * C] * a2;
            }
            if (two) {
                if (k0) {
                    s += rb[j * C] * b0;
                }
                if (k2) {
                    s += rb[(j - 1) * C] * b2;
                }
            }
        }
        tt_dw_gi_put(o + ix * os, s, add);
    }
}

/* A stride-2 plane, any padding: input row iy at t = iy + pad_top reads output rows t / 2 (filter row 0) and
 * t / 2 - 1 (row 2) when t is even, (t - 1) / 2 (row 1) when odd, those in [0, OH). */
TT_CONV_INLINE void tt_dw_gi_s2(const tt_conv_dims *d, const float *dyc, const float *w, float *out, int32_t os,
                                const int32_t add)
{
    const int32_t C = d->out_c, OH = d->out_h, OW = d->out_w, W = d->in_w, pl = d->pad_left, rs = OW * C;
    int32_t iy, ix;
    for (iy = 0; iy < d->in_h; ++iy) {
        const int32_t t = iy + d->pad_top, j = t >> 1;
        const int32_t k0 = !(t & 1) && j < OH, k2 = !(t & 1) && j >= 1 && j <= OH, k1 = (t & 1) && j < OH;
        float *o = out + iy * W * os;
        if (k0 && k2) {
            tt_dw_gi_s2_row(dyc + j * rs, w, dyc + (j - 1) * rs, w + 6, 1, C, OW, pl, W, o, os, add);
        } else if (k0 || k1 || k2) {
            tt_dw_gi_s2_row(dyc + (k2 ? j - 1 : j) * rs, w + (k0 ? 0 : k1 ? 3 : 6), 0, 0, 0, C, OW, pl, W, o, os,
                            add);
        } else {
            for (ix = 0; ix < W; ++ix) {
                tt_dw_gi_put(o + ix * os, 0.0f, add);
            }
        }
    }
}

/* One function per (plane kind, add): `add` a constant in each. */
TT_CONV_NOINLINE void tt_dw_gi_same3_set(const float *dyc, const float *w, int32_t C, int32_t H, int32_t W,
                                         float *out, int32_t os)
{
    tt_dw_gi_same3(dyc, w, C, H, W, out, os, 0);
}
TT_CONV_NOINLINE void tt_dw_gi_same3_add(const float *dyc, const float *w, int32_t C, int32_t H, int32_t W,
                                         float *out, int32_t os)
{
    tt_dw_gi_same3(dyc, w, C, H, W, out, os, 1);
}
TT_CONV_NOINLINE void tt_dw_gi_s2_set(const tt_conv_dims *d, const float *dyc, const float *w, float *out, int32_t os)
{
    tt_dw_gi_s2(d, dyc, w, out, os, 0);
}
TT_CONV_NOINLINE void tt_dw_gi_s2_add(const tt_conv_dims *d, const float *dyc, const float *w, float *out, int32_t os)
{
    tt_dw_gi_s2(d, dyc, w, out, os, 1);
}
#undef TT_DW_S3_FIRST

/* The 3x3 undilated planes with a path of their own (SAME stride 1, any stride 2): their nine taps gathered
 * (int8: dequantized, tt_dq's value) and the plane run for `add` as a constant. 0: not such a plane. */
TT_CONV_INLINE int32_t tt_dw_gi_fast3(const tt_conv_dims *d, const float *dyc, const float *wc, int32_t w_stride,
                                      const int8_t *wq, int32_t z, float sc, float *out, int32_t os, int32_t add)
{
    const int32_t S = d->stride_w, W = d->in_w, H = d->in_h;
    const int32_t same1 = S == 1 && d->pad_top == 1 && d->pad_left == 1 && d->out_h == H && d->out_w == W && W >= 2 &&
                          H >= 2;
    float w9[9];
    const float *w = w9;
    int32_t j;
    if (d->k_h != 3 || d->k_w != 3 || d->dilation_h != 1 || d->dilation_w != 1 || d->stride_h != S ||
        !(same1 || S == 2)) {
        return 0;
    }
    if (wc != 0 && w_stride == 1) {
        w = wc; /* already nine floats in a row (the hidden streams' taps) */
    } else if (wc != 0) {
        for (j = 0; j < 9; ++j) {
            w9[j] = wc[j * w_stride];
        }
    } else {
        for (j = 0; j < 9; ++j) {
            w9[j] = tt_dq(wq[j * d->out_c], z, sc);
        }
    }
    if (same1) {
        (add ? tt_dw_gi_same3_add : tt_dw_gi_same3_set)(dyc, w, d->out_c, H, W, out, os);
    } else {
        (add ? tt_dw_gi_s2_add : tt_dw_gi_s2_set)(d, dyc, w, out, os);
    }
    return 1;
}

/* Every other filter: the taps per input row and pixel, as the header of this section says. */
TT_CONV_NOINLINE void tt_dw_gi_channel(const tt_conv_dims *d, const float *dyc, const float *wc, int32_t w_stride,
                                       const int8_t *wq, int32_t z, float sc, float *out, int32_t os, int32_t add)
{
    int32_t iy, ix, ky, kx, r, j, nr, nc;
    const int32_t C = d->out_c, OW = d->out_w, KW = d->k_w, S = d->stride_w, dil = d->dilation_w;
    const int32_t pl = d->pad_left, W = d->in_w, taps = d->k_h * KW, k3 = S == 1 && KW == 3 && dil == 1;
    const float *rdy[TT_DW_ROWS], *rw[TT_DW_ROWS];
    int32_t rk[TT_DW_ROWS], ro[TT_DW_ROWS], ck[TT_DW_ROWS], co[TT_DW_ROWS];
    float wl[TT_DW_MAX_TAPS];
    if (d->k_h > TT_DW_ROWS || KW > TT_DW_ROWS) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < W; ++ix) {
                float s = 0.0f;
                for (ky = 0; ky < d->k_h; ++ky) {
                    const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                    for (kx = 0; kx < KW && oy >= 0; ++kx) {
                        const int32_t ox = tt_src_out(ix, pl, kx, dil, S, OW), tap = ky * KW + kx;
                        if (ox >= 0) {
                            s += dyc[(oy * OW + ox) * C] * (wc != 0 ? wc[tap * w_stride] : tt_dq(wq[tap * C], z, sc));
                        }
                    }
                }
                tt_dw_gi_put(out + (iy * W + ix) * os, s, add);
            }
        }
        return;
    }
    if (wc == 0) {
        /* the taps dequantized once (the same float values tt_dq gives per element) */
        for (j = 0; j < taps; ++j) {
            wl[j] = tt_dq(wq[j * C], z, sc);
        }
        wc = wl;
        w_stride = 1;
    }
    for (iy = 0; iy < d->in_h; ++iy) {
        nr = tt_dw_gi_list(iy, d->pad_top, d->k_h, d->dilation_h, d->stride_h, d->out_h, rk, ro);
        for (r = 0; r < nr; ++r) {
            rdy[r] = dyc + ro[r] * OW * C;
            rw[r] = wc + rk[r] * KW * w_stride;
        }
        if (k3 && nr > 0 && nr <= 3) {
            float *o = out + iy * W * os;
            if (nr == 3) {
                tt_dw_gi_row3(rdy, rw, w_stride, 3, C, OW, pl, W, o, os, add);
            } else if (nr == 2) {
                tt_dw_gi_row3(rdy, rw, w_stride, 2, C, OW, pl, W, o, os, add);
            } else {
                tt_dw_gi_row3(rdy, rw, w_stride, 1, C, OW, pl, W, o, os, add);
            }
            continue;
        }
        for (ix = 0; ix < W; ++ix) {
            float s = 0.0f;
            if (S == 1) {
                /* the filter columns [kx0, kx1) reach output columns ox0 - kx * dil in [0, OW) */
                const int32_t ox0 = ix + pl;
                int32_t kx0 = 0, kx1 = KW;
                while (kx1 > 0 && ox0 - (kx1 - 1) * dil < 0) {
                    --kx1;
                }
                while (kx0 < kx1 && ox0 - kx0 * dil >= OW) {
                    ++kx0;
                }
                for (r = 0; r < nr; ++r) {
                    const float *rp = rdy[r] + ox0 * C, *wp = rw[r];
                    for (kx = kx0; kx < kx1; ++kx) {
                        s += rp[-kx * dil * C] * wp[kx * w_stride];
                    }
                }
            } else {
                nc = tt_dw_gi_list(ix, pl, KW, dil, S, OW, ck, co);
                for (r = 0; r < nr; ++r) {
                    for (j = 0; j < nc; ++j) {
                        s += rdy[r][co[j] * C] * rw[r][ck[j] * w_stride];
                    }
                }
            }
            tt_dw_gi_put(out + (iy * W + ix) * os, s, add);
        }
    }
}

void tt_depthwise_conv2d_grad_input_channel_f32(const tt_conv_dims *d, const float *dyc, const float *wc,
                                                 int32_t w_stride, const int8_t *wq, int32_t z, float sc, float *out,
                                                 int32_t os, int32_t add)
{
    if (!tt_dw_gi_fast3(d, dyc, wc, w_stride, wq, z, sc, out, os, add)) {
        tt_dw_gi_channel(d, dyc, wc, w_stride, wq, z, sc, out, os, add);
    }
}

/* Every (input channel, multiplier) pair of one batch: dyb / dxb the batch's gradients (dx pixel stride os, channel
 * 0 at dxb), w float or (0) int8 wq with its per-channel dequantization. */
static void tt_dw_gi_batch(const tt_conv_dims *d, const float *dyb, const float *w, const int8_t *wq,
                           const float *scale, const int32_t *zero_point, int32_t c0, int32_t c1, float *dxb,
                           int32_t os)
{
    int32_t ic, m;
    const int32_t M = d->depth_multiplier, OC = d->out_c;
    for (ic = c0; ic < c1; ++ic) {
        for (m = 0; m < M; ++m) {
            const int32_t oc = ic * M + m;
            if (w != 0) {
                tt_depthwise_conv2d_grad_input_channel_f32(d, dyb + oc, w + oc, OC, 0, 0, 0.0f, dxb + (ic - c0), os,
                                                            m > 0);
            } else {
                tt_depthwise_conv2d_grad_input_channel_f32(d, dyb + oc, 0, 0, wq + oc, zero_point[oc], scale[oc],
                                                            dxb + (ic - c0), os, m > 0);
            }
        }
    }
}

void tt_depthwise_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx)
{
    int32_t b;
    for (b = 0; b < d->batches; ++b) {
        tt_dw_gi_batch(d, dy + b * d->out_h * d->out_w * d->out_c, w, 0, 0, 0, 0, d->in_c,
                       dx + b * d->in_h * d->in_w * d->in_c, d->in_c);
    }
}

void tt_depthwise_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w,
                                           const float *scale, const int32_t *zero_point, float *dx)
{
    int32_t b;
    for (b = 0; b < d->batches; ++b) {
        tt_dw_gi_batch(d, dy + b * d->out_h * d->out_w * d->out_c, 0, w, scale, zero_point, 0, d->in_c,
                       dx + b * d->in_h * d->in_w * d->in_c, d->in_c);
    }
}

/* ---- in-place input gradient (depth multiplier 1; memplan: dx written over dz) ------------------------------
 * Input-gradient channel c reads only output-gradient channel c, and both keep channel c at the offsets
 * (pixel * C + c) of the shared buffer: channel c of a batch is computed into scratch (in_h*in_w floats), then
 * copied over it, as tt_depthwise_conv2d_f32_inplace does. With several batches, batch b of dx covers
 * [b*n_in*C, (b+1)*n_in*C) and batch b of dz [b*n_out*C, (b+1)*n_out*C): when n_in <= n_out the batches go
 * first to last (dx of batch b never reaches dz of a later batch), otherwise last to first. The sums are the
 * out-of-place kernels'. */
static void tt_dw_grad_input_inplace(const tt_conv_dims *d, float *dydx, const float *w, const int8_t *wq,
                                     const float *scale, const int32_t *zero_point, float *scratch)
{
    int32_t i, c, p;
    const int32_t C = d->in_c, n_in = d->in_h * d->in_w, n_out = d->out_h * d->out_w;
    const int32_t backwards = n_in > n_out;
    for (i = 0; i < d->batches; ++i) {
        const int32_t b = backwards ? d->batches - 1 - i : i;
        float *dxb = dydx + b * n_in * C;
        for (c = 0; c < C; ++c) {
            tt_dw_gi_batch(d, dydx + b * n_out * C, w, wq, scale, zero_point, c, c + 1, scratch, 1);
            for (p = 0; p < n_in; ++p) {
                dxb[p * C + c] = scratch[p];
            }
        }
    }
}

void tt_depthwise_conv2d_grad_input_f32_inplace(const tt_conv_dims *d, float *dydx, const float *w, float *scratch)
{
    tt_dw_grad_input_inplace(d, dydx, w, 0, 0, 0, scratch);
}

void tt_depthwise_conv2d_grad_input_qw_f32_inplace(const tt_conv_dims *d, float *dydx, const int8_t *w,
                                                   const float *scale, const int32_t *zero_point, float *scratch)
{
    tt_dw_grad_input_inplace(d, dydx, 0, w, scale, zero_point, scratch);
}

/* tt_depthwise_conv2d_grad_weight_f32 with x read as fp16 (fp16-mixed's saved input), widened per element: the
 * same sums in the same order. */
void tt_depthwise_conv2d_grad_weight_hx_f32(const tt_conv_dims *d, int32_t k, const float *dy, const uint16_t *x,
                                            float *dw)
{
    tt_dw_gw_walk(d, k, 0, d->k_h * d->k_w, dy, 0, 0, x, dw);
}

/* The output gradient read as fp16 (written so by its kernel: fp16_mixed.fp16_written), x either (the f32 / f16
 * pair, the other 0). */
void tt_depthwise_conv2d_grad_weight_hdy_f32(const tt_conv_dims *d, int32_t k, const uint16_t *dy, const float *xf,
                                             const uint16_t *xh, float *dw)
{
    if (xh != 0) {
        tt_dw_gw_walk(d, k, 0, d->k_h * d->k_w, 0, dy, 0, xh, dw);
    } else {
        tt_dw_gw_walk(d, k, 0, d->k_h * d->k_w, 0, dy, xf, 0, dw);
    }
}

/* ---- fp16-mixed: fp16 in, fp16 out (issue 13) ----------------------------------------------------------------
 * Each element's float32 operations are those of the fp32 kernels above (tt_dw_generic's forward sum; the input
 * gradient's s = 0, += dy * w over the taps that reach an output in (filter y, filter x) order, total = 0 + s, then
 * + s of each later multiplier in m order), the fp16 operands widened where they are read and each result rounded
 * once as it is stored. Written per element with tt_tap_window / tt_src_out (the walk the fp32 kernels speed up):
 * which elements share a pass changes no bits. */

/* One output pixel's outputs of input channels [c0, c1) of one batch: out[(pixel) * ys + oc - c0 * M]. The taps
 * are walked by pointer steps from the window's first in-image tap (no index arithmetic per tap). */
TT_CONV_INLINE void tt_dw_hx_hy_px(const tt_conv_dims *d, int32_t oy, int32_t ox, int32_t c0, int32_t c1,
                                   float act_min, float act_max, const uint16_t *x, const float *w, const float *bias,
                                   uint16_t *y, int32_t ys)
{
    int32_t ic, m, ky, kx;
    const int32_t mult = d->depth_multiplier, C = d->in_c, OC = d->out_c;
    const int32_t xcol = d->dilation_w * C, xrow = d->dilation_h * d->in_w * C, wrow = d->k_w * OC;
    const int32_t iy0 = oy * d->stride_h - d->pad_top, ix0 = ox * d->stride_w - d->pad_left;
    const int32_t yp = (oy * d->out_w + ox) * ys - c0 * mult;
    int32_t k4[4];
    const uint16_t *x0;
    const float *w0;
    tt_tap_window(d, iy0, ix0, k4);
    if (k4[0] >= k4[1] || k4[2] >= k4[3]) {
        k4[1] = k4[0];                                     /* no in-image tap: the sum is +0, no pointer formed */
        x0 = x;
        w0 = w;
    } else {
        x0 = x + ((iy0 + k4[0] * d->dilation_h) * d->in_w + ix0 + k4[2] * d->dilation_w) * C;
        w0 = w + (k4[0] * d->k_w + k4[2]) * OC;
    }
    for (ic = c0; ic < c1; ++ic) {
        for (m = 0; m < mult; ++m) {
            const int32_t oc = ic * mult + m;
            const uint16_t *xr = x0 + ic;
            const float *wr = w0 + oc;
            float facc = 0.0f;
            for (ky = k4[0]; ky < k4[1]; ++ky, xr += xrow, wr += wrow) {
                const uint16_t *xp = xr;
                const float *wp = wr;
                for (kx = k4[2]; kx < k4[3]; ++kx, xp += xcol, wp += OC) {
                    facc += tt_f16_read(*xp) * *wp;
                }
            }
            y[yp + oc] = tt_f16_narrow(tt_act_clamp(bias != 0 ? facc + bias[oc] : facc, act_min, act_max));
        }
    }
}

/* 3x3, dilation 1, multiplier 1: channel ic's outputs, the nine weights in registers, and along an output row whose
 * window is inside the image the widened 3x3 inputs slide: a stride-1 step widens one new column (3 inputs), a
 * stride-2 step two, instead of nine per output. The sum is the generic one's (taps in (ky, kx) order from +0);
 * pixels whose window leaves the image take tt_dw_hx_hy_px. */
static void tt_dw_hx_hy_3x3(const tt_conv_dims *d, int32_t ic, int32_t c0, float act_min, float act_max,
                            const uint16_t *x, const float *w, const float *bias, uint16_t *y, int32_t ys)
{
    const int32_t C = d->in_c, OC = d->out_c, W = d->in_w, S = d->stride_w;
    const float w00 = w[0 * OC + ic], w01 = w[1 * OC + ic], w02 = w[2 * OC + ic];
    const float w10 = w[3 * OC + ic], w11 = w[4 * OC + ic], w12 = w[5 * OC + ic];
    const float w20 = w[6 * OC + ic], w21 = w[7 * OC + ic], w22 = w[8 * OC + ic];
    const float b = bias != 0 ? bias[ic] : 0.0f;
    int32_t oy, ox;
    for (oy = 0; oy < d->out_h; ++oy) {
        const int32_t iy0 = oy * d->stride_h - d->pad_top;
        int32_t prev = -2;                                 /* the output column the window below holds, or -2 */
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, e0 = 0.0f, e1 = 0.0f, e2 = 0.0f;
        for (ox = 0; ox < d->out_w; ++ox) {
            const int32_t ix0 = ox * S - d->pad_left;
            float facc;
            if (iy0 < 0 || iy0 + 2 >= d->in_h || ix0 < 0 || ix0 + 2 >= W) {
                tt_dw_hx_hy_px(d, oy, ox, ic, ic + 1, act_min, act_max, x, w, bias, y + (ic - c0), ys);
                prev = -2;
                continue;
            }
            {
                /* columns a, b, e of the window: input columns ix0, ix0 + 1, ix0 + 2 of rows iy0 .. iy0 + 2 */
                const uint16_t *xp = x + (iy0 * W + ix0) * C + ic;
                const int32_t rs = W * C;
                if (prev == ox - 1 && S == 1) {
                    a0 = b0; a1 = b1; a2 = b2;
                    b0 = e0; b1 = e1; b2 = e2;
                } else if (prev == ox - 1 && S == 2) {
                    a0 = e0; a1 = e1; a2 = e2;
                    b0 = tt_f16_read(xp[C]);
                    b1 = tt_f16_read(xp[rs + C]);
                    b2 = tt_f16_read(xp[2 * rs + C]);
                } else {
                    a0 = tt_f16_read(xp[0]);
                    a1 = tt_f16_read(xp[rs]);
                    a2 = tt_f16_read(xp[2 * rs]);
                    b0 = tt_f16_read(xp[C]);
                    b1 = tt_f16_read(xp[rs + C]);
                    b2 = tt_f16_read(xp[2 * rs + C]);
                }
                e0 = tt_f16_read(xp[2 * C]);
                e1 = tt_f16_read(xp[rs + 2 * C]);
                e2 = tt_f16_read(xp[2 * rs + 2 * C]);
            }
            prev = ox;
            facc = 0.0f;
            facc += a0 * w00;
            facc += b0 * w01;
            facc += e0 * w02;
            facc += a1 * w10;
            facc += b1 * w11;
            facc += e1 * w12;
            facc += a2 * w20;
            facc += b2 * w21;
            facc += e2 * w22;
            y[(oy * d->out_w + ox) * ys + ic - c0] =
                tt_f16_narrow(tt_act_clamp(bias != 0 ? facc + b : facc, act_min, act_max));
        }
    }
}

/* Outputs of input channels [c0, c1) of one batch: out[(pixel) * ys + oc - c0 * M]. */
static void tt_dw_hx_hy_batch(const tt_conv_dims *d, int32_t c0, int32_t c1, float act_min, float act_max,
                              const uint16_t *x, const float *w, const float *bias, uint16_t *y, int32_t ys)
{
    int32_t oy, ox, ic;
    if (d->k_h == 3 && d->k_w == 3 && d->dilation_h == 1 && d->dilation_w == 1 && d->depth_multiplier == 1 &&
        (d->stride_w == 1 || d->stride_w == 2)) {
        for (ic = c0; ic < c1; ++ic) {
            tt_dw_hx_hy_3x3(d, ic, c0, act_min, act_max, x, w, bias, y, ys);
        }
        return;
    }
    for (oy = 0; oy < d->out_h; ++oy) {
        for (ox = 0; ox < d->out_w; ++ox) {
            tt_dw_hx_hy_px(d, oy, ox, c0, c1, act_min, act_max, x, w, bias, y, ys);
        }
    }
}

/* vec: tt_fvec_dw_ok's answer for these operands (0 where there are no Helium kernels) */
static void tt_dw_hx_hy(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x, const float *w,
                        const float *bias, int32_t vec, uint16_t *y)
{
    int32_t b;
    (void)vec;
#if defined(TT_FVEC_DW_H)
    if (vec) {
        int32_t c;
        const int32_t C = d->in_c;
        for (b = 0; b < d->batches; ++b) {
            for (c = 0; c < C; ++c) {
                tt_fvec_dw_hx_hy_channel(d, x + b * d->in_h * d->in_w * C + c, w + c, bias != 0 ? bias + c : 0,
                                         act_min, act_max, y + b * d->out_h * d->out_w * C + c, C);
            }
        }
        return;
    }
#endif
    for (b = 0; b < d->batches; ++b) {
        tt_dw_hx_hy_batch(d, 0, d->in_c, act_min, act_max, x + b * d->in_h * d->in_w * d->in_c, w, bias,
                          y + b * d->out_h * d->out_w * d->out_c, d->out_c);
    }
}

void tt_depthwise_conv2d_hx_hy(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                               const float *w, const float *bias, uint16_t *y)
{
    tt_dw_hx_hy(d, act_min, act_max, x, w, bias, TT_DW_FVEC(d, w, bias, act_min, act_max), y);
}

void tt_depthwise_conv2d_hx_hy_rep(const tt_conv_dims *d, float act_min, float act_max, const uint16_t *x,
                                   const float *w, const float *bias, int32_t *w_ok, uint16_t *y)
{
    if (*w_ok < 0) {
        *w_ok = TT_DW_FVEC(d, w, bias, act_min, act_max);
    }
    tt_dw_hx_hy(d, act_min, act_max, x, w, bias, *w_ok, y);
}

void tt_depthwise_conv2d_hx_hy_inplace(const tt_conv_dims *d, float act_min, float act_max, uint16_t *xy,
                                       const float *w, const float *bias, uint16_t *scratch)
{
    int32_t b, c, p;
    const int32_t C = d->in_c, n_out = d->out_h * d->out_w;
    const int32_t vec = TT_DW_FVEC(d, w, bias, act_min, act_max);
    (void)vec;
    for (b = 0; b < d->batches; ++b) {
        const uint16_t *x = xy + b * d->in_h * d->in_w * C;
        uint16_t *y = xy + b * n_out * C;
        for (c = 0; c < C; ++c) {
#if defined(TT_FVEC_DW_H)
            if (vec) {
                tt_fvec_dw_hx_hy_channel(d, x + c, w + c, bias != 0 ? bias + c : 0, act_min, act_max, scratch, 1);
                tt_fvec_dw_put(scratch, n_out, y + c, C);
                continue;
            }
#endif
            tt_dw_hx_hy_batch(d, c, c + 1, act_min, act_max, x, w, bias, scratch, 1);
            for (p = 0; p < n_out; ++p) {
                y[p * C + c] = scratch[p];
            }
        }
    }
}

/* Input channel ic of one batch: dx element (iy, ix) to out[(iy * in_w + ix) * os]. The rows and columns of taps
 * that reach an output are listed once per input row / pixel (tt_dw_gi_list, as tt_dw_gi_channel does; in tap order),
 * not searched per tap and multiplier; a filter wider than TT_DW_ROWS takes the per-tap search. */
static void tt_dw_gi_hdy_hdx_channel(const tt_conv_dims *d, const uint16_t *dy, const float *w, int32_t ic,
                                     uint16_t *out, int32_t os)
{
    int32_t iy, ix, m, ky, kx, r, j, nr, nc;
    const int32_t M = d->depth_multiplier, OC = d->out_c, OW = d->out_w, KW = d->k_w;
    int32_t rk[TT_DW_ROWS], ro[TT_DW_ROWS], ck[TT_DW_ROWS], co[TT_DW_ROWS];
    if (d->k_h > TT_DW_ROWS || KW > TT_DW_ROWS) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                float total = 0.0f;
                for (m = 0; m < M; ++m) {
                    const int32_t oc = ic * M + m;
                    float s = 0.0f;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                        if (oy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < KW; ++kx) {
                            const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, OW);
                            if (ox >= 0) {
                                s += tt_f16_read(dy[(oy * OW + ox) * OC + oc]) * w[(ky * KW + kx) * OC + oc];
                            }
                        }
                    }
                    total = (m > 0 ? total : 0.0f) + s;
                }
                out[(iy * d->in_w + ix) * os] = tt_f16_narrow(total);
            }
        }
        return;
    }
    for (iy = 0; iy < d->in_h; ++iy) {
        nr = tt_dw_gi_list(iy, d->pad_top, d->k_h, d->dilation_h, d->stride_h, d->out_h, rk, ro);
        for (ix = 0; ix < d->in_w; ++ix) {
            float total = 0.0f;
            nc = tt_dw_gi_list(ix, d->pad_left, KW, d->dilation_w, d->stride_w, OW, ck, co);
            for (m = 0; m < M; ++m) {
                const int32_t oc = ic * M + m;
                float s = 0.0f;
                for (r = 0; r < nr; ++r) {
                    const uint16_t *g = dy + ro[r] * OW * OC + oc;
                    const float *wr = w + rk[r] * KW * OC + oc;
                    for (j = 0; j < nc; ++j) {
                        s += tt_f16_read(g[co[j] * OC]) * wr[ck[j] * OC];
                    }
                }
                total = (m > 0 ? total : 0.0f) + s;
            }
            out[(iy * d->in_w + ix) * os] = tt_f16_narrow(total);
        }
    }
}

void tt_depthwise_conv2d_grad_input_hdy_hdx(const tt_conv_dims *d, const uint16_t *dy, const float *w, uint16_t *dx)
{
    int32_t b, ic;
    const int32_t vec = TT_DW_FVEC(d, w, 0, 0.0f, 0.0f);
    (void)vec;
    for (b = 0; b < d->batches; ++b) {
        for (ic = 0; ic < d->in_c; ++ic) {
#if defined(TT_FVEC_DW_H)
            if (vec) {
                tt_fvec_dw_gi_channel(d, dy + b * d->out_h * d->out_w * d->out_c + ic, w + ic,
                                      dx + b * d->in_h * d->in_w * d->in_c + ic, d->in_c);
                continue;
            }
#endif
            tt_dw_gi_hdy_hdx_channel(d, dy + b * d->out_h * d->out_w * d->out_c, w, ic,
                                     dx + b * d->in_h * d->in_w * d->in_c + ic, d->in_c);
        }
    }
}

/* Batch order and channel-by-channel copy of tt_dw_grad_input_inplace (its comment says why it is safe). */
void tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(const tt_conv_dims *d, uint16_t *dydx, const float *w,
                                                    uint16_t *scratch)
{
    int32_t i, c, p;
    const int32_t C = d->in_c, n_in = d->in_h * d->in_w, n_out = d->out_h * d->out_w;
    const int32_t backwards = n_in > n_out, vec = TT_DW_FVEC(d, w, 0, 0.0f, 0.0f);
    (void)vec;
    for (i = 0; i < d->batches; ++i) {
        const int32_t b = backwards ? d->batches - 1 - i : i;
        uint16_t *dxb = dydx + b * n_in * C;
        for (c = 0; c < C; ++c) {
#if defined(TT_FVEC_DW_H)
            if (vec) {
                tt_fvec_dw_gi_channel(d, dydx + b * n_out * C + c, w + c, scratch, 1);
                tt_fvec_dw_put(scratch, n_in, dxb + c, C);
                continue;
            }
#endif
            tt_dw_gi_hdy_hdx_channel(d, dydx + b * n_out * C, w, c, scratch, 1);
            for (p = 0; p < n_in; ++p) {
                dxb[p * C + c] = scratch[p];
            }
        }
    }
}
