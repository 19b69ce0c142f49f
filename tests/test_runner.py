"""The build engine with a fake stage table: what runs, what is restored, and what survives failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tinytrain.cache.store import Cache
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.planner import explain, plan
from tinytrain.pipeline.runner import StageNotImplemented, build
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.workspace import open_cache


def _build(proj, b: str = "b", **kw):
    spec = load_spec(proj.spec_path)
    return build(spec, open_cache(spec), BuildLog(quiet=True), stages=proj.table(b), **kw)


def _states(result) -> dict[str, str]:
    return {o.stage: o.state for o in result.outcomes}


def _entries_by_stage(cache_root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in cache_root.glob("ac/*/*.json"):
        stage = json.loads(p.read_text())["preimage"]["stage"]
        counts[stage] = counts.get(stage, 0) + 1
    return counts


def _cache_root() -> Path:
    return Path(os.environ["TINYTRAIN_CACHE_DIR"])


def test_first_build_runs_until_the_unimplemented_stage_and_stops_with_exit_1(fake_project):
    r = _build(fake_project)
    assert fake_project.calls() == ["a", "b", "c"]
    assert _states(r) == {"a": "ran", "b": "ran", "c": "ran", "d": "not implemented"}
    assert isinstance(r.error, StageNotImplemented) and r.exit_code == 1
    assert "stage d is not implemented yet" in str(r.error) and "--until c" in str(r.error)
    assert (fake_project.out / "c" / "c.json").exists()
    assert (fake_project.out / "b" / "sub" / "note.json").exists()
    manifest = json.loads((fake_project.out / "a" / "manifest.json").read_text())
    assert manifest["key"] == r.outcomes[0].key


def test_second_identical_build_calls_no_stage_function(fake_project):
    _build(fake_project, until="c")
    fake_project.reset_calls()
    r = _build(fake_project, until="c")
    assert fake_project.calls() == []
    assert _states(r) == {"a": "cached", "b": "cached", "c": "cached"}
    assert r.error is None and r.cache["hits"] == 3 and r.cache["misses"] == 0
    assert (fake_project.out / "c" / "c.json").exists()


def test_artifacts_are_restored_after_the_build_folder_is_removed(fake_project):
    _build(fake_project, until="c")
    import shutil

    shutil.rmtree(fake_project.out)
    fake_project.reset_calls()
    _build(fake_project, until="c")
    assert fake_project.calls() == []
    assert json.loads((fake_project.out / "c" / "c.json").read_text())["lr"] == 0.01


def test_changing_a_key_only_a_later_stage_reads_keeps_earlier_stages_cached(fake_project):
    _build(fake_project, until="c")
    fake_project.reset_calls()
    fake_project.write_spec(train={"learning_rate": 0.5}, target={"board": "stm32f746-disco"})
    r = _build(fake_project, until="c")
    assert fake_project.calls() == ["c"]
    assert _states(r) == {"a": "cached", "b": "cached", "c": "ran"}


def test_key_unrelated_to_every_stage_keeps_everything_cached(fake_project):
    _build(fake_project, until="c")
    fake_project.reset_calls()
    fake_project.write_spec(target={"board": "stm32f746-disco"}, build={"out_dir": "out", "salt": ""})
    _build(fake_project, until="c")
    assert fake_project.calls() == []


def test_changed_input_file_reruns_its_stage_and_explain_names_it(fake_project):
    _build(fake_project, until="c")
    (fake_project.root / "net.tflite").write_bytes(b"other model bytes\n")
    spec = load_spec(fake_project.spec_path)
    cache = open_cache(spec)
    items = {i.stage.name: i for i in plan(spec, cache, fake_project.table())}
    assert items["a"].state == "will run" and items["a"].reason == "input file changed (model.path)"
    assert items["b"].reason == "upstream a will run"
    text = "\n".join(explain(spec, cache, "a", fake_project.table()))
    assert "config.model.path.sha256" in text
    fake_project.reset_calls()
    r = _build(fake_project, until="c")
    assert fake_project.calls() == ["a", "b", "c"]
    # After the rebuild explain still says why it ran.
    text = "\n".join(explain(spec, cache, "a", fake_project.table()))
    assert "nothing changed since the last build" in text and "config.model.path.sha256" in text
    assert r.error is None


def test_same_upstream_bytes_keep_downstream_cached(fake_project):
    # `format` changes a's key, but a's output does not depend on it: b must stay cached because
    # keys use the content of inputs, not upstream keys.
    _build(fake_project, until="c")
    fake_project.reset_calls()
    fake_project.write_spec(model={"path": "net.tflite", "format": "tflite"})
    r = _build(fake_project, until="c")
    assert fake_project.calls() == ["a"]
    assert _states(r) == {"a": "ran", "b": "cached", "c": "cached"}


def test_moved_checkout_hits_the_cache(fake_project, tmp_path):
    _build(fake_project, until="c")
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "net.tflite").write_bytes((fake_project.root / "net.tflite").read_bytes())
    (moved / "tinytrain.yaml").write_text(fake_project.spec_path.read_text())
    fake_project.reset_calls()
    spec = load_spec(moved / "tinytrain.yaml")
    r = build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    assert fake_project.calls() == [] and r.error is None


def test_editing_a_stage_source_invalidates_it(fake_project):
    _build(fake_project, until="c")
    fake_project.reset_calls()
    with open(fake_project.module_file("b"), "a") as f:
        f.write("# a harmless edit\n")
    spec = load_spec(fake_project.spec_path)
    item = {i.stage.name: i for i in plan(spec, open_cache(spec), fake_project.table())}["b"]
    assert item.reason == f"source changed ({fake_project.module('b')})"
    r = _build(fake_project, until="c")
    assert fake_project.calls() == ["b"]  # c's input bytes are unchanged
    assert _states(r)["b"] == "ran"


def test_failing_stage_leaves_no_cache_entry_and_no_artifact_folder(fake_project):
    _build(fake_project, until="b")  # a good b first: its folder must not survive a failed rerun
    fake_project.reset_calls()
    r = _build(fake_project, b="boom", until="c")
    assert fake_project.calls() == ["boom"]
    assert r.exit_code == 1 and "stage b failed: RuntimeError: boom" in str(r.error)
    assert _states(r) == {"a": "cached", "b": "failed"}
    assert not (fake_project.out / "b").exists()
    assert not (fake_project.out / "c").exists()
    assert _entries_by_stage(_cache_root()).get("b", 0) == 1  # only the good b of the first build
    # Nothing of the failure is remembered: the next build runs it again.
    fake_project.reset_calls()
    _build(fake_project, b="boom", until="c")
    assert fake_project.calls() == ["boom"]


def test_user_error_raised_by_a_stage_exits_2(fake_project):
    r = _build(fake_project, b="usererr", until="b")
    assert isinstance(r.error, UserError) and r.exit_code == 2
    assert "the data is wrong" in str(r.error)
    assert "b" not in _entries_by_stage(_cache_root())


def test_a_full_disk_while_a_stage_writes_is_one_line_naming_the_folder_and_exits_2(fake_project):
    r = _build(fake_project, b="diskfull", until="b")
    assert isinstance(r.error, UserError) and r.exit_code == 2
    first = str(r.error).splitlines()[0]
    assert first.startswith("no space left on the device of ") and "(stage b, writing its outputs)" in first
    assert "OSError" not in first and "Errno" not in first
    assert "b" not in _entries_by_stage(_cache_root())
    assert not (fake_project.out / "b").exists()


def test_stage_killed_mid_run_leaves_no_entry_and_the_next_build_recovers(fake_project):
    fake_project.write_spec(quantize={"num_samples": 60})  # the sleeper sleeps this many seconds
    proc = subprocess.Popen([sys.executable, str(fake_project.driver("sleeper")), "build",
                             str(fake_project.spec_path), "--until", "b"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not fake_project.marker.exists():
            assert proc.poll() is None, "the build ended before the stage started"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _entries_by_stage(_cache_root()) == {"a": 1}
    assert not (fake_project.out / "b").exists()
    assert (fake_project.out / "a" / "a.txt").exists()
    fake_project.reset_calls()
    r = _build(fake_project, until="b")
    assert _states(r) == {"a": "cached", "b": "ran"} and r.error is None


def test_two_concurrent_builds_of_one_spec_both_succeed(fake_project):
    fake_project.write_spec(quantize={"num_samples": 1})  # the sleeper holds the stage for 1 s
    cmd = [sys.executable, str(fake_project.driver("sleeper")), "build", str(fake_project.spec_path),
           "--until", "c", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert json.loads(out)["ok"] is True
    # The second build waited for the first and restored everything from the cache.
    assert sorted(fake_project.calls()) == ["a", "c", "sleeper"]
    assert json.loads((fake_project.out / "c" / "c.json").read_text())["b"].endswith("1")


def test_corrupt_blob_is_rebuilt(fake_project):
    _build(fake_project, until="a")
    for blob in _cache_root().glob("cas/*/*"):
        blob.write_bytes(b"rot")
    fake_project.reset_calls()
    r = _build(fake_project, until="a")
    assert fake_project.calls() == ["a"] and r.error is None


def test_until_only_force_and_dry_run(fake_project):
    r = _build(fake_project, until="a")
    assert fake_project.calls() == ["a"] and list(_states(r)) == ["a"]

    fake_project.reset_calls()
    r = _build(fake_project, dry_run=True)
    assert fake_project.calls() == [] and not (fake_project.out / "b").exists()
    assert _states(r) == {"a": "cached", "b": "will run", "c": "will run", "d": "not implemented"}

    r = _build(fake_project, only="b")
    assert fake_project.calls() == ["b"] and _states(r) == {"b": "ran"}

    fake_project.reset_calls()
    r = _build(fake_project, until="b", force=["b"])
    assert fake_project.calls() == ["b"] and _states(r) == {"a": "cached", "b": "ran"}


def test_only_needs_cached_inputs(fake_project):
    r = _build(fake_project, only="c")
    assert r.exit_code == 2 and "--only c needs the artifacts of a" in str(r.error)
    assert fake_project.calls() == []


@pytest.mark.parametrize("kw, message", [
    ({"until": "bb"}, "unknown stage 'bb'"),
    ({"force": ["zz"]}, "unknown stage 'zz'"),
    ({"until": "a", "force": ["c"]}, "--force c: that stage is not part of this build"),
    ({"until": "a", "only": "b"}, "cannot be combined"),
])
def test_bad_stage_selection_is_a_user_error(fake_project, kw, message):
    with pytest.raises(UserError, match=message):
        _build(fake_project, **kw)


def test_result_json_is_plain_json(fake_project):
    r = _build(fake_project, until="b")
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["ok"] is True and doc["ran"] == ["a", "b"] and doc["cached"] == []
    assert doc["stages"][0]["metrics"] == {"bytes": 17} and doc["stages"][0]["summary"] == "17 bytes"
    assert doc["cache"]["misses"] == 2


def test_build_record_counts_this_build_without_walking_the_store(fake_project, monkeypatch):
    """build.json's cache part is this build's counters: what it stored (entries, their outputs' bytes) and
    restored (hits), not a walk of the whole store (that is `tinytrain cache stats`)."""
    from tinytrain.cache import store

    def no_walk(folder):
        raise AssertionError(f"a build walked {folder}")
    monkeypatch.setattr(store, "_count_files", no_walk)
    first = _build(fake_project, until="b").to_json()["cache"]
    stored = sum(p.stat().st_size for stage in ("a", "b") for p in (fake_project.out / stage).rglob("*")
                 if p.is_file() and p.name != "manifest.json")
    assert (first["hits"], first["misses"], first["stored"], first["stored_bytes"]) == (0, 2, 2, stored)
    again = _build(fake_project, until="b").to_json()["cache"]
    assert (again["hits"], again["misses"], again["stored"], again["stored_bytes"]) == (2, 0, 0, 0)


def test_cache_dir_precedence(fake_project, tmp_path, monkeypatch):
    spec = load_spec(fake_project.spec_path)
    assert Path(open_cache(spec).root) == _cache_root()
    fake_project.write_spec(build={"out_dir": "out", "cache_dir": "spec-cache"})
    spec = load_spec(fake_project.spec_path)
    assert Path(open_cache(spec).root) == fake_project.root / "spec-cache"
    assert Path(open_cache(spec, tmp_path / "cli").root) == tmp_path / "cli"
    assert isinstance(Cache(tmp_path / "x"), Cache)


def test_editing_a_c_kernel_changes_the_cross_compile_implementation_version(tmp_path, monkeypatch):
    """The C sources a stage compiles are part of its implementation version, like its Python modules."""
    import tinytrain
    from tinytrain.pipeline import preimage
    from tinytrain.pipeline.stage_graph import stage

    fake_pkg = tmp_path / "pkg"
    (fake_pkg / "kernels_c" / "boards").mkdir(parents=True)
    kernel = fake_pkg / "kernels_c" / "tt_conv.c"
    kernel.write_text("int f(void) { return 1; }\n")
    (fake_pkg / "__init__.py").write_text("")
    monkeypatch.setattr(tinytrain, "__file__", str(fake_pkg / "__init__.py"))

    before = preimage.impl_digests(stage("cross-compile"))
    kernel.write_text("int f(void) { return 2; }\n")
    after = preimage.impl_digests(stage("cross-compile"))
    assert before["files:kernels_c/*.c"] != after["files:kernels_c/*.c"]
    assert {k: v for k, v in before.items() if k != "files:kernels_c/*.c"} == \
           {k: v for k, v in after.items() if k != "files:kernels_c/*.c"}


def test_a_later_stage_gets_its_head_start_while_the_first_ones_run(fake_project):
    """A stage module's `prewarm(config, unit_cache_dir)` (cross-compile: the kernel library's objects) starts when the
    first stage runs and stops when its own turn comes, before it runs; a build that runs nothing starts none."""
    hook = (
        "\n\nclass _Started:\n"
        "    def stop(self):\n"
        "        with open(CALLS, 'a') as f:\n"
        "            f.write('stop-c\\n')\n\n"
        "def prewarm(config, unit_cache_dir):\n"
        "    with open(CALLS, 'a') as f:\n"
        "        f.write(f'prewarm-c:{config[\"train.learning_rate\"]}:{unit_cache_dir.name}\\n')\n"
        "    return _Started()\n")
    with open(fake_project.module_file("c"), "a") as f:
        f.write(hook)
    _build(fake_project)
    assert fake_project.calls() == ["prewarm-c:0.01:c", "a", "b", "stop-c", "c"]
    fake_project.reset_calls()
    _build(fake_project)                      # everything cached
    assert fake_project.calls() == []
