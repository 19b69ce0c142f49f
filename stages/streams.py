"""Streamed op groups: run a few ops of the schedule interleaved, a slice at a time, so that the big tensors
between them never exist whole (DESIGN §3 `reorder`; MCUNetV2's patch-based inference, TTE's in-place update).

    find_streams(graph, order)  -> (order, [Stream])   every group the schedule allows, made contiguous
    prune_streams(...)          -> the streams that lower the arena (the others cost call overhead for nothing)

Three kinds, each exact (every element is computed by the same arithmetic, in the same order, as unstreamed):

rows       A chain of forward conv2d / depthwise_conv2d ops (N = 1) whose intermediate outputs have no other
           reader (frozen layers below the trained ones). The last op's output is produced row by row; each op
           computes a row of its output as soon as a consumer needs it (line buffers: no row is computed twice),
           and keeps only the last `window` rows of its output, the most any consumer row reads (3 for a 3x3
           stride-1 or stride-2 consumer, 1 for a 1x1). For MobileNetV2-w0.35 at 128x128 the stem and the first
           two blocks never hold their 64x64x48 expand output (192 KB), only 3 rows of it (9 KB).
positions  The gradient of a global average pool feeding a masked 1x1 convolution (mean_grad -> clamp/mask grad
           -> bias_grad and/or a 1x1 stride-1 conv2d_grad_input): one spatial position at a time, so the broadcast
           gradient (MobileNetV2's 4x4x1280 fp32, 80 KB) exists one position (5 KB) at a time; the bias gradient
           accumulates over the positions in the order the whole kernel sums them.
channels   A weight gradient (conv2d / fully connected) and the optimizer update that consumes it: one output
           channel of the gradient at a time, updated at once (TTE's in-place update taken to the row), so the
           fp32 weight gradient (74 KB for block_14's expand conv) exists one output channel at a time.

A stream's ops are consecutive in the schedule; every tensor they read or write lives for the whole group (the
memory planner extends the lifetimes), and the streamed tensors (`chunked`) cost only their window.
The numpy golden model runs the ops unstreamed: streaming changes where values live, not what they are, and the
generated C is checked against it bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinytrain.stages import ops
from tinytrain.stages.geometry import out_size_and_pad
from tinytrain.stages.ir import Graph, Op
from tinytrain.stages.memplan import element_bytes
from tinytrain.stages.schedule import dependencies, is_valid_order

ROW_OPS = ops.ROW_OPS
MAX_ROW_OPS = 16   # kernels_c/tt_stream.h TT_STREAM_MAX_OPS: a longer chain continues as a new stream
MASK_OPS = ops.MASK_OPS
UPDATE_OPS = ops.UPDATE_OPS
CHANNEL_GRAD_OPS = ops.CHANNEL_GRAD_OPS


@dataclass
class Stream:
    kind: str                     # rows | positions | channels
    ops: list[int]                # op indices, in execution order (consecutive in the schedule)
    chunked: dict[str, int]       # streamed tensor -> bytes it occupies while streamed
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ops": list(self.ops), "chunked": dict(self.chunked), "info": self.info}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Stream":
        return Stream(d["kind"], [int(i) for i in d["ops"]], {k: int(v) for k, v in d["chunked"].items()},
                      dict(d.get("info", {})))


def _readers(graph: Graph) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            if t is not None:
                out.setdefault(t, []).append(i)
    return out


def _numel(shape) -> int:
    return int(np.prod(list(shape), dtype=np.int64)) if len(shape) else 1


# ---- rows ------------------------------------------------------------------------------------------------------

def row_geometry(graph: Graph, op: Op) -> dict[str, int]:
    """Row geometry of a conv / depthwise op: input and output rows, stride, top padding and the rows one output
    row reads (span)."""
    a = op.attrs
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    w = graph.tensors[op.inputs[1]]
    kh = int(w.shape[1])
    sh, dh = int(a["stride_h"]), int(a.get("dilation_h", 1))
    oh, pt = out_size_and_pad(a["padding"], int(x.shape[1]), kh, sh, dh)
    return {"in_h": int(x.shape[1]), "out_h": oh, "stride": sh, "pad_top": pt, "span": (kh - 1) * dh + 1,
            "in_row": _numel(x.shape[2:]) * element_bytes(graph, op.inputs[0]),
            "out_row": _numel(y.shape[2:]) * element_bytes(graph, op.outputs[0])}


def input_rows(geo: dict[str, int], r: int) -> tuple[int, int]:
    """First and last input row that output row r reads (clipped to the input)."""
    lo = r * geo["stride"] - geo["pad_top"]
    return max(lo, 0), min(lo + geo["span"] - 1, geo["in_h"] - 1)


def window_rows(consumer: dict[str, int]) -> int:
    """Rows of its input a consumer needs at once: the producer keeps that many (the last ones it made)."""
    return max(hi - lo + 1 for lo, hi in (input_rows(consumer, r) for r in range(consumer["out_h"])))


def row_op_ok(graph: Graph, op: Op, trained: dict) -> bool:
    if op.type not in ROW_OPS or len(op.outputs) != 1:
        return False
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if len(x.shape) != 4 or len(y.shape) != 4 or x.shape[0] != 1 or y.shape[0] != 1:
        return False
    if op.inputs[1] in trained or graph.tensors[op.inputs[1]].data is None:
        return False  # a trained layer's input is saved for its gradient anyway; weights must be constants
    return int(y.shape[1]) > 1


def _row_streams(graph: Graph, order: list[int]) -> list[Stream]:
    trained = graph.meta.get("train", {}).get("trained", {})
    readers = _readers(graph)
    out: list[Stream] = []
    s = 0
    while s < len(order):
        chain = [order[s]]
        if row_op_ok(graph, graph.ops[order[s]], trained):
            while s + len(chain) < len(order) and len(chain) < MAX_ROW_OPS:
                prev, nxt = graph.ops[chain[-1]], graph.ops[order[s + len(chain)]]
                t = prev.outputs[0]
                if (not row_op_ok(graph, nxt, trained) or nxt.inputs[0] != t or readers.get(t) != [order[s + len(chain)]]
                        or t in graph.outputs):
                    break
                chain.append(order[s + len(chain)])
        if len(chain) >= 2:
            geos = [row_geometry(graph, graph.ops[i]) for i in chain]
            windows = {}
            chunked = {}
            for j in range(len(chain) - 1):
                t = graph.ops[chain[j]].outputs[0]
                rows = window_rows(geos[j + 1])
                windows[t] = rows
                chunked[t] = rows * geos[j]["out_row"]
            out.append(Stream("rows", chain, chunked, {"windows": windows}))
        s += len(chain)
    return out


# ---- positions -------------------------------------------------------------------------------------------------

def _pointwise_grad_input(graph: Graph, op: Op, t: str) -> bool:
    if op.type != "conv2d_grad_input" or op.inputs[0] != t:
        return False
    a = op.attrs
    w = graph.tensors[op.inputs[1]].shape
    dx, dz = graph.tensors[op.outputs[0]].shape, graph.tensors[t].shape
    return (int(w[1]) == 1 and int(w[2]) == 1 and int(a["stride_h"]) == 1 and int(a["stride_w"]) == 1
            and tuple(dx[:3]) == tuple(dz[:3]))


def _position_candidates(graph: Graph) -> list[list[int]]:
    """[mean_grad, mask op, consumers...] op groups (graph order inside the consumers)."""
    readers = _readers(graph)
    out = []
    for m, op in enumerate(graph.ops):
        if op.type not in ops.BROADCAST_GRAD_OPS:
            continue
        t1 = op.outputs[0]
        sh = graph.tensors[t1].shape
        if len(sh) != 4 or sh[0] != 1 or t1 in graph.outputs or len(readers.get(t1, [])) != 1:
            continue
        e = readers[t1][0]
        eop = graph.ops[e]
        if eop.type not in MASK_OPS or eop.inputs[0] != t1:
            continue
        t2 = eop.outputs[0]
        cons = readers.get(t2, [])
        if not cons or t2 in graph.outputs:
            continue
        if all(graph.ops[c].type == "bias_grad" or _pointwise_grad_input(graph, graph.ops[c], t2) for c in cons):
            out.append([m, e] + sorted(cons))
    return out


# ---- channels --------------------------------------------------------------------------------------------------

def _channel_candidates(graph: Graph) -> list[list[int]]:
    readers = _readers(graph)
    if int(graph.meta.get("train", {}).get("batch_size", 1)) != 1:
        return []
    out = []
    for g, op in enumerate(graph.ops):
        if op.type not in CHANNEL_GRAD_OPS:
            continue
        dw = op.outputs[0]
        rs = readers.get(dw, [])
        if len(rs) != 1 or dw in graph.outputs:
            continue
        u = graph.ops[rs[0]]
        # every update reads (param, gradient, ...); one that zeroes its gradient after use (reset_grad) keeps it
        if u.type not in UPDATE_OPS or len(u.inputs) < 2 or u.inputs[1] != dw or u.attrs.get("reset_grad"):
            continue
        out.append([g, rs[0]])
    return out


# ---- making groups contiguous ----------------------------------------------------------------------------------

def _gather(order: list[int], group: list[int], preds: list[set[int]]) -> list[int] | None:
    """`order` with `group` made consecutive (in the group's order), or None when a dependency forbids it. Ops
    between the group's first and last member that a member needs move before the group, the others after."""
    pos = {i: s for s, i in enumerate(order)}
    members = set(group)
    a, b = min(pos[i] for i in group), max(pos[i] for i in group)
    window = order[a:b + 1]
    # ops in the window a later group member (transitively, within the window) depends on
    need: set[int] = set()
    stack = [p for i in group for p in preds[i] if p not in members and a <= pos.get(p, -1) <= b]
    while stack:
        p = stack.pop()
        if p in need:
            continue
        need.add(p)
        stack.extend(q for q in preds[p] if q not in members and a <= pos.get(q, -1) <= b)
    for p in need:
        if any(q in members for q in _ancestors_in(p, preds, pos, a, b)):
            return None  # needed by the group but itself needs a member: the group cannot be contiguous
    before = [i for i in window if i in need]
    after = [i for i in window if i not in need and i not in members]
    return order[:a] + before + list(group) + after + order[b + 1:]


def _ancestors_in(i: int, preds: list[set[int]], pos: dict[int, int], a: int, b: int) -> set[int]:
    seen: set[int] = set()
    stack = list(preds[i])
    while stack:
        p = stack.pop()
        if p in seen or not (a <= pos.get(p, -1) <= b):
            continue
        seen.add(p)
        stack.extend(preds[p])
    return seen


def find_streams(graph: Graph, order: list[int]) -> tuple[list[int], list[Stream]]:
    """Every stream the schedule allows; the order comes back with each group's ops made consecutive."""
    order = list(order)
    streams = _row_streams(graph, order)
    preds = dependencies(graph)
    for kind, groups in (("positions", _position_candidates(graph)), ("channels", _channel_candidates(graph))):
        for group in groups:
            pos = {i: s for s, i in enumerate(order)}
            group = sorted(group, key=lambda i: pos[i])
            if kind == "channels":
                # the gradient moves down to its update (only the update reads it)
                new = [i for i in order if i != group[0]]
                k = new.index(group[1])
                new = new[:k] + [group[0]] + new[k:]
            else:
                new = _gather(order, group, preds)
            if new is None or not is_valid_order(graph, new):
                continue
            order = new
            streams.append(_chunked_stream(graph, kind, group))
    return order, streams


def _chunked_stream(graph: Graph, kind: str, group: list[int]) -> Stream:
    if kind == "positions":
        t1 = graph.ops[group[0]].outputs[0]
        t2 = graph.ops[group[1]].outputs[0]
        c = int(graph.tensors[t1].shape[-1])
        return Stream(kind, group, {t1: c * 4, t2: c * 4},
                      {"positions": int(graph.tensors[t1].shape[1]) * int(graph.tensors[t1].shape[2])})
    dw = graph.ops[group[0]].outputs[0]
    sh = graph.tensors[dw].shape
    return Stream(kind, group, {dw: _numel(sh[1:]) * 4}, {"channels": int(sh[0])})


def prune_streams(plan_fn, streams: list[Stream]) -> tuple[list[Stream], Any]:
    """Drop each stream whose removal does not raise the arena (fewer streams: fewer, larger kernel calls).
    plan_fn(streams) -> MemPlan."""
    keep = list(streams)
    best = plan_fn(keep)
    for s in sorted(streams, key=lambda s: sum(s.chunked.values())):
        trial = [k for k in keep if k is not s]
        p = plan_fn(trial)
        if p.arena <= best.arena:
            keep, best = trial, p
    return keep, best
