"""The exact training peak of a plan: autodiff's training graph planned by the reorder stage's own planner.

sparse-plan decides `fits` on it, `auto` verifies its search's choice with it (auto_plan.verified_auto), and
update_check prices its rounding / master-copy choice with it.
"""

from __future__ import annotations

from typing import Any, Callable

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
    """exact_peak memoised per (graph, plan, memory settings, QAS on), for everything sparse-plan asks: the auto
    verification, update_check's pricing of a rounding / master-copy choice (`pricing()`), the final report. The
    settings, QAS switch and graph given here are a call's defaults. Graphs are told apart by reorder's ScheduleMemo
    key (structure and constants, not the values of weights and biases): the graph autodiff trains, with the wider
    scales sparse-plan chose (stages/quant/rescale.py), is the same one here, as it is to the reorder stage.

    Computed elsewhere (`prefetch`: side by side on every core; `job` / `adopt`: in a worker of the caller's), a peak
    comes back with the schedule planned for it into reorder's ScheduleMemo, so that the reorder stage's plan of the
    graph autodiff writes stays a lookup (planning/parallel.py: a deterministic function of its arguments, so the
    same numbers wherever it ran)."""

    def __init__(self, graph: Graph, settings: MemorySettings, qas: bool = True):
        self.graph, self.settings, self.qas = graph, settings, qas
        self._memo: dict[tuple[str, str, str, bool], dict[str, Any]] = {}
        self._fingerprints: dict[int, tuple[Graph, str]] = {}   # id -> (the graph, kept alive; its key)

    def _job(self, plan: TrainPlan, settings: MemorySettings | None, qas: bool | None,
             graph: Graph | None) -> tuple[Graph, TrainPlan, MemorySettings, bool]:
        return (self.graph if graph is None else graph, plan, self.settings if settings is None else settings,
                self.qas if qas is None else bool(qas))

    def _key(self, job: tuple[Graph, TrainPlan, MemorySettings, bool]) -> tuple[str, str, str, bool]:
        from tinytrain.stages.reorder import SCHEDULES

        graph, plan, settings, qas = job
        fp = self._fingerprints.get(id(graph))
        if fp is None or fp[0] is not graph:
            fp = self._fingerprints[id(graph)] = (graph, SCHEDULES.key(graph))
        return fp[1], plan.dumps(), repr(settings), qas

    def __call__(self, plan: TrainPlan, settings: MemorySettings | None = None, qas: bool | None = None,
                 graph: Graph | None = None) -> dict[str, Any]:
        job = self._job(plan, settings, qas, graph)
        key = self._key(job)
        if key not in self._memo:
            try:
                self._memo[key] = exact_peak(*job)
            except (UserError, NotImplementedError) as e:
                raise ExactUnavailable(_one_line(e)) from e
        return self._memo[key]

    def known(self, plan: TrainPlan, settings: MemorySettings | None = None, qas: bool | None = None,
              graph: Graph | None = None) -> dict[str, Any] | None:
        """The peak when computed already, else None (nothing is computed)."""
        return self._memo.get(self._key(self._job(plan, settings, qas, graph)))

    def job(self, plan: TrainPlan, settings: MemorySettings | None = None, qas: bool | None = None,
            graph: Graph | None = None) -> Callable[[], tuple]:
        """self(plan, ...) as a function for a forked worker (planning/parallel.py); hand what it returns to `adopt`
        in this process. A failure there is left to __call__, which reports it."""
        job = self._job(plan, settings, qas, graph)
        key = self._key(job)
        return lambda: self._computed(key, job)

    def _computed(self, key: tuple, job: tuple) -> tuple:
        """(key, peak or None when autodiff refuses, the ScheduleMemo entry planned for it or None when known)."""
        from tinytrain.stages.reorder import SCHEDULES

        if key in self._memo:
            return key, self._memo[key], None    # its schedule is in the caller's ScheduleMemo already
        try:
            peak = exact_peak(*job)
        except (UserError, NotImplementedError):
            return key, None, None
        return key, peak, SCHEDULES.latest()

    def adopt(self, computed: tuple) -> None:
        """Take in what a `job` (or prefetch's worker) computed: the peak, and its schedule into ScheduleMemo."""
        from tinytrain.stages.reorder import SCHEDULES

        key, peak, schedule = computed
        if peak is not None:
            self._memo[key] = peak
        if schedule is not None:
            SCHEDULES.adopt(*schedule)

    def prefetch(self, plans: list[TrainPlan], settings: list[MemorySettings] | None = None, qas: bool | None = None,
                 graph: Graph | None = None) -> None:
        """Compute the peaks of every plan in `plans` with every one of `settings` (default: this object's) that
        are not known yet, side by side on every core."""
        from tinytrain.stages.planning.parallel import fork_map

        todo: dict[tuple, tuple] = {}
        for p in plans:
            for s in settings or [None]:
                job = self._job(p, s, qas, graph)
                key = self._key(job)
                if key not in self._memo:
                    todo.setdefault(key, job)
        if len(todo) < 2:
            return
        jobs = list(todo.items())     # the workers get them by fork; only an index crosses (a graph is large)
        for got in fork_map(lambda i: self._computed(*jobs[i]), range(len(jobs))) or []:
            self.adopt(got)

    def pricing(self) -> "Pricing":
        """update_check's `exact_peak`: (graph, plan, settings, qas) -> the peak, from this memo."""
        return Pricing(self)


class Pricing:
    """The calling convention update_check prices its choice with (stages/quant/update_check.peaks): exact_peak(graph,
    plan, settings, qas), raising autodiff's own error (which it answers with the estimate), and `many` to compute
    several settings side by side. Both are the ExactPeaks it wraps."""

    def __init__(self, peaks: ExactPeaks):
        self.peaks = peaks

    def __call__(self, graph: Graph, plan: TrainPlan, settings: MemorySettings, qas: bool = True) -> dict[str, Any]:
        try:
            return self.peaks(plan, settings, qas, graph)
        except ExactUnavailable as e:
            raise e.__cause__ from None     # the UserError / NotImplementedError update_check catches

    def many(self, graph: Graph, plan: TrainPlan, settings: list[MemorySettings], qas: bool = True) -> None:
        self.peaks.prefetch([plan], settings, qas, graph)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__
