/* sub: int8 and float32 with broadcasting (sub_grad is add_grad's tt_unbroadcast_f32 with sign -1). */
#include "tt_broadcast.h"

#ifdef TT_INTERFACE
/* SUB: y = a - b, int8 (ADD's general path on the rescaled operands, tt_add_params_s8) and float32, broadcast. */
void tt_sub_s8(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y);
void tt_sub_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y);
#endif /* TT_INTERFACE */

void tt_sub_s8(const tt_add_params_s8 *p, const tt_broadcast *bc, const int8_t *a, const int8_t *b, int8_t *y)
{
    tt_add_sub_s8(p, bc, -1, a, b, y);
}

void tt_sub_f32(const tt_broadcast *bc, float act_min, float act_max, const float *a, const float *b, float *y)
{
    tt_binary_f32(1, bc, act_min, act_max, a, b, y);
}
