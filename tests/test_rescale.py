"""Weights that are free to move (issue 17, item 2; stages/quant/rescale.py), pinned against the numpy golden model.

A trained int8 weight the update probe moves past ±127 gets a wider per-channel scale (values requantised), its
layer's int8 output the smallest wider scale at which the probe of the widened weights saw none of its values clamp
(counted per factor, checked against the golden forward), and every bias whose input or weight scale moved follows
(TFLite's int8 spec: s_b = s_in·s_w). Checked: the factors from the probe's reach, the rewrite against a direct
requantisation, the bias rule and the shared-parameter groups (validate_int8 accepts the rescaled graph), the
golden forward of the rescaled graph against the original within the rounding of the wider steps, the probe on
the rescaled graph saturating less, the stage's plan.json / train_plan.json / plan.txt, and (slow) the generated C
bit-exact to the golden model on a rescaled graph. Accuracy is measured by bench/int8_vs_fp32.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.contract import StageContext
from tinytrain.pipeline.spec import UpdateSpec
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.stages import sparse_plan as SP
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.quant import rescale
from tinytrain.stages.quant import update_check as uc
from tinytrain.stages.quant.ptq import validate_int8

FIX = Path(__file__).parent / "fixtures"
DIGITS = DataSpec(source="digits", test_fraction=0.2)
W = "digits_cnn_1/dense_1/MatMul"
B = "digits_cnn_1/dense_1/BiasAdd"


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_model(FIX / "digits_cnn_int8.tflite")


@pytest.fixture(scope="module")
def data():
    from tinytrain.stages.train.data import load_dataset
    ds = load_dataset(DIGITS)
    return ds.x_train[:256], ds.y_train[:256], ds.x_test[:64]


def _layer(graph: Graph, weight: str):
    return next(op for op in graph.ops if len(op.inputs) > 1 and op.inputs[1] == weight)


def test_factor_is_the_smallest_power_of_two_that_holds_the_reach():
    assert [rescale.factor_for(r) for r in (0, 127, 127.01, 254, 255, 1000, 1e9)] == [1, 1, 2, 2, 4, 8,
                                                                                        rescale.MAX_FACTOR]


def test_rewrite_requantises_weights_bias_and_output_consistently(graph):
    fc = _layer(graph, W)
    out = fc.outputs[0]
    k = [1, 2, 1, 4, 1, 8, 8, 1, 2, 1]
    g = rescale.apply(graph, {"weights": {W: k}, "outputs": {out: 4}})
    assert validate_int8(g) == []                       # bias scale = s_in·s_w, shared params, fixed outputs
    w0, w1 = graph.tensors[W], g.tensors[W]
    kk = np.asarray(k, np.float64)
    np.testing.assert_array_equal(np.asarray(w1.quant.scale, np.float32),
                                  (np.asarray(w0.quant.scale, np.float64) * kk).astype(np.float32))
    q = w0.data.astype(np.float64) / kk[:, None]
    np.testing.assert_array_equal(w1.data, (np.sign(q) * np.floor(np.abs(q) + 0.5)).astype(np.int8))
    assert w0.data is not w1.data and graph.tensors[W].quant.scale == w0.quant.scale   # the input is not touched
    s_in = graph.tensors[fc.inputs[0]].quant.scale[0]
    b1 = g.tensors[B]
    np.testing.assert_array_equal(np.asarray(b1.quant.scale, np.float32),
                                  (s_in * np.asarray(w1.quant.scale, np.float64)).astype(np.float32))
    real0 = graph.tensors[B].data * np.asarray(graph.tensors[B].quant.scale)
    real1 = b1.data * np.asarray(b1.quant.scale)
    assert np.all(np.abs(real1 - real0) <= 0.5 * np.asarray(b1.quant.scale) + 1e-12)
    assert g.tensors[out].quant.scale[0] == pytest.approx(4 * graph.tensors[out].quant.scale[0], rel=1e-7)
    assert g.tensors[out].quant.zero_point == graph.tensors[out].quant.zero_point
    assert rescale.apply(graph, {"weights": {}, "outputs": {}}) is graph


def test_rescaled_forward_equals_the_original_within_rounding(graph, data):
    """The logits (the widened output, dequantised) and the softmax after them agree with the original graph's to
    within the wider output step plus the weights' rounding: the rewrite changes precision, not the function."""
    x = data[2]
    fc = _layer(graph, W)
    out = fc.outputs[0]
    g = rescale.apply(graph, {"weights": {W: [2] * 10}, "outputs": {out: 2}})
    inp = graph.tensors[graph.inputs[0]]
    xb = np.concatenate([te._feed(x[i:i + 1], inp) for i in range(len(x))])
    a = run_graph(graph, {graph.inputs[0]: xb}, keep_intermediates=True)
    b = run_graph(g, {g.inputs[0]: xb}, keep_intermediates=True)

    def real(gr, vals, name):
        q = gr.tensors[name].quant
        return (vals[name].astype(np.float64) - q.zero_point[0]) * q.scale[0]

    s_out = g.tensors[out].quant.scale[0]
    # |Δlogit| <= one new output step (requantisation) + Σ|x|·(half a new weight step) over the inputs
    xin = np.abs(real(graph, a, fc.inputs[0]))
    w_err = xin.sum(axis=1, keepdims=True) * 0.5 * np.asarray(g.tensors[W].quant.scale)[None, :]
    assert np.all(np.abs(real(g, b, out) - real(graph, a, out)) <= s_out + w_err + 1e-9)
    assert np.mean(np.abs(real(g, b, out) - real(graph, a, out))) < 2 * s_out
    pa = np.asarray(a[graph.outputs[0]]).argmax(-1)
    pb = np.asarray(b[g.outputs[0]]).argmax(-1)
    assert np.mean(pa == pb) >= 0.9


def test_a_hidden_output_widens_with_its_shared_group_and_the_next_bias(graph):
    """Widening a hidden layer's output rescales every tensor that must share its int8 parameters (pooling,
    reshape) and the bias of the layer that reads it (s_in moved)."""
    last_conv = [op for op in graph.ops if op.type == "conv2d"][-1]
    out = last_conv.outputs[0]
    group = rescale._group(graph, out)
    assert group == sorted([out, "digits_cnn_1/flatten_1/Reshape"])       # conv -> reshape -> fully_connected
    g = rescale.apply(graph, {"weights": {}, "outputs": {out: 2}})
    assert validate_int8(g) == []
    for name in group:
        assert g.tensors[name].quant.scale[0] == pytest.approx(2 * graph.tensors[name].quant.scale[0], rel=1e-7)
    readers = [op for op in graph.ops if op.inputs and op.inputs[0] in group and len(op.inputs) > 2
               and op.inputs[2]]
    assert readers
    for op in readers:
        b0, b1 = graph.tensors[op.inputs[2]], g.tensors[op.inputs[2]]
        assert b1.quant.scale[0] == pytest.approx(2 * b0.quant.scale[0], rel=1e-6)
        v = b0.data * np.asarray(b0.quant.scale, np.float64) / np.asarray(b1.quant.scale, np.float64)
        np.testing.assert_array_equal(b1.data, np.sign(v) * np.floor(np.abs(v) + 0.5))
    # softmax's output has fixed parameters (1/256, -128): a group holding it is never widened
    sm = next(op for op in graph.ops if op.type == "softmax")
    assert rescale._group(graph, sm.outputs[0]) is None


def test_probe_reach_picks_wider_scales_and_saturation_drops(graph, data):
    """Momentum 0.9 at lr 0.01 moves the new classes' rows far past ±127 (the issue's 54 % case): the probe's free
    trajectory says how far, the chosen factors cover it, and the same probe on the rescaled graph leaves fewer
    weights at ±127."""
    x, y, _ = data
    plan = TrainPlan.last_k(graph, 1)
    kw = dict(loss="cross_entropy", optimizer="momentum", qas_enabled=True, learning_rate=0.01, x=x, y=y,
              steps=256)
    before = uc.probe(graph, plan, **kw)
    reach = np.asarray(before[W]["reach"])
    assert before[W]["axis"] == 0 and reach.shape == (10,) and reach.max() > 127
    assert before[W]["saturated"] > 0 and before[W]["output_clamped"] > 0
    choice = rescale.choose(graph, before)
    k = np.asarray(choice["weights"][W])
    assert np.all(127 * k >= np.minimum(reach, 127 * rescale.MAX_FACTOR)) and np.all(127 * k / 2 < reach[k > 1])
    assert np.all(k[reach <= 127] == 1)
    assert choice["outputs"] == {}                     # outputs: measured on the widened graph, not inferred
    assert B not in choice["weights"]                  # int32 biases have room
    after = uc.probe(rescale.apply(graph, choice), plan, **kw, output_reach=True)
    assert after[W]["saturated"] < before[W]["saturated"]
    # the output's head-room: the smallest ×2^j at which none of its values clamps
    over = after[W]["output_over"]
    assert len(over) == int(np.log2(rescale.MAX_FACTOR)) + 1 and over[0] == after[W]["output_clamped"] > 0
    assert all(a >= b for a, b in zip(over, over[1:]))
    both = rescale.choose(graph, before, after)
    assert both["weights"] == choice["weights"]
    j = int(np.log2(both["outputs"].get(_layer(graph, W).outputs[0], 1)))
    assert over[j] == 0 and (j == 0 or over[j - 1] > 0)


def test_output_factor_is_the_smallest_that_holds_every_value():
    assert rescale.output_factor([0.0] * 7) == 1
    assert rescale.output_factor([0.3, 0.02, 1e-4, 0.0, 0.0, 0.0, 0.0]) == 8
    assert rescale.output_factor([0.3] * 7) == rescale.MAX_FACTOR


def test_output_over_counts_the_clamps_of_the_output_widened_by_each_factor(graph, data):
    """The probe's output_over against the golden forward of the graph whose output is widened by 2^j (rescale.apply):
    one step, on a graph whose head output is narrowed 4-fold so that it clamps, the same counts."""
    x, y, _ = data
    out = _layer(graph, W).outputs[0]
    narrow = rescale.apply(graph, {"weights": {}, "outputs": {out: 0.25}})
    plan = TrainPlan.last_k(narrow, 1)
    got = uc.probe(narrow, plan, loss="cross_entropy", optimizer="momentum", qas_enabled=True, learning_rate=0.01,
                   x=x, y=y, steps=1, seed=5, output_reach=True)[W]["output_over"]
    i = int(np.random.default_rng(5).permutation(len(x))[0])
    t = narrow.tensors[out]
    xq = te._feed(x[i:i + 1], narrow.tensors[narrow.inputs[0]])
    want = []
    for j in range(len(got)):
        g = rescale.apply(narrow, {"weights": {}, "outputs": {out: 2 ** j}})
        v = np.asarray(run_graph(g, {g.inputs[0]: xq}, keep_intermediates=True)[out])
        want.append(float(np.sum(np.isin(v, uc._clamp_codes(g.tensors[out], "none")))) / v.size)
    assert t.dtype == "int8" and want[0] > 0 and want[-1] == 0
    assert got == want


def test_reach_is_the_free_trajectory_of_the_updates(graph, data):
    """One SGD step: reach = max over the channel of |q + Δ| (Δ the update's own float32 value) where that passes the
    starting max, i.e. the weight where no clamp stopped it."""
    x, y, _ = data
    plan = TrainPlan.last_k(graph, 1)
    got = uc.probe(graph, plan, loss="cross_entropy", optimizer="sgd", qas_enabled=True, learning_rate=1000.0,
                   x=x, y=y, steps=1, seed=3)
    from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
    tg = build_training_graph(graph, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                              QASOptions(True, "nearest", False))
    i = int(np.random.default_rng(3).permutation(len(x))[0])
    values = te.run_sample(tg, te.init_state(tg), x[i:i + 1], y[i:i + 1])
    g = values[tg.meta["train"]["trained"][W]["gradient"]].astype(np.float32)
    s = np.asarray(tg.tensors[f"qas/{W}/scale"].data, np.float32)[:, None]
    delta = (-(np.float32(1000.0) * g) / s).astype(np.float32)
    q = graph.tensors[W].data.astype(np.float64)
    want = np.maximum(np.abs(q).max(1), np.abs(q + delta).max(1))
    np.testing.assert_allclose(got[W]["reach"], np.round(want, 3), atol=1e-3)
    assert max(got[W]["reach"]) > 127          # lr 1000: far past the range


def _stage(tmp: Path, graph: Graph, kind: str) -> tuple[dict, dict, str, str]:
    qdir = tmp / "quantize"
    qdir.mkdir(parents=True)
    graph.save(qdir)
    out = tmp / "out"
    out.mkdir()
    cfg = {"train.update": UpdateSpec.model_validate({"scheme": "last_k", "k": 1}),
           "target.board": "host", "data": DIGITS, "train.optimizer.kind": kind,
           "train.qas": {"enabled": True, "rounding": "nearest", "master_copy": False}}
    res = SP.run(StageContext(config=cfg, inputs={"quantize/graph.json": qdir / "graph.json",
                                                  "quantize/tensors.npz": qdir / "tensors.npz"}, out_dir=out))
    return (json.loads((out / "plan.json").read_text()), json.loads((out / "train_plan.json").read_text()),
            (out / "plan.txt").read_text(), res.summary)


def test_sparse_plan_rescales_momentum_head_and_autodiff_trains_the_rescaled_graph(graph, tmp_path):
    doc, tp, text, summary = _stage(tmp_path, graph, "momentum")
    u = doc["updates"]
    k = u["rescale"]["weights"][W]
    assert max(k) > 1 and tp["rescale"] == u["rescale"]
    sat = u["saturation"][W]
    assert sat["elements"] == graph.tensors[W].data.size and sat["after_rescale"] < sat["before_rescale"]
    assert "weight range" in text and W in text and "before → after the rescale" in text
    assert "rescaled (up to ×" in summary
    # autodiff reads train_plan.json's rescale: its training graph holds the rescaled weights and scales
    from tinytrain.stages import autodiff as AD

    ad = tmp_path / "autodiff"
    ad.mkdir()
    AD.run(StageContext(config={"train.optimizer": {"kind": "momentum"}, "train.batch_size": 1,
                                "train.qas": {"enabled": True, "rounding": "nearest", "master_copy": False}},
                        inputs={"quantize/graph.json": tmp_path / "quantize" / "graph.json",
                                "quantize/tensors.npz": tmp_path / "quantize" / "tensors.npz",
                                "sparse-plan/train_plan.json": tmp_path / "out" / "train_plan.json"}, out_dir=ad))
    tg = Graph.load(ad, stem="train_")
    want = rescale.apply(graph, u["rescale"])
    np.testing.assert_array_equal(tg.tensors[W].data, want.tensors[W].data)
    assert tg.tensors[W].quant.scale == want.tensors[W].quant.scale
    assert tg.tensors[B].quant.scale == want.tensors[B].quant.scale
    # run.json (emulate-run's re-check) states the scales the plan chose too
    inputs = {f"sparse-plan/{n}": tmp_path / "out" / n for n in ("update_check.json", "train_plan.json")}
    r = uc.for_run(inputs, graph, {"data": DIGITS, "train.optimizer": {"kind": "momentum"}, "train.batch_size": 1},
                   {"loss": "cross_entropy"}, 0.01)
    assert r["rescale"] == u["rescale"] and r["qas"] == json.loads(
        (tmp_path / "out" / "update_check.json").read_text())["qas"]


def test_sparse_plan_keeps_sgd_scales_when_nothing_passes_the_range(graph, tmp_path):
    """Adam at its usual rate: nearest rounding erases the steps of the new rows, nothing reaches past ±127 there;
    whatever the probe finds, train_plan.json carries `rescale` exactly when the choice widens something."""
    doc, tp, text, _ = _stage(tmp_path, graph, "adam")
    widen = doc["updates"]["rescale"]
    assert ("rescale" in tp) == bool(widen["weights"] or widen["outputs"])
    assert all(max(k) > 1 for k in widen["weights"].values())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_generated_c_matches_golden_model_on_a_rescaled_graph(graph, tmp_path):
    """The C takes every requantisation from the graph's scales, like the golden model: on a rescaled graph the
    int8 forward and the trained tensors after 20 steps are bit-identical to the golden model's."""
    from test_codegen import STEPS, _data, _forward_ref, _golden, _run

    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.reorder import plan_schedules
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    fc = _layer(graph, W)
    g = rescale.apply(graph, {"weights": {W: [1, 2, 4, 8, 1, 2, 4, 8, 16, 2]}, "outputs": {fc.outputs[0]: 8}})
    tg = build_training_graph(g, TrainPlan.last_k(g, 2), "cross_entropy", OptimizerSpec(kind="momentum"), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:8], y[:8])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9)
    out = _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg,
               {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
               defines={"TT_DUMP_TENSORS": "1"})
    head = tg.tensors[tg.meta["train"]["prediction"]]
    ev = np.frombuffer((tmp_path / "run" / "eval_out.bin").read_bytes(), head.dtype).reshape(16, -1)
    np.testing.assert_array_equal(ev[:8], _forward_ref(tg, x[:8]).reshape(8, -1))
    _, state = _golden(tg, x, y, cfg)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    wb = out["weights.bin"]
    for t in io["trained_tensors"]:
        got = np.frombuffer(wb[t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        if t["dtype"] != "float32":
            np.testing.assert_array_equal(got, state[t["name"]], err_msg=t["name"])


def test_output_clamp_ignores_the_fused_activations_own_bounds():
    """A fused ReLU's output (zero point −128) sits at −128 for every negative pre-activation: that is real 0, not a
    clamp a wider scale would lift; ReLU6's 127 is real 6. Only the range's other ends count."""
    from tinytrain.stages.model.ir import QuantParams, Tensor

    def t(s, z):
        return Tensor(name="o", shape=[1, 4], dtype="int8", quant=QuantParams([s], [z], 0))

    assert uc._clamp_codes(t(0.1, 23), "none") == [-128, 127]
    assert uc._clamp_codes(t(0.1, -128), "relu") == [127]
    assert uc._clamp_codes(t(6 / 255, -128), "relu6") == []
    assert uc._clamp_codes(t(0.01, -128), "relu6") == [127]          # range ends at 2.55 < 6: 127 clamps
