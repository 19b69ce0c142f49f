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


def test_dequantized_rows_come_from_the_quantize_stage(cov, tmp_path):
    """A float precision of an int8 model file: the row is marked `dequantized` because the build's quantize stage
    trained the dequantized float copy (its metrics), not because the benchmark made one; int8 is not marked."""
    import tinytrain

    model = REPO / "tests" / "fixtures" / "convnet_int8.tflite"
    marks = {}
    for precision in ("fp32", "int8"):
        spec = tmp_path / f"{precision}.yaml"
        spec.write_text(json.dumps({"name": precision, "model": {"path": str(model)},
                                    "train": {"precision": precision}, "build": {"out_dir": str(tmp_path / "b")}}))
        r = tinytrain.build(spec, until="quantize", cache_dir=tmp_path / "cache")
        row = cov.Row(model="convnet_int8", source="s")
        cov._read_artifacts(row, r.artifact("quantize", "graph.json").parent.parent, ["load", "quantize"])
        marks[precision] = row.dequantized
    assert marks == {"fp32": True, "int8": False}


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
