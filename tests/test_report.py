"""report.md and the closing summary of `tinytrain build`: every section is there, every figure comes from an
artifact, and a build that stopped early still gets a report of what exists.

The build folder here is written by hand with distinctive numbers, so that a figure taken from the wrong
place (or computed instead of read) shows up as a mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinytrain.pipeline import report as rp


def _w(root: Path, rel: str, doc) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))


def full_build(root: Path) -> Path:
    _w(root, "build.json", {"name": "demo", "spec": "/x/demo.yaml", "ok": True, "error": None,
                            "ran": ["emulate-run"], "cached": ["load", "quantize", "sparse-plan", "autodiff",
                                                               "reorder", "codegen", "cross-compile"],
                            "cache": {"hits": 7, "misses": 1},
                            "stages": [{"stage": s, "state": "cached", "duration_s": 0.0, "summary": f"{s} ok"}
                                       for s in rp.STAGES[:-1]]
                            + [{"stage": "emulate-run", "state": "ran", "duration_s": 12.34, "summary": "trained"}]})
    _w(root, "load/summary.json", {"ops": 17, "params": 4321, "param_bytes": 17284, "macs": 2_345_678,
                                   "dtype": "float", "ops_by_type": {"conv2d": 3, "fully_connected": 1},
                                   "inputs": [{"name": "x", "shape": [1, 8, 8, 1], "dtype": "float32"}],
                                   "outputs": [{"name": "y", "shape": [1, 10], "dtype": "float32"}]})
    _w(root, "load/graph.txt", "input x\n")
    _w(root, "quantize/report.json", {"mode": "ptq", "model": {
        "acc_float": 0.4911, "acc_int8": 0.4877, "agreement": 0.9833, "eval_samples": 361, "eval_split": "test",
        "output_sqnr_db": 37.25, "worst_sqnr_db": 31.5, "worst_tensor": "conv_b"}})
    _w(root, "sparse-plan/plan.txt", "auto: 1 layer + last 1 biases, est. 13.4 KB of 300 KB budget\n")
    _w(root, "autodiff/summary.json", {"ops": 23, "ops_by_phase": {"forward": 5, "loss": 2, "backward": 9,
                                                                   "accumulate": 0, "update": 7},
                                       "trained_params": 2570, "precision": "int8", "loss": "cross_entropy",
                                       "optimizer": {"kind": "sgd"}, "batch_size": 1,
                                       "parameter_gradient_bytes": 10280, "optimizer_state_bytes": 0})
    _w(root, "reorder/memplan.json", {"arena_bytes": 14000, "lower_bound_bytes": 13000, "plain_peak_bytes": 20480,
                                      "schedule": "in_place"})
    _w(root, "reorder/memory.svg", "<svg/>")
    _w(root, "codegen/codegen.json", {"lines": 594, "kernel_calls": 10, "arena_bytes": 14000, "const_bytes": 4300})
    _w(root, "codegen/io_layout.json", {"trained_tensors": [{"name": "w"}, {"name": "b"}], "weights_bytes": 2600})
    _w(root, "cross-compile/size.json", {"board": "stm32f746-disco", "host": False, "fits": True,
                                         "flash": {"used": 19968, "available": 1048576, "text": 13107,
                                                   "rodata": 6451, "data": 120},
                                         "sram": {"used": 33894, "available": 327680, "static": 17510,
                                                  "stack": 16384}})
    _w(root, "emulate-run/run.json", {
        "summary": "trained 3 epochs on stm32f746-disco: acc 49.4% → 95.0%", "board": "stm32f746-disco",
        "runtime": {"epochs": 3, "learning_rate": 0.01},
        "data": {"train_samples_per_epoch": 1437},
        "accuracy": {"before": {"correct": 178, "total": 360}, "after": {"correct": 342, "total": 360},
                     "before_pct": 49.4444, "after_pct": 95.0},
        "loss": {"steps": 4311, "first": 2.25, "last": 0.5268},
        "gate": {"accepted": True, "reason": "accuracy 49.4% -> 95.0% (change +45.6 >= +0.0 points): kept"},
        "instructions": {"counted": True, "per_step_mean": 1_066_000.0, "per_step_min": 1_060_000,
                         "per_step_max": 1_080_000, "total_train": 4_590_000_000},
        "cycles_estimate": {"clock_hz": 216_000_000, "ms_per_step": 4.935, "tte_reference": {
            "ms_per_step": 373.0, "cycles_per_step": 80_568_000.0, "ratio": 0.01323}},
        "stack": {"high_water_bytes": 820, "size_bytes": 16384},
        "arena": {"planned_bytes": 13936, "used_bytes": 13924},
        "export": {"weights": "trained", "wof_n_buffers": 13}})
    _w(root, "emulate-run/loss.svg", "<svg/>")
    _w(root, "emulate-run/trained.wof", "x")
    return root


def _renderings(v) -> set[str]:
    """The ways the report may print a number read from an artifact."""
    out = {str(v)}
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        out |= {f"{f:g}", f"{f:.1f}", f"{f:.2f}", f"{f:.4g}", f"{f:.3g}", rp.kb(f), rp.count(f), rp.pct(f),
                rp.pct(f, True), f"{f / 1e6:.0f}", f"{f:.2f} s"}
    return out


def test_report_has_every_section_and_every_number_matches_its_artifact(tmp_path):
    root = full_build(tmp_path / "build" / "demo")
    path = rp.write_report(root)
    text = path.read_text()
    assert path == root / "report.md"
    for title in rp.SECTION_TITLES:
        assert f"## {title}" in text
    assert "_Not built" not in text
    _, arts = rp.render(root)
    numbers = [(rel, p, v) for rel, p, v in arts.used if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) > 40
    for rel, p, v in numbers:
        # the value is really in the file at that place ...
        doc = json.loads((root / rel).read_text())
        for k in p:
            doc = doc[k]
        assert doc == v
        # ... and the report prints it in one of its formats
        assert any(r in text for r in _renderings(v)), (rel, p, v)
    # Spot checks of the formatting that matters to a reader, each beside its source link.
    for expected in ("49.4% before → 95.0% after", "float 49.1%, int8 48.8%", "361 samples",
                     "flash 19.5 KB of 1024.0 KB", "SRAM 33.1 KB of 320.0 KB", "peak (arena) 13.7 KB, lower bound 12.7 KB",
                     "1.07M mean", "4.93 ms per step at 216 MHz", "373 ms", "80.6M cycles", "0.0132×",
                     "stack high-water mark 0.8 KB of 16.0 KB", "13.6 KB used of 13.6 KB planned",
                     "1 ran (cache counters: 7 hits, 1 misses)", "594 lines of C",
                     "[emulate-run/run.json](emulate-run/run.json)", "![loss per step](emulate-run/loss.svg)",
                     "![memory timeline](reorder/memory.svg)", "[emulate-run/trained.wof](emulate-run/trained.wof)",
                     "auto: 1 layer + last 1 biases"):
        assert expected in text, expected


def test_report_of_a_partial_build_says_what_is_missing(tmp_path):
    root = tmp_path / "b"
    _w(root, "load/summary.json", {"ops": 3, "params": 10, "param_bytes": 40, "macs": 100, "dtype": "float",
                                   "inputs": [], "outputs": []})
    text = rp.write_report(root).read_text()
    assert "3 ops, 10 parameters" in text
    for stage in ("quantize", "sparse-plan", "autodiff", "reorder", "codegen", "cross-compile", "emulate-run"):
        assert f"_Not built: no artifacts in `{stage}/`" in text
    assert rp.summary_block(root) == []


def test_summary_block_reads_artifacts_and_names_them(tmp_path):
    root = full_build(tmp_path / "demo")
    lines = rp.summary_block(root)
    text = "\n".join(lines)
    assert lines[0] == "summary:"
    assert "accuracy (test split, 360 samples): 49.4% → 95.0%" in text
    assert "1.07M (≈4.9 ms @216 MHz; TTE MobileNetV2: 373 ms)" in text
    assert "SRAM 33.1 KB / 320.0 KB, flash 19.5 KB / 1024.0 KB on stm32f746-disco (fits)" in text
    assert "arena 13.6 KB (planned 13.6 KB), stack high-water 0.8 KB" in text
    assert "cache: 7 stage(s) restored, 1 ran" in text
    for line in lines[1:-1]:
        src = line.rsplit(None, 1)[-1]
        assert Path(src).is_file(), line
    assert str(root / "report.md") in lines[-1]


def test_rejected_gate_is_in_the_summary(tmp_path):
    root = full_build(tmp_path / "demo")
    doc = json.loads((root / "emulate-run/run.json").read_text())
    doc["gate"] = {"accepted": False, "reason": "rejected, the ORIGINAL weights are exported"}
    _w(root, "emulate-run/run.json", doc)
    assert "gate rejected the run, original weights exported" in "\n".join(rp.summary_block(root))
    assert "rejected, the ORIGINAL weights are exported" in rp.write_report(root).read_text()


@pytest.mark.parametrize("n,expected", [(999, "999"), (1_066_000, "1.07M"), (80_568_000, "80.6M"), (4.59e9, "4.59G")])
def test_count_format(n, expected):
    assert rp.count(n) == expected
