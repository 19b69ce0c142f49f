"""What a stage's result depends on, as the JSON "preimage" its cache key is the hash of (DESIGN §4).

    {"key_schema": 2, "stage": "load",
     "impl":   {"tinytrain.stages.load": "<source sha256>", "tinytrain.stages.model.ir": "<source sha256>", ...,
                "files:kernels_c/*.h": "<sha256 of the matching files>"},
     "config": {"model": {"path": {"sha256": "..."}, "format": "auto"}},
     "inputs": {"load/graph.json": "<content sha256>", ...},
     "tools":  {"arm-none-eabi-gcc --version": "arm-none-eabi-gcc (15:13.2) 13.2.1"},
     "salt":   ""}

File-valued config fields enter by content ({"sha256": ...}; folders {"tree": ...}), never by
absolute path, so that the same project checked out elsewhere still hits the cache. Inputs enter
by content digest, not by the upstream key: an upstream rebuild that yields the same bytes keeps
this stage cached. The top-level field names double as the "why" of `status` and `explain`.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from tinytrain.cache.keys import (KEY_SCHEMA_VERSION, implementation_digests, library_versions, module_closure,
                                  sha256_file, tool_identity, tree_digest)
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.stage_graph import StageDef


def config_value(spec: BaseModel, dotted: str) -> Any:
    """The part of the spec at a dotted path ("train.update"); None where an optional section is absent."""
    value: Any = spec
    for part in dotted.split("."):
        if value is None:
            return None
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            raise KeyError(f"the spec has no field {dotted!r} (stage table and spec disagree)")
        value = getattr(value, part)
    return value


def config_slice(spec: BaseModel, paths: Iterable[str]) -> dict[str, Any]:
    return {p: config_value(spec, p) for p in paths}


def slice_preimage(value: Any, where: str = "") -> Any:
    """A config value in hashable JSON form: defaults included, paths replaced by content digests."""
    if isinstance(value, BaseModel):
        return {name: slice_preimage(getattr(value, name), _join(where, name)) for name in type(value).model_fields}
    if isinstance(value, Path):
        return path_digest(value, where)
    if isinstance(value, Mapping):
        return {str(k): slice_preimage(v, _join(where, str(k))) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [slice_preimage(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, enum.Enum):
        return slice_preimage(value.value, where)
    return to_jsonable_python(value)


def path_digest(path: Path, where: str = "") -> dict[str, str]:
    if path.is_file():
        return {"sha256": sha256_file(path)}
    if path.is_dir():
        return {"tree": tree_digest(path)}
    raise UserError(f"{where or 'spec'}: {path} does not exist")


def impl_digests(stage: StageDef, closure: dict[str, Path] | None = None) -> dict[str, str]:
    """The stage's implementation version: one digest per module it runs (its `impl` module and the tinytrain
    modules that reaches through imports, computed) and per glob of non-Python sources it uses, so that
    `explain` can say which source changed."""
    digests = implementation_digests(stage.impl, closure) if stage.impl else {}
    digests.update({f"files:{pattern}": package_files_digest(pattern) for pattern in stage.source_files})
    return digests


def package_files_digest(pattern: str) -> str:
    """Digest of the package's non-Python sources matching `pattern` (e.g. the C kernels a stage compiles)."""
    import hashlib

    import tinytrain

    root = Path(tinytrain.__file__).parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.glob(pattern) if p.is_file()):
        h.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\0".encode())
    return h.hexdigest()


def tool_digests(stage: StageDef, config: dict[str, Any]) -> dict[str, str]:
    """{command: first output line} of the stage's tools that shape its output for this config slice
    (`config_slice`; `Tool.applies`)."""
    return {" ".join(t.cmd): tool_identity(list(t.cmd)) for t in stage.tools if t.applies(config)}


def stage_preimage(stage: StageDef, spec: BaseModel, input_digests: Mapping[str, str], salt: str) -> dict[str, Any]:
    closure = module_closure(stage.impl) if stage.impl else None  # walked once: sources and libraries both need it
    config = config_slice(spec, stage.config)
    return {
        "key_schema": KEY_SCHEMA_VERSION,
        "stage": stage.name,
        "impl": impl_digests(stage, closure),
        "config": {p: slice_preimage(v, p) for p, v in config.items()},
        "inputs": dict(sorted(input_digests.items())),
        "tools": tool_digests(stage, config),
        "libraries": library_versions(stage.impl, closure) if stage.impl else {},
        "salt": salt,
    }


def change_reason(diffs: list[tuple[str, Any, Any]]) -> str:
    """The first thing a user should hear about why a key changed, from a preimage diff."""
    if not diffs:
        return "no cache entry (evicted, or never stored)"
    heads = [d[0] for d in diffs]

    def first(prefix: str) -> str | None:
        return next((h for h in heads if h == prefix or h.startswith(prefix + ".")), None)

    if first("key_schema") or first("stage"):
        return "tinytrain's key format changed"
    h = first("impl")
    if h:
        return f"source changed ({h[len('impl.'):] or 'stage modules'})"
    content = [h for h in heads if h.startswith("config.") and h.endswith((".sha256", ".tree"))]
    if content:
        return f"input file changed ({content[0][len('config.'):].rsplit('.', 1)[0]})"
    h = first("config")
    if h:
        return f"config changed ({h[len('config.'):]})"
    h = first("inputs")
    if h:
        return f"input changed ({h[len('inputs.'):] or 'upstream artifacts'})"
    h = first("tools")
    if h:
        return f"tool changed ({h[len('tools.'):]})"
    h = first("libraries")
    if h:
        return f"library changed ({h[len('libraries.'):]})"
    if first("salt"):
        return "salt changed"
    return f"changed: {heads[0]}"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
