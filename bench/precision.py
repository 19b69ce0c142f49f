"""int8 vs fp32 vs fp16-mixed on the digits example (issue 13, item 5): peak SRAM, speed, accuracy after training.

    .venv/bin/python bench/precision.py [--board host] [--scheme auto|full|last_k] [--json OUT]

Builds tinytrain.yaml.example three times with `train.precision` int8 / fp32 / fp16-mixed on `--board` (each a build
name of its own, so all stay cached) and prints one row per precision:
  arena       the planned peak of the training program (reorder/memplan.json; measured equal in the run)
  fp32 same   fp16-mixed only: the fp32 graph of the same plan (autodiff/precision.json)
  SRAM        data + bss + stack of the executable (cross-compile/size.json)
  instr/step  mean instructions per training step counted in QEMU (Cortex-M boards only)
  host ms     CPU time per training step of the host build (best of 5; the machine's other load matters little)
  accuracy    test split before -> after training (run.json)
  loss scale  fp16-mixed: the final scale and the steps skipped for an Inf/NaN gradient
fp16-mixed needs a board with half precision (`host` here; the Cortex-M55 board once it is merged): on another
board that row says why it is refused. Benchmarks measure; nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "tinytrain.yaml.example"
PRECISIONS = ("int8", "fp32", "fp16-mixed")


def _host_ms(out_dir: Path, steps: int = 400) -> float:
    """CPU ms per training step of a host build: the executable run for 1 and for 1 + steps steps."""
    sys.path.insert(0, str(HERE))
    from speed import _one_step_files   # the same runtime files bench/speed.py times the host build with

    elf = out_dir / "cross-compile" / "firmware.elf"

    def cpu(n: int) -> float:
        best = float("inf")
        with tempfile.TemporaryDirectory(prefix="tt-precision-") as tmp:
            exe = Path(tmp) / "fw"
            exe.write_bytes(elf.read_bytes())
            exe.chmod(0o755)
            for name, content in _one_step_files(out_dir, EXAMPLE, n).items():
                (Path(tmp) / name).write_bytes(content)
            for _ in range(5):
                proc = subprocess.Popen([str(exe)], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"the host firmware {elf} failed")
                best = min(best, usage.ru_utime + usage.ru_stime)
        return best

    return (cpu(1 + steps) - cpu(1)) / steps * 1e3


def row(precision: str, board: str, scheme: str) -> dict[str, Any]:
    import tinytrain

    name = f"precision-{precision}-{board}-{scheme}"
    try:
        r = tinytrain.build(str(EXAMPLE), name=name, **{"train.precision": precision, "target.board": board,
                                                        "train.update.scheme": scheme,
                                                        **({"train.update.k": 1} if scheme == "last_k" else {})})
    except tinytrain.UserError as e:
        return {"precision": precision, "board": board, "refused": " ".join(str(e).split())}
    out = r.out_dir
    run = json.loads((out / "emulate-run" / "run.json").read_text())
    plan = json.loads((out / "reorder" / "memplan.json").read_text())
    size = json.loads((out / "cross-compile" / "size.json").read_text())
    prec = out / "autodiff" / "precision.json"
    sram = (size.get("sram") or {}).get("used")
    d = {"precision": precision, "board": board, "scheme": scheme, "arena_bytes": int(plan["arena_bytes"]),
         "arena_bytes_fp32_same_plan": json.loads(prec.read_text())["arena_bytes_fp32"] if prec.is_file() else None,
         "sram_bytes": sram, "instructions_per_step": run["instructions"].get("per_step_mean"),
         "host_ms_per_step": _host_ms(out) if board == "host" else None,
         "accuracy_before_pct": run["accuracy"]["before_pct"], "accuracy_after_pct": run["accuracy"]["after_pct"],
         "loss_scale": (run.get("loss_scale") or {}).get("final"),
         "skipped_steps": (run.get("loss_scale") or {}).get("skipped_steps")}
    return d


def table(rows: list[dict[str, Any]]) -> str:
    kb = lambda v: "" if v is None else f"{v / 1024:.1f}"  # noqa: E731
    lines = ["| precision | board | arena KB | fp32 same plan KB | SRAM KB | instr/step | host ms/step | accuracy % "
             "| loss scale (skipped) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['precision']} | {r['board']} | refused: {r['refused']} |||||||")
            continue
        ins = "" if r["instructions_per_step"] is None else f"{r['instructions_per_step'] / 1e6:.2f} M"
        ms = "" if r["host_ms_per_step"] is None else f"{r['host_ms_per_step']:.4f}"
        ls = "" if r["loss_scale"] is None else f"{r['loss_scale']:g} ({r['skipped_steps']})"
        lines.append(f"| {r['precision']} | {r['board']} | {kb(r['arena_bytes'])} | "
                     f"{kb(r['arena_bytes_fp32_same_plan'])} | {kb(r['sram_bytes'])} | {ins} | {ms} | "
                     f"{r['accuracy_before_pct']:.1f} → {r['accuracy_after_pct']:.1f} | {ls} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--board", default="host")
    ap.add_argument("--scheme", default="auto", choices=("auto", "full", "last_k"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = [row(p, a.board, a.scheme) for p in PRECISIONS]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
