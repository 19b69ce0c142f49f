"""SPACE_TO_DEPTH (fixture: its recipe `_model` below, written by tests/make_movement_fixtures.py)."""

from . import OpCase


def _model():
    """[1,8,8,3]: CONV_2D 3x3 (4) -> SPACE_TO_DEPTH (block 2) -> [1,4,4,16] -> CONV_2D 1x1 (8) -> SPACE_TO_DEPTH
    (block 2) -> [1,2,2,32] -> CONV_2D 1x1 (2): two instances between layers, so the backward runs through both."""
    import keras
    import tensorflow as tf

    x = keras.Input(shape=(8, 8, 3), batch_size=1)
    y = keras.layers.Conv2D(4, 3, padding="same")(x)
    y = keras.layers.Lambda(lambda t: tf.nn.space_to_depth(t, 2))(y)
    y = keras.layers.Conv2D(8, 1)(y)
    y = keras.layers.Lambda(lambda t: tf.nn.space_to_depth(t, 2))(y)
    y = keras.layers.Conv2D(2, 1)(y)
    return keras.Model(x, y)


def _torch(attrs, ins, out_shapes):
    """torch's pixel_unshuffle (NCHW, channels in c*k^2 + block position order), reordered to TFLite's
    (block position)*C + c."""
    import torch.nn.functional as F

    x, k = ins[0], int(attrs["block_size"])
    y = F.pixel_unshuffle(x.permute(0, 3, 1, 2), k).permute(0, 2, 3, 1)
    n, h, w, ck = y.shape
    return y.reshape(n, h, w, ck // (k * k), k * k).transpose(3, 4).reshape(n, h, w, ck)


CASES = {"space_to_depth": OpCase(("ops/space_to_depth_int8.tflite", "ops/space_to_depth_float.tflite"),
                                  torch=_torch)}
FIXTURE_MODELS = {"space_to_depth": _model}
