"""Data of any rank (issue 10 item 3): [N, F] features, [N, T, F] sequences and images load from an .npz; the
sample shape is checked against the model input with one line (exit 2); an MLP on [N, 64] features trains end to
end on the host board (the project's own TFLite writer makes the model, see tests/feature_models.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from feature_models import features_mlp, write
from tinytrain.pipeline.cli import main
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.stages.train.data import DataError, check_compatible, load_dataset

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


def _classes(x: np.ndarray, k: int = 4) -> np.ndarray:
    """Labels that depend on the data (so training has something to learn): the argmax of k fixed projections."""
    a = np.random.default_rng(7).standard_normal((x[0].size, k))
    return np.argmax((x.reshape(len(x), -1) - 0.5) @ a, axis=1).astype(np.int64)


@pytest.mark.parametrize("shape", [(64,), (5, 8), (4, 4, 3)])
def test_npz_of_any_rank_loads(tmp_path, shape):
    x = np.random.default_rng(0).uniform(0, 1, (40, *shape)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=_classes(x))
    ds = load_dataset(DataSpec(source="npz", path=tmp_path / "d.npz"))
    assert ds.sample_shape == shape and ds.x_train.dtype == np.float32
    assert len(ds.x_train) + len(ds.x_test) == 40
    check_compatible(ds, [1, *shape], num_classes=4)


@pytest.mark.parametrize("shape", [(64,), (5, 8)])
def test_regression_npz_of_any_rank_loads(tmp_path, shape):
    x = np.random.default_rng(0).uniform(0, 1, (20, *shape)).astype(np.float32)
    np.savez(tmp_path / "r.npz", x=x, y=x.reshape(20, -1)[:, :2])
    ds = load_dataset(DataSpec(source="npz", path=tmp_path / "r.npz", task="regression"))
    assert ds.sample_shape == shape and ds.num_targets == 2


def test_rank_errors_are_one_clear_line(tmp_path):
    np.savez(tmp_path / "flat.npz", x=np.zeros(10), y=np.zeros(10, int))
    with pytest.raises(DataError, match=r"x has shape \[10\]; expected one sample per row: \[N, F\] features") as e:
        load_dataset(DataSpec(source="npz", path=tmp_path / "flat.npz"))
    assert e.value.exit_code == 2 and "x[:, None]" in e.value.hint
    np.savez(tmp_path / "deep.npz", x=np.zeros((4, 1, 1, 1, 1, 1)), y=np.zeros(4, int))
    with pytest.raises(DataError, match=r"x has shape \[4, 1, 1, 1, 1, 1\]"):
        load_dataset(DataSpec(source="npz", path=tmp_path / "deep.npz"))


def test_shape_mismatch_says_expected_and_got(tmp_path):
    x = np.zeros((20, 32), np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    ds = load_dataset(DataSpec(source="npz", path=tmp_path / "d.npz"))
    with pytest.raises(DataError) as e:
        check_compatible(ds, [1, 64])
    assert e.value.message == ("data shape does not match the model input: expected samples of [64] (features) "
                               "(model input [1, 64], batch first), got [32] (features)")
    assert "\n" not in e.value.message and "[N, 64]" in e.value.hint
    with pytest.raises(DataError, match=r"expected samples of \[8, 8, 1\] \(an image \[H, W, C\]\).*got \[32\]"):
        check_compatible(ds, [1, 8, 8, 1])


def _spec(tmp_path: Path, npz: Path, model: Path, **train) -> Path:
    t = {"update": {"scheme": "full"}, "epochs": 2, "learning_rate": 0.05, **train}
    spec = {"name": "feat", "model": {"path": str(model)}, "data": {"source": "npz", "path": str(npz)},
            "quantize": {"num_samples": 32}, "train": t, "target": {"board": "host"},
            "build": {"out_dir": str(tmp_path / "build"), "cache_dir": str(tmp_path / "cache")}}
    p = tmp_path / "spec.yaml"
    p.write_text(json.dumps(spec))  # JSON is YAML
    return p


@pytest.mark.slow  # ~10 s: a whole build (quantize ... emulate-run) on the host board
@needs_cc
def test_mlp_on_flat_features_trains_end_to_end_on_the_host_board(tmp_path, capsys):
    model = write(features_mlp(64), tmp_path / "mlp64.tflite")
    x = np.random.default_rng(1).uniform(0, 1, (120, 64)).astype(np.float32)
    np.savez(tmp_path / "f.npz", x=x, y=_classes(x))
    code = main(["build", str(_spec(tmp_path, tmp_path / "f.npz", model))])
    out, err = capsys.readouterr()
    assert code == 0, err
    run = json.loads((tmp_path / "build" / "feat" / "emulate-run" / "run.json").read_text())
    assert run["board"] == "host" and run["data"]["train_samples"] == 96
    acc = run["accuracy"]
    assert acc["after_pct"] > acc["before_pct"]  # 2 epochs on a learnable labelling improve test accuracy


def test_mismatched_feature_count_exits_2_with_one_line(tmp_path, capsys):
    model = write(features_mlp(64), tmp_path / "mlp64.tflite")
    x = np.random.default_rng(1).uniform(0, 1, (40, 48)).astype(np.float32)
    np.savez(tmp_path / "f.npz", x=x, y=_classes(x))
    code = main(["build", str(_spec(tmp_path, tmp_path / "f.npz", model))])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    first = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(first) == 1 and "expected samples of [64] (features)" in first[0] and "got [48]" in first[0], err


def test_sequences_stream_to_the_firmware_with_their_rank(tmp_path):
    """emulate-run's streams carry [T, F] samples as they are (TTDS rank 2), quantized with the input's parameters."""
    from tinytrain.stages import emulate_run
    from tinytrain.stages.train.data import read_stream
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    x = np.random.default_rng(2).uniform(-1, 1, (30, 5, 8)).astype(np.float32)
    np.savez(tmp_path / "s.npz", x=x, y=np.arange(30) % 3)
    spec = DataSpec(source="npz", path=tmp_path / "s.npz")
    layout = {"input": {"shape": [1, 5, 8], "dtype": "int8", "scale": 1 / 64, "zero_point": 0}}
    files, info = emulate_run.run_files(spec, layout, RuntimeConfig(learning_rate=0.1))
    (tmp_path / "test.ttds").write_bytes(files["test.ttds"])
    xs, ys = read_stream(tmp_path / "test.ttds")
    assert xs.shape == (info["test_samples"], 5, 8) and xs.dtype == np.int8
    ds = load_dataset(spec)
    np.testing.assert_array_equal(xs, np.clip(np.round(ds.x_test * 64), -128, 127).astype(np.int8))
    np.testing.assert_array_equal(ys, ds.y_test)
    with pytest.raises(DataError, match=r"expected samples of \[8, 5\] \(a sequence \[T, F\]\).*got \[5, 8\]"):
        emulate_run.run_files(spec, {"input": {**layout["input"], "shape": [1, 8, 5]}}, RuntimeConfig())
