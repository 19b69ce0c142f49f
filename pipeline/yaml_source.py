"""Read a YAML document and remember where each value came from.

PyYAML's `safe_load` throws the positions away, so we compose the node tree ourselves and build
plain Python objects from it, recording the line of every key and value by its path
(("train", "optimizer", "kind") -> line). Spec errors use that to point at the right line.

A spec is a few KB. Hostile or broken input must fail fast with one line, so before anything is
built, a streaming pass over the parser's events (no recursion, no expansion) refuses documents that
nest too deep or that would expand, aliases included, to too many values: nine levels of nine
aliases are 1 KB of text but 9**9 values once expanded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from tinytrain.pipeline.errors import SpecError

Path_ = tuple[str | int, ...]

# Limits, each far above any real spec (a few KB, 5 levels, a few hundred values).
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 20_000

# libyaml's parser and composer when PyYAML was built with it (10x faster), else the pure-Python ones.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """SafeLoader that also reads `1e-3` and `1.0e39` as numbers (YAML 1.2 and editors do; PyYAML's 1.1
    rules want a dot and a signed exponent, and would hand the spec the strings "1e-3" and "1.0e39")."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))


@dataclass(frozen=True)
class Located:
    """A YAML document as plain data plus the 1-based line of each path in it."""

    data: Any
    # path -> (line of the key, line of the value); list items have the item's line twice.
    lines: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def line_of(self, path: Path_, *, key: bool = False) -> int:
        """Line of `path`, or of its nearest ancestor that exists in the document (line 1 at worst)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                key_line, value_line = self.lines[p]
                return key_line if key else value_line
            p = p[:-1]
        return 1

    def has(self, path: Path_) -> bool:
        return tuple(path) in self.lines


def load_yaml(text: str, filename: str) -> Located:
    if len(text) > MAX_BYTES:
        raise SpecError(f"{filename}: the spec is {len(text)} characters long; refused above {MAX_BYTES} "
                        "(a spec is a few KB)")
    loader = None
    try:
        _check_size(text, filename)
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return Located({}, {})
        lines: dict[Path_, tuple[int, int]] = {}
        data = _build(loader, node, (), lines, filename)
        return Located(data, lines)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem = ", ".join(p for p in (e.context, e.problem) if p) or "cannot parse"
        raise SpecError(f"{where}: malformed YAML: {_one_line(problem)}") from None
    except yaml.reader.ReaderError as e:
        # Raised while reading characters (NUL, other control characters): no line, a position.
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)  # libyaml: int, PyYAML: str
        raise SpecError(f"{filename}:{line}: malformed YAML: character U+{code:04X} is not allowed in YAML "
                        "(is this a text file?)") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{filename}: malformed YAML: {_one_line(str(e))}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_size(text: str, filename: str) -> None:
    """Refuse a document nesting deeper than MAX_DEPTH or holding more than MAX_NODES values once every
    alias is expanded. Streams the parser's events: an alias adds the size recorded for its anchor, so
    the count costs one pass however large the expansion would be."""
    sizes: dict[str, int] = {}          # anchor -> values in what it names, expanded
    open_: list[list] = []              # per open collection: [its anchor, values in it so far]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_) == MAX_DEPTH:
                raise SpecError(f"{filename}:{event.start_mark.line + 1}: the YAML nests deeper than {MAX_DEPTH} "
                                "levels; refused (a spec needs fewer than ten)")
            open_.append([event.anchor, 1])
            n = 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = open_.pop()
            if anchor is not None:
                sizes[anchor] = size
            if open_:
                open_[-1][1] += size
            continue
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            # An unknown anchor is the composer's error to report, with its line.
            n = 1 if isinstance(event, yaml.ScalarEvent) else sizes.get(event.anchor, 1)
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                sizes[event.anchor] = 1
            if open_:
                open_[-1][1] += n
        else:
            continue
        total += n
        if total > MAX_NODES:
            raise SpecError(f"{filename}:{event.start_mark.line + 1}: the YAML holds more than {MAX_NODES} values "
                            "once its aliases are expanded; refused (a spec holds a few hundred)")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _build(loader: yaml.SafeLoader, node: yaml.Node, path: Path_, lines: dict, filename: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        # Expands `<<: *anchor` merge keys the way safe_load would.
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(f"{filename}:{key_node.start_mark.line + 1}: a key must be a plain value")
            # A key is the text written, as in JSON and in YAML 1.2 editors: `5:` names op "5", and
            # `yes:` or `null:` are names too, not a boolean or nothing.
            key = key_node.value
            if key in out:
                # safe_load keeps the last one silently; a duplicated key is almost always a mistake.
                first = lines[path + (key,)][0]
                raise SpecError(f"{filename}:{key_node.start_mark.line + 1}: key {dotted(path + (key,))!r} "
                                f"appears twice (first on line {first})")
            lines[path + (key,)] = (key_node.start_mark.line + 1, value_node.start_mark.line + 1)
            out[key] = _build(loader, value_node, path + (key,), lines, filename)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[path + (i,)] = (item.start_mark.line + 1, item.start_mark.line + 1)
            items.append(_build(loader, item, path + (i,), lines, filename))
        return items
    return _scalar(loader, node, filename)


def _scalar(loader: yaml.SafeLoader, node: yaml.Node, filename: str) -> Any:
    mark = node.start_mark
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark or mark
        problem = e.problem or "cannot read this value"
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        # PyYAML's constructors trust their regexes: `!!int x`, `!!bool maybe` or the date 2024-13-45
        # raise plain Python errors.
        problem = f"cannot read {node.value!r} as {node.tag.rsplit(':', 1)[-1]} ({type(e).__name__}: {e})"
    raise SpecError(f"{filename}:{mark.line + 1}:{mark.column + 1}: malformed YAML: {_one_line(problem)}")


def dotted(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out
