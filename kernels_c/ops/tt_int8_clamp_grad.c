/* int8_clamp_grad: the gradient through an int8 op's output clamp (masked where the int8 output sits at a
 * bound). */
#include "tt_train_ops.h"

void tt_int8_clamp_grad_f32(int32_t n, int32_t lo, int32_t hi, const float *dy, const int8_t *y, float *dx)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        dx[i] = ((int32_t)y[i] > lo && (int32_t)y[i] < hi) ? dy[i] : 0.0f;
    }
}
