"""Data movement: reshape, pad, concatenation, strided_slice, and their backward ops."""

from __future__ import annotations

from .backward import input_backward
from .base import Builtin, OpDef


# ---- backward: dz moved back to the input's place (pad: reads the paddings; concatenation: one share per operand)

def _reshape_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz)


def _pad_backward(bb, op, i, dz):
    input_backward(bb, op, i, dz, reads=(op.inputs[1],))


def _concatenation_backward(bb, op, i, dz):
    ins = [n for n in op.inputs if n is not None]
    axis = int(op.attrs.get("axis", -1)) % len(bb.g.tensors[op.outputs[0]].shape)
    outs = [bb.share(n, i) for n in ins]
    if any(outs):
        bb.emit("concatenation_grad", [dz], [o for o in outs if o], axis=axis,
                sizes=[int(bb.g.tensors[n].shape[axis]) for n in ins], which=[j for j, o in enumerate(outs) if o])


def _strided_slice_backward(bb, op, i, dz):
    a = op.attrs
    input_backward(bb, op, i, dz, attrs=dict(starts=[int(v) for v in a["starts"]], stops=[int(v) for v in a["stops"]],
                                             strides=[int(v) for v in a["strides"]]))


OPS = (
    OpDef("reshape", signature="x, shape? -> y", attrs=("new_shape",),
          note="new_shape is the output shape, always present", tflite=(Builtin("RESHAPE", 1, 2),),
          differentiable=True, shared_qparams="first", in_place="any", backward=_reshape_backward),
    OpDef("pad", signature="x, paddings[N,2] -> y", tflite=(Builtin("PAD", 2, 2), Builtin("PADV2", 2, 3)),
          differentiable=True, shared_qparams="first", backward=_pad_backward),
    OpDef("concatenation", signature="x0, x1, ... -> y", attrs=("axis", "act"),
          tflite=(Builtin("CONCATENATION", 1, 1 << 16),), differentiable=True, shared_qparams="all",
          const_operands_per_tensor=True, backward=_concatenation_backward),
    OpDef("strided_slice", signature="x, begin, end, strides -> y",
          attrs=("starts", "stops", "strides", "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                 "shrink_axis_mask", "offset"),
          note="starts/stops/strides per axis, resolved by the reader with TFLite's StartForAxis/StopForAxis "
               "against the static shape (a negative stride stops before `stops`, -1 meaning past index 0); "
               "the masks and offset as in the file, for the writer; axis 0 is always taken whole",
          tflite=(Builtin("STRIDED_SLICE", 4, 4),), differentiable=True, shared_qparams="first",
          backward=_strided_slice_backward),
    OpDef("reshape_grad", kind="backward", of="reshape", signature="dy -> dx", in_place="any"),
    OpDef("pad_grad", kind="backward", of="pad", signature="dy, paddings -> dx"),
    OpDef("concatenation_grad", kind="backward", of="concatenation", signature="dz -> dx0?, dx1?, ...",
          attrs=("axis", "sizes", "which")),
    OpDef("strided_slice_grad", kind="backward", of="strided_slice", signature="dy -> dx",
          attrs=("starts", "stops", "strides"), note="dy scattered into zeros of x's shape"),
)
