"""Action entries of the cache (DESIGN §4): what a stage run stored, as the JSON in ac/<aa>/<key>.json, and the
checks a parsed entry passes before anything is restored from it (it may come from a truncated write or from a
remote server we do not control)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = "manifest.json"
ENTRY_FORMAT = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Longest file-name component most filesystems accept (bytes); a longer output name cannot be restored.
_NAME_MAX = 255


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
        _check_restorable(outputs)
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


def _check_restorable(outputs: list[OutputRecord]) -> None:
    """Names that are each safe can still not be restored together: `x` and `x/y` (a file and a
    folder of one name), or a component longer than a file name may be. Such an entry is refused
    up front instead of failing half-way through a restore."""
    names = {o.name for o in outputs}
    for o in outputs:
        parts = o.name.split("/")
        if any(len(part.encode("utf-8")) > _NAME_MAX for part in parts):
            raise ValueError(f"output name too long ({len(o.name)} characters)")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in names:
                raise ValueError(f"output names clash: {prefix!r} is both a file and a folder")


def _plain(obj: Any) -> Any:
    """json.dumps fallback for the values stages like to return (numpy scalars/arrays, paths)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (Path, PurePosixPath)):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")
