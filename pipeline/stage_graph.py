"""The eight stages, in order, with the config slice each one reads (DESIGN §3).

This table is data: the runner, `status`, `graph` and the cache key all read it. A stage whose
`impl` is None is registered but not implemented yet: `status` shows it and a build stops there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageDef:
    name: str
    # Dotted spec paths this stage reads; only these go into its cache key.
    config: tuple[str, ...]
    # Upstream stages whose artifacts this stage reads.
    deps: tuple[str, ...]
    # Module exposing `run(ctx) -> StageResult`, or None while not implemented.
    impl: str | None
    # Modules whose source text is the stage's implementation version (besides `impl` itself).
    sources: tuple[str, ...] = ()
    description: str = ""
    # Commands whose first output line identifies an external tool the stage runs (e.g.
    # ("arm-none-eabi-gcc", "--version")); part of the cache key, so a new compiler rebuilds.
    tools: tuple[tuple[str, ...], ...] = ()


STAGES: tuple[StageDef, ...] = (
    StageDef("load", ("model",), (), "tinytrain.stages.load",
             ("tinytrain.stages.ir", "tinytrain.stages.tflite_reader"),
             "read .tflite/.circle into the IR"),
    StageDef("quantize", ("quantize", "data"), ("load",), "tinytrain.stages.quantize",
             ("tinytrain.stages.ir", "tinytrain.stages.ptq", "tinytrain.stages.calibrate",
              "tinytrain.stages.bn_fold", "tinytrain.stages.executor", "tinytrain.stages.int8_arith",
              "tinytrain.stages.tflite_writer", "tinytrain.stages.data", "tinytrain.pipeline.spec_quantize",
              "tinytrain.pipeline.spec_data"),
             "float IR -> real int8 IR (+ model_int8.tflite)"),
    StageDef("sparse-plan", ("train.update", "target.board"), ("quantize",), None, (),
             "choose what to train under the memory budget"),
    StageDef("autodiff", ("train.loss", "train.optimizer", "train.batch_size", "train.qas"), ("quantize", "sparse-plan"),
             None, (), "compile-time backward graph and update ops"),
    StageDef("reorder", ("train.reorder",), ("autodiff",), "tinytrain.stages.reorder",
             ("tinytrain.stages.memplan", "tinytrain.stages.schedule", "tinytrain.stages.ir"),
             "schedule with in-place updates; static arena plan"),
    StageDef("codegen", ("target.kernels",), ("reorder",), None, (),
             "C sources for the training program"),
    StageDef("cross-compile", ("target.board", "target.cflags", "target.kernels"), ("codegen",), None, (),
             "ELF for the board, size report and fit check"),
    StageDef("emulate-run", ("train.learning_rate", "train.epochs", "train.seed", "data", "target.board",
                             "target.timeout_s"),
             ("cross-compile", "quantize"), None, (), "train inside QEMU (or natively for host)"),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def stage(name: str) -> StageDef:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(name)
