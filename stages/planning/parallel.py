"""Independent, deterministic planning work side by side on every core: forked workers (issue 14: `auto` on
MobileNetV2 within two minutes on two cores).

`fork_map(fn, items)` is [fn(x) for x in items] computed by worker_count() forked processes. Fork hands `fn` (often
a closure over large state: a graph, cached activations) to the workers without pickling it, and they start with
the parent's memory. Only the items and the results cross between processes. It returns None when that cannot be
done (no fork on this platform, a worker failed, a result or an exception that does not pickle): the caller then
computes in this process, where a failure is reported as it should be. Use it only for functions whose result
depends on their argument alone (seeded runs, pure functions): then where it ran does not matter.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence


def worker_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not on Linux
        return os.cpu_count() or 1


def fork_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int | None = None) -> list[Any] | None:
    n = min(workers or worker_count(), len(items))
    if n < 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    try:
        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_set_child_fn, initargs=(fn,)) as pool:
            return list(pool.map(_call_child_fn, items))
    except Exception:       # noqa: BLE001 -- computed again in this process, which reports a real failure
        return None


class Background:
    """fn() computed in one forked process while the caller goes on (a core the caller's single-threaded work leaves
    idle); `result()` waits for it. Computed in this process instead, at `result()`, on one core, where fork is
    missing, or when the worker failed (a failure is then reported here, as it should be). Only for a pure fn.
    Used in a `with` block, so that a caller that fails before asking for the result stops the worker. `nice`: the
    worker's niceness increment (os.nice), for work that should yield the CPU to the caller's."""

    def __init__(self, fn: Callable[[], Any], nice: int = 0):
        self.fn = fn
        self._pool: ProcessPoolExecutor | None = None
        self._future: Any = None
        if worker_count() < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return
        try:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_set_child_fn, initargs=(lambda _: fn(), nice))
            self._future = self._pool.submit(_call_child_fn, None)
        except Exception:       # noqa: BLE001 -- computed here at result()
            self._future = None

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the worker without waiting for its result (the caller failed before asking): it ends with its
        (short, pure) fn, and nothing waits on it or keeps its pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._future = None

    def result(self) -> Any:
        try:
            if self._future is not None:
                return self._future.result()
        except Exception:       # noqa: BLE001 -- computed again here, where a real failure is reported
            pass
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            self._future = None
        return self.fn()


_CHILD_FN: list[Callable[[Any], Any]] = []     # a worker's function (set by its initializer, in the child only)


def _set_child_fn(fn: Callable[[Any], Any], nice: int = 0) -> None:
    _CHILD_FN[:] = [fn]
    if nice:
        os.nice(nice)


def _call_child_fn(item: Any) -> Any:
    return _CHILD_FN[0](item)
