"""MobileNetV2-w0.35 @128 with the TTE-like sparse scheme on the STM32F746 (issue 5's device benchmark).

bench/mbv2_tte.yaml builds the zoo model for stm32f746-disco and trains a few steps in QEMU; bench/instructions_mbv2.py
prints the instructions per step next to TTE's 373 ms. The fast tests check the spec names the same layers as
bench/memory_mbv2.py's scheme and that the data script is deterministic and small; the slow one builds and runs it
twice (fit, arena high-water == plan, deterministic instruction counts).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SPEC = BENCH / "mbv2_tte.yaml"
KB = 1024


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_spec_trains_the_layers_of_the_memory_benchmark():
    """The device spec's manual plan is bench/memory_mbv2.py's TTE-like scheme, layer for layer."""
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.stages import zoo
    from tinytrain.stages.tflite_reader import read_model

    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    plan, _ = _bench("memory_mbv2").tte_like_plan(g)
    want = {lp.layer: (lp.bias, lp.weight_ratio) for lp in plan.layers}
    spec = load_spec(SPEC)  # validated: "1/8" is 0.125
    assert spec.train.update.scheme == "manual"
    got = {int(k.lstrip("#")): (v.bias, float(v.weight_ratio)) for k, v in spec.train.update.layers.items()}
    assert got == want
    assert spec.target.board == "stm32f746-disco" and spec.train.batch_size == 1


def test_synthetic_data_is_deterministic_and_small(tmp_path):
    make = _bench("make_mbv2_data").make
    a, b = make(tmp_path / "a.npz"), make(tmp_path / "b.npz")
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size < 4 * KB * KB
    import numpy as np

    with np.load(a) as z:
        assert z["x_train"].shape[1:] == (128, 128, 3) and z["x_train"].dtype == np.uint8
        assert sorted(set(z["y_train"].tolist())) == list(range(10)) and len(z["y_test"]) >= 10


def _spec_in(tmp: Path) -> Path:
    """bench/mbv2_tte.yaml with its data, build folder and cache in `tmp` (no side effects on the repository)."""
    doc = yaml.safe_load(SPEC.read_text())
    data = _bench("make_mbv2_data").make(tmp / "mbv2_synth.npz")
    doc["data"]["path"] = str(data)
    doc["build"] = {"out_dir": str(tmp / "build"), "cache_dir": str(tmp / "cache")}
    path = tmp / "mbv2_tte.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_mbv2_builds_fits_trains_in_qemu_and_counts_deterministically(tmp_path, capsys):
    from tinytrain.pipeline.cli import main

    spec = _spec_in(tmp_path)
    assert main(["build", str(spec), "--json"]) == 0, capsys.readouterr().out[-3000:]
    capsys.readouterr()
    build = tmp_path / "build" / "mbv2_tte"
    r = _bench("instructions_mbv2").measure(build)
    # Fits the board: static SRAM + the stack (whose measured high-water is well inside it) <= 320 KB, flash <= 1 MB.
    assert r["fits"] and r["sram"]["used_bytes"] <= 320 * KB and r["flash"]["used_bytes"] <= 1024 * KB
    assert r["sram"]["static_bytes"] + r["sram"]["stack_bytes"] <= 320 * KB
    assert 0 < r["sram"]["stack_high_water_bytes"] < r["sram"]["stack_bytes"]
    # The painted arena's high-water is the plan's, exactly; codegen keeps nothing trained outside the arena.
    assert r["arena"]["equal"] and r["arena"]["used_bytes"] == r["arena"]["planned_end_bytes"]
    cg = json.loads((build / "codegen" / "codegen.json").read_text())
    assert cg["sram_outside_arena_bytes"] == 0 and len(cg["split_weights"]) == 2  # the 1/8 and 1/4 layers
    assert r["steps"] == 4 and r["instructions_per_step"]["min"] > 0
    text = _bench("instructions_mbv2").report(r)
    assert "373 ms" in text and "216 MHz" in text and "1 instruction ≈ 1 cycle" in text

    # The same firmware and input give the same counts: run the emulator again.
    first = json.loads((build / "emulate-run" / "run.json").read_text())
    assert main(["build", str(spec), "--json", "--force", "emulate-run"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ran"] == ["emulate-run"]
    second = json.loads((build / "emulate-run" / "run.json").read_text())
    assert second["instructions"] == first["instructions"]
    assert second["loss"] == first["loss"] and second["arena"] == first["arena"]
