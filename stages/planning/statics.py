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
still fail to link when they are not counted. The facts are read from the training graph exactly as codegen reads
them, and tests/test_statics.py checks them against the symbols of the compiled program.
"""

from __future__ import annotations

from typing import Any

from tinytrain.stages.model.ir import Graph, numel

FLOAT = 4


def outside_arena(tg: Graph) -> list[dict[str, Any]]:
    """[{name, bytes, what}] of the model-sized static buffers codegen emits for this training graph."""
    meta = tg.meta["train"]
    lab = tg.tensors[meta["label_input"]]
    if lab.dtype != "float32":          # class labels: one int32, no row
        return []
    out = [{"name": "tt_target_row", "bytes": numel(lab.shape) * FLOAT,
            "what": f"the driver's row of {numel(lab.shape)} float targets"}]
    if meta.get("loss") == "mse" or not meta.get("heads"):
        return out
    heads = [tg.tensors[h["tensor"]] for h in meta["heads"]]
    for j, t in enumerate(heads):
        out.append({"name": f"tt_eval_head{j}", "bytes": numel(t.shape) * (1 if t.dtype == "int8" else FLOAT),
                    "what": f"the evaluation's copy of head {meta['heads'][j].get('output', j)!s}"})
    biggest = max(numel(t.shape) for t in heads)
    out.append({"name": "tt_eval_grad", "bytes": biggest * FLOAT, "what": "the evaluation's gradient scratch"})
    if any(t.dtype == "int8" for t in heads):
        out.append({"name": "tt_eval_pred", "bytes": biggest * FLOAT,
                    "what": "the evaluation's dequantized head"})
    return out


def for_model(graph: Graph, settings: Any, qas: bool = True) -> list[dict[str, Any]]:
    """outside_arena of the model's training graph. The trained outputs and their losses fix these buffers, not
    which layers train: any plan that trains something gives the same list. The full plan's here: it trains
    something for every trained output (autodiff drops what an untrained output alone reads)."""
    from tinytrain.stages.planning.plan_exact import training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan

    return outside_arena(training_graph(graph, TrainPlan.full(graph), settings, qas))


def total(items: list[dict[str, Any]]) -> int:
    return sum(int(i["bytes"]) for i in items)


def describe(items: list[dict[str, Any]]) -> str:
    """'56.0 KB outside the arena (the driver's row of 14336 float targets)'."""
    from tinytrain.stages.planning.memory_model import kb

    return f"{kb(total(items))} outside the arena ({', '.join(i['what'] + ' ' + kb(i['bytes']) for i in items)})"
