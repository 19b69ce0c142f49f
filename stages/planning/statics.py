"""Buffers the firmware keeps in SRAM outside the arena whose size depends on the model: what the budget must hold
besides the exact peak of the training step (planning/plan_exact.py).

The arena holds every tensor of the training step. The board's `runtime_reserve_bytes` holds what does not depend
on the model (stack, the driver's file and text buffers). What is left, and grows with the trained outputs:

  target row     the driver reads one sample's float targets (TT_NUM_TARGETS floats) from the .ttds record into a
                 static row that evaluation and training share (stages/c_emit/driver.py); with float targets only
  head copies    heads evaluated by their loss (several heads, bce, huber): the forward copies each head into its
                 own static buffer (stages/c_emit/program.py head_captures), plus a float gradient scratch as large
                 as the largest head and, for int8 heads, a float copy of it dequantized (program._heads_eval)

A detector's box head (BlazeFace: 896 x 16 floats, 56 KB) makes these large: a plan whose arena fits the budget can
still fail to link when they are not counted.

One more depends on the plan, not only on the trained outputs, so the exact peak of each plan counts it
(planning/plan_exact.exact_peak, `kept_whole` below):

  whole weights  a weight trained on a slice of its input channels is split (the frozen rest stays in flash, the
                 trained slice lives in the arena) when every reader has a split-weight kernel (split_weights);
                 otherwise codegen keeps the whole weight in SRAM outside the arena (hand_landmark_full: 70.9 KB).

The facts are read from the training graph exactly as codegen reads them (for_model: from what autodiff builds
the graph's heads and target input from), and tests/test_statics.py checks them against the symbols of the
compiled program.
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, Op, numel
from tinytrain.stages.train.losses import head_tensors, heads_from, target_input

FLOAT = 4


def outside_arena(tg: Graph) -> list[dict[str, Any]]:
    """[{name, bytes, what}] of the model-sized static buffers codegen emits for this training graph."""
    meta = tg.meta["train"]
    lab = tg.tensors[meta["label_input"]]
    heads = [(h.get("output", j), tg.tensors[h["tensor"]]) for j, h in enumerate(meta.get("heads") or [])]
    return _buffers(lab.dtype, lab.shape, meta.get("loss"), [(o, t.dtype, t.shape) for o, t in heads])


def for_model(graph: Graph, settings: Any) -> list[dict[str, Any]]:
    """outside_arena of the model's training graph, without building it: the trained outputs and their losses fix
    these buffers, not which layers train, and they are read from what autodiff builds the graph's heads and
    target input from (losses.head_tensors, losses.target_input)."""
    heads = heads_from(list(settings.heads) or settings.loss, list(graph.outputs))
    head_of, _ = head_tensors(graph, graph.ops, heads)
    shapes = {h.name: list(graph.tensors[head_of[h.name]].shape) for h in heads}
    _, shape, dtype = target_input(heads, shapes)
    loss = heads[0].loss if len(heads) == 1 else "multi"
    return _buffers(dtype, shape, loss, [(h.name, graph.tensors[head_of[h.name]].dtype, shapes[h.name])
                                         for h in heads])


def _buffers(label_dtype: str, label_shape: list[int], loss: str | None,
             heads: list[tuple[Any, str, list[int]]]) -> list[dict[str, Any]]:
    """The buffers of a training step with this target input, loss ("multi": several heads) and heads
    ((output, dtype, shape) of the tensor each loss reads)."""
    if label_dtype != "float32":          # class labels: one int32, no row
        return []
    out = [{"name": "tt_target_row", "bytes": numel(label_shape) * FLOAT,
            "what": f"the driver's row of {numel(label_shape)} float targets"}]
    if loss == "mse" or not heads:
        return out
    for j, (output, dtype, shape) in enumerate(heads):
        out.append({"name": f"tt_eval_head{j}", "bytes": numel(shape) * (1 if dtype == "int8" else FLOAT),
                    "what": f"the evaluation's copy of head {output!s}"})
    biggest = max(numel(shape) for _, _, shape in heads)
    out.append({"name": "tt_eval_grad", "bytes": biggest * FLOAT, "what": "the evaluation's gradient scratch"})
    if any(dtype == "int8" for _, dtype, _ in heads):
        out.append({"name": "tt_eval_pred", "bytes": biggest * FLOAT,
                    "what": "the evaluation's dequantized head"})
    return out


def total(items: list[dict[str, Any]]) -> int:
    return sum(int(i["bytes"]) for i in items)


def describe(items: list[dict[str, Any]]) -> str:
    """'56.0 KB outside the arena (the driver's row of 14336 float targets)'."""
    from tinytrain.stages.planning.memory_model import kb

    return f"{kb(total(items))} outside the arena ({', '.join(i['what'] + ' ' + kb(i['bytes']) for i in items)})"


def split_weights(g: Graph, trained: dict[str, dict[str, Any]], in_arena: Any = None,
                  fused: dict[str, str] | None = None) -> dict[str, int]:
    """weight -> n of the partially trained int8 or float32 weights whose every reader has a split-weight kernel
    (codegen keeps their compact trained slice [..., :n] in the arena, the whole original in flash). `in_arena`:
    the tensors the memory plan placed (None: all of them); `fused`: arena.fused_dequantize(g)."""
    from tinytrain.stages.planning.arena import fused_dequantize

    fused = fused_dequantize(g) if fused is None else fused
    readers = g.consumers()
    out = {}
    for p, info in trained.items():
        t = g.tensors[p]
        n = info.get("n")
        if n is None or int(n) >= int(t.shape[-1]) or t.dtype not in ("int8", "float32") \
                or (in_arena is not None and p not in in_arena) or len(t.shape) < 2:
            continue  # trained whole (or not splittable): one tensor at its arena offset
        ok = True
        for i in readers.get(p, []):
            op = g.ops[i]
            for k, name in enumerate(op.inputs):
                if name != p or _split_reader(g, op, k):
                    continue
                if ops.REGISTRY[op.type].conversion and op.outputs[0] in fused and all(
                        _split_reader(g, g.ops[o], j) for o in readers.get(op.outputs[0], [])
                        for j, x in enumerate(g.ops[o].inputs) if x == op.outputs[0]):
                    continue   # a dequantize fused into its readers, which all read the split weight
                if op.type in ops.UPDATE_OPS and k == 0:   # updates run on the trained slice (trained_slice)
                    continue
                ok = False
        if ok:
            out[p] = int(n)
    return out


def _split_reader(g: Graph, op: Op, k: int) -> bool:
    """op's kernel reads a split weight at operand k (OpDef.split_weight; a forward op's int8 kernel, or its
    float32 one on a float32 weight)."""
    d = ops.REGISTRY[op.type]
    return d.split_weight == k and (d.kind != "forward" or g.tensors[op.inputs[0]].dtype == "int8"
                                    or g.tensors[op.inputs[k]].dtype == "float32")


def kept_whole(tg: Graph) -> list[dict[str, Any]]:
    """[{name, bytes, what}] of the partially trained weights codegen keeps whole in SRAM outside the arena: a
    reader has no split kernel (split_weights). Depends on the plan (which weights train on a slice)."""
    trained = tg.meta["train"]["trained"]
    split = split_weights(tg, trained)
    out = []
    for p, info in trained.items():
        t = tg.tensors[p]
        n = info.get("n")
        if t.data is None or n is None or int(n) >= int(t.shape[-1]) or p in split:
            continue
        out.append({"name": p, "bytes": t.nbytes,
                    "what": f"{p} trained on {n} of {t.shape[-1]} channels, whole (a reader has no split kernel)"})
    return out
