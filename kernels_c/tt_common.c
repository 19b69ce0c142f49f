/* Shared geometry helpers. */
#include "tt_kernels.h"

/* kernels/padding.h ComputeOutSize + ComputePaddingWithOffset; mirrors executor._out_size_and_pad. */
void tt_out_size_and_pad(int32_t same, int32_t in_size, int32_t filter, int32_t stride, int32_t dilation,
                         int32_t *out_size, int32_t *pad_before)
{
    const int32_t eff = (filter - 1) * dilation + 1;
    const int32_t out = same ? (in_size + stride - 1) / stride : (in_size + stride - eff) / stride;
    int32_t total = (out - 1) * stride + eff - in_size;
    if (total < 0) {
        total = 0;
    }
    *out_size = out;
    *pad_before = total / 2;
}
