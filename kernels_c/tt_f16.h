/* fp16-mixed training (issue 13): IEEE binary16 storage, fp32 arithmetic. numpy reference: stages/golden/fp16.py.
 *
 * Storage is uint16_t holding binary16 bits on every target. Why not _Float16 / __fp16: with -std=c99 neither is
 * standard (_Float16 is C23 / TS 18661-3; __fp16 is an Arm extension whose format depends on -mfp16-format), and
 * x86 hosts may promote differently. The conversions below are written once in portable integer C, with round to
 * nearest, ties to even, subnormals kept and overflow to +-Inf -- what numpy's float32 -> float16 cast and Arm's
 * VCVTB.F16.F32 do -- so the host and every Cortex-M give the same bits. All arithmetic on the values is done by
 * the fp32 kernels (fp16 operands are exact in fp32), so no fp16 arithmetic unit is needed for the results. */
#ifndef TT_F16_H
#define TT_F16_H

#include <stdint.h>
#include <string.h>

/* float(h), exact. Inline so that the kernels that read fp16 operands themselves (the weight gradients' saved
 * inputs: tt_conv2d_grad_weight_hx_f32_range, tt_fully_connected_grad_weight_hx_f32_range) widen each element in a
 * register where they use it, and no fp32 copy of the tensor is made (memplan: fused widening). */
static inline float tt_f16_widen(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    float f;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13);                  /* Inf, NaN (payload kept) */
    } else if (exp != 0u) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);         /* normal: rebias 15 -> 127 */
    } else if (man == 0u) {
        bits = sign;                                              /* +-0 */
    } else {
        /* subnormal: man * 2^-24, normalised */
        uint32_t e = 113u;                                        /* 127 - 14 */
        while ((man & 0x400u) == 0u) {
            man <<= 1;
            --e;
        }
        bits = sign | (e << 23) | ((man & 0x3FFu) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* float(h) as the kernels that read fp16 operands take it. On an Arm FPU with the half-precision conversions
 * (__ARM_FP bit 1: the Cortex-M55 board) one VCVTB.F32.F16: exact, fp16 subnormals kept (FP-to-FP conversions do
 * not flush half-precision inputs, FZ16 or not; the single-precision result is never subnormal). It differs from
 * tt_f16_widen only on a signalling NaN, which it quiets; tt_f32_to_f16 stores every NaN quiet, so no tensor the
 * kernels read holds one and the bits are the same everywhere. Elsewhere: F16C's VCVTPH2PS where the target has it
 * (below), else tt_f16_widen. TT_F16_PORTABLE (tests) selects the portable widening and narrowing both. */
#if defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 2) && !defined(TT_F16_PORTABLE)
static inline float tt_f16_read(uint16_t h)
{
    float f;
    __asm__("vmov %0, %1\n\tvcvtb.f32.f16 %0, %0" : "=t"(f) : "r"((uint32_t)h));
    return f;
}
#elif defined(__F16C__) && !defined(TT_F16_PORTABLE)
/* x86-64 with F16C (the host build's x86-64-v3): one VCVTPH2PS, the same bits but a signalling NaN's quieting, as on
 * Arm (tests/test_fp16_read.py checks all 65,536 values); the per-element reads of the fp16 kernels were most of
 * their host time with the portable widening's branches. */
#include <immintrin.h>
static inline float tt_f16_read(uint16_t h)
{
    return _cvtsh_ss(h);
}
#else
static inline float tt_f16_read(uint16_t h)
{
    return tt_f16_widen(h);
}
#endif

/* fp16(f), round to nearest even (tt_f32_to_f16's body), in portable integer C. */
static inline uint16_t tt_f16_narrow_portable(float f)
{
    uint32_t x;
    uint32_t sign, exp, man;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (x >> 23) & 0xFFu;
    man = x & 0x7FFFFFu;
    if (exp == 0xFFu) {                                           /* Inf, NaN (quiet, top payload bits kept) */
        return (uint16_t)(sign | 0x7C00u | (man ? (0x200u | (man >> 13)) : 0u));
    }
    if (exp >= 143u) {                                            /* >= 2^16: beyond 65504 -> Inf */
        return (uint16_t)(sign | 0x7C00u);
    }
    if (exp >= 113u) {                                            /* normal fp16 range (2^-14 and up) */
        uint32_t h = ((exp - 112u) << 10) | (man >> 13);
        uint32_t rest = man & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
            ++h;                                                  /* a carry into the exponent is right, even to Inf */
        }
        return (uint16_t)(sign | h);
    }
    if (exp >= 102u) {                                            /* fp16 subnormal (or rounds up to the smallest normal) */
        uint32_t m = man | 0x800000u;                             /* 24 significant bits */
        uint32_t shift = 126u - exp;                              /* 14 .. 24 */
        uint32_t h = m >> shift;
        uint32_t rest = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) {
            ++h;
        }
        return (uint16_t)(sign | h);
    }
    return (uint16_t)sign;                                        /* below half the smallest subnormal: +-0 */
}

/* fp16(f) as the kernels that write fp16 results themselves store it (fp16-mixed's fp16_output ops:
 * ops/tt_conv2d.c, tt_mean.c, tt_mask*.c, ...), inline so that they round each result where they store it and link
 * without tt_f16.c. On an Arm FPU with the half-precision conversions (the Cortex-M55 board) one scalar
 * VCVTB.F16.F32: it rounds by FPSCR.RMode (nearest even: the board's startup states RMode = 0, AHP = 0, DN = 0),
 * keeps fp16 subnormal results (FZ16 = 0) and fp32 subnormal inputs (FZ = 0; they round to +-0 or the smallest
 * subnormal as the portable code does), overflows to +-Inf, and with DN = 0 turns a NaN into the quiet NaN with its
 * top payload bits: tt_f16_narrow_portable's bits on every fp32 value (tests/test_m55_f16.py checks 2.8 M of them
 * in QEMU, every sign, exponent and rounding boundary). VCVTB writes only the low half of its register, hence the
 * 16-bit truncation. On x86-64 with F16C (the host build) one VCVTPS2PH with round to nearest even in the instruction
 * (the same bits, checked by tests/test_fp16_read.py); elsewhere the portable rounding. */
#if defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 2) && !defined(TT_F16_PORTABLE)
static inline uint16_t tt_f16_narrow(float f)
{
    uint32_t bits;
    __asm__("vcvtb.f16.f32 %0, %0" : "+t"(f));
    memcpy(&bits, &f, 4);
    return (uint16_t)bits;
}
#elif defined(__F16C__) && !defined(TT_F16_PORTABLE)
static inline uint16_t tt_f16_narrow(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#else
static inline uint16_t tt_f16_narrow(float f)
{
    return tt_f16_narrow_portable(f);
}
#endif

float tt_f16_to_f32(uint16_t h);
uint16_t tt_f32_to_f16(float f);

/* y[i] = fp16(x[i]); safe in place (y may start where x does: it writes behind what it reads). */
void tt_cast_f32_f16(uint32_t n, const float *x, uint16_t *y);
/* y[i] = float(x[i]); safe in place (it runs backwards). */
void tt_cast_f16_f32(uint32_t n, const uint16_t *x, float *y);

/* y[i] = float(fp16(x[i])): an fp16 value kept in an fp32 slot; safe in place. */
void tt_round_f16(uint32_t n, const float *x, float *y);

/* y[i] = x[i] * s (the loss gradient times the loss scale). */
void tt_scale_f32(uint32_t n, const float *x, float s, float *y);
/* y[i] = float(g[i]) / s (gradients unscaled before the update). */
void tt_unscale_f16(uint32_t n, const uint16_t *g, float s, float *y);
void tt_unscale_f32(uint32_t n, const float *g, float s, float *y);

/* 1 when any element is Inf or NaN (by its exponent bits: independent of any fast-math setting). */
int tt_nonfinite_f16(uint32_t n, const uint16_t *g);
int tt_nonfinite_f32(uint32_t n, const float *g);

/* The loss-scale policy (train.loss_scale; GradScaler's). */
typedef struct {
    int32_t dynamic;      /* 0: static scale */
    float growth;         /* x growth after `interval` finite steps in a row */
    float backoff;        /* x backoff on a step with an Inf/NaN gradient (skipped) */
    int32_t interval;
    float min_scale, max_scale;
} tt_loss_scale_params;

void tt_loss_scale_update(const tt_loss_scale_params *p, float *scale, int32_t *good, int32_t *skipped,
                          int32_t found_inf);

#endif
