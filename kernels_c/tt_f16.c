/* fp16-mixed training kernels (tt_f16.h). Integer-only conversions: bit-identical on every target. */
#include "tt_f16.h"

#include <string.h>

/* target.kernels: mve - Helium conversions and scans for the array functions below (tt_f16_mve.h says why their bits
 * are these loops'); the scalar tt_f16_to_f32 / tt_f32_to_f16 stay portable: they are the reference. */
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_f16_mve.h"
#else
#define TT_F16_MVE 0
#endif

float tt_f16_to_f32(uint16_t h)
{
    return tt_f16_widen(h);
}

uint16_t tt_f32_to_f16(float f)
{
    return tt_f16_narrow_portable(f);
}

void tt_cast_f32_f16(uint32_t n, const float *x, uint16_t *y)
{
    uint32_t i = 0;
#if TT_F16_MVE
    i = tt_cast_f32_f16_mve(n, x, y);
#endif
    for (; i < n; ++i) {
        y[i] = tt_f32_to_f16(x[i]);
    }
}

void tt_cast_f16_f32(uint32_t n, const uint16_t *x, float *y)
{
    uint32_t i;
#if TT_F16_MVE
    /* backwards like the loop below, the last n % 4 first: each block reads its 8 bytes before writing 16 at twice
     * the offset, which only covers values already read */
    for (i = n; i % 4u != 0u; --i) {
        y[i - 1u] = tt_f16_to_f32(x[i - 1u]);
    }
    for (; i > 0u; i -= 4u) {
        tt_f16x4_to_f32_mve(x + i - 4u, y + i - 4u);
    }
    return;
#endif
    for (i = n; i > 0u; --i) {
        y[i - 1u] = tt_f16_to_f32(x[i - 1u]);
    }
}

void tt_round_f16(uint32_t n, const float *x, float *y)
{
    uint32_t i = 0;
#if TT_F16_MVE
    i = tt_round_f16_mve(n, x, y);
#endif
    for (; i < n; ++i) {
        y[i] = tt_f16_to_f32(tt_f32_to_f16(x[i]));
    }
}

void tt_scale_f32(uint32_t n, const float *x, float s, float *y)
{
    uint32_t i;
    for (i = 0; i < n; ++i) {
        y[i] = x[i] * s;
    }
}

/* 1/s when s is a power of two whose reciprocal is a normal float (exponent field 1..253, no mantissa bits): then
 * g * (1/s) and g / s are the same real number, both rounded once to nearest even, so they are the same bits for
 * every g (subnormal results, +-0, Inf and NaN included) and the division (14 cycles, not pipelined) can be a
 * multiply. The dynamic loss scale is a power of two whenever its growth and backoff factors are (GradScaler's
 * 2 and 0.5, the default). 0 when s is not such a power. */
static float tt_exact_reciprocal(float s)
{
    uint32_t b, r;
    float inv;
    memcpy(&b, &s, 4);
    if ((b & 0x807FFFFFu) != 0u || (b >> 23) < 1u || (b >> 23) > 253u) {
        return 0.0f;
    }
    r = (254u - (b >> 23)) << 23;
    memcpy(&inv, &r, 4);
    return inv;
}

void tt_unscale_f16(uint32_t n, const uint16_t *g, float s, float *y)
{
    const float inv = tt_exact_reciprocal(s);
    uint32_t i = 0;
#if TT_F16_MVE
    for (; i + 4u <= n; i += 4u) { /* Helium converts, the scalar FPU scales (fp32 vectors would flush subnormals) */
        float t[4];
        uint32_t k;
        tt_f16x4_to_f32_mve(g + i, t);
        for (k = 0; k < 4u; ++k) {
            y[i + k] = inv != 0.0f ? t[k] * inv : t[k] / s;
        }
    }
#endif
    for (; i < n; ++i) {
        const float v = tt_f16_to_f32(g[i]);
        y[i] = inv != 0.0f ? v * inv : v / s;
    }
}

void tt_unscale_f32(uint32_t n, const float *g, float s, float *y)
{
    const float inv = tt_exact_reciprocal(s);
    uint32_t i;
    if (inv != 0.0f) { /* the same bits as g[i] / s: tt_exact_reciprocal says why */
        for (i = 0; i < n; ++i) {
            y[i] = g[i] * inv;
        }
        return;
    }
    for (i = 0; i < n; ++i) {
        y[i] = g[i] / s;
    }
}

int tt_nonfinite_f16(uint32_t n, const uint16_t *g)
{
    uint32_t i;
#if TT_F16_MVE
    return tt_nonfinite_f16_mve(n, g);
#endif
    for (i = 0; i < n; ++i) {
        if ((g[i] & 0x7C00u) == 0x7C00u) {
            return 1;
        }
    }
    return 0;
}

int tt_nonfinite_f32(uint32_t n, const float *g)
{
    uint32_t i, b;
#if TT_F16_MVE
    return tt_nonfinite_f32_mve(n, g);
#endif
    for (i = 0; i < n; ++i) {
        memcpy(&b, &g[i], 4);
        if ((b & 0x7F800000u) == 0x7F800000u) {
            return 1;
        }
    }
    return 0;
}

void tt_loss_scale_update(const tt_loss_scale_params *p, float *scale, int32_t *good, int32_t *skipped,
                          int32_t found_inf)
{
    float s = *scale;
    if (found_inf) {
        *skipped += 1;
        *good = 0;
        if (p->dynamic) {
            s = s * p->backoff;
            if (s < p->min_scale) {
                s = p->min_scale;
            }
        }
    } else {
        *good += 1;
        if (p->dynamic && *good >= p->interval) {
            s = s * p->growth;
            if (s > p->max_scale) {
                s = p->max_scale;
            }
            *good = 0;
        }
    }
    *scale = s;
}
