"""The eight stages, in order, with the config slice each one reads (DESIGN §3).

This table is data: the runner, `status`, `graph` and the cache key all read it. A stage whose
`impl` is None is registered but not implemented yet: `status` shows it and a build stops there.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from tinytrain.stages.device.boards import BOARDS, HOST_ISA_PROBE


@dataclass(frozen=True)
class Tool:
    """An external tool a stage runs, identified by the first line `cmd` prints (e.g. ("arm-none-eabi-gcc",
    "--version")); that line is part of the stage's cache key, so a new compiler rebuilds.

    `only_for`: (a dotted config path the stage reads, the values for which the tool's answer shapes the output).
    For other values the tool stays out of the key: the host's ISA probe decides the host board's -march only, so a
    new build machine must not invalidate Cortex-M firmware. None: the tool is always part of the key."""

    cmd: tuple[str, ...]
    only_for: tuple[str, tuple[Any, ...]] | None = None

    def applies(self, config: dict[str, Any]) -> bool:
        """Whether the tool is part of the key for this config slice ({dotted path: value})."""
        return self.only_for is None or config[self.only_for[0]] in self.only_for[1]


@dataclass(frozen=True)
class StageDef:
    name: str
    # Dotted spec paths this stage reads; only these go into its cache key.
    config: tuple[str, ...]
    # Upstream stages whose artifacts this stage reads.
    deps: tuple[str, ...]
    # Module exposing `run(ctx) -> StageResult`, or None while not implemented. Its source and that of every
    # tinytrain module it reaches through imports (computed by reading the code: cache/imports.py) are the
    # stage's implementation version, part of its cache key; no module list is kept by hand.
    impl: str | None
    description: str = ""
    # External tools the stage runs (`Tool`; a plain command tuple is a Tool that always applies).
    tools: tuple[Tool | tuple[str, ...], ...] = ()
    # Globs (relative to the tinytrain package) of non-Python sources the stage uses, e.g. the C kernels it
    # compiles: part of the implementation version, so editing a kernel rebuilds.
    source_files: tuple[str, ...] = ()
    # Upstream artifacts the stage reads, as "<stage>/<glob>". A dependency named here contributes only the
    # matching artifacts (to the stage's inputs and its cache key); one not named contributes all of its
    # artifacts. Precise reads keep a stage cached when an upstream stage reran but what it reads is unchanged.
    reads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        tools = tuple(t if isinstance(t, Tool) else Tool(tuple(t)) for t in self.tools)
        for t in tools:
            # A condition on a field the stage does not read would let two different outputs share a key.
            if t.only_for is not None and t.only_for[0] not in self.config:
                raise ValueError(f"stage {self.name}: tool {' '.join(t.cmd)} depends on {t.only_for[0]}, "
                                 "which is not in the stage's config")
        object.__setattr__(self, "tools", tools)

    def reads_artifact(self, dep: str, name: str) -> bool:
        patterns = [r.split("/", 1)[1] for r in self.reads if r.split("/", 1)[0] == dep]
        return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


STAGES: tuple[StageDef, ...] = (
    StageDef("load", ("model",), (), "tinytrain.stages.load",
             "read .tflite/.circle into the IR"),
    StageDef("quantize", ("quantize", "data"), ("load",), "tinytrain.stages.quantize",
             "float IR -> real int8 IR (+ model_int8.tflite)"),
    # train.loss, train.qas and train.reorder.enabled: the exact peak of the chosen plan is autodiff's graph for
    # them, planned as the reorder stage plans it (sparse_plan imports the modules of both, so they are part of
    # this stage's version too).
    StageDef("sparse-plan", ("train.update", "train.optimizer.kind", "train.batch_size", "train.loss",
                             "train.outputs", "train.qas", "train.precision",
                             "train.reorder.enabled", "target.board", "data"), ("quantize",),
             "tinytrain.stages.sparse_plan",
             "choose what to train under the memory budget"),
    StageDef("autodiff", ("train.loss", "train.outputs", "train.optimizer", "train.batch_size", "train.qas",
                          "train.precision", "train.loss_scale", "train.reorder.enabled"),
             ("quantize", "sparse-plan"),
             "tinytrain.stages.autodiff",
             "compile-time backward graph and update ops (int8: QAS)",
             reads=("quantize/graph.json", "quantize/tensors.npz", "sparse-plan/train_plan.json")),
    StageDef("reorder", ("train.reorder",), ("autodiff",), "tinytrain.stages.reorder",
             "schedule with in-place updates and streamed groups; static arena plan"),
    StageDef("codegen", ("target.kernels",), ("autodiff", "reorder"), "tinytrain.stages.codegen",
             "C sources for the training program",
             source_files=("kernels_c/*.h",)),
    StageDef("cross-compile", ("target.board", "target.cflags", "target.kernels"), ("codegen",),
             "tinytrain.stages.cross_compile",
             "ELF for the board, size report and fit check",
             # The ISA probe sets -march for the host board only (stages/device/boards.py).
             tools=(("arm-none-eabi-gcc", "--version"), ("cc", "--version"),
                    Tool(HOST_ISA_PROBE, ("target.board", tuple(b.name for b in BOARDS.values() if b.host)))),
             source_files=("kernels_c/*.c", "kernels_c/ops/*.c", "kernels_c/*.h", "kernels_c/boards/*")),
    # Runtime values only (they go into runtime.bin, never into the program): changing them reruns this stage
    # alone. `model` is read for the original file's tensor count (the .wof's n_buffers); train.optimizer for
    # its hyper-parameters (the kind is compiled in by autodiff, so it changes the ELF too).
    StageDef("emulate-run", ("train.learning_rate", "train.epochs", "train.seed", "train.batch_size",
                             "train.optimizer", "train.max_train_samples", "train.gate", "train.checkpoint",
                             "train.resume_from", "data", "model",
                             "target.board", "target.timeout_s"),
             ("cross-compile", "codegen", "quantize", "load", "sparse-plan"), "tinytrain.stages.emulate_run",
             "train inside QEMU (or natively for host); export trained weights (.wof, .tflite)",
             tools=(("qemu-system-arm", "--version"),),
             # host_eval.elf: the same program built natively, for the accuracy evaluation (stages/emulate_run.py)
             reads=("cross-compile/firmware.elf", "cross-compile/host_eval.elf", "cross-compile/size.json",
                    "codegen/io_layout.json",
                    "quantize/graph.json", "quantize/tensors.npz", "load/graph.json",
                    # the int8 update check, re-run at the run's learning rate (stages/quant/update_check.py)
                    "sparse-plan/update_check.json", "sparse-plan/train_plan.json")),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def stage(name: str) -> StageDef:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(name)
