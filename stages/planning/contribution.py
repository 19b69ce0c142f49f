"""Contribution analysis (TTE §2.2): how much accuracy (or, for regression, error) each sparse-update option buys.

Measured by short fine-tuning runs, each a *unit* of its own (one TrainPlan, fine-tuned then scored):
  reference      the model as it is (no update)
  bias k         biases of the last k trainable layers, k = 1..K           Δ_b(k)   = acc(bias k) - acc(reference)
  weight l, r    the same biases down to layer l (k_l = its position from the end + 1) plus l's weights at ratio r
                                                                           Δ_w(l,r) = acc(weight l,r) - acc(bias k_l)
so a layer's weight gain is measured against the bias-only update whose gradient already reaches it (TTE's
"vs bias-only"), and the K bias runs double as the weight runs' references: K + 4·K + 1 runs in all.

How a unit runs (`make_measure`): the int8 graph from `quantize` is dequantized to float (weights and biases to
their real values, activations float32, QUANTIZE/DEQUANTIZE dropped) and trained with the float training path
(autodiff.build_training_graph + train_executor.train): SGD, batch 1, fused softmax cross-entropy, for
`analysis.steps` steps (default: one pass over `analysis.samples`), seeded. It is scored by top-1 accuracy on
`analysis.eval_samples` other samples. Both sets are a seeded split of the TRAIN split: the test split stays
unseen, so the accuracy the user reports later is honest. Float fine-tuning stands in for int8 + QAS, which TTE
shows tracks it; it is much faster and the ranking of options is what matters.
Speed (issue 14): the ops before a unit's first trained layer are frozen, so their values are computed once per
sample set, batched, and cached at single-tensor cuts (frozen_prefix.py); a unit trains and scores only the suffix
from the deepest cut before its first trained layer. Float conv2d and 1x1 conv gradients run as BLAS products
(fast_float.py) instead of the golden model's TFLite-order loops: the analysis needs float fine-tuning, not the
device's float rounding order (results differ from the reference kernels in the last bits only). The units a
round (or the full analysis) still has to measure are independent seeded runs: on several cores they run side by
side in forked workers (`parallel_measure`), each result the same as measuring it here.

Regression (`data.task: regression`, float targets; trained with `train.loss: mse`): each unit fine-tunes with the
MSE loss instead, and records the mean squared error of its predictions on the held-out samples (per sample the
mean over the outputs, as the loss and the device's test MSE; then the mean over the samples). The table scores a
unit by the share of the reference's error it removes, score = 1 - MSE / MSE_ref (the reference scores 0; the
same Δ formulas as above apply to it). Why this and not -MSE: the search ranks options by summed Δs, which any
positive scale leaves unchanged, but a unit-free score (i) makes the gains read like accuracy points ("+35.0":
35 % of the no-update model's error removed) whatever the targets' units, (ii) keeps the search's and the
verification's tolerances meaningful for targets of any magnitude. Scores are floored at SCORE_FLOOR (-1: twice
the reference's error or worse); a diverged unit (non-finite predictions or MSE) records `mse: null`,
`diverged: true` and scores the floor, i.e. the worst, as a diverged classification run scores 0 % — the floor also
keeps a blown-up bias run from inflating the Δ of the weight runs measured against it. The cache keeps each
unit's raw MSE (the score depends on the reference unit and is derived when the table is assembled); regression
unit keys also carry the task, so units of the two kinds never mix.
The task comes from the data (`Dataset.regression`); sparse-plan also hands over train.loss, which must agree
with it (mse for regression, cross_entropy for class labels: emulate-run refuses the mix too), checked before
anything is measured. A regression table has `task: "regression"`; a classification table is exactly as before.

Named outputs (`train.outputs`: several heads, each with its loss and weight): each unit fine-tunes the heads with
their losses and records the total weighted loss of the trained heads on the held-out samples (`loss`); the table
(`task: "outputs"`) scores a unit by the share of the reference's loss it removes, exactly as regression does with
the MSE. Only layers whose result reaches a trained output are options (the others are pruned from training).

Modules: this one (units, the table, the stage), contribution_measure.py (the float measurement and the task),
contribution_cache.py (unit keys and memos), contribution_text.py (contributions.txt). `Analysis.measure_plan`
also measures whole plans for sparse-plan's final choice (auto_plan.whole_plan_choice), keyed like the units.

Nothing here depends on the memory budget: re-planning with another budget reuses the whole table (the whole-plan
choice measures only candidate plans not measured before).
Caching: each unit's key is sha256 of {graph content digest, data digest, the unit's plan (weights by tensor
name), the analysis settings} (+ the task for regression). `UnitCache` keeps one JSON file per key in a folder
(given by the runner when it provides one); `analyse(..., known=...)` also reuses the units of an earlier
contributions.json. A unit whose inputs did not change is never measured twice.

Stage use: `run(ctx)` is a stand-alone stage (`contribution`, config: train.update.scheme,
train.update.analysis, data; deps: quantize) whose contributions.json `sparse-plan` reads, so that a budget change
reruns only the search. Without that stage `sparse-plan` calls `analyse` itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinytrain.pipeline.contract import StageContext, StageResult, no_progress
from tinytrain.pipeline.errors import UserError
from tinytrain.stages.golden import fast_float
from tinytrain.stages.planning.parallel import fork_map, worker_count
from tinytrain.stages.planning.contribution_cache import (
    UNIT_VALUE,
    UNIT_VERSION,
    UnitCache,
    graph_digest,
    plausible_unit,
    unit_key,
)
from tinytrain.stages.quant.dequantize import dequantize_graph
from tinytrain.stages.planning.contribution_measure import (
    EVAL_BATCH,
    AnalysisSettings,
    ContributionError,
    Measure,
    Task,
    check_task,
    evaluate,
    evaluate_heads,
    evaluate_mse,
    holdout_split,
    make_measure,
    num_classes,
    one_blas_thread,
    outputs_per_sample,
    task_of,
)
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.memory_model import WEIGHT_RATIOS, channels, short_name
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan, _has_bias, _in_channels, outputs_last

TABLE_VERSION = 1
SCORE_FLOOR = -1.0      # regression / outputs: the worst score (error >= 2x the reference's, or a diverged run)
METRICS = {"classification": "top-1 accuracy on held-out train samples (fraction)",
           "regression": "share of the reference's (no update) mean squared error removed, 1 - MSE / MSE_ref, on "
                         "held-out train samples (fraction; floored at -1, which a diverged run scores)",
           "outputs": "share of the reference's (no update) total weighted loss of the trained outputs removed, "
                      "1 - loss / loss_ref, on held-out train samples (fraction; floored at -1, which a diverged "
                      "run scores)"}
# The tasks scored by the share of the reference's error removed: task -> the unit value that error is.
ERROR_TASKS = {"regression": "mse", "outputs": "loss"}


def table_task(table: dict[str, Any] | None) -> str:
    """"classification" (tables without a `task`, as before regression existed), "regression" or "outputs"."""
    return str((table or {}).get("task") or "classification")


# ---- units -------------------------------------------------------------------------------------------

def trainable_layers(graph: Graph, outputs: list[str] | None = None) -> list[int]:
    """The trainable layers (op order); with `outputs` (the trained heads), only those whose result reaches one of
    them: a layer of an output that is not trained is pruned from training and has nothing to offer."""
    ops = TrainPlan.trainable_ops(graph)
    if not outputs:
        return ops
    live = set(outputs)
    reach: set[int] = set()
    for i in range(len(graph.ops) - 1, -1, -1):
        op = graph.ops[i]
        if live & set(op.outputs):
            reach.add(i)
            live.update(t for t in op.inputs if t is not None)
    return [i for i in ops if i in reach]


def units(graph: Graph, settings: AnalysisSettings,
          outputs: list[str] | None = None) -> list[tuple[str, dict[str, Any], TrainPlan | None]]:
    """(unit id, description, plan) for every measurement, plans naming layers by weight tensor (names survive
    dequantization, op indices do not). A bias region whose layers have no bias at all (a bias-less classifier,
    a conv whose bias the converter folded into a separate ADD) trains nothing by itself: its plan is None, the
    reference's, so it is never measured apart (`empty: true`); its weights are offered all the same, measured
    against the reference."""
    ops = trainable_layers(graph, outputs)
    depth = len(ops) if settings.max_layers is None else min(settings.max_layers, len(ops))

    def bias_plan(k: int, extra: tuple[int, float] | None = None) -> TrainPlan | None:
        lps = []
        for i in ops[len(ops) - k:]:
            ratio = extra[1] if extra and extra[0] == i else 0.0
            bias = _has_bias(graph, i)
            if bias or ratio:
                lps.append(LayerPlan(graph.ops[i].inputs[1], bias=bias, weight_ratio=ratio))
        return TrainPlan(lps) if lps else None

    out: list[tuple[str, dict[str, Any], TrainPlan | None]] = [("reference", {"kind": "reference"}, None)]
    for k in range(1, depth + 1):
        plan = bias_plan(k)
        out.append((f"bias:{k}", {"kind": "bias", "k": k, "earliest_op": ops[len(ops) - k],
                                  **({"empty": True} if plan is None else {})}, plan))
    for pos in range(depth):
        i = ops[len(ops) - 1 - pos]
        for r in WEIGHT_RATIOS:
            out.append((f"weight:{i}:{r}", {"kind": "weight", "op": i, "ratio": r, "position": pos,
                                            "channels": channels(_in_channels(graph, i), r),
                                            "reference_k": pos + 1},
                        bias_plan(pos + 1, (i, r))))
    return out


def base_unit(desc: dict[str, Any]) -> str | None:
    """The unit a unit's Δ is measured against: the reference for a bias region, the bias region reaching the
    layer for a weight option."""
    if desc["kind"] == "bias":
        return "reference"
    if desc["kind"] == "weight":
        return f"bias:{desc['reference_k']}"
    return None


def parallel_measure(measure: Measure, plans: list[TrainPlan | None]) -> list[dict[str, Any]] | None:
    """measure(plan) for every plan on every core (parallel.fork_map; None: measure here instead). Each unit is a
    seeded, deterministic run of its own, so its result does not depend on where it ran. The workers inherit the
    parent's memory: the frozen prefix's cached activations are `warm`ed first (a child's own fills would be lost
    with it)."""
    measure.warm()  # type: ignore[attr-defined]
    return fork_map(measure, plans)


# The counters of one analysis (what was measured, reused, dropped): for the log, the stage summary and
# build.json, never for an artifact (the bytes of a stage's output depend only on its key).
RUN_COUNTERS = ("measured", "reused", "dropped", "estimated_only")


class Analysis:
    """The contribution table, built unit by unit: `measure(ids)` measures (or reuses) the named units, `table()`
    assembles what is known. With `estimates` (first_order), a unit not measured yet enters the table as an
    estimate: its first-order gain scaled to the measured units' units (`calibration`), marked `estimated`.
    Without, `table()` needs every unit measured (`measure_all`)."""

    def __init__(self, graph: Graph, measure: Measure, settings: AnalysisSettings, *, graph_dig: str,
                 data_dig: str, cache: UnitCache | None = None, known: dict[str, Any] | None = None,
                 progress=no_progress, task: str = "classification",
                 estimates: dict[str, float] | None = None, held_out: int | None = None, heads: Any = None):
        if task not in UNIT_VALUE:
            raise ContributionError(f"contribution analysis: unknown task {task!r}")
        self.graph, self._measure, self.settings, self.task = graph, measure, settings, task
        self.gd, self.dd, self.cache, self.progress = graph_dig, data_dig, cache, progress
        self.value = UNIT_VALUE[task]
        self.prior = {u["key"]: u for u in (known or {}).get("units", []) if "key" in u and self.value in u}
        self.outputs = None if heads is None else [h[0] for h in heads]     # the trained outputs' layers only
        self.todo = units(graph, settings, self.outputs)
        self.desc = {uid: (desc, plan) for uid, desc, plan in self.todo}
        self.heads = heads          # Task.key_json(): the named outputs trained (part of every key)
        self.keys = {uid: self.key(plan) for uid, _, plan in self.todo}
        self.docs: dict[str, dict[str, Any]] = {}     # key -> measurement
        self.estimates = estimates
        self.held_out = settings.eval_samples if held_out is None else held_out   # samples each Δ is scored on
        self.counts = {"measured": 0, "reused": 0}

    def key(self, plan: TrainPlan | None) -> str:
        return unit_key(self.gd, self.dd, plan, self.settings, self.task, self.heads)

    def known(self, uid: str) -> bool:
        return self.keys[uid] in self.docs

    def measure_plan(self, plan: TrainPlan | None) -> dict[str, Any]:
        """One whole plan measured as a unit (or its memo reused): the same fine-tuning and score as the table's
        units, keyed and cached the same way (a plan equal to a table unit's is that unit)."""
        key = self.key(plan)
        if key not in self.docs and not self._reuse(key):
            self._record(key, self._measure(plan))
        return self.docs[key]

    def _reuse(self, key: str) -> bool:
        """Take unit `key` from the earlier table or the cache, if either has it."""
        doc = self.prior.get(key) or (self.cache.get(key) if self.cache else None)
        if doc is None or self.value not in doc:
            return False        # (a doc without the value cannot happen: the key holds the task)
        self.counts["reused"] += 1
        self.docs[key] = {k: v for k, v in doc.items() if k not in ("key", "id", "plan")}
        return True

    def _record(self, key: str, res: dict[str, Any]) -> None:
        doc = _unit_doc(res, self.value)
        self.counts["measured"] += 1
        if self.cache:
            self.cache.put(key, doc)
        self.docs[key] = {k: v for k, v in doc.items() if k not in ("key", "id", "plan")}

    def measure(self, ids: list[str]) -> None:
        """Measure (or reuse) the named units."""
        ids = list(dict.fromkeys(ids))
        self.measure_plans([self.desc[uid][1] for uid in ids], names=ids)

    def measure_plans(self, plans: list[TrainPlan | None], names: list[str] | None = None) -> None:
        """Measure (or reuse) these plans as units. Those still to measure are independent runs: with several cores
        they run side by side in forked workers (parallel_measure), each exactly as it would run here."""
        todo: dict[str, tuple[str, TrainPlan | None]] = {}    # key -> (a name, the plan); one run per key
        for n, plan in enumerate(plans):
            key = self.key(plan)
            if key not in self.docs and key not in todo and not self._reuse(key):
                todo[key] = (names[n] if names else f"plan {n + 1}", plan)
        # Only a measure that says how to share its state (`warm`: make_measure's) goes to workers; any other (a
        # test's stand-in, whose side effects must stay in this process) runs here.
        if len(todo) > 1 and worker_count() > 1 and hasattr(self._measure, "warm"):
            self.progress(f"measuring {len(todo)} options on {min(worker_count(), len(todo))} cores", 0.0)
            results = parallel_measure(self._measure, [plan for _, plan in todo.values()])
            if results is not None:
                for key, res in zip(todo, results):
                    self._record(key, res)
        for n, (key, (name, plan)) in enumerate(todo.items()):
            if key not in self.docs:
                self.progress(f"measuring {name} ({n + 1}/{len(todo)})", n / max(1, len(todo)))
                self._record(key, self._measure(plan))

    def measure_all(self) -> None:
        self.measure([uid for uid, _, _ in self.todo])

    def counters(self) -> dict[str, int]:
        c = dict(self.counts)
        c["dropped"] = self.cache.dropped if self.cache else 0
        c["estimated_only"] = sum(1 for uid, _, _ in self.todo if not self.known(uid))
        return c

    def table(self) -> dict[str, Any]:
        rows = []
        for uid, desc, plan in self.todo:
            key = self.keys[uid]
            row = {"id": uid, **desc, "key": key, "plan": plan.to_json() if plan else None}
            if key in self.docs:
                row.update({k: v for k, v in self.docs[key].items() if k not in desc})
            elif self.estimates is None:
                raise ContributionError(f"contribution analysis: unit {uid} was not measured")
            else:
                row.update({self.value: None, "estimated": True})
            if self.estimates is not None:
                row["first_order"] = float(self.estimates.get(uid, 0.0))
            rows.append(row)
        counts = self.counters()
        if self.task in ERROR_TASKS:
            table = _error_table(self.graph, self.settings, self.gd, self.dd, rows, self.task, self.outputs)
        else:
            table = _table(self.graph, self.settings, self.gd, self.dd, rows)
        table.update(counts)
        if self.estimates is not None:
            table["estimate"] = _fill_estimates(table, self.held_out)
        return table


def delta_noise_var(table: dict[str, Any], held_out: int) -> float:
    """Variance of a measured Δ from the held-out set's finite size alone: a difference of two accuracies on the
    same `held_out` samples, each binomial, 2·p(1 − p)/n at the reference accuracy p (regression: the binomial
    worst case p = 1/2, a rough level for a score whose per-sample spread is of order one)."""
    p = 0.5 if table_task(table) in ERROR_TASKS else float(table["reference"]["accuracy"])
    p = min(max(p, 0.05), 0.95)       # a reference at 0 % or 100 % would claim noiseless measurements
    return 2.0 * p * (1.0 - p) / max(1, held_out)


def _fill_estimates(table: dict[str, Any], held_out: int) -> dict[str, Any]:
    """Δ of the options not measured: Δ ≈ c · first-order gain, with a scale c per kind (bias regions; weights)
    fitted on the measured options, noise-aware. A measured Δ is noisy (`delta_noise_var`: ±4 points at 256
    held-out samples, ±16 at 20), so a kind gets its own least-squares scale (through 0) only when it differs from
    the scale fitted on both kinds together by more than two standard errors of its fit; otherwise both share the
    pooled scale. A few noisy negative Δs of one kind therefore no longer zero every estimate of that kind (which
    kept the search from ever trying the rest), while consistent evidence still does. Scales are floored at 0;
    with nothing measured c = 1 (only the ranking matters)."""
    var = delta_noise_var(table, held_out)
    pts = {kind: [(e["first_order"], e["delta"]) for e in table[kind]
                  if not e.get("estimated") and not e.get("empty") and e.get("first_order", 0) > 0]
           for kind in ("bias", "weights")}
    pooled = pts["bias"] + pts["weights"]
    den = sum(x * x for x, _ in pooled)
    c0 = sum(x * y for x, y in pooled) / den if den > 0 else 1.0
    fit, own = {}, {}
    for kind in ("bias", "weights"):
        sxy, sxx = sum(x * y for x, y in pts[kind]), sum(x * x for x, _ in pts[kind])
        c = c0
        if sxx > 0 and abs(sxy / sxx - c0) > 2.0 * math.sqrt(var / sxx):
            c = sxy / sxx
        own[kind] = c != c0
        fit[kind] = max(0.0, c)
        for e in table[kind]:
            if e.get("estimated"):
                e["delta"] = fit[kind] * e["first_order"]
    return {"method": "first-order (learning rate x steps x squared norm of the expected gradient, the probe "
                      "samples' mean gradient less its sampling noise), scaled to the measured options: one "
                      "least-squares scale for both kinds, a kind's own where it differs by more than two standard "
                      "errors of the held-out noise",
            "scale": fit, "pooled_scale": max(0.0, c0), "own_scale": own, "held_out": held_out,
            "delta_noise_sd": math.sqrt(var)}


def analyse(graph: Graph, measure: Measure, settings: AnalysisSettings, *, graph_dig: str, data_dig: str,
            cache: UnitCache | None = None, known: dict[str, Any] | None = None,
            progress=no_progress, task: str = "classification") -> dict[str, Any]:
    """The whole contribution table (contributions.json), every unit measured. `measure(plan)` -> {"accuracy":
    ..., ...} (regression: {"mse": ..., ...}) runs one unit; it is called only for units found neither in `cache`
    nor in `known` (an earlier table) nor measured already (an empty bias region is the reference)."""
    an = Analysis(graph, measure, settings, graph_dig=graph_dig, data_dig=data_dig, cache=cache, known=known,
                  progress=progress, task=task)
    an.measure_all()
    return an.table()


def _unit_doc(res: dict[str, Any], value: str) -> dict[str, Any]:
    """What one measurement records. Classification: as it always was. Regression (outputs): the raw MSE (loss),
    or `mse: null` (`loss: null`) and `diverged: true` when it is not finite (JSON has no NaN/inf; the table scores
    it the floor)."""
    extra = {k: float(v) for k, v in res.items()
             if k not in (value, "diverged") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if value == "accuracy":
        return {"accuracy": float(res["accuracy"]), **extra}
    extra = {k: v for k, v in extra.items() if math.isfinite(v)}
    err = res.get(value)
    err = float(err) if err is not None else float("nan")
    if not math.isfinite(err) or res.get("diverged"):
        return {value: None, "diverged": True, **extra}
    return {value: err, **extra}


def _scorer(ref_mse: float | None, what: str = "MSE") -> Callable[[float | None], float]:
    """score = 1 - MSE / MSE_ref (or loss / loss_ref), floored at SCORE_FLOOR; a diverged unit (None) scores the
    floor. A reference with no error at all (MSE_ref = 0) scores the others by -MSE (still 0 for the reference)."""
    if ref_mse is None or not math.isfinite(ref_mse):
        raise ContributionError("contribution analysis: the model as it is (no update) predicts non-finite values on "
                                f"the held-out train samples, so no option's {what} can be compared with it",
                                hint="check the model and the data's scale, or use scheme manual / last_k / "
                                     "bias_only")

    def score(mse: float | None) -> float:
        if mse is None:
            return SCORE_FLOOR
        s = 1.0 - mse / ref_mse if ref_mse > 0 else -mse
        return max(SCORE_FLOOR, float(s))
    return score


def _entries(rows: list[dict[str, Any]], value: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The table's bias and weight entries from unit rows that carry `value` ("accuracy", or "score" for
    regression). An option is `estimated` when it or the unit its Δ is measured against was not measured (its Δ
    is filled in by _fill_estimates); an empty bias region is the reference (Δ 0)."""
    by_id = {r["id"]: r for r in rows}
    keep = ("first_order", "empty", "diverged", "mse", "loss", "accuracy", "score")
    bias, weights = [], []
    for r in rows:
        if r["kind"] not in ("bias", "weight"):
            continue
        base = by_id[base_unit(r)]
        est = bool(r.get("estimated") or base.get("estimated"))
        delta = 0.0 if est else r[value] - base[value]
        e = {k: r[k] for k in keep if k in r}
        if r["kind"] == "bias":
            bias.append({"k": r["k"], "earliest_op": r["earliest_op"], **e, "delta": delta,
                         **({"estimated": True} if est else {})})
        else:
            weights.append({"op": r["op"], "ratio": r["ratio"], "position": r["position"], "channels": r["channels"],
                            "reference_k": r["reference_k"], **e, "delta": delta,
                            **({"estimated": True} if est else {})})
    return bias, weights


def _error_table(graph: Graph, settings: AnalysisSettings, gd: str, dd: str, rows: list[dict[str, Any]],
                 task: str, outputs: list[str] | None = None) -> dict[str, Any]:
    """The regression (outputs) table: as `_table`, each unit's score (1 - MSE/MSE_ref, 1 - loss/loss_ref) in place
    of its accuracy."""
    value = ERROR_TASKS[task]
    by_id = {r["id"]: r for r in rows}
    ref = by_id["reference"][value]
    score = _scorer(ref, "MSE" if value == "mse" else "loss")
    for r in rows:
        if not r.get("estimated"):
            r["score"] = score(r.get(value))
    bias, weights = _entries(rows, "score")
    ops = trainable_layers(graph, outputs)
    return {"version": TABLE_VERSION, "task": task, "metric": METRICS[task],
            "graph": gd, "data": dd, "settings": settings.to_json(),
            "layers": [{"op": i, "name": short_name(graph.ops[i].inputs[1]), "type": graph.ops[i].type,
                        "position": len(ops) - 1 - n} for n, i in enumerate(ops)],
            "reference": {value: ref, "score": by_id["reference"]["score"]}, "bias": bias, "weights": weights,
            "units": rows}


def _table(graph: Graph, settings: AnalysisSettings, gd: str, dd: str, rows: list[dict[str, Any]],
           *_: Any) -> dict[str, Any]:
    by_id = {r["id"]: r for r in rows}
    ref = by_id["reference"]["accuracy"]
    bias, weights = _entries(rows, "accuracy")
    ops = trainable_layers(graph)
    return {"version": TABLE_VERSION, "metric": METRICS["classification"],
            "graph": gd, "data": dd, "settings": settings.to_json(),
            "layers": [{"op": i, "name": short_name(graph.ops[i].inputs[1]), "type": graph.ops[i].type,
                        "position": len(ops) - 1 - n} for n, i in enumerate(ops)],
            "reference": {"accuracy": ref}, "bias": bias, "weights": weights, "units": rows}


def unit_score(table: dict[str, Any], doc: dict[str, Any]) -> float:
    """A measured unit's score on the table's scale: its accuracy (classification), or the share of the
    reference's error it removes, 1 - value / reference value, floored at SCORE_FLOOR (regression, outputs)."""
    value = ERROR_TASKS.get(table_task(table))
    if value is None:
        return float(doc["accuracy"])
    return _scorer(table["reference"][value], "MSE" if value == "mse" else "loss")(doc.get(value))


def table_matches(table: dict[str, Any] | None, graph_dig: str, settings: AnalysisSettings) -> bool:
    return (isinstance(table, dict) and table.get("version") == TABLE_VERSION and table.get("graph") == graph_dig
            and table.get("settings") == settings.to_json())


# ---- stage -------------------------------------------------------------------------------------------

def load_graph(ctx: StageContext) -> Graph:
    for stage in ("quantize", "load"):
        try:
            return Graph.load(ctx.input_dir(stage))
        except KeyError:
            continue
    raise UserError("sparse-plan needs the IR of the quantize stage")


def unit_cache_of(ctx: StageContext) -> UnitCache | None:
    """The runner hands each stage a persistent folder for sub-stage units; each measurement is one unit there."""
    d = ctx.unit_cache_dir
    return UnitCache(Path(d) / "contribution", refresh=bool(getattr(ctx, "refresh_units", False))) if d else None


PROBE_SAMPLES = 32      # tuning samples whose mean gradient the first-order estimate uses


def first_order(graph: Graph, ds, settings: AnalysisSettings, probe: int = PROBE_SAMPLES,
                loss: Any = None) -> dict[str, float]:
    """First-order estimate of every unit's gain, in loss units: an SGD run of `steps` steps at learning rate lr on
    a parameter set P lowers the loss by about lr · steps · |expected gradient over P|² (TTE's contribution analysis
    ranks options by such gradient information before it measures), |expected gradient|² estimated without the
    probe's sampling noise (see below). One backward pass per probe sample of the
    float model with every weight and bias trainable (the plan `full`) gives every parameter's gradient; a bias
    region sums its biases' terms, a weight option its trained input channels' slice (w[..., :n·M], M the
    depthwise multiplier). The reference scores 0. Cheap next to measuring (MobileNetV2: a few seconds)."""
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.golden.train_step import init_state, run_sample

    task = task_of(graph, ds, loss)
    fg = dequantize_graph(graph)
    x_tu, y_tu, _, _ = holdout_split(ds, settings, task.y)
    train_loss = task.loss
    if task.heads is not None:      # named outputs: by the float graph's names (a final DEQUANTIZE is gone)
        from tinytrain.stages.train.losses import Head
        name = dict(zip(graph.outputs, fg.outputs))
        train_loss = [Head(name[h.name], h.loss, h.weight) for h in task.heads]
    tg = build_training_graph(fg, TrainPlan.full(fg), train_loss, OptimizerSpec(kind="sgd"), 1)
    grads = {p: d["gradient"] for p, d in tg.meta["train"]["trained"].items()}
    state = init_state(tg, {"seed": settings.seed})
    n = max(1, min(probe, len(x_tu)))
    mean = {p: np.zeros(fg.tensors[p].shape, np.float64) for p in grads}
    power = {p: np.zeros(fg.tensors[p].shape, np.float64) for p in grads}      # mean of the squared gradients
    with np.errstate(all="ignore"), one_blas_thread():
        for i in range(n):
            values = run_sample(tg, state, x_tu[i:i + 1], y_tu[i:i + 1], fast_float.run_op,
                                fast_float.backward_op)
            for p, gname in grads.items():
                gi = np.asarray(values[gname], np.float64).reshape(mean[p].shape)
                mean[p] += gi / n
                power[p] += gi * gi / n
    scale = settings.learning_rate * (settings.steps or len(x_tu))
    # |mean gradient|² over n probe samples overstates |expected gradient|² by the sampling noise, trace(Σ)/n, which
    # grows with the number of parameters: a wide weight layer's noise alone would outrank a bias region whose
    # gradient truly points somewhere. The unbiased estimate subtracts it: |ḡ|² − Σ s²/n, s² the per-parameter
    # sample variance (floored at 0; with one probe sample nothing is subtracted).
    noise = {p: (power[p] - mean[p] ** 2) * (n / (n - 1)) / n if n > 1 else np.zeros_like(mean[p]) for p in grads}

    def sq_of(p: str, sl=...) -> float:
        a = mean[p][sl]
        v = float(np.sum(a * a) - np.sum(noise[p][sl]))
        return max(0.0, v) if math.isfinite(v) else 0.0

    out: dict[str, float] = {"reference": 0.0}
    for uid, desc, plan in units(graph, settings, None if task.heads is None else [h.name for h in task.heads]):
        if desc["kind"] == "bias":
            total = 0.0
            for lp in (plan.layers if plan else []):
                i = _op_of_weight(fg, lp.layer)
                if lp.bias:
                    total += sq_of(fg.ops[i].inputs[2])
            out[uid] = scale * total
        elif desc["kind"] == "weight":
            i = _op_of_weight(fg, graph.ops[desc["op"]].inputs[1])
            w = fg.ops[i].inputs[1]
            c_in = _in_channels(fg, i)
            mult = max(1, int(fg.tensors[w].shape[-1]) // c_in) if outputs_last(fg, fg.ops[i]) else 1
            out[uid] = scale * sq_of(w, (..., slice(0, desc["channels"] * mult)))
    return out


def _op_of_weight(graph: Graph, weight: str) -> int:
    return next(i for i in trainable_layers(graph) if graph.ops[i].inputs[1] == weight)


def open_analysis(graph: Graph, data_spec: Any, settings: AnalysisSettings, *, cache: UnitCache | None = None,
                  known: dict[str, Any] | None = None, progress=no_progress, loss: Any = None,
                  estimate: bool = False) -> Analysis:
    """Load the data and set up the analysis (nothing measured yet); with `estimate`, every unit is first
    estimated to first order (`first_order`), so that the caller measures only the units that matter."""
    if data_spec is None:
        raise ContributionError("scheme auto measures each option by fine-tuning on the train data, but the spec "
                                "has no `data` section",
                                hint="add data: {source: ...}, or choose scheme manual / last_k / bias_only")
    from tinytrain.stages.train.data import load_dataset

    if isinstance(data_spec, dict):
        from tinytrain.pipeline.spec_data import DataSpec
        data_spec = DataSpec.model_validate(data_spec)
    ds = load_dataset(data_spec)
    task = task_of(graph, ds, loss)     # checks the data against the loss / heads before anything runs
    measure = make_measure(graph, ds, settings, loss)
    estimates = None
    if estimate:
        progress("first-order estimate of every option", 0.0)
        estimates = first_order(graph, ds, settings, loss=loss)
    return Analysis(graph, measure, settings, graph_dig=graph_digest(graph), data_dig=ds.digest(), cache=cache,
                    known=known, progress=progress, task=task.kind, heads=task.key_json(),
                    estimates=estimates, held_out=len(holdout_split(ds, settings, task.y)[2]))


def compute_table(graph: Graph, data_spec: Any, settings: AnalysisSettings, *, cache: UnitCache | None = None,
                  known: dict[str, Any] | None = None, progress=no_progress, loss: str | None = None) -> dict[str, Any]:
    """Load the data and measure every unit (the contribution stage). The data's task picks the measurement
    (classification: accuracy, regression: MSE); `loss` (train.loss, when the caller knows it) must agree."""
    an = open_analysis(graph, data_spec, settings, cache=cache, known=known, progress=progress, loss=loss)
    an.measure_all()
    return an.table()


def run(ctx: StageContext) -> StageResult:
    from tinytrain.stages.planning.contribution_text import reference_text, table_text

    scheme = ctx.config.get("train.update.scheme", "auto")
    settings = AnalysisSettings.from_spec(ctx.config.get("train.update.analysis"))
    graph = load_graph(ctx)
    out = Path(ctx.out_dir)
    if scheme != "auto":
        doc = {"version": TABLE_VERSION, "skipped": f"scheme {scheme} needs no contribution analysis"}
        (out / "contributions.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return StageResult(summary=f"skipped (scheme {scheme})", metrics={"measured": 0})
    table = compute_table(graph, ctx.config.get("data"), settings, cache=unit_cache_of(ctx), progress=ctx.progress,
                          loss=_loss_of(ctx.config))
    write_table(out / "contributions.json", table)
    (out / "contributions.txt").write_text(table_text(table))
    metrics = {k: table.get(k, 0) for k in RUN_COUNTERS}
    value = ERROR_TASKS.get(table_task(table))
    if value is not None:
        metrics[f"reference_{value}"] = table["reference"][value]
    else:
        metrics["reference_accuracy"] = table["reference"]["accuracy"]
    return StageResult(summary=f"{table['measured']} units measured, {table['reused']} reused; reference "
                               f"{reference_text(table)}", metrics=metrics)


def _loss_of(config: Any) -> Any:
    """What the analysis trains, from a stage's config: the heads of train.outputs, else train.loss (None when
    the spec leaves it to the data)."""
    from tinytrain.stages.train.losses import loss_config

    return loss_config(config) if config.get("train.outputs") else config.get("train.loss")


def write_table(path: Path, table: dict[str, Any]) -> None:
    """contributions.json: the table without the run's counters (RUN_COUNTERS: what this run measured or reused
    depends on the memos found, not on the key; they go to the log, the summary and build.json)."""
    doc = {k: v for k, v in table.items() if k not in RUN_COUNTERS}
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")


