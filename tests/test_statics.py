"""The model-sized buffers outside the arena (stages/planning/statics.py) are the ones the linked program has.

The case is a detector's structure in small (what made BlazeFace's plan fit 300 KB while its firmware needed
354 KB): an int8 model with two outputs, a wide box head and a narrow score head, trained on the box head (MSE)
or on both (bce + huber). Outside reference: the symbol table of the program the host compiler links (`nm`): every
buffer statics.py names is there with its size, and when the box head grows, the program's static data grows by
exactly what statics.py says (the arena aside) -- nothing output-sized is left uncounted."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from feature_models import _Net
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.planning import statics
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.losses import Head

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("nm") is None,
                              reason="no host C compiler or nm")


def detector(boxes: int, features: int = 16, hidden: int = 12):
    """[1, F] -> FC + relu trunk -> outputs `boxes` [1, boxes] and `scores` [1, 3], quantized to int8."""
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages.quantize import quantize_model

    n = _Net(7)
    x = n.t("features", [1, features], "input")
    h = n.fc("trunk", x, features, hidden, "relu")
    s = n.fc("scores", h, hidden, 3)
    b = n.fc("boxes", h, hidden, boxes)      # the last layer: the smallest plan trains its bias
    calib = np.random.default_rng(4).standard_normal((32, features)).astype(np.float32)
    q, _ = quantize_model(n.graph([x], [b, s]), calib, QuantizeSpec())
    return q


HEADS = {"mse": [Head("boxes", "mse")], "heads": [Head("scores", "bce"), Head("boxes", "huber", 0.5)]}


def _training_graph(boxes: int, heads: str):
    g = detector(boxes)
    return build_training_graph(g, TrainPlan.full(g), HEADS[heads], OptimizerSpec("sgd"), 1)


def _linked_statics(tg, tmp_path) -> tuple[dict[str, int], int]:
    """(size of every data/bss symbol of the linked host program, their total without the arena)."""
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board

    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    elf = build_firmware(get_board("host"), tmp_path / "prog", tmp_path / "build").elf
    out = subprocess.run(["nm", "-S", str(elf)], capture_output=True, text=True, check=True).stdout
    syms: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "bBdD":
            syms[parts[3].split(".")[0]] = syms.get(parts[3].split(".")[0], 0) + int(parts[1], 16)
    return syms, sum(v for k, v in syms.items() if k != "tt_arena")


def test_outside_arena_lists_the_box_heads_buffers():
    mse = statics.outside_arena(_training_graph(600, "mse"))
    assert [(i["name"], i["bytes"]) for i in mse] == [("tt_target_row", 600 * 4)]
    heads = statics.outside_arena(_training_graph(600, "heads"))
    # targets of both heads back to back; the int8 heads captured; float scratch and dequantized copy per element
    assert [(i["name"], i["bytes"]) for i in heads] == [
        ("tt_target_row", (3 + 600) * 4), ("tt_eval_head0", 3), ("tt_eval_head1", 600),
        ("tt_eval_grad", 600 * 4), ("tt_eval_pred", 600 * 4)]
    assert statics.describe(mse) == "2.3 KB outside the arena (the driver's row of 600 float targets 2.3 KB)"


@needs_cc
@pytest.mark.parametrize("heads", ["mse", "heads"])
def test_linked_program_has_exactly_these_buffers(tmp_path, heads):
    tg = _training_graph(600, heads)
    syms, _ = _linked_statics(tg, tmp_path)
    for item in statics.outside_arena(tg):
        assert syms.get(item["name"]) == item["bytes"], (item, {k: v for k, v in syms.items() if "tt_" in k})


@pytest.mark.slow  # ~8 s: four host builds
@needs_cc
@pytest.mark.parametrize("heads", ["mse", "heads"])
def test_nothing_output_sized_is_left_uncounted(tmp_path, heads):
    small, big = _training_graph(8, heads), _training_graph(900, heads)
    _, s_small = _linked_statics(small, tmp_path / "small")
    _, s_big = _linked_statics(big, tmp_path / "big")
    assert s_big - s_small == statics.total(statics.outside_arena(big)) - statics.total(statics.outside_arena(small))


def test_sparse_plan_budget_counts_them(tmp_path):
    """The plan's budget holds the arena and these buffers: a budget that holds the arena alone is refused by
    sparse-plan with the whole need named, instead of failing at link time."""
    from tinytrain.pipeline.errors import UserError
    from tinytrain.stages.planning.auto_plan import smallest_plan_check
    from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
    from tinytrain.stages.planning.plan_exact import ExactPeaks

    g = detector(4000)
    s = MemorySettings(loss="mse", heads=(Head("boxes", "mse"),))
    mm = MemoryModel(g, s)
    exact = ExactPeaks(g, s)
    outside = statics.for_model(g, s)
    assert statics.total(outside) == 4000 * 4
    budget = exact(TrainPlan.bias_only(g, 1))["peak_bytes"] + 1024
    smallest_plan_check(mm, budget, 1, exact, g, [])                 # the arena alone fits the budget ...
    with pytest.raises(UserError, match=r"it needs .* \(exact peak of its training step .* \+ 15\.6 KB outside the "
                                        r"arena \(the driver's row of 4000 float targets 15\.6 KB\)"):
        smallest_plan_check(mm, budget - statics.total(outside), 1, exact, g, outside)   # ... not with the row


def _trunk_half(g) -> TrainPlan:
    """The boxes head's bias and the trunk's weights on half of their 16 input channels."""
    from tinytrain.stages.planning.train_plan import LayerPlan

    trunk = next(i for i, op in enumerate(g.ops) if op.type == "fully_connected" and op.outputs[0].startswith("trunk"))
    boxes = next(i for i, op in enumerate(g.ops) if op.type == "fully_connected" and op.outputs[0].startswith("boxes"))
    return TrainPlan([LayerPlan(trunk, weight_ratio=0.5), LayerPlan(boxes, bias=True)])


@needs_cc
def test_weight_kept_whole_is_counted_by_the_plan(tmp_path):
    """A weight trained on a slice of its input channels whose reader has no split kernel (fully_connected) stays
    whole in SRAM outside the arena (hand_landmark_full: 70.9 KB): statics.kept_whole names it with its size, the
    linked program has a static of exactly that size, and the exact peak of the plan counts it beside the arena."""
    from tinytrain.stages.planning.memory_model import MemorySettings
    from tinytrain.stages.planning.plan_exact import exact_peak

    g = detector(40)
    plan = _trunk_half(g)
    tg = build_training_graph(g, plan, HEADS["mse"], OptimizerSpec("sgd"), 1)
    whole = statics.kept_whole(tg)
    weight = next(p for p, info in tg.meta["train"]["trained"].items() if info.get("n") == 8)
    assert [(w["name"], w["bytes"]) for w in whole] == [(weight, 12 * 16)]
    assert not statics.split_weights(tg, tg.meta["train"]["trained"])
    syms, _ = _linked_statics(tg, tmp_path)
    kept = {k: v for k, v in syms.items() if k.startswith("tt_s") and k[4:].isdigit()}
    assert list(kept.values()) == [12 * 16], syms
    ex = exact_peak(g, plan, MemorySettings(loss="mse", heads=(Head("boxes", "mse"),)))
    _, mp, _, _ = plan_schedules(tg, True)
    assert ex["arena_bytes"] == mp.arena and ex["peak_bytes"] == mp.arena + 12 * 16
    assert ex["kept_whole"] == whole


@pytest.mark.parametrize("heads", [[Head("boxes", "mse")], [Head("scores", "bce")], [Head("boxes", "huber")],
                                   [Head("scores", "cross_entropy")],
                                   [Head("scores", "bce"), Head("boxes", "huber", 0.5)],
                                   [Head("boxes", "mse"), Head("scores", "cross_entropy")]])
def test_for_model_reads_what_the_training_graph_has(heads):
    """for_model derives the buffers without building the training graph: the same list as the graph's, int8 and
    float, one head or several."""
    from tinytrain.stages.planning.memory_model import MemorySettings

    for g in (detector(40), _float_detector(40)):
        tg = build_training_graph(g, TrainPlan.full(g), heads, OptimizerSpec("sgd"), 1)
        assert statics.for_model(g, MemorySettings(heads=tuple(heads))) == statics.outside_arena(tg)


def _float_detector(boxes: int):
    n = _Net(7)
    x = n.t("features", [1, 16], "input")
    h = n.fc("trunk", x, 16, 12, "relu")
    return n.graph([x], [n.fc("boxes", h, 12, boxes), n.fc("scores", h, 12, 3)])
