/* bias_grad: the bias gradient of a conv / depthwise / fully connected layer, float32. */
#include "tt_kernels.h"
#include "tt_f16.h"

#ifdef TT_INTERFACE
/* db[c] = sum over every row (batch and positions) of dy[row, c]. */
void tt_bias_grad_f32(int32_t rows, int32_t channels, const float *dy, float *db);
/* fp16-mixed (issue 13): tt_bias_grad_f32 and the positions stream's tt_bias_grad_acc_f32 (tt_stream.h) reading an
 * fp16 dy, widened where it is added: the bits of tt_cast_f16_f32 + the fp32 kernel without the fp32 copy. */
void tt_bias_grad_hy_f32(int32_t rows, int32_t channels, const uint16_t *dy, float *db);
void tt_bias_grad_acc_hy_f32(int32_t rows, int32_t channels, const uint16_t *dy, float *db);
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

/* db[c] (+)= sum over rows, in row order, of the widened dy[r, c]: tt_bias_grad_f32's and tt_bias_grad_acc_f32's
 * sums (the one-channel shortcut of tt_bias_grad_f32 adds in the same order). */
void tt_bias_grad_acc_hy_f32(int32_t rows, int32_t channels, const uint16_t *dy, float *db)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < channels; ++c) {
            db[c] += tt_f16_read(dy[r * channels + c]);
        }
    }
}

void tt_bias_grad_hy_f32(int32_t rows, int32_t channels, const uint16_t *dy, float *db)
{
    int32_t c;
    for (c = 0; c < channels; ++c) {
        db[c] = 0.0f;
    }
    tt_bias_grad_acc_hy_f32(rows, channels, dy, db);
}
