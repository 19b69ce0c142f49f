"""The model input from a row source (tt_model.h tt_row_source_fn, stages/c_emit/row_feed.py): a model whose stem
is a row stream is fed row by row (TT_INPUT_FED 1, the input never whole in the arena), another fills its input
buffer row by row (TT_INPUT_FED 0); either way the *_rows calls train and predict the same bits as the whole-input
calls, ask for the rows in order, and a failed row returns TT_ERR_IO with nothing trained."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.model.tflite_reader import read_model

FIX = Path(__file__).resolve().parent / "fixtures"
N = 6

HARNESS = r"""/* test harness: whole-input calls against row-source calls */
#include <stdint.h>
#include <string.h>
#include "tt_model.h"
#include "tt_platform.h"

#define N_TRAIN %(n)du
static uint8_t train[N_TRAIN * (TT_INPUT_BYTES + 4u)];
static uint8_t out[2u * 4096u + 64u];

typedef struct { const uint8_t *x; uint32_t next; int32_t fail_at; int32_t out_of_order; } src_t;

static int rows(void *ctx, uint32_t row, void *dst, uint32_t bytes)
{
    src_t *s = (src_t *)ctx;
    if (row != s->next++ || bytes != TT_INPUT_ROW_BYTES || row >= TT_INPUT_ROWS) {
        s->out_of_order = 1;
    }
    if ((int32_t)row == s->fail_at) {
        return -1;
    }
    memcpy(dst, s->x + row * TT_INPUT_ROW_BYTES, bytes);
    return 0;
}

static uint32_t weights(uint8_t *o)
{
    uint32_t k, at = 0;
    for (k = 0; k < TT_TRAINED_COUNT; ++k) {
        at += tt_trained_read(k, 0, o + at, tt_trained_size(k));
    }
    return at;
}

int tt_main(void)
{
    uint32_t i, wa, wb, wc;
    int32_t status[6] = {0, 0, 0, 0, 0, 0};
    uint8_t pa[TT_OUTPUT_BYTES], pb[TT_OUTPUT_BYTES];
    src_t s;
    if (tt_read_file("train.bin", train, sizeof train) != (long)sizeof train) {
        return 1;
    }
    tt_init();
    for (i = 0; i < N_TRAIN; ++i) {
        const uint8_t *rec = train + i * (TT_INPUT_BYTES + 4u);
        (void)tt_train_sample(rec, rec + TT_INPUT_BYTES);
    }
    tt_predict(train, pa);
    wa = weights(out);
    tt_init();
    for (i = 0; i < N_TRAIN; ++i) {
        const uint8_t *rec = train + i * (TT_INPUT_BYTES + 4u);
        s.x = rec; s.next = 0; s.fail_at = -1; s.out_of_order = 0;
        status[0] |= tt_train_sample_rows(rows, &s, rec + TT_INPUT_BYTES) < 0;
        status[1] |= s.out_of_order;
    }
    s.x = train; s.next = 0; s.fail_at = -1; s.out_of_order = 0;
    status[0] |= tt_predict_rows(rows, &s, pb) != TT_OK;
    status[1] |= s.out_of_order;
    wb = weights(out + 4096u);
    status[2] = wa == wb && memcmp(out, out + 4096u, wa) == 0 && memcmp(pa, pb, sizeof pa) == 0;
    /* a row that fails: TT_ERR_IO, nothing trained, no step counted */
    s.x = train; s.next = 0; s.fail_at = 1; s.out_of_order = 0;
    i = tt_steps_done();
    status[3] = tt_train_sample_rows(rows, &s, train + TT_INPUT_BYTES) == TT_ERR_IO;
    wc = weights(out + 4096u);
    status[4] = wc == wa && memcmp(out, out + 4096u, wa) == 0 && tt_steps_done() == i;
    s.x = train; s.next = 0; s.fail_at = 0; s.out_of_order = 0;
    tt_evaluate_begin();
    status[5] = tt_evaluate_add_rows(rows, &s, train + TT_INPUT_BYTES) == TT_ERR_IO;
    memcpy(out + 8192u, status, sizeof status);
    return tt_write_file("out.bin", out + 8192u, sizeof status) == 0 ? 0 : 3;
}
"""


@pytest.mark.slow   # ~13 s each (a host build of the kernels); the fed driver path runs in the default suite
# through tests/test_streams.py test_residual_prefix_streamed_c_is_bit_identical
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("name, fed", [("convnet_int8", True), ("dwsep_int8", False)])
def test_row_source_calls_are_the_whole_input_calls(name, fed, tmp_path):
    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware
    from tinytrain.stages.planning.train_plan import TrainPlan
    from tinytrain.stages.reorder import plan_schedules

    g = read_model(FIX / f"{name}.tflite")
    tg = build_training_graph(g, TrainPlan.bias_only(g, last=1), "cross_entropy",
                              OptimizerSpec("sgd", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    assert any(s.info.get("fed") for s in mp.streams) == fed
    prog = tmp_path / "prog"
    codegen.generate(tg, mp.order, mp.to_json(), prog)
    h = (prog / "tt_model.h").read_text()
    assert f"#define TT_INPUT_FED {int(fed)}" in h
    x_t = tg.tensors[next(t for t in tg.inputs if t != tg.meta["train"]["label_input"])]
    assert f"#define TT_INPUT_ROWS {x_t.shape[1]}u" in h
    buffer = int(h.split("#define TT_INPUT_BUFFER_BYTES ")[1].split("u")[0])
    assert (buffer < x_t.nbytes) == fed   # fed: only the stem's window of rows is in the arena
    (prog / "tt_driver.c").write_text(HARNESS % {"n": N})
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, size=(N, *x_t.shape[1:]), dtype=np.int8)
    y = rng.integers(0, int(tg.tensors[tg.meta["train"]["prediction"]].shape[-1]), size=N)
    recs = b"".join(xi.tobytes() + np.int32(yi).tobytes() for xi, yi in zip(x, y))
    board = get_board("host")
    b = build_firmware(board, prog, tmp_path / "build")
    run_firmware(board, b.elf, tmp_path / "run", {"train.bin": recs}, 120, results_name=None, losses_name=None)
    status = np.frombuffer((tmp_path / "run" / "out.bin").read_bytes(), np.int32)
    # no call failed, rows in order, same bits, a failed row: TT_ERR_IO / nothing trained / evaluation refused
    assert status.tolist() == [0, 0, 1, 1, 1, 1]
