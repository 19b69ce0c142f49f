"""Streaming inference of a stateful model in the generated library: one call per invocation (frame), the state
kept in SRAM between calls (issue 10, item 4).

    stream_parts(gen, tg) -> StreamParts | None        (None: the model is not stateful)

Training runs the model unrolled over model.sequence_length invocations (stages/model/state.py); a product runs
it one invocation at a time, as LiteRT and TFLite Micro do with the original file. This module emits that:

    tt_stream_reset()               every state variable := its initial value (what the model's CALL_ONCE init
                                    subgraph assigns); tt_init calls it
    tt_stream_step(frame, output)   one invocation: reads each variable, runs the ops, stores the new values

The ops are those of one invocation (state.step_graph: the original model's ops, over the training program's
tensors), emitted by the same op emitters as the training program, so a trained weight is read where training
updates it (in the arena or its SRAM copy): after tt_train_sample, the next frame uses the new weights.

Memory (static, outside the training arena, so streaming and training never disturb each other's data):
  - one buffer per state variable (`.bss`, TT_STREAM_STATE_BYTES in all): the variable's value between calls;
  - the activations of one invocation in `tt_stream_arena` (TT_STREAM_ARENA_BYTES): placed first-fit by liveness
    over the invocation's op order;
  - a variable's new value is written straight into its buffer when every read of the old value comes before the
    op that makes the new one (a ring buffer's update: concat, then slice); otherwise it is made in the stream
    arena and copied at the end of the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinytrain.stages.c_emit.literals import CTYPE, CodegenError, c_array
from tinytrain.stages.model import state as st
from tinytrain.stages.model.ir import Graph

ALIGN = 16


@dataclass
class StreamParts:
    """What api.py renders into tt_model.h / tt_model.c."""
    reason: str = ""                                  # why there is no per-frame API ("" when there is)
    globals: list[str] = field(default_factory=list)  # state buffers, the stream arena, initial values
    reset: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)     # tt_stream_step's statements (`frame`, `output` in scope)
    frame: dict[str, Any] = field(default_factory=dict)    # name, shape, dtype, bytes, scale, zero_point
    output: dict[str, Any] = field(default_factory=dict)
    variables: list[dict[str, Any]] = field(default_factory=list)  # variable, read, assign, bytes, direct
    state_bytes: int = 0
    arena_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.reason

    def layout(self) -> dict[str, Any]:
        """io_layout.json's "stream" entry."""
        if not self.ok:
            return {"available": False, "reason": self.reason}
        return {"available": True, "frame": self.frame, "output": self.output, "variables": self.variables,
                "state_bytes": self.state_bytes, "arena_bytes": self.arena_bytes}


def _io(g: Graph, name: str) -> dict[str, Any]:
    t = g.tensors[name]
    q = t.quant
    return {"name": name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes,
            "scale": float(q.scale[0]) if q is not None else None,
            "zero_point": int(q.zero_point[0]) if q is not None else None}


def stream_parts(gen: Any, tg: Graph) -> StreamParts | None:
    """The per-frame program of `tg` (autodiff's training graph) on codegen's `gen`; None when tg is not an
    unrolled stateful model, a StreamParts with `reason` when its per-frame API cannot be emitted."""
    try:
        g = st.step_graph(tg)
    except ValueError as e:
        return StreamParts(reason=str(e))
    if g is None:
        return None
    if len(g.outputs) != 1:
        return StreamParts(reason=f"one invocation has {len(g.outputs)} outputs; the per-frame API returns one")
    try:
        return _emit(gen, g)
    except CodegenError as e:
        return StreamParts(reason=str(e))


def _emit(gen: Any, g: Graph) -> StreamParts:
    svars = st.variables(g)
    x, out = st.model_inputs(g)[0], g.outputs[0]
    reads = {v.read: k for k, v in enumerate(svars)}
    producer = g.producers()
    consumers = g.consumers()
    n = len(g.ops)
    p = StreamParts(frame=_io(g, x), output=_io(g, out))
    # Where each variable's new value is made: straight into its buffer when no read of the old value follows.
    direct: dict[str, int] = {}
    for k, v in enumerate(svars):
        if v.assign is None:
            continue
        if v.assign not in producer or v.assign in reads or v.assign == x:
            raise CodegenError(f"state {v.variable!r} is assigned {v.assign!r}, which no op of the invocation makes")
        if all(i < producer[v.assign] for i in consumers.get(v.read, [])) and v.assign != out:
            direct[v.assign] = k
    # Buffers: one per variable, then the invocation's activations first-fit by liveness in the stream arena.
    locs: dict[str, tuple[str, str]] = {}   # tensor -> (kind, C expression)
    for k, v in enumerate(svars):
        t = g.tensors[v.read]
        ct = CTYPE[t.dtype]
        p.globals.append(f"static {ct} tt_sv{k}[{max(int(np.prod(t.shape)), 1)}] __attribute__((aligned(4))); "
                         f"/* state {v.variable} */")
        locs[v.read] = ("static", f"(({ct} *)tt_sv{k})")
        data = np.ascontiguousarray(v.init).tobytes()
        if len(set(data)) <= 1:
            p.reset.append(f"memset(tt_sv{k}, {data[0] if data else 0}, {len(data)}u);")
        else:
            p.globals.append(f"static const uint8_t tt_svi{k}[{len(data)}] = {c_array('uint8_t', list(data))};")
            p.reset.append(f"memcpy(tt_sv{k}, tt_svi{k}, {len(data)}u);")
        p.state_bytes += len(data)
        p.variables.append({"variable": v.variable, "read": v.read, "assign": v.assign, "bytes": len(data),
                            "direct": v.assign in direct})
    for name, k in direct.items():
        locs[name] = ("static", f"(({CTYPE[g.tensors[name].dtype]} *)tt_sv{k})")
    last = {}
    for i, op in enumerate(g.ops):
        for t in op.inputs:
            if t is not None:
                last[t] = i
    keep_to_end = {out} | {v.assign for v in svars if v.assign and v.assign not in direct}
    placed: list[tuple[int, int, int, int]] = []   # (start, end, offset, size)
    offsets: dict[str, int] = {}
    order = [x] + [t for op in g.ops for t in op.outputs]
    for name in order:
        if name in locs or g.tensors[name].is_constant:
            continue
        start = -1 if name == x else producer[name]
        end = n if name in keep_to_end else max(last.get(name, start), start)
        size = -(-g.tensors[name].nbytes // ALIGN) * ALIGN
        off = 0
        for s0, e0, o0, z0 in sorted(placed, key=lambda r: r[2]):
            if s0 <= end and start <= e0 and off < o0 + z0 and o0 < off + size:
                off = -(-(o0 + z0) // ALIGN) * ALIGN
        placed.append((start, end, off, size))
        offsets[name] = off
        locs[name] = ("arena", f"(({CTYPE[g.tensors[name].dtype]} *)(tt_stream_arena + {off}))")
    p.arena_bytes = max((o + z for _, _, o, z in placed), default=0)
    p.globals.insert(0, f"static uint8_t tt_stream_arena[{max(p.arena_bytes, ALIGN)}] __attribute__((aligned(16)));")
    # The invocation's op calls, by the training program's emitters on a view: this graph, these places.
    from tinytrain.stages.codegen import _Loc

    saved = (gen.g, gen.locs, gen.offset)
    gen.g = g
    gen.locs = {**gen.locs, **{t: _Loc(kind, expr) for t, (kind, expr) in locs.items()}}
    gen.offset = dict(offsets)   # same_place() sees only this program's places (none shared: no in-place calls)
    try:
        p.body.append(f"memcpy({locs[x][1]}, frame, {g.tensors[x].nbytes}u);")
        for op in g.ops:
            p.body += gen.emit(op)
    finally:
        gen.g, gen.locs, gen.offset = saved
    for k, v in enumerate(svars):
        if v.assign and v.assign not in direct:
            p.body.append(f"memcpy(tt_sv{k}, {locs[v.assign][1]}, {g.tensors[v.assign].nbytes}u); "
                          f"/* new {v.variable} */")
    enc = g.meta.get("output_uint8", {}).get(out)
    if enc is None:
        p.body.append(f"if (output != 0) {{\n    memcpy(output, {locs[out][1]}, {g.tensors[out].nbytes}u);\n}}")
        return p
    # The model's own uint8 output (stages/model/uint8_output.py): its final QUANTIZE re-encodes the int8 score.
    p.output.update(name=enc["output"], dtype="uint8", scale=enc["scale"], zero_point=enc["zero_point"])
    p.body.append(f"if (output != 0) {{\n    uint32_t i;\n    for (i = 0; i < {g.tensors[out].nbytes}u; ++i) {{\n"
                  f"        const int32_t v = (int32_t){locs[out][1]}[i] + {enc['offset']};\n"
                  f"        ((uint8_t *)output)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);\n    }}\n}}")
    return p
