"""bench/coverage.py's recipe (no network, no build): a sigmoid output is trained with bce on 0/1 labels, a run
whose loss does not move is not reported as training, and --merge keeps the rows not re-run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cov():
    # by its path: `coverage` is also the name of a pip package a test run may have imported
    spec = importlib.util.spec_from_file_location("tt_bench_coverage", REPO / "bench" / "coverage.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_sigmoid_output_gets_bce_on_binary_labels(cov, tmp_path):
    """MediaPipe's selfie segmentation ends in a LOGISTIC (a probability per pixel): its data are 0/1 labels
    under the output's loaded name and its spec trains that output with bce; hand_recrop (a regression) keeps MSE."""
    fixtures = REPO / "tests" / "fixtures" / "thirdparty"
    name = cov.sigmoid_output(fixtures / "selfie_segmentation.tflite")
    assert name == "activation_10"
    assert cov.sigmoid_output(fixtures / "hand_recrop.tflite") is None
    ins, outs = [[[1, 4, 4, 3], "float32"]], [[[1, 4, 4, 1], "float32"]]
    task = cov.write_data(tmp_path / "d.npz", ins, outs, first_output=name, sigmoid=name)
    d = np.load(tmp_path / "d.npz")
    assert task == "outputs" and set(np.unique(d[f"y_train_{name}"])) <= {0.0, 1.0}
    assert d[f"y_train_{name}"].shape == (cov.N_TRAIN, 4, 4, 1)
    spec = json.loads(cov.spec_text("m", Path("m.tflite"), tmp_path / "d.npz", task, tmp_path, sigmoid=name))
    assert spec["train"]["outputs"] == [{"name": name, "loss": "bce"}]
    plain = json.loads(cov.spec_text("m", Path("m.tflite"), tmp_path / "d.npz", "regression", tmp_path))
    assert plain["train"]["loss"] == "mse"


def test_unmoved_loss_is_not_reported_as_training(cov):
    r = cov.Row(model="m", source="s", exit_code=0, loss_before=0.316, loss_after=0.316)
    assert cov.result_text(r).startswith("runs, but the loss does not move")
    r.loss_after = 0.2
    assert cov.result_text(r) == "trains"
    r.exit_code, r.reason = 2, "budget too small"
    assert cov.result_text(r) == "budget too small"


def test_merge_replaces_rows_in_place(cov):
    old = [{"model": "a", "source": "x", "task": "regression"}, {"model": "b", "source": "x", "task": "classification"}]
    rows = cov.merged([cov.Row(model="b", source="x", loss="bce"), cov.Row(model="c", source="y")], old)
    assert [(r.model, r.loss) for r in rows] == [("a", "mse"), ("b", "bce"), ("c", "")]


def test_precision_and_board_reach_the_spec(cov, tmp_path):
    """--precision states train.precision and --board target.board; left out, the spec is today's (no precision,
    stm32f746-disco)."""
    d = tmp_path / "d.npz"
    spec = json.loads(cov.spec_text("m", Path("m.tflite"), d, "regression", tmp_path, board="mps3-an547",
                                    precision="fp16-mixed"))
    assert spec["train"]["precision"] == "fp16-mixed" and spec["target"]["board"] == "mps3-an547"
    plain = json.loads(cov.spec_text("m", Path("m.tflite"), d, "regression", tmp_path))
    assert "precision" not in plain["train"] and plain["target"]["board"] == "stm32f746-disco"


def test_float_copy_dequantizes_int8_weights_only(cov, tmp_path):
    """An int8 model's float copy has float32 weights equal to the int8 ones dequantized; a float model and a
    stateful int8 model (whose resource variables the writer cannot write) get no copy."""
    from tinytrain.stages.model.tflite_reader import read_model

    fixtures = REPO / "tests" / "fixtures"
    src = fixtures / "convnet_int8.tflite"
    out = cov.float_copy(src, tmp_path)
    assert out is not None and out.is_file()
    q, f = read_model(src), read_model(out)
    for name, t in q.tensors.items():
        if t.data is not None and t.dtype == "int8" and t.quant is not None and len(t.quant.scale) == 1:
            want = (t.data.astype(np.float64) - t.quant.zero_point[0]) * t.quant.scale[0]
            assert f.tensors[name].dtype == "float32"
            np.testing.assert_allclose(f.tensors[name].data, want, rtol=1e-6)
    assert all(t.dtype != "int8" for t in f.tensors.values())
    assert cov.float_copy(fixtures / "convnet_float.tflite", tmp_path) is None
    assert cov.float_copy(fixtures / "stateful" / "stream_kws_int8.tflite", tmp_path) is None
    assert cov.is_int8(fixtures / "stateful" / "stream_kws_int8.tflite")
    assert not cov.is_int8(fixtures / "convnet_float.tflite")


def test_fp16_mixed_table_has_arena_and_loss_scale(cov):
    r = cov.Row(model="m", source="s", exit_code=0, loss_before=1.0, loss_after=0.5, arena=2048, arena_fp32=4096,
                loss_scale=16384.0, skipped_steps=2, dequantized=True, board="mps3-an547")
    heads = cov.headers("fp16-mixed")
    row = dict(zip(heads, cov.table_rows([r], "fp16-mixed")[0]))
    assert (row["arena KB"], row["fp32 same plan KB"], row["loss scale (skipped)"]) == ("2.0", "4.0", "16384 (2)")
    assert row["model"] == "m (dequantized)"
    assert "arena KB" not in cov.headers(None) and len(cov.table_rows([r])[0]) == len(cov.headers(None))
    md = cov.markdown([r], {"w": "1"}, "today", "mps3-an547", "fp16-mixed")
    assert "`train.precision: fp16-mixed`" in md and "1 of 1 builds train in QEMU on mps3-an547" in md
