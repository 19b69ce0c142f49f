"""Checkpoint / resume end to end (issue 12, item 3) through the generated C API and the emulate-run driver.

A run stopped after N steps saves checkpoint.ttck; a second run resumes from it; the losses of both runs
concatenated and the final weights are byte-identical to one uninterrupted run (the example's digits CNN with
SGD, and a residual model with Adam and batch 2, so optimizer moments, Adam's step counter and gradient
accumulation matter). A truncated or byte-flipped checkpoint is refused (results.json checkpoint_status, the
firmware's log) and training starts from the original weights: the run equals a fresh one. The host reads the
checkpoint back (stages/train/checkpoint.py) and its weights equal the stopped run's weights.bin.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.train import checkpoint as ck
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.device.boards import get_board
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.runtime_config import (
    FLAG_EVAL_AFTER,
    FLAG_RESUME,
    FLAG_SAVE_CHECKPOINT,
    RuntimeConfig,
)
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan

FIX = Path(__file__).resolve().parent / "fixtures"
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


def _digits_int8():
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages.quantize import quantize_model

    g = read_model(FIX / "digits_cnn_float.tflite")
    x = np.load(FIX / "digits_cnn.input.npy").astype(np.float32)
    calib = np.concatenate([x, np.random.default_rng(1).uniform(0, 1, (32,) + x.shape[1:]).astype(np.float32)])
    return quantize_model(g, calib, QuantizeSpec())[0]


def _firmware(g, opt: str, batch: int, out: Path):
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.02),
                              batch)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), out / "prog")
    board = get_board("host")
    return tg, build_firmware(board, out / "prog", out / "build").elf


def _streams(tg, out: Path, n: int):
    meta = tg.meta["train"]
    x_t = tg.tensors[[t for t in tg.inputs if t != meta["label_input"]][0]]
    rng = np.random.default_rng(7)
    if x_t.dtype == "int8":
        x = rng.integers(-128, 128, size=[n] + list(x_t.shape[1:])).astype(np.int8)
    else:
        x = rng.standard_normal([n] + list(x_t.shape[1:])).astype(np.float32)
    y = rng.integers(0, tg.tensors[meta["prediction"]].shape[-1], n)
    write_stream(out / "train.ttds", x, y)
    write_stream(out / "test.ttds", x[:4], y[:4])
    return {"train.ttds": out / "train.ttds", "test.ttds": out / "test.ttds"}


def _run(elf, rundir: Path, data, cfg: RuntimeConfig, extra=None):
    run_firmware(get_board("host"), elf, rundir, {"runtime.bin": cfg.to_bytes(), **data, **(extra or {})}, 120)
    out = {n: (rundir / n).read_bytes() for n in ("results.json", "losses.bin", "weights.bin")}
    out["results"] = json.loads(out["results.json"])
    if (rundir / "checkpoint.ttck").exists():
        out["ckpt"] = (rundir / "checkpoint.ttck").read_bytes()
    return out


CASES = [("digits", "sgd", 1), ("residual_float", "adam", 2)]


@pytest.mark.parametrize("model,opt,batch", CASES, ids=[f"{m}-{o}-b{b}" for m, o, b in CASES])
def test_resume_is_bit_identical_and_bad_checkpoints_are_refused(model, opt, batch, tmp_path):
    g = _digits_int8() if model == "digits" else read_model(FIX / f"{model}.tflite")
    tg, elf = _firmware(g, opt, batch, tmp_path)
    data = _streams(tg, tmp_path, 12)
    base = dict(learning_rate=0.02, epochs=2, batch_size=batch, flags=FLAG_EVAL_AFTER)
    whole = _run(elf, tmp_path / "whole", data, RuntimeConfig(**base))
    steps = whole["results"]["steps"]
    assert steps == 2 * (12 // batch)
    stop = steps // 2 + 1   # crosses the epoch boundary on resume
    first = _run(elf, tmp_path / "first", data, RuntimeConfig(**{**base, "flags": FLAG_SAVE_CHECKPOINT},
                                                              stop_after_steps=stop))
    assert first["results"]["steps"] == stop and first["weights.bin"] != whole["weights.bin"]
    second = _run(elf, tmp_path / "second", data, RuntimeConfig(**{**base, "flags": FLAG_EVAL_AFTER | FLAG_RESUME}),
                  {"resume.ttck": first["ckpt"]})
    r2 = second["results"]
    assert r2["checkpoint_status"] == 0 and r2["start_step"] == stop and r2["steps"] == steps - stop
    assert first["losses.bin"] + second["losses.bin"] == whole["losses.bin"]
    assert second["weights.bin"] == whole["weights.bin"]
    assert r2["acc_after"] == whole["results"]["acc_after"]

    # The host reads it back: step, and weights equal to what the stopped run wrote.
    layout = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    c = ck.read_checkpoint(first["ckpt"], layout)
    assert c.steps == stop
    wb = np.frombuffer(first["weights.bin"], np.uint8)
    for t in layout["trained_tensors"]:
        assert c.tensors[t["name"]].tobytes() == wb[t["offset"]:t["offset"] + t["nbytes"]].tobytes()
    if opt == "adam":
        assert any(r == "optimizer" and np.any(c.tensors[n]) for n, r in c.roles.items())
    assert "step " + str(stop) in ck.describe(tmp_path / "first" / "checkpoint.ttck", layout)

    # Refused: truncated, one byte flipped (in the state and in the header), another model's: original weights.
    fresh = _run(elf, tmp_path / "fresh", data, RuntimeConfig(**base))
    flipped = bytearray(first["ckpt"])
    flipped[len(flipped) // 2] ^= 0x10
    head_flip = bytearray(first["ckpt"])
    head_flip[16] ^= 0x01      # the step counter: only the CRC can tell
    bad = {"truncated": (first["ckpt"][:-7], -1), "flipped": (bytes(flipped), -5), "step": (bytes(head_flip), -5),
           "magic": (b"XXXX" + first["ckpt"][4:], -2)}
    for name, (blob, code) in bad.items():
        r = _run(elf, tmp_path / f"bad_{name}", data, RuntimeConfig(**{**base, "flags": FLAG_EVAL_AFTER | FLAG_RESUME}),
                 {"resume.ttck": blob})
        assert r["results"]["checkpoint_status"] == code, name
        assert r["results"]["start_step"] == 0
        assert r["losses.bin"] == fresh["losses.bin"] and r["weights.bin"] == fresh["weights.bin"], name
        with pytest.raises(ck.CheckpointError):
            ck.read_checkpoint(blob, layout)


def test_inspect_reads_a_checkpoint_artifact_and_refuses_a_bad_one(tmp_path):
    """The generic `tinytrain inspect` view of a .ttck (pipeline/inspect_artifacts.py): header only without the
    codegen layout beside it; a truncated one is described as refused, not a traceback."""
    from tinytrain.pipeline.inspect_artifacts import describe
    from tinytrain.stages.c_emit.api import CKPT_HEADER

    state = b"\x01\x00\x00\x00" * 3
    head = bytearray(ck._HEAD.pack(b"TTCK", ck.CKPT_VERSION, 0x1234, CKPT_HEADER + len(state) + 4, 7, 0,
                                   len(state), 0))
    body = bytes(head) + state
    raw = body + (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "little")
    (tmp_path / "ok.ttck").write_bytes(raw)
    (tmp_path / "bad.ttck").write_bytes(raw[:-3])
    assert "step 7" in describe(tmp_path / "ok.ttck") and "CRC ok" in describe(tmp_path / "ok.ttck")
    assert "refused" in describe(tmp_path / "bad.ttck")
