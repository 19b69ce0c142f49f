"""What a build prints: one line per stage, and a live progress line while a stage runs.

Lines go to stdout, or to stderr when stdout carries the `--json` document. The live line (rich)
only appears on a terminal, so logs and CI output stay one line per stage.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape


class BuildLog:
    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False):
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self._status: Any = None

    def line(self, text: str, style: str | None = None) -> None:
        if not self.quiet:
            self.console.print(escape(text), style=style)

    # ---- a running stage ---------------------------------------------------------------------
    def started(self, stage: str) -> None:
        if self.quiet or not self.console.is_terminal:
            return
        self._status = self.console.status(f"[{escape(stage)}] running…")
        self._status.start()

    def progress(self, stage: str, message: str, fraction: float | None = None) -> None:
        if self._status is None:
            return
        pct = f" {fraction * 100:.0f}%" if fraction is not None else ""
        self._status.update(f"[{escape(stage)}] {escape(message)}{pct}")

    def finished(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    # ---- one line per stage ------------------------------------------------------------------
    def ran(self, stage: str, duration_s: float, summary: str) -> None:
        self.line(f"[{stage}] ran in {format_seconds(duration_s)}{_tail(summary)}")

    def cached(self, stage: str, key: str, summary: str) -> None:
        self.line(f"[{stage}] cached (key {key[:6]}…){_tail(summary)}", style="dim")

    def failed(self, stage: str, message: str) -> None:
        self.line(f"[{stage}] failed: {message.splitlines()[0] if message else ''}", style="red")


def _tail(summary: str) -> str:
    return f" — {summary}" if summary else ""


def format_seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f}s"
    if s < 120:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"
