/* space_to_depth: SPACE_TO_DEPTH (NHWC, reference_ops::SpaceToDepth) for int8 and float32
 * (stages/ops/space_to_depth.py). Its backward, depth_to_space of dy, is tt_depth_to_space_f32.
 *
 *   y[n, h, w, (i*k + j)*c + d] = x[n, h*k + i, w*k + j, d],  k = block
 *
 * Row i of an output pixel's k x k block is k input pixels side by side, k*c contiguous elements, and lands as one
 * contiguous run in y: one memcpy of that many bytes whatever the element type, y written in order. */
#include <string.h>

#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* SPACE_TO_DEPTH (ops/tt_space_to_depth.c; stages/ops/space_to_depth.py), NHWC, dims of the input x
 * [batches, in_h, in_w, in_c], block k dividing in_h and in_w: y [batches, in_h/k, in_w/k, in_c*k^2]. */
void tt_space_to_depth_s8(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                          const int8_t *x, int8_t *y);
void tt_space_to_depth_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                           const float *x, float *y);
#endif /* TT_INTERFACE */

static void tt_s2d_move(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t k, size_t elem,
                        const uint8_t *x, uint8_t *y)
{
    const size_t run = (size_t)k * (size_t)in_c * elem;        /* one row of a block */
    const size_t row = (size_t)in_w * (size_t)in_c * elem;     /* one input row */
    int32_t n, h, w, i;
    for (n = 0; n < batches; ++n) {
        for (h = 0; h < in_h; h += k) {
            for (w = 0; w < in_w; w += k) {
                const uint8_t *src = x + (((size_t)n * in_h + h) * in_w + w) * in_c * elem;
                for (i = 0; i < k; ++i) {
                    memcpy(y, src + (size_t)i * row, run);
                    y += run;
                }
            }
        }
    }
}

void tt_space_to_depth_s8(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                          const int8_t *x, int8_t *y)
{
    tt_s2d_move(batches, in_h, in_w, in_c, block, 1, (const uint8_t *)x, (uint8_t *)y);
}

void tt_space_to_depth_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                           const float *x, float *y)
{
    tt_s2d_move(batches, in_h, in_w, in_c, block, sizeof(float), (const uint8_t *)x, (uint8_t *)y);
}
