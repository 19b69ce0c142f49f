"""A procedural, learnable 10-class image task, shared by the zoo model's pretraining (tests/make_zoo.py) and the
device fine-tuning data (bench/make_mbv2_data.py), so that the fine-tuning data is a *shifted* variant of what the
zoo model was pretrained on — the situation on-device training is for (a deployed camera sees other colours than
the training set did).

    images(labels, rng, domain="source") -> uint8 (N, 128, 128, 3)

Class c is an oriented sinusoidal grating in a soft-edged disc on a textured background:
  orientation  (c % 5) * 36 degrees (+- 4 degrees jitter), 3.5..6 cycles per image, random phase;
  colour       the grating's hue comes from a family: c < 5 "warm" (red..orange), c >= 5 "cool" (cyan..blue);
  position, radius, background hue/brightness and a blocky noise texture are random per sample.
So a network has to read both the orientation and the colour family of the disc to tell the 10 classes apart.

domain="source" (pretraining) draws hues from the families above. domain="shifted" (fine-tuning) rotates every
hue by HUE_SHIFT degrees (warm becomes yellow-green, cool becomes violet) and dims the image: the orientation
cue survives, the colour cue is out of the pretraining distribution, so the pretrained network loses part of its
accuracy and the late layers have something to re-learn.

Deterministic: everything comes from the caller's numpy Generator. numpy only (tests/make_zoo.py runs it under
TensorFlow's interpreter, the benchmark under tinytrain's).
"""

from __future__ import annotations

import numpy as np

SIZE = 128
CLASSES = 10
ORIENTATIONS = 5
WARM = (-10.0, 35.0)     # hue ranges in degrees, red..orange
COOL = (185.0, 235.0)    # cyan..blue
HUE_SHIFT = 75.0         # the fine-tuning domain's hue rotation
DOMAINS = ("source", "shifted")


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """h in degrees, s and v in [0, 1] (arrays of the same shape) -> (..., 3) RGB in [0, 1]."""
    h = np.mod(h, 360.0) / 60.0
    c = v * s
    x = c * (1 - np.abs(np.mod(h, 2) - 1))
    z = np.zeros_like(h)
    k = np.floor(h).astype(int) % 6
    rgb = np.select([k[..., None] == i for i in range(6)],
                    [np.stack(t, -1) for t in ((c, x, z), (x, c, z), (z, c, x), (z, x, c), (x, z, c), (c, z, x))])
    return rgb + (v - c)[..., None]


def images(labels: np.ndarray, rng: np.random.Generator, domain: str = "source") -> np.ndarray:
    """Render one image per label (ints in 0..9) in `domain` ("source" or "shifted")."""
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {DOMAINS}, not {domain!r}")
    labels = np.asarray(labels, dtype=np.int64)
    yy, xx = np.meshgrid(np.arange(SIZE, dtype=np.float64), np.arange(SIZE, dtype=np.float64), indexing="ij")
    out = np.empty((len(labels), SIZE, SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        theta = np.deg2rad((c % ORIENTATIONS) * 180.0 / ORIENTATIONS + rng.uniform(-4, 4))
        freq = rng.uniform(3.5, 6.0) / SIZE
        grating = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (np.cos(theta) * xx + np.sin(theta) * yy)
                                     + rng.uniform(0, 2 * np.pi))
        cy, cx = rng.uniform(40, SIZE - 40, size=2)
        r = rng.uniform(30, 48)
        disc = np.clip((r - np.hypot(yy - cy, xx - cx)) / 4.0, 0, 1)   # soft edge, 4 px
        lo, hi = WARM if c < ORIENTATIONS else COOL
        hue = rng.uniform(lo, hi) + (HUE_SHIFT if domain == "shifted" else 0.0)
        fg = _hsv_to_rgb(np.array(hue), np.array(rng.uniform(0.65, 1.0)), np.array(rng.uniform(0.75, 1.0)))
        bg = _hsv_to_rgb(np.array(rng.uniform(0, 360)), np.array(rng.uniform(0.0, 0.3)),
                         np.array(rng.uniform(0.15, 0.45)))
        # Blocky noise (one value per 8x8 patch): texture the network must ignore; it also compresses well.
        noise = np.kron(rng.standard_normal((SIZE // 8, SIZE // 8, 1)), np.ones((8, 8, 1))) * 0.06
        stripes = bg * (1 - grating[..., None]) + fg * grating[..., None]
        img = bg + disc[..., None] * (stripes - bg) + noise
        if domain == "shifted":
            img = 0.8 * img + 0.05   # a dimmer, lower-contrast camera
        out[i] = np.clip(np.round(img * 255.0), 0, 255).astype(np.uint8)
    return out


def to_model_input(x: np.ndarray) -> np.ndarray:
    """uint8 pixels -> the zoo model's float input range [-1, 1] (MobileNetV2's preprocess_input)."""
    return (x.astype(np.float32) / np.float32(127.5) - np.float32(1.0)).astype(np.float32)
