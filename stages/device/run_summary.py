"""emulate-run's readable forms of its run.json: the one-line summary, the stage metrics, the loss picture and
`tinytrain inspect`'s text (stages/emulate_run.py writes run.json and calls these)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from tinytrain.pipeline.plots import Picture, loss_figure
from tinytrain.stages.model import wof
from tinytrain.stages.readable import human_count


def _kb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:.1f}"


def summary_line(doc: Mapping[str, Any]) -> str:
    """e.g. `trained 3 epochs on stm32f746-disco: acc 49.6% → 91.3%, 1.92M instr/step (8.9 ms @216 MHz),
    stack 2.1 KB, arena 13.4/13.4 KB` (+ `; gate rejected: original weights exported`)."""
    acc = doc["accuracy"]
    a = ("acc n/a" if acc["before_pct"] is None or acc["after_pct"] is None
         else f"acc {acc['before_pct']:.1f}% → {acc['after_pct']:.1f}%")
    for key, label in (("mse", "MSE"), ("test_loss", "test loss")):
        if key in doc:
            m = doc[key]
            a = (f"{label} n/a" if m["before"] is None or m["after"] is None
                 else f"{label} {m['before']:.3g} → {m['after']:.3g}")
    ins = doc["instructions"]
    if ins["counted"]:
        i = f"{human_count(ins['per_step_mean'])} instr/step"
        c = doc.get("cycles_estimate")
        if c:
            i += f" ({c['ms_per_step']:.1f} ms @{c['clock_hz'] / 1e6:.0f} MHz)"
        est = doc.get("cycles_per_step_estimate") or {}
        if est.get("traced"):
            i += f", ≈{human_count(est['cycles_per_step'])} cycles/step est. ({est['cpu']})"
    else:
        i = "instr/step not counted on host"
    parts = [a, i]
    if doc.get("loss_scale"):
        parts.append(f"fp16-mixed: loss scale {doc['loss_scale']['final']:g}, "
                     f"{doc['loss_scale']['skipped_steps']} steps skipped")
    if doc["stack"]["high_water_bytes"]:
        parts.append(f"stack {_kb(doc['stack']['high_water_bytes'])} KB")
    ar = doc["arena"]
    parts.append(f"arena {_kb(ar['used_bytes'])}/{_kb(ar['planned_bytes'])} KB")
    epochs = doc["runtime"]["epochs"]
    line = f"trained {epochs} epoch{'s' if epochs != 1 else ''} on {doc['board']}: " + ", ".join(parts)
    if not doc["gate"]["accepted"]:
        line += "; gate rejected the run: original weights exported"
    if (doc.get("updates") or {}).get("warning"):
        line += "; WARNING: " + doc["updates"]["warning"]
    return line


def metrics(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"acc_before_pct": doc["accuracy"]["before_pct"], "acc_after_pct": doc["accuracy"]["after_pct"],
            "instructions_per_step": doc["instructions"]["per_step_mean"],
            "ms_per_step": (doc["cycles_estimate"] or {}).get("ms_per_step"),
            "cycles_per_step_estimate": (doc.get("cycles_per_step_estimate") or {}).get("cycles_per_step"),
            "stack_high_water_bytes": doc["stack"]["high_water_bytes"],
            "arena_planned_bytes": doc["arena"]["planned_bytes"], "arena_used_bytes": doc["arena"]["used_bytes"],
            "gate_accepted": doc["gate"]["accepted"], "steps": doc["loss"]["steps"],
            **({"mse_before": doc["mse"]["before"], "mse_after": doc["mse"]["after"]} if "mse" in doc else {})}


def loss_picture(doc: Mapping[str, Any]) -> Picture:
    """run.json's loss per step with its per-epoch means, and the test metric as measured: the firmware measures
    it before and after training only, so those two points (accuracy, or MSE for regression)."""
    loss = doc["loss"]
    steps = int(loss["steps"])
    if "mse" in doc:
        m = doc["mse"]
        points, name = [(0, m["before"], "before"), (steps, m["after"], "after")], "test MSE"
    else:
        a = doc["accuracy"]
        points, name = [(0, a["before_pct"], "before"), (steps, a["after_pct"], "after")], "test accuracy (%)"
    return loss_figure(loss["per_step"], loss["steps_per_epoch"], title=doc["summary"],
                       epoch_means=loss["epoch_mean"], accuracy=points, accuracy_name=name)


def inspect(path: Path) -> str | None:
    path = Path(path)
    if path.is_dir():
        path = path / "run.json"
    if path.suffix == ".wof":
        return wof.describe(path)
    if path.suffix == ".ttck":
        return describe_checkpoint(path)
    if path.name != "run.json":
        return None
    doc = json.loads(path.read_text())
    lines = [doc["summary"], ""]
    loss = doc["loss"]
    lines.append(f"loss: {loss['steps']} steps, first {loss['first']:.4g}, last {loss['last']:.4g}"
                 + (f", per-epoch means {', '.join(f'{v:.4g}' for v in loss['epoch_mean'])}"
                    if loss.get("epoch_mean") else ""))
    acc = doc["accuracy"]
    if "mse" in doc:
        lines.append(f"MSE (test split): before {doc['mse']['before']}, after {doc['mse']['after']}")
    elif "test_loss" in doc:
        lines.append(f"loss (test split): before {doc['test_loss']['before']}, after {doc['test_loss']['after']}")
    else:
        lines.append(f"accuracy (test split): before {acc['before']}, after {acc['after']}")
    est = doc.get("cycles_per_step_estimate") or {}
    if est.get("traced"):
        by = est["by_core"]
        mix = ", ".join(f"{k} {human_count(v)}" for k, v in sorted(est["mix"].items(), key=lambda kv: -kv[1]))
        # every core whose table can cost the trace: an M55 trace with Helium instructions has the M55's only
        cores = ", ".join(f"Cortex-{k.split('-', 1)[1].upper()} ≈{human_count(v['cycles'])} (CPI {v['cpi']})"
                          for k, v in sorted(by.items(), key=lambda kv: kv[0] != est["cpu"]))
        lines.append(f"cycles per step (one step traced, {human_count(est['instructions_traced'])} instructions): "
                     f"{cores}; mix: {mix}")
    elif est:
        lines.append(f"cycles per step: not traced ({est.get('reason')})")
    lines.append(f"gate: {doc['gate']['reason']}")
    ck = doc.get("checkpoint")
    if ck:
        lines.append("checkpoint: " + ", ".join(
            ([f"resumed at step {ck['resumed_from_step']}"] if ck.get("resumed_from_step") is not None else [])
            + ([f"saved {ck['saved']} at step {ck['saved_step']}"] if ck.get("saved") else [])))
        if ck.get("saved") and (path.parent / ck["saved"]).is_file():
            lines.append(describe_checkpoint(path.parent / ck["saved"]).rstrip("\n"))
    ex = doc["export"]
    lines.append(f"exported {ex['weights']} weights: {ex['wof']} ({ex['wof_n_buffers']} buffers, data for tensors "
                 f"{ex['wof_tensors']}), {ex['tflite']}")
    m = doc["memory"]
    lines.append(f"memory: flash {m['flash_used']} / {m['flash_available']} B, SRAM {m['sram_used']} / "
                 f"{m['sram_available']} B (size.json)")
    return "\n".join(lines) + "\n"


def describe_checkpoint(path: Path) -> str:
    from tinytrain.stages.train.checkpoint import describe_artifact

    return describe_artifact(path)
