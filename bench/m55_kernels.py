"""Instructions and estimated cycles per training step on the Cortex-M55 board (mps3-an547), portable kernels against
`target.kernels: mve` (Helium), for the example in int8, fp32 and fp16-mixed and for MobileNetV2 (int8 unless
--precisions says otherwise); the trained weights must be the same bytes for every kernel variant of a precision.

    .venv/bin/python bench/m55_kernels.py [--samples 300] [--out /tmp/m55-bench]      # the example, three precisions
    .venv/bin/python bench/m55_kernels.py --mbv2 [--precisions int8,fp16-mixed] [--no-cycles]   # MobileNetV2 TTE
    (--kernels mve: one variant only, e.g. to trace it again after a change; "vs portable" is then against itself)

The example: tinytrain.yaml.example with one epoch of the first --samples training samples and a fixed 200 KB budget.
--mbv2: bench/mbv2_tte.yaml (data from bench/make_mbv2_data.py, written when missing) with the M55's budget; int8
by default, fp32 / fp16-mixed train the zoo model's float copy (bench/precision.py's).
Instructions per step come from QEMU -icount (deterministic: one run each is enough). Cycles: one training step traced
in QEMU and costed with stages/device/cycles.py's Cortex-M55 table (its docstring states the assumptions: single-issue
scalar, Helium dual-beat, zero-wait TCM); --no-cycles skips the trace. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BOARD = "mps3-an547"
KERNELS = ("portable", "mve")
PRECISIONS = ("int8", "fp32", "fp16-mixed")


def _one_step_files(build_dir: Path, spec: Any) -> dict[str, bytes]:
    """runtime.bin (no evaluation, stop after one step), train.ttds, test.ttds for a built program."""
    from tinytrain.stages import emulate_run
    from tinytrain.stages.model.ir import Graph

    layout = json.loads((build_dir / "codegen" / "io_layout.json").read_text())
    rc = emulate_run.runtime_config({"train.learning_rate": spec.train.learning_rate, "train.epochs": 1,
                                     "train.seed": spec.train.seed, "train.batch_size": spec.train.batch_size,
                                     "train.optimizer": spec.train.optimizer, "train.max_train_samples": 0})
    rc = dataclasses.replace(rc, flags=0, epochs=1, stop_after_steps=1)
    files, _ = emulate_run.run_files(spec.data, layout, rc, Graph.load(build_dir / "quantize"))
    return files


def measure(spec: Any, label: str, kernels: str, out: Path, overrides: dict, cycles: bool) -> dict:
    import tinytrain
    from tinytrain.pipeline.api import load_spec
    from tinytrain.stages.device import cycles as cyc
    from tinytrain.stages.device.boards import get_board

    ov = {"name": f"m55bench-{label}", "build.out_dir": str(out / "build"), "target.board": BOARD,
          "target.kernels": kernels, **overrides}
    # One build folder per model and precision: the kernel variants share every stage before cross-compile.
    res = tinytrain.build(spec, cache_dir=out / "cache", **ov)
    doc = json.loads(res.artifact("emulate-run", "run.json").read_text())
    row = {"model": label, "kernels": kernels, "per_step": doc["instructions"]["per_step_mean"],
           "accuracy_after_pct": doc["accuracy"]["after_pct"],
           "weights_sha256": hashlib.sha256(res.artifact("emulate-run", "weights.bin").read_bytes()).hexdigest()[:16]}
    if cycles:
        est = doc.get("cycles_per_step_estimate") or {}
        if not est.get("traced"):
            with tempfile.TemporaryDirectory(prefix="tt-m55-trace-") as tmp:
                est = cyc.estimate_step(get_board(BOARD), res.out_dir / "cross-compile" / "firmware.elf",
                                        _one_step_files(res.out_dir, load_spec(spec, **ov)), Path(tmp),
                                        timeout_s=7200)
        row.update(cycles=est["cycles_per_step"], traced=est["instructions_traced"],
                   vector=sum(est["mix"].get(c, 0) for c in cyc.MVE_CLASSES))
    return row


def _mbv2_spec(precision: str = "int8") -> dict:
    """bench/mbv2_tte.yaml in `precision` (fp32 / fp16-mixed: the zoo model's float copy, as bench/precision.py)."""
    sys.path.insert(0, str(HERE))
    from precision import _mbv2_spec as spec_for

    spec = spec_for(precision, BOARD)
    for k in ("name", "build"):
        spec.pop(k, None)   # measure() names the build and its folder
    return spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbv2", action="store_true", help="MobileNetV2 TTE scheme (int8) instead of the example")
    ap.add_argument("--samples", type=int, default=300, help="example only: training samples of the one epoch")
    ap.add_argument("--precisions", default=None,
                    help="comma-separated (default: int8, fp32, fp16-mixed for the example; int8 for --mbv2)")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help="comma-separated kernel variants to measure (default: portable,mve; the first is the baseline)")
    ap.add_argument("--no-cycles", action="store_true", help="skip the one-step trace (instructions only)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from tinytrain.stages.device.boards import get_board

    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels or any(k not in KERNELS for k in kernels):
        ap.error(f"--kernels: choose among {', '.join(KERNELS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="m55-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.mbv2:
        budget_kb = get_board(BOARD).budget_bytes // 1024
        precisions = args.precisions.split(",") if args.precisions else ["int8"]
        groups = [(f"MobileNetV2 TTE {p}", _mbv2_spec(p), {"train.update.budget_kb": budget_kb}) for p in precisions]
    else:
        groups = [(f"example {p}", REPO / "tinytrain.yaml.example",
                   {"train.update.budget_kb": 200, "train.epochs": 1, "train.max_train_samples": args.samples,
                    "train.precision": p}) for p in (args.precisions or ",".join(PRECISIONS)).split(",")]
    rows, same = [], True
    for label, spec, ov in groups:
        group = [measure(spec, label.replace(" ", "-"), k, out, ov, not args.no_cycles) for k in kernels]
        same &= len({r["weights_sha256"] for r in group}) == 1
        rows += group
    cyc = not args.no_cycles
    print(f"Cortex-M55 ({BOARD}, QEMU), one training step:")
    print("| model | kernels | instructions / step | vs portable |" + (" est. cycles / step (M55 table) | vs portable "
                                                                       "| Helium instructions |" if cyc else "")
          + " accuracy after | weights sha256 |")
    print("|---|---|---|---|" + ("---|---|---|" if cyc else "") + "---|---|")
    base: dict[str, dict] = {}
    for r in rows:
        b = base.setdefault(r["model"], r)
        line = f"| {r['model']} | {r['kernels']} | {r['per_step']:,.0f} | {r['per_step'] / b['per_step']:.3f} |"
        if cyc:
            line += f" {r['cycles']:,} | {r['cycles'] / b['cycles']:.3f} | {r['vector']:,} |"
        print(line + f" {r['accuracy_after_pct']:.1f} % | `{r['weights_sha256']}` |")
    if not same:
        print("the trained weights differ between kernel variants")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
