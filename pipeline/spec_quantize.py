"""The `quantize` section of the spec: how a float model becomes a real int8 model.

Every field changes the int8 graph, so all of them belong in the quantize stage's cache key
(and none of them in load's).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tinytrain.pipeline.spec_base import SpecModel


class QuantizeSpec(SpecModel):
    """Post-training int8 quantization (TFLite int8 spec) calibrated on samples of `data`."""

    enabled: bool = Field(default=True, description="false: a float model stays float (the stage passes the "
                                                    "graph through and only reports); an int8 model file is "
                                                    "dequantized to its float copy (a stateful one is refused); "
                                                    "true: an int8 model file passes through as it is")
    calibration: Literal["minmax", "percentile", "mse"] = Field(
        default="minmax",
        description="activation range per tensor: minmax = observed min/max; percentile = clip at "
                    "`percentile` of |values|; mse = clipping range that minimises the quantization MSE")
    percentile: float = Field(default=99.99, gt=50, le=100,
                              description="percentile for calibration: percentile (50 < p <= 100)")
    num_samples: int = Field(default=200, ge=1, description="calibration samples drawn from the train split")
    seed: int = Field(default=0, ge=0, description="seed of the calibration sample draw")
    per_channel: bool = Field(default=True, description="per-output-channel weight scales (false: one per tensor)")
    io: Literal["int8", "float"] = Field(
        default="int8",
        description="int8: the graph's inputs/outputs are int8 (as the converter's full-int8 mode); float: "
                    "float32 I/O with QUANTIZE/DEQUANTIZE inserted at the boundaries")
    eval_samples: int | None = Field(default=None, ge=1,
                                     description="test samples used for the report (SQNR, accuracy); null = all")
