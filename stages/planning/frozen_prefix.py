"""The frozen prefix of a float graph, run once per sample set (contribution analysis' hot path).

A contribution unit trains a few layers near the end of the model; every op before the first trained one computes
the same values in every unit (its inputs are the sample and frozen constants). `FrozenPrefix` therefore cuts the
graph at a *single-tensor cut* — an op position where exactly one non-constant tensor produced before it (or the
graph input) is read at or after it — and keeps that tensor's value for every sample of a named set (tuning,
held-out), computed once, batched. A unit then trains and evaluates only the suffix graph (`suffix`), whose one
input is the cut tensor: the same ops on the same values as the whole graph, minus the repeated prefix.

Cuts are computed lazily and chained (a deeper cut runs from the nearest cached shallower one). A residual block's
inner positions are not single-tensor cuts (the skip tensor crosses them too), so a unit starting inside a block
runs the block's first ops itself: a few ops, not the prefix.
"""

from __future__ import annotations

import copy
from typing import Iterable

import numpy as np

from tinytrain.stages.model.ir import Graph

BATCH = 64                  # samples per batched prefix run
CACHE_BYTES = 96 * 2 ** 20  # the cut activations one pass keeps (all sample sets together)


def single_tensor_cuts(graph: Graph) -> list[tuple[int, str]]:
    """[(op position c, tensor)]: positions where `tensor` is the only non-constant value produced before op c
    (the graph input counts) that ops[c:] or the graph outputs read. Position 0 is the graph input itself."""
    const = {t.name for t in graph.constants()}
    last_use: dict[str, int] = {}
    n = len(graph.ops)
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            if t is not None and t not in const:
                last_use[t] = i
    for t in graph.outputs:
        last_use[t] = n
    live = {t for t in graph.inputs if last_use.get(t, -1) >= 0}
    cuts: list[tuple[int, str]] = []
    for c in range(n):
        live = {t for t in live if last_use.get(t, -1) >= c}
        if len(live) == 1:
            cuts.append((c, next(iter(live))))
        live |= {t for t in graph.ops[c].outputs if last_use.get(t, -1) > c}
    return cuts


def _subgraph(graph: Graph, start: int, stop: int, inp: str, outputs: list[str]) -> Graph:
    """ops[start:stop] as a graph whose one input is `inp` (its tensor marked as an input)."""
    ops = graph.ops[start:stop]
    names = {inp, *outputs} | {t for op in ops for t in (*op.inputs, *op.outputs) if t is not None}
    tensors = {k: graph.tensors[k] for k in names}
    t = copy.copy(graph.tensors[inp])
    t.role = "input"
    tensors[inp] = t
    g = Graph(tensors=tensors, ops=ops, inputs=[inp], outputs=list(outputs), meta=dict(graph.meta))
    g.validate()
    return g


class FrozenPrefix:
    """Cached cut activations of `graph` (float) for named sample sets, and the suffix graphs that start there."""

    def __init__(self, graph: Graph, samples: dict[str, np.ndarray]):
        from tinytrain.stages.golden.fast_float import run_graph

        self._run = run_graph
        self.graph = graph
        self.samples = {k: np.asarray(v, np.float32) for k, v in samples.items()}
        self.cuts = single_tensor_cuts(graph)
        self._acts: dict[int, dict[str, np.ndarray]] = {}
        self._suffix: dict[int, Graph] = {}
        self._segments: dict[tuple[int, int], Graph] = {}
        self._filled: set[str] = set()
        self._keep = self._kept_cuts(sum(len(v) for v in self.samples.values()))
        self.prefix_runs = 0        # batched prefix passes made (diagnostics)

    def _kept_cuts(self, samples: int) -> set[int]:
        """The cuts one pass keeps: deepest first (units train the last layers most), while their activations for
        all sets fit CACHE_BYTES. Others are computed when a unit asks, from the nearest kept cut before them."""
        keep, used = set(), 0
        for c, t in reversed(self.cuts[1:]):
            size = 4 * samples * int(np.prod(self.graph.tensors[t].shape[1:], dtype=np.int64))
            if used + size <= CACHE_BYTES:
                keep.add(c)
                used += size
        return keep

    def cut_before(self, first_op: int) -> tuple[int, str]:
        """The deepest single-tensor cut at or before op `first_op` (the first op whose result a unit changes)."""
        best = self.cuts[0]
        for c in self.cuts:
            if c[0] <= first_op:
                best = c
        return best

    def first_trained_op(self, weights: Iterable[str]) -> int:
        """The first op that reads any of the trained parameter tensors `weights` (len(ops): none)."""
        ws = set(weights)
        return next((i for i, op in enumerate(self.graph.ops) if ws & set(op.inputs)), len(self.graph.ops))

    def suffix(self, cut: tuple[int, str]) -> Graph:
        c, t = cut
        if c not in self._suffix:
            self._suffix[c] = _subgraph(self.graph, c, len(self.graph.ops), t, list(self.graph.outputs))
        return self._suffix[c]

    def _fill(self, which: str) -> None:
        """One batched pass of the whole graph over set `which`, keeping the cuts `_keep` chose."""
        x = self.samples[which]
        kept: dict[int, list[np.ndarray]] = {c: [] for c, _ in self.cuts if c in self._keep}
        with np.errstate(all="ignore"):
            for i in range(0, len(x), BATCH):
                v = x[i:i + BATCH]
                for (c0, t0), (c1, t1) in zip(self.cuts, self.cuts[1:]):
                    g = self._segment(c0, c1)
                    v = np.asarray(self._run(g, {t0: v})[t1], np.float32)
                    if c1 in kept:
                        kept[c1].append(v)
        for c, parts in kept.items():
            self._acts.setdefault(c, {})[which] = self._join(parts, c)
        self._filled.add(which)
        self.prefix_runs += 1

    def _join(self, parts: list[np.ndarray], c: int) -> np.ndarray:
        t = dict(self.cuts)[c]
        return np.concatenate(parts) if parts else np.zeros((0, *self.graph.tensors[t].shape[1:]), np.float32)

    def _segment(self, c0: int, c1: int) -> Graph:
        if (c0, c1) not in self._segments:
            cuts = dict(self.cuts)
            self._segments[(c0, c1)] = _subgraph(self.graph, c0, c1, cuts[c0], [cuts[c1]])
        return self._segments[(c0, c1)]

    def activations(self, cut: tuple[int, str], which: str) -> np.ndarray:
        """The cut tensor's value for every sample of set `which` (leading axis: samples)."""
        c, t = cut
        if c == self.cuts[0][0]:
            return self.samples[which]
        if which not in self._filled:
            self._fill(which)
        got = self._acts.setdefault(c, {})
        if which not in got:        # a cut too large to keep in the pass: from the nearest kept one before it
            start = max((k for k in self._acts if k < c and which in self._acts[k]), default=self.cuts[0][0])
            x = self.samples[which] if start == self.cuts[0][0] else self._acts[start][which]
            g = self._segment(start, c)
            with np.errstate(all="ignore"):
                parts = [np.asarray(self._run(g, {g.inputs[0]: x[i:i + BATCH]})[t], np.float32)
                         for i in range(0, len(x), BATCH)]
            got[which] = self._join(parts, c)
        return got[which]
