"""A local cache that someone else could write (issue 16): symlinks and special files are never
followed or trusted, restoring is total or nothing, a read-only or misplaced cache folder is one
clear line, and spec paths to special files are refused without reading them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinytrain.cache.keys import action_key, sha256_bytes
from tinytrain.cache.store import Cache, CacheError
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.runner import build
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.workspace import open_cache

FILES = {"graph.json": b'{"ops":[]}', "sub/w.bin": b"\x07" * 300}
REPO = Path(__file__).resolve().parents[1]


def make_out(folder: Path, files=FILES) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def stored(tmp_path, files=FILES, stage="load"):
    cache = Cache(tmp_path / "cache")
    pre = {"stage": stage}
    key = action_key(pre)
    entry = cache.store(key, pre, make_out(tmp_path / f"out-{stage}", files), "s", {}, 0.1)
    return cache, key, entry


# ---------------------------------------------------------------------------- symlinks, special files


def test_gc_never_follows_a_symlinked_cas_folder(tmp_path, caplog):
    cache, key, entry = stored(tmp_path)
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "id_ed25519").write_text("PRIVATE KEY")
    (secret / ("ab" * 32)).write_text("looks like a blob")
    (cache.cas_dir / "ab").symlink_to(secret, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        res = cache.gc(max_age_s=0)  # everything is "old": a following gc would empty `secret`
    assert (secret / "id_ed25519").read_text() == "PRIVATE KEY"
    assert (secret / ("ab" * 32)).exists()
    assert not os.path.lexists(cache.cas_dir / "ab")  # the link itself is gone ...
    assert res["unsafe_removed"] == 1 and "is a symlink" in caplog.text  # ... and reported


def test_gc_removes_special_files_and_symlinked_blobs(tmp_path):
    cache, key, entry = stored(tmp_path)
    digest = entry.outputs[0].digest
    blob = cache.blob_path(digest)
    blob.unlink()
    blob.symlink_to("/dev/zero")
    os.mkfifo(cache.cas_dir / digest[:2] / ("f" * 64))
    res = cache.gc()
    assert res["unsafe_removed"] == 2
    assert not os.path.lexists(blob) and not os.path.lexists(cache.cas_dir / digest[:2] / ("f" * 64))
    assert os.path.exists("/dev/zero")


@pytest.mark.parametrize("plant", ["dev-zero", "fifo", "dir-link"])
def test_lookup_never_hashes_a_special_file(tmp_path, plant):
    # Before: a blob linked to /dev/zero made every build hash forever; a FIFO blocked the open.
    cache, key, entry = stored(tmp_path)
    digest = next(o.digest for o in entry.outputs if o.name == "sub/w.bin")
    blob = cache.blob_path(digest)
    if plant == "dir-link":
        real = blob.parent
        moved = tmp_path / "moved"
        real.rename(moved)
        real.symlink_to(moved, target_is_directory=True)
    else:
        blob.unlink()
        blob.symlink_to("/dev/zero") if plant == "dev-zero" else os.mkfifo(blob)
    assert cache.lookup(key) is None
    assert "sub/w.bin" in cache.last_drop_reason
    if plant == "dir-link":
        assert (moved / digest).exists()  # outside the cache: untouched
    # Rebuilt by the next store, and then served again.
    cache.store(key, {"stage": "load"}, make_out(tmp_path / "again"), "s", {}, 0.1)
    assert cache.lookup(key) is not None


@pytest.mark.parametrize("target", ["/proc/self/environ", "fifo"])
def test_an_action_entry_that_is_a_link_or_fifo_is_removed_not_read(tmp_path, target):
    cache, key, entry = stored(tmp_path)
    path = cache.entry_path(key)
    path.unlink()
    path.symlink_to(target) if target != "fifo" else os.mkfifo(path)
    assert cache.lookup(key) is None
    assert not os.path.lexists(path)


def test_a_symlinked_lock_file_is_replaced_not_written_through(tmp_path):
    cache = Cache(tmp_path / "cache")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (cache.root / "lock").unlink(missing_ok=True)
    (cache.root / "lock").symlink_to(victim)
    with cache.lock():
        pass
    assert victim.read_text() == "keep" and not (cache.root / "lock").is_symlink()


# ---------------------------------------------------------------------------- restore: total or nothing


def _forge_outputs(cache: Cache, key: str, extra: list[tuple[str, bytes]]) -> None:
    """Rewrite the local entry with extra outputs whose blobs are digest-correct."""
    path = cache.entry_path(key)
    doc = json.loads(path.read_bytes())
    for name, data in extra:
        digest = sha256_bytes(data)
        cache.blob_path(digest).parent.mkdir(parents=True, exist_ok=True)
        cache.blob_path(digest).write_bytes(data)
        doc["outputs"].append({"name": name, "digest": digest, "size": len(data)})
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("names", [["x", "x/y"], ["n" * 300], ["d/" + "n" * 256]])
def test_entries_that_cannot_be_restored_are_dropped_up_front(tmp_path, names):
    cache, key, _ = stored(tmp_path)
    _forge_outputs(cache, key, [(n, n.encode()[:10]) for n in names])
    assert cache.lookup(key) is None
    assert "clash" in cache.last_drop_reason or "too long" in cache.last_drop_reason
    assert not cache.entry_path(key).exists()


def test_an_error_while_restoring_drops_the_entry_and_leaves_dest_alone(tmp_path, monkeypatch):
    from tinytrain.cache import store as store_mod

    cache, key, entry = stored(tmp_path)
    dest = tmp_path / "build" / "load"
    dest.mkdir(parents=True)
    (dest / "old.txt").write_text("previous")

    def denied(src, dst, *, fsync):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(store_mod, "copy_hashing", denied)
    with pytest.raises(CacheError, match="Permission denied"):
        cache.materialize(entry, dest)
    assert (dest / "old.txt").read_text() == "previous"  # nothing half-restored
    assert not cache.entry_path(key).exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_build_whose_cached_entry_cannot_be_restored_reruns_the_stage(fake_project, monkeypatch):
    # Before: FileExistsError on every later build, even with the remote removed from the spec.
    spec = load_spec(fake_project.spec_path)
    build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    cache = open_cache(spec)
    key_a = json.loads((fake_project.out / "a" / "manifest.json").read_text())["key"]
    _forge_outputs(cache, key_a, [("x", b"file"), ("x/y", b"under a file")])
    fake_project.reset_calls()
    r = build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    assert r.exit_code == 0 and fake_project.calls() == ["a"]  # b and c: same input bytes, cached
    # The rerun replaced the bad entry: the next build is fully cached.
    fake_project.reset_calls()
    r = build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    assert r.exit_code == 0 and fake_project.calls() == []


def test_a_permission_error_while_restoring_in_a_build_reruns_the_stage(fake_project, monkeypatch):
    from tinytrain.cache import store as store_mod

    spec = load_spec(fake_project.spec_path)
    build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    real = store_mod.copy_hashing
    failed = []

    def deny_once_for_b(src, dst, *, fsync):
        if Path(dst).name == "b.txt" and not failed and not fsync:
            failed.append(dst)
            raise PermissionError(13, "Permission denied", str(dst))
        return real(src, dst, fsync=fsync)

    monkeypatch.setattr(store_mod, "copy_hashing", deny_once_for_b)
    fake_project.reset_calls()
    r = build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    assert failed and r.exit_code == 0 and fake_project.calls() == ["b"]


# ---------------------------------------------------------------------------- cache folder


@contextlib.contextmanager
def read_only(folder: Path):
    """Make `folder` unwritable for this process: a read-only bind mount when running as root
    (root ignores permission bits), else permission bits."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a read-only folder here (root without mount rights)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_read_only_cache_serves_a_fully_cached_build_and_says_so_once(fake_project, caplog):
    spec = load_spec(fake_project.spec_path)
    build(spec, open_cache(spec), BuildLog(quiet=True), stages=fake_project.table(), until="c")
    root = Path(os.environ["TINYTRAIN_CACHE_DIR"])
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    import shutil

    shutil.rmtree(fake_project.out)
    fake_project.reset_calls()
    with read_only(root), caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        cache = open_cache(spec)
        r = build(spec, cache, BuildLog(quiet=True), stages=fake_project.table(), until="c")
        assert r.exit_code == 0 and fake_project.calls() == []
        assert (fake_project.out / "c" / "c.json").exists()
        assert caplog.text.count("cannot be written") == 1
        assert r.cache["read_only"] and r.cache["hits"] == 3
        # A stage that must run still runs; its result lives only for this process.
        fake_project.write_spec(train={"learning_rate": 0.5})
        spec2 = load_spec(fake_project.spec_path)
        r = build(spec2, cache, BuildLog(quiet=True), stages=fake_project.table(), until="c")
        assert r.exit_code == 0 and fake_project.calls() == ["c"]
        with pytest.raises(Exception, match="cannot be written"):
            cache.gc()
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-m", "tinytrain", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_cache_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "not-a-folder").write_text("x")
    spec = tmp_path / "t.yaml"
    spec.write_text((REPO / "tinytrain.yaml.example").read_text().replace(
        "tests/fixtures/", str(REPO / "tests/fixtures") + "/"))
    proc = _cli(["build", str(spec), "--cache-dir", str(tmp_path / "not-a-folder")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.lstrip().startswith("hint")]
    assert len(lines) == 1 and "not a folder" in lines[0] and "not-a-folder" in lines[0]
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- spec paths


@pytest.mark.parametrize("field,target", [("model", "/proc/self/environ"), ("model", "/dev/zero"),
                                          ("data", "fifo"), ("model", "fifo")])
def test_spec_paths_to_special_files_are_refused_without_reading(tmp_path, monkeypatch, field, target):
    from tinytrain.pipeline.errors import SpecError

    monkeypatch.setenv("TT_SECRET_MARKER", "hunter2-secret")
    if target == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)
    (tmp_path / "net.tflite").write_bytes((REPO / "tests/fixtures/digits_cnn_float.tflite").read_bytes())
    doc = {"model": {"path": "net.tflite"}, "data": {"source": "npz", "path": "x.npz"}}
    doc[field]["path"] = target
    (tmp_path / "t.yaml").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "t.yaml")  # a FIFO would block here if it were opened
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and f"{field}.path" in msg and target in msg
    assert ("FIFO" in msg) if "pipe" in target else ("device" in msg or "/proc pseudo" in msg)
    assert "hunter2" not in msg and "does not exist" not in msg


def test_a_full_disk_names_the_cache_folder_in_one_line(fake_project, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tiny tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (fake_project.root / "net.tflite").write_bytes(b"m" * 200_000)  # stage a copies it: 200 KB
        spec = load_spec(fake_project.spec_path)
        r = build(spec, open_cache(spec, small), BuildLog(quiet=True), stages=fake_project.table(), until="c")
        assert r.exit_code == 2  # the environment, not a bug: a user error's exit code
        assert str(r.error).splitlines()[0] == (f"no space left on the device of {small} "
                                                f"(the cache, storing the results of a)")
        assert not list(small.rglob("*.json"))[1:] and not list(small.rglob(".tmp-*"))  # at most stats.json
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
