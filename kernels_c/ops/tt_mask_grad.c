/* mask_grad: dz = dy where the forward output's 1-bit mask (tt_mask.h, tt_mask.c) is set. */
#include "tt_mask.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_float_mve.h" /* target.kernels: mve - VPSEL under the mask bits, the same bits */
#endif

void tt_mask_grad_f32(int32_t n, int32_t bit_offset, const uint8_t *mask, const float *dy, float *dz)
{
    int32_t i;
#ifdef TT_FLOAT_MVE
    tt_mask_grad_f32_mve(n, bit_offset, mask, dy, dz);
    return;
#endif
    for (i = 0; i < n; ++i) {
        const uint32_t b = (uint32_t)bit_offset + (uint32_t)i;
        dz[i] = ((mask[b >> 3] >> (b & 7u)) & 1u) ? dy[i] : 0.0f;
    }
}
