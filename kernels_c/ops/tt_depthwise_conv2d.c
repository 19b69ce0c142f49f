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
#include "tt_dw_s8_avx2.h"

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
                /* the in-image taps: a rectangle [ky0, ky1) x [kx0, kx1) of the filter (int32 sums: any order) */
                int32_t kx0 = 0, kx1 = g.k_w;
                while (kx0 < kx1 && ix0 + kx0 * g.dil_w < 0) {
                    ++kx0;
                }
                while (kx1 > kx0 && ix0 + (kx1 - 1) * g.dil_w >= g.in_w) {
                    --kx1;
                }
                for (ky = ky0; ky < ky1; ++ky) {
                    const int8_t *xr = xc + (iy0 + ky * g.dil_h) * row + ix0 * C;
                    const int8_t *wr = wc + ky * g.k_w * WS;
                    for (kx = kx0; kx < kx1; ++kx) {
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
/* Written out: 10 instructions per output (GCC's loop of the C below reloaded its constants from the stack). */
__attribute__((naked, noinline)) static void tt_rq_run_s8(TT_ASM_ARG const int32_t *args)
{
    /* args: acc, out, stride, n, 2 * bias, h, multiplier, e */
    __asm__ volatile(
        "push   {r4, r5, r6, r7, r8, r9, lr}\n\t"
        "ldm    r0, {r1, r2, r3, r4, r5, r6, r7, r8}\n\t"
        "1:\n\t"
        "ldr    r0, [r1], #4\n\t"
        "add    r0, r0, r5\n\t"
        "add    r9, r6, r0, asr #31\n\t"
        "smmlar r9, r0, r7, r9\n\t"
        "asr    r9, r9, r8\n\t"
        "ssat   r9, #8, r9\n\t"
        "strb   r9, [r2]\n\t"
        "add    r2, r2, r3\n\t"
        "subs   r4, r4, #1\n\t"
        "bne    1b\n\t"
        "pop    {r4, r5, r6, r7, r8, r9, pc}\n\t");
}

static inline void tt_rq_run(const int32_t *acc, int8_t *out, int32_t stride, int32_t n, int32_t bias2,
                             const tt_requant_mm *o)
{
    int32_t args[8];
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

/* One channel: xc / wc at channel c of the batch's input / the weight (tap stride WS), output pixel p to
 * out[p * out_stride]. 3x3, no dilation. A small map (its padded plane fits the buffer, stride_h == stride_w)
 * is copied whole, rows one after the other, and one pass of tt_dw16_pairs runs over the flattened plane (the
 * outputs that would straddle two rows are computed and dropped): no per-row overhead. Otherwise strips of
 * TT_DW16_STRIP outputs over a ring of three rows, per output row the pass over the strip, then the
 * requantization. */
static void tt_dw16_channel(const tt_geom *g, const int8_t *xc, const int8_t *wc, int32_t WS, int32_t bias,
                            int32_t zin, const tt_requant1 *r, int8_t *out, int32_t out_stride)
{
    int16_t buf[TT_DW16_BUF];
    int32_t acc[TT_DW16_ACC];
    int32_t tag[3];
    int32_t a[6];
    const int32_t S = g->stride_w;
    tt_dw16_rq q;
    int32_t ky, ox0, oy;
    q.r = r;
    q.bias = bias;
    q.lo = r->lo;
    q.hi = r->hi;
    /* one SMMLAR (tt_requant_mm) when 2 * (sum + bias) fits: |sum| <= 9 * 255 * 256 / 2 < 2^20 */
    q.fast = tt_requant_mm_init(&q.mm, r) && bias > -(1 << 29) && bias < (1 << 29);
    q.full = q.fast && q.lo == -128 && q.hi == 127;
    for (ky = 0; ky < 3; ++ky) {
        /* doubled taps (|2w| <= 256 fits a lane): the sums come out doubled, as tt_requant_mm takes them */
        const int32_t w0 = 2 * wc[(3 * ky) * WS], w1 = 2 * wc[(3 * ky + 1) * WS], w2 = 2 * wc[(3 * ky + 2) * WS];
        a[2 * ky] = (int32_t)tt_pack16(w0, w1);
        a[2 * ky + 1] = (int32_t)tt_pack16(w1, w2);
    }
    {
        const int32_t span = (g->out_w - 1) * S + 3, rows = (g->out_h - 1) * g->stride_h + 3;
        const int32_t count = (g->out_h - 1) * span + g->out_w, pairs = (count + 1) >> 1;
        /* the last pair reads up to S * (2 * pairs - 1) + 5 <= rows * span + 6 (zeroed slack) */
        if (g->stride_h == S && rows * span + 8 <= TT_DW16_BUF && 2 * pairs <= TT_DW16_ACC) {
            int32_t i;
            for (i = 0; i < rows; ++i) {
                tt_dw16_fill(buf + i * span, xc, g->in_c, g->in_h, g->in_w, i - g->pad_top, -g->pad_left, span, zin);
            }
            for (i = rows * span; i < rows * span + 8; ++i) {
                buf[i] = 0;
            }
            tt_dw16_pairs(buf, buf + span, buf + 2 * span, a, S, pairs, acc);
            for (oy = 0; oy < g->out_h; ++oy) {
                tt_dw16_store(&q, acc + oy * span, g->out_w, out + oy * g->out_w * out_stride, out_stride);
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
            tt_dw16_store(&q, acc, nx, out + (oy * g->out_w + ox0) * out_stride, out_stride);
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
    int32_t b, c, p;
    for (c = 0; c < C; ++c) {
        const tt_requant1 r = tt_requant_channel(q, c);
        const int32_t bc = bias != 0 ? bias[c] : 0;
        for (b = 0; b < d->batches; ++b) {
            const int8_t *xb = x + b * g.in_h * g.in_w * C;
            int8_t *yb = y + b * n_out * C;
            if (scratch == 0) {
                tt_dw16_channel(&g, xb + c, w + c, C, bc, q->input_zero_point, &r, yb + c, C);
            } else {
                tt_dw16_channel(&g, xb + c, w + c, C, bc, q->input_zero_point, &r, scratch, 1);
                for (p = 0; p < n_out; ++p) {
                    yb[p * C + c] = scratch[p];
                }
            }
        }
    }
}
#endif

void tt_depthwise_conv2d_s8(const tt_conv_dims *d, const tt_requant_s8 *q, const int8_t *x, const int8_t *w,
                            const int32_t *bias, int8_t *y)
{
#if TT_HOST_AVX2 /* the host build's AVX2 kernel (same bytes), when the shape fits it */
    if (tt_dw_s8_avx2(d, q, x, w, bias, y)) {
        return;
    }
#endif
    int32_t b, oy, ox, ic, m, ky, kx;
    const int32_t zin = q->input_zero_point;
    const int32_t mult = d->depth_multiplier;
#if TT_SIMD
    if (tt_dw16_fits(d)) {
        tt_dw16_conv(d, q, x, w, bias, y, 0);
        return;
    }
#endif
    if (mult == 1) {
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
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                int8_t *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (ic = 0; ic < d->in_c; ++ic) {
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        int32_t acc = 0;
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t iy = iy0 + ky * d->dilation_h;
                            if (iy < 0 || iy >= d->in_h) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ix = ix0 + kx * d->dilation_w;
                                if (ix < 0 || ix >= d->in_w) {
                                    continue;
                                }
                                acc += ((int32_t)x[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] - zin) *
                                       (int32_t)w[(ky * d->k_w + kx) * d->out_c + oc];
                            }
                        }
                        if (bias != 0) {
                            acc += bias[oc];
                        }
                        yp[oc] = (int8_t)tt_requant_one(q, acc, oc);
                    }
                }
            }
        }
    }
}

void tt_depthwise_conv2d_f32(const tt_conv_dims *d, float act_min, float act_max, const float *x, const float *w,
                             const float *bias, float *y)
{
    int32_t b, oy, ox, ic, m, ky, kx;
    const int32_t mult = d->depth_multiplier;
    for (b = 0; b < d->batches; ++b) {
        for (oy = 0; oy < d->out_h; ++oy) {
            const int32_t iy0 = oy * d->stride_h - d->pad_top;
            for (ox = 0; ox < d->out_w; ++ox) {
                const int32_t ix0 = ox * d->stride_w - d->pad_left;
                float *yp = y + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                for (ic = 0; ic < d->in_c; ++ic) {
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        float acc = 0.0f;
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t iy = iy0 + ky * d->dilation_h;
                            if (iy < 0 || iy >= d->in_h) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ix = ix0 + kx * d->dilation_w;
                                if (ix < 0 || ix >= d->in_w) {
                                    continue;
                                }
                                acc += x[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] *
                                       w[(ky * d->k_w + kx) * d->out_c + oc];
                            }
                        }
                        if (bias != 0) {
                            acc += bias[oc];
                        }
                        yp[oc] = tt_act_clamp(acc, act_min, act_max);
                    }
                }
            }
        }
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
        tt_dw16_conv(d, q, xy, w, bias, xy, scratch);
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
    int32_t b, c, oy, ox, ky, kx;
    const int32_t C = d->in_c;
    for (b = 0; b < d->batches; ++b) {
        const float *x = xy + b * d->in_h * d->in_w * C;
        float *y = xy + b * d->out_h * d->out_w * C;
        for (c = 0; c < C; ++c) {
            for (oy = 0; oy < d->out_h; ++oy) {
                const int32_t iy0 = oy * d->stride_h - d->pad_top;
                for (ox = 0; ox < d->out_w; ++ox) {
                    const int32_t ix0 = ox * d->stride_w - d->pad_left;
                    float acc = 0.0f;
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t iy = iy0 + ky * d->dilation_h;
                        if (iy < 0 || iy >= d->in_h) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ix = ix0 + kx * d->dilation_w;
                            if (ix < 0 || ix >= d->in_w) {
                                continue;
                            }
                            acc += x[(iy * d->in_w + ix) * C + c] * w[(ky * d->k_w + kx) * C + c];
                        }
                    }
                    if (bias != 0) {
                        acc += bias[c];
                    }
                    if (acc < act_min) {
                        acc = act_min;
                    }
                    if (acc > act_max) {
                        acc = act_max;
                    }
                    scratch[oy * d->out_w + ox] = acc;
                }
            }
            for (oy = 0; oy < d->out_h * d->out_w; ++oy) {
                y[oy * C + c] = scratch[oy];
            }
        }
    }
}

void tt_depthwise_conv2d_grad_input_f32(const tt_conv_dims *d, const float *dy, const float *w, float *dx)
{
    int32_t b, iy, ix, ic, m, ky, kx;
    const int32_t mult = d->depth_multiplier;
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                for (ic = 0; ic < d->in_c; ++ic) {
                    float total = 0.0f;
                    /* grad_ops accumulates each output channel over the taps, then folds the multiplier. */
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        float s = 0.0f;
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                            if (oy < 0) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ox =
                                    tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                                if (ox < 0) {
                                    continue;
                                }
                                s += dy[((b * d->out_h + oy) * d->out_w + ox) * d->out_c + oc] *
                                     w[(ky * d->k_w + kx) * d->out_c + oc];
                            }
                        }
                        total += s;
                    }
                    dx[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] = total;
                }
            }
        }
    }
}

void tt_depthwise_conv2d_grad_weight_f32(const tt_conv_dims *d, int32_t k, const float *dy, const float *x,
                                         float *dw)
{
    tt_depthwise_conv2d_grad_weight_f32_taps(d, k, 0, d->k_h * d->k_w, dy, x, dw);
}

/* Taps [t0, t1) (t = ky * k_w + kx, the rows of the [KH*KW, k*M] gradient): each tap row is its own sum. */
void tt_depthwise_conv2d_grad_weight_f32_taps(const tt_conv_dims *d, int32_t k, int32_t t0, int32_t t1,
                                              const float *dy, const float *x, float *dw)
{
    int32_t t, oc, b, oy, ox;
    const int32_t mult = d->depth_multiplier;
    const int32_t n_out = k * mult;
    for (t = t0; t < t1; ++t) {
        const int32_t ky = t / d->k_w, kx = t % d->k_w;
        float *dwp = dw + (t - t0) * n_out;
        for (oc = 0; oc < n_out; ++oc) {
            dwp[oc] = 0.0f;
        }
        for (b = 0; b < d->batches; ++b) {
            for (oy = 0; oy < d->out_h; ++oy) {
                const int32_t iy = oy * d->stride_h - d->pad_top + ky * d->dilation_h;
                if (iy < 0 || iy >= d->in_h) {
                    continue;
                }
                for (ox = 0; ox < d->out_w; ++ox) {
                    const int32_t ix = ox * d->stride_w - d->pad_left + kx * d->dilation_w;
                    const float *dyp;
                    const float *xp;
                    if (ix < 0 || ix >= d->in_w) {
                        continue;
                    }
                    dyp = dy + ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                    xp = x + ((b * d->in_h + iy) * d->in_w + ix) * d->in_c;
                    for (oc = 0; oc < n_out; ++oc) {
                        dwp[oc] += dyp[oc] * xp[oc / mult];
                    }
                }
            }
        }
    }
}

/* The taps that reach input pixel (iy, ix), in (filter y, filter x) order, found once per pixel instead of once
 * per channel: tap index and the dy offset of its output pixel. At most TT_DW_MAX_TAPS (larger filters take the
 * per-channel search). */
#define TT_DW_MAX_TAPS 49

void tt_depthwise_conv2d_grad_input_qw_f32(const tt_conv_dims *d, const float *dy, const int8_t *w,
                                           const float *scale, const int32_t *zero_point, float *dx)
{
    int32_t b, iy, ix, ic, m, ky, kx, t;
    const int32_t mult = d->depth_multiplier;
    int32_t tap_w[TT_DW_MAX_TAPS], tap_dy[TT_DW_MAX_TAPS];
    const int32_t listed = d->k_h * d->k_w <= TT_DW_MAX_TAPS;
    for (b = 0; b < d->batches; ++b) {
        for (iy = 0; iy < d->in_h; ++iy) {
            for (ix = 0; ix < d->in_w; ++ix) {
                int32_t nt = 0;
                if (listed) {
                    for (ky = 0; ky < d->k_h; ++ky) {
                        const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                        if (oy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < d->k_w; ++kx) {
                            const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                            if (ox < 0) {
                                continue;
                            }
                            tap_w[nt] = (ky * d->k_w + kx) * d->out_c;
                            tap_dy[nt] = ((b * d->out_h + oy) * d->out_w + ox) * d->out_c;
                            ++nt;
                        }
                    }
                }
                for (ic = 0; ic < d->in_c; ++ic) {
                    float total = 0.0f;
                    for (m = 0; m < mult; ++m) {
                        const int32_t oc = ic * mult + m;
                        float s = 0.0f;
                        if (listed) {
                            const int32_t z = zero_point[oc];
                            const float sc = scale[oc];
                            for (t = 0; t < nt; ++t) {
                                s += dy[tap_dy[t] + oc] * ((float)((int32_t)w[tap_w[t] + oc] - z) * sc);
                            }
                            total += s;
                            continue;
                        }
                        for (ky = 0; ky < d->k_h; ++ky) {
                            const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                            if (oy < 0) {
                                continue;
                            }
                            for (kx = 0; kx < d->k_w; ++kx) {
                                const int32_t ox =
                                    tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                                if (ox < 0) {
                                    continue;
                                }
                                s += dy[((b * d->out_h + oy) * d->out_w + ox) * d->out_c + oc] *
                                     tt_dq(w[(ky * d->k_w + kx) * d->out_c + oc], zero_point[oc], scale[oc]);
                            }
                        }
                        total += s;
                    }
                    dx[((b * d->in_h + iy) * d->in_w + ix) * d->in_c + ic] = total;
                }
            }
        }
    }
}

/* ---- in-place depthwise input gradient (depth multiplier 1; memplan: dx written over dz) ---------------------
 * Input-gradient channel c reads only output-gradient channel c, and both keep channel c at the offsets
 * (pixel * C + c) of the shared buffer: channel c of a batch is computed into scratch (in_h*in_w floats), then
 * copied over it, as tt_depthwise_conv2d_f32_inplace does. With several batches, batch b of dx covers
 * [b*n_in*C, (b+1)*n_in*C) and batch b of dz [b*n_out*C, (b+1)*n_out*C): when n_in <= n_out the batches go
 * first to last (dx of batch b never reaches dz of a later batch), otherwise last to first. Each element is the
 * sum of tt_depthwise_conv2d_grad_input_f32 / _qw_f32 (taps in (filter y, filter x) order, then total = 0 + s),
 * so the bits are those of the out-of-place kernels. */
/* Stride 1, float taps wc[tap * w_stride], at most TT_DW_ROWS filter rows: the same sums without the per-tap
 * division of tt_src_out. The filter rows that reach input row iy are listed once per row (in ky order); per
 * pixel the taps run in (ky, kx) order, skipping out-of-range output columns, so each element sees the float
 * operations of the general loop below in the same order (s = 0, s += dy * w per valid tap, total = 0 + s). A
 * 3-wide undilated row whose three output columns are all in range is unrolled. */
#define TT_DW_ROWS 8

/* 3x3, undilated, every filter row in range (the rows of a 3x3 "same" gradient but the first and last): the nine
 * taps stay in registers, the output columns whose three taps are all in range run unrolled, the others (the
 * first and last columns) take the general row loop; the same operations in the same order. */
static void tt_dw_gi_row3x3(const tt_conv_dims *d, const float *const rdy[3], const float *wc, int32_t w_stride,
                           int32_t iy, float *out)
{
    const int32_t C = d->out_c, OW = d->out_w, W = d->in_w, pl = d->pad_left;
    const float w00 = wc[0], w01 = wc[w_stride], w02 = wc[2 * w_stride];
    const float w10 = wc[3 * w_stride], w11 = wc[4 * w_stride], w12 = wc[5 * w_stride];
    const float w20 = wc[6 * w_stride], w21 = wc[7 * w_stride], w22 = wc[8 * w_stride];
    const float *r0 = rdy[0], *r1 = rdy[1], *r2 = rdy[2];
    float *o = out + iy * W;
    int32_t ix, kx, ky, lo = 2 - pl, hi = OW - pl; /* columns [lo, hi): ox0 - 2 >= 0 and ox0 < OW */
    if (lo < 0) {
        lo = 0;
    }
    if (hi > W) {
        hi = W;
    }
    if (lo > hi) {
        lo = hi;
    }
    for (ix = 0; ix < W; ++ix) {
        const int32_t ox0 = ix + pl;
        float total = 0.0f, s = 0.0f;
        if (ix == lo) {
            const float *p0 = r0 + ox0 * C, *p1 = r1 + ox0 * C, *p2 = r2 + ox0 * C;
            for (; ix < hi; ++ix, p0 += C, p1 += C, p2 += C) {
                float t = 0.0f, u = 0.0f;
                t += p0[0] * w00;
                t += p0[-C] * w01;
                t += p0[-2 * C] * w02;
                t += p1[0] * w10;
                t += p1[-C] * w11;
                t += p1[-2 * C] * w12;
                t += p2[0] * w20;
                t += p2[-C] * w21;
                t += p2[-2 * C] * w22;
                u += t;
                o[ix] = u;
            }
            if (ix >= W) {
                break;
            }
        }
        {
            const int32_t oxa = ix + pl;
            for (ky = 0; ky < 3; ++ky) {
                const float *rp = ky == 0 ? r0 : ky == 1 ? r1 : r2;
                for (kx = 0; kx < 3; ++kx) {
                    const int32_t ox = oxa - kx;
                    if (ox < 0 || ox >= OW) {
                        continue;
                    }
                    s += rp[ox * C] * wc[(ky * 3 + kx) * w_stride];
                }
            }
            total += s;
            o[ix] = total;
        }
    }
}

static void tt_dw_grad_input_channel_s1(const tt_conv_dims *d, const float *dyb, int32_t c, const float *wc,
                                        int32_t w_stride, float *out)
{
    int32_t iy, ix, ky, kx, r, nr;
    const int32_t C = d->out_c, OW = d->out_w, KW = d->k_w, dil_w = d->dilation_w;
    const int k33 = d->k_h == 3 && KW == 3 && d->dilation_h == 1 && dil_w == 1;
    const float *rdy[TT_DW_ROWS];
    const float *rw[TT_DW_ROWS];
    for (iy = 0; iy < d->in_h; ++iy) {
        if (k33 && iy + d->pad_top - 2 >= 0 && iy + d->pad_top < d->out_h) {
            const float *rows[3];
            rows[0] = dyb + (iy + d->pad_top) * OW * C + c;
            rows[1] = rows[0] - OW * C;
            rows[2] = rows[1] - OW * C;
            tt_dw_gi_row3x3(d, rows, wc, w_stride, iy, out);
            continue;
        }
        nr = 0;
        for (ky = 0; ky < d->k_h; ++ky) {
            const int32_t oy = iy + d->pad_top - ky * d->dilation_h;
            if (oy >= 0 && oy < d->out_h) {
                rdy[nr] = dyb + oy * OW * C + c;
                rw[nr] = wc + ky * KW * w_stride;
                ++nr;
            }
        }
        for (ix = 0; ix < d->in_w; ++ix) {
            const int32_t ox0 = ix + d->pad_left; /* output column of tap kx: ox0 - kx * dil_w */
            float total = 0.0f, s = 0.0f;
            if (KW == 3 && dil_w == 1 && ox0 - 2 >= 0 && ox0 < OW) {
                for (r = 0; r < nr; ++r) {
                    const float *dp = rdy[r] + ox0 * C;
                    const float *wp = rw[r];
                    s += dp[0] * wp[0];
                    s += dp[-C] * wp[w_stride];
                    s += dp[-2 * C] * wp[2 * w_stride];
                }
            } else {
                for (r = 0; r < nr; ++r) {
                    for (kx = 0; kx < KW; ++kx) {
                        const int32_t ox = ox0 - kx * dil_w;
                        if (ox < 0 || ox >= OW) {
                            continue;
                        }
                        s += rdy[r][ox * C] * rw[r][kx * w_stride];
                    }
                }
            }
            total += s;
            out[iy * d->in_w + ix] = total;
        }
    }
}

static void tt_dw_grad_input_channel(const tt_conv_dims *d, const float *dyb, int32_t c, const float *wc,
                                     int32_t w_stride, const int8_t *wq, int32_t z, float sc, float *out)
{
    int32_t iy, ix, ky, kx;
    const int32_t C = d->out_c;
    if (wc != 0 && d->stride_h == 1 && d->stride_w == 1 && d->k_h <= TT_DW_ROWS) {
        tt_dw_grad_input_channel_s1(d, dyb, c, wc, w_stride, out);
        return;
    }
    for (iy = 0; iy < d->in_h; ++iy) {
        for (ix = 0; ix < d->in_w; ++ix) {
            float total = 0.0f, s = 0.0f;
            for (ky = 0; ky < d->k_h; ++ky) {
                const int32_t oy = tt_src_out(iy, d->pad_top, ky, d->dilation_h, d->stride_h, d->out_h);
                if (oy < 0) {
                    continue;
                }
                for (kx = 0; kx < d->k_w; ++kx) {
                    const int32_t ox = tt_src_out(ix, d->pad_left, kx, d->dilation_w, d->stride_w, d->out_w);
                    const int32_t tap = ky * d->k_w + kx;
                    if (ox < 0) {
                        continue;
                    }
                    s += dyb[(oy * d->out_w + ox) * C + c] *
                         (wc != 0 ? wc[tap * w_stride] : tt_dq(wq[tap * C + c], z, sc));
                }
            }
            total += s;
            out[iy * d->in_w + ix] = total;
        }
    }
}

/* w: float weight (wq 0) or int8 weight with its dequantize tables. */
static void tt_dw_grad_input_inplace(const tt_conv_dims *d, float *dydx, const float *w, const int8_t *wq,
                                     const float *scale, const int32_t *zero_point, float *scratch)
{
    int32_t i, c, p, t;
    const int32_t C = d->in_c, n_in = d->in_h * d->in_w, n_out = d->out_h * d->out_w, taps = d->k_h * d->k_w;
    const int32_t backwards = n_in > n_out;
    float wl[TT_DW_MAX_TAPS];
    for (i = 0; i < d->batches; ++i) {
        const int32_t b = backwards ? d->batches - 1 - i : i;
        const float *dyb = dydx + b * n_out * C;
        float *dxb = dydx + b * n_in * C;
        for (c = 0; c < C; ++c) {
            if (w != 0) {
                tt_dw_grad_input_channel(d, dyb, c, w + c, C, 0, 0, 0.0f, scratch);
            } else if (taps <= TT_DW_MAX_TAPS) {
                /* the channel's taps dequantized once (the same float values tt_dq gives per element) */
                for (t = 0; t < taps; ++t) {
                    wl[t] = tt_dq(wq[t * C + c], zero_point[c], scale[c]);
                }
                tt_dw_grad_input_channel(d, dyb, c, wl, 1, 0, 0, 0.0f, scratch);
            } else {
                tt_dw_grad_input_channel(d, dyb, c, 0, 0, wq, zero_point[c], scale[c], scratch);
            }
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
