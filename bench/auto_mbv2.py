"""Wall time and choice of `scheme: auto` (contribution analysis + search + exact verification) on MobileNetV2-w0.35@128.

    python bench/auto_mbv2.py --train-per-class 52 # 520 train samples: the analysis' defaults (256 + 256) apply
    python bench/auto_mbv2.py                      # bench/make_mbv2_data.py's data (40 train samples)
    python bench/auto_mbv2.py --compare-layers 0   # time only, no comparison
    python bench/auto_mbv2.py --size 96            # zoo:mbv2-w0.35-96 on the same images resized to 96x96

1. Builds bench/mbv2_auto.yaml up to sparse-plan in a fresh, empty cache (nothing memoised) and times it: the
   default lazy analysis (first-order estimates, only what the search needs measured).
2. With --compare-layers N (default 8): builds again, in the same cache, with `analysis.max_layers: N`, which has
   few enough options (1 + 5N) for the full analysis (every option measured; the lazy run's measurements are
   reused, the rest measured now).
3. Fine-tunes each chosen plan as one unit (the analysis' own measurement: float SGD on the tuning split, top-1
   on the held-out split) and prints, side by side, the plan, its predicted gain (sum of its options' Δ) and its
   measured gain over the no-update reference.
The lazy run's whole-plan candidates (auto_plan.whole_plan_choice: each fine-tuned as one unit) are printed with
their summed and measured gains. The load average is printed before and after: on a shared machine the wall time
counts other jobs' turns, the CPU time does not.
A benchmark, not a test: times depend on the machine (issue 14's goal: the default analysis <= 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_mbv2_data  # noqa: E402


def _build(spec: str, tmp: Path, tag: str, quiet: bool = False) -> tuple[float, dict]:
    path = tmp / f"mbv2_auto_{tag}.yaml"
    path.write_text(spec.replace("out_dir: ../build", f"out_dir: {tmp}/build-{tag}"))
    cmd = [sys.executable, "-m", "tinytrain", "build", str(path), "--cache-dir", str(tmp / "cache")]
    subprocess.run(cmd + ["--until", "quantize"], check=True, capture_output=True)
    t0, c0 = time.perf_counter(), _child_cpu()
    subprocess.run(cmd + ["--until", "sparse-plan"], check=True, capture_output=quiet)
    wall = time.perf_counter() - t0
    out = tmp / f"build-{tag}" / "mbv2_auto"
    return wall, {"plan": json.loads((out / "sparse-plan" / "plan.json").read_text()), "dir": out,
                  "cpu": _child_cpu() - c0}


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: on a shared machine the wall time also counts
    other jobs' turns."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _plan_text(plan: dict) -> str:
    p = plan["predicted"]
    w = p["weights"]
    ws = ", ".join(f"#{op}@{r:g}" for op, r in sorted(w.items(), key=lambda t: int(t[0]))) or "none"
    return f"k={p['k']} biases region, weights {ws}"


def _measured_gains(build_dir: Path, data_spec: dict, plans: list[dict]) -> tuple[float, list[float]]:
    """(reference accuracy, measured gain of each plan): each plan fine-tuned as one contribution unit."""
    from tinytrain.pipeline.spec_data import DataSpec
    from tinytrain.stages.planning import contribution as C
    from tinytrain.stages.train.data import load_dataset
    from tinytrain.stages.model.ir import Graph
    from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

    g = Graph.load(build_dir / "quantize")
    ds = load_dataset(DataSpec.model_validate(data_spec))
    measure = C.make_measure(g, ds, C.AnalysisSettings())
    ref = measure(None)["accuracy"]
    gains = []
    for plan in plans:
        tp = json.loads((plan["dir"] / "sparse-plan" / "train_plan.json").read_text())
        # Name layers by weight tensor: dequantization drops QUANTIZE ops, so op indices would shift.
        lps = [LayerPlan(g.ops[int(d["layer"])].inputs[1], bool(d["bias"]), float(d["weight_ratio"]))
               for d in tp["layers"]]
        gains.append(measure(TrainPlan(lps))["accuracy"] - ref)
    return ref, gains


def _print_whole(plan: dict) -> None:
    wp = (plan.get("analysis") or {}).get("whole_plan")
    if not wp or wp.get("chosen") is None:
        return
    print(f"whole plans measured ({len(wp['candidates'])}; * chosen):")
    for n, c in enumerate(wp["candidates"]):
        ws = ", ".join(f"#{op}@{r:g}" for op, r in c["weights_by_op"].items()) or "none"
        print(f"  {'*' if n == wp['chosen'] else ' '} {c['source']:<10} k={c['k']:<3} weights {ws[:40]:<40} "
              f"summed {100 * c['predicted_gain']:+6.1f}  measured {100 * c['measured_gain']:+6.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-per-class", type=int, default=make_mbv2_data.TRAIN_PER_CLASS)
    ap.add_argument("--size", type=int, choices=(128, 96), default=128,
                    help="96: zoo:mbv2-w0.35-96 on the images resized to 96x96 (bench/mbv2_variants.py's data)")
    ap.add_argument("--compare-layers", type=int, default=8,
                    help="also run the full analysis on the last N layers and compare the plans (0: off)")
    a = ap.parse_args(argv)
    out = make_mbv2_data.DEFAULT_OUT
    if a.train_per_class != make_mbv2_data.TRAIN_PER_CLASS:     # never overwrite bench/mbv2_tte.yaml's data
        out = out.with_name(f"mbv2_synth_{a.train_per_class}pc.npz")
    make_mbv2_data.TRAIN_PER_CLASS = a.train_per_class
    with tempfile.TemporaryDirectory(prefix="tt-auto-bench-") as tmp:
        tmp = Path(tmp)
        if a.size == 96:
            import mbv2_variants
            data = mbv2_variants.data_for(96, tmp)
        else:
            data = make_mbv2_data.make(out)
        spec = (HERE / "mbv2_auto.yaml").read_text().replace("../build/bench-data/mbv2_synth.npz", str(data))
        spec = spec.replace("zoo:mbv2-w0.35-128", f"zoo:mbv2-w0.35-{a.size}")
        print(f"zoo:mbv2-w0.35-{a.size}; load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg())
              + f" ({os.cpu_count()} cores)")
        wall, lazy = _build(spec, tmp, "lazy")
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        plan = lazy["plan"]
        an = plan.get("analysis", {})
        print(f"train samples: {a.train_per_class * 10}; sparse-plan wall time {wall:.1f} s, CPU {lazy['cpu']:.1f} s "
              f"(load + quantize excluded)")
        print(f"analysis: {an.get('mode')}, {an.get('units_measured')} of {an.get('units')} options measured, "
              f"{len(an.get('rounds', []))} search rounds; chosen plan's options still estimated: "
              f"{plan['predicted'].get('estimated_options') or 'none'}")
        print(f"plan: {_plan_text(plan)}, exact peak {plan['exact']['peak_bytes'] / 1024:.1f} KB of "
              f"{plan['budget_bytes'] / 1024:.1f} KB, fits {plan['fits']}")
        _print_whole(plan)
        if a.compare_layers <= 0:
            return 0
        n = a.compare_layers
        spec_full = spec.replace("    scheme: auto ", f"    analysis: {{max_layers: {n}}}\n    scheme: auto ", 1)
        wall_full, full = _build(spec_full, tmp, "full", quiet=True)
        import yaml
        data_spec = yaml.safe_load(spec)["data"]
        data_spec["path"] = str(data)
        t0 = time.perf_counter()
        ref, gains = _measured_gains(lazy["dir"], data_spec, [lazy, full])
        t_meas = time.perf_counter() - t0
    rows = [(f"lazy, all {an.get('units')} options", lazy, gains[0]),
            (f"full, last {n} layers", full, gains[1])]
    print(f"\ncomparison (reference accuracy {ref:.1%} on the held-out train samples; full analysis "
          f"{wall_full:.0f} s after the lazy run's units, fine-tuning both plans {t_meas:.0f} s):")
    print(f"  {'analysis':<26} {'plan':<56} {'predicted':>9} {'measured':>9}")
    for name, run, gain in rows:
        p = run["plan"]["predicted"]
        print(f"  {name:<26} {_plan_text(run['plan'])[:56]:<56} {100 * p['delta_accuracy']:>+8.1f}  "
              f"{100 * gain:>+8.1f}")
    print("  (points of top-1 accuracy: predicted = sum of the plan's options' Δ; measured = the plan fine-tuned "
          "as one unit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
