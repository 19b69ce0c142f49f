"""Instructions per training step of the digits example on the Cortex-M55 board (mps3-an547) with each
`target.kernels` variant, and the M7 for reference; the trained weights must be the same bytes for all.

    .venv/bin/python bench/m55_kernels.py [--samples 300] [--out /tmp/m55-bench]

Same spec as tinytrain.yaml.example except: one epoch of the first --samples training samples and a fixed 200 KB
budget (so every board trains the same plan). Counts come from QEMU -icount (deterministic), so one run each is
enough. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUNS = (("mps3-an547", "portable"), ("mps3-an547", "dsp"), ("mps3-an547", "mve"), ("stm32f746-disco", "portable"))


def measure(board: str, kernels: str, samples: int, out: Path) -> dict:
    from tinytrain.pipeline.cli import main

    doc = yaml.safe_load((REPO / "tinytrain.yaml.example").read_text())
    doc["model"]["path"] = str(REPO / doc["model"]["path"])
    doc["target"].update(board=board, kernels=kernels)
    doc["train"]["update"]["budget_kb"] = 200
    doc["train"].update(epochs=1, max_train_samples=samples)
    doc["build"] = {"out_dir": str(out / "build"), "cache_dir": str(out / "cache")}
    doc["name"] = f"digits-{board}"  # one folder per board: the kernel variants share every stage before codegen
    spec = out / f"{board}-{kernels}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    if main(["-q", "build", str(spec)]) != 0:
        raise SystemExit(f"the build for {board}/{kernels} failed")
    run_dir = out / "build" / doc["name"] / "emulate-run"
    run = json.loads((run_dir / "run.json").read_text())
    return {"board": board, "kernels": kernels, "per_step": run["instructions"]["per_step_mean"],
            "total_run": run["instructions"]["total_run"], "accuracy_after_pct": run["accuracy"]["after_pct"],
            "weights_sha256": hashlib.sha256((run_dir / "weights.bin").read_bytes()).hexdigest()[:16]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="m55-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [measure(b, k, args.samples, out) for b, k in RUNS]
    base = rows[0]["per_step"]
    print("| board | kernels | instructions per step | vs portable | whole run (train + 2 evaluations) "
          "| accuracy after | weights sha256 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['board']} | {r['kernels']} | {r['per_step']:,.0f} | {r['per_step'] / base:.3f} "
              f"| {r['total_run']:,} | {r['accuracy_after_pct']:.1f} % | `{r['weights_sha256']}` |")
    if len({r["weights_sha256"] for r in rows}) != 1:
        print("the trained weights differ between runs")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
