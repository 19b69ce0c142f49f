"""The budget refusal names what holds the smallest plan's peak and why it is whole (stages/planning/peak_why.py).

The outside reference is the memory plan itself: the buffers named are the largest ones live at the step where the
reorder planner's arena peaks, with the sizes the planner gave them."""

from __future__ import annotations

from test_statics import HEADS, detector
from tinytrain.stages import sparse_plan as SP
from tinytrain.stages.planning import peak_why
from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
from tinytrain.stages.planning.plan_exact import ExactPeaks, training_graph
from tinytrain.stages.planning.train_plan import PlanError, TrainPlan
from tinytrain.stages.reorder import plan_schedules


def test_the_largest_buffers_at_the_peak_are_named_with_their_reason():
    g = detector(4000)
    s = MemorySettings(loss="mse", heads=tuple(HEADS["mse"]))
    tg = training_graph(g, TrainPlan.bias_only(g, 1), s)
    _, mp, _, _ = plan_schedules(tg, True)
    held = peak_why.explain(tg, mp)
    step = peak_why.peak_step(mp)
    live = sorted((b.size for b in mp.buffers if b.start <= step <= b.end), reverse=True)
    assert [h["bytes"] for h in held] == live[:3]
    assert sum(b.size for b in mp.buffers if b.start <= step <= b.end) <= mp.arena
    why = {h["tensor"]: h["why"] for h in held}
    assert why["train/target"] == "the loss target, read whole by the loss"
    assert why["boxes/b"] == "trained state (bias)"


def test_refusal_carries_the_explanation():
    g = detector(4000)
    s = MemorySettings(loss="mse", heads=tuple(HEADS["mse"]))
    e = SP._what_holds_the_peak(PlanError("budget 1.0 KB is too small", hint="h"), g, MemoryModel(g, s), 1,
                                ExactPeaks(g, s))
    assert e.message.startswith("budget 1.0 KB is too small; at its peak the arena holds ")
    assert "train/target [1, 4000] float32 15.6 KB (the loss target, read whole by the loss)" in e.message
    assert e.hint == "h"


def test_sparse_plan_refusal_names_the_peak_or_what_autodiff_lacks(tmp_path, monkeypatch):
    import pytest
    from test_sparse_plan import graph_of, make_ctx
    from tinytrain.stages.planning import plan_exact

    g = graph_of("digits_cnn_int8")
    with pytest.raises(PlanError) as e:
        SP.run(make_ctx(tmp_path / "a", g, {"scheme": "auto", "budget_kb": 0.25}))
    assert "too small for the smallest plan" in e.value.message and "; at its peak the arena holds " in e.value.message

    def unavailable(self, plan):
        raise plan_exact.ExactUnavailable("no backward for op FOO at operator index 7")
    monkeypatch.setattr(plan_exact.ExactPeaks, "__call__", unavailable)
    with pytest.raises(PlanError) as e:
        SP.run(make_ctx(tmp_path / "b", g, {"scheme": "auto", "budget_kb": 0.25}))
    assert e.value.message.endswith("; autodiff cannot build its training step: no backward for op FOO at operator "
                                    "index 7")


def test_row_stream_rules_name_the_op_that_breaks_them():
    """dwsep (tests/fixtures): a spatial PAD whose two readers (conv, depthwise) meet only at a CONCATENATION; the
    smallest row group that could hold its output runs into an op row streams cannot run, named, as does the one
    for the conv's output before it; a stream's own window is said to be one."""
    from test_sparse_plan import graph_of

    g = graph_of("dwsep_int8")
    tg = training_graph(g, TrainPlan.bias_only(g, 1), MemorySettings())
    _, mp, _, _ = plan_schedules(tg, True)
    pad = next(op for op in tg.ops if op.type == "pad")
    why = peak_why.why_whole(tg, mp, pad.outputs[0])
    assert why.startswith("not in any row stream: the row group that would hold it reaches ") and \
        why.endswith("which a row stream cannot run (no row form for this op), before its branches meet"), why
    # the conv before it: a group holding its output ends on the larger padded tensor, so it grows on (a stream's
    # whole last output must be smaller to lower the peak) into the same op
    why = peak_why.why_whole(tg, mp, pad.inputs[0])
    assert why.startswith("not in any row stream: the row group that would hold it reaches ") and \
        why.endswith("before a tensor smaller than it"), why
    for st in mp.streams:
        for t in st.chunked:
            assert peak_why.why_whole(tg, mp, t) == "a row stream's window already"


def test_a_group_that_could_hold_it_is_named():
    """hpad (tests/fixtures/streams): planned without row streams, the first conv's 16x16x8 output could sit inside
    a row group (up to the strided depthwise and max pooling, whose ADD is smaller): the reason names that group."""
    from pathlib import Path

    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.planning.arena import MemOptions, plan_memory
    from tinytrain.stages.planning.schedule import in_place_update_order

    g = read_model(Path(__file__).parent / "fixtures" / "streams" / "hpad_int8.tflite")
    tg = build_training_graph(g, TrainPlan.bias_only(g, last=1), "cross_entropy", OptimizerSpec("sgd"), 1)
    order = in_place_update_order(tg)
    mp = plan_memory(tg, order, MemOptions())
    conv = tg.ops[order[0]]
    why = peak_why.why_whole(tg, mp, conv.outputs[0])
    assert why.startswith(f"not in any row stream: a row group of ") and why.endswith(
        "could hold it, but the planner's cut points did not lower the peak with it inside one"), why
    assert f"(conv2d ({conv.outputs[0].split(';')[0]}) to add (" in why
