"""The on-disk cache: a content-addressed store of blobs plus an action cache (DESIGN §4).

Layout under the root:
    cas/<aa>/<sha256>       one blob per distinct artifact content
    ac/<aa>/<key>.json      action entry: outputs (name -> digest, size), summary, metrics, preimage
    last/<scope-hash>.json  the last preimage seen per "<spec name>/<stage>", for `explain`
    units/<stage>/...       sub-stage units (memos, compiled objects), written without the lock
    stats.json              the last build's counters: hits, misses, entries stored and their bytes
    lock                    flock'ed by every writer of cas/, ac/ and last/

Crash safety rests on two rules: every file is written to a `.tmp-*` file in its final folder and
renamed into place, and a store writes all blobs before the action entry. A process killed at
any point therefore leaves at worst some orphan blobs and temp files (swept by `gc`), never an
entry that points at something missing. Readers never trust the disk: `lookup` re-hashes every
blob, and anything that does not verify is dropped so that the stage is rebuilt.

The action entry's format and checks are cache/entries.py; the crash-safe file operations cache/fs_ops.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from tinytrain.cache import safe_fs
from tinytrain.cache.entries import (
    MANIFEST_NAME,
    _HEX64,
    ActionEntry,
    OutputRecord,
    _plain,
    _safe_relative,
)
from tinytrain.cache.fs_ops import (
    TMP_PREFIX,
    _blob_sizes,
    _count_files,
    _fsync_dir,
    new_tmp,
    _remove_any,
    _remove_empty_dirs,
    _swap_in,
    atomic_write_bytes,
    copy_hashing,
)
from tinytrain.cache.keys import sha256_bytes, tree_files
from tinytrain.pipeline.errors import TinytrainError, UserError
from tinytrain.stages.model.ir import canonical_json

log = logging.getLogger("tinytrain.cache")

# A materialisation temp dir older than this belongs to a dead process, not a slow one.
_STALE_TMP_DIR_S = 600.0
# A temp file under units/ younger than this may still be in flight: the sub-stage caches write there without the
# store's lock (UnitCache.put, cross_compile.ObjectCache.store). Their temp file lives from its creation to its
# rename, one write of bytes already in memory (a memo of a few KB, an object of at most a few MB): milliseconds,
# seconds on a slow network disk. Ten minutes also covers a writer paused in between (a stopped process, a busy
# machine), as for the materialisation dirs above; the only cost is that a temp file a killed build left stays
# until a later gc.
UNIT_TMP_MIN_AGE_S = _STALE_TMP_DIR_S
# An action entry is a small JSON document; a bigger file in ac/ is not one of ours.
MAX_ENTRY_BYTES = 16 << 20
_READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class CacheError(TinytrainError):
    """An entry could not be restored (a blob vanished or rotted between lookup and materialise,
    or its files cannot be created here). The entry has been dropped; the stage can be rerun."""


class CacheDirError(UserError):
    """The cache folder cannot be used at all (a file is in its place, it cannot be created)."""


class DiskFullError(UserError):
    """No space left on the device of a named folder: the environment, not tinytrain, so exit code 2."""


def disk_full(folder: Path, what: str) -> DiskFullError:
    return DiskFullError(f"no space left on the device of {folder} ({what})",
                         hint="free some space, or shrink the cache: tinytrain cache gc --max-size 2G")


class Cache:
    def __init__(self, root: Path | str, remote: "Any | None" = None):
        self.root = Path(root).expanduser()
        self.remote = remote
        # Why the last lookup returned None although something was there (for logs and `status`).
        self.last_drop_reason: str | None = None
        # Set when the folder cannot be written: cached results are still served, and new ones go
        # to a private scratch folder that lives as long as this object (see _go_read_only).
        self.read_only_reason: str | None = None
        self._scratch: Path | None = None
        self._counters: dict = {}
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._lock_fd: int | None = None
        self._open_root()

    @classmethod
    def default_root(cls) -> Path:
        env = os.environ.get("TINYTRAIN_CACHE_DIR")
        if env:
            return Path(env).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg:
            return Path(xdg).expanduser() / "tinytrain"
        return Path.home() / ".cache" / "tinytrain"

    def _open_root(self) -> None:
        hint = "give --cache-dir (or build.cache_dir, $TINYTRAIN_CACHE_DIR) a folder you can write"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise CacheDirError(f"cache folder {self.root} is not a folder (a file is in its way)",
                                hint=hint) from None
        except OSError as e:
            if not safe_fs.is_real_dir(self.root) and not self.root.is_dir():
                raise CacheDirError(f"cannot create the cache folder {self.root}: {e.strerror}",
                                    hint=hint) from None
        if not self.root.is_dir():
            raise CacheDirError(f"cache folder {self.root} is not a folder", hint=hint)
        probe = new_tmp(self.root, "probe-")
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as e:
            if e.errno not in _READ_ONLY_ERRNOS + _FULL_ERRNOS:
                raise CacheDirError(f"cannot use the cache folder {self.root}: {e.strerror}",
                                    hint=hint) from None
            self._go_read_only(e.strerror)
            return
        # The folder is writable. A concurrent build that sweeps stale temp files under the lock may already have
        # removed the probe: that is no error.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)

    def _go_read_only(self, why: str) -> None:
        if self.read_only_reason is not None:
            return
        self.read_only_reason = why
        self._scratch = Path(tempfile.mkdtemp(prefix="tinytrain-scratch-cache-"))
        weakref.finalize(self, shutil.rmtree, str(self._scratch), True)
        log.warning("cache folder %s cannot be written (%s): cached results are used, new ones "
                    "are not kept", self.root, why)

    @property
    def read_only(self) -> bool:
        return self.read_only_reason is not None

    # ----------------------------------------------------------------- layout

    @property
    def write_root(self) -> Path:
        """Where new files go: the cache folder, or the scratch folder when it is read-only."""
        return self._scratch if self._scratch is not None else self.root

    @property
    def cas_dir(self) -> Path:
        return self.root / "cas"

    @property
    def ac_dir(self) -> Path:
        return self.root / "ac"

    @property
    def units_dir(self) -> Path:
        """Sub-stage memo files (StageContext.unit_cache_dir)."""
        return self.write_root / "units"

    def blob_path(self, digest: str) -> Path:
        return self._readable(Path("cas") / digest[:2] / digest)

    def entry_path(self, key: str) -> Path:
        if not _HEX64.match(key):
            raise ValueError(f"not an action key: {key!r}")
        return self._readable(Path("ac") / key[:2] / f"{key}.json")

    def _blob_write_path(self, digest: str) -> Path:
        return self.write_root / "cas" / digest[:2] / digest

    def _entry_write_path(self, key: str) -> Path:
        self.entry_path(key)  # validates the key
        return self.write_root / "ac" / key[:2] / f"{key}.json"

    def _readable(self, rel: Path) -> Path:
        # Read-only: what this process stored lives in the scratch folder, the rest in the cache.
        if self._scratch is not None and os.path.lexists(self._scratch / rel):
            return self._scratch / rel
        return self.root / rel

    def _last_path(self, scope: str) -> Path:
        return self.write_root / "last" / f"{sha256_bytes(scope.encode('utf-8'))}.json"

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

    def _acquire_flock(self) -> int | None:
        if self.read_only:
            # A shared lock on an existing lock file still keeps a writer (e.g. its owner's gc)
            # from changing what we read; without one, there is nobody to coordinate with.
            try:
                fd = os.open(self.root / "lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None
            fcntl.flock(fd, fcntl.LOCK_SH)
            return fd
        path = self.root / "lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            # Someone planted a symlink where our lock file goes: never write through it.
            log.warning("cache: removed %s, a symlink where the lock file belongs", path)
            path.unlink()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
        if not self._real_dirs(path, create=False):
            return None
        try:
            raw = safe_fs.read_regular(path, MAX_ENTRY_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            # A symlink, FIFO, device or giant file where an entry belongs: never trusted.
            self._remove_unsafe(path, str(e))
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
        if not self._real_dirs(path, create=False):
            return f"blob {out.digest[:12]} is missing"
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                self._remove_unsafe(path, f"is {safe_fs.kind_of(st.st_mode)}")
                return f"blob {out.digest[:12]} was {safe_fs.kind_of(st.st_mode)}, not a file"
            if st.st_size != out.size:
                return f"blob {out.digest[:12]} has {st.st_size} bytes, expected {out.size}"
            digest, _ = safe_fs.sha256_regular(path)
            if digest != out.digest:
                return f"blob {out.digest[:12]} is corrupt (digest mismatch)"
        except FileNotFoundError:
            return f"blob {out.digest[:12]} is missing"
        except OSError as e:
            return f"blob {out.digest[:12]} cannot be read: {e.strerror or e}"
        return None

    def _real_dirs(self, path: Path, create: bool) -> bool:
        """Whether every folder from the cache root down to `path`'s folder is a real folder.
        A symlink or file planted in their place (`cas/ab` -> somewhere else) is reported and
        removed, so that nothing is ever read from or written to outside the cache."""
        base = self._scratch if self._scratch is not None and path.is_relative_to(self._scratch) else self.root
        d = base
        for part in path.parent.relative_to(base).parts:
            d = d / part
            try:
                mode = os.lstat(d).st_mode
            except FileNotFoundError:
                if not create:
                    return False
                d.mkdir(exist_ok=True)
                continue
            if not stat.S_ISDIR(mode):
                self._remove_unsafe(d, f"is {safe_fs.kind_of(mode)}")
                if not create:
                    return False
                d.mkdir()
        return True

    def _remove_unsafe(self, path: Path, what: str) -> None:
        """Report and remove (the link itself, never its target) something that is not ours."""
        try:
            _remove_any(path)
            done = "removed"
        except OSError:
            done = "left in place (the cache cannot be written)"
        log.warning("cache: %s %s; %s, not trusted", path, what, done)

    def _drop(self, key: str, seen: bytes, reason: str) -> None:
        """Remove a bad entry, unless another process replaced it since we read it."""
        self.last_drop_reason = reason
        log.warning("cache entry %s dropped: %s", key[:12], reason)
        with self.lock():
            path = self.entry_path(key)
            # A read-only folder keeps its (bad) entry: the stage is rerun every time, correctly.
            with contextlib.suppress(OSError, ValueError):
                if safe_fs.read_regular(path, MAX_ENTRY_BYTES) == seen:
                    path.unlink()
            self._drop_rotten_blobs(seen, key)

    def _drop_rotten_blobs(self, raw: bytes, key: str) -> None:
        # A corrupt blob is removed so that other entries sharing it fail fast and the next
        # store writes a good copy.
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            for out in ActionEntry.from_json_bytes(raw, key).outputs:
                problem = self._blob_problem(out)
                if problem and "missing" not in problem:
                    with contextlib.suppress(OSError):
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
        entry = ActionEntry(key, [], summary, dict(metrics), float(duration_s), plain_preimage, time.time())
        with self.lock():
            try:
                self._store_locked(entry, files)
            except OSError as e:
                if e.errno in _FULL_ERRNOS:
                    raise disk_full(self.write_root, f"the cache, storing the results of "
                                    f"{plain_preimage.get('stage', 'a stage')}") from None
                if e.errno not in _READ_ONLY_ERRNOS or self.read_only:
                    raise
                self._go_read_only(e.strerror)
                self._store_locked(entry, files)
            self._bump(stored=1, stored_bytes=sum(o.size for o in entry.outputs))
        if self.remote is not None and getattr(self.remote, "write", False):
            self._upload(entry)
        return entry

    def _store_locked(self, entry: ActionEntry, files: list[tuple[str, Path]]) -> None:
        entry.outputs = [self._put_blob(name, path) for name, path in files]
        self._write_entry(entry.key, entry.to_json_bytes())

    def _write_entry(self, key: str, raw: bytes) -> None:
        path = self._entry_write_path(key)
        self._real_dirs(path, create=True)
        if os.path.lexists(path) and not os.path.isfile(path) or os.path.islink(path):
            _remove_any(path)
        atomic_write_bytes(path, raw)

    def _put_blob(self, name: str, src: Path) -> OutputRecord:
        # Copy-and-hash in one pass into a temp file, then rename it to its digest. An existing
        # blob is simply replaced: same bytes if it was good, repaired if it had rotted.
        cas = self.write_root / "cas"
        self._real_dirs(cas / "x", create=True)
        tmp = new_tmp(cas)
        try:
            digest, size = copy_hashing(src, tmp, fsync=True)
            final = self._blob_write_path(digest)
            self._real_dirs(final, create=True)
            if os.path.islink(final) or os.path.lexists(final) and not os.path.isfile(final):
                _remove_any(final)  # a planted symlink or folder: os.replace must not go through it
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
            tmp = new_tmp(dest.parent, f"{dest.name}-")
            tmp.mkdir()
            try:
                try:
                    for out in entry.outputs:
                        self._copy_out(entry, out, tmp / out.name)
                except OSError as e:
                    # Total or nothing: an entry whose files cannot all be created here is dropped,
                    # so that the stage reruns instead of failing every later build the same way.
                    if e.errno in _FULL_ERRNOS:
                        raise disk_full(dest.parent, f"restoring {dest.name}") from None
                    reason = f"cannot restore it in {dest}: {e.strerror or e}"
                    self._drop(entry.key, self._raw_of(entry), reason)
                    raise CacheError(f"cache entry for {entry.key[:12]} dropped ({reason})",
                                     hint="build again; the stage will be rerun") from None
                (tmp / MANIFEST_NAME).write_text(self._manifest(entry))
                _swap_in(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return {out.name: dest / out.name for out in entry.outputs}

    def _raw_of(self, entry: ActionEntry) -> bytes:
        with contextlib.suppress(OSError, ValueError):
            return safe_fs.read_regular(self.entry_path(entry.key), MAX_ENTRY_BYTES)
        return entry.to_json_bytes()

    def _copy_out(self, entry: ActionEntry, out: OutputRecord, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest, _ = copy_hashing(self.blob_path(out.digest), target, fsync=False)
        except (FileNotFoundError, safe_fs.UnsafeFile):
            digest = None
        if digest != out.digest:
            reason = f"{out.name}: blob {out.digest[:12]} vanished or rotted before materialise"
            self._drop(entry.key, self._raw_of(entry), reason)
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
        rel = self._last_path(scope).relative_to(self.write_root)
        try:
            doc = json.loads(safe_fs.read_regular(self._readable(rel), MAX_ENTRY_BYTES))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("scope") != scope:
            return None
        pre = doc.get("preimage")
        return pre if isinstance(pre, dict) else None

    # ----------------------------------------------------------------- stats

    def begin_build(self) -> None:
        with self.lock():
            if not self.read_only:
                # Temp files left by a process killed mid-write (e.g. a download): every writer of these
                # holds this lock, so any temp file we can see now is stale (units/: gc, by age).
                self._sweep_temp_files(("cas", "ac", "last"))
            self._write_counters({"hits": 0, "misses": 0, "stored": 0, "stored_bytes": 0, "started": time.time()})

    def note_hit(self, key: str) -> None:
        self._bump(hits=1)

    def note_miss(self, key: str) -> None:
        self._bump(misses=1)

    def _bump(self, **add: int) -> None:
        # Read-modify-write under the lock: parallel stage processes count into one build.
        with self.lock():
            counters = self._read_counters()
            for field, n in add.items():
                counters[field] = int(counters.get(field, 0)) + n
            self._write_counters(counters)

    def _read_counters(self) -> dict:
        try:
            doc = json.loads(safe_fs.read_regular(self.write_root / "stats.json", MAX_ENTRY_BYTES))
        except (OSError, ValueError):
            return {"hits": 0, "misses": 0}
        return doc if isinstance(doc, dict) else {"hits": 0, "misses": 0}

    def _write_counters(self, counters: dict) -> None:
        # Not durable (fs_ops.atomic_write_bytes): counters of one build, which the next build starts afresh; an
        # fsync here would be two disk flushes per stage.
        atomic_write_bytes(self.write_root / "stats.json", json.dumps(counters, sort_keys=True).encode(),
                           durable=False)

    def stats(self) -> dict:
        """`tinytrain cache stats`: the store's size (a walk of cas/, ac/ and units/) and the last build's hits and
        misses."""
        blobs, blob_bytes = _count_files(self.cas_dir)
        entries, entry_bytes = _count_files(self.ac_dir)
        units, unit_bytes = _count_files(self.root / "units")
        counters = self._read_counters()
        doc = {
            "root": str(self.root),
            "size_bytes": blob_bytes + entry_bytes + unit_bytes,
            "entries": entries,
            "blobs": blobs,
            "unit_files": units,
            "hits": int(counters.get("hits", 0)),
            "misses": int(counters.get("misses", 0)),
        }
        return self._where(doc)

    def build_summary(self) -> dict:
        """The cache's part of a build's record (build.json): this build's counters, hits, misses, the entries it
        stored and their outputs' bytes (`stored`, `stored_bytes`; a restored stage is a hit), read from stats.json
        without walking the store: `stats` lists every file of it, 0.1 s of CPU for a cache of 11,000 files on a
        warm local disk, more on a cold or network one, on every build, for figures no build needs."""
        counters = self._read_counters()
        return self._where({"root": str(self.root),
                            **{k: int(counters.get(k, 0)) for k in ("hits", "misses", "stored", "stored_bytes")}})

    def _where(self, doc: dict) -> dict:
        """`doc` with why the folder is read-only and the remote cache, if any."""
        if self.read_only:
            doc["read_only"] = self.read_only_reason
        if self.remote is not None:
            doc["remote"] = getattr(self.remote, "shown_url", "?")  # masked: never credentials
        return doc

    # ----------------------------------------------------------------- gc

    def _writable_or_fail(self, what: str) -> None:
        if self.read_only:
            raise CacheDirError(f"cache folder {self.root} cannot be written ({self.read_only_reason}): "
                                f"cannot {what}")

    def gc(self, max_size: int | None = None, max_age_s: float | None = None) -> dict:
        """Drop entries last used more than max_age_s ago, then the least recently used until
        the cache is at most max_size bytes, then every blob no entry references. Sub-stage units
        (StageContext.unit_cache_dir: measurement memos, compiled objects) count towards the size and
        are dropped by the same rule, by their files' mtime (a unit's last use where its cache touches it).

        Nothing is followed: symlinks and special files found anywhere in the cache are reported
        and removed first (the link, never its target), and everything after walks with lstat."""
        self._writable_or_fail("collect garbage")
        with self.lock():
            unsafe = self._repair_unsafe()
            temps = self._sweep_temp_files(("cas", "ac", "last", "units"))
            entries = self._scan_entries()
            units = self._scan_units()
            blob_sizes = _blob_sizes(self.cas_dir)
            doomed = _choose_victims([*entries, *units], {d: size for d, (_, size) in blob_sizes.items()},
                                     max_size, max_age_s, time.time())
            for e in doomed:
                for path in e.paths:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            doomed_paths = {p for e in doomed for p in e.paths}
            live = {d for e in entries if e.path not in doomed_paths for d in e.digests}
            freed = sum(e.size for e in doomed)
            units_removed = sum(len(e.paths) for e in doomed if isinstance(e, _UnitInfo))
            blobs_removed = 0
            for digest, (path, size) in blob_sizes.items():
                if digest not in live:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    blobs_removed += 1
                    freed += size
            _remove_empty_dirs(self.cas_dir)
            _remove_empty_dirs(self.ac_dir)
            # Unit folders stay: their writers (sub-stage caches) make them without the store's lock.
        return {
            "entries_removed": sum(1 for e in doomed if isinstance(e, _EntryInfo)),
            "units_removed": units_removed,
            "blobs_removed": blobs_removed,
            "temp_files_removed": temps,
            "unsafe_removed": unsafe,
            "bytes_freed": freed,
            "size_bytes": self.stats()["size_bytes"],
        }

    def _repair_unsafe(self) -> int:
        """Remove every symlink and special file under the root (reported, never followed)."""
        removed = 0
        for path, st in safe_fs.walk(self.root):
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                continue
            if path == self.root / "lock" and not stat.S_ISLNK(st.st_mode):
                continue
            self._remove_unsafe(path, f"is {safe_fs.kind_of(st.st_mode)}")
            removed += 1
        return removed

    def _scan_units(self) -> list["_UnitInfo"]:
        """The sub-stage units (StageContext.unit_cache_dir): the files of one folder that share a name but for
        the suffix are one unit (an ObjectCache object and its header list), kept or dropped together, so that
        gc never leaves half of one behind."""
        groups: dict[Path, list[tuple[Path, os.stat_result]]] = {}
        for p, st in safe_fs.walk(self.root / "units"):
            if stat.S_ISREG(st.st_mode) and not p.name.startswith(TMP_PREFIX):
                groups.setdefault(p.with_suffix(""), []).append((p, st))
        return [_UnitInfo(tuple(sorted(p for p, _ in files)), max(st.st_mtime for _, st in files),
                          sum(st.st_size for _, st in files))
                for _, files in sorted(groups.items())]

    def _sweep_temp_files(self, subs: tuple[str, ...]) -> int:
        """Remove the temp files under `subs` (and the root's) that no writer is still writing. Every writer of
        cas/, ac/ and last/ holds the lock we hold now: all of theirs are stale. The sub-stage caches write units/
        without it: theirs only once older than UNIT_TMP_MIN_AGE_S (a clock set back keeps them too)."""
        removed = 0
        units, now = self.root / "units", time.time()
        found = [p for sub in subs for p, st in safe_fs.walk(self.root / sub) if p.name.startswith(TMP_PREFIX)
                 and (units not in p.parents or now - st.st_mtime >= UNIT_TMP_MIN_AGE_S)]
        found += [p for p in self.root.glob(f"{TMP_PREFIX}*")]
        for p in found:
            with contextlib.suppress(OSError):
                _remove_any(p)
                removed += 1
        return removed

    def _scan_entries(self) -> list["_EntryInfo"]:
        found = []
        for path, st in sorted(safe_fs.walk(self.ac_dir)):
            if path.parent.parent != self.ac_dir or path.suffix != ".json" or not stat.S_ISREG(st.st_mode):
                continue
            key = path.name[: -len(".json")]
            try:
                entry = ActionEntry.from_json_bytes(safe_fs.read_regular(path, MAX_ENTRY_BYTES), key)
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
        self._writable_or_fail("clear it")
        with self.lock():
            for sub in ("cas", "ac", "last", "units"):
                _remove_any(self.root / sub)
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
        distrust = self.remote.entry_problem(raw)
        if distrust:
            # Nothing of it is fetched or stored: the stage runs here instead.
            self.last_drop_reason = f"remote entry {key[:12]} refused: {distrust}"
            log.warning("remote cache %s: entry %s (%s) refused, %s; building it locally",
                        getattr(self.remote, "shown_url", "?"), key[:12],
                        entry.preimage.get("stage", "?"), distrust)
            return None
        with self.lock():
            for out in entry.outputs:
                if self._blob_problem(out) is None:
                    continue
                dest = self._blob_write_path(out.digest)
                try:
                    self._real_dirs(dest, create=True)
                    fetched = self.remote.fetch_cas(out.digest, dest, out.size)
                except OSError as e:
                    if e.errno in _FULL_ERRNOS:
                        raise disk_full(dest.parent, "the cache, downloading from the remote cache") from None
                    if e.errno in _READ_ONLY_ERRNOS and not self.read_only:
                        self._go_read_only(e.strerror)
                        return self._lookup_remote(key)
                    raise
                if not fetched:
                    self.last_drop_reason = f"remote blob for {out.name} unavailable or corrupt"
                    return None
            # Blobs first, entry last, as for a local store.
            try:
                self._write_entry(key, raw)
            except OSError as e:
                if e.errno in _FULL_ERRNOS:
                    raise disk_full(self.write_root, "the cache, storing a remote entry") from None
                raise
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

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.path,)


@dataclass(frozen=True)
class _UnitInfo:
    """A sub-stage unit for gc: its files, their last modification, their bytes (it references no blob)."""
    paths: tuple[Path, ...]
    last_used: float
    size: int
    digests: frozenset = frozenset()
    readable: bool = True


def _choose_victims(entries: list[_EntryInfo | _UnitInfo], blob_sizes: dict[str, int], max_size: int | None,
                    max_age_s: float | None, now: float) -> list[_EntryInfo | _UnitInfo]:
    def doomed_now(e: _EntryInfo | _UnitInfo) -> bool:
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

