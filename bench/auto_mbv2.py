"""Wall time of `scheme: auto` (contribution analysis + search + exact verification) on MobileNetV2-w0.35@128.

    python bench/auto_mbv2.py                      # bench/make_mbv2_data.py's data (40 train samples)
    python bench/auto_mbv2.py --train-per-class 52 # 520 train samples: the analysis' defaults (256 + 256) apply

Builds bench/mbv2_auto.yaml up to sparse-plan in a fresh, empty cache (nothing memoised), times it, and prints the
plan's summary line, how many of the options were measured and how many only estimated (plan.json `analysis`).
A benchmark, not a test: the figure depends on the machine (issue 14's goal: <= 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_mbv2_data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-per-class", type=int, default=make_mbv2_data.TRAIN_PER_CLASS)
    a = ap.parse_args(argv)
    out = make_mbv2_data.DEFAULT_OUT
    if a.train_per_class != make_mbv2_data.TRAIN_PER_CLASS:     # never overwrite bench/mbv2_tte.yaml's data
        out = out.with_name(f"mbv2_synth_{a.train_per_class}pc.npz")
    make_mbv2_data.TRAIN_PER_CLASS = a.train_per_class
    data = make_mbv2_data.make(out)
    spec = (HERE / "mbv2_auto.yaml").read_text().replace("../build/bench-data/mbv2_synth.npz", str(data))
    with tempfile.TemporaryDirectory(prefix="tt-auto-bench-") as tmp:
        path = Path(tmp) / "mbv2_auto.yaml"
        path.write_text(spec.replace("out_dir: ../build", f"out_dir: {tmp}/build"))
        cmd = [sys.executable, "-m", "tinytrain", "build", str(path), "--until", "sparse-plan",
               "--cache-dir", str(Path(tmp) / "cache")]
        subprocess.run(cmd + ["--until", "quantize"], check=True, capture_output=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        plan = json.loads((Path(tmp) / "build" / "mbv2_auto" / "sparse-plan" / "plan.json").read_text())
    an = plan.get("analysis", {})
    print(f"train samples: {a.train_per_class * 10}; sparse-plan wall time {wall:.1f} s (load + quantize excluded)")
    print(f"analysis: {an.get('mode')}, {an.get('units_measured')} of {an.get('units')} options measured, "
          f"{len(an.get('rounds', []))} search rounds; chosen plan's options still estimated: "
          f"{plan['predicted'].get('estimated_options') or 'none'}")
    print(f"plan: k={plan['predicted']['k']}, weights {plan['predicted']['weights']}, exact peak "
          f"{plan['exact']['peak_bytes'] / 1024:.1f} KB of {plan['budget_bytes'] / 1024:.1f} KB, fits {plan['fits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
