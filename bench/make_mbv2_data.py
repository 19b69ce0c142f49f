"""The fine-tuning data for the MobileNetV2-w0.35@128 device benchmark (bench/mbv2_tte.yaml): a small, shifted
variant of the task the zoo model was pretrained on.

    .venv/bin/python bench/make_mbv2_data.py [--out build/bench-data/mbv2_synth.npz] [--test-per-class N]

The zoo model (zoo:mbv2-w0.35-128, tests/make_zoo.py) was pretrained on bench/synth_images.py's "source" domain:
10 classes = 5 grating orientations x 2 hue families. This file holds the "shifted" domain of the same generator
(every hue rotated, the image dimmer: another camera), on which the pretrained network gets only part of the
classes right (the orientation cue survives, the colour cue moved) — so training on the device has something to
learn, and the loss per step and the test accuracy before/after show whether it does. A real image set would be
a large download; this one is a few hundred KB and made in a fraction of a second.

Small on purpose: QEMU runs 2-4e8 instructions per training step (and a forward pass per test sample, before and
after), so the spec trains on the first `train.max_train_samples` samples and the test split is TEST_PER_CLASS per
class (50 samples: the whole QEMU run, 40 steps and 100 test passes, takes about a minute).
For an accuracy comparison on the host (bench/int8_vs_fp32.py, no QEMU) 50 test samples are too coarse (one is 2
points, and the binomial error at 60 % is 7 points): `--test-per-class N` writes a larger test split of the same
domain (its own file, e.g. --out build/bench-data/mbv2_synth_t40.npz; the train split is unchanged).
Deterministic (fixed seed): the same bytes every time, so the build cache hits.

Pixels are stored as uint8 0..255; the spec maps them to [-1, 1] (scale 1/127.5, offset -1), the zoo model's input
range (its input quantization is scale 1/127.5, zero point 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth_images  # noqa: E402

# Under the repository's build/ (ignored by git): generated pixels need not be committed; the spec
# (bench/mbv2_tte.yaml) points there and bench/instructions_mbv2.py writes it before building.
DEFAULT_OUT = HERE.parent / "build" / "bench-data" / "mbv2_synth.npz"
CLASSES = synth_images.CLASSES
DOMAIN = "shifted"
TRAIN_PER_CLASS = 4   # 40 train samples: the run uses the first train.max_train_samples of them
TEST_PER_CLASS = 5    # 50 test samples: accuracy before/after costs two forward passes each in QEMU
SEED = 20240605       # not the pretraining seeds (tests/make_zoo.py): other images of the shifted domain


def _labels(per_class: int, rng: np.random.Generator) -> np.ndarray:
    # Each block of 10 holds every class once, in a shuffled order: the first k samples are near balanced
    # whatever max_train_samples is, and SGD at batch 1 does not see the classes in a fixed cycle.
    return np.concatenate([rng.permutation(CLASSES) for _ in range(per_class)]).astype(np.int64)


def arrays(test_per_class: int = TEST_PER_CLASS) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test (uint8 images, int64 labels) and class_names."""
    # One stream per split: changing the size of one split leaves the other's images as they were.
    tr, te = (np.random.default_rng(s) for s in np.random.SeedSequence(SEED).spawn(2))
    y_train, y_test = _labels(TRAIN_PER_CLASS, tr), _labels(test_per_class, te)
    x_train = synth_images.images(y_train, tr, DOMAIN)
    x_test = synth_images.images(y_test, te, DOMAIN)
    names = [f"{fam}_{o * 180 // synth_images.ORIENTATIONS}deg" for fam in ("warm", "cool")
             for o in range(synth_images.ORIENTATIONS)]
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
            "class_names": np.array(names)}


def make(out: Path = DEFAULT_OUT, test_per_class: int = TEST_PER_CLASS) -> Path:
    """Write the npz (x_train, y_train, x_test, y_test, class_names) to `out` unless identical bytes are there."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    # np.savez_compressed stores a fixed zip timestamp, so the bytes depend on the arrays only.
    np.savez_compressed(tmp, **arrays(test_per_class))
    if out.is_file() and out.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--test-per-class", type=int, default=TEST_PER_CLASS,
                    help=f"test samples per class (default {TEST_PER_CLASS}: the device benchmark's QEMU budget)")
    a = ap.parse_args(argv)
    if a.test_per_class < 1:
        print("make_mbv2_data: --test-per-class must be at least 1", file=sys.stderr)
        return 2
    p = make(a.out, a.test_per_class)
    print(f"{p} ({p.stat().st_size / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
