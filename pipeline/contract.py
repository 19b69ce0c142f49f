"""What a stage is given and what it returns: the contract between the runner and `stages/`.

A stage is a pure function `run(ctx: StageContext) -> StageResult`. It reads only its config slice
(`ctx.config`), the upstream artifacts it was handed (`ctx.inputs`) and the external files its
config names (e.g. `model.path`, which the runner hashes into the cache key); it writes only into
`ctx.out_dir`. It never reads the clock, the environment, or the rest of the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


class Progress(Protocol):
    """How a stage says what it is doing; the console decides how to show it (a live bar on a terminal,
    a line every few seconds in a log). Call it as often as convenient: it is cheap.

    message: what is going on ("training steps", "measuring conv_3"); fraction: share of the stage done
    (0..1), if known. The keywords are figures the stage may know: `done`/`total` of its main loop
    (steps, units measured), `epoch`/`epochs` (1-based), `loss` (a running loss)."""

    def __call__(self, message: str, fraction: float | None = None, *, done: int | None = None,
                 total: int | None = None, epoch: int | None = None, epochs: int | None = None,
                 loss: float | None = None) -> None: ...


def no_progress(message: str, fraction: float | None = None, **figures: Any) -> None:
    return None


@dataclass(frozen=True)
class StageContext:
    # Config slice: dotted spec path (as declared by the stage, e.g. "model" or "train.update")
    # -> the pydantic model or plain value found there.
    config: dict[str, Any]
    # Upstream artifacts: "<stage>/<artifact file name>" -> path of a read-only file.
    inputs: dict[str, Path]
    # An empty folder that is the stage's own; everything written here becomes an artifact.
    out_dir: Path
    progress: Progress = no_progress
    # A persistent, content-addressed memo for sub-stage units (e.g. one contribution measurement each),
    # owned by the cache: a stage keys entries by the content of what they depend on, so a rerun of the
    # stage for another reason (a new budget) reuses every unit that did not change. None: no memo.
    unit_cache_dir: Path | None = None
    # `--force STAGE`: the stage measures its units again (and rewrites their memos) instead of reusing them.
    refresh_units: bool = False

    def input(self, key: str) -> Path:
        try:
            return self.inputs[key]
        except KeyError:
            raise KeyError(f"stage input {key!r} not provided (have: {sorted(self.inputs)})") from None

    def input_dir(self, stage: str) -> Path:
        """The folder holding an upstream stage's artifacts (they are materialised together)."""
        for key, path in self.inputs.items():
            if key.split("/", 1)[0] == stage:
                return path.parent
        raise KeyError(f"no artifacts of stage {stage!r} were provided")


@dataclass
class StageResult:
    # One line for the build log: what the stage did and its main figure.
    summary: str
    # JSON-able figures for `--json`, reports and tests (e.g. {"ops": 12, "params": 3456}).
    metrics: dict[str, Any] = field(default_factory=dict)


StageFn = Callable[[StageContext], StageResult]
