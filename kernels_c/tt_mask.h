/* tt_mask.h: 1-bit activation masks for the backward pass (autodiff's clamp_mask / mask_grad ops).
 *
 * Instead of keeping a forward activation y alive until the backward pass only to mask a gradient with it
 * (int8_clamp_grad: lo < y_q < hi; act_grad of relu / relu6 / relu_n1_to_1), the forward packs one bit per
 * element and the backward masks with the bits: 1/8 byte per element instead of 1 (int8) or 4 (float).
 *
 * Mask layout: uint8_t[ceil(n / 8)]; element i is bit (i & 7) of byte i >> 3, LSB first (numpy's
 * packbits(bitorder="little")); 1 = the gradient passes. The unused high bits of the last byte are written 0.
 * Same conventions as tt_kernels.h (C99, no state, every buffer passed in). */
#ifndef TT_MASK_H
#define TT_MASK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* mask bit i = lo < y[i] < hi (integer compare), for i < n; bits of the last byte past n are 0. */
void tt_clamp_mask_s8(int32_t n, int32_t lo, int32_t hi, const int8_t *y, uint8_t *mask);

/* mask bit i = lo < y[i] && (y[i] < hi or hi == +INFINITY: no upper bound), float32 compare: NaN gives 0 and
 * +inf passes an unbounded hi, exactly as tt_act_grad_f32 (relu: lo 0, hi +INFINITY; relu6: 0, 6;
 * relu_n1_to_1: -1, 1). */
void tt_clamp_mask_f32(int32_t n, float lo, float hi, const float *y, uint8_t *mask);

/* dz[i] = bit (bit_offset + i) of mask set ? dy[i] : 0.0f, for i < n. bit_offset is the mask bit of dy[0]
 * (0 for a whole tensor; the element offset of a chunk of it). dz may be dy (in place). */
void tt_mask_grad_f32(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dy, float *dz);

/* fp16-mixed (issue 13): the two kernels above on fp16 tensors (binary16 bits, kernels_c/tt_f16.h), so that an
 * fp16 result needs no fp32 copy. tt_clamp_mask_hy: y fp16, widened where it is compared (exact): the bits of
 * tt_cast_f16_f32 + tt_clamp_mask_f32. tt_mask_grad_f16: exactly one of dyf (fp32) / dyh (fp16) and one of dzf /
 * dzh is non-null; an fp16 dz holds the fp32 result rounded once (dy or +0: the bits of tt_mask_grad_f32 +
 * tt_round_f16). dz may be dy when both have the same type (in place). */
void tt_clamp_mask_hy(int32_t n, float lo, float hi, const uint16_t *y, uint8_t *mask);
void tt_mask_grad_f16(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dyf, const uint16_t *dyh,
                      float *dzf, uint16_t *dzh);

#ifdef __cplusplus
}
#endif

#endif /* TT_MASK_H */
