"""The contribution analysis' unit keys and the persistent unit cache (one JSON memo per measured unit).

Each unit's key is sha256 of {graph content digest, data digest, the unit's plan (weights by tensor name), the
analysis settings} (+ the task and, for named outputs, the heads trained, when not classification: existing
classification keys stay valid). A unit whose inputs did not change is never measured twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from tinytrain.stages.model.ir import Graph, canonical_json, npz_bytes
from tinytrain.stages.planning.train_plan import TrainPlan

UNIT_VERSION = 2      # 2: the suffix after a cached frozen prefix, float conv2d by BLAS (last bits differ from 1)
# What a unit records per task: the measured value, in contributions.json's units and the unit cache.
UNIT_VALUE = {"classification": "accuracy", "regression": "mse", "outputs": "loss"}


def graph_digest(graph: Graph) -> str:
    h = hashlib.sha256()
    h.update(canonical_json(graph.to_json()).encode())
    h.update(npz_bytes({t.name: t.data for t in graph.constants()}))
    return h.hexdigest()


def unit_key(graph_dig: str, data_dig: str, plan: TrainPlan | None, settings: Any,
             task: str = "classification", heads: Any = None) -> str:
    """`settings`: contribution_measure.AnalysisSettings; `heads`: Task.key_json() (named outputs)."""
    doc = {"unit_version": UNIT_VERSION, "graph": graph_dig, "data": data_dig,
           "plan": plan.to_json() if plan is not None else None, "settings": settings.unit_json()}
    if task != "classification":     # classification keys stay what they were (existing caches stay valid)
        doc["task"] = task
    if heads is not None:
        doc["heads"] = heads
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _is_unit(doc: Any) -> bool:
    return isinstance(doc, dict) and any(v in doc for v in UNIT_VALUE.values())


def _unit_digest(key: str, doc: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({"key": key, "unit": doc}).encode()).hexdigest()


def plausible_unit(doc: dict[str, Any]) -> bool:
    """A measurement that can be true: an accuracy in [0, 1]; an MSE or a loss >= 0 (or null for a diverged
    run)."""
    acc = doc.get("accuracy")
    num = (int, float)
    if "accuracy" in doc and not (isinstance(acc, num) and not isinstance(acc, bool) and 0.0 <= acc <= 1.0):
        return False
    for key in ("mse", "loss"):
        v = doc.get(key, 0.0)
        if v is not None and not (isinstance(v, num) and not isinstance(v, bool) and math.isfinite(v) and v >= 0.0):
            return False
    return True


class UnitCache:
    """One JSON file per measured unit: <dir>/<key[:2]>/<key>.json, written atomically (temp + rename), so two
    builds measuring at once at worst measure a unit twice. Content-checked like every other cache entry: a memo
    holds its key and the sha256 of (key, measurement); one whose digest does not match (edited, truncated, of an
    older format) or whose value cannot be true (an accuracy outside [0, 1]) is dropped and measured again.
    `refresh` (the runner's `--force` of the stage): every unit is measured again and its memo rewritten."""

    def __init__(self, directory: Path, refresh: bool = False):
        self.dir = Path(directory)
        self.refresh = refresh
        self.dropped = 0          # memos found bad (log/metrics only; never written into an artifact)

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.refresh:
            return None
        path = self._path(key)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            entry = None
        doc = entry.get("unit") if isinstance(entry, dict) else None
        if (isinstance(doc, dict) and entry.get("key") == key and _is_unit(doc) and plausible_unit(doc)
                and entry.get("digest") == _unit_digest(key, doc)):
            # mtime is the memo's last use for the store's gc (cache.store.Cache.gc: --max-age and least recently
            # used first), as ObjectCache.fetch does for objects; a cache that cannot be written keeps the old time.
            with contextlib.suppress(OSError):
                os.utime(path)
            return doc
        self.dropped += 1
        path.unlink(missing_ok=True)
        return None

    def put(self, key: str, doc: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"key": key, "unit": doc, "digest": _unit_digest(key, doc)}, sort_keys=True))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
