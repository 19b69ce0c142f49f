/* selftest.c: proof program for a board's support code (not part of any firmware unless named).
 *
 * Streams `data.ttds` (float32 samples of rank 1, at most 64 values) through semihosting (or
 * stdio on host), computes float results that depend on every rounding (a running sum, dot
 * products with fixed pseudo-random weights, a few epochs of SGD on a linear model), and writes
 *   results.json  the figures, floats as their bit patterns, identical on every board
 *   dots.bin      each record's dot product as raw float32, to exercise binary output
 * The instruction count and stack high-water mark come out on the "@tt exit" line and in
 * metrics.json (those differ between boards by nature).
 */
#include <stdint.h>
#include <string.h>

#include "tt_platform.h"
#include "tt_ttds.h"

#define MAX_DIM 64
#define MAX_RECORDS 256
#define MAX_CLASSES 16
#define EPOCHS 3

static float weights[MAX_DIM];
static float model[MAX_DIM];
static float dots[MAX_RECORDS];
static char json[2048];

/* A 32-bit LCG: exact integer arithmetic, then scaled by a power of two, so the weights are
 * the same floats everywhere. */
static uint32_t lcg_state = 12345u;
static float lcg_uniform(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)(int32_t)(lcg_state >> 8) / 16777216.0f - 0.5f;
}

static size_t append(size_t at, const char *text) {
    size_t n = strlen(text);
    if (at + n + 1 > sizeof json) tt_fail("results.json buffer too small");
    memcpy(json + at, text, n + 1);
    return at + n;
}

int tt_main(void) {
    tt_ttds ds;
    int rc = tt_ttds_open(&ds, "data.ttds");
    if (rc != 0) tt_fail(tt_ttds_error(rc));
    if (ds.dtype != TT_TTDS_FLOAT32 || ds.rank != 1 || ds.dims[0] > MAX_DIM || ds.count > MAX_RECORDS)
        tt_fail("selftest wants float32 samples [N<=256, D<=64]");
    uint32_t dim = ds.dims[0];
    for (uint32_t i = 0; i < dim; i++) weights[i] = lcg_uniform();

    uint32_t classes[MAX_CLASSES] = {0};
    float sample[MAX_DIM];
    float sum = 0.0f;
    int32_t label;
    uint32_t n = 0;
    uint64_t t0 = tt_instructions();
    while ((rc = tt_ttds_next(&ds, &label, sample)) == 1) {
        float dot = 0.0f;
        for (uint32_t i = 0; i < dim; i++) {
            sum += sample[i];
            dot += sample[i] * weights[i]; /* two roundings each: -ffp-contract=off keeps it so */
        }
        dots[n++] = dot;
        if (label >= 0 && label < MAX_CLASSES) classes[label]++;
        if (n % 64 == 0) tt_progress(n, ds.count, "records");
    }
    if (rc < 0) tt_fail(tt_ttds_error(rc));
    uint64_t t_pass = tt_instructions() - t0;

    /* SGD on a linear model, target = label: streams the file again each epoch (seek). */
    const float lr = 0.01f;
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        if (tt_ttds_seek(&ds, 0) != 0) tt_fail("seek failed");
        while ((rc = tt_ttds_next(&ds, &label, sample)) == 1) {
            float y = 0.0f;
            for (uint32_t i = 0; i < dim; i++) y += model[i] * sample[i];
            float g = lr * (y - (float)label);
            for (uint32_t i = 0; i < dim; i++) model[i] -= g * sample[i];
        }
        if (rc < 0) tt_fail(tt_ttds_error(rc));
    }
    tt_ttds_close(&ds);

    uint32_t hash = 2166136261u; /* FNV-1a over the dot products' bits */
    for (uint32_t r = 0; r < n; r++) {
        uint32_t b = tt_f32_bits(dots[r]);
        for (int k = 0; k < 4; k++) hash = (hash ^ ((b >> (8 * k)) & 0xFFu)) * 16777619u;
    }

    char item[96];
    size_t at = 0;
    tt_snprintf(item, sizeof item, "{\"records\": %lu, \"dim\": %lu, \"classes\": [", (unsigned long)n,
                (unsigned long)dim);
    at = append(at, item);
    for (int c = 0; c < MAX_CLASSES; c++) {
        tt_snprintf(item, sizeof item, "%s%lu", c ? ", " : "", (unsigned long)classes[c]);
        at = append(at, item);
    }
    tt_snprintf(item, sizeof item, "], \"sum_bits\": %lu, \"dots_fnv1a\": %lu, \"model_bits\": [",
                (unsigned long)tt_f32_bits(sum), (unsigned long)hash);
    at = append(at, item);
    for (uint32_t i = 0; i < dim; i++) {
        tt_snprintf(item, sizeof item, "%s%lu", i ? ", " : "", (unsigned long)tt_f32_bits(model[i]));
        at = append(at, item);
    }
    at = append(at, "]}\n");
    if (tt_write_file("results.json", json, at) != 0) tt_fail("cannot write results.json");
    if (tt_write_file("dots.bin", dots, n * sizeof dots[0]) != 0) tt_fail("cannot write dots.bin");

    tt_snprintf(json, sizeof json,
                "{\"board\": \"%s\", \"instructions_first_pass\": %llu, \"instructions\": %llu, "
                "\"have_instructions\": %d, \"stack_high_water\": %lu, \"stack_size\": %lu}\n",
                tt_board(), (unsigned long long)t_pass, (unsigned long long)tt_instructions(), tt_have_instructions(),
                (unsigned long)tt_stack_high_water(), (unsigned long)tt_stack_size());
    if (tt_write_file("metrics.json", json, strlen(json)) != 0) tt_fail("cannot write metrics.json");
    tt_log("selftest: %lu records, sum bits 0x%08lx, dots fnv1a 0x%08lx\n", (unsigned long)n,
           (unsigned long)tt_f32_bits(sum), (unsigned long)hash);
    return 0;
}
