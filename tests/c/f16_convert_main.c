/* tests/test_fp16_kernels.py's harness: reads float32s from argv[1], writes their fp16 bits (tt_f32_to_f16) to
 * argv[2], and the float32 of every one of the 65536 fp16 patterns (tt_f16_to_f32) to argv[3]. */
#include <stdio.h>
#include <stdint.h>

#include "tt_f16.h"

int main(int argc, char **argv)
{
    FILE *in, *out, *all;
    float f;
    uint32_t i;
    if (argc != 4) {
        return 2;
    }
    in = fopen(argv[1], "rb");
    out = fopen(argv[2], "wb");
    all = fopen(argv[3], "wb");
    if (!in || !out || !all) {
        return 3;
    }
    while (fread(&f, 4, 1, in) == 1) {
        uint16_t h = tt_f32_to_f16(f);
        fwrite(&h, 2, 1, out);
    }
    for (i = 0; i < 65536u; ++i) {
        float g = tt_f16_to_f32((uint16_t)i);
        fwrite(&g, 4, 1, all);
    }
    fclose(in);
    fclose(out);
    fclose(all);
    return 0;
}
