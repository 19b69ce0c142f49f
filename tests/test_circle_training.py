"""A .circle model's CIRCLE_TRAINING metadata (onert's circle+, issue 12 item 4) fills the training fields a spec
leaves out, and `tinytrain explain` says where each value came from.

The metadata is written here with the flatbuffers runtime's Builder in the layout of ONE's circle_traininfo.fbs
(schema 0.1, identifier CTR0) and read back by stages/model/circle_training.py; a field-by-field check against the
schema's slot order is in test_layout_matches_the_schema_slots (read with raw vtable lookups, not our reader).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import tinytrain
from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.planner import _value_sources
from tinytrain.pipeline.stage_graph import STAGES
from tinytrain.stages.model.circle_training import (
    TrainingInfo,
    parse_training_info,
    read_circle_training,
    training_info_bytes,
)
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import model_bytes

FIX = Path(__file__).resolve().parent / "fixtures"
# float32-exact values (the schema's fields are float), so a round trip compares with ==
ADAM = TrainingInfo("adam", 2.0 ** -7, "sparse_categorical_crossentropy", 4, 3, beta1=0.75, beta2=0.9921875,
                    eps=2.0 ** -20, from_logits=True)


def _circle(tmp_path: Path, info: TrainingInfo | None = ADAM, blob: bytes | None = None) -> Path:
    g = read_model(FIX / "mlp_float.tflite")
    meta = {"CIRCLE_TRAINING": blob if blob is not None else training_info_bytes(info)} if info or blob else None
    p = tmp_path / "m.circle"
    p.write_bytes(model_bytes(g, circle=True, metadata=meta))
    return p


def _spec(path: Path, **train) -> dict:
    return {"name": "c", "model": {"path": str(path)}, "train": train, "target": {"board": "host"}}


def test_roundtrip_and_absent_metadata(tmp_path):
    assert parse_training_info(training_info_bytes(ADAM)) == ADAM
    sgd = TrainingInfo("sgd", 0.125, "mean_squared_error", 2, None)
    assert parse_training_info(training_info_bytes(sgd)) == sgd
    assert read_circle_training(_circle(tmp_path)) == ADAM
    assert read_circle_training(_circle(tmp_path, None)) is None
    assert read_model(_circle(tmp_path)).ops          # the model itself still loads


def test_layout_matches_the_schema_slots():
    """circle_traininfo.fbs ModelTraining slots: 0 version, 1 optimizer, 2/3 optimizer_opt (union), 4 lossfn,
    5/6 lossfn_opt, 7 epochs, 8 batch_size, 9 loss_reduction_type; AdamOptions: learning_rate, beta_1, beta_2,
    epsilon. Read with bare vtable arithmetic."""
    buf = training_info_bytes(ADAM)
    assert buf[4:8] == b"CTR0"
    root = struct.unpack_from("<I", buf, 0)[0]

    def field(table: int, slot: int, fmt: str):
        vt = table - struct.unpack_from("<i", buf, table)[0]
        vt_len = struct.unpack_from("<H", buf, vt)[0]
        off = struct.unpack_from("<H", buf, vt + 4 + 2 * slot)[0] if 4 + 2 * slot < vt_len else 0
        return struct.unpack_from(fmt, buf, table + off)[0] if off else 0   # absent = the schema default, 0

    assert field(root, 1, "<b") == 1 and field(root, 2, "<B") == 2      # ADAM, AdamOptions
    assert field(root, 4, "<b") == 0 and field(root, 5, "<B") == 1      # SPARSE_CATEGORICAL_CROSSENTROPY
    assert field(root, 7, "<i") == 3 and field(root, 8, "<i") == 4
    rel = field(root, 3, "<I")
    vt = root - struct.unpack_from("<i", buf, root)[0]
    adam = root + struct.unpack_from("<H", buf, vt + 4 + 2 * 3)[0] + rel
    assert (field(adam, 0, "<f"), field(adam, 1, "<f"), field(adam, 2, "<f"), field(adam, 3, "<f")) == \
        (2.0 ** -7, 0.75, 0.9921875, 2.0 ** -20)


def test_the_spec_takes_what_it_omits_from_the_metadata_and_explain_says_so(tmp_path):
    path = _circle(tmp_path)
    spec = tinytrain.load_spec(_spec(path))
    assert (spec.train.optimizer.kind, spec.train.learning_rate, spec.train.batch_size, spec.train.epochs) == \
        ("adam", 2.0 ** -7, 4, 3)
    assert spec.train.loss == "cross_entropy" and spec.train.optimizer.beta1 == 0.75
    src = spec.value_sources()
    assert src["train.optimizer.kind"] == "m.circle's CIRCLE_TRAINING metadata"
    stated = tinytrain.load_spec(_spec(path, learning_rate=0.02, optimizer={"kind": "sgd"}))
    assert stated.train.learning_rate == 0.02 and stated.train.optimizer.kind == "sgd"
    assert stated.value_sources()["train.learning_rate"].startswith("the spec")
    autodiff = next(s for s in STAGES if s.name == "autodiff")
    lines = _value_sources(spec, autodiff)
    assert any(ln.startswith('  train.optimizer.kind = "adam": from m.circle') for ln in lines), lines
    run = next(s for s in STAGES if s.name == "emulate-run")
    assert any("train.learning_rate = 0.0078125" in ln for ln in _value_sources(spec, run))
    # tflite / circle without metadata: nothing changes
    plain = tinytrain.load_spec(_spec(_circle(tmp_path, None)))
    assert plain.value_sources() == {} and plain.train.optimizer.kind == "sgd"


def test_explain_cli_names_the_metadata(tmp_path):
    import yaml

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({**_spec(_circle(tmp_path)), "build": {"cache_dir": str(tmp_path / "cache")}}))
    r = subprocess.run([sys.executable, "-m", "tinytrain", "explain", str(f), "autodiff"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "CIRCLE_TRAINING metadata" in r.stdout and "train.optimizer.kind" in r.stdout


@pytest.mark.parametrize("blob,why", [(b"\x08\x00\x00\x00XXXX", "identifier"),
                                      (training_info_bytes(TrainingInfo("sgd", 0.1, "mean_squared_error", 2, 1,
                                                                        reduction="sum")), "reduction"),
                                      (training_info_bytes(TrainingInfo("sgd", -1.0, "mean_squared_error", 2, 1)),
                                       "positive")])
def test_bad_metadata_is_a_spec_error(blob, why, tmp_path):
    with pytest.raises(SpecError, match=why):
        tinytrain.load_spec(_spec(_circle(tmp_path, blob=blob)))


def test_the_trained_circle_carries_what_it_was_trained_with(tmp_path):
    from types import SimpleNamespace

    from tinytrain.stages.model.circle_training import write_circle_plus

    rc = SimpleNamespace(learning_rate=0.0078125, batch_size=2, epochs=3, beta1=0.75, beta2=0.9921875, eps=2.0 ** -20)
    assert write_circle_plus(FIX / "mlp_float.tflite", tmp_path / "t.circle", "adam", rc, False)
    info = read_circle_training(tmp_path / "t.circle")
    assert (info.optimizer, info.learning_rate, info.batch_size, info.epochs, info.beta1, info.eps) == \
        ("adam", 0.0078125, 2, 3, 0.75, 2.0 ** -20)
    assert info.loss == "sparse_categorical_crossentropy"
    assert len(read_model(tmp_path / "t.circle").ops) == len(read_model(FIX / "mlp_float.tflite").ops)
    # momentum cannot be named in the schema: the model is written without the metadata
    assert not write_circle_plus(FIX / "mlp_float.tflite", tmp_path / "m.circle", "momentum", rc, False)
    assert read_circle_training(tmp_path / "m.circle") is None


@pytest.mark.slow
def test_a_circle_model_builds_with_its_metadata_and_exports_trained_circle(tmp_path):
    """End to end on host: the digits CNN as .circle with CIRCLE_TRAINING (adam, batch 2, 1 epoch); the spec names
    none of those; emulate-run trains with them and writes trained.circle carrying them."""
    g = read_model(FIX / "digits_cnn_float.tflite")
    info = TrainingInfo("adam", 2.0 ** -8, "sparse_categorical_crossentropy", 2, 1, beta1=0.875, beta2=0.9921875,
                        eps=2.0 ** -20)
    (tmp_path / "d.circle").write_bytes(model_bytes(g, circle=True,
                                                    metadata={"CIRCLE_TRAINING": training_info_bytes(info)}))
    res = tinytrain.build({"name": "cp", "model": {"path": str(tmp_path / "d.circle")}, "data": {"source": "digits"},
                           "quantize": {"num_samples": 32}, "train": {"max_train_samples": 8},
                           "target": {"board": "host"},
                           "build": {"out_dir": str(tmp_path / "b"), "cache_dir": str(tmp_path / "c")}})
    run = json.loads(res.artifact("emulate-run", "run.json").read_text())
    assert run["runtime"]["batch_size"] == 2 and run["runtime"]["epochs"] == 1 and run["steps"] == 4
    out = read_circle_training(res.stages["emulate-run"].folder / "trained.circle")
    assert (out.optimizer, out.learning_rate, out.batch_size, out.epochs, out.beta1) == ("adam", 2.0 ** -8, 2, 1, 0.875)
