"""Run a list of doit task dicts through doit's Python API.

doit orders the tasks by `task_dep` and skips a task whose `uptodate` callables all return True.
We keep doit's own dependency database in a throw-away folder: the up-to-date decision is the
action-cache lookup inside `uptodate`, and a database of file timestamps must never overrule it.
doit prints nothing; the runner reports, and doit's own failures come back as a list.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.reporter import ZeroReporter
from doit.task import dict_to_task


class _Recorder(ZeroReporter):
    """Collects doit's own error messages instead of printing them."""

    messages: list[str] = []

    def runtime_error(self, msg: str) -> None:
        type(self).messages.append(msg)

    def add_failure(self, task: Any, fail_info: Any) -> None:
        type(self).messages.append(f"{task.name}: {fail_info.get_msg()}")


class _Loader(TaskLoader2):
    def __init__(self, tasks: list[dict[str, Any]], config: dict[str, Any]):
        super().__init__()
        self._tasks = tasks
        self._config = config

    def setup(self, opt_values: dict[str, Any]) -> None:
        pass

    def load_doit_config(self) -> dict[str, Any]:
        return dict(self._config)

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
        return [dict_to_task(dict(t)) for t in self._tasks]


def run_tasks(tasks: list[dict[str, Any]], targets: list[str]) -> tuple[int, list[str]]:
    """Run `targets` (and their task_dep) from `tasks`. Returns doit's exit code and its messages."""
    # A fresh class per call: the recorder's list must not leak between builds in one process.
    recorder = type("Recorder", (_Recorder,), {"messages": []})
    with tempfile.TemporaryDirectory(prefix="tinytrain-doit-") as tmp:
        config = {
            "dep_file": str(Path(tmp) / "doit-db.json"),
            "backend": "json",
            "verbosity": 2,
            "reporter": recorder,
            "default_tasks": list(targets),
        }
        # config_filenames=(): doit must not pick up a [tool.doit] section from the user's folder.
        code = DoitMain(_Loader(tasks, config), config_filenames=()).run(["run", *targets])
    return code, list(recorder.messages)
