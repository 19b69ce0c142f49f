"""Stage `emulate-run`: train inside the emulated MCU (QEMU; natively for `host`), then export (DESIGN §3, §7).

Inputs: cross-compile's `firmware.elf` + `size.json`, codegen's `io_layout.json` ("input": the model
input's dtype / scale / zero point; "trained_tensors": name, dtype, shape, offset, nbytes, source_index
of each tensor in weights.bin), quantize's int8 IR (graph.json + tensors.npz), load's IR, the model
file (`model`: its tensor count is the .wof's n_buffers), the data (`data`) and the runtime values
(`train.learning_rate`, `epochs`, `seed`, `batch_size`, `optimizer`, `max_train_samples`, `gate`,
`target.board`, `target.timeout_s`). Runtime values reach the firmware in `runtime.bin`
(stages/train/runtime_config.py), never through the program, so changing them reruns only this stage.

The run folder (a temp folder, not an artifact) holds runtime.bin, train.ttds (the train split) and
test.ttds (the test split) -- the same `load_dataset` split quantize calibrated on, samples quantized
with the model input's scale / zero point exactly as TFLite's QUANTIZE op does.

Artifacts
  run.json            loss per step, accuracy before/after (%), instructions per training step; fp16-mixed
                      (train.precision): `loss_scale` {final, skipped_steps, policy}
                      (mean/min/max, total), a cycle estimate at the board's real clock as ms/step,
                      stack high-water mark, arena planned vs used, flash/SRAM from size.json, the
                      improvement gate's decision, what was exported
  loss.svg, loss.png  per-step loss (log scale), its moving average, the per-epoch means, and the test
                      accuracy (MSE) measured before and after training
  weights.bin         the firmware's trained tensors as it wrote them (whatever the gate decided)
  trained.wof         weights-only format of seed 000 (layout: stages/model/wof.py), indexed by the
                      ORIGINAL model file's tensors
  trained_int8.tflite the int8 model with the trained tensors replaced (LiteRT runs it)
  run.log             the console of the firmware and the emulator's log
  trained.circle      for a .circle model: the trained model in circle form with the CIRCLE_TRAINING metadata
                      (onert's circle+, stages/model/circle_training.py) saying what it was trained with
  trained.ttck        with `train.checkpoint`: the checkpoint the firmware saved (stages/train/checkpoint.py reads it;
                      `tinytrain inspect SPEC emulate-run` shows its step and state norms)

Checkpoint / resume (runtime values, like the learning rate): `train.checkpoint: {stop_after_steps: N}` stops
after N training steps and saves trained.ttck; `train.resume_from: path/to/trained.ttck` continues from it (the
firmware skips the steps it holds), and the losses of both runs together and the final weights equal one
uninterrupted run's, bit for bit. The checkpoint is checked on the host first (size, magic, version, model id,
CRC): a bad one is a one-line error, never a silent restart from the original weights.

Improvement gate (seed 000, step 3): with `train.gate.enabled`, the trained weights are exported
only if accuracy after - before >= `train.gate.min_delta` (percentage points); otherwise the
original weights are exported and run.json / the summary say so.

Regression (`train.loss: mse`, `data.task: regression`): the streams are TTDS version 2 (float32
targets per record, stages/train/data.py), the firmware reports the test split's mean squared error before
and after as IEEE-754 bit patterns (results.json `mse_before_bits` / `mse_after_bits`; JSON from the
firmware holds integers only), run.json has `mse` {before, after, delta} instead of accuracy, and the
gate keeps the trained weights when before - after >= min_delta (lower is better; min_delta in MSE
units, default 0: kept unless the error grew).

Named outputs (`train.outputs`, codegen's io_layout "heads"): the streams are TTDS version 2 whose float targets
are the heads' targets back to back (stages/data.target_rows); the firmware reports the test split's mean training
loss (every head's weighted loss) as bits (`loss_before_bits` / `loss_after_bits`), run.json has `test_loss`
{before, after, delta}, and the gate keeps the trained weights when before - after >= min_delta (loss units).

Where the phases run (run.json `phases`): on an emulated board, QEMU trains and the accuracy (MSE, test loss)
before and after is evaluated natively on cross-compile's `host_eval.elf`, the same generated C built for the host
(stages/device/eval_split.py): bit-identical by construction, and checked on every run -- QEMU evaluates the first
eval_split.CHECK_SAMPLES test samples too, before and after, and their output bytes must equal the host's (a
difference is a build error). The host evaluates from QEMU's trained state (a checkpoint), while QEMU trains for
the evaluation before. `instructions.total_run` counts what QEMU ran (training + the check samples). Without a
host build (no `cc`, or it failed: cross-compile's build.json says why) QEMU evaluates as before.

Cycle estimates: QEMU counts instructions, not cycles. `cycles_estimate` assumes one cycle per instruction at
the board's real clock (216 MHz for the STM32F746). `cycles_per_step_estimate` is better founded: one training
step traced in QEMU (`-d in_asm,exec,nochain`), every instruction classed and costed with a Cortex-M4 / M7 / M55
table (stages/device/cycles.py states the tables and their assumptions), with the instruction mix. The trace is slow
(~TRACE_SLOWDOWN x per instruction), so it runs only when it costs at most TRACE_BUDGET of the run (the digits
example: yes; MobileNetV2: no, bench/speed.py traces it); otherwise the entry says why not.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import struct
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tinytrain.pipeline.contract import StageContext, StageResult, no_progress
from tinytrain.pipeline.errors import StageFailed, UserError
from tinytrain.stages.cross_compile import HOST_EVAL_ELF
from tinytrain.stages.device import cycles
from tinytrain.stages.device import eval_split
from tinytrain.stages.device import export
from tinytrain.stages.quant import rescale, update_check
from tinytrain.stages.model import wof
from tinytrain.stages.device.boards import BOARDS, Board, get_board
from tinytrain.stages.device.launch import EmulationError, RunResult, run_firmware
from tinytrain.stages.device.run_summary import inspect, loss_picture, metrics, summary_line  # noqa: F401 -- inspect: this stage's hook (pipeline/api.py)
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.parallel import Background
from tinytrain.stages.train.runtime_config import (
    FLAG_EVAL_AFTER,
    FLAG_EVAL_BEFORE,
    FLAG_RESUME,
    FLAG_SAVE_CHECKPOINT,
    OPTIMIZER_DEFAULTS,
    PROTOCOL,
    RuntimeConfig,
)

ARTIFACTS = ("run.json", "loss.svg", "loss.png", "weights.bin", "trained.wof", "trained_int8.tflite", "run.log")
CHECKPOINT_ARTIFACT = "trained.ttck"   # only with train.checkpoint
CIRCLE_ARTIFACT = "trained.circle"     # only for a .circle model: the trained model with CIRCLE_TRAINING metadata
RUN_JSON_VERSION = 1

# The real parts' core clocks (the emulator runs the mps2 machines at 25 MHz; that is not the board's). The MPS3
# Each board's real core clock (boards.Board.core_clock_hz; AN547 is an FPGA image: its Cortex-M55 runs at the
# image's 32 MHz main clock).
BOARD_CLOCK_HZ = {b.name: b.core_clock_hz for b in BOARDS.values() if b.core_clock_hz}

# MIT TTE (tiny-training) on STM32F746 @216 MHz: MobileNetV2-w0.35 @128, sparse update, 373 ms per step.
TTE_MS_PER_STEP = 373.0
TTE_CLOCK_HZ = 216_000_000
TTE_CYCLES_PER_STEP = TTE_MS_PER_STEP * 1e-3 * TTE_CLOCK_HZ   # ~80.6 M

# The cycle estimate's trace (stages/device/cycles.py) runs about TRACE_SLOWDOWN times slower per instruction than the
# plain emulation, plus a fixed start-up cost worth TRACE_FIXED_INSNS plain instructions (measured: a MobileNetV2
# step, 170 M instructions, traces in 46 s where the plain run does 4.2 ns per instruction; the digits trace is
# 0.4 s, mostly QEMU's start), and may cost TRACE_BUDGET of the run.
TRACE_SLOWDOWN = 64
TRACE_FIXED_INSNS = 120_000_000
TRACE_BUDGET = 0.2


class DivergedError(StageFailed):
    """The loss became NaN or infinite."""


# ---- stage ---------------------------------------------------------------------------------------

def run(ctx: StageContext) -> StageResult:
    cfg = ctx.config
    board = get_board(cfg["target.board"])
    timeout_s = float(cfg.get("target.timeout_s") or 600.0)
    cc_dir = ctx.input_dir("cross-compile")
    elf = cc_dir / "firmware.elf"
    size = _read_json(cc_dir / "size.json", "cross-compile's size.json")
    layout = _read_json(ctx.input("codegen/io_layout.json"), "codegen's io_layout.json")
    # the int8 graph as autodiff trained it: with the wider scales sparse-plan chose (stages/quant/rescale.py)
    qgraph = rescale.planned(Graph.load(ctx.input_dir("quantize")), ctx.inputs.get("sparse-plan/train_plan.json"))
    n_buffers = _original_tensor_count(cfg, ctx)
    rc = runtime_config(cfg)
    data_spec = cfg.get("data")
    if data_spec is None:
        raise UserError("emulate-run needs data to train on, but the spec has no `data` section",
                        hint="add data: {source: digits} (or npz / images)")

    ctx.progress("preparing the run folder", 0.0)
    files, data_info = run_files(data_spec, layout, rc, qgraph)
    resume = cfg.get("train.resume_from")
    if resume is not None:
        files["resume.ttck"] = checked_checkpoint(Path(resume), layout)
    host_elf = ctx.inputs.get(f"cross-compile/{HOST_EVAL_ELF}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Int8 updates that rounding erases at this run's learning rate (run.json `updates`, issue 17): it needs
        # nothing from the run, so it is computed while the firmware trains (QEMU is another process).
        recheck = pool.submit(update_check.for_run, ctx.inputs, qgraph, cfg, layout, rc.learning_rate)
        with tempfile.TemporaryDirectory(prefix="tinytrain-run-") as tmp:
            exe = _private_copy(elf, Path(tmp))
            if not board.host and host_elf is not None and eval_split.wanted(rc):
                split = eval_split.run_split(board, exe, _private_copy(host_elf, Path(tmp)), Path(tmp), files, rc,
                                             _runner(ctx, timeout_s))
                result, error, phases, hosts = split.result, split.error, split.phases, split.hosts
            else:
                result, error = _run(board, exe, Path(tmp) / "run", files, timeout_s, ctx)
                phases, hosts = in_place_phases(board, rc, host_elf is not None), {}
        if error is not None:
            recheck.cancel()
    log_text = run_log(result, rc, board, hosts)
    if error is not None:
        raise _explain_failure(error, rc, log_text)

    outcome = collect(result, layout, rc)
    estimate = cycle_estimate(board, elf, files, rc, outcome["results"], result, timeout_s, ctx)
    out = Path(ctx.out_dir)
    (out / "run.log").write_text(log_text)
    outcome["checkpoint"] = keep_checkpoint(result, rc, out)
    updates = recheck.result()
    doc = finish(out, outcome, qgraph, layout, n_buffers, rc, cfg.get("train.gate"), board, size, data_info,
                 result, estimate, updates, phases)
    if _model_is_circle(cfg):
        from tinytrain.stages.model.circle_training import write_circle_plus

        opt = cfg.get("train.optimizer")
        kind = getattr(opt, "kind", None) or dict(opt or {}).get("kind", "sgd")
        write_circle_plus(out / "trained_int8.tflite", out / CIRCLE_ARTIFACT, kind, rc, layout.get("loss") == "mse")
    return StageResult(summary=doc["summary"], metrics=metrics(doc))


def _private_copy(elf: Path, folder: Path) -> Path:
    """Artifacts come out of the cache read-only and without the execute bit: the host runs a private copy. The
    run folders are its siblings, so a program cannot see (or clobber) an ELF."""
    exe = folder / Path(elf).name
    shutil.copyfile(elf, exe)
    exe.chmod(0o755)
    return exe


def _runner(ctx: StageContext, timeout_s: float) -> eval_split.Runner:
    """run_firmware with this stage's settings; progress only for the run that trains (the host runs evaluate)."""
    def run(board: Board, exe: Path, workdir: Path, files: dict[str, bytes], report: bool) -> RunResult:
        if report:
            ctx.progress(f"training on {board.name} in QEMU {board.qemu_machine} (evaluation: natively)", 0.05)
        return run_firmware(board, exe, workdir, files, timeout_s, progress=ctx.progress if report else no_progress,
                            epochs=int(ctx.config["train.epochs"]),
                            samples_per_step=int(ctx.config.get("train.batch_size") or 1))
    return run


def in_place_phases(board: Board, rc: RuntimeConfig, host_built: bool) -> dict[str, Any]:
    """run.json's `phases` when one program run does everything (the host board, or no host build to evaluate on)."""
    where = "host" if board.host else f"QEMU {board.qemu_machine}"
    doc: dict[str, Any] = {"train": {"where": where}}
    for phase in eval_split.wanted(rc):
        doc[f"evaluate_{phase}"] = {"where": where}
    if not board.host and eval_split.wanted(rc):
        doc["host_eval"] = ("not used: no training run" if host_built
                            else "cross-compile built no host_eval.elf (its build.json says why)")
    return doc


def cycle_estimate(board: Board, elf: Path, files: dict[str, bytes], rc: RuntimeConfig, res: Mapping[str, Any],
                   result: RunResult, timeout_s: float, ctx: StageContext) -> dict[str, Any]:
    """run.json's `cycles_per_step_estimate`: one training step traced in QEMU and costed (stages/device/cycles.py), when
    that costs at most TRACE_BUDGET of this run. The trace runs ~TRACE_SLOWDOWN times slower per instruction than
    the plain run, so the rule compares instruction counts (deterministic, unlike a clock): a traced step must
    not exceed TRACE_BUDGET of the run's instructions after the slowdown. Otherwise `{"traced": false, ...}`;
    bench/speed.py traces any build on request (cycles.estimate_step)."""
    per_step = float(res.get("instructions_per_step_max") or 0)
    total = float(result.instructions or 0)
    if board.host or not per_step or not total:
        return {"traced": False, "reason": "no instruction count to trace (host board or no training step)"}
    if board.cpu not in cycles.COSTS:  # checked before the trace, which would cost time only to fail
        return {"traced": False, "reason": f"no cycle table for {board.cpu} (have {', '.join(cycles.COSTS)})"}
    if per_step * TRACE_SLOWDOWN + TRACE_FIXED_INSNS > TRACE_BUDGET * total:
        return {"traced": False, "reason": f"tracing one step (~{TRACE_SLOWDOWN}x slower than the run per "
                                           f"instruction) would cost more than {TRACE_BUDGET:.0%} of this run; "
                                           "bench/speed.py estimates it on request"}
    ctx.progress("tracing one training step for the cycle estimate", 0.97)
    one = dict(files)
    one["runtime.bin"] = dataclasses.replace(rc, flags=0, epochs=1, stop_after_steps=1).to_bytes()
    with tempfile.TemporaryDirectory(prefix="tinytrain-trace-") as tmp:
        try:
            doc = cycles.estimate_step(board, elf, one, Path(tmp), clock_hz=BOARD_CLOCK_HZ.get(board.name),
                                       timeout_s=timeout_s)
        except (RuntimeError, ValueError) as e:
            return {"traced": False, "reason": f"the trace failed: {e}"}
    doc.pop("trace_wall_s", None)  # a clock reading: not an artifact's content
    return {"traced": True, **doc}


def runtime_config(cfg: Mapping[str, Any]) -> RuntimeConfig:
    """The spec's runtime values -> runtime.bin's record (optimizer hyper-parameters included)."""
    opt = cfg.get("train.optimizer")
    d = opt.model_dump() if hasattr(opt, "model_dump") else dict(opt or {})
    kind = d.get("kind", "sgd")
    ck = cfg.get("train.checkpoint")
    return RuntimeConfig(
        learning_rate=float(cfg["train.learning_rate"]), epochs=int(cfg["train.epochs"]),
        seed=int(cfg.get("train.seed") or 0), batch_size=int(cfg.get("train.batch_size") or 1),
        # The firmware's SGD reads momentum too: plain sgd must get 0 whatever the spec's default says.
        momentum=float(d.get("momentum", OPTIMIZER_DEFAULTS.momentum)) if kind == "momentum" else 0.0,
        beta1=float(d.get("beta1", OPTIMIZER_DEFAULTS.beta1)), beta2=float(d.get("beta2", OPTIMIZER_DEFAULTS.beta2)),
        eps=float(d.get("eps", OPTIMIZER_DEFAULTS.eps)), alpha=float(d.get("rho", OPTIMIZER_DEFAULTS.alpha)),
        weight_decay=0.0,
        max_train_samples=int(cfg.get("train.max_train_samples") or 0),
        flags=(FLAG_EVAL_BEFORE | FLAG_EVAL_AFTER | (FLAG_SAVE_CHECKPOINT if ck is not None else 0)
               | (FLAG_RESUME if cfg.get("train.resume_from") is not None else 0)),
        stop_after_steps=int(_field(ck, "stop_after_steps") or 0))


def _model_is_circle(cfg: Mapping[str, Any]) -> bool:
    model = cfg.get("model")
    path, fmt = getattr(model, "path", None), getattr(model, "format", "auto")
    if path is None or fmt == "tflite" or not Path(path).is_file():
        return False
    with open(path, "rb") as f:
        return f.read(8)[4:8] == b"CIR0"


def _field(section: Any, name: str) -> Any:
    if section is None:
        return None
    return getattr(section, name) if hasattr(section, name) else dict(section).get(name)


def checked_checkpoint(path: Path, layout: Mapping[str, Any]) -> bytes:
    """The bytes of train.resume_from after the firmware's own checks (size, magic, version, model id, CRC), so a
    bad checkpoint is the user's one-line error instead of a run that silently starts over."""
    from tinytrain.stages.train.checkpoint import CheckpointError, read_checkpoint

    raw = Path(path).read_bytes()
    try:
        read_checkpoint(raw, layout)
    except CheckpointError as e:
        raise UserError(f"train.resume_from {path}: {e}; refused (nothing was trained)") from None
    return raw


def keep_checkpoint(result: RunResult, rc: RuntimeConfig, out: Path) -> dict[str, Any] | None:
    """Copy the saved checkpoint to trained.ttck; what run.json says about resuming and saving."""
    res = _parse_results(result) or {}
    if rc.flags & FLAG_RESUME and int(res.get("checkpoint_status", 0)) != 0:
        # The host checked it already: the firmware disagreeing is our bug, not the user's input.
        raise StageFailed(f"the firmware refused train.resume_from (status {res.get('checkpoint_status')}) that the "
                          f"host accepted" + _console_tail(result))
    if not rc.flags & (FLAG_RESUME | FLAG_SAVE_CHECKPOINT):
        return None
    doc: dict[str, Any] = {"resumed_from_step": int(res.get("start_step", 0)) if rc.flags & FLAG_RESUME else None,
                           "saved": None, "stop_after_steps": rc.stop_after_steps or None}
    if rc.flags & FLAG_SAVE_CHECKPOINT:
        raw = result.files.get("checkpoint.ttck")
        if raw is None:
            raise StageFailed("the firmware did not write checkpoint.ttck" + _console_tail(result))
        (out / CHECKPOINT_ARTIFACT).write_bytes(raw)
        doc.update(saved=CHECKPOINT_ARTIFACT, saved_step=int(res.get("start_step", 0)) + int(res.get("steps", 0)))
    return doc


def run_files(data_spec: Any, layout: Mapping[str, Any], rc: RuntimeConfig,
              qgraph: Graph | None = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """runtime.bin, train.ttds, test.ttds as bytes, and what they hold (for run.json)."""
    from tinytrain.stages.train.data import check_compatible, load_dataset, write_stream

    ds = load_dataset(data_spec)
    inp = layout.get("input") or {}
    if layout.get("heads"):
        return _run_files_outputs(ds, layout, rc, inp)
    regression = layout.get("loss") == "mse"
    if ds.task == "outputs":  # train.outputs naming the model's one output, with a cross-entropy or MSE head
        from tinytrain.stages.train.data import single_target

        ds = single_target(ds, classification=not regression)
    if regression != ds.regression:
        # The program was compiled for one kind of target; the other kind cannot be streamed to it.
        raise UserError(f"the firmware was built for {'MSE (regression)' if regression else 'classification'} "
                        f"but the data is {'regression targets' if ds.regression else 'class labels'}",
                        hint=("set data.task: regression with float y arrays [N, outputs]" if regression
                              else "train regression data with train.loss: mse"))
    shape = inp.get("shape")
    if shape is None and qgraph is not None:
        shape = qgraph.tensors[qgraph.inputs[0]].shape
    if shape is not None:
        n_classes = None
        if regression and layout.get("num_targets") is not None:
            n_classes = int(layout["num_targets"])
        elif qgraph is not None and qgraph.outputs:
            n_classes = int(qgraph.tensors[qgraph.outputs[0]].shape[-1])
        check_compatible(ds, shape, n_classes)
    with tempfile.TemporaryDirectory(prefix="tinytrain-ttds-") as tmp:
        out = {}
        for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
            p = Path(tmp) / f"{split}.ttds"
            if regression:
                write_stream(p, quantize_input(x, inp), None, targets=y)
            else:
                write_stream(p, quantize_input(x, inp), y)
            out[f"{split}.ttds"] = p.read_bytes()
    out["runtime.bin"] = rc.to_bytes()
    used = len(ds.y_train) if not rc.max_train_samples else min(rc.max_train_samples, len(ds.y_train))
    info = {"train_samples": int(len(ds.y_train)), "test_samples": int(len(ds.y_test)),
            "train_samples_per_epoch": int(used), "classes": len(ds.class_names),
            "input_dtype": str(inp.get("dtype", "int8"))}
    if regression:
        info.update(task="regression", targets=ds.num_targets)
    return out, info


def _run_files_outputs(ds: Any, layout: Mapping[str, Any], rc: RuntimeConfig,
                       inp: Mapping[str, Any]) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Named outputs (train.outputs): TTDS version 2 whose float targets are the heads' targets back to back
    (stages/train/losses.py, stages/data.target_rows)."""
    from tinytrain.stages.train.data import check_sample_shape, target_rows, write_stream

    if inp.get("shape") is not None:
        check_sample_shape(ds.sample_shape, inp["shape"])
    rows = dict(zip(("train", "test"), target_rows(ds, list(layout["heads"]))))
    out = {}
    with tempfile.TemporaryDirectory(prefix="tinytrain-ttds-") as tmp:
        for split, x in (("train", ds.x_train), ("test", ds.x_test)):
            p = Path(tmp) / f"{split}.ttds"
            write_stream(p, quantize_input(x, inp), None, targets=rows[split])
            out[f"{split}.ttds"] = p.read_bytes()
    out["runtime.bin"] = rc.to_bytes()
    n = len(ds.x_train)
    used = n if not rc.max_train_samples else min(rc.max_train_samples, n)
    return out, {"train_samples": int(n), "test_samples": int(len(ds.x_test)), "train_samples_per_epoch": int(used),
                 "classes": 0, "input_dtype": str(inp.get("dtype", "int8")), "task": "outputs",
                 "targets": int(rows["train"].shape[1]), "outputs": [h["output"] for h in layout["heads"]]}


def quantize_input(x: np.ndarray, inp: Mapping[str, Any]) -> np.ndarray:
    """Float samples -> the model input's dtype, as TFLite's QUANTIZE does (reference_ops::AffineQuantize:
    round half away from zero of x / scale in float32, plus the zero point, clamped)."""
    dtype = str(inp.get("dtype", "int8"))
    if dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    if dtype != "int8":
        raise StageFailed(f"io_layout.json: input dtype {dtype} is not supported (int8 or float32)")
    scale, zp = float(_first(inp["scale"])), int(_first(inp["zero_point"]))
    q = (np.asarray(x, dtype=np.float32) / np.float32(scale)).astype(np.float32)
    r = np.sign(q) * np.floor(np.abs(q) + np.float32(0.5))
    return np.clip(r + zp, -128, 127).astype(np.int8)


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, (list, tuple)) else v


def _run(board: Board, elf: Path, workdir: Path, files: dict[str, bytes], timeout_s: float,
         ctx: StageContext) -> tuple[RunResult | None, EmulationError | None]:
    where = "natively" if board.host else f"in QEMU {board.qemu_machine}"
    ctx.progress(f"training on {board.name} {where}", 0.05)
    try:
        return run_firmware(board, elf, workdir, files, timeout_s, progress=ctx.progress,
                            epochs=int(ctx.config["train.epochs"]),
                            samples_per_step=int(ctx.config.get("train.batch_size") or 1)), None
    except EmulationError as e:
        return e.result, e


# ---- failures ------------------------------------------------------------------------------------

def _explain_failure(err: EmulationError, rc: RuntimeConfig, log_text: str) -> StageFailed:
    """A NaN loss is the user's learning rate, not a crash: say which step and what to change."""
    result = err.result
    results = _parse_results(result)
    losses = _losses(result.files.get("losses.bin", b"")) if result is not None else []
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if (results or {}).get("loss_nan") or bad is not None:
        return diverged(bad if bad is not None else max(len(losses) - 1, 0), rc, str(err))
    return err


def diverged(step: int, rc: RuntimeConfig, detail: str = "") -> DivergedError:
    e = DivergedError(f"loss became NaN at step {step}: lower train.learning_rate (now {rc.learning_rate:g})"
                      + (f"\n{_indent(detail)}" if detail else ""),
                      hint="steps count sample steps from 0 over all epochs; try a learning rate 10x smaller")
    return e


def _indent(text: str) -> str:
    return "\n".join("  " + ln for ln in text.splitlines())


def _parse_results(result: RunResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    if isinstance(result.results, dict):
        return result.results
    raw = result.files.get("results.json")
    try:
        return json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _losses(raw: bytes) -> list[float]:
    n = len(raw) // 4
    return [float(v) for v in struct.unpack(f"<{n}f", raw[: 4 * n])]


# ---- results -------------------------------------------------------------------------------------

def collect(result: RunResult, layout: Mapping[str, Any], rc: RuntimeConfig) -> dict[str, Any]:
    """Check the firmware's outputs against the protocol; raise on anything missing or diverged."""
    res = _parse_results(result)
    for name in ("results.json", "losses.bin", "weights.bin"):
        if name not in result.files:
            raise StageFailed(f"the firmware ended without writing {name} (protocol {PROTOCOL})"
                              + _console_tail(result))
    if not isinstance(res, dict) or res.get("protocol") != PROTOCOL:
        raise StageFailed(f"results.json speaks protocol {None if not isinstance(res, dict) else res.get('protocol')}, "
                          f"expected {PROTOCOL}" + _console_tail(result))
    losses = _losses(result.files["losses.bin"])
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if res.get("loss_nan") or bad is not None:
        raise diverged(bad if bad is not None else len(losses), rc, _console_tail(result).strip())
    return {"results": res, "losses": losses, "weights": result.files["weights.bin"]}


def _console_tail(result: RunResult, n: int = 15) -> str:
    lines = [ln for ln in result.console.splitlines() if not ln.startswith("@tt progress")]
    return ("\n  last lines of the console:\n" + "\n".join("    " + ln for ln in lines[-n:])) if lines else ""


def run_log(result: RunResult | None, rc: RuntimeConfig, board: Board,
            hosts: Mapping[str, RunResult] | None = None) -> str:
    if result is None:
        return ""
    # Progress lines are for the live display; in the log one in 50 is plenty (the rest would be most of it).
    lines, seen = [], 0
    for ln in result.console.splitlines():
        if ln.startswith("@tt progress"):
            seen += 1
            if seen % 50 != 1:
                continue
        lines.append(ln)
    # The ELF runs from a temp folder; its name alone keeps the log the same bytes run to run.
    cmd = " ".join(Path(c).name if c.endswith("firmware.elf") else c for c in result.command)
    parts = [f"# {board.name}: {cmd}",
             f"# runtime: {json.dumps(_rc_json(rc), sort_keys=True)}",
             f"# exit code {result.exit_code}; {seen} progress lines, 1 in 50 kept", "", "## console",
             "\n".join(lines).rstrip(), "", "## emulator log", result.log.rstrip() or "(empty)", ""]
    for phase, host in (hosts or {}).items():
        parts += [f"## host build, evaluation {phase} training (console)", host.console.rstrip() or "(empty)", ""]
    return "\n".join(parts)


def _rc_json(rc: RuntimeConfig) -> dict[str, Any]:
    return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in rc.__dict__.items()}


def pct(acc: Mapping[str, Any] | None) -> float | None:
    if not acc or not int(acc.get("total", 0)):
        return None
    return 100.0 * int(acc["correct"]) / int(acc["total"])


def mse_of(res: Mapping[str, Any], when: str, metric: str = "mse") -> float | None:
    """results.json's `<metric>_<when>_bits` (IEEE-754 float32 bit pattern: mse, or loss for named outputs) as a
    float; None when not evaluated."""
    bits, total = res.get(f"{metric}_{when}_bits"), res.get(f"{metric}_{when}_total")
    if bits is None or not int(total or 0):
        return None
    return float(struct.unpack("<f", struct.pack("<I", int(bits) & 0xFFFFFFFF))[0])


def _gate_settings(gate: Any) -> tuple[bool, float]:
    d = gate.model_dump() if hasattr(gate, "model_dump") else dict(gate or {})
    return bool(d.get("enabled", True)), float(d.get("min_delta", 0.0))


def _gate_verdict(doc: dict[str, Any], enabled: bool, gain: float | None, min_delta: float, unknown: str,
                  change: str) -> dict[str, Any]:
    """Seed 000's step 3, for any metric: keep the trained weights when `gain` (better is positive) reaches
    min_delta. `change` describes the measurement and ends with the comparison sign's place `{}`."""
    if not enabled:
        doc.update(accepted=True, reason="gate disabled: the trained weights are exported")
    elif gain is None:
        doc.update(accepted=True, reason=f"no test {unknown} to judge by: the trained weights are exported")
    elif gain >= min_delta:
        doc.update(accepted=True, reason=change.format(">=") + ": kept")
    else:
        doc.update(accepted=False, reason=change.format("<") + ": rejected, the ORIGINAL weights are exported")
    return doc


def gate_decision_mse(gate: Any, before: float | None, after: float | None, metric: str = "mse") -> dict[str, Any]:
    """The regression gate (and, with metric "loss", the named outputs' one on the test loss): lower is better;
    kept when before - after >= min_delta (in the metric's units)."""
    enabled, min_delta = _gate_settings(gate)
    known = before is not None and after is not None and math.isfinite(before) and math.isfinite(after)
    gain = (before - after) if known else None
    doc: dict[str, Any] = {"enabled": enabled, "metric": metric, f"min_delta_{metric}": min_delta,
                           f"improvement_{metric}": gain}
    label = "MSE" if metric == "mse" else "test loss"
    change = (f"{label} {before:.4g} -> {after:.4g} (improvement {gain:+.4g} {{}} {min_delta:+.4g})" if known else "")
    return _gate_verdict(doc, enabled, gain, min_delta, label, change)


def gate_decision(gate: Any, before: float | None, after: float | None) -> dict[str, Any]:
    """The classification gate: kept when accuracy after - before >= min_delta (percentage points)."""
    enabled, min_delta = _gate_settings(gate)
    gain = None if before is None or after is None else after - before
    doc: dict[str, Any] = {"enabled": enabled, "min_delta_points": min_delta,
                           "delta_points": None if gain is None else round(gain, 4)}
    change = (f"accuracy {before:.1f}% -> {after:.1f}% (change {gain:+.1f} {{}} {min_delta:+.1f} points)"
              if gain is not None else "")
    return _gate_verdict(doc, enabled, gain, min_delta, "accuracy", change)


def finish(out: Path, outcome: dict[str, Any], qgraph: Graph, layout: Mapping[str, Any], n_buffers: int,
           rc: RuntimeConfig, gate: Any, board: Board, size: Mapping[str, Any], data_info: Mapping[str, Any],
           result: RunResult, estimate: dict[str, Any] | None = None,
           updates: dict[str, Any] | None = None, phases: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write run.json, loss.svg/.png, weights.bin, trained.wof, trained_int8.tflite; return run.json's document."""
    res, losses = outcome["results"], outcome["losses"]
    entries = list(layout.get("trained_tensors") or [])
    trained = export.parse_weights(entries, outcome["weights"])
    names = export.resolve(qgraph, entries)
    before, after = pct(res.get("acc_before")), pct(res.get("acc_after"))
    regression = res.get("task") == "regression"
    outputs = res.get("task") == "loss"  # named outputs: the test split's mean training loss
    if regression:
        mse_before, mse_after = mse_of(res, "before"), mse_of(res, "after")
        decision = gate_decision_mse(gate, mse_before, mse_after)
    elif outputs:
        loss_before, loss_after = mse_of(res, "before", "loss"), mse_of(res, "after", "loss")
        decision = gate_decision_mse(gate, loss_before, loss_after, "loss")
    else:
        decision = gate_decision(gate, before, after)
    chosen = trained if decision["accepted"] else export.original_weights(qgraph, entries)

    (out / "weights.bin").write_bytes(outcome["weights"])
    wdata, not_in_wof = export.wof_data(qgraph, chosen, names)
    changed = {n: int(np.count_nonzero(trained[n] != qgraph.tensors[names[n]].data)) for n in trained}

    steps = len(losses)
    epochs = max(int(rc.epochs), 1)
    per_epoch = steps // epochs if steps % epochs == 0 and steps else None
    clock = BOARD_CLOCK_HZ.get(board.name)
    mean = float(res.get("instructions_per_step_mean") or 0)
    counted = not board.host and mean > 0
    instr = {"counted": counted, "per_step_mean": mean if counted else None,
             "per_step_min": int(res.get("instructions_per_step_min") or 0) if counted else None,
             "per_step_max": int(res.get("instructions_per_step_max") or 0) if counted else None,
             "total_train": int(res.get("instructions_total_train") or 0) if counted else None,
             "total_run": result.instructions if counted else None,
             "how": (f"QEMU -icount shift=0: SysTick counts every {board.instructions_per_tick} instructions" if counted
                     else "not counted on host")}
    one_cpi = None
    if counted and clock:
        ms = mean / clock * 1e3
        one_cpi = {"clock_hz": clock, "cycles_per_step": mean, "ms_per_step": ms,
                  "assumption": "1 cycle per instruction (an estimate: QEMU counts instructions, not cycles)",
                  "tte_reference": {"ms_per_step": TTE_MS_PER_STEP, "clock_hz": TTE_CLOCK_HZ,
                                    "cycles_per_step": TTE_CYCLES_PER_STEP,
                                    "model": "MobileNetV2-w0.35 @128, sparse update (MIT TTE, STM32F746)",
                                    "ratio": round(mean / TTE_CYCLES_PER_STEP, 6)}}
    planned, used = int(res.get("arena_bytes_planned") or 0), int(res.get("arena_bytes_used") or 0)
    # The arena's size is the planned end of the highest buffer rounded up to 16-byte alignment: the padding is
    # never written, so "used == arena size" cannot hold exactly. Firmware since `arena_end_planned` compares the
    # used size (scanned by 32-bit word) with the planned end of the last buffer rounded up to a word.
    end = res.get("arena_end_planned")
    target = int(end) if end is not None else planned
    flash, sram = size.get("flash", {}), size.get("sram", {})
    doc: dict[str, Any] = {
        "version": RUN_JSON_VERSION, "protocol": res.get("protocol"), "board": board.name, "host": board.host,
        "runtime": _rc_json(rc),
        "data": dict(data_info),
        "loss": {"per_step": [_f(v) for v in losses], "steps": steps, "epochs": epochs,
                 "steps_per_epoch": per_epoch,
                 "epoch_mean": ([_f(float(np.mean(losses[i * per_epoch:(i + 1) * per_epoch])))
                                 for i in range(epochs)] if per_epoch else None),
                 "first": _f(losses[0]) if losses else None, "last": _f(losses[-1]) if losses else None},
        "accuracy": {"split": "test", "before": res.get("acc_before"), "after": res.get("acc_after"),
                     "before_pct": _r(before), "after_pct": _r(after),
                     "delta_points": None if before is None or after is None else _r(after - before)},
        **({"mse": {"split": "test", "before": _mse(mse_before), "after": _mse(mse_after),
                    "delta": (None if mse_before is None or mse_after is None else _mse(mse_after - mse_before)),
                    "samples": int(res.get("mse_after_total") or res.get("mse_before_total") or 0),
                    "how": "mean over the test samples of the mean over outputs of (prediction - target)^2, "
                           "float32 on the device (results.json mse_*_bits)"}} if regression else {}),
        **({"test_loss": {"split": "test", "before": _mse(loss_before), "after": _mse(loss_after),
                          "delta": (None if loss_before is None or loss_after is None
                                    else _mse(loss_after - loss_before)),
                          "samples": int(res.get("loss_after_total") or res.get("loss_before_total") or 0),
                          "how": "mean over the test samples of the training loss (every trained output's weighted "
                                 "loss), float32 on the device (results.json loss_*_bits)"}} if outputs else {}),
        "steps": int(res.get("steps") or steps), "samples": int(res.get("samples") or 0),
        "instructions": instr, "cycles_estimate": one_cpi,
        "cycles_per_step_estimate": estimate or {"traced": False, "reason": "not requested"},
        "stack": {"high_water_bytes": result.stack_high_water, "size_bytes": result.stack_size},
        "arena": {"planned_bytes": planned, "planned_end_bytes": target, "used_bytes": used, "equal": used == target,
                  "definition": ("used: end of the highest 32-bit word of the arena that no longer holds the paint "
                                 "pattern 0xDEADBEEF after the run; equal: used == planned_end_bytes, the planned "
                                 "end of the last buffer (max offset + size) rounded up to 4 bytes; planned_bytes "
                                 "is the arena's size (that end rounded up to the 16-byte alignment)")},
        "memory": {"flash_used": flash.get("used"), "flash_available": flash.get("available"),
                   "sram_used": sram.get("used"), "sram_available": sram.get("available"),
                   "fits": size.get("fits"), "source": "cross-compile/size.json"},
        "gate": decision,
        **({"phases": phases} if phases else {}),
        **({"checkpoint": outcome["checkpoint"]} if outcome.get("checkpoint") else {}),
        "export": {"weights": "trained" if decision["accepted"] else "original",
                   "wof": "trained.wof", "wof_n_buffers": n_buffers, "wof_absent_offset": wof.ABSENT,
                   "wof_tensors": sorted(wdata), "not_in_wof": not_in_wof,
                   "tflite": "trained_int8.tflite", "firmware_weights": "weights.bin",
                   "tensors": [{"name": e["name"], "source_index": e.get("source_index"), "dtype": e["dtype"],
                                "shape": list(e["shape"]), "elements_changed": changed[str(e["name"])]}
                               for e in entries]},
    }
    if updates is not None:
        doc["updates"] = updates
    if layout.get("precision") == "fp16-mixed":   # issue 13: the loss scale the run ended with, and the skipped steps
        doc["precision"] = "fp16-mixed"
        doc["loss_scale"] = {"final": float(np.frombuffer(np.uint32(res.get("loss_scale_bits", 0)).tobytes(),
                                                          np.float32)[0]),
                             "skipped_steps": int(res.get("skipped_steps", 0)), "policy": layout.get("loss_scale")}
    # int8 weights stuck at the ends of their range after training (issue 17, item 2: a saturating tensor needs a
    # wider scale); "before": the same count in the model as quantized.
    at_limit = lambda a: int(np.sum(np.abs(np.asarray(a).astype(np.int32)) >= 127))  # noqa: E731
    doc["saturation"] = {n: {"elements": int(a.size), "at_limit_after": at_limit(a),
                             "at_limit_before": at_limit(qgraph.tensors[names[n]].data)}
                         for n, a in trained.items() if a.dtype == np.int8}
    doc["summary"] = summary_line(doc)
    # The loss picture (~0.5 s of matplotlib on MobileNetV2) is drawn by a forked worker while the exports are
    # written here: both come last in the build's critical path.
    with Background(lambda: loss_picture(doc)) as picture:
        export.write_tflite(export.apply_weights(qgraph, chosen, names), out / "trained_int8.tflite")
        wof.write_wof(out / "trained.wof", n_buffers, wdata)
        (out / "run.json").write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        picture.result().write(out / "loss")
    return doc


def _f(v: float) -> float:
    return float(np.float32(v))


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _mse(v: float | None) -> float | None:
    # Non-finite values cannot go into run.json (allow_nan=False): a diverged MSE shows as null.
    return None if v is None or not math.isfinite(v) else float(v)


# ---- helpers -------------------------------------------------------------------------------------

def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StageFailed(f"cannot read {what}: {e}") from None


def _original_tensor_count(cfg: Mapping[str, Any], ctx: StageContext) -> int:
    """The .wof's n_buffers: tensors in the ORIGINAL model file (what onert-micro checks it against)."""
    model = cfg.get("model")
    path = getattr(model, "path", None) if model is not None else None
    if path is not None and Path(path).is_file():
        return export.model_tensor_count(Path(path))
    return export.graph_tensor_count(_read_json(ctx.input("load/graph.json"), "load's graph.json"))
