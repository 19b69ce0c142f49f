"""scheme auto on models whose last layers have no bias (issue 10: MobileNetV2's classifier), the lazy analysis,
and the unit memos (issue 15 item 2: content-checked, --force re-measures, counters out of the artifacts).

The bias-less classifier is digits_cnn_int8 (converter-made fixture) with the bias input of its last
FULLY_CONNECTED removed in the IR (the form the TF converter writes for Dense(use_bias=False)); no new file."""

import json
import math
from dataclasses import replace

import pytest

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.planning import auto_plan
from tinytrain.stages.planning import contribution as C
from tinytrain.stages.planning import budget_search as PS
from tinytrain.stages import sparse_plan as SP
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.train_plan import TrainPlan

from test_sparse_plan import FAST, FakeMeasure, fake, graph_of, make_ctx, read  # noqa: F401  (fixtures, helpers)


def biasless_classifier() -> Graph:
    g = graph_of("digits_cnn_int8")
    last = TrainPlan.trainable_ops(g)[-1]
    op = g.ops[last]
    bias = op.inputs[2]
    op.inputs = op.inputs[:2] + [None]
    del g.tensors[bias]
    g.validate()
    return g


def test_biasless_classifier_region_is_empty_and_offers_its_weights():
    g = biasless_classifier()
    us = {uid: (desc, plan) for uid, desc, plan in C.units(g, C.AnalysisSettings())}
    desc, plan = us["bias:1"]
    assert desc.get("empty") and plan is None          # nothing to train: the reference's plan (measured once)
    last = TrainPlan.trainable_ops(g)[-1]
    _, wplan = us[f"weight:{last}:0.125"]
    assert [(lp.bias, lp.weight_ratio) for lp in wplan.layers] == [(False, 0.125)]


def test_auto_on_a_biasless_classifier_trains_something_within_the_budget(tmp_path, fake):
    g = biasless_classifier()
    last = TrainPlan.trainable_ops(g)[-1]
    # The smallest plan (the classifier's weights at 1/8) by the exact measure, plus a little room.
    cost, k, w = SP.smallest_plans(SP.MemoryModel(g, SP.memory_settings({})), 1,
                                   SP.ExactPeaks(g, SP.memory_settings({})))[0]
    assert k == 1 and w == {last: 0.125}
    budget_kb = cost / 1024 + 0.5
    ctx = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": budget_kb})
    res = SP.run(ctx)
    plan = read(ctx, "plan.json")
    assert plan["layers"], "the plan trains nothing"
    assert any(d["weight_ratio"] > 0 for d in plan["layers"]) or any(d["bias"] for d in plan["layers"])
    assert plan["fits"] and plan["exact"]["peak_bytes"] <= budget_kb * 1024
    TrainPlan.from_json(read(ctx, "train_plan.json")).resolve(g)
    # The summary counts what is trained, never "last k biases" of layers that have none.
    b = sum(d["bias"] for d in plan["layers"])
    assert (f"{b} bias" in res.summary) == (b > 0)


def test_budget_below_the_biasless_classifier_names_its_weights(tmp_path, fake):
    g = biasless_classifier()
    ctx = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 0.1})
    with pytest.raises(UserError) as e:
        SP.run(ctx)
    text = str(e.value)
    # The classifier's weights at 1/8 would keep its whole 2.5 KB int8 weight in SRAM beside the 0.8 KB arena (no
    # split kernel reads a fully connected weight's slice: planning/statics.kept_whole), 3.3 KB in all: the smallest
    # plan is the conv's bias, 1.2 KB, and the refusal names it and not a "classifier's bias" that does not exist.
    assert "the bias of op #1 conv2d" in text and "it needs 1.2 KB" in text and "classifier's bias" not in text
    assert fake.calls == 0                                  # refused before anything is measured


def _brute(problem, cap):
    return PS.brute_force(problem, cap).best


@pytest.mark.parametrize("cap", [5, 9, 14, 30, 100])
def test_dp_with_empty_regions_matches_brute_force(cap):
    # Region 1 (the classifier) has no bias; its weights' gains are negative so that "nothing" would win if an
    # empty region were allowed alone.
    problem = PS.Problem(
        bias=[PS.Option(3, 0.0, empty=True), PS.Option(6, 0.05), PS.Option(10, 0.07)],
        weights=[{0.125: PS.Option(2, -0.01), 1.0: PS.Option(6, 0.02)},
                 {0.125: PS.Option(1, 0.03), 0.5: PS.Option(4, 0.06)},
                 {1.0: PS.Option(9, 0.2)}])
    dp, bf = PS.knapsack_dp(problem, cap).best, _brute(problem, cap)
    assert (dp is None) == (bf is None)
    if dp is not None:
        assert math.isclose(dp.gain, bf.gain) and problem.valid(dp.k, dp.ratios)
        assert dp.k != 1 or dp.ratios                        # the empty region never goes alone


def test_lazy_analysis_measures_only_what_the_search_needs(tmp_path, fake, monkeypatch):
    g = graph_of("digits_cnn_int8")
    monkeypatch.setattr(auto_plan, "FULL_ANALYSIS_MAX_UNITS", 0)   # treat the fixture as a large model
    ctx = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16, "analysis": FAST})
    res = SP.run(ctx)
    plan, trace = read(ctx, "plan.json"), read(ctx, "search_trace.json")
    a = plan["analysis"]
    assert a["mode"] == "lazy" and a["units_measured"] < a["units"] == 16
    assert fake.calls == res.metrics["measured_units"] < 16
    assert plan["predicted"]["estimated_options"] == a["chosen_estimated"] == []
    assert trace["analysis"] == a
    text = (ctx.out_dir / "plan.txt").read_text()
    assert "options measured by fine-tuning, the others estimated to first order" in text
    assert "every option of the chosen plan is measured" in text


# ---- unit memos (issue 15 item 2) -------------------------------------------------------------------------

def test_edited_memo_is_dropped_and_remeasured(tmp_path, fake):
    g = graph_of("digits_cnn_int8")
    units = tmp_path / "units"
    r1 = SP.run(make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16}, unit_cache=units))
    first = fake.calls
    assert first == r1.metrics["measured_units"] > 16      # the table's units and the whole plans
    memo = sorted(units.rglob("*.json"))[0]
    doc = json.loads(memo.read_text())
    doc["unit"]["accuracy"] = 7.5                          # 750 %: and the digest no longer matches
    memo.write_text(json.dumps(doc))
    ctx = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16}, unit_cache=units)
    res = SP.run(ctx)
    assert fake.calls == first + 1 and res.metrics["measured_units"] == 1 and res.metrics["dropped_units"] == 1
    assert all(u.get("accuracy") is None or 0 <= u["accuracy"] <= 1 for u in read(ctx, "contributions.json")["units"])
    assert json.loads(memo.read_text())["unit"]["accuracy"] != 7.5      # rewritten with the real measurement


def test_memo_with_a_matching_digest_but_an_impossible_value_is_dropped(tmp_path):
    cache = C.UnitCache(tmp_path)
    cache.put("ab" * 32, {"accuracy": 7.5})
    assert cache.get("ab" * 32) is None and cache.dropped == 1


def test_force_remeasures_and_same_key_gives_same_bytes(tmp_path, fake):
    g = graph_of("digits_cnn_int8")
    units = tmp_path / "units"
    c1 = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16}, unit_cache=units)
    r1 = SP.run(c1)
    c2 = make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16}, unit_cache=units)
    r2 = SP.run(c2)                                        # every unit from its memo
    c3 = replace(make_ctx(tmp_path, g, {"scheme": "auto", "budget_kb": 16}, unit_cache=units), refresh_units=True)
    r3 = SP.run(c3)                                        # --force: measured again
    n = r1.metrics["measured_units"]                       # the table's 16 units and the whole plans
    assert n > 16 and fake.calls == 2 * n
    assert (r2.metrics["measured_units"], r3.metrics["measured_units"]) == (0, n)
    assert r2.metrics["reused_units"] == n and f"{n} reused" in r2.summary
    for name in ("plan.txt", "plan.json", "contributions.json", "search_trace.json", "train_plan.json"):
        assert (c1.out_dir / name).read_bytes() == (c2.out_dir / name).read_bytes() == (c3.out_dir / name).read_bytes()
    assert "units measured" not in (c1.out_dir / "plan.txt").read_text()


# ---- whole-plan choice ----------------------------------------------------------------------------------------

class InterferingMeasure:
    """Accuracy that is not additive: each bias adds 0.01; one trained weight layer adds 0.1, but two or more
    interfere and add only 0.02 together. Every single weight option's Δ is +10 points, so the sum of single gains
    prefers every weight layer at once — which measures worse than any one of them alone."""

    def __init__(self):
        self.calls = 0

    def factory(self, graph, ds, settings, loss=None):
        def measure(plan):
            self.calls += 1
            layers = plan.layers if plan else []
            n_w = sum(1 for lp in layers if lp.weight_ratio > 0)
            return {"accuracy": 0.2 + 0.01 * sum(lp.bias for lp in layers)
                    + (0.1 if n_w == 1 else 0.02 if n_w > 1 else 0.0)}
        return measure


def test_whole_plan_score_beats_the_sum_of_single_gains(tmp_path, monkeypatch):
    f = InterferingMeasure()
    monkeypatch.setattr(C, "make_measure", f.factory)
    g = graph_of("digits_cnn_int8")
    ctx = make_ctx(tmp_path, g, {"scheme": "auto"})           # host: no memory limit, every plan fits
    res = SP.run(ctx)
    plan = read(ctx, "plan.json")
    whole = plan["analysis"]["whole_plan"]
    search, chosen = whole["candidates"][0], whole["candidates"][whole["chosen"]]
    # The additive search picks all three weight layers (summed +33 points); measured as one plan it gains +5.
    assert search["source"] == "search" and len(search["weights_by_op"]) == 3
    assert search["predicted_gain"] == pytest.approx(0.33) and search["measured_gain"] == pytest.approx(0.05)
    # The whole-plan choice has one weight layer (the deepest region's: 3 biases): +13 points measured.
    assert whole["chosen"] != 0 and chosen["source"] in ("sub-plan", "table unit")
    assert len(chosen["weights_by_op"]) == 1 and chosen["k"] == 3
    assert chosen["measured_gain"] == pytest.approx(0.13) == plan["predicted"]["measured_gain"]
    assert chosen["measured_gain"] == max(c["measured_gain"] for c in whole["candidates"])
    trained = [d for d in plan["layers"] if d["weight_ratio"] > 0]
    assert len(trained) == 1 and str(trained[0]["layer"]) in chosen["weights_by_op"]
    # What the files say is the chosen plan's: its own summed prediction and its measured gain.
    assert plan["predicted"]["delta_accuracy"] == pytest.approx(chosen["predicted_gain"])
    assert "ΔAcc +13.0 (measured; +13.0 predicted)" in res.summary and "weights of 1 layer" in res.summary
    text = (ctx.out_dir / "plan.txt").read_text()
    assert "whole plans measured" in text and f"chosen: {chosen['source']}" in text
    # The best measured table units were candidates (already measured: no new fine-tuning for them).
    assert "table unit" in {c["source"] for c in whole["candidates"]}
