"""Element-wise arithmetic: add, mul, sub."""

from . import OpCase

CASES = {
    "add": OpCase(("residual_int8.tflite", "residual_float.tflite", "ops/bn_input_float.tflite")),
    "mul": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
    "sub": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
}
