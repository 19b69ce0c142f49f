/* int8 QAS update (DESIGN §6): the fp32 SGD step carried into the int domain, with explicit rounding.
 * The rules are documented in tt_kernels.h; tests/test_kernels_c.py (qas_update_ref) is their numpy mirror. */
#include "tt_kernels.h"

#include <math.h>

uint32_t tt_xorshift32(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
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
        const float u = (float)(tt_xorshift32(rng_state) >> 8) * (1.0f / 16777216.0f);
        return floorf(v + u);
    }
    return floorf(v + 0.5f);
}

static inline float tt_clampf(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

void tt_qas_update_s8(const tt_qas_layout *l, const float *factor, int8_t *w, const float *g, float *master,
                      uint32_t *rng_state)
{
    int32_t r, j;
    for (r = 0; r < l->s.rows; ++r) {
        for (j = 0; j < l->s.n; ++j) {
            const int32_t ch = l->rows_per_channel > 0 ? r / l->rows_per_channel : j;
            const int32_t k = r * l->s.n + j;
            int8_t *wp = w + r * l->s.cols + j;
            const float x = -(g[k] * factor[ch]);
            if (x != x) {
                continue; /* NaN: leave the weight alone (and draw no random number) */
            }
            if (master != 0) {
                const float m = tt_clampf(master[k] + x, -127.0f, 127.0f);
                master[k] = m;
                *wp = (int8_t)tt_clampf(tt_round(m, l->rounding, rng_state), -127.0f, 127.0f);
            } else {
                /* A step beyond +-254 saturates anyway; clamping first keeps the int conversion defined. */
                const float dq = tt_clampf(tt_round(x, l->rounding, rng_state), -255.0f, 255.0f);
                *wp = (int8_t)tt_clamp32((int32_t)*wp + (int32_t)dq, -127, 127);
            }
        }
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
