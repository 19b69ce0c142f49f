"""C literals and names the code generator writes (stages/codegen.py and the op modules' C emitters in
stages/ops/): C types of IR dtypes, activation enums and float bounds, exact float32 literals, const arrays."""

from __future__ import annotations

import math

import numpy as np

from tinytrain.stages.model.ir import numel  # noqa: F401  (the C emitters take it from here)

CTYPE = {"int8": "int8_t", "int32": "int32_t", "float32": "float", "uint8": "uint8_t", "int16": "int16_t",
         "int64": "int64_t", "float16": "uint16_t"}   # fp16: IEEE binary16 bits (kernels_c/tt_f16.h)
ACT_ENUM = {"none": "TT_ACT_NONE", "relu": "TT_ACT_RELU", "relu6": "TT_ACT_RELU6",
            "relu_n1_to_1": "TT_ACT_RELU_N1_TO_1"}
FLOAT_BOUNDS = {"none": (-math.inf, math.inf), "relu": (0.0, math.inf), "relu6": (0.0, 6.0),
                "relu_n1_to_1": (-1.0, 1.0)}


class CodegenError(NotImplementedError):
    pass


def flit(x: float) -> str:
    """A float32 constant as an exact C literal."""
    v = float(np.float32(x))
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if math.isnan(v):
        raise CodegenError("NaN constant")
    return f"{v.hex()}f" if v != 0 else ("-0.0f" if math.copysign(1, v) < 0 else "0.0f")


def c_array(ctype: str, values, per_line: int = 16) -> str:
    vals = list(values)
    if not vals:
        return "{0}"
    items = []
    for v in vals:
        if ctype == "float":
            items.append(flit(v))
        elif ctype == "int32_t" and int(v) == -(1 << 31):
            items.append("INT32_MIN")
        else:
            items.append(str(int(v)))
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "{\n    " + ",\n    ".join(lines) + "\n}"
