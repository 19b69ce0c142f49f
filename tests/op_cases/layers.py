"""Layers: conv2d, depthwise_conv2d, transpose_conv, fully_connected."""

from . import OpCase


def _transpose_conv(attrs, ins, out_shapes):
    """torch's conv_transpose2d (no padding: the full scatter, (H-1)*s + k rows) cropped at TFLite's padding
    (pad_top / pad_left as for a conv whose input is the op's output), zero-extended where TFLite's output reaches
    past the scatter (SAME with k < s); then the bias and the fused activation."""
    import torch
    import torch.nn.functional as F

    from tinytrain.stages.ops.conv_forward import transpose_conv_geometry

    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 and torch.is_tensor(ins[2]) else None   # x, w, b?, output_shape
    _, oh, ow, _ = out_shapes[0]
    _, kh, kw, _ = w.shape
    sh, sw, pt, pl = transpose_conv_geometry(attrs, x.shape, out_shapes[0], kh, kw)
    full = F.conv_transpose2d(x.permute(0, 3, 1, 2), w.permute(3, 0, 1, 2), stride=(sh, sw))
    full = F.pad(full, (0, max(0, pl + ow - full.shape[3]), 0, max(0, pt + oh - full.shape[2])))
    y = full[:, :, pt:pt + oh, pl:pl + ow].permute(0, 2, 3, 1)
    if b is not None:
        y = y + b
    act = attrs.get("act", "none")
    if act == "relu":
        y = torch.clamp(y, min=0.0)
    elif act == "relu6":
        y = torch.clamp(y, 0.0, 6.0)
    return y


CASES = {
    "conv2d": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
    "depthwise_conv2d": OpCase(("dwsep_int8.tflite", "dwsep_float.tflite")),
    "transpose_conv": OpCase(("tconv/tconv_a_int8.tflite", "tconv/tconv_a_float.tflite"), torch=_transpose_conv),
    "fully_connected": OpCase(("convnet_int8.tflite", "convnet_float.tflite")),
}
