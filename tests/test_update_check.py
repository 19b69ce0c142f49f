"""Int8 updates that never vanish silently (issue 17, item 1; stages/quant/update_check.py).

The probe is pinned against the golden model (stages/golden/train_step.py + stages/quant/qas.py): the Δ it measures is
recomputed here from the sample's gradient by the QAS formula (Δ = −lr·g/s) and the lost elements counted with
|Δ| < 1/2; its shadow update leaves training untouched; the integer change the real update then applies is
round(Δ). The planner picks the master copy, else stochastic rounding, as the budget allows, and warns otherwise;
run.json's re-check warns at the run's learning rate. Accuracy is measured by bench/int8_vs_fp32.py, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from test_sparse_plan import make_ctx
from tinytrain.pipeline.contract import StageContext
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.stages.quant import qas
from tinytrain.stages import sparse_plan as SP
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.quant import update_check as uc
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan

FIX = Path(__file__).parent / "fixtures"
DIGITS = DataSpec(source="digits", test_fraction=0.2)
W = "digits_cnn_1/dense_1/MatMul"      # the classifier's weight (int8, per output channel)
B = "digits_cnn_1/dense_1/BiasAdd"


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_model(FIX / "digits_cnn_int8.tflite")


@pytest.fixture(scope="module")
def data():
    from tinytrain.stages.train.data import load_dataset
    ds = load_dataset(DIGITS)
    return ds.x_train[:64], ds.y_train[:64]


def _scale(tg: Graph, p: str) -> np.ndarray:
    return np.asarray(tg.tensors[f"qas/{p}/scale"].data, np.float32)


# ---- the probe against the golden model ----------------------------------------------------------------

def test_sgd_probe_counts_exactly_the_updates_below_half_a_step(graph, data):
    """One SGD step: Δ = −(lr·g)/s per element (float32, qas.py's formula), recomputed from the golden model's
    gradient; lost = Δ ≠ 0 with |Δ| < 1/2. The probe's counts are exactly these."""
    x, y = data
    plan = TrainPlan.last_k(graph, 1)
    lr = 0.01
    got = uc.probe(graph, plan, loss="cross_entropy", optimizer="sgd", qas_enabled=True, learning_rate=lr,
                   x=x, y=y, steps=1, seed=3)
    tg = build_training_graph(graph, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                              QASOptions(True, "nearest", False))
    i = int(np.random.default_rng(3).permutation(len(x))[0])
    values = te.run_sample(tg, te.init_state(tg), x[i:i + 1], y[i:i + 1])
    for p in (W, B):
        g = values[tg.meta["train"]["trained"][p]["gradient"]].astype(np.float32)
        s = _scale(tg, p).reshape([-1] + [1] * (g.ndim - 1)) if g.ndim > 1 else _scale(tg, p)
        delta = (-(np.float32(lr) * g) / s).astype(np.float32)
        moving = delta != 0
        lost = moving & (np.abs(delta) < 0.5)
        assert got[p]["updates"] == int(moving.sum()) > 0
        assert got[p]["lost"] == int(lost.sum())
        assert got[p]["lost_fraction"] == int(lost.sum()) / int(moving.sum())
        mass = np.abs(delta.astype(np.float64))
        assert got[p]["lost_mass"] == pytest.approx(mass[lost].sum() / mass[moving].sum(), rel=1e-12)
    # The classifier's int8 output (the logits) at the ends of its range: where its gradient stops.
    out = next(op.outputs[0] for op in graph.ops if op.type == "fully_connected")
    v = np.asarray(values[out])
    assert got[W]["output_clamped"] == got[B]["output_clamped"] == float(np.sum((v == -128) | (v == 127))) / v.size


def test_output_clamps_are_counted_once_per_layer_output_and_sample(graph, data, monkeypatch):
    """The weight and the bias of a layer share its output: the probe counts that output's clamped codes once per
    sample, and the same count is the head-room's share at the scale as it is (output_over[0])."""
    x, y = data
    # lr 0.5: the logits reach the ends of their int8 range within 5 steps (about a third of them then).
    kw = dict(loss="cross_entropy", optimizer="sgd", qas_enabled=True, learning_rate=0.5, x=x, y=y, steps=5)
    calls = []
    real = np.isin
    monkeypatch.setattr(uc.np, "isin", lambda a, b, **k: calls.append(np.shape(a)) or real(a, b, **k))
    got = uc.probe(graph, TrainPlan.last_k(graph, 1), **kw)
    out = next(op.outputs[0] for op in graph.ops if op.type == "fully_connected")
    assert calls == [tuple(graph.tensors[out].shape)] * 5           # 5 samples, one trained layer
    reach = uc.probe(graph, TrainPlan.last_k(graph, 1), **kw, output_reach=True)
    assert got[W]["output_clamped"] == got[B]["output_clamped"] == reach[W]["output_over"][0] > 0


def test_adam_below_half_a_step_loses_every_update(graph, data):
    """Adam's first step moves every element by lr·g/(|g|+eps)/s ≤ lr/s: with lr < min(s)/2 nearest rounding
    erases all of them, and the detector says so (the issue's Adam lr 0.001 case)."""
    x, y = data
    plan = TrainPlan.last_k(graph, 1)
    lr = 0.45 * float(np.min(graph.tensors[W].quant.scale))
    got = uc.probe(graph, plan, loss="cross_entropy", optimizer="adam", qas_enabled=True, learning_rate=lr,
                   x=x, y=y, steps=1)
    assert got[W]["updates"] > 0 and got[W]["lost"] == got[W]["updates"]
    assert got[W]["lost_fraction"] == 1.0 and got[W]["lost_mass"] == 1.0
    assert uc.vanishing(got) == [W]


@pytest.mark.parametrize("kind,rounding", [("sgd", "nearest"), ("adam", "nearest"), ("rmsprop", "nearest"),
                                           ("momentum", "nearest")])
def test_shadow_delta_leaves_training_alone_and_is_what_the_update_rounds(graph, data, kind, rounding):
    """The shadow run changes no tensor of the step (parameters, optimizer state, gradients); the real update that
    follows moves each int8 weight by exactly clip(round_nearest(Δ)) (Δ the shadow's value)."""
    x, y = data
    plan = TrainPlan.last_k(graph, 1)
    tg = build_training_graph(graph, plan, "cross_entropy", OptimizerSpec(kind=kind), 1,
                              QASOptions(True, rounding, False))
    runtime = {"learning_rate": 0.05}
    defaults = tg.meta["train"]["runtime_defaults"]
    state = te.init_state(tg)
    for i in range(3):
        values = te.run_sample(tg, state, x[i:i + 1], y[i:i + 1])
        for op in tg.ops[int(tg.meta["train"]["sample_ops"]):]:
            if op.type == "step_counter":
                state[op.inputs[0]][...] += 1
                continue
            before = {k: np.array(v, copy=True) for k, v in values.items() if isinstance(v, np.ndarray)}
            delta = uc._shadow_delta(op, values, runtime, defaults)
            for k, v in before.items():
                np.testing.assert_array_equal(values[k], v, err_msg=k)
            p_old = values[op.inputs[0]].astype(np.int64).copy()
            te._qas_update(op, values, runtime, defaults)
            lo, hi = op.attrs["bounds"]
            want = np.clip(p_old + qas.round_nearest(delta), lo, hi)
            np.testing.assert_array_equal(values[op.inputs[0]].astype(np.int64), want, err_msg=op.inputs[0])


def test_frozen_prefix_computed_once_gives_the_same_probe(graph, data, monkeypatch):
    """The probe computes the frozen prefix (forward ops that read only the sample and constants) once per sample
    and reuses it on later visits and in a later probe with the same prefix: the same figures as computing every
    op on every visit, with the prefix's kernels run once per distinct sample."""
    from tinytrain.stages.golden import forward as fwd_exec

    x, y = data[0][:8], data[1][:8]
    plan = TrainPlan.last_k(graph, 1)
    kw = dict(loss="cross_entropy", optimizer="sgd", qas_enabled=True, learning_rate=0.01, x=x, y=y, steps=20)
    tg = build_training_graph(graph, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                              QASOptions(True, "nearest", False))
    prefix = uc.FrozenOps(tg, te.init_state(tg))
    split = int(tg.meta["train"]["sample_ops"])
    fwd = [i for i, op in enumerate(tg.ops[:split]) if op.type in te._FORWARD_OPS]
    assert prefix.ops and prefix.ops < set(fwd)           # the convs are frozen, the classifier is not
    assert prefix.frontier and len(prefix.frontier) < len(prefix.ops)
    calls = []
    real = fwd_exec.run_op
    monkeypatch.setattr(fwd_exec, "run_op", lambda g, op, v, **k: calls.append(k["index"]) or real(g, op, v, **k))
    shared = uc.PrefixCache(x)
    first = uc.probe(graph, plan, **kw, prefix_cache=shared)
    again = uc.probe(graph, plan, **kw, prefix_cache=shared)
    frozen_calls = sum(1 for i in calls if i in prefix.ops)
    assert frozen_calls == len(prefix.ops) * len(x)          # 40 visits of 8 samples: the prefix ran 8 times
    monkeypatch.setattr(fwd_exec, "run_op", real)
    monkeypatch.setattr(uc.PrefixCache, "forward_op", lambda self, prefix, sample: None)   # every op, every visit
    plain = uc.probe(graph, plan, **kw)
    assert first == again == plain
    # Another plan (the last two layers trained) has another prefix: it shares nothing with this one.
    other = uc.FrozenOps(*(lambda g: (g, te.init_state(g)))(
        build_training_graph(graph, TrainPlan.last_k(graph, 2), "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                             QASOptions(True, "nearest", False))))
    assert other.fingerprint != prefix.fingerprint and other.ops < prefix.ops


def test_float_graph_has_nothing_to_probe(data):
    g = read_model(FIX / "digits_cnn_float.tflite")
    x, y = data
    assert uc.probe(g, TrainPlan.last_k(g, 1), loss="cross_entropy", optimizer="adam", qas_enabled=True,
                    learning_rate=1e-3, x=x.astype(np.float32), y=y, steps=1) == {}


# ---- the decision ------------------------------------------------------------------------------------------

def _t(lost_mass: float) -> dict:
    return {"updates": 100, "lost": int(lost_mass * 100), "lost_fraction": lost_mass, "lost_mass": lost_mass,
            "median_abs_delta": 0.1, "saturated": 0, "dtype": "int8", "elements": 100}


PEAKS = {("nearest", False): 1000, ("nearest", True): 1400, ("stochastic", False): 1008}


def _decide(tensors, budget, **kw):
    args = {"qas_enabled": True, "rounding": "nearest", "master_copy": False, **kw}
    return uc.decide(tensors, budget=budget, peak=lambda r, m: PEAKS[(r, m)], **args)


def test_planner_picks_the_master_copy_when_it_fits():
    d = _decide({"w": _t(0.9), "b": _t(0.0)}, budget=1500)
    assert d["action"] == "master_copy" and d["qas"] == {"enabled": True, "rounding": "nearest", "master_copy": True}
    assert d["cost_bytes"] == 400 and d["vanishing"] == ["w"] and d["warning"] is None
    assert uc.train_plan_fields(d) == {"qas": d["qas"]}
    assert _decide({"w": _t(0.9)}, budget=None)["action"] == "master_copy"   # no limit (host)


def test_planner_falls_back_to_stochastic_rounding_then_warns():
    d = _decide({"w": _t(0.9)}, budget=1200)
    assert d["action"] == "stochastic" and d["qas"]["rounding"] == "stochastic" and d["cost_bytes"] == 8
    d = _decide({"w": _t(0.9)}, budget=1004)
    assert d["action"] == "warn" and d["qas"] == d["requested"] and uc.train_plan_fields(d) == {}
    assert "90% of the update of w" in d["warning"] and "fits the budget (1004 bytes)" in d["warning"]
    # a (fixed) plan over the budget without any remedy: stochastic rounding's PRNG bytes are not what decides it
    d = _decide({"w": _t(0.9)}, budget=900)
    assert d["action"] == "stochastic" and "over the budget without it too" in d["reason"]


def test_planner_keeps_the_spec_when_nothing_vanishes_or_it_already_carries_updates():
    d = _decide({"w": _t(0.4)}, budget=1500)
    assert d["action"] == "none" and uc.train_plan_fields(d) == {} and d["warning"] is None
    for kw in ({"rounding": "stochastic"}, {"master_copy": True}):
        d = _decide({"w": _t(0.9)}, budget=1500, **kw)
        assert d["action"] == "kept" and d["qas"] == d["requested"] and d["warning"] is None


def test_qas_off_warns_why_it_cannot_learn():
    d = _decide({"w": _t(1.0)}, budget=None, qas_enabled=False)
    assert d["action"] == "warn" and not d["qas"]["master_copy"]
    assert "train.qas.enabled is false" in d["warning"] and "set train.qas.enabled: true" in d["warning"]


# ---- the stage: plan.json, train_plan.json, plan.txt, the summary; emulate-run's run.json field -------------------

def _stage(tmp: Path, graph: Graph, kind: str, budget_kb=None, **qas_cfg) -> tuple[dict, dict, str, str, Path]:
    ctx = make_ctx(tmp, graph, {"scheme": "last_k", "k": 1, "budget_kb": budget_kb}, data=DIGITS,
                   **{"train.optimizer.kind": kind,
                      "train.qas": {"enabled": True, "rounding": "nearest", "master_copy": False, **qas_cfg}})
    res, out = SP.run(ctx), ctx.out_dir
    return (json.loads((out / "plan.json").read_text()), json.loads((out / "train_plan.json").read_text()),
            (out / "plan.txt").read_text(), res.summary, out)


def test_sparse_plan_gives_adam_a_master_copy_and_sgd_nothing(graph, tmp_path):
    doc, tp, text, summary, out = _stage(tmp_path, graph, "adam")
    u = doc["updates"]
    assert u["learning_rate"] == 0.001 and u["action"] == "master_copy" and W in u["vanishing"]
    assert u["tensors"][W]["lost_mass"] > uc.LOST_THRESHOLD
    assert tp["qas"] == {"enabled": True, "rounding": "nearest", "master_copy": True}
    assert "fp32 master copy" in summary and f"costs {u['cost_bytes']} bytes" in text
    assert u["cost_bytes"] == 4 * int(np.prod(graph.tensors[W].shape))   # the fp32 copy of the trained weight
    # run.json judges what the firmware was compiled with (its checkpoint layout lists master copies and PRNG
    # streams), so a build whose autodiff did not apply the plan's choice still warns.
    inputs = {f"sparse-plan/{n}": out / n for n in ("update_check.json", "train_plan.json")}
    cfg = {"data": DIGITS, "train.optimizer": {"kind": "adam"}, "train.batch_size": 1}
    with_master = {"checkpoint": {"tensors": [{"name": f"opt/{W}/master", "role": "optimizer"}]}}
    assert uc.for_run(inputs, graph, cfg, with_master, 0.001)["warning"] is None
    assert uc.for_run(inputs, graph, cfg, {}, 0.001)["warning"] is None         # no layout: the plan's word
    r = uc.for_run(inputs, graph, cfg, {"checkpoint": {"tensors": []}}, 0.001)
    assert r["qas"]["master_copy"] is False and W in r["warning"]
    # autodiff applies the plan's choice over the spec's train.qas: the trained weight gets its fp32 master copy.
    from tinytrain.stages import autodiff as AD

    ad_out = tmp_path / "autodiff"
    ad_out.mkdir()
    ad_inputs = {"quantize/graph.json": tmp_path / "quantize" / "graph.json",
                 "quantize/tensors.npz": tmp_path / "quantize" / "tensors.npz",
                 "sparse-plan/train_plan.json": out / "train_plan.json"}
    AD.run(StageContext(config={"train.optimizer": {"kind": "adam"}, "train.batch_size": 1,
                                "train.qas": {"enabled": True, "rounding": "nearest", "master_copy": False}},
                        inputs=ad_inputs, out_dir=ad_out))
    assert f"opt/{W}/master" in {t["name"] for t in json.loads((ad_out / "train_graph.json").read_text())["tensors"]}
    doc, tp, text, summary, _ = _stage(tmp_path, graph, "sgd")
    assert doc["updates"]["action"] == "none" and "qas" not in tp and "WARNING" not in summary
    assert "int8 updates (probe" in text


def test_sparse_plan_warns_when_no_remedy_fits(graph, tmp_path):
    doc, _, _, _, _ = _stage(tmp_path, graph, "adam")
    peaks = doc["updates"]["peaks_bytes"]
    # plan.json's exact peak is the one of the rule the planner chose (what autodiff builds)
    assert doc["updates"]["action"] == "master_copy" and doc["exact"]["peak_bytes"] == peaks["master_copy"]
    assert doc["memory_settings"]["master_copy"] is True
    assert peaks["nearest"] < peaks["stochastic"] < peaks["master_copy"]
    doc, tp, _, summary, _ = _stage(tmp_path, graph, "adam", budget_kb=peaks["stochastic"] / 1024)
    assert doc["updates"]["action"] == "stochastic" and tp["qas"]["rounding"] == "stochastic"
    assert doc["exact"]["peak_bytes"] == peaks["stochastic"] and doc["fits"] is True
    assert doc["updates"]["cost_bytes"] == peaks["stochastic"] - peaks["nearest"]
    doc, tp, text, summary, out = _stage(tmp_path, graph, "adam", budget_kb=peaks["nearest"] / 1024)
    assert doc["updates"]["action"] == "warn" and "qas" not in tp and doc["exact"]["peak_bytes"] == peaks["nearest"]
    assert "WARNING" in summary and "of the update of" in summary and "WARNING" in text
    # emulate-run's re-check at the run's rate reads what the plan compiled and warns in run.json.
    inputs = {f"sparse-plan/{n}": out / n for n in ("update_check.json", "train_plan.json")}
    cfg = {"data": DIGITS, "train.optimizer": {"kind": "adam"}, "train.batch_size": 1}
    r = uc.for_run(inputs, graph, cfg, {"loss": "cross_entropy"}, 0.001)
    assert r["warning"] and W in r["vanishing"] and r["lost_mass"][W] > uc.LOST_THRESHOLD
    # At a rate large enough for its steps to survive rounding there is nothing to warn about.
    r = uc.for_run(inputs, graph, cfg, {"loss": "cross_entropy"}, 0.05)
    assert r["warning"] is None


def test_sparse_plan_says_why_qas_off_cannot_learn(graph, tmp_path):
    doc, tp, text, summary, out = _stage(tmp_path, graph, "sgd", enabled=False)
    assert doc["updates"]["action"] == "warn" and "qas" not in tp
    assert "train.qas.enabled is false" in summary and "set train.qas.enabled: true" in summary
    assert "WARNING: train.qas.enabled is false" in text
    # run.json (emulate-run's re-check at the run's rate) says it too
    inputs = {f"sparse-plan/{n}": out / n for n in ("update_check.json", "train_plan.json")}
    r = uc.for_run(inputs, graph, {"data": DIGITS, "train.optimizer": {"kind": "sgd"}, "train.batch_size": 1},
                   {"loss": "cross_entropy"}, 0.01)
    assert r["qas"]["enabled"] is False and "train.qas.enabled is false" in r["warning"]
