"""Make the converter-made stateful streaming fixture (tests/fixtures/stateful/), the structure of microWakeWord's
models in miniature.

Run by hand with TensorFlow (not in CI; tests only read the files):

    /work/tfenv/bin/python tests/make_stateful_fixtures.py

`stream_kws_int8.tflite`: a tf.Module whose streaming buffers are tf.Variables, saved and converted full-integer
int8 (int8 I/O) with resource variables enabled, so that the file holds what microWakeWord's do: subgraph #0 with
CALL_ONCE, VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, and an init subgraph that assigns each variable its
initial value (zeros). One invocation takes one chunk of 3 frames x 10 features:

    x [1,3,10] -> reshape [1,3,1,10] -> concat(state0 [1,2,1,10], x) [1,5,1,10] -> state0 := last 2 frames
       -> CONV_2D 5x1 (ReLU) [1,1,1,8] -> concat(state1 [1,3,1,8], y) [1,4,1,8] -> state1 := last 3 frames
       -> reshape [1,32] -> FULLY_CONNECTED [1,2] -> output [1,2]

`stream_kws_u8out.tflite`: the same with a uint8 output, as microWakeWord's (a final QUANTIZE int8 -> uint8).

`stream_kws.input.npy`: int8 [4, 6, 3, 10], 4 sequences of 6 invocations (seeds fixed).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

OUT = Path(__file__).resolve().parent / "fixtures" / "stateful"
SEED = 77
FRAMES, FEATURES, CONV_OUT, CLASSES = 3, 10, 8, 2


class StreamKWS(tf.Module):
    def __init__(self, rng: np.random.Generator):
        super().__init__()
        self.state0 = tf.Variable(tf.zeros([1, 2, 1, FEATURES]), trainable=False, name="stream0/states")
        self.state1 = tf.Variable(tf.zeros([1, 3, 1, CONV_OUT]), trainable=False, name="stream1/states")
        self.w_conv = tf.constant(rng.normal(0, 0.3, (5, 1, FEATURES, CONV_OUT)).astype(np.float32))
        self.b_conv = tf.constant(rng.normal(0, 0.1, (CONV_OUT,)).astype(np.float32))
        self.w_fc = tf.constant(rng.normal(0, 0.3, (4 * CONV_OUT, CLASSES)).astype(np.float32))
        self.b_fc = tf.constant(rng.normal(0, 0.1, (CLASSES,)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, FRAMES, FEATURES], tf.float32)])
    def __call__(self, x):
        x = tf.reshape(x, [1, FRAMES, 1, FEATURES])
        buf0 = tf.concat([self.state0, x], axis=1)
        self.state0.assign(buf0[:, -2:])
        y = tf.nn.relu(tf.nn.conv2d(buf0, self.w_conv, strides=1, padding="VALID") + self.b_conv)
        buf1 = tf.concat([self.state1, y], axis=1)
        self.state1.assign(buf1[:, -3:])
        return tf.matmul(tf.reshape(buf1, [1, 4 * CONV_OUT]), self.w_fc) + self.b_fc


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    module = StreamKWS(rng)
    rep = rng.normal(0, 1, (64, 1, FRAMES, FEATURES)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures=module.__call__.get_concrete_function())
        for out_type, fname in ((tf.int8, "stream_kws_int8.tflite"), (tf.uint8, "stream_kws_u8out.tflite")):
            conv = tf.lite.TFLiteConverter.from_saved_model(tmp)
            conv.experimental_enable_resource_variables = True
            # What microWakeWord sets: the variables themselves become int8 (no DEQUANTIZE/QUANTIZE around them).
            conv._experimental_variable_quantization = True
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.representative_dataset = lambda: ([r] for r in rep)
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            conv.inference_input_type = tf.int8
            conv.inference_output_type = out_type
            (OUT / fname).write_bytes(conv.convert())
    x = rng.normal(0, 1, (4, 6, FRAMES, FEATURES))
    # Quantized with the model's input parameters, as the data a user feeds an int8 model.
    interp = tf.lite.Interpreter(model_path=str(OUT / "stream_kws_int8.tflite"))
    scale, zp = interp.get_input_details()[0]["quantization"]
    q = np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8)
    np.save(OUT / "stream_kws.input.npy", q)


if __name__ == "__main__":
    main()
