"""TRANSPOSE (fixture: its recipe `_model` below, written by tests/make_movement_fixtures.py)."""

from . import OpCase


def _model():
    """[1,4,6,3]: CONV_2D 3x3 (8) -> TRANSPOSE (0,2,1,3) -> [1,6,4,8] -> CONV_2D 1x1 (4) -> TRANSPOSE (0,3,1,2)
    -> [1,4,6,4] -> CONV_2D 1x1 (2): the two transposes between layers, so the backward runs through both."""
    import keras
    import tensorflow as tf

    x = keras.Input(shape=(4, 6, 3), batch_size=1)
    y = keras.layers.Conv2D(8, 3, padding="same")(x)
    y = keras.layers.Lambda(lambda t: tf.transpose(t, [0, 2, 1, 3]))(y)
    y = keras.layers.Conv2D(4, 1)(y)
    y = keras.layers.Lambda(lambda t: tf.transpose(t, [0, 3, 1, 2]))(y)
    y = keras.layers.Conv2D(2, 1)(y)
    return keras.Model(x, y)


def _torch(attrs, ins, out_shapes):
    return ins[0].permute(*[int(p) for p in attrs["perm"]])


CASES = {"transpose": OpCase(("ops/transpose_int8.tflite", "ops/transpose_float.tflite"), torch=_torch)}
FIXTURE_MODELS = {"transpose": _model}
