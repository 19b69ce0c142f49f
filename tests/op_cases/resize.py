"""Resizes: resize_bilinear, resize_nearest_neighbor, with PyTorch twins written from TFLite's reference formulas
(torch's own interpolate has no mode for TFLite's legacy coordinates)."""

from __future__ import annotations

import numpy as np

from . import OpCase


def _source(n_in: int, n_out: int, attrs: dict) -> np.ndarray:
    """TFLite's source coordinate of each output row / column (resize_bilinear.h, resize_nearest_neighbor.h)."""
    align, half = bool(attrs.get("align_corners")), bool(attrs.get("half_pixel_centers"))
    scale = (n_in - 1) / (n_out - 1) if align and n_out > 1 else n_in / n_out
    o = np.arange(n_out, dtype=np.float64)
    return (o + 0.5) * scale - 0.5 if half else o * scale


def _bilinear(attrs, ins, out_shapes):
    import torch

    x = ins[0]
    for axis, n_out in ((1, out_shapes[0][1]), (2, out_shapes[0][2])):
        n_in = x.shape[axis]
        src = np.float32(_source(n_in, n_out, attrs)).astype(np.float64)
        lo = np.maximum(np.floor(src), 0).astype(np.int64)
        hi = np.minimum(np.ceil(src), n_in - 1).astype(np.int64)
        w = torch.tensor(src - np.floor(src)).reshape([-1 if d == axis else 1 for d in range(4)])
        a, b = x.index_select(axis, torch.tensor(lo)), x.index_select(axis, torch.tensor(hi))
        x = a + (b - a) * w
    return x


def _nearest(attrs, ins, out_shapes):
    import torch

    x = ins[0]
    for axis, n_out in ((1, out_shapes[0][1]), (2, out_shapes[0][2])):
        n_in = x.shape[axis]
        align, half = bool(attrs.get("align_corners")), bool(attrs.get("half_pixel_centers"))
        # float32 as GetNearestNeighbor computes it; std::round sends halves away from zero (src >= 0 here)
        scale = np.float32(n_in - 1) / np.float32(n_out - 1) if align and n_out > 1 \
            else np.float32(n_in) / np.float32(n_out)
        src = ((np.arange(n_out, dtype=np.float32) + np.float32(0.5 if half else 0.0)) * scale).astype(np.float64)
        idx = np.floor(src + 0.5) if align else np.floor(src)
        idx = np.clip(idx, 0, n_in - 1).astype(np.int64)
        x = x.index_select(axis, torch.tensor(idx))
    return x


CASES = {
    "resize_bilinear": OpCase(("ops/resize_int8.tflite", "ops/resize_float.tflite"), torch=_bilinear),
    "resize_nearest_neighbor": OpCase(("ops/resize_int8.tflite", "ops/resize_float.tflite"), torch=_nearest),
}
