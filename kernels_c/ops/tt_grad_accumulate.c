/* grad_accumulate: the gradient of a tensor several ops read (the sum of their shares), and acc += g. */
#include "tt_kernels.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* acc += g (gradient of a tensor read by several ops, in reader order). */
void tt_accumulate_f32(int32_t n, float *acc, const float *g);
/* fp16-mixed (issue 13): grad_accumulate's sum (tt_sum_f32: y = x0 + x1 + ... in reader order, in fp32) with each
 * share and the result fp32 or fp16 (xf[j] / xh[j] the share's pointer of its type, the other 0; yf / yh likewise):
 * the shares widened where they are read (exact), the sum rounded once as it is stored, so the bits of tt_sum_f32
 * between tt_cast_f16_f32 and tt_round_f16. y may start where a share does (memplan's in-place sharing): an fp32 y
 * with an fp16 share is written from the end, any other pair behind what it reads. */
void tt_sum_f16(int32_t n_inputs, const float *const *xf, const uint16_t *const *xh, int32_t n, float *yf,
                uint16_t *yh);
#endif /* TT_INTERFACE */

void tt_accumulate_f32(int32_t n, float *acc, const float *g)
{
    int32_t i;
    for (i = 0; i < n; ++i) {
        acc[i] += g[i];
    }
}

static inline float tt_share(const float *const *xf, const uint16_t *const *xh, int32_t j, int32_t i)
{
    return xh[j] != 0 ? tt_f16_read(xh[j][i]) : xf[j][i];
}

void tt_sum_f16(int32_t n_inputs, const float *const *xf, const uint16_t *const *xh, int32_t n, float *yf,
                uint16_t *yh)
{
    /* an fp32 y over an fp16 share covers its elements 2i and 2i + 1, which a forward loop has not read yet */
    int32_t back = 0, j, k;
    if (yf != 0) {
        for (j = 0; j < n_inputs; ++j) {
            back |= xh[j] != 0;
        }
    }
    for (k = 0; k < n; ++k) {
        const int32_t i = back ? n - 1 - k : k;
        float s = tt_share(xf, xh, 0, i);
        for (j = 1; j < n_inputs; ++j) {
            s += tt_share(xf, xh, j, i);
        }
        if (yh != 0) {
            yh[i] = tt_f16_narrow(s);
        } else {
            yf[i] = s;
        }
    }
}
