"""Running firmware: QEMU for the Cortex-M boards, the native executable for `host`.

`run_firmware(board, elf, workdir, files, timeout_s)` puts the input files into `workdir`, runs the
program there (semihosting opens files relative to QEMU's working directory), and returns a
`RunResult`: exit code, console, the files the program wrote, and the figures of its
"@tt exit" line (instructions, stack high-water mark). A fault, a hang or a non-zero exit raises
`EmulationError` with the last lines of the console and the emulator's log.

QEMU command (the choice that makes counts deterministic):

    qemu-system-arm -M <machine> -cpu <cpu> -nographic -monitor none -serial null
        -semihosting-config enable=on,target=native
        -icount shift=0,align=off,sleep=off -kernel firmware.elf

`-icount shift=0` ties virtual time to the instruction count (1 ns per instruction), `align=off`
and `sleep=off` keep the host's real time out of it. SysTick, clocked at the mps2 machines'
25 MHz, then advances once per 40 instructions, and `tt_instructions()` reads it: the same
firmware and input give the same count on every run and every machine, to 40 instructions. (A
TCG plugin would count exactly, but Debian's QEMU ships no plugins and the firmware could not
read a plugin's count per training step.)

The stage wrapper (`emulate-run`: lr/epochs/seed in, run.json/.wof out) comes with codegen; it
calls this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tinytrain.pipeline.contract import Progress, no_progress
from tinytrain.pipeline.errors import StageFailed, UserError
from tinytrain.stages.device.boards import Board

QEMU = "qemu-system-arm"
ICOUNT = "shift=0,align=off,sleep=off"

_EXIT_RE = re.compile(r"^@tt exit code=(-?\d+) instructions=(\S+) stack_high_water=(\S+) stack_size=(\S+)")
_PROGRESS_RE = re.compile(r"^@tt progress (\d+)/(\d+) ?(.*)$")
_FAULT_RE = re.compile(r"^@tt fault (.*)$")
_FAIL_RE = re.compile(r"^@tt fail (.*)$")

TAIL_LINES = 25
LOSS_WINDOW = 32  # values averaged into the running loss shown while training


@dataclass
class RunResult:
    board: str
    command: list[str]
    exit_code: int
    console: str                       # what the program printed (semihosting console / stdout)
    log: str                           # the emulator's (or native process's) stderr
    wall_s: float
    files: dict[str, bytes] = field(default_factory=dict)  # files the program created or changed
    instructions: int | None = None    # from the "@tt exit" line; None on host
    stack_high_water: int | None = None
    stack_size: int | None = None
    results: Any = None                # parsed results file (results.json), if the program wrote it

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class EmulationError(StageFailed):
    """The firmware faulted, hung, failed or exited non-zero. `kind`: fault, timeout, failed,
    exit, crash, results. `result` holds what the run produced."""

    def __init__(self, message: str, *, kind: str, result: RunResult, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind
        self.result = result


def qemu_command(board: Board, elf: Path) -> list[str]:
    return [QEMU, "-M", board.qemu_machine, "-cpu", board.qemu_cpu,
            "-nographic", "-monitor", "none", "-serial", "null",
            "-semihosting-config", "enable=on,target=native",
            "-icount", ICOUNT, "-kernel", str(elf)]


def run_firmware(board: Board, elf: Path, workdir: Path, files: Mapping[str, bytes | Path] | None = None,
                 timeout_s: float = 600.0, *, progress: Progress = no_progress, check: bool = True,
                 results_name: str | None = "results.json", losses_name: str | None = "losses.bin",
                 epochs: int | None = None, samples_per_step: int = 1) -> RunResult:
    """Run `elf` for `board` in `workdir` with `files` (name -> bytes or a path to copy) placed there.

    Progress: every "@tt progress done/total what" line of the console is passed on as it arrives,
    with the running loss (the mean of the last LOSS_WINDOW values the program has appended to
    `losses_name`, read as it grows) and, given the run's `epochs`, the epoch the step belongs to.

    Raises EmulationError when `check` and the program does not end with exit code 0; a timeout
    always raises (the process is killed)."""
    elf, workdir = Path(elf).resolve(), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, content in (files or {}).items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"input file name {name!r} must be relative to the run folder")
        dest = workdir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, (bytes, bytearray)):
            dest.write_bytes(content)
        else:
            shutil.copyfile(content, dest)
    for name in (results_name, losses_name):
        if name and name not in (files or {}):
            (workdir / name).unlink(missing_ok=True)  # a stale one must not pass for this run's
    before = _snapshot(workdir)

    if board.host:
        cmd, where = [str(elf)], "native"
    else:
        if shutil.which(QEMU) is None:
            raise UserError(f"{QEMU} is not installed; it is needed to run firmware for {board.name}",
                            hint="install qemu-system-arm (Debian: qemu-system-arm)")
        cmd, where = qemu_command(board, elf), f"QEMU {board.qemu_machine}"

    losses = _LossTail(workdir / losses_name) if losses_name else None
    try:
        console, log, rc, wall, timed_out = _execute(cmd, workdir, timeout_s, _StepReporter(progress, losses, epochs,
                                                                                        samples_per_step))
    finally:
        if losses is not None:
            losses.close()
    result = RunResult(board.name, cmd, rc, console, log, wall, _changed_files(workdir, before))
    exit_line = next((m for m in map(_EXIT_RE.match, reversed(console.splitlines())) if m), None)
    if exit_line:
        result.instructions = _int_or_none(exit_line.group(2))
        result.stack_high_water = _int_or_none(exit_line.group(3))
        result.stack_size = _int_or_none(exit_line.group(4))

    label = f"firmware on {board.name} ({where})"
    if timed_out:
        raise EmulationError(f"{label} did not finish within {timeout_s:g} s and was stopped (hang?)"
                             + _tail(console, log), kind="timeout", result=result,
                             hint="raise target.timeout_s if the program is merely slow")
    fault = next((m.group(1) for m in map(_FAULT_RE.match, console.splitlines()) if m), None)
    if fault is not None:
        raise EmulationError(f"{label} crashed: {fault} (exit code {rc})" + _tail(console, log),
                             kind="fault", result=result)
    if rc < 0:  # host: killed by a signal
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        raise EmulationError(f"{label} crashed: killed by signal {name}" + _tail(console, log),
                             kind="crash", result=result)
    if check and rc != 0:
        failed = next((m.group(1) for m in map(_FAIL_RE.match, console.splitlines()) if m), None)
        if failed is not None:
            raise EmulationError(f"{label} failed: {failed} (exit code {rc})" + _tail(console, log),
                                 kind="failed", result=result)
        what = "" if exit_line else " before the program reported its exit (emulator error?)"
        raise EmulationError(f"{label} exited with code {rc}{what}" + _tail(console, log),
                             kind="exit", result=result)
    if results_name and results_name in result.files:
        try:
            result.results = json.loads(result.files[results_name])
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise EmulationError(f"{label} wrote a {results_name} that is not valid JSON: {e}"
                                 + _tail(console, log), kind="results", result=result) from None
    return result


def trace_firmware(board: Board, elf: Path, workdir: Path, files: Mapping[str, bytes], feed: Any,
                   done: Any = lambda: False, timeout_s: float = 600.0) -> tuple[str, float]:
    """Run `elf` in QEMU with its execution log on (`-d in_asm,exec,nochain`, stages/device/cycles.py reads it) and pass
    every log line to `feed(line)`; stop the emulator as soon as `done()` says the window of interest is over.
    Returns (console, wall seconds). Only for the cycle estimate: the log costs ~60x the plain run per instruction."""
    if board.host:
        raise ValueError("a trace needs an emulated board, not host")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (workdir / name).write_bytes(content)
    cmd = qemu_command(board, Path(elf).resolve())
    cmd[-2:-2] = ["-d", "in_asm,exec,nochain"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    try:
        assert proc.stderr is not None
        for raw in proc.stderr:
            feed(raw.decode("utf-8", "replace").rstrip("\n"))
            if done():
                break
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=5)
    return b"".join(out).decode("utf-8", "replace"), time.monotonic() - start


class _LossTail:
    """The running loss of a training program: reads the float32 values it appends to its loss file
    (semihosting writes go straight to the host file), one per training step, and averages the LOSS_WINDOW values
    up to a given step. Up to that step, not the last ones read: the console line naming the step may be read
    after later losses were written, and the figure must not depend on that timing."""

    def __init__(self, path: Path):
        self.path = path
        self._file: Any = None
        self._rest = b""
        self._values: list[float] = []

    def running(self, upto: int | None = None) -> float | None:
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except OSError:  # not created yet
                return None
        data = self._rest + self._file.read()
        n = len(data) // 4
        self._rest = data[4 * n:]
        self._values.extend(struct.unpack(f"<{n}f", data[: 4 * n]))
        end = len(self._values) if upto is None else min(upto, len(self._values))
        window = self._values[max(0, end - LOSS_WINDOW):end]
        return sum(window) / len(window) if window else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class _StepReporter:
    """Turns the console's "@tt progress" lines into progress reports with step, epoch and loss."""

    def __init__(self, progress: Progress, losses: _LossTail | None, epochs: int | None, samples_per_step: int = 1):
        self.progress, self.losses, self.epochs = progress, losses, epochs
        # The program appends one loss per sample and reports progress per step (one update: batch_size samples).
        self.samples_per_step = max(1, int(samples_per_step))

    def line(self, line: str) -> None:
        m = _PROGRESS_RE.match(line)
        if not m:
            return
        done, total = int(m.group(1)), int(m.group(2))
        figures: dict[str, Any] = {"done": done, "total": total}
        if self.epochs and total >= self.epochs:
            per_epoch = total // self.epochs
            figures.update(epoch=min(self.epochs, max(0, done - 1) // per_epoch + 1), epochs=self.epochs)
        if self.losses is not None:
            loss = self.losses.running(done * self.samples_per_step)
            if loss is not None:
                figures["loss"] = loss
        self.progress(m.group(3) or "progress", done / total if total else None, **figures)


def _execute(cmd: list[str], cwd: Path, timeout_s: float,
             reporter: _StepReporter) -> tuple[str, str, int, float, bool]:
    """Run, streaming the console for "@tt progress" lines; kill at the deadline."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out_lines: list[str] = []
    err_chunks: list[bytes] = []

    def read_out() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            out_lines.append(line)
            reporter.line(line.rstrip("\n"))

    def read_err() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read(4096), b""):
            err_chunks.append(chunk)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
    finally:
        if proc.poll() is None:  # interrupted (e.g. Ctrl-C): never leave an emulator behind
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(timeout=5)
    wall = time.monotonic() - start
    return "".join(out_lines), b"".join(err_chunks).decode("utf-8", "replace"), proc.returncode, wall, timed_out


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _digest(p) for p in folder.rglob("*") if p.is_file()}


def _changed_files(folder: Path, before: dict[str, str]) -> dict[str, bytes]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            name = str(p.relative_to(folder))
            if before.get(name) != _digest(p):
                out[name] = p.read_bytes()
    return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _tail(console: str, log: str) -> str:
    parts = []
    lines = [ln for ln in console.splitlines() if not _PROGRESS_RE.match(ln)]
    if lines:
        parts.append("\n  last lines of the console:\n" + "\n".join("    " + ln for ln in lines[-TAIL_LINES:]))
    elines = log.strip().splitlines()
    if elines:
        parts.append("\n  emulator log:\n" + "\n".join("    " + ln for ln in elines[-TAIL_LINES:]))
    return "".join(parts) or "\n  (no console output)"
