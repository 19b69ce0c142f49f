"""The exact training peak of a plan: autodiff's training graph planned by the reorder stage's own planner.

sparse-plan decides `fits` on it, `auto` verifies its search's choice with it (auto_plan.verified_auto), and
update_check prices its rounding / master-copy choice with it.
"""

from __future__ import annotations

from typing import Any

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.memory_model import MemorySettings
from tinytrain.stages.planning.train_plan import TrainPlan


def exact_peak(graph: Graph, plan: TrainPlan, settings: MemorySettings, qas: bool = True) -> dict[str, Any]:
    """The peak the `reorder` stage will report for `plan` (plus the partially trained weights codegen keeps whole
    outside the arena, planning/statics.kept_whole; `arena_bytes`: the arena alone): autodiff's training graph with the build's loss,
    optimizer, batch size and QAS settings, planned by reorder's own planner (plan_schedules, with
    train.reorder.enabled). Deterministic, and cheap next to the search (MobileNetV2: well under a second)."""
    from tinytrain.stages.reorder import plan_schedules
    from tinytrain.stages.planning import statics
    tg = training_graph(graph, plan, settings, qas)
    chosen, best, plain, _ = plan_schedules(tg, settings.reorder)
    # a partially trained weight codegen keeps whole outside the arena depends on the plan: its peak counts it
    whole = statics.kept_whole(tg)
    extra = statics.total(whole)
    return {"peak_bytes": int(best.arena) + extra, "lower_bound_bytes": int(best.lower_bound) + extra,
            "plain_peak_bytes": int(plain.arena) + extra, "schedule": chosen, "reorder": settings.reorder,
            "arena_bytes": int(best.arena), "kept_whole": whole}


def training_graph(graph: Graph, plan: TrainPlan, settings: MemorySettings, qas: bool = True) -> Graph:
    """autodiff's training graph of `plan` with the build's loss, optimizer, batch size and QAS settings."""
    from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
    tg = build_training_graph(graph, plan, list(settings.heads) or settings.loss,
                              OptimizerSpec(kind=settings.optimizer), settings.batch_size,
                              QASOptions(qas, settings.rounding, settings.master_copy))
    if settings.fp16_mixed:
        from tinytrain.stages.train.fp16_mixed import to_fp16_mixed
        tg = to_fp16_mixed(tg, reorder=settings.reorder)   # the loss-scale policy does not change memory
    return tg


class ExactUnavailable(Exception):
    """autodiff cannot build the training graph of this model or plan (a UserError or NotImplementedError of its
    own, which its stage will report); kept apart from the stage's own PlanErrors, which are UserErrors too."""


class ExactPeaks:
    """exact_peak per plan, memoised (the auto verification and the final report ask for the same plans)."""

    def __init__(self, graph: Graph, settings: MemorySettings, qas: bool = True):
        self.graph, self.settings, self.qas = graph, settings, qas
        self._memo: dict[str, dict[str, Any]] = {}

    def __call__(self, plan: TrainPlan) -> dict[str, Any]:
        key = plan.dumps()
        if key not in self._memo:
            try:
                self._memo[key] = exact_peak(self.graph, plan, self.settings, self.qas)
            except (UserError, NotImplementedError) as e:
                raise ExactUnavailable(_one_line(e)) from e
        return self._memo[key]


    def prefetch(self, plans: list[TrainPlan]) -> None:
        """Compute the exact peaks of `plans` not known yet side by side on every core (planning/parallel.py: a
        deterministic function of the plan, so the same numbers); anything that fails there is left to __call__."""
        from tinytrain.stages.planning.parallel import fork_map

        todo = list({p.dumps(): p for p in plans if p.dumps() not in self._memo}.values())
        if len(todo) < 2:
            return
        got = fork_map(self._peak_or_none, todo)
        for plan, res in zip(todo, got or []):
            if res is not None:
                self._memo[plan.dumps()] = res

    def _peak_or_none(self, plan: TrainPlan) -> dict[str, Any] | None:
        try:
            return exact_peak(self.graph, plan, self.settings, self.qas)
        except (UserError, NotImplementedError):
            return None


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__

