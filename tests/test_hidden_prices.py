"""`auto`'s prices count the hidden-channel streams (stages/planning/channel_stream.py) where the chains stay intact:
a bias-only region of MobileNetV2 is priced with blocks 10-16's backward one hidden channel at a time, as the
reorder stage runs it; a weight whose gradient would break a chain (a depthwise's) pays the difference in its own
term, so the additive price stays an upper bound of the simulated peak, which the exact planner checks."""

from __future__ import annotations

import pytest

from tinytrain.stages.model import zoo
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
from tinytrain.stages.planning.plan_exact import exact_peak
from tinytrain.stages.planning.train_plan import TrainPlan

N_BIAS = 22   # TTE's bias count (bench/memory_mbv2.py)


@pytest.fixture(scope="module")
def mbv2():
    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    return g, MemoryModel(g, MemorySettings())


def _price(mm: MemoryModel, g, plan: TrainPlan) -> int:
    layers = plan.resolve(g)
    earliest = min(r.op_index for r in layers)
    k = sum(lay.op_index >= earliest for lay in mm.layers)
    return mm.bias_option(k)["total"] + sum(mm.weight_cost(r.op_index, r.weight_ratio)["total"]
                                           for r in layers if r.in_channels)


def test_bias_region_priced_with_hidden_streams(mbv2):
    g, mm = mbv2
    plan = TrainPlan.bias_only(g, last=N_BIAS)
    e = min(r.op_index for r in plan.resolve(g))
    streamed, plain = mm._region(e)["transient"], mm._region(e, False)["transient"]
    assert streamed < plain                       # the chains of blocks 10-16 lower the bias-only region
    price = _price(mm, g, plan)
    assert price == mm.estimate(plan)["total"]   # a bias-only plan: the price is the simulated peak
    # against the reorder stage's exact planner: the price follows it (it was the unstreamed region before)
    exact = exact_peak(g, plan, MemorySettings())["peak_bytes"]
    assert 0.95 <= price / exact <= 1.05
    assert price - streamed + plain > 1.05 * exact


def test_a_weight_that_breaks_a_chain_pays_for_it(mbv2):
    g, mm = mbv2
    e = min(r.op_index for r in TrainPlan.bias_only(g, last=N_BIAS).resolve(g))
    gap = mm._region(e, False)["transient"] - mm._region(e)["transient"]
    region = [lay for lay in mm.layers if lay.op_index >= e]
    dw = next(lay for lay in region if lay.type == "depthwise_conv2d")
    expand = next(lay for lay in region if lay.type == "conv2d" and "_expand" in lay.weight)
    assert mm._breaks_chains(dw.op_index) and not mm._breaks_chains(expand.op_index)
    assert mm.weight_cost(dw.op_index, 1.0)["transient"] >= gap
    for lay in (dw, expand):
        plan = TrainPlan.bias_only(g, last=N_BIAS)
        next(lp for lp in plan.layers if lp.layer == lay.op_index).weight_ratio = 1.0
        assert _price(mm, g, plan) >= mm.estimate(plan)["total"], lay.name
