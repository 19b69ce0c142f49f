"""Streamed op groups (stages/planning/streams.py): the planner finds them, the memory plan counts them, and the generated C
that runs them row by row / position by position / channel by channel / hidden channel by hidden channel is bit-identical to the numpy golden model
(which runs every op whole)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from test_codegen import _data, _forward_ref, _golden, _run  # the same firmware/golden-model harness
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.planning.arena import MemOptions, check_plan, plan_memory
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.runtime_config import RuntimeConfig
from tinytrain.stages.planning.schedule import in_place_update_order, is_valid_order
from tinytrain.stages.planning.streams import find_streams, input_rows, window_rows

REPO = Path(__file__).resolve().parent.parent


def _geo(k, s, pad, in_h, out_h):
    return {"in_h": in_h, "out_h": out_h, "stride": s, "pad_top": pad, "span": k}


@pytest.mark.parametrize("k,s,pad,in_h,out_h,want", [
    (3, 1, 1, 8, 8, 3), (3, 2, 0, 8, 4, 3), (1, 1, 0, 8, 8, 1), (5, 1, 2, 8, 8, 5), (3, 2, 1, 3, 2, 2)])
def test_window_is_the_most_rows_one_output_row_reads(k, s, pad, in_h, out_h, want):
    geo = _geo(k, s, pad, in_h, out_h)
    assert window_rows(geo) == want
    # every input row is read by some output row, in order (the line buffer slides forward only)
    spans = [input_rows(geo, r) for r in range(out_h)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(spans, spans[1:]))


def _mbv2_tte():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from memory_mbv2 import tte_like_plan
    finally:
        sys.path.remove(str(REPO / "bench"))
    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model

    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    plan, _ = tte_like_plan(g)
    return g, plan


@pytest.fixture(scope="module")
def mbv2_tg():
    g, plan = _mbv2_tte()
    return build_training_graph(g, plan, "cross_entropy", OptimizerSpec("sgd"), 1,
                                QASOptions(enabled=True, rounding="nearest", master_copy=False))


def test_mbv2_streams_found_and_counted(mbv2_tg):
    tg = mbv2_tg
    best, plan, _, cands = plan_schedules(tg, True)
    kinds = [s.kind for s in plan.streams]
    assert best.endswith("+streams")
    assert is_valid_order(tg, plan.order)
    check_plan(plan)
    # the stem and the first two blocks, row by row: block_1's 64x64x48 expand output keeps 3 rows (9 KB), and the
    # 128x128x3 image is fed to the stem row by row, 3 rows (1,152 B) at a time; with the image gone the next
    # blocks' expand outputs are worth streaming too
    rows = sorted((s for s in plan.streams if s.kind == "rows"), key=lambda s: s.ops[0])
    assert [tg.ops[i].type for i in rows[0].ops] == ["conv2d", "depthwise_conv2d", "conv2d"] * 2
    expand = tg.ops[rows[0].ops[3]].outputs[0]
    assert rows[0].chunked[expand] == 3 * 64 * 48
    x = tg.ops[rows[0].ops[0]].inputs[0]
    assert x in tg.inputs and rows[0].info["fed"] == [x] and rows[0].chunked[x] == 3 * 128 * 3
    assert all("fed" not in s.info for s in rows[1:])
    # the head's broadcast mean gradient one position at a time (1280 floats), each expand weight gradient of the
    # trained blocks one output channel at a time: alone, or inside the hidden-channel stream of its block's
    # backward (stages/planning/channel_stream.py), whose 8x8x192 fp32 gradients (48 KB) exist one 8x8 plane each
    assert "positions" in kinds
    rows_of_weights = [s for s in plan.streams if s.kind == "channels"
                       or (s.kind == "hidden" and any(tg.ops[i].type == "conv2d_grad_weight" for i in s.ops))]
    assert len(rows_of_weights) >= 4
    hidden = [s for s in plan.streams if s.kind == "hidden"]
    assert len(hidden) >= 3 and all(v <= 8 * 8 * 4 for s in hidden for v in s.chunked.values())
    pos = next(s for s in plan.streams if s.kind == "positions")
    assert sorted(pos.chunked.values()) == [1280 * 4, 1280 * 4]
    # streams only ever lower the arena
    without = min(p.arena for n, p in cands.items() if not n.endswith("+streams"))
    assert plan.arena < without
    # the plan without the streams' windows is what the same order costs unstreamed
    assert plan_memory(tg, plan.order, plan.options).arena >= plan.arena


def test_gathering_a_group_keeps_dependencies(mbv2_tg):
    order, streams = find_streams(mbv2_tg, list(range(len(mbv2_tg.ops))))
    assert is_valid_order(mbv2_tg, order)
    pos = {i: k for k, i in enumerate(order)}
    for s in streams:
        steps = [pos[i] for i in s.ops]
        assert steps == list(range(steps[0], steps[0] + len(steps))), s.kind


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_mbv2_streamed_c_matches_golden_model(mbv2_tg, tmp_path):
    """Every stream kind in one program: the int8 forward row by row, the head's gradient position by position,
    the expand weights' QAS updates channel by channel; bit-exact against the unstreamed numpy golden model."""
    tg = mbv2_tg
    _, mp, _, _ = plan_schedules(tg, True)
    assert {s.kind for s in mp.streams} == {"rows", "positions", "channels", "hidden"}
    summ = codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    steps = 3
    x, y = _data(tg, steps)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:2], y[:2])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    out = _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg,
               {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
               defines={"TT_DUMP_TENSORS": "1"})
    meta = tg.meta["train"]
    head_t = tg.tensors[meta["prediction"]]
    ev = np.frombuffer((tmp_path / "run" / "eval_out.bin").read_bytes(), head_t.dtype).reshape(4, -1)
    np.testing.assert_array_equal(ev[:2], _forward_ref(tg, x[:2]).reshape(2, -1))
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    wb = out["weights.bin"]
    for t in io["trained_tensors"]:
        got = np.frombuffer(wb[t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        np.testing.assert_array_equal(got, state[t["name"]], err_msg=t["name"])
    res = json.loads(out["results.json"])
    assert res["arena_bytes_planned"] == mp.arena == summ["arena_bytes"]
    assert 0 < res["arena_bytes_used"] <= res["arena_bytes_planned"]


# Every stream kind with the other variants of its member ops: float (rows of tt_conv2d_f32 / depthwise_f32,
# act-grad masks, float Adam), int8 without 1-bit masks (int8_clamp_grad per position), QAS momentum with stochastic
# rounding and Adam with an fp32 master copy (the per-channel offsets of every state tensor).
VARIANTS = {
    "int8-nomask-momentum-stochastic": dict(float_twin=False, masks=False, opt="momentum", rounding="stochastic",
                                            master=False),
    "int8-adam-master": dict(float_twin=False, masks=True, opt="adam", rounding="nearest", master=True),
    "float-adam": dict(float_twin=True, masks=True, opt="adam", rounding="nearest", master=False),
}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_stream_variants_match_golden_model(variant, tmp_path):
    from tinytrain.stages.quant.dequantize import dequantize_graph

    v = VARIANTS[variant]
    g, plan = _mbv2_tte()
    if v["float_twin"]:
        g = dequantize_graph(g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(v["opt"]), 1,
                              QASOptions(enabled=True, rounding=v["rounding"], master_copy=v["master"]),
                              masks=v["masks"])
    # every stream the in-place order allows, kept whether or not it lowers this variant's arena
    order, streams = find_streams(tg, in_place_update_order(tg))
    mp = plan_memory(tg, order, MemOptions(master_copy=bool(tg.meta["train"].get("master_copy", False))), streams)
    check_plan(mp)
    kinds = {s.kind for s in mp.streams}
    assert kinds == {"rows", "positions", "channels", "hidden"}, kinds
    pos = next(s for s in mp.streams if s.kind == "positions")
    assert tg.ops[pos.ops[1]].type == ("mask_grad" if v["masks"] else "int8_clamp_grad")
    x, y = _data(tg, 2, seed=3)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9, seed=5)

    def firmware(plan, name):
        summ = codegen.generate(tg, plan.order, plan.to_json(), tmp_path / name / "prog")
        out = _run("host", tmp_path / name / "prog", tmp_path / name / "build", tmp_path / name / "run", cfg,
                   {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"})
        assert json.loads(out["results.json"])["arena_bytes_planned"] == plan.arena == summ["arena_bytes"]
        return out

    out = firmware(mp, "streamed")
    want, state = _golden(tg, x, y, cfg)
    io = json.loads((tmp_path / "streamed" / "prog" / "io_layout.json").read_text())
    if v["float_twin"]:
        # fp32 C and numpy round differently over a network this deep (the first loss already differs in the
        # 5th digit): the claim is that streaming changes nothing, so the streamed program must give the
        # unstreamed one's bytes; the golden model only loosely
        plain = firmware(plan_memory(tg, in_place_update_order(tg), mp.options), "plain")
        assert out["losses.bin"] == plain["losses.bin"] and out["weights.bin"] == plain["weights.bin"]
        np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-4)
        return
    # the loss is fp32 math on the dequantized logits (own expf / logf): 1e-5, as test_codegen; the int8 weights
    # and int32 biases, which every gradient feeds, must be identical
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    for t in io["trained_tensors"]:
        got = np.frombuffer(out["weights.bin"][t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        np.testing.assert_array_equal(got, state[t["name"]], err_msg=t["name"])


# ---- a third-party frozen prefix: residual blocks, PReLU, max pooling, channel padding -------------------------

@pytest.fixture(scope="module")
def hand_recrop_int8():
    """MediaPipe's hand_recrop (tests/fixtures/thirdparty), quantized on 4 synthetic images: 256x256x3 input,
    blocks of depthwise -> conv and max_pool -> channel pad, joined by ADD, then PReLU."""
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages import quantize
    from tinytrain.stages.model.tflite_reader import read_model

    g = read_model(REPO / "tests" / "fixtures" / "thirdparty" / "hand_recrop.tflite")
    rng = np.random.default_rng(0)
    calib = rng.uniform(0, 1, size=(4, 256, 256, 3)).astype(np.float32)
    q, _ = quantize.quantize_model(g, calib, QuantizeSpec(), calib[:1])
    from tinytrain.stages.planning.train_plan import TrainPlan
    return build_training_graph(q, TrainPlan.bias_only(q, last=1), "cross_entropy", OptimizerSpec("sgd"), 1,
                                QASOptions(enabled=True, rounding="nearest", master_copy=False))


def test_residual_prefix_is_streamed_and_lowers_the_peak(hand_recrop_int8, monkeypatch):
    """The frozen prefix runs as one row stream through the residual blocks (both branches of each ADD inside
    it, the block input read by two ops of the stream), and the 320 KB peak (the 192 KB input next to the 128 KB
    first activation) drops below the 300 KB budget. Fed row by row from the data source, the input is never whole
    and the short stem stream alone goes lower still (the residual blocks no longer hold the peak)."""
    from tinytrain.stages import reorder as reorder_mod
    from tinytrain.stages.planning import streams as streams_mod

    tg = hand_recrop_int8
    _, fed, _, _ = plan_schedules(tg, True)
    x = next(t for t in tg.inputs if t != tg.meta["train"]["label_input"])
    assert any(s.info.get("fed") == [x] for s in fed.streams)
    monkeypatch.setattr(streams_mod, "fed_inputs", lambda *a, **k: [])   # the input whole, as before feeding
    monkeypatch.setattr(reorder_mod, "SCHEDULES", reorder_mod.ScheduleMemo())
    best, plan, plain, cands = plan_schedules(tg, True)
    assert fed.arena < plan.arena
    check_plan(plan)
    rows = [s for s in plan.streams if s.kind == "rows"]
    assert rows, best
    types = {tg.ops[i].type for s in rows for i in s.ops}
    assert {"conv2d", "depthwise_conv2d", "prelu", "max_pool2d", "pad", "add"} <= types
    fan_out = [q for s in rows for srcs in s.info["sources"] for q in srcs if q >= 0]
    assert len(fan_out) > len(set(fan_out))  # some op of a stream feeds two others (a block's two branches)
    unstreamed = min(p.arena for n, p in cands.items() if not n.endswith("+streams"))
    assert unstreamed > 300 * 1024 > plan.arena


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_residual_prefix_streamed_c_is_bit_identical(hand_recrop_int8, tmp_path):
    """The streamed program gives the unstreamed program's bytes (loss and trained bias) and the golden model's."""
    tg = hand_recrop_int8
    _, mp, _, _ = plan_schedules(tg, True)
    assert any(s.kind == "rows" for s in mp.streams)
    x, y = _data(tg, 2, seed=1)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)

    def firmware(plan, name):
        summ = codegen.generate(tg, plan.order, plan.to_json(), tmp_path / name / "prog")
        out = _run("host", tmp_path / name / "prog", tmp_path / name / "build", tmp_path / name / "run", cfg,
                   {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"})
        assert json.loads(out["results.json"])["arena_bytes_planned"] == plan.arena == summ["arena_bytes"]
        return out

    streamed = firmware(mp, "streamed")
    plain = firmware(plan_memory(tg, mp.order, mp.options), "plain")
    assert streamed["losses.bin"] == plain["losses.bin"] and streamed["weights.bin"] == plain["weights.bin"]
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(streamed["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "streamed" / "prog" / "io_layout.json").read_text())
    for t in io["trained_tensors"]:
        got = np.frombuffer(streamed["weights.bin"][t["offset"]:t["offset"] + t["nbytes"]],
                            t["dtype"]).reshape(t["shape"])
        np.testing.assert_array_equal(got, state[t["name"]], err_msg=t["name"])


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["residual_int8", "convnet_int8", "residual_float"])
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_small_row_streams_are_bit_identical(fixture, tmp_path):
    """Every row stream find_streams offers (kept whether or not it lowers the arena) on small fixtures: a conv
    and the residual ADD reading the block input twice (int8 and float), a conv and max pooling."""
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(REPO / "tests" / "fixtures" / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.bias_only(g, last=1), "cross_entropy", OptimizerSpec("sgd"), 1)
    order, streams = find_streams(tg, in_place_update_order(tg))
    streams = [s for s in streams if s.kind == "rows"]
    assert streams
    mp = plan_memory(tg, order, MemOptions(), streams)
    check_plan(mp)
    x, y = _data(tg, 3, seed=2)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    outs = []
    for name, plan in (("streamed", mp), ("plain", plan_memory(tg, order, MemOptions()))):
        codegen.generate(tg, plan.order, plan.to_json(), tmp_path / name / "prog")
        outs.append(_run("host", tmp_path / name / "prog", tmp_path / name / "build", tmp_path / name / "run", cfg,
                         {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}))
    assert outs[0]["losses.bin"] == outs[1]["losses.bin"] and outs[0]["weights.bin"] == outs[1]["weights.bin"]
    if g.tensors[g.inputs[0]].dtype == "int8":
        want, _ = _golden(tg, x, y, cfg)
        np.testing.assert_allclose(np.frombuffer(outs[0]["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None
                    or shutil.which("cc") is None, reason="arm-none-eabi-gcc, qemu-system-arm or cc not installed")
def test_row_streams_in_qemu_give_the_host_bytes(tmp_path):
    """The streamed group schedule (tt_stream.c) on the Cortex-M7 board in QEMU gives the host build's bytes."""
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(REPO / "tests" / "fixtures" / "residual_int8.tflite")
    tg = build_training_graph(g, TrainPlan.bias_only(g, last=1), "cross_entropy", OptimizerSpec("sgd"), 1)
    order, streams = find_streams(tg, in_place_update_order(tg))
    mp = plan_memory(tg, order, MemOptions(), [s for s in streams if s.kind == "rows"])
    assert mp.streams
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x, y = _data(tg, 3, seed=4)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    data = {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}
    host = _run("host", tmp_path / "prog", tmp_path / "hb", tmp_path / "hr", cfg, data)
    board = _run("stm32f746-disco", tmp_path / "prog", tmp_path / "bb", tmp_path / "br", cfg, data)
    assert host["losses.bin"] == board["losses.bin"] and host["weights.bin"] == board["weights.bin"]


# ---- spatial padding inside a row stream ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["int8", "float"])
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_h_padding_streams_bit_identical(kind, tmp_path):
    """tests/fixtures/streams/hpad (tests/make_pad_stream_fixtures.py, the TF converter): PADs of H inside a row
    stream, one before a strided valid depthwise (a top pad row) in a BlazeBlock-like branch beside max pooling and
    a channel PAD, one with two pad rows on top and one below before a valid depthwise. The planner streams every
    op of the frozen prefix; the program gives the unstreamed program's bytes (and, int8, the golden model's)."""
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.planning.streams import pad_rows
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(REPO / "tests" / "fixtures" / "streams" / f"hpad_{kind}.tflite")
    tg = build_training_graph(g, TrainPlan.bias_only(g, last=1), "cross_entropy", OptimizerSpec("sgd"), 1)
    order, streams = find_streams(tg, in_place_update_order(tg))
    streams = [s for s in streams if s.kind == "rows"]
    padded = sorted(pad_rows(tg, tg.ops[i]) for s in streams for i in s.ops if tg.ops[i].type == "pad")
    assert padded == [(0, 0), (1, 0), (2, 1)]   # the channel PAD, then the two that pad H
    mp = plan_memory(tg, order, MemOptions(), streams)
    check_plan(mp)
    plain = plan_memory(tg, order, MemOptions())
    assert mp.arena < plain.arena
    x, y = _data(tg, 3, seed=5)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    outs = []
    for name, plan in (("streamed", mp), ("plain", plain)):
        codegen.generate(tg, plan.order, plan.to_json(), tmp_path / name / "prog")
        outs.append(_run("host", tmp_path / name / "prog", tmp_path / name / "build", tmp_path / name / "run", cfg,
                         {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}))
    assert outs[0]["losses.bin"] == outs[1]["losses.bin"] and outs[0]["weights.bin"] == outs[1]["weights.bin"]
    if kind == "int8":
        want, _ = _golden(tg, x, y, cfg)
        np.testing.assert_allclose(np.frombuffer(outs[0]["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
