/* Streamed op groups: see tt_stream.h and stages/planning/streams.py. */
#include <stdint.h>
#include <string.h>

#include "tt_stream.h"

/* Input rows [lo, hi] that output row r of op o reads (clipped to the input; hi < lo: none). */
static void tt_rows_read(const tt_row_op *o, int32_t r, int32_t *lo, int32_t *hi)
{
    const int32_t top = r * o->stride - o->pad_top;
    *lo = top > 0 ? top : 0;
    *hi = top + o->span - 1 < o->in_h - 1 ? top + o->span - 1 : o->in_h - 1;
}

/* Slides a window down by one row: n bytes from src to dst < src, in increasing order (the two overlap). On the
 * Thumb-2 cores, word-aligned windows move 32 bytes per pass with LDM / STM of four registers twice (6
 * instructions per 32 bytes: the library memmove took ~28); a pass writes below the bytes the next one reads, so
 * the overlap is safe. The tail, and any other target, through memmove. */
static void tt_slide(uint8_t *dst, const uint8_t *src, size_t n)
{
#if defined(__arm__) && defined(__GNUC__) && defined(__ARM_ARCH_ISA_THUMB) && __ARM_ARCH_ISA_THUMB >= 2
    if ((((uintptr_t)dst | (uintptr_t)src) & 3u) == 0 && n >= 32) {
        size_t passes = n >> 5;
        __asm__ volatile("1:\n\t"
                         "ldmia  %1!, {r3, r4, r5, r6}\n\t"
                         "stmia  %0!, {r3, r4, r5, r6}\n\t"
                         "ldmia  %1!, {r3, r4, r5, r6}\n\t"
                         "stmia  %0!, {r3, r4, r5, r6}\n\t"
                         "subs   %2, %2, #1\n\t"
                         "bne    1b\n\t"
                         : "+r"(dst), "+r"(src), "+r"(passes)
                         :
                         : "r3", "r4", "r5", "r6", "cc", "memory");
        n &= 31u;
    }
#endif
    if (n > 0) {
        memmove(dst, src, n);
    }
}

/* The next output row of op k, its inputs being ready: slide its window, call the kernel, count the row. */
static void tt_rows_compute(const tt_row_op *ops, int32_t n, const uint8_t *const *ext, uint8_t *const *bufs,
                            uint8_t *y, tt_row_fn fn, void *ctx, int32_t *made, int32_t k)
{
    const tt_row_op *o = &ops[k];
    const int32_t r = made[k];
    const uint8_t *xs[TT_STREAM_MAX_IN];
    int32_t lo, hi, j;
    uint8_t *yout;
    tt_rows_read(o, r, &lo, &hi);
    for (j = 0; j < o->n_in; ++j) {
        const int32_t p = o->src[j];
        if (p < 0) {
            xs[j] = ext[-1 - p] + lo * o->in_row[j];
        } else {
            /* the window of p holds its rows [made - window, made) */
            const int32_t first = made[p] - ops[p].window > 0 ? made[p] - ops[p].window : 0;
            xs[j] = bufs[p] + (lo - first) * o->in_row[j];
        }
    }
    if (k == n - 1) {
        yout = y + r * o->out_row;
    } else if (r >= o->window) {
        /* the oldest row slides out: no consumer still reads it (the window covers the furthest read) */
        tt_slide(bufs[k], bufs[k] + o->out_row, (size_t)(o->window - 1) * (size_t)o->out_row);
        yout = bufs[k] + (o->window - 1) * o->out_row;
    } else {
        yout = bufs[k] + r * o->out_row;
    }
    if (o->n_in == TT_ROW_SOURCE) {
        tt_row_feed_next((tt_row_feed *)ctx, yout, o->out_row); /* called directly: no callback calls back */
    } else {
        fn(ctx, k, xs, hi >= lo ? hi - lo + 1 : 0, o->pad_top - r * o->stride + lo, yout, 1);
    }
    made[k] = r + 1;
}

/* Pull schedule (stages/planning/streams.py simulates the same): to make op k's next row, its first streamed input whose
 * producer has not yet made the last row it reads is made first (a path of the DAG on an explicit stack, no
 * recursion); once all are there, k's row is computed. */
void tt_stream_rows(const tt_row_op *ops, int32_t n, const uint8_t *const *ext, uint8_t *const *bufs, uint8_t *y,
                    tt_row_fn fn, void *ctx)
{
    int32_t made[TT_STREAM_MAX_OPS];
    int32_t stack[TT_STREAM_MAX_OPS];
    int32_t k, depth;
    for (k = 0; k < TT_STREAM_MAX_OPS; ++k) {
        made[k] = 0;
    }
    while (made[n - 1] < ops[n - 1].out_h) {
        depth = 0;
        stack[depth++] = n - 1;
        while (depth > 0) {
            const tt_row_op *o;
            int32_t lo, hi, j, pending = -1;
            k = stack[depth - 1];
            o = &ops[k];
            tt_rows_read(o, made[k], &lo, &hi);
            for (j = 0; j < o->n_in && pending < 0; ++j) {
                if (o->src[j] >= 0 && made[o->src[j]] <= hi) {
                    pending = o->src[j];
                }
            }
            if (pending >= 0) {
                stack[depth++] = pending;
            } else {
                tt_rows_compute(ops, n, ext, bufs, y, fn, ctx, made, k);
                --depth;
            }
        }
    }
}

void tt_row_feed_next(tt_row_feed *f, uint8_t *dst, int32_t bytes)
{
    if (f->status == 0) {
        f->status = f->fn(f->ctx, f->next, dst, (uint32_t)bytes);
    }
    if (f->status != 0) {
        memset(dst, 0, (size_t)bytes);
    }
    ++f->next;
}

int tt_rows_from_memory(void *ctx, uint32_t row, void *dst, uint32_t bytes)
{
    memcpy(dst, (const uint8_t *)ctx + (size_t)row * bytes, bytes);
    return 0;
}

/* count a power of two: x / count == x * (1 / count) bit for bit (1 / count is exact and both round the same real
 * value once), a multiply instead of a division per element. */
void tt_mean_hw_grad_positions_f32(int32_t positions, int32_t count, int32_t c, const float *dy, float *dx)
{
    int32_t i, ch;
    const float n = (float)count;
    if (count > 0 && (count & (count - 1)) == 0 && count <= (1 << 24)) {
        const float r = 1.0f / n;
        for (i = 0; i < positions; ++i) {
            for (ch = 0; ch < c; ++ch) {
                dx[i * c + ch] = dy[ch] * r;
            }
        }
        return;
    }
    for (i = 0; i < positions; ++i) {
        for (ch = 0; ch < c; ++ch) {
            dx[i * c + ch] = dy[ch] / n;
        }
    }
}

void tt_bias_grad_acc_f32(int32_t rows, int32_t channels, const float *dy, float *db)
{
    int32_t r, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < channels; ++c) {
            db[c] += dy[r * channels + c];
        }
    }
}
