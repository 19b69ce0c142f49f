"""Crash-safe file operations of the cache (DESIGN §4): write to a `.tmp-*` file in the final folder, fsync, rename
into place; swap folders in and out; count and sweep."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import uuid
from pathlib import Path

from tinytrain.cache import safe_fs

TMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not every filesystem supports it, and it is only insurance.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def new_tmp(folder: Path, tag: str = "") -> Path:
    return folder / f"{TMP_PREFIX}{tag}{uuid.uuid4().hex[:16]}"


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write `data` to `path` through a temp file renamed into place: a reader sees the old file or the new one,
    never half of one. `durable` also fsyncs the file and its folder, so that the new bytes survive a power loss
    once this returns: what the cache keeps (entries, `last/`) needs that, since a later build trusts them. A file
    that the next build writes again anyway (the build record, the report, the build's counters) does not: after a
    crash it is at worst stale or gone, and two fsyncs per write are a disk flush each on every build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_tmp(path.parent)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def copy_hashing(src: Path, dst: Path, *, fsync: bool) -> tuple[str, int]:
    """Copy src to dst (created exclusively) and return (sha256, size) of the bytes copied."""
    h = hashlib.sha256()
    size = 0
    with os.fdopen(safe_fs.open_regular(src), "rb") as fi, open(dst, "xb") as fo:
        while chunk := fi.read(_CHUNK):
            h.update(chunk)
            fo.write(chunk)
            size += len(chunk)
        if fsync:
            fo.flush()
            os.fsync(fo.fileno())
    return h.hexdigest(), size




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
    old = new_tmp(dest.parent, f"old-{dest.name}-")
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
    for p, st in safe_fs.walk(folder):
        if stat.S_ISREG(st.st_mode) and not p.name.startswith(TMP_PREFIX):
            n += 1
            size += st.st_size
    return n, size


def _blob_sizes(cas: Path) -> dict[str, tuple[Path, int]]:
    """digest -> (path, size) of every regular file at cas/<aa>/<name> (lstat: links are not blobs)."""
    sizes = {}
    for p, st in safe_fs.walk(cas):
        if (p.parent.parent == cas and stat.S_ISREG(st.st_mode)
                and not p.name.startswith(TMP_PREFIX)):
            sizes[p.name] = (p, st.st_size)
    return sizes


def _remove_empty_dirs(folder: Path) -> None:
    for p, st in safe_fs.walk(folder):
        if stat.S_ISDIR(st.st_mode) and p.parent == folder:
            with contextlib.suppress(OSError):
                p.rmdir()
