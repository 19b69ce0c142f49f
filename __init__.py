"""tinytrain: compile a neural network into on-device training firmware for microcontrollers.

The Python API (documented in pipeline/api.py and the README):

    import tinytrain
    spec = tinytrain.load_spec("tinytrain.yaml", **{"train.epochs": 1})
    result = tinytrain.build(spec)                      # -> tinytrain.BuildResult
    print(tinytrain.inspect(spec, "quantize", "report.json"))

`import tinytrain` stays cheap: the API (and numpy, pydantic, rich behind it) is imported on first use.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from tinytrain.pipeline.errors import ModelError, SpecError, StageFailed, TinytrainError, UserError


_API = ("build", "load_spec", "inspect", "BuildResult", "StageInfo", "StageView")

__all__ = [*_API, "TinytrainError", "UserError", "SpecError", "ModelError", "StageFailed", "__version__"]


def _version() -> str:
    # pyproject.toml holds the version; the installed metadata carries it here. Read on first use: a metadata
    # lookup scans the installed distributions, which every `import tinytrain` (each CLI call) would pay for.
    try:
        return metadata.version("tinytrain")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    if name in _API:
        # By name, not by an import statement: this package __init__ belongs to every stage's cache key
        # (cache/imports.py follows import statements), and no stage uses the API.
        return getattr(importlib.import_module("tinytrain.pipeline.api"), name)
    raise AttributeError(f"module 'tinytrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API) | {"__version__"})
