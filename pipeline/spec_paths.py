"""Paths in the spec are written relative to the YAML file's folder, wherever the tool is run from.

`SpecPath` / `ExistingFile` resolve during validation (the loader passes the folder as the
validation context `{"base_dir": ...}`), so an error such as a missing model file is reported
at its YAML line. `resolve_paths` is the safety net for spec sections that declare a plain
`Path`: it resolves whatever relative paths are left after validation.
"""

from __future__ import annotations

import os
import os.path
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Strict, ValidationInfo

from tinytrain.cache.safe_fs import kind_of


def _base(info: ValidationInfo | None) -> Path:
    ctx = info.context if info is not None else None
    return Path(ctx["base_dir"]) if ctx and "base_dir" in ctx else Path.cwd()


def _resolve(v: Path, info: ValidationInfo) -> Path:
    p = absolute(v, _base(info))
    _refuse_special(p)
    return p


def _existing_file(v: Path, info: ValidationInfo) -> Path:
    p = absolute(v, _base(info))
    _refuse_special(p)
    if not p.exists():
        raise ValueError(f"file not found: {p}")
    if not p.is_file():
        raise ValueError(f"not a file: {p}")
    return p


# Pseudo-filesystems whose "files" are views of the kernel or of a process (environment, memory):
# never model or data files, and reading one could put secrets into an error message.
_PSEUDO_ROOTS = ("/proc", "/sys")


def _refuse_special(p: Path) -> None:
    """A path that exists must be a regular file or a folder on a real filesystem. Only metadata is
    looked at (stat does not open, so a FIFO cannot block), and no content is ever read here."""
    try:
        st = os.stat(p)
    except OSError:
        return  # missing (or unreachable): the caller's own check says so
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise ValueError(f"{p} is {kind_of(st.st_mode)}, not a regular file or folder")
    for root in _PSEUDO_ROOTS:
        try:
            if os.stat(root).st_dev == st.st_dev:
                raise ValueError(f"{p} is in the {root} pseudo-filesystem, not a regular file or folder")
        except FileNotFoundError:
            continue


def absolute(p: Path, base: Path) -> Path:
    p = Path(p).expanduser()
    # No symlink resolution: the user's spelling of a path is what error messages should show.
    return p if p.is_absolute() else Path(os.path.normpath(base / p))


# Strict(False): the spec's models are strict (spec_base.py), but a path is written as a YAML string.
SpecPath = Annotated[Path, Strict(False), AfterValidator(_resolve)]
ExistingFile = Annotated[Path, Strict(False), AfterValidator(_existing_file)]


def resolve_paths(model: BaseModel, base: Path) -> None:
    """Make every relative `Path` field in `model` (recursively) absolute against `base`."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        new = _resolved(value, base)
        if new is not value:
            # Plain attribute assignment: validate_assignment is off, and the value is already valid.
            object.__setattr__(model, name, new)


def _resolved(value: Any, base: Path) -> Any:
    if isinstance(value, Path):
        return value if value.is_absolute() else absolute(value, base)
    if isinstance(value, BaseModel):
        resolve_paths(value, base)
        return value
    if isinstance(value, list):
        new = [_resolved(v, base) for v in value]
        return value if all(a is b for a, b in zip(new, value)) else new
    if isinstance(value, dict):
        new_d = {k: _resolved(v, base) for k, v in value.items()}
        return value if all(new_d[k] is value[k] for k in value) else new_d
    return value
