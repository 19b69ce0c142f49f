"""A model file whose numbers are corrupt: one weight patched in the flatbuffer's own bytes, as a flipped
exponent bit would do. Non-finite values are refused at load (exit 2, one line naming the tensor and its op);
an absurd magnitude builds but says so in load's summary line. A huge file is refused before it is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.cli import main
from tinytrain.stages.model import tflite_reader
from tinytrain.stages.model.tflite_reader import read_model

FIXTURE = Path(__file__).parent / "fixtures" / "digits_cnn_float.tflite"


def _patched_model(folder: Path, value: float) -> tuple[Path, str]:
    """The fixture with the first element of its largest float weight replaced by `value`, in place."""
    graph = read_model(FIXTURE)
    weights = [t for t in graph.tensors.values() if t.role == "weight" and t.data is not None]
    w = max(weights, key=lambda t: t.data.size)
    raw = FIXTURE.read_bytes()
    blob = np.ascontiguousarray(w.data, dtype=np.float32).tobytes()
    at = raw.find(blob)
    assert at >= 0 and raw.find(blob, at + 1) < 0, "the weight's bytes must occur once in the file"
    patched = bytearray(raw)
    patched[at:at + 4] = np.float32(value).tobytes()
    path = folder / "model.tflite"
    path.write_bytes(bytes(patched))
    return path, w.name


def _build(folder: Path, capsys) -> tuple[int, str, str]:
    spec = folder / "spec.yaml"
    spec.write_text("name: sane\nmodel:\n  path: model.tflite\ndata:\n  source: digits\n")
    code = main(["build", str(spec), "--until", "load", "--cache-dir", str(folder / "cache")])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_is_refused_naming_tensor_and_op(tmp_path, capsys, value):
    _, name = _patched_model(tmp_path, value)
    code, out, err = _build(tmp_path, capsys)
    assert code == 2, out + err
    assert "Traceback" not in err
    assert name in err and "non-finite" in err and "#" in err, err
    assert not list((tmp_path / "cache").glob("ac/*/*.json")), "a refused model must not be cached"


def test_absurd_weight_builds_with_a_warning_in_the_summary(tmp_path, capsys):
    _, name = _patched_model(tmp_path, 2e37)
    code, out, err = _build(tmp_path, capsys)
    assert code == 0, out + err
    text = out + err
    assert "warning:" in text and name in text and "2e+37" in text, text


def test_sane_model_has_no_warning(tmp_path, capsys):
    (tmp_path / "model.tflite").write_bytes(FIXTURE.read_bytes())
    code, out, err = _build(tmp_path, capsys)
    assert code == 0 and "warning:" not in (out + err), out + err


def test_huge_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    # A sparse file: its size is real, its bytes are never written nor read.
    big = tmp_path / "model.tflite"
    with open(big, "wb") as f:
        f.truncate(tflite_reader.MAX_MODEL_BYTES + 1)
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or b"")
    code, out, err = _build(tmp_path, capsys)
    assert code == 2 and "it was not read" in err, out + err
    assert big not in read
