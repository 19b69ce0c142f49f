"""Activations and softmax."""

from . import OpCase

CASES = {
    "softmax": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "relu": OpCase(("residual_int8.tflite", "residual_float.tflite")),
    # TFLM's int8 RELU6 clamps in the input's parameters and ignores the output's (activations_common.cc
    # Relu6Prepare); LiteRT's QuantizedReluX requantizes, and so do we (see tests/test_executor_litert.py).
    "relu6": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite"),
                    tflm="TFLM's int8 RELU6 ignores the output quantization (Relu6Prepare)"),
    "logistic": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
    "tanh": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
    "hard_swish": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
    "leaky_relu": OpCase(("ops/act_arith_int8.tflite", "ops/act_arith_float.tflite")),
    "prelu": OpCase(("ops/prelu_slice_int8.tflite", "ops/prelu_slice_float.tflite")),
}
