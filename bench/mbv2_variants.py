"""MobileNetV2-w0.35 variants (int8 and float, 128 and 96) trained with the default plan (`scheme: auto`) on the
default board: does each fit the budget and train in QEMU? (issue 10, "Done when").

    python bench/mbv2_variants.py                 # the four zoo variants; writes bench/mbv2_variants.md
    python bench/mbv2_variants.py --only 96       # variants whose zoo name contains this text

`--model FILE` builds other MobileNetV2 files instead (e.g. a converter's own float or 96 export: bench/
make_mbv2_converter.py makes them with TensorFlow; a file name with `_96_` or `-96` gets the 96x96 data). The zoo variants are zoo models (stages/model/zoo.py): zoo:mbv2-w0.35-128 is the converter-made int8 file; -96, -128-float
and -96-float are made from it at first use (stages/model/zoo_derive.py). Each is built with bench/mbv2_auto.yaml's
settings (stm32f746-disco, auto, SGD, 2 epochs on 20 samples, 50 test samples) on bench/make_mbv2_data.py's shifted
synthetic task; the 96 variants get the same images resized to 96x96 (nearest neighbour). A float model goes through
quantize as any float model does (tinytrain's int8 conversion; the spec is otherwise unchanged).
Each build runs `tinytrain build --json` in a subprocess with a private, empty cache. Recorded: the plan auto chose,
the predicted SRAM, the firmware's SRAM/flash (cross-compile/size.json), top-1 before/after training in QEMU
(emulate-run/run.json) and the wall time of sparse-plan (auto's analysis) and of the whole build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_mbv2_data  # noqa: E402

VARIANTS = ("mbv2-w0.35-128", "mbv2-w0.35-96", "mbv2-w0.35-128-float", "mbv2-w0.35-96-float")


def data_for(size: int, tmp: Path) -> Path:
    a = make_mbv2_data.arrays()
    if size != a["x_train"].shape[1]:
        idx = (np.arange(size) * a["x_train"].shape[1] / size).astype(int)
        for k in ("x_train", "x_test"):
            a[k] = np.ascontiguousarray(a[k][:, idx][:, :, idx])
    path = tmp / f"mbv2_{size}.npz"
    np.savez_compressed(path, **a)
    return path


def build(variant: str, tmp: Path, timeout: float) -> dict:
    """variant: a zoo name, or the path of a converter-made file (bench/make_mbv2_converter.py)."""
    size = 96 if ("-96" in variant or "_96_" in variant) else 128
    ref = variant if variant.endswith(".tflite") else f"zoo:{variant}"
    spec = (HERE / "mbv2_auto.yaml").read_text()
    spec = spec.replace("zoo:mbv2-w0.35-128", ref).replace(
        "../build/bench-data/mbv2_synth.npz", str(data_for(size, tmp))).replace(
        "out_dir: ../build", f"out_dir: {tmp}/build").replace("name: mbv2_auto", f"name: {_ident(variant)}")
    path = tmp / f"{_ident(variant)}.yaml"
    path.write_text(spec)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "tinytrain", "build", str(path), "--json", "--cache-dir",
                               str(tmp / f"cache-{_ident(variant)}")], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "seconds": round(time.perf_counter() - t0, 1), "exit_code": None,
                "reason": f"timeout after {timeout:g} s"}
    row = {"variant": variant, "seconds": round(time.perf_counter() - t0, 1), "exit_code": proc.returncode}
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["reason"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return row
    stages = {s["stage"]: s for s in doc.get("stages", [])}
    row["reason"] = "" if doc.get("ok") else str((doc.get("error") or {}).get("message", doc.get("error")))
    sp = stages.get("sparse-plan", {})
    row["plan"] = sp.get("summary", "")
    row["plan_seconds"] = sp.get("duration_s")
    row["quantize"] = stages.get("quantize", {}).get("summary", "")
    out = Path(doc.get("out_dir", ""))
    size_json = out / "cross-compile" / "size.json"
    if size_json.is_file():
        s = json.loads(size_json.read_text())
        row["sram_kb"] = round(s["sram"]["used"] / 1024, 1)
        row["flash_kb"] = round(s["flash"]["used"] / 1024, 1)
        row["sram_available_kb"] = round(s["sram"]["available"] / 1024, 1)
    run = out / "emulate-run" / "run.json"
    if run.is_file():
        r = json.loads(run.read_text())
        row["acc_before"], row["acc_after"] = _acc(r, "before"), _acc(r, "after")
    return row


def _ident(variant: str) -> str:
    return Path(variant).stem.replace(".", "_").replace("-", "_")


def _acc(run: dict, when: str):
    a = run.get("accuracy", {})
    return a.get(f"{when}_pct")


def markdown(rows: list[dict]) -> str:
    head = ("| zoo model | plan `auto` chose | firmware SRAM KB | flash KB | top-1 before -> after (QEMU) | "
            "auto s | build s | result |\n|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| `{r['variant'] if r['variant'].endswith('.tflite') else 'zoo:' + r['variant']}` | {r.get('plan', '').replace('|', '/')} | {r.get('sram_kb', '')} | "
        f"{r.get('flash_kb', '')} | {r.get('acc_before', '')} -> {r.get('acc_after', '')} | "
        f"{r.get('plan_seconds', '')} | {r['seconds']} | {'trains' if r['exit_code'] == 0 else r.get('reason', '')} |\n"
        for r in rows)
    return ("MobileNetV2-w0.35 variants, default `scheme: auto` on stm32f746-disco (320 KB SRAM, budget 300 KB), "
            "bench/mbv2_auto.yaml's settings, `python bench/mbv2_variants.py`.\n\n" + head + body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--model", action="append", default=None,
                    help="build this .tflite instead of the zoo variants (repeatable; e.g. your converter's own)")
    a = ap.parse_args(argv)
    variants = list(a.model) if a.model else list(VARIANTS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tt-mbv2v-") as tmp:
        for v in variants:
            if a.only and a.only not in v:
                continue
            print(f"{v} ...", flush=True)
            rows.append(build(v, Path(tmp), a.timeout))
            print(f"    {json.dumps(rows[-1])}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "mbv2_variants.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "mbv2_variants.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
