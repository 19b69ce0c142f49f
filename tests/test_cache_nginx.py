"""The remote cache against a real nginx (WebDAV PUT) on 127.0.0.1: one clone builds the example
and uploads, a second clone with an empty local cache gets every stage from the server; a server
that stops or answers 500 mid-build means local building; and the same over TLS with basic auth,
with a CA the test makes itself. Needs the `nginx` and `openssl` Debian packages (.ci/setup)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tinytrain.cache.remote import RemoteCache
from tinytrain.cache.remote_config import open_remote
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.runner import build
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.workspace import open_cache

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
OPENSSL = shutil.which("openssl")
STAGES = ["load", "quantize", "sparse-plan", "autodiff", "reorder", "codegen", "cross-compile", "emulate-run"]

if not os.path.exists(NGINX):
    pytest.skip("nginx is not installed (apt-get install nginx; see .ci/setup)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """One nginx in the foreground, single process, everything (config, pid, logs, temp folders,
    the stored cache) under its own prefix folder, listening on 127.0.0.1 only."""

    def __init__(self, prefix: Path, *, tls: tuple[Path, Path] | None = None, htpasswd: Path | None = None,
                 fail_paths: tuple[str, ...] = ()):
        self.prefix = prefix
        self.www = prefix / "www"
        for d in ("www/tt", "logs", "tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
            (prefix / d).mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/tt"
        listen = f"listen 127.0.0.1:{self.port}{' ssl' if tls else ''};"
        ssl = f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};" if tls else ""
        auth = f'auth_basic "tinytrain cache"; auth_basic_user_file {htpasswd};' if htpasswd else ""
        # Exact-match locations answer 500 for chosen entries: a server failing mid-build.
        failing = "\n".join(f"location = {p} {{ return 500; }}" for p in fail_paths)
        (prefix / "nginx.conf").write_text(f"""
daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {prefix}/logs/access.log;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    client_max_body_size 0;
    server {{
        {listen}
        {ssl}
        root {self.www};
        {failing}
        location /tt/ {{
            {auth}
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw;
        }}
    }}
}}
""")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Nginx":
        self.proc = subprocess.Popen([NGINX, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf"),
                                      "-e", str(self.prefix / "logs/error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(100):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def stored(self, kind: str) -> list[Path]:
        return [p for p in (self.www / "tt" / kind).glob("*") if p.is_file()]


@pytest.fixture
def servers():
    started: list[Nginx] = []

    def start(*args, **kw) -> Nginx:
        srv = Nginx(*args, **kw).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def clone(tmp_path: Path, name: str, remote: dict) -> Path:
    """A checkout of the example spec in its own folder, with the remote cache configured."""
    folder = tmp_path / name
    folder.mkdir()
    text = (REPO / "tinytrain.yaml.example").read_text().replace("tests/fixtures/", f"{REPO}/tests/fixtures/")
    text += "\n# test remote\n"
    spec = folder / "tinytrain.yaml"
    spec.write_text(text)
    doc_remote = json.dumps(remote)
    # `build:` exists in the example: append remote_cache under it.
    lines = spec.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("build:"))
    lines.insert(at + 1, f"  remote_cache: {doc_remote}")
    spec.write_text("\n".join(lines) + "\n")
    return spec


def cli_build(spec: Path, cache_dir: Path, env_extra: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "TINYTRAIN_CACHE_DIR": str(cache_dir), **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-m", "tinytrain", "build", str(spec)], cwd=spec.parent,
                          capture_output=True, text=True, env=env, timeout=900)
    record = json.loads((spec.parent / "build" / "digits" / "build.json").read_text())
    return proc, record


def test_nginx_round_trip_and_fallback_when_it_stops_or_fails(servers, tmp_path, caplog):
    srv = servers(tmp_path / "nginx")

    # CI: builds and uploads.
    proc, rec = cli_build(clone(tmp_path, "ci", {"url": srv.url, "write": True}), tmp_path / "ci-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rec["ran"] == STAGES and "unreachable" not in proc.stderr
    assert len(srv.stored("ac")) == len(STAGES) and srv.stored("cas")

    # A second clone, empty local cache, read only: every stage comes from nginx, same bytes.
    proc, rec = cli_build(clone(tmp_path, "desk", {"url": srv.url}), tmp_path / "desk-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rec["cached"] == STAGES and rec["ran"] == []
    for st in STAGES:
        ci = json.loads((tmp_path / "ci/build/digits" / st / "manifest.json").read_text())
        desk = json.loads((tmp_path / "desk/build/digits" / st / "manifest.json").read_text())
        assert ci["outputs"] == desk["outputs"]
    keys = {o["stage"]: o["key"] for o in rec["stages"]}

    # The server answers 500 for the entries from sparse-plan on: those stages are built here.
    srv.stop()
    failing = tuple(f"/tt/ac/{keys[st]}" for st in STAGES[2:])
    failing_srv = servers(tmp_path / "nginx500", fail_paths=failing)
    shutil.copytree(srv.www, failing_srv.www, dirs_exist_ok=True)
    proc, rec = cli_build(clone(tmp_path, "desk500", {"url": failing_srv.url}), tmp_path / "desk500-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rec["cached"] == STAGES[:2] and rec["ran"] == STAGES[2:]
    assert "HTTP 500" in proc.stderr

    # The server goes away in the middle of a build (after quantize's lookup): local building.
    spec = load_spec(clone(tmp_path, "desk-stop", {"url": failing_srv.url}))
    cache = open_cache(spec, tmp_path / "desk-stop-cache")
    real_lookup = cache.lookup
    looked_up: list[str] = []

    def lookup_then_stop(key):
        entry = real_lookup(key)
        looked_up.append(key)
        if len(looked_up) == 2:
            failing_srv.stop()
        return entry

    cache.lookup = lookup_then_stop
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        result = build(spec, cache, BuildLog(quiet=True))
    assert result.exit_code == 0
    states = {o.stage: o.state for o in result.outcomes}
    assert [s for s in STAGES if states[s] == "cached"] == STAGES[:2]
    assert caplog.text.count("unreachable") == 1  # then skipped for the rest of the build


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca_and_server_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    folder.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=tinytrain test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
                                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                    "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=folder)
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")
def test_nginx_over_tls_with_basic_auth(servers, tmp_path, caplog):
    ca, cert, key = make_ca_and_server_cert(tmp_path / "pki")
    password = "tls-Pa55-word"
    hashed = subprocess.run([OPENSSL, "passwd", "-apr1", password], capture_output=True, text=True,
                            check=True).stdout.strip()
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"ci:{hashed}\n")
    srv = servers(tmp_path / "nginx", tls=(cert, key), htpasswd=htpasswd)
    env = {"TT_CACHE_USER": "ci", "TT_CACHE_PASSWORD": password}
    remote = {"url": srv.url, "ca_file": str(ca), "username_env": "TT_CACHE_USER",
              "password_env": "TT_CACHE_PASSWORD", "netrc": False}

    proc, rec = cli_build(clone(tmp_path, "ci", {**remote, "write": True}), tmp_path / "ci-cache", env)
    assert proc.returncode == 0 and rec["ran"] == STAGES, proc.stdout + proc.stderr
    assert "unreachable" not in proc.stderr and "HTTP" not in proc.stderr
    assert len(srv.stored("ac")) == len(STAGES)

    proc, rec = cli_build(clone(tmp_path, "desk", remote), tmp_path / "desk-cache", env)
    assert proc.returncode == 0 and rec["cached"] == STAGES, proc.stdout + proc.stderr
    for where in (tmp_path / "ci", tmp_path / "desk", tmp_path / "ci-cache", tmp_path / "desk-cache"):
        for p in where.rglob("*"):
            if p.is_file():
                assert password.encode() not in p.read_bytes(), p
    assert password not in proc.stdout + proc.stderr

    # The same server without the CA, or with a wrong password: one warning, a miss, no secret shown.
    key0 = rec["stages"][0]["key"]
    with caplog.at_level(logging.WARNING, logger="tinytrain.cache"):
        assert RemoteCache(srv.url).get_ac(key0) is None
        assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
        spec = load_spec(clone(tmp_path, "wrong", remote))
        wrong = open_remote(spec.build.remote_cache, environ={**env, "TT_CACHE_PASSWORD": "nope"})
        assert wrong.get_ac(key0) is None and "HTTP 401" in caplog.text
        right = open_remote(spec.build.remote_cache, environ=env)
        assert right.get_ac(key0) is not None
    assert password not in caplog.text
