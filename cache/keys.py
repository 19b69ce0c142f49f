"""Action keys: what a stage's result depends on, hashed (DESIGN §4).

The runner builds a "preimage" dict (schema version, stage, source digest, config slice, input
content digests, tool identities, library versions, salt) and `action_key` hashes its canonical JSON. The preimage
itself is stored with the result so `tinytrain explain` can diff it field by field.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

from tinytrain.cache.imports import ModuleFile, import_closure, package_module_file, third_party_imports
from tinytrain.stages.model.ir import canonical_json

# Bump when the meaning of a preimage changes, so that old entries can never be mistaken for new ones.
# 2: "impl" is the computed import closure of the stage's module, no longer a hand-kept module list.
# 3: "libraries" holds the versions of the third-party libraries the stage's code imports, and Python's.
KEY_SCHEMA_VERSION = 3

_CHUNK = 1 << 20


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_files(folder: str | os.PathLike) -> list[tuple[str, Path]]:
    """Every regular file under `folder` as (relative posix name, path), sorted by name.

    Symlinks and special files are refused rather than skipped: a silently missing artifact
    would make two different outputs hash the same."""
    root = Path(folder)
    if not root.is_dir():
        # os.walk would quietly yield nothing, and an empty artifact set would be cached.
        raise NotADirectoryError(f"{root}: not a folder")
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in dirnames:
            if (base / d).is_symlink():
                raise ValueError(f"{base / d}: symlinked folders are not allowed in an artifact tree")
        for name in filenames:
            path = base / name
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"{path}: only regular files are allowed in an artifact tree")
            found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def tree_digest(folder: str | os.PathLike) -> str:
    """Digest of a folder's content: names and bytes, not timestamps or permissions."""
    h = hashlib.sha256()
    for name, path in tree_files(folder):
        # NUL and newline cannot both be inside a POSIX file name, so entries cannot run together.
        h.update(f"{name}\0{sha256_file(path)}\n".encode())
    return h.hexdigest()


def module_source_digest(module_names: Iterable[str]) -> str:
    """sha256 over the source text of the named modules, so that editing a stage invalidates it.

    A module that cannot be found hashes as absent (its stage cannot run anyway); when it appears
    the digest changes."""
    h = hashlib.sha256()
    for name in sorted(set(module_names)):
        _hash_module(h, name, _module_origin(name))
    return h.hexdigest()


def module_closure(module: str) -> dict[str, Path] | None:
    """`module` and every tinytrain module it reaches through its imports, as {name: source file} (computed, see
    `cache.imports`); None when `module` cannot be found. A stage module outside the package (tests use these) is
    found by the import system, and only package modules are followed from it."""
    import tinytrain

    root, package = Path(tinytrain.__file__).parent, tinytrain.__name__
    start = package_module_file(root, package, module)
    if start is None and not (module == package or module.startswith(package + ".")):
        origin = _module_origin(module)
        start = ModuleFile(module, Path(origin), origin.endswith("__init__.py")) if origin else None
    return None if start is None else import_closure(start, root, package)


def implementation_digests(module: str, closure: dict[str, Path] | None = None) -> dict[str, str]:
    """The implementation version of the code `module` runs, as {module name: source digest} over its
    `module_closure` (pass it when already computed). One digest per module, so that `explain` can name the file
    that changed; a module that cannot be found hashes as absent."""
    closure = module_closure(module) if closure is None else closure
    if closure is None:
        h = hashlib.sha256()
        _hash_module(h, module, None)
        return {module: h.hexdigest()}
    digests = {}
    for name, path in sorted(closure.items()):
        h = hashlib.sha256()
        _hash_module(h, name, str(path))
        digests[name] = h.hexdigest()
    return digests


def library_versions(module: str, closure: dict[str, Path] | None = None) -> dict[str, str]:
    """{distribution: version} of the third-party libraries the code of `module` imports (read from the sources of
    its `module_closure`), plus the Python version: a new numpy or matplotlib can change the bytes a stage writes,
    so it must change the stage's key. A library that is not installed is "absent"."""
    import tinytrain

    closure = module_closure(module) if closure is None else closure
    versions = {"python": ".".join(str(v) for v in sys.version_info[:3])}
    if closure is None:
        return versions
    for top in sorted(third_party_imports(closure, tinytrain.__name__)):
        # Most libraries are distributed under their import name; the full map costs a scan of every installed
        # distribution's file list, so it is read only for the others (PIL, sklearn, yaml).
        dists = [top] if _dist_version(top) != "absent" else _distributions().get(top, [top])
        for dist in dists:
            versions[dist] = _dist_version(dist)
    return versions


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return {top: sorted(set(d)) for top, d in importlib.metadata.packages_distributions().items()}


@functools.lru_cache(maxsize=None)
def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _hash_module(h: Any, name: str, origin: str | None) -> None:
    data = Path(origin).read_bytes() if origin else b""
    marker = "present" if origin else "absent"
    h.update(f"{name}\0{marker}\0{len(data)}\0".encode())
    h.update(data)


def _module_origin(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return spec.origin


def tool_identity(cmd: list[str]) -> str:
    """First line a tool prints for e.g. `--version`; "absent" when it is not installed.

    Memoised per process: a build asks for the same compiler once per stage."""
    return _tool_identity(tuple(cmd))


@functools.lru_cache(maxsize=64)
def _tool_identity(cmd: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, errors="replace", timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return "absent"
    except subprocess.TimeoutExpired:
        # A tool that hangs on --version is still a different tool from an absent one.
        return f"unresponsive: {' '.join(cmd)}"
    text = proc.stdout.strip() or proc.stderr.strip()
    first = text.splitlines()[0].strip() if text else ""
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {first}"
    return first


def action_key(preimage: dict) -> str:
    return sha256_bytes(canonical_json(preimage).encode("utf-8"))


class _Missing(str):
    """Marks a field present on one side of a diff only. A str so that `--json` can print it,
    a distinct object so that callers can tell it from a real value with `is MISSING`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


MISSING: Any = _Missing("<absent>")


def diff_preimages(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """Field-by-field differences as (dotted path, old, new), sorted by path.

    Dicts recurse with `.key`; lists of equal length recurse with `[i]`, otherwise the whole
    list is reported. A field on one side only has MISSING on the other."""
    out: list[tuple[str, Any, Any]] = []
    # Compare what is hashed: a fresh preimage may hold tuples or numpy scalars, a stored one JSON.
    _diff("", _as_json(old), _as_json(new), out)
    out.sort(key=lambda t: t[0])
    return out


def _as_json(obj: Any) -> Any:
    return json.loads(canonical_json(obj)) if obj is not None else {}


def _diff(path: str, old: Any, new: Any, out: list) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{k}" if path else str(k)
            _diff(sub, old.get(k, MISSING), new.get(k, MISSING), out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(f"{path}[{i}]", a, b, out)
    elif not _same(old, new):
        out.append((path, old, new))


def _same(a: Any, b: Any) -> bool:
    # 1 == 1.0 == True in Python but not in the canonical JSON that is hashed.
    if a is MISSING or b is MISSING:
        return a is b
    return type(a) is type(b) and a == b
