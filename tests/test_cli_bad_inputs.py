"""Bad inputs through the real CLI and the real `load` stage: exit code 2, one clear message, no traceback,
and nothing cached or half-written (issue 2's list: malformed YAML, unknown key, wrong type, missing model,
truncated and corrupted flatbuffers, an unsupported op)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tflite.BuiltinOperator import BuiltinOperator as BO

from test_load import write_model as write_fc_model
from tinytrain.pipeline.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "digits_cnn_float.tflite"


def _spec(folder: Path, model: str = "model.tflite", extra: str = "") -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(f"name: bad\nmodel:\n  path: {model}\ndata:\n  source: digits\n{extra}")
    return spec


def _build(spec: Path, cache: Path, capsys) -> tuple[int, str]:
    code = main(["build", str(spec), "--until", "load", "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    return code, err


def _assert_clean_failure(code: int, err: str, needle: str, folder: Path, cache: Path) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert needle in err, err
    assert not list(cache.glob("ac/*/*.json")), "a failed build must not leave a cache entry"
    assert not (folder / "build" / "bad" / "load").exists(), "a failed build must not leave artifacts"


@pytest.mark.parametrize("cut", [0, 7, 100, 1000, -200])
def test_truncated_model(tmp_path, capsys, cut):
    data = FIXTURE.read_bytes()
    (tmp_path / "model.tflite").write_bytes(data[:cut] if cut >= 0 else data[:cut])
    code, err = _build(_spec(tmp_path), tmp_path / "cache", capsys)
    _assert_clean_failure(code, err, "model.tflite", tmp_path, tmp_path / "cache")


def test_corrupted_model(tmp_path, capsys):
    data = bytearray(FIXTURE.read_bytes())
    data[4:8] = b"GIF8"
    (tmp_path / "model.tflite").write_bytes(bytes(data))
    code, err = _build(_spec(tmp_path), tmp_path / "cache", capsys)
    _assert_clean_failure(code, err, "GIF8", tmp_path, tmp_path / "cache")


def test_unsupported_op_is_named_with_its_index(tmp_path, capsys):
    shutil.copy(write_fc_model(tmp_path, opcodes=[(BO.CUSTOM, BO.CUSTOM, "MyFancyOp")]), tmp_path / "model.tflite")
    code, err = _build(_spec(tmp_path), tmp_path / "cache", capsys)
    _assert_clean_failure(code, err, "unsupported op CUSTOM(MyFancyOp) at operator index 0", tmp_path,
                          tmp_path / "cache")


def test_missing_model_file(tmp_path, capsys):
    code, err = _build(_spec(tmp_path, model="nowhere.tflite"), tmp_path / "cache", capsys)
    _assert_clean_failure(code, err, "nowhere.tflite", tmp_path, tmp_path / "cache")


@pytest.mark.parametrize("extra, needle", [
    ("train:\n  batch_size: many\n", "train.batch_size"),
    ("train:\n  optimiser: {kind: sgd}\n", "did you mean 'optimizer'"),
    ("train: [unclosed\n", "spec.yaml:"),
    # issue 15: each of these used to be a traceback, an exit 1 seven stages later, or 24 GB of memory
    ("b0: &b0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n" for i in range(1, 9)), "aliases are expanded"),
    ("x: " + "{a: " * 5000 + "}" * 5000 + "\n", "nest"),
    ("x: \x00\n", "character U+0000"),
    ("train: {learning_rate: .inf}\n", "train.learning_rate: should be a finite number"),
    ("train: {learning_rate: 1e400}\n", "train.learning_rate: should be a finite number"),
    ("train: {epochs: 99999999999999999999999}\n", "train.epochs: 99999999999999999999999 does not fit"),
    ("train: {epochs: yes}\n", "train.epochs: should be a valid integer, got True"),
])
def test_spec_errors(tmp_path, capsys, extra, needle):
    shutil.copy(FIXTURE, tmp_path / "model.tflite")
    code, err = _build(_spec(tmp_path, extra=extra), tmp_path / "cache", capsys)
    _assert_clean_failure(code, err, needle, tmp_path, tmp_path / "cache")
    assert len(err.splitlines()) == 1, err
