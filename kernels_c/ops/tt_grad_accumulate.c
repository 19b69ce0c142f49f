/* grad_accumulate: acc += g, the gradient of a tensor several ops read. */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* acc += g (gradient of a tensor read by several ops, in reader order). */
void tt_accumulate_f32(int32_t n, float *acc, const float *g);
#endif /* TT_INTERFACE */

void tt_accumulate_f32(int32_t n, float *acc, const float *g)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        acc[i] += g[i];
    }
}
