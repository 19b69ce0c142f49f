"""Layers: conv2d, depthwise_conv2d, transpose_conv, fully_connected."""

from . import OpCase

CASES = {
    "conv2d": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "depthwise_conv2d": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite")),
    "transpose_conv": OpCase(("tconv/tconv_a_int8.tflite", "tconv/tconv_a_float.tflite")),
    "fully_connected": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
}
