/* Streamed op groups (stages/planning/streams.py): the C side of the three stream kinds.
 *
 * rows: a group of ops (a DAG with one sink: conv / depthwise / pooling, and ops that map row r to row r such as
 * element-wise arithmetic, activations and channel padding) producing the sink's output row by row. Op k computes
 * its next output row when a consumer needs it and keeps the last `window` rows of its output contiguous in a small
 * buffer (older rows slide out); inputs from outside the group are whole tensors, the sink writes its whole output
 * tensor. Each row is computed once, by a call of the unchanged kernel on the input rows it reads
 * (see tt_stream_rows). The windows are computed by stages/planning/streams.py, which simulates this same schedule. */
#ifndef TT_STREAM_H
#define TT_STREAM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TT_STREAM_MAX_OPS 32
#define TT_STREAM_MAX_IN 2
#define TT_ROW_SOURCE (-1)

typedef struct {
    int32_t in_h, out_h;       /* rows of the op's (streamed) inputs and of its output */
    int32_t stride, pad_top;   /* row stride and top padding of the op */
    int32_t span;              /* input rows one output row reads: (k_h - 1) * dilation_h + 1 */
    int32_t n_in;              /* streamed inputs (the others, e.g. weights or per-channel operands, are whole);
                                  TT_ROW_SOURCE: a fed input's source op, its rows from the tt_row_feed ctx */
    int32_t src[TT_STREAM_MAX_IN];     /* each streamed input: op of the group (>= 0) or outside tensor -1 - e */
    int32_t in_row[TT_STREAM_MAX_IN];  /* bytes of one row of each streamed input */
    int32_t out_row;           /* bytes of one output row */
    int32_t window;            /* rows kept of the output (every op but the sink) */
} tt_row_op;

/* Computes op k's next output row: xs[j] points at the first input row the call reads of streamed input j,
 * `in_rows` rows of each are valid, and the sub-problem's top padding is `pad_top` (so the kernel reads exactly the
 * rows the whole op would); y receives `out_rows` output rows. */
typedef void (*tt_row_fn)(void *ctx, int32_t k, const uint8_t *const *xs, int32_t in_rows, int32_t pad_top,
                          uint8_t *y, int32_t out_rows);

/* Runs ops[0..n) (ops[n - 1] is the sink) producing every row of the sink into y. ext[e] is outside tensor e
 * (whole); bufs[k] (k < n - 1) holds op k's window. */
void tt_stream_rows(const tt_row_op *ops, int32_t n, const uint8_t *const *ext, uint8_t *const *bufs, uint8_t *y,
                    tt_row_fn fn, void *ctx);

/* A fed input (stages/planning/streams.py fed_inputs): the model input is not whole in SRAM; the stream's source op
 * asks a row source for its rows, in order 0, 1, ... (each once), as the stream needs them. A source writes row
 * `row` (`bytes` bytes, C order) to dst and returns 0, or nonzero when it cannot (the feed then stops asking, keeps
 * the first failure in `status` and fills the rest with zeros). The same type as tt_model.h's tt_row_source_fn. */
typedef int (*tt_row_source)(void *ctx, uint32_t row, void *dst, uint32_t bytes);
typedef struct {
    tt_row_source fn;
    void *ctx;
    uint32_t next;    /* the row asked for next */
    int32_t status;   /* 0, or the first nonzero return of fn */
} tt_row_feed;

/* The next row of the feed into dst: what tt_stream_rows does for a source op (n_in TT_ROW_SOURCE; ctx is the feed,
 * which the callback then gets too). */
void tt_row_feed_next(tt_row_feed *f, uint8_t *dst, int32_t bytes);
/* A row source over a whole input in memory (ctx: its first byte): row r is bytes [r * bytes, (r + 1) * bytes). */
int tt_rows_from_memory(void *ctx, uint32_t row, void *dst, uint32_t bytes);

/* positions: the pieces one spatial position of a broadcast mean gradient needs. */
/* dx[i * c + ch] = dy[ch] / (float)count for i in [0, positions): tt_mean_hw_grad_f32 on `positions` of its
 * count outputs. */
void tt_mean_hw_grad_positions_f32(int32_t positions, int32_t count, int32_t c, const float *dy, float *dx);
/* db[c] += dy[r * channels + c] over the rows (tt_bias_grad_f32 without zeroing db first). */
void tt_bias_grad_acc_f32(int32_t rows, int32_t channels, const float *dy, float *db);

#ifdef __cplusplus
}
#endif

#endif /* TT_STREAM_H */
