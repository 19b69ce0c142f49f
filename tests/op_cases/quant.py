"""Conversions: quantize (float -> int8 at a float input), dequantize (int8 -> float at a float output)."""

from . import OpCase

CASES = {
    "quantize": OpCase(("convnet_int8_floatio.tflite",)),
    "dequantize": OpCase(("convnet_int8_floatio.tflite",)),
}
