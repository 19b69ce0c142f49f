"""Runtime configuration of a generated training firmware (`runtime.bin`) and the firmware protocol.

Values that only change how the firmware *runs* (learning rate, epochs, seed, ...) are passed in a
small binary file at start-up, so that changing them reruns only `emulate-run`, never `codegen` or
`cross-compile` (DESIGN §3).

`runtime.bin` (protocol 1), little-endian, 56 bytes, no padding:

    offset size  field
    0      4     magic  b"TTRC"
    4      4     version (u32) = 1
    8      4     learning_rate (f32)
    12     4     epochs (u32)
    16     4     seed (u32)
    20     4     batch_size (u32, >= 1): updates are applied after every batch_size samples
    24     4     momentum (f32)        SGD momentum / RMSProp momentum
    28     4     beta1 (f32)           Adam
    32     4     beta2 (f32)           Adam
    36     4     eps (f32)             Adam / RMSProp
    40     4     alpha (f32)           RMSProp decay
    44     4     weight_decay (f32)
    48     4     max_train_samples (u32): samples of train.ttds used per epoch, 0 = all
    52     4     flags (u32): bit0 evaluate on test.ttds before training, bit1 evaluate after,
                 bit2 resume from `resume.ttck` (a checkpoint, stages/c_emit/api.py), bit3 save
                 `checkpoint.ttck` after training, bit4 write every evaluated sample's output bytes to
                 `eval_before.bin` / `eval_after.bin` (emulate-run's QEMU-vs-host agreement check)
    56     4     stop_after_steps (u32, version 2 only): stop after this many steps of this run

Version 2 (60 bytes) is written only when stop_after_steps is set, so every other record keeps its
version-1 bytes (and the caches that key on them).

The C side (`tt_runtime_config` in the generated `tt_model.c`) parses it field by field from the
bytes (never a memcpy of a struct, whose padding and endianness are the compiler's), and fails
with `tt_fail` on a wrong magic, version or size.

The firmware's run folder holds:
  * `runtime.bin`   this file;
  * `train.ttds`, `test.ttds`  TTDS streams (stages/train/data.py `write_stream`): int8 samples already
    quantized with the model input's scale / zero point (float32 samples for float models), int32
    labels.

The firmware (protocol 1):
  1. reads runtime.bin; paints the arena with 0xA5;
  2. if flags bit0: evaluates test.ttds (forward only, argmax of the output) -> acc_before;
  3. trains `epochs` times over the first max_train_samples records of train.ttds, in file order
     (no shuffling; a last partial batch is dropped, as train_executor.train does); per sample:
     forward, loss, backward (gradients accumulate), and every batch_size samples the updates, in
     the schedule's order, in place (batch 1: the updates run inside the sample step, in the
     in-place order). batch_size must equal the compiled one (the update's 1/B is a constant of
     the program), else tt_fail. `tt_instructions()` is read around every training step (one
     step = batch_size samples + their update), giving instructions_per_step_*;
  4. if flags bit1: evaluates again -> acc_after;
  5. writes `losses.bin` (f32 little-endian, one per sample step, in order), `weights.bin` (the
     final bytes of every trained tensor -- whole tensors, untrained channels included --
     concatenated in the order of codegen's `io_layout.json`), and `results.json`:
       {"protocol": 1, "acc_before": {"correct": c, "total": t}, "acc_after": {...},
        "steps": S, "samples": N, "instructions_total_train": I,
        "instructions_per_step_min": a, "instructions_per_step_max": b,
        "instructions_per_step_mean": m, "arena_bytes_planned": A, "arena_bytes_used": U,
        "loss_nan": false}
     integers only (acc_* are {"correct": 0, "total": 0} when not evaluated; instruction counts
     are 0 on host). arena_bytes_used is the highest arena offset no longer holding the paint.
  6. On a NaN/inf loss it stops, writes results.json with "loss_nan": true (and losses.bin up
     to and including that loss), and calls tt_fail("loss is NaN at step k").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

MAGIC = b"TTRC"
VERSION = 1
PROTOCOL = 1

FLAG_EVAL_BEFORE = 1 << 0
FLAG_EVAL_AFTER = 1 << 1
FLAG_RESUME = 1 << 2
FLAG_SAVE_CHECKPOINT = 1 << 3
FLAG_EVAL_DUMP = 1 << 4

# One struct format for the whole record: '<' = little-endian, no padding.
_FORMAT = "<4sIfIIIffffffII"
SIZE = struct.calcsize(_FORMAT)  # 56
SIZE_V2 = SIZE + 4

# The largest values the record's u32 and f32 fields hold; the spec refuses larger ones up front.
U32_MAX = 2**32 - 1
F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # 3.4028234663852886e+38


@dataclass(frozen=True)
class OptimizerHyperParameters:
    """The optimizer hyper-parameters runtime.bin carries. Its defaults are THE defaults, read by the spec's
    `train.optimizer` (what users see and set; RMSProp's alpha is `rho` there, as in Keras), by this record and by
    autodiff's training graph (`runtime_defaults`, the golden model's values): one place, so that the firmware
    and the golden model cannot train with different values. They are Keras's (TFLite's origin), not PyTorch's
    (eps 1e-8, RMSProp alpha 0.99)."""

    momentum: float = 0.9   # SGD with momentum: velocity decay
    beta1: float = 0.9      # Adam: first-moment decay
    beta2: float = 0.999    # Adam: second-moment decay
    eps: float = 1e-7       # Adam, RMSProp: added to the denominator
    alpha: float = 0.9      # RMSProp: decay of the squared-gradient average


OPTIMIZER_DEFAULTS = OptimizerHyperParameters()


@dataclass(frozen=True)
class RuntimeConfig:
    learning_rate: float = 0.01
    epochs: int = 1
    seed: int = 0
    batch_size: int = 1
    # The firmware's plain SGD reads momentum too, so the record's default is none (emulate-run sets the spec's
    # value for the momentum optimizer only).
    momentum: float = 0.0
    beta1: float = OPTIMIZER_DEFAULTS.beta1
    beta2: float = OPTIMIZER_DEFAULTS.beta2
    eps: float = OPTIMIZER_DEFAULTS.eps
    alpha: float = OPTIMIZER_DEFAULTS.alpha
    weight_decay: float = 0.0
    max_train_samples: int = 0
    flags: int = FLAG_EVAL_BEFORE | FLAG_EVAL_AFTER
    stop_after_steps: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (int, "int") and not (0 <= int(v) <= U32_MAX):
                raise ValueError(f"runtime config {f.name}={v} does not fit in a u32")
        if self.batch_size < 1:
            raise ValueError("runtime config batch_size must be >= 1")

    def to_bytes(self) -> bytes:
        v2 = int(self.stop_after_steps) != 0
        head = struct.pack(
            _FORMAT, MAGIC, 2 if v2 else VERSION, float(self.learning_rate), int(self.epochs), int(self.seed),
            int(self.batch_size), float(self.momentum), float(self.beta1), float(self.beta2),
            float(self.eps), float(self.alpha), float(self.weight_decay),
            int(self.max_train_samples), int(self.flags))
        return head + struct.pack("<I", int(self.stop_after_steps)) if v2 else head

    @classmethod
    def from_bytes(cls, data: bytes) -> "RuntimeConfig":
        if len(data) not in (SIZE, SIZE_V2):
            raise ValueError(f"runtime.bin: {len(data)} bytes, expected {SIZE}")
        (magic, version, lr, epochs, seed, bs, mom, b1, b2, eps, alpha, wd, maxn,
         flags) = struct.unpack(_FORMAT, data[:SIZE])
        stop = struct.unpack("<I", data[SIZE:])[0] if len(data) == SIZE_V2 else 0
        if magic != MAGIC:
            raise ValueError(f"runtime.bin: bad magic {magic!r}")
        if version != (2 if len(data) == SIZE_V2 else VERSION):
            raise ValueError(f"runtime.bin: version {version}, expected {VERSION}")
        return cls(learning_rate=lr, epochs=epochs, seed=seed, batch_size=bs, momentum=mom,
                   beta1=b1, beta2=b2, eps=eps, alpha=alpha, weight_decay=wd,
                   max_train_samples=maxn, flags=flags, stop_after_steps=stop)
