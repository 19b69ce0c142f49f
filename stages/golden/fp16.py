"""numpy reference of fp16-mixed training's own arithmetic (issue 13), which kernels_c/tt_f16.c matches bit for bit.

Storage is IEEE binary16; every computation is float32. A value enters fp16 by numpy's float32 -> float16
conversion (round to nearest, ties to even; subnormals kept; overflow to +-Inf) and leaves it exactly. The loss
scale is a float32: scaling is one float32 multiply, unscaling one float32 division (both correctly rounded in
numpy and in C with -ffp-contract=off). The loss-scale policy (GradScaler's) runs in float32 as well.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = float(np.finfo(np.float16).max)   # 65504
FP16_TINY = 2.0 ** -24                       # the smallest positive subnormal


def to_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):   # beyond 65504 is +-Inf: the overflow loss scaling catches
        return np.asarray(x, np.float32).astype(np.float16)


def to_f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def nonfinite(arrays) -> int:
    """1 when any element of any array is Inf or NaN (the step is skipped), else 0."""
    return int(any(not np.isfinite(np.asarray(a, np.float32)).all() for a in arrays))


def scale_grad(g: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (np.asarray(g, np.float32) * np.float32(np.asarray(scale).reshape(-1)[0])).astype(np.float32)


def unscale(g: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (np.asarray(g).astype(np.float32) / np.float32(np.asarray(scale).reshape(-1)[0])).astype(np.float32)


def update_scale(scale: np.ndarray, good: np.ndarray, skipped: np.ndarray, flag: int, *, dynamic: bool,
                 growth: float, backoff: float, interval: int, lo: float, hi: float) -> None:
    """The loss-scale policy after one step, in place: an overflowing step is counted as skipped and (dynamic) backs
    the scale off, not below `lo`; `interval` finite steps in a row (dynamic) grow it, not above `hi`."""
    s = np.float32(scale.reshape(-1)[0])
    if flag:
        skipped[...] += 1
        good[...] = 0
        if dynamic:
            s = max(np.float32(s * np.float32(backoff)), np.float32(lo))
    else:
        good[...] += 1
        if dynamic and int(good) >= interval:
            s = min(np.float32(s * np.float32(growth)), np.float32(hi))
            good[...] = 0
    scale.reshape(-1)[0] = np.float32(s)
