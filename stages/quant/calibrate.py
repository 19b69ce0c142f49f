"""Activation range calibration: run the float graph on calibration samples and pick, per tensor,
the real range [lo, hi] that its int8 encoding will cover.

Three methods (QuantizeSpec.calibration):
  minmax      the observed min and max: nothing is clipped, resolution suffers from outliers.
  percentile  clip at the p-th percentile of the values (and 100-p at the low end).
  mse         search a shrink factor of the min/max range that minimises the quantize-dequantize MSE
              over the observed values (what the converter's "MSE" mode and TensorRT's entropy-free
              calibrators do).

Observers keep the exact min/max plus a bounded, seeded sample of the values: percentiles and the MSE
search on ~256k values are within noise of the full set, and memory stays flat however many
samples calibrate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

QMIN, QMAX = -128, 127
SAMPLE_CAP = 1 << 18


@dataclass
class RangeObserver:
    seed: int = 0
    cap: int = SAMPLE_CAP
    lo: float = float("inf")
    hi: float = float("-inf")
    count: int = 0
    _chunks: list[np.ndarray] = field(default_factory=list, repr=False)
    _kept: int = 0

    def update(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float32).ravel()
        if v.size == 0:
            return
        self.lo = min(self.lo, float(v.min()))
        self.hi = max(self.hi, float(v.max()))
        self.count += v.size
        # Keep the sample proportional across batches: each batch may add at most its share of the
        # remaining room, so early batches do not crowd out later ones entirely.
        room = self.cap - self._kept
        if room <= 0:
            rng = np.random.default_rng([self.seed, self.count])
            pool = np.concatenate(self._chunks)
            take = min(v.size, self.cap // 4)
            pool[rng.choice(pool.size, take, replace=False)] = v[rng.choice(v.size, take, replace=False)]
            self._chunks = [pool]
            return
        if v.size > room:
            rng = np.random.default_rng([self.seed, self.count])
            v = v[rng.choice(v.size, room, replace=False)]
        self._chunks.append(v.copy())
        self._kept += v.size

    def values(self) -> np.ndarray:
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)

    def range(self, method: str = "minmax", percentile: float = 99.99) -> tuple[float, float]:
        if self.count == 0:
            raise ValueError("observer saw no values")
        if method == "minmax":
            return self.lo, self.hi
        vals = self.values()
        if method == "percentile":
            lo, hi = np.percentile(vals, [100.0 - percentile, percentile])
            return float(min(lo, self.hi)), float(max(hi, self.lo))
        if method == "mse":
            return mse_range(vals, self.lo, self.hi)
        raise ValueError(f"unknown calibration method {method!r}")


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Per-tensor asymmetric int8 (scale, zero point) covering [lo, hi]. The range is widened to hold
    0 so that real zero (padding, ReLU's floor) is exactly representable, as the TFLite spec demands."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-8:
        hi = lo + 1e-8
    # .tflite stores scales as float32 and kernels derive their fixed-point multipliers from those
    # bits; a float64 scale in the IR would let our executor and LiteRT requantize differently.
    scale = float(np.float32((hi - lo) / float(QMAX - QMIN)))
    zp = int(np.clip(np.round(QMIN - lo / scale), QMIN, QMAX))
    return float(scale), zp


def fake_quant(v: np.ndarray, scale: float, zp: int) -> np.ndarray:
    q = np.clip(np.round(v / scale) + zp, QMIN, QMAX)
    return (q - zp) * scale


def mse_range(vals: np.ndarray, lo: float, hi: float, steps: int = 100) -> tuple[float, float]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if vals.size == 0 or hi - lo < 1e-8:
        return lo, hi
    best, best_err = (lo, hi), np.inf
    for alpha in np.linspace(1.0, 0.2, steps):
        s, z = activation_qparams(lo * alpha, hi * alpha)
        err = float(np.mean((fake_quant(vals, s, z) - vals) ** 2))
        # Strictly better only: on ties keep the wider range (fewer surprises on unseen data).
        if err < best_err * (1 - 1e-6):
            best, best_err = (lo * alpha, hi * alpha), err
    return float(best[0]), float(best[1])


def observe(run: Callable[[np.ndarray], dict[str, np.ndarray]], batches: Iterable[np.ndarray],
            names: Iterable[str], seed: int = 0) -> dict[str, RangeObserver]:
    """Feed each batch through `run` (which returns every intermediate by tensor name) and observe
    the tensors in `names`."""
    names = list(names)
    obs = {n: RangeObserver(seed=seed + i) for i, n in enumerate(names)}
    for batch in batches:
        values = run(batch)
        for n in names:
            if n in values:
                obs[n].update(values[n])
    return obs
