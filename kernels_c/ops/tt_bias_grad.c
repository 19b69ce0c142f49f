/* bias_grad: the bias gradient of a conv / depthwise / fully connected layer, float32. */
#include "tt_kernels.h"

#ifdef TT_INTERFACE
/* db[c] = sum over every row (batch and positions) of dy[row, c]. */
void tt_bias_grad_f32(int32_t rows, int32_t channels, const float *dy, float *db);
#endif /* TT_INTERFACE */

void tt_bias_grad_f32(int32_t rows, int32_t channels, const float *dy, float *db)
{
    int32_t r, c;
    if (channels == 1) {
        /* One channel (a hidden-channel stream calls this per channel): the same sum in the same order, in a
         * register, without the column loop GCC versions for vectors (on the host that set-up cost more than
         * the 16-64 additions). */
        float s = 0.0f;
        for (r = 0; r < rows; ++r) {
            s += dy[r];
        }
        db[0] = s;
        return;
    }
    for (c = 0; c < channels; ++c) {
        db[c] = 0.0f;
    }
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < channels; ++c) {
            db[c] += dy[r * channels + c];
        }
    }
}
