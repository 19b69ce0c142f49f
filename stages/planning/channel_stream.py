"""Hidden-channel streams: the backward of a chain between two 1x1 convolutions run one hidden channel at a time
(stages/planning/streams.py's fourth kind, `hidden`).

In an inverted-residual block (expand 1x1 -> depthwise -> project 1x1) the gradients between the two 1x1 convs
have the expanded width: MobileNetV2-w0.35's block 12 holds 8x8x192 fp32 (48 KB) for them, the largest tensor of
its backward. Every op between the two channel-mixing ops maps hidden channel c to hidden channel c, so the chain
runs as a loop over c, each iteration holding one H x W plane of each gradient:

    start   a 1x1 stride-1 input gradient (hidden_role "mix") producing the hidden gradient h: its channel c
    chain   per-channel ops on h and what they make, every reader of each inside the chain: masks ("mask", dz = dy
            where a saved 1-bit mask / int8 output allows), depth-multiplier-1 depthwise input gradients
            ("channel"), bias gradients ("sum": element c of theirs)
    ends    1x1 stride-1 input gradients ("mix": the sum over c of each channel's contribution, accumulated in
            channel order onto a zeroed output, the whole kernel's order) and 1x1 weight gradients ("weight":
            row c) with their update (one row at a time, as a `channels` stream; after the row's input gradient,
            which reads the old row)

Each element is the same float32 arithmetic, in the same order, as the whole kernels compute
(kernels_c/tt_hidden_stream.h): the bits do not change. The chain's own gradients (`chunked`) cost one plane; the
tensors the chain reads or writes from outside (the start's input gradient, the ends' outputs, saved masks and
activations) live for the whole loop, so whether it pays is the exact planner's call (streams.prune_streams keeps
it only when the arena does not grow; dropped, the `channels` stream it absorbed comes back).
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, Op, numel
from tinytrain.stages.planning.arena import depth_multiplier, element_bytes
from tinytrain.stages.planning.abstract_program import merge_group

ROLES = ops.HIDDEN_ROLES
# the most filter taps a streamed depthwise gradient keeps (kernels_c/tt_hidden_stream.c TT_HS_MAX_TAPS): a larger
# filter leaves its chain unstreamed here, so that planning never picks a stream codegen cannot emit
MAX_TAPS = 64
# forward ops whose input gradient mixes hidden channels (a 1x1 conv's): read once, not per chain step
_MIX_FORWARD = frozenset(d.of for d in ops.REGISTRY.values() if d.hidden_role == "mix")
FP32 = 4


def _nhwc1(graph: Graph, t: str) -> bool:
    sh = graph.tensors[t].shape
    return len(sh) == 4 and int(sh[0]) == 1


def _weight_shape(graph: Graph, op: Op) -> list[int]:
    """The forward conv's weight shape [O, KH, KW, I] of a conv gradient op."""
    return [int(v) for v in (op.attrs.get("w_shape") or graph.tensors[op.inputs[1]].shape)]


def pointwise(graph: Graph, op: Op) -> bool:
    """A 1x1 stride-1 conv gradient whose gradient operand and other tensor have the same N=1 H x W."""
    a = op.attrs
    ws = _weight_shape(graph, op)
    if len(ws) != 4 or int(ws[1]) != 1 or int(ws[2]) != 1:
        return False
    if int(a.get("stride_h", 1)) != 1 or int(a.get("stride_w", 1)) != 1:
        return False
    dz, other = op.inputs[0], (op.outputs[0] if ROLES.get(op.type) == "mix" else op.inputs[1])
    if not (_nhwc1(graph, dz) and _nhwc1(graph, other)):
        return False
    return tuple(graph.tensors[dz].shape[1:3]) == tuple(graph.tensors[other].shape[1:3])


def _mask_ok(graph: Graph, op: Op, t: str) -> bool:
    """A mask the C reads per channel: a 1-bit mask of t's elements, or an int8 tensor of t's shape."""
    m = graph.tensors[op.inputs[1]]
    if m.dtype == "uint8":
        return numel(m.shape) * 8 >= numel(graph.tensors[t].shape)
    return m.dtype == "int8" and list(m.shape) == list(graph.tensors[t].shape) and "lo" in op.attrs


def chain_at(graph: Graph, a: int, readers: dict[str, list[int]]) -> dict[str, Any] | None:
    """The hidden-channel chain starting at op a (a 1x1 input gradient), or None when a is no such start or a reader
    of the chain's gradients is not one of the roles above."""
    op = graph.ops[a]
    if ROLES.get(op.type) != "mix" or not pointwise(graph, op):
        return None
    h = op.outputs[0]
    c = int(graph.tensors[h].shape[3])
    if c < 2 or graph.tensors[h].dtype != "float32" or _weight_shape(graph, op)[3] != c:
        return None
    members, planes, sums, ends, weights = [a], [h], [], [], []
    frontier = [h]
    while frontier:
        t = frontier.pop(0)
        rs = readers.get(t, [])
        if not rs or t in graph.outputs:
            return None
        for r in rs:
            rop = graph.ops[r]
            role = ROLES.get(rop.type)
            if r in members or rop.inputs[0] != t or rop.inputs.count(t) != 1:
                return None
            out = rop.outputs[0] if rop.outputs else None
            if role in ("mask", "channel"):
                if role == "mask" and not _mask_ok(graph, rop, t):
                    return None
                if role == "channel" and (depth_multiplier(graph, rop) != 1 or _taps(graph, rop) > MAX_TAPS):
                    return None
                if out in rop.inputs or not _nhwc1(graph, out) or int(graph.tensors[out].shape[3]) != c \
                        or graph.tensors[out].dtype != "float32":
                    return None
                members.append(r)
                planes.append(out)
                frontier.append(out)
            elif role == "sum":
                if numel(graph.tensors[out].shape) != c:
                    return None
                members.append(r)
                sums.append(r)
            elif role == "mix" and pointwise(graph, rop) and _weight_shape(graph, rop)[0] == c:
                members.append(r)
                ends.append(r)
            elif role == "weight" and pointwise(graph, rop) and int(rop.attrs["w_shape"][0]) == c:
                rs2 = readers.get(out, [])
                if len(rs2) != 1 or out in graph.outputs:
                    return None
                u = graph.ops[rs2[0]]
                if u.type not in ops.UPDATE_OPS or len(u.inputs) < 2 or u.inputs[1] != out \
                        or u.attrs.get("reset_grad"):
                    return None
                members += [r, rs2[0]]
                weights.append((r, rs2[0]))
            else:
                return None
    if len(planes) < 2 and not ends and not weights:
        return None
    # an updated parameter the start reads (its column c) would change under it: refuse
    updated = {graph.ops[u].inputs[0] for _, u in weights}
    if updated & set(op.inputs):
        return None
    return {"members": members, "planes": planes, "sums": sums, "ends": ends, "weights": weights, "channels": c}


def chunked(graph: Graph, chain: dict[str, Any]) -> dict[str, int]:
    """Bytes each streamed tensor occupies: one channel's plane of each gradient, one row of each weight gradient."""
    c = chain["channels"]
    out = {t: numel(graph.tensors[t].shape) // c * element_bytes(graph, t) for t in chain["planes"]}
    for g, _ in chain["weights"]:
        dw = graph.ops[g].outputs[0]
        out[dw] = numel(graph.tensors[dw].shape[1:]) * 4
    return out


def hidden_candidates(graph: Graph) -> list[dict[str, Any]]:
    """Every chain of the graph (batch 1: the weight rows update in place), disjoint, in graph order."""
    if int(graph.meta.get("train", {}).get("batch_size", 1)) != 1:
        return []
    readers = graph.consumers()
    out, taken = [], set()
    for a in range(len(graph.ops)):
        chain = chain_at(graph, a, readers)
        if chain is None or taken & set(chain["members"]):
            continue
        taken.update(chain["members"])
        out.append(chain)
    return out


# ---- the memory model's view (stages/planning/memory_model.py) ---------------------------------------------------

def _forward_of(name: str) -> tuple[str, int | None]:
    """(forward tensor, forward op index or None) of a gradient name of the memory model's abstract program:
    grad/<t>#<i>[.<k>] (op i's share), grad/<t> (the sum of the shares), grad/<t>:pre (before a mask)."""
    t = name[len("grad/"):] if name.startswith("grad/") else name
    if t.endswith(":pre"):
        return t[:-len(":pre")], None
    if "#" in t:
        t, i = t.rsplit("#", 1)
        return t, int(i.split(".")[0])
    return t, None


def merge_steps(steps: list[tuple], sizes: dict[str, int], graph: Graph, start: int = 0) -> dict[int, int]:
    """The reorder stage's hidden streams on the memory model's abstract program (steps: (type, SRAM inputs,
    outputs), in order; steps[start:] the backward): each chain becomes one step that reads and writes everything
    its members do (abstract_program.merge_group: all of it lives across the loop, as the planner extends the
    lifetimes), its gradients sized one plane (`sizes` updated). Returns the old -> new index of every step."""
    remap = {j: j for j in range(len(steps))}
    j = start
    while j < len(steps):
        found = _abstract_chain(steps, j, graph)
        if found is None:
            j += 1
            continue
        members, planes, c = found
        for t in planes:
            sizes[t] = numel(graph.tensors[_forward_of(t)[0]].shape) // c * FP32
        merged = merge_group(steps, members, "hidden")
        if merged is None:
            return remap
        remap = {old: merged[cur] for old, cur in remap.items()}
        j = merged[members[0]] + 1
    return remap


def _abstract_chain(steps: list[tuple], j: int, graph: Graph) -> tuple[list[int], list[str], int] | None:
    """(member steps, gradient planes, hidden channels) of the chain starting at steps[j], by chain_at's rules."""
    typ, _, outs = steps[j]
    if ROLES.get(typ) != "mix" or len(outs) != 1:
        return None
    h = outs[0]
    t, i = _forward_of(h)
    if i is None or not _conv_1x1(graph, i) or t not in graph.tensors or not _nhwc1(graph, t):
        return None
    c = int(graph.tensors[t].shape[3])
    members, planes, frontier = [j], [h], [h]
    while frontier:
        cur = frontier.pop(0)
        rs = [k for k in range(j + 1, len(steps)) if cur in steps[k][1]]
        if not rs:
            return None
        for k in rs:
            typ_k, ins_k, outs_k = steps[k]
            role = ROLES.get(typ_k)
            if k in members or ins_k[0] != cur or ins_k.count(cur) != 1:
                return None
            if role in ("mask", "channel"):
                if len(outs_k) != 1 or outs_k[0] in ins_k:
                    return None
                if role == "channel":
                    fi = _forward_of(outs_k[0])[1]
                    if fi is None or depth_multiplier(graph, graph.ops[fi]) != 1 \
                            or _taps(graph, graph.ops[fi]) > MAX_TAPS:
                        return None
                members.append(k)
                planes.append(outs_k[0])
                frontier.append(outs_k[0])
            elif role == "sum":
                members.append(k)
            elif role == "mix":
                fi = _forward_of(outs_k[0])[1]
                if fi is None or not _conv_1x1(graph, fi):
                    return None
                members.append(k)
            elif role == "weight":
                upd = [m for m in range(k + 1, len(steps)) if outs_k[0] in steps[m][1]]
                if len(upd) != 1 or steps[upd[0]][0] != "update":
                    return None
                members.append(k)
            else:
                return None
    if len(planes) < 2:
        return None
    return sorted(members), planes, c


def _taps(graph: Graph, op: Op) -> int:
    """Filter taps of a depthwise op or its gradient (weight [1, kh, kw, C], its second input)."""
    ws = graph.tensors[op.inputs[1]].shape
    return int(ws[1]) * int(ws[2])


def _conv_1x1(graph: Graph, i: int) -> bool:
    """Forward op i is a 1x1 stride-1 conv over N=1 NHWC (what `pointwise` asks of its gradients)."""
    op = graph.ops[i]
    if op.type not in _MIX_FORWARD or len(op.inputs) < 2 or op.inputs[1] is None:
        return False
    ws = graph.tensors[op.inputs[1]].shape
    x, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    return (len(ws) == 4 and int(ws[1]) == 1 and int(ws[2]) == 1 and int(op.attrs.get("stride_h", 1)) == 1
            and int(op.attrs.get("stride_w", 1)) == 1 and len(x) == 4 and int(x[0]) == 1
            and tuple(x[1:3]) == tuple(y[1:3]))
