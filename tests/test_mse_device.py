"""MSE (regression) training on the device: TTDS version 2 (float32 targets per record), codegen's mse_loss and
test-split MSE, emulate-run's regression data path, run.json's `mse` and the MSE gate.

Models: the mlp fixtures (float and int8) with their softmax removed by hand in the IR, so the prediction is the
FC output; targets are a fixed linear function of the input. Host runs use ASan/UBSan and TT_DUMP_TENSORS.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from feature_models import without_softmax
from test_codegen import (_check_first_evaluation, _check_trained, _golden,  # the same firmware/golden-model harness
                          _host_and_qemu, _host_run_dumped)
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.stages import codegen, emulate_run
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.device.boards import get_board
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.train.data import DataError, load_dataset, read_stream, write_stream
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.runtime_config import RuntimeConfig
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan

FIX = Path(__file__).resolve().parent / "fixtures"
STEPS = 20
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


# ---- TTDS version 2 ---------------------------------------------------------------------------------------------

def test_ttds_round_trip_with_targets(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (5, 3, 2)).astype(np.int8)
    t = rng.standard_normal((5, 4)).astype(np.float32)
    write_stream(tmp_path / "r.ttds", x, None, targets=t)
    data = (tmp_path / "r.ttds").read_bytes()
    assert struct.unpack_from("<H", data, 4)[0] == 2 and struct.unpack_from("<I", data, 28)[0] == 4
    assert len(data) == 32 + 5 * (4 + 16 + 6)
    x2, y2, t2 = read_stream(tmp_path / "r.ttds", targets=True)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, np.zeros(5))
    assert t2.tobytes() == t.tobytes()  # bit-exact
    assert len(read_stream(tmp_path / "r.ttds")) == 2
    # Without targets: version 1, exactly the old bytes (label, sample), reserved 0; targets=True gives None.
    write_stream(tmp_path / "c.ttds", x, np.arange(5))
    old = (tmp_path / "c.ttds").read_bytes()
    assert struct.unpack_from("<HI", old, 4)[0] == 1 and old[28:32] == b"\0\0\0\0" and len(old) == 32 + 5 * 10
    assert read_stream(tmp_path / "c.ttds", targets=True)[2] is None
    with pytest.raises(DataError, match=r"\[N, K\]"):
        write_stream(tmp_path / "bad.ttds", x, None, targets=t[:3])
    # A version-2 header without targets is malformed.
    bad = bytearray(data)
    bad[28:32] = b"\0\0\0\0"
    (tmp_path / "bad2.ttds").write_bytes(bytes(bad))
    with pytest.raises(DataError, match="unsupported TTDS"):
        read_stream(tmp_path / "bad2.ttds")


# ---- data: task regression --------------------------------------------------------------------------------------

def test_regression_dataset_from_npz(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (30, 4, 4, 1)).astype(np.float32)
    y = (x.reshape(30, -1) @ rng.standard_normal((16, 3))).astype(np.float64)
    np.savez(tmp_path / "r.npz", x=x, y=y)
    ds = load_dataset(DataSpec(source="npz", path=tmp_path / "r.npz", task="regression", test_fraction=0.2))
    assert ds.regression and ds.num_targets == 3 and ds.class_names == []
    assert ds.y_train.dtype == np.float32 and ds.y_train.shape == (24, 3) and ds.y_test.shape == (6, 3)
    np.savez(tmp_path / "one.npz", x_train=x[:20], y_train=y[:20, 0], x_test=x[20:], y_test=y[20:, 0])
    ds1 = load_dataset(DataSpec(source="npz", path=tmp_path / "one.npz", task="regression"))
    assert ds1.y_test.shape == (10, 1)
    np.savez(tmp_path / "nan.npz", x=x, y=np.where(np.arange(30)[:, None] == 3, np.nan, y))
    with pytest.raises(DataError, match="NaN"):
        load_dataset(DataSpec(source="npz", path=tmp_path / "nan.npz", task="regression"))
    with pytest.raises(ValueError, match="needs source 'npz'"):
        DataSpec(source="digits", task="regression")
    with pytest.raises(ValueError, match="do not apply"):
        DataSpec(source="npz", path=tmp_path / "r.npz", task="regression", classes=[0])
    # Classification stays the default, with its digest unchanged by the new field.
    assert DataSpec(source="digits").task == "classification"


# ---- codegen: MSE training on the host vs the golden model -------------------------------------------------------

def _regression_model(name: str) -> Graph:
    """The fixture with its final softmax removed in the IR: the FC output is the prediction."""
    return without_softmax(read_model(FIX / f"{name}.tflite"))


def _build(g: Graph, out: Path, opt: str = "sgd", lr: float = 0.01):
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec(kind=opt, learning_rate=lr), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), out / "prog")
    return tg, mp


def _data(tg: Graph, n: int, seed: int = 0):
    meta = tg.meta["train"]
    x_t = tg.tensors[[t for t in tg.inputs if t != meta["label_input"]][0]]
    k = int(np.prod(tg.tensors[meta["prediction"]].shape[1:]))
    rng = np.random.default_rng(seed)
    if x_t.dtype == "int8":
        x = rng.integers(-128, 128, size=[n] + list(x_t.shape[1:])).astype(np.int8)
        xf = x.astype(np.float32) / np.float32(64)
    else:
        x = rng.standard_normal([n] + list(x_t.shape[1:])).astype(np.float32)
        xf = x
    a = np.random.default_rng(99).standard_normal((xf[0].size, k)).astype(np.float32) * np.float32(0.25)
    return x, (xf.reshape(n, -1) @ a).astype(np.float32)


def _device_mse(ev: np.ndarray, head, targets: np.ndarray) -> np.float32:
    """The firmware's evaluation in float32 and its order: per-sample mean, summed in order, / count."""
    y = ev.astype(np.float32)
    if head.dtype == "int8":
        s, z = float(head.quant.scale[0]), int(head.quant.zero_point[0])
        y = (np.float64(s) * (ev.astype(np.int64) - z)).astype(np.float32)
    total = np.float32(0)
    for r in range(len(y)):
        acc = np.float32(0)
        for d in (y[r] - targets[r]).astype(np.float32):
            acc = np.float32(acc + np.float32(d * d))
        total = np.float32(total + np.float32(acc / np.float32(y.shape[1])))
    return np.float32(total / np.float32(len(y)))


@needs_cc
@pytest.mark.parametrize("fixture,opt", [("mlp_float", "adam"), ("mlp_int8", "sgd")])
def test_mse_host_matches_golden_model(fixture, opt, tmp_path):
    tg, mp = _build(_regression_model(fixture), tmp_path, opt)
    # the program's sources: the model library (tt_model.c) and its emulate-run driver (tt_driver.c, the TTDS reader)
    src = "".join((tmp_path / "prog" / f).read_text() for f in ("tt_model.c", "tt_driver.c"))
    assert "tt_mse_f32(" in src and "tt_ttds_next_target(" in src
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    assert io["loss"] == "mse" and io["num_targets"] == 10
    x, t = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, None, targets=t)
    write_stream(tmp_path / "test.ttds", x[:8], None, targets=t[:8])
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9, alpha=0.99, eps=1e-7)
    out = _host_run_dumped(tmp_path, cfg)
    res = json.loads(out["results.json"])
    meta = tg.meta["train"]
    head = tg.tensors[meta["prediction"]]

    losses = np.frombuffer(out["losses.bin"], "<f4")
    want, state = _golden(tg, x, t, cfg)
    assert losses.shape == (STEPS,)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)
    _check_trained(out, io, state)   # int8 weights identical after 20 steps

    # Evaluation: forward before training vs the executor, the reported MSE vs the same float32 computation.
    ev, _ = _check_first_evaluation(tg, x, tmp_path)
    assert res["task"] == "regression" and "acc_before" not in res
    assert res["mse_before_total"] == res["mse_after_total"] == 8
    before = emulate_run.mse_of(res, "before")
    after = emulate_run.mse_of(res, "after")
    assert before == pytest.approx(float(_device_mse(ev[:8], head, t[:8])), rel=1e-6)
    assert after == pytest.approx(float(_device_mse(ev[8:], head, t[:8])), rel=1e-6)
    assert after < before  # 20 steps on a linear target lower the error
    assert res["steps"] == STEPS and res["loss_nan"] is False


@needs_cc
def test_mse_program_rejects_streams_without_targets(tmp_path):
    tg, _ = _build(_regression_model("mlp_float"), tmp_path)
    x, _ = _data(tg, 4)
    write_stream(tmp_path / "train.ttds", x, np.zeros(4, np.int64))  # version 1: labels only
    write_stream(tmp_path / "test.ttds", x, np.zeros(4, np.int64))
    board = get_board("host")
    b = build_firmware(board, tmp_path / "prog", tmp_path / "build")
    r = run_firmware(board, b.elf, tmp_path / "run", {"runtime.bin": RuntimeConfig(learning_rate=0.01).to_bytes(),
                                                      "train.ttds": tmp_path / "train.ttds",
                                                      "test.ttds": tmp_path / "test.ttds"}, 60, check=False)
    assert r.exit_code != 0 and "float targets do not match" in r.console


@needs_cc
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_mse_qemu_matches_host_bit_for_bit(tmp_path):
    tg, mp = _build(_regression_model("mlp_int8"), tmp_path)
    x, t = _data(tg, 12, seed=3)
    write_stream(tmp_path / "train.ttds", x, None, targets=t)
    write_stream(tmp_path / "test.ttds", x[:6], None, targets=t[:6])
    rh, rq = _host_and_qemu(tmp_path, RuntimeConfig(learning_rate=0.01, epochs=1))
    assert rq == rh and rq["mse_before_bits"] != 0


# ---- emulate-run: regression data, run.json, gate -----------------------------------------------------------------

def test_run_files_stream_regression_targets(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (20, 4, 4, 1)).astype(np.float32)
    y = rng.standard_normal((20, 2)).astype(np.float32)
    np.savez(tmp_path / "r.npz", x_train=x[:15], y_train=y[:15], x_test=x[15:], y_test=y[15:])
    spec = DataSpec(source="npz", path=tmp_path / "r.npz", task="regression")
    layout = {"input": {"shape": [1, 4, 4, 1], "dtype": "float32"}, "loss": "mse", "num_targets": 2}
    files, info = emulate_run.run_files(spec, layout, RuntimeConfig(learning_rate=0.1))
    assert info["task"] == "regression" and info["targets"] == 2
    (tmp_path / "test.ttds").write_bytes(files["test.ttds"])
    x2, _, t2 = read_stream(tmp_path / "test.ttds", targets=True)
    np.testing.assert_array_equal(x2, x[15:])
    np.testing.assert_array_equal(t2, y[15:])
    with pytest.raises(DataError, match="2 value"):
        emulate_run.run_files(spec, {**layout, "num_targets": 3}, RuntimeConfig(learning_rate=0.1))
    with pytest.raises(Exception, match="built for classification"):
        emulate_run.run_files(spec, {"input": layout["input"]}, RuntimeConfig(learning_rate=0.1))
    with pytest.raises(Exception, match="built for MSE"):
        emulate_run.run_files(DataSpec(source="digits"), {**layout, "input": {"shape": [1, 8, 8, 1],
                                                                               "dtype": "float32"}},
                              RuntimeConfig(learning_rate=0.1))


def test_mse_gate_and_summary():
    bits = lambda v: struct.unpack("<I", struct.pack("<f", v))[0]  # noqa: E731
    res = {"task": "regression", "mse_before_bits": bits(0.031), "mse_before_total": 5,
           "mse_after_bits": bits(0.012), "mse_after_total": 5}
    assert emulate_run.mse_of(res, "before") == pytest.approx(0.031)
    assert emulate_run.mse_of({**res, "mse_before_total": 0}, "before") is None
    ok = emulate_run.gate_decision_mse({"enabled": True, "min_delta": 0.0}, 0.031, 0.012)
    assert ok["accepted"] and ok["metric"] == "mse"
    worse = emulate_run.gate_decision_mse({"enabled": True, "min_delta": 0.0}, 0.012, 0.031)
    assert not worse["accepted"] and "ORIGINAL" in worse["reason"]
    assert not emulate_run.gate_decision_mse({"min_delta": 0.05}, 0.031, 0.012)["accepted"]
    doc = {"accuracy": {"before_pct": None, "after_pct": None}, "mse": {"before": 0.031, "after": 0.012},
           "instructions": {"counted": False}, "stack": {"high_water_bytes": 0},
           "arena": {"used_bytes": 1024, "planned_bytes": 1024}, "runtime": {"epochs": 1}, "board": "host",
           "gate": ok}
    assert "MSE 0.031 → 0.012" in emulate_run.summary_line(doc)
