"""The fp16-mixed example end to end on the host (issue 13): run.json and `inspect` report the loss scale and the
skipped steps, the checkpoint carries them, and a resumed run ends exactly as an uninterrupted one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tinytrain
from tinytrain.stages.device.boards import BOARDS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler"), pytest.mark.slow]


def _spec(tmp: Path, name: str, **train) -> dict:
    return {"name": name, "model": {"path": str(ROOT / "tests/fixtures/digits_cnn_float.tflite")},
            "data": {"source": "digits"},
            "train": {"precision": "fp16-mixed", "epochs": 1, "max_train_samples": 400,
                      "update": {"scheme": "last_k", "k": 1}, **train},
            "target": {"board": "host"}, "build": {"out_dir": str(tmp / "build")}}


def test_fp16_example_reports_and_resumes_the_loss_scale(tmp_path):
    full = tinytrain.build(_spec(tmp_path, "full"))
    run = json.loads(full.artifact("emulate-run", "run.json").read_text())
    ls = run["loss_scale"]
    assert run["precision"] == "fp16-mixed" and ls["policy"]["kind"] == "dynamic"
    assert ls["skipped_steps"] >= 1 and ls["final"] < 65536        # the default 2^16 overflows at first
    assert run["accuracy"]["after_pct"] > run["accuracy"]["before_pct"]

    first = tinytrain.build(_spec(tmp_path, "part", checkpoint={"stop_after_steps": 150}))
    ck = tmp_path / "part.ttck"
    shutil.copy(first.artifact("emulate-run", "trained.ttck"), ck)
    from tinytrain.stages.train.checkpoint import describe_artifact   # what `tinytrain inspect` prints for it
    desc = describe_artifact(first.artifact("emulate-run", "trained.ttck"))
    assert "fp16-mixed loss scale" in desc and "steps skipped" in desc
    rest = tinytrain.build(_spec(tmp_path, "part", resume_from=str(ck)))
    resumed = json.loads(rest.artifact("emulate-run", "run.json").read_text())
    assert resumed["loss_scale"]["final"] == ls["final"]
    assert resumed["loss_scale"]["skipped_steps"] == ls["skipped_steps"]
    assert resumed["loss"]["per_step"] == run["loss"]["per_step"][150:]


_EMULATED = [b.name for b in BOARDS.values() if b.half_precision and not b.host]


@pytest.mark.parametrize("board", _EMULATED or [pytest.param(None, marks=pytest.mark.skip(
    reason="no emulated board with half precision here (the Cortex-M55 board, mps3-an547, comes with its branch)"))])
def test_fp16_example_on_an_emulated_board_has_the_host_bits(board, tmp_path):
    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None:
        pytest.skip("no arm-none-eabi-gcc / qemu-system-arm")
    runs = {}
    for b in ("host", board):
        spec = _spec(tmp_path, f"fp16-{b}", max_train_samples=200)
        spec["target"] = {"board": b}
        r = tinytrain.build(spec)
        runs[b] = (json.loads(r.artifact("emulate-run", "run.json").read_text()),
                   r.artifact("emulate-run", "weights.bin").read_bytes())
    (host, hw), (dev, dw) = runs["host"], runs[board]
    assert dev["loss"]["per_step"] == host["loss"]["per_step"]
    assert dev["loss_scale"]["final"] == host["loss_scale"]["final"]
    assert dev["loss_scale"]["skipped_steps"] == host["loss_scale"]["skipped_steps"]
    assert dw == hw
