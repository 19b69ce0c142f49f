/* tt_math.h: the kernels' own expf / logf / tanhf.
 *
 * Why: glibc's and newlib's libm round expf/logf differently in the last bit, and results compared between
 * the host build and the QEMU build must be bit-identical (DESIGN §6, boards/README.md). These use only
 * float32 +, -, *, / and integer bit operations, which are IEEE-exact on every target (with
 * -ffp-contract=off), so they give the same bits everywhere. Accuracy: about 1 ulp over the ranges the loss and
 * softmax kernels use (exp of x <= 0, log of x >= 1); the numpy model differs from them by that much, well
 * within the 1e-5 relative tolerance of float results. */
#ifndef TT_MATH_H
#define TT_MATH_H

#include <stdint.h>
#include <string.h>

/* floorf(v) for |v| <= 2^24 + 1 (and any |v| < 2^31) without the libm call (Cortex-M4 has no VRINTM): the
 * truncation is exact there, and (float)t too: below 2^24 every integer is a float, above it v is an integer and
 * t == v. */
static inline int32_t tt_floor32(float v)
{
    const int32_t t = (int32_t)v;
    return ((float)t > v) ? t - 1 : t;
}

static inline float tt_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t tt_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* exp(x): x = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2), degree-7 Taylor polynomial for e^r
 * (truncation error < 1e-8 relative), then 2^n by building the exponent bits. */
static inline float tt_expf(float x)
{
    const float log2e = 1.44269502f;
    const float ln2_hi = 0.693145752f; /* 0x3f317200: n * ln2_hi is exact for |n| < 2^8 */
    const float ln2_lo = 1.42860677e-06f;
    float r, p, t;
    int32_t n;
    if (x != x) {
        return x;
    }
    if (x > 88.7228394f) {
        return tt_bits_to_f32(0x7f800000u); /* +inf */
    }
    if (x < -103.972084f) {
        return 0.0f;
    }
    t = x * log2e;
    n = (int32_t)(t < 0.0f ? t - 0.5f : t + 0.5f); /* round half away from zero, no libm */
    r = x - (float)n * ln2_hi;
    r = r - (float)n * ln2_lo;
    p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f +
        r * (0.00833333377f + r * (0.00138888892f + r * 0.000198412701f))))));
    if (n < -100) { /* keep the exponent field positive: scale in two steps into the subnormal range */
        p = p * tt_bits_to_f32(0x0d800000u); /* 2^-100 */
        n += 100;
    }
    return p * tt_bits_to_f32((uint32_t)(n + 127) << 23);
}

/* log(x), fdlibm's e_logf.c reduction (x = 2^k (1 + f), sqrt(2)/2 <= 1 + f < sqrt(2)) and its polynomial in
 * s = f / (2 + f). */
static inline float tt_logf(float x)
{
    const float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f;
    const float Lg1 = 6.6666668653e-01f, Lg2 = 4.0000000596e-01f, Lg3 = 2.8571429849e-01f,
                Lg4 = 2.2222198546e-01f, Lg5 = 1.8183572590e-01f, Lg6 = 1.5313838422e-01f,
                Lg7 = 1.4798198640e-01f;
    uint32_t ix = tt_f32_to_bits(x);
    int32_t k = 0, i;
    float f, s, z, w, t1, t2, R, hfsq, dk;
    if (x != x || x < 0.0f) {
        return tt_bits_to_f32(0x7fc00000u); /* NaN */
    }
    if (x == 0.0f) {
        return tt_bits_to_f32(0xff800000u); /* -inf */
    }
    if (ix >= 0x7f800000u) {
        return x; /* +inf */
    }
    if (ix < 0x00800000u) { /* subnormal: scale up by 2^25 */
        k -= 25;
        x = x * 33554432.0f;
        ix = tt_f32_to_bits(x);
    }
    k += (int32_t)(ix >> 23) - 127;
    ix &= 0x007fffffu;
    i = (int32_t)((ix + (0x95f64u << 3)) & 0x800000u);
    x = tt_bits_to_f32(ix | ((uint32_t)i ^ 0x3f800000u)); /* x or x/2, in [sqrt(2)/2, sqrt(2)) */
    k += i >> 23;
    f = x - 1.0f;
    s = f / (2.0f + f);
    dk = (float)k;
    z = s * s;
    w = z * z;
    t1 = w * (Lg2 + w * (Lg4 + w * Lg6));
    t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
    R = t2 + t1;
    hfsq = 0.5f * f * f;
    return dk * ln2_hi - ((hfsq - (s * (hfsq + R) + dk * ln2_lo)) - f);
}

/* tanh(x) for the fp32 TANH op (numpy's np.tanh in the golden model; within a few ulp of it). Two ranges:
 *  - |x| < 0.25: the odd Taylor series to x^11 (the next term is < 1e-10 relative), which avoids the cancellation
 *    of the formula below near 0;
 *  - otherwise 1 - 2 / (e^(2|x|) + 1) with tt_expf; its rounding error is < 1e-7 absolute, i.e. < 5e-7 relative
 *    since |tanh| >= 0.24 there. From |x| >= 9 on tanh rounds to 1 in float32.
 * Sign restored at the end (tanh is odd); NaN in, NaN out. */
static inline float tt_tanhf(float x)
{
    const float a = x < 0.0f ? -x : x;
    float t;
    if (x != x) {
        return x;
    }
    if (a < 0.25f) {
        const float z = a * a;
        t = a + a * z * (-0.333333343f + z * (0.133333340f + z * (-0.0539682545f + z * (0.0218694885f +
            z * -0.00886323582f))));
    } else if (a >= 9.0f) {
        t = 1.0f;
    } else {
        t = 1.0f - 2.0f / (tt_expf(2.0f * a) + 1.0f);
    }
    return x < 0.0f ? -t : t;
}

#endif /* TT_MATH_H */
