"""Checkpoint / resume through the spec and the emulate-run stage (issue 12, item 3).

`train.checkpoint: {stop_after_steps: N}` stops after N steps and leaves trained.ttck; `train.resume_from` continues
from it. Both are runtime values: only emulate-run's key reads them (fast test), and a build that resumes reruns
emulate-run alone. The two runs' losses together and the final weights equal one uninterrupted run's, bit for bit
(the example's digits CNN, int8 QAS; on host and -- slow -- in QEMU on the example's board). A truncated or
byte-flipped checkpoint is one line and exit 2 from the CLI, before anything trains.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tinytrain
from tinytrain.pipeline.preimage import config_slice, slice_preimage
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.stage_graph import STAGES
from tinytrain.stages.emulate_run import runtime_config
from tinytrain.stages.train.runtime_config import FLAG_RESUME, FLAG_SAVE_CHECKPOINT, RuntimeConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "tinytrain.yaml.example"


def _spec(tmp_path: Path, board: str = "host", **train) -> dict:
    return {"name": "ck", "model": {"path": str(REPO / "tests/fixtures/digits_cnn_float.tflite")},
            "data": {"source": "digits", "classes": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]},
            "quantize": {"num_samples": 32},
            "train": {"epochs": 2, "max_train_samples": 10, "learning_rate": 0.02, "gate": {"enabled": False},
                      **train},
            "target": {"board": board},
            "build": {"out_dir": str(tmp_path / "build"), "cache_dir": str(tmp_path / "cache")}}


def test_checkpoint_options_are_runtime_values_of_emulate_run_only(tmp_path):
    (tmp_path / "x.ttck").write_bytes(b"TTCK")
    plain = load_spec(EXAMPLE)
    data = json.loads(plain.model_dump_json())
    data["train"].update(checkpoint={"stop_after_steps": 3}, resume_from=str(tmp_path / "x.ttck"))
    data["build"].pop("cache_dir", None)
    ck = tinytrain.load_spec(data)
    changed = [st.name for st in STAGES
               if slice_preimage(config_slice(plain, st.config)) != slice_preimage(config_slice(ck, st.config))]
    assert changed == ["emulate-run"]
    cfg = {k: v for k, v in config_slice(ck, next(s for s in STAGES if s.name == "emulate-run").config).items()}
    rc = runtime_config(cfg)
    assert rc.stop_after_steps == 3 and rc.flags & FLAG_SAVE_CHECKPOINT and rc.flags & FLAG_RESUME
    back = RuntimeConfig.from_bytes(rc.to_bytes())
    assert (back.flags, back.stop_after_steps) == (rc.flags, 3)
    rc0 = runtime_config(config_slice(plain, next(s for s in STAGES if s.name == "emulate-run").config))
    assert rc0.stop_after_steps == 0 and not rc0.flags & (FLAG_SAVE_CHECKPOINT | FLAG_RESUME)
    assert len(rc0.to_bytes()) == 56        # no checkpoint: the version-1 record, as before


def _weights(res) -> bytes:
    return res.artifact("emulate-run", "weights.bin").read_bytes()


def _losses(res) -> list[float]:
    return json.loads(res.artifact("emulate-run", "run.json").read_text())["loss"]["per_step"]


@pytest.mark.slow
@pytest.mark.parametrize("board", ["host", "stm32f746-disco"])
def test_stop_and_resume_through_the_spec_is_bit_identical(board, tmp_path):
    if board != "host" and shutil.which("qemu-system-arm") is None:
        pytest.skip("no qemu-system-arm")
    # Each build overwrites build/ck/emulate-run: read what each left before the next one runs.
    whole = tinytrain.build(_spec(tmp_path, board))
    whole_losses, whole_w = _losses(whole), _weights(whole)
    assert len(whole_losses) == 20
    first = tinytrain.build(_spec(tmp_path, board, checkpoint={"stop_after_steps": 13}))
    assert first.ran == ["emulate-run"]            # a runtime value: nothing upstream rebuilt
    first_losses, first_w = _losses(first), _weights(first)
    saved = tmp_path / "saved.ttck"
    shutil.copyfile(first.artifact("emulate-run", "trained.ttck"), saved)
    doc = json.loads(first.artifact("emulate-run", "run.json").read_text())
    assert doc["checkpoint"]["saved_step"] == 13 and len(first_losses) == 13
    second = tinytrain.build(_spec(tmp_path, board, resume_from=str(saved)))
    assert second.ran == ["emulate-run"]
    assert json.loads(second.artifact("emulate-run", "run.json").read_text())["checkpoint"]["resumed_from_step"] == 13
    assert first_losses + _losses(second) == whole_losses
    assert _weights(second) == whole_w and first_w != whole_w

    # `tinytrain inspect SPEC emulate-run` on the stopped build shows the checkpoint: step and state norms.
    view = tinytrain.inspect(_spec(tmp_path, board, checkpoint={"stop_after_steps": 13}), "emulate-run")
    assert "step 13" in view.text and "|x|_2 =" in view.text

    # Corrupt checkpoints: one line, exit 2, nothing trained.
    spec_file = tmp_path / "bad.yaml"
    for what, blob in (("truncated", saved.read_bytes()[:-9]), ("flipped", _flip(saved.read_bytes()))):
        bad = tmp_path / f"{what}.ttck"
        bad.write_bytes(blob)
        spec_file.write_text(json.dumps(_spec(tmp_path, board, resume_from=str(bad))))
        r = subprocess.run([sys.executable, "-m", "tinytrain", "build", str(spec_file)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        # One error line (the build then names its partial report, as for every failed build); no traceback.
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
        assert "Traceback" not in r.stderr and len(err) == 1, r.stderr
        assert "train.resume_from" in err[0] and ("truncated" in err[0] or "CRC" in err[0]), err


def _flip(raw: bytes) -> bytes:
    b = bytearray(raw)
    b[len(b) // 2] ^= 0x04
    return bytes(b)
