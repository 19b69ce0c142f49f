"""Helpers of the numpy reference kernels (stages/golden/forward.py and the op modules' kernels in stages/ops/)."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.model.ir import Tensor


def qparams(t: Tensor) -> tuple[float, int]:
    """Per-tensor (scale, zero point) of an int8 activation."""
    if t.quant is None:
        raise ValueError(f"int8 tensor {t.name!r} has no quantization parameters")
    if t.quant.per_channel:
        raise ValueError(f"activation {t.name!r} is quantized per channel; only weights may be")
    return float(t.quant.scale[0]), int(t.quant.zero_point[0])



def float_act(y: np.ndarray, act: str) -> np.ndarray:
    """ActivationFunctionWithMinMax with the float bounds of CalculateActivationRange."""
    if act == "none":
        return y
    if act == "relu":
        return np.maximum(y, np.float32(0))
    if act == "relu6":
        return np.minimum(np.maximum(y, np.float32(0)), np.float32(6))
    if act == "relu_n1_to_1":
        return np.minimum(np.maximum(y, np.float32(-1)), np.float32(1))
    raise NotImplementedError(f"fused activation {act!r}")
