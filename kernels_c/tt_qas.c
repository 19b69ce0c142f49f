/* int8 QAS update (DESIGN §6): the fp32 SGD step carried into the int domain, with explicit rounding.
 * The rules are documented in tt_kernels.h; tests/test_kernels_c.py (qas_update_ref) is their numpy mirror. */
#include "tt_kernels.h"

#include <math.h>
#include <stddef.h>

#include "tt_opt_step.h"

uint32_t tt_xorshift32(uint32_t *state)
{
    *state = tt_xorshift32_next(*state);
    return *state;
}

void tt_qas_factors(int32_t channels, float lr, const float *w_scale, float x_scale, float *factor)
{
    int32_t c;
    for (c = 0; c < channels; ++c) {
        factor[c] = lr / (x_scale * w_scale[c]);
    }
}

/* floorf(v + 0.5f) or floorf(v + u), u in [0, 1) with 24 random bits (exact in float32). */
static inline float tt_round(float v, tt_rounding rounding, uint32_t *rng_state)
{
    if (rounding == TT_ROUND_STOCHASTIC) {
        const float u = tt_uniform24(tt_xorshift32(rng_state));
        return floorf(v + u);
    }
    return floorf(v + 0.5f);
}

static inline float tt_clampf(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

#if defined(__GNUC__)
#define TT_QAS8_INLINE static inline __attribute__((always_inline))
#else
#define TT_QAS8_INLINE static inline
#endif

/* One row of tt_qas_update_s8; per_col, has_master, stochastic are constants at every call site. f: the row's
 * factor (f[0]) or the factor of column j (f[j]). Per element, the float operations of the plain rule in
 * tt_kernels.h, in its order. The clamps of the rounded value move before the floor: floor is monotone and the
 * bounds are integers, so clamp(floor(y), a, b) == floor(clamp(y, a, b)), and a clamped y fits int32. */
TT_QAS8_INLINE uint32_t tt_qas_row_s8(const int per_col, const int has_master, const int stochastic, int32_t n,
                                      const float *f, int8_t *w, const float *g, float *m, uint32_t x)
{
    const float f_row = per_col ? 0.0f : f[0];
    int32_t j;
    for (j = 0; j < n; ++j) {
        const float v = -(g[j] * (per_col ? f[j] : f_row));
        float y;
        int32_t q;
        if (v != v) {
            continue; /* NaN: leave the weight alone (and draw no random number) */
        }
        if (has_master) {
            const float mm = tt_clampf(m[j] + v, -127.0f, 127.0f);
            m[j] = mm;
            y = mm;
        } else {
            y = v;
        }
        if (stochastic) {
            x = tt_xorshift32_next(x);
            y = y + tt_uniform24(x);
        } else {
            y = y + 0.5f;
        }
        if (has_master) {
            /* mm in [-127, 127]: y in [-127, 128] (127 + u rounds to 128 for u > 1 - 2^-18): only the top clamps */
            q = tt_floor32(y);
            w[j] = (int8_t)(q > 127 ? 127 : q);
        } else {
            q = tt_floor32(tt_clampf(y, -255.0f, 255.0f));
            q += (int32_t)w[j];
            w[j] = (int8_t)(q < -127 ? -127 : (q > 127 ? 127 : q));
        }
    }
    return x;
}

void tt_qas_update_s8(const tt_qas_layout *l, const float *factor, int8_t *w, const float *g, float *master,
                      uint32_t *rng_state)
{
    const int32_t rows = l->s.rows, cols = l->s.cols, n = l->s.n, rpc = l->rows_per_channel;
    const int stochastic = l->rounding == TT_ROUND_STOCHASTIC;
    uint32_t x = stochastic ? *rng_state : 0u;
    const float *f = factor;
    int32_t r, left = rpc; /* rows left in the current output channel (rpc > 0) */
    for (r = 0; r < rows; ++r) {
        int8_t *wr = w + (size_t)r * (size_t)cols;
        const float *gr = g + (size_t)r * (size_t)n;
        float *mr = master != 0 ? master + (size_t)r * (size_t)n : 0;
#define TT_QAS8_ROW(PC)                                                                                              \
    if (mr != 0) {                                                                                                   \
        x = stochastic ? tt_qas_row_s8(PC, 1, 1, n, f, wr, gr, mr, x) : tt_qas_row_s8(PC, 1, 0, n, f, wr, gr, mr, x); \
    } else {                                                                                                         \
        x = stochastic ? tt_qas_row_s8(PC, 0, 1, n, f, wr, gr, mr, x) : tt_qas_row_s8(PC, 0, 0, n, f, wr, gr, mr, x); \
    }
        if (rpc > 0) {
            TT_QAS8_ROW(0)
            if (--left == 0) { /* the next output channel: no division per element */
                left = rpc;
                ++f;
            }
        } else {
            TT_QAS8_ROW(1)
        }
#undef TT_QAS8_ROW
    }
    if (stochastic) {
        *rng_state = x;
    }
}

void tt_qas_update_bias_s32(int32_t channels, tt_rounding rounding, const float *factor, int32_t *b,
                            const float *g, float *master, uint32_t *rng_state)
{
    int32_t c;
    /* 2^31 and the largest float32 below it: the int32 range in float. */
    const float hi = 2147483520.0f, lo = -2147483648.0f;
    for (c = 0; c < channels; ++c) {
        const float x = -(g[c] * factor[c]);
        if (x != x) {
            continue;
        }
        if (master != 0) {
            const float m = tt_clampf(master[c] + x, lo, hi);
            master[c] = m;
            b[c] = (int32_t)tt_clampf(tt_round(m, rounding, rng_state), lo, hi);
        } else {
            const float dq = tt_clampf(tt_round(x, rounding, rng_state), -4294967296.0f, 4294967296.0f);
            int64_t v = (int64_t)b[c] + (int64_t)dq;
            if (v > (int64_t)TT_INT32_MAX) {
                v = TT_INT32_MAX;
            }
            if (v < (int64_t)TT_INT32_MIN) {
                v = TT_INT32_MIN;
            }
            b[c] = (int32_t)v;
        }
    }
}
