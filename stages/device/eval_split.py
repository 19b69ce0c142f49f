"""Training in QEMU, evaluation on the host build of the same program (issue 14 item 4).

The accuracy (MSE, test loss) before and after training is pure inference over the whole test split: on
MobileNetV2 it was 60 % of the instructions QEMU emulated in a build. cross-compile also builds `host_eval.elf`,
the same generated C and kernels compiled natively (stages/cross_compile.py); both sides use -ffp-contract=off, no
-ffast-math and no libm transcendental (kernels_c/boards/README.md), so the host's outputs are the firmware's bits.
That is checked on every run, not assumed:

  QEMU        trains as before, but evaluates only the first CHECK_SAMPLES test samples, before and after
              training, writing each sample's output bytes (runtime flag FLAG_EVAL_DUMP); it saves the trained
              state as a checkpoint (FLAG_SAVE_CHECKPOINT, stages/c_emit/api.py's format) after the last step.
  host, before  the original weights (or train.resume_from's checkpoint, as in QEMU), no training steps
              (epochs 0), evaluates the whole test split, dumping every output; runs while QEMU trains.
  host, after   resumes from QEMU's checkpoint, no training steps, evaluates the whole test split.
  check       QEMU's dumped outputs must equal the host's first CHECK_SAMPLES outputs byte for byte, before
              and after; any difference is a build error (EvalMismatch) naming the phase and the sample.

The figures then come from the host (accuracy, MSE or loss: results.json's `*_before*` / `*_after*` keys), the
rest (losses, weights, instruction counts, stack, arena) from QEMU. run.json's `phases` says where each ran.
"""

from __future__ import annotations

import dataclasses
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from tinytrain.pipeline.errors import StageFailed
from tinytrain.stages.device.boards import Board, get_board
from tinytrain.stages.device.launch import EmulationError, RunResult
from tinytrain.stages.train.runtime_config import (
    FLAG_EVAL_AFTER,
    FLAG_EVAL_BEFORE,
    FLAG_EVAL_DUMP,
    FLAG_RESUME,
    FLAG_SAVE_CHECKPOINT,
    RuntimeConfig,
)

# Test samples QEMU evaluates too, before and after training (each a forward pass: ~0.1 s of QEMU on MobileNetV2).
CHECK_SAMPLES = 2
PHASES = ("before", "after")
_FLAG = {"before": FLAG_EVAL_BEFORE, "after": FLAG_EVAL_AFTER}

# run(board, exe, workdir, files, progress_on) -> RunResult; raises EmulationError (stages/device/launch.py)
Runner = Callable[[Board, Path, Path, dict[str, bytes], bool], RunResult]


class EvalMismatch(StageFailed):
    """The host build's evaluation is not the firmware's, bit for bit."""


@dataclasses.dataclass
class SplitRun:
    result: RunResult | None          # QEMU's run, with the host's evaluation figures merged into its results
    error: EmulationError | None      # QEMU's failure (a diverged loss, a fault), as run_firmware raised it
    phases: dict[str, Any]            # run.json's `phases`
    hosts: dict[str, RunResult]       # the host runs by phase (their consoles go into run.log)


def wanted(rc: RuntimeConfig) -> tuple[str, ...]:
    """The evaluation phases the run asks for."""
    return tuple(p for p in PHASES if rc.flags & _FLAG[p])


def stream_head(raw: bytes, n: int) -> bytes:
    """The first `n` records of a TTDS stream (stages/train/data.py), as a stream."""
    from tinytrain.stages.train.data import read_stream, write_stream

    with tempfile.TemporaryDirectory(prefix="tinytrain-head-") as tmp:
        src, dst = Path(tmp) / "all.ttds", Path(tmp) / "head.ttds"
        src.write_bytes(raw)
        x, y, t = read_stream(src, targets=True)
        write_stream(dst, x[:n], y[:n], targets=None if t is None else t[:n])
        return dst.read_bytes()


def stream_count(raw: bytes) -> int:
    return int.from_bytes(raw[8:12], "little")  # the header's record count (<4sHBB then I)


def run_split(board: Board, elf: Path, host_elf: Path, workdir: Path, files: dict[str, bytes],
              rc: RuntimeConfig, run: Runner) -> SplitRun:
    """Train in QEMU and evaluate on the host (module docstring). Raises EvalMismatch when the sample disagrees,
    EmulationError when a host run fails."""
    phases = wanted(rc)
    n_test = stream_count(files["test.ttds"])
    check = min(CHECK_SAMPLES, n_test)
    qfiles = dict(files)
    qfiles["test.ttds"] = stream_head(files["test.ttds"], check)
    qfiles["runtime.bin"] = dataclasses.replace(rc, flags=rc.flags | FLAG_SAVE_CHECKPOINT | FLAG_EVAL_DUMP).to_bytes()
    host = get_board("host")
    root = Path(workdir)

    def host_run(phase: str, extra: dict[str, bytes], flags: int) -> RunResult:
        hfiles = {**files, **extra,
                  "runtime.bin": dataclasses.replace(rc, flags=flags | _FLAG[phase] | FLAG_EVAL_DUMP, epochs=0,
                                                     stop_after_steps=0).to_bytes()}
        return run(host, host_elf, root / f"host-{phase}", hfiles, False)

    with ThreadPoolExecutor(max_workers=1) as pool:
        # The evaluation before training needs nothing from QEMU: it runs on the other core meanwhile.
        early = (pool.submit(host_run, "before", {}, rc.flags & FLAG_RESUME) if "before" in phases else None)
        try:
            qemu = run(board, elf, root / "qemu", qfiles, True)
        except EmulationError as e:
            if early is not None:
                early.exception()  # wait for it; QEMU's failure is the one to report
            return SplitRun(e.result, e, {}, {})
        hosts = {"before": early.result()} if early is not None else {}
    if "after" in phases:
        ckpt = qemu.files.get("checkpoint.ttck")
        if ckpt is None:
            raise StageFailed("the firmware did not write the checkpoint the host evaluation resumes from")
        hosts["after"] = host_run("after", {"resume.ttck": ckpt}, FLAG_RESUME)
        status = int((hosts["after"].results or {}).get("checkpoint_status", -1))
        if status != 0:
            raise StageFailed(f"the host build refused the firmware's checkpoint (status {status}): the two builds "
                              "are not the same program")
    agreement = compare(qemu, hosts, check, n_test)
    merged = dict(qemu.results or {})
    for phase, res in hosts.items():
        for key, value in (res.results or {}).items():
            if f"_{phase}" in key:
                merged[key] = value
    qemu.results = merged
    where_q = f"QEMU {board.qemu_machine}"
    doc: dict[str, Any] = {"train": {"where": where_q}}
    for phase in phases:
        doc[f"evaluate_{phase}"] = {"where": "host", "executable": "cross-compile/host_eval.elf",
                                    "samples": n_test}
    doc["agreement"] = agreement
    return SplitRun(qemu, None, doc, hosts)


def compare(qemu: RunResult, hosts: dict[str, RunResult], check: int, n_test: int) -> dict[str, Any]:
    """QEMU's dumped outputs against the host's first `check` ones, per phase; EvalMismatch on any difference."""
    for phase, host in hosts.items():
        name = f"eval_{phase}.bin"
        q, h = qemu.files.get(name, b""), host.files.get(name, b"")
        check_outputs(phase, q, h, check, n_test)
    return {"samples_per_phase": check, "phases": sorted(hosts, key=PHASES.index), "equal": True,
            "how": f"the first {check} test samples are evaluated in QEMU too; every byte of their outputs equals "
                   "the host build's"}


def check_outputs(phase: str, qemu: bytes, host: bytes, check: int, n_test: int) -> None:
    """One phase's agreement: `qemu` holds `check` outputs, `host` `n_test` of the same size, the first equal."""
    if check == 0:
        return
    size = len(qemu) // check
    if size == 0 or len(qemu) != size * check or len(host) != size * n_test:
        raise EvalMismatch(f"the QEMU-vs-host evaluation check ({phase} training) got {len(qemu)} bytes of outputs "
                           f"from QEMU for {check} samples and {len(host)} from the host for {n_test}")
    for k in range(check):
        a, b = qemu[k * size:(k + 1) * size], host[k * size:(k + 1) * size]
        if a != b:
            at = next(i for i in range(size) if a[i] != b[i])
            raise EvalMismatch(f"the host build's evaluation differs from QEMU's {phase} training: test sample {k}, "
                               f"output byte {at} (QEMU {a[at]:#04x}, host {b[at]:#04x}); the native build of the "
                               "same C must give the same bits (see kernels_c/boards/README.md)")
