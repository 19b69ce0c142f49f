"""train.precision fp16-mixed in the analytic memory model (stages/planning/memory_model.py): the abstract training
program of an fp32 plan rewritten as stages/train/fp16_mixed.py rewrites the training graph.

    fp16_steps(steps, n_fwd, sizes, graph, batch1) -> [(name, steps)]   the forms to_fp16_mixed chooses among

What changes against fp32 (the rules are fp16_mixed's):
  saved activations  a float32 tensor the forward writes and the backward reads is kept as fp16: a cast step right
                     after its producer writes the 2-byte copy (the fp32 value lives on while forward steps read
                     it); a backward step whose kernel reads fp16 at that operand (OpDef.fp16_operands: the
                     weight gradients' input, the activation mask) reads the copy itself (fused_widen), any other
                     first widens it into an fp32 temporary of its own.
                     Everything else (frozen prefix, gradients, the loss) keeps its fp32 bytes: fp16 values in fp32
                     slots, rounded in place (the prefix: fp32 values), except the transients whose kernels write
                     and read fp16 themselves (OpDef.fp16_output / fp16_operands: fp16_mixed.fp16_written), which
                     take 2 bytes, in the frozen prefix too (fp16_mixed.prefix_results).
  the overflow check batch 1, "check_first": the backward runs twice, first with each update replaced by a check of
                     its gradient (the tensors renamed: the pass keeps nothing), then as fp32's with its in-place
                     updates. "one_pass": every update waits for the end of the backward, where the check reads all
                     gradients. With batch > 1 the updates already wait for the batch: only the saved activations
                     change.
  order              the exact planner also plans the memory-greedy order (schedule.memory_greedy_order), which
                     moves the saved activations' casts past the forward steps that free more, and reorders a backward
                     that runs in one pass (one_pass, batch > 1): the casts are placed by its rule, and those forms
                     are also priced in its order (`_greedy`).
to_fp16_mixed plans its forms and keeps the smallest arena, so the estimate is the smallest of the forms here.
The loss scale, its good-steps and skipped-steps counters are 3 resident 4-byte scalars (RESIDENT_SCALARS).
"""

from __future__ import annotations

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.ops import fp16 as f16
from tinytrain.stages.train.fp16_mixed import broadcasts_in_place, in_place_at

Step = tuple[str, list[str], list[str]]
POSITIONS = "positions"   # abstract_program.merge_positions' step: a pooled head's gradient one position at a time
RESIDENT_SCALARS = 3


def fused_widen(graph: Graph, readers: dict[str, list[tuple[str, int]]]) -> dict[str, str]:
    """{fp32 temporary: fp16 tensor} for every `cast_f16_f32` whose readers all read its result at an operand whose
    kernel reads fp16 itself (OpDef.fp16_operands: the weight gradients' saved input, widened in a register where
    it is used), like memplan.fused_input_dequantize: the fp32 copy never exists, the fp16 tensor lives until those
    readers run, and the bits are the same (the widening is exact). `readers`: {tensor: [(op type, operand)]}."""
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.type != f16.CAST_F16_F32 or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        if graph.tensors[x].dtype != "float16" or y in graph.outputs:
            continue
        rs = readers.get(y, [])
        if rs and all(ops.reads_fp16(t, k) for t, k in rs):
            out[y] = x
    return out


def _saved_as_fp16(steps: list[Step], n_fwd: int, sizes: dict[str, int], graph: Graph,
                   inputs: set[str]) -> list[Step]:
    producer = {t: i for i in range(n_fwd) for t in steps[i][2]}
    saved = set()
    for j in range(n_fwd, len(steps)):
        for t in steps[j][1]:
            if t in producer and t not in inputs and t in graph.tensors and graph.tensors[t].dtype == "float32" \
                    and graph.tensors[t].data is None:
                saved.add(t)
    # the casts run where the exact planner's memory-greedy order puts them (schedule.memory_greedy_order: among the
    # ready ops the smallest allocated - freed bytes, then the smallest allocation, ties to the earlier op, which a
    # cast is): before a forward step only when that scores no worse, else later, its fp32 value living on until then
    remaining: dict[str, int] = {}
    for _, ins, _ in steps[:n_fwd]:
        for t in ins:
            remaining[t] = remaining.get(t, 0) + 1
    live = set(inputs)

    def key(ins: list[str], outs: list[str]) -> tuple[int, int]:
        alloc = sum(sizes.get(t, 0) for t in set(outs) if t not in live)
        freed = sum(sizes.get(t, 0) for t in set(ins) if remaining.get(t, 0) == ins.count(t) and t not in pending)
        return alloc - freed, alloc

    def cast(t: str) -> Step:
        sizes[f"f16/{t}"] = -(-sizes[t] // 2)
        return f16.CAST_F32_F16, [t], [f"f16/{t}"]

    def cast_key(t: str) -> tuple[int, int]:
        half = sizes[f"f16/{t}"] if f"f16/{t}" in sizes else -(-sizes[t] // 2)
        return half - (sizes[t] if remaining.get(t, 0) == 0 else 0), half

    pending: list[str] = []
    out: list[Step] = []
    for i, (typ, ins, outs) in enumerate(steps):
        while pending and (i >= n_fwd or min(map(cast_key, pending)) <= key(ins, outs)):
            t = min(pending, key=lambda c: (cast_key(c), producer[c]))
            pending.remove(t)
            out.append(cast(t))
        if i < n_fwd:
            for t in ins:
                remaining[t] = remaining.get(t, 0) - 1
            live.update(outs)
            pending += [t for t in outs if t in saved]
        if i >= n_fwd:
            widened = {}
            for k, t in enumerate(ins):
                if t in saved and t not in widened and not ops.reads_fp16(typ, k):   # fused_widen
                    widened[t] = f"f32/{t}@{i}"
                    sizes[widened[t]] = sizes[t]
                    out.append((f16.CAST_F16_F32, [f"f16/{t}"], [widened[t]]))
            ins = [f"f16/{t}" if t in saved and ops.reads_fp16(typ, k) else widened.get(t, t)
                   for k, t in enumerate(ins)]
        out.append((typ, list(ins), list(outs)))
    out += [cast(t) for t in pending]
    return out


def _written_as_fp16(steps: list[Step], n_fwd: int, sizes: dict[str, int], inputs: set[str],
                     graph: Graph) -> list[Step]:
    """`steps` with the transients fp16_mixed.fp16_written stores as 2-byte tensors renamed (h16/...) at half their
    bytes: written by an op that can write fp16 (OpDef.fp16_output), read only at operands that read fp16
    (OpDef.fp16_operands), not fed to an in-place reader whose own result stays fp32; in the forward (the frozen
    prefix too: fp16_mixed.prefix_results) only where the backward does not read it (saved: a cast's fp16 copy).
    A row stream's step (memory_model._stream_rows) writes and reads through its ops, found in `graph`."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for j, (_, ins, _) in enumerate(steps):
        for k, t in enumerate(ins):
            readers.setdefault(t, []).append((j, k))
    made_by = {o: op for op in graph.ops for o in op.outputs}
    graph_readers: dict[str, list[tuple[str, int]]] = {}
    for op in graph.ops:
        for k, t in enumerate(op.inputs):
            if t is not None:
                graph_readers.setdefault(t, []).append((op.type, k))

    def streamed(typ: str) -> bool:
        return typ.startswith("stream_rows")

    def reads_fp16(j: int, k: int, t: str) -> bool:
        if steps[j][0] == POSITIONS:   # mean_grad -> mask -> bias / 1x1 input gradient: fp16 at each gradient operand
            return True
        if streamed(steps[j][0]):
            return t in graph_readers and all(ops.reads_fp16(r, kk) for r, kk in graph_readers[t])
        return ops.reads_fp16(steps[j][0], k)

    writer: dict[str, tuple[str, str | None]] = {}   # t -> (the op type that writes it, that op's operand 0)
    producer: dict[str, int] = {}                     # t -> the first step that writes it
    for j, (typ, ins, outs) in enumerate(steps):
        for t in outs:
            producer.setdefault(t, j)
            if streamed(typ) and t in made_by:
                writer[t] = (made_by[t].type, made_by[t].inputs[0])
            elif typ == POSITIONS:   # a backward stream's results: its ops (mean_grad, act_grad / mask_grad, the 1x1
                writer[t] = (typ, ins[0])   # input gradient) each write fp16 (bias_grad's: a parameter's gradient)
            elif len(outs) == 1 or typ in ops.FP16_OUTPUT_OPS:   # each result of a multi-result op (add_grad)
                writer[t] = (typ, ins[0] if ins else None)
    out = set()
    for t, (typ, _) in writer.items():
        rs = readers.get(t, [])
        if (typ not in ops.FP16_OUTPUT_OPS and typ != POSITIONS) or t in inputs or not rs \
                or not all(reads_fp16(j, k, t) for j, k in rs):
            continue
        op = made_by.get(t)
        if op is not None and broadcasts_in_place(graph, op, t):
            continue   # broadcasting element-wise op: no fp16 form (fp16_mixed.fp16_written)
        # a forward result the backward reads is saved (a cast's fp16 copy)
        if producer[t] < n_fwd and any(j >= n_fwd for j, _ in rs):
            continue
        out.add(t)
    # fp16_mixed.fp16_written's in-place rules: an in-place reader keeping an fp32 result, a channel-by-channel
    # in-place op (depthwise) with an fp32 input
    changed = True
    while changed:
        changed = False
        for t in sorted(out):
            typ, x0 = writer[t]
            if any(in_place_at(steps[j][0], k) and steps[j][2] and steps[j][2][0] not in out for j, k in readers[t]) \
                    or (typ in ops.CHANNEL_SCRATCH_OPS and x0 is not None and x0 not in out):
                out.discard(t)
                changed = True
    for t in out:
        sizes[f"h16/{t}"] = -(-sizes[t] // 2)
    return [(typ, [f"h16/{t}" if t in out else t for t in ins], [f"h16/{t}" if t in out else t for t in outs])
            for typ, ins, outs in steps]


def fp16_steps(steps: list[Step], n_fwd: int, sizes: dict[str, int], graph: Graph, batch1: bool,
               inputs: list[str], streamed: dict[str, int]) -> list[tuple[str, list[Step]]]:
    """The fp16-mixed forms of the abstract program `steps` (its first `n_fwd` steps: the forward, mask steps
    included; then the loss and the backward), each (name, steps); new tensors' bytes go into `sizes`.
    `streamed`: the parameter gradients fp32's program computes one output channel at a time ({name: channels}),
    whole again where their update waits (one_pass)."""
    n_head = n_fwd + 1   # the loss step
    base = _saved_as_fp16(_written_as_fp16(steps, n_fwd, sizes, set(inputs), graph), n_head, sizes, graph,
                          set(inputs))
    head = next(k for k, st in enumerate(base) if st[0] == "loss") + 1
    if not batch1:
        return [("batch", base), ("batch/greedy", _greedy(base, head, sizes))]
    backward = base[head:]
    grads = [t for typ, ins, _ in backward if typ == "update" for t in ins]
    whole = {t: f"whole/{t}" for t in grads if t in streamed}
    for t, w in whole.items():
        sizes[w] = sizes[t] * streamed[t]
    one_pass = base[:head] + [(typ, [whole.get(t, t) for t in ins], [whole.get(t, t) for t in outs])
                              for typ, ins, outs in backward if typ != "update"] \
        + [("update", [whole.get(t, t) for t in grads], [])]
    rename: dict[str, str] = {}
    check: list[Step] = []
    for typ, ins, outs in backward:
        ins = [rename.get(t, t) for t in ins]
        if typ == "update":
            check.append((f16.AMP_CHECK, ins, []))
            continue
        for t in outs:
            if t not in rename:
                rename[t] = f"chk/{t}"
                sizes[rename[t]] = sizes[t]
        check.append((typ, ins, [rename[t] for t in outs]))
    return [("one_pass", one_pass), ("one_pass/greedy", _greedy(one_pass, head, sizes)),
            ("check_first", base[:head] + check + backward)]


class Reordered(list):
    """A form's steps reordered (_greedy); `position[k]`: where step k of the form in its own order went, so that
    memory_model moves each layer's backward window with its steps."""
    position: list[int]


def _greedy(form: list[Step], head: int, sizes: dict[str, int]) -> Reordered:
    """`form` with its backward (the steps from `head`: one pass) in schedule.memory_greedy_order's order, which the
    exact planner also plans: among the steps whose inputs are made, the one with the smallest allocated - freed
    bytes, then the smallest allocation, then the earliest. A step waits for every earlier step that writes what it
    reads or writes and for every earlier reader of what it writes (the program's order on each tensor); tensors
    made before the backward are live throughout (not counted)."""
    steps = form[head:]
    last_write: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    preds: list[set[int]] = []
    for j, (_, ins, outs) in enumerate(steps):
        p = {last_write[t] for t in ins + outs if t in last_write}
        p.update(r for t in outs for r in readers.get(t, ()))
        preds.append(p)
        for t in ins:
            readers.setdefault(t, []).append(j)
        for t in outs:
            last_write[t] = j
            readers[t] = []
    made = {t for _, _, outs in steps for t in outs}
    remaining: dict[str, int] = {}
    for _, ins, _ in steps:
        for t in ins:
            if t in made:
                remaining[t] = remaining.get(t, 0) + 1
    succs: list[list[int]] = [[] for _ in steps]
    for j, p in enumerate(preds):
        for i in p:
            succs[i].append(j)
    waiting = [len(p) for p in preds]
    ready = [j for j, n in enumerate(waiting) if n == 0]
    live: set[str] = set()
    order: list[int] = []

    def key(j: int) -> tuple[int, int, int]:
        _, ins, outs = steps[j]
        alloc = sum(sizes.get(t, 0) for t in set(outs) if t not in live)
        freed = sum(sizes.get(t, 0) for t in set(ins) if t in remaining and remaining[t] == ins.count(t))
        freed += sum(sizes.get(t, 0) for t in set(outs) if remaining.get(t, 0) == 0)
        return alloc - freed, alloc, j

    while ready:
        j = min(ready, key=key)
        ready.remove(j)
        order.append(j)
        for k in succs[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
        _, ins, outs = steps[j]
        for t in ins:
            if t in remaining:
                remaining[t] -= 1
        live.update(t for t in outs if remaining.get(t, 0) > 0)
        live.difference_update(t for t in ins if remaining.get(t) == 0)
    out = Reordered(form[:head] + [steps[j] for j in order])
    out.position = list(range(head)) + [0] * len(steps)
    for k, j in enumerate(order):
        out.position[head + j] = head + k
    return out
