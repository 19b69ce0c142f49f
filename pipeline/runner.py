"""Build a spec: doit walks the stage DAG; each stage is restored from the cache or run.

Per stage (DESIGN §2, §4):
  1. preimage from the stage's config slice and the content digests of its upstream artifacts
     (known now: upstream tasks have finished) -> key;
  2. doit's `uptodate` is the action-cache lookup: on a hit the entry is materialised under
     `<out_dir>/<name>/<stage>/` and the stage function is not called;
  3. on a miss the stage function runs in a fresh temp folder; only if it returns normally are
     its files stored (blobs, then the entry) and materialised. A failure or a kill leaves no
     entry and no stage folder: the old folder is removed before the run, the new one appears
     whole by a rename.
A stage without an implementation stops the build with StageNotImplemented (exit code 1: the spec
is fine, the tool cannot do it yet; `--until` builds the stages before it).
Builds of one spec are serialised by a lock on its build folder (see workspace.build_lock).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from tinytrain.cache.fs_ops import atomic_write_bytes
from tinytrain.cache.store import ActionEntry, Cache, CacheError
from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.contract import StageContext, StageResult
from tinytrain.pipeline.doit_driver import run_tasks
from tinytrain.pipeline.errors import StageFailed, TinytrainError, UserError
from tinytrain.pipeline.planner import (CACHED, NOT_IMPLEMENTED, find_stage, in_order, plan,
                                        preimage_and_key, remember, with_ancestors)
from tinytrain.pipeline.preimage import config_slice
from tinytrain.pipeline.spec import Spec
from tinytrain.pipeline.stage_graph import StageDef
from tinytrain.pipeline.workspace import build_dir, build_lock, stage_dir
from tinytrain.stages.planning.parallel import Background


class StageNotImplemented(StageFailed):
    """The build reached a stage that is registered but has no implementation yet (exit code 1)."""


@dataclass
class StageOutcome:
    stage: str
    # ran | cached | failed | not implemented | will run (dry run)
    state: str
    key: str | None = None
    duration_s: float = 0.0
    summary: str = ""
    metrics: dict = field(default_factory=dict)
    reason: str = ""
    out_dir: str | None = None
    # CPU seconds of the run (this process and the children it waited for: compilers, QEMU, workers). On a shared
    # machine wall time grows with the others' load; CPU time mostly does not, so benchmarks report both.
    cpu_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "state": self.state, "key": self.key, "duration_s": round(self.duration_s, 4),
                "cpu_s": round(self.cpu_s, 4), "summary": self.summary, "metrics": self.metrics, "reason": self.reason,
                "out_dir": self.out_dir}


@dataclass
class BuildResult:
    name: str
    spec_path: str | None
    out_dir: str
    outcomes: list[StageOutcome]
    duration_s: float
    dry_run: bool = False
    cache: dict = field(default_factory=dict)
    error: TinytrainError | None = None

    @property
    def exit_code(self) -> int:
        return self.error.exit_code if self.error is not None else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "spec": self.spec_path, "out_dir": self.out_dir, "ok": self.error is None,
            "exit_code": self.exit_code, "dry_run": self.dry_run,
            "error": str(self.error) if self.error is not None else None,
            "duration_s": round(self.duration_s, 4),
            "ran": [o.stage for o in self.outcomes if o.state == "ran"],
            "cached": [o.stage for o in self.outcomes if o.state == CACHED],
            "stages": [o.to_json() for o in self.outcomes],
            "cache": self.cache,
        }


@dataclass(frozen=True)
class Selection:
    run: tuple[str, ...]        # stages to build (restore or run)
    restore_only: tuple[str, ...]  # upstream of --only: must come from the cache


def select(stages: Sequence[StageDef], until: str | None = None, only: str | None = None,
           force: Sequence[str] = ()) -> Selection:
    if until and only:
        raise UserError("--until and --only cannot be combined")
    for name in force:
        find_stage(name, stages)
    if only:
        st = find_stage(only, stages)
        run, restore = {st.name}, with_ancestors(st.deps, stages)
    elif until:
        run, restore = with_ancestors([find_stage(until, stages).name], stages), set()
    else:
        run, restore = {s.name for s in stages}, set()
    stray = [f for f in force if f not in run]
    if stray:
        raise UserError(f"--force {stray[0]}: that stage is not part of this build")
    return Selection(tuple(s.name for s in in_order(run, stages)), tuple(s.name for s in in_order(restore, stages)))


def build(spec: Spec, cache: Cache, log: BuildLog, *, until: str | None = None, only: str | None = None,
          force: Sequence[str] = (), dry_run: bool = False, stages: Sequence[StageDef] | None = None,
          stage_stdout: Any = None) -> BuildResult:
    stages = tuple(stages if stages is not None else stage_graph.STAGES)
    sel = select(stages, until, only, force)
    t0 = time.perf_counter()
    drawn = False
    result = BuildResult(spec.name, str(spec.source) if spec.source else None, str(build_dir(spec)), [], 0.0,
                         dry_run=dry_run)
    if dry_run:
        result.outcomes = _dry_run(spec, cache, stages, sel, force, log)
    else:
        with build_lock(spec):
            log.detail(f"cache folder {cache.root}; artifacts in {build_dir(spec)}")
            cache.begin_build()
            run = _Run(spec, cache, log, stages, sel, frozenset(force), stage_stdout)
            try:
                result.outcomes, result.error = run.execute()
            finally:
                drawn = run.early_picture.wait()
                if run.early_picture.error:
                    log.warning(f"warning: could not draw the per-layer memory chart: {run.early_picture.error}; "
                                "the report goes without it")
        result.cache = cache.build_summary()
    result.duration_s = time.perf_counter() - t0
    if not dry_run:
        _write_record_and_report(result, log, layers_drawn=drawn)
    return result


def _write_record_and_report(result: BuildResult, log: BuildLog, layers_drawn: bool = False) -> None:
    """build/<name>/build.json (what ran, what was restored, the cache counters) and report.md: the final
    summary reads only artifacts, and this record is the artifact for the build itself. Never fails the
    build: a report that cannot be written is a warning. `layers_drawn`: the per-layer chart is drawn already, or
    could not be (_EarlyPicture)."""
    import json

    from tinytrain.pipeline.report import BUILD_RECORD, write_report

    folder = Path(result.out_dir)
    try:
        # not durable, like the report: every build writes its own record (fs_ops.atomic_write_bytes)
        atomic_write_bytes(folder / BUILD_RECORD,
                           (json.dumps(result.to_json(), indent=1, sort_keys=True, default=str) + "\n").encode(),
                           durable=False)
        write_report(folder, layers_picture=not layers_drawn)
    except Exception as e:  # noqa: BLE001 - the build's own outcome matters more than its report
        log.warning(f"warning: could not write the build report in {folder}: {type(e).__name__}: {e}")


def _dry_run(spec: Spec, cache: Cache, stages: Sequence[StageDef], sel: Selection, force: Sequence[str],
             log: BuildLog) -> list[StageOutcome]:
    outcomes = []
    for item in plan(spec, cache, stages, wanted=sel.run, force=force):
        if item.stage.name not in sel.run:
            continue
        name = item.stage.name
        summary = item.entry.summary if item.entry else ""
        outcomes.append(StageOutcome(name, item.state, item.key, summary=summary, reason=item.reason))
        if item.state == CACHED and item.key:
            log.cached(name, item.key, summary)
        else:
            log.line(f"[{name}] {'would run' if item.state != NOT_IMPLEMENTED else item.state}"
                     + (f" — {item.reason}" if item.reason and item.state != NOT_IMPLEMENTED else ""))
    return outcomes


class _Run:
    """One build's state while doit drives it: entries and artifact paths of finished stages."""

    def __init__(self, spec: Spec, cache: Cache, log: BuildLog, stages: Sequence[StageDef], sel: Selection,
                 force: frozenset[str], stage_stdout: Any):
        self.spec, self.cache, self.log, self.sel, self.force = spec, cache, log, sel, force
        self.stages = {s.name: s for s in stages}
        self.stage_stdout = stage_stdout
        self.entries: dict[str, ActionEntry] = {}
        self.paths: dict[str, dict[str, Path]] = {}
        self.keys: dict[str, tuple[dict, str]] = {}
        self.outcomes: list[StageOutcome] = []
        self.error: TinytrainError | None = None
        self.early_picture = _EarlyPicture(build_dir(spec), set(sel.run) | set(sel.restore_only))
        self.prewarms: dict[str, Any] | None = None   # started when the first stage runs (_start_prewarms)

    def execute(self) -> tuple[list[StageOutcome], TinytrainError | None]:
        names = [n for n in self.stages if n in self.sel.run or n in self.sel.restore_only]
        tasks = [{
            "name": n,
            "actions": [(self._act, [n])],
            "uptodate": [(self._uptodate, [n])],
            "task_dep": [d for d in self.stages[n].deps if d in names],
            "verbosity": 2,
        } for n in names]
        try:
            code, messages = run_tasks(tasks, list(self.sel.run))
        finally:
            for name in list(self.prewarms or {}):
                self._stop_prewarm(name)
        if self.error is None and code != 0:
            self.error = StageFailed("the build engine (doit) failed: " + " | ".join(m.strip() for m in messages))
        return self.outcomes, self.error

    # ---- doit callbacks: they never raise, doit would print a traceback ----------------------
    def _uptodate(self, name: str) -> bool:
        self._stop_prewarm(name)   # the stage's turn: restored or run, its head start ends here
        try:
            return self._restore(name)
        except TinytrainError as e:
            self.error = e
        except Exception as e:  # noqa: BLE001 - reported as a failed build, with the cause chained
            self.error = _wrap(name, e)
        return False

    def _act(self, name: str) -> bool:
        # self.error may already be set by this stage's own uptodate (e.g. its key could not be made).
        if self.error is None:
            try:
                self._run(name)
                return True
            except TinytrainError as e:
                self.error = e
            except Exception as e:  # noqa: BLE001
                self.error = _wrap(name, e)
        state = NOT_IMPLEMENTED if isinstance(self.error, StageNotImplemented) else "failed"
        self.outcomes.append(StageOutcome(name, state, reason=str(self.error)))
        if state == NOT_IMPLEMENTED:
            self.log.line(f"[{name}] not implemented yet")
        else:
            self.log.failed(name, str(self.error))
        return False

    # ---- the two paths ----------------------------------------------------------------------
    def _restore(self, name: str) -> bool:
        st = self.stages[name]
        if st.impl is None:
            return False
        pre, key = preimage_and_key(st, self.spec, self.entries)
        self.keys[name] = (pre, key)
        if name in self.force:
            return False
        t0 = time.perf_counter()
        entry = self.cache.lookup(key)
        if entry is None:
            self.log.detail(f"[{name}] key {key}: not in the cache")
            return False
        try:
            self._materialize(name, entry, pre)
        except CacheError as e:
            # The cache dropped the entry (restoring is total or nothing): run the stage instead.
            self.log.line(f"[{name}] {e.message}; running it", style="yellow")
            return False
        self.cache.note_hit(key)
        if name in self.sel.run:
            self.outcomes.append(StageOutcome(name, CACHED, key, 0.0, entry.summary, entry.metrics,
                                              out_dir=str(stage_dir(self.spec, name))))
            self.log.cached(name, key, entry.summary, restore_s=time.perf_counter() - t0)
        return True

    def _run(self, name: str) -> None:
        st = self.stages[name]
        if name in self.sel.restore_only:
            raise UserError(f"--only {self.sel.run[0]} needs the artifacts of {name}, which are not cached "
                            f"for this spec", hint=f"build them first: tinytrain build SPEC --until {name}")
        if st.impl is None:
            raise StageNotImplemented(f"stage {name} is not implemented yet",
                                      hint=_until_hint(st, self.stages))
        pre, key = self.keys[name]
        fn = load_stage_function(st)
        self._start_prewarms(name)
        dest = stage_dir(self.spec, name)
        # Artifacts of an older config must not survive a failed rerun looking current.
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=f"tinytrain-{name}-") as tmp:
            out = Path(tmp) / "out"
            out.mkdir()
            ctx = StageContext(config=config_slice(self.spec, st.config), inputs=self._inputs(st), out_dir=out,
                               progress=partial(self.log.progress, name),
                               unit_cache_dir=self.cache.units_dir / name, refresh_units=name in self.force)
            self.log.started(name)
            t0, c0 = time.perf_counter(), _cpu_seconds()
            try:
                with _stdout_to(self.stage_stdout):
                    result = fn(ctx)
            finally:
                self.log.finished()
            duration, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
            if not isinstance(result, StageResult):
                raise StageFailed(f"stage {name} returned {type(result).__name__}, not a StageResult")
            entry = self.cache.store(key, pre, out, result.summary, result.metrics, duration)
        self._materialize(name, entry, pre)
        self.cache.note_miss(key)
        self.outcomes.append(StageOutcome(name, "ran", key, duration, entry.summary, entry.metrics,
                                          out_dir=str(dest), cpu_s=cpu))
        self.log.ran(name, duration, entry.summary, key=key)

    def _start_prewarms(self, running: str) -> None:
        """When the first stage runs (a no-op build starts nothing): each stage selected after it whose module has
        a `prewarm(config, unit_cache_dir)` (cross-compile: the kernel library's objects) starts its head start in
        the background, on a core the build leaves idle; it ends when that stage's turn comes. A head start is
        only ever a copy of the stage's own work (its unit cache), so it changes no result."""
        if self.prewarms is not None:
            return
        self.prewarms = {}
        later = self.sel.run[self.sel.run.index(running) + 1:] if running in self.sel.run else ()
        for name in later:
            st = self.stages[name]
            try:
                hook = getattr(importlib.import_module(st.impl), "prewarm", None) if st.impl else None
                started = hook(config_slice(self.spec, st.config), self.cache.units_dir / name) if hook else None
            except Exception:   # noqa: BLE001 -- only the head start is lost; the stage itself reports problems
                started = None
            if started is not None:
                self.prewarms[name] = started

    def _stop_prewarm(self, name: str) -> None:
        started = (self.prewarms or {}).pop(name, None)
        if started is not None:
            started.stop()

    def _materialize(self, name: str, entry: ActionEntry, pre: dict) -> None:
        self.paths[name] = self.cache.materialize(entry, stage_dir(self.spec, name))
        self.entries[name] = entry
        remember(self.cache, self.spec, name, pre)
        self.early_picture.stage_done(name)

    def _inputs(self, st: StageDef) -> dict[str, Path]:
        return {f"{dep}/{n}": p for dep in st.deps for n, p in self.paths[dep].items() if st.reads_artifact(dep, n)}


class _EarlyPicture:
    """The report's per-layer chart (report.write_layers_picture, ~1 s of matplotlib on MobileNetV2) reads only the
    artifacts of report.LAYERS_PICTURE_STAGES: once those are built, a forked process (parallel.Background, niced:
    it yields the CPU to the stage it runs beside, QEMU, whose run is the build's critical path) draws it while the
    stages after them run (emulate-run waits on QEMU, one core, most of its time), instead of after the build. A
    process, not a thread: matplotlib's rc settings are global, and a stage drawing its own picture at the same time
    must not see them change. The end of the build waits for it (Background draws it then where it could not fork,
    or once more when the forked draw failed); when that failed too, the chart is not drawn a third time: `error`
    says why, the build warns and the report goes without it."""

    def __init__(self, folder: Path, selected: set[str]):
        from tinytrain.pipeline.report import LAYERS_PICTURE_STAGES

        self.folder = folder
        self.waiting = set(LAYERS_PICTURE_STAGES)
        # only where a stage still runs after the chart's inputs (otherwise the report at the end is as early)
        self.wanted = self.waiting <= selected and bool(selected - self.waiting)
        self.proc: Background | None = None    # the process drawing it, once started
        self.error: str | None = None          # why the chart could not be drawn (after wait)

    def stage_done(self, name: str) -> None:
        self.waiting.discard(name)
        if self.wanted and not self.waiting and self.proc is None:
            from tinytrain.pipeline.report import write_layers_picture

            self.proc = Background(partial(write_layers_picture, self.folder), nice=10)

    def wait(self) -> bool:
        """True when the report need not draw the chart: it was drawn here, or drawing it failed twice (forked, then
        in this process; `error` says why, and a chart of an earlier build is removed rather than shown)."""
        if self.proc is None:
            return False
        with self.proc:
            try:
                self.proc.result()
            except Exception as e:  # noqa: BLE001 -- a chart is not worth a failed build, nor a third try
                from tinytrain.pipeline.report import LAYERS_STEM

                self.error = f"{type(e).__name__}: {e}"
                for ext in (".svg", ".png"):
                    with contextlib.suppress(OSError):
                        (self.folder / LAYERS_STEM).with_suffix(ext).unlink(missing_ok=True)
        return True


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load_stage_function(st: StageDef) -> Callable[[StageContext], StageResult]:
    try:
        module = importlib.import_module(st.impl or "")
    except ImportError as e:
        raise StageFailed(f"stage {st.name}: cannot import {st.impl}: {e}") from e
    fn = getattr(module, "run", None)
    if not callable(fn):
        raise StageFailed(f"stage {st.name}: module {st.impl} has no run(ctx) function")
    return fn


# A stage that runs out of disk or hits a read-only folder while writing its outputs meets the environment, not a
# bug: one line naming the folder (exit 2), like the cache's own DiskFullError.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC: "no space left on the device of", errno.EDQUOT: "disk quota exceeded on",
                       errno.EROFS: "read-only file system at"}


def _wrap(name: str, e: BaseException) -> TinytrainError:
    if isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS:
        where = Path(e.filename).parent if e.filename else Path(tempfile.gettempdir())
        err = UserError(f"{_ENVIRONMENT_ERRNOS[e.errno]} {where} (stage {name}, writing its outputs)",
                        hint="free some space, or point TMPDIR at a larger disk")
        err.__cause__ = e
        return err
    err = StageFailed(f"stage {name} failed: {type(e).__name__}: {e}",
                      hint="set TINYTRAIN_DEBUG=1 to see the traceback")
    err.__cause__ = e
    err.traceback = "".join(traceback.format_exception(e))  # type: ignore[attr-defined]
    return err


def _until_hint(st: StageDef, stages: dict[str, StageDef]) -> str:
    ready = [n for n, s in stages.items() if s.impl is not None and n in with_ancestors(st.deps, list(stages.values()))]
    last = ready[-1] if ready else None
    return f"build the stages before it with --until {last}" if last else "no stage before it is implemented"


@contextlib.contextmanager
def _stdout_to(stream: Any):
    # With --json, stdout carries one JSON document: a stage's stray prints go to stderr instead.
    if stream is None:
        yield
        return
    with contextlib.redirect_stdout(stream):
        yield


__all__ = ["BuildResult", "StageOutcome", "StageNotImplemented", "build", "select", "load_stage_function"]
