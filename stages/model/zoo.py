"""Models users and benchmarks can name: `zoo:<name>` -> a converter-made .tflite shipped with tinytrain.

    resolve("zoo:mbv2-w0.35-128")  -> Path to stages/model/zoo_models/mbv2_w035_128_int8.tflite (shipped in the wheel)
    names()                        -> the known names

The files are made by tests/make_zoo.py with TensorFlow's own converter (see that script for how; the MobileNetV2
is pretrained on bench/synth_images.py's procedural task, since there is no network access for ImageNet weights).
A spec says `model: {path: zoo:mbv2-w0.35-128}`; `is_zoo_ref` tells such a path from a file path.

Variants (DERIVED) are made from a shipped file at first use by stages/model/zoo_derive.py, without TensorFlow and
deterministically (the same bytes every time), into a cache folder ($TINYTRAIN_ZOO_DIR, else
$XDG_CACHE_HOME/tinytrain/zoo, else ~/.cache/tinytrain/zoo): the MobileNetV2 at 96x96 and the float32 twins, so
the repository ships one 645 KB file instead of four (the float ones are 1.6 MB each).
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
# name -> (shipped base name, zoo_derive recipe, one line)
DERIVED: dict[str, tuple[str, list[tuple[str, int | None]], str]] = {
    "mbv2-w0.35-96": ("mbv2-w0.35-128", [("size", 96)],
                      "the same MobileNetV2 at 96x96x3, int8 (made from mbv2-w0.35-128 at first use)"),
    "mbv2-w0.35-128-float": ("mbv2-w0.35-128", [("float", None)],
                             "MobileNetV2 width 0.35, 128x128x3, float32: mbv2-w0.35-128's weights dequantized"),
    "mbv2-w0.35-96-float": ("mbv2-w0.35-128", [("size", 96), ("float", None)],
                            "MobileNetV2 width 0.35, 96x96x3, float32 (from mbv2-w0.35-128)"),
}
ALIASES = {"mbv2-w0.35-128-int8": "mbv2-w0.35-128", "mbv2-w0.35-96-int8": "mbv2-w0.35-96"}


def names() -> list[str]:
    return sorted([*MODELS, *DERIVED])


def cache_dir() -> Path:
    """Where derived variants are written (made once, then reused)."""
    import os

    if os.environ.get("TINYTRAIN_ZOO_DIR"):
        return Path(os.environ["TINYTRAIN_ZOO_DIR"])
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "tinytrain" / "zoo"


def is_zoo_ref(value: str | Path) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve(ref: str) -> Path:
    """`zoo:<name>` (or a bare name) -> the model file; a clear error naming what exists otherwise."""
    name = ref[len(PREFIX):] if ref.startswith(PREFIX) else ref
    name = ALIASES.get(name, name)
    if name in DERIVED:
        from tinytrain.stages.model import zoo_derive

        base, recipe, _ = DERIVED[name]
        try:
            return zoo_derive.derive(resolve(base), recipe, cache_dir())
        except OSError as e:
            raise UserError(f"zoo model {name!r} could not be written to {cache_dir()}: {e.strerror or e}",
                            hint="set TINYTRAIN_ZOO_DIR to a writable folder") from None
    if name not in MODELS:
        # One line (a spec error is one located line); `tinytrain zoo`-style descriptions belong in the README.
        raise UserError(f"unknown zoo model {name!r} (known: {', '.join(f'zoo:{n}' for n in names())})")
    path = ZOO_DIR / MODELS[name][0]
    if not path.is_file():
        raise UserError(f"zoo model {name!r} is registered but its file {path} is missing",
                        hint="make it with tests/make_zoo.py (needs TensorFlow)")
    return path
