"""Models users and benchmarks can name: `zoo:<name>` -> a converter-made .tflite shipped with tinytrain.

    resolve("zoo:mbv2-w0.35-128")  -> Path to stages/model/zoo_models/mbv2_w035_128_int8.tflite (shipped in the wheel)
    names()                        -> the known names

The files are made by tests/make_zoo.py with TensorFlow's own converter (see that script for how; the MobileNetV2
is pretrained on bench/synth_images.py's procedural task, since there is no network access for ImageNet weights).
A spec says `model: {path: zoo:mbv2-w0.35-128}`; `is_zoo_ref` tells such a path from a file path.
"""

from __future__ import annotations

from pathlib import Path

from tinytrain.pipeline.errors import UserError

PREFIX = "zoo:"
ZOO_DIR = Path(__file__).resolve().parent / "zoo_models"

# name -> (file in ZOO_DIR, one line for `tinytrain` help and error messages)
MODELS: dict[str, tuple[str, str]] = {
    "mbv2-w0.35-128": ("mbv2_w035_128_int8.tflite",
                       "MobileNetV2 width 0.35, 128x128x3, 10 classes, int8 (the TTE paper's network; pretrained on "
                       "a synthetic 10-class task, no ImageNet weights)"),
}
ALIASES = {"mbv2-w0.35-128-int8": "mbv2-w0.35-128"}


def names() -> list[str]:
    return sorted(MODELS)


def is_zoo_ref(value: str | Path) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve(ref: str) -> Path:
    """`zoo:<name>` (or a bare name) -> the model file; a clear error naming what exists otherwise."""
    name = ref[len(PREFIX):] if ref.startswith(PREFIX) else ref
    name = ALIASES.get(name, name)
    if name not in MODELS:
        # One line (a spec error is one located line); `tinytrain zoo`-style descriptions belong in the README.
        raise UserError(f"unknown zoo model {name!r} (known: {', '.join(f'zoo:{n}' for n in names())})")
    path = ZOO_DIR / MODELS[name][0]
    if not path.is_file():
        raise UserError(f"zoo model {name!r} is registered but its file {path} is missing",
                        hint="make it with tests/make_zoo.py (needs TensorFlow)")
    return path
