"""Make the converter-made fixtures of the data-movement ops DEPTH_TO_SPACE, SPLIT and SPLIT_V
(tests/fixtures/ops/; the op conformance test reads them, see tests/op_cases/).

Run by hand with TensorFlow (not in CI; tests only read the files):

    /path/to/tf-venv/bin/python tests/make_movement_fixtures.py [name ...]

Each model `<m>` gets `<m>_float.tflite`, `<m>_int8.tflite` (full-integer int8, int8 I/O, 64 N(0,1)
representative inputs) and `<m>.input.npy` (4 samples), as tests/make_op_fixtures.py writes them. Models (and
every FIXTURE_MODELS recipe of tests/op_cases/, e.g. transpose):

  d2s      [1,4,5,3]: CONV_2D 3x3 (12 channels) -> DEPTH_TO_SPACE (block 2) -> [1,8,10,3] -> CONV_2D 1x1 (4)
           -> DEPTH_TO_SPACE (block 2) -> output [1,16,20,1]
  split    [1,6,6,3]: CONV_2D 3x3 (8 channels) -> SPLIT in 2 along channels -> ADD of the halves -> SPLIT_V along H
           in [2, 4] -> CONCATENATION of the parts swapped -> SPLIT_V along W in [1, 3, 2] -> CONCATENATION as
           [last, first, middle] -> CONV_2D 1x1 (4) -> output [1,6,6,4]
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras

import op_cases
from make_op_fixtures import write_models

OUT = Path(__file__).resolve().parent / "fixtures" / "ops"
SEED = 4321


def d2s() -> keras.Model:
    x = keras.Input(shape=(4, 5, 3), batch_size=1)
    y = keras.layers.Conv2D(12, 3, padding="same")(x)
    y = keras.layers.Lambda(lambda t: tf.nn.depth_to_space(t, 2))(y)
    y = keras.layers.Conv2D(4, 1)(y)
    y = keras.layers.Lambda(lambda t: tf.nn.depth_to_space(t, 2))(y)
    return keras.Model(x, y)


def split() -> keras.Model:
    x = keras.Input(shape=(6, 6, 3), batch_size=1)
    y = keras.layers.Conv2D(8, 3, padding="same")(x)
    a, b = keras.layers.Lambda(lambda t: tf.split(t, 2, axis=3))(y)
    s = keras.layers.Add()([a, b])
    top, bottom = keras.layers.Lambda(lambda t: tf.split(t, [2, 4], axis=1))(s)
    z = keras.layers.Concatenate(axis=1)([bottom, top])
    p, q, r = keras.layers.Lambda(lambda t: tf.split(t, [1, 3, 2], axis=2))(z)
    out = keras.layers.Concatenate(axis=2)([r, p, q])
    out = keras.layers.Conv2D(4, 1)(out)
    return keras.Model(x, out)


# and the recipes the op cases declare beside them (tests/op_cases/, FIXTURE_MODELS)
MODELS = {"d2s": d2s, "split": split, **op_cases.fixture_models()}


if __name__ == "__main__":
    import sys

    write_models(MODELS, OUT, SEED, sys.argv[1:] or None)
