"""The Cortex-M55 board (mps3-an547, issue 13 item 4): the example trains on it in QEMU with the same bits as on
the host, and `target.kernels: mve` (Helium int8 dot products, kernels_c/tt_dot_mve.h) gives the same bits as
the portable kernels.

Board-level checks (self-test, calibration, MPU faults) are in tests/test_boards.py, parametrized over every board.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOARD = "mps3-an547"

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")


def _spec(tmp: Path, name: str, board: str, kernels: str = "portable") -> Path:
    import yaml

    doc = yaml.safe_load((REPO / "tinytrain.yaml.example").read_text())
    doc["model"]["path"] = str(REPO / doc["model"]["path"])
    doc["target"].update(board=board, kernels=kernels)
    # One budget for both boards, so that sparse-plan picks the same update plan (host has no SRAM limit).
    doc["train"]["update"]["budget_kb"] = 200
    doc["train"].update(epochs=1, max_train_samples=60)
    doc["build"] = {"out_dir": str(tmp / "build")}
    doc["name"] = name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _build(spec: Path, name: str) -> dict:
    from tinytrain.pipeline.cli import main

    assert main(["build", str(spec)]) == 0
    b = spec.parent / "build" / name
    return {"run": json.loads((b / "emulate-run" / "run.json").read_text()),
            "weights": (b / "emulate-run" / "weights.bin").read_bytes(),
            "cflags": json.loads((b / "cross-compile" / "build.json").read_text())["cflags"],
            "elf": (b / "cross-compile" / "firmware.elf").read_bytes()}


@needs_arm
@pytest.mark.slow
def test_example_trains_on_the_m55_bit_identical_to_host(tmp_path, capsys):
    host = _build(_spec(tmp_path, "host", "host"), "host")
    m55 = _build(_spec(tmp_path, "m55", BOARD), "m55")
    capsys.readouterr()
    assert "-mcpu=cortex-m55" in m55["cflags"]
    assert m55["weights"] == host["weights"]
    assert m55["run"]["loss"]["per_step"] == host["run"]["loss"]["per_step"]
    assert m55["run"]["accuracy"] == host["run"]["accuracy"]
    assert m55["run"]["loss"]["steps"] == 60
    assert m55["run"]["instructions"]["counted"] and m55["run"]["instructions"]["per_step_mean"] > 0
