/* reshape and reshape_grad: a copy where the plan did not put input and output in one place (also
 * codegen's copy_call for any other copy). */
#include "tt_kernels.h"

#include <string.h>

#ifdef TT_INTERFACE
/* RESHAPE: a no-op when codegen aliases input and output; otherwise a copy (memmove: may overlap). */
void tt_copy_s8(int32_t n, const int8_t *x, int8_t *y);
void tt_copy_f32(int32_t n, const float *x, float *y);
#endif /* TT_INTERFACE */

void tt_copy_s8(int32_t n, const int8_t *x, int8_t *y)
{
    if (x != y) {
        memmove(y, x, (size_t)n);
    }
}

void tt_copy_f32(int32_t n, const float *x, float *y)
{
    if (x != y) {
        memmove(y, x, (size_t)n * sizeof(float));
    }
}
