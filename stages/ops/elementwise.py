"""Binary element-wise ops with numpy broadcasting: add, sub, mul, and their backward ops."""

from __future__ import annotations

from .base import Builtin, OpDef


_NOTE = ("numpy broadcasting, either operand may be a constant such as BatchNorm's per-channel scale [C]; a "
         "constant never spans the batch axis")

OPS = (
    OpDef("add", signature="a, b -> y", attrs=("act",), tflite=(Builtin("ADD", 2, 2),), differentiable=True,
          clamp_masked=True, const_operands_per_tensor=True, in_place="any"),
    OpDef("mul", signature="a, b -> y", attrs=("act",), note="a * b; " + _NOTE, tflite=(Builtin("MUL", 2, 2),),
          differentiable=True, clamp_masked=True, const_operands_per_tensor=True),
    OpDef("sub", signature="a, b -> y", attrs=("act",), note="a - b; " + _NOTE, tflite=(Builtin("SUB", 2, 2),),
          differentiable=True, clamp_masked=True, const_operands_per_tensor=True),
    OpDef("add_grad", kind="backward", of="add", signature="dz -> da?, db?", attrs=("which",),
          note="unbroadcast to each operand's shape"),
    OpDef("mul_grad", kind="backward", of="mul", signature="dz, other -> d",
          note="one op per operand that needs a gradient: unbroadcast(dz*other)"),
    OpDef("sub_grad", kind="backward", of="sub", signature="dz -> da?, db?", attrs=("which",),
          note="a: +dz, b: -dz; unbroadcast as add_grad"),
)
