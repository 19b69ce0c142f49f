"""`tinytrain infer`: run the reference executor on the IR a stage produced.

The stage folder holds `graph.json` + `tensors.npz` (or `<stem>graph.json` + `<stem>tensors.npz`).
Inputs are a batch, batch dimension first; a single sample without it is accepted too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tinytrain.pipeline.errors import StageFailed, UserError


def find_graph(folder: Path) -> str:
    """The stem of the stage's IR files ("" for graph.json)."""
    if (folder / "graph.json").exists():
        return ""
    stems = sorted(p.name[: -len("graph.json")] for p in folder.glob("*graph.json")
                   if (folder / p.name.replace("graph.json", "tensors.npz")).exists())
    if not stems:
        raise UserError(f"{folder} holds no IR graph (graph.json + tensors.npz) to run")
    return stems[0]


def infer(folder: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    from tinytrain.stages.model.ir import Graph

    try:
        from tinytrain.stages.golden.forward import run_graph
    except ImportError as e:
        raise StageFailed(f"the reference executor is not available: {e}") from e
    graph = Graph.load(folder, find_graph(folder))
    if len(graph.inputs) != 1:
        raise UserError(f"the graph has {len(graph.inputs)} inputs; infer takes one .npy input")
    t = graph.tensors[graph.inputs[0]]
    x = _as_batch(x, t.shape, t.name)
    if x.dtype != np.dtype(t.dtype):
        if np.issubdtype(np.dtype(t.dtype), np.floating) and np.issubdtype(x.dtype, np.number):
            x = x.astype(t.dtype)
        else:
            raise UserError(f"input {t.name} is {t.dtype}; the array is {x.dtype}")
    return dict(run_graph(graph, {t.name: x}))


def _as_batch(x: np.ndarray, shape: list[int], name: str) -> np.ndarray:
    sample = list(shape[1:])
    if list(x.shape[1:]) == sample:
        return x
    if list(x.shape) == sample:
        return x[None, ...]
    raise UserError(f"input {name} expects samples of shape {sample} (batch first, e.g. "
                    f"[N,{','.join(map(str, sample))}]); the array is {list(x.shape)}")
