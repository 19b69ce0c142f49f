"""Readable summaries of artifacts (`tinytrain inspect`), dispatched on the file's type.

A stage module may define `inspect(artifact_path) -> str | None` to describe its own artifacts;
None falls back to the generic view here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from tinytrain.cache.keys import sha256_file

TEXT_SUFFIXES = {".txt", ".md", ".log", ".c", ".h", ".ld", ".s", ".S", ".csv", ".yaml", ".yml", ".ini", ".cfg"}
MAX_TEXT_LINES = 400

Inspector = Callable[[Path], "str | None"]


def describe(path: Path, custom: Inspector | None = None) -> str:
    if custom is not None:
        text = custom(path)
        if text is not None:
            return text
    name, suffix = path.name, path.suffix
    if name.endswith("graph.json") and (path.parent / name.replace("graph.json", "tensors.npz")).exists():
        return _graph(path)
    if suffix == ".json":
        return _json(path)
    if suffix in TEXT_SUFFIXES:
        return _text(path)
    if suffix == ".npz":
        return _npz(path)
    if suffix == ".ttck":   # a training checkpoint (stages/train/checkpoint.py): step, CRC, state norms
        from tinytrain.stages.train.checkpoint import describe_artifact

        return describe_artifact(path)
    if suffix == ".npy":
        return _arrays({"(array)": np.load(path, allow_pickle=False)})
    return _binary(path)


def _graph(path: Path) -> str:
    from tinytrain.stages.model.ir import Graph

    stem = path.name[: -len("graph.json")]
    g = Graph.load(path.parent, stem)
    params = sum(int(np.prod(t.shape)) for t in g.constants())
    head = [f"{len(g.ops)} ops, {len(g.tensors)} tensors, {params} constant values",
            "inputs:  " + ", ".join(f"{n}:{g.tensors[n].short_type()}" for n in g.inputs),
            "outputs: " + ", ".join(f"{n}:{g.tensors[n].short_type()}" for n in g.outputs), ""]
    rows = [("#", "op", "output", "inputs", "attrs")]
    for i, op in enumerate(g.ops):
        outs = ", ".join(f"{_short(t)}:{g.tensors[t].short_type()}" for t in op.outputs)
        ins = ", ".join("_" if t is None else _short(t) for t in op.inputs)
        attrs = " ".join(f"{k}={v}" for k, v in sorted(op.attrs.items()))
        rows.append((str(i), op.type, outs, ins, attrs))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    table = ["  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4] for r in rows]
    return "\n".join(head + [t.rstrip() for t in table]) + "\n"


def _short(name: str, width: int = 28) -> str:
    # Converter tensor names run to 150 characters; their tail is the part that tells them apart.
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _json(path: Path) -> str:
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:
        return f"(not valid JSON: {e})\n" + _text(path)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _text(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines()
    more = len(lines) - MAX_TEXT_LINES
    shown = lines[:MAX_TEXT_LINES] + ([f"... {more} more lines in {path}"] if more > 0 else [])
    return "\n".join(shown) + "\n"


def _npz(path: Path) -> str:
    with np.load(path, allow_pickle=False) as npz:
        return _arrays({k: npz[k] for k in npz.files})


def _arrays(arrays: dict[str, np.ndarray]) -> str:
    if not arrays:
        return "(no arrays)\n"
    rows = [("name", "dtype", "shape", "min", "max", "mean")]
    for name, a in arrays.items():
        if a.size and np.issubdtype(a.dtype, np.number):
            af = a.astype(np.float64)
            stats = (f"{af.min():.6g}", f"{af.max():.6g}", f"{af.mean():.6g}")
        else:
            stats = ("-", "-", "-")
        rows.append((name, str(a.dtype), "[" + ",".join(str(d) for d in a.shape) + "]", *stats))
    widths = [max(len(r[c]) for r in rows) for c in range(6)]
    return "\n".join("  ".join(r[c].ljust(widths[c]) for c in range(6)).rstrip() for r in rows) + "\n"


def _binary(path: Path) -> str:
    return f"{path.stat().st_size} bytes, sha256 {sha256_file(path)[:16]}… (binary; open {path})\n"
