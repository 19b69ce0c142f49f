"""Where a build's files live: its artifact folders, its cache, and the lock that serialises
builds of the same spec.

Cache folder precedence (first that is set wins):
    1. `--cache-dir` on the command line   (one run, e.g. a CI step)
    2. `build.cache_dir` in the spec        (this project, versioned with it)
    3. `$TINYTRAIN_CACHE_DIR`               (this machine or CI job)
    4. `$XDG_CACHE_HOME/tinytrain`, else `~/.cache/tinytrain`
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Iterator

from tinytrain.cache.remote_config import open_remote
from tinytrain.cache.store import Cache
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.spec import Spec


def build_dir(spec: Spec) -> Path:
    return Path(spec.build.out_dir) / spec.name


def stage_dir(spec: Spec, stage: str) -> Path:
    return build_dir(spec) / stage


def cache_root(spec: Spec | None, override: str | Path | None = None) -> Path:
    if override:
        return Path(override).expanduser().absolute()
    if spec is not None and spec.build.cache_dir is not None:
        return Path(spec.build.cache_dir)
    return Cache.default_root()


def open_cache(spec: Spec | None, override: str | Path | None = None) -> Cache:
    remote = None
    if spec is not None and spec.build.remote_cache is not None:
        remote = open_remote(spec.build.remote_cache)
    root = cache_root(spec, override)
    what = ("--cache-dir" if override else "build.cache_dir" if spec is not None and spec.build.cache_dir is not None
            else "the cache folder")
    check_folder(root, what)
    try:
        return Cache(root, remote=remote)
    except (FileExistsError, NotADirectoryError) as e:  # raced with check_folder, or a stranger path
        raise UserError(f"{what} {root}: cannot be used as a folder ({e.strerror})") from None


def check_folder(path: Path, what: str) -> None:
    """A folder tinytrain will create or write into must not be (or sit under) a file: say so in one line."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == path else f"is under {p}, which is a file"
                raise UserError(f"{what} {path} {where}, not a folder")
            return


def make_folder(path: Path, what: str) -> None:
    check_folder(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as e:
        raise UserError(f"{what} {path}: cannot create it ({e.strerror})") from None


def scope(spec: Spec, stage: str) -> str:
    """Key under which the last preimage of this spec's stage is remembered for `explain`."""
    return f"{spec.name}/{stage}"


@contextlib.contextmanager
def build_lock(spec: Spec) -> Iterator[None]:
    """Exclusive per build folder. Two builds of one spec would otherwise swap a stage's folder
    while the other reads it as its input; with the lock the second waits and then finds
    everything cached."""
    folder = Path(spec.build.out_dir)
    make_folder(folder, "build.out_dir")
    check_folder(build_dir(spec), "the build folder")
    try:
        fd = os.open(folder / f".{spec.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"build.out_dir {folder}: cannot write there ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def clean(spec: Spec) -> bool:
    """Remove `<out_dir>/<name>/` (and nothing else). Returns whether there was anything."""
    target = build_dir(spec)
    with build_lock(spec):
        if not target.exists():
            return False
        shutil.rmtree(target)
    # The lock file stays: deleting it would let a waiting build lock an orphaned inode.
    return True
