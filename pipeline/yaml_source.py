"""Read a YAML document and remember where each value came from.

PyYAML's `safe_load` throws the positions away, so we compose the node tree ourselves and build
plain Python objects from it, recording the line of every key and value by its path
(("train", "optimizer", "kind") -> line). Spec errors use that to point at the right line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from tinytrain.pipeline.errors import SpecError

Path_ = tuple[str | int, ...]


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
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
            problem = e.problem or e.context or "cannot parse"
            raise SpecError(f"{where}: malformed YAML: {problem}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"{filename}: malformed YAML: {e}") from None
        if node is None:
            return Located({}, {})
        lines: dict[Path_, tuple[int, int]] = {}
        data = _build(loader, node, (), lines, filename)
        return Located(data, lines)
    finally:
        loader.dispose()


def _build(loader: yaml.SafeLoader, node: yaml.Node, path: Path_, lines: dict, filename: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        # Expands `<<: *anchor` merge keys the way safe_load would.
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(loader, key_node, filename)
            if isinstance(key, (dict, list)):
                raise SpecError(f"{filename}:{key_node.start_mark.line + 1}: a key must be a plain value")
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
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark or node.start_mark
        raise SpecError(f"{filename}:{mark.line + 1}:{mark.column + 1}: malformed YAML: {e.problem}") from None


def dotted(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out

