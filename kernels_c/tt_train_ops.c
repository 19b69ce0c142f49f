/* Kernels of the generated training program beyond tt_kernels.h (declarations and rules: tt_train_ops.h). */
#include "tt_train_ops.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "tt_opt_step.h"
#include "tt_simd.h" /* TT_HOST_SIMD: SSE2 on the native host build */
#if defined(__arm__) && defined(__ARM_FEATURE_SAT) && defined(__GNUC__)
#include <arm_acle.h> /* __ssat */
#endif

/* ---- element-wise ------------------------------------------------------------------------------------------- */

void tt_sum_f32(int32_t n_inputs, const float *const *xs, int32_t n, float *y)
{
    int32_t i, j;
    for (i = 0; i < n; ++i) {
        float s = xs[0][i];
        for (j = 1; j < n_inputs; ++j) {
            s += xs[j][i];
        }
        y[i] = s;
    }
}

void tt_dequantize_slice_s8_f32(int32_t rows, int32_t depth, int32_t k, float scale, int32_t zero_point,
                                const int8_t *x, float *y)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < k; ++c) {
            y[r * k + c] = (float)((int32_t)x[r * depth + c] - zero_point) * scale;
        }
    }
}

/* The first index of the largest of x[0..n), for either element type (the definitions stay plain so that
 * cross-compile's name scan sees them). */
#define TT_ARGMAX_BODY                                                                                               \
    int32_t i, best = 0;                                                                                             \
    for (i = 1; i < n; ++i) {                                                                                        \
        if (x[i] > x[best]) {                                                                                        \
            best = i;                                                                                                \
        }                                                                                                            \
    }                                                                                                                \
    return best;

int32_t tt_argmax_s8(int32_t n, const int8_t *x)
{
    TT_ARGMAX_BODY
}

int32_t tt_argmax_f32(int32_t n, const float *x)
{
    TT_ARGMAX_BODY
}
#undef TT_ARGMAX_BODY

/* ---- QAS update ----------------------------------------------------------------------------------------------
 * Per element, in the order of stages/quant/qas.py (each line one float32 rounding, as numpy does it).
 *
 * Cost: the update runs once per trained element per step (on the digits example it was ~78% of a step), so the
 * loop is specialised: tt_qas_update dispatches once per call on optimizer kind x rounding mode (nearest,
 * stochastic, master copy) x scale layout (one per row / one per column), each combination an always-inlined
 * copy of one generic row loop (tt_qas_row) in which those switches are compile-time constants (24 copies,
 * ~12 KB of Cortex-M7 code; also specialising int8/int32 saved ~10% more instructions for twice the code). The
 * channel scale is read once per row when the row is one output channel, the tt_qas_params fields are copied to
 * locals (the state stores are float stores the compiler would otherwise assume may alias them), and the
 * xorshift32 state stays in a register. The integer rounding takes an int32 fast path for |x| < 2^24; only larger
 * or non-finite values go through the int64 conversions (library calls on Cortex-M, ~100 instructions each
 * element before). The default spec's case (SGD, QAS, no weight decay, no master copy) has a tighter loop of its
 * own (tt_qas_sgd_update, +4 KB of M7 code; ~24 instructions per int8 weight instead of ~51), which the native
 * host build runs four int8 weights at a time with SSE2 (tt_qas_sgd4_s8; its per-element division was 47 % of
 * the digits host step). Every float operation and its order are those of the plain per-element loop, so results
 * are bit-identical to it. */
#define TT_DELTA_LIMIT 1099511627776.0f /* 2^40 */
/* Below 2^24 in magnitude a rounded value and its sum with an int8 parameter fit int32 without overflow, and
 * clipping to +-2^40 is the identity. */
#define TT_FAST_LIMIT 16777216.0f /* 2^24 */

#if defined(__GNUC__)
#define TT_QAS_INLINE static inline __attribute__((always_inline))
#define TT_QAS_LIKELY(c) __builtin_expect(!!(c), 1)
#else
#define TT_QAS_INLINE static inline
#define TT_QAS_LIKELY(c) (c)
#endif

enum { TT_QAS_NEAREST = 0, TT_QAS_STOCHASTIC = 1, TT_QAS_MASTER = 2 };

static inline float tt_clip_delta(float v)
{
    if (v < -TT_DELTA_LIMIT) {
        return -TT_DELTA_LIMIT;
    }
    if (v > TT_DELTA_LIMIT) {
        return TT_DELTA_LIMIT;
    }
    return v;
}

/* round half away from zero (qas.round_nearest: trunc, then the exact fraction) and floor, in an integer type T
 * that holds the result: int64_t for |v| <= 2^40, int32_t (the single-instruction float <-> int32 conversions) for
 * |v| <= 2^24 + 1 (tt_floor32 is tt_math.h's). (float)t is exact: below 2^24 every integer is a float, above
 * it v is an integer and t == v. */
#define TT_ROUND_AWAY(T, NAME)                                                                                       \
    static inline T NAME(float v)                                                                                    \
    {                                                                                                                \
        const T t = (T)v;                                                                                            \
        const float frac = v - (float)t;                                                                             \
        return t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);                                                 \
    }
TT_ROUND_AWAY(int64_t, tt_round_away)
TT_ROUND_AWAY(int32_t, tt_round_away32)
#undef TT_ROUND_AWAY

static inline int64_t tt_floor64(float v)
{
    const int64_t t = (int64_t)v;
    return ((float)t > v) ? t - 1 : t;
}

/* The rare values outside the fast path (|x| >= 2^24, infinities, NaN), as the plain loop treats them: clip to
 * +-2^40 and convert through int64; NaN keeps the parameter (the loss check stops training). u: the stochastic
 * draw (drawn by the caller, none for NaN). Out of line: one copy instead of one per specialisation. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static int32_t tt_qas_round_slow(int mode, float x, float u, int32_t cur_int, int32_t lo, int32_t hi)
{
    int64_t v;
    if (x != x) {
        v = cur_int;
    } else if (mode == TT_QAS_MASTER) {
        v = tt_round_away(tt_clip_delta(x));
    } else if (mode == TT_QAS_STOCHASTIC) {
        v = (int64_t)cur_int + tt_floor64(tt_clip_delta(x) + u);
    } else {
        v = (int64_t)cur_int + tt_round_away(tt_clip_delta(x));
    }
    return (int32_t)(v < lo ? lo : (v > hi ? hi : v));
}

/* The rare value x_round of an element (tt_qas_round_slow) with its draw: none for NaN. */
TT_QAS_INLINE int32_t tt_qas_slow(const int mode, float x_round, int32_t cur_int, int32_t lo, int32_t hi, uint32_t *x)
{
    float u = 0.0f;
    if (mode == TT_QAS_STOCHASTIC && x_round == x_round) { /* NaN draws nothing */
        *x = tt_xorshift32_next(*x);
        u = tt_uniform24(*x);
    }
    return tt_qas_round_slow(mode, x_round, u, cur_int, lo, hi);
}

/* clamp(cur + r, lo, hi) for an int32 bias: cur + r (|r| <= 2^24) may leave int32, so in int64. */
static inline int32_t tt_add_clamp32(int32_t cur, int32_t r, int32_t lo, int32_t hi)
{
    const int64_t w = (int64_t)cur + r;
    return (int32_t)(w < lo ? lo : (w > hi ? hi : w));
}

/* p[j] of the parameter row pr, int8 or int32 by is32, and p[j] = v. */
TT_QAS_INLINE int32_t tt_qas_load(const int is32, const void *pr, int32_t j)
{
    return is32 ? ((const int32_t *)pr)[j] : (int32_t)((const int8_t *)pr)[j];
}


TT_QAS_INLINE void tt_qas_store(const int is32, void *pr, int32_t j, int32_t v)
{
    if (is32) {
        ((int32_t *)pr)[j] = v;
    } else {
        ((int8_t *)pr)[j] = (int8_t)v;
    }
}

/* One row: elements [0, n) of row r of the parameter (pr, int8 or int32 by is32) and of the compact [rows, n]
 * tensors (g, s0, s1, m). sp: the row's channel scale (per_elem == 0) or the scale of column j at sp[j]. kind,
 * mode, per_elem are constants at every call site (is32 is loop-invariant). Returns the PRNG state after the row. */
TT_QAS_INLINE uint32_t tt_qas_row(const tt_qas_params *c, const int kind, const int mode, const int is32,
                                  const int per_elem, int32_t n, const float *sp, void *pr, const float *g, float *s0,
                                  float *s1, float *m, uint32_t x)
{
    const int32_t qas = c->qas, wd_on = c->weight_decay != 0.0f, lo = c->lo, hi = c->hi;
    const float bs = c->batch_scale, lr = c->lr, wd = c->weight_decay, eps = c->eps;
    const float s_row = per_elem ? 0.0f : sp[0];
    int32_t j;
    for (j = 0; j < n; ++j) {
        const float s = per_elem ? sp[j] : s_row;
        const int32_t cur_int = tt_qas_load(is32, pr, j);
        const float cur = mode == TT_QAS_MASTER ? m[j] : (float)cur_int;
        float gg = g[j] * bs;
        float d, delta, x_round;
        int32_t v;
        if (qas) {
            if (wd_on) {
                gg = gg + wd * (s * cur);
            }
        } else {
            gg = gg * s;
            if (wd_on) {
                gg = gg + wd * cur;
            }
        }
        if (kind == TT_OPT_MOMENTUM) {
            d = tt_momentum_step(gg, &s0[j], c->momentum, lr);
        } else if (kind == TT_OPT_ADAM) {
            d = tt_adam_step(gg, &s0[j], &s1[j], c->one_minus_beta1, c->beta2, c->one_minus_beta2, c->lr_over_bc1,
                             c->sqrt_bc2, eps);
        } else if (kind == TT_OPT_RMSPROP) {
            d = tt_rmsprop_step(gg, &s0[j], c->alpha, c->one_minus_alpha, lr, eps);
        } else {
            d = lr * gg;
        }
        delta = qas ? (-d) / s : -d;
        /* x_round: the value rounded (the new master value, or the step) */
        if (mode == TT_QAS_MASTER) {
            x_round = m[j] + delta;
            m[j] = x_round;
        } else {
            x_round = delta;
        }
        if (x_round > -TT_FAST_LIMIT && x_round < TT_FAST_LIMIT) { /* false for NaN too */
            int32_t r;
            if (mode == TT_QAS_STOCHASTIC) {
                x = tt_xorshift32_next(x);
                /* |x_round + u| <= 2^24 + 1 rounds to at most 2^24 in float32: int32 is enough */
                r = tt_floor32(x_round + tt_uniform24(x));
            } else {
                r = tt_round_away32(x_round);
            }
            if (mode == TT_QAS_MASTER) {
                v = r < lo ? lo : (r > hi ? hi : r);
            } else if (!is32) {
                v = cur_int + r; /* int8 + at most 2^24: no overflow */
                v = v < lo ? lo : (v > hi ? hi : v);
            } else {
                v = tt_add_clamp32(cur_int, r, lo, hi);
            }
        } else {
            v = tt_qas_slow(mode, x_round, cur_int, lo, hi, &x);
        }
        tt_qas_store(is32, pr, j, v);
    }
    return x;
}

/* ---- the common case: SGD with QAS on, no weight decay, no master copy (the default spec's update) ---------------
 * Per element the generic row computes gg = g * bs; d = lr * gg; delta = (-d) / s. Here: gg = g (bs == 1.0f:
 * g * 1.0f == g for every non-NaN float, also with flush-to-zero, where lr * g flushes the same subnormal input)
 * or g * bs; delta = (neg_lr * gg) / s with neg_lr = -lr, because IEEE multiplication rounds |lr * gg| the same
 * for either sign, so (-lr) * gg == -(lr * gg) bit for bit. No per-element test of qas, weight decay, is32 or
 * the optimizer kind remains; the branch-free rounding below replaces the compare-and-select of tt_round_away32. */

/* clamp to [-128, 127]: one SSAT where the core has it (gcc does not always find it in the selects) */
static inline int32_t tt_sat8(int32_t v)
{
#if defined(__arm__) && defined(__ARM_FEATURE_SAT) && defined(__GNUC__)
    return __ssat(v, 8);
#else
    return v > 127 ? 127 : (v < -128 ? -128 : v);
#endif
}

/* round half away from zero of |v| < 2^24, branch-free: t = trunc(v) and frac = v - t are exact (below 2^24
 * every integer is a float, and frac is v's fraction bits), frac + frac is exact and lies in (-2, 2), so its
 * truncation is sign(frac) exactly when |frac| >= 0.5, else 0: t + trunc(2 frac) == roundf(v). */
static inline int32_t tt_round_away_fast(float v)
{
    const int32_t t = (int32_t)v;
    const float frac = v - (float)t;
    return t + (int32_t)(frac + frac);
}

/* Elements [j0, j1) of one row of the common case; stochastic, is32, per_elem, unit_batch are constants at every
 * call site. The elements, the PRNG draws and the rare-value path (tt_qas_round_slow) are those of tt_qas_row. */
TT_QAS_INLINE uint32_t tt_qas_sgd_span(const int stochastic, const int is32, const int per_elem, const int unit_batch,
                                       int32_t j0, int32_t j1, const float *sp, float bs, float neg_lr, int32_t lo,
                                       int32_t hi, void *pr, const float *g, uint32_t x)
{
    const float s_row = per_elem ? 0.0f : sp[0];
    const int mode = stochastic ? TT_QAS_STOCHASTIC : TT_QAS_NEAREST;
    int32_t j;
    for (j = j0; j < j1; ++j) {
        const float s = per_elem ? sp[j] : s_row;
        const float gg = unit_batch ? g[j] : g[j] * bs;
        const float delta = (neg_lr * gg) / s;
        const int32_t cur_int = tt_qas_load(is32, pr, j);
        int32_t v;
        /* the slow path's argument set-up stays out of the loop body (gcc hoists it above the test otherwise) */
        if (TT_QAS_LIKELY(fabsf(delta) < TT_FAST_LIMIT)) { /* false for NaN too */
            int32_t r;
            if (stochastic) {
                x = tt_xorshift32_next(x);
                r = tt_floor32(delta + tt_uniform24(x));
            } else {
                r = tt_round_away_fast(delta);
            }
            if (!is32) {
                /* int8 + at most 2^24: no overflow. hi == 127 and lo >= -128 here (the caller checks), so
                 * clamp(v, lo, hi) == max(clamp(v, -128, 127), lo), and the first clamp is one SSAT on Arm */
                v = tt_sat8(cur_int + r);
                v = v < lo ? lo : v;
            } else {
                v = tt_add_clamp32(cur_int, r, lo, hi);
            }
        } else {
            v = tt_qas_slow(mode, delta, cur_int, lo, hi, &x);
        }
        tt_qas_store(is32, pr, j, v);
    }
    return x;
}

#if TT_HOST_SIMD
/* Four int8 elements of the common case at once (SSE2), lane by lane the float operations of tt_qas_sgd_span:
 * mulps / divps / addps round each lane as mulss / divss / addss do (IEEE, round to nearest), cvttps2dq truncates
 * as the (int32_t) casts, and the draws are the same four in the same order. The clamp: packs to int16 saturates
 * (|cur + r| <= 2^24 + 127), max with lo (>= -128), packs to int8 saturates at 127 = hi; that is clamp(v, lo, hi).
 * Returns 0, writing nothing and drawing nothing, when a lane is outside the fast path (|delta| >= 2^24 or NaN):
 * the caller then takes the four elements one by one. */
TT_QAS_INLINE int tt_qas_sgd4_s8(const int stochastic, const int per_elem, const int unit_batch, const float *sp,
                                 __m128 s_row, __m128 bs, __m128 neg_lr, __m128i lo16, int8_t *p, const float *g,
                                 uint32_t *x)
{
    const __m128 gg = unit_batch ? _mm_loadu_ps(g) : _mm_mul_ps(_mm_loadu_ps(g), bs);
    const __m128 delta = _mm_div_ps(_mm_mul_ps(neg_lr, gg), per_elem ? _mm_loadu_ps(sp) : s_row);
    const __m128 mag = _mm_andnot_ps(_mm_set1_ps(-0.0f), delta);
    __m128i t, r, cur, v;
    int32_t c4;
    if (_mm_movemask_ps(_mm_cmplt_ps(mag, _mm_set1_ps(TT_FAST_LIMIT))) != 0xF) { /* NaN compares false */
        return 0;
    }
    if (stochastic) {
        const uint32_t a = tt_xorshift32_next(*x), b = tt_xorshift32_next(a), c = tt_xorshift32_next(b),
                       d = tt_xorshift32_next(c);
        const __m128i bits = _mm_srli_epi32(_mm_set_epi32((int)d, (int)c, (int)b, (int)a), 8); /* < 2^24: exact */
        const __m128 y = _mm_add_ps(delta, _mm_mul_ps(_mm_cvtepi32_ps(bits), _mm_set1_ps(TT_U24_SCALE)));
        *x = d;
        t = _mm_cvttps_epi32(y);
        r = _mm_add_epi32(t, _mm_castps_si128(_mm_cmpgt_ps(_mm_cvtepi32_ps(t), y))); /* floor: t - ((float)t > y) */
    } else {
        __m128 frac;
        t = _mm_cvttps_epi32(delta);
        frac = _mm_sub_ps(delta, _mm_cvtepi32_ps(t));
        r = _mm_add_epi32(t, _mm_cvttps_epi32(_mm_add_ps(frac, frac))); /* tt_round_away_fast */
    }
    memcpy(&c4, p, 4);
    cur = _mm_cvtsi32_si128(c4);
    cur = _mm_unpacklo_epi8(cur, cur);
    cur = _mm_srai_epi32(_mm_unpacklo_epi16(cur, cur), 24); /* the four int8 values sign-extended */
    v = _mm_add_epi32(cur, r);
    v = _mm_max_epi16(_mm_packs_epi32(v, v), lo16);
    c4 = _mm_cvtsi128_si32(_mm_packs_epi16(v, v));
    memcpy(p, &c4, 4);
    return 1;
}
#endif

/* One row of the common case: the host's SSE2 blocks of four where they apply, the plain loop for the rest. */
TT_QAS_INLINE uint32_t tt_qas_sgd_row(const int stochastic, const int is32, const int per_elem, const int unit_batch,
                                      int32_t n, const float *sp, float bs, float neg_lr, int32_t lo, int32_t hi,
                                      void *pr, const float *g, uint32_t x)
{
    int32_t j = 0;
#if TT_HOST_SIMD
    if (!is32) {
        const __m128 s_row = _mm_set1_ps(per_elem ? 0.0f : sp[0]), vbs = _mm_set1_ps(bs), vlr = _mm_set1_ps(neg_lr);
        const __m128i lo16 = _mm_set1_epi16((int16_t)lo);
        int8_t *p8 = (int8_t *)pr;
        for (; j + 4 <= n; j += 4) {
            if (!tt_qas_sgd4_s8(stochastic, per_elem, unit_batch, per_elem ? sp + j : sp, s_row, vbs, vlr, lo16, p8 + j,
                                g + j, &x)) {
                x = tt_qas_sgd_span(stochastic, 0, per_elem, unit_batch, j, j + 4, sp, bs, neg_lr, lo, hi, pr, g, x);
            }
        }
    }
#endif
    return tt_qas_sgd_span(stochastic, is32, per_elem, unit_batch, j, n, sp, bs, neg_lr, lo, hi, pr, g, x);
}

/* All rows of the common case for one (stochastic, is32, unit_batch); the scale layout per call, the channel
 * index counted along the rows (no division). */
TT_QAS_INLINE void tt_qas_sgd_rows(const int stochastic, const int is32, const int unit_batch, int32_t rows,
                                   int32_t cols, int32_t n, int32_t rows_per_channel, int32_t scale_count,
                                   const float *scale, void *param, const float *g, float bs, float neg_lr,
                                   int32_t lo, int32_t hi, uint32_t *rng)
{
    const size_t stride = (size_t)cols * (is32 ? 4u : 1u);
    const int per_elem = scale_count != 1 && rows_per_channel <= 0;
    const int advance = !per_elem && scale_count != 1; /* one scale per rows_per_channel rows */
    uint32_t x = stochastic ? *rng : 0u;
    const float *sp = scale;
    int32_t r, left = rows_per_channel;
    char *pr = (char *)param;
    for (r = 0; r < rows; ++r) {
        if (per_elem) {
            x = tt_qas_sgd_row(stochastic, is32, 1, unit_batch, n, sp, bs, neg_lr, lo, hi, pr, g, x);
        } else {
            x = tt_qas_sgd_row(stochastic, is32, 0, unit_batch, n, sp, bs, neg_lr, lo, hi, pr, g, x);
            if (advance && --left == 0) { /* the next output channel */
                left = rows_per_channel;
                ++sp;
            }
        }
        pr += stride;
        g += n;
    }
    if (stochastic) {
        *rng = x;
    }
}

/* Out of line: its own small register set, and one copy of the eight specialisations. int8 parameters come with
 * the weight bounds hi == 127, lo >= -128 (the caller checks; others take the generic loop). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void tt_qas_sgd_update(int stochastic, int32_t rows, int32_t cols, int32_t n, int32_t rows_per_channel,
                              int32_t scale_count, const float *scale, void *param, int32_t is_int32,
                              const float *g, float bs, float lr, int32_t lo, int32_t hi, uint32_t *rng)
{
    const float neg_lr = -lr;
    const int unit = bs == 1.0f;
#define TT_QAS_SGD_CASE(ST, I32, UNIT)                                                                              \
    tt_qas_sgd_rows(ST, I32, UNIT, rows, cols, n, rows_per_channel, scale_count, scale, param, g, bs, neg_lr, lo,   \
                    hi, rng)
    if (stochastic) {
        if (is_int32) {
            if (unit) { TT_QAS_SGD_CASE(1, 1, 1); } else { TT_QAS_SGD_CASE(1, 1, 0); }
        } else {
            if (unit) { TT_QAS_SGD_CASE(1, 0, 1); } else { TT_QAS_SGD_CASE(1, 0, 0); }
        }
    } else {
        if (is_int32) {
            if (unit) { TT_QAS_SGD_CASE(0, 1, 1); } else { TT_QAS_SGD_CASE(0, 1, 0); }
        } else {
            if (unit) { TT_QAS_SGD_CASE(0, 0, 1); } else { TT_QAS_SGD_CASE(0, 0, 0); }
        }
    }
#undef TT_QAS_SGD_CASE
}

/* All rows for one (kind, mode, is32): the scale layout is chosen per call, the channel scale once per row. */
TT_QAS_INLINE void tt_qas_rows(const tt_qas_params *c, const int kind, const int mode, const int is32, int32_t rows,
                               int32_t cols, int32_t n, int32_t rows_per_channel, int32_t scale_count,
                               const float *scale, void *param, const float *g, float *s0, float *s1, float *m,
                               uint32_t *rng)
{
    const int32_t esz = is32 ? 4 : 1;
    const int per_elem = scale_count != 1 && rows_per_channel <= 0;
    uint32_t x = rng != 0 ? *rng : 0u;
    int32_t r;
    for (r = 0; r < rows; ++r) {
        void *pr = (char *)param + (size_t)r * (size_t)cols * (size_t)esz;
        const int32_t k = r * n;
        const float *sp = scale + (per_elem || scale_count == 1 ? 0 : r / rows_per_channel);
        /* unused state / master pointers are NULL: no offset on them (undefined behaviour) */
        float *s0r = kind != TT_OPT_SGD ? s0 + k : s0, *s1r = kind == TT_OPT_ADAM ? s1 + k : s1;
        float *mr = mode == TT_QAS_MASTER ? m + k : m;
        if (per_elem) {
            x = tt_qas_row(c, kind, mode, is32, 1, n, sp, pr, g + k, s0r, s1r, mr, x);
        } else {
            x = tt_qas_row(c, kind, mode, is32, 0, n, sp, pr, g + k, s0r, s1r, mr, x);
        }
    }
    if (mode == TT_QAS_STOCHASTIC) {
        *rng = x;
    }
}

#define TT_QAS_CASE(KIND, MODE)                                                                                      \
    tt_qas_rows(&c, KIND, MODE, is_int32, rows, cols, n, rows_per_channel, scale_count, scale, param, g, state0,   \
                state1, master, rng);

#define TT_QAS_KIND(KIND)                                                                                            \
    if (mode == TT_QAS_MASTER) {                                                                                     \
        TT_QAS_CASE(KIND, TT_QAS_MASTER)                                                                             \
    } else if (mode == TT_QAS_STOCHASTIC) {                                                                          \
        TT_QAS_CASE(KIND, TT_QAS_STOCHASTIC)                                                                         \
    } else {                                                                                                         \
        TT_QAS_CASE(KIND, TT_QAS_NEAREST)                                                                            \
    }

void tt_qas_update(const tt_qas_params *p, int32_t rows, int32_t cols, int32_t n, int32_t rows_per_channel,
                   int32_t scale_count, const float *scale, void *param, int32_t is_int32, const float *g,
                   float *state0, float *state1, float *master, uint32_t *rng)
{
    /* a local copy: its fields cannot alias the float state the loop stores to, so they stay in registers */
    const tt_qas_params c = *p;
    const int mode = master != 0 ? TT_QAS_MASTER
                                 : (c.rounding == TT_ROUND_STOCHASTIC ? TT_QAS_STOCHASTIC : TT_QAS_NEAREST);
    if (c.kind == TT_OPT_SGD && c.qas && !(c.weight_decay != 0.0f) && mode != TT_QAS_MASTER &&
        (is_int32 || (c.hi == 127 && c.lo >= -128 && c.lo <= c.hi))) {
        tt_qas_sgd_update(mode == TT_QAS_STOCHASTIC, rows, cols, n, rows_per_channel, scale_count, scale, param,
                          is_int32, g, c.batch_scale, c.lr, c.lo, c.hi, rng);
        return;
    }
    switch (c.kind) {
    case TT_OPT_MOMENTUM:
        TT_QAS_KIND(TT_OPT_MOMENTUM)
        break;
    case TT_OPT_ADAM:
        TT_QAS_KIND(TT_OPT_ADAM)
        break;
    case TT_OPT_RMSPROP:
        TT_QAS_KIND(TT_OPT_RMSPROP)
        break;
    default:
        TT_QAS_KIND(TT_OPT_SGD)
        break;
    }
}
