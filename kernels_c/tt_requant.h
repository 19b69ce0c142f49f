/* Per-output-channel requantization constants of conv / depthwise, hoisted out of the pixel loops (internal to the
 * kernel library). tt_requant_apply(r, acc) == tt_multiply_by_quantized_multiplier(acc, m, s) + z_y, clamped: the
 * same operations, with the channel's table lookups and the shift's sign split done once per channel instead of
 * once per output element. */
#ifndef TT_REQUANT_H
#define TT_REQUANT_H

#include "tt_kernels.h"
#include "tt_simd.h"

typedef struct {
    int32_t multiplier;
    int left, right; /* shift > 0: left shift of the accumulator; shift <= 0: rounding right shift by -shift */
    int32_t zero_point, lo, hi;
} tt_requant1;

static inline tt_requant1 tt_requant_channel(const tt_requant_s8 *q, int32_t oc)
{
    tt_requant1 r;
    const int32_t i = q->per_channel ? oc : 0;
    const int shift = (int)q->shift[i];
    r.multiplier = q->multiplier[i];
    r.left = shift > 0 ? shift : 0;
    r.right = shift > 0 ? 0 : -shift;
    r.zero_point = q->output_zero_point;
    r.lo = q->act_min;
    r.hi = q->act_max;
    return r;
}

static inline int8_t tt_requant_apply(const tt_requant1 *r, int32_t acc)
{
    const int32_t v = tt_rounding_divide_by_pot(tt_srdhm(tt_wrap_shl32(acc, r->left), r->multiplier), r->right) +
                      r->zero_point;
    return (int8_t)tt_clamp32(v, r->lo, r->hi);
}

/* The same requantization, cheaper, for the channels of every real model: multiplier >= 0 and a rounding right
 * shift e = -shift in 1..22 (so no left shift). With s = SRDHM(x, m) = floor((x*m + 2^30) / 2^31) and
 * RDBPOT(s, e) = floor((s + 2^(e-1) - [s < 0]) / 2^e) (ties away from zero), the nested floors merge
 * (floor(floor(a / 2^31) / 2^e) = floor(a / 2^(31+e)) for an integer a), and adding z_y commutes with the floor:
 *   RDBPOT(SRDHM(x, m), e) + z_y = floor((x*m + 2^30 + 2^(e+30) - [s < 0]*2^31 + z_y*2^(31+e)) / 2^(31+e)),
 * one 64-bit multiply-accumulate and one shift of its high word by e - 1. [s < 0] may be taken as [x < 0] when
 * m >= 0: x >= 0 gives s >= 0, and x < 0 gives s <= 0, where s == 0 rounds to 0 either way (e >= 1). No int64
 * overflow: |x*m| <= 2^62 and the constant is below 2^61 for e <= 22. Any other channel (never seen in practice:
 * QuantizeMultiplier gives m in [2^30, 2^31) or 0) takes tt_requant_apply. */
typedef struct {
    int64_t k;         /* 2^30 + 2^(e+30) + z_y * 2^(31+e) */
    int32_t multiplier;
    int sh;            /* e - 1 */
} tt_requant_fast;

/* 1 and *f filled when the channel's requantization has the fast form, else 0. Always inlined: with conv2d and
 * depthwise_conv2d in separate files, GCC's own choice inlined it in another order and the depthwise channel loop
 * (run once per channel) ran a few more instructions; forced, that loop compiles as when both shared one file. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int tt_requant_fast_init(tt_requant_fast *f, const tt_requant1 *r)
{
    const int e = r->right;
    if (r->left != 0 || e < 1 || e > 22 || r->multiplier < 0) {
        f->k = 0;
        f->multiplier = 0;
        f->sh = 0;
        return 0;
    }
    f->multiplier = r->multiplier;
    f->sh = e - 1;
    f->k = ((int64_t)1 << 30) + ((int64_t)1 << (e + 30)) + (int64_t)r->zero_point * ((int64_t)1 << (31 + e));
    return 1;
}

/* tt_multiply_by_quantized_multiplier(x, m, -e) + z_y (before the clamp). Right shift of a negative int64 /
 * int32: arithmetic on every target we build for (see tt_fixedpoint.h). */
static inline int32_t tt_requant_fast_apply(int64_t k, int32_t multiplier, int sh, int32_t x)
{
    const int64_t t = (int64_t)x * multiplier + k - (int64_t)((uint32_t)x & 0x80000000u);
    return (int32_t)(t >> 32) >> sh;
}

/* The fast form once more for a doubled sum x2 = 2x (|x| < 2^30), one SMMLAR per output on the DSP cores. With
 * the fast form's t = x*m + k - [x<0]*2^31 and k's low word (e >= 1): 2k = 2^31 + 2^32 * h, h = 2^(e-1) + z_y*2^e,
 *   2t = 2^32 * (h - [x<0]) + x2*m + 2^31,
 * so floor(2t / 2^32) is SMMLAR(x2, m, h - [x<0]) (the high word of a*2^32 + x2*m, rounded by + 2^31), and the
 * fast result floor(t / 2^(31+e)) = floor(2t / 2^(32+e)) is that shifted right by e (nested floors merge).
 * [x<0] = -(x2 >> 31). The kernels that keep their sums doubled get them for free (weights doubled in int16 lanes:
 * |2w| <= 256). No int64 overflow: |x2*m| < 2^62, |h| < 2^30. */
typedef struct {
    int32_t h, multiplier, e;
} tt_requant_mm;

static inline int tt_requant_mm_init(tt_requant_mm *o, const tt_requant1 *r)
{
    const int e = r->right;
    if (r->left != 0 || e < 1 || e > 22 || r->multiplier < 0) {
        o->h = o->multiplier = o->e = 0;
        return 0;
    }
    o->h = (int32_t)(((int64_t)1 << (e - 1)) + (int64_t)r->zero_point * ((int64_t)1 << e));
    o->multiplier = r->multiplier;
    o->e = e;
    return 1;
}

/* SMMLAR: the high word of a*2^32 + x*m + 2^31 (one instruction on the DSP cores; the int64 sum elsewhere, its
 * high word in range for every use here). */
static inline int32_t tt_smmlar(int32_t x, int32_t m, int32_t a)
{
#if TT_SIMD && defined(__arm__) && defined(__GNUC__)
    int32_t r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(x), "r"(m), "r"(a));
    return r;
#else
    return (int32_t)(((int64_t)a * 4294967296LL + (int64_t)x * m + 2147483648LL) >> 32);
#endif
}

/* v clamped to [-128, 127] (one SSAT on the DSP cores). */
static inline int32_t tt_ssat8(int32_t v)
{
#if TT_SIMD && defined(__arm__) && defined(__GNUC__)
    int32_t r;
    __asm__("ssat %0, #8, %1" : "=r"(r) : "r"(v));
    return r;
#else
    return tt_clamp32(v, -128, 127);
#endif
}

/* tt_multiply_by_quantized_multiplier(x, m, -e) + z_y for x2 = 2x, before the clamp. */
static inline int32_t tt_requant_mm_apply(int32_t h, int32_t multiplier, int32_t e, int32_t x2)
{
    return tt_smmlar(x2, multiplier, h + (x2 >> 31)) >> e;
}

/* tt_multiply_by_quantized_multiplier_smaller_than_one_exp(x, m, -e) + z (add's rescalings) for x2 = 2x, one SMMLAR:
 * tt_requant_mm's form (derived above for a right shift e >= 1) extended to e == 0, where the reference is
 * SRDHM(x, m) + z = floor((x*m + 2^30) / 2^31) + z = floor((x2*m + 2^31) / 2^32) + z, SMMLAR(x2, m, z) exactly with
 * no sign term. So h = [e > 0] * 2^(e-1) + z * 2^e and the sign term (x2 >> 31) is masked by `neg` (-1 when e > 0,
 * else 0). Needs m >= 0, 0 <= e <= 22 (|h| < 2^30 for |z| <= 128) and |x| < 2^30. */
typedef struct {
    int32_t h, multiplier, e, neg;
} tt_requant_mmx;

/* 1 and *o filled when (multiplier, shift = -e) has this form, else 0. */
static inline int tt_requant_mmx_init(tt_requant_mmx *o, int32_t multiplier, int32_t shift, int32_t zero_point)
{
    const int32_t e = -shift;
    if (multiplier < 0 || e < 0 || e > 22 || zero_point < -128 || zero_point > 128) {
        o->h = o->multiplier = o->e = o->neg = 0;
        return 0;
    }
    o->h = (int32_t)((e > 0 ? ((int64_t)1 << (e - 1)) : 0) + (int64_t)zero_point * ((int64_t)1 << e));
    o->multiplier = multiplier;
    o->e = e;
    o->neg = e > 0 ? -1 : 0;
    return 1;
}

static inline int32_t tt_requant_mmx_apply(const tt_requant_mmx *o, int32_t x2)
{
    return tt_smmlar(x2, o->multiplier, o->h + ((x2 >> 31) & o->neg)) >> o->e;
}

#endif /* TT_REQUANT_H */
