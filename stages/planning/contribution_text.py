"""Readable forms of the contribution table (contributions.txt, `tinytrain inspect`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinytrain.stages.planning.contribution import ERROR_TASKS, SCORE_FLOOR, table_task
from tinytrain.stages.planning.memory_model import WEIGHT_RATIOS


def mse_text(mse: float | None) -> str:
    return "diverged" if mse is None else f"{mse:.4g}"


ERROR_NAME = {"mse": "MSE", "loss": "loss"}    # how the text names a task's error value


def reference_text(table: dict[str, Any]) -> str:
    """The reference's measurement: "acc 22.9%", "MSE 0.1234" or "loss 0.1234"."""
    value = ERROR_TASKS.get(table_task(table))
    if value is not None:
        return f"{ERROR_NAME[value]} {mse_text(table['reference'][value])}"
    return f"acc {table['reference']['accuracy']:.1%}"


def table_text(table: dict[str, Any]) -> str:
    if "skipped" in table:
        return table["skipped"] + "\n"
    s = table["settings"]
    value = ERROR_TASKS.get(table_task(table))
    regression = value is not None
    if regression:
        what = ("regression, mse loss" if value == "mse" else
                "named outputs, the total weighted loss of the trained outputs")
        name = ERROR_NAME[value]
        head = [f"contribution analysis ({what}): {s['samples']} tuning / {s['eval_samples']} "
                f"held-out train samples, {s['steps'] or 'one pass'} steps, SGD lr {s['learning_rate']}, "
                f"seed {s['seed']}",
                f"reference (no update): {name} {mse_text(table['reference'][value])}",
                f"score: share of the reference's {name} removed (1 - {name} / reference {name}); Δ in points of it"]
    else:
        head = [f"contribution analysis: {s['samples']} tuning / {s['eval_samples']} held-out train samples, "
                f"{s['steps'] or 'one pass'} steps, SGD lr {s['learning_rate']}, seed {s['seed']}",
                f"reference (no update): accuracy {table['reference']['accuracy']:.2%}"]
    lines = head + ["", "biases of the last k layers (Δ vs no update, points)"]
    names = {lay["op"]: lay["name"] for lay in table["layers"]}
    for b in table["bias"]:
        if b.get("estimated"):
            score = "estimated"
        else:
            score = f"{name} {mse_text(b[value])}" if regression else f"acc {b['accuracy']:.2%}"
        note = " (no bias in the region: trains only the weights chosen in it)" if b.get("empty") else ""
        lines.append(f"  k={b['k']:<3} down to {names.get(b['earliest_op'], b['earliest_op'])}: "
                     f"{score}  Δ {100 * b['delta']:+.1f}{note}")
    lines += ["", "weights (Δ vs the bias-only update reaching the layer, points)",
              f"  {'op':>4}  {'layer':<40} " + " ".join(f"{r:>7g}" for r in WEIGHT_RATIOS)]
    by_op: dict[int, dict[float, str]] = {}
    for w in table["weights"]:
        by_op.setdefault(w["op"], {})[w["ratio"]] = f"{100 * w['delta']:+.1f}" + ("~" if w.get("estimated") else "")
    for op in sorted(by_op, reverse=True):
        lines.append(f"  {op:>4}  {names.get(op, str(op))[:40]:<40} "
                     + " ".join(f"{by_op[op].get(r, 'nan'):>7}" for r in WEIGHT_RATIOS))
    if any(w.get("estimated") for w in table["weights"]):
        lines.append("  (~: estimated, not measured)")
    diverged = [u["id"] for u in table.get("units", []) if u.get("diverged")]
    if regression and diverged:
        lines.append(f"diverged (scored {100 * SCORE_FLOOR:+.0f}, the worst): {', '.join(diverged)}")
    est = table.get("estimate")
    if est:
        n_est = sum(1 for e in table["bias"] + table["weights"] if e.get("estimated"))
        lines.append(f"\n{n_est} of {len(table['bias']) + len(table['weights'])} options estimated, not measured: "
                     f"{est['method']} (scale: bias {est['scale']['bias']:.4g}, weights "
                     f"{est['scale']['weights']:.4g}); every option of the chosen plan is measured unless plan.txt "
                     f"says otherwise")
    return "\n".join(lines) + "\n"


def inspect(path: Path) -> str | None:
    path = Path(path)
    if path.is_dir():
        path = path / "contributions.json"
    if path.name == "contributions.json":
        return table_text(json.loads(path.read_text()))
    return None
