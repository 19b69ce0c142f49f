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
    return Cache(cache_root(spec, override), remote=remote)


def scope(spec: Spec, stage: str) -> str:
    """Key under which the last preimage of this spec's stage is remembered for `explain`."""
    return f"{spec.name}/{stage}"


@contextlib.contextmanager
def build_lock(spec: Spec) -> Iterator[None]:
    """Exclusive per build folder. Two builds of one spec would otherwise swap a stage's folder
    while the other reads it as its input; with the lock the second waits and then finds
    everything cached."""
    folder = Path(spec.build.out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f".{spec.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
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
