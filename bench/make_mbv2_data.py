"""A small synthetic 10-class image set for the MobileNetV2-w0.35@128 device benchmark (bench/mbv2_tte.yaml).

    /opt/ttvenv/bin/python bench/make_mbv2_data.py [--out build/bench-data/mbv2_synth.npz]

Why synthetic: the benchmark measures memory, fit and instructions per training step, not accuracy, and the zoo
model has random weights anyway; a real image set would be a large download for nothing. Each class is a smooth
colour pattern (a class-specific low-frequency sinusoid) plus blocky noise, so the classes are separable and the
file compresses well. Deterministic (fixed seed): the same bytes every time, so the build cache hits.

Pixels are stored as uint8 0..255; the spec maps them to [-1, 1] (scale 1/127.5, offset -1), the zoo model's input
range (its input quantization is scale 1/127.5, zero point 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# Under the repository's build/ (ignored by git): ~650 KB of generated pixels need not be committed; the spec
# (bench/mbv2_tte.yaml) points there and bench/instructions_mbv2.py writes it before building.
DEFAULT_OUT = HERE.parent / "build" / "bench-data" / "mbv2_synth.npz"
SIZE = 128
CLASSES = 10
TRAIN_PER_CLASS = 4   # 40 train samples: the run uses the first few (train.max_train_samples)
TEST_PER_CLASS = 1    # 10 test samples: accuracy before/after costs two forward passes each in QEMU
SEED = 20240605


def _images(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    yy, xx = np.meshgrid(np.linspace(0, 1, SIZE), np.linspace(0, 1, SIZE), indexing="ij")
    out = np.empty((len(labels), SIZE, SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        fx, fy = 1 + c % 5, 1 + c // 5
        phase = rng.uniform(0, 0.5)
        base = np.stack([np.sin(2 * np.pi * (fx * xx + fy * yy + phase + k / 3)) for k in range(3)], axis=-1)
        # Blocky noise (one value per 16x16 patch) varies the samples yet keeps the file small (it compresses).
        noise = np.kron(rng.standard_normal((SIZE // 16, SIZE // 16, 3)), np.ones((16, 16, 1)))
        img = 0.7 * base + 0.15 * noise
        out[i] = np.clip(np.round((img + 1) * 127.5), 0, 255).astype(np.uint8)
    return out


def make(out: Path = DEFAULT_OUT) -> Path:
    """Write the npz (x_train, y_train, x_test, y_test, class_names) to `out` unless identical bytes are there."""
    rng = np.random.default_rng(SEED)
    y_train = np.tile(np.arange(CLASSES), TRAIN_PER_CLASS).astype(np.int64)   # classes interleaved
    y_test = np.tile(np.arange(CLASSES), TEST_PER_CLASS).astype(np.int64)
    x_train, x_test = _images(rng, y_train), _images(rng, y_test)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    # np.savez_compressed stores a fixed zip timestamp, so the bytes depend on the arrays only.
    np.savez_compressed(tmp, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                        class_names=np.array([f"pattern{c}" for c in range(CLASSES)]))
    if out.is_file() and out.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    p = make(a.out)
    print(f"{p} ({p.stat().st_size / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
