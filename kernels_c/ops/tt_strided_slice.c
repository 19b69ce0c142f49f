/* STRIDED_SLICE (reference_ops::StridedSlice, executor._strided_slice) and its backward (grad_ops.strided_slice_grad),
 * on the rank-4 view codegen resolves: per axis a start and a (possibly negative) stride, and the output extent.
 * Shrunk axes have extent 1 (the output's element order is the same with or without them). int8 keeps the input's
 * quantization, so the int8 slice is a copy like the float one. y must not overlap x (a reversed axis would read
 * what it already overwrote). */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* STRIDED_SLICE on a rank-4 view: output element (i0..i3) reads input index start[d] + i_d * stride[d] per axis
 * (stride may be negative); out_shape holds the extents (a shrunk axis: 1). int8 keeps the input's parameters. */
typedef struct {
    int32_t in_shape[4];
    int32_t out_shape[4];
    int32_t start[4];
    int32_t stride[4];
} tt_strided_slice_params;
void tt_strided_slice_s8(const tt_strided_slice_params *p, const int8_t *x, int8_t *y);
void tt_strided_slice_f32(const tt_strided_slice_params *p, const float *x, float *y);
/* dx (x's rank-4 shape p->in_shape) = 0 except the sliced positions, which get dy in order. */
void tt_strided_slice_grad_f32(const tt_strided_slice_params *p, const float *dy, float *dx);
#endif /* TT_INTERFACE */

#define TT_SS_IN(p, i0, i1, i2, i3) \
    ((((p)->start[0] + (i0) * (p)->stride[0]) * (p)->in_shape[1] + (p)->start[1] + (i1) * (p)->stride[1]) * \
         (p)->in_shape[2] * (p)->in_shape[3] + \
     ((p)->start[2] + (i2) * (p)->stride[2]) * (p)->in_shape[3] + (p)->start[3] + (i3) * (p)->stride[3])

/* The statement after it runs once per output element (i0, i1, i2, i3), in row-major order. */
#define TT_SS_FOR_EACH_OUTPUT(p, i0, i1, i2, i3) \
    for ((i0) = 0; (i0) < (p)->out_shape[0]; ++(i0)) \
        for ((i1) = 0; (i1) < (p)->out_shape[1]; ++(i1)) \
            for ((i2) = 0; (i2) < (p)->out_shape[2]; ++(i2)) \
                for ((i3) = 0; (i3) < (p)->out_shape[3]; ++(i3))

void tt_strided_slice_s8(const tt_strided_slice_params *p, const int8_t *x, int8_t *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    TT_SS_FOR_EACH_OUTPUT(p, i0, i1, i2, i3) {
        y[k++] = x[TT_SS_IN(p, i0, i1, i2, i3)];
    }
}

void tt_strided_slice_f32(const tt_strided_slice_params *p, const float *x, float *y)
{
    int32_t i0, i1, i2, i3, k = 0;
    TT_SS_FOR_EACH_OUTPUT(p, i0, i1, i2, i3) {
        y[k++] = x[TT_SS_IN(p, i0, i1, i2, i3)];
    }
}

/* dx = 0 except at the sliced positions, which get dy (distinct per element: a scatter without collisions). */
void tt_strided_slice_grad_f32(const tt_strided_slice_params *p, const float *dy, float *dx)
{
    const int32_t n = p->in_shape[0] * p->in_shape[1] * p->in_shape[2] * p->in_shape[3];
    int32_t i0, i1, i2, i3, k = 0;
    for (i0 = 0; i0 < n; ++i0) {
        dx[i0] = 0.0f;
    }
    TT_SS_FOR_EACH_OUTPUT(p, i0, i1, i2, i3) {
        dx[TT_SS_IN(p, i0, i1, i2, i3)] = dy[k++];
    }
}
