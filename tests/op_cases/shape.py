"""Data movement: reshape, pad, concatenation, strided_slice."""

from . import OpCase

CASES = {
    "reshape": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "pad": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite")),
    "concatenation": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite")),
    "strided_slice": OpCase(("ops/prelu_slice_int8.tflite", "ops/prelu_slice_float.tflite")),
}
