"""File access for the cache that never follows a symlink and never opens a special file.

Anyone who can write the cache folder could plant `cas/<aa>` -> `/home/me/.ssh` or a blob ->
`/dev/zero`; following either would make `gc` delete files outside the cache or make a lookup hash
forever. Everything under the cache root is therefore opened with O_NOFOLLOW (and O_NONBLOCK, so
that a FIFO cannot block the open) and checked with fstat to be a regular file, and folders are
walked with lstat only.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Iterator

_CHUNK = 1 << 20


class UnsafeFile(OSError):
    """A path in the cache is a symlink, a folder where a file belongs, or a special file."""


def kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def open_regular(path: Path | str) -> int:
    """A read-only fd of `path`, which must be a regular file reached without a symlink in its
    last component. Raises FileNotFoundError, or UnsafeFile naming what it is instead."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == 40:  # ELOOP: the last component is a symlink
            raise UnsafeFile(e.errno, "is a symlink", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(0, f"is {kind_of(mode)}, not a regular file", str(path))
        # Regular files ignore O_NONBLOCK for reads, but clear it anyway for clarity.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path | str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (ValueError if larger)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path}: larger than {limit} bytes")
    return data


def sha256_regular(path: Path | str) -> tuple[str, int]:
    """(sha256, size) of a regular file, never following a symlink."""
    h = hashlib.sha256()
    size = 0
    with os.fdopen(open_regular(path), "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def walk(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every path below `folder` with its lstat, depth first, never entering a symlinked folder.
    A folder is yielded after its content (so callers may remove it when it became empty)."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        p = Path(entry.path)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            yield from walk(p)
        yield p, st


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
