"""The memory model's abstract program of a training step (memory_model.MemoryModel._simulate): steps (type, SRAM
inputs, outputs), in order, with the byte size of every tensor they name.

  StepBuilder      the BackwardBuilder that records an op module's backward emission as steps
  mask_steps       autodiff's 1-bit activation masks, as steps
  merge_group      a stream's steps as one step (merge_positions: the position stream; the hidden-channel streams:
                   channel_stream.merge_steps)
  live_profile     the live bytes at each step, with the exact planner's lifetimes and in-place sharing
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tinytrain.stages.model.ir import Graph, numel
from tinytrain.stages.ops import CLAMP_MASK, FIRST_INPUT_ONLY, IN_PLACE_OPS, MASK_GRAD, REGISTRY
from tinytrain.stages.ops.backward import Dequantizer, insert_masks, mask_bounds
from tinytrain.stages.planning.arena import ALIGN, CHANNEL_SCRATCH_OPS

if TYPE_CHECKING:
    from tinytrain.stages.planning.memory_model import MemoryModel

FP32 = 4


def aligned(n: int) -> int:
    """n bytes rounded up to the arena's alignment, as the arena places a buffer."""
    return -(-int(n) // ALIGN) * ALIGN


class StepBuilder:
    """The BackwardBuilder (stages/ops/backward.py) of the abstract program: an op module's backward ops become
    (type, SRAM inputs, outputs) steps; constants (flash) are not inputs. What the exact planner does to the graph
    autodiff emits is applied here as the ops come: an int8 tensor's dequantization (backward.Dequantizer, autodiff's
    too) is a step where a backward op first reads it, except where memplan.fused_dequantize fuses it into its
    reader (`fused_read`: the reader reads the int8 tensor itself); `finish` places each layer's updates as the
    reorder stage does."""

    def __init__(self, model: "MemoryModel", steps: list, sizes: dict[str, int], share, update,
                 wk: dict[str, int], bias_on: set[str], pgrads: dict[str, list[str]], whole):
        self.m, self.g, self.steps, self.sizes, self._share, self._update = model, model.g, steps, sizes, share, update
        self._wk, self._bias_on, self._pgrads, self._whole = wk, bias_on, pgrads, whole
        self.bcast: set[str] = set()     # gradients that are a broadcast (mean_grad's): reorder streams them by position
        self.maskable: set[int] = set()  # steps autodiff may turn into mask_grad (backward.mask_bounds)
        self.deq = Dequantizer(self, fuses=partial(fused_read, self.g))
        self._reads: dict[int, list[str]] = {}   # id(step) -> every tensor it reads (constants included)
        self._marked: set[int] = set()           # id(step) of maskable steps
        self._new: dict[str, str] = {}           # parameter gradient -> its parameter, until a step writes it
        self._params: list[tuple[str, str, tuple]] = []   # (parameter, its gradient, the step writing it)
        self.streamed: dict[str, int] = {}       # channel-streamed parameter gradient -> its channels

    # ---- BackwardBuilder
    def share(self, t: str | None, i: int) -> str | None:
        return self._share(t, i)

    def real(self, t: str) -> str:
        return self.deq.real(t)

    def real_slice(self, x: str, k: int, depth: int | None) -> str:
        return self.deq.real_slice(x, k, depth)

    def gradient(self, name: str, like: str) -> str:
        self.sizes[name] = self.m._bytes(like, fp32=True) if like in self.g.tensors else self.sizes[like]
        return name

    def copy(self, name: str, shape: list[int]) -> str:
        self.sizes[name] = numel(shape) * FP32
        return name

    def weight_channels(self, w: str) -> int:
        return self._wk.get(w, 0)

    def trains_bias(self, b: str | None) -> bool:
        return b is not None and b in self._bias_on

    def param_grad(self, p: str, i: int, shape: list[int]) -> str:
        name = f"grad/{p}#{i}"
        self.sizes[name] = numel(shape) * FP32
        self._pgrads.setdefault(p, []).append(name)
        self._new[name] = p
        return name

    def emit(self, type_: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        d = REGISTRY[type_]
        reads = self.deq.reads(d, inputs)
        step = (type_, [t for t in reads if t in self.sizes], list(outputs))
        self._step(step, reads)
        if len(inputs) == 2 and inputs[1] in self.g.tensors \
                and mask_bounds(type_, attrs, self.g.tensors[inputs[1]]) is not None:
            self._marked.add(id(step))
        if d.broadcasts and len(outputs) == 1:
            self.bcast.add(outputs[0])
        self._params += [(self._new.pop(o), o, step) for o in outputs if o in self._new]

    def _step(self, step: tuple, reads: list[str]) -> None:
        self.steps.append(step)
        self._reads[id(step)] = reads

    def finish(self, start: int) -> None:
        """Place the updates of the parameter gradients the op's backward wrote (steps[start:]), as the reorder
        stage does: a whole gradient (no other layer shares the parameter) updates right after the last step that
        reads the parameter (an input gradient reads the old weight), at once with batch_size > 1 (what runs then
        is the accumulation); a `channel_stream` weight gradient (conv / FC, in-place updates at batch 1) is
        computed right before its update, one output channel at a time."""
        seg = self.steps[start:]
        del self.steps[start:]
        s = self.m.s
        pos = {id(st): j for j, st in enumerate(seg)}
        anchors: dict[int, list[tuple[str, tuple | None]]] = {}
        moved: set[int] = set()
        for p, gname, step in self._params:
            if not self._whole(p):
                continue
            at = pos[id(step)]
            if s.batch_size == 1:
                at = max([at] + [j for j, st in enumerate(seg) if p in self._reads.get(id(st), ())])
            streamed = s.reorder and s.batch_size == 1 and REGISTRY[step[0]].channel_stream
            if streamed:
                self.sizes[gname] //= int(self.g.tensors[p].shape[0])
                self.streamed[gname] = int(self.g.tensors[p].shape[0])
                moved.add(id(step))
            anchors.setdefault(at, []).append((gname, step if streamed else None))
        for j, st in enumerate(seg):
            if id(st) not in moved:
                self.steps.append(st)
            for gname, streamed_step in anchors.get(j, ()):
                if streamed_step is not None:
                    self.steps.append(streamed_step)
                self._update(gname)
        for j in range(start, len(self.steps)):
            if id(self.steps[j]) in self._marked:
                self.maskable.add(j)
        self._params.clear()
        self._reads.clear()
        self._marked.clear()


def fused_read(g: Graph, reader, k: int, t: str, sliced: bool, depth: int | None) -> bool:
    """memplan.fused_dequantize: a backward op (OpDef `reader`) reading the dequantized int8 tensor t (sliced: its
    trained channels) as its operand k dequantizes it as it reads it, so the fp32 copy takes no SRAM: an input
    gradient's weights (`grad_input`), a `fused_input` weight gradient's per-tensor 4-D input slice."""
    if k != 1:
        return False
    if not sliced:
        return reader.grad_input
    xt = g.tensors[t]
    return reader.fused_input and depth is None and xt.quant is not None and len(xt.quant.scale) == 1 \
        and len(xt.shape) == 4


def mask_steps(steps: list[tuple[str, list[str], list[str]]], n_fwd: int, maskable: set[int],
                sizes: dict[str, int], graph: Graph) -> int:
    """autodiff._use_masks on the abstract program: a forward output y whose only readers after the forward
    (steps[n_fwd:]) are masking steps (int8_clamp_grad, act_grad of relu / relu6 / relu_n1_to_1) gets a
    `clamp_mask` step right after its producer (ceil(n/8) bytes) and those steps read the mask instead
    (`mask_grad`, in place over dy). Returns how many steps went into the forward (backward.insert_masks, as
    autodiff runs it)."""
    def masks(j: int, y: str) -> bool | None:   # a masking step reading [dy, y] (its bounds are autodiff's)
        return True if j in maskable and steps[j][1][1:] == [y] and steps[j][1][0] != y else None

    def mask_step(y: str, _) -> tuple[tuple, str]:
        sizes[f"mask/{y}"] = -(-numel(graph.tensors[y].shape) // 8)
        return (CLAMP_MASK.name, [y], [f"mask/{y}"]), f"mask/{y}"

    return insert_masks(steps, n_fwd, lambda st: (st[1], st[2]), masks, mask_step,
                        lambda st, mask: (MASK_GRAD.name, [st[1][0], mask], list(st[2])))


def merge_positions(steps: list[tuple], dy: str, dz: str) -> dict[int, int]:
    """The reorder stage's position stream on the abstract program: the step that makes the broadcast gradient dy
    (mean_grad), the mask making dz and the steps reading dz become one step (merge_group). Returns the
    old -> new index of every step."""
    remap = {k: k for k in range(len(steps))}
    m = next((k for k in range(len(steps)) if dy in steps[k][2]), None)
    if m is None:
        return remap
    members = [m] + [k for k in range(m + 1, len(steps)) if dz in steps[k][2] or dz in steps[k][1]]
    merged = merge_group(steps, members, "positions")
    return remap if merged is None else merged


def live_profile(sizes: dict[str, int], steps: list[tuple[str, list[str], list[str]]], inputs: list[str],
                  outputs: list[str], graph: Graph) -> tuple[list[int], dict[str, int], dict[str, int]]:
    """(live transient bytes at each step, last step of each tensor, bytes of the buffer holding each tensor) of
    `steps` run in order, with memplan.plan_memory's lifetimes and in-place sharing; each buffer counts its
    aligned size, as the arena places it."""
    n = max(len(steps), 1)
    first: dict[str, int] = {}
    end: dict[str, int] = {}
    for t in inputs:
        first[t], end[t] = 0, 0
    for s, (_, ins, outs) in enumerate(steps):
        for t in ins:
            end[t] = s
        for t in outs:
            if t not in first:
                first[t], end[t] = s, max(end.get(t, s), s)
    for t in outputs:
        if t in first:
            end[t] = n - 1
    # buffers as [size, start, end]
    bufs: list[list[int]] = []
    by: dict[str, list[int]] = {}
    for t in inputs:
        by[t] = [sizes[t], 0, end[t]]
        bufs.append(by[t])
    for s, (typ, ins, outs) in enumerate(steps):
        taken: set[int] = set()
        for t in outs:
            if first[t] != s or t in by:
                continue
            host = None
            if typ in IN_PLACE_OPS:
                for c in (ins[:1] if typ in FIRST_INPUT_ONLY else ins):
                    b = by.get(c)
                    if b is None or id(b) in taken or c in outputs or end[c] != s or b[2] != s \
                            or ins.count(c) != 1 or b[0] < sizes[t]:
                        continue
                    host = b
                    break
            if host is not None:
                taken.add(id(host))
                host[2] = max(host[2], end[t])
                by[t] = host
                # one output channel of scratch, as the planner counts it (a forward op's; the backward's
                # depthwise input gradient, in place over dz, is modelled without it)
                if typ in CHANNEL_SCRATCH_OPS and REGISTRY[typ].kind == "forward":
                    # fp16-mixed's 2-byte results (planning/fp16_memory: h16/<tensor>) take 2-byte scratch
                    h16 = t.startswith("h16/") and t not in graph.tensors
                    tt = graph.tensors[t[4:] if h16 else t]
                    bufs.append([numel(tt.shape[:-1]) * (2 if h16 else int(np.dtype(tt.dtype).itemsize)), s, s])
                continue
            by[t] = [sizes[t], s, end[t]]
            bufs.append(by[t])
    diff = [0] * (n + 1)
    for size, a, b in bufs:
        diff[a] += aligned(size)
        diff[b + 1] -= aligned(size)
    live, acc = [], 0
    for s in range(n):
        acc += diff[s]
        live.append(acc)
    return live, end, {t: aligned(b[0]) for t, b in by.items()}


def merge_group(steps: list[tuple], members: list[int], kind: str) -> dict[int, int] | None:
    """steps[members] (members[0] the first, in the order given) become one step of type `kind` reading what the
    members read and do not make, and writing all they write: the reorder stage's planner runs a stream's ops as one
    group and keeps the group's tensors for the whole group, without in-place sharing inside it. The steps between the members that write what the
    group reads go before it, the others after, as streams._gather orders ops. Returns the old -> new index of every
    step; None, with `steps` untouched, when a step between them both feeds the group and reads what it makes (the
    planner would not gather it either)."""
    first, last = members[0], max(members)
    inside = set(members)
    made = {t for k in members for t in steps[k][2]}
    reads = {t for k in members for t in steps[k][1]}
    before, after = [], []
    for k in range(first, last + 1):
        if k in inside:
            continue
        if set(steps[k][2]) & reads:
            if set(steps[k][1]) & made:
                return None
            before.append(k)
        else:
            after.append(k)
    merged = (kind, list(dict.fromkeys(t for k in members for t in steps[k][1] if t not in made)),
              list(dict.fromkeys(t for k in members for t in steps[k][2])))
    span = [steps[k] for k in before] + [merged] + [steps[k] for k in after]
    remap = {k: k for k in range(first)}
    remap.update({k: first + n for n, k in enumerate(before)})
    remap.update({k: first + len(before) for k in members})
    remap.update({k: first + len(before) + 1 + n for n, k in enumerate(after)})
    shift = (last + 1 - first) - len(span)
    remap.update({k: k - shift for k in range(last + 1, len(steps))})
    steps[first:last + 1] = span
    return remap
