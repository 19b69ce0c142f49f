"""planning/parallel.py's fork_map and what uses it outside the contribution analysis (ExactPeaks.prefetch): the
same results as computing in this process, and a clean fallback when a worker fails."""

from __future__ import annotations

import os
import time

import pytest

from tinytrain.stages.planning.memory_model import MemorySettings
from tinytrain.stages.planning.parallel import Background, fork_map, worker_count
from tinytrain.stages.planning.plan_exact import ExactPeaks, exact_peak
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

from test_sparse_plan import graph_of

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


@needs_fork
def test_fork_map_is_map_and_sees_the_parents_memory():
    table = {k: k * k for k in range(10)}          # a closure over parent state: fork hands it over unpickled
    got = fork_map(lambda k: table[k] + 1, list(range(10)), workers=2)
    assert got == [k * k + 1 for k in range(10)]


@needs_fork
def test_fork_map_gives_none_when_a_worker_fails():
    parent = os.getpid()

    def boom(k):
        if os.getpid() != parent:
            raise RuntimeError("in a worker")
        return k
    assert fork_map(boom, [1, 2, 3], workers=2) is None


@needs_fork
def test_background_computes_in_a_worker_and_falls_back_here(monkeypatch):
    parent = os.getpid()
    table = {"a": [1, 2, 3]}
    in_worker = worker_count() > 1                                    # one core: nothing to gain from a worker
    assert Background(lambda: (os.getpid() != parent, table["a"])).result() == (in_worker, [1, 2, 3])

    def boom():
        if os.getpid() != parent:
            raise RuntimeError("in a worker")
        return "here"
    # the worker path on any machine (one core would compute boom here at once): it fails there, computed here
    monkeypatch.setattr("tinytrain.stages.planning.parallel.worker_count", lambda: 2)
    assert Background(boom).result() == "here"
    # a caller that fails before asking: the `with` block stops the worker
    with pytest.raises(ValueError):
        with Background(lambda: time.sleep(0.2)) as bg:
            assert bg._pool is not None
            raise ValueError("the caller failed")
    assert bg._pool is None
    monkeypatch.setattr("tinytrain.stages.planning.parallel.worker_count", lambda: 1)
    assert Background(lambda: os.getpid()).result() == parent        # one core: computed at result()


@needs_fork
def test_background_nice_lowers_only_the_workers_priority(monkeypatch):
    """Background(fn, nice=n) (the runner's early layer chart): the worker yields the CPU; computed here (one core),
    this process keeps its priority."""
    base = os.nice(0)
    monkeypatch.setattr("tinytrain.stages.planning.parallel.worker_count", lambda: 2)
    assert Background(lambda: os.nice(0), nice=5).result() == min(base + 5, 19)
    monkeypatch.setattr("tinytrain.stages.planning.parallel.worker_count", lambda: 1)
    assert Background(lambda: os.nice(0), nice=5).result() == base
    assert os.nice(0) == base


@needs_fork
def test_prefetched_exact_peaks_equal_computed_ones():
    g = graph_of("digits_cnn_int8")
    ops = TrainPlan.trainable_ops(g)
    plans = [TrainPlan.bias_only(g, 1), TrainPlan.bias_only(g, 2),
             TrainPlan([LayerPlan(ops[-1], bias=True, weight_ratio=0.5)])]
    ex = ExactPeaks(g, MemorySettings())
    ex.prefetch(plans)
    for p in plans:
        want = exact_peak(g, p, MemorySettings())
        assert ex.known(p) == want and ex(p) == want


@needs_fork
def test_prefetched_peaks_bring_their_schedules_back(monkeypatch):
    """A worker's plan lands in this process' ScheduleMemo: the reorder stage's plan of the graph autodiff writes for
    a prefetched plan and settings (update_check's pricing) is a lookup, the same plan as planning afresh."""
    from tinytrain.stages import reorder
    from tinytrain.stages.planning.plan_exact import training_graph

    memo = reorder.ScheduleMemo()
    monkeypatch.setattr(reorder, "SCHEDULES", memo)
    g = graph_of("digits_cnn_int8")
    plan = TrainPlan.bias_only(g, 2)
    settings = [MemorySettings(rounding=r, master_copy=m) for r, m in (("nearest", False), ("nearest", True),
                                                                        ("stochastic", False))]
    price = ExactPeaks(g, MemorySettings()).pricing()
    price.many(g, plan, settings)
    for s in settings:
        assert price.peaks.known(plan, s) == exact_peak(g, plan, s)
        hits = reorder.SCHEDULES.hits
        tg = training_graph(g, plan, s)
        got = reorder.plan_schedules(tg, True)
        assert reorder.SCHEDULES.hits == hits + 1
        monkeypatch.setattr(reorder, "SCHEDULES", reorder.ScheduleMemo())     # planned afresh, here
        assert got[1].to_json() == reorder.plan_schedules(tg, True)[1].to_json()
        monkeypatch.setattr(reorder, "SCHEDULES", memo)


def test_a_rescaled_graph_has_the_same_peaks_and_schedules(monkeypatch):
    """The graph autodiff trains has sparse-plan's wider scales (stages/quant/rescale.py: other weight and bias
    values, other scales): no planner reads those, so its exact peak is the quantized graph's, memoised once, and the
    schedule planned for one is the reorder stage's lookup for the other."""
    from tinytrain.stages import reorder
    from tinytrain.stages.planning.plan_exact import training_graph
    from tinytrain.stages.quant import rescale

    monkeypatch.setattr(reorder, "SCHEDULES", reorder.ScheduleMemo())
    g = graph_of("digits_cnn_int8")
    plan = TrainPlan.last_k(g, 1)
    w = g.ops[plan.layers[0].layer].inputs[1]
    wide = rescale.apply(g, {"weights": {w: [2] * len(g.tensors[w].quant.scale)}})
    assert wide is not g and not (wide.tensors[w].data == g.tensors[w].data).all()
    ex = ExactPeaks(g, MemorySettings())
    assert ex.known(plan, graph=wide) is None
    plain = ex(plan)
    assert ex.known(plan, graph=wide) is plain and plain == exact_peak(wide, plan, MemorySettings())
    hits = reorder.SCHEDULES.hits
    reorder.plan_schedules(training_graph(wide, plan, MemorySettings()), True)
    assert reorder.SCHEDULES.hits == hits + 1


@needs_fork
def test_a_peak_computed_in_a_worker_is_adopted_with_its_schedule(monkeypatch):
    """ExactPeaks.job in a forked worker (sparse-plan runs it while the update check probes), `adopt` here: the same
    peak as computed here, and the reorder stage's plan a lookup."""
    from tinytrain.stages import reorder
    from tinytrain.stages.planning.plan_exact import training_graph

    monkeypatch.setattr(reorder, "SCHEDULES", reorder.ScheduleMemo())
    g = graph_of("digits_cnn_int8")
    plan = TrainPlan.bias_only(g, 2)
    ex = ExactPeaks(g, MemorySettings())
    job = ex.job(plan)
    with Background(job) as bg:
        got = bg.result()
    assert got[2] is not None              # the worker planned it: its schedule comes along
    ex.adopt(got)
    assert ex.known(plan) == exact_peak(g, plan, MemorySettings())
    hits = reorder.SCHEDULES.hits
    reorder.plan_schedules(training_graph(g, plan, MemorySettings()), True)
    assert reorder.SCHEDULES.hits == hits + 1
    assert ex.job(plan)()[2] is None       # known here: nothing planned again, nothing to hand back
