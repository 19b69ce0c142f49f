/* transpose: int8 and float32 (stages/ops/transpose.py); transpose_grad is the float kernel with the inverse
 * permutation. Pure data movement: int8 keeps the input's parameters. */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* TRANSPOSE of a rank-4 view (lower ranks: leading axes of extent 1 that stay in place): y's axis k is x's axis
 * perm[k], so y has shape in_shape[perm[0..3]] and y[i0,i1,i2,i3] = x at index j with j[perm[k]] = i_k (numpy's
 * x.transpose(perm)). y is written in row-major order and must not overlap x. */
void tt_transpose_s8(const int32_t in_shape[4], const int32_t perm[4], const int8_t *x, int8_t *y);
void tt_transpose_f32(const int32_t in_shape[4], const int32_t perm[4], const float *x, float *y);
#endif /* TT_INTERFACE */

/* The element strides of x along y's axes: walking y in row-major order steps x by these. */
static void tt_transpose_strides(const int32_t in_shape[4], const int32_t perm[4], int32_t out_shape[4],
                                 int32_t stride[4])
{
    int32_t in_stride[4];
    int32_t k;
    in_stride[3] = 1;
    for (k = 2; k >= 0; --k) {
        in_stride[k] = in_stride[k + 1] * in_shape[k + 1];
    }
    for (k = 0; k < 4; ++k) {
        out_shape[k] = in_shape[perm[k]];
        stride[k] = in_stride[perm[k]];
    }
}

/* One loop nest for both element types: the copy is the same, only the element's type differs. */
#define TT_TRANSPOSE_BODY                                                                                          \
    int32_t shape[4], stride[4];                                                                                   \
    int32_t i0, i1, i2, i3;                                                                                        \
    tt_transpose_strides(in_shape, perm, shape, stride);                                                           \
    for (i0 = 0; i0 < shape[0]; ++i0) {                                                                            \
        for (i1 = 0; i1 < shape[1]; ++i1) {                                                                        \
            for (i2 = 0; i2 < shape[2]; ++i2) {                                                                    \
                const int32_t base = i0 * stride[0] + i1 * stride[1] + i2 * stride[2];                             \
                for (i3 = 0; i3 < shape[3]; ++i3) {                                                                \
                    *y++ = x[base + i3 * stride[3]];                                                               \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

void tt_transpose_s8(const int32_t in_shape[4], const int32_t perm[4], const int8_t *x, int8_t *y)
{
    TT_TRANSPOSE_BODY
}

void tt_transpose_f32(const int32_t in_shape[4], const int32_t perm[4], const float *x, float *y)
{
    TT_TRANSPOSE_BODY
}
