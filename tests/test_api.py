"""The Python API: tinytrain.build / load_spec / inspect, overrides, errors as exceptions, a cheap import."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tinytrain
from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.runner import StageNotImplemented

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake(fake_project, monkeypatch):
    monkeypatch.setattr(stage_graph, "STAGES", fake_project.table())
    return fake_project


def test_build_returns_stages_metrics_and_artifact_paths(fake):
    r = tinytrain.build(fake.spec_path, until="c")
    assert isinstance(r, tinytrain.BuildResult) and r.ok and r.name == "tinytrain"
    assert list(r.stages) == ["a", "b", "c"] and r.ran == ["a", "b", "c"] and r.cached == []
    assert r.stages["a"].summary == "17 bytes" and r.stages["b"].metrics == {"chars": 17}
    assert len(r.stages["a"].key) == 64
    assert r.out_dir == fake.out and r.report == fake.out / "report.md" and r.report.is_file()
    note = r.artifact("b", "sub/note.json")
    assert note == fake.out / "b" / "sub" / "note.json" and json.loads(note.read_text()) == {"chars": 17}
    assert sorted(r.stages["b"].artifacts) == ["b.txt", "sub/note.json"]
    with pytest.raises(tinytrain.UserError, match="no artifact 'nope.txt'"):
        r.artifact("b", "nope.txt")
    again = tinytrain.build(fake.spec_path, until="c")
    assert again.ran == [] and again.cached == ["a", "b", "c"] and fake.calls() == ["a", "b", "c"]


def test_dotted_and_nested_overrides_change_the_spec_like_the_file_would(fake):
    tinytrain.build(fake.spec_path, until="c")
    r = tinytrain.build(fake.spec_path, until="c", **{"train.learning_rate": 0.02})
    assert r.ran == ["c"] and r.cached == ["a", "b"]
    assert json.loads(r.artifact("c", "c.json").read_text())["lr"] == 0.02
    r = tinytrain.build(fake.spec_path, until="c", quantize={"num_samples": 11})
    assert r.ran == ["b", "c"] and r.artifact("b", "b.txt").read_text().endswith("11")
    # a relative path in an override is relative to the spec's folder, as in the file
    r = tinytrain.build(fake.spec_path, until="a", **{"build.out_dir": "elsewhere"})
    assert r.out_dir == fake.root / "elsewhere" / "tinytrain" and r.cached == ["a"]
    text = fake.spec_path.read_text()  # overrides never touch the file
    assert "elsewhere" not in text and "0.02" not in text


def test_load_spec_from_a_path_a_dict_or_a_spec(fake, monkeypatch, tmp_path):
    spec = tinytrain.load_spec(fake.spec_path, train={"learning_rate": 0.5})
    assert spec.train.learning_rate == 0.5 and spec.source == fake.spec_path.resolve()
    assert spec.quantize.num_samples == 10  # the rest comes from the file
    assert tinytrain.load_spec(spec, **{"train.epochs": 7}).train.epochs == 7
    monkeypatch.chdir(fake.root)
    from_dict = tinytrain.load_spec({"model": {"path": "net.tflite"}, "target": {"board": "host"}})
    assert from_dict.name == "tinytrain" and from_dict.model.path == fake.root / "net.tflite"
    assert from_dict.source is None


@pytest.mark.parametrize("source, overrides, needle", [
    ("file", {"train.learning_rate": "fast"}, "train.learning_rate: Input should be a valid number"),
    ("file", {"train": {"epochz": 1}}, "train.epochz: Extra inputs are not permitted"),
    ("file", {"train.learning_rate.x": 1}, "train.learning_rate is a value, not a section"),
    ("file", {"train..x": 1}, "expected a spec path like train.learning_rate"),
    ("missing", {}, "spec file not found"),
    ("dict", {}, "model: Field required"),
])
def test_bad_specs_and_overrides_raise_spec_errors(fake, source, overrides, needle):
    src = {"file": fake.spec_path, "missing": fake.root / "missing.yaml", "dict": {"name": "x"}}[source]
    with pytest.raises(tinytrain.SpecError, match=needle.replace(".", r"\.")) as info:
        tinytrain.build(src, **overrides)
    assert info.value.exit_code == 2


def test_failures_raise_with_what_was_built_so_far(fake, monkeypatch):
    with pytest.raises(StageNotImplemented) as info:
        tinytrain.build(fake.spec_path)
    assert isinstance(info.value, tinytrain.StageFailed) and info.value.exit_code == 1
    assert info.value.build_result.ran == ["a", "b", "c"] and not info.value.build_result.ok
    monkeypatch.setattr(stage_graph, "STAGES", fake.table("usererr"))
    with pytest.raises(tinytrain.UserError, match="the data is wrong"):
        tinytrain.build(fake.spec_path, until="b")
    with pytest.raises(tinytrain.UserError, match="unknown stage|no stage"):
        tinytrain.build(fake.spec_path, until="nope")


def test_log_false_is_silent_and_log_true_prints_the_build_log(fake, capsys):
    tinytrain.build(fake.spec_path, until="a")
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    tinytrain.build(fake.spec_path, until="b", log=True)
    out, _ = capsys.readouterr()
    assert out.startswith("[a] cached (key ") and "[b] ran in " in out


def test_inspect_gives_paths_and_the_readable_view(fake):
    tinytrain.build(fake.spec_path, until="b")
    view = tinytrain.inspect(fake.spec_path, "b")
    assert view.stage == "b" and view.folder == fake.out / "b" and view.note is None
    assert sorted(view.artifacts) == ["b.txt", "sub/note.json"]
    assert "── b.txt ──" in view.text and '"chars": 17' in view.text
    one = tinytrain.inspect(fake.spec_path, "b", "sub/note.json")
    assert str(one) == one.text and "b.txt" not in one.text and '"chars": 17' in one.text
    assert tinytrain.inspect(fake.spec_path, "b", artifact="sub/note.json").text == one.text
    with pytest.raises(tinytrain.UserError, match="no artifacts for this spec yet"):
        tinytrain.inspect(fake.spec_path, "c")


def test_import_tinytrain_is_cheap():
    code = ("import sys, tinytrain; heavy = ['numpy', 'pydantic', 'rich', 'yaml', 'doit', 'tinytrain.pipeline.api'];"
            "print([m for m in heavy if m in sys.modules]); tinytrain.build; print('tinytrain.pipeline.api' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.split("\n")[:2] == ["[]", "True"]


def _example(tmp_path: Path) -> Path:
    shutil.copy(REPO / "tinytrain.yaml.example", tmp_path / "tinytrain.yaml.example")
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "digits_cnn_float.tflite", tmp_path / "tests" / "fixtures")
    return tmp_path / "tinytrain.yaml.example"


def test_example_until_quantize_through_the_api(tmp_path):
    r = tinytrain.build(_example(tmp_path), until="quantize", cache_dir=tmp_path / "cache",
                        **{"build.out_dir": str(tmp_path / "out")})
    assert r.ran == ["load", "quantize"] and r.out_dir == tmp_path / "out" / "digits"
    report = json.loads(r.artifact("quantize", "report.json").read_text())
    assert r.metrics["int8_accuracy_pct"] == pytest.approx(100 * report["model"]["acc_int8"])
    assert "accuracy_after_pct" not in r.metrics  # emulate-run did not run
    # every artifact of the stage has a readable view (the stage's own inspector or the generic one)
    view = tinytrain.inspect(r.spec, "quantize", cache_dir=tmp_path / "cache")
    assert sorted(view.artifacts) == sorted(p.name for p in r.stages["quantize"].artifacts.values())
    for name in view.artifacts:
        assert f"── {name} ──" in view.text


@pytest.mark.slow
def test_example_full_build_through_the_api(tmp_path):
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("needs qemu-system-arm and arm-none-eabi-gcc")
    r = tinytrain.build(_example(tmp_path), cache_dir=tmp_path / "cache", **{"build.out_dir": str(tmp_path / "out"),
                                                                            "train.epochs": 1})
    assert r.ok and len(r.ran) == 8
    run = json.loads(r.artifact("emulate-run", "run.json").read_text())
    size = json.loads(r.artifact("cross-compile", "size.json").read_text())
    assert run["runtime"]["epochs"] == 1
    assert r.metrics["accuracy_before_pct"] == run["accuracy"]["before_pct"]
    assert r.metrics["accuracy_after_pct"] == run["accuracy"]["after_pct"]
    assert r.metrics["peak_sram_bytes"] == size["sram"]["used"]
    assert r.artifact("emulate-run", "trained_int8.tflite").stat().st_size > 0
