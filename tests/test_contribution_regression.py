"""scheme auto for regression (data.task: regression, train.loss: mse): contribution analysis fine-tunes each unit
with the mse loss and scores it by the share of the reference's (no update) MSE removed, 1 - MSE / MSE_ref; the
plan, its summary, plan.txt, contributions.txt and `inspect` speak of MSE, not accuracy. Classification stays
exactly as it was (same keys, same numbers).

Model: the digits CNN fixture with its softmax removed (the FC output is the prediction), quantized as the
quantize stage would; targets a fixed linear map of the float model's output plus an offset, so that retraining
the last layer (and its bias) removes most of the error.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from feature_models import without_softmax
from test_sparse_plan import DIGITS, FAST, graph_of, make_ctx, read
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages.planning import contribution as C
from tinytrain.stages.planning import contribution_text as CT
from tinytrain.stages import sparse_plan as SP
from tinytrain.stages.model.ir import Graph, canonical_json
from tinytrain.stages.planning.memory_model import MemorySettings
from tinytrain.stages.planning.train_plan import TrainPlan

MSE = {"train.loss": "mse"}


def regression_float_model() -> Graph:
    return without_softmax(graph_of("digits_cnn_float"))


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """(int8 graph, DataSpec of the regression npz, float graph)."""
    from tinytrain.stages.golden.forward import run_graph
    from tinytrain.stages.quantize import quantize_model

    root = tmp_path_factory.mktemp("reg")
    g = regression_float_model()
    shape = g.tensors[g.inputs[0]].shape
    x = np.random.default_rng(0).uniform(0, 1, [400] + list(shape[1:])).astype(np.float32)
    f = np.concatenate([run_graph(g, {g.inputs[0]: x[i:i + 64]})[g.outputs[0]] for i in range(0, len(x), 64)])
    a = np.random.default_rng(1).standard_normal((f.shape[1], f.shape[1])).astype(np.float32) * 0.3
    y = (f @ a + 0.5).astype(np.float32)
    np.savez(root / "r.npz", x_train=x[:320], y_train=y[:320], x_test=x[320:], y_test=y[320:])
    q, _ = quantize_model(g, x[:64], QuantizeSpec(num_samples=64))
    return q, DataSpec(source="npz", path=root / "r.npz", task="regression"), g


def smallest_kb(q: Graph) -> float:
    need = SP.exact_peak(q, TrainPlan.bias_only(q, 1), MemorySettings(loss="mse"))["peak_bytes"]
    return math.ceil(need / 1024 * 10) / 10


def check_regression_table(table: dict) -> None:
    assert table["task"] == "regression" and "mean squared error" in table["metric"]
    assert "accuracy" not in table["reference"] and "accuracy" not in json.dumps(table["units"])
    ref = table["reference"]["mse"]
    assert math.isfinite(ref) and ref > 0 and table["reference"]["score"] == 0
    for row in table["bias"] + table["weights"]:
        assert math.isfinite(row["score"]) and math.isfinite(row["delta"]) and row["score"] >= C.SCORE_FLOOR
        assert row["mse"] is None or math.isclose(row["score"], max(C.SCORE_FLOOR, 1 - row["mse"] / ref))


# ---- auto plans regression models ------------------------------------------------------------------------------

def test_auto_regression_plans_within_the_budget_and_speaks_mse(reg, tmp_path):
    q, data, _ = reg
    budget = smallest_kb(q) + 8
    units = tmp_path / "units"
    ctx = make_ctx(tmp_path, q, {"scheme": "auto", "budget_kb": budget, "analysis": FAST}, data=data,
                   unit_cache=units, **MSE)
    res = SP.run(ctx)
    plan = read(ctx, "plan.json")
    assert plan["budget_bytes"] == round(budget * 1024) and plan["fits"]
    assert plan["exact"]["peak_bytes"] <= plan["budget_bytes"]
    assert plan["memory_settings"]["loss"] == "mse"
    table = read(ctx, "contributions.json")
    check_regression_table(table)
    assert res.metrics["measured_units"] > 16 and len(table["bias"]) == 3 and len(table["weights"]) == 12
    # Training the last layer is a real improvement: its bias alone, and its weights on top of it.
    bias = {b["k"]: b for b in table["bias"]}
    fc = {w["ratio"]: w for w in table["weights"] if w["op"] == 3}
    assert bias[1]["delta"] > 0.05 and bias[1]["mse"] < table["reference"]["mse"]
    assert fc[1.0]["delta"] > 0.3 and fc[1.0]["score"] > 0.5
    # The prediction is in MSE, not accuracy.
    p = plan["predicted"]
    assert p["metric"] == "mse" and "delta_accuracy" not in p and "reference_accuracy" not in p
    assert p["reference_mse"] == table["reference"]["mse"]
    # Each chosen option removes its share of the error the others leave: never an MSE of exactly 0 (issue 10),
    # even when the summed gains exceed the whole reference error.
    wts = {(str(w["op"]), w["ratio"]): w for w in table["weights"]}
    parts = [bias[p["k"]]["delta"]] + [wts[(op, r)]["delta"] for op, r in p["weights"].items()]
    assert math.isclose(p["delta_score"], sum(parts))
    assert math.isclose(p["predicted_mse"], p["reference_mse"] * math.prod(1 - d for d in parts))
    assert p["predicted_mse"] > 0
    assert p["delta_score"] > 0.3 and p["predicted_mse"] < p["reference_mse"]
    # The summary gives the chosen plan's MSE measured as a whole plan.
    measured_mse = p["reference_mse"] * (1 - p["measured_gain"])
    assert res.summary.startswith("auto: ") and f"MSE {p['reference_mse']:.4g} → {measured_mse:.4g} (measured)" \
        in res.summary and "ΔAcc" not in res.summary
    assert res.metrics["predicted_delta_score"] == p["delta_score"] and "predicted_delta_accuracy" not in res.metrics
    text = (ctx.out_dir / "plan.txt").read_text()
    assert "predicted: MSE" in text and "reference (no update): MSE" in text
    assert "accuracy" not in text and "acc " not in text
    inspected = SP.inspect(ctx.out_dir)
    assert "Δ: points of the reference MSE removed" in inspected and "accuracy" not in inspected
    assert "MSE" in SP.inspect(ctx.out_dir / "contributions.json")
    assert read(ctx, "search_trace.json")["metric"] == "mse"

    # Another budget: every table unit comes from the unit cache, the table is the same, the plan fits the new
    # budget; only whole plans not measured before are measured.
    big = budget + 40
    ctx2 = make_ctx(tmp_path, q, {"scheme": "auto", "budget_kb": big, "analysis": FAST}, data=data,
                    unit_cache=units, **MSE)
    res2 = SP.run(ctx2)
    t2 = read(ctx2, "contributions.json")
    assert res2.metrics["reused_units"] >= 16 and "measured" not in t2
    assert res2.metrics["measured_units"] <= len(read(ctx2, "plan.json")["analysis"]["whole_plan"]["candidates"])
    assert [u["mse"] for u in t2["units"]] == [u["mse"] for u in table["units"]]
    plan2 = read(ctx2, "plan.json")
    assert plan2["fits"] and plan2["exact"]["peak_bytes"] <= plan2["budget_bytes"] == round(big * 1024)
    w2 = plan2["analysis"]["whole_plan"]
    assert plan2["predicted"]["measured_gain"] == max(c["measured_gain"] for c in w2["candidates"])


def test_budget_below_the_smallest_plan_is_refused_before_measuring(reg, tmp_path):
    q, data, _ = reg
    with pytest.raises(UserError, match="too small for the smallest plan, the bias of op"):
        SP.run(make_ctx(tmp_path, q, {"scheme": "auto", "budget_kb": 0.25, "analysis": FAST}, data=data, **MSE))


def test_contribution_stage_regression(reg, tmp_path):
    """The stand-alone stage (no train.loss in its config: the data decides) and sparse-plan reading its table."""
    q, data, _ = reg
    cctx = make_ctx(tmp_path, q, {"scheme": "auto"}, data=data,
                    **{"train.update.scheme": "auto", "train.update.analysis": {**FAST}})
    res = C.run(cctx)
    assert "reference MSE" in res.summary and "acc" not in res.summary
    assert math.isfinite(res.metrics["reference_mse"]) and "reference_accuracy" not in res.metrics
    check_regression_table(read(cctx, "contributions.json"))
    txt = (cctx.out_dir / "contributions.txt").read_text()
    assert "reference (no update): MSE" in txt and "accuracy" not in txt and "acc " not in txt
    up = {"contribution/contributions.json": cctx.out_dir / "contributions.json"}
    ctx = make_ctx(tmp_path, q, {"scheme": "auto", "analysis": FAST}, data=data, extra_inputs=up, **MSE)
    r = SP.run(ctx)
    plan = read(ctx, "plan.json")        # no table unit measured again: only whole plans that are not table units
    assert r.metrics["measured_units"] <= len(plan["analysis"]["whole_plan"]["candidates"])
    assert plan["predicted"]["metric"] == "mse"


# ---- diverged units --------------------------------------------------------------------------------------------

def test_diverged_regression_units_score_the_worst(reg, tmp_path):
    """A unit whose predictions blow up records mse null / diverged and scores the floor; nothing crashes, the
    JSON has no NaN, the search still plans."""
    q, _, _ = reg

    def measure(plan):
        if plan is None:
            return {"mse": 4.0}
        if any(lp.weight_ratio >= 0.5 for lp in plan.layers):
            return {"mse": float("nan"), "train_loss": float("inf")}
        if any(lp.weight_ratio for lp in plan.layers):
            return {"mse": float("inf")}
        return {"mse": 4.0 - 0.5 * len(plan.layers), "train_loss": 1.0}

    table = C.analyse(q, measure, C.AnalysisSettings(), graph_dig="g", data_dig="d", task="regression")
    C.write_table(tmp_path / "contributions.json", table)        # allow_nan=False: raises on NaN/inf
    check_regression_table(table)
    diverged = [u for u in table["units"] if u.get("diverged")]
    assert len(diverged) == 12 and all(u["mse"] is None and u["score"] == C.SCORE_FLOOR for u in diverged)
    assert all("train_loss" not in u for u in diverged)
    assert all(w["delta"] < 0 for w in table["weights"])
    assert "diverged (scored -100, the worst)" in CT.table_text(table)
    from tinytrain.stages.planning.memory_model import MemoryModel
    plan, predicted, _, _ = SP.plan_auto(MemoryModel(q, MemorySettings(loss="mse")), table, 1 << 40)
    assert not any(lp.weight_ratio for lp in plan.layers) and predicted["delta_score"] > 0
    # A floored (not diverged) unit: MSE far above the reference's.
    t2 = C.analyse(q, lambda p: {"mse": 1.0 if p is None else 50.0}, C.AnalysisSettings(max_layers=1),
                   graph_dig="g", data_dig="d", task="regression")
    assert all(r["score"] == C.SCORE_FLOOR for r in t2["bias"] + t2["weights"])


def test_real_run_with_a_huge_learning_rate_does_not_crash(reg, tmp_path):
    q, data, _ = reg
    ctx = make_ctx(tmp_path, q, {"scheme": "auto", "analysis": {**FAST, "learning_rate": 10.0}}, data=data, **MSE)
    SP.run(ctx)
    table = read(ctx, "contributions.json")
    check_regression_table(table)
    assert any(u.get("diverged") for u in table["units"])


# ---- task and loss must agree; keys keep the kinds apart ---------------------------------------------------------

def test_loss_and_task_must_agree(reg, tmp_path, monkeypatch):
    q, data, _ = reg
    calls = []
    monkeypatch.setattr(C, "make_measure", lambda *a: calls.append(a) or (lambda plan: {"accuracy": 0.5}))
    with pytest.raises(UserError, match="train.loss is mse, but the data are class labels"):
        SP.run(make_ctx(tmp_path, graph_of("digits_cnn_int8"), {"scheme": "auto", "budget_kb": 64}, data=DIGITS,
                        **MSE))
    with pytest.raises(UserError, match="set train.loss: mse"):
        SP.run(make_ctx(tmp_path / "r", q, {"scheme": "auto", "budget_kb": 64}, data=data,
                        **{"train.loss": "cross_entropy"}))
    assert calls == []


def test_unit_keys_keep_the_tasks_apart_and_classification_keys_unchanged():
    g = graph_of("digits_cnn_int8")
    s = C.AnalysisSettings()
    plan = TrainPlan.bias_only(g, 1)
    old = hashlib.sha256(canonical_json({"unit_version": C.UNIT_VERSION, "graph": "g", "data": "d",
                                         "plan": plan.to_json(), "settings": s.unit_json()}).encode()).hexdigest()
    assert C.unit_key("g", "d", plan, s) == old                              # existing caches stay valid
    assert C.unit_key("g", "d", plan, s, "regression") != old
    cache = C.UnitCache(Path("/nonexistent"))
    assert cache.get("ab") is None


def test_unit_cache_does_not_mix_tasks(tmp_path):
    g = graph_of("digits_cnn_int8")
    cache = C.UnitCache(tmp_path / "units")
    n = {"cls": 0, "reg": 0}

    def cls(plan):
        n["cls"] += 1
        return {"accuracy": 0.5}

    def regr(plan):
        n["reg"] += 1
        return {"mse": 1.0 if plan is None else 0.5}

    s = C.AnalysisSettings(max_layers=1)
    C.analyse(g, cls, s, graph_dig="g", data_dig="d", cache=cache)
    t = C.analyse(g, regr, s, graph_dig="g", data_dig="d", cache=cache, task="regression")
    assert n == {"cls": 6, "reg": 6} and t["bias"][0]["delta"] == 0.5
    t = C.analyse(g, regr, s, graph_dig="g", data_dig="d", cache=cache, task="regression", known=t)
    c = C.analyse(g, cls, s, graph_dig="g", data_dig="d", cache=cache)
    assert n == {"cls": 6, "reg": 6} and t["reused"] == c["reused"] == 6 and "task" not in c


def test_regression_needs_one_output_matching_the_targets(reg, tmp_path):
    from dataclasses import replace

    from tinytrain.stages.train.data import load_dataset
    _, data, g = reg
    ds = load_dataset(data)
    narrow = replace(ds, y_train=ds.y_train[:, :3], y_test=ds.y_test[:, :3])   # 3 targets, the model has 10
    with pytest.raises(UserError, match=r"3 value\(s\) per sample but the model has 10"):
        C.make_measure(g, narrow, C.AnalysisSettings(**FAST))
    assert C.outputs_per_sample(g) == 10
    two = Graph(tensors=g.tensors, ops=g.ops, inputs=g.inputs, outputs=g.outputs * 2, meta=g.meta)
    with pytest.raises(UserError, match="2 outputs"):
        C.make_measure(two, ds, C.AnalysisSettings(**FAST))


# ---- classification is unchanged ---------------------------------------------------------------------------------

# digits_cnn_int8 on DIGITS with FAST settings (test_sparse_plan.test_real_measurement_is_deterministic_and_plans),
# measured before regression support existed: correct answers out of 48 per unit, in unit order.
GOLDEN_CORRECT = [11, 11, 12, 14, 11, 17, 18, 20, 13, 12, 18, 21, 18, 18, 18, 18]


def test_classification_table_is_unchanged(tmp_path):
    g = graph_of("digits_cnn_int8")
    table = C.compute_table(g, DIGITS, C.AnalysisSettings(**FAST))
    assert set(table) == {"version", "metric", "graph", "data", "settings", "layers", "reference", "bias",
                          "weights", "units", "measured", "reused", "dropped", "estimated_only"}
    assert table["metric"] == "top-1 accuracy on held-out train samples (fraction)"
    assert set(table["reference"]) == {"accuracy"}
    assert all(set(b) == {"k", "earliest_op", "accuracy", "delta"} for b in table["bias"])
    assert all(set(w) == {"op", "ratio", "position", "channels", "accuracy", "reference_k", "delta"}
               for w in table["weights"])
    correct = [round(u["accuracy"] * 48) for u in table["units"]]
    assert correct == GOLDEN_CORRECT
    text = CT.table_text(table)
    assert "reference (no update): accuracy" in text and "MSE" not in text


# ---- a real build: the spec's train.loss reaches the stage, the runner's unit cache serves a budget change --------

def test_build_regression_auto_reuses_units_when_only_the_budget_changes(reg, tmp_path):
    import yaml

    from tinytrain.pipeline.console import BuildLog
    from tinytrain.pipeline.runner import build
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.stage_graph import stage
    from tinytrain.pipeline.workspace import open_cache
    from tinytrain.stages.model.tflite_writer import write_model

    q, data, g = reg
    write_model(g, tmp_path / "net.tflite")
    table = (stage("load"), stage("quantize"), stage("sparse-plan"))
    small = smallest_kb(q) + 2

    def build_with(budget_kb):
        doc = {"model": {"path": "net.tflite"}, "data": {"source": "npz", "path": str(data.path), "task": "regression"},
               "train": {"loss": "mse", "update": {"scheme": "auto", "budget_kb": budget_kb, "analysis": FAST}},
               "build": {"out_dir": "out"}}
        (tmp_path / "tt.yaml").write_text(yaml.safe_dump(doc))
        spec = load_spec(tmp_path / "tt.yaml")
        r = build(spec, open_cache(spec), BuildLog(quiet=True), stages=table)
        assert r.error is None, r.error
        d = tmp_path / "out" / "tt" / "sparse-plan"
        m = next(o.metrics for o in r.outcomes if o.stage == "sparse-plan")
        return (json.loads((d / "plan.json").read_text()), {**json.loads((d / "contributions.json").read_text()),
                                                            "measured": m["measured_units"],
                                                            "reused": m["reused_units"]})

    plan, t1 = build_with(small)
    assert t1["task"] == "regression" and t1["measured"] >= 16 and plan["memory_settings"]["loss"] == "mse"
    assert plan["fits"] and plan["predicted"]["metric"] == "mse"
    plan2, t2 = build_with(small + 30)
    assert t2["reused"] >= 16 and plan2["fits"]
    assert t2["measured"] <= len(plan2["analysis"]["whole_plan"]["candidates"])     # whole plans only
    assert plan2["budget_bytes"] == round((small + 30) * 1024)
