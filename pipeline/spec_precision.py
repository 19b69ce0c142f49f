"""`train.precision` and `train.loss_scale`: which number format training runs in (issue 13).

    int8        the quantize stage's real int8 graph, trained with QAS (fp32 backward); quantize.enabled: true
    fp32        the float graph, every tensor float32; quantize.enabled: false
    fp16-mixed  the float graph with activations and gradients stored as IEEE binary16, fp32 master weights (the
                kernels read the fp32 weights; frozen ones stay fp32 in flash), every dot product and update
                accumulated in fp32; the loss is multiplied by a loss scale and the gradients divided by it before
                the update; quantize.enabled: false

Left out, precision follows `quantize.enabled` as it always did (int8 when on, fp32 when off), so existing specs
mean what they meant. Stated, it sets quantize.enabled when that is left out, and must agree with it otherwise.
fp16-mixed needs a board with half-precision support (Board.half_precision); `loss_scale` only applies to it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from tinytrain.pipeline.spec_base import SpecModel

PRECISIONS = ("int8", "fp32", "fp16-mixed")
Precision = Literal["int8", "fp32", "fp16-mixed"]

# The largest finite fp32 value: a scale the firmware keeps in a float must stay finite.
FP32_MAX = 3.4028234663852886e38


class LossScaleSpec(SpecModel):
    """Loss scaling of fp16-mixed training (PyTorch GradScaler's policy and defaults): the per-sample loss's
    gradient is multiplied by `scale` before it enters the fp16 backward, and the gradients are divided by it (in
    fp32) before the update. A step whose fp16 gradients hold an Inf or NaN is skipped (no update, the optimizer
    state untouched) and counted; `dynamic` then multiplies the scale by `backoff_factor` (not below `min_scale`),
    and after `growth_interval` finite steps in a row by `growth_factor` (not above `max_scale`). `static` keeps
    the scale; it still skips a step with an Inf/NaN gradient."""

    kind: Literal["static", "dynamic"] = Field(default="dynamic", description="static: a fixed scale; dynamic: "
                                                                             "halve on overflow, grow when finite")
    init_scale: float = Field(default=65536.0, gt=0, description="the scale of the first step (2**16)")
    growth_factor: float = Field(default=2.0, gt=1, description="dynamic: the scale is multiplied by this after "
                                                                "growth_interval finite steps in a row")
    backoff_factor: float = Field(default=0.5, gt=0, lt=1, description="dynamic: the scale is multiplied by this "
                                                                       "when a step overflows (the step is skipped)")
    growth_interval: int = Field(default=2000, ge=1, description="dynamic: finite steps in a row before a growth")
    min_scale: float = Field(default=1.0, gt=0, description="dynamic: the scale never backs off below this")
    max_scale: float = Field(default=2.0 ** 24, gt=0, description="dynamic: the scale never grows above this")

    @model_validator(mode="after")
    def _limits(self) -> "LossScaleSpec":
        for name in ("init_scale", "growth_factor", "min_scale", "max_scale"):
            v = getattr(self, name)
            if not math.isfinite(v) or v > FP32_MAX:
                raise ValueError(f"train.loss_scale.{name} is {v}: it must be a finite fp32 number")
        if self.min_scale > self.max_scale:
            raise ValueError(f"train.loss_scale.min_scale {self.min_scale:g} is above max_scale "
                             f"{self.max_scale:g}: no scale satisfies both limits")
        if not self.min_scale <= self.init_scale <= self.max_scale:
            raise ValueError(f"train.loss_scale.init_scale {self.init_scale:g} is outside [min_scale, max_scale] = "
                             f"[{self.min_scale:g}, {self.max_scale:g}]")
        if self.max_scale * self.growth_factor > FP32_MAX and self.kind == "dynamic":
            raise ValueError(f"train.loss_scale: max_scale {self.max_scale:g} x growth_factor "
                             f"{self.growth_factor:g} overflows fp32: lower max_scale")
        return self


def resolve(stated: str | None, quantize_enabled: bool, quantize_stated: bool) -> tuple[str, bool]:
    """(precision, quantize.enabled) from what the spec states; raises ValueError on a contradiction."""
    if stated is None:
        return ("int8" if quantize_enabled else "fp32"), quantize_enabled
    want = stated == "int8"
    if quantize_stated and quantize_enabled != want:
        raise ValueError(f"train.precision {stated} needs quantize.enabled: {str(want).lower()} (the spec says "
                         f"{str(quantize_enabled).lower()}): leave quantize.enabled out or make them agree")
    return stated, want
