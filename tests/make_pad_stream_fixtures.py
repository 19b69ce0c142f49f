"""Make the converter-made fixtures of row streams through spatial padding (tests/fixtures/streams/).

Run by hand with TensorFlow (not in CI; tests only read the files):

    /work/tfenv/bin/python tests/make_pad_stream_fixtures.py

Same conventions as tests/make_op_fixtures.py (`<m>_float.tflite`, full-integer int8 `<m>_int8.tflite`, 4 samples
in `<m>.input.npy`, fixed seeds). Model:

  hpad  [1,16,16,3]: CONV_2D 3x3 same (ReLU6) -> two branches joined by ADD (MediaPipe's BlazeBlock shape):
        PAD H (1,0) W (1,0) -> DEPTHWISE_CONV_2D 3x3 stride 2 valid (ReLU) -> CONV_2D 1x1 (24), and MAX_POOL_2D
        2x2 -> PAD C (0,16); -> RELU -> PAD H (2,1) W (1,1) (two pad rows on top, one below) -> DEPTHWISE_CONV_2D
        3x3 valid -> CONV_2D 1x1 (4) -> MEAN -> FULLY_CONNECTED 4 -> SOFTMAX
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_op_fixtures import SEED, write_models  # noqa: E402  the same conversion and sample files

OUT = Path(__file__).resolve().parent / "fixtures" / "streams"


def hpad() -> keras.Model:
    layers = keras.layers
    bias = keras.initializers.RandomNormal(stddev=0.2, seed=SEED)
    x = keras.Input(shape=(16, 16, 3), batch_size=1)
    h = layers.Conv2D(8, 3, padding="same", activation="relu6", bias_initializer=bias)(x)
    # a top pad row: no SAME padding of the strided depthwise pads the top, so the converter keeps the PAD
    a = layers.ZeroPadding2D(((1, 0), (1, 0)))(h)
    a = layers.DepthwiseConv2D(3, strides=2, padding="valid", activation="relu", bias_initializer=bias)(a)
    a = layers.Conv2D(24, 1, bias_initializer=bias)(a)
    b = layers.MaxPooling2D(2)(h)
    b = layers.Lambda(lambda t: keras.ops.pad(t, [[0, 0], [0, 0], [0, 0], [0, 16]]))(b)   # channel PAD
    s = layers.ReLU()(layers.Add()([a, b]))
    s = layers.ZeroPadding2D(((2, 1), (1, 1)))(s)
    s = layers.DepthwiseConv2D(3, padding="valid", bias_initializer=bias)(s)
    s = layers.Conv2D(4, 1, bias_initializer=bias)(s)
    s = layers.GlobalAveragePooling2D()(s)
    y = layers.Dense(4, activation="softmax", bias_initializer=bias)(s)
    return keras.Model(x, y)


MODELS = {"hpad": hpad}


if __name__ == "__main__":
    write_models(MODELS, OUT, SEED, sys.argv[1:] or None)
