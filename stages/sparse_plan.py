"""Stage `sparse-plan`: choose what to train on the device (DESIGN §3, §6; TTE's sparse update).

Schemes (`train.update.scheme`)
  full        every weight and bias
  last_k      weights and biases of the last k trainable layers (op order)
  bias_only   biases only: of all layers, or of the last k that have one
  manual      per layer (`layers`: weight tensor name, its part before ';', output tensor, or op index "5"/"#5"):
              bias on/off and weight ratio r in {0, 1/8, 1/4, 1/2, 1} (the first ceil(r·C_in) input channels)
  auto        contribution analysis (contribution.py) + search (plan_search.py) for the largest predicted
              accuracy gain whose estimated memory (plan_memory.py) fits the budget; for regression data
              (data.task: regression, train.loss: mse) the gain is the share of the no-update MSE removed
Budget: `train.update.budget_kb` (KB = 1024 bytes), else the board's SRAM minus the runtime's own needs
(stages/boards.py). Memory is reported two ways: the analytic estimate (plan_memory.py, what the search prices
options with) and the exact peak of the chosen plan — autodiff's training graph for the build's loss, optimizer,
batch size and QAS settings, planned by the reorder stage's own planner (with train.reorder.enabled), i.e. the
number the reorder stage will print. `fits` is decided on the exact peak. Fixed schemes are checked against the
budget (a plan over it is reported, not refused); `auto` must fit it: the knapsack's choice is verified with the
exact planner and the search re-run under a corrected capacity until it does (`verified_auto`; recorded in
search_trace.json), and a budget below the smallest plan's exact peak is refused before anything is measured.

The budget enters only the search: the contribution table (one cached unit per measurement) and the memory of
each option do not depend on it, so re-planning with another budget re-runs the search alone (milliseconds) —
with the `contribution` stage upstream the table even comes from the cache; without it, from the unit cache
when the runner provides one.

Artifacts
  plan.json           TrainPlan JSON (layers by op index of the quantize graph, with their names) + scheme,
                      budget, the memory estimate (`memory`), the exact peak (`exact`), `fits` (on the exact peak)
                      and, for auto, the predicted gain (`predicted`: classification delta_accuracy and
                      reference_accuracy; regression metric "mse", delta_score, reference_mse, predicted_mse)
  train_plan.json     the plan alone (version, scheme, layers; `qas` when the update check changed it): the only
                      file autodiff reads
  update_check.json   int8 updates below half a step, per trained tensor, and the rounding / master copy chosen
                      (stages/update_check.py; also plan.json `updates`, plan.txt; emulate-run re-checks it)
  memory.json         memory of every option: bias regions k = 1..K, every layer's weights at every ratio
  plan.txt            readable plan, memory breakdown, and for auto the best candidate per k
  contributions.json  auto: the contribution table (contribution.py)
  search_trace.json   auto: candidates considered (best per k for dp, per generation for evolutionary), best so far,
                      and `verification`: each search round's capacity, choice, exact peak and whether it fit
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tinytrain.pipeline.contract import StageContext, StageResult
from tinytrain.pipeline.errors import UserError
from tinytrain.stages import contribution as contrib
from tinytrain.stages import update_check
from tinytrain.stages.ir import Graph
from tinytrain.stages.losses import heads_from, loss_config
from tinytrain.stages.plan_memory import WEIGHT_RATIOS, MemoryModel, MemorySettings, channels, kb, short_name
from tinytrain.stages.plan_search import Choice, Option, Problem, SearchResult, search
from tinytrain.stages.train_plan import RATIOS, LayerPlan, PlanError, TrainPlan
from tinytrain.stages.contribution import SCORE_FLOOR

NO_LIMIT = 1 << 62      # capacity of the search when the board sets no limit (host)
RATIO_TEXT = "0, 1/8, 1/4, 1/2, 1"


# ---- config ------------------------------------------------------------------------------------------

def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def update_spec(value: Any):
    from tinytrain.pipeline.spec import UpdateSpec
    if value is None:
        return UpdateSpec()
    return value if isinstance(value, UpdateSpec) else UpdateSpec.model_validate(value)


def memory_settings(config: dict[str, Any]) -> MemorySettings:
    """What changes training memory besides the plan, from the stage's config slice (defaults: the spec's)."""
    kind = config.get("train.optimizer.kind") or _get(config.get("train.optimizer"), "kind", "sgd")
    qas = config.get("train.qas")
    master = config.get("train.qas.master_copy")
    if master is None:
        master = _get(qas, "master_copy", False)
    reorder = config.get("train.reorder.enabled")
    if reorder is None:
        reorder = _get(config.get("train.reorder"), "enabled", True)
    loss = loss_config(config)
    heads = tuple(loss) if isinstance(loss, list) else ()
    return MemorySettings(optimizer=str(kind), batch_size=int(config.get("train.batch_size") or 1),
                          master_copy=bool(master), loss=heads[0].loss if heads else loss,
                          rounding=str(_get(qas, "rounding", "nearest")), reorder=bool(reorder), heads=heads)


def qas_enabled(config: dict[str, Any]) -> bool:
    return bool(_get(config.get("train.qas"), "enabled", True))


# ---- the exact peak -----------------------------------------------------------------------------------------

def exact_peak(graph: Graph, plan: TrainPlan, settings: MemorySettings, qas: bool = True) -> dict[str, Any]:
    """The peak the `reorder` stage will report for `plan`: autodiff's training graph with the build's loss,
    optimizer, batch size and QAS settings, planned by reorder's own planner (plan_schedules, with
    train.reorder.enabled). Deterministic, and cheap next to the search (MobileNetV2: well under a second)."""
    from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
    from tinytrain.stages.reorder import plan_schedules
    tg = build_training_graph(graph, plan, list(settings.heads) or settings.loss,
                              OptimizerSpec(kind=settings.optimizer), settings.batch_size,
                              QASOptions(qas, settings.rounding, settings.master_copy))
    chosen, best, plain, _ = plan_schedules(tg, settings.reorder)
    return {"peak_bytes": int(best.arena), "lower_bound_bytes": int(best.lower_bound),
            "plain_peak_bytes": int(plain.arena), "schedule": chosen, "reorder": settings.reorder}


class ExactUnavailable(Exception):
    """autodiff cannot build the training graph of this model or plan (a UserError or NotImplementedError of its
    own, which its stage will report); kept apart from the stage's own PlanErrors, which are UserErrors too."""


class ExactPeaks:
    """exact_peak per plan, memoised (the auto verification and the final report ask for the same plans)."""

    def __init__(self, graph: Graph, settings: MemorySettings, qas: bool = True):
        self.graph, self.settings, self.qas = graph, settings, qas
        self._memo: dict[str, dict[str, Any]] = {}

    def __call__(self, plan: TrainPlan) -> dict[str, Any]:
        key = plan.dumps()
        if key not in self._memo:
            try:
                self._memo[key] = exact_peak(self.graph, plan, self.settings, self.qas)
            except (UserError, NotImplementedError) as e:
                raise ExactUnavailable(_one_line(e)) from e
        return self._memo[key]


def resolve_budget(budget_kb: float | None, board: str | None) -> tuple[int | None, str]:
    """Budget in bytes and where it came from; (None, why) when there is no limit (host) or none is known."""
    if budget_kb is not None:
        return int(round(budget_kb * 1024)), f"train.update.budget_kb = {budget_kb:g}"
    try:
        from tinytrain.stages.boards import get_board
    except ImportError:      # the registry is optional for this stage: an explicit budget_kb always works
        return None, "no budget_kb and no board registry"
    try:
        b = get_board(board or "host")
    except KeyError as e:
        raise PlanError(str(e.args[0]) if e.args else str(e)) from None
    if getattr(b, "host", False):
        return None, f"board {b.name}: no memory limit"
    sram, reserve = int(_get(b, "sram_bytes")), int(_get(b, "runtime_reserve_bytes", 0) or 0)
    return sram - reserve, f"board {b.name}: {kb(sram)} SRAM - {kb(reserve)} runtime reserve"


# ---- fixed schemes -------------------------------------------------------------------------------------

def layer_table(mm: MemoryModel) -> str:
    return ", ".join(f"#{lay.op_index} {lay.name} ({lay.type})" for lay in mm.layers)


def find_layer(mm: MemoryModel, graph: Graph, key: str | int) -> int:
    """Op index of the trainable layer named `key` (see the module docstring for the accepted names)."""
    ops = [lay.op_index for lay in mm.layers]
    text = str(key).strip()
    if isinstance(key, int) or text.lstrip("#").isdigit():
        i = int(text.lstrip("#"))
        if i in ops:
            return i
        raise PlanError(f"manual plan names op #{i}, which is not a trainable layer",
                        hint=f"trainable layers: {layer_table(mm)}")
    for match in (lambda lay: lay.weight == text,
                  lambda lay: graph.ops[lay.op_index].outputs[0] == text,
                  lambda lay: lay.name == text,
                  lambda lay: graph.ops[lay.op_index].outputs[0].split(";")[0] == text):
        hits = [lay.op_index for lay in mm.layers if match(lay)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise PlanError(f"manual plan names layer {text!r}, which matches ops {hits}",
                            hint="name it by op index (\"#5\") or by its full weight tensor name")
    raise PlanError(f"manual plan names layer {text!r}, which does not exist (or has no trainable weights)",
                    hint=f"trainable layers (op index, weight name, type): {layer_table(mm)}")


def check_ratio(ratio: Any, layer: str) -> float:
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise PlanError(f"weight ratio {ratio!r} of layer {layer!r} is not a number; use one of {RATIO_TEXT}") \
            from None
    if not any(math.isclose(r, x) for x in RATIOS):
        raise PlanError(f"weight ratio {ratio} of layer {layer!r} is not one of {RATIO_TEXT}",
                        hint="the ratio is the share of input channels (the first ones) whose weights train")
    return next(x for x in RATIOS if math.isclose(r, x))


def manual_plan(mm: MemoryModel, graph: Graph, layers: dict[str, Any]) -> TrainPlan:
    seen: dict[int, str] = {}
    out = []
    for key, lu in layers.items():
        i = find_layer(mm, graph, key)
        if i in seen:
            raise PlanError(f"manual plan names op #{i} twice ({seen[i]!r} and {key!r})")
        seen[i] = key
        ratio = check_ratio(_get(lu, "weight_ratio", 0.0), key)
        bias = bool(_get(lu, "bias", False))
        if bias and mm.by_op[i].bias is None:
            raise PlanError(f"manual plan trains the bias of {key!r} (op #{i}), which has no bias",
                            hint="set bias: false for it")
        if bias or ratio:
            out.append(LayerPlan(i, bias=bias, weight_ratio=ratio))
    if not out:
        raise PlanError("the manual plan trains nothing (every listed layer has bias: false and weight_ratio 0)")
    return TrainPlan(sorted(out, key=lambda lp: lp.layer))


def fixed_plan(mm: MemoryModel, graph: Graph, upd) -> TrainPlan:
    n = len(mm.layers)
    if upd.scheme == "full":
        return TrainPlan.full(graph)
    if upd.scheme == "last_k":
        if upd.k > n:
            raise PlanError(f"last_k with k = {upd.k}, but the model has {n} trainable layers",
                            hint=f"use k <= {n}; trainable layers: {layer_table(mm)}")
        return TrainPlan.last_k(graph, upd.k)
    if upd.scheme == "bias_only":
        with_bias = sum(lay.bias is not None for lay in mm.layers)
        if with_bias == 0:
            raise PlanError("bias_only, but no trainable layer of the model has a bias",
                            hint="use last_k or manual (weights)")
        if upd.k is not None and upd.k > with_bias:
            raise PlanError(f"bias_only with k = {upd.k}, but only {with_bias} layers have a bias",
                            hint=f"use k <= {with_bias}")
        return TrainPlan.bias_only(graph, upd.k)
    if upd.scheme == "manual":
        return manual_plan(mm, graph, upd.layers)
    raise PlanError(f"unknown scheme {upd.scheme!r}")


# ---- auto ----------------------------------------------------------------------------------------------

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
                        graph: Graph | None = None) -> None:
    """Refuse a budget below the cheapest useful plan (the last layer's bias, or its weights at the smallest ratio
    when it has none, or of the last layers down to the first that can train), by the exact measure when `exact`
    is given. Needs no measurement, so it runs before any."""
    cost, k, w = smallest_plans(mm, depth, exact)[0]
    if budget < cost:
        opt = mm.bias_option(k)
        need_kb = math.ceil(cost / 1024 * 10) / 10
        measure = "exact peak of its training step" if exact is not None else "estimate"
        raise PlanError(f"budget {kb(budget)} is too small for the smallest plan, {describe_plan(mm, graph, k, w)}: "
                        f"it needs {kb(cost)} ({measure}; activations and gradients {kb(opt['transient'])} by the "
                        f"analytic model)",
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
    if ctx.config.get("train.outputs") or len(graph.outputs) > 1:
        # The contribution analysis fine-tunes and scores one output; named heads need a scheme that says what to train.
        heads_from(loss_config(ctx.config), list(graph.outputs))  # several outputs and none named: say so first
        raise UserError("scheme auto scores options on a single output and cannot plan for train.outputs yet",
                        hint="with train.outputs choose train.update.scheme: full, last_k, bias_only or manual")
    settings = contrib.AnalysisSettings.from_spec(upd.analysis)
    gd = contrib.graph_digest(graph)
    path = ctx.inputs.get("contribution/contributions.json")
    upstream = json.loads(Path(path).read_text()) if path is not None else None

    def searched(table):
        if use_exact:
            return verified_auto(mm, table, capacity, exact, upd.search, upd.analysis.seed)
        return (*plan_auto(mm, table, capacity, upd.search, upd.analysis.seed), None)

    if upstream is not None and contrib.table_matches(upstream, gd, settings):
        counts = {"measured": 0, "reused": len(upstream.get("units", [])), "dropped": 0, "estimated_only": 0}
        return upstream, searched(upstream), {"mode": "full", "source": "contribution stage"}, counts
    lazy = len(contrib.units(graph, settings)) > FULL_ANALYSIS_MAX_UNITS
    an = contrib.open_analysis(graph, ctx.config.get("data"), settings, cache=contrib.unit_cache_of(ctx),
                               known=upstream, progress=ctx.progress, loss=ctx.config.get("train.loss"),
                               estimate=lazy)
    if not lazy:
        an.measure_all()
        table = an.table()
        return table, searched(table), {"mode": "full"}, an.counters()
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
    return table, result, record, an.counters()


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
    if contrib.table_task(table) != "regression":
        return {"delta_accuracy": gain, "reference_accuracy": table["reference"]["accuracy"]}
    ref = float(table["reference"]["mse"])
    if parts is None:
        parts = [gain]
    # Each option removes its share of the error that is left (never more than all of it): the MSE shrinks by a
    # factor (1 - Δ) per option, so summed gains that overlap cannot predict an MSE of 0 (or below).
    factor = 1.0
    for d in parts:
        factor *= 1.0 - min(max(float(d), SCORE_FLOOR), 1.0)
    pred = ref * factor if ref > 0 else -gain
    return {"metric": "mse", "delta_score": gain, "reference_mse": ref, "predicted_mse": max(0.0, pred),
            "combination": "multiplicative: each option removes its share of the remaining MSE"}


def predicted_gain(predicted: dict[str, Any]) -> float:
    """The summed gain of plan.json's `predicted` (either task)."""
    return float(predicted["delta_score"] if predicted.get("metric") == "mse" else predicted["delta_accuracy"])


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
    # Widening the capacity cannot beat the plan the search picks with no limit at all.
    top = search(problem, NO_LIMIT, method, seed).best
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
            if slack <= SLACK_TOLERANCE * budget or (top is not None and res.best.gain >= top.gain - 1e-12):
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


# ---- stage -------------------------------------------------------------------------------------------

def run(ctx: StageContext) -> StageResult:
    cfg = ctx.config
    upd = update_spec(cfg.get("train.update"))
    board = cfg.get("target.board") or "host"
    graph = contrib.load_graph(ctx)
    mm = MemoryModel(graph, memory_settings(cfg))
    if not mm.layers:
        raise PlanError("the model has no trainable layer (conv2d, depthwise_conv2d or fully_connected with "
                        "constant weights)")
    budget, budget_src = resolve_budget(upd.budget_kb, board)
    exact = ExactPeaks(graph, mm.s, qas_enabled(cfg))
    exact_error = None
    out = Path(ctx.out_dir)
    doc: dict[str, Any] = {"scheme": upd.scheme, "budget_bytes": budget, "budget_source": budget_src}
    if upd.scheme == "auto":
        # host has no memory limit: auto then picks the plan with the largest predicted gain.
        capacity = budget if budget is not None else NO_LIMIT
        # Before measuring anything: a budget below the smallest plan fails at once (by the exact measure).
        depth = len(mm.layers) if upd.analysis.max_layers is None else min(upd.analysis.max_layers, len(mm.layers))
        try:
            smallest_plan_check(mm, capacity, depth, exact, graph)
        except ExactUnavailable as e:
            # autodiff cannot build this model's training graph (it will say so in its own stage): plan on the
            # analytic model alone rather than hide the plan.
            exact_error = str(e)
            smallest_plan_check(mm, capacity, depth, graph=graph)
        ctx.progress("contribution analysis", 0.0)
        use_exact = budget is not None and exact_error is None
        table, result, analysis, counts = auto_search(ctx, graph, mm, upd, capacity, budget, exact, use_exact)
        plan, predicted, res, positions, verification = result
        ctx.progress("search", 0.9)
        doc["predicted"] = predicted
        doc["analysis"] = analysis
        contrib.write_table(out / "contributions.json", table)
        _write_json(out / "search_trace.json", {**trace_doc(res, positions, mm, budget, verification,
                                                            metric=doc["predicted"].get("metric")),
                                                "analysis": analysis})
    else:
        plan = fixed_plan(mm, graph, upd)
        table, counts = None, {}
    plan.resolve(graph)   # the same checks autodiff will make
    est = mm.estimate(plan)
    ex = None
    if exact_error is None:
        try:
            ex = exact(plan)
        except ExactUnavailable as e:
            exact_error = str(e)
    doc.update(plan_json(plan, mm))
    doc["memory"] = est
    doc["exact"] = ex if ex is not None else {"peak_bytes": None, "error": exact_error}
    # The exact peak decides; the estimate only when autodiff cannot build the graph (its stage will fail anyway).
    peak = ex["peak_bytes"] if ex is not None else est["total"]
    doc["fits"] = None if budget is None else bool(peak <= budget)
    doc["fits_by"] = "exact" if ex is not None else "estimate"
    doc["estimate_over_exact"] = round(est["total"] / ex["peak_bytes"], 4) if ex and ex["peak_bytes"] else None
    doc["memory_settings"] = mm.s.to_json()
    # Int8 updates below half a step vanish under nearest rounding: probe, and pick what carries them (issue 17).
    doc["updates"] = update_check.check(graph, plan, cfg, mm.s, upd.analysis, budget, exact_peak)
    _write_json(out / "update_check.json", doc["updates"] or {"applies": False})
    _write_json(out / "plan.json", doc)
    # What autodiff consumes, alone: a new budget or board that picks the same plan leaves these bytes (and so
    # autodiff and everything after it up to cross-compile) unchanged in the cache.
    _write_json(out / "train_plan.json", {**{k: doc[k] for k in ("version", "scheme", "layers") if k in doc},
                                          **update_check.train_plan_fields(doc["updates"])})
    _write_json(out / "memory.json", {**mm.table(), "plan": est, "exact": doc["exact"], "budget_bytes": budget})
    line = summary_line(doc, mm) + update_check.summary_suffix(doc["updates"])
    (out / "plan.txt").write_text(plan_text(doc, mm, table) + update_check.text(doc["updates"]))
    metrics = {"scheme": upd.scheme, "memory_bytes": est["total"], "exact_peak_bytes": doc["exact"]["peak_bytes"],
               "budget_bytes": budget, "fits": doc["fits"],
               "trained_layers": len(plan.layers),
               "weight_layers": sum(1 for lp in plan.layers if lp.weight_ratio > 0),
               "biases": sum(1 for lp in plan.layers if lp.bias)}
    if upd.scheme == "auto":
        p = doc["predicted"]
        if p.get("metric") == "mse":
            metrics.update(predicted_delta_score=p["delta_score"], predicted_mse=p["predicted_mse"],
                           reference_mse=p["reference_mse"])
        else:
            metrics["predicted_delta_accuracy"] = p["delta_accuracy"]
        # What this run measured or found memoised: the log line and build.json, never an artifact.
        metrics.update({f"{k}_units": v for k, v in counts.items()})
        line += (f" [{counts.get('measured', 0)} units measured, {counts.get('reused', 0)} reused"
                 + (f", {counts['dropped']} bad memos dropped" if counts.get("dropped") else "")
                 + (f", {counts['estimated_only']} estimated only" if counts.get("estimated_only") else "") + "]")
    return StageResult(summary=line, metrics=metrics)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def plan_json(plan: TrainPlan, mm: MemoryModel) -> dict[str, Any]:
    """TrainPlan JSON (what autodiff reads), each layer with its name and channel count for people."""
    doc = plan.to_json()
    for d in doc["layers"]:
        lay = mm.by_op[d["layer"]]
        d["name"], d["type"] = lay.name, lay.type
        d["channels"] = channels(lay.c_in, d["weight_ratio"])
    return doc


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _kb_short(n: float) -> str:
    return f"{n / 1024:.1f}".rstrip("0").rstrip(".") + " KB"


def summary_line(doc: dict[str, Any], mm: MemoryModel) -> str:
    layers = doc["layers"]
    w = sum(1 for d in layers if d["weight_ratio"] > 0)
    b = sum(1 for d in layers if d["bias"])
    total = doc["memory"]["total"]
    budget = doc["budget_bytes"]
    peak = (doc.get("exact") or {}).get("peak_bytes")
    mem = f"est. {kb(total)}" + (f", exact {kb(peak)}" if peak is not None else "") \
        + (f" of {_kb_short(budget)} budget" if budget is not None else ", no budget")
    scheme = doc["scheme"]
    if scheme == "auto":
        p = doc["predicted"]
        k = p["k"]
        if p.get("metric") == "mse":
            gain = f"MSE {p['reference_mse']:.4g} → {p['predicted_mse']:.4g}"
        else:
            gain = f"ΔAcc {100 * p['delta_accuracy']:+.1f}"
        what = " + ".join(([f"weights of {w} layer{'s' * (w != 1)}"] if w else [])
                          + ([f"{b} bias{'es' * (b != 1)}"] if b else []))
        return f"auto: {what} (last {k} layer{'s' * (k != 1)}), {mem}, {gain} (predicted)"
    what = {"full": f"all {len(mm.layers)} layers (weights + biases)",
            "last_k": f"weights + biases of the last {len(layers)} layers",
            "bias_only": f"{b} biases",
            "manual": f"{w} layer{'s' * (w != 1)} weights + {b} biases"}[scheme]
    over = " — OVER BUDGET" if doc["fits"] is False else ""
    return f"{scheme}: {what}, {mem}{over}"


# ---- readable forms --------------------------------------------------------------------------------------

def plan_text(doc: dict[str, Any], mm: MemoryModel, table: dict[str, Any] | None = None) -> str:
    lines = [summary_line(doc, mm), f"budget: {doc['budget_source']}",
             "memory settings: " + ", ".join(f"{k}={v}" for k, v in doc["memory_settings"].items()), ""]
    trained = {d["layer"]: d for d in doc["layers"]}
    per = {r["op"]: r for r in doc["memory"].get("per_layer", [])}
    width = max([len("layer")] + [len(lay.name) for lay in mm.layers])
    lines.append(f"{'op':>4}  {'layer':<{width}}  {'type':<16} {'bias':<5} {'ratio':>6} {'ch':>9} {'memory':>10}")
    for lay in mm.layers:
        d = trained.get(lay.op_index)
        if d is None:
            lines.append(f"{lay.op_index:>4}  {lay.name:<{width}}  {lay.type:<16} {'-':<5} {'-':>6} {'':>9} {'frozen':>10}")
            continue
        row = per.get(lay.op_index, {})
        ratio = _ratio_text(d["weight_ratio"])
        mem = row.get("bias", 0) + row.get("weight", 0)
        lines.append(f"{lay.op_index:>4}  {lay.name:<{width}}  {lay.type:<16} {'yes' if d['bias'] else 'no':<5} "
                     f"{ratio:>6} {d['channels']:>4}/{lay.c_in:<4} {kb(mem):>10}")
    m = doc["memory"]
    lines += ["", f"memory estimate (analytic, plan_memory.py): {kb(m['total'])} = activations and gradients at "
                  f"the peak {kb(m['transient'])} + trained biases {kb(m['bias_params'])} + trained weights "
                  f"{kb(m['weights'])} (forward alone {kb(m['forward_peak'])}; 'memory' per layer above: the "
                  f"option's price in the search)"]
    ex = doc.get("exact") or {}
    if ex.get("peak_bytes") is not None:
        lines.append(f"exact peak (autodiff's graph, reorder's planner{'' if ex['reorder'] else ', reorder off'}): "
                     f"{kb(ex['peak_bytes'])} (lower bound {kb(ex['lower_bound_bytes'])}, schedule "
                     f"{ex['schedule']}, without reordering {kb(ex['plain_peak_bytes'])}); "
                     f"estimate / exact = {doc['estimate_over_exact']:.3f}")
    else:
        lines.append(f"exact peak: not available ({ex.get('error')}); fits is judged on the estimate")
    if doc["budget_bytes"] is not None:
        lines.append(f"budget: {kb(doc['budget_bytes'])} — {'fits' if doc['fits'] else 'OVER BUDGET'} "
                     f"(by the {doc.get('fits_by', 'exact')} peak)")
    if doc["scheme"] == "auto":
        p = doc["predicted"]
        if p.get("metric") == "mse":
            lines.append(f"predicted: MSE {p['reference_mse']:.4g} (no update) → {p['predicted_mse']:.4g} "
                         f"(held-out train samples; the search adds the options' gains, {100 * p['delta_score']:+.1f} "
                         f"points of the reference MSE; the MSE shown assumes each option removes its share of the "
                         f"error the others leave)")
        else:
            lines.append(f"predicted: accuracy {p['reference_accuracy']:.1%} (no update) "
                         f"{100 * p['delta_accuracy']:+.1f} points (held-out train samples; additive model: gains "
                         f"measured one option at a time and summed, so overlapping gains are overstated)")
        a = doc.get("analysis") or {}
        if a.get("mode") == "lazy":
            est = p.get("estimated_options") or []
            lines.append(f"analysis: {a['units_measured']} of {a['units']} options measured by fine-tuning, the "
                         f"others estimated to first order ({a['probe_samples']} probe samples' mean gradient) and "
                         f"scaled to the measured ones; {len(a['rounds'])} search rounds, each measuring what the "
                         f"previous one chose; "
                         + (f"options of the chosen plan still estimated: {', '.join(est)}" if est else
                            "every option of the chosen plan is measured"))
    if table is not None:
        lines += ["", contrib.table_text(table).rstrip()]
    return "\n".join(lines) + "\n"


def _ratio_text(r: float) -> str:
    return {0.0: "0", 0.125: "1/8", 0.25: "1/4", 0.5: "1/2", 1.0: "1"}.get(float(r), f"{r:g}")


def trace_doc(res: SearchResult, positions: list[int], mm: MemoryModel, budget: int | None,
              verification: dict[str, Any] | None = None, metric: str | None = None) -> dict[str, Any]:
    """search_trace.json; `metric` "mse" (regression: gains are shares of the reference MSE) is recorded, absent
    for classification (gains are accuracy fractions, as before)."""
    def named(c: dict[str, Any] | None) -> dict[str, Any] | None:
        if c is None:
            return None
        ops = {str(positions[int(j)]): r for j, r in c["weights"].items()}
        return {"k": c["k"], "cost": c["cost"], "gain": c["gain"], "weights_by_op": ops,
                "weights_by_layer": {mm.by_op[int(o)].name: r for o, r in ops.items()}}
    trace = []
    for t in res.trace:
        row = dict(t)
        for key in ("candidate", "best_so_far"):
            if key in row:
                row[key] = named(row[key])
        trace.append(row)
    doc = {"method": res.method, "budget_bytes": budget, "evaluated": res.evaluated,
           "best": named(res.best.to_json()) if res.best else None, "trace": trace}
    if metric is not None:
        doc["metric"] = metric
    if verification is not None:
        # `trace` and `best` are the search of the chosen round (its capacity may differ from the budget).
        rounds = []
        for r in verification["rounds"]:
            row = dict(r)
            if "weights_by_op" in row:
                row["weights_by_layer"] = {mm.by_op[int(o)].name: w for o, w in row["weights_by_op"].items()}
            rounds.append(row)
        doc["verification"] = {**verification, "rounds": rounds}
    return doc


def trace_text(doc: dict[str, Any]) -> str:
    budget = kb(doc["budget_bytes"]) if doc["budget_bytes"] is not None else "none (no limit)"
    lines = [f"search: {doc['method']}, budget {budget}, {doc['evaluated']} candidates evaluated"
             + (" (Δ: points of the reference MSE removed)" if doc.get("metric") == "mse" else "")]
    for t in doc["trace"]:
        if "k" in t:
            if not t.get("fits"):
                lines.append(f"  k={t['k']:<3} bias region alone {kb(t['bias_cost'])}: does not fit")
                continue
            c = t["candidate"]
            ws = ", ".join(f"{n} @ {_ratio_text(r)}" for n, r in c["weights_by_layer"].items()) or "no weights"
            lines.append(f"  k={t['k']:<3} {kb(c['cost']):>10}  Δ {100 * c['gain']:+6.1f}  {ws}")
        else:
            b = t.get("best_so_far")
            lines.append(f"  gen {t['generation']:<3} feasible {t['feasible']:<3} best so far "
                         + (f"{kb(b['cost'])} Δ {100 * b['gain']:+.1f} (k={b['k']})" if b else "-"))
    b = doc.get("best")
    if b:
        ws = ", ".join(f"{n} @ {_ratio_text(r)}" for n, r in b["weights_by_layer"].items()) or "no weights"
        lines.append(f"best: k={b['k']}, {ws}: {kb(b['cost'])}, Δ {100 * b['gain']:+.1f} (predicted)")
    v = doc.get("verification")
    if v:
        lines.append(f"exact verification (reorder's planner) against the budget {kb(v['budget_bytes'])}:")
        for r in v["rounds"]:
            if r.get("k") is None:
                lines.append(f"  round {r['round']}: capacity {kb(r['capacity_bytes'])}: no plan")
                continue
            lines.append(f"  round {r['round']}: capacity {kb(r['capacity_bytes']):>10}  k={r['k']:<3} "
                         f"search cost {kb(r['search_cost']):>10}  exact {kb(r['exact_peak_bytes']):>10}  "
                         f"{'fits' if r['fits'] else 'over'}  Δ {100 * r['gain']:+.1f}")
        how = f"round {v['chosen_round']}" if v["chosen_round"] is not None else v["fallback"]
        lines.append(f"chosen: {how}, exact peak {kb(v['exact_peak_bytes'])}")
    return "\n".join(lines) + "\n"


def memory_text(doc: dict[str, Any]) -> str:
    lines = ["memory of each option (" + ", ".join(f"{k}={v}" for k, v in doc["settings"].items()) + ")",
             f"forward peak: {kb(doc['forward_peak'])}", "", "bias regions (biases of the last k layers):"]
    for b in doc["bias_options"]:
        lines.append(f"  k={b['k']:<3} down to {b['earliest']:<40} {kb(b['total']):>10}  (activations and "
                     f"gradients {kb(b['transient'])}, biases {kb(b['bias_params'])})")
    lines += ["", "weights (resident slice + optimizer state, + what its gradient adds to the peak of the smallest "
                  "region holding it):"]
    rows: dict[int, dict[float, int]] = {}
    names = {}
    for w in doc["weight_options"]:
        rows.setdefault(w["op"], {})[w["ratio"]] = w["total"]
        names[w["op"]] = w["name"]
    lines.append(f"  {'op':>4}  {'layer':<40} " + " ".join(f"{_ratio_text(r):>10}" for r in WEIGHT_RATIOS))
    for op, r in rows.items():
        lines.append(f"  {op:>4}  {names[op][:40]:<40} " + " ".join(f"{kb(r[x]):>10}" for x in WEIGHT_RATIOS))
    return "\n".join(lines) + "\n"


def inspect(path: Path) -> str | None:
    """`tinytrain inspect sparse-plan`: the plan (and for auto the search trace) by default."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    name = "plan.json" if path.is_dir() else path.name
    if name == "plan.json":
        text = (folder / "plan.txt").read_text() if (folder / "plan.txt").exists() else None
        if path.is_dir() and (folder / "search_trace.json").exists():
            text = (text or "") + "\n" + trace_text(json.loads((folder / "search_trace.json").read_text()))
        return text
    if name == "search_trace.json":
        return trace_text(json.loads(path.read_text()))
    if name == "memory.json":
        return memory_text(json.loads(path.read_text()))
    if name == "contributions.json":
        return contrib.table_text(json.loads(path.read_text()))
    return None
