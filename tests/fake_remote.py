"""A tiny PUT-capable HTTP cache on 127.0.0.1 (Bazel HTTP cache layout: GET/HEAD/PUT on /ac/<key> and /cas/<digest>,
kept in the server's `blobs` dict; every request in `log` as (method, path, Authorization)) that can also misbehave:
require credentials (`auth`), send an endless body or trickle bytes (slow loris; `modes[path]`), serve altered bytes
(paths in `corrupt`), or answer every request with one status (`fail_with`, e.g. 500)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _prelude(self) -> bool:
        srv = self.server
        srv.log.append((self.command, self.path, self.headers.get("Authorization")))
        if srv.auth is not None and self.headers.get("Authorization") != srv.auth:
            self._status(401)
            return False
        if srv.fail_with:
            self._status(srv.fail_with)
            return False
        return True

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        if self._prelude():
            self._status(200 if self.path in self.server.blobs else 404)

    def do_GET(self):
        if not self._prelude():
            return
        srv = self.server
        data = srv.blobs.get(self.path)
        if data is None:
            self._status(404)
            return
        mode = srv.modes.get(self.path)
        if self.path in srv.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        self.send_response(200)
        if mode != "endless":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            if mode == "endless":  # no Content-Length, never ends until the client hangs up
                while not srv.stopping.is_set():
                    self.wfile.write(data[:1] * 65536)
            elif mode == "slow":  # one byte at a time, never quite silent
                for b in data:
                    if srv.stopping.is_set():
                        break
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.2)
            else:
                self.wfile.write(data)
        except OSError:
            pass  # the client gave up: that is the point of these modes

    def do_PUT(self):
        if not self._prelude():
            return
        length = int(self.headers.get("Content-Length", "0"))
        self.server.blobs[self.path] = self.rfile.read(length)
        self._status(201)


@contextlib.contextmanager
def serving(auth: str | None = None, watchdog_s: float = 60):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.blobs, srv.log, srv.modes, srv.corrupt, srv.fail_with, srv.auth = {}, [], {}, set(), None, auth
    srv.stopping = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    # Bounded even if a test hangs: the server stops itself.
    watchdog = threading.Timer(watchdog_s, srv.shutdown)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield srv
    finally:
        srv.stopping.set()
        watchdog.cancel()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def url(srv) -> str:
    host, port = srv.server_address[:2]
    return f"http://{host}:{port}"
