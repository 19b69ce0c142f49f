"""Cut a model at named tensors (`model.outputs`): keep only what computing them needs.

A model often ends in post-processing that is no part of what one trains: MediaPipe's custom ops that turn
landmarks into a transform matrix or warp a tensor with it, a detector's decoding. With `model.outputs:
[tensor, ...]` those tensors become the model's outputs and every op that does not lead to them is dropped,
unsupported ones included (the reader skips them: `needed_ops` decides which, on its raw operator table).

One rule, backward reachability from the requested tensors, serves both the reader (raw tensor indices) and the
IR (`prune_graph`, tensor names), so it lives here once.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Hashable, Sequence

from tinytrain.pipeline.errors import ModelError
from tinytrain.stages.model import state
from tinytrain.stages.model.ir import Graph


def needed_ops(ops_io: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]],
               targets: Sequence[Hashable]) -> set[int]:
    """Indices of the ops (given as (inputs, outputs) per op, in execution order) that computing `targets`
    needs. Missing optional operands (None or -1) are ignored."""
    wanted = set(targets)
    keep: set[int] = set()
    for i in range(len(ops_io) - 1, -1, -1):  # ops are topologically ordered: one backward pass suffices
        ins, outs = ops_io[i]
        if wanted.intersection(outs):
            keep.add(i)
            wanted.update(t for t in ins if t is not None and t != -1)
    return keep


def check_names(requested: Sequence[str], known: Sequence[str], where: str) -> None:
    """One line naming the first requested tensor that does not exist, with the closest names the model has."""
    if not requested:
        raise ModelError(f"{where}: model.outputs is empty; name at least one tensor (or leave it out)")
    dup = sorted({n for n in requested if list(requested).count(n) > 1})
    if dup:
        raise ModelError(f"{where}: model.outputs names {dup[0]!r} more than once")
    have = set(known)
    for name in requested:
        if name not in have:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
            hint = (f"did you mean {', '.join(repr(c) for c in close)}?" if close else
                    f"`tinytrain inspect SPEC load` lists the model's tensors (graph.txt)")
            raise ModelError(f"{where}: model.outputs names tensor {name!r}, which the model does not have; "
                             f"{hint}")


def prune_graph(graph: Graph, outputs: Sequence[str]) -> Graph:
    """A new Graph whose outputs are `outputs` and which holds only the ops, tensors and inputs they need.
    Raises ModelError for an unknown or constant name, or one that no longer depends on any model input."""
    where = "model.outputs"
    check_names(outputs, list(graph.tensors), where)
    for name in outputs:
        if graph.tensors[name].is_constant:
            raise ModelError(f"{where}: {name!r} is a constant (a weight or a parameter), not a tensor the model "
                             f"computes; name an op's output")
    # A stateful graph also keeps what its state assignments need (stages/model/state.py).
    keep = needed_ops([(op.inputs, op.outputs) for op in graph.ops], list(outputs) + state.assigned(graph))
    ops = [op for i, op in enumerate(graph.ops) if i in keep]
    used = {n for op in ops for n in (*op.inputs, *op.outputs) if n is not None} | set(outputs)
    inputs = [n for n in graph.inputs if n in used]
    if not inputs:
        raise ModelError(f"{where}: {', '.join(repr(n) for n in outputs)} do(es) not depend on any model input; "
                         f"name tensors computed from the input")
    tensors = {n: t for n, t in graph.tensors.items() if n in used}
    meta = state.prune_meta(dict(graph.meta), inputs) | {"pruned_to": list(outputs), "pruned_ops": len(graph.ops) - len(ops)}
    pruned = Graph(tensors=tensors, ops=ops, inputs=inputs, outputs=list(outputs), meta=meta)
    pruned.validate()
    return pruned


def cut_suggestion(ops_io: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]], bad: Sequence[int],
                   names: Sequence[str], graph_outputs: Sequence[Hashable]) -> str | None:
    """For a load error, a ready `model.outputs` line that leaves the unsupported ops `bad` out, or None.
    When they only post-process (no op the reader supports depends on them): the tensors that feed them plus the
    outputs they do not touch. When supported ops follow them: the model's outputs that do not depend on them,
    if any. Tensors are ids; `names[id]` is a tensor's name as graph.txt shows it."""
    bad_set = set(bad)
    computed = {t for _, outs in ops_io for t in outs}  # not a constant, not a model input
    tainted: set[Hashable] = set()
    downstream_supported = False
    for i, (ins, outs) in enumerate(ops_io):
        if i in bad_set or tainted.intersection(ins):
            downstream_supported |= i not in bad_set
            tainted.update(outs)
    cut = list(dict.fromkeys(t for t in graph_outputs if t not in tainted))
    if not downstream_supported:
        cut += [t for i in sorted(bad_set) for t in ops_io[i][0] if t in computed and t not in tainted]
    cut = list(dict.fromkeys(cut))
    if not cut:
        return None
    listed = json.dumps([names[t] for t in cut])  # JSON is YAML: names with ':' or ',' stay one item
    if downstream_supported:
        return (f"the model's outputs {listed} do not depend on the unsupported op(s): to train on them alone, "
                f"add `outputs: {listed}` to the spec's `model` section (the rest of the model is dropped)")
    return (f"the unsupported op(s) only post-process the model's result: to train the part before them, add "
            f"`outputs: {listed}` to the spec's `model` section (the ops after those tensors are dropped)")


__all__ = ["needed_ops", "check_names", "prune_graph", "cut_suggestion"]
