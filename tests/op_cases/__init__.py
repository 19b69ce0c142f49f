"""The per-op case table of the op conformance test (tests/test_op_conformance.py).

Every module of this package declares `CASES = {op name: OpCase(...)}`; `load()` merges them. A new op gets every
check of the conformance test by adding its entry here (a new module, or a line in its family's), never by
editing the test. What an OpCase names:

  fixtures   converter-made .tflite files (paths under tests/fixtures/) that hold the op. Each instance of the op
             with int8 inputs is checked bit-exact against LiteRT's reference kernels and TFLite Micro on the
             oracle's own input tensors; instances with float inputs give the backward and float C checks; every
             instance is run through codegen's C and the kernel library (ASan/UBSan) against the numpy executor.
  torch      the op's PyTorch twin (attrs, inputs, output shapes) -> output or list of outputs; inputs are float64
             torch tensors for float operands, numpy arrays for integer constants (axes, shapes). None: the twin
             of tests/torch_mirror.py.
  tflm       why TFLite Micro is not an oracle of this op's int8 forward (None: it is).
  litert_ref False when LiteRT's reference resolver lacks the op's version (the converter's int8 DEPTH_TO_SPACE
             v2): LiteRT's builtin kernels without delegates are the oracle instead (a data-movement op has no
             arithmetic in which they could differ).

A module may also declare `FIXTURE_MODELS = {fixture name: function returning a keras.Model}`, the recipe of its
converter-made fixtures: tests/make_movement_fixtures.py writes <name>_float.tflite, <name>_int8.tflite and
<name>.input.npy under tests/fixtures/ops/ from it (TensorFlow imported inside the function, so the tests, which
only read the files, never need it). A new op's recipe then lives beside its cases.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpCase:
    fixtures: tuple[str, ...]
    torch: Callable | None = None
    tflm: str | None = None
    litert_ref: bool = True


def load() -> dict[str, OpCase]:
    out: dict[str, OpCase] = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{m.name}")
        for name, case in getattr(mod, "CASES", {}).items():
            if name in out:
                raise ValueError(f"op {name!r} has cases in two modules ({m.name})")
            out[name] = case
    return out


def fixture_models() -> dict[str, Callable]:
    """Every case module's FIXTURE_MODELS, merged (a name twice is an error)."""
    out: dict[str, Callable] = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        for name, make in getattr(importlib.import_module(f"{__name__}.{m.name}"), "FIXTURE_MODELS", {}).items():
            if name in out:
                raise ValueError(f"fixture model {name!r} is declared twice ({m.name})")
            out[name] = make
    return out
