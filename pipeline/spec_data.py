"""The `data` section of the spec: where training/calibration/test samples come from.

Normalisation story (one rule for every source): the float the model sees is
    x_float = x_raw * scale + offset
where x_raw is what the source holds (digits: 0..16; images: 0..255; npz: whatever is stored).
`scale: null` (the default) picks the source's natural scale so that values land in [0, 1]:
1/16 for digits, 1/255 for images, 1.0 for npz (assumed already normalised).
Match this to what the model was trained with; quantize calibrates on these floats.

Class selection: `classes: [3, 5, 8]` keeps only those raw labels. With `relabel: true` (default)
they become 0..k-1 in the order given (3->0, 5->1, 8->2), which is what a model with k outputs
expects; with `relabel: false` the raw labels are kept.

Task: `classification` (the default: integer labels), `regression` (npz only: y_train / y_test are
float targets [N, K], trained with `train.loss: mse`) or `outputs` (npz only: one y array per output named
in `train.outputs`, see stages/train/data.py; the default when train.outputs is given). The task is stated, not guessed from y's
dtype: a float y holding whole numbers is a valid classification set (it is converted to labels).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import Field, Strict, field_validator, model_validator

from tinytrain.pipeline.spec_base import SpecModel
from tinytrain.pipeline.spec_paths import SpecPath

# Natural x_raw -> [0, 1] scale of each source (used when `scale` is not given).
DEFAULT_SCALE = {"digits": 1.0 / 16.0, "images": 1.0 / 255.0, "npz": 1.0}

# The validators below word their rules for users; `json_schema_extra` states the same rules for editors
# (tests/test_spec_schema.py holds both to the same verdicts). Keys that only apply to an array or a number
# are ignored by JSON Schema for null, so they sit beside the `| None`.
# The cross-field rules of `_path_matches_source`:
_RULES = {"allOf": [
    {"if": {"properties": {"source": {"const": "digits"}}},
     "then": {"properties": {"path": {"type": "null"}}},
     "else": {"required": ["path"], "properties": {"path": {"type": "string"}}}},
    {"if": {"not": {"properties": {"source": {"const": "images"}}}},
     "then": {"properties": {"image_size": {"type": "null"}}}},
    {"if": {"required": ["task"], "properties": {"task": {"const": "regression"}}},
     "then": {"properties": {"source": {"const": "npz"}, "classes": {"type": "null"}, "relabel": {"const": True}}}},
]}


class DataSpec(SpecModel):
    """Dataset for calibration (quantize), accuracy reports and on-device training runs."""

    model_config = SpecModel.model_config | {"json_schema_extra": _RULES}

    source: Literal["digits", "npz", "images"] = Field(
        description="digits: scikit-learn's bundled 8x8 digits (offline); npz: a .npz file with "
                    "x_train/y_train/x_test/y_test (or x/y, split here), x of any rank ([N, F] features, "
                    "[N, T, F] sequences, [N, H, W, C] images); images: a folder with one "
                    "subfolder of images per class")
    # Existence is checked when the data is loaded (stages/train/data.py), not here, so that a spec can be
    # validated before its data is made.
    path: SpecPath | None = Field(default=None, description="the .npz file or image folder (not for digits), "
                                                            "relative to this YAML file's folder")
    classes: list[int] | None = Field(default=None, description="raw labels to keep; null = all",
                                      json_schema_extra={"minItems": 1, "uniqueItems": True,
                                                         "items": {"minimum": 0}})
    relabel: bool = Field(default=True, description="map the kept classes to 0..k-1 in the order given")
    test_fraction: float = Field(default=0.2, description="test share when the source has no split",
                                 json_schema_extra={"exclusiveMinimum": 0, "exclusiveMaximum": 1})
    split_seed: int = Field(default=0, ge=0, description="seed of the stratified train/test split")
    # Strict(False): a pair is written as a YAML list.
    image_size: Annotated[tuple[int, int], Strict(False)] | None = Field(
        default=None, description="[height, width] to resize images to",
        json_schema_extra={"prefixItems": [{"minimum": 1}, {"minimum": 1}]})
    grayscale: bool = Field(default=True, description="images: load as 1 channel (false: 3 channels)")
    scale: float | None = Field(default=None, description="x_float = x_raw * scale + offset; null = "
                                                          "source default (digits 1/16, images 1/255, npz 1)",
                                json_schema_extra={"not": {"const": 0}})
    offset: float = Field(default=0.0, description="see scale")
    layout: Literal["nhwc"] = Field(default="nhwc", description="image layout (TFLite models are NHWC); [N, F] features "
                                                             "and [N, T, F] sequences are fed as stored")
    task: Literal["classification", "regression", "outputs"] = Field(
        default="classification", description="classification: integer labels; regression: float targets "
                                               "[N, K] in the npz's y arrays (train with loss: mse); outputs: one "
                                               "y array per output named in train.outputs, y_<output> (or "
                                               "y_train_<output> and y_test_<output>)")

    @field_validator("test_fraction")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"test_fraction must be strictly between 0 and 1, got {v}")
        return v

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("classes is empty: leave it out (or null) to keep all classes")
        if any(c < 0 for c in v):
            raise ValueError(f"classes must be non-negative labels, got {v}")
        dup = sorted(c for c, n in Counter(v).items() if n > 1)
        if dup:
            raise ValueError(f"classes lists {dup} more than once")
        return v

    @field_validator("image_size")
    @classmethod
    def _size(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and (v[0] <= 0 or v[1] <= 0):
            raise ValueError(f"image_size must be two positive integers [height, width], got {list(v)}")
        return v

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: float | None) -> float | None:
        if v == 0.0:  # inf and NaN are refused for every number (spec_base.py)
            raise ValueError(f"scale must be a finite non-zero number, got {v}")
        return v

    @model_validator(mode="after")
    def _path_matches_source(self) -> "DataSpec":
        if self.source == "digits":
            if self.path is not None:
                raise ValueError("source 'digits' is built in and takes no path; remove `path` "
                                 "(or use source: npz / images for your own files)")
        elif self.path is None:
            what = "a .npz file" if self.source == "npz" else "a folder with one subfolder per class"
            raise ValueError(f"source {self.source!r} needs `path`: {what}")
        if self.image_size is not None and self.source != "images":
            raise ValueError("image_size only applies to source 'images'")
        if self.task in ("regression", "outputs"):
            if self.source != "npz":
                raise ValueError(f"task {self.task!r} needs source 'npz' (targets in its y arrays); "
                                 f"source {self.source!r} only has class labels")
            if self.classes is not None or not self.relabel:
                raise ValueError(f"classes / relabel select class labels; they do not apply to task {self.task!r}")
        return self

    def effective_scale(self) -> float:
        return self.scale if self.scale is not None else DEFAULT_SCALE[self.source]
