"""The `tinytrain` command: exit codes, output formats and every verb, via main() and one real process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.cli import main, parse_age, parse_size

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake(fake_project, monkeypatch):
    monkeypatch.setattr(stage_graph, "STAGES", fake_project.table())
    return fake_project


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_build_exit_codes_and_summary_lines(fake, capsys):
    code, out, err = _run(capsys, "build", fake.spec_path, "--until", "c")
    assert code == 0
    assert out.splitlines()[0].startswith("[a] ran in ") and out.splitlines()[0].endswith("— 17 bytes")
    assert "build ok" in out and "3 ran, 0 cached" in out
    code, out, err = _run(capsys, "build", fake.spec_path, "--until", "c")
    assert code == 0 and out.splitlines()[0].startswith("[a] cached (key ")
    code, out, err = _run(capsys, "build", fake.spec_path)
    assert code == 1 and "[d] not implemented yet" in out
    assert err.startswith("error: stage d is not implemented yet") and "Traceback" not in err


def test_build_json_is_one_document_on_stdout(fake, capsys):
    code, out, err = _run(capsys, "build", fake.spec_path, "--until", "b", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["ran"] == ["a", "b"]
    assert [s["state"] for s in doc["stages"]] == ["ran", "ran"] and doc["stages"][1]["metrics"] == {"chars": 17}
    assert "[a] ran" in err  # the human lines go to stderr
    code, out, _ = _run(capsys, "build", fake.spec_path, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["exit_code"] == 1 and not doc["ok"] and "not implemented" in doc["error"]
    assert doc["cached"] == ["a", "b"] and doc["ran"] == ["c"]


def test_dry_run_force_and_only_flags(fake, capsys):
    code, out, _ = _run(capsys, "build", fake.spec_path, "--dry-run", "--until", "b")
    assert code == 0 and fake.calls() == [] and "[a] would run — no cache entry (never built)" in out
    _run(capsys, "build", fake.spec_path, "--until", "b")
    fake.reset_calls()
    code, out, _ = _run(capsys, "build", fake.spec_path, "--until", "b", "--force", "a")
    assert code == 0 and fake.calls() == ["a"] and "[b] cached" in out
    fake.reset_calls()
    code, out, _ = _run(capsys, "build", fake.spec_path, "--only", "c")
    assert code == 0 and fake.calls() == ["c"] and "[a]" not in out


@pytest.mark.parametrize("argv, message", [
    (["build", "{spec}", "--until", "nope"], "error: unknown stage 'nope'"),
    (["build", "{spec}", "--only", "c"], "error: --only c needs the artifacts of a"),
    (["build", "{root}/missing.yaml"], "spec file not found"),
    (["explain", "{spec}", "zz"], "unknown stage 'zz'"),
    (["inspect", "{spec}", "a"], "stage a has no artifacts for this spec yet"),
    (["cache", "gc"], "needs a scope"),
    (["cache", "gc", "--max-size", "lots"], "expected a size like 500M"),
])
def test_user_errors_exit_2_without_traceback(fake, capsys, argv, message):
    code, out, err = _run(capsys, *[a.format(spec=fake.spec_path, root=fake.root) for a in argv])
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_bad_spec_exits_2_with_the_line(fake, capsys):
    fake.spec_path.write_text("model: {path: net.tflite}\ntrain:\n  optimizer: {kind: adamw}\n")
    code, _, err = _run(capsys, "build", fake.spec_path)
    assert code == 2
    assert err == (f"error: {fake.spec_path}:3: train.optimizer.kind: 'adamw' is not one of "
                   "sgd, momentum, adam, rmsprop\n")


def test_usage_errors_exit_2(capsys):
    assert main(["build"]) == 2
    assert main(["frobnicate"]) == 2
    assert main([]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


def test_stage_crash_exits_1_and_debug_reraises(fake, capsys, monkeypatch):
    monkeypatch.setattr(stage_graph, "STAGES", fake.table("boom"))
    code, _, err = _run(capsys, "build", fake.spec_path, "--until", "b")
    assert code == 1 and "error: stage b failed: RuntimeError: boom" in err and "Traceback" not in err
    monkeypatch.setenv("TINYTRAIN_DEBUG", "1")
    with pytest.raises(Exception, match="stage b failed"):
        main(["build", str(fake.spec_path), "--until", "b"])


def test_status_and_explain(fake, capsys):
    code, out, _ = _run(capsys, "status", fake.spec_path)
    assert code == 0
    rows = [line.split(None, 1) for line in out.splitlines()]
    assert rows[0] == ["a", "will run         no cache entry (never built)"]
    assert rows[3] == ["d", "not implemented"]
    _run(capsys, "build", fake.spec_path, "--until", "c")
    fake.write_spec(quantize={"num_samples": 11})
    code, out, _ = _run(capsys, "status", fake.spec_path)
    assert out.splitlines()[0].startswith("a  cached           key ")
    assert "b  will run         config changed (quantize.num_samples)" in out
    assert "c  will run         upstream b will run" in out
    code, out, _ = _run(capsys, "status", fake.spec_path, "--json")
    assert [s["state"] for s in json.loads(out)["stages"]] == ["cached", "will run", "will run", "not implemented"]
    code, out, _ = _run(capsys, "explain", fake.spec_path, "b")
    assert code == 0
    assert out.splitlines()[0] == "b: will run — config changed (quantize.num_samples)"
    assert "  config.quantize.num_samples: 10 -> 11" in out
    code, out, _ = _run(capsys, "explain", fake.spec_path, "c")
    assert "inputs are unknown" in out and "nothing changed" in out
    code, out, _ = _run(capsys, "explain", fake.spec_path, "d")
    assert "not implemented" in out


def test_inspect_dispatches_on_file_type(fake, capsys):
    _run(capsys, "build", fake.spec_path, "--until", "c")
    code, out, _ = _run(capsys, "inspect", fake.spec_path, "b")
    assert code == 0 and "── b.txt ──" in out and "── sub/note.json ──" in out
    assert '"chars": 17' in out and "FAKE MODEL BYTES" in out
    code, out, _ = _run(capsys, "inspect", fake.spec_path, "c", "c.json")
    assert json.loads(out) == {"b": "FAKE MODEL BYTES\n10", "lr": 0.01}
    np.savez(fake.root / "w.npz", w=np.arange(6, dtype=np.int8).reshape(2, 3))
    from tinytrain.pipeline.inspect_artifacts import describe

    table = describe(fake.root / "w.npz")
    assert table.splitlines()[1].split() == ["w", "int8", "[2,3]", "0", "5", "2.5"]
    code, _, err = _run(capsys, "inspect", fake.spec_path, "c", "nope.bin")
    assert code == 2 and "it has: c.json" in err


def test_inspect_restores_cached_artifacts_after_clean(fake, capsys):
    _run(capsys, "build", fake.spec_path, "--until", "a")
    code, out, _ = _run(capsys, "clean", fake.spec_path)
    assert code == 0 and out.startswith("removed ") and not fake.out.exists()
    fake.reset_calls()
    code, out, _ = _run(capsys, "inspect", fake.spec_path, "a", "a.txt")
    assert code == 0 and out == "FAKE MODEL BYTES\n" and fake.calls() == []


def test_clean_removes_only_this_builds_folder(fake, capsys, tmp_path):
    _run(capsys, "build", fake.spec_path, "--until", "a")
    keep = fake.root / "out" / "other-build" / "x.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("keep")
    _run(capsys, "clean", fake.spec_path)
    assert keep.exists() and not fake.out.exists()
    code, out, _ = _run(capsys, "clean", fake.spec_path)
    assert code == 0 and out.startswith("nothing to clean")
    # The cache is untouched: the next build restores.
    fake.reset_calls()
    _run(capsys, "build", fake.spec_path, "--until", "a")
    assert fake.calls() == []


@pytest.mark.parametrize("fmt, needle", [("text", "a      -      model"), ("mermaid", "s0 --> s1"),
                                         ("dot", '"c" -> "d";')])
def test_graph_formats(fake, capsys, fmt, needle):
    code, out, _ = _run(capsys, "graph", "--format", fmt)
    assert code == 0 and needle in out


def test_graph_with_a_spec_shows_states(fake, capsys):
    code, out, _ = _run(capsys, "graph", fake.spec_path)
    assert code == 0 and "will run" in out and "not implemented" in out


def test_cache_stats_and_gc(fake, capsys):
    _run(capsys, "build", fake.spec_path, "--until", "b")
    code, out, _ = _run(capsys, "cache", "stats", "--json")
    st = json.loads(out)
    assert code == 0 and st["entries"] == 2 and st["misses"] == 2 and st["hits"] == 0
    code, out, _ = _run(capsys, "cache", "stats")
    assert "in 2 entries" in out and "2 misses" in out
    code, out, _ = _run(capsys, "cache", "gc", "--max-size", "0")
    assert code == 0 and out.startswith("removed 2 entries")
    fake.reset_calls()
    _run(capsys, "build", fake.spec_path, "--until", "b")
    assert fake.calls() == ["a", "b"]


def test_cache_dir_option_wins(fake, capsys, tmp_path):
    _run(capsys, "build", fake.spec_path, "--until", "a", "--cache-dir", tmp_path / "cli-cache")
    assert list((tmp_path / "cli-cache").glob("ac/*/*.json"))


@pytest.mark.parametrize("text, value", [("500M", 500 << 20), ("2G", 2 << 30), ("1024", 1024), ("1.5k", 1536),
                                         ("10MiB", 10 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text, value", [("30d", 30 * 86400), ("12h", 43200), ("90", 90.0), ("2w", 14 * 86400)])
def test_parse_age(text, value):
    assert parse_age(text) == value


def test_schema_command_prints_the_json_schema(capsys):
    code, out, _ = _run(capsys, "schema")
    doc = json.loads(out)
    assert code == 0 and doc["title"] == "Spec" and "train" in doc["properties"]


# ---- the real load stage and the shipped example ---------------------------------------------------

def _example(tmp_path: Path) -> Path:
    """The shipped example, copied with its model so that the build folder lands in tmp_path."""
    shutil.copy(REPO / "tinytrain.yaml.example", tmp_path / "tinytrain.yaml.example")
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "digits_cnn_float.tflite", tmp_path / "tests" / "fixtures")
    return tmp_path / "tinytrain.yaml.example"


def test_example_until_load_then_a_second_build_runs_nothing(tmp_path, capsys, monkeypatch):
    load = pytest.importorskip("tinytrain.stages.load")
    example = _example(tmp_path)
    code, out, err = _run(capsys, "build", example, "--until", "load")
    assert code == 0, err
    assert (tmp_path / "build" / "digits" / "load" / "graph.json").exists()
    calls = []
    monkeypatch.setattr(load, "run", lambda ctx: calls.append(ctx) or pytest.fail("load ran"))
    code, out, err = _run(capsys, "build", example, "--until", "load")
    assert code == 0 and calls == [] and out.startswith("[load] cached (key ")
    code, out, _ = _run(capsys, "inspect", example, "load", "graph.json")
    assert code == 0 and "conv2d" in out and "fully_connected" in out


def test_infer_runs_the_reference_executor_on_a_stage_graph(tmp_path, capsys):
    pytest.importorskip("tinytrain.stages.load")
    pytest.importorskip("tinytrain.stages.golden.forward")
    example = _example(tmp_path)
    assert main(["build", str(example), "--until", "load"]) == 0
    x = np.load(REPO / "tests" / "fixtures" / "digits_cnn.input.npy")
    np.save(tmp_path / "in.npy", x)
    code, out, err = _run(capsys, "infer", example, "--stage", "load", "--input", tmp_path / "in.npy",
                          "--output", tmp_path / "out.npy")
    assert code == 0, err
    y = np.load(tmp_path / "out.npy")
    assert y.shape == (x.shape[0], 10) and np.allclose(y.sum(axis=1), 1.0, atol=1e-5)


def test_console_script_in_a_real_process(tmp_path):
    exe = Path(sys.executable).with_name("tinytrain")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {path: missing.tflite}\n")
    proc = subprocess.run([str(exe), "build", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}:1: model.path: file not found") and "Traceback" not in proc.stderr
    proc = subprocess.run([str(exe), "schema"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["title"] == "Spec"
