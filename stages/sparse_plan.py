"""Stage `sparse-plan`: choose what to train on the device (DESIGN §3, §6; TTE's sparse update).

Schemes (`train.update.scheme`)
  full        every weight and bias
  last_k      weights and biases of the last k trainable layers (op order)
  bias_only   biases only: of all layers, or of the last k that have one
  manual      per layer (`layers`: weight tensor name, its part before ';', output tensor, or op index "5"/"#5"):
              bias on/off and weight ratio r in {0, 1/8, 1/4, 1/2, 1} (the first ceil(r·C_in) input channels)
  auto        contribution analysis (contribution.py) + search (plan_search.py) for the largest predicted
              accuracy gain whose estimated memory (plan_memory.py) fits the budget, then the best of the top
              candidate plans measured as whole plans (auto_plan.py); for regression data (data.task:
              regression, train.loss: mse) the gain is the share of the no-update MSE removed, for named outputs
              (train.outputs) the share of the no-update total weighted loss of the trained outputs
Modules: this one (config, budget, fixed schemes, the stage), auto_plan.py (auto), plan_exact.py (the exact peak),
plan_report.py (plan.txt, the summary line, the search trace's text).
Budget: `train.update.budget_kb` (KB = 1024 bytes), else the board's SRAM minus the runtime's own needs
(stages/device/boards.py); the arena gets the budget less the model-sized buffers the firmware keeps outside it
(planning/statics.py: a float target row, loss heads' evaluation copies; `outside_arena` in plan.json), so that a
plan that fits also links. A refusal names what holds the smallest plan's peak and why (planning/peak_why.py).
Memory is reported two ways: the analytic estimate (plan_memory.py, what the search prices
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
                      reference_accuracy; regression metric "mse", delta_score, reference_mse, predicted_mse;
                      named outputs metric "loss", reference_loss, predicted_loss; `measured_gain`: the chosen
                      plan measured as a whole, auto_plan.whole_plan_choice)
  train_plan.json     the plan alone (version, scheme, layers; `qas` when the update check changed it): the only
                      file autodiff reads
  update_check.json   int8 updates below half a step, per trained tensor, and the rounding / master copy chosen
                      (stages/quant/update_check.py; also plan.json `updates`, plan.txt; emulate-run re-checks it)
  memory.json         memory of every option: bias regions k = 1..K, every layer's weights at every ratio
  plan.txt            readable plan, memory breakdown, and for auto the best candidate per k
  contributions.json  auto: the contribution table (contribution.py)
  search_trace.json   auto: candidates considered (best per k for dp, per generation for evolutionary), best so far,
                      and `verification`: each search round's capacity, choice, exact peak and whether it fit
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tinytrain.pipeline.contract import StageContext, StageResult
from tinytrain.stages.planning import contribution as contrib
from tinytrain.stages.planning import contribution_text
from tinytrain.stages.planning import statics
from tinytrain.stages.planning.parallel import Background
from tinytrain.stages.quant import update_check
from tinytrain.stages.planning.auto_plan import (
    MAX_ROUNDS,
    NO_LIMIT,
    auto_search,
    build_problem,
    plan_auto,
    plan_of,
    restrict_to_trained,
    smallest_plan_check,
    smallest_plans,
    verified_auto,
)
from tinytrain.pipeline.errors import UserError
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.train.losses import loss_config
from tinytrain.stages.planning.plan_exact import ExactPeaks, ExactUnavailable, exact_peak  # noqa: F401
from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings, channels, kb
from tinytrain.stages.planning.plan_report import memory_text, plan_text, summary_line, trace_doc, trace_text
from tinytrain.stages.planning.train_plan import RATIOS, LayerPlan, PlanError, TrainPlan

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
                          rounding=str(_get(qas, "rounding", "nearest")), reorder=bool(reorder), heads=heads,
                          fp16_mixed=config.get("train.precision") == "fp16-mixed")


def qas_enabled(config: dict[str, Any]) -> bool:
    return bool(_get(config.get("train.qas"), "enabled", True))


# ---- the budget ------------------------------------------------------------------------------------------


def resolve_budget(budget_kb: float | None, board: str | None) -> tuple[int | None, str]:
    """Budget in bytes and where it came from; (None, why) when there is no limit (host) or none is known."""
    if budget_kb is not None:
        return int(round(budget_kb * 1024)), f"train.update.budget_kb = {budget_kb:g}"
    try:
        from tinytrain.stages.device.boards import get_board
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


def _outside_arena(graph: Graph, settings: MemorySettings) -> list[dict[str, Any]]:
    """statics.for_model, or [] when the losses do not fit the model (autodiff's stage says why)."""
    try:
        return statics.for_model(graph, settings)
    except (UserError, NotImplementedError):
        return []


def _what_holds_the_peak(e: PlanError, graph: Graph, mm: MemoryModel, depth: int, exact: ExactPeaks) -> PlanError:
    """The budget refusal, with the largest buffers at the smallest plan's peak and why each is whole there
    (planning/peak_why.py): what is missing for the model to fit, not only how much."""
    from tinytrain.stages.planning import peak_why
    from tinytrain.stages.planning.plan_exact import training_graph
    from tinytrain.stages.reorder import plan_schedules

    cands = smallest_plans(mm, depth, exact)
    if not cands:
        return e
    try:
        _, k, w = cands[0]
        tg = training_graph(graph, plan_of(mm, k, w), exact.settings, exact.qas)
        _, mp, _, _ = plan_schedules(tg, exact.settings.reorder)
        held = peak_why.explain(tg, mp)
    except Exception:   # noqa: BLE001 -- only the explanation is lost: the user still gets the budget refusal
        return e        # (tests/test_peak_why.py checks the explanations themselves)
    return PlanError(f"{e.message}; at its peak the arena holds {peak_why.describe(held)}", hint=e.hint)


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
    # The budget holds the arena and the model-sized buffers codegen keeps outside it (planning/statics.py): the
    # arena gets what they leave, so that a plan that fits here also links.
    outside = _outside_arena(graph, mm.s) if budget is not None else []
    doc["outside_arena"] = outside
    arena_budget = None if budget is None else budget - statics.total(outside)
    if upd.scheme == "auto":
        # host has no memory limit: auto then picks the plan with the largest predicted gain.
        capacity = arena_budget if arena_budget is not None else NO_LIMIT
        restrict_to_trained(mm, graph, cfg)
        # Before measuring anything: a budget below the smallest plan fails at once (by the exact measure).
        depth = len(mm.layers) if upd.analysis.max_layers is None else min(upd.analysis.max_layers, len(mm.layers))
        try:
            try:
                smallest_plan_check(mm, capacity, depth, exact, graph, outside)
            except PlanError as e:
                raise _what_holds_the_peak(e, graph, mm, depth, exact) from None
        except ExactUnavailable as e:
            # autodiff cannot build this model's training graph (it will say so in its own stage): plan on the
            # analytic model alone rather than hide the plan.
            exact_error = str(e)
            try:
                smallest_plan_check(mm, capacity, depth, graph=graph, outside=outside)
            except PlanError as pe:
                # what keeps the exact measure (and training) from this model is the missing piece: say it
                raise PlanError(f"{pe.message}; autodiff cannot build its training step: {exact_error}",
                                hint=pe.hint) from None
        ctx.progress("contribution analysis", 0.0)
        use_exact = budget is not None and exact_error is None
        table, result, analysis, counts = auto_search(ctx, graph, mm, upd, capacity, arena_budget, exact,
                                                      use_exact)
        plan, predicted, res, positions, verification = result
        ctx.progress("search", 0.9)
        doc["predicted"] = predicted
        doc["analysis"] = analysis
        contrib.write_table(out / "contributions.json", table)
        _write_json(out / "search_trace.json", {**trace_doc(res, positions, mm, arena_budget, verification,
                                                            metric=doc["predicted"].get("metric")),
                                                "analysis": analysis})
    else:
        plan = fixed_plan(mm, graph, upd)
        table, counts = None, {}
    plan.resolve(graph)   # the same checks autodiff will make
    # Int8 updates below half a step vanish under nearest rounding, and weights pinned at ±127 cannot move: probe,
    # and pick the head-room and the update rule that carry them (issue 17). Before the memory report: the chosen
    # rule (a master copy, a PRNG state) is what autodiff builds, so it is what the exact peak measures.
    # While the check probes (a core for a second or two), a forked worker computes what does not depend on it unless
    # it changes the QAS setting: memory.json's table of every option, the plan's estimate and its exact peak.
    peak_job = exact.job(plan) if exact_error is None else None
    with Background(lambda: (mm.table(), mm.estimate(plan), peak_job() if peak_job else None)) as meanwhile:
        doc["updates"] = update_check.check(graph, plan, cfg, mm.s, upd.analysis, arena_budget, exact.pricing())
        chosen = (doc["updates"] or {}).get("qas")
        settings, qas = mm.s, exact.qas
        if chosen and chosen != doc["updates"]["requested"]:
            settings = dataclasses.replace(mm.s, rounding=chosen["rounding"], master_copy=bool(chosen["master_copy"]))
            qas = bool(chosen["enabled"])
        table_of_options, est, computed = meanwhile.result()
        if computed is not None:
            exact.adopt(computed)
        if settings is not mm.s:
            est = MemoryModel(graph, settings).estimate(plan)
        ex = None
        if exact_error is None:
            # A lookup now (the worker's, or the check's pricing of its choice). No peak depends on the values of
            # weights and biases, so the graph autodiff trains (with the wider scales the check chose) has these
            # peaks and schedules: the reorder stage's plan of it is a lookup too (reorder.ScheduleMemo).
            try:
                ex = exact(plan, settings, qas)
            except ExactUnavailable as e:
                exact_error = str(e)
        doc.update(plan_json(plan, mm))
        doc["memory"] = est
        doc["exact"] = ex if ex is not None else {"peak_bytes": None, "error": exact_error}
        # The exact peak decides; the estimate only when autodiff cannot build the graph (its stage will fail anyway).
        peak = ex["peak_bytes"] if ex is not None else est["total"]
        doc["fits"] = None if budget is None else bool(peak <= arena_budget)
        doc["fits_by"] = "exact" if ex is not None else "estimate"
        doc["estimate_over_exact"] = round(est["total"] / ex["peak_bytes"], 4) if ex and ex["peak_bytes"] else None
        doc["memory_settings"] = settings.to_json()
        _write_json(out / "update_check.json", doc["updates"] or {"applies": False})
        _write_json(out / "plan.json", doc)
        # What autodiff consumes, alone: a new budget or board that picks the same plan leaves these bytes (and so
        # autodiff and everything after it up to cross-compile) unchanged in the cache.
        _write_json(out / "train_plan.json", {**{k: doc[k] for k in ("version", "scheme", "layers") if k in doc},
                                              **update_check.train_plan_fields(doc["updates"])})
        _write_json(out / "memory.json", {**table_of_options, "plan": est, "exact": doc["exact"],
                                          "budget_bytes": budget})
    line = summary_line(doc, mm) + update_check.summary_suffix(doc["updates"])
    (out / "plan.txt").write_text(plan_text(doc, mm, table) + update_check.text(doc["updates"]))
    metrics = {"scheme": upd.scheme, "memory_bytes": est["total"], "exact_peak_bytes": doc["exact"]["peak_bytes"],
               "budget_bytes": budget, "fits": doc["fits"],
               "trained_layers": len(plan.layers),
               "weight_layers": sum(1 for lp in plan.layers if lp.weight_ratio > 0),
               "biases": sum(1 for lp in plan.layers if lp.bias)}
    if upd.scheme == "auto":
        p = doc["predicted"]
        m = p.get("metric")
        if m is not None:
            metrics.update({"predicted_delta_score": p["delta_score"], f"predicted_{m}": p[f"predicted_{m}"],
                            f"reference_{m}": p[f"reference_{m}"]})
        else:
            metrics["predicted_delta_accuracy"] = p["delta_accuracy"]
        if p.get("measured_gain") is not None:
            metrics["measured_gain"] = p["measured_gain"]
        # What this run measured or found memoised: the log line and build.json, never an artifact.
        metrics.update({f"{k}_units": v for k, v in counts.items()})
        line += (f" [{counts.get('measured', 0)} units measured, {counts.get('reused', 0)} reused"
                 + (f", {counts['dropped']} bad memos dropped" if counts.get("dropped") else "")
                 + (f", {counts['estimated_only']} estimated only" if counts.get("estimated_only") else "") + "]")
    return StageResult(summary=line, metrics=metrics)


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


# ---- readable forms --------------------------------------------------------------------------------------


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
        return contribution_text.table_text(json.loads(path.read_text()))
    return None
