"""The HTTP remote cache against a tiny PUT-capable server on 127.0.0.1 (Bazel HTTP cache layout)."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import pytest

import fake_remote
from fake_remote import url
from tinytrain.cache.keys import action_key, sha256_bytes
from tinytrain.cache.remote import RemoteCache
from tinytrain.cache.store import Cache

FILES = {"graph.json": b'{"ops":[]}', "sub/tensors.npz": b"\x01" * 500}


@pytest.fixture
def server():
    with fake_remote.serving(watchdog_s=30) as srv:
        yield srv


def make_out(folder: Path) -> Path:
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def store_one(tmp_path, remote, name="writer") -> tuple[Cache, str]:
    cache = Cache(tmp_path / name, remote=remote)
    pre = {"stage": "load", "x": 1}
    key = action_key(pre)
    cache.store(key, pre, make_out(tmp_path / f"out-{name}"), "2 files", {"n": 2}, 0.1)
    return cache, key


def test_write_uploads_blobs_then_the_entry(server, tmp_path):
    _, key = store_one(tmp_path, RemoteCache(url(server), write=True))
    puts = [path for method, path, _ in server.log if method == "PUT"]
    assert puts[-1] == f"/ac/{key}" and len(puts) == 1 + len(FILES)
    assert {f"/cas/{sha256_bytes(d)}" for d in FILES.values()} == set(puts[:-1])
    for d in FILES.values():
        assert server.blobs[f"/cas/{sha256_bytes(d)}"] == d
    assert json.loads(server.blobs[f"/ac/{key}"])["key"] == key


def test_blobs_the_server_has_are_not_uploaded_again(server, tmp_path):
    store_one(tmp_path, RemoteCache(url(server), write=True), "first")
    server.log.clear()
    store_one(tmp_path, RemoteCache(url(server), write=True), "second")
    assert [m for m, *_ in server.log] == ["HEAD"] * len(FILES) + ["PUT"]


def test_read_only_remote_never_writes(server, tmp_path):
    store_one(tmp_path, RemoteCache(url(server), write=False))
    assert not [m for m, *_ in server.log if m == "PUT"] and not server.blobs


def test_local_miss_reads_through_and_stores_locally(server, tmp_path):
    _, key = store_one(tmp_path, RemoteCache(url(server), write=True))
    reader = Cache(tmp_path / "reader", remote=RemoteCache(url(server), write=False))
    entry = reader.lookup(key)
    assert entry is not None and {o.name for o in entry.outputs} == set(FILES)
    dest = tmp_path / "build" / "load"
    reader.materialize(entry, dest)
    assert (dest / "sub/tensors.npz").read_bytes() == FILES["sub/tensors.npz"]
    # Now it is local: a second lookup does not touch the network.
    server.log.clear()
    offline = Cache(tmp_path / "reader")
    assert offline.lookup(key) == entry and server.log == []


def test_corrupt_remote_blob_is_a_miss_and_leaves_nothing_locally(server, tmp_path, caplog):
    _, key = store_one(tmp_path, RemoteCache(url(server), write=True))
    server.corrupt.add(f"/cas/{sha256_bytes(FILES['sub/tensors.npz'])}")
    reader = Cache(tmp_path / "reader", remote=RemoteCache(url(server)))
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert reader.lookup(key) is None
    assert "digest mismatch" in caplog.text
    assert "unavailable or corrupt" in reader.last_drop_reason
    assert not reader.entry_path(key).exists()
    assert not reader.blob_path(sha256_bytes(FILES["sub/tensors.npz"])).exists()
    assert not list(reader.root.rglob(".tmp-*"))


def test_corrupt_local_blob_is_repaired_from_the_remote(server, tmp_path):
    cache, key = store_one(tmp_path, RemoteCache(url(server), write=True))
    blob = cache.blob_path(sha256_bytes(FILES["graph.json"]))
    blob.write_bytes(b"rotten")
    assert cache.lookup(key) is not None
    assert "graph.json" in cache.last_drop_reason  # the local copy was dropped ...
    assert blob.read_bytes() == FILES["graph.json"]  # ... and fetched again


def test_unsafe_remote_entry_is_refused(server, tmp_path):
    key = "a" * 64
    doc = {"format": 1, "key": key, "summary": "", "metrics": {}, "duration_s": 0.0, "preimage": {},
           "created": 0.0, "outputs": [{"name": "../../evil", "digest": sha256_bytes(b"x"), "size": 1}]}
    server.blobs[f"/ac/{key}"] = json.dumps(doc).encode()
    server.blobs[f"/cas/{sha256_bytes(b'x')}"] = b"x"
    reader = Cache(tmp_path / "reader", remote=RemoteCache(url(server)))
    assert reader.lookup(key) is None and "unsafe output name" in reader.last_drop_reason


def test_server_errors_degrade_to_a_miss(server, tmp_path, caplog):
    _, key = store_one(tmp_path, RemoteCache(url(server), write=True))
    server.fail_with = 500
    reader = Cache(tmp_path / "reader", remote=RemoteCache(url(server), write=True))
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert reader.lookup(key) is None
        # Storing still works locally even though the upload fails.
        store_one(tmp_path, reader.remote, "reader")
    assert "HTTP 500" in caplog.text
    assert reader.lookup(key) is not None


def test_unreachable_server_is_a_miss_once_then_skipped(tmp_path, caplog):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteCache(f"http://127.0.0.1:{port}", write=True, timeout_s=2)
    cache = Cache(tmp_path / "c", remote=remote)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert cache.lookup("b" * 64) is None
        assert remote.disabled_reason is not None
        store_one(tmp_path, remote, "c")
    assert time.monotonic() - start < 5
    assert caplog.text.count("unreachable") == 1
    assert cache.lookup(action_key({"stage": "load", "x": 1})) is not None


def test_rejects_non_http_urls():
    with pytest.raises(ValueError):
        RemoteCache("file:///etc")
