"""MobileNetV2-w0.35 @128, bench/mbv2_tte.yaml's TTE-like sparse scheme, in fp16-mixed on the Cortex-M55 board
(issue 13): the float copy of the zoo model (the int8 weights dequantized, as bench/precision.py --mbv2 builds it)
fits mps3-an547's 512 KB DTCM, trains in QEMU with the host build's bits, and its arena is below the fp32 graph's of
the same plan (the check pass keeps fp32's in-place updates, and the activations the backward reads are fp16)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

import tinytrain

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
KB = 1024


def _spec(tmp: Path, board: str) -> dict:
    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.model.tflite_writer import write_model
    from tinytrain.stages.quant.dequantize import dequantize_graph

    sys.path.insert(0, str(BENCH))
    try:
        make = __import__("make_mbv2_data").make
    finally:
        sys.path.remove(str(BENCH))
    flt = tmp / "mbv2_float.tflite"
    if not flt.is_file():
        write_model(dequantize_graph(read_model(zoo.resolve("mbv2-w0.35-128"))), flt)
    data = tmp / "mbv2_synth.npz"
    if not data.is_file():
        make(data)
    doc = yaml.safe_load((BENCH / "mbv2_tte.yaml").read_text())
    doc["name"] = f"mbv2-fp16-{board}"
    doc["model"]["path"] = str(flt)
    doc["data"]["path"] = str(data)
    doc["train"]["precision"] = "fp16-mixed"
    doc["train"]["max_train_samples"] = 4
    doc["train"]["epochs"] = 1
    doc["target"]["board"] = board
    doc["build"] = {"out_dir": str(tmp / "build"), "cache_dir": str(tmp / "cache")}
    return doc


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("arm-none-eabi-gcc") is None
                    or shutil.which("qemu-system-arm") is None, reason="no cc / arm-none-eabi-gcc / qemu-system-arm")
def test_mbv2_fp16_mixed_fits_the_m55_and_has_the_host_bits(tmp_path):
    runs = {}
    for board in ("host", "mps3-an547"):
        r = tinytrain.build(_spec(tmp_path, board))
        runs[board] = (r, json.loads(r.artifact("emulate-run", "run.json").read_text()),
                       r.artifact("emulate-run", "weights.bin").read_bytes())
    (_, host, hw), (dev_r, dev, dw) = runs["host"], runs["mps3-an547"]
    assert dev["precision"] == "fp16-mixed" and dev["loss"]["steps"] == 4
    assert dev["loss"]["per_step"] == host["loss"]["per_step"] and dw == hw
    assert dev["loss_scale"]["final"] == host["loss_scale"]["final"]
    assert dev["loss_scale"]["skipped_steps"] == host["loss_scale"]["skipped_steps"]
    size = json.loads(dev_r.artifact("cross-compile", "size.json").read_text())
    assert size["sram"]["used"] <= 512 * KB                       # the DTCM
    cg = json.loads(dev_r.artifact("codegen", "codegen.json").read_text())
    assert cg["sram_outside_arena_bytes"] == 0 and len(cg["split_weights"]) == 2   # the 1/8 and 1/4 layers
    prec = json.loads(dev_r.artifact("autodiff", "precision.json").read_text())
    plan = json.loads(dev_r.artifact("reorder", "memplan.json").read_text())
    assert plan["arena_bytes"] == prec["arena_bytes"] < prec["arena_bytes_fp32"]
    assert dev["arena"]["equal"] and dev["arena"]["planned_bytes"] == plan["arena_bytes"]   # painted high-water
