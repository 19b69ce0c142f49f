"""A remote cache over HTTP in the layout of Bazel's HTTP cache: `<base>/ac/<key>` and
`<base>/cas/<sha256>`, read with GET/HEAD and written with PUT (nginx with WebDAV PUT, bazel-remote
and similar servers speak it). Only the stdlib is used.

A remote is an accelerator, never a dependency: any network or server failure becomes a miss
with a logged warning, and after a connection-level failure the remote is switched off for the
rest of this process so a dead server costs one timeout, not one per stage.

A remote is also untrusted input (see signing.py for who may write entries). Every operation has
an overall deadline, enforced by a watchdog that shuts the socket down, so a server that trickles
bytes cannot hold a build; a download stops at the size its entry declares; secrets stay in
request headers and every URL shown is masked (credentials.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

from tinytrain.cache import signing
from tinytrain.cache.credentials import Credentials, mask_url

log = logging.getLogger("tinytrain.cache")

_CHUNK = 1 << 16
# An action entry is a small JSON document; anything larger is not one of ours.
_MAX_AC_BYTES = 16 << 20
DEFAULT_DEADLINE_S = 30.0
_NETWORK_ERRORS = (OSError, http.client.HTTPException)  # timeouts, resets, TLS errors are OSErrors
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class _Miss(Exception):
    """Ends one operation as a miss; the reason is already logged."""


class _LocalWriteError(Exception):
    """Writing the downloaded bytes to the local disk failed (not the server's fault)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class RemoteCache:
    def __init__(self, base_url: str, write: bool = False, timeout_s: float = DEFAULT_DEADLINE_S, *,
                 credentials: Credentials | None = None, ca_file: str | os.PathLike | None = None,
                 sign_key: bytes | None = None, verify_key: bytes | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"remote cache URL must be http(s): {mask_url(base_url)!r}")
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if "@" in parts.netloc:
            raise ValueError("pass user info as credentials, not in the URL (see credentials.resolve)")
        self.base_url = base_url.rstrip("/")
        self.shown_url = mask_url(self.base_url)
        self._scheme, self._host, self._port = parts.scheme, parts.hostname or "", parts.port
        self._path = parts.path.rstrip("/")
        self.write = write
        # Overall time limit of one operation (one GET, HEAD or PUT including its body).
        self.timeout_s = timeout_s
        self._headers = (credentials or Credentials()).headers()
        self._tls = self._tls_context(ca_file) if parts.scheme == "https" else None
        self.sign_key = sign_key
        self.verify_key = verify_key
        # Set after a connection-level failure; the remote is then skipped (see module doc).
        self.disabled_reason: str | None = None
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"RemoteCache({self.shown_url!r}, write={self.write})"

    @staticmethod
    def _tls_context(ca_file) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        return ctx

    # ----------------------------------------------------------------- action cache

    def get_ac(self, key: str) -> bytes | None:
        try:
            with self._exchange("GET", f"ac/{key}") as (resp, deadline):
                if resp is None:
                    return None
                declared = _content_length(resp)
                if declared is not None and declared > _MAX_AC_BYTES:
                    raise self._miss(f"GET ac/{key[:12]}: {declared} bytes is too large for an action entry")
                chunks = list(_read_bounded(resp, _MAX_AC_BYTES + 1, deadline))
        except _Miss:
            return None
        except _NETWORK_ERRORS as e:
            self._fail(f"GET ac/{key[:12]}: {_why(e)}")
            return None
        data = b"".join(chunks)
        if len(data) > _MAX_AC_BYTES:
            self._fail(f"GET ac/{key[:12]}: response too large for an action entry", disable=False)
            return None
        return data

    def put_ac(self, key: str, data: bytes) -> bool:
        if self.sign_key is not None:
            data = signing.sign(data, self.sign_key)
        return self._put(f"ac/{key}", [data], len(data))

    def entry_problem(self, raw: bytes) -> str | None:
        """Why an entry fetched from this remote must not be trusted (None: trust it)."""
        if self.verify_key is None:
            return None
        return signing.problem(raw, self.verify_key)

    # ----------------------------------------------------------------- content-addressed store

    def has_cas(self, digest: str) -> bool:
        try:
            with self._exchange("HEAD", f"cas/{digest}") as (resp, _):
                return resp is not None and resp.status == 200
        except _Miss:
            return False
        except _NETWORK_ERRORS as e:
            self._fail(f"HEAD cas/{digest[:12]}: {_why(e)}")
            return False

    def fetch_cas(self, digest: str, dest: Path, size: int | None = None) -> bool:
        """Download a blob to `dest` through a temp file in its folder; only bytes whose sha256
        matches are renamed into place. At most `size` bytes (the size the entry declares) are
        read. A full local disk raises OSError(ENOSPC) naming the folder."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-remote-{uuid.uuid4().hex[:16]}"
        try:
            with self._exchange("GET", f"cas/{digest}") as (resp, deadline):
                if resp is None:
                    return False
                declared = _content_length(resp)
                if size is not None and declared is not None and declared != size:
                    raise self._miss(f"GET cas/{digest[:12]}: server announces {declared} bytes, "
                                     f"the entry declares {size}")
                limit = size + 1 if size is not None else None
                got, n = _stream_hashing(_read_bounded(resp, limit, deadline), tmp)
            if size is not None and n > size:
                raise self._miss(f"GET cas/{digest[:12]}: server sent more than the {size} bytes the "
                                 f"entry declares; download stopped")
            if got != digest:
                raise self._miss(f"GET cas/{digest[:12]}: content digest mismatch (got {got[:12]})")
            os.replace(tmp, dest)
            return True
        except _Miss:
            return False
        except _LocalWriteError as e:
            if e.error.errno in _FULL_ERRNOS:
                raise OSError(e.error.errno, f"no space left on the device of {dest.parent}") from None
            raise e.error from None
        except _NETWORK_ERRORS as e:
            self._fail(f"GET cas/{digest[:12]}: {_why(e)}")
            return False
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def put_cas(self, digest: str, path: Path) -> bool:
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                return self._put(f"cas/{digest}", iter(lambda: f.read(_CHUNK), b""), size)
        except OSError as e:
            self._fail(f"PUT cas/{digest[:12]}: cannot read local blob: {e}", disable=False)
            return False

    # ----------------------------------------------------------------- plumbing

    def _put(self, rel: str, chunks, size: int) -> bool:
        if not self.write:
            return False
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        try:
            with self._exchange("PUT", rel, chunks, headers) as (resp, _):
                return resp is not None
        except _Miss:
            return False
        except _NETWORK_ERRORS as e:
            self._fail(f"PUT {rel}: {_why(e)}")
            return False

    @contextlib.contextmanager
    def _exchange(self, method: str, rel: str, chunks=None, headers: dict | None = None):
        """Yields (response, deadline), or (None, deadline) for a miss (404) or an HTTP error
        (already logged). Network errors propagate to the caller, which names the operation.
        A watchdog shuts the socket down at the deadline, whatever the server does."""
        if self.disabled_reason:
            yield None, 0.0
            return
        deadline = time.monotonic() + self.timeout_s
        conn = self._connection()
        watchdog = threading.Timer(self.timeout_s, _shut, [conn])
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                self._send(conn, method, rel, chunks, {**(headers or {}), **self._headers}, deadline)
                resp = conn.getresponse()
            except _NETWORK_ERRORS as e:
                raise _expired(e, deadline, self.timeout_s) from None
            if resp.status == 404:
                resp.read(0)
                yield None, deadline
                return
            if not 200 <= resp.status < 300:
                # 401/403: every later request would fail the same way.
                disable = resp.status in (401, 403, 407)
                self._fail(f"{method} {rel}: HTTP {resp.status} {resp.reason}", disable=disable)
                yield None, deadline
                return
            try:
                yield resp, deadline
            except _NETWORK_ERRORS as e:
                raise _expired(e, deadline, self.timeout_s) from None
        finally:
            watchdog.cancel()
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s,
                                               context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)

    def _send(self, conn, method: str, rel: str, chunks, headers: dict, deadline: float) -> None:
        conn.putrequest(method, f"{self._path}/{rel}", skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        for chunk in chunks or ():
            _check_deadline(deadline)
            conn.send(chunk)

    def _miss(self, message: str) -> _Miss:
        self._fail(message, disable=False)
        return _Miss(message)

    def _fail(self, message: str, disable: bool = True) -> None:
        self.last_error = message
        if disable:
            self.disabled_reason = message
            log.warning("remote cache %s unreachable, continuing without it: %s",
                        self.shown_url, message)
        else:
            log.warning("remote cache %s: %s", self.shown_url, message)


def _shut(conn: http.client.HTTPConnection) -> None:
    # Wakes up a recv/send blocked in another thread; close() alone would not.
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError("deadline passed")


def _expired(e: BaseException, deadline: float, limit: float) -> BaseException:
    if time.monotonic() >= deadline - 0.05:
        return TimeoutError(f"no complete answer within the {limit:g} s deadline")
    return e


def _content_length(resp) -> int | None:
    value = resp.getheader("Content-Length")
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n >= 0 else None


def _read_bounded(resp, limit: int | None, deadline: float):
    """Chunks of the body, stopping after `limit` bytes (if given) or at the deadline."""
    total = 0
    while True:
        _check_deadline(deadline)
        want = _CHUNK if limit is None else min(_CHUNK, limit - total)
        if want <= 0:
            return
        chunk = resp.read1(want)
        if not chunk:
            # The watchdog's shutdown looks like an early end of the body: say what it was.
            _check_deadline(deadline)
            return
        total += len(chunk)
        yield chunk


def _stream_hashing(chunks, tmp: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    try:
        f = open(tmp, "xb")
    except OSError as e:
        raise _LocalWriteError(e) from None
    with f:
        for chunk in chunks:
            h.update(chunk)
            n += len(chunk)
            try:
                f.write(chunk)
            except OSError as e:
                raise _LocalWriteError(e) from None
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            raise _LocalWriteError(e) from None
    return h.hexdigest(), n


def _why(e: BaseException) -> str:
    return str(getattr(e, "reason", None) or e) or type(e).__name__
