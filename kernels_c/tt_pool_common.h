/* The float activation clamp of the pooling kernels (ops/tt_average_pool2d.c, tt_max_pool2d.c). */
#ifndef TT_POOL_COMMON_H
#define TT_POOL_COMMON_H

#include "tt_kernels.h"

static inline float tt_clampf(float v, float lo, float hi)
{
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

#endif /* TT_POOL_COMMON_H */
