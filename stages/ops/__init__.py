"""The op registry: everything the pipeline knows about an op type, declared once, in the op's own module.

One module per op or small family (conv.py, fully_connected.py, elementwise.py, activations.py, pooling.py,
shape.py, resize.py, softmax.py, quant.py, depth_to_space.py, split.py) declares an `OPS` tuple of `OpDef`s: the
forward op as a .tflite file holds it (its TFLite builtin codes and their operand counts, and where moved its
options: read_options / write_options), its IR operands and attrs, its traits, and next to it the backward ops
autodiff emits for it. depth_to_space.py and split.py show an op added in one place: module, C kernel file
(kernels_c/ops/, declaring its own prototypes), its cases (tests/op_cases/) and one line here. training.py declares
the ops only training graphs hold (losses, updates, gradient plumbing). `_FAMILIES` below is the one table that
lists the modules; adding an op means adding an `OpDef` to its family's module (or a new module and one line here).

Every op-name list and trait list of the pipeline is derived here (`FORWARD_OPS`, `LAYER_OPS`, `INT8_OPS`, ...)
and imported from here: the TFLite reader's handler table and the writer's builtin map, the executor's kernel
table, ptq's int8 rules, autodiff's differentiable and clamp-masked ops, memplan's in-place traits, the trainable
layers of train_plan / plan_memory / load, the streams' row / channel / mask ops and the schedule's eager ops.
tests/test_op_registry.py checks that no list of op names is written anywhere else.

`catalogue()` renders the IR op vocabulary (the table stages/model/ir.py used to hold by hand).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

from tinytrain.stages.ops import (
    activations,
    conv,
    depth_to_space,
    elementwise,
    fp16,
    fully_connected,
    pooling,
    quant,
    resize,
    shape,
    softmax,
    space_to_depth,
    split,
    training,
    transpose,
)
from tinytrain.stages.ops.base import KINDS, Builtin, OpDef
# The ops a stage adds or tests by itself (gradient plumbing, conversions, a few per-op rules): consumers spell
# them through these definitions (ops.GRAD_ACCUMULATE.name), so each op's name is written once, in its module.
from tinytrain.stages.ops.conv import CONV2D, CONV2D_GRAD_INPUT, TRANSPOSE_CONV
from tinytrain.stages.ops.quant import DEQUANTIZE, DEQUANTIZE_SLICE, QUANTIZE
from tinytrain.stages.ops.shape import PAD, STRIDED_SLICE
from tinytrain.stages.ops.training import (ACT_GRAD, BATCH_ACCUMULATE, BIAS_GRAD, CLAMP_MASK, GRAD_ACCUMULATE,
                                           INT8_CLAMP_GRAD, MASK_GRAD, STEP_COUNTER)

__all__ = ["Builtin", "OpDef", "KINDS", "REGISTRY", "get", "names", "update_op", "catalogue",
           # the re-exported definitions above
           "CONV2D", "CONV2D_GRAD_INPUT", "TRANSPOSE_CONV", "DEQUANTIZE", "DEQUANTIZE_SLICE", "QUANTIZE", "PAD",
           "STRIDED_SLICE", "ACT_GRAD", "BATCH_ACCUMULATE", "BIAS_GRAD", "CLAMP_MASK", "GRAD_ACCUMULATE",
           "INT8_CLAMP_GRAD", "MASK_GRAD", "STEP_COUNTER"]

# The one table of op modules. Order: forward families first, training ops last (derived lists keep this order).
_FAMILIES = (conv, fully_connected, elementwise, pooling, shape, softmax, activations, quant, resize, depth_to_space,
             split, transpose, space_to_depth, training, fp16)


def _build() -> Mapping[str, OpDef]:
    out: dict[str, OpDef] = {}
    for mod in _FAMILIES:
        for d in mod.OPS:
            if d.name in out:
                raise ValueError(f"op {d.name!r} is registered twice ({mod.__name__})")
            out[d.name] = d
    return MappingProxyType(out)


REGISTRY: Mapping[str, OpDef] = _build()


def get(name: str) -> OpDef | None:
    return REGISTRY.get(name)


def names(pred: Callable[[OpDef], bool]) -> tuple[str, ...]:
    """Registered op names whose definition satisfies `pred`, in registry order."""
    return tuple(d.name for d in REGISTRY.values() if pred(d))


# ---- derived lists (the only place they are written) -----------------------------------------------------------
FORWARD_OPS = names(lambda d: d.kind == "forward")
LAYER_OPS = names(lambda d: d.layer)
TRAINABLE_OPS = names(lambda d: d.trainable)
FROZEN_ONLY_OPS = names(lambda d: d.frozen_only)
BN_FOLD_OPS = names(lambda d: d.bn_fold)
INT8_OPS = names(lambda d: d.kind == "forward" and d.int8)
DIFFERENTIABLE = names(lambda d: d.differentiable)
CONVERSION_OPS = names(lambda d: d.conversion)
UNPACK_OPS = names(lambda d: d.unpacks_constants)
CLAMP_MASKED_OPS = names(lambda d: d.clamp_masked)
OP_CLAMPS = MappingProxyType({d.name: d.op_clamp for d in REGISTRY.values() if d.op_clamp is not None})
SHARED_PARAM_OPS = names(lambda d: d.shared_qparams is not None)
FIXED_OUTPUT_PARAMS = MappingProxyType({d.name: d.fixed_output for d in REGISTRY.values() if d.fixed_output})
CONST_OPERAND_OPS = names(lambda d: d.const_operands_per_tensor)
ROW_OPS = names(lambda d: d.row_stream == "conv")
POOL_ROW_OPS = names(lambda d: d.row_stream == "pool")
LOCAL_ROW_OPS = names(lambda d: d.row_stream == "local")
IN_PLACE_OPS = names(lambda d: d.in_place is not None)
FIRST_INPUT_ONLY = names(lambda d: d.in_place in ("first", "channel"))
CHANNEL_SCRATCH_OPS = names(lambda d: d.in_place == "channel")
MASK_OPS = names(lambda d: d.masks_gradient)
BROADCAST_GRAD_OPS = names(lambda d: d.broadcasts)
CHANNEL_GRAD_OPS = names(lambda d: d.channel_stream)
HIDDEN_ROLES = MappingProxyType({d.name: d.hidden_role for d in REGISTRY.values() if d.hidden_role is not None})
GRAD_INPUT_OPS = names(lambda d: d.grad_input)
FP16_OPERANDS = MappingProxyType({d.name: d.fp16_operands for d in REGISTRY.values() if d.fp16_operands})


def reads_fp16(op_type: str, k: int) -> bool:
    """Whether op_type's C kernel reads an fp16 tensor itself at operand k (OpDef.fp16_operands; "all": any)."""
    ks = FP16_OPERANDS.get(op_type, ())
    return ks == "all" or k in ks

FP16_OUTPUT_OPS = names(lambda d: d.fp16_output)
FLOAT_UPDATE_OPS = names(lambda d: d.kind == "update" and not d.qas)
QAS_UPDATE_OPS = names(lambda d: d.kind == "update" and d.qas)
UPDATE_OPS = FLOAT_UPDATE_OPS + QAS_UPDATE_OPS
EAGER_OPS = names(lambda d: d.eager)
# spec loss name -> its loss op; loss name -> the activation its training forward drops (losses on logits)
LOSS_OPS = MappingProxyType({d.loss: d.name for d in REGISTRY.values() if d.loss is not None})
LOSS_DROPS = MappingProxyType({d.dropped_by: d.name for d in REGISTRY.values() if d.dropped_by is not None})
# TFLite builtin operator name -> (op, Builtin); custom code -> (op, Builtin)
TFLITE_BUILTINS = MappingProxyType({b.code: (d.name, b) for d in REGISTRY.values() for b in d.tflite
                                    if not b.custom})
TFLITE_CUSTOM = MappingProxyType({b.code: (d.name, b) for d in REGISTRY.values() for b in d.tflite if b.custom})


def update_op(kind: str, qas: bool) -> str:
    """The update op of optimizer `kind` (float, or QAS for int8 / int32 parameters)."""
    for d in REGISTRY.values():
        if d.kind == "update" and d.optimizer == kind and d.qas == qas:
            return d.name
    raise KeyError(f"no {'QAS ' if qas else ''}update op for optimizer {kind!r}")


def catalogue(kind: str | None = None) -> str:
    """The IR op vocabulary as text, one op per line: `type: operands -> outputs; attrs  (note)`."""
    lines = []
    for d in REGISTRY.values():
        if kind is not None and d.kind != kind:
            continue
        line = f"  {d.name + ':':<30} {d.signature}"
        if d.attrs:
            line += f";  {', '.join(d.attrs)}"
        if d.note:
            line += f"  ({d.note})"
        lines.append(line)
    return "\n".join(lines)
