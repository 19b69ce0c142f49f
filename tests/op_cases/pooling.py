"""Pooling and reductions: average_pool2d, max_pool2d, mean."""

from . import OpCase

CASES = {
    "average_pool2d": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "max_pool2d": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "mean": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite")),
}
