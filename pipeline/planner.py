"""What a build would do, without doing it: per stage, cached / will run and why / not implemented.

`status`, `build --dry-run` and `explain` read this; the runner computes the same preimages while
it runs, because a stage's inputs are only known once its upstream stages have produced them.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tinytrain.cache.keys import MISSING, action_key, diff_preimages
from tinytrain.cache.store import ActionEntry, Cache
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.preimage import change_reason, config_value, stage_preimage
from tinytrain.pipeline.spec import Spec
from tinytrain.pipeline.stage_graph import StageDef
from tinytrain.pipeline.workspace import scope

CACHED, WILL_RUN, NOT_IMPLEMENTED = "cached", "will run", "not implemented"


@dataclass
class PlanItem:
    stage: StageDef
    state: str
    reason: str = ""
    preimage: dict | None = None
    key: str | None = None
    entry: ActionEntry | None = None


# ---- choosing stages ---------------------------------------------------------------------------

def find_stage(name: str, stages: Sequence[StageDef]) -> StageDef:
    for s in stages:
        if s.name == name:
            return s
    names = [s.name for s in stages]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}?" if close else f"stages: {', '.join(names)}"
    raise UserError(f"unknown stage {name!r}", hint=hint)


def with_ancestors(names: Iterable[str], stages: Sequence[StageDef]) -> set[str]:
    by_name = {s.name: s for s in stages}
    out: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(by_name[n].deps)
    return out


def in_order(names: set[str], stages: Sequence[StageDef]) -> list[StageDef]:
    return [s for s in stages if s.name in names]


# ---- keys --------------------------------------------------------------------------------------

def input_digests(stage: StageDef, entries: Mapping[str, ActionEntry]) -> dict[str, str]:
    return {f"{dep}/{o.name}": o.digest for dep in stage.deps for o in entries[dep].outputs
            if stage.reads_artifact(dep, o.name)}


def preimage_and_key(stage: StageDef, spec: Spec, entries: Mapping[str, ActionEntry]) -> tuple[dict, str]:
    pre = stage_preimage(stage, spec, input_digests(stage, entries), spec.build.salt)
    return pre, action_key(pre)


def miss_reason(cache: Cache, spec: Spec, stage: StageDef, pre: dict) -> str:
    dropped = cache.last_drop_reason
    last = cache.last_preimage(scope(spec, stage.name))
    if last is None:
        reason = "no cache entry (never built)"
    else:
        reason = change_reason(diff_preimages(last, pre))
    return f"{reason}; a cached entry was dropped: {dropped}" if dropped else reason


def plan(spec: Spec, cache: Cache, stages: Sequence[StageDef], wanted: Iterable[str] | None = None,
         force: Iterable[str] = ()) -> list[PlanItem]:
    """Walk the stages in order; a stage's key is known only when all its inputs are cached."""
    names = with_ancestors(wanted, stages) if wanted is not None else {s.name for s in stages}
    forced = set(force)
    entries: dict[str, ActionEntry] = {}
    unknown: dict[str, str] = {}
    items = []
    for st in in_order(names, stages):
        if st.impl is None:
            items.append(PlanItem(st, NOT_IMPLEMENTED, f"stage {st.name} is not implemented yet"))
            unknown[st.name] = "is not implemented"
            continue
        blocked = [d for d in st.deps if d not in entries]
        if blocked:
            items.append(PlanItem(st, WILL_RUN, f"upstream {blocked[0]} {unknown.get(blocked[0], 'will run')}"))
            unknown[st.name] = "will run"
            continue
        pre, key = preimage_and_key(st, spec, entries)
        if st.name in forced:
            items.append(PlanItem(st, WILL_RUN, "forced (--force)", pre, key))
            unknown[st.name] = "will run"
            continue
        entry = cache.lookup(key)
        if entry is not None:
            entries[st.name] = entry
            items.append(PlanItem(st, CACHED, "", pre, key, entry))
        else:
            items.append(PlanItem(st, WILL_RUN, miss_reason(cache, spec, st, pre), pre, key))
            unknown[st.name] = "will run"
    return items


# ---- remembering and explaining ----------------------------------------------------------------

def remember(cache: Cache, spec: Spec, stage: str, pre: dict) -> None:
    """Record the preimage a stage's artifacts now correspond to; keep the one before it when it
    differs, so that `explain` can still say why the last build reran the stage."""
    sc = scope(spec, stage)
    last = cache.last_preimage(sc)
    if last is not None and diff_preimages(last, pre):
        cache.record_last(sc + "#previous", last)
    cache.record_last(sc, pre)


def explain(spec: Spec, cache: Cache, stage_name: str, stages: Sequence[StageDef]) -> list[str]:
    st = find_stage(stage_name, stages)
    return _explain(spec, cache, st, stages) + _value_sources(spec, st)


def _value_sources(spec: Spec, st: StageDef) -> list[str]:
    """Where the stage's values came from when not (only) from the spec: a .circle model's training metadata."""
    sources = spec.value_sources() if hasattr(spec, "value_sources") else {}
    mine = {k: v for k, v in sources.items() if any(k == c or k.startswith(c + ".") for c in st.config)}
    if not mine:
        return []
    return ["values and where they came from:"] + [f"  {k} = {json.dumps(config_value(spec, k))}: from {v}"
                                                   for k, v in sorted(mine.items())]


def _explain(spec: Spec, cache: Cache, st: StageDef, stages: Sequence[StageDef]) -> list[str]:
    item = next(i for i in plan(spec, cache, stages, wanted=[st.name]) if i.stage.name == st.name)
    if item.state == NOT_IMPLEMENTED:
        return [f"{st.name}: not implemented yet, so it has no cache key to explain"]
    last = cache.last_preimage(scope(spec, st.name))
    current, note = item.preimage, ""
    if current is None:
        # Upstream has not been built with this config: its outputs, our inputs, are unknown.
        current = stage_preimage(st, spec, {}, spec.build.salt)
        note = f"({item.reason}: this stage's inputs are unknown until then, so they are not compared)"
        if last is not None:
            last = {k: v for k, v in last.items() if k != "inputs"}
            current = {k: v for k, v in current.items() if k != "inputs"}
    if last is None:
        return [f"{st.name}: {item.state}" + (f" — {item.reason}" if item.reason else ""),
                f"no earlier build of {st.name} is recorded for {spec.name!r} in {cache.root}; nothing to compare"]
    diffs = diff_preimages(last, current)
    if not diffs:
        lines = [f"{st.name}: {item.state}" + (f" (key {item.key[:12]})" if item.key else "")
                 + " — nothing changed since the last build"]
        previous = cache.last_preimage(scope(spec, st.name) + "#previous")
        if previous is not None:
            lines.append("it last ran because, compared with the build before:")
            lines += [f"  {_diff_line(d)}" for d in diff_preimages(previous, last)]
        return lines + ([note] if note else [])
    head = f"{st.name}: {item.state} — {change_reason(diffs)}" if item.state != CACHED else \
        f"{st.name}: cached (an earlier entry matches), but differs from the last build:"
    return [head, *(f"  {_diff_line(d)}" for d in diffs)] + ([note] if note else [])


def _diff_line(d: tuple[str, Any, Any]) -> str:
    path, old, new = d
    return f"{path}: {_show(old)} -> {_show(new)}"


def _show(v: Any) -> str:
    if v is MISSING:
        return "(absent)"
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
