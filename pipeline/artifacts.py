"""Find a stage's artifacts for `inspect` and `infer`: from the cache when the current spec's
entry exists (restored into the build folder), else whatever an earlier build left there."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tinytrain.cache.store import Cache
from tinytrain.pipeline.errors import UserError
from tinytrain.pipeline.planner import CACHED, find_stage, plan, remember
from tinytrain.pipeline.spec import Spec
from tinytrain.pipeline.stage_graph import StageDef
from tinytrain.pipeline.workspace import build_lock, stage_dir


def stage_artifacts(spec: Spec, cache: Cache, stage: str, stages: Sequence[StageDef]) -> tuple[Path, str | None]:
    """(folder, note): note warns when the folder does not match the current spec."""
    st = find_stage(stage, stages)
    item = next(i for i in plan(spec, cache, stages, wanted=[st.name]) if i.stage.name == st.name)
    folder = stage_dir(spec, st.name)
    if item.state == CACHED and item.entry is not None and item.preimage is not None:
        with build_lock(spec):
            cache.materialize(item.entry, folder)
            remember(cache, spec, st.name, item.preimage)
        return folder, None
    if (folder / "manifest.json").exists():
        return folder, f"note: these artifacts are from an earlier build; {st.name} would rerun now ({item.reason})"
    raise UserError(f"stage {st.name} has no artifacts for this spec yet ({item.reason})",
                    hint=f"build it first: tinytrain build {spec.source or 'SPEC'} --until {st.name}")
