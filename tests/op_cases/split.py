"""SPLIT and SPLIT_V (fixture: tests/make_movement_fixtures.py); twins: torch.split."""

from . import OpCase


def _split(attrs, ins, out_shapes):
    import torch

    return list(torch.split(ins[1], list(attrs["sizes"]), dim=int(attrs["axis"])))


def _split_v(attrs, ins, out_shapes):
    import torch

    return list(torch.split(ins[0], list(attrs["sizes"]), dim=int(attrs["axis"])))


CASES = {
    "split_even": OpCase(("ops/split_int8.tflite", "ops/split_float.tflite"), torch=_split),
    "split_v": OpCase(("ops/split_int8.tflite", "ops/split_float.tflite"), torch=_split_v),
}
