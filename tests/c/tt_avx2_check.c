/* Host AVX2 kernel check (tests/test_host_avx2.py): the AVX2 kernels (static, in their headers: this file is compiled
 * with the host board's AVX2 flags and TT_USE_HOST_SIMD=1) against the portable kernels of the library (compiled
 * without them), on the same random cases in one program. One line per case: the portable output's FNV-1a hash
 * ("out") and the AVX2 kernel's ("avx2out"); "avx2 1" when the AVX2 kernel took the case, "avx2 0" when it left it
 * to the portable kernel (then, in place, "kept 1" says it left the buffer as it was: the portable kernel runs on it
 * next in the library's dispatch).
 *
 * Usage: tt_avx2_check SEED N. Cases: depthwise 3x3 (out of place and in place), 1x1 conv, hidden-stream mask
 * gradient. Shapes, zero points, activation ranges, per-channel multipliers and shifts (mostly the fast form,
 * some not) and extreme values -128 / 127 come from a fixed PRNG. Every buffer is its own exact-size allocation
 * so that AddressSanitizer catches any access past a tail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tt_kernels.h"
#include "tt_hidden_stream.h"
#include "tt_dw_s8_avx2.h"
#include "tt_pw_s8_avx2.h"

#if !TT_HOST_AVX2
#error "tt_avx2_check.c is compiled with the AVX2 flags (-march=x86-64-v3 -DTT_USE_HOST_SIMD=1)"
#endif

static uint64_t rng_state;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

static int32_t rint_in(int32_t lo, int32_t hi) /* uniform in [lo, hi] */
{
    return lo + (int32_t)(rnd() % (uint32_t)(hi - lo + 1));
}

/* int8 values with the extremes -128 and 127 over-represented */
static void fill_s8(int8_t *p, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        const uint32_t k = rnd() % 8;
        p[i] = (int8_t)(k == 0 ? -128 : k == 1 ? 127 : rint_in(-128, 127));
    }
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; ++i) {
        h = (h ^ b[i]) * 1099511628211ULL;
    }
    return h;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == 0) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Requantisation of C channels: multipliers in [2^30, 2^31) (QuantizeMultiplier's range) or 0, shifts mostly
 * -6..-14 (outputs spread over the int8 range), sometimes -1 or -22; in one call of six one channel's shift is 0 or
 * +1 (no fast form) */
static tt_requant_s8 make_requant(int32_t C, int32_t *m, int32_t *sh)
{
    tt_requant_s8 q;
    int32_t c;
    const int32_t relu = (int32_t)(rnd() % 3);
    q.per_channel = (int32_t)(rnd() % 4 != 0);
    q.input_zero_point = rnd() % 4 == 0 ? (rnd() % 2 ? -128 : 127) : rint_in(-128, 127);
    q.output_zero_point = rint_in(-128, 127);
    q.act_min = relu ? q.output_zero_point : -128;
    q.act_max = relu == 2 ? (q.output_zero_point + 60 > 127 ? 127 : q.output_zero_point + 60) : 127;
    for (c = 0; c < C; ++c) {
        const uint32_t k = rnd() % 40;
        m[c] = k == 0 ? 0 : k == 1 ? 0x7fffffff : (int32_t)(0x40000000u + (rnd() & 0x3fffffffu));
        sh[c] = k == 2 ? -1 : k == 3 ? -22 : -rint_in(6, 14);
    }
    if (rnd() % 6 == 0) { /* one channel without the fast form: the AVX2 kernels leave the call to the portable one */
        sh[rint_in(0, C - 1)] = rnd() % 2 ? 0 : 1;
    }
    q.multiplier = m;
    q.shift = sh;
    return q;
}

static void case_dw(int32_t i)
{
    tt_conv_dims d;
    const int32_t same = (int32_t)(rnd() % 2), inplace = (int32_t)(rnd() % 2);
    int32_t C = rnd() % 3 == 0 ? 16 * rint_in(1, 3) : rint_in(1, 40);
    int32_t *m, *sh, *bias = 0, c, nx, ny, used, kept = 1;
    int8_t *x, *w, *y;
    uint64_t hfast;
    tt_requant_s8 q;
    memset(&d, 0, sizeof d);
    d.batches = inplace ? 1 : rint_in(1, 2);
    d.in_h = rint_in(same ? 1 : 3, 9);
    d.in_w = rint_in(same ? 1 : 3, 11);
    d.in_c = d.out_c = C;
    d.k_h = d.k_w = 3;
    d.stride_h = rint_in(1, 2);
    d.stride_w = rint_in(1, 2);
    d.dilation_h = d.dilation_w = 1;
    d.depth_multiplier = 1;
    tt_out_size_and_pad(same, d.in_h, 3, d.stride_h, 1, &d.out_h, &d.pad_top);
    tt_out_size_and_pad(same, d.in_w, 3, d.stride_w, 1, &d.out_w, &d.pad_left);
    m = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)C);
    sh = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)C);
    q = make_requant(C, m, sh);
    nx = d.batches * d.in_h * d.in_w * C;
    ny = d.batches * d.out_h * d.out_w * C;
    if (inplace && ny > nx) {
        ny = nx; /* not reached for SAME / VALID (out <= in), kept as a guard */
    }
    x = (int8_t *)xmalloc((size_t)nx);
    w = (int8_t *)xmalloc((size_t)(9 * C));
    fill_s8(x, nx);
    fill_s8(w, 9 * C);
    if (rnd() % 5 != 0) {
        bias = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)C);
        for (c = 0; c < C; ++c) {
            bias[c] = rnd() % 10 == 0 ? (rnd() % 2 ? 40000 : -40000) : rint_in(-20000, 20000);
        }
    }
    if (inplace) {
        int8_t *scratch = (int8_t *)xmalloc((size_t)(d.out_h * d.out_w));
        int8_t *fast = (int8_t *)xmalloc((size_t)nx);
        memcpy(fast, x, (size_t)nx);
        used = tt_dw_s8_avx2(&d, &q, fast, w, bias, fast);
        kept = used ? 1 : memcmp(fast, x, (size_t)nx) == 0;
        y = (int8_t *)xmalloc((size_t)nx);
        memcpy(y, x, (size_t)nx);
        tt_depthwise_conv2d_s8_inplace(&d, &q, y, w, bias, scratch);
        ny = d.out_h * d.out_w * C;
        hfast = fnv(fast, (size_t)ny);
        free(scratch);
        free(fast);
    } else {
        int8_t *fast = (int8_t *)xmalloc((size_t)ny);
        y = (int8_t *)xmalloc((size_t)ny);
        used = tt_dw_s8_avx2(&d, &q, x, w, bias, fast);
        tt_depthwise_conv2d_s8(&d, &q, x, w, bias, y);
        hfast = used ? fnv(fast, (size_t)ny) : 0;
        free(fast);
    }
    printf("%d dw %s b%d %dx%dx%d s%d,%d p%d,%d zin %d zout %d act %d..%d pc %d avx2 %d kept %d out %016llx "
           "avx2out %016llx\n", (int)i,
           inplace ? "inplace" : "copy", (int)d.batches, (int)d.in_h, (int)d.in_w, (int)C, (int)d.stride_h,
           (int)d.stride_w, (int)d.pad_top, (int)d.pad_left, (int)q.input_zero_point, (int)q.output_zero_point,
           (int)q.act_min, (int)q.act_max, (int)q.per_channel, (int)used, (int)kept,
           (unsigned long long)fnv(y, (size_t)ny), (unsigned long long)hfast);
    free(x);
    free(w);
    free(y);
    free(bias);
    free(m);
    free(sh);
}

static void case_pw(int32_t i)
{
    tt_conv_dims d;
    const int32_t C = rnd() % 4 == 0 ? 16 * rint_in(1, 4) : rint_in(1, 70), OC = rnd() % 4 == 0 ? 8 * rint_in(1, 9) : rint_in(1, 70);
    int32_t *m, *sh, *bias = 0, c, nx, ny, used;
    int8_t *x, *w, *y, *fast;
    tt_requant_s8 q;
    memset(&d, 0, sizeof d);
    d.batches = rint_in(1, 2);
    d.in_h = rint_in(1, 6);
    d.in_w = rint_in(1, 7);
    d.in_c = C;
    d.out_c = OC;
    d.k_h = d.k_w = 1;
    d.stride_h = rint_in(1, 2);
    d.stride_w = rint_in(1, 2);
    d.dilation_h = d.dilation_w = 1;
    d.depth_multiplier = 1;
    d.out_h = (d.in_h - 1) / d.stride_h + 1;
    d.out_w = (d.in_w - 1) / d.stride_w + 1;
    m = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)OC);
    sh = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)OC);
    q = make_requant(OC, m, sh);
    nx = d.batches * d.in_h * d.in_w * C;
    ny = d.batches * d.out_h * d.out_w * OC;
    x = (int8_t *)xmalloc((size_t)nx);
    w = (int8_t *)xmalloc((size_t)(OC * C));
    y = (int8_t *)xmalloc((size_t)ny);
    fast = (int8_t *)xmalloc((size_t)ny);
    fill_s8(x, nx);
    fill_s8(w, OC * C);
    if (rnd() % 5 != 0) {
        bias = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)OC);
        for (c = 0; c < OC; ++c) {
            bias[c] = rnd() % 10 == 0 ? (rnd() % 2 ? 40000 : -40000) : rint_in(-20000, 20000);
        }
    }
    used = tt_pw_s8_avx2(&d, &q, x, w, bias, fast);
    tt_conv2d_s8(&d, &q, x, w, bias, y);
    printf("%d pw b%d %dx%dx%d->%d s%d,%d zin %d zout %d act %d..%d pc %d avx2 %d out %016llx avx2out %016llx\n",
           (int)i, (int)d.batches, (int)d.in_h, (int)d.in_w, (int)C, (int)OC, (int)d.stride_h, (int)d.stride_w,
           (int)q.input_zero_point, (int)q.output_zero_point, (int)q.act_min, (int)q.act_max, (int)q.per_channel,
           (int)used, (unsigned long long)fnv(y, (size_t)ny), (unsigned long long)(used ? fnv(fast, (size_t)ny) : 0));
    free(fast);
    free(x);
    free(w);
    free(y);
    free(bias);
    free(m);
    free(sh);
}

/* Float bits with -0, NaN, Inf and denormals among ordinary values: the select must copy each kept one as is. */
static void case_mask(int32_t i)
{
    const int32_t P = rint_in(1, 70), C = rint_in(1, 20), c = rint_in(0, C - 1);
    const int32_t nbits = P * C, nbytes = (nbits + 7) / 8;
    uint8_t *mask = (uint8_t *)xmalloc((size_t)nbytes);
    float *dy = (float *)xmalloc(sizeof(float) * (size_t)P), *dz = (float *)xmalloc(sizeof(float) * (size_t)P);
    float *fast = (float *)xmalloc(sizeof(float) * (size_t)P);
    int32_t p;
    for (p = 0; p < nbytes; ++p) {
        mask[p] = (uint8_t)rnd();
    }
    for (p = 0; p < P; ++p) {
        const uint32_t k = rnd() % 8;
        const uint32_t special[5] = {0x80000000u, 0x7fc00001u, 0xff800000u, 0x00000001u, 0xffc00000u};
        uint32_t u = k < 5 ? special[k] : rnd();
        memcpy(&dy[p], &u, 4);
    }
    tt_hs_mask_grad_f32(P, C, c, mask, dy, dz);
    tt_mask_grad_bits_f32(P, C, c, mask, dy, fast);
    printf("%d mask P%d C%d c%d avx2 1 out %016llx avx2out %016llx\n", (int)i, (int)P, (int)C, (int)c,
           (unsigned long long)fnv(dz, sizeof(float) * (size_t)P), (unsigned long long)fnv(fast, sizeof(float) * (size_t)P));
    free(fast);
    free(mask);
    free(dy);
    free(dz);
}

int main(int argc, char **argv)
{
    int32_t i, n;
    if (argc != 3) {
        fprintf(stderr, "usage: tt_avx2_check SEED N\n");
        return 2;
    }
    rng_state = strtoull(argv[1], 0, 10);
    n = (int32_t)strtol(argv[2], 0, 10);
    for (i = 0; i < n; ++i) {
        switch (i % 3) {
        case 0: case_dw(i); break;
        case 1: case_pw(i); break;
        default: case_mask(i); break;
        }
    }
    return 0;
}
