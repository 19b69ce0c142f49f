"""fp16-mixed training graphs (issue 13): the float training IR of stages/autodiff.py rewritten so that activations
and gradients are stored as IEEE binary16 while every kernel computes in fp32.

Rules (what is stored in which type):
  * activations and gradients of the sample phase hold fp16 values; every op still runs its fp32 kernel, so every
    dot product accumulates in fp32 from fp16 operands and its result is rounded once to fp16 (round to nearest
    even), as PyTorch's autocast does on a GPU. Where they are stored:
      - activations the backward reads (saved between the forward and the backward: what dominates training
        memory) are fp16 tensors (dtype "float16", 2 bytes in the arena): the forward's result is rounded
        (`round_f16`), the forward's next readers read that fp32 value, and `cast_f32_f16` keeps the fp16 copy; a
        backward op reads it through `cast_f16_f32` (exact), which the memory plan and the C fuse into the kernels
        that read fp16 themselves (the weight gradients, the activation masks, the max pool's gradient:
        planning/fp16_memory.fused_widen), so those make no fp32 copy; any other reader gets an fp32 temporary;
      - the trained parameters' gradients (batch 1), which wait for the overflow check: fp16 tensors or fp32 slots,
        whichever plans the smaller arena (`grads_fp16`; batch > 1: the fp32 accumulators);
      - everything else lives for an op or two. Where the op that makes it can write fp16 itself (OpDef.fp16_output:
        fp32 arithmetic, one rounding per element on store) and every reader reads fp16 at that operand
        (OpDef.fp16_operands), it is a 2-byte fp16 tensor (fp16_written: e.g. a conv's output before a global
        mean, the mean's broadcast gradient and its masked form); otherwise an fp32 slot holding an fp16 value
        (`round_f16` in place, same bits as a round trip through fp16 storage), so no second copy of it ever
        exists (an fp32 result cast to fp16 afterwards would exist whole first).
  * weights: fp32. Trained weights are the fp32 master copy the update writes; the kernels read it as it is (no fp16
    copy: it would cost SRAM, and the dot products run in fp32 anyway); frozen weights stay fp32 in flash.
  * the frozen prefix's activations that the backward does not read (prefix_results): fp16 tensors where their
    kernels write and read fp16 (fp16_written: no rounding op, so the prefix's row streams stay whole), else fp32
    values, unrounded.
  * kept in fp32: the model input, the prediction (the loss's logits / output: evaluation reads it), the loss and the
    loss op's own gradient before scaling, batch accumulators and optimizer state.
  * loss scaling: the loss's gradient is multiplied by the loss scale (`loss_scale_mul`) before it is stored in
    fp16, so small gradients stay above fp16's subnormal range; the step phase checks every trained gradient for
    Inf/NaN (`amp_check`), divides it by the scale in fp32 (`amp_unscale`), and runs the updates (and Adam's step
    counter) only when all are finite (`skip_if`); `loss_scale_update` then applies the policy (train.loss_scale).
    The scale, the finite-steps counter and the skipped-steps counter are optimizer state: checkpoints keep them.
No update may run before the step is known to be finite. With batch 1 that would keep every gradient until the
end of the backward, losing fp32's in-place and channel-streamed updates; so the check can run in a backward pass of
its own first (`check_first`: recomputed, each trained gradient checked as it is made, a conv / FC weight gradient
one output channel at a time, nothing stored), after which the real backward updates in place as fp32's does. It
costs a second backward's instructions on a finite step (on an overflowing one the real backward is skipped with its
updates: its ops carry `skip_if` too); to_fp16_mixed plans it against the one-pass forms and keeps the smallest
arena.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.ops import fp16 as f16
from tinytrain.stages.ops.training import LOSS_SUM

SCALE, GOOD, SKIPPED, FLAG = "amp/loss_scale", "amp/good_steps", "amp/skipped_steps", "amp/found_inf"
_LOSS_TYPES = frozenset(ops.LOSS_OPS.values()) | {LOSS_SUM}


def policy_from_config(cfg: Any) -> dict[str, Any]:
    """train.loss_scale (a LossScaleSpec, a dict or None: GradScaler's defaults) as the op's attrs."""
    from tinytrain.pipeline.spec_precision import LossScaleSpec

    if cfg is None:
        cfg = LossScaleSpec()
    elif not isinstance(cfg, LossScaleSpec):
        cfg = LossScaleSpec(**(cfg.model_dump() if hasattr(cfg, "model_dump") else dict(cfg)))
    return {"kind": cfg.kind, "init_scale": float(cfg.init_scale), "growth": float(cfg.growth_factor),
            "backoff": float(cfg.backoff_factor), "interval": int(cfg.growth_interval),
            "min_scale": float(cfg.min_scale), "max_scale": float(cfg.max_scale)}


def prefix_results(g: Graph) -> set[str]:
    """The float32 results of the frozen prefix (forward ops before the first that reads a trained parameter) that
    the backward does not read: nothing of them is kept for the backward, and rounding ops between them would cut
    their row streams (stages/planning/streams.py) and cost a window each, so they hold fp32 values, unrounded;
    where their kernels write and read fp16 themselves (fp16_written) they are 2-byte tensors instead (fp32
    arithmetic, each result rounded once as it is stored: no op of their own, the row streams intact)."""
    meta = g.meta["train"]
    n_fwd, split = int(meta["phases"]["forward"]), int(meta["sample_ops"])
    trained = set(meta["trained"])
    prefix = next((i for i, op in enumerate(g.ops[:n_fwd]) if trained & set(op.inputs)), n_fwd)
    backward_reads = {t for op in g.ops[n_fwd:split] for t in op.inputs if t is not None}
    return {t for op in g.ops[:prefix] for t in op.outputs
            if t not in backward_reads and g.tensors[t].dtype == "float32" and g.tensors[t].data is None}


def _head_tensors(meta: dict) -> set[str]:
    """The prediction, the loss and every head's tensor: kept fp32."""
    return {meta["prediction"], meta["loss_tensor"], *[hd["tensor"] for hd in meta.get("heads", [])]}


def half_tensors(g: Graph, prefix: set[str] | None = None) -> set[str]:
    """The float32 tensors the sample phase writes that fp16-mixed stores as fp16 (see the module's rules); prefix:
    prefix_results(g) where the caller has it already."""
    meta = g.meta["train"]
    split = int(meta["sample_ops"])
    keep = _head_tensors(meta)
    keep.update(meta.get("accumulators", []))
    # the frozen prefix: fp32, or fp16 written by its kernels (prefix_results)
    keep.update(prefix_results(g) if prefix is None else prefix)
    out: set[str] = set()
    for op in g.ops[:split]:
        if op.type in _LOSS_TYPES:
            continue
        for t in op.outputs:
            tt = g.tensors[t]
            if tt.dtype == "float32" and tt.data is None and t not in g.inputs and t not in keep \
                    and t not in op.inputs:
                out.add(t)
    return out


def to_fp16_mixed(g: Graph, loss_scale: Any = None, reorder: bool = True, grads_fp16: bool | None = None,
                  check_first: bool | None = None) -> Graph:
    """Rewrite float training IR `g` (stages/autodiff.py) in place into its fp16-mixed form; returns it.

    Where the trained parameters' gradients wait for the overflow check (`grads_fp16`): True stores them as fp16
    (half the bytes while several are held, plus an fp32 temporary while each is written and unscaled); False
    keeps fp32 slots holding fp16 values (no temporaries; better when one gradient dominates). None: both are
    planned with the reorder stage's planner (`reorder`: train.reorder.enabled) and the smaller arena wins (ties:
    fp32 slots), so the choice is a function of the graph alone, the same in sparse-plan and autodiff.

    `check_first` (batch 1 only): the overflow check runs in a first backward pass of its own (the backward
    recomputed, every trained gradient checked as it is made and dropped: nothing is stored for it), then the real
    backward updates each weight in place (channel by channel where fp32's does) once the flag is known. It costs a
    second backward's instructions and keeps fp32's in-place and streamed updates. None: planned against the two
    one-pass forms, the smallest arena wins (ties: one pass, the fewer instructions)."""
    batch1 = int(g.meta["train"].get("batch_size", 1)) == 1
    if check_first is None and grads_fp16 is None:
        import copy

        from tinytrain.stages.reorder import plan_schedules

        cands = [to_fp16_mixed(copy.deepcopy(g), loss_scale, reorder, gf, False) for gf in (False, True)]
        if batch1:
            cands.append(to_fp16_mixed(copy.deepcopy(g), loss_scale, reorder, False, True))
        arenas = [plan_schedules(c, reorder)[1].arena for c in cands]
        best = cands[arenas.index(min(arenas))]
        g.tensors, g.ops, g.meta = best.tensors, best.ops, best.meta
        return g
    check_first = bool(check_first) and batch1
    grads_fp16 = bool(grads_fp16) and not check_first
    meta = g.meta["train"]
    if meta.get("precision") != "float32":
        # The pipeline cannot get here (quantize gives fp16-mixed a float graph, an int8 file's dequantized copy).
        raise UserError(f"train.precision fp16-mixed trains a float graph, but this training graph is "
                        f"{meta.get('precision')}: build it from the quantize stage's float graph "
                        f"(stages/quant/dequantize.py dequantizes an int8 one)")
    pol = policy_from_config(loss_scale)
    split = int(meta["sample_ops"])
    ph = meta["phases"]
    n_fwd, n_loss = int(ph["forward"]), int(ph["loss"])
    prefix = prefix_results(g)
    half = half_tensors(g, prefix)

    def new(name: str, like: Tensor, dtype: str = "float32", role: str | None = None, data=None) -> str:
        base, k = name, 1
        while name in g.tensors:
            name, k = f"{base}.{k}", k + 1
        g.tensors[name] = Tensor(name, list(like.shape), dtype, role=role or like.role, data=data)
        return name

    scale = new(SCALE, Tensor(SCALE, [], "float32"), role="optimizer_state",
                data=np.array(pol["init_scale"], np.float32))
    good = new(GOOD, Tensor(GOOD, [], "int32"), "int32", "optimizer_state", np.zeros((), np.int32))
    skipped = new(SKIPPED, Tensor(SKIPPED, [], "int32"), "int32", "optimizer_state", np.zeros((), np.int32))
    flag = new(FLAG, Tensor(FLAG, [], "int32"), "int32", "activation")

    out: list[Op] = []
    bounds: list[int] = []            # new op count at the end of forward, loss
    rename: dict[str, str] = {}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(g.ops[:split]):
        for t in op.inputs:
            if t is not None:
                readers.setdefault(t, []).append(i)
    n_head = n_fwd + n_loss
    # saved for the backward: written by the forward, read after it -> stored as fp16 (half the bytes); the rest
    # live for an op or two: fp32 slots holding fp16 values (round_f16, in place), so no second copy exists
    producer = {t: i for i, op in enumerate(g.ops[:split]) for t in op.outputs}
    saved = {t for t in half if producer[t] < n_fwd and any(r >= n_fwd for r in readers.get(t, []))}
    # the trained parameters' gradients (batch 1: no fp32 accumulator) wait for the overflow check: fp16 as well
    final_grads = {d["gradient"] for d in meta["trained"].values()} & half if grads_fp16 else set()
    saved |= final_grads
    # check_first: each trained gradient is unscaled (in place) as soon as it is made, so its update can follow
    step_grads = {op.inputs[1] for op in g.ops[split:] if op.type in ops.UPDATE_OPS}
    unscaled: dict[str, str] = {}
    narrow = fp16_written(g, (half - saved - step_grads) | (prefix - _head_tensors(meta)), split)
    for i, op in enumerate(g.ops[:split]):
        if i == n_fwd:
            bounds.append(len(out))
        if i == n_head:
            bounds.append(len(out))
        ins = [rename.get(t, t) if t is not None else None for t in op.inputs]
        if i >= n_fwd:   # a backward op reading a saved activation: widened into an fp32 temporary for the op
            widened: dict[str, str] = {}
            for t in ins:
                if t is not None and t in saved and t not in widened:
                    widened[t] = new(f"f32/{t}@{i}", g.tensors[t])
                    out.append(Op(f16.CAST_F16_F32, [t], [widened[t]], {}))
            ins = [widened.get(t, t) if t is not None else None for t in ins]
        outs, after = [], []
        for t in op.outputs:
            if t not in half:
                outs.append(t)
                if t in narrow:   # the frozen prefix's results its kernels write and read as fp16 (prefix_results)
                    g.tensors[t].dtype = "float16"
                continue
            raw = new(f"raw/{t}", g.tensors[t])
            outs.append(raw)
            if t in final_grads:   # read by the step phase only (amp_check, amp_unscale read fp16)
                after.append(Op(f16.CAST_F32_F16, [raw], [t], {}))
            elif t in saved:   # forward readers read the rounded fp32 value, the backward its fp16 copy
                r = new(f"f32/{t}", g.tensors[t])
                after += [Op(f16.ROUND_F16, [raw], [r], {}), Op(f16.CAST_F32_F16, [r], [t], {})]
                for o in g.ops[i + 1:n_fwd]:
                    o.inputs = [r if x == t else x for x in o.inputs]
            elif t in narrow:   # written as fp16 by its kernel, read as fp16 by every reader: no fp32 copy
                outs[-1] = t
                del g.tensors[raw]
                g.tensors[t].dtype = "float16"
            else:
                after.append(Op(f16.ROUND_F16, [raw], [t], {}))
        out.append(Op(op.type, ins, outs, dict(op.attrs), op.source_index))
        out.extend(after)
        if check_first:
            for t in op.outputs:
                if t in step_grads:
                    unscaled[t] = new(f"unscaled/{t}", g.tensors[t], "float32", "gradient")
                    out.append(Op(f16.AMP_UNSCALE, [t, scale], [unscaled[t]], {}))
        if op.type in _LOSS_TYPES and op.type != LOSS_SUM:
            for d in op.outputs[1:]:
                dt = g.tensors[d]
                raw = new(f"raw/scaled/{d}", dt)
                scaled = new(f"scaled/{d}", dt)
                out.append(Op(f16.LOSS_SCALE_MUL, [d, scale], [raw], {}))
                out.append(Op(f16.ROUND_F16, [raw], [scaled], {}))
                rename[d] = scaled
    while len(bounds) < 2:
        bounds.append(len(out))
    new_split = len(out)
    n_acc_new = sum(1 for op in out[bounds[1]:] if op.type == f16.BATCH_ACCUMULATE)

    # ---- the step phase: check, unscale, guarded updates, the scale policy ------------------------------------
    step_ops = g.ops[split:]
    updates = [op for op in step_ops if op.type in ops.UPDATE_OPS]
    if any(op.type in ops.QAS_UPDATE_OPS for op in updates):
        raise UserError("fp16-mixed trains float parameters only (this graph has int8 QAS updates)")
    grads = [op.inputs[1] for op in updates]
    if check_first:
        first = check_pass(g, out[bounds[1]:new_split], set(grads), flag, new)
        # the real backward is only there for its updates: on a step the check found Inf/NaN in, it is skipped
        # whole (as its updates are), not run for nothing
        for op in out[bounds[1]:new_split]:
            op.attrs["skip_if"] = flag
        out = out[:bounds[1]] + first + out[bounds[1]:]
        new_split += len(first)
    else:
        out.append(Op(f16.AMP_CHECK, grads, [flag], {}))
    for op in step_ops:
        if op.type == f16.STEP_COUNTER:
            out.append(Op(op.type, op.inputs + [flag], list(op.outputs), {**op.attrs, "skip_if": flag}))
        elif op.type in ops.UPDATE_OPS and check_first:
            attrs = {**op.attrs, "skip_if": flag}
            out.append(Op(op.type, [op.inputs[0], unscaled[op.inputs[1]], *op.inputs[2:], flag], list(op.outputs),
                          attrs))
        elif op.type in ops.UPDATE_OPS:
            gname = op.inputs[1]
            gt = g.tensors[gname]
            g32 = new(f"unscaled/{op.inputs[0]}", gt, "float32", "gradient")
            reset = bool(op.attrs.get("reset_grad"))
            # reset (batch > 1): the accumulator is zeroed after use, skipped step or not (as reset_grad did)
            out.append(Op(f16.AMP_UNSCALE_RESET if reset else f16.AMP_UNSCALE, [gname, scale], [g32], {}))
            attrs = {**op.attrs, "reset_grad": False, "skip_if": flag}
            out.append(Op(op.type, [op.inputs[0], g32, *op.inputs[2:], flag], list(op.outputs), attrs))
        else:
            raise UserError(f"fp16-mixed: unexpected op {op.type!r} in the step phase")
    out.append(Op(f16.LOSS_SCALE_UPDATE, [scale, good, skipped, flag], [scale, good, skipped],
                  {k: pol[k] for k in ("kind", "growth", "backoff", "interval", "min_scale", "max_scale")}))

    for t in saved:
        g.tensors[t].dtype = "float16"
    g.ops = out
    meta["sample_ops"] = new_split
    meta["phases"] = {"forward": bounds[0], "loss": bounds[1] - bounds[0],
                      "backward": new_split - bounds[1] - n_acc_new, "accumulate": n_acc_new,
                      "update": len(out) - new_split}
    meta["optimizer_state"] = list(meta["optimizer_state"]) + [scale, good, skipped]
    meta["precision"] = "fp16-mixed"
    meta["loss_scale"] = {**pol, "scale_tensor": scale, "good_steps_tensor": good, "skipped_steps_tensor": skipped,
                          "flag_tensor": flag, "fp16_tensors": len(saved),
                          "fp16_rounded_tensors": len(half) + len(rename), "gradients_fp16": bool(final_grads),
                          "fp16_written": len(narrow),
                          "check_first": check_first}
    meta["runtime_defaults"] = dict(meta["runtime_defaults"])
    g.validate()
    return g


def fp16_written(g: Graph, transient: set[str], split: int) -> set[str]:
    """The `transient` tensors (fp16 values the sample phase makes and its next ops read) that are stored as fp16
    by the kernel that writes them: its op can write fp16 (OpDef.fp16_output: fp32 arithmetic, one rounding per
    element on store, the bits of the fp32 kernel followed by round_f16) and every reader reads fp16 at that operand
    (OpDef.fp16_operands). Then no fp32 copy of the result ever exists and it takes 2 bytes per element; anywhere
    else an fp32 result cast to fp16 would exist whole first, so it stays an fp32 slot rounded in place."""
    readers: dict[str, list[tuple[Op, int]]] = {}
    for op in g.ops:
        for k, t in enumerate(op.inputs):
            if t is not None:
                readers.setdefault(t, []).append((op, k))
    out = set()
    for op in g.ops[:split]:
        if op.type not in ops.FP16_OUTPUT_OPS:
            continue
        for t in op.outputs:   # each result of its own (add_grad: one per operand)
            rs = readers.get(t, [])
            if broadcasts_in_place(g, op, t):
                continue
            if t in transient and t not in g.outputs and rs \
                    and all(ops.reads_fp16(r.type, k) for r, k in rs):
                out.add(t)
    # an in-place reader (mask_grad) whose own result stays fp32 could no longer write it over its 2-byte input:
    # the pair would then cost more than two fp32 slots in one, so such a tensor stays fp32; likewise a result of
    # a channel-by-channel in-place op (depthwise) whose input stays fp32 (its kernels go fp16 -> fp16, so that the
    # channel it copies over is the one it read) (to a fixed point)
    writer = {t: op for op in g.ops[:split] for t in op.outputs}
    changed = True
    while changed:
        changed = False
        for t in sorted(out):
            if any(in_place_at(r.type, k) and r.outputs and r.outputs[0] not in out
                   and g.tensors[r.outputs[0]].dtype == "float32" for r, k in readers[t]) \
                    or (writer[t].type in ops.CHANNEL_SCRATCH_OPS and writer[t].inputs[0] not in out
                        and g.tensors[writer[t].inputs[0]].dtype != "float16"):
                out.discard(t)
                changed = True
    return out


def in_place_at(op_type: str, k: int) -> bool:
    """Operand k of an op of type `op_type` may be the buffer its result is written over (memplan's in-place
    sharing). fp16_written's fixed point and its estimate (planning/fp16_memory) both ask it."""
    return op_type in ops.IN_PLACE_OPS and (k == 0 or op_type not in ops.FIRST_INPUT_ONLY)


def broadcasts_in_place(g: Graph, op: Op, result: str) -> bool:
    """`op` is an element-wise op that may write over any operand (add) and one of its activation operands is
    broadcast to `result`'s shape while its fp32 bytes could hold `result` as fp16 (at least half its elements): the
    planner might then write an fp16 `result` over that operand, which no kernel can do (a broadcast element is read
    again after the result has covered it), so `result` stays fp32 (fp16_written; planning/fp16_memory likewise).
    A smaller broadcast operand (a row, a per-channel vector) cannot host it: such an add writes fp16
    (tt_add_f16_broadcast, behind what it reads over its operand of `result`'s shape)."""
    if op.type not in ops.IN_PLACE_OPS or op.type in ops.FIRST_INPUT_ONLY:
        return False
    n = int(np.prod(g.tensors[result].shape, dtype=np.int64))
    return any(x is not None and g.tensors[x].data is None and g.tensors[x].shape != g.tensors[result].shape
               and 2 * int(np.prod(g.tensors[x].shape, dtype=np.int64)) >= n for x in op.inputs)


def check_pass(g: Graph, backward: list[Op], grads: set[str], flag: str, new) -> list[Op]:
    """The overflow check's own backward pass (check_first): `backward` (the rewritten backward, the real pass)
    again with every tensor it writes renamed (chk/...), minus its unscaling, and each trained gradient checked as
    soon as it is made (amp_check with the previous check's flag: the flags chain, so no gradient waits for
    another). The same ops on the same inputs give the same bits, so the flag is the one the gradients of the real
    pass would give; the last check writes `flag`."""
    rename: dict[str, str] = {}
    out: list[Op] = []
    prev: str | None = None
    pending = []
    for op in backward:
        if op.type == f16.AMP_UNSCALE:
            continue
        ins = [rename.get(t, t) if t is not None else None for t in op.inputs]
        outs = []
        for t in op.outputs:
            if t not in rename:
                rename[t] = new(f"chk/{t}", g.tensors[t], g.tensors[t].dtype)
            outs.append(rename[t])
        out.append(Op(op.type, ins, outs, dict(op.attrs), op.source_index))
        for t in op.outputs:
            if t in grads:
                pending.append(t)
                f = new(f"{flag}@{len(pending)}", g.tensors[flag], "int32", "activation")
                out.append(Op(f16.AMP_CHECK, [rename[t]] + ([prev] if prev else []), [f], {}))
                prev = f
    if set(pending) != grads:
        raise AssertionError(f"check pass: gradients {sorted(grads - set(pending))} are never made")
    # the last check writes the step's flag itself (the updates and the policy read it)
    for op in reversed(out):
        if op.type == f16.AMP_CHECK:
            del g.tensors[op.outputs[0]]
            op.outputs = [flag]
            break
    return out


def memory_against_fp32(fp32: Graph, fp16: Graph, reorder: bool = True) -> dict[str, Any]:
    """The arena of the fp16-mixed training graph next to the fp32 graph of the same plan, both planned by the
    reorder stage's planner, and the activations saved for the backward in each (autodiff's precision.json)."""
    from tinytrain.stages.reorder import plan_schedules

    _, b32, _, _ = plan_schedules(fp32, reorder)
    _, b16, _, _ = plan_schedules(fp16, reorder)
    # the fp16 copies a cast makes (saved activations, gradients kept to the check); the results their kernels write
    # as fp16 (fp16_written) are counted apart: they were fp32 slots, not saved tensors
    cast = {o for op in fp16.ops if op.type == f16.CAST_F32_F16 for o in op.outputs}
    saved16 = [t for t in fp16.tensors.values() if t.dtype == "float16" and t.name in cast]
    written16 = [t for t in fp16.tensors.values() if t.dtype == "float16" and t.name not in cast]
    return {"arena_bytes": int(b16.arena), "arena_bytes_fp32": int(b32.arena),
            "arena_saving_bytes": int(b32.arena) - int(b16.arena),
            "saved_activation_bytes": sum(t.nbytes for t in saved16),
            "saved_activation_bytes_fp32": 2 * sum(t.nbytes for t in saved16),   # fp16 tensors: saved activations
            #                                                                       and the gradients kept to the check
            "fp16_tensors": len(saved16), "reorder": reorder,
            "fp16_written_tensors": len(written16), "fp16_written_bytes": sum(t.nbytes for t in written16),
            "check_first": bool(fp16.meta["train"]["loss_scale"].get("check_first")),
            "note": "fp16 halves the activations kept for the backward; the Inf/NaN check runs before any update: "
                    "in a backward pass of its own (check_first: the updates then run in place, channel by channel, "
                    "as fp32's) or at the end of the backward, every trained gradient kept until then, whichever "
                    "plans the smaller arena. The weight gradients, activation masks and max-pool gradients read the "
                    "saved fp16 activations themselves (no fp32 copy); a transient result whose kernel writes fp16 "
                    "and whose readers read it is a 2-byte tensor (fp16_written); where the frozen fp32 forward is "
                    "the peak, fp16 saves nothing there"}
