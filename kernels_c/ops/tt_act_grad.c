/* act_grad: the straight-through mask of a fused activation, from the forward output, float32. */
#include "tt_kernels.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_float_mve.h" /* target.kernels: mve - integer compares and VPSEL, the same bits */
#endif

#ifdef TT_INTERFACE
/* Straight-through mask from the forward *output* y: relu y>0, relu6 0<y<6, relu_n1_to_1 -1<y<1 (dx may be dy). */
void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx);
#endif /* TT_INTERFACE */

void tt_act_grad_f32(int32_t n, tt_act act, const float *dy, const float *y, float *dx)
{
    int32_t i;
#ifdef TT_FLOAT_MVE
    tt_act_grad_f32_mve(n, (int)act, dy, y, dx);
    return;
#endif
    for (i = 0; i < n; ++i) {
        int keep;
        switch (act) {
        case TT_ACT_RELU:
            keep = y[i] > 0.0f;
            break;
        case TT_ACT_RELU6:
            keep = y[i] > 0.0f && y[i] < 6.0f;
            break;
        case TT_ACT_RELU_N1_TO_1:
            keep = y[i] > -1.0f && y[i] < 1.0f;
            break;
        default:
            keep = 1;
            break;
        }
        dx[i] = keep ? dy[i] : 0.0f;
    }
}
