"""Checks the fp16-mixed graph tests share: the arena the fp16 graph plans against its fp32 reference, and
sparse-plan's analytic estimate against the exact peak of the same plan."""

from __future__ import annotations


def estimate_over_exact(g, plan) -> float:
    """sparse-plan's fp16-mixed estimate of `plan` on float graph `g` over its exact peak (sgd, batch 1)."""
    from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
    from tinytrain.stages.planning.plan_exact import exact_peak

    st = MemorySettings(optimizer="sgd", batch_size=1, fp16_mixed=True)
    est = MemoryModel(g, st).estimate(plan)["total"]
    exact = exact_peak(g, plan, st, qas=False)["peak_bytes"]
    return est / exact


def fp16_arena_falls(g16, ref) -> None:
    """The fp16-mixed training graph plans a smaller arena than its fp32 reference."""
    from tinytrain.stages.reorder import plan_schedules

    _, p16, _, _ = plan_schedules(g16, True)
    _, p32, _, _ = plan_schedules(ref, True)
    assert p16.arena < p32.arena, (p16.arena, p32.arena)
