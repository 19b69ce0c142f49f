/* Hidden-channel streams (stages/planning/channel_stream.py): the backward of a chain
 *     pointwise input gradient -> per-channel ops (masks, bias gradients, depthwise input gradient: the depthwise
 *     file's one-channel kernel, tt_depthwise_conv2d_grad_input_channel_f32, on a compact plane)
 *     -> pointwise weight gradient + update / pointwise input gradient
 * run one hidden channel c at a time, so the chain's gradients (an inverted-residual block's expanded width) exist
 * one channel (one H*W plane, compact) at a time. Each kernel computes channel c of what the whole op computes, with
 * the same float32 operations in the same order (the comments name the whole kernel it follows), so the bits are
 * those of the unstreamed program. Included by tt_kernels.h after tt_conv_dims. */
#ifndef TT_HIDDEN_STREAM_H
#define TT_HIDDEN_STREAM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Channel c of a 1x1 stride-1 conv2d_grad_input over P pixels: dh[p] = 0 + sum over k < K, in order, of
 * dz[p * K + k] * w(k, c), w(k, c) the forward weight [K, 1, 1, C] at output channel k, input channel c: float
 * (w, wq 0; a split weight's input channels [0, n) in `wpart` [K, n], the others in the whole `w`) or int8
 * dequantized with output channel k's scale / zero point (the input channels [0, n) of a split weight in `part`
 * [K, n], the others in the whole `wq`). As tt_conv2d_grad_input_f32 / _split / _qw_f32. */
void tt_hs_pw_grad_in_f32(int32_t P, int32_t K, int32_t C, int32_t c, const float *dz, const float *w,
                          const float *wpart, const int8_t *wq, const int8_t *part, int32_t n, const float *scale,
                          const int32_t *zero_point, float *dh);

/* dx[p * IC + i] += dh[p] * w(c, i) for the expand conv's output channel c (forward weight [C, 1, 1, IC]): the
 * 1x1 input gradient summed over the hidden channels one channel per call, in channel order, onto dx zeroed
 * before channel 0 (0 + s of the whole kernel: s never is -0). Weight as tt_hs_pw_grad_in_f32 (scale, zero point
 * of output channel c). */
void tt_hs_pw_grad_in_acc_f32(int32_t P, int32_t IC, int32_t c, const float *dh, const float *w,
                              const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                              const float *scale, const int32_t *zero_point,
                              float *dx);

/* Channel c's taps of a [1, kh, kw, C] depthwise weight as floats: float w (wq 0), or int8 dequantized with
 * channel c's scale and zero point (tt_dq, the value the whole kernel computes per element). taps <= 64. */
void tt_hs_dw_taps(int32_t taps, int32_t C, int32_t c, const float *w, const int8_t *wq, const float *scale,
                   const int32_t *zero_point, float *wc);

/* Masks of channel c over P pixels (the whole tensor's element p * C + c): the 1-bit mask of mask_grad, the int8
 * output of int8_clamp_grad (lo < y < hi), as tt_mask_grad_f32 / tt_int8_clamp_grad_f32. */
void tt_hs_mask_grad_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy, float *dz);
void tt_hs_int8_clamp_grad_f32(int32_t P, int32_t C, int32_t c, int32_t lo, int32_t hi, const float *dy,
                               const int8_t *y, float *dx);
/* tt_hs_mask_grad_f32 followed by the channel's bias gradient tt_bias_grad_f32(P, 1, dz, db): db[0] = 0 + dz[0]
 * + dz[1] + ... in pixel order, summed as the plane is masked (one pass). */
void tt_hs_mask_bias_grad_f32(int32_t P, int32_t C, int32_t c, const uint8_t *mask, const float *dy, float *dz,
                              float *db);

/* tt_hs_pw_grad_in_f32 followed by tt_hs_mask_grad_f32 on its plane (mask of the [P, C] tensor, channel c), and
 * when db != 0 the bias sum of tt_hs_mask_bias_grad_f32: the sums of the pixels whose bit is set (the same sums),
 * +0 for the others, without computing what the mask drops. */
void tt_hs_pw_grad_in_mask_f32(int32_t P, int32_t K, int32_t C, int32_t c, const float *dz, const float *w,
                               const float *wpart, const int8_t *wq, const int8_t *part, int32_t n,
                               const float *scale, const int32_t *zero_point, const uint8_t *mask, float *dh,
                               float *db);

/* Row o of a 1x1 weight gradient over P pixels from a float copy of its int8 input: tt_hs_dequant_rows writes
 * xf[p * k + c] = (float)(x[p * IC + c] - zero_point) * scale for c < k (tt_conv2d_grad_weight_qx_f32_range's value
 * per element) once per stream; tt_hs_pw_grad_w_f32 then gives dw[c] = 0 + sum over p, in order, of
 * dh[p] * xf[p * k + c] for c < k: the bits of tt_conv2d_grad_weight_qx_f32_range on a one-channel dz (pixels whose
 * dh is +-0 are skipped as there: every xf is finite, so they would add +-0 to a sum that is never -0). */
void tt_hs_dequant_rows(int32_t P, int32_t IC, int32_t k, const int8_t *x, float scale, int32_t zero_point,
                        float *xf);
void tt_hs_pw_grad_w_f32(int32_t P, int32_t k, const float *dh, const float *xf, float *dw);

#ifdef __cplusplus
}
#endif

#endif /* TT_HIDDEN_STREAM_H */
