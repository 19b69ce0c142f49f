"""Instructions per training step of MobileNetV2-w0.35 @128 (TTE-like sparse update) on the STM32F746 in QEMU,
next to MIT's Tiny Training Engine (373 ms per step at 216 MHz, ≈ 80.6 M cycles).

    .venv/bin/python bench/instructions_mbv2.py [--json] [--spec bench/mbv2_tte.yaml] [--rerun]

Builds bench/mbv2_tte.yaml through the pipeline (`tinytrain build`; cached stages are restored, --rerun forces the
QEMU run again), then reads emulate-run/run.json, cross-compile/size.json and reorder/memplan.json and prints:
  instructions per training step (mean / min / max over the run's steps; QEMU -icount shift=0, counted by SysTick
  every 40 instructions), the equivalent time at 216 MHz and TTE's figure beside it;
  SRAM (static + stack) and flash against the board, the measured stack high-water mark, and the training
  arena: planned peak vs the painted high-water, vs TTE's 141 KB;
  whether it learns: the loss per step (mean of the first and of the last quarter of the steps) and the test
  accuracy before and after, on bench/make_mbv2_data.py's shifted variant of the zoo model's pretraining task.

Assumption (stated in the output): one instruction ≈ one cycle. The Cortex-M7 can issue two instructions per cycle
(fewer cycles) but waits on flash and memory (more); QEMU counts instructions, not cycles, so the ms figure is an
estimate. Kernels are the portable C99 ones (target.kernels: portable), TTE's are hand-tuned with the ARM DSP
extension.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SPEC = HERE / "mbv2_tte.yaml"
CLOCK_HZ = 216_000_000
TTE_MS = 373.0
TTE_CYCLES = TTE_MS * 1e-3 * CLOCK_HZ     # ≈ 80.6 M
TTE_PEAK_KB = 141


def build(spec: Path, rerun: bool = False) -> Path:
    """Build `spec` with the pipeline; returns its build folder (build/<name>/)."""
    import contextlib
    import io

    from tinytrain.pipeline.cli import main as cli

    sys.path.insert(0, str(HERE))
    from make_mbv2_data import make

    make()  # the synthetic data set the spec names (same bytes every time: no cache miss)
    args = ["build", str(spec), "--json"] + (["--force", "emulate-run"] if rerun else [])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(args)
    doc = json.loads(out.getvalue() or "{}")
    if rc != 0:
        raise SystemExit(f"tinytrain build {spec} failed (exit {rc}):\n{json.dumps(doc, indent=1)[:4000]}")
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.pipeline.workspace import build_dir

    return build_dir(load_spec(spec))


def measure(build_dir: Path) -> dict:
    run = json.loads((build_dir / "emulate-run" / "run.json").read_text())
    size = json.loads((build_dir / "cross-compile" / "size.json").read_text())
    mem = json.loads((build_dir / "reorder" / "memplan.json").read_text())
    ins = run["instructions"]
    mean = float(ins["per_step_mean"])
    sram, flash = size["sram"], size["flash"]
    return {
        "model": "MobileNetV2-w0.35 @128, int8, 10 classes (zoo:mbv2-w0.35-128), TTE-like sparse update, SGD, batch 1",
        "board": run["board"],
        "steps": run["loss"]["steps"],
        "instructions_per_step": {"mean": mean, "min": ins["per_step_min"], "max": ins["per_step_max"],
                                  "how": ins["how"]},
        "ms_per_step_at_216mhz": mean / CLOCK_HZ * 1e3,
        "assumption": "1 instruction ≈ 1 cycle at 216 MHz (QEMU counts instructions; the dual-issue Cortex-M7 may "
                      "need fewer cycles, flash wait states more)",
        "tte": {"ms_per_step": TTE_MS, "cycles_per_step": TTE_CYCLES, "ratio": mean / TTE_CYCLES,
                "peak_kb": TTE_PEAK_KB},
        "sram": {"static_bytes": sram["static"], "stack_bytes": sram["stack"], "used_bytes": sram["used"],
                 "available_bytes": sram["available"], "stack_high_water_bytes": run["stack"]["high_water_bytes"]},
        "flash": {"used_bytes": flash["used"], "available_bytes": flash["available"]},
        "fits": bool(size["fits"]),
        "arena": {"planned_peak_bytes": mem["arena_bytes"], "lower_bound_bytes": mem["lower_bound_bytes"],
                  **{k: run["arena"][k] for k in ("planned_end_bytes", "used_bytes", "equal")}},
        "loss_per_step": run["loss"]["per_step"],
        "learning": learning(run),
    }


def learning(run: dict) -> dict:
    """Did the run learn? The mean loss of each epoch (the same samples every epoch: like with like), the means
    of the first and last quarter of the steps and the first and last step (single steps at batch 1 are noisy: a
    confidently wrong sample costs ~10, a right one ~0), and the test accuracy before/after with the split's size."""
    loss = [float(v) for v in run["loss"]["per_step"]]
    k = max(1, len(loss) // 4)
    acc = run["accuracy"]
    return {"loss_first": loss[0] if loss else None, "loss_last": loss[-1] if loss else None,
            "quarter": k, "loss_mean_first": sum(loss[:k]) / k if loss else None,
            "loss_mean_last": sum(loss[-k:]) / k if loss else None,
            "loss_epoch_mean": [float(v) for v in run["loss"]["epoch_mean"] or []],
            "accuracy_before_pct": acc["before_pct"], "accuracy_after_pct": acc["after_pct"],
            "test_samples": run["data"]["test_samples"], "train_samples": run["data"]["train_samples_per_epoch"],
            "epochs": run["loss"]["epochs"]}


def _kb(n: float) -> str:
    return f"{n / 1024:.1f} KB"


def report(r: dict) -> str:
    i, s, f, a, t, ln = (r["instructions_per_step"], r["sram"], r["flash"], r["arena"], r["tte"], r["learning"])
    return "\n".join([
        r["model"],
        f"board {r['board']} (QEMU mps2-an500), {r['steps']} training steps",
        "",
        f"instructions per training step   mean {i['mean'] / 1e6:.1f} M   min {i['min'] / 1e6:.1f} M   "
        f"max {i['max'] / 1e6:.1f} M   ({i['how']})",
        f"≈ {r['ms_per_step_at_216mhz']:.0f} ms per step at 216 MHz  vs  TTE {t['ms_per_step']:.0f} ms "
        f"(≈ {t['cycles_per_step'] / 1e6:.1f} M cycles): {t['ratio']:.2f}x TTE",
        f"assumption: {r['assumption']}",
        "",
        f"SRAM   {_kb(s['used_bytes'])} of {_kb(s['available_bytes'])}  (static {_kb(s['static_bytes'])} + stack "
        f"{_kb(s['stack_bytes'])}; measured stack high-water {s['stack_high_water_bytes']} B)",
        f"flash  {_kb(f['used_bytes'])} of {_kb(f['available_bytes'])}   fits: {'yes' if r['fits'] else 'NO'}",
        f"training arena (peak memory)  planned {_kb(a['planned_peak_bytes'])} (lower bound "
        f"{_kb(a['lower_bound_bytes'])}), measured high-water {a['used_bytes']} B == planned end "
        f"{a['planned_end_bytes']} B: {'equal' if a['equal'] else 'NOT equal'};  TTE {t['peak_kb']} KB",
        "",
        f"learning: {ln['train_samples']} training samples x {ln['epochs']} epoch(s), batch 1, on the shifted "
        f"synthetic task (bench/make_mbv2_data.py)",
        f"loss  per epoch (mean) {' -> '.join(_g(v) for v in ln['loss_epoch_mean'])};  mean of the first "
        f"{ln['quarter']} steps {_g(ln['loss_mean_first'])}, of the last {ln['quarter']} {_g(ln['loss_mean_last'])};  "
        f"first step {_g(ln['loss_first'])}, last {_g(ln['loss_last'])}",
        f"test accuracy ({ln['test_samples']} samples)  before {_g(ln['accuracy_before_pct'], '.1f')}%  after "
        f"{_g(ln['accuracy_after_pct'], '.1f')}%",
    ])


def _g(v, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    ap.add_argument("--rerun", action="store_true", help="run the firmware in QEMU again even if cached")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = measure(build(a.spec, a.rerun))
    print(json.dumps(r, indent=2, sort_keys=True) if a.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
