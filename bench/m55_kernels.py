"""Instructions per training step on the Cortex-M55 board (mps3-an547) with each `target.kernels` variant, and on
the M7 for reference; the trained weights must be the same bytes for all of them.

    .venv/bin/python bench/m55_kernels.py [--samples 300] [--out /tmp/m55-bench]
    .venv/bin/python bench/m55_kernels.py --spec bench/mbv2_tte.yaml     # after bench/make_mbv2_data.py; ~10 min

Default: tinytrain.yaml.example with one epoch of the first --samples training samples and a fixed 200 KB budget
(so both boards train the same plan). With --spec, that spec with the board, the kernels and the budget changed (the
smallest board's, so that sparse-plan makes the same choices, e.g. the update rounding, on every board). Counts come from QEMU -icount
(deterministic), so one run each is enough. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

from tinytrain.stages.device.boards import get_board

REPO = Path(__file__).resolve().parents[1]
RUNS = (("mps3-an547", "portable"), ("mps3-an547", "dsp"), ("mps3-an547", "mve"), ("stm32f746-disco", "portable"))


def measure(spec: Path, board: str, kernels: str, out: Path, overrides: dict) -> dict:
    import tinytrain

    # One build folder per board: the kernel variants share every stage before cross-compile.
    res = tinytrain.build(spec, cache_dir=out / "cache", **{
        "name": f"m55bench-{board}", "build.out_dir": str(out / "build"), "target.board": board,
        "target.kernels": kernels, **overrides})
    weights = res.artifact("emulate-run", "weights.bin").read_bytes()
    doc = json.loads(res.artifact("emulate-run", "run.json").read_text())
    return {"board": board, "kernels": kernels, "per_step": doc["instructions"]["per_step_mean"],
            "total_run": doc["instructions"]["total_run"], "accuracy_after_pct": doc["accuracy"]["after_pct"],
            "weights_sha256": hashlib.sha256(weights).hexdigest()[:16]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=None, help="a spec to run as it is (default: the example)")
    ap.add_argument("--samples", type=int, default=300, help="example only: training samples of the one epoch")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="m55-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.spec is None:
        spec = REPO / "tinytrain.yaml.example"
        overrides = {"train.update.budget_kb": 200, "train.epochs": 1, "train.max_train_samples": args.samples}
    else:  # the smallest budget of the boards, so that sparse-plan makes the same choices on all of them
        budget = min(get_board(b).budget_bytes for b, _ in RUNS) // 1024
        spec, overrides = args.spec.resolve(), {"train.update.budget_kb": budget}
    rows = [measure(spec, b, k, out, overrides) for b, k in RUNS]
    base = rows[0]["per_step"]
    print(f"{spec.name}:")
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
