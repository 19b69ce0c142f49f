"""Operator schedules of a training step (DESIGN §3 `reorder`): which order the ops of a training IR run in.

    dependencies(graph)                 -> preds[i]: ops that must run before op i
    phases(graph)                       -> op index lists that may be reordered among themselves
    plain_order(graph)                  -> autodiff's order: full forward, full backward keeping every gradient,
                                           then all updates
    in_place_update_order(graph)        -> TTE's in-place update: each update (or batch accumulation) runs as soon
                                           as its gradient is complete, so the gradient is freed at once and the
                                           gradients of different layers never coexist
    memory_greedy_order(graph, sizes)   -> topological list scheduling that, among the ready ops, runs the one
                                           that frees the most / allocates the least (deterministic ties)

Dependencies come from the op list read as a program: a tensor written in place (an update writes its weight and
state back under the same name) gets versions, so readers of the old value must run before the update
(write-after-read: the input gradient of layer L reads w_L before w_L is updated), readers of the new value after
it, and writers keep their order.

Phases: with batch_size > 1, ops[:sample_ops] run once per sample and the rest once per step, so the two lists are
reordered separately; with batch 1 they are one program and updates move into the backward pass.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.arena import fused_dequantize

EAGER_OPS = ops.EAGER_OPS


def dependencies(graph: Graph) -> list[set[int]]:
    # A fused dequantize's readers read the int8 weight itself when they run (memplan.fused_dequantize): they are
    # readers of the weight's current version too, so its in-place update waits for them.
    fused = fused_dequantize(graph)
    preds: list[set[int]] = [set() for _ in graph.ops]
    writer: dict[str, int] = {}              # last writer of each tensor's current version
    readers: dict[str, list[int]] = {}       # readers of the current version
    for i, op in enumerate(graph.ops):
        ins = [t for t in op.inputs if t is not None]
        ins += [fused[t] for t in ins if t in fused]
        if op.attrs.get("skip_if"):   # fp16-mixed: an op skipped on an overflowing step reads the check's flag
            ins.append(op.attrs["skip_if"])
        for t in ins:
            if t in writer:
                preds[i].add(writer[t])
        for t in op.outputs:
            if t in writer:
                preds[i].add(writer[t])                                  # write after write
            preds[i].update(r for r in readers.get(t, []) if r != i)     # write after read
        for t in ins:
            readers.setdefault(t, []).append(i)
        for t in op.outputs:
            writer[t] = i
            readers[t] = []
    return preds


def phases(graph: Graph) -> list[list[int]]:
    n = len(graph.ops)
    train = graph.meta.get("train", {})
    if int(train.get("batch_size", 1)) > 1 and "sample_ops" in train:
        k = int(train["sample_ops"])
        return [list(range(k)), list(range(k, n))]
    return [list(range(n))]


def plain_order(graph: Graph) -> list[int]:
    return list(range(len(graph.ops)))


def in_place_update_order(graph: Graph) -> list[int]:
    """The graph's order, except that eager ops (updates, batch accumulation) run as soon as they are ready."""
    preds = dependencies(graph)
    order: list[int] = []
    for ph in phases(graph):
        members = set(ph)
        eager = [i for i in ph if graph.ops[i].type in EAGER_OPS]
        done: set[int] = set(order)
        pending = list(eager)

        def flush():
            progress = True
            while progress:
                progress = False
                for e in list(pending):
                    if all(p in done or p not in members for p in preds[e]):
                        order.append(e)
                        done.add(e)
                        pending.remove(e)
                        progress = True

        flush()
        for i in ph:
            if i in done or i in pending:
                continue
            order.append(i)
            done.add(i)
            flush()
        if pending:
            raise ValueError(f"ops {pending} are never ready")
    return order


def memory_greedy_order(graph: Graph, sizes: dict[str, int], resident: Iterable[str] = ()) -> list[int]:
    """List scheduling: among the ready ops, run the one with the smallest (allocated − freed) bytes, then the
    smallest allocation, then the earliest in the graph's order. Eager ops (updates) free their gradient and
    allocate nothing, so they run as soon as they can. Tensors absent from `sizes` (flash) and `resident` ones
    (live all the time anyway) do not count."""
    preds = dependencies(graph)
    resident = set(resident)
    outputs = set(graph.outputs)
    order: list[int] = []
    for ph in phases(graph):
        members = set(ph)
        # Remaining reads of each transient tensor within what is left to schedule.
        remaining: dict[str, int] = {}
        for i in ph:
            for t in graph.ops[i].inputs:
                if t is not None and t in sizes and t not in resident:
                    remaining[t] = remaining.get(t, 0) + 1
        live: set[str] = {t for t in graph.inputs if t in sizes and t not in resident}
        for i in order:  # tensors written by earlier phases stay live if read here
            live.update(t for t in graph.ops[i].outputs if t in remaining)
        indeg = {i: sum(1 for p in preds[i] if p in members) for i in ph}
        succs: dict[int, list[int]] = {i: [] for i in ph}
        for i in ph:
            for p in preds[i]:
                if p in members:
                    succs[p].append(i)
        ready = sorted(i for i in ph if indeg[i] == 0)

        def score(i: int) -> tuple[int, int, int]:
            op = graph.ops[i]
            alloc = sum(sizes[t] for t in set(op.outputs) if t in sizes and t not in resident and t not in live)
            reads: dict[str, int] = {}
            for t in op.inputs:
                if t is not None and t in remaining:
                    reads[t] = reads.get(t, 0) + 1
            freed = sum(sizes[t] for t, c in reads.items() if remaining[t] == c and t not in outputs)
            # An output nobody reads dies at once.
            freed += sum(sizes[t] for t in set(op.outputs)
                         if t in sizes and t not in resident and t not in remaining and t not in outputs)
            return (alloc - freed, alloc, i)

        while ready:
            heap = [score(i) for i in ready]
            heapq.heapify(heap)
            _, _, i = heap[0]
            ready.remove(i)
            order.append(i)
            op = graph.ops[i]
            for t in op.inputs:
                if t is not None and t in remaining:
                    remaining[t] -= 1
                    if remaining[t] == 0 and t not in outputs:
                        live.discard(t)
            for t in op.outputs:
                if t in sizes and t not in resident and remaining.get(t, 0) > 0:
                    live.add(t)
            for s in succs[i]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if len(order) != sum(len(p) for p in phases(graph)[: phases(graph).index(ph) + 1]):
            raise ValueError("the op dependencies have a cycle")
    return order


def is_valid_order(graph: Graph, order: list[int], preds: list[set[int]] | None = None) -> bool:
    """A permutation that respects every dependency (`preds`: dependencies(graph), when the caller has them) and
    keeps each phase together."""
    if sorted(order) != list(range(len(graph.ops))):
        return False
    pos = {i: k for k, i in enumerate(order)}
    preds = dependencies(graph) if preds is None else preds
    if any(pos[p] > pos[i] for i in range(len(graph.ops)) for p in preds[i]):
        return False
    offset = 0
    for ph in phases(graph):
        if set(order[offset:offset + len(ph)]) != set(ph):
            return False
        offset += len(ph)
    return True
