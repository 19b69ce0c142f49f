"""What holds a training step's peak, and why the planner could not make it smaller: the words a budget refusal
needs ("budget 300 KB is too small ... it needs 1702 KB") so that the user learns what is missing, not only how much.

    explain(tg, memplan, top=3) -> [{tensor, shape, dtype, bytes, role, why}]   the largest buffers live at the peak

At the peak step of the memory plan (stages/planning/arena.py MemPlan: buffers with lifetimes), the largest live
buffers are named, each with the reason it is whole there:

  streamed         it is a row stream's window already (nothing more to gain from rows)
  trained region   a forward activation read by the backward (a trained layer's input, or on the path of a
                   gradient): the backward needs it whole
  no group         the smallest row group that could hold it, grown along the schedule until its branches meet
                   (a skip branch, a detector's second head): the op row streams cannot run that it reaches first,
                   a tensor of it read whole (by the backward, or by an op that reads it whole), its length past
                   a row stream's limit; or the group, when one exists and the planner did not pick it
  op               its producer or a reader is an op row streaming does not handle (streams.row_kind)
  input / output   the model input (written whole by the caller) or a trained output, its target or its gradient
                   (the loss reads them whole)

Pure: reads the training graph and its plan, changes nothing.
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.memory_model import kb, short_name
from tinytrain.stages.planning.streams import MAX_ROW_OPS, row_geometry, row_op_ok


STREAMABLE = set(ops.ROW_OPS) | set(ops.POOL_ROW_OPS) | set(ops.LOCAL_ROW_OPS)   # streams.row_kind's ops


def peak_step(memplan) -> int:
    """The first step at which the most bytes are live."""
    live = [sum(d.values()) for d in memplan.live_by_role] or [0]
    return max(range(len(live)), key=live.__getitem__)


def explain(tg: Graph, memplan, top: int = 3) -> list[dict[str, Any]]:
    step = peak_step(memplan)
    live = sorted((b for b in memplan.buffers if b.start <= step <= b.end), key=lambda b: -b.size)
    out = []
    for b in live[:top]:
        name = (b.tensors or [b.name])[0]
        t = tg.tensors.get(name)
        out.append({"tensor": short_name(name), "shape": list(t.shape) if t is not None else None,
                    "dtype": t.dtype if t is not None else None, "bytes": int(b.size), "role": b.role,
                    "why": why_whole(tg, memplan, name, b.role)})
    return out


def why_whole(tg: Graph, memplan, name: str, role: str = "activation") -> str:
    """Why tensor `name` of the training graph occupies its whole size in `memplan`."""
    meta = tg.meta.get("train", {})
    n_fwd = int(meta.get("phases", {}).get("forward", len(tg.ops)))
    producer, readers = tg.producers(), tg.consumers()
    streamed = {t for st in memplan.streams for t in st.chunked}
    heads = {h["tensor"] for h in meta.get("heads") or []} | {meta.get("prediction")}
    sinks = {tg.ops[st.ops[-1]].outputs[0]: list(st.ops) for st in memplan.streams if st.kind == "rows"}
    return _why(tg, name, role, n_fwd, producer, readers, streamed, heads, meta.get("label_input"),
                getattr(memplan, "order", None), sinks)


def _why(tg: Graph, name: str, role: str, n_fwd: int, producer: dict[str, int], readers: dict[str, list[int]],
         streamed: set[str], heads: set[str], label: str | None, order: list[int] | None = None,
         sinks: dict[str, list[int]] | None = None) -> str:
    sinks = sinks or {}
    if name in streamed:
        return "a row stream's window already"
    if role in ("weight", "bias", "optimizer_state", "accumulator", "master_copy"):
        return f"trained state ({role})"
    if name == label:
        return "the loss target, read whole by the loss"
    if role == "gradient":
        return "a gradient of the backward (whole: only weight gradients and a pooled head's gradient stream)"
    if producer.get(name, -1) >= n_fwd:
        return f"made after the forward by {tg.ops[producer[name]].type}, read whole by the loss or the backward"
    if name in tg.inputs:
        return "the model input, written whole by the caller"
    if name in heads:
        return "a trained output, read whole by the loss"
    rd = readers.get(name, [])
    if any(i >= n_fwd for i in rd):
        first = min(i for i in rd if i >= n_fwd)
        return f"read by the backward ({tg.ops[first].type}): a trained layer needs it whole"
    p = producer.get(name)
    trained = tg.meta.get("train", {}).get("trained", {})
    if p is not None and not row_op_ok(tg, tg.ops[p], trained):
        return f"made by {_op_words(tg, p)}, which a row stream cannot run ({_rows_rule(tg.ops[p])})"
    bad = [i for i in rd if not row_op_ok(tg, tg.ops[i], trained)]
    if bad:
        return f"read by {_op_words(tg, bad[0])}, which a row stream cannot run ({_rows_rule(tg.ops[bad[0]])})"
    if p is not None and order is not None:
        return _group_holding(tg, name, sinks.get(name, [p]), order, n_fwd, readers, trained)
    return "not in any row stream (the planner's cut points did not lower the peak with it inside one)"


def _group_holding(tg: Graph, name: str, start: list[int], order: list[int], n_fwd: int,
                   readers: dict[str, list[int]], trained: dict) -> str:
    """Why no row stream holds `name` inside (as a window): the smallest row group that could, grown along the
    schedule from the ops `start` (its producer, or the row stream it ends) as streams._row_group needs it
    (consecutive ops, every tensor made inside read only inside but the last op's), until it closes on a last
    output smaller than `name`; and the op, tensor or limit that stops it first, or that group when the planner did
    not pick it."""
    from tinytrain.stages.planning.arena import element_bytes
    from tinytrain.stages.model.ir import numel

    def nbytes(t: str) -> int:
        return numel(tg.tensors[t].shape) * element_bytes(tg, t)

    fwd = [i for i in order if i < n_fwd]
    if any(i not in fwd for i in start):
        return "not in any row stream (the planner's cut points did not lower the peak with it inside one)"
    k = max(fwd.index(i) for i in start)
    members = list(start)
    size = nbytes(name)
    as_large = None   # a closing point that holds it inside but ends on a tensor at least as large
    while True:
        inside = set(members)
        last = tg.ops[members[-1]].outputs[0]
        open_ = [o for i in members for o in tg.ops[i].outputs
                 if o in tg.outputs or any(r not in inside for r in readers.get(o, []))]
        for o in open_:
            late = [r for r in readers.get(o, []) if r >= n_fwd]
            if o != last and (late or o in tg.outputs):
                what = f"the backward ({tg.ops[late[0]].type})" if late else "the loss (a model output)"
                return (f"not in any row stream: {short_name(o)}, made in the row group that would hold it, is read "
                        f"whole by {what}")
        if name not in open_ and (not open_ or open_ == [last]):   # `name` inside, not the (whole) sink
            first, end = tg.ops[members[0]], tg.ops[members[-1]]
            if nbytes(last) < size:
                return (f"not in any row stream: a row group of {len(members)} ops ({first.type} "
                        f"({short_name(first.outputs[0])}) to {end.type} ({short_name(end.outputs[0])})) could hold "
                        f"it, but the planner's cut points did not lower the peak with it inside one")
            as_large = as_large or (last, len(members))
        if len(members) >= MAX_ROW_OPS:
            if as_large:
                return (f"not in any row stream: every row group of at most {MAX_ROW_OPS} ops (a row stream's limit) "
                        f"from {_op_words(tg, members[0])} that holds it ends on a tensor at least as large "
                        f"({short_name(as_large[0])} {kb(nbytes(as_large[0]))}, after {as_large[1]} ops), which "
                        "the next stream would read whole")
            return (f"not in any row stream: the row group that would hold it (its branches meet only after "
                    f"{MAX_ROW_OPS} ops) is longer than a row stream runs ({MAX_ROW_OPS} ops)")
        k += 1
        if k >= len(fwd):
            return "not in any row stream: its branches do not meet before the forward ends"
        i = fwd[k]
        if not row_op_ok(tg, tg.ops[i], trained):
            return (f"not in any row stream: the row group that would hold it reaches {_op_words(tg, i)}, which a "
                    f"row stream cannot run ({_rows_rule(tg.ops[i])}), before "
                    + ("a tensor smaller than it" if as_large else "its branches meet"))
        geo_in = set(row_geometry(tg, tg.ops[i])["inputs"])
        whole = [t for j, t in enumerate(tg.ops[i].inputs) if t is not None and j not in geo_in
                 and any(t in tg.ops[m].outputs for m in members)]
        if whole:
            return (f"not in any row stream: {_op_words(tg, i)} reads {short_name(whole[0])}, made in the row group "
                    f"that would hold it, whole (not row by row)")
        members.append(i)


def _op_words(tg: Graph, i: int) -> str:
    return f"{tg.ops[i].type} ({short_name(tg.ops[i].outputs[0])})"


def _rows_rule(op) -> str:
    if op.type not in STREAMABLE:
        return "no row form for this op"
    if op.type == ops.PAD.name:
        return "padding of N, or paddings computed at run time"
    if op.type in ops.POOL_ROW_OPS:
        return "pooling that pads"
    return "N=1 NHWC with frozen constant weights only"


def describe(items: list[dict[str, Any]]) -> str:
    """"regressors/x [1, 896, 16] float32 56.0 KB (why); ..."."""
    return "; ".join(f"{i['tensor']} {i['shape']} {i['dtype']} {kb(i['bytes'])} ({i['why']})" for i in items)
