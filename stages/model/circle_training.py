"""Training parameters a `.circle` model carries (onert's "circle+"): read, and write for tests and exports.

onert stores them as a model metadata entry named CIRCLE_TRAINING whose buffer holds a second flatbuffer,
`ModelTraining` (file identifier "CTR0", ONE's runtime/libs/circle-schema/circle_traininfo.fbs, schema 0.1).
Its fields, in vtable slot order (a union takes two slots: its type byte, then the table):

    0 version: uint          3 optimizer_opt: SGDOptions | AdamOptions    7 epochs: int
    1 optimizer: byte        4 lossfn: byte                               8 batch_size: int
      (SGD 0, ADAM 1)          (SPARSE_CATEGORICAL_CROSSENTROPY 0,        9 loss_reduction_type: byte
    2 optimizer_opt_type       CATEGORICAL_CROSSENTROPY 1,                  (SumOverBatchSize 0, Sum 1)
      (NONE 0, SGD 1, ADAM 2)  MEAN_SQUARED_ERROR 2)                     10 trainable_ops: [int]
                             5 lossfn_opt_type, 6 lossfn_opt (from_logits: bool)

    SGDOptions { learning_rate: float }   AdamOptions { learning_rate, beta_1, beta_2, epsilon: float }

We read it with the flatbuffers runtime's table accessors (our own code, no generated classes). What tinytrain
takes from it: optimizer kind and hyper-parameters, loss, learning rate, batch size, epochs (`spec_values`). Our
loss is always the mean over the batch, so a `Sum` reduction is refused rather than silently changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np
from flatbuffers import number_types as N
from flatbuffers.table import Table

METADATA_NAME = "CIRCLE_TRAINING"
IDENTIFIER = b"CTR0"
SCHEMA_VERSION = 0
OPTIMIZERS = {0: "sgd", 1: "adam"}
LOSSES = {0: "sparse_categorical_crossentropy", 1: "categorical_crossentropy", 2: "mean_squared_error"}
REDUCTIONS = {0: "sum_over_batch_size", 1: "sum"}
_OPT_UNION = {"sgd": 1, "adam": 2}     # OptimizerOptions union type per optimizer
_LOSS_UNION = {0: 1, 1: 2, 2: 3}       # LossFnOptions union type per loss


class CircleTrainingError(ValueError):
    """The CIRCLE_TRAINING metadata is malformed or asks for something tinytrain does not do."""


@dataclass(frozen=True)
class TrainingInfo:
    optimizer: str                    # sgd | adam
    learning_rate: float | None
    loss: str                         # a LOSSES value
    batch_size: int | None
    epochs: int | None
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    reduction: str = "sum_over_batch_size"
    from_logits: bool = False
    version: int = SCHEMA_VERSION


def _slot(t: Table, slot: int) -> int:
    return t.Offset(4 + 2 * slot)


def _get(t: Table, slot: int, flags: Any, default: Any) -> Any:
    o = _slot(t, slot)
    return t.Get(flags, o + t.Pos) if o else default


def _sub(t: Table, slot: int) -> Table | None:
    o = _slot(t, slot)
    return Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None


def parse_training_info(buf: bytes) -> TrainingInfo:
    """The ModelTraining table in `buf` (the metadata buffer's bytes)."""
    buf = bytes(buf)
    if len(buf) < 8:
        raise CircleTrainingError(f"{METADATA_NAME} metadata is {len(buf)} bytes: too short for a flatbuffer")
    if buf[4:8] != IDENTIFIER:
        raise CircleTrainingError(f"{METADATA_NAME} metadata has file identifier {buf[4:8]!r}, expected {IDENTIFIER!r}")
    try:
        root = Table(bytearray(buf), flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, buf, 0))
        version = _get(root, 0, N.Uint32Flags, 0)
        opt_code = _get(root, 1, N.Int8Flags, 0)
        loss_code = _get(root, 4, N.Int8Flags, 0)
        red_code = _get(root, 9, N.Int8Flags, 0)
        epochs = _get(root, 7, N.Int32Flags, 0)
        batch = _get(root, 8, N.Int32Flags, 0)
        opt_t, loss_t = _sub(root, 3), _sub(root, 6)
        f = N.Float32Flags
        lr = _get(opt_t, 0, f, None) if opt_t is not None else None
        adam = [_get(opt_t, k, f, None) for k in (1, 2, 3)] if opt_t is not None and opt_code == 1 else [None] * 3
        logits = bool(_get(loss_t, 0, N.BoolFlags, False)) if loss_t is not None and loss_code in (0, 1) else False
    except (IndexError, ValueError, TypeError) as e:   # struct.error is a ValueError... and offsets past the end
        raise CircleTrainingError(f"{METADATA_NAME} metadata is not a valid ModelTraining flatbuffer ({e})") from None
    if version != SCHEMA_VERSION:
        raise CircleTrainingError(f"{METADATA_NAME} schema version {version}; tinytrain reads version {SCHEMA_VERSION}")
    if opt_code not in OPTIMIZERS or loss_code not in LOSSES or red_code not in REDUCTIONS:
        raise CircleTrainingError(f"{METADATA_NAME}: unknown optimizer {opt_code}, loss {loss_code} or loss "
                                  f"reduction {red_code}")
    return TrainingInfo(OPTIMIZERS[opt_code], lr, LOSSES[loss_code], batch or None, epochs or None,
                        beta1=adam[0], beta2=adam[1], eps=adam[2], reduction=REDUCTIONS[red_code],
                        from_logits=logits, version=version)


def read_circle_training(path: Path) -> TrainingInfo | None:
    """The CIRCLE_TRAINING metadata of a .circle file, or None when it has none (or is not a circle file)."""
    import tflite

    with open(path, "rb") as f:
        if f.read(8)[4:8] != b"CIR0":   # a .tflite: no need to read the whole file
            return None
    raw = Path(path).read_bytes()
    m = tflite.Model.GetRootAs(raw, 0)
    for i in range(m.MetadataLength()):
        md = m.Metadata(i)
        if (md.Name() or b"").decode("utf-8", "replace") != METADATA_NAME:
            continue
        if md.Buffer() >= m.BuffersLength():
            raise CircleTrainingError(f"{METADATA_NAME} metadata names buffer {md.Buffer()}, the model has "
                                      f"{m.BuffersLength()}")
        return parse_training_info(m.Buffers(md.Buffer()).DataAsNumpy().tobytes())
    return None


def _f32(v: float) -> float:
    """A float32 field as the shortest decimal that reads back as the same float32 (0.9, not 0.89999997...)."""
    return float(str(np.float32(v)))


def spec_values(info: TrainingInfo) -> dict[str, Any]:
    """The spec fields (dotted paths) the metadata gives values for."""
    if info.reduction != "sum_over_batch_size":
        raise CircleTrainingError(f"{METADATA_NAME} asks for loss reduction {info.reduction!r}; tinytrain's loss is "
                                  "the mean over the batch (sum_over_batch_size)")
    for name, v in (("learning_rate", info.learning_rate), ("batch_size", info.batch_size), ("epochs", info.epochs),
                    ("eps", info.eps)):
        if v is not None and not v > 0:
            raise CircleTrainingError(f"{METADATA_NAME}: {name} is {v}; it must be positive")
    out: dict[str, Any] = {"train.optimizer.kind": info.optimizer,
                           "train.loss": "mse" if info.loss == "mean_squared_error" else "cross_entropy"}
    if info.learning_rate is not None:
        out["train.learning_rate"] = _f32(info.learning_rate)
    if info.batch_size is not None:
        out["train.batch_size"] = int(info.batch_size)
    if info.epochs is not None:
        out["train.epochs"] = int(info.epochs)
    for name in ("beta1", "beta2", "eps"):
        if getattr(info, name) is not None:
            out[f"train.optimizer.{name}"] = _f32(getattr(info, name))
    return out


def training_info_bytes(info: TrainingInfo) -> bytes:
    """`info` as a CTR0 ModelTraining flatbuffer (what onert-micro's training reads from CIRCLE_TRAINING)."""
    b = flatbuffers.Builder(128)
    opt_code = {v: k for k, v in OPTIMIZERS.items()}[info.optimizer]
    loss_code = {v: k for k, v in LOSSES.items()}[info.loss]
    floats = [info.learning_rate or 0.0] + ([info.beta1 or 0.0, info.beta2 or 0.0, info.eps or 0.0]
                                           if info.optimizer == "adam" else [])
    b.StartObject(len(floats))
    for slot, v in enumerate(floats):
        b.PrependFloat32Slot(slot, float(v), 0.0)
    opt_t = b.EndObject()
    b.StartObject(1)
    if loss_code in (0, 1):
        b.PrependBoolSlot(0, bool(info.from_logits), False)
    loss_t = b.EndObject()
    b.StartObject(11)
    b.PrependUint32Slot(0, info.version, 0)
    b.PrependInt8Slot(1, opt_code, 0)
    b.PrependUint8Slot(2, _OPT_UNION[info.optimizer], 0)
    b.PrependUOffsetTRelativeSlot(3, opt_t, 0)
    b.PrependInt8Slot(4, loss_code, 0)
    b.PrependUint8Slot(5, _LOSS_UNION[loss_code], 0)
    b.PrependUOffsetTRelativeSlot(6, loss_t, 0)
    b.PrependInt32Slot(7, int(info.epochs or 0), 0)
    b.PrependInt32Slot(8, int(info.batch_size or 0), 0)
    b.PrependInt8Slot(9, {v: k for k, v in REDUCTIONS.items()}[info.reduction], 0)
    b.Finish(b.EndObject(), file_identifier=IDENTIFIER)
    return bytes(b.Output())


def write_circle_plus(trained_tflite: Path, dest: Path, optimizer: str, rc: Any, regression: bool) -> bool:
    """The trained model as a .circle carrying CIRCLE_TRAINING: what it was trained with (optimizer, its
    hyper-parameters, loss, batch size, epochs), so onert can continue training it. Returns False (and writes the
    model without the metadata) for an optimizer the schema cannot name (momentum, rmsprop)."""
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.model.tflite_writer import write_model_bytes

    g = read_model(Path(trained_tflite))
    last = g.ops[-1].type if g.ops else ""
    info = None
    if optimizer in ("sgd", "adam"):
        info = TrainingInfo(optimizer, float(rc.learning_rate),
                            "mean_squared_error" if regression else "sparse_categorical_crossentropy",
                            int(rc.batch_size), int(rc.epochs),
                            beta1=float(rc.beta1) if optimizer == "adam" else None,
                            beta2=float(rc.beta2) if optimizer == "adam" else None,
                            eps=float(rc.eps) if optimizer == "adam" else None,
                            from_logits=not regression and last != "SOFTMAX")
    meta = {METADATA_NAME: training_info_bytes(info)} if info is not None else None
    write_model_bytes(g, Path(dest), metadata=meta)
    return info is not None
