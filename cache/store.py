"""The on-disk cache: a content-addressed store of blobs plus an action cache (DESIGN §4).

Layout under the root:
    cas/<aa>/<sha256>       one blob per distinct artifact content
    ac/<aa>/<key>.json      action entry: outputs (name -> digest, size), summary, metrics, preimage
    last/<scope-hash>.json  the last preimage seen per "<spec name>/<stage>", for `explain`
    stats.json              hits and misses of the last build
    lock                    flock'ed by every writer

Crash safety rests on two rules: every file is written to a `.tmp-*` file in its final folder and
renamed into place, and a store writes all blobs before the action entry. A process killed at
any point therefore leaves at worst some orphan blobs and temp files (swept by `gc`), never an
entry that points at something missing. Readers never trust the disk: `lookup` re-hashes every
blob, and anything that does not verify is dropped so that the stage is rebuilt.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from tinytrain.cache.keys import sha256_bytes, sha256_file, tree_files
from tinytrain.pipeline.errors import TinytrainError
from tinytrain.stages.ir import canonical_json

log = logging.getLogger("tinytrain.cache")

TMP_PREFIX = ".tmp-"
MANIFEST_NAME = "manifest.json"
ENTRY_FORMAT = 1
_CHUNK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A materialisation temp dir older than this belongs to a dead process, not a slow one.
_STALE_TMP_DIR_S = 600.0


class CacheError(TinytrainError):
    """The cache changed under a reader (a blob vanished or rotted between lookup and
    materialise). The entry has been dropped; building again rebuilds the stage."""


@dataclass
class OutputRecord:
    name: str
    digest: str
    size: int


@dataclass
class ActionEntry:
    key: str
    outputs: list[OutputRecord]
    summary: str
    metrics: dict
    duration_s: float
    preimage: dict
    created: float

    def to_json_bytes(self) -> bytes:
        doc = asdict(self)
        doc["format"] = ENTRY_FORMAT
        return json.dumps(doc, sort_keys=True, default=_plain).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, raw: bytes, expected_key: str) -> "ActionEntry":
        """Parse and validate; raises ValueError on anything unexpected, since an entry can
        come from a truncated write or from a remote server we do not control."""
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != ENTRY_FORMAT:
            raise ValueError("not an action entry of a known format")
        if doc.get("key") != expected_key:
            raise ValueError(f"entry is for key {doc.get('key')!r}")
        outputs = [_parse_output(o) for o in _typed(doc, "outputs", list)]
        if len({o.name for o in outputs}) != len(outputs):
            raise ValueError("duplicate output names")
        return cls(
            key=expected_key,
            outputs=outputs,
            summary=_typed(doc, "summary", str),
            metrics=_typed(doc, "metrics", dict),
            duration_s=float(_typed(doc, "duration_s", (int, float))),
            preimage=_typed(doc, "preimage", dict),
            created=float(_typed(doc, "created", (int, float))),
        )


def _typed(doc: dict, field: str, kind: Any) -> Any:
    value = doc.get(field)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"field {field!r} missing or of the wrong type")
    return value


def _parse_output(o: Any) -> OutputRecord:
    if not isinstance(o, dict):
        raise ValueError("output record is not an object")
    name, digest, size = o.get("name"), o.get("digest"), o.get("size")
    if not isinstance(name, str) or not _safe_relative(name):
        raise ValueError(f"unsafe output name {name!r}")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise ValueError(f"bad digest for {name!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"bad size for {name!r}")
    return OutputRecord(name, digest, size)


def _safe_relative(name: str) -> bool:
    # Output names become paths under the materialisation folder; an entry from a remote must not
    # be able to write outside it.
    p = PurePosixPath(name)
    return (
        bool(name) and not p.is_absolute() and "\\" not in name and "\0" not in name
        and all(part not in ("", ".", "..") for part in name.split("/"))
        and name != MANIFEST_NAME
    )


def _plain(obj: Any) -> Any:
    """json.dumps fallback for the values stages like to return (numpy scalars/arrays, paths)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (Path, PurePosixPath)):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not every filesystem supports it, and it is only insurance.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _new_tmp(folder: Path, tag: str = "") -> Path:
    return folder / f"{TMP_PREFIX}{tag}{uuid.uuid4().hex[:16]}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_tmp(path.parent)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def copy_hashing(src: Path, dst: Path, *, fsync: bool) -> tuple[str, int]:
    """Copy src to dst (created exclusively) and return (sha256, size) of the bytes copied."""
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        while chunk := fi.read(_CHUNK):
            h.update(chunk)
            fo.write(chunk)
            size += len(chunk)
        if fsync:
            fo.flush()
            os.fsync(fo.fileno())
    return h.hexdigest(), size


class Cache:
    def __init__(self, root: Path | str, remote: "Any | None" = None):
        self.root = Path(root).expanduser()
        self.remote = remote
        # Why the last lookup returned None although something was there (for logs and `status`).
        self.last_drop_reason: str | None = None
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._lock_fd: int | None = None
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def default_root(cls) -> Path:
        env = os.environ.get("TINYTRAIN_CACHE_DIR")
        if env:
            return Path(env).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg:
            return Path(xdg).expanduser() / "tinytrain"
        return Path.home() / ".cache" / "tinytrain"

    # ----------------------------------------------------------------- layout

    @property
    def cas_dir(self) -> Path:
        return self.root / "cas"

    @property
    def ac_dir(self) -> Path:
        return self.root / "ac"

    def blob_path(self, digest: str) -> Path:
        return self.cas_dir / digest[:2] / digest

    def entry_path(self, key: str) -> Path:
        if not _HEX64.match(key):
            raise ValueError(f"not an action key: {key!r}")
        return self.ac_dir / key[:2] / f"{key}.json"

    def _last_path(self, scope: str) -> Path:
        return self.root / "last" / f"{sha256_bytes(scope.encode('utf-8'))}.json"

    # ----------------------------------------------------------------- lock

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive across processes (flock) and threads (RLock); re-entrant within a thread,
        so that e.g. a lookup that drops an entry can be called while the caller holds it."""
        with self._thread_lock:
            if self._lock_depth == 0:
                self._lock_fd = self._acquire_flock()
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0 and self._lock_fd is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                    self._lock_fd = None

    def _acquire_flock(self) -> int:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for the cache lock on %s (another build is writing)", self.root)
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ----------------------------------------------------------------- lookup

    def lookup(self, key: str) -> ActionEntry | None:
        """The entry for `key` with every blob verified, or None (then maybe last_drop_reason)."""
        self.last_drop_reason = None
        entry = self._lookup_local(key)
        if entry is None and self.remote is not None:
            entry = self._lookup_remote(key)
        if entry is not None:
            # mtime doubles as "last access" for gc --max-age.
            with contextlib.suppress(OSError):
                os.utime(self.entry_path(key))
        return entry

    def _lookup_local(self, key: str) -> ActionEntry | None:
        path = self.entry_path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            entry = ActionEntry.from_json_bytes(raw, key)
        except (ValueError, UnicodeDecodeError) as e:
            self._drop(key, raw, f"unparsable action entry {path.name}: {e}")
            return None
        problem = self._verify_blobs(entry)
        if problem:
            self._drop(key, raw, problem)
            return None
        return entry

    def _verify_blobs(self, entry: ActionEntry) -> str | None:
        for out in entry.outputs:
            problem = self._blob_problem(out)
            if problem:
                return f"{out.name}: {problem}"
        return None

    def _blob_problem(self, out: OutputRecord) -> str | None:
        path = self.blob_path(out.digest)
        try:
            size = path.stat().st_size
            if size != out.size:
                return f"blob {out.digest[:12]} has {size} bytes, expected {out.size}"
            if sha256_file(path) != out.digest:
                return f"blob {out.digest[:12]} is corrupt (digest mismatch)"
        except FileNotFoundError:
            return f"blob {out.digest[:12]} is missing"
        return None

    def _drop(self, key: str, seen: bytes, reason: str) -> None:
        """Remove a bad entry, unless another process replaced it since we read it."""
        self.last_drop_reason = reason
        log.warning("cache entry %s dropped: %s", key[:12], reason)
        with self.lock():
            path = self.entry_path(key)
            with contextlib.suppress(FileNotFoundError):
                if path.read_bytes() == seen:
                    path.unlink()
            self._drop_rotten_blobs(seen, key)

    def _drop_rotten_blobs(self, raw: bytes, key: str) -> None:
        # A corrupt blob is removed so that other entries sharing it fail fast and the next
        # store writes a good copy.
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            for out in ActionEntry.from_json_bytes(raw, key).outputs:
                problem = self._blob_problem(out)
                if problem and "missing" not in problem:
                    with contextlib.suppress(FileNotFoundError):
                        self.blob_path(out.digest).unlink()

    # ----------------------------------------------------------------- store

    def store(self, key: str, preimage: dict, out_dir: Path, summary: str, metrics: dict,
              duration_s: float) -> ActionEntry:
        """Record a successful stage's outputs: every regular file under out_dir."""
        files = tree_files(out_dir)
        for name, _ in files:
            if not _safe_relative(name):
                raise ValueError(f"{out_dir}: artifact name {name!r} is reserved or unsafe")
        plain_preimage = json.loads(canonical_json(preimage))
        with self.lock():
            outputs = [self._put_blob(name, path) for name, path in files]
            entry = ActionEntry(key, outputs, summary, dict(metrics), float(duration_s),
                                plain_preimage, time.time())
            atomic_write_bytes(self.entry_path(key), entry.to_json_bytes())
        if self.remote is not None and getattr(self.remote, "write", False):
            self._upload(entry)
        return entry

    def _put_blob(self, name: str, src: Path) -> OutputRecord:
        # Copy-and-hash in one pass into a temp file, then rename it to its digest. An existing
        # blob is simply replaced: same bytes if it was good, repaired if it had rotted.
        self.cas_dir.mkdir(parents=True, exist_ok=True)
        tmp = _new_tmp(self.cas_dir)
        try:
            digest, size = copy_hashing(src, tmp, fsync=True)
            final = self.blob_path(digest)
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(final.parent)
        self._after_blob_written(name)
        return OutputRecord(name, digest, size)

    def _after_blob_written(self, name: str) -> None:
        """Test seam: crash-safety tests kill the process here, between blobs and entry."""

    # ----------------------------------------------------------------- materialise

    def materialize(self, entry: ActionEntry, dest: Path) -> dict[str, Path]:
        """Make `dest` hold exactly the entry's outputs plus manifest.json, swapped in whole."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self.lock():
            self._sweep_stale_tmp_dirs(dest)
            tmp = _new_tmp(dest.parent, f"{dest.name}-")
            tmp.mkdir()
            try:
                for out in entry.outputs:
                    self._copy_out(entry, out, tmp / out.name)
                (tmp / MANIFEST_NAME).write_text(self._manifest(entry))
                _swap_in(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return {out.name: dest / out.name for out in entry.outputs}

    def _copy_out(self, entry: ActionEntry, out: OutputRecord, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest, _ = copy_hashing(self.blob_path(out.digest), target, fsync=False)
        except FileNotFoundError:
            digest = None
        if digest != out.digest:
            raw = entry.to_json_bytes()
            with contextlib.suppress(FileNotFoundError):
                raw = self.entry_path(entry.key).read_bytes()
            reason = f"{out.name}: blob {out.digest[:12]} vanished or rotted before materialise"
            self._drop(entry.key, raw, reason)
            raise CacheError(f"cache entry for {entry.key[:12]} became invalid ({reason})",
                             hint="build again; the stage will be rerun")

    @staticmethod
    def _manifest(entry: ActionEntry) -> str:
        doc = {
            "key": entry.key,
            "summary": entry.summary,
            "metrics": entry.metrics,
            "duration_s": entry.duration_s,
            "outputs": [asdict(o) for o in entry.outputs],
        }
        return json.dumps(doc, indent=2, sort_keys=True, default=_plain) + "\n"

    @staticmethod
    def _sweep_stale_tmp_dirs(dest: Path) -> None:
        # Left by a process killed mid-materialise; young ones may belong to a live process
        # that uses another cache root (and so another lock).
        now = time.time()
        for p in dest.parent.glob(f"{TMP_PREFIX}*{dest.name}-*"):
            with contextlib.suppress(OSError):
                if now - p.lstat().st_mtime > _STALE_TMP_DIR_S:
                    _remove_any(p)

    # ----------------------------------------------------------------- explain

    def record_last(self, scope: str, preimage: dict) -> None:
        doc = {"scope": scope, "preimage": json.loads(canonical_json(preimage))}
        with self.lock():
            atomic_write_bytes(self._last_path(scope), json.dumps(doc, sort_keys=True).encode())

    def last_preimage(self, scope: str) -> dict | None:
        try:
            doc = json.loads(self._last_path(scope).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("scope") != scope:
            return None
        pre = doc.get("preimage")
        return pre if isinstance(pre, dict) else None

    # ----------------------------------------------------------------- stats

    def begin_build(self) -> None:
        with self.lock():
            self._write_counters({"hits": 0, "misses": 0, "started": time.time()})

    def note_hit(self, key: str) -> None:
        self._bump("hits")

    def note_miss(self, key: str) -> None:
        self._bump("misses")

    def _bump(self, field: str) -> None:
        # Read-modify-write under the lock: parallel stage processes count into one build.
        with self.lock():
            counters = self._read_counters()
            counters[field] = int(counters.get(field, 0)) + 1
            self._write_counters(counters)

    def _read_counters(self) -> dict:
        try:
            doc = json.loads((self.root / "stats.json").read_bytes())
        except (OSError, ValueError):
            return {"hits": 0, "misses": 0}
        return doc if isinstance(doc, dict) else {"hits": 0, "misses": 0}

    def _write_counters(self, counters: dict) -> None:
        atomic_write_bytes(self.root / "stats.json", json.dumps(counters, sort_keys=True).encode())

    def stats(self) -> dict:
        blobs, blob_bytes = _count_files(self.cas_dir)
        entries, entry_bytes = _count_files(self.ac_dir)
        counters = self._read_counters()
        return {
            "root": str(self.root),
            "size_bytes": blob_bytes + entry_bytes,
            "entries": entries,
            "blobs": blobs,
            "hits": int(counters.get("hits", 0)),
            "misses": int(counters.get("misses", 0)),
        }

    # ----------------------------------------------------------------- gc

    def gc(self, max_size: int | None = None, max_age_s: float | None = None) -> dict:
        """Drop entries last used more than max_age_s ago, then the least recently used until
        the cache is at most max_size bytes, then every blob no entry references."""
        with self.lock():
            temps = self._sweep_temp_files()
            entries = self._scan_entries()
            blob_sizes = _blob_sizes(self.cas_dir)
            doomed = _choose_victims(entries, blob_sizes, max_size, max_age_s, time.time())
            for e in doomed:
                with contextlib.suppress(FileNotFoundError):
                    e.path.unlink()
            doomed_paths = {e.path for e in doomed}
            live = {d for e in entries if e.path not in doomed_paths for d in e.digests}
            freed = sum(e.size for e in doomed)
            blobs_removed = 0
            for digest, size in blob_sizes.items():
                if digest not in live:
                    with contextlib.suppress(FileNotFoundError):
                        self.blob_path(digest).unlink()
                    blobs_removed += 1
                    freed += size
            _remove_empty_dirs(self.cas_dir)
            _remove_empty_dirs(self.ac_dir)
            units = self._expire_units(max_age_s, time.time())
        return {
            "entries_removed": len(doomed),
            "units_removed": units,
            "blobs_removed": blobs_removed,
            "temp_files_removed": temps,
            "bytes_freed": freed,
            "size_bytes": self.stats()["size_bytes"],
        }

    def _expire_units(self, max_age_s: float | None, now: float) -> int:
        """Sub-stage memo files (StageContext.unit_cache_dir) are small and content-keyed: only age drops them."""
        if max_age_s is None:
            return 0
        removed = 0
        for p in (self.root / "units").rglob("*.json"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > max_age_s:
                    p.unlink()
                    removed += 1
        return removed

    def _sweep_temp_files(self) -> int:
        # Safe to delete every temp file: all writers hold the lock we hold now.
        removed = 0
        for sub in ("cas", "ac", "last", "units"):
            for p in (self.root / sub).rglob(f"{TMP_PREFIX}*"):
                with contextlib.suppress(OSError):
                    _remove_any(p)
                    removed += 1
        for p in self.root.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                _remove_any(p)
                removed += 1
        return removed

    def _scan_entries(self) -> list["_EntryInfo"]:
        found = []
        for path in sorted(self.ac_dir.glob("*/*.json")):
            key = path.name[: -len(".json")]
            try:
                st = path.stat()
                entry = ActionEntry.from_json_bytes(path.read_bytes(), key)
            except (OSError, ValueError, UnicodeDecodeError):
                # Unreadable entries are garbage: make them the first victims.
                found.append(_EntryInfo(path, 0.0, 0, frozenset(), readable=False))
                continue
            last_used = max(st.st_mtime, entry.created)
            found.append(_EntryInfo(path, last_used, st.st_size,
                                    frozenset(o.digest for o in entry.outputs)))
        return found

    # ----------------------------------------------------------------- clear

    def clear(self) -> None:
        with self.lock():
            for sub in ("cas", "ac", "last", "units"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (self.root / "stats.json").unlink()

    # ----------------------------------------------------------------- remote

    def _lookup_remote(self, key: str) -> ActionEntry | None:
        raw = self.remote.get_ac(key)
        if raw is None:
            return None
        try:
            entry = ActionEntry.from_json_bytes(raw, key)
        except (ValueError, UnicodeDecodeError) as e:
            self.last_drop_reason = f"remote action entry unparsable: {e}"
            log.warning("remote cache: %s", self.last_drop_reason)
            return None
        with self.lock():
            for out in entry.outputs:
                if self._blob_problem(out) is None:
                    continue
                if not self.remote.fetch_cas(out.digest, self.blob_path(out.digest)):
                    self.last_drop_reason = f"remote blob for {out.name} unavailable or corrupt"
                    return None
            # Blobs first, entry last, as for a local store.
            atomic_write_bytes(self.entry_path(key), raw)
        return entry

    def _upload(self, entry: ActionEntry) -> bool:
        for out in entry.outputs:
            if self.remote.has_cas(out.digest):
                continue
            if not self.remote.put_cas(out.digest, self.blob_path(out.digest)):
                return False
        return self.remote.put_ac(entry.key, entry.to_json_bytes())


@dataclass(frozen=True)
class _EntryInfo:
    path: Path
    last_used: float
    size: int
    digests: frozenset
    readable: bool = True


def _choose_victims(entries: list[_EntryInfo], blob_sizes: dict[str, int], max_size: int | None,
                    max_age_s: float | None, now: float) -> list[_EntryInfo]:
    def doomed_now(e: _EntryInfo) -> bool:
        too_old = max_age_s is not None and now - e.last_used > max_age_s
        return not e.readable or too_old

    victims = [e for e in entries if doomed_now(e)]
    if max_size is None:
        return victims
    # Least recently used first.
    survivors = sorted((e for e in entries if not doomed_now(e)), key=lambda e: e.last_used)
    refs: dict[str, int] = {}
    for e in survivors:
        for d in e.digests:
            refs[d] = refs.get(d, 0) + 1
    total = sum(e.size for e in survivors) + sum(blob_sizes.get(d, 0) for d in refs)
    for e in survivors:
        if total <= max_size:
            break
        victims.append(e)
        total -= e.size
        for d in e.digests:
            refs[d] -= 1
            if refs[d] == 0:
                total -= blob_sizes.get(d, 0)
    return victims


def _swap_in(new: Path, dest: Path) -> None:
    """Rename `new` to `dest`, moving any old `dest` aside first and deleting it after, so a
    reader sees the old folder, no folder, or the new one; never a half-written one."""
    for _ in range(5):
        old = _move_aside(dest)
        try:
            os.rename(new, dest)
        except OSError as e:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.rename(old, dest)
                _remove_any(old)
            # Another writer (using another cache root, hence another lock) put a dest back
            # between our two renames: try again.
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                continue
            raise
        if old is not None:
            _remove_any(old)
        _fsync_dir(dest.parent)
        return
    raise OSError(f"could not replace {dest}: it keeps being recreated")


def _move_aside(dest: Path) -> Path | None:
    if not (dest.exists() or dest.is_symlink()):
        return None
    old = _new_tmp(dest.parent, f"old-{dest.name}-")
    try:
        os.rename(dest, old)
    except FileNotFoundError:
        return None
    return old


def _remove_any(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _count_files(folder: Path) -> tuple[int, int]:
    n = size = 0
    for p in folder.rglob("*"):
        if p.name.startswith(TMP_PREFIX):
            continue
        with contextlib.suppress(OSError):
            st = p.lstat()
            if p.is_file():
                n += 1
                size += st.st_size
    return n, size


def _blob_sizes(cas: Path) -> dict[str, int]:
    sizes = {}
    for p in cas.glob("*/*"):
        if p.name.startswith(TMP_PREFIX):
            continue
        with contextlib.suppress(OSError):
            sizes[p.name] = p.stat().st_size
    return sizes


def _remove_empty_dirs(folder: Path) -> None:
    for p in folder.glob("*"):
        if p.is_dir():
            with contextlib.suppress(OSError):
                p.rmdir()
