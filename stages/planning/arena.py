"""Static memory plan of a training step: what lives in SRAM, when, and where (DESIGN §3 `reorder`, §7).

    counted_bytes(graph, options)       -> {tensor: bytes it occupies in SRAM}   (absent = not in SRAM)
    plan_memory(graph, order, options)  -> MemPlan (lifetimes, arena offsets, arena size, lower bound)

Memory is counted the way the Tiny Training Engine counts it:
- constants stay in flash and cost no SRAM, except tensors the step writes (trained weights and biases, optimizer
  state, batch accumulators): those live in SRAM for the whole step;
- a trained weight costs only its trained slice (ratio r -> ceil(r·C_in) input channels on the last axis, as
  autodiff's `n`); the frozen rest stays in flash;
- int8 tensors cost 1 byte per element. A float graph that stands in for an int8 one (autodiff cannot build int8
  training graphs yet) names its int8 tensors in `meta["memplan"]["int8_tensors"]` (see `int8_twin`), and those are
  counted at 1 byte too; gradients are fp32 (4 bytes);
- with `master_copy`, every trained int8 parameter also keeps an fp32 copy of its trained slice (QAS, DESIGN §6);
- the dequantize of an int8 weight that only input-gradient ops read (`deq/<w>` in autodiff's int8 graphs) is
  fused into those ops (see `fused_dequantize`): the generated kernels read the int8 weight (flash, or the trained
  weight in SRAM) and dequantize each element as they use it, so the fp32 copy never exists and costs nothing
  (without this, Conv_1 of MobileNetV2-w0.35 alone would need 560 KB of fp32 weights);
- activations and gradients are transient: they live from the step of the op that writes them (or step 0 for
  graph inputs) to the step of their last reader (graph outputs: to the end). A saved activation that a weight
  gradient reads therefore counts until that backward op runs.

- a `dequantize_slice` of a saved int8 input that only conv2d weight gradients read is fused into them too
  (`fused_input_dequantize`): the int8 input lives until they run, the fp32 copy never exists; so is fp16-mixed's
  widening (`cast_f16_f32`) of a saved fp16 activation into kernels that read fp16 themselves
  (planning/fp16_memory.fused_widen);
- streamed op groups (stages/planning/streams.py, chosen by the reorder stage): a streamed tensor costs its window (rows,
  one position, one output channel), and every tensor the group's ops touch lives for the whole group.

A step is one op of the schedule; at step s every tensor it reads or writes is live. `in_place` lets an op write
its output into an input that dies at that op (elementwise ops, reshape, TinyEngine's channel-by-channel in-place
depthwise convolution, which needs one output channel of scratch, counted), so the two share one buffer.

The arena is planned by greedy best-fit (largest buffer first, lowest gap that fits among the buffers whose
lifetimes overlap), like TFLite Micro's GreedyMemoryPlanner. The lower bound is the largest sum of live bytes at
any step: no placement of these lifetimes can use less.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, numel
from tinytrain.stages.planning import fp16_memory

ALIGN = 16
# Ops whose output may overwrite a dying input of at least its size. Depthwise: TinyEngine computes one output
# channel into a scratch buffer and copies it over the input channel it came from.
IN_PLACE_OPS = ops.IN_PLACE_OPS
# In-place ops whose output may only take over their first input: depthwise (its weights and bias are not
# activations), int8_clamp_grad / mask_grad (dz = dy masked by the forward output or its bit mask: it overwrites dy),
# depthwise_conv2d_grad_input (dx channel c depends on dz channel c only: same channel-by-channel scheme as the
# forward, one input-gradient channel of scratch).
FIRST_INPUT_ONLY = ops.FIRST_INPUT_ONLY
# In-place ops that compute one channel at a time into a scratch buffer and copy it over the channel they read.
CHANNEL_SCRATCH_OPS = ops.CHANNEL_SCRATCH_OPS
CHANNEL_CHAIN_OPS = ops.fp16.CHANNEL_CHAIN_OPS
ROLE_ORDER = ("weight", "bias", "optimizer_state", "accumulator", "master_copy", "input", "activation",
              "gradient", "scratch")


@dataclass
class MemOptions:
    align: int = ALIGN
    in_place: bool = True
    master_copy: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"align": self.align, "in_place": self.in_place, "master_copy": self.master_copy}


@dataclass
class Buffer:
    """One block of the arena: a tensor, or a chain of tensors written in place over each other."""
    name: str
    size: int
    start: int
    end: int
    role: str
    tensors: list[str] = field(default_factory=list)
    offset: int = -1
    # Placed at the offset of this buffer, which it outlives (a row stream's sink written over its consumed input,
    # _sink_host): the two overlap in time only while the stream runs, when the simulation says it is safe.
    follows: "Buffer | None" = field(default=None, repr=False, compare=False)


@dataclass
class MemPlan:
    order: list[int]
    buffers: list[Buffer]
    arena: int
    lower_bound: int
    steps: int
    # Live bytes per step, by role (for the timeline picture).
    live_by_role: list[dict[str, int]]
    options: MemOptions
    streams: list = field(default_factory=list)   # stages.streams.Stream

    @property
    def peak(self) -> int:
        return self.arena

    def tensor_rows(self) -> list[dict[str, Any]]:
        rows = []
        for b in self.buffers:
            for t in b.tensors or [b.name]:
                rows.append({"tensor": t, "buffer": b.name, "role": b.role, "size": b.size, "start": b.start,
                             "end": b.end, "offset": b.offset})
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"arena_bytes": self.arena, "peak_bytes": self.arena, "lower_bound_bytes": self.lower_bound,
                "steps": self.steps, "options": self.options.to_json(),
                "resident_bytes": sum(b.size for b in self.buffers if b.role in _RESIDENT),
                "buffers": [{"name": b.name, "size": b.size, "start": b.start, "end": b.end, "offset": b.offset,
                             "role": b.role, "tensors": b.tensors} for b in self.buffers],
                "streams": [st.to_json() for st in self.streams]}


_RESIDENT = ("weight", "bias", "optimizer_state", "accumulator", "master_copy")


# ---- what counts ---------------------------------------------------------------------------------------------

def int8_twin(graph: Graph) -> Graph:
    """A float32 copy of an int8 graph (weights and biases dequantized, activations float32, quantization dropped)
    that names its int8 tensors in meta["memplan"]["int8_tensors"], so that memory is counted as the int8 model's
    while autodiff (float only for now) builds its training graph. autodiff deep-copies meta, so the names reach
    the training IR."""
    g = Graph(tensors={k: copy.copy(t) for k, t in graph.tensors.items()}, ops=copy.deepcopy(graph.ops),
              inputs=list(graph.inputs), outputs=list(graph.outputs), meta=copy.deepcopy(graph.meta))
    int8 = sorted(n for n, t in graph.tensors.items() if t.dtype == "int8")
    for name, t in g.tensors.items():
        if t.dtype not in ("int8", "int16", "int32") or (t.data is None and t.quant is None):
            continue
        if t.data is not None and t.quant is not None and t.role in ("weight", "bias", "constant"):
            t.data = _dequant(np.asarray(t.data), t.quant).astype(np.float32)
        elif t.data is not None:
            continue  # integer shape operands (reshape, mean axes) stay integers
        t.dtype, t.quant = "float32", None
    g.meta.setdefault("memplan", {})["int8_tensors"] = int8
    return g


def _dequant(q: np.ndarray, qp) -> np.ndarray:
    scale = np.asarray(qp.scale, np.float64)
    zp = np.asarray(qp.zero_point, np.float64)
    if len(qp.scale) > 1:
        shape = [1] * q.ndim
        shape[qp.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q.astype(np.float64) - zp) * scale


def element_bytes(graph: Graph, name: str, int8: set[str] | None = None) -> int:
    t = graph.tensors[name]
    if name in (int8 if int8 is not None else int8_names(graph)):
        return 1
    return int(np.dtype(t.dtype).itemsize)


def int8_names(graph: Graph) -> set[str]:
    return set(graph.meta.get("memplan", {}).get("int8_tensors", []))


def tensor_roles(graph: Graph) -> dict[str, str]:
    """Memory role of every SRAM tensor: weight / bias (trained), optimizer_state, accumulator, input, activation,
    gradient. Constants that no op writes are absent (flash)."""
    train = graph.meta.get("train", {})
    trained = train.get("trained", {})
    accs = set(train.get("accumulators", []))
    opt = set(train.get("optimizer_state", []))
    # autodiff's real fp32 master tensors (QAS master_copy): counted as what they are, once.
    masters = set((train.get("qas") or {}).get("master_copies", {}).values())
    written = {t for op in graph.ops for t in op.outputs}
    roles: dict[str, str] = {}
    for name, t in graph.tensors.items():
        if t.data is not None:
            if name not in written:
                continue  # flash
            if name in trained:
                roles[name] = "bias" if t.role == "bias" else "weight"
            elif name in masters:
                roles[name] = "master_copy"
            elif name in accs:
                roles[name] = "accumulator"
            elif name in opt or t.role == "optimizer_state":
                roles[name] = "optimizer_state"
            else:
                roles[name] = "weight"  # some other constant the step writes: it must be in SRAM
        elif name in graph.inputs:
            roles[name] = "input"
        elif t.role == "gradient":
            roles[name] = "gradient"
        else:
            roles[name] = "activation"
    return roles


GRAD_INPUT_OPS = ops.GRAD_INPUT_OPS
FUSED_INPUT_OPS = ops.names(lambda d: d.fused_input)


def fused_dequantize(graph: Graph) -> dict[str, str]:
    """{fp32 tensor: int8 weight} for every `dequantize` of an int8 weight (a tensor with data: flash constant or
    trained weight) whose readers are all input-gradient ops reading it as their weight. codegen emits those ops as
    kernels that dequantize the weight on the fly (f32(q - zp) * f32(scale), bit-equal to the dequantize op, and
    in the same accumulation order), and no code for the dequantize itself; so the fp32 tensor takes no SRAM.
    schedule.dependencies treats its readers as readers of the int8 weight (an update must wait for them)."""
    readers: dict[str, list[tuple[str, int]]] = {}
    for op in graph.ops:
        for k, t in enumerate(op.inputs):
            if t is not None:
                readers.setdefault(t, []).append((op.type, k))
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.type != ops.DEQUANTIZE.name or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        w, y = op.inputs[0], op.outputs[0]
        wt = graph.tensors[w]
        if wt.data is None or wt.dtype != "int8" or wt.quant is None or y in graph.outputs:
            continue
        rs = readers.get(y, [])
        if rs and all(t in GRAD_INPUT_OPS and k == 1 for t, k in rs):
            out[y] = w
    out.update(fused_input_dequantize(graph, readers))
    out.update(fp16_memory.fused_widen(graph, readers))   # fp16-mixed: kernels that read the fp16 tensor itself
    return out


def fused_input_dequantize(graph: Graph, readers: dict[str, list[tuple[str, int]]]) -> dict[str, str]:
    """{fp32 slice: int8 activation} for every `dequantize_slice` (per-tensor quantization) that only conv2d weight
    gradients read as their input: tt_conv2d_grad_weight_qx_f32_range dequantizes each element where it uses it,
    so the fp32 copy of the saved input (8 KB for MobileNetV2's block_11 add output) never exists; the int8
    activation lives until those gradients run instead (plan_memory maps the reads)."""
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.type != ops.DEQUANTIZE_SLICE.name or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        xt = graph.tensors[x]
        if xt.dtype != "int8" or xt.quant is None or len(xt.quant.scale) != 1 or len(xt.shape) != 4:
            continue
        if int(op.attrs.get("depth", xt.shape[-1])) != int(xt.shape[-1]) or y in graph.outputs:
            continue
        rs = readers.get(y, [])
        if rs and all(t in FUSED_INPUT_OPS and k == 1 for t, k in rs):
            out[y] = x
    return out


def counted_bytes(graph: Graph, options: MemOptions | None = None) -> dict[str, int]:
    """SRAM bytes of every tensor that has any (see the module doc)."""
    trained = graph.meta.get("train", {}).get("trained", {})
    int8 = int8_names(graph)
    fused = fused_dequantize(graph)
    out: dict[str, int] = {}
    for name, role in tensor_roles(graph).items():
        if name in fused:
            continue  # never materialised: its readers dequantize the int8 weight themselves
        t = graph.tensors[name]
        shape = list(t.shape)
        if name in trained and trained[name].get("n") is not None and shape:
            shape[-1] = int(trained[name]["n"])  # the trained slice; the frozen rest is in flash
        out[name] = numel(shape) * element_bytes(graph, name, int8)
    return out


def master_copies(graph: Graph) -> dict[str, int]:
    """fp32 master copies of the trained slices of int8 parameters (QAS with master_copy), for a graph that
    does not hold them itself (a training graph from autodiff has real master tensors: nothing to add)."""
    if (graph.meta.get("train", {}).get("qas") or {}).get("master_copies"):
        return {}
    trained = graph.meta.get("train", {}).get("trained", {})
    out = {}
    for name, info in trained.items():
        t = graph.tensors[name]
        if element_bytes(graph, name) == 1:
            shape = list(t.shape)
            if info.get("n") is not None and shape:
                shape[-1] = int(info["n"])
            out[f"master/{name}"] = numel(shape) * 4
    return out


# ---- lifetimes -----------------------------------------------------------------------------------------------

def plan_memory(graph: Graph, order: list[int] | None = None, options: MemOptions | None = None,
                streams: list | None = None, placement_search: int = 0, place_below: int | None = None) -> MemPlan:
    """Lifetimes of the SRAM tensors under `order` (op indices; default: the graph's order), buffers (with
    in-place sharing), arena offsets and the lower bound. `streams` (stages.streams.Stream, each consecutive in
    `order`): their streamed tensors cost their window only, and everything their ops touch lives for the whole
    group. `placement_search`: rounds of local search after the greedy placement (see _place). `place_below`: when
    the lower bound already exceeds it, the buffers are not placed (offsets -1) and the arena is the lower bound,
    for a caller that only wants to know whether the arena can stay at or below that size."""
    options = options or MemOptions()
    order = list(range(len(graph.ops))) if order is None else list(order)
    if sorted(order) != list(range(len(graph.ops))):
        raise ValueError("order must be a permutation of the graph's op indices")
    streams = list(streams or [])
    sizes = counted_bytes(graph, options)
    for st in streams:
        for t, nbytes in st.chunked.items():
            sizes[t] = int(nbytes)
    roles = tensor_roles(graph)
    n = max(len(order), 1)
    last = n - 1
    resident = {t for t, r in roles.items() if r in _RESIDENT}

    first: dict[str, int] = {}
    end: dict[str, int] = {}
    for t in graph.inputs:
        if t in sizes and t not in resident:
            first[t], end[t] = 0, 0
    fused = fused_dequantize(graph)
    for s, i in enumerate(order):
        op = graph.ops[i]
        for t in op.inputs:
            t = fused.get(t, t)  # a fused dequantize's reader reads its int8 source
            if t is not None and t in sizes and t not in resident:
                end[t] = s
        for t in op.outputs:
            if t in sizes and t not in resident and t not in first:
                first[t], end[t] = s, max(end.get(t, s), s)
    for t in graph.outputs:
        if t in first:
            end[t] = last
    streamed_ops: set[int] = set()
    # element-wise ops inside a channels stream (fp16-mixed's rounding and unscaling of a weight gradient,
    # stages/ops/fp16.CHANNEL_CHAIN_OPS): each channel is rewritten in place, so they share their input's buffer
    chain_ops = {i for st in streams if st.kind == "channels" for i in st.ops[1:-1]
                 if graph.ops[i].type in CHANNEL_CHAIN_OPS}
    pos = {i: k for k, i in enumerate(order)}
    for st in streams:
        steps = sorted(pos[i] for i in st.ops)
        a, b = steps[0], steps[-1]
        if b - a + 1 != len(st.ops):
            raise ValueError(f"stream {st.kind} {st.ops} is not consecutive in the schedule")
        streamed_ops.update(st.ops)
        for i in st.ops:
            op = graph.ops[i]
            for t in op.outputs:
                if t in first:
                    first[t] = min(first[t], a)
            for t in list(op.inputs) + list(op.outputs):
                t = fused.get(t, t)  # a fused reader reads the int8/fp16 source on every pass of the stream
                if t is not None and t in end:
                    end[t] = max(end[t], b)

    buffers: list[Buffer] = []
    by_tensor: dict[str, Buffer] = {}
    for t in sorted(resident, key=lambda x: (ROLE_ORDER.index(roles[x]), x)):
        b = Buffer(t, sizes[t], 0, last, roles[t], [t])
        buffers.append(b)
    if options.master_copy:
        for name, size in sorted(master_copies(graph).items()):
            buffers.append(Buffer(name, size, 0, last, "master_copy", [name]))

    scratch: list[Buffer] = []
    # Transient tensors in order of definition; an output may take over a dying input's buffer.
    for t in graph.inputs:
        if t in first:
            b = Buffer(t, sizes[t], 0, end[t], roles[t], [t])
            buffers.append(b)
            by_tensor[t] = b
    # (op, output) pairs by the step their buffer starts: a stream's outputs all start with the stream
    births: dict[int, list[tuple[int, str]]] = {}
    for i in order:
        for t in graph.ops[i].outputs:
            if t in first:
                births.setdefault(first[t], []).append((i, t))
    sink_hosts = {graph.ops[st.ops[-1]].outputs[0]: st for st in streams if st.info.get("sink_over")}
    for s, _ in enumerate(order):
        taken: set[int] = set()
        for i, t in births.get(s, []):
            op = graph.ops[i]
            if first[t] != s or t in by_tensor:
                continue
            if options.in_place and t in sink_hosts:
                host = _sink_host(graph, sink_hosts[t], t, sizes, end, by_tensor, pos)
                if host is not None and end[t] > host.end:
                    # while the stream runs the sink's rows are inside the input's buffer; after it, its own
                    b = Buffer(t, sizes[t], host.end + 1, end[t], roles[t], [t], follows=host)
                    buffers.append(b)
                    by_tensor[t] = b
                    continue
            if options.in_place and i in chain_ops and op.inputs[0] in by_tensor \
                    and by_tensor[op.inputs[0]].size >= sizes[t]:
                host = by_tensor[op.inputs[0]]
                host.tensors.append(t)
                host.end = max(host.end, end[t])
                by_tensor[t] = host
                continue
            host = _in_place_host(graph, op, t, s, sizes, end, by_tensor, taken) \
                if options.in_place and i not in streamed_ops else None
            if host is not None:
                taken.add(id(host))
                host.tensors.append(t)
                host.end = max(host.end, end[t])
                by_tensor[t] = host
                if op.type in CHANNEL_SCRATCH_OPS:
                    out = graph.tensors[t]
                    ch = numel(out.shape[:-1]) * element_bytes(graph, t)
                    scratch.append(Buffer(f"scratch/{t}", ch, s, s, "scratch", []))
                continue
            b = Buffer(t, sizes[t], s, end[t], roles[t], [t])
            buffers.append(b)
            by_tensor[t] = b
    buffers.extend(scratch)

    live = _live_by_role(buffers, n)
    lower = max((sum(d.values()) for d in live), default=0)
    if place_below is not None and lower > place_below:
        return MemPlan(order, buffers, lower, lower, n, live, options, streams)
    _place(buffers, options.align, placement_search, lower)
    arena = max((b.offset + _aligned(b.size, options.align) for b in buffers), default=0)
    return MemPlan(order, buffers, arena, lower, n, live, options, streams)


def _sink_host(graph, st, out, sizes, end, by_tensor, pos) -> Buffer | None:
    """The buffer of an outside input of row stream `st` that its sink's output `out` may take over: one the
    stream's simulation allows (Stream.info["sink_over"]: each sink row is written after the last read of the
    input rows under it), that dies with the stream and holds only that input, and is large enough."""
    b = max(pos[i] for i in st.ops)
    for t in st.info["sink_over"]:
        host = by_tensor.get(t)
        if host is None or t in graph.outputs or end.get(t) != b or host.end != b or host.tensors != [t]:
            continue
        if host.size >= sizes[out]:
            return host
    return None


def _in_place_host(graph, op, out, s, sizes, end, by_tensor, taken) -> Buffer | None:
    if op.type not in IN_PLACE_OPS:
        return None
    if op.type in CHANNEL_SCRATCH_OPS and depth_multiplier(graph, op) != 1:
        return None
    cands = op.inputs[:1] if op.type in FIRST_INPUT_ONLY else op.inputs
    for t in cands:
        if t is None or t not in by_tensor or t in graph.outputs:
            continue
        host = by_tensor[t]
        if id(host) in taken or end.get(t) != s or host.end != s:
            continue
        if op.inputs.count(t) != 1 or host.size < sizes[out]:
            continue
        return host
    return None


def depth_multiplier(graph, op) -> int:
    """The depth multiplier of a channel-by-channel op (CHANNEL_SCRATCH_OPS): in place only when it is 1."""
    if ops.REGISTRY[op.type].kind == "forward":
        return int(op.attrs.get("depth_multiplier", 1))
    # the gradient op's attrs name it `multiplier` (autodiff), else it follows from the weight and input shapes
    m = op.attrs.get("multiplier") or op.attrs.get("depth_multiplier")
    if m:
        return int(m)
    w, dx = graph.tensors[op.inputs[1]].shape, graph.tensors[op.outputs[0]].shape
    return int(w[3]) // int(dx[3])


def _aligned(n: int, align: int) -> int:
    return -(-n // align) * align if align > 1 else n


# Placement orders tried by _place (each deterministic: ties by start, then name); the smallest arena wins.
_PLACE_ORDERS = (
    lambda b: (-b.size, b.start, b.name),                           # largest first (TFLite Micro's greedy)
    lambda b: (-(b.end - b.start + 1) * b.size, b.start, b.name),   # largest area in the timeline first
    lambda b: (-(b.end - b.start), -b.size, b.start, b.name),       # longest-lived first
    lambda b: (b.start, -b.size, b.name),                           # in order of birth
)


def _place(buffers: list[Buffer], align: int, search: int = 0, lower: int = 0) -> None:
    """Greedy best-fit under several orders, keeping the smallest arena; then, with `search` > 0, up to that many
    rounds of local search: the buffer that ends highest moves a little earlier in the placing order (a few
    milliseconds a round for MobileNetV2's ~170 buffers), until the arena reaches the (aligned) lower bound or 60
    rounds bring nothing. Deterministic. A round re-places only from the first position its order changed
    (`_Placer`): the buffers before it land where they did (issue 14: placement was most of `auto`'s exact peaks)."""
    placer = _Placer(buffers, align)

    def place(order: list[Buffer]) -> int:
        placer.place(order)
        return placer.arena()

    best: tuple[int, list[Buffer]] | None = None
    for key in _PLACE_ORDERS:
        order = sorted(buffers, key=key)
        a = place(order)
        if best is None or a < best[0]:
            best = (a, order)
    if best is None:
        return
    best_arena, order = best[0], list(best[1])
    best_order, stale = list(order), 0
    target = _aligned(lower, align)
    for it in range(search):
        if best_arena <= target or stale >= 60:
            break
        top = placer.top()
        k = order.index(top)
        if k == 0:
            break
        order.insert(max(0, k - 1 - it % 7), order.pop(k))
        a = place(order)
        if a < best_arena:
            best_arena, best_order, stale = a, list(order), 0
        else:
            stale += 1
    place(best_order)
    placer.write_offsets()


def _live_by_role(buffers: list[Buffer], n: int) -> list[dict[str, int]]:
    """Live bytes per step and role: a difference array per role (O(buffers + steps), not buffers x steps)."""
    delta = np.zeros((len(ROLE_ORDER), n + 1), np.int64)
    for b in buffers:
        r = ROLE_ORDER.index(b.role)
        delta[r, b.start] += b.size
        delta[r, b.end + 1] -= b.size
    acc = np.cumsum(delta[:, :n], axis=1).T.tolist()
    return [dict(zip(ROLE_ORDER, (int(v) for v in row))) for row in acc]


def _place_in_order(buffers: list[Buffer], align: int, key) -> None:
    """Greedy best-fit: each buffer in `key` order goes into the smallest gap between the already placed buffers
    whose lifetimes overlap its own (the first such gap by offset on ties), else on top (`_Placer`)."""
    placer = _Placer(buffers, align)
    placer.place(sorted(buffers, key=key))
    placer.write_offsets()


class _Placer:
    """`_place_in_order`'s greedy best fit over a fixed set of buffers, for one placing order after another.

    Vectorised over the placed buffers (numpy), so a placement is a few array passes per buffer rather than a
    Python loop over every placed one; the offsets are those of the plain loop (same order, same tie rules). What
    step k places depends only on the first k + 1 buffers of the order (a buffer that follows another is placed
    with it, at its step), so a new order that shares the previous one's first p buffers keeps their offsets and
    places from step p on: the same offsets as placing it from scratch."""

    def __init__(self, buffers: list[Buffer], align: int):
        self.buffers = buffers
        m = len(buffers)
        self.index = {id(b): i for i, b in enumerate(buffers)}
        self.start = np.fromiter((b.start for b in buffers), np.int64, m)
        self.end = np.fromiter((b.end for b in buffers), np.int64, m)
        self.need = np.fromiter((_aligned(b.size, align) for b in buffers), np.int64, m)
        self.lo = np.zeros(m, np.int64)
        self.step = np.full(m, m, np.int64)      # the step that placed each buffer in the last order (m: none)
        self.seq: list[int] = []                 # the last order, as indices into `buffers`
        self.followers: dict[int, list[int]] = {}
        for i, b in enumerate(buffers):
            if b.follows is not None:
                self.followers.setdefault(self.index[id(b.follows)], []).append(i)

    def place(self, order: list[Buffer]) -> None:
        seq = [self.index[id(b)] for b in order]
        p = 0
        for a, b in zip(seq, self.seq):
            if a != b:
                break
            p += 1
        start, end, need, lo, step = self.start, self.end, self.need, self.lo, self.step
        placed = step < p
        step[~placed] = len(seq)
        lo[~placed] = 0         # as a fresh placement leaves a buffer it never reaches
        pos = {i: k for k, i in enumerate(seq)}
        for k in range(p, len(seq)):
            i = seq[k]
            b = self.buffers[i]
            if b.follows is not None:
                continue  # placed with the buffer it follows
            group = self.followers.get(i)
            if group is not None:
                members = [i] + sorted(group, key=pos.__getitem__)
                off = _place_group(start, end, need, lo, placed, members)
                for j in members:
                    lo[j], placed[j], step[j] = off, True, k
                continue
            ov = np.flatnonzero(placed & (start <= end[i]) & (start[i] <= end))   # placed, overlapping in time
            if len(ov):
                plo, phi = lo[ov], lo[ov] + need[ov]
                srt = np.lexsort((phi, plo))           # by (offset, end offset), as sorted() on the pairs
                plo, phi = plo[srt], phi[srt]
                reach = np.maximum.accumulate(phi)     # the cursor after each busy block
                cursor = np.concatenate(([0], reach[:-1]))
                gap = plo - cursor
                fits = np.flatnonzero(gap >= need[i])
                if len(fits):
                    j = fits[np.argmin(gap[fits])]     # argmin: the first of equal smallest gaps
                    lo[i] = cursor[j]
                else:
                    lo[i] = reach[-1]
            else:
                lo[i] = 0
            placed[i], step[i] = True, k
        self.seq = seq

    def arena(self) -> int:
        return int((self.lo + self.need).max()) if len(self.buffers) else 0

    def top(self) -> Buffer:
        """The buffer that ends highest (the last by name on ties), as max(buffers, key=(end offset, name))."""
        ends = self.lo + self.need
        highest = np.flatnonzero(ends == ends.max())
        return max((self.buffers[int(i)] for i in highest), key=lambda b: b.name)

    def write_offsets(self) -> None:
        for b, off in zip(self.buffers, self.lo.tolist()):
            b.offset = int(off)


def _place_group(start, end, need, lo, placed, members: list[int]) -> int:
    """The lowest offset where every member (a buffer and those that follow it, all at one offset) is clear of the
    placed buffers that overlap it in time."""
    busy = []
    for k in members:
        ov = np.flatnonzero(placed & (start <= end[k]) & (start[k] <= end))
        busy.append(list(zip(lo[ov].tolist(), (lo[ov] + need[ov]).tolist())))
    for off in sorted({0} | {hi for b in busy for _, hi in b}):
        if all(not (plo < off + int(need[k]) and off < phi) for k, b in zip(members, busy) for plo, phi in b):
            return off
    raise AssertionError("unreachable: the offset above every placed buffer is clear")


def check_plan(plan: MemPlan) -> None:
    """No two buffers that are live at the same step overlap in the arena; everything fits in the arena."""
    bs = sorted(plan.buffers, key=lambda b: b.offset)
    for i, a in enumerate(bs):
        if a.offset < 0 or a.offset % plan.options.align or a.offset + a.size > plan.arena:
            raise AssertionError(f"buffer {a.name} at {a.offset}+{a.size} is outside the arena {plan.arena}")
        for b in bs[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if a.start <= b.end and b.start <= a.end and a.size and b.size:
                raise AssertionError(f"buffers {a.name} and {b.name} overlap in time and space")


def kb(n: int) -> str:
    return f"{n / 1024:.1f} KB"
