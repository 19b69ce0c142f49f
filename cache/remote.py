"""A remote cache over HTTP in the layout of Bazel's HTTP cache: `<base>/ac/<key>` and
`<base>/cas/<sha256>`, read with GET/HEAD and written with PUT (nginx with WebDAV PUT, bazel-remote
and similar servers speak it). Only the stdlib is used.

A remote is an accelerator, never a dependency: any network or server failure becomes a miss
with a logged warning, and after a connection-level failure the remote is switched off for the
rest of this process so a dead server costs one timeout, not one per stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path

log = logging.getLogger("tinytrain.cache")

_CHUNK = 1 << 20
# An action entry is a small JSON document; anything larger is not one of ours.
_MAX_AC_BYTES = 16 << 20
_NETWORK_ERRORS = (OSError, http.client.HTTPException)  # URLError, timeouts, resets are OSErrors


class RemoteCache:
    def __init__(self, base_url: str, write: bool = False, timeout_s: float = 10.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"remote cache URL must be http(s): {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.write = write
        self.timeout_s = timeout_s
        # Set after a connection-level failure; the remote is then skipped (see module doc).
        self.disabled_reason: str | None = None
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"RemoteCache({self.base_url!r}, write={self.write})"

    # ----------------------------------------------------------------- action cache

    def get_ac(self, key: str) -> bytes | None:
        try:
            with self._open("GET", f"ac/{key}") as resp:
                if resp is None:
                    return None
                data = resp.read(_MAX_AC_BYTES + 1)
        except _NETWORK_ERRORS as e:
            self._fail(f"GET ac/{key[:12]}: {e}")
            return None
        if len(data) > _MAX_AC_BYTES:
            self._fail(f"GET ac/{key[:12]}: response too large for an action entry")
            return None
        return data

    def put_ac(self, key: str, data: bytes) -> bool:
        return self._put(f"ac/{key}", data, len(data))

    # ----------------------------------------------------------------- content-addressed store

    def has_cas(self, digest: str) -> bool:
        with self._open("HEAD", f"cas/{digest}") as resp:
            return resp is not None and resp.status == 200

    def fetch_cas(self, digest: str, dest: Path) -> bool:
        """Download a blob to `dest` through a temp file in its folder; only bytes whose sha256
        matches are renamed into place."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-remote-{uuid.uuid4().hex[:16]}"
        try:
            with self._open("GET", f"cas/{digest}") as resp:
                if resp is None:
                    return False
                got = _stream_hashing(resp, tmp)
            if got != digest:
                self._fail(f"GET cas/{digest[:12]}: content digest mismatch (got {got[:12]})",
                           disable=False)
                return False
            os.replace(tmp, dest)
            return True
        except _NETWORK_ERRORS as e:
            self._fail(f"GET cas/{digest[:12]}: {e}")
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def put_cas(self, digest: str, path: Path) -> bool:
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                return self._put(f"cas/{digest}", f, size)
        except OSError as e:
            self._fail(f"PUT cas/{digest[:12]}: cannot read local blob: {e}", disable=False)
            return False

    # ----------------------------------------------------------------- plumbing

    def _put(self, rel: str, body, size: int) -> bool:
        if not self.write:
            return False
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        try:
            with self._open("PUT", rel, body, headers) as resp:
                return resp is not None
        except _NETWORK_ERRORS as e:
            self._fail(f"PUT {rel}: {e}")
            return False

    @contextlib.contextmanager
    def _open(self, method: str, rel: str, body=None, headers: dict | None = None):
        """Yields the response, or None for a miss (404) or any failure (already logged)."""
        if self.disabled_reason:
            yield None
            return
        req = urllib.request.Request(f"{self.base_url}/{rel}", data=body, method=method,
                                     headers=headers or {})
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code != 404:
                self._fail(f"{method} {rel}: HTTP {e.code} {e.reason}", disable=False)
            yield None
            return
        except _NETWORK_ERRORS as e:
            self._fail(f"{method} {rel}: {getattr(e, 'reason', e)}")
            yield None
            return
        with resp:
            yield resp

    def _fail(self, message: str, disable: bool = True) -> None:
        self.last_error = message
        if disable:
            self.disabled_reason = message
            log.warning("remote cache %s unreachable, continuing without it: %s",
                        self.base_url, message)
        else:
            log.warning("remote cache %s: %s", self.base_url, message)


def _stream_hashing(resp, tmp: Path) -> str:
    h = hashlib.sha256()
    with open(tmp, "xb") as f:
        while chunk := resp.read(_CHUNK):
            h.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()
