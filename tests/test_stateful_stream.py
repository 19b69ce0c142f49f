"""The per-frame C API of a stateful model (stages/c_emit/stream.py): tt_stream_step called once per frame, the
state kept in SRAM between calls, against LiteRT and TFLite Micro invoking the original stateful .tflite once per
frame, and against the numpy golden model; after on-device training the frames use the trained weights.

Fixture: tests/fixtures/stateful/stream_kws_int8.tflite (tests/make_stateful_fixtures.py, the TF converter).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from litert_oracle import tflm_available
from litert_sequence import run_litert_sequence, run_tflm_sequence
from tinytrain.stages.model import state
from tinytrain.stages.model.tflite_reader import read_model

FIX = Path(__file__).resolve().parent / "fixtures" / "stateful"
MODEL = FIX / "stream_kws_int8.tflite"
STEPS = 4           # model.sequence_length of the training program; streaming is not limited to it
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


def _program(tmp: Path, steps: int = STEPS, model: Path = MODEL):
    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan
    from tinytrain.stages.reorder import plan_schedules

    u = state.unroll(read_model(model), steps)
    tg = build_training_graph(u, TrainPlan.full(u), "cross_entropy", OptimizerSpec("sgd", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    summary = codegen.generate(tg, mp.order, mp.to_json(), tmp / "prog")
    return tg, summary


def test_the_one_invocation_program_over_the_training_graph_is_the_original_model():
    # state.step_graph rebuilds one invocation from the training graph (its weights by name): over sequences it
    # gives what the original stateful graph gives, frame by frame.
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(MODEL)
    u = state.unroll(g, STEPS)
    tg = build_training_graph(u, TrainPlan.full(u), "cross_entropy", OptimizerSpec("sgd", learning_rate=0.05), 1)
    sg = state.step_graph(tg)
    assert [op.type for op in sg.ops] == [op.type for op in g.ops]
    assert [v.variable for v in state.variables(sg)] == [v.variable for v in state.variables(g)]
    seqs = np.load(FIX / "stream_kws.input.npy")
    ours = np.stack([s[sg.outputs[0]] for s in state.run_sequence(sg, seqs)], axis=1)
    ref = np.stack([s[g.outputs[0]] for s in state.run_sequence(g, seqs)], axis=1)
    np.testing.assert_array_equal(ours, ref)
    assert state.step_graph(read_model(FIX.parent / "mlp_int8.tflite")) is None   # stateless: no per-frame program


def test_codegen_emits_the_per_frame_api_with_the_state_in_sram(tmp_path):
    _, summary = _program(tmp_path)
    s = summary["stream"]
    assert s["available"] and s["frame"]["shape"] == [1, 3, 10] and s["output"]["shape"] == [1, 2]
    # The two ring buffers, int8: [1,2,1,10] and [1,3,1,8]; both updated in place (concat, then slice).
    assert s["state_bytes"] == 2 * 10 + 3 * 8 and all(v["direct"] for v in s["variables"])
    h = (tmp_path / "prog" / "tt_model.h").read_text()
    c = (tmp_path / "prog" / "tt_model.c").read_text()
    for decl in ("void tt_stream_reset(void);", "void tt_stream_step(const void *frame, void *output);",
                 "#define TT_STREAM_STATE_BYTES 44u", "#define TT_STREAM_TRAIN_FRAMES 4u"):
        assert decl in h
    assert {"static int8_t tt_sv0[20]" in c, "static int8_t tt_sv1[20]" in c} == {True, False}
    assert "tt_stream_reset();" in c.split("void tt_init(void)")[1].split("tt_steps = 0;")[0]  # tt_init resets the state
    assert json.loads((tmp_path / "prog" / "io_layout.json").read_text())["stream"] == s


def test_a_stateless_model_has_no_per_frame_api(tmp_path):
    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan
    from tinytrain.stages.reorder import plan_schedules

    g = read_model(FIX.parent / "mlp_int8.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec("sgd", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    summary = codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    assert "stream" not in summary and "tt_stream" not in (tmp_path / "prog" / "tt_model.h").read_text()


HARNESS = r"""/* test harness: frames through tt_stream_step before and after on-device training */
#include <stdint.h>
#include <string.h>
#include "tt_model.h"
#include "tt_platform.h"

#define N_SEQ %(n_seq)du
#define N_FRAMES %(n_frames)du
#define N_TRAIN %(n_train)du
static uint8_t frames[N_SEQ * N_FRAMES * TT_STREAM_FRAME_BYTES];
static uint8_t train[N_TRAIN * (TT_INPUT_BYTES + 4u)];
static uint8_t out[2u * N_SEQ * N_FRAMES * TT_STREAM_OUTPUT_BYTES + 4096u];

static uint32_t stream_all(uint32_t at)
{
    uint32_t s, f;
    for (s = 0; s < N_SEQ; ++s) {
        tt_stream_reset();
        for (f = 0; f < N_FRAMES; ++f) {
            tt_stream_step(frames + (s * N_FRAMES + f) * TT_STREAM_FRAME_BYTES, out + at);
            at += TT_STREAM_OUTPUT_BYTES;
        }
    }
    return at;
}

int tt_main(void)
{
    uint32_t i, at = 0, k;
    if (tt_read_file("frames.bin", frames, sizeof frames) != (long)sizeof frames ||
        tt_read_file("train.bin", train, sizeof train) != (long)sizeof train) {
        return 1;
    }
    tt_init();
    at = stream_all(at);
    for (i = 0; i < N_TRAIN; ++i) {
        uint8_t *rec = train + i * (TT_INPUT_BYTES + 4u);
        if (tt_train_sample(rec, rec + TT_INPUT_BYTES) < 0) {
            return 2;
        }
    }
    at = stream_all(at);
    for (k = 0; k < TT_TRAINED_COUNT; ++k) {
        at += tt_trained_read(k, 0, out + at, tt_trained_size(k));
    }
    return tt_write_file("out.bin", out, at) == 0 ? 0 : 3;
}
"""


def _run_harness(tmp: Path, board: str, frames: np.ndarray, x: np.ndarray, y: np.ndarray) -> bytes:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    (prog / "tt_driver.c").write_text(HARNESS % {"n_seq": frames.shape[0], "n_frames": frames.shape[1],
                                                 "n_train": len(x)})
    recs = b"".join(xi.tobytes() + np.int32(yi).tobytes() for xi, yi in zip(x, y))
    b = build_firmware(get_board(board), prog, tmp / f"build-{board}")
    run_firmware(get_board(board), b.elf, tmp / f"run-{board}", {"frames.bin": frames.tobytes(), "train.bin": recs},
                 300, results_name=None, losses_name=None)
    return (tmp / f"run-{board}" / "out.bin").read_bytes()


def _with_trained(tg, raw: bytes):
    """tg with its trained tensors set to the bytes the firmware read back (io order)."""
    import copy

    g = copy.copy(tg)
    g.tensors = dict(tg.tensors)
    off = 0
    for name in tg.meta["train"]["trained"]:
        t = tg.tensors[name]
        g.tensors[name] = copy.copy(t)
        g.tensors[name].data = np.frombuffer(raw[off:off + t.nbytes], t.dtype).reshape(t.shape).copy()
        off += t.nbytes
    assert off == len(raw)
    return g


def _stream_golden(tg, seqs: np.ndarray) -> np.ndarray:
    """Frames through state.step_graph(tg) (the golden model, the C's fixed-point FC rescale), as the model's
    output bytes: a re-encoded uint8 output (stages/model/uint8_output.py) as uint8."""
    sg = state.step_graph(tg)
    out = np.stack([s[sg.outputs[0]] for s in state.run_sequence(sg, seqs, fc_requant="fixed_point")], axis=1)
    enc = sg.meta["output_uint8"].get(sg.outputs[0])
    return out if enc is None else np.clip(out.astype(np.int32) + enc["offset"], 0, 255).astype(np.uint8)


@pytest.mark.slow  # a firmware build (~10 s on a shared machine)
@needs_cc
@pytest.mark.parametrize("name", ["stream_kws_int8", "stream_kws_u8out"])
def test_frames_through_the_c_api_are_litert_invoking_the_stateful_file_before_and_after_training(name, tmp_path):
    model = FIX / f"{name}.tflite"
    seqs = np.load(FIX / "stream_kws.input.npy")          # int8 [4 sequences, 6 frames, 3, 10]
    tg, summary = _program(tmp_path, model=model)
    out_t = np.dtype(summary["stream"]["output"]["dtype"])
    assert out_t == (np.uint8 if name.endswith("u8out") else np.int8)
    rng = np.random.default_rng(5)
    x = np.concatenate([seqs[:, :STEPS], seqs[:, 2:2 + STEPS]])  # 8 training sequences of STEPS frames
    y = rng.integers(0, 2, len(x))
    raw = _run_harness(tmp_path, "host", seqs, x, y)
    n_out = seqs.shape[0] * seqs.shape[1] * 2
    before = np.frombuffer(raw[:n_out], out_t).reshape(seqs.shape[0], seqs.shape[1], 2)
    after = np.frombuffer(raw[n_out:2 * n_out], out_t).reshape(before.shape)
    # Before training: the original file invoked once per frame, its own output bytes (uint8 for u8out). 6 frames
    # per sequence with a training program of 4: the state carries over between calls, not within a fixed window.
    np.testing.assert_array_equal(before, _stream_golden(tg, seqs))
    # LiteRT rescales the FC in double, TFLite Micro and the C in fixed point: on near-ties they may differ by one
    # LSB (tests/test_stateful.py); on these frames they agree, so the C is LiteRT's output byte for byte.
    np.testing.assert_array_equal(before, run_litert_sequence(model, seqs))
    if tflm_available():
        np.testing.assert_array_equal(before, run_tflm_sequence(model, seqs))
    # The unrolled training program's golden forward (int8) gives the same at frame STEPS - 1.
    from tinytrain.stages.golden.forward import run_graph
    u = state.unroll(read_model(model), STEPS)
    last = run_graph(u, {u.inputs[0]: seqs[:, :STEPS]}, fc_requant="fixed_point")[u.outputs[0]]
    np.testing.assert_array_equal(last.astype(np.int32) + (128 if out_t == np.uint8 else 0), before[:, STEPS - 1])
    # After training: the same frames through the trained weights (the firmware's own, read back).
    trained = _with_trained(tg, raw[2 * n_out:])
    assert any(not np.array_equal(trained.tensors[n].data, tg.tensors[n].data) for n in tg.meta["train"]["trained"])
    np.testing.assert_array_equal(after, _stream_golden(trained, seqs))
    assert not np.array_equal(after, before)


@pytest.mark.slow  # two firmware builds and a QEMU run
@needs_cc
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_frames_through_the_c_api_in_qemu_are_the_host_s_bytes(tmp_path):
    seqs = np.load(FIX / "stream_kws.input.npy")
    _program(tmp_path, model=FIX / "stream_kws_u8out.tflite")
    x, y = seqs[:, :STEPS], np.arange(len(seqs)) % 2
    host = _run_harness(tmp_path, "host", seqs, x, y)
    assert _run_harness(tmp_path, "stm32f746-disco", seqs, x, y) == host


def test_the_exported_library_documents_the_per_frame_api(tmp_path):
    from tinytrain.pipeline.export_lib import export_library

    _program(tmp_path)
    seqs = np.load(FIX / "stream_kws.input.npy")[:, :STEPS]
    out = export_library(tmp_path / "prog", None, tmp_path / "lib", "kws", (seqs, np.arange(len(seqs)) % 2))
    readme = (out / "README.md").read_text()
    assert "## Streaming: one frame per call" in readme and "tt_stream_step(frame, score);" in readme
    assert "`TT_STREAM_STATE_BYTES` = 44 B" in readme
    assert "void tt_stream_step(const void *frame, void *output);" in (out / "src" / "tt_model.h").read_text()
