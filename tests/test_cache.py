"""The local cache (DESIGN §4): keys, store/lookup/materialise, crash safety, concurrency, gc."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from tinytrain.cache import store as store_mod
from tinytrain.cache.keys import (
    KEY_SCHEMA_VERSION,
    MISSING,
    action_key,
    diff_preimages,
    implementation_digests,
    module_source_digest,
    sha256_bytes,
    sha256_file,
    tool_identity,
    tree_digest,
)
from tinytrain.cache.store import ActionEntry, Cache, CacheError, DiskFullError

FILES = {"graph.json": b'{"ops":[]}', "tensors.npz": b"\x00" * 300, "sub/graph.txt": b"conv2d x -> y\n"}


def preimage(**changes) -> dict:
    base = {
        "schema": KEY_SCHEMA_VERSION,
        "stage": "load",
        "impl": "a" * 64,
        "config": {"model": {"path": "m.tflite", "input_shape": [1, 8, 8, 3], "scale": 1.0}},
        "inputs": {"model.path": "b" * 64},
        "tools": {"cc": "absent"},
        "salt": "",
    }
    base.update(changes)
    return base


def make_out(folder: Path, files: dict[str, bytes] = FILES) -> Path:
    for name, data in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return folder


def read_tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


@pytest.fixture
def stored(cache, tmp_path) -> tuple[Cache, str, ActionEntry]:
    pre = preimage()
    key = action_key(pre)
    entry = cache.store(key, pre, make_out(tmp_path / "out"), "3 ops", {"ops": 3}, 0.25)
    return cache, key, entry


def blob_of(cache: Cache, entry: ActionEntry, name: str) -> Path:
    return cache.blob_path(next(o.digest for o in entry.outputs if o.name == name))


# ---------------------------------------------------------------------------- keys


def test_same_preimage_same_key_regardless_of_order_and_container():
    a = preimage()
    b = dict(reversed(list(preimage().items())))
    b["config"] = {"model": {"scale": 1.0, "input_shape": (1, 8, 8, 3), "path": "m.tflite"}}
    assert action_key(a) == action_key(b)
    assert len(action_key(a)) == 64


@pytest.mark.parametrize("change", [
    {"schema": KEY_SCHEMA_VERSION + 1},
    {"stage": "quantize"},
    {"impl": "c" * 64},
    {"config": {"model": {"path": "m.tflite", "input_shape": [1, 8, 8, 3], "scale": 2.0}}},
    {"config": {"model": {"path": "m.tflite", "input_shape": [1, 8, 8, 3], "scale": 1}}},  # int != float
    {"config": {"model": {"path": "m.tflite", "input_shape": [1, 8, 8, 3], "scale": 1.0, "new": None}}},
    {"inputs": {"model.path": "d" * 64}},
    {"tools": {"cc": "gcc 12"}},
    {"salt": "x"},
])
def test_any_field_change_gives_a_new_key(change):
    assert action_key(preimage(**change)) != action_key(preimage())


def test_diff_preimages_names_each_changed_field():
    old = preimage()
    new = preimage(inputs={"model.path": "d" * 64}, salt="x", extra=[1])
    new["config"] = {"model": {"path": "m.tflite", "input_shape": [1, 8, 8, 4], "scale": 1}}
    assert diff_preimages(old, new) == [
        ("config.model.input_shape[3]", 3, 4),
        ("config.model.scale", 1.0, 1),
        ("extra", MISSING, [1]),
        ("inputs.model.path", "b" * 64, "d" * 64),
        ("salt", "", "x"),
    ]
    assert diff_preimages(old, old) == []
    # A tuple in a fresh preimage equals the list the stored one holds: no spurious difference.
    assert diff_preimages({"s": [1, 2]}, {"s": (1, 2)}) == []
    assert diff_preimages({"s": [1, 2]}, {"s": [1, 2, 3]}) == [("s", [1, 2], [1, 2, 3])]
    assert diff_preimages(None, {"a": 1}) == [("a", MISSING, 1)]
    assert json.dumps(diff_preimages({}, {"a": 1})) == '[["a", "<absent>", 1]]'


def test_module_source_digest_follows_the_source_text(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = tmp_path / "tt_probe_stage_mod.py"
    mod.write_text("def run(ctx):\n    return 1\n")
    first = module_source_digest(["tt_probe_stage_mod", "json"])
    assert module_source_digest(["json", "tt_probe_stage_mod"]) == first
    mod.write_text("def run(ctx):\n    return 2\n")
    assert module_source_digest(["tt_probe_stage_mod", "json"]) != first
    absent = module_source_digest(["tt_no_such_module_xyz"])
    assert absent == module_source_digest(["tt_no_such_module_xyz"])
    assert absent != module_source_digest([])


def test_implementation_digests_follow_the_module_and_its_tinytrain_imports(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = tmp_path / "tt_probe_impl_mod.py"
    mod.write_text("import json\nfrom tinytrain.stages.model.geometry import out_size_and_pad\n")
    digests = implementation_digests("tt_probe_impl_mod")
    # json is another package's (versioned by the environment); the tinytrain modules are followed.
    # The package __init__ re-exports the error classes, so pipeline.errors belongs to every closure.
    assert set(digests) == {"tt_probe_impl_mod", "tinytrain", "tinytrain.stages", "tinytrain.stages.model",
                            "tinytrain.stages.model.geometry",
                            "tinytrain.pipeline", "tinytrain.pipeline.errors"}
    assert digests["tt_probe_impl_mod"] == module_source_digest(["tt_probe_impl_mod"])
    mod.write_text(mod.read_text() + "# edited\n")
    again = implementation_digests("tt_probe_impl_mod")
    assert again["tt_probe_impl_mod"] != digests["tt_probe_impl_mod"]
    assert {k: v for k, v in again.items() if k != "tt_probe_impl_mod"} == \
           {k: v for k, v in digests.items() if k != "tt_probe_impl_mod"}
    # A module that cannot be found hashes as absent, inside the package or outside it.
    for name in ("tinytrain.stages.no_such_stage_xyz", "tt_no_such_module_xyz"):
        assert implementation_digests(name) == {name: module_source_digest([name])}


def test_tree_digest_depends_on_names_and_bytes_only(tmp_path):
    a = make_out(tmp_path / "a")
    b = make_out(tmp_path / "b")
    os.utime(b / "graph.json", (1, 1))
    assert tree_digest(a) == tree_digest(b)
    (b / "graph.json").rename(b / "graph2.json")
    assert tree_digest(a) != tree_digest(b)


def test_file_and_bytes_digests_agree(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc" * 1000)
    assert sha256_file(p) == sha256_bytes(b"abc" * 1000)


def test_tool_identity():
    assert tool_identity(["tt-no-such-tool-xyz", "--version"]) == "absent"
    assert tool_identity([sys.executable, "--version"]).startswith("Python 3.")


def test_default_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYTRAIN_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Cache.default_root() == tmp_path / "env"
    monkeypatch.delenv("TINYTRAIN_CACHE_DIR")
    assert Cache.default_root() == tmp_path / "xdg" / "tinytrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Cache.default_root() == tmp_path / "home" / ".cache" / "tinytrain"


# ---------------------------------------------------------------------------- store / lookup


def test_miss_then_hit(cache, tmp_path):
    pre = preimage()
    key = action_key(pre)
    assert cache.lookup(key) is None
    assert cache.last_drop_reason is None
    stored = cache.store(key, pre, make_out(tmp_path / "out"), "3 ops", {"ops": 3}, 0.25)
    got = Cache(cache.root).lookup(key)  # a fresh instance: nothing held in memory
    assert got == stored
    assert {o.name for o in got.outputs} == set(FILES)
    assert got.preimage == pre and got.summary == "3 ops" and got.metrics == {"ops": 3}
    assert cache.lookup(action_key(preimage(salt="other"))) is None


def test_corrupt_blob_is_detected_dropped_and_rebuilt(stored, tmp_path):
    cache, key, entry = stored
    blob = blob_of(cache, entry, "tensors.npz")
    data = bytearray(blob.read_bytes())
    data[100] ^= 1  # same size: only the digest can tell
    blob.write_bytes(bytes(data))
    assert cache.lookup(key) is None
    assert "corrupt" in cache.last_drop_reason and "tensors.npz" in cache.last_drop_reason
    assert not cache.entry_path(key).exists()
    assert not blob.exists()
    # The caller reruns the stage and stores again: the blob is good and it hits.
    cache.store(key, preimage(), make_out(tmp_path / "out2"), "3 ops", {}, 0.1)
    assert cache.lookup(key) is not None


def test_missing_blob_is_a_miss(stored):
    cache, key, entry = stored
    blob_of(cache, entry, "graph.json").unlink()
    assert cache.lookup(key) is None
    assert "missing" in cache.last_drop_reason


def test_truncated_action_entry_is_a_miss(stored):
    cache, key, _ = stored
    path = cache.entry_path(key)
    path.write_bytes(path.read_bytes()[:40])
    assert cache.lookup(key) is None
    assert "unparsable" in cache.last_drop_reason
    assert not path.exists()


@pytest.mark.parametrize("bad_name", ["../escape", "/abs", "a/../../b", "manifest.json", ""])
def test_entry_with_unsafe_output_name_is_rejected(stored, bad_name):
    cache, key, _ = stored
    path = cache.entry_path(key)
    doc = json.loads(path.read_bytes())
    doc["outputs"][0]["name"] = bad_name
    path.write_text(json.dumps(doc))
    assert cache.lookup(key) is None
    assert "unsafe output name" in cache.last_drop_reason


def test_store_refuses_reserved_names_and_symlinks(cache, tmp_path):
    out = make_out(tmp_path / "out", {"manifest.json": b"{}"})
    with pytest.raises(ValueError, match="reserved"):
        cache.store("e" * 64, {}, out, "", {}, 0)
    out2 = make_out(tmp_path / "out2")
    (out2 / "link").symlink_to(out2 / "graph.json")
    with pytest.raises(ValueError, match="regular files"):
        cache.store("e" * 64, {}, out2, "", {}, 0)
    with pytest.raises(NotADirectoryError):  # not an empty artifact set
        cache.store("e" * 64, {}, tmp_path / "never-written", "", {}, 0)
    assert cache.lookup("e" * 64) is None


def test_store_accepts_numpy_metrics(cache, tmp_path):
    import numpy as np

    entry = cache.store("f" * 64, preimage(), make_out(tmp_path / "out"), "s",
                        {"params": np.int64(7), "w": np.arange(2), "loss": float("nan")}, 0.1)
    got = cache.lookup("f" * 64)
    assert got.metrics["params"] == 7 and got.metrics["w"] == [0, 1]
    assert entry.key == got.key


# ---------------------------------------------------------------------------- crash safety

_KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from tinytrain.cache import store as store_mod
    root, out, key, mode = sys.argv[1:5]
    cache = store_mod.Cache(Path(root))
    if mode == "after-first-blob":
        cache._after_blob_written = lambda name: os._exit(9)
    else:  # die with the entry's temp file written but not yet renamed into place
        real_replace = os.replace
        def replace(src, dst):
            if str(dst).endswith(".json"):
                os._exit(9)
            real_replace(src, dst)
        store_mod.os.replace = replace
    cache.store(key, {"k": 1}, Path(out), "s", {}, 0.0)
    sys.exit(0)  # not reached: the store must have been killed
""")


@pytest.mark.parametrize("mode", ["after-first-blob", "before-entry-rename"])
def test_process_killed_during_store_leaves_no_entry(cache, tmp_path, mode):
    out = make_out(tmp_path / "out")
    key = action_key({"k": 1})
    proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(cache.root), str(out), key, mode],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 9, proc.stderr
    assert list(cache.cas_dir.glob("*/*")), "the killed store wrote at least one blob"
    assert not cache.entry_path(key).exists()
    assert cache.lookup(key) is None
    leftovers = list(cache.root.rglob(".tmp-*"))
    assert (mode == "before-entry-rename") == bool(leftovers)
    report = cache.gc()
    assert report["blobs_removed"] >= 1 and report["temp_files_removed"] == len(leftovers)
    assert not list(cache.root.rglob(".tmp-*")) and cache.stats()["blobs"] == 0
    # The lock died with the process: the next build stores normally.
    cache.store(key, {"k": 1}, out, "s", {}, 0.0)
    assert cache.lookup(key) is not None


def test_temp_files_are_invisible_to_lookup_and_stats(stored):
    cache, key, _ = stored
    before = cache.stats()
    (cache.cas_dir / ".tmp-deadbeef").write_bytes(b"partial")
    (cache.entry_path(key).parent / ".tmp-cafe").write_bytes(b"{")
    assert cache.lookup(key) is not None
    assert cache.stats() == before


# ---------------------------------------------------------------------------- materialise


def test_materialize_makes_dest_exactly_the_outputs_plus_manifest(stored, tmp_path):
    cache, key, entry = stored
    dest = tmp_path / "build" / "spec" / "load"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("from an older build")
    paths = cache.materialize(entry, dest)
    assert set(paths) == set(FILES) and all(paths[n].read_bytes() == FILES[n] for n in FILES)
    tree = read_tree(dest)
    assert set(tree) == set(FILES) | {"manifest.json"}
    manifest = json.loads(tree["manifest.json"])
    assert manifest["key"] == key and manifest["summary"] == "3 ops"
    assert {o["name"]: o["digest"] for o in manifest["outputs"]} == {
        n: sha256_bytes(d) for n, d in FILES.items()}
    cache.materialize(entry, dest)  # again, over itself
    assert os.listdir(dest.parent) == ["load"], "no temp or old folders left beside dest"


def test_materialize_of_a_vanished_blob_fails_cleanly(stored, tmp_path):
    cache, key, entry = stored
    dest = tmp_path / "build" / "load"
    cache.materialize(entry, dest)
    blob_of(cache, entry, "sub/graph.txt").unlink()
    with pytest.raises(CacheError):
        cache.materialize(entry, dest)
    assert os.listdir(dest.parent) == ["load"]
    assert read_tree(dest)["sub/graph.txt"] == FILES["sub/graph.txt"], "old folder kept intact"
    assert not cache.entry_path(key).exists()


# ---------------------------------------------------------------------------- concurrency


def _build_worker(root: str, out: str, dest: str, key: str, rounds: int, barrier) -> None:
    cache = Cache(Path(root))
    barrier.wait(timeout=10)
    for i in range(rounds):
        entry = cache.lookup(key)
        if entry is None or i % 3 == 0:  # keep re-storing so stores race with materialises
            entry = cache.store(key, {"k": key}, Path(out), "s", {}, 0.0)
        cache.materialize(entry, Path(dest))


def _reader_worker(dest: str, stop, bad, complete) -> None:
    """Reads dest the way a person or a later stage does: manifest, then each file it lists.
    A file that vanished is the old folder being deleted after a swap (retry); bytes that do not
    match the manifest would be a half-written folder."""
    while not stop.is_set():
        try:
            manifest = json.loads(Path(dest, "manifest.json").read_bytes())
            for out in manifest["outputs"]:
                if sha256_file(Path(dest, out["name"])) != out["digest"]:
                    bad.value += 1
        except (FileNotFoundError, NotADirectoryError):
            continue
        except ValueError:
            bad.value += 1
            continue
        complete.value += 1


def test_two_builds_at_once_both_succeed_and_verify(cache, tmp_path):
    ctx = multiprocessing.get_context("fork")
    key = action_key({"k": "same"})
    dest = tmp_path / "build" / "load"
    barrier = ctx.Barrier(2)
    stop, bad, complete = ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 0)
    outs = [make_out(tmp_path / f"out{i}") for i in range(2)]
    builders = [ctx.Process(target=_build_worker, args=(str(cache.root), str(o), str(dest), key, 15, barrier))
                for o in outs]
    reader = ctx.Process(target=_reader_worker, args=(str(dest), stop, bad, complete))
    reader.start()
    for p in builders:
        p.start()
    for p in builders:
        p.join(timeout=20)
    stop.set()
    reader.join(timeout=5)
    assert [p.exitcode for p in builders] == [0, 0]
    assert bad.value == 0, "a reader saw a half-written folder"
    assert complete.value > 0, "the reader never got to read the folder"
    entry = cache.lookup(key)
    assert entry is not None and cache.stats()["entries"] == 1
    assert {n: d for n, d in read_tree(dest).items() if n != "manifest.json"} == FILES
    assert os.listdir(dest.parent) == ["load"]


def test_lock_is_reentrant_and_exclusive_across_processes(cache):
    with cache.lock(), cache.lock():
        proc = subprocess.run(
            [sys.executable, "-c",
             "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR)\n"
             "try: fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)\n"
             "except BlockingIOError: sys.exit(3)",
             str(cache.root / "lock")], timeout=30)
        assert proc.returncode == 3
    with cache.lock():
        pass


# ---------------------------------------------------------------------------- explain / stats / gc


def test_record_and_read_last_preimage(cache):
    assert cache.last_preimage("spec/load") is None
    cache.record_last("spec/load", preimage())
    cache.record_last("other/load", preimage(salt="x"))
    assert cache.last_preimage("spec/load") == preimage()
    assert cache.last_preimage("other/load")["salt"] == "x"


def test_stats_counts_hits_misses_entries_blobs_and_size(stored, tmp_path):
    cache, key, entry = stored
    cache.begin_build()
    cache.note_hit(key)
    cache.note_hit(key)
    cache.note_miss("0" * 64)
    s = Cache(cache.root).stats()
    assert (s["hits"], s["misses"], s["entries"], s["blobs"]) == (2, 1, 1, 3)
    assert s["size_bytes"] == sum(len(d) for d in FILES.values()) + cache.entry_path(key).stat().st_size
    # Identical content stored under another key shares the blobs.
    cache.store("1" * 64, {}, make_out(tmp_path / "again"), "s", {}, 0)
    assert (cache.stats()["entries"], cache.stats()["blobs"]) == (2, 3)
    cache.begin_build()
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (0, 0)


def test_entries_are_fsynced_the_build_counters_and_reports_are_not(cache, tmp_path, monkeypatch):
    """What the cache keeps survives a power cut (fsync); the counters of one build and the files every build
    writes again (report, build.json: durable=False) are only atomic, without a disk flush per write."""
    from tinytrain.cache.fs_ops import atomic_write_bytes
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    cache.begin_build()
    cache.note_hit("0" * 64)
    cache.note_miss("1" * 64)
    atomic_write_bytes(tmp_path / "report.md", b"new", durable=False)
    assert synced == [] and (tmp_path / "report.md").read_bytes() == b"new"
    assert (cache.build_summary()["hits"], cache.build_summary()["misses"]) == (1, 1)
    cache.store("2" * 64, {}, make_out(tmp_path / "out"), "s", {}, 0)
    assert len(synced) >= len(FILES) + 1     # every blob and the entry (and their folders)
    assert (cache.build_summary()["stored"], cache.build_summary()["stored_bytes"]) == \
        (1, sum(len(d) for d in FILES.values()))


def _store_at(cache: Cache, tmp_path: Path, monkeypatch, key: str, files: dict, when: float) -> ActionEntry:
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(time=lambda: when))
    entry = cache.store(key, {"k": key}, make_out(tmp_path / key[:4], files), "s", {}, 0)
    os.utime(cache.entry_path(key), (when, when))
    return entry


def test_gc_by_age_keeps_recently_used_entries(cache, tmp_path, monkeypatch):
    now = 1_000_000.0
    _store_at(cache, tmp_path, monkeypatch, "a" * 64, {"x": b"old"}, now - 3600)
    _store_at(cache, tmp_path, monkeypatch, "b" * 64, {"x": b"used"}, now - 3600)
    _store_at(cache, tmp_path, monkeypatch, "c" * 64, {"x": b"new"}, now - 10)
    monkeypatch.undo()
    assert cache.lookup("b" * 64) is not None  # a hit refreshes last access
    report = cache.gc(max_age_s=600)  # real clock is far past `now`: only the touched one survives
    assert report["entries_removed"] == 2 and report["blobs_removed"] == 2
    assert cache.lookup("b" * 64) is not None
    assert cache.lookup("a" * 64) is None and cache.lookup("c" * 64) is None
    assert cache.stats()["blobs"] == 1


def test_gc_by_size_drops_least_recently_used_first(cache, tmp_path, monkeypatch):
    shared = b"s" * 1000
    _store_at(cache, tmp_path, monkeypatch, "a" * 64, {"x": b"1" * 4000, "s": shared}, 100.0)
    _store_at(cache, tmp_path, monkeypatch, "b" * 64, {"x": b"2" * 4000, "s": shared}, 200.0)
    _store_at(cache, tmp_path, monkeypatch, "c" * 64, {"x": b"3" * 4000}, 300.0)
    monkeypatch.undo()
    total = cache.stats()["size_bytes"]
    report = cache.gc(max_size=total - 1)
    assert report["entries_removed"] == 1 and report["blobs_removed"] == 1  # the shared blob stays
    assert [cache.lookup(k * 64) is not None for k in "abc"] == [False, True, True]
    assert cache.stats()["size_bytes"] <= total - 4000
    cache.gc(max_size=0)
    assert cache.stats() | {"root": ""} == {"root": "", "size_bytes": 0, "entries": 0, "blobs": 0,
                                            "unit_files": 0, "hits": 0, "misses": 0}


def test_gc_removes_unreadable_entries_and_orphan_blobs(stored):
    cache, key, _ = stored
    orphan = cache.blob_path("9" * 64)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"orphan")
    junk = cache.entry_path("8" * 64)
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_text("{not json")
    report = cache.gc()
    assert report["entries_removed"] == 1 and report["blobs_removed"] == 1
    assert not orphan.exists() and not junk.exists()
    assert cache.lookup(key) is not None


def test_clear(stored):
    cache, key, _ = stored
    cache.record_last("s/load", {})
    cache.clear()
    assert cache.lookup(key) is None and cache.last_preimage("s/load") is None
    assert cache.stats()["entries"] == 0 and cache.stats()["blobs"] == 0


def test_an_interrupted_store_leaves_no_entry_and_no_temp_file(cache, tmp_path, monkeypatch):
    # Failures are never stored (the caller's rule), and a store that itself fails half-way
    # (disk full, unreadable output) must not leave an entry or a temp file either.
    real_copy = store_mod.copy_hashing
    calls = []

    def copy_then_fail(src, dst, *, fsync):
        calls.append(src)
        if len(calls) == 2:
            Path(dst).write_bytes(b"half")
            raise OSError(28, "No space left on device")
        return real_copy(src, dst, fsync=fsync)

    monkeypatch.setattr(store_mod, "copy_hashing", copy_then_fail)
    with pytest.raises(DiskFullError) as err:
        cache.store("d" * 64, {"stage": "codegen"}, make_out(tmp_path / "out"), "s", {}, 0)
    # One line that names the full folder and what was being done.
    assert str(err.value).splitlines()[0] == (f"no space left on the device of {cache.root} "
                                              f"(the cache, storing the results of codegen)")
    assert cache.lookup("d" * 64) is None
    assert not list(cache.root.rglob(".tmp-*"))


def test_gc_expires_old_unit_memos_and_clear_removes_them(tmp_path):
    import os
    import time as _time

    from tinytrain.cache.store import Cache

    cache = Cache(tmp_path / "c")
    old = cache.root / "units" / "sparse-plan" / "contribution" / "ab" / "ab12.json"
    new = old.with_name("ab34.json")
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    new.write_text("{}")
    os.utime(old, (_time.time() - 3600, _time.time() - 3600))
    assert cache.gc(max_age_s=60)["units_removed"] == 1
    assert not old.exists() and new.exists()
    cache.clear()
    assert not (cache.root / "units").exists()


def test_gc_spares_a_unit_writers_temp_file_in_flight(cache):
    """The sub-stage caches write units/ without the store's lock: a gc during a build must not delete the temp
    file a unit writer is about to rename (UnitCache.put, ObjectCache.store), only one old enough to be a dead
    writer's. Temp files of the locked folders go whatever their age."""
    from tinytrain.cache.fs_ops import new_tmp

    folder = cache.units_dir / "sparse-plan" / "contribution" / "ab"
    folder.mkdir(parents=True)
    in_flight = new_tmp(folder)
    in_flight.write_bytes(b"{}")
    dead = new_tmp(folder)
    dead.write_bytes(b"{")
    old = time.time() - store_mod.UNIT_TMP_MIN_AGE_S - 1
    os.utime(dead, (old, old))
    cas_tmp = new_tmp(cache.cas_dir)
    cas_tmp.parent.mkdir(parents=True, exist_ok=True)
    cas_tmp.write_bytes(b"x")
    report = cache.gc()
    assert report["temp_files_removed"] == 2 and not dead.exists() and not cas_tmp.exists()
    in_flight.replace(folder / "ab12.json")          # the writer finishes: its memo is in place
    assert (folder / "ab12.json").read_bytes() == b"{}" and cache.stats()["unit_files"] == 1


def test_a_unit_memo_read_counts_as_a_use_for_gc(tmp_path):
    """UnitCache.get refreshes the memo's mtime: gc drops memos by last use (age, least recently used first), not
    by when they were written."""
    from tinytrain.stages.planning.contribution_cache import UnitCache

    cache = Cache(tmp_path / "c")
    memos = UnitCache(cache.units_dir / "sparse-plan" / "contribution")
    read, unread = "ab" + "1" * 62, "cd" + "2" * 62
    old = time.time() - 7200
    for key in (read, unread):
        memos.put(key, {"accuracy": 0.5})
        os.utime(memos._path(key), (old, old))
    assert memos.get(read) == {"accuracy": 0.5}
    assert memos._path(read).stat().st_mtime > old + 3600
    assert cache.gc(max_age_s=3600)["units_removed"] == 1
    assert memos.get(read) == {"accuracy": 0.5} and memos.get(unread) is None


def _object_unit(cache: Cache, key: str, size: int, when: float) -> tuple[Path, Path]:
    """An ObjectCache entry (cross-compile's compiled kernel object and its header list) in the cache's units."""
    from tinytrain.stages.cross_compile import ObjectCache

    obj, meta = ObjectCache(cache.units_dir / "cross-compile" / "objects")._paths(key)
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(b"o" * size)
    meta.write_text('{"headers": []}')
    for p in (obj, meta):
        os.utime(p, (when, when))
    return obj, meta


def test_gc_counts_compiled_objects_and_drops_them_by_age_and_size(stored):
    """cross-compile's objects in the unit cache are part of the cache's size and go by gc's rules (age, then least
    recently used), the object and its header list together."""
    cache, key, _ = stored
    now = time.time()
    old = _object_unit(cache, "ab" + "1" * 62, 5000, now - 7200)
    lru = _object_unit(cache, "cd" + "2" * 62, 3000, now - 600)
    fresh = _object_unit(cache, "ef" + "3" * 62, 3000, now - 10)
    before = cache.stats()
    units_bytes = sum(p.stat().st_size for p in (*old, *lru, *fresh))
    assert before["unit_files"] == 6
    entry_bytes = sum(len(d) for d in FILES.values()) + cache.entry_path(key).stat().st_size
    assert before["size_bytes"] == entry_bytes + units_bytes
    old_bytes = sum(p.stat().st_size for p in old)
    report = cache.gc(max_age_s=3600)
    assert (report["units_removed"], report["entries_removed"], report["bytes_freed"]) == (2, 0, old_bytes)
    assert not any(p.exists() for p in old) and all(p.exists() for p in (*lru, *fresh))
    # Over the size limit: the least recently used unit goes first (before the more recent entry and object).
    cache.lookup(key)                                   # the entry: used now
    report = cache.gc(max_size=cache.stats()["size_bytes"] - 1)
    assert report["units_removed"] == 2 and report["entries_removed"] == 0
    assert not any(p.exists() for p in lru) and all(p.exists() for p in fresh) and cache.lookup(key) is not None
    cache.gc(max_size=0)
    assert not [p for p in cache.units_dir.rglob("*") if p.is_file()] and cache.stats()["size_bytes"] == 0


def test_library_versions_follow_the_third_party_imports_of_the_stage_code(tmp_path, monkeypatch):
    from tinytrain.cache import keys
    from tinytrain.pipeline.preimage import change_reason
    from tinytrain.pipeline.stage_graph import stage

    reorder = keys.library_versions(stage("reorder").impl)
    # reorder draws its memory picture with matplotlib and computes with numpy; the PIL of the data loaders
    # is not in its code.
    assert {"python", "numpy", "matplotlib"} <= set(reorder) and "pillow" not in reorder
    # A library known under another import name (PIL, sklearn) is keyed by its distribution.
    assert "pillow" in keys.library_versions(stage("quantize").impl)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tt_probe_libs.py").write_text("import json, os\nfrom collections import Counter\n")
    assert set(keys.library_versions("tt_probe_libs")) == {"python"}

    # A new matplotlib changes reorder's key, and explain says why.
    old = {"libraries": reorder}
    real = keys._dist_version
    monkeypatch.setattr(keys, "_dist_version", lambda d: "99.0" if d == "matplotlib" else real(d))
    new = {"libraries": keys.library_versions(stage("reorder").impl)}
    assert new != old
    assert change_reason(diff_preimages(old, new)) == "library changed (matplotlib)"
