"""The skeleton of the generated training program (stages/codegen.py writes the kernel calls): the arena and its
paint, weights.bin / results output, the sample and step loops, evaluation before and after, and `tt_main`
implementing the firmware protocol of stages/runtime_config.py."""

from __future__ import annotations

from tinytrain.stages.c_literals import CodegenError, flit, numel
from tinytrain.stages.runtime_config import PROTOCOL

# The arena is painted with this 32-bit word before the run and scanned by word afterwards (tt_arena_used): as
# int8 bytes it reads -17, -66, -83, -34 and as a float -6.3e18, so data that happens to equal it is very unlikely
# (a one-byte paint was: an int8 activation of -91 is common).
PAINT = 0xDEADBEEF


def program(gen, fwd_lines: list[str], sample_lines: list[str], step_lines: list[str], x_name: str,
             lab_name: str, head: str, loss: str, batch_size: int, trained: list[dict], prng_inits: list[str],
             stack_bytes: int, n_prof: int = 0, regression: bool = False) -> str:
    g = gen.g
    x_t = g.tensors[x_name]
    head_t = g.tensors[head]
    x_bytes = x_t.nbytes
    n_classes = head_t.shape[-1]
    argmax = "tt_argmax_s8" if head_t.dtype == "int8" else "tt_argmax_f32"
    ttds_dtype = {"int8": "TT_TTDS_INT8", "float32": "TT_TTDS_FLOAT32"}.get(x_t.dtype)
    if ttds_dtype is None:
        raise CodegenError(f"model input of dtype {x_t.dtype}")
    wb_lines = []
    for t in trained:
        loc = gen.loc(t["name"])
        if t["name"] in gen.split:  # the merged tensor: trained slice + frozen channels from flash
            whole, part, n = gen.weight_args(t["name"])
            cols = int(t["shape"][-1])
            wb_lines.append(f"    tt_write_split(fd, {whole}, {part}, {t['nbytes'] // cols}u, {cols}u, {n}u);")
            continue
        wb_lines.append(f"    if (tt_write(fd, {loc}, {t['nbytes']}) != 0) {{ tt_fail(\"cannot write weights.bin\"); }}")
    write_split = """
/* weights.bin holds whole tensors: a split weight is written row by row, channels [0, n) from its trained slice and
 * the rest from the flash original, through a small buffer (few semihosting calls, little stack). */
static void tt_write_split(int fd, const int8_t *whole, const int8_t *part, uint32_t rows, uint32_t cols, uint32_t n)
{
    static int8_t buf[256];
    uint32_t r, used = 0, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < cols; ++c) {
            buf[used++] = c < n ? part[r * n + c] : whole[r * cols + c];
            if (used == sizeof buf) {
                if (tt_write(fd, buf, used) != 0) {
                    tt_fail("cannot write weights.bin");
                }
                used = 0;
            }
        }
    }
    if (used != 0 && tt_write(fd, buf, used) != 0) {
        tt_fail("cannot write weights.bin");
    }
}
""" if gen.split else ""
    arena_end = max((int(b["offset"]) + int(b["size"]) for b in gen.plan["buffers"] if int(b["size"])), default=0)
    ind = lambda ls, n: "\n".join(" " * n + ln for ln in ls)  # noqa: E731
    if regression:
        eval_fn, eval_fmt, read_record, targets_check = _regression_parts(gen, x_name, lab_name, head, ttds_dtype)
    else:
        eval_fn = f"""static void tt_evaluate(uint32_t *correct, uint32_t *total)
{{
    tt_ttds s;
    int32_t label;
    int rc = tt_ttds_open(&s, "test.ttds");
    *correct = 0;
    *total = 0;
    if (rc != 0) {{
        tt_fail("cannot open test.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("test.ttds: samples do not match the model input");
    }}
    while ((rc = tt_ttds_next(&s, &label, {gen.loc(x_name)})) == 1) {{
        tt_forward();
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
        {{ /* the forward output of every test sample, for bit-exact checks against the executor */
            const int dfd = tt_open("eval_out.bin", TT_APPEND);
            if (dfd < 0 || tt_write(dfd, {gen.loc(head)}, {head_t.nbytes}) != 0) {{
                tt_fail("cannot write eval_out.bin");
            }}
            tt_close(dfd);
        }}
#endif
        *correct += ({argmax}(TT_NUM_CLASSES, {gen.loc(head)}) == label) ? 1u : 0u;
        *total += 1;
    }}
    if (rc < 0) {{
        tt_fail("test.ttds: read error");
    }}
    tt_ttds_close(&s);
}}

"""
        eval_fmt = ('"{\\"protocol\\": ' + str(PROTOCOL) + ', \\"acc_before\\": {\\"correct\\": %lu, \\"total\\": %lu}, "\n'
                    '        "\\"acc_after\\": {\\"correct\\": %lu, \\"total\\": %lu}, \\"steps\\": %lu, \\"samples\\": %lu, "')
        read_record = f"""                rc = tt_ttds_next(&s, &label, {gen.loc(x_name)});
                if (rc != 1) {{
                    tt_fail("train.ttds: read error");
                }}
                if (label < 0 || label >= TT_NUM_CLASSES) {{
                    tt_fail("train.ttds: label out of range");
                }}
                {gen.loc(lab_name)}[0] = label;
"""
        targets_check = ""
    return f"""/* Generated by tinytrain codegen (stages/codegen.py): the training program of one model.
 * Protocol {PROTOCOL}: see stages/runtime_config.py. Do not edit: regenerate. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tt_kernels.h"
#include "tt_train_ops.h"
#include "tt_platform.h"
#include "tt_ttds.h"

#define TT_ARENA_SIZE {max(gen.arena, 16)}u
#define TT_ARENA_PLANNED {gen.arena}u
/* The planned end of the last buffer (max offset + size), rounded up to the 4-byte word the arena is scanned by:
 * what tt_arena_used() must find (the arena's own size adds the 16-byte alignment padding nobody writes). */
#define TT_ARENA_END {-(-arena_end // 4) * 4}u
#define TT_BATCH_SIZE {batch_size}u
#define TT_NUM_CLASSES {n_classes}
#define TT_INPUT_BYTES {x_bytes}u
#define TT_PAINT 0x{PAINT:08X}u

static uint8_t tt_arena[TT_ARENA_SIZE] __attribute__((aligned(16)));

/* runtime.bin, parsed field by field (little-endian) so no struct padding or byte order leaks in. */
typedef struct {{
    float learning_rate;
    uint32_t epochs, seed, batch_size;
    float momentum, beta1, beta2, eps, alpha, weight_decay;
    uint32_t max_train_samples, flags;
}} tt_runtime_config;

static tt_runtime_config tt_cfg;

/* Per-op instruction profile of the training step (-DTT_PROFILE=1 only; bench/profile_mbv2.py): op k's
 * instructions and calls, written to profile.bin (little-endian uint64 instructions[N], then uint32 calls[N]). */
#if defined(TT_PROFILE) && TT_PROFILE
#define TT_PROF_N {max(n_prof, 1)}
static uint64_t tt_prof_insns[TT_PROF_N];
static uint32_t tt_prof_calls[TT_PROF_N];
static uint64_t tt_prof_t0;
#define TT_PROF_BEGIN() (tt_prof_t0 = tt_instructions())
#define TT_PROF_END(k) (tt_prof_insns[(k)] += tt_instructions() - tt_prof_t0, ++tt_prof_calls[(k)])
static void tt_prof_write(void)
{{
    const int fd = tt_open("profile.bin", TT_WRITE);
    if (fd < 0 || tt_write(fd, tt_prof_insns, sizeof tt_prof_insns) != 0 ||
        tt_write(fd, tt_prof_calls, sizeof tt_prof_calls) != 0) {{
        tt_fail("cannot write profile.bin");
    }}
    tt_close(fd);
}}
#else
#define TT_PROF_BEGIN() ((void)0)
#define TT_PROF_END(k) ((void)0)
#endif

{chr(10).join(gen.globals)}
{write_split}
static uint32_t tt_le32(const uint8_t *p)
{{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}}

static float tt_lef32(const uint8_t *p)
{{
    const uint32_t u = tt_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}}

static void tt_read_config(void)
{{
    uint8_t b[64];
    const long n = tt_read_file("runtime.bin", b, sizeof b);
    if (n != 56) {{
        tt_fail("runtime.bin missing or not 56 bytes");
    }}
    if (b[0] != 'T' || b[1] != 'T' || b[2] != 'R' || b[3] != 'C' || tt_le32(b + 4) != 1u) {{
        tt_fail("runtime.bin: bad magic or version");
    }}
    tt_cfg.learning_rate = tt_lef32(b + 8);
    tt_cfg.epochs = tt_le32(b + 12);
    tt_cfg.seed = tt_le32(b + 16);
    tt_cfg.batch_size = tt_le32(b + 20);
    tt_cfg.momentum = tt_lef32(b + 24);
    tt_cfg.beta1 = tt_lef32(b + 28);
    tt_cfg.beta2 = tt_lef32(b + 32);
    tt_cfg.eps = tt_lef32(b + 36);
    tt_cfg.alpha = tt_lef32(b + 40);
    tt_cfg.weight_decay = tt_lef32(b + 44);
    tt_cfg.max_train_samples = tt_le32(b + 48);
    tt_cfg.flags = tt_le32(b + 52);
    if (tt_cfg.batch_size != TT_BATCH_SIZE) {{
        tt_fail("runtime.bin: batch_size differs from the compiled batch size");
    }}
}}

static void tt_init_state(void)
{{
{ind(gen.init_lines, 4)}
{ind(prng_inits, 4)}
}}

/* Forward only (evaluation): the schedule's forward ops in its order. */
static void tt_forward(void)
{{
{ind(fwd_lines, 4)}
}}

/* One sample: forward, loss, backward{', accumulation' if batch_size > 1 else ', in-place updates'}. */
static void tt_sample_step(void)
{{
{ind(sample_lines, 4)}
}}

/* Once per batch: the updates (empty when they run in the sample step). */
static void tt_update_step(void)
{{
{ind(step_lines, 4) if step_lines else '    /* updates run inside the sample step (batch 1, in-place order) */'}
}}

static void tt_write_weights(const char *name)
{{
    const int fd = tt_open(name, TT_WRITE);
    if (fd < 0) {{
        tt_fail("cannot open weights file");
    }}
{chr(10).join(wb_lines)}
    tt_close(fd);
}}

{eval_fn}/* The arena is painted word by word before the run; the used size is the end of the last word that no longer
 * holds the paint (a byte-wise scan read data bytes equal to a one-byte paint as unused). */
static void tt_arena_paint(void)
{{
    const uint32_t p = TT_PAINT;
    uint32_t i;
    for (i = 0; i + 4u <= TT_ARENA_SIZE; i += 4u) {{
        memcpy(tt_arena + i, &p, 4);
    }}
}}

static uint32_t tt_arena_used(void)
{{
    uint32_t i = TT_ARENA_SIZE - TT_ARENA_SIZE % 4u;
    while (i > 0) {{
        uint32_t w;
        memcpy(&w, tt_arena + i - 4u, 4);
        if (w != TT_PAINT) {{
            break;
        }}
        i -= 4u;
    }}
    return i;
}}

static void tt_write_results(uint32_t cb, uint32_t tb, uint32_t ca, uint32_t ta, uint32_t steps,
                             uint32_t samples, uint64_t itotal, uint64_t imin, uint64_t imax, int nan)
{{
    static char buf[768];
    const uint64_t imean = steps ? itotal / steps : 0;
    const int n = tt_snprintf(buf, sizeof buf,
        {eval_fmt}
        "\\"instructions_total_train\\": %llu, \\"instructions_per_step_min\\": %llu, "
        "\\"instructions_per_step_max\\": %llu, \\"instructions_per_step_mean\\": %llu, "
        "\\"arena_bytes_planned\\": %lu, \\"arena_end_planned\\": %lu, \\"arena_bytes_used\\": %lu, "
        "\\"loss_nan\\": %s}}\\n",
        (unsigned long)cb, (unsigned long)tb, (unsigned long)ca, (unsigned long)ta, (unsigned long)steps,
        (unsigned long)samples, (unsigned long long)itotal, (unsigned long long)imin, (unsigned long long)imax,
        (unsigned long long)imean, (unsigned long)TT_ARENA_PLANNED, (unsigned long)TT_ARENA_END,
        (unsigned long)tt_arena_used(),
        nan ? "true" : "false");
    if (n <= 0 || tt_write_file("results.json", buf, (size_t)n) != 0) {{
        tt_fail("cannot write results.json");
    }}
}}

int tt_main(void)
{{
    uint32_t cb = 0, tb = 0, ca = 0, ta = 0, steps = 0, samples = 0, epoch, used, i;
    uint64_t itotal = 0, imin = 0, imax = 0;
    int32_t label;
    int lfd, rc;
    tt_ttds s;
    tt_read_config();
    tt_arena_paint();
    tt_init_state();
    if (tt_cfg.flags & 1u) {{
        tt_evaluate(&cb, &tb);
    }}
    if (tt_ttds_open(&s, "train.ttds") != 0) {{
        tt_fail("cannot open train.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("train.ttds: samples do not match the model input");
    }}{targets_check}
    used = s.count;
    if (tt_cfg.max_train_samples != 0 && tt_cfg.max_train_samples < used) {{
        used = tt_cfg.max_train_samples;
    }}
    used -= used % TT_BATCH_SIZE; /* a last partial batch is dropped, as train_executor.train does */
    lfd = tt_open("losses.bin", TT_WRITE);
    if (lfd < 0) {{
        tt_fail("cannot open losses.bin");
    }}
    for (epoch = 0; epoch < tt_cfg.epochs; ++epoch) {{
        if (tt_ttds_seek(&s, 0) != 0) {{
            tt_fail("train.ttds: seek failed");
        }}
        for (i = 0; i < used; i += TT_BATCH_SIZE) {{
            const uint64_t t0 = tt_instructions();
            uint64_t dt;
            uint32_t j;
            for (j = 0; j < TT_BATCH_SIZE; ++j) {{
                float lv;
                uint8_t lb[4];
                uint32_t bits;
{read_record}                tt_sample_step();
                lv = {gen.loc(loss)}[0];
                bits = tt_f32_bits(lv);
                lb[0] = (uint8_t)bits; lb[1] = (uint8_t)(bits >> 8); lb[2] = (uint8_t)(bits >> 16); lb[3] = (uint8_t)(bits >> 24);
                if (tt_write(lfd, lb, 4) != 0) {{
                    tt_fail("cannot write losses.bin");
                }}
                ++samples;
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
                {{
                    char name[32];
                    tt_snprintf(name, sizeof name, "dump_%lu.bin", (unsigned long)samples);
                    tt_write_weights(name);
                }}
#endif
                if (!(lv == lv) || lv - lv != 0.0f) {{
                    static char msg[64];
                    tt_close(lfd);
                    tt_write_results(cb, tb, ca, ta, steps, samples, itotal, imin, imax, 1);
                    tt_snprintf(msg, sizeof msg, "loss is NaN at step %lu", (unsigned long)(samples - 1));
                    tt_fail(msg);
                }}
            }}
            tt_update_step();
            dt = tt_instructions() - t0;
            if (steps == 0 || dt < imin) {{
                imin = dt;
            }}
            if (dt > imax) {{
                imax = dt;
            }}
            itotal += dt;
            ++steps;
            tt_progress(steps, (used / TT_BATCH_SIZE) * tt_cfg.epochs, "training steps");
        }}
    }}
    tt_close(lfd);
    tt_ttds_close(&s);
    if (tt_cfg.flags & 2u) {{
        tt_evaluate(&ca, &ta);
    }}
    tt_write_weights("weights.bin");
#if defined(TT_PROFILE) && TT_PROFILE
    tt_prof_write();
#endif
    tt_write_results(cb, tb, ca, ta, steps, samples, itotal, imin, imax, 0);
    (void)tt_arena_used;
    return 0;
}}
"""


def _regression_parts(gen, x_name: str, lab_name: str, head: str, ttds_dtype: str) -> tuple[str, str, str, str]:
    """The MSE (regression) variants of the program's pieces: tt_evaluate computing the test split's mean squared
    error, results.json's mse fields, the train loop's record read (float targets straight into the target
    tensor) and the check that the streams carry as many targets as the model has outputs.

    tt_evaluate keeps the classification signature (a, total): `a` is the IEEE-754 bit pattern of the MSE (results.json
    holds integers only; stages/emulate_run.py decodes it). Per sample the error is that of tt_mse_f32 / grad_ops
    .mse_loss (mean over the sample's outputs); the MSE is their mean over the samples, summed in float in file order."""
    g = gen.g
    head_t, lab_t = g.tensors[head], g.tensors[lab_name]
    k = numel(head_t.shape)
    if numel(lab_t.shape) != k:
        raise CodegenError(f"mse target {lab_name!r} {lab_t.shape} does not match the prediction {head_t.shape}")
    if head_t.dtype == "int8":
        # The loss reads the dequantized head (autodiff's dequantize): evaluate on the same real values.
        s, z = gen.qp(head)
        pred_decl = "    static float pred[TT_NUM_TARGETS];\n"
        pred = (f"        tt_dequantize_s8_f32(TT_NUM_TARGETS, {flit(s)}, {z}, {gen.loc(head)}, pred);\n"
                "        y = pred;\n")
    elif head_t.dtype == "float32":
        pred_decl, pred = "", f"        y = {gen.loc(head)};\n"
    else:
        raise CodegenError(f"mse on a {head_t.dtype} prediction")
    eval_fn = f"""#define TT_NUM_TARGETS {k}u

static void tt_evaluate(uint32_t *mse_bits, uint32_t *total)
{{
    static float target[TT_NUM_TARGETS];
{pred_decl}    tt_ttds s;
    int32_t label;
    float sum = 0.0f;
    int rc = tt_ttds_open(&s, "test.ttds");
    *mse_bits = 0;
    *total = 0;
    if (rc != 0) {{
        tt_fail("cannot open test.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("test.ttds: samples do not match the model input");
    }}
    if (s.targets != TT_NUM_TARGETS) {{
        tt_fail("test.ttds: the records' float targets do not match the model's outputs");
    }}
    while ((rc = tt_ttds_next_target(&s, &label, target, {gen.loc(x_name)})) == 1) {{
        const float *y;
        float acc = 0.0f;
        uint32_t k;
        tt_forward();
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
        {{ /* the forward output of every test sample, for bit-exact checks against the executor */
            const int dfd = tt_open("eval_out.bin", TT_APPEND);
            if (dfd < 0 || tt_write(dfd, {gen.loc(head)}, {head_t.nbytes}) != 0) {{
                tt_fail("cannot write eval_out.bin");
            }}
            tt_close(dfd);
        }}
#endif
{pred}        for (k = 0; k < TT_NUM_TARGETS; ++k) {{
            const float d = y[k] - target[k];
            acc += d * d;
        }}
        sum += acc / (float)TT_NUM_TARGETS;
        *total += 1;
    }}
    if (rc < 0) {{
        tt_fail("test.ttds: read error");
    }}
    tt_ttds_close(&s);
    *mse_bits = tt_f32_bits(*total ? sum / (float)*total : 0.0f);
}}

"""
    eval_fmt = ('"{\\"protocol\\": ' + str(PROTOCOL) + ', \\"task\\": \\"regression\\", '
                '\\"mse_before_bits\\": %lu, \\"mse_before_total\\": %lu, "\n'
                '        "\\"mse_after_bits\\": %lu, \\"mse_after_total\\": %lu, \\"steps\\": %lu, '
                '\\"samples\\": %lu, "')
    read_record = f"""                rc = tt_ttds_next_target(&s, &label, {gen.loc(lab_name)}, {gen.loc(x_name)});
                if (rc != 1) {{
                    tt_fail("train.ttds: read error");
                }}
"""
    targets_check = """
    if (s.targets != TT_NUM_TARGETS) {
        tt_fail("train.ttds: the records' float targets do not match the model's outputs");
    }"""
    return eval_fn, eval_fmt, read_record, targets_check
