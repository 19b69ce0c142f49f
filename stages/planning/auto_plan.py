"""sparse-plan's `auto` scheme: the contribution table (contribution.py), the search (plan_search.py) under the
budget, the exact verification of the choice, and the whole-plan choice.

Small models (at most FULL_ANALYSIS_MAX_UNITS units) measure every option; larger ones are analysed lazily
(`auto_search`). The search adds single options' gains (TTE's additive model), which overstates plans whose
options overlap (two layers' updates that fix the same error). So the final choice measures whole plans
(`whole_plan_choice`): the search's best plan per region size k that fits, and the additive winner's nested
sub-plans, each fine-tuned as one unit, and keeps the best measured one (see there).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tinytrain.pipeline.contract import StageContext
from tinytrain.stages.planning import contribution as contrib
from tinytrain.stages.planning.contribution import SCORE_FLOOR
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.train.losses import heads_from, loss_config
from tinytrain.stages.planning.plan_exact import ExactPeaks, ExactUnavailable
from tinytrain.stages.planning.memory_model import WEIGHT_RATIOS, MemoryModel, kb, short_name
from tinytrain.stages.planning.plan_report import _ratio_text
from tinytrain.stages.planning.budget_search import Choice, Option, Problem, SearchResult, search
from tinytrain.stages.planning.train_plan import LayerPlan, PlanError, TrainPlan


NO_LIMIT = 1 << 62      # capacity of the search when the board sets no limit (host)


def build_problem(mm: MemoryModel, table: dict[str, Any]) -> tuple[Problem, list[int]]:
    """The search problem from the memory model and a contribution table. Returns it and the op index of each
    position from the end (0 = the classifier). A region without any bias is an `empty` option: it prices the
    gradient's way down to its layers and gains nothing by itself, so the search takes it only with a weight."""
    positions = [lay.op_index for lay in reversed(mm.layers)]
    bias_delta = {b["k"]: float(b["delta"]) for b in table["bias"]}
    depth = len(bias_delta)
    bias: list[Option | None] = []
    for k in range(1, depth + 1):
        opt = mm.bias_option(k)
        bias.append(Option(int(opt["total"]), bias_delta[k], empty=not opt["biases"]))
    wdelta = {(w["op"], float(w["ratio"])): float(w["delta"]) for w in table["weights"]}
    weights = []
    for j in range(depth):
        op = positions[j]
        weights.append({r: Option(int(mm.weight_cost(op, r)["total"]), wdelta[(op, r)])
                        for r in WEIGHT_RATIOS if (op, r) in wdelta})
    for k in range(1, depth + 1):       # an empty region with no weight to offer is no choice at all
        if bias[k - 1].empty and not any(weights[j] for j in range(k)):
            bias[k - 1] = None
    return Problem(bias, weights), positions


def smallest_region_plan(mm: MemoryModel, k: int) -> tuple[int, dict[int, float]] | None:
    """(analytic cost, weights by op) of region k's cheapest useful plan: its biases, or when none of its layers
    has a bias, the cheapest weight option in it (every ratio the planner supports is priced)."""
    opt = mm.bias_option(k)
    if opt["biases"]:
        return int(opt["total"]), {}
    region = mm.layers[len(mm.layers) - k:]
    cost, op, r = min((mm.weight_cost(lay.op_index, r)["total"], lay.op_index, r)
                      for lay in region for r in WEIGHT_RATIOS)
    return int(opt["total"] + cost), {op: r}


def smallest_plans(mm: MemoryModel, depth: int, exact: ExactPeaks | None = None,
                   tries: int = 3) -> list[tuple[int, int, dict[int, float]]]:
    """[(cost, k, weights by op)] of the cheapest useful plans, cheapest first: the biases of the last k layers, or
    for a region without biases its cheapest weight. Costs are the analytic terms, or with `exact` the exact peaks
    of the `tries` analytically cheapest (the two measures may order close candidates differently)."""
    costs = sorted((c, k, w) for k in range(1, depth + 1)
                   for c, w in [smallest_region_plan(mm, k)])
    if exact is not None:
        costs = sorted((exact(plan_of(mm, k, w))["peak_bytes"], k, w) for _, k, w in costs[:tries])
    return costs


def describe_plan(mm: MemoryModel, graph: Graph | None, k: int, weights: dict[int, float]) -> str:
    """"the bias of op #61 conv2d (out_relu)" / "the weights of op #63 fully_connected (predictions) at 1/8" /
    "the biases of the last 3 layers (op #59 ... #63)": what a plan trains, named by op and output."""
    def name(op: int) -> str:
        lay = mm.by_op[op]
        out = short_name(graph.ops[op].outputs[0]) if graph is not None else lay.name
        return f"op #{op} {lay.type} ({out})"
    region = mm.layers[len(mm.layers) - k:]
    biased = [lay for lay in region if lay.bias is not None]
    parts = []
    if biased:
        parts.append(f"the bias of {name(biased[0].op_index)}" if len(biased) == 1 else
                     f"the biases of the last {k} layers ({name(region[0].op_index)} to {name(region[-1].op_index)})")
    for op, r in sorted(weights.items()):
        parts.append(f"the weights of {name(op)} at {_ratio_text(r)}")
    return " and ".join(parts)


def smallest_plan_check(mm: MemoryModel, budget: int, depth: int, exact: ExactPeaks | None = None,
                        graph: Graph | None = None, outside: list[dict[str, Any]] | None = None) -> None:
    """Refuse a budget below the cheapest useful plan (the last layer's bias, or its weights at the smallest ratio
    when it has none, or of the last layers down to the first that can train), by the exact measure when `exact`
    is given. Needs no measurement, so it runs before any. `budget` is what the arena gets; `outside` (planning/
    statics.py) what the firmware keeps beside it, named in the message with the whole need."""
    from tinytrain.stages.planning import statics

    cost, k, w = smallest_plans(mm, depth, exact)[0]
    if budget < cost:
        opt = mm.bias_option(k)
        extra = statics.total(outside or [])
        need_kb = math.ceil((cost + extra) / 1024 * 10) / 10
        measure = "exact peak of its training step" if exact is not None else "estimate"
        beside = f" + {statics.describe(outside)}" if extra else ""
        raise PlanError(f"budget {kb(budget + extra)} is too small for the smallest plan, "
                        f"{describe_plan(mm, graph, k, w)}: it needs {kb(cost + extra)} ({measure} {kb(cost)}"
                        f"{beside}; activations and gradients {kb(opt['transient'])} by the analytic model)",
                        hint=f"set train.update.budget_kb to at least {need_kb:g}, or pick a board with more SRAM")


def plan_of(mm: MemoryModel, k: int, weights_by_op: dict[int, float]) -> TrainPlan:
    """Biases of the last k layers (those that have one) and the given weights."""
    out = []
    for lay in mm.layers[len(mm.layers) - k:]:
        r = weights_by_op.get(lay.op_index, 0.0)
        if lay.bias is not None or r:
            out.append(LayerPlan(lay.op_index, bias=lay.bias is not None, weight_ratio=r))
    return TrainPlan(out)


def choice_plan(mm: MemoryModel, positions: list[int], k: int, ratios: dict[int, float]) -> TrainPlan:
    return plan_of(mm, k, {positions[j]: r for j, r in ratios.items()})


FULL_ANALYSIS_MAX_UNITS = 64   # up to this many units the whole table is measured; above, only what the search needs


MAX_LAZY_ROUNDS = 12           # search -> measure the chosen options -> search again, at most this often


def choice_units(table: dict[str, Any], positions: list[int], k: int, ratios: dict[int, float]) -> list[str]:
    """The units whose measurements a choice's predicted gain rests on: the reference, its bias region, and per
    trained weight the weight unit and the bias region it is measured against."""
    ids = ["reference", f"bias:{k}"]
    for j, r in sorted(ratios.items()):
        ids += [f"bias:{j + 1}", f"weight:{positions[j]}:{r}"]
    return ids


MAX_WEIGHTS_PER_ROUND = 3     # a lazy round measures at most this many of the chosen weights (largest Δ first)


MIN_WEIGHTS_MEASURED = 3      # weight options measured before the scale of the weights' estimates is trusted


def _to_measure(table: dict[str, Any], positions: list[int], k: int, ratios: dict[int, float], known) -> list[str]:
    """The units a lazy round measures: the chosen region's and up to MAX_WEIGHTS_PER_ROUND of the chosen weights
    that are still estimated, those with the largest estimated Δ first (early rounds search on estimates scaled
    by few measurements; measuring a few and searching again corrects the scale before the many are paid for).
    While fewer than MIN_WEIGHTS_MEASURED weight options are measured, the round also measures the weight options
    with the largest first-order estimate inside the chosen region (the search could add them at no cost of reach), so that
    a bias-only choice does not rest on weight estimates scaled by no weight measurement at all."""
    wts = {(w["op"], float(w["ratio"])): w for w in table["weights"]}
    ids = [u for u in ("reference", f"bias:{k}") if not known(u)]
    pending = sorted(((-float(wts[(positions[j], float(r))]["delta"]), j, r) for j, r in ratios.items()
                      if not (known(f"weight:{positions[j]}:{r}") and known(f"bias:{j + 1}"))))
    chosen = pending[:MAX_WEIGHTS_PER_ROUND]
    measured = sum(1 for w in table["weights"] if not w.get("estimated"))
    if measured + len(chosen) < MIN_WEIGHTS_MEASURED:
        picked = {(j, r) for _, j, r in chosen}
        extra = sorted((-float(w.get("first_order", 0.0)), positions.index(w["op"]), float(w["ratio"]))
                       for w in table["weights"]
                       if w.get("estimated") and w["op"] in positions[:k]
                       and (positions.index(w["op"]), float(w["ratio"])) not in picked)
        chosen += extra[:MIN_WEIGHTS_MEASURED - measured - len(chosen)]
    for _, j, r in chosen:
        ids += [u for u in (f"bias:{j + 1}", f"weight:{positions[j]}:{r}") if not known(u)]
    return list(dict.fromkeys(ids))


def auto_search(ctx: StageContext, graph: Graph, mm: MemoryModel, upd, capacity: int, budget: int | None,
                exact: ExactPeaks, use_exact: bool) -> tuple[dict[str, Any], tuple, dict[str, Any], dict[str, int]]:
    """The contribution table and the search's answer: (table, (plan, predicted, res, positions, verification),
    analysis record, run counters).

    Small models (at most FULL_ANALYSIS_MAX_UNITS units): every option is measured, then searched. Larger ones
    (MobileNetV2: 266 units) are analysed lazily: every option is first estimated to first order
    (contribution.first_order: one gradient pass per probe sample, less the probe's sampling noise), the estimates
    scaled to what has been measured so far (noise-aware: contribution._fill_estimates); the search picks a plan on
    that table; the options the plan rests on are measured (and, until MIN_WEIGHTS_MEASURED weight options are,
    the region's most promising weights too); and the search runs again, until the chosen plan's every option is
    measured (or MAX_LAZY_ROUNDS).
    Only the plans that win a search get measured: the answer equals the full analysis's whenever no option that
    was only estimated would have beaten it once measured (the estimates rank options by the loss decrease of
    their gradients, the measurements by accuracy)."""
    loss = loss_config(ctx.config)
    if isinstance(loss, str):
        heads_from(loss, list(graph.outputs))   # several outputs and none named: say so before anything runs
    else:
        loss = list(loss)                       # named outputs: scored by their total weighted loss
    if ctx.config.get("train.loss") is None and not ctx.config.get("train.outputs"):
        loss = None                             # the data decides (classification or regression)
    settings = contrib.AnalysisSettings.from_spec(upd.analysis)
    gd = contrib.graph_digest(graph)
    path = ctx.inputs.get("contribution/contributions.json")
    upstream = json.loads(Path(path).read_text()) if path is not None else None

    def searched(table):
        if use_exact:
            return verified_auto(mm, table, capacity, exact, upd.search, upd.analysis.seed)
        return (*plan_auto(mm, table, capacity, upd.search, upd.analysis.seed), None)

    reuse = upstream is not None and contrib.table_matches(upstream, gd, settings)
    lazy = not reuse and len(contrib.units(graph, settings, trained_outputs(ctx.config, graph))) > FULL_ANALYSIS_MAX_UNITS
    an = contrib.open_analysis(graph, ctx.config.get("data"), settings, cache=contrib.unit_cache_of(ctx),
                               known=upstream, progress=ctx.progress, loss=loss, estimate=lazy)

    def whole(table, result, record):
        result, record["whole_plan"] = whole_plan_choice(an, graph, mm, table, result, capacity, budget, exact,
                                                         use_exact)
        return table, result, record, an.counters()

    if reuse:
        return whole(upstream, searched(upstream), {"mode": "full", "source": "contribution stage"})
    if not lazy:
        an.measure_all()
        table = an.table()
        return whole(table, searched(table), {"mode": "full"})
    an.measure(["reference"])
    rounds = []
    for r in range(MAX_LAZY_ROUNDS + 1):
        table = an.table()
        result = searched(table)
        res, positions = result[2], result[3]
        need = _to_measure(table, positions, res.best.k, res.best.ratios, an.known)
        rounds.append({"round": r, "k": res.best.k, "weights_by_op": result[1]["weights"], "measure": need})
        if not need or r == MAX_LAZY_ROUNDS:
            break
        ctx.progress(f"measuring the {len(need)} options search round {r} chose", None)
        an.measure(need)
    record = {"mode": "lazy", "rounds": rounds, "max_rounds": MAX_LAZY_ROUNDS,
              "probe_samples": contrib.PROBE_SAMPLES, "units": len(an.todo),
              "units_measured": sum(1 for uid, _, _ in an.todo if an.known(uid)),
              "chosen_estimated": rounds[-1]["measure"]}
    return whole(table, result, record)


def trained_outputs(config: Any, graph: Graph) -> list[str] | None:
    """The outputs train.outputs names (None: the model's single output), checked against the model's outputs
    (losses.heads_from: a name that is no output is autodiff's one line, with a "did you mean")."""
    loss = loss_config(config)
    return None if isinstance(loss, str) else [h.name for h in heads_from(loss, list(graph.outputs))]


def restrict_to_trained(mm: MemoryModel, graph: Graph, config: Any) -> None:
    """With train.outputs, the search offers only the layers whose result reaches a trained output (the others are
    pruned from training): `mm.layers` keeps those (in place, before any option is priced)."""
    outs = trained_outputs(config, graph)
    if outs:
        keep = set(contrib.trainable_layers(graph, outs))
        mm.layers = [lay for lay in mm.layers if lay.op_index in keep]


MAX_PER_K = 3          # whole-plan candidates: the search's best plans of this many other region sizes k
SUBPLAN_SIZES = (1, 2, 4)   # ... the search's choice's top-m weights by Δ (in the smallest region holding them)
MAX_TABLE_UNITS = 3    # ... and the best measured table units that fit (already measured: free)


def whole_plan_choice(an, graph: Graph, mm: MemoryModel, table: dict[str, Any], result: tuple, capacity: int,
                      budget: int | None, exact: ExactPeaks, use_exact: bool) -> tuple[tuple, dict[str, Any]]:
    """The best of the top candidate plans, each measured as a whole plan (fine-tuned as one unit, like the table's
    units and cached the same way). The search adds single options' gains, which overstates a plan whose options
    overlap (two updates that fix the same error) and cannot see options that interfere; the candidates are the
    search's choice W, the search's best plan for up to MAX_PER_K other bias regions k (largest predicted gain
    first), W's sub-plans made of its top-m weights by Δ (SUBPLAN_SIZES, each in the smallest region holding
    them: many options at once can measure worse than a few — on MobileNetV2 the search's 19-layer plan, summed
    +118 points, measured -6), and the MAX_TABLE_UNITS table units with the largest measured gain (a table unit
    is a whole plan already measured: a bias region, or one layer's weights in the region reaching it), all that
    fit the budget (by the exact peak when the exact planner is used, else the analytic cost under `capacity`). The chosen plan is the one with the largest measured gain; W stays unless
    another measures strictly better. Returns the search result tuple with the chosen plan and its prediction (its
    `measured_gain` added) and the record for plan.json's analysis."""
    plan, predicted, res, positions, verification = result
    problem, _ = build_problem(mm, table)
    best = res.best
    cands: list[tuple[str, int, dict[int, float]]] = [("search", best.k, dict(best.ratios))]
    per_k = sorted((t["candidate"] for t in res.trace if t.get("fits") and "candidate" in t),
                   key=lambda c: (-c["gain"], c["cost"], c["k"]))
    for c in per_k[:MAX_PER_K + 1]:
        cands.append(("best of k", int(c["k"]), {int(j): float(r) for j, r in c["weights"].items()}))
    by_delta = sorted(best.ratios.items(), key=lambda jr: -_weight_delta(table, positions, *jr))
    for m in SUBPLAN_SIZES:
        if m < len(by_delta):
            sub = dict(by_delta[:m])
            cands.append(("sub-plan", _smallest_region(problem, sub), sub))
    ref_score = contrib.unit_score(table, table["reference"])
    measured_units = sorted(
        ((contrib.unit_score(table, u) - ref_score, u) for u in table.get("units", [])
         if u["kind"] in ("bias", "weight") and not u.get("estimated") and not u.get("empty")),
        key=lambda t: -t[0])
    table_cands = []
    for _, u in measured_units:
        if u["kind"] == "bias":
            table_cands.append(("table unit", int(u["k"]), {}))
        else:
            table_cands.append(("table unit", int(u["reference_k"]), {int(u["position"]): float(u["ratio"])}))
    _prefetch(an, graph, mm, positions, problem, cands, table_cands, capacity, budget, exact, use_exact)
    seen: set[tuple] = set()
    rows: list[dict[str, Any]] = []
    chosen: tuple | None = None
    ref = table["reference"]
    n_table = 0
    for source, k, ratios in cands + table_cands:
        sig = (k, tuple(sorted(ratios.items())))
        if sig in seen or problem.bias[k - 1] is None or not problem.valid(k, ratios):
            continue
        if source == "table unit" and n_table >= MAX_TABLE_UNITS:
            break
        seen.add(sig)
        p = choice_plan(mm, positions, k, ratios)
        peak = exact(p)["peak_bytes"] if use_exact else None
        if (peak is not None and budget is not None and peak > budget) or (
                peak is None and problem.cost(k, ratios) > capacity):
            continue
        an.progress(f"measuring whole plan {len(rows) + 1} (k={k}, {len(ratios)} weight layers)", None)
        n_table += source == "table unit"
        doc = an.measure_plan(_named_plan(graph, p))
        gain = contrib.unit_score(table, doc) - contrib.unit_score(table, ref)
        row = {"source": source, "k": k, "weights_by_op": {str(positions[j]): r for j, r in sorted(ratios.items())},
               "predicted_gain": problem.gain(k, ratios), "measured_gain": gain, "exact_peak_bytes": peak}
        rows.append(row)
        if chosen is None or gain > chosen[0] + 1e-9:
            chosen = (gain, k, ratios, len(rows) - 1)
    if chosen is None:      # no candidate fits (cannot happen: the search's choice fits); keep the search's
        return result, {"candidates": rows, "chosen": None, "rule": "no candidate fits: the search's choice"}
    gain, k, ratios, idx = chosen
    if idx != 0:
        choice = Choice(k, ratios, problem.cost(k, ratios), problem.gain(k, ratios))
        plan, new = _chosen(mm, table, positions, SearchResult(choice, method=res.method))
        for key in ("search_capacity",):
            if key in predicted:
                new[key] = predicted[key]
        predicted = new
    predicted["measured_gain"] = gain
    record = {"candidates": rows, "chosen": idx,
              "rule": "the candidate with the largest measured gain (each fine-tuned as one unit); the search's "
                      "choice unless another measures strictly better"}
    return (plan, predicted, res, positions, verification), record


def _prefetch(an, graph: Graph, mm: MemoryModel, positions: list[int], problem: Problem, cands: list, table_cands: list,
              capacity: int, budget: int | None, exact: ExactPeaks, use_exact: bool) -> None:
    """Compute ahead, on every core, what whole_plan_choice's loop will ask for: the candidates' exact peaks, then
    the measurements of those that fit. Both are deterministic per plan and memoised, so the loop then finds the
    same numbers it would have computed one by one, and decides exactly as before. (The table units it may try are
    measured already; only the first MAX_TABLE_UNITS + 1 of them get a peak ahead.)"""
    seen: set[tuple] = set()
    plans: list[tuple[str, TrainPlan, int, dict[int, float]]] = []
    for source, k, ratios in cands + table_cands[:MAX_TABLE_UNITS + 1]:
        sig = (k, tuple(sorted(ratios.items())))
        if sig in seen or problem.bias[k - 1] is None or not problem.valid(k, ratios):
            continue
        seen.add(sig)
        plans.append((source, choice_plan(mm, positions, k, ratios), k, ratios))
    if use_exact:
        exact.prefetch([p for _, p, _, _ in plans])
    fitting = []
    for source, p, k, ratios in plans:
        if source == "table unit":
            continue
        if use_exact:
            try:
                peak = exact(p)["peak_bytes"]
            except ExactUnavailable:
                continue
            if budget is not None and peak > budget:
                continue
        elif problem.cost(k, ratios) > capacity:
            continue
        fitting.append(_named_plan(graph, p))
    an.measure_plans(fitting)


def _smallest_region(problem: Problem, ratios: dict[int, float]) -> int:
    """The smallest bias region k holding the weights at positions `ratios` that is a valid choice."""
    k = max(ratios) + 1
    while k < problem.k_max and problem.bias[k - 1] is None:
        k += 1
    return k


def _weight_delta(table: dict[str, Any], positions: list[int], j: int, r: float) -> float:
    return next(float(w["delta"]) for w in table["weights"] if w["op"] == positions[j] and float(w["ratio"]) == r)


def _named_plan(graph: Graph, plan: TrainPlan) -> TrainPlan:
    """`plan` (layers by op index of the quantize graph) with layers named by weight tensor, as the analysis' units
    are (dequantization drops QUANTIZE ops, so op indices shift; names stay)."""
    return TrainPlan([LayerPlan(graph.ops[int(lp.layer)].inputs[1], lp.bias, lp.weight_ratio) for lp in plan.layers])


def plan_auto(mm: MemoryModel, table: dict[str, Any], budget: int, method: str = "dp",
              seed: int = 0) -> tuple[TrainPlan, dict[str, Any], SearchResult, list[int]]:
    """Search the table under `budget` bytes -> (plan, predicted, search result, positions). Pure: no measuring,
    analytic costs only (`verified_auto` checks the choice with the exact planner)."""
    problem, positions = build_problem(mm, table)
    smallest_plan_check(mm, budget, problem.k_max)
    res = search(problem, budget, method, seed)
    if res.best is None:   # cannot happen after the check (the smallest plan fits), kept as a clear message
        raise PlanError(f"no plan fits the budget {kb(budget)}")
    plan, predicted = _chosen(mm, table, positions, res)
    return plan, predicted, res, positions


def _chosen(mm: MemoryModel, table: dict[str, Any], positions: list[int],
            res: SearchResult) -> tuple[TrainPlan, dict[str, Any]]:
    best = res.best
    plan = choice_plan(mm, positions, best.k, best.ratios)
    bias = {b["k"]: b for b in table["bias"]}
    wts = {(w["op"], float(w["ratio"])): w for w in table["weights"]}
    chosen = [bias[best.k]] + [wts[(positions[j], float(r))] for j, r in sorted(best.ratios.items())]
    predicted = {**predicted_metric(table, best.gain, [float(e["delta"]) for e in chosen]),
                 "estimated_options": [f"bias:{best.k}" if "k" in e else f"weight:{e['op']}:{e['ratio']}"
                                       for e in chosen if e.get("estimated")],
                 "k": best.k, "weights": {str(positions[j]): r for j, r in sorted(best.ratios.items())},
                 "search_cost": best.cost}
    return plan, predicted


def predicted_metric(table: dict[str, Any], gain: float, parts: list[float] | None = None) -> dict[str, Any]:
    """plan.json's `predicted` figures for a summed gain: classification {delta_accuracy, reference_accuracy} (as
    always); regression {metric: "mse", delta_score, reference_mse, predicted_mse}: the MSE predicted when each of
    the chosen options (their Δs: `parts`) removes its share of the error left by the others,
    MSE_ref · Π (1 - Δ_i); positive unless a measured option left no error at all."""
    metric = contrib.ERROR_TASKS.get(contrib.table_task(table))
    if metric is None:
        return {"delta_accuracy": gain, "reference_accuracy": table["reference"]["accuracy"]}
    ref = float(table["reference"][metric])
    if parts is None:
        parts = [gain]
    # Each option removes its share of the error that is left (never more than all of it): the MSE shrinks by a
    # factor (1 - Δ) per option, so summed gains that overlap cannot predict an MSE of 0 (or below).
    factor = 1.0
    for d in parts:
        factor *= 1.0 - min(max(float(d), SCORE_FLOOR), 1.0)
    pred = ref * factor if ref > 0 else -gain
    return {"metric": metric, "delta_score": gain, f"reference_{metric}": ref, f"predicted_{metric}": max(0.0, pred),
            "combination": f"multiplicative: each option removes its share of the remaining {metric}"}


def predicted_gain(predicted: dict[str, Any]) -> float:
    """The summed gain of plan.json's `predicted` (either task)."""
    return float(predicted["delta_score"] if predicted.get("metric") in contrib.ERROR_TASKS.values()
                 else predicted["delta_accuracy"])


MAX_ROUNDS = 8          # searches of the exact verification (each: a search + one exact plan, < 1 s on MBV2)


SLACK_TOLERANCE = 0.01  # stop widening once the exact peak is within 1 % of the budget


def verified_auto(mm: MemoryModel, table: dict[str, Any], budget: int, exact: ExactPeaks, method: str = "dp",
                  seed: int = 0) -> tuple[TrainPlan, dict[str, Any], SearchResult, list[int], dict[str, Any]]:
    """`plan_auto` whose choice truly fits: the search runs on the analytic costs under a capacity, the chosen plan's
    exact peak (reorder's planner) is compared with the budget, and the capacity moves by the difference — down by
    the overshoot when the plan does not fit, up by the slack when it fits with room to spare (the additive model
    over-prices plans with several weight layers) — bracketed by the capacities already tried, for at most
    MAX_ROUNDS searches. The answer is the fitting plan with the largest predicted gain (ties: the smaller exact
    peak); if no searched plan fits, the smallest plan (which smallest_plan_check found to fit). Returns plan,
    predicted, the chosen search's result, positions and the verification record (search_trace.json)."""
    problem, positions = build_problem(mm, table)
    # Widening the capacity cannot beat the plan the search picks with no limit at all. That search has the largest
    # frontiers of all: it runs only when a fitting plan leaves slack (the one case that asks for it).
    unlimited: list[Choice | None] = []

    def top() -> Choice | None:
        if not unlimited:
            unlimited.append(search(problem, NO_LIMIT, method, seed).best)
        return unlimited[0]

    rounds: list[dict[str, Any]] = []
    chosen: tuple | None = None
    cap, lo, hi = budget, None, None            # lo: largest capacity whose plan fit; hi: smallest that did not
    for r in range(MAX_ROUNDS):
        res = search(problem, cap, method, seed)
        if res.best is None:
            rounds.append({"round": r, "capacity_bytes": cap, "plan": None})
            break
        plan, predicted = _chosen(mm, table, positions, res)
        peak = exact(plan)["peak_bytes"]
        fits = peak <= budget
        rounds.append({"round": r, "capacity_bytes": cap, "k": res.best.k, "weights_by_op": predicted["weights"],
                       "search_cost": res.best.cost, "gain": res.best.gain, "exact_peak_bytes": peak,
                       "fits": fits})
        if fits and (chosen is None or res.best.gain > chosen[0] + 1e-12
                     or (math.isclose(res.best.gain, chosen[0], abs_tol=1e-12) and peak < chosen[1])):
            chosen = (res.best.gain, peak, r, plan, predicted, res)
        if fits:
            lo = cap
            slack = budget - peak
            if slack <= SLACK_TOLERANCE * budget or (top() is not None and res.best.gain >= top().gain - 1e-12):
                break
            nxt = cap + slack if hi is None else min(cap + slack, (cap + hi) // 2)
        else:
            hi = cap
            nxt = cap - (peak - budget)
            if lo is not None:
                nxt = max(nxt, (lo + cap) // 2)
        inside = (nxt > cap and (hi is None or nxt < hi)) if fits else (0 <= nxt < cap and (lo is None or nxt > lo))
        if not inside:     # the bracket is closed: another search would return a plan already tried
            break
        cap = nxt
    record: dict[str, Any] = {"budget_bytes": budget, "rounds": rounds, "max_rounds": MAX_ROUNDS}
    if chosen is None:
        # Every searched plan overshot: the smallest plan fits (smallest_plan_check ran by the exact measure).
        peak, k, w = smallest_plans(mm, problem.k_max, exact)[0]
        ratios = {positions.index(op): r for op, r in w.items()}
        res = SearchResult(Choice(k, ratios, problem.cost(k, ratios), problem.gain(k, ratios)), method=method)
        plan, predicted = _chosen(mm, table, positions, res)
        record.update({"chosen_round": None, "fallback": "smallest plan", "exact_peak_bytes": peak})
    else:
        _, peak, r, plan, predicted, res = chosen
        record.update({"chosen_round": r, "fallback": None, "exact_peak_bytes": peak})
    predicted["search_capacity"] = rounds[record["chosen_round"]]["capacity_bytes"] \
        if record["chosen_round"] is not None else None
    return plan, predicted, res, positions, record

