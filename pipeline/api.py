"""The Python API: what `tinytrain build / inspect` do, for notebooks and scripts.

    import tinytrain
    result = tinytrain.build("tinytrain.yaml", **{"train.learning_rate": 0.02})
    result.metrics["accuracy_after_pct"], result.stages["emulate-run"].state, result.artifact("emulate-run", "run.json")

Overrides change the spec before it is validated, exactly as if the file said so:
  - a keyword is a spec path: `"train.learning_rate"` (dotted; pass it with `**{...}`), or a top-level
    section (`train`, `build`, `name`, ...);
  - a dict value is merged into the section it names (`train={"epochs": 1}` changes only the epochs),
    any other value replaces what is there;
  - relative paths resolve against the spec file's folder (the current folder for a spec given as a dict).
Build options are keyword-only and never spec keys: until, only, force, cache_dir, dry_run, log.

Errors raise the CLI's exceptions (tinytrain.pipeline.errors) instead of exiting: UserError (a bad spec is a
SpecError, a bad model a ModelError) for what the user can fix, StageFailed when a stage fails. A failed
build's exception carries what was built so far as `.build_result`.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from pydantic import ValidationError

from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.spec import Spec
from tinytrain.pipeline.spec import load_spec as _load_spec_file

DEFAULT_NAME = "tinytrain"


# ---- results ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageInfo:
    name: str
    # ran | cached | failed | not implemented | will run (dry run)
    state: str
    summary: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    duration_s: float = 0.0
    # The stage's artifact folder and its files (name relative to the folder -> path); empty if not built.
    folder: Path | None = None
    artifacts: dict[str, Path] = field(default_factory=dict)
    cpu_s: float = 0.0                 # CPU seconds of a run, children included (0 when cached)


@dataclass(frozen=True)
class BuildResult:
    name: str
    spec: Spec
    out_dir: Path                      # <out_dir>/<name>/
    stages: dict[str, StageInfo]       # in build order
    metrics: dict[str, Any]            # headline figures (see HEADLINE), only those the build produced
    duration_s: float
    ok: bool
    report: Path | None                # report.md, when written

    @property
    def ran(self) -> list[str]:
        return [n for n, s in self.stages.items() if s.state == "ran"]

    @property
    def cached(self) -> list[str]:
        return [n for n, s in self.stages.items() if s.state == "cached"]

    def artifact(self, stage: str, name: str) -> Path:
        info = self.stages.get(stage)
        if info is None or name not in info.artifacts:
            from tinytrain.pipeline.errors import UserError

            have = ", ".join(sorted(info.artifacts)) if info else "the stage was not part of this build"
            raise UserError(f"stage {stage} has no artifact {name!r} in this build", hint=f"it has: {have}")
        return info.artifacts[name]


# headline metric -> (stage, metric of that stage, scale)
HEADLINE: dict[str, tuple[str, str, float]] = {
    "float_accuracy_pct": ("quantize", "acc_float", 100.0),
    "int8_accuracy_pct": ("quantize", "acc_int8", 100.0),
    "accuracy_before_pct": ("emulate-run", "acc_before_pct", 1.0),
    "accuracy_after_pct": ("emulate-run", "acc_after_pct", 1.0),
    "mse_before": ("emulate-run", "mse_before", 1.0),
    "mse_after": ("emulate-run", "mse_after", 1.0),
    "planned_peak_bytes": ("reorder", "peak_bytes", 1.0),
    "peak_sram_bytes": ("cross-compile", "sram_used", 1.0),
    "flash_bytes": ("cross-compile", "flash_used", 1.0),
    "instructions_per_step": ("emulate-run", "instructions_per_step", 1.0),
    "ms_per_step": ("emulate-run", "ms_per_step", 1.0),
}


# ---- the three functions --------------------------------------------------------------------------

def load_spec(source: Any, /, **overrides: Any) -> Spec:
    """A validated Spec from a YAML path, a dict (the YAML's content) or a Spec, with `overrides` applied."""
    if isinstance(source, Spec):
        if not overrides:
            return source
        base = source.source.parent if source.source else Path.cwd()
        return _validate(_plain(source), base, source.source, overrides)
    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
        data.setdefault("name", DEFAULT_NAME)
        return _validate(data, Path.cwd(), None, overrides)
    if isinstance(source, (str, Path)):
        path = Path(source)
        spec = _load_spec_file(path)  # every check of the file, with its line numbers
        if not overrides:
            return spec
        from tinytrain.pipeline.yaml_source import load_yaml

        data = dict(load_yaml(path.read_text(encoding="utf-8"), str(path)).data)
        data.setdefault("name", spec.name)
        return _validate(data, path.resolve().parent, path.resolve(), overrides)
    raise SpecError(f"a spec is a path to a YAML file, a dict or a Spec, not a {type(source).__name__}")


def build(spec: Any, /, *, until: str | None = None, only: str | None = None, force: Sequence[str] | str = (),
          cache_dir: str | Path | None = None, dry_run: bool = False, log: bool | TextIO = False,
          **overrides: Any) -> BuildResult:
    """Build `spec` (see load_spec) like `tinytrain build`; returns what ran, what was cached, metrics and paths.

    log: False prints nothing but warnings (on stderr); True prints the build log to stdout; a stream gets it."""
    from tinytrain.pipeline.console import NORMAL, QUIET, BuildLog
    from tinytrain.pipeline.runner import build as run_build
    from tinytrain.pipeline.workspace import open_cache

    spec = load_spec(spec, **overrides)
    cache = open_cache(spec, cache_dir)
    if log is False:
        build_log = BuildLog(sys.stderr, verbosity=QUIET)
    else:
        build_log = BuildLog(sys.stdout if log is True else log, verbosity=NORMAL)
    force = (force,) if isinstance(force, str) else tuple(force)
    raw = run_build(spec, cache, build_log, until=until, only=only, force=force, dry_run=dry_run)
    result = _result(spec, raw)
    if raw.error is not None:
        raw.error.build_result = result  # type: ignore[attr-defined]
        raise raw.error
    return result


@dataclass(frozen=True)
class StageView:
    """A built stage's artifacts, restored from the cache when needed (like `tinytrain inspect`)."""

    stage: str
    folder: Path
    artifacts: dict[str, Path]
    # Set when the folder holds an earlier build's artifacts because the stage would rerun now.
    note: str | None
    text: str  # the readable view `tinytrain inspect` prints

    def __str__(self) -> str:
        return self.text


def inspect(spec: Any, stage: str, /, artifact: str | None = None, *, cache_dir: str | Path | None = None,
            **overrides: Any) -> StageView:
    """The artifacts of `stage` for `spec` and their readable view (of one `artifact` if named)."""
    from tinytrain.pipeline.artifacts import stage_artifacts
    from tinytrain.pipeline.errors import UserError
    from tinytrain.pipeline.inspect_artifacts import describe
    from tinytrain.pipeline.planner import find_stage
    from tinytrain.pipeline.workspace import open_cache

    spec = load_spec(spec, **overrides)
    cache = open_cache(spec, cache_dir)
    st = find_stage(stage, stage_graph.STAGES)
    folder, note = stage_artifacts(spec, cache, st.name, stage_graph.STAGES)
    files = _files(folder)
    shown = list(files.values())
    if artifact is not None:
        if artifact not in files:
            raise UserError(f"stage {st.name} has no artifact {artifact!r}", hint=f"it has: {', '.join(files)}")
        shown = [files[artifact]]
    custom = _stage_inspector(st.impl)
    parts = []
    for i, p in enumerate(shown):
        if len(shown) > 1:
            parts.append(("\n" if i else "") + f"── {p.relative_to(folder).as_posix()} ──\n")
        parts.append(describe(p, custom))
    return StageView(st.name, folder, files, note, "".join(parts))


# ---- helpers ----------------------------------------------------------------------------------------

def _validate(data: dict[str, Any], base: Path, source: Path | None, overrides: Mapping[str, Any]) -> Spec:
    from tinytrain.pipeline.spec_paths import resolve_paths

    for key, value in overrides.items():
        _apply(data, key, value)
    try:
        spec = Spec.model_validate(data, context={"base_dir": base})
    except ValidationError as e:
        what = f"{source}" if source else "the spec"
        with_overrides = f" with overrides {', '.join(overrides)}" if overrides else ""
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
                             for err in e.errors(include_url=False))
        raise SpecError(f"{what}{with_overrides}: {problems}") from None
    resolve_paths(spec, base)
    spec._source = source
    return spec


def _apply(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise SpecError(f"override {key!r}: expected a spec path like train.learning_rate")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError(f"override {key!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
        node = child
    last = parts[-1]
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for k, v in value.items():
            _apply(node[last], str(k), v)
    else:
        node[last] = copy.deepcopy(value)


def _plain(spec: Spec) -> dict[str, Any]:
    """A Spec as the dict it validates from (only what was set, so defaults that follow other keys still do)."""
    return spec.model_dump(mode="python", exclude_unset=True, by_alias=True)


def _files(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def _stage_inspector(module_name: str | None):
    if not module_name:
        return None
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    fn = getattr(module, "inspect", None)
    return fn if callable(fn) else None


def _result(spec: Spec, raw: Any) -> BuildResult:
    stages: dict[str, StageInfo] = {}
    for o in raw.outcomes:
        folder = Path(o.out_dir) if o.out_dir else None
        stages[o.stage] = StageInfo(o.stage, o.state, o.summary, dict(o.metrics), o.key, o.duration_s, folder,
                                    _files(folder) if folder else {}, o.cpu_s)
    metrics = {}
    for name, (stage, key, scale) in HEADLINE.items():
        value = stages[stage].metrics.get(key) if stage in stages else None
        if value is not None:
            metrics[name] = value * scale if scale != 1.0 else value
    out = Path(raw.out_dir)
    report = out / "report.md"
    return BuildResult(spec.name, spec, out, stages, metrics, raw.duration_s, raw.error is None,
                       report if report.is_file() and not raw.dry_run else None)


__all__ = ["BuildResult", "StageInfo", "StageView", "build", "inspect", "load_spec"]
