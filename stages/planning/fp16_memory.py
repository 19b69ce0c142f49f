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
to_fp16_mixed plans its forms and keeps the smallest arena, so the estimate is the smallest of the forms here.
The loss scale, its good-steps and skipped-steps counters are 3 resident 4-byte scalars (RESIDENT_SCALARS).
"""

from __future__ import annotations

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.ops import fp16 as f16
from tinytrain.stages.train.fp16_mixed import broadcasts_in_place, in_place_at

Step = tuple[str, list[str], list[str]]
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
        if rs and all(k in ops.FP16_OPERANDS.get(t, ()) for t, k in rs):
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
    out: list[Step] = []
    for i, (typ, ins, outs) in enumerate(steps):
        if i >= n_fwd:
            direct = ops.FP16_OPERANDS.get(typ, ())   # operands whose kernel reads the fp16 tensor (fused_widen)
            widened = {}
            for k, t in enumerate(ins):
                if t in saved and t not in widened and k not in direct:
                    widened[t] = f"f32/{t}@{i}"
                    sizes[widened[t]] = sizes[t]
                    out.append((f16.CAST_F16_F32, [f"f16/{t}"], [widened[t]]))
            ins = [f"f16/{t}" if t in saved and k in direct else widened.get(t, t) for k, t in enumerate(ins)]
        out.append((typ, list(ins), list(outs)))
        for t in outs:
            if t in saved:
                sizes[f"f16/{t}"] = -(-sizes[t] // 2)
                out.append((f16.CAST_F32_F16, [t], [f"f16/{t}"]))
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
        if streamed(steps[j][0]):
            return t in graph_readers and all(kk in ops.FP16_OPERANDS.get(r, ()) for r, kk in graph_readers[t])
        return k in ops.FP16_OPERANDS.get(steps[j][0], ())

    writer: dict[str, tuple[str, str | None]] = {}   # t -> (the op type that writes it, that op's operand 0)
    producer: dict[str, int] = {}                     # t -> the first step that writes it
    for j, (typ, ins, outs) in enumerate(steps):
        for t in outs:
            producer.setdefault(t, j)
            if streamed(typ) and t in made_by:
                writer[t] = (made_by[t].type, made_by[t].inputs[0])
            elif len(outs) == 1 or typ in ops.FP16_OUTPUT_OPS:   # each result of a multi-result op (add_grad)
                writer[t] = (typ, ins[0] if ins else None)
    out = set()
    for t, (typ, _) in writer.items():
        rs = readers.get(t, [])
        if typ not in ops.FP16_OUTPUT_OPS or t in inputs or not rs or not all(reads_fp16(j, k, t) for j, k in rs):
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
        return [("batch", base)]
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
    return [("one_pass", one_pass), ("check_first", base[:head] + check + backward)]
