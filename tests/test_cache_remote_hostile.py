"""A remote cache that someone else could write or that misbehaves (issue 16): signed entries,
bounded and deadline-limited downloads, stale temp files after kill -9, credentials that are sent
but never shown or stored. Servers are tiny http.server instances on 127.0.0.1 (fake_remote.py)."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fake_remote
from tinytrain.cache import signing
from tinytrain.cache.credentials import Credentials, mask_url, resolve
from tinytrain.cache.keys import action_key, sha256_bytes
from tinytrain.cache.remote import RemoteCache
from tinytrain.cache.store import Cache
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.errors import SpecError, UserError
from tinytrain.pipeline.runner import build
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.stage_graph import StageDef
from tinytrain.pipeline.workspace import open_cache

KEY = b"ci-only signing key"


@pytest.fixture
def server():
    with fake_remote.serving() as srv:
        yield srv


def put_entry(srv, files: dict[str, bytes], stage: str = "load", sign_key: bytes | None = None) -> str:
    """Publish an entry (and its blobs) on the server the way a writer would; returns its key."""
    key = action_key({"stage": stage, "files": sorted(files)})
    outputs = []
    for name, data in files.items():
        srv.blobs[f"/cas/{sha256_bytes(data)}"] = data
        outputs.append({"name": name, "digest": sha256_bytes(data), "size": len(data)})
    doc = {"format": 1, "key": key, "summary": "s", "metrics": {}, "duration_s": 0.1,
           "preimage": {"stage": stage}, "created": 0.0, "outputs": outputs}
    raw = json.dumps(doc).encode()
    srv.blobs[f"/ac/{key}"] = signing.sign(raw, sign_key) if sign_key else raw
    return key


# ---------------------------------------------------------------------------- bounded downloads


def test_a_download_stops_at_the_declared_size(server, tmp_path, caplog):
    data = b"A" * 1000
    key = put_entry(server, {"w.bin": data})
    server.modes[f"/cas/{sha256_bytes(data)}"] = "endless"  # same first byte, then forever
    cache = Cache(tmp_path / "c", remote=RemoteCache(fake_remote.url(server), timeout_s=20))
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert cache.lookup(key) is None
    assert "more than the 1000 bytes the entry declares" in caplog.text
    assert not list(cache.root.rglob(".tmp-*")) and not cache.entry_path(key).exists()
    assert cache.remote.disabled_reason is None  # a bad blob is not a dead server


@pytest.mark.parametrize("what", ["cas", "ac"])
def test_a_slow_loris_server_is_cut_off_at_the_deadline(server, tmp_path, caplog, what):
    data = b"B" * 500  # 0.2 s per byte: 100 s if it were allowed to finish
    key = put_entry(server, {"w.bin": data})
    server.modes[f"/cas/{sha256_bytes(data)}" if what == "cas" else f"/ac/{key}"] = "slow"
    remote = RemoteCache(fake_remote.url(server), timeout_s=1.0)
    cache = Cache(tmp_path / "c", remote=remote)
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert cache.lookup(key) is None
    assert "within the 1 s deadline" in caplog.text
    # Switched off: the rest of the build does not wait again.
    assert remote.disabled_reason is not None and remote.get_ac(key) is None
    assert not list(cache.root.rglob(".tmp-*"))


_DOWNLOADER = """
import sys
from pathlib import Path
from tinytrain.cache.remote import RemoteCache
from tinytrain.cache.store import Cache
Cache(sys.argv[1], remote=RemoteCache(sys.argv[2], timeout_s=60)).lookup(sys.argv[3])
"""


def test_temp_files_of_a_killed_download_are_swept_by_the_next_build(server, tmp_path):
    data = b"C" * 4096
    key = put_entry(server, {"w.bin": data})
    server.modes[f"/cas/{sha256_bytes(data)}"] = "slow"
    root = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", _DOWNLOADER, str(root), fake_remote.url(server), key], env=env)
    try:
        for _ in range(200):  # until the download has started writing
            temps = list(root.rglob(".tmp-remote-*")) if root.exists() else []
            if temps:
                break
            time.sleep(0.05)
        assert temps, "the download never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert temps[0].exists()  # kill -9: no finally clause ran
    Cache(root).begin_build()
    assert not list(root.rglob(".tmp-*"))


# ---------------------------------------------------------------------------- signed entries


def test_sign_and_verify():
    raw = json.dumps({"format": 1, "key": "k", "outputs": [], "created": 1.5}).encode()
    signed = signing.sign(raw, KEY)
    assert signing.problem(signed, KEY) is None
    assert signing.problem(raw, KEY) == "entry is not signed"
    assert "does not match" in signing.problem(signed, b"another key")
    doc = json.loads(signed)
    doc["created"] = 2.5
    assert "does not match" in signing.problem(json.dumps(doc).encode(), KEY)


_MAKE = """
from pathlib import Path
from tinytrain.pipeline.contract import StageResult
def run(ctx):
    fw = ctx.out_dir / "firmware.sh"
    fw.write_text('#!/bin/sh\\necho honest > "$1"\\n')
    return StageResult("firmware")
"""

_EXEC = """
import subprocess
from tinytrain.pipeline.contract import StageResult
def run(ctx):
    # Like emulate-run on board host: whatever firmware the previous stage produced is executed.
    subprocess.run(["sh", str(ctx.input("make/firmware.sh")), str(ctx.out_dir / "result.txt")], check=True)
    return StageResult((ctx.out_dir / "result.txt").read_text().strip())
"""


def _firmware_table(fake_project) -> tuple[StageDef, ...]:
    stages = fake_project.root / "stages"
    names = {}
    for kind, body in (("make", _MAKE), ("exec", _EXEC)):
        names[kind] = f"{fake_project.prefix}_{kind}"
        (stages / f"{names[kind]}.py").write_text(textwrap.dedent(body))
    return (StageDef("make", ("model",), (), names["make"]),
            StageDef("exec", ("train.learning_rate",), ("make",), names["exec"]))


def _build_with_remote(fake_project, table, cache_dir: Path, **remote):
    fake_project.write_spec(build={"out_dir": "out", "remote_cache": remote})
    spec = load_spec(fake_project.spec_path)
    shutil.rmtree(fake_project.out, ignore_errors=True)
    return build(spec, open_cache(spec, cache_dir), BuildLog(quiet=True), stages=table)


@pytest.mark.parametrize("forgery", ["unsigned", "other-key"])
def test_a_poisoned_entry_is_refused_and_never_executed(server, fake_project, tmp_path, monkeypatch, caplog,
                                                        forgery):
    table = _firmware_table(fake_project)
    url = fake_remote.url(server)
    monkeypatch.setenv("TT_SIGN_KEY", KEY.decode())
    r = _build_with_remote(fake_project, table, tmp_path / "ci", url=url, write=True, sign_key_env="TT_SIGN_KEY")
    assert r.exit_code == 0 and r.outcomes[1].summary == "honest"
    make_key = r.outcomes[0].key
    assert signing.problem(server.blobs[f"/ac/{make_key}"], KEY) is None  # CI signed what it uploaded

    # The attacker can write the server but does not hold the key: a digest-correct shell script.
    marker = tmp_path / "pwned"
    poison = f'#!/bin/sh\ntouch {marker}\necho honest > "$1"\n'.encode()
    server.blobs[f"/cas/{sha256_bytes(poison)}"] = poison
    doc = json.loads(server.blobs[f"/ac/{make_key}"])
    doc.pop("signature")
    doc["outputs"] = [{"name": "firmware.sh", "digest": sha256_bytes(poison), "size": len(poison)}]
    raw = json.dumps(doc).encode()
    server.blobs[f"/ac/{make_key}"] = raw if forgery == "unsigned" else signing.sign(raw, b"attacker key")

    # A desk that holds the verify key: refused with one line, built locally, nothing stored.
    monkeypatch.setenv("TT_VERIFY_KEY", KEY.decode())
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        r = _build_with_remote(fake_project, table, tmp_path / "desk", url=url, verify_key_env="TT_VERIFY_KEY")
    assert r.exit_code == 0 and not marker.exists()
    assert {o.stage: o.state for o in r.outcomes} == {"make": "ran", "exec": "cached"}
    refused = [rec for rec in caplog.records if "refused" in rec.getMessage()]
    assert len(refused) == 1 and make_key[:12] in refused[0].getMessage()
    desk = tmp_path / "desk"
    assert not (desk / "cas" / sha256_bytes(poison)[:2] / sha256_bytes(poison)).exists()
    assert b"touch" not in b"".join(p.read_bytes() for p in desk.rglob("*") if p.is_file())

    # Control: without a verify key the same remote makes the build execute the attacker's script.
    r = _build_with_remote(fake_project, table, tmp_path / "trusting", url=url)
    assert r.exit_code == 0 and marker.exists()


def test_a_configured_verify_key_that_is_missing_is_one_clear_error(fake_project, monkeypatch):
    monkeypatch.delenv("TT_NO_SUCH_KEY", raising=False)
    fake_project.write_spec(build={"out_dir": "out", "remote_cache": {
        "url": "http://127.0.0.1:9", "verify_key_env": "TT_NO_SUCH_KEY"}})
    with pytest.raises(UserError, match=r"\$TT_NO_SUCH_KEY is not set"):
        open_cache(load_spec(fake_project.spec_path))


def test_keys_from_files_and_a_writer_without_its_key_uploads_nothing(fake_project, tmp_path, monkeypatch,
                                                                     caplog):
    from tinytrain.cache.remote_config import open_remote

    (fake_project.root / "verify.key").write_bytes(KEY + b"\n")
    fake_project.write_spec(build={"out_dir": "out", "remote_cache": {
        "url": "http://127.0.0.1:9", "write": True, "verify_key_file": "verify.key", "sign_key_env": "TT_UNSET"}})
    monkeypatch.delenv("TT_UNSET", raising=False)
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        remote = open_remote(load_spec(fake_project.spec_path).build.remote_cache)
    assert remote.verify_key == KEY  # relative to the spec's folder, trailing newline stripped
    assert not remote.write and "$TT_UNSET is not set, so nothing is uploaded" in caplog.text


# ---------------------------------------------------------------------------- credentials


def test_mask_url():
    assert mask_url("https://ci:s3cret@cache.example:8443/tt?token=abc") == "https://***@cache.example:8443/tt?token=***"
    assert mask_url("http://cache.example/tt") == "http://cache.example/tt"


def test_credential_sources_in_order(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine cache.example login nu password np\n")
    netrc.chmod(0o600)
    env = {"TOK": "t0k", "U": "eu", "P": "ep", "NETRC": str(netrc)}
    basic = lambda u, p: "Basic " + base64.b64encode(f"{u}:{p}".encode()).decode()  # noqa: E731
    assert resolve("http://cache.example/x", token_env="TOK", environ=env)[1].authorization == "Bearer t0k"
    assert resolve("http://cache.example/x", username_env="U", password_env="P",
                   environ=env)[1].authorization == basic("eu", "ep")
    url, c = resolve("http://a%40b:p%3Aw@cache.example/x", environ=env)
    assert url == "http://cache.example/x" and c.authorization == basic("a@b", "p:w")
    assert resolve("http://cache.example/x", environ=env)[1].authorization == basic("nu", "np")
    assert resolve("http://cache.example/x", use_netrc=False, environ=env)[1].authorization is None
    c = resolve("http://cache.example/x", token_env="MISSING", use_netrc=False, environ=env)[1]
    assert c.authorization is None and c.notes == ("$MISSING (token_env) is not set",)
    assert "t0k" not in repr(resolve("http://cache.example/x", token_env="TOK", environ=env)[1])


def test_basic_auth_from_the_environment_reaches_the_server_and_is_shown_nowhere(fake_project, tmp_path,
                                                                                  monkeypatch, capsys, caplog):
    password = "pa55-w0rd-XYZ"
    auth = "Basic " + base64.b64encode(f"ci:{password}".encode()).decode()
    monkeypatch.setenv("TT_USER", "ci")
    monkeypatch.setenv("TT_PASS", password)
    with fake_remote.serving(auth=auth) as srv:
        remote = {"url": fake_remote.url(srv), "write": True, "username_env": "TT_USER", "password_env": "TT_PASS"}
        r = _build_with_remote(fake_project, fake_project.table(), tmp_path / "ci", **remote)
        assert r.exit_code == 1 and [o.state for o in r.outcomes[:3]] == ["ran"] * 3  # d is not implemented
        assert any(k.startswith("/ac/") for k in srv.blobs)  # uploaded: the credentials worked
        fake_project.reset_calls()
        r = _build_with_remote(fake_project, fake_project.table(), tmp_path / "desk", **{**remote, "write": False})
        assert fake_project.calls() == []  # every stage from the server
        # With a wrong password: one warning, masked, then the remote is skipped.
        monkeypatch.setenv("TT_PASS", "wrong")
        with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
            r = _build_with_remote(fake_project, fake_project.table(), tmp_path / "desk2", **{**remote, "write": False})
        assert caplog.text.count("HTTP 401") == 1
    # The password itself appears in no output, record, report or cache file.
    seen = capsys.readouterr()
    blobs = [p.read_bytes() for d in (tmp_path / "ci", tmp_path / "desk", fake_project.root / "out")
             for p in d.rglob("*") if p.is_file()]
    for text in [seen.out, seen.err, caplog.text, *[b.decode("latin-1") for b in blobs]]:
        assert password not in text and base64.b64encode(f"ci:{password}".encode()).decode() not in text
    record = json.loads((fake_project.out / "build.json").read_text())
    assert record["cache"]["remote"] == fake_remote.url(srv)


def test_a_password_in_the_url_works_and_is_masked_in_warnings(tmp_path, caplog):
    auth = "Basic " + base64.b64encode(b"ci:url-secret").decode()
    with fake_remote.serving(auth=auth) as srv:
        host, port = srv.server_address[:2]
        url, creds = resolve(f"http://ci:url-secret@{host}:{port}")
        remote = RemoteCache(url, write=True, credentials=creds)
        cache = Cache(tmp_path / "c", remote=remote)
        pre = {"stage": "load"}
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "f").write_text("x")
        cache.store(action_key(pre), pre, tmp_path / "o", "s", {}, 0.0)
        assert f"/ac/{action_key(pre)}" in srv.blobs
        srv.fail_with = 500
        with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
            assert Cache(tmp_path / "d", remote=remote).lookup(action_key(pre)) is None
    assert "HTTP 500" in caplog.text and "url-secret" not in caplog.text


def test_a_bearer_token_is_sent(server, tmp_path):
    remote = RemoteCache(fake_remote.url(server), credentials=Credentials("Bearer abc", "$T"))
    remote.get_ac("a" * 64)
    assert server.log[-1][2] == "Bearer abc"


@pytest.mark.parametrize("bad", ["ftp://u:hunter2@x/", "https://u:hunter2@x/tt?token=hunter2"])
def test_spec_errors_never_show_a_password(fake_project, bad):
    fake_project.write_spec(build={"out_dir": "out", "remote_cache": {"url": bad}})
    with pytest.raises(SpecError) as err:
        load_spec(fake_project.spec_path)
    assert "hunter2" not in str(err.value) and "remote_cache.url" in str(err.value)
