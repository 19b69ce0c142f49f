"""Paths in the spec are written relative to the YAML file's folder, wherever the tool is run from.

`SpecPath` / `ExistingFile` resolve during validation (the loader passes the folder as the
validation context `{"base_dir": ...}`), so an error such as a missing model file is reported
at its YAML line. `resolve_paths` is the safety net for spec sections that declare a plain
`Path`: it resolves whatever relative paths are left after validation.
"""

from __future__ import annotations

import os.path
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Strict, ValidationInfo


def _base(info: ValidationInfo | None) -> Path:
    ctx = info.context if info is not None else None
    return Path(ctx["base_dir"]) if ctx and "base_dir" in ctx else Path.cwd()


def _resolve(v: Path, info: ValidationInfo) -> Path:
    return absolute(v, _base(info))


def _existing_file(v: Path, info: ValidationInfo) -> Path:
    p = absolute(v, _base(info))
    if not p.exists():
        raise ValueError(f"file not found: {p}")
    if not p.is_file():
        raise ValueError(f"not a file: {p}")
    return p


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
