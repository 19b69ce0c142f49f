"""Spatial geometry shared by every kernel family (forward, backward, generated C): TFLite's rules."""

from __future__ import annotations


def out_size_and_pad(padding: str, in_size: int, filt: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """(output size, padding before) as ComputeOutSize + ComputePaddingWithOffset (kernels/padding.h) compute
    them: the before-padding is total // 2 and the odd extra pixel goes after, which kernels get for free by
    skipping out-of-range taps."""
    eff = (filt - 1) * dilation + 1
    if padding == "same":
        out = (in_size + stride - 1) // stride
    elif padding == "valid":
        out = (in_size + stride - eff) // stride
    else:
        raise ValueError(f"unknown padding {padding!r}")
    total = max((out - 1) * stride + eff - in_size, 0)
    return out, total // 2
