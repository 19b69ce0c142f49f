"""The build spec: what `tinytrain.yaml` may hold, validated (pydantic v2).

Every model forbids unknown keys, so a typo is an error with a suggestion rather than a setting
silently ignored. `load_spec` reads the YAML with line numbers and reports every problem as
`file:line: yaml.path: message` (a `SpecError`, exit code 2). Paths are relative to the YAML file's
folder. The stage table (`stage_graph.py`) names which dotted parts of this spec each stage reads;
only those parts reach its cache key.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, WithJsonSchema, field_validator,
                      model_validator)

from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.spec_base import SpecJsonSchema, SpecModel
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.pipeline.spec_errors import format_errors
from tinytrain.pipeline.spec_paths import ExistingFile, SpecPath, resolve_paths
from tinytrain.pipeline.spec_precision import LossScaleSpec, Precision, resolve as resolve_precision
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.pipeline.yaml_source import MAX_BYTES, load_yaml

# The board choices come from the board registry, so a new board needs no edit here.
from tinytrain.stages.device.boards import BOARD_NAMES as BOARDS, describe_boards  # noqa: E402
from tinytrain.stages.device.boards import BOARDS as BOARD_OBJECTS, get_board  # noqa: E402
from tinytrain.stages.train.runtime_config import OPTIMIZER_DEFAULTS
WEIGHT_RATIOS = (0.0, 0.125, 0.25, 0.5, 1.0)
# A ratio may also be written as text: "0", "1/8", "1/4", "1/2", "1".
WEIGHT_RATIO_TEXTS = tuple(str(Fraction(r)) for r in WEIGHT_RATIOS)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_URL_RE = r"^https?://[^/\s]+"


# Every section: closed, values typed as YAML types them, numbers within the firmware's 32 bits.
_Strict = SpecModel


# ---- model ------------------------------------------------------------------------------------

def _zoo_model(v: Any) -> Any:
    """`zoo:<name>` names a model shipped with tinytrain; it resolves to that file (hashed like any other)."""
    from tinytrain.stages.model import zoo

    if isinstance(v, str) and zoo.is_zoo_ref(v):
        try:
            return zoo.resolve(v)
        except Exception as e:  # an unknown name: its message lists the known ones
            raise ValueError(str(e)) from None
    return v


class ModelSpec(_Strict):
    """The network to train: a TFLite flatbuffer as the TensorFlow converter writes it."""

    path: Annotated[ExistingFile, BeforeValidator(_zoo_model)] = Field(
        description="the .tflite or .circle file (relative to this YAML file's folder), or a zoo name such as "
                    "zoo:mbv2-w0.35-128")
    format: Literal["auto", "tflite", "circle"] = Field(
        default="auto", description="auto: decided by the file's identifier (TFL3 or CIR0)")
    outputs: list[str] | None = Field(
        default=None, min_length=1,
        description="cut the model at these tensors (names as `tinytrain inspect SPEC load` shows them): they "
                    "become its outputs and every op after them is dropped, e.g. a custom op that only "
                    "post-processes the result; null = the model's own outputs",
        json_schema_extra={"uniqueItems": True})
    sequence_length: int | None = Field(
        default=None, ge=1, le=4096,
        description="stateful streaming models (resource variables, e.g. microWakeWord): invocations per training "
                    "sample; a sample is [sequence_length, *input shape], run from the model's initial state, and "
                    "its label applies to the last invocation's output; null for stateless models")


# ---- train ------------------------------------------------------------------------------------

class LayerUpdate(_Strict):
    """What to train in one layer (scheme `manual`)."""

    bias: bool = Field(default=False, description="update this layer's bias")
    weight_ratio: Annotated[float, WithJsonSchema({"enum": [*WEIGHT_RATIOS, *WEIGHT_RATIO_TEXTS]})] = Field(
        default=0.0, description="share of input channels whose weights are updated (the first ones): "
                                 "0, 1/8, 1/4, 1/2 or 1; fractions may be written as 1/8")

    @field_validator("weight_ratio", mode="before")
    @classmethod
    def _ratio(cls, v: Any) -> Any:
        choices = ", ".join(WEIGHT_RATIO_TEXTS)
        if isinstance(v, str):
            if v not in WEIGHT_RATIO_TEXTS:
                raise ValueError(f"weight_ratio {v} is not one of {choices}")
            return float(Fraction(v))
        if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v) not in WEIGHT_RATIOS:
            raise ValueError(f"weight_ratio {v} is not one of {choices}")
        return v


class AnalysisSpec(_Strict):
    """auto: contribution analysis (TTE). Each option (the last k biases; one layer's weights at one ratio) is
    scored by a short, seeded fine-tuning run of the dequantized model on part of the TRAIN split and its accuracy
    on another, disjoint part of it (the test split stays unseen). None of this depends on the budget, so
    re-planning with another budget reuses every measurement."""

    samples: int = Field(default=256, ge=1, description="train samples each measurement fine-tunes on")
    eval_samples: int = Field(default=256, ge=1,
                              description="held-out train samples each measurement is scored on (disjoint)")
    steps: int | None = Field(default=None, ge=1,
                              description="fine-tuning steps (batch 1) per measurement; null = one pass over "
                                          "`samples`")
    learning_rate: float = Field(default=0.01, gt=0, description="SGD learning rate of the measurement runs")
    seed: int = Field(default=0, ge=0, description="sample selection and order of the measurement runs")
    max_layers: int | None = Field(
        default=None, ge=1, description="analyse only the last N trainable layers (biases and weights); "
                                        "null = all (cost: N bias runs + 4 weight runs per layer)")


# `UpdateSpec._scheme_fields` as JSON Schema, for editors (a test holds both to the same verdicts).
_SCHEME_IS = {s: {"required": ["scheme"], "properties": {"scheme": {"const": s}}}
              for s in ("last_k", "manual")}
_UPDATE_RULES = {"allOf": [
    {"if": _SCHEME_IS["last_k"], "then": {"required": ["k"], "properties": {"k": {"type": "integer"}}}},
    {"if": _SCHEME_IS["manual"], "then": {"required": ["layers"], "properties": {"layers": {"minProperties": 1}}},
     "else": {"properties": {"layers": {"maxProperties": 0}}}},
    {"if": {"not": {"required": ["scheme"], "properties": {"scheme": {"enum": ["last_k", "bias_only"]}}}},
     "then": {"properties": {"k": {"type": "null"}}}},
]}


class UpdateSpec(_Strict):
    """Which parameters are trained on the device (sparse update)."""

    model_config = ConfigDict(json_schema_extra=_UPDATE_RULES)

    scheme: Literal["full", "last_k", "bias_only", "manual", "auto"] = Field(
        default="auto",
        description="full: every weight and bias; last_k: weights and biases of the last k layers; "
                    "bias_only: biases only (of the last k layers when k is given); manual: per layer, "
                    "see `layers`; auto: the most useful update that fits `budget_kb`")
    k: int | None = Field(default=None, ge=1, description="layer count for last_k (required) and bias_only")
    budget_kb: float | None = Field(
        default=None, gt=0,
        description="SRAM budget in KB (1 KB = 1024 bytes) for the whole training program (auto searches under "
                    "it; other schemes are checked against it); null = the board's SRAM minus what the runtime "
                    "itself needs")
    layers: dict[str, LayerUpdate] = Field(
        default_factory=dict, description="manual: layer -> what to update; a layer is named by its weight "
                                          "tensor (full or the part before ';', as `tinytrain inspect SPEC "
                                          "sparse-plan` lists them), its output tensor, or its op index "
                                          "(\"5\" or \"#5\"); layers not listed are frozen")
    search: Literal["dp", "evolutionary"] = Field(
        default="dp", description="auto: dp = exact knapsack over the additive contribution model; "
                                  "evolutionary = seeded evolutionary search (an alternative for comparison)")
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)

    @model_validator(mode="after")
    def _scheme_fields(self) -> "UpdateSpec":
        if self.scheme == "last_k" and self.k is None:
            raise ValueError("scheme last_k needs k (how many of the last layers to update)")
        if self.scheme == "manual" and not self.layers:
            raise ValueError("scheme manual needs `layers` (layer name -> {bias, weight_ratio})")
        if self.scheme != "manual" and self.layers:
            raise ValueError(f"`layers` only applies to scheme manual (scheme is {self.scheme})")
        if self.scheme in ("full", "manual", "auto") and self.k is not None:
            raise ValueError(f"k does not apply to scheme {self.scheme}")
        return self


class OptimizerSpec(_Strict):
    """The update rule compiled into the firmware; its state tensors are counted in memory."""

    kind: Literal["sgd", "momentum", "adam", "rmsprop"] = Field(default="sgd")
    # Defaults: stages/train/runtime_config.py OPTIMIZER_DEFAULTS, shared with the firmware's record and autodiff.
    momentum: float = Field(default=OPTIMIZER_DEFAULTS.momentum, ge=0, lt=1, description="momentum: velocity decay")
    beta1: float = Field(default=OPTIMIZER_DEFAULTS.beta1, ge=0, lt=1, description="adam: first-moment decay")
    beta2: float = Field(default=OPTIMIZER_DEFAULTS.beta2, ge=0, lt=1, description="adam: second-moment decay")
    rho: float = Field(default=OPTIMIZER_DEFAULTS.alpha, ge=0, lt=1,
                       description="rmsprop: decay of the squared-gradient average")
    eps: float = Field(default=OPTIMIZER_DEFAULTS.eps, gt=0, description="adam, rmsprop: added to the denominator")


class QASSpec(_Strict):
    """Quantization-aware scaling of int8 updates (DESIGN §6)."""

    enabled: bool = Field(default=True, description="scale int8 weight/bias updates to match fp32 ones")
    rounding: Literal["nearest", "stochastic"] = Field(default="nearest",
                                                       description="rounding of updated weights back to int8")
    master_copy: bool = Field(default=False,
                              description="keep an fp32 copy of the trained slice (more SRAM, more precision)")


class ReorderSpec(_Strict):
    """Operator scheduling of the training step."""

    enabled: bool = Field(default=True, description="apply each update as soon as its gradient is ready and "
                                                    "reorder ops to shrink peak memory")


class GateSpec(_Strict):
    """Improvement gate: test accuracy is measured before and after training on the device, and the trained
    weights are exported only if it did not drop (else the original weights are)."""

    enabled: bool = Field(default=True, description="false: always export the trained weights")
    min_delta: float = Field(default=0.0, description="keep the trained weights when accuracy after - before >= "
                                                      "min_delta, in percentage points (e.g. -1.0 tolerates a "
                                                      "1-point drop); otherwise the original weights are exported")


class CheckpointSpec(_Strict):
    """Runtime value: emulate-run saves a checkpoint (trained weights, optimizer state, step counter, PRNG streams;
    CRC-protected, layout in stages/c_emit/api.py) as the artifact trained.ttck, which train.resume_from of a
    later build continues from, bit for bit as if never stopped."""

    stop_after_steps: int | None = Field(
        default=None, ge=1, description="stop after this many training steps (updates) of this run and save the "
                                        "checkpoint there; null = train to the end and save the checkpoint there")


class OutputLoss(_Strict):
    """One trained output of a model with several (a detector's scores and boxes, a landmark model's points and
    presence flag): which output, its loss and its weight in the summed loss (stages/train/losses.py)."""

    name: str = Field(description="the model output's tensor name (as `tinytrain inspect SPEC load` lists them)")
    loss: Literal["cross_entropy", "mse", "bce", "huber"] = Field(
        description="cross_entropy: softmax cross-entropy on a class index; mse: mean squared error; bce: binary "
                    "cross-entropy with logits (a final sigmoid is dropped); huber: Huber loss, delta 1")
    weight: float = Field(default=1.0, gt=0, description="the head's weight in the summed loss")


class TrainSpec(_Strict):
    """On-device training. learning_rate, epochs, seed, max_train_samples, gate, checkpoint and resume_from are
    runtime values: changing them reruns only emulate-run."""

    update: UpdateSpec = Field(default_factory=UpdateSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    loss: Literal["cross_entropy", "mse"] = Field(default="cross_entropy",
                                                  description="cross_entropy: fused softmax cross-entropy on "
                                                              "integer labels; mse: mean squared error on float "
                                                              "targets (the default when data.task is regression)")
    outputs: list[OutputLoss] | None = Field(
        default=None, description="the output(s) to train, each with its loss and weight (gradients of several "
                                  "heads add up where they meet; outputs not listed are pruned from training); "
                                  "null = the model's single output with `loss`. Data: data.task outputs, one y "
                                  "array per listed output in the .npz")
    batch_size: int = Field(default=1, ge=1, description="samples per update (gradients are accumulated)")
    epochs: int = Field(default=1, ge=1)
    learning_rate: float = Field(default=0.01, gt=0)
    seed: int = Field(default=0, ge=0, description="sample order and stochastic rounding")
    max_train_samples: int | None = Field(
        default=None, ge=1, description="runtime value: train samples used per epoch (the first ones of the train "
                                        "split); null = all")
    gate: GateSpec = Field(default_factory=GateSpec)
    checkpoint: CheckpointSpec | None = Field(
        default=None, description="runtime value: save a checkpoint (emulate-run's trained.ttck), optionally "
                                  "stopping early; null = no checkpoint")
    resume_from: ExistingFile | None = Field(
        default=None, description="runtime value: a checkpoint (trained.ttck of an earlier run of this model) to "
                                  "continue training from: the steps it holds are skipped. A truncated, corrupted "
                                  "or other model's checkpoint is refused with an error")
    qas: QASSpec = Field(default_factory=QASSpec)
    reorder: ReorderSpec = Field(default_factory=ReorderSpec)
    precision: Precision | None = Field(
        default=None, description="int8 (the quantized graph, QAS) | fp32 | fp16-mixed (fp16 activations and "
                                  "gradients, fp32 master weights and accumulation, loss scaling; boards with "
                                  "half precision only); null = int8 when quantize.enabled, else fp32 "
                                  "(pipeline/spec_precision.py)")
    loss_scale: LossScaleSpec | None = Field(
        default=None, description="fp16-mixed only: the loss-scaling policy; null = dynamic with PyTorch "
                                  "GradScaler's defaults")


# ---- target -----------------------------------------------------------------------------------

class TargetSpec(_Strict):
    """Where the firmware runs."""

    board: Literal[BOARDS] = Field(  # type: ignore[valid-type]
        default="host", description=describe_boards())
    kernels: Literal["portable", "dsp", "mve"] = Field(
        default="portable", description="portable C99; Cortex-M DSP (ACLE) variants; or mve: the DSP variants plus "
                                        "Helium (MVE) int8 dot products, fp16 conversions, float gradient "
                                        "masks and fp16-mixed's conv/depthwise dot products (fp32 vector "
                                        "arithmetic where its operands provably keep the portable bits), on "
                                        "boards with MVE (same results as portable)")
    cflags: list[str] = Field(default_factory=list, description="extra compiler flags")
    timeout_s: float = Field(default=600.0, gt=0, description="emulator run time limit, seconds")

    @model_validator(mode="after")
    def _kernels_fit_the_board(self) -> "TargetSpec":
        board = get_board(self.board)
        if self.kernels == "mve" and not board.mve:
            with_mve = ", ".join(b.name for b in BOARD_OBJECTS.values() if b.mve)
            raise ValueError(f"kernels mve needs a board with Helium (MVE); {self.board} ({board.cpu}) has none "
                             f"(boards with MVE: {with_mve})")
        return self


# ---- build ------------------------------------------------------------------------------------

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _env_name(description: str):
    return Field(default=None, pattern=_ENV_NAME, description=description)


class RemoteCacheSpec(_Strict):
    """An HTTP cache speaking Bazel's protocol (GET/PUT/HEAD of /ac/<key> and /cas/<digest>).
    Secrets are never written here: name the environment variables (or a key file) that hold them."""

    url: str = Field(description="e.g. https://cache.example/tinytrain (user info in the URL works but is "
                                 "discouraged; it is always shown masked)", json_schema_extra={"pattern": _URL_RE})
    write: bool = Field(default=False, description="also upload results (typically only in CI)")
    timeout_s: float = Field(default=30.0, gt=0, le=3600,
                             description="overall time limit of one remote operation (one GET, HEAD or PUT), "
                                         "seconds; past it the remote is skipped for the rest of the build")
    token_env: str | None = _env_name("environment variable holding a Bearer token")
    username_env: str | None = _env_name("environment variable holding the basic-auth user name")
    password_env: str | None = _env_name("environment variable holding the basic-auth password")
    netrc: bool = Field(default=True, description="use the .netrc entry ($NETRC, else ~/.netrc) of the host when "
                                                  "no other credentials are given")
    ca_file: ExistingFile | None = Field(default=None,
                                         description="PEM file of the CA(s) to trust for https (default: the system's)")
    sign_key_env: str | None = _env_name("environment variable holding the HMAC-SHA256 key that signs uploaded "
                                         "entries (CI)")
    sign_key_file: ExistingFile | None = Field(default=None, description="file holding that key instead")
    verify_key_env: str | None = _env_name("environment variable holding the key that remote entries must be "
                                           "signed with; unsigned or wrongly signed entries are refused")
    verify_key_file: ExistingFile | None = Field(default=None, description="file holding that key instead")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        from tinytrain.cache.credentials import mask_url

        if not re.match(_URL_RE, v):
            raise ValueError(f"url must start with http:// or https://, got {mask_url(v)!r}")
        if "?" in v or "#" in v:
            # Requests go to <url>/ac/<key>: a query or fragment would be silently dropped.
            raise ValueError(f"url must not have a query or fragment, got {mask_url(v)!r}")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _one_source_each(self) -> "RemoteCacheSpec":
        for what in ("sign_key", "verify_key"):
            if getattr(self, f"{what}_env") and getattr(self, f"{what}_file"):
                raise ValueError(f"give {what}_env or {what}_file, not both")
        if bool(self.username_env) != bool(self.password_env):
            raise ValueError("username_env and password_env go together")
        return self


class BuildSpec(_Strict):
    """Where results go. Nothing here changes a result, so none of it is part of a cache key
    (except `salt`, whose only job is to change every key)."""

    out_dir: SpecPath = Field(default=Path("build"), description="artifacts go to <out_dir>/<name>/<stage>/")
    cache_dir: SpecPath | None = Field(
        default=None, description="local cache; null = $TINYTRAIN_CACHE_DIR, else ~/.cache/tinytrain "
                                  "(the --cache-dir option overrides all)")
    remote_cache: RemoteCacheSpec | None = Field(default=None)
    salt: str = Field(default="", description="any text; changing it invalidates every cached result of this spec")


# ---- the spec ---------------------------------------------------------------------------------

# `Spec._loss_matches_task` as JSON Schema, for editors (a test holds both to the same verdicts).
_REGRESSION = {"required": ["task"], "properties": {"task": {"const": "regression"}}}
_LOSS_RULES = {"allOf": [
    {"if": {"required": ["data"], "properties": {"data": {"type": "object", **_REGRESSION}}},
     "then": {"properties": {"train": {"properties": {"loss": {"const": "mse"}}}}}},
    {"if": {"required": ["data"], "properties": {"data": {"type": "object", "not": _REGRESSION}}},
     "then": {"properties": {"train": {"properties": {"loss": {"not": {"const": "mse"}}}}}}},
]}


class Spec(_Strict):
    """A tinytrain build: model, data, quantization, training, target board."""

    model_config = ConfigDict(json_schema_extra=_LOSS_RULES)

    name: str = Field(description="build name: artifacts go to <out_dir>/<name>/; default: the file name "
                                  "without .yaml/.yml/.example", json_schema_extra={"pattern": _NAME_RE.pattern})
    model: ModelSpec
    data: DataSpec | None = Field(default=None)
    quantize: QuantizeSpec = Field(default_factory=QuantizeSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    target: TargetSpec = Field(default_factory=TargetSpec)
    build: BuildSpec = Field(default_factory=BuildSpec)

    _source: Path | None = PrivateAttr(default=None)
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError(f"name {v!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        return v

    @model_validator(mode="after")
    def _training_from_circle(self) -> "Spec":
        """A .circle model's CIRCLE_TRAINING metadata (onert's circle+) fills the training fields the spec leaves
        out: optimizer (kind, Adam's betas and eps), loss, learning rate, batch size, epochs. What the spec states
        wins; `value_sources()` says where each value came from (`tinytrain explain` prints it)."""
        from tinytrain.stages.model.circle_training import CircleTrainingError, read_circle_training, spec_values

        path = Path(self.model.path)
        if self.model.format == "tflite" or not path.is_file():
            return self
        try:
            info = read_circle_training(path)
            values = spec_values(info) if info is not None else {}
        except CircleTrainingError as e:
            raise ValueError(f"model {path.name}: {e}") from None
        for dotted, value in values.items():
            *parents, leaf = dotted.split(".")[1:]
            section: Any = self.train
            stated = True
            for part in parents:
                stated = stated and part in section.model_fields_set
                section = getattr(section, part)
            if stated and leaf in section.model_fields_set:
                self._sources[dotted] = "the spec (overrides the model's CIRCLE_TRAINING metadata)"
                continue
            setattr(section, leaf, value)
            self._sources[dotted] = f"{path.name}'s CIRCLE_TRAINING metadata"
        return self

    @model_validator(mode="after")
    def _precision(self) -> "Spec":
        """train.precision against quantize.enabled and the board (pipeline/spec_precision.py): fp16-mixed needs a
        board with half precision; loss_scale applies to fp16-mixed only. Afterwards precision is never null."""
        from tinytrain.stages.device.boards import BOARDS as BOARD_TABLE

        prec, enabled = resolve_precision(self.train.precision, self.quantize.enabled,
                                          "enabled" in self.quantize.model_fields_set)
        self.quantize.enabled = enabled
        self.train.precision = prec
        if prec == "fp16-mixed":
            board = BOARD_TABLE[self.target.board]
            if not board.half_precision:
                able = ", ".join(b.name for b in BOARD_TABLE.values() if b.half_precision)
                raise ValueError(f"train.precision fp16-mixed needs a board with half-precision support; "
                                 f"{board.name} ({board.cpu}) has none. Boards that have it: {able}")
            if self.train.loss_scale is None:
                self.train.loss_scale = LossScaleSpec()
        elif self.train.loss_scale is not None:
            raise ValueError(f"train.loss_scale applies to train.precision fp16-mixed only (precision is {prec})")
        return self

    def value_sources(self) -> dict[str, str]:
        """Dotted spec field -> where its value came from, for the fields a model's metadata could give."""
        return dict(self._sources)

    @model_validator(mode="after")
    def _loss_matches_task(self) -> "Spec":
        """Regression data train with MSE: the default loss follows data.task; a stated loss must agree. Named
        outputs (train.outputs) take one target array per output: data.task outputs (the default with them)."""
        outs = self.train.outputs
        if outs is not None:
            if not outs:
                raise ValueError("train.outputs is empty: name at least one output (or leave it out to train the "
                                 "model's single output)")
            dup = sorted({o.name for o in outs if [p.name for p in outs].count(o.name) > 1})
            if dup:
                raise ValueError(f"train.outputs names {dup} more than once")
            if "loss" in self.train.model_fields_set:
                raise ValueError("train.loss and train.outputs are both given: with train.outputs each output "
                                 "names its own loss")
            if self.data is not None:
                if "task" not in self.data.model_fields_set:
                    self.data.task = "outputs"
                elif self.data.task != "outputs":
                    raise ValueError(f"train.outputs trains named outputs, which take one y array per output: set "
                                     f"data.task: outputs (or leave task out), not {self.data.task}")
            return self
        if self.data is not None and self.data.task == "outputs":
            raise ValueError("data.task is outputs (one y array per output) but train.outputs does not name them")
        regression = self.data is not None and self.data.task == "regression"
        if regression and "loss" not in self.train.model_fields_set:
            self.train.loss = "mse"
        elif regression and self.train.loss != "mse":
            raise ValueError("data.task is regression (float targets) but train.loss is "
                             f"{self.train.loss}: regression trains with train.loss: mse (or leave loss out)")
        elif not regression and self.data is not None and self.train.loss == "mse":
            raise ValueError("train.loss is mse but data.task is classification (integer labels): set "
                             "data.task: regression with float targets, or train.loss: cross_entropy")
        return self

    @property
    def source(self) -> Path | None:
        """The YAML file this spec was read from (None when built in code)."""
        return self._source


def default_name(path: Path) -> str:
    name = path.name
    for suffix in (".example", ".yaml", ".yml"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".-_")
    return name or "build"


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file. Every problem is a SpecError naming the YAML line."""
    path = Path(path)
    shown = str(path)
    try:
        with path.open("rb") as f:
            # Never more than the limit plus one byte: a huge file or /dev/zero is refused, not read.
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{shown}: spec file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{shown}: is a folder, not a spec file") from None
    except OSError as e:
        raise SpecError(f"{shown}: cannot read spec file: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        raise SpecError(f"{shown}: the spec file is larger than {MAX_BYTES // (1 << 20)} MB; refused "
                        "(a spec is a few KB: is this the right file?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(f"{shown}:{line}: the spec is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start})") from None
    doc = load_yaml(text, shown)
    if not isinstance(doc.data, dict):
        raise SpecError(f"{shown}:1: the spec must be a mapping of keys (model:, data:, train:, ...), "
                        f"not a {type(doc.data).__name__}")
    data = dict(doc.data)
    data.setdefault("name", default_name(path))
    base = path.resolve().parent
    try:
        spec = Spec.model_validate(data, context={"base_dir": base})
    except ValidationError as e:
        raise SpecError(format_errors(e, doc, Spec, shown)) from None
    resolve_paths(spec, base)
    spec._source = path.resolve()
    return spec


SCHEMA_ID = "urn:tinytrain:spec"


def json_schema() -> dict[str, Any]:
    """The spec as JSON Schema (draft 2020-12): it accepts what `load_spec` accepts, except what only files
    can tell (whether `model.path` exists)."""
    schema = Spec.model_json_schema(schema_generator=SpecJsonSchema)
    # load_spec fills in `name` from the file name.
    schema["required"] = [k for k in schema["required"] if k != "name"]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
