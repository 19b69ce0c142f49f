"""Training in QEMU, evaluation on the host build (stages/device/eval_split.py): the agreement check, the data it
gives each side, and (with the ARM toolchain) that a build's results are those of evaluating in QEMU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.errors import StageFailed
from tinytrain.stages.device import eval_split
from tinytrain.stages.device.boards import get_board
from tinytrain.stages.device.launch import RunResult
from tinytrain.stages.train.data import read_stream, write_stream
from tinytrain.stages.train.runtime_config import (
    FLAG_EVAL_AFTER,
    FLAG_EVAL_BEFORE,
    FLAG_EVAL_DUMP,
    FLAG_RESUME,
    FLAG_SAVE_CHECKPOINT,
    RuntimeConfig,
)

REPO = Path(__file__).resolve().parents[1]


def _stream(tmp: Path, n: int, targets: bool = False) -> bytes:
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, size=(n, 4, 4, 1), dtype=np.int8)
    y = rng.integers(0, 3, size=n)
    t = rng.standard_normal((n, 2)).astype(np.float32) if targets else None
    write_stream(tmp / "s.ttds", x, None if targets else y, targets=t)
    return (tmp / "s.ttds").read_bytes()


@pytest.mark.parametrize("targets", [False, True])
def test_stream_head_keeps_the_first_records(tmp_path, targets):
    raw = _stream(tmp_path, 7, targets)
    head = eval_split.stream_head(raw, 3)
    assert eval_split.stream_count(raw) == 7 and eval_split.stream_count(head) == 3
    (tmp_path / "h.ttds").write_bytes(head)
    x, y, t = read_stream(tmp_path / "s.ttds", targets=True)
    hx, hy, ht = read_stream(tmp_path / "h.ttds", targets=True)
    assert np.array_equal(hx, x[:3]) and np.array_equal(hy, y[:3])
    assert (ht is None) == (not targets) and (ht is None or np.array_equal(ht, t[:3]))


def test_check_outputs_accepts_equal_bits_and_names_the_first_difference():
    host = bytes(range(40))                       # 10 samples of 4 output bytes
    eval_split.check_outputs("before", host[:8], host, 2, 10)
    bad = bytearray(host[:8])
    bad[5] ^= 0x01                                # sample 1, byte 1: one bit flipped
    with pytest.raises(eval_split.EvalMismatch) as e:
        eval_split.check_outputs("after", bytes(bad), host, 2, 10)
    msg = str(e.value)
    assert "\n" not in msg and "after training" in msg and "test sample 1" in msg and "output byte 1" in msg
    with pytest.raises(eval_split.EvalMismatch, match="bytes of outputs"):
        eval_split.check_outputs("before", host[:8], host[:36], 2, 10)   # the host evaluated fewer samples
    with pytest.raises(eval_split.EvalMismatch, match="bytes of outputs"):
        eval_split.check_outputs("before", b"", host, 2, 10)              # QEMU dumped nothing
    assert issubclass(eval_split.EvalMismatch, StageFailed)


class _FakeRuns:
    """Stands in for run_firmware: records what each run was given and answers like the firmware would, with
    `outputs(board, phase, n)` deciding the output bytes it dumps."""

    def __init__(self, outputs):
        self.outputs, self.calls = outputs, []

    def __call__(self, board, exe, workdir, files, report):
        rc = RuntimeConfig.from_bytes(files["runtime.bin"])
        n = eval_split.stream_count(files["test.ttds"])
        self.calls.append((board.name, rc, n, dict(files)))
        out, res = {}, {"protocol": 1, "steps": 3, "checkpoint_status": 0}
        for phase, flag in (("before", FLAG_EVAL_BEFORE), ("after", FLAG_EVAL_AFTER)):
            if rc.flags & flag:
                res[f"acc_{phase}"] = {"correct": n // 2 + (phase == "after"), "total": n}
                if rc.flags & FLAG_EVAL_DUMP:
                    out[f"eval_{phase}.bin"] = self.outputs(board.name, phase, n)
        if rc.flags & FLAG_SAVE_CHECKPOINT:
            out["checkpoint.ttck"] = b"TTCK-trained"
        out["weights.bin"] = b"w"
        return RunResult(board.name, ["fake"], 0, "", "", 0.0, out, results=res)


def _same(board, phase, n):
    return b"".join(bytes([k, 1 if phase == "after" else 0]) for k in range(n))


def test_split_gives_qemu_the_training_and_the_host_the_whole_test_split(tmp_path):
    files = {"runtime.bin": RuntimeConfig().to_bytes(), "train.ttds": b"train", "test.ttds": _stream(tmp_path, 9)}
    runs = _FakeRuns(_same)
    split = eval_split.run_split(get_board("stm32f746-disco"), Path("fw"), Path("host"), tmp_path, files,
                                 RuntimeConfig(epochs=2), runs)
    by = {(name, rc.flags & (FLAG_EVAL_BEFORE | FLAG_EVAL_AFTER)): (rc, n, f) for name, rc, n, f in runs.calls}
    qrc, qn, _ = by[("stm32f746-disco", FLAG_EVAL_BEFORE | FLAG_EVAL_AFTER)]
    assert qn == eval_split.CHECK_SAMPLES and qrc.epochs == 2 and qrc.flags & FLAG_SAVE_CHECKPOINT
    brc, bn, _ = by[("host", FLAG_EVAL_BEFORE)]
    arc, an, af = by[("host", FLAG_EVAL_AFTER)]
    assert bn == an == 9 and brc.epochs == arc.epochs == 0 and not brc.flags & FLAG_RESUME
    assert arc.flags & FLAG_RESUME and af["resume.ttck"] == b"TTCK-trained"   # QEMU's trained state
    res = split.result.results
    assert res["acc_before"] == {"correct": 4, "total": 9} and res["acc_after"] == {"correct": 5, "total": 9}
    assert split.result.files["weights.bin"] == b"w" and split.error is None
    assert split.phases["train"]["where"] == "QEMU mps2-an500"
    assert split.phases["evaluate_before"]["where"] == split.phases["evaluate_after"]["where"] == "host"
    assert split.phases["agreement"]["equal"] and split.phases["agreement"]["phases"] == ["before", "after"]


def test_split_fails_when_the_host_bits_differ(tmp_path):
    files = {"runtime.bin": RuntimeConfig().to_bytes(), "train.ttds": b"train", "test.ttds": _stream(tmp_path, 5)}

    def drift(board, phase, n):   # the host's trained model is off by one in sample 1's second byte
        out = bytearray(_same(board, phase, n))
        if board == "host" and phase == "after":
            out[3] ^= 0x80
        return bytes(out)

    with pytest.raises(eval_split.EvalMismatch, match="after training: test sample 1, output byte 1"):
        eval_split.run_split(get_board("stm32f746-disco"), Path("fw"), Path("host"), tmp_path, files,
                             RuntimeConfig(), _FakeRuns(drift))


# ---- the real thing: the example's program, evaluated in QEMU and on the host ----------------------------------

def _arm_missing() -> str | None:
    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None or not shutil.which("cc"):
        return "needs arm-none-eabi-gcc, qemu-system-arm and cc"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_arm_missing() is not None, reason=_arm_missing() or "")
def test_a_build_evaluated_on_the_host_equals_one_evaluated_in_qemu(tmp_path):
    """The digits example (small: a few seconds of QEMU) built once; emulate-run with and without host_eval.elf
    among its inputs gives the same run.json figures and the same trained bytes."""
    import yaml

    import tinytrain
    from tinytrain.pipeline.contract import StageContext
    from tinytrain.pipeline.preimage import config_slice
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.stages import emulate_run

    doc = yaml.safe_load((REPO / "tinytrain.yaml.example").read_text())
    doc["model"]["path"] = str(REPO / doc["model"]["path"])
    doc["train"].update(epochs=1, max_train_samples=30)
    doc["build"] = {"out_dir": str(tmp_path / "build")}
    spec = tmp_path / "digits.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = tinytrain.build(str(spec), cache_dir=tmp_path / "cache")
    build = r.out_dir
    split_doc = json.loads((build / "emulate-run" / "run.json").read_text())
    assert split_doc["phases"]["evaluate_after"]["where"] == "host" and split_doc["phases"]["agreement"]["equal"]
    assert split_doc["accuracy"]["after"]["total"] > eval_split.CHECK_SAMPLES

    # The same stage again without the host build: everything in QEMU, as before the split.
    from tinytrain.pipeline.stage_graph import stage

    inputs = {}
    for dep in stage("emulate-run").deps:
        for p in (build / dep).iterdir():
            if p.name != "host_eval.elf":
                inputs[f"{dep}/{p.name}"] = p
    cfg = config_slice(load_spec(spec), stage("emulate-run").config)
    out = tmp_path / "qemu-only"
    out.mkdir()
    emulate_run.run(StageContext(config=cfg, inputs=inputs, out_dir=out))
    qemu_doc = json.loads((out / "run.json").read_text())
    assert qemu_doc["phases"]["evaluate_after"]["where"] == "QEMU mps2-an500"
    for key in ("accuracy", "loss", "gate", "export", "saturation"):
        assert qemu_doc[key] == split_doc[key], key
    assert (out / "weights.bin").read_bytes() == (build / "emulate-run" / "weights.bin").read_bytes()
    # QEMU evaluated the whole test split twice there, CHECK_SAMPLES samples twice here.
    assert qemu_doc["instructions"]["total_run"] > split_doc["instructions"]["total_run"]
