"""DEPTH_TO_SPACE (fixture: tests/make_movement_fixtures.py)."""

from . import OpCase


def _torch(attrs, ins, out_shapes):
    """torch's pixel_shuffle (NCHW, channels in CRD order) after reordering TFLite's DCR channels."""
    import torch.nn.functional as F

    x, k = ins[0], int(attrs["block_size"])
    n, h, w, c = x.shape
    crd = x.reshape(n, h, w, k * k, c // (k * k)).transpose(3, 4).reshape(n, h, w, c)
    return F.pixel_shuffle(crd.permute(0, 3, 1, 2), k).permute(0, 2, 3, 1)


CASES = {"depth_to_space": OpCase(("ops/d2s_int8.tflite", "ops/d2s_float.tflite"), torch=_torch, litert_ref=False)}
