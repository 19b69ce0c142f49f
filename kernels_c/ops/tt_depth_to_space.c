/* depth_to_space: DEPTH_TO_SPACE (NHWC, TFLite's DCR order, reference_ops::DepthToSpace) for int8 and float32,
 * and its backward, space_to_depth of the gradient (stages/ops/depth_to_space.py).
 *
 *   y[n, h*k + i, w*k + j, c] = x[n, h, w, (i*k + j)*oc + c],  oc = in_c / (k*k)
 *
 * For each input pixel and each of its k*k groups, one run of oc contiguous elements moves: a memcpy of that
 * many bytes whatever the element type. The backward is space_to_depth's kernel (ops/tt_space_to_depth.c). */
#include <string.h>

#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* DEPTH_TO_SPACE (ops/tt_depth_to_space.c; stages/ops/depth_to_space.py), NHWC, DCR order, dims of the input x
 * [batches, in_h, in_w, in_c], block k: y [batches, in_h*k, in_w*k, in_c/k^2]. Its gradient is space_to_depth's
 * forward kernel on dy (codegen calls tt_space_to_depth_f32). */
void tt_depth_to_space_s8(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                          const int8_t *x, int8_t *y);
void tt_depth_to_space_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                           const float *x, float *y);
#endif /* TT_INTERFACE */

/* x [n, h, w, c] -> y [n, h*k, w*k, c/k^2]. */
static void tt_d2s_move(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t k, size_t elem,
                        const uint8_t *src, uint8_t *dst)
{
    const int32_t oc = in_c / (k * k);
    const size_t run = (size_t)oc * elem;
    int32_t n, h, w, i, j;
    for (n = 0; n < batches; ++n) {
        for (h = 0; h < in_h; ++h) {
            for (i = 0; i < k; ++i) {
                for (w = 0; w < in_w; ++w) {
                    for (j = 0; j < k; ++j) {
                        const size_t depth = ((((size_t)n * in_h + h) * in_w + w) * in_c + (size_t)(i * k + j) * oc)
                                             * elem;
                        const size_t space = ((((size_t)n * in_h + h) * k + i) * in_w * k + (size_t)w * k + j) * run;
                        memcpy(dst + space, src + depth, run);
                    }
                }
            }
        }
    }
}

void tt_depth_to_space_s8(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                          const int8_t *x, int8_t *y)
{
    tt_d2s_move(batches, in_h, in_w, in_c, block, 1, (const uint8_t *)x, (uint8_t *)y);
}

void tt_depth_to_space_f32(int32_t batches, int32_t in_h, int32_t in_w, int32_t in_c, int32_t block,
                           const float *x, float *y)
{
    tt_d2s_move(batches, in_h, in_w, in_c, block, sizeof(float), (const uint8_t *)x, (uint8_t *)y);
}
