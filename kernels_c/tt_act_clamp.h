/* The float32 activation clamp of the conv, depthwise, pooling, concatenation and clamp kernels: np.maximum then
 * np.minimum, as executor._float_act (a NaN stays NaN). */
#ifndef TT_ACT_CLAMP_H
#define TT_ACT_CLAMP_H

static inline float tt_act_clamp(float v, float lo, float hi)
{
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

#endif /* TT_ACT_CLAMP_H */
