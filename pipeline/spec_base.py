"""What every section of the spec shares, and the JSON Schema generator that states the same rules.

* Closed mappings: an unknown key is an error (with a "did you mean"), never a setting silently ignored.
* Values are taken as the YAML types them (pydantic's strict mode): `epochs: yes` is a boolean, not 1;
  `enabled: 1` is a number, not true; `learning_rate: "0.01"` is text. This is also what JSON Schema
  means by integer, number and boolean, so an editor validating against `tinytrain schema` agrees with
  the loader. Paths and pairs (`data.image_size`) opt out where a YAML string or list is the only way
  to write them.
* Every number fits the firmware's 32-bit fields (stages/train/runtime_config.py packs the runtime values
  as u32 and f32): integers at most U32_MAX (each integer field sets its own lower bound, 0 or 1),
  floats finite and within +-F32_MAX. A value that would
  only fail when runtime.bin is written, seven stages later, fails here with its YAML line.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from tinytrain.stages.train.runtime_config import F32_MAX, U32_MAX


class SpecModel(BaseModel):
    """Base of every spec section."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _fits_32_bits(cls, v: Any) -> Any:
        check_range(v)
        return v


def check_range(v: Any) -> None:
    """ValueError unless every number in `v` (lists and tuples included) fits a u32 or an f32."""
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        # The lower bound is each field's own (ge=0, ge=1, ...), with its own message.
        if v > U32_MAX:
            raise ValueError(f"{v} does not fit the firmware's 32-bit unsigned integers (at most {U32_MAX})")
    elif isinstance(v, float):
        if not -F32_MAX <= v <= F32_MAX:  # NaN fails too
            raise ValueError(f"{v} does not fit the firmware's 32-bit floats (finite, at most {F32_MAX:.7g} "
                             "in magnitude)")
    elif isinstance(v, (list, tuple)):
        for item in v:
            check_range(item)


class SpecJsonSchema(GenerateJsonSchema):
    """pydantic's schema plus the range every number must keep (see `check_range`)."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        js = super().int_schema(schema)
        _bound(js, None, U32_MAX)
        return js

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        js = super().float_schema(schema)
        _bound(js, -F32_MAX, F32_MAX)
        return js


def _bound(js: JsonSchemaValue, low: float | None, high: float) -> None:
    """Add `low`/`high` unless the field already has a tighter bound on that side."""
    lo = js.get("minimum", js.get("exclusiveMinimum"))
    if low is not None and (lo is None or lo < low):
        js["minimum"] = low
    hi = js.get("maximum", js.get("exclusiveMaximum"))
    if hi is None or hi > high:
        js["maximum"] = high
