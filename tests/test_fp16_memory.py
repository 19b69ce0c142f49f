"""fp16-mixed memory (issue 13): the overflow check before any update keeps fp32's in-place and channel-streamed
updates (stages/train/fp16_mixed.py, check_first), the frozen prefix is not rounded, and sparse-plan's analytic
estimate (stages/planning/fp16_memory.py) tracks the exact planner on fp16-mixed graphs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages import ops
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.ops import fp16 as f16
from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
from tinytrain.stages.planning.plan_exact import exact_peak
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.fp16_mixed import to_fp16_mixed

FIX = Path(__file__).parent / "fixtures"
PLAN_LAST1 = lambda g: TrainPlan.last_k(g, 1)  # noqa: E731


def _train_graph(name: str, plan, opt: str = "sgd", batch: int = 1):
    g = read_model(FIX / f"{name}.tflite")
    return build_training_graph(g, plan(g), "cross_entropy", OptimizerSpec(kind=opt), batch, QASOptions(False))


def test_check_first_plans_below_fp32_and_below_the_one_pass_forms():
    """Digits CNN, every layer trained: the one-pass forms keep every gradient until the check (~30 KB); checking in
    a pass of its own lets the updates run in place, channel by channel, below fp32's arena (19.4 KB)."""
    fp32 = _train_graph("digits_cnn_float", TrainPlan.full)
    a32 = plan_schedules(fp32, True)[1].arena
    arenas = {}
    for gf, cf in ((True, False), (False, False), (None, True)):
        tg = to_fp16_mixed(copy.deepcopy(fp32), grads_fp16=gf, check_first=cf)
        name, plan, _, _ = plan_schedules(tg, True)
        arenas[cf, gf] = plan.arena
        if cf:
            assert sum(st.kind == "channels" for st in plan.streams) >= 2   # in the check pass and the real one
            # each conv weight gradient's update runs in its channel stream, whichever order plans smaller
            assert name.startswith("in_place_update") or name.endswith("+streams"), name
    best = to_fp16_mixed(copy.deepcopy(fp32))
    assert best.meta["train"]["loss_scale"]["check_first"] is True
    assert arenas[True, None] < a32 < min(arenas[False, True], arenas[False, False])
    # no update before the last check: every update reads the flag the last check writes
    flag = best.meta["train"]["loss_scale"]["flag_tensor"]
    writer = [i for i, op in enumerate(best.ops) if flag in op.outputs]
    assert len(writer) == 1 and best.ops[writer[0]].type == f16.AMP_CHECK
    assert all(flag in op.inputs for op in best.ops[best.meta["train"]["sample_ops"]:] if op.attrs.get("skip_if"))


@pytest.mark.parametrize("name, plan", [("digits_cnn_float", TrainPlan.full), ("digits_cnn_float", PLAN_LAST1),
                                        ("convnet_float", TrainPlan.full), ("dwsep_float", TrainPlan.full)])
def test_kernels_read_fp16_so_the_arena_is_below_fp32(name, plan):
    """The weight gradients, the activation masks and the max pool's gradient read the saved fp16 tensor themselves
    (planning/fp16_memory.fused_widen): no fp32 copy of a saved activation is planned for them, and the exact arena
    is below fp32's on the same plan. Measured (fp32 -> fp16-mixed): digits every layer 19,856 -> 18,960 B, digits
    classifier only (the example's `auto`) 12,400 -> 12,048 B, convnet 32,896 -> 30,304 B, dwsep 25,792 -> 23,456 B
    (dwsep: 23,696 B before its relu6 wrote its fp16 result itself, fp16_mixed.fp16_written; before the fused
    widening: 19,808, 12,976, 38,496 and 23,696 B, every saved activation widened into an fp32 temporary)."""
    from tinytrain.stages.planning.arena import counted_bytes, fused_dequantize

    fp32 = _train_graph(name, plan)
    tg = to_fp16_mixed(copy.deepcopy(fp32))
    fused = fused_dequantize(tg)
    sizes = counted_bytes(tg)
    for op in tg.ops:
        for k, t in enumerate(op.inputs):
            src = next((o for o in tg.ops if t in o.outputs and o.type == f16.CAST_F16_F32), None)
            if src is not None and ops.reads_fp16(op.type, k):
                assert fused[t] == src.inputs[0] and t not in sizes          # never materialised
                assert tg.tensors[src.inputs[0]].dtype == "float16"
    assert fused, "no widening was fused"
    assert plan_schedules(tg, True)[1].arena < plan_schedules(fp32, True)[1].arena


def test_an_overflowing_step_skips_the_real_backward():
    """check_first: the check pass decides the step; every op of the real backward (not only its updates) carries
    the flag, so on an overflowing step the C runs none of it, and the schedule runs none of it before the flag."""
    from tinytrain.stages.planning.schedule import dependencies

    tg = to_fp16_mixed(_train_graph("digits_cnn_float", TrainPlan.full), check_first=True)
    meta = tg.meta["train"]
    flag = meta["loss_scale"]["flag_tensor"]
    writer = next(i for i, op in enumerate(tg.ops) if flag in op.outputs)
    real = tg.ops[writer + 1:meta["sample_ops"]]
    assert real and all(op.attrs.get("skip_if") == flag for op in real)
    assert not any(op.attrs.get("skip_if") for op in tg.ops[:writer])      # the forward and the check pass run
    preds = dependencies(tg)
    assert all(writer in preds[i] for i in range(writer + 1, meta["sample_ops"]))


def test_batch_accumulation_keeps_one_check():
    tg = to_fp16_mixed(_train_graph("digits_cnn_float", TrainPlan.full, batch=2), check_first=True)
    assert tg.meta["train"]["loss_scale"]["check_first"] is False
    assert sum(op.type == f16.AMP_CHECK for op in tg.ops) == 1


def test_frozen_prefix_is_not_rounded():
    """Ops before the first trained layer get no rounding op: fp32 results, or fp16 ones their kernels write
    themselves (fp16_mixed.prefix_results); what the backward reads is stored as fp16."""
    tg = _train_graph("dwsep_float", lambda g: TrainPlan.last_k(g, 1))
    trained = set(tg.meta["train"]["trained"])
    n_fwd = tg.meta["train"]["phases"]["forward"]
    first = next(i for i, op in enumerate(tg.ops[:n_fwd]) if trained & set(op.inputs))
    frozen_outs = {t for op in tg.ops[:first] for t in op.outputs}
    back_reads = {t for op in tg.ops[n_fwd:] for t in op.inputs}
    out = to_fp16_mixed(tg)
    rounded = {op.inputs[0] for op in out.ops if op.type == f16.ROUND_F16}
    assert frozen_outs and not any(f"raw/{t}" in rounded for t in frozen_outs - back_reads)
    assert any(f"raw/{t}" in rounded or t in out.tensors and out.tensors[t].dtype == "float16"
               for t in {t for op in out.ops[first:n_fwd] for t in op.outputs})


CASES = [("digits_cnn_float", "full", "sgd", 1), ("digits_cnn_float", "bias", "adam", 1),
         ("dwsep_float", "full", "sgd", 1), ("dwsep_float", "last1", "adam", 1), ("residual_float", "full", "sgd", 2),
         ("convnet_float", "full", "sgd", 1), ("convnet_float", "bias", "sgd", 1), ("mlp_float", "last1", "sgd", 1)]
PLANS = {"full": TrainPlan.full, "bias": TrainPlan.bias_only, "last1": lambda g: TrainPlan.last_k(g, 1)}


@pytest.mark.parametrize("name, plan, opt, batch", CASES)
def test_estimate_tracks_the_exact_fp16_peak(name, plan, opt, batch):
    """sparse-plan's analytic estimate of fp16-mixed (2-byte saved activations, widening temporaries, the check's
    pass or the one-pass forms, the loss-scale scalars) against the exact planner on the fp16-mixed graph.
    Measured over 60 fixture / plan / optimizer / batch cases: 0.957 to 1.030 (fp32's: 0.98 to 1.04)."""
    g = read_model(FIX / f"{name}.tflite")
    st = MemorySettings(optimizer=opt, batch_size=batch, fp16_mixed=True)
    p = PLANS[plan](g)
    est = MemoryModel(g, st).estimate(p)["total"]
    exact = exact_peak(g, p, st, qas=False)["peak_bytes"]
    assert 0.93 <= est / exact <= 1.05, (est, exact)
    est32 = MemoryModel(g, MemorySettings(optimizer=opt, batch_size=batch)).estimate(p)["total"]
    assert est != est32   # the precision is seen
