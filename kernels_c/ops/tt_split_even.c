/* split: SPLIT / SPLIT_V (reference_ops::Split) for int8 and float32, and split_grad, the outputs' gradients
 * concatenated back (stages/ops/split.py).
 *
 * The input is `outer` runs of sum(inner) contiguous elements: part j takes inner[j] of each run (inner[j] = its
 * extent along the axis times the elements after the axis; outer = the elements before it). */
#include <string.h>

#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* SPLIT / SPLIT_V (ops/tt_split_even.c; stages/ops/split.py): x is `outer` runs of sum(inner) elements, part j gets
 * inner[j] of each run; grad: dx = the parts' gradients concatenated back, zeros for a NULL part. */
void tt_split_s8(int32_t parts, const int32_t *inner, int32_t outer, const int8_t *x, int8_t *const *y);
void tt_split_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *x, float *const *y);
void tt_split_grad_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *const *dy, float *dx);
#endif /* TT_INTERFACE */

static void tt_split_move(int32_t parts, const int32_t *inner, int32_t outer, size_t elem, const uint8_t *x,
                          uint8_t *const *y)
{
    int32_t o, j;
    for (o = 0; o < outer; ++o) {
        for (j = 0; j < parts; ++j) {
            const size_t run = (size_t)inner[j] * elem;
            memcpy(y[j] + (size_t)o * run, x, run);
            x += run;
        }
    }
}

void tt_split_s8(int32_t parts, const int32_t *inner, int32_t outer, const int8_t *x, int8_t *const *y)
{
    tt_split_move(parts, inner, outer, 1, (const uint8_t *)x, (uint8_t *const *)y);
}

void tt_split_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *x, float *const *y)
{
    tt_split_move(parts, inner, outer, sizeof(float), (const uint8_t *)x, (uint8_t *const *)y);
}

void tt_split_grad_f32(int32_t parts, const int32_t *inner, int32_t outer, const float *const *dy, float *dx)
{
    int32_t o, j;
    for (o = 0; o < outer; ++o) {
        for (j = 0; j < parts; ++j) {
            if (dy[j] != 0) {
                memcpy(dx, dy[j] + (size_t)o * (size_t)inner[j], (size_t)inner[j] * sizeof(float));
            } else {
                memset(dx, 0, (size_t)inner[j] * sizeof(float));
            }
            dx += inner[j];
        }
    }
}
