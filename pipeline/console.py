"""What a build prints: one line per stage, and progress while a stage runs.

Lines go to stdout, or to stderr when stdout carries the `--json` document.

Progress depends on where the lines go (stages only report it, through `ctx.progress`; see
pipeline/contract.py):
  - a terminal: a live rich bar per running stage, with its elapsed time and ETA;
  - anything else (a pipe, a CI log): a plain line every `progress_every` seconds while a stage
    runs -- stage, elapsed time and what the stage last reported (step/total, epoch, running loss)
    -- so a long run never looks hung. `progress_every=0` prints every report as it comes.

Verbosity: 0 (`-q`) prints errors, warnings and the final result only; 1 the stage lines; 2 (`-v`)
adds the cache folder, full cache keys and per-stage timings of restores.
Colour: "auto" colours only a terminal and never when $NO_COLOR is set (https://no-color.org);
"always" and "never" are the explicit choices of `--color` and win over $NO_COLOR.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

QUIET, NORMAL, VERBOSE = 0, 1, 2
COLOR_CHOICES = ("auto", "always", "never")
PROGRESS_EVERY_S = 5.0


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def color_system(choice: str, stream: Any) -> str | None:
    """Rich's colour system for `choice` (auto | always | never) on `stream`; None: no escape codes."""
    if choice == "never":
        return None
    if choice == "always":
        return "auto" if _isatty(stream) else "standard"
    if os.environ.get("NO_COLOR", "") != "" or not _isatty(stream):
        return None
    return "auto"


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # Rich exits the process here; a build goes on (it fills the cache) and just stops printing.
        self.quiet = True
        silence_stream(self.file)


@dataclass
class _Report:
    """The last thing a running stage reported."""

    stage: str
    started: float
    message: str = "running"
    fraction: float | None = None
    done: int | None = None
    total: int | None = None
    epoch: int | None = None
    epochs: int | None = None
    loss: float | None = None

    def text(self, now: float | None) -> str:
        """The report as a log line; without `now` (for the live bar, which shows time and share itself)
        neither the elapsed time nor the percentage."""
        parts = [self.message]
        if self.done is not None:
            parts[0] += f" {self.done}/{self.total}" if self.total else f" {self.done}"
        if self.fraction is not None and now is not None:
            parts[0] += f" ({self.fraction * 100:.0f}%)"
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch}/{self.epochs}" if self.epochs else f"epoch {self.epoch}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        head = f"[{self.stage}] {format_seconds(now - self.started)} elapsed: " if now is not None else ""
        return head + ", ".join(parts)


class BuildLog:
    def __init__(self, stream: TextIO | None = None, *, verbosity: int = NORMAL, color: str = "auto",
                 progress_every: float = PROGRESS_EVERY_S, live: bool | None = None, quiet: bool = False):
        stream = stream or sys.stdout
        verbosity = QUIET if quiet else verbosity
        tty = _isatty(stream)
        self.console = _Console(file=stream, highlight=False, soft_wrap=True, force_terminal=tty,
                               color_system=color_system(color, stream))
        self.verbosity = verbosity
        self.progress_every = max(0.0, float(progress_every))
        # A live bar only where a cursor can redraw it; a CI log gets plain lines instead.
        self.live = (tty and not self.console.is_dumb_terminal) if live is None else live
        self._lock = threading.Lock()
        self._closed = False
        self._report: _Report | None = None
        self._bar: Any = None
        self._task: Any = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def quiet(self) -> bool:
        return self.verbosity <= QUIET

    # ---- plain lines -------------------------------------------------------------------------
    def line(self, text: str, style: str | None = None) -> None:
        if not self.quiet:
            self._print(text, style)

    def detail(self, text: str) -> None:
        """Only with -v: cache keys, timings, folders."""
        if self.verbosity >= VERBOSE:
            self._print(text, "dim")

    def result(self, text: str, style: str | None = None) -> None:
        """The final result: printed even with -q."""
        self._print(text, style)

    def warning(self, text: str) -> None:
        self._print(text, "yellow")

    def _print(self, text: str, style: str | None) -> None:
        with self._lock:
            if self._closed:
                return
            self.console.print(escape(text), style=style)
            self._closed = self.console.quiet  # the reader went away (`| head`): see _Console

    # ---- a running stage ---------------------------------------------------------------------
    def started(self, stage: str) -> None:
        if self.quiet or self._closed:
            return
        self._report = _Report(stage, time.monotonic())
        if self.live:
            from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("[{task.fields[stage]}]", markup=False), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.description}"), console=self.console, transient=True)
            self._task = self._bar.add_task("running", total=None, stage=stage)
            self._bar.start()
        elif self.progress_every > 0:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name=f"progress-{stage}", daemon=True)
            self._ticker.start()

    def progress(self, stage: str, message: str, fraction: float | None = None, *, done: int | None = None,
                 total: int | None = None, epoch: int | None = None, epochs: int | None = None,
                 loss: float | None = None) -> None:
        """A stage's report (called from the stage, possibly from one of its threads)."""
        rep = self._report
        if rep is None or rep.stage != stage:
            return
        with self._lock:
            rep.message, rep.fraction = message, fraction
            if fraction is None and done is not None and total:
                rep.fraction = done / total
            if done is not None or total is not None:
                rep.done, rep.total = done, total
            if epoch is not None:
                rep.epoch, rep.epochs = epoch, epochs
            if loss is not None:
                rep.loss = loss
            if self._bar is not None:
                pct = None if rep.fraction is None else min(100.0, max(0.0, rep.fraction * 100))
                self._bar.update(self._task, description=escape(rep.text(None)),
                                 total=100 if pct is not None else None, completed=pct or 0)
                return
        if self.progress_every == 0 and not self.live:
            self._print(rep.text(time.monotonic()), "dim")

    def _tick(self) -> None:
        while not self._stop.wait(self.progress_every):
            rep = self._report
            if rep is None:
                return
            self._print(rep.text(time.monotonic()), "dim")

    def finished(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._report = None

    # ---- one line per stage ------------------------------------------------------------------
    def ran(self, stage: str, duration_s: float, summary: str, key: str | None = None) -> None:
        self.line(f"[{stage}] ran in {format_seconds(duration_s)}{_tail(summary)}")
        if key:
            self.detail(f"[{stage}] stored under key {key}")

    def cached(self, stage: str, key: str, summary: str, restore_s: float | None = None) -> None:
        self.line(f"[{stage}] cached (key {key[:6]}…){_tail(summary)}", style="dim")
        if restore_s is not None:
            self.detail(f"[{stage}] key {key}, restored in {format_seconds(restore_s)}")

    def failed(self, stage: str, message: str) -> None:
        self.line(f"[{stage}] failed: {message.splitlines()[0] if message else ''}", style="red")


def silence_stream(stream: Any) -> None:
    """Point a broken stdout/stderr at /dev/null, so that the interpreter's final flush does not
    complain about the closed pipe either (see the Python docs on SIGPIPE)."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _tail(summary: str) -> str:
    return f" — {summary}" if summary else ""


def format_seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f}s"
    if s < 120:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"
