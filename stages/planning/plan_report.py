"""sparse-plan's readable forms: the one-line summary, plan.txt, search_trace.json / its text, memory.json's text.

For `auto` the predicted figures are the task's (stages/planning/contribution.py): classification in accuracy points,
regression in the MSE, named outputs in the total weighted loss of the trained outputs; and when the plan was
chosen by measuring whole plans (auto_plan.whole_plan_choice), the measured gain of the chosen plan beside them.
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages.planning import contribution_text, statics
from tinytrain.stages.planning.memory_model import WEIGHT_RATIOS, MemoryModel, kb
from tinytrain.stages.planning.budget_search import SearchResult


def _kb_short(n: float) -> str:
    return f"{n / 1024:.1f}".rstrip("0").rstrip(".") + " KB"


ERROR_NAME = {"mse": "MSE", "loss": "loss"}   # a regression / named-outputs plan's error, as the text names it


def gain_text(p: dict[str, Any]) -> str:
    """The chosen plan's gain for the summary line: measured as a whole plan when it was, else predicted.
    "ΔAcc +6.2 (measured; +9.0 predicted)", "MSE 0.2 → 0.1 (predicted)", "loss 0.52 → 0.31 (measured)"."""
    metric = p.get("metric")
    measured = p.get("measured_gain")
    if metric in ERROR_NAME:
        ref = p[f"reference_{metric}"]
        if measured is not None:
            after = ref * (1.0 - measured) if ref > 0 else -measured
            return f"{ERROR_NAME[metric]} {ref:.4g} → {max(0.0, after):.4g} (measured)"
        return f"{ERROR_NAME[metric]} {ref:.4g} → {p[f'predicted_{metric}']:.4g} (predicted)"
    if measured is not None:
        return f"ΔAcc {100 * measured:+.1f} (measured; {100 * p['delta_accuracy']:+.1f} predicted)"
    return f"ΔAcc {100 * p['delta_accuracy']:+.1f} (predicted)"


def summary_line(doc: dict[str, Any], mm: MemoryModel) -> str:
    layers = doc["layers"]
    w = sum(1 for d in layers if d["weight_ratio"] > 0)
    b = sum(1 for d in layers if d["bias"])
    total = doc["memory"]["total"]
    budget = doc["budget_bytes"]
    peak = (doc.get("exact") or {}).get("peak_bytes")
    outside = statics.total(doc.get("outside_arena") or [])
    mem = f"est. {kb(total)}" + (f", exact {kb(peak)}" if peak is not None else "") \
        + (f" + {kb(outside)} outside the arena" if outside else "") \
        + (f" of {_kb_short(budget)} budget" if budget is not None else ", no budget")
    scheme = doc["scheme"]
    if scheme == "auto":
        p = doc["predicted"]
        k = p["k"]
        what = " + ".join(([f"weights of {w} layer{'s' * (w != 1)}"] if w else [])
                          + ([f"{b} bias{'es' * (b != 1)}"] if b else []))
        return f"auto: {what} (last {k} layer{'s' * (k != 1)}), {mem}, {gain_text(p)}"
    what = {"full": f"all {len(mm.layers)} layers (weights + biases)",
            "last_k": f"weights + biases of the last {len(layers)} layers",
            "bias_only": f"{b} biases",
            "manual": f"{w} layer{'s' * (w != 1)} weights + {b} biases"}[scheme]
    over = " — OVER BUDGET" if doc["fits"] is False else ""
    return f"{scheme}: {what}, {mem}{over}"


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
        if ex.get("kept_whole"):
            lines.append(f"  of which outside the arena (the plan's choice): "
                         + "; ".join(f"{w['what']} {kb(w['bytes'])}" for w in ex["kept_whole"]))
    else:
        lines.append(f"exact peak: not available ({ex.get('error')}); fits is judged on the estimate")
    if doc["budget_bytes"] is not None:
        beside = (f"; the arena gets what {statics.describe(doc['outside_arena'])} leave"
                  if doc.get("outside_arena") else "")
        lines.append(f"budget: {kb(doc['budget_bytes'])} — {'fits' if doc['fits'] else 'OVER BUDGET'} "
                     f"(by the {doc.get('fits_by', 'exact')} peak{beside})")
    if doc["scheme"] == "auto":
        p = doc["predicted"]
        metric = p.get("metric")
        if metric in ERROR_NAME:
            name = ERROR_NAME[metric] + (" (the total weighted loss of the trained outputs)" if metric == "loss" else "")
            lines.append(f"predicted: {name} {p[f'reference_{metric}']:.4g} (no update) → "
                         f"{p[f'predicted_{metric}']:.4g} (held-out train samples; the search adds the options' gains, "
                         f"{100 * p['delta_score']:+.1f} points of the reference {ERROR_NAME[metric]}; the value shown "
                         f"assumes each option removes its share of the error the others leave)")
        else:
            lines.append(f"predicted: accuracy {p['reference_accuracy']:.1%} (no update) "
                         f"{100 * p['delta_accuracy']:+.1f} points (held-out train samples; additive model: gains "
                         f"measured one option at a time and summed, so overlapping gains are overstated)")
        a = doc.get("analysis") or {}
        wp = a.get("whole_plan")
        if wp and wp.get("chosen") is not None:
            c = wp["candidates"][wp["chosen"]]
            unit = "points of accuracy" if metric not in ERROR_NAME else f"points of the reference {ERROR_NAME[metric]}"
            lines.append(f"whole plans measured: {len(wp['candidates'])} candidates (the search's choice, its best "
                         f"plans of other region sizes, its top weights alone, the best measured table units), each "
                         f"fine-tuned as one unit; chosen: "
                         f"{'the search' + chr(39) + 's choice' if wp['chosen'] == 0 else c['source']} "
                         f"(k={c['k']}), measured {100 * c['measured_gain']:+.1f} {unit} (summed options "
                         f"{100 * c['predicted_gain']:+.1f})")
            for n, r in enumerate(wp["candidates"]):
                ws = ", ".join(f"#{o} @ {_ratio_text(x)}" for o, x in r["weights_by_op"].items()) or "no weights"
                lines.append(f"  {'*' if n == wp['chosen'] else ' '} {r['source']:<10} k={r['k']:<3} {ws:<40} "
                             f"summed {100 * r['predicted_gain']:+6.1f}  measured {100 * r['measured_gain']:+6.1f}")
        if a.get("mode") == "lazy":
            est = p.get("estimated_options") or []
            lines.append(f"analysis: {a['units_measured']} of {a['units']} options measured by fine-tuning, the "
                         f"others estimated to first order ({a['probe_samples']} probe samples' mean gradient) and "
                         f"scaled to the measured ones; {len(a['rounds'])} search rounds, each measuring what the "
                         f"previous one chose; "
                         + (f"options of the chosen plan still estimated: {', '.join(est)}" if est else
                            "every option of the chosen plan is measured"))
    if table is not None:
        lines += ["", contribution_text.table_text(table).rstrip()]
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

