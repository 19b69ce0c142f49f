"""int8 vs fp32 vs fp16-mixed on the digits example (issue 13, item 5): peak SRAM, speed, accuracy after training.

    .venv/bin/python bench/precision.py [--board host] [--scheme auto|full|last_k] [--json OUT]
    .venv/bin/python bench/precision.py --mbv2 [--board host]     # MobileNetV2-w0.35@128, TTE-like sparse scheme
    (--precisions int8,fp32: only those rows)

Builds tinytrain.yaml.example three times with `train.precision` int8 / fp32 / fp16-mixed on `--board` (each a build
name of its own, so all stay cached) and prints one row per precision:
  arena       the planned peak of the training program (reorder/memplan.json; measured equal in the run)
  fp32 same   fp16-mixed only: the fp32 graph of the same plan (autodiff/precision.json)
  check       fp16-mixed only: where the overflow check runs (autodiff/precision.json check_first): "pass" = a
              backward pass of its own before the in-place updates (a second backward's instructions), "end" = at
              the end of the one backward, every trained gradient kept until then (whichever plans less SRAM)
  SRAM        data + bss + stack of the executable (cross-compile/size.json)
  instr/step  mean instructions per training step counted in QEMU (Cortex-M boards only)
  host ms     CPU time per training step of the host build (best of 5; the machine's other load matters little)
  accuracy    test split before -> after training (run.json)
  loss scale  fp16-mixed: the final scale and the steps skipped for an Inf/NaN gradient
--mbv2: bench/mbv2_tte.yaml's model and sparse scheme instead (data: bench/make_mbv2_data.py, made when missing);
int8 is the zoo's int8 model, fp32 and fp16-mixed its float copy (the int8 weights dequantized,
stages/quant/dequantize.dequantize_graph, written as a .tflite under build/bench-data/).
fp16-mixed needs a board with half precision (`host`, `mps3-an547`): on another board that row says why it is
refused. Memory and instruction counts are deterministic; host ms are CPU time and move with the machine's load.
Benchmarks measure; nothing here asserts.
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


def _host_ms(out_dir: Path, spec: Path = EXAMPLE, steps: int = 400) -> float:
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
            for name, content in _one_step_files(out_dir, spec, n).items():
                (Path(tmp) / name).write_bytes(content)
            for _ in range(5):
                proc = subprocess.Popen([str(exe)], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"the host firmware {elf} failed")
                best = min(best, usage.ru_utime + usage.ru_stime)
        return best

    return (cpu(1 + steps) - cpu(1)) / steps * 1e3


DATA = ROOT / "build" / "bench-data"


def _mbv2_spec(precision: str, board: str) -> dict[str, Any]:
    """bench/mbv2_tte.yaml as a dict for `precision` on `board` (float precisions: the float copy of the model)."""
    import yaml

    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.model.tflite_writer import write_model
    from tinytrain.stages.quant.dequantize import dequantize_graph

    npz = DATA / "mbv2_synth.npz"
    if not npz.is_file():
        subprocess.run([sys.executable, str(HERE / "make_mbv2_data.py"), "--out", str(npz)], check=True)
    spec = yaml.safe_load((HERE / "mbv2_tte.yaml").read_text())
    spec["data"]["path"] = str(npz)
    if precision != "int8":
        flt = DATA / "mbv2_w035_128_float.tflite"
        if not flt.is_file():
            write_model(dequantize_graph(read_model(zoo.resolve("mbv2-w0.35-128"))), flt)
        spec["model"]["path"] = str(flt)
    spec["name"] = f"precision-mbv2-{precision}-{board}"
    spec["train"]["precision"] = precision
    spec["target"]["board"] = board
    spec["build"] = {"out_dir": str(ROOT / "build")}
    return spec


def row(precision: str, board: str, scheme: str) -> dict[str, Any]:
    import tinytrain

    name = f"precision-{precision}-{board}-{scheme}"
    try:
        if scheme == "mbv2":
            r = tinytrain.build(_mbv2_spec(precision, board))
        else:
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
    pj = json.loads(prec.read_text()) if prec.is_file() else {}
    d = {"precision": precision, "board": board, "scheme": scheme, "arena_bytes": int(plan["arena_bytes"]),
         "arena_bytes_fp32_same_plan": pj.get("arena_bytes_fp32"),
         "check": None if not pj else ("pass" if pj.get("check_first") else "end"),
         "sram_bytes": sram, "instructions_per_step": run["instructions"].get("per_step_mean"),
         "host_ms_per_step": _host_ms(out, spec=HERE / "mbv2_tte.yaml" if scheme == "mbv2" else EXAMPLE,
                                      steps=20 if scheme == "mbv2" else 400) if board == "host" else None,
         "accuracy_before_pct": run["accuracy"]["before_pct"], "accuracy_after_pct": run["accuracy"]["after_pct"],
         "loss_scale": (run.get("loss_scale") or {}).get("final"),
         "skipped_steps": (run.get("loss_scale") or {}).get("skipped_steps")}
    return d


def table(rows: list[dict[str, Any]]) -> str:
    kb = lambda v: "" if v is None else f"{v / 1024:.1f}"  # noqa: E731
    lines = ["| precision | board | arena KB | fp32 same plan KB | check | SRAM KB | instr/step | host ms/step "
             "| accuracy % | loss scale (skipped) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['precision']} | {r['board']} | refused: {r['refused']} ||||||||")
            continue
        ins = "" if r["instructions_per_step"] is None else f"{r['instructions_per_step'] / 1e6:.2f} M"
        ms = "" if r["host_ms_per_step"] is None else f"{r['host_ms_per_step']:.4f}"
        ls = "" if r["loss_scale"] is None else f"{r['loss_scale']:g} ({r['skipped_steps']})"
        lines.append(f"| {r['precision']} | {r['board']} | {kb(r['arena_bytes'])} | "
                     f"{kb(r['arena_bytes_fp32_same_plan'])} | {r.get('check') or ''} | {kb(r['sram_bytes'])} | "
                     f"{ins} | {ms} | "
                     f"{r['accuracy_before_pct']:.1f} → {r['accuracy_after_pct']:.1f} | {ls} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--board", default="host")
    ap.add_argument("--scheme", default="auto", choices=("auto", "full", "last_k"))
    ap.add_argument("--mbv2", action="store_true", help="MobileNetV2 with bench/mbv2_tte.yaml's sparse scheme")
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated subset of " + ", ".join(PRECISIONS))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    chosen = [p.strip() for p in a.precisions.split(",") if p.strip()]
    bad = [p for p in chosen if p not in PRECISIONS]
    if bad or not chosen:
        ap.error(f"--precisions: {', '.join(bad) or 'none given'}: choose among {', '.join(PRECISIONS)}")
    rows = [row(p, a.board, "mbv2" if a.mbv2 else a.scheme) for p in chosen]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
