"""What holds a training step's peak, and why the planner could not make it smaller: the words a budget refusal
needs ("budget 300 KB is too small ... it needs 1702 KB") so that the user learns what is missing, not only how much.

    explain(tg, memplan, top=3) -> [{tensor, shape, dtype, bytes, role, why}]   the largest buffers live at the peak

At the peak step of the memory plan (stages/planning/arena.py MemPlan: buffers with lifetimes), the largest live
buffers are named, each with the reason it is whole there:

  streamed         it is a row stream's window already (nothing more to gain from rows)
  trained region   a forward activation read by the backward (a trained layer's input, or on the path of a
                   gradient): the backward needs it whole
  skip branch      a frozen-prefix activation read again by an op past the next one, outside any row stream
                   (an FPN / U-Net skip, a detector's second head): row streams keep every tensor but their last
                   op's inside the group, so a tensor read far later stays whole
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
from tinytrain.stages.planning.streams import row_op_ok


STREAMABLE = set(ops.ROW_OPS) | set(ops.POOL_ROW_OPS) | set(ops.LOCAL_ROW_OPS)   # streams.row_kind's ops


def peak_step(memplan) -> int:
    live = [0] * max(memplan.steps, 1)
    for b in memplan.buffers:
        for s in range(max(b.start, 0), min(b.end, len(live) - 1) + 1):
            live[s] += b.size
    return max(range(len(live)), key=lambda s: live[s])


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
    return _why(tg, name, role, n_fwd, producer, readers, streamed, heads, meta.get("label_input"))


def _why(tg: Graph, name: str, role: str, n_fwd: int, producer: dict[str, int], readers: dict[str, list[int]],
         streamed: set[str], heads: set[str], label: str | None) -> str:
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
    fwd = [i for i in rd if i < n_fwd]
    if p is not None and fwd and max(fwd) > p + 1:
        far = max(fwd)
        return (f"read again {far - p} ops later by {_op_words(tg, far)}: a skip branch; row streams keep the "
                "tensors they make inside the group, so a tensor read that far on stays whole (streaming a branch "
                "region is not implemented)")
    return "not in any row stream (the planner's cut points did not lower the peak with it inside one)"


def _op_words(tg: Graph, i: int) -> str:
    return f"{tg.ops[i].type} ({short_name(tg.ops[i].outputs[0])})"


def _rows_rule(op) -> str:
    if op.type not in STREAMABLE:
        return "no row form for this op"
    if op.type == ops.PAD.name:
        return "only padding of W and C streams"
    if op.type in ops.POOL_ROW_OPS:
        return "pooling that pads"
    return "N=1 NHWC with frozen constant weights only"


def describe(items: list[dict[str, Any]]) -> str:
    """"regressors/x [1, 896, 16] float32 56.0 KB (why); ..."."""
    return "; ".join(f"{i['tensor']} {i['shape']} {i['dtype']} {kb(i['bytes'])} ({i['why']})" for i in items)
