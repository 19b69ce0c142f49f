"""Turn pydantic's validation errors into `file:line: yaml.path: what is wrong` lines.

pydantic reports a `loc` tuple in the model's terms; it may hold union member tags
("function-after[...]", "float") that are not in the YAML. We keep the parts that exist in the
document, find their line, and phrase the common errors the way a user reads them: unknown keys
get a "did you mean", literal choices are listed.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from tinytrain.pipeline.yaml_source import Located, dotted


def format_errors(err: ValidationError, doc: Located, root: type[BaseModel], filename: str) -> str:
    found = []
    for e in err.errors(include_url=False):
        path = _clean_loc(e["loc"], doc, keep_last=e["type"] == "missing")
        line = doc.line_of(path, key=e["type"] in ("extra_forbidden", "missing"))
        where = dotted(path) or "(top level)"
        found.append((line, f"{filename}:{line}: {where}: {_describe(e, path, root)}"))
    # pydantic may report one problem once per union member; the user needs it once, in file order.
    return "\n".join(dict.fromkeys(text for _, text in sorted(found, key=lambda t: t[0])))


def _clean_loc(loc: tuple, doc: Located, *, keep_last: bool) -> tuple:
    out: tuple = ()
    for i, part in enumerate(loc):
        candidate = out + (part,)
        if doc.has(candidate) or (keep_last and i == len(loc) - 1):
            out = candidate
    return out


# pydantic's words for the container types name Python classes; say them in YAML terms.
_PLAIN = {"model_type": "should be a mapping (key: value)", "dict_type": "should be a mapping (key: value)",
          "model_attributes_type": "should be a mapping (key: value)",
          "list_type": "should be a list", "tuple_type": "should be a list", "path_type": "should be a path (text)"}


def _describe(e: dict[str, Any], path: tuple, root: type[BaseModel]) -> str:
    kind, ctx = e["type"], e.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(path[-1]) if path else "?"
        allowed = [k for k in field_names(root, path[:-1])]
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            return f"unknown key {key!r}; did you mean {close[0]!r}?"
        return f"unknown key {key!r}; allowed keys: {', '.join(allowed)}" if allowed else f"unknown key {key!r}"
    if kind == "missing":
        return "required key is missing"
    if kind in ("literal_error", "enum"):
        choices = literal_choices(root, path) or [ctx.get("expected", "?")]
        return f"{e['input']!r} is not one of {', '.join(str(c) for c in choices)}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", e["msg"]))
    msg = _PLAIN.get(kind) or e["msg"]
    if msg.startswith("Input should be "):
        msg = "should be " + msg[len("Input should be "):]
    return f"{msg}, got {e['input']!r}" if "input" in e and not isinstance(e["input"], (dict, list)) else msg


# ---- walking the model classes along a YAML path ---------------------------------------------

def field_names(root: type, path: tuple) -> list[str]:
    t = _type_at(root, path)
    return list(t.model_fields) if _is_model(t) else []


def literal_choices(root: type, path: tuple) -> list[Any]:
    for t in _members(_type_at(root, path)):
        if typing.get_origin(t) is typing.Literal:
            return list(typing.get_args(t))
    return []


def _type_at(root: type, path: tuple) -> Any:
    t: Any = root
    for part in path:
        t = _child(t, part)
        if t is None:
            return None
    return t


def _child(t: Any, part: Any) -> Any:
    for m in _members(t):
        if _is_model(m) and isinstance(part, str) and part in m.model_fields:
            return m.model_fields[part].annotation
        origin = typing.get_origin(m)
        args = typing.get_args(m)
        if origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
            return args[0]
        if origin is dict and isinstance(part, str) and len(args) == 2:
            return args[1]
    return None


def _members(t: Any) -> list[Any]:
    """The alternatives of a type: Optional/Union members and Annotated bases, flattened."""
    if t is None:
        return []
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _members(typing.get_args(t)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(t) for m in _members(a)]
    return [t]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)
