"""Streamed op groups: run a few ops of the schedule interleaved, a slice at a time, so that the big tensors
between them never exist whole (DESIGN §3 `reorder`; MCUNetV2's patch-based inference, TTE's in-place update).

    find_streams(graph, order)  -> (order, [Stream])   every group the schedule allows, made contiguous
    prune_streams(...)          -> the streams that lower the arena (the others cost call overhead for nothing)

Four kinds, each exact (every element is computed by the same arithmetic, in the same order, as unstreamed):

rows       A group of forward ops of a frozen prefix (N = 1): conv2d / depthwise_conv2d with constant untrained
           weights, max / average pooling that pads nothing, and ops that map row r to row r (element-wise
           arithmetic with W/C broadcasting, activations, PReLU, channel padding), forming a DAG whose outputs
           but the last op's (the sink) are read only inside the group, as row inputs: residual blocks stream
           with both branches of their ADD inside the group. The sink's output is produced row by row; each op
           computes a row of its output when a consumer needs it (kernels_c/tt_stream.c's pull schedule: no row is
           computed twice) and keeps only the last `window` rows of its output, the most any read needs at once,
           found by simulating that schedule (simulate_rows). Inputs from outside the group stay whole. Which
           groups: in each run of such ops in the schedule, a dynamic program over the cut points minimises the
           most bytes any group or unstreamed op holds (then the sum of their squares: a large op below that
           most is still lowered), so the big tensors sit inside groups. For
           MobileNetV2-w0.35 at 128x128 the stem and the first two blocks never hold their 64x64x48 expand output
           (192 KB), only 3 rows of it (9 KB); MediaPipe's hand_recrop streams its first 23 ops (two residual
           blocks, each ADD with both branches) and never holds their 128x128 activations whole: 320 KB -> 247 KB.
           The model input of a chain stream is fed row by row from the data source (fed_inputs, with_feeds: a
           source op in front): MobileNetV2's 48 KB image is held 3 rows at a time (arena 128.7 -> 116.8 KB).
positions  The gradient of a global average pool feeding a masked 1x1 convolution (mean_grad -> clamp/mask grad
           -> bias_grad and/or a 1x1 stride-1 conv2d_grad_input): one spatial position at a time, so the broadcast
           gradient (MobileNetV2's 4x4x1280 fp32, 80 KB) exists one position (5 KB) at a time; the bias gradient
           accumulates over the positions in the order the whole kernel sums them.
channels   A weight gradient (conv2d / fully connected) and the optimizer update that consumes it: one output
           channel of the gradient at a time, updated at once (TTE's in-place update taken to the row), so the
           fp32 weight gradient (74 KB for block_14's expand conv) exists one output channel at a time.
hidden     The backward between two 1x1 convs (an inverted-residual block's project input gradient, masks, bias
           gradients, depthwise input gradient, expand weight gradient + update and input gradient), one hidden
           channel at a time (stages/planning/channel_stream.py): MobileNetV2's 8x8x192 fp32 block gradients (48 KB)
           exist one 8x8 plane at a time. It absorbs the chain's `channels` stream, which comes back when
           prune_streams drops it.

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
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Graph, Op, numel
from tinytrain.stages.planning import channel_stream
from tinytrain.stages.planning.arena import element_bytes
from tinytrain.stages.planning.schedule import dependencies, is_valid_order

ROW_OPS = ops.ROW_OPS
MAX_ROW_OPS = 32   # kernels_c/tt_stream.h TT_STREAM_MAX_OPS: a longer run continues as a new stream
MASK_OPS = ops.MASK_OPS
UPDATE_OPS = ops.UPDATE_OPS
CHANNEL_GRAD_OPS = ops.CHANNEL_GRAD_OPS
CHANNEL_CHAIN_OPS, CHANNEL_END_OPS = ops.fp16.CHANNEL_CHAIN_OPS, ops.fp16.CHANNEL_END_OPS


@dataclass
class Stream:
    kind: str                     # rows | positions | channels
    ops: list[int]                # op indices, in execution order (consecutive in the schedule)
    chunked: dict[str, int]       # streamed tensor -> bytes it occupies while streamed
    info: dict[str, Any] = field(default_factory=dict)
    # streams this one absorbed (a hidden stream's weight rows were a `channels` stream): they come back when
    # prune_streams drops it; not part of the plan's JSON
    replaces: list["Stream"] = field(default_factory=list, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ops": list(self.ops), "chunked": dict(self.chunked), "info": self.info}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Stream":
        return Stream(d["kind"], [int(i) for i in d["ops"]], {k: int(v) for k, v in d["chunked"].items()},
                      dict(d.get("info", {})))


# ---- rows ------------------------------------------------------------------------------------------------------

# Ops whose output row r reads row r of each streamed input and nothing else of it (element-wise arithmetic with
# operands broadcast along W/C, activations, channel / width padding) run on one-row sub-problems; pooling reads a
# window like a conv (OpDef.row_stream).
LOCAL_ROW_OPS = ops.LOCAL_ROW_OPS
POOL_ROW_OPS = ops.POOL_ROW_OPS
MAX_ROW_INPUTS = 2  # kernels_c/tt_stream.h TT_STREAM_MAX_IN


def _nhwc1(shape) -> bool:
    return len(shape) == 4 and int(shape[0]) == 1


def row_kind(graph: Graph, op: Op) -> str | None:
    """`window` (conv, depthwise, pooling: an output row reads a window of input rows), `local` (LOCAL_ROW_OPS),
    or None: how the op runs in a row stream, before the checks of row_geometry."""
    if op.type in ROW_OPS or op.type in POOL_ROW_OPS:
        return "window"
    return "local" if op.type in LOCAL_ROW_OPS else None


def row_geometry(graph: Graph, op: Op) -> dict[str, Any]:
    """Row geometry of an op of a row stream: input and output rows, stride, top padding, the input rows one output
    row reads (span), which inputs are streamed (`inputs`, indices into op.inputs; the others are read whole) and
    the bytes of a row of each (`in_rows`; `in_row`: the first's), and of the output (`out_row`)."""
    a = op.attrs
    y = graph.tensors[op.outputs[0]]
    oh = int(y.shape[1])
    h_pads = pad_rows(graph, op)
    if h_pads is not None:
        # output row r is input row r - top, or a row of the pad value where that row does not exist (the C makes
        # it from an empty input, stages/codegen.py): a 1-row window with top padding
        x = graph.tensors[op.inputs[0]]
        ins = [0] if x.data is None and _nhwc1(x.shape) else []
        geo = {"in_h": int(x.shape[1]), "out_h": oh, "stride": 1, "pad_top": h_pads[0], "span": 1}
    elif row_kind(graph, op) == "local":
        ins = [j for j, t in enumerate(op.inputs) if t is not None and graph.tensors[t].data is None
               and _nhwc1(graph.tensors[t].shape) and int(graph.tensors[t].shape[1]) == oh]
        geo = {"in_h": oh, "out_h": oh, "stride": 1, "pad_top": 0, "span": 1}
    else:
        x = graph.tensors[op.inputs[0]]
        if op.type in POOL_ROW_OPS:
            kh, sh, dh = int(a["filter_h"]), int(a["stride_h"]), 1
        else:
            kh, sh, dh = int(graph.tensors[op.inputs[1]].shape[1]), int(a["stride_h"]), int(a.get("dilation_h", 1))
        oh, pt = out_size_and_pad(a["padding"], int(x.shape[1]), kh, sh, dh)
        ins = [0]
        geo = {"in_h": int(x.shape[1]), "out_h": oh, "stride": sh, "pad_top": pt, "span": (kh - 1) * dh + 1}
    in_rows = [numel(graph.tensors[op.inputs[j]].shape[2:]) * element_bytes(graph, op.inputs[j]) for j in ins]
    geo.update({"inputs": ins, "in_rows": in_rows, "in_row": in_rows[0] if in_rows else 0,
                "out_row": numel(y.shape[2:]) * element_bytes(graph, op.outputs[0])})
    return geo


def input_rows(geo: dict[str, int], r: int) -> tuple[int, int]:
    """First and last input row that output row r reads (clipped to the input)."""
    lo = r * geo["stride"] - geo["pad_top"]
    return max(lo, 0), min(lo + geo["span"] - 1, geo["in_h"] - 1)


def window_rows(consumer: dict[str, int]) -> int:
    """Rows of its input a consumer needs at once: the producer keeps that many (the last ones it made)."""
    return max(hi - lo + 1 for lo, hi in (input_rows(consumer, r) for r in range(consumer["out_h"])))


def row_op_ok(graph: Graph, op: Op, trained: dict) -> bool:
    """The op can run in a row stream: one N=1 NHWC output of more than one row, 1 or 2 streamed inputs of that
    layout, constant frozen weights (a trained layer's input is saved for its gradient anyway), pooling whose
    sub-problems need no padding, PAD of H/W/C (not N)."""
    kind = row_kind(graph, op)
    if kind is None or len(op.outputs) != 1 or not op.inputs or op.inputs[0] is None:
        return False
    y = graph.tensors[op.outputs[0]]
    if not _nhwc1(y.shape) or int(y.shape[1]) <= 1:
        return False
    if kind == "window":
        x = graph.tensors[op.inputs[0]]
        if not _nhwc1(x.shape):
            return False
        if op.type in POOL_ROW_OPS:
            a = op.attrs
            # the C runs each output row as a VALID sub-problem: exact only when the op pads nothing
            valid = [out_size_and_pad("valid", int(x.shape[d]), int(a[f"filter_{c}"]), int(a[f"stride_{c}"]), 1)[0]
                     for d, c in ((1, "h"), (2, "w"))]
            return valid == [int(y.shape[1]), int(y.shape[2])]
        return op.inputs[1] not in trained and graph.tensors[op.inputs[1]].data is not None
    geo = row_geometry(graph, op)
    if not 1 <= len(geo["inputs"]) <= MAX_ROW_INPUTS or 0 not in geo["inputs"]:
        return False
    for j, t in enumerate(op.inputs):
        if t is None or j in geo["inputs"] or t in trained:
            if t is not None and t in trained:
                return False
            continue
        sh = graph.tensors[t].shape
        if len(sh) == 4 and int(sh[1]) != 1:
            return False  # an operand with rows of its own that is not streamed (e.g. a constant image)
    if op.type == ops.PAD.name and pad_rows(graph, op) is None:
        return False  # padding N (or paddings that are not constant) changes which rows exist
    return True


def pad_rows(graph: Graph, op: Op) -> tuple[int, int] | None:
    """(top, bottom) rows a PAD of an N=1 NHWC tensor adds along H (0, 0 for W/C padding), or None when the op is
    no such PAD: another op, paddings that are not constant, or padding of N."""
    if op.type != ops.PAD.name or len(op.inputs) < 2 or op.inputs[1] is None:
        return None
    x, p = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    if p.data is None or not _nhwc1(x.shape):
        return None
    pads = np.asarray(p.data).reshape(-1, 2)
    if pads.shape[0] != 4 or pads[0].any():
        return None
    return int(pads[1][0]), int(pads[1][1])


def _row_calls(geos: list[dict[str, Any]], sources: list[list[int]]):
    """kernels_c/tt_stream.c's pull schedule, without data: yields (k, lo, hi, made) once per row call, in call order:
    op k makes its output row made[k] from its input rows lo..hi (made is the live per-op count, advanced after the
    caller has looked). sources[k]: per streamed input of op k, the producing op of the group (>= 0) or an outside
    tensor (< 0)."""
    n = len(geos)
    made = [0] * n
    while made[n - 1] < geos[n - 1]["out_h"]:
        stack = [n - 1]
        while stack:
            k = stack[-1]
            lo, hi = input_rows(geos[k], made[k])
            pending = next((p for p in sources[k] if p >= 0 and made[p] <= hi), None)
            if pending is not None:
                stack.append(pending)
                continue
            yield k, lo, hi, made
            made[k] += 1
            stack.pop()


def simulate_rows(geos: list[dict[str, Any]], sources: list[list[int]]) -> list[int]:
    """Windows of a row stream: runs the pull schedule (_row_calls) and returns, per op, the most rows of its output
    any read needs at once (made so far - first row read); the sink's is 0."""
    n = len(geos)
    window = [0] * n
    for k, lo, hi, made in _row_calls(geos, sources):
        if hi >= lo:
            for p in sources[k]:
                if p >= 0:
                    window[p] = max(window[p], made[p] - lo)
    window[n - 1] = 0
    return window


def sink_over_inputs(geos: list[dict[str, Any]], sources: list[list[int]], n_outside: int) -> list[int]:
    """The outside inputs (indices into the stream's `outside`) whose buffer the sink's output may share: runs the
    pull schedule (_row_calls), timing each row call, and keeps input e when every sink row is written by a
    later call than the last one that reads any row of e its bytes overlap (the sink's row r and e's row q both
    start at the buffer's start: bytes [r * out_row, (r + 1) * out_row) and [q * in_row, (q + 1) * in_row)). Rows
    the schedule reads after they are overwritten, or an input read in the same call that writes over it, rule it
    out. MobileNetV2's stem: the 32x32x8 output of blocks 0-1 goes where the 128x128x3 image was (8 KB)."""
    n = len(geos)
    last_read: list[dict[int, int]] = [{} for _ in range(n_outside)]
    in_row: list[int | None] = [None] * n_outside
    written: list[int] = []
    for clock, (k, lo, hi, _made) in enumerate(_row_calls(geos, sources)):
        for j, p in enumerate(sources[k]):
            if p < 0:
                e = -1 - p
                if in_row[e] not in (None, geos[k]["in_rows"][j]):
                    in_row[e] = -1  # read with two row sizes: not a plain NHWC image
                elif in_row[e] is None:
                    in_row[e] = geos[k]["in_rows"][j]
                for q in range(lo, hi + 1):
                    last_read[e][q] = clock
        if k == n - 1:
            written.append(clock)
    out_row = geos[n - 1]["out_row"]
    ok = []
    for e in range(n_outside):
        if not in_row[e] or in_row[e] < 0:
            continue
        if all(last_read[e].get(q, -1) < t for r, t in enumerate(written)
               for q in range(r * out_row // in_row[e], ((r + 1) * out_row - 1) // in_row[e] + 1)):
            ok.append(e)
    return ok


def fed_inputs(graph: Graph, group: list[int], outside: list[str], readers: dict[str, list[int]],
               whole: set[str] = frozenset()) -> list[str]:
    """The outside inputs of a row stream that a row source feeds instead of a whole buffer: the model's input
    (an N=1 NHWC graph input of more than one row) when only the group's first op reads it, as rows, and the group
    is a chain (each op reading the one before; what memory_model.py mirrors, so that the `auto` search's price and
    the exact peak agree: a residual block fed from the image would stream where the price says it does not,
    tests/test_sparse_plan.py test_simulated_peak_tracks_the_exact_planner). The generated
    program asks the data source for its rows in order as the stream needs them (kernels_c/tt_stream.h
    tt_row_feed), keeping a window of them: MobileNetV2's 128x128x3 image (48 KB) is never whole in SRAM, only
    the 3 rows the stem's conv reads (1.1 KB). At most one: the C API takes one input."""
    label = graph.meta.get("train", {}).get("label_input")
    if len(group) >= MAX_ROW_OPS:
        return []   # no room for the source op
    for t in outside:
        if t in graph.inputs and t != label and t not in graph.outputs and t not in whole \
                and _nhwc1(graph.tensors[t].shape) and int(graph.tensors[t].shape[1]) > 1 \
                and readers.get(t) == group[:1] and _chain(graph, group, readers):
            return [t]
    return []


def _chain(graph: Graph, group: list[int], readers: dict[str, list[int]]) -> bool:
    """Each op of the group after the first reads the op before it as its first input, and only it reads it."""
    for a, b in zip(group, group[1:]):
        t = graph.ops[a].outputs[0]
        if graph.ops[b].inputs[0] != t or readers.get(t) != [b]:
            return False
    return True


def feed_geometry(graph: Graph, t: str) -> dict[str, Any]:
    """Row geometry of a fed input's source (a pseudo op of the stream, one row per call, no inputs)."""
    h = int(graph.tensors[t].shape[1])
    row = numel(graph.tensors[t].shape[2:]) * element_bytes(graph, t)
    return {"in_h": h, "out_h": h, "stride": 1, "pad_top": 0, "span": 1, "inputs": [], "in_rows": [],
            "in_row": 0, "out_row": row}


def with_feeds(graph: Graph, geos: list[dict[str, Any]], sources: list[list[int]], outside: list[str],
               fed: list[str]) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """The stream as tt_stream_rows runs it when inputs are fed: a source op per fed input in front (ops 0..f-1),
    the group's ops after it, each read of a fed input pointed at its source."""
    f = len(fed)
    src = {-1 - outside.index(t): k for k, t in enumerate(fed)}
    shifted = [[src[p] if p in src else (p + f if p >= 0 else p) for p in s] for s in sources]
    return [feed_geometry(graph, t) for t in fed] + list(geos), [[] for _ in fed] + shifted


def _row_group(graph: Graph, group: list[int], readers: dict[str, list[int]],
               geos: dict[int, dict[str, Any]]) -> tuple[list[list[int]], list[str]] | None:
    """(sources per op, outside tensors) when `group` (op indices in schedule order) can run as one row stream:
    every output but the last op's is read only inside the group, as a streamed input; else None."""
    pos = {i: k for k, i in enumerate(group)}
    for i in group[:-1]:
        t = graph.ops[i].outputs[0]
        if t in graph.outputs or not readers.get(t) or any(r not in pos for r in readers[t]):
            return None
    produced = {graph.ops[i].outputs[0]: pos[i] for i in group}
    sources, outside = [], []
    for i in group:
        op = graph.ops[i]
        src = []
        for j, t in enumerate(op.inputs):
            if t in produced and produced[t] >= pos[i]:
                return None
            if j in geos[i]["inputs"]:
                if t in produced:
                    src.append(produced[t])
                else:
                    if t not in outside:
                        outside.append(t)
                    src.append(-1 - outside.index(t))
            elif t in produced:
                return None  # read whole: it never exists whole inside the group
        sources.append(src)
    return sources, outside


def _group_cost(graph: Graph, group: list[int], sources: list[list[int]], outside: list[str],
                geos: dict[int, dict[str, Any]], nbytes, readers: dict[str, list[int]]) -> int:
    """Bytes a row stream holds while it runs, estimated without simulating it: its outside inputs and its sink's
    output whole, each intermediate output (and a fed input, fed_inputs) for the most rows its consumers read at
    once, per consumer."""
    rows: dict[int, int] = {}
    for k, i in enumerate(group):
        for p in sources[k]:
            if p >= 0:
                rows[p] = rows.get(p, 0) + geos[i]["window"]
    fed = fed_inputs(graph, group, outside, readers)
    held = 0
    for t in outside:
        if t in fed:  # a window of rows: as many as its readers read at once
            held += sum(geos[i]["window"] for k, i in enumerate(group) if -1 - outside.index(t) in sources[k]) \
                * feed_geometry(graph, t)["out_row"]
        else:
            held += nbytes(t)
    return (held + nbytes(graph.ops[group[-1]].outputs[0])
            + sum(r * geos[group[p]]["out_row"] for p, r in rows.items()))


def _op_cost(graph: Graph, i: int, nbytes) -> int:
    """Bytes an op run whole holds: its non-constant inputs and its output."""
    op = graph.ops[i]
    ins = {t for t in op.inputs if t is not None and graph.tensors[t].data is None}
    return sum(nbytes(t) for t in ins | set(op.outputs))


def _row_streams(graph: Graph, order: list[int]) -> list[Stream]:
    """Row streams of the schedule. In each run of consecutive row-streamable ops, the groups (at most MAX_ROW_OPS
    ops, _row_group) are chosen by a dynamic program over the run's cut points that minimises the most bytes any
    group or unstreamed op holds (_group_cost, _op_cost), then the sum of their squares, then the fewest streamed
    ops: the big tensors end up inside groups, the cuts fall on small ones."""
    trained = graph.meta.get("train", {}).get("trained", {})
    readers = graph.consumers()
    ok = {i: row_op_ok(graph, graph.ops[i], trained) for i in order}
    geos = {i: row_geometry(graph, graph.ops[i]) for i in order if ok[i]}
    for geo in geos.values():
        geo["window"] = window_rows(geo)
    sizes: dict[str, int] = {}

    def nbytes(t: str) -> int:
        if t not in sizes:
            sizes[t] = numel(graph.tensors[t].shape) * element_bytes(graph, t)
        return sizes[t]

    out: list[Stream] = []
    written_over: set[str] = set()   # sinks placed over one of their inputs
    s = 0
    while s < len(order):
        if not ok[order[s]]:
            s += 1
            continue
        e = s
        while e + 1 < len(order) and ok[order[e + 1]]:
            e += 1
        run = order[s:e + 1]
        at = {i: k for k, i in enumerate(run)}
        # last reader (position in the run) of each op's output; past the end when it cannot stay inside a group
        last = [max((at.get(r, len(run)) for r in readers.get(graph.ops[i].outputs[0], [])), default=len(run))
                if graph.ops[i].outputs[0] not in graph.outputs else len(run) for i in run]
        # best[j]: (most bytes held, sum of squared bytes held, streamed ops, previous cut, group found) for the
        # run's first j ops. The squares: below the run's most, a group that lowers a large op still counts (the
        # run's most is an estimate -- a stream's last output written over its input rows holds less -- and the
        # step's peak may sit elsewhere); prune_streams drops the groups the exact arena does not need.
        best: list[tuple | None] = [None] * (len(run) + 1)
        best[0] = (0, 0, 0, -1, None)
        for i in range(len(run)):
            peak, sq, nops = best[i][:3]
            c = _op_cost(graph, run[i], nbytes)
            cand = (max(peak, c), sq + c * c, nops, i, None)
            if best[i + 1] is None or cand[:3] < best[i + 1][:3]:
                best[i + 1] = cand
            reach = -1
            for j in range(i + 2, min(len(run), i + MAX_ROW_OPS) + 1):
                reach = max(reach, last[j - 2])
                if reach > j - 1:
                    continue  # an output of run[i:j - 1] is read after the group: _row_group would refuse it
                found = _row_group(graph, run[i:j], readers, geos)
                if found is None:
                    continue
                c = _group_cost(graph, run[i:j], *found, geos, nbytes, readers)
                cand = (max(peak, c), sq + c * c, nops + j - i, i, found)
                if best[j] is None or cand[:3] < best[j][:3]:
                    best[j] = cand
        j, groups = len(run), []
        while j > 0:
            i, found = best[j][3:]
            if found is not None:
                groups.append((run[i:j], found))
            j = i
        for group, (sources, outside) in reversed(groups):
            gl = [geos[i] for i in group]
            windows = simulate_rows(gl, sources)
            win = {graph.ops[i].outputs[0]: windows[k] for k, i in enumerate(group[:-1])}
            chunked = {graph.ops[i].outputs[0]: windows[k] * gl[k]["out_row"] for k, i in enumerate(group[:-1])}
            whole = {t for i in group for j, t in enumerate(graph.ops[i].inputs) if j not in geos[i]["inputs"]}
            fed = fed_inputs(graph, group, outside, readers, whole)
            if fed:
                fg, fs = with_feeds(graph, gl, sources, outside, fed)
                fw = simulate_rows(fg, fs)
                for f, t in enumerate(fed):
                    win[t], chunked[t] = fw[f], fw[f] * fg[f]["out_row"]
            # not over a tensor that is itself written over another (the arena places one level of it)
            over = [outside[e] for e in sink_over_inputs(gl, sources, len(outside))
                    if outside[e] not in whole and outside[e] not in fed and outside[e] not in written_over]
            if over:
                written_over.add(graph.ops[group[-1]].outputs[0])
            info = {"windows": win, "sources": sources, "outside": outside, "sink_over": over}
            if fed:
                info["fed"] = fed
            out.append(Stream("rows", group, chunked, info))
        s = e + 1
    return out


# ---- positions -------------------------------------------------------------------------------------------------

def _pointwise_grad_input(graph: Graph, op: Op, t: str) -> bool:
    if op.type != ops.CONV2D_GRAD_INPUT.name or op.inputs[0] != t:
        return False
    a = op.attrs
    w = graph.tensors[op.inputs[1]].shape
    dx, dz = graph.tensors[op.outputs[0]].shape, graph.tensors[t].shape
    return (int(w[1]) == 1 and int(w[2]) == 1 and int(a["stride_h"]) == 1 and int(a["stride_w"]) == 1
            and tuple(dx[:3]) == tuple(dz[:3]))


def _position_candidates(graph: Graph) -> list[list[int]]:
    """[mean_grad, mask op, consumers...] op groups (graph order inside the consumers)."""
    readers = graph.consumers()
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
        if all(graph.ops[c].type == ops.BIAS_GRAD.name or _pointwise_grad_input(graph, graph.ops[c], t2) for c in cons):
            out.append([m, e] + sorted(cons))
    return out


# ---- channels --------------------------------------------------------------------------------------------------

def _channel_candidates(graph: Graph) -> list[list[int]]:
    readers = graph.consumers()
    if int(graph.meta.get("train", {}).get("batch_size", 1)) != 1:
        return []
    out = []
    for g, op in enumerate(graph.ops):
        if op.type not in CHANNEL_GRAD_OPS:
            continue
        group = [g]
        dw = op.outputs[0]
        rs = readers.get(dw, [])
        # fp16-mixed: the gradient passes element-wise ops (rounding, unscaling) on its way, or ends in a check
        while len(rs) == 1 and dw not in graph.outputs and graph.ops[rs[0]].type in CHANNEL_CHAIN_OPS \
                and graph.ops[rs[0]].inputs[0] == dw:
            group.append(rs[0])
            dw = graph.ops[rs[0]].outputs[0]
            rs = readers.get(dw, [])
        if len(rs) != 1 or dw in graph.outputs:
            continue
        u = graph.ops[rs[0]]
        if u.type in CHANNEL_END_OPS and dw in u.inputs:
            out.append(group + [rs[0]])
            continue
        # every update reads (param, gradient, ...); one that zeroes its gradient after use (reset_grad) keeps it
        if u.type not in UPDATE_OPS or len(u.inputs) < 2 or u.inputs[1] != dw or u.attrs.get("reset_grad"):
            continue
        out.append(group + [rs[0]])
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
                # the gradient (and the ops it passes) moves down to its update (only the group reads it)
                new = [i for i in order if i not in group[:-1]]
                k = new.index(group[-1])
                new = new[:k] + group[:-1] + new[k:]
            else:
                new = _gather(order, group, preds)
            if new is None or not is_valid_order(graph, new, preds):
                continue
            order = new
            streams.append(_chunked_stream(graph, kind, group))
    for chain in channel_stream.hidden_candidates(graph):
        pos = {i: s for s, i in enumerate(order)}
        group = sorted(chain["members"], key=lambda i: pos[i])
        members = set(group)
        inner = [s for s in streams if set(s.ops) & members]
        if any(s.kind != "channels" or not set(s.ops) <= members for s in inner):
            continue
        new = _gather(order, group, preds)
        if new is None or not is_valid_order(graph, new, preds) or not _consecutive(new, streams):
            continue
        order = new
        streams = [s for s in streams if s not in inner]
        streams.append(Stream("hidden", group, channel_stream.chunked(graph, chain),
                              {"channels": chain["channels"]}, replaces=inner))
    return order, streams


def _consecutive(order: list[int], streams: list[Stream]) -> bool:
    pos = {i: s for s, i in enumerate(order)}
    for st in streams:
        steps = sorted(pos[i] for i in st.ops)
        if steps[-1] - steps[0] + 1 != len(steps):
            return False
    return True


def _chunked_stream(graph: Graph, kind: str, group: list[int]) -> Stream:
    if kind == "positions":
        t1 = graph.ops[group[0]].outputs[0]
        t2 = graph.ops[group[1]].outputs[0]
        c = int(graph.tensors[t1].shape[-1])
        return Stream(kind, group, {t1: c * 4, t2: c * 4},
                      {"positions": int(graph.tensors[t1].shape[1]) * int(graph.tensors[t1].shape[2])})
    dw = graph.ops[group[0]].outputs[0]
    sh = graph.tensors[dw].shape
    chain = [graph.ops[i].outputs[0] for i in group[:-1]]
    return Stream(kind, group, {t: numel(sh[1:]) * element_bytes(graph, t) for t in chain},
                  {"channels": int(sh[0])})


def prune_streams(plan_fn, streams: list[Stream]) -> tuple[list[Stream], Any]:
    """Drop each stream whose removal does not raise the arena (fewer streams: fewer, larger kernel calls).
    plan_fn(streams, place_below) -> MemPlan (memplan.plan_memory: a trial whose lower bound is already above the
    arena to beat is not placed)."""
    keep = list(streams)
    best = plan_fn(keep, None)
    for s in sorted(streams, key=lambda s: sum(s.chunked.values())):
        trial = [k for k in keep if k is not s] + s.replaces
        p = plan_fn(trial, best.arena)
        if p.arena <= best.arena:
            keep, best = trial, p
    return keep, best
