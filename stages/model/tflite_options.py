"""TFLite operator options -> IR attrs: the reader's per-operator context (_OpCtx), the option parsers by TFLite
code, and the handler tables derived from the op registry (which IR op a code becomes and its operand counts).
An op module may own its options instead (OpDef.read_options)."""

from __future__ import annotations

import struct
from typing import Any, Callable

import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator as BO
from tflite.BuiltinOptions import BuiltinOptions as BOpt

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages import ops
from tinytrain.stages.model.ir import Tensor
from tinytrain.stages.ops import Builtin
from tinytrain.stages.ops.conv import MEDIAPIPE_TRANSPOSE_CONV_BIAS

_ACTIVATIONS = {0: "none", 1: "relu", 2: "relu_n1_to_1", 3: "relu6", 4: "tanh"}
_PADDINGS = {0: "same", 1: "valid"}


class _OpCtx:
    """What an option parser needs: the op's options table and its operand tensors."""

    # reader: tflite_reader._Reader (its err() and tensors)
    def __init__(self, reader: Any, idx: int, name: str, op: Any, ins: list, outs: list):
        self.reader, self.idx, self.name, self.op, self.ins, self.outs = reader, idx, name, op, ins, outs

    def err(self, message: str) -> ModelError:
        return self.reader.err(f"operator {self.idx} ({self.name}): {message}")

    def options(self, cls: type, opt_type: int, required: bool = True) -> Any:
        if self.op.BuiltinOptionsType() == opt_type:
            table = self.op.BuiltinOptions()
            if table is not None:
                o = cls()
                o.Init(table.Bytes, table.Pos)
                return o
        if required:
            raise self.err("builtin options are missing or of the wrong kind")
        return None

    def act(self, o: Any) -> str:
        code = 0 if o is None else o.FusedActivationFunction()
        if code not in _ACTIVATIONS:
            raise self.err(f"unsupported fused activation (code {code})")
        return _ACTIVATIONS[code]

    def padding(self, o: Any) -> str:
        code = o.Padding()
        if code not in _PADDINGS:
            raise self.err(f"unknown padding (code {code})")
        return _PADDINGS[code]

    def rank(self, what: str, t: Tensor | None, rank: int) -> None:
        """Later stages index shapes by position; a wrong rank must fail here, clearly."""
        if t is not None and len(t.shape) != rank:
            raise self.err(f"{what} {t.name!r} has shape {t.shape}, expected rank {rank}")

    def layer_ranks(self, w_rank: int, io_rank: int | None) -> None:
        if io_rank is not None:
            self.rank("input", self.ins[0], io_rank)
            self.rank("output", self.outs[0], io_rank)
        self.rank("filter", self.ins[1], w_rank)
        self.rank("bias", self.ins[2] if len(self.ins) > 2 else None, 1)

    def positive(self, **values: int) -> dict[str, int]:
        for k, v in values.items():
            if v < 1:
                raise self.err(f"{k} must be >= 1, got {v}")
        return {k: int(v) for k, v in values.items()}


def _conv_common(c: _OpCtx, o: Any) -> dict[str, Any]:
    attrs = c.positive(stride_h=o.StrideH(), stride_w=o.StrideW(),
                       dilation_h=o.DilationHFactor(), dilation_w=o.DilationWFactor())
    attrs.update(padding=c.padding(o), act=c.act(o))
    return attrs


def _parse_conv(c: _OpCtx) -> dict[str, Any]:
    c.layer_ranks(4, 4)
    return _conv_common(c, c.options(tflite.Conv2DOptions, BOpt.Conv2DOptions))


def _parse_dwconv(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.DepthwiseConv2DOptions, BOpt.DepthwiseConv2DOptions)
    c.layer_ranks(4, 4)
    if c.ins[1].shape[0] != 1:
        raise c.err(f"depthwise filter shape {c.ins[1].shape} must start with 1")
    attrs = _conv_common(c, o)
    attrs.update(c.positive(depth_multiplier=o.DepthMultiplier()))
    return attrs


def _parse_fc(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.FullyConnectedOptions, BOpt.FullyConnectedOptions, required=False)
    c.layer_ranks(2, None)
    if o is not None and o.WeightsFormat() != 0:
        raise c.err("shuffled weight formats are not supported")
    return {"act": c.act(o), "keep_num_dims": bool(o.KeepNumDims()) if o is not None else False}


def _parse_add(c: _OpCtx) -> dict[str, Any]:
    return {"act": c.act(c.options(tflite.AddOptions, BOpt.AddOptions, required=False))}


def _broadcast_operands(c: _OpCtx) -> None:
    """MUL/SUB broadcast their operands numpy-style; the output must be the broadcast shape, and a constant
    operand must not span the batch axis (the result would then depend on the batch the executor runs)."""
    a, b, y = c.ins[0], c.ins[1], c.outs[0]
    try:
        shape = list(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    except ValueError:
        raise c.err(f"operand shapes {a.shape} and {b.shape} do not broadcast") from None
    if shape != list(y.shape):
        raise c.err(f"output shape {y.shape} is not the broadcast of the operand shapes {a.shape} and {b.shape}")
    for t in (a, b):
        if t.data is not None and len(t.shape) == len(y.shape) and t.shape and t.shape[0] != 1:
            raise c.err(f"constant operand {t.name!r} of shape {t.shape} spans the batch axis")


def _parse_mul(c: _OpCtx) -> dict[str, Any]:
    _broadcast_operands(c)
    return {"act": c.act(c.options(tflite.MulOptions, BOpt.MulOptions, required=False))}


def _parse_sub(c: _OpCtx) -> dict[str, Any]:
    _broadcast_operands(c)
    return {"act": c.act(c.options(tflite.SubOptions, BOpt.SubOptions, required=False))}


def _parse_leaky_relu(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.LeakyReluOptions, BOpt.LeakyReluOptions, required=False)
    # The schema's default alpha is 0.0 (a missing table means alpha 0, i.e. RELU).
    alpha = float(o.Alpha()) if o is not None else 0.0
    if not np.isfinite(alpha):
        raise c.err(f"leaky_relu alpha is {alpha}")
    return {"alpha": alpha}


def _parse_pool(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.Pool2DOptions, BOpt.Pool2DOptions)
    c.rank("input", c.ins[0], 4)
    c.rank("output", c.outs[0], 4)
    attrs = c.positive(filter_h=o.FilterHeight(), filter_w=o.FilterWidth(),
                       stride_h=o.StrideH(), stride_w=o.StrideW())
    attrs.update(padding=c.padding(o), act=c.act(o))
    return attrs


def _parse_mean(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.ReducerOptions, BOpt.ReducerOptions, required=False)
    return {"keep_dims": bool(o.KeepDims()) if o is not None else False}


def _parse_reshape(c: _OpCtx) -> dict[str, Any]:
    # The output tensor's shape is authoritative: the options' new_shape is optional and the shape
    # operand may be computed at run time.
    return {"new_shape": list(c.outs[0].shape)}


def _parse_softmax(c: _OpCtx) -> dict[str, Any]:
    beta = float(c.options(tflite.SoftmaxOptions, BOpt.SoftmaxOptions).Beta())
    if not np.isfinite(beta):
        raise c.err(f"softmax beta is {beta}")
    return {"beta": beta}


def _parse_concat(c: _OpCtx) -> dict[str, Any]:
    o = c.options(tflite.ConcatenationOptions, BOpt.ConcatenationOptions)
    rank = len(c.outs[0].shape)
    axis = int(o.Axis())
    if not -rank <= axis < rank:
        raise c.err(f"axis {axis} out of range for rank {rank}")
    # Normalised so that later stages never see a negative axis.
    return {"axis": axis % rank, "act": c.act(o)}


def _parse_padv2(c: _OpCtx) -> dict[str, Any]:
    """PADV2 is read as PAD when its pad value is the one PAD implies (0.0, or the zero point)."""
    value = c.ins[2] if len(c.ins) > 2 else None
    if value is None:
        return {}
    if value.data is None or value.data.size != 1:
        raise c.err("only a constant scalar pad value is supported")
    out_q = c.outs[0].quant
    implied = out_q.zero_point[0] if (out_q is not None and c.outs[0].dtype == "int8") else 0
    if value.data.reshape(-1)[0] != implied:
        raise UnsupportedOpError("PADV2", c.idx, where=str(c.reader.path),
                                 hint=f"only a pad value of {implied} (what PAD uses) is supported")
    return {}


def _no_attrs(c: _OpCtx) -> dict[str, Any]:
    return {}


def _parse_prelu(c: _OpCtx) -> dict[str, Any]:
    x, alpha = c.ins[0], c.ins[1]
    # The output has the input's shape (LiteRT checks it); alpha must broadcast into it without
    # touching the batch axis, or the result would depend on the batch the executor runs.
    a_shape = list(alpha.shape)
    if len(a_shape) > len(x.shape) or (len(a_shape) == len(x.shape) and a_shape and a_shape[0] != 1):
        raise c.err(f"alpha shape {a_shape} does not broadcast over input {x.shape} without the batch axis")
    for da, dx in zip(reversed(a_shape), reversed(x.shape)):
        if da not in (1, dx):
            raise c.err(f"alpha shape {a_shape} does not broadcast to input shape {x.shape}")
    if list(c.outs[0].shape) != list(x.shape):
        raise c.err(f"output shape {c.outs[0].shape} differs from input shape {x.shape}")
    return {}


def _parse_strided_slice(c: _OpCtx) -> dict[str, Any]:
    """Resolved per axis with TFLite's strided_slice_logic (StartForAxis / StopForAxis) against the
    model's static input shape, so the executor and later stages see plain (start, stop, step)."""
    o = c.options(tflite.StridedSliceOptions, BOpt.StridedSliceOptions, required=False)
    masks = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0}
    offset = False
    if o is not None:
        masks = {"begin_mask": int(o.BeginMask()), "end_mask": int(o.EndMask()),
                 "ellipsis_mask": int(o.EllipsisMask()), "new_axis_mask": int(o.NewAxisMask()),
                 "shrink_axis_mask": int(o.ShrinkAxisMask())}
        offset = bool(o.Offset())
    if masks["ellipsis_mask"] or masks["new_axis_mask"]:
        raise UnsupportedOpError("STRIDED_SLICE", c.idx, where=str(c.reader.path),
                                 hint="ellipsis_mask and new_axis_mask are not supported")
    shape = list(c.ins[0].shape)
    vecs = []
    for what, t in zip(("begin", "end", "strides"), c.ins[1:4]):
        if t is None or t.data is None:
            raise c.err(f"{what} must be a constant")
        v = [int(a) for a in np.asarray(t.data).reshape(-1)]
        if len(v) != len(shape):
            raise c.err(f"{what} has {len(v)} entries for an input of rank {len(shape)}")
        vecs.append(v)
    begin, end, strides = vecs
    if any(s == 0 for s in strides):
        raise c.err("a stride is 0")
    starts, stops = [], []
    for ax, dim in enumerate(shape):
        st = strides[ax]
        start = begin[ax]
        if masks["begin_mask"] >> ax & 1:
            start = -(1 << 31) if st > 0 else (1 << 31) - 1
        if start < 0:
            start += dim
        start = min(max(start, 0), dim) if st > 0 else min(max(start, -1), dim - 1)
        if masks["shrink_axis_mask"] >> ax & 1:
            stop = start + 1
        else:
            stop = end[ax] + (start if offset else 0)
            if masks["end_mask"] >> ax & 1:
                stop = (1 << 31) - 1 if st > 0 else -(1 << 31)
            if stop < 0:
                stop += dim
            stop = min(max(stop, 0), dim) if st > 0 else min(max(stop, -1), dim - 1)
        starts.append(start)
        stops.append(stop)
    if shape and ((starts[0], stops[0], strides[0]) != (0, shape[0], 1) or masks["shrink_axis_mask"] & 1):
        raise c.err("slicing the batch axis is not supported")
    return {"starts": starts, "stops": stops, "strides": strides, **masks, "offset": offset}


def _parse_resize(opts_cls: type, opt_type: int) -> Callable[[_OpCtx], dict[str, Any]]:
    """RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR: a rank-4 NHWC input, a constant int32 size [2] (new height,
    width) that must agree with the output's static shape; align_corners and half_pixel_centers (not both, as
    LiteRT's Prepare checks)."""
    def parse(c: _OpCtx) -> dict[str, Any]:
        o = c.options(opts_cls, opt_type, required=False)
        align = bool(o.AlignCorners()) if o is not None else False
        half = bool(o.HalfPixelCenters()) if o is not None else False
        x, size, y = c.ins[0], c.ins[1], c.outs[0]
        c.rank("input", x, 4)
        c.rank("output", y, 4)
        if size.data is None:
            raise c.err("the size operand must be a constant")
        hw = [int(v) for v in np.asarray(size.data).reshape(-1)]
        if size.dtype != "int32" or len(hw) != 2:
            raise c.err(f"the size operand must be int32 [2], got {size.dtype} {size.shape}")
        if min(hw) < 1:
            raise c.err(f"output size {hw} must be positive")
        if [y.shape[0], hw[0], hw[1], y.shape[3]] != [x.shape[0], y.shape[1], y.shape[2], x.shape[3]]:
            raise c.err(f"output shape {y.shape} does not match input {x.shape} resized to {hw}")
        if align and half:
            raise c.err("align_corners and half_pixel_centers are both set")
        return {"align_corners": align, "half_pixel_centers": half}
    return parse


def _parse_transpose_conv(c: _OpCtx) -> dict[str, Any]:
    """TRANSPOSE_CONV: inputs (output_shape, weights [O,KH,KW,I], input, bias?) in the file. The output shape
    operand must be a constant equal to the output tensor's static shape (LiteRT resizes the output from it; a
    computed one would make the shape dynamic). The fused activation is the newer schema's field (0 = none in
    older files). Dilation is always 1 (TFLite has none for this op)."""
    o = c.options(tflite.TransposeConvOptions, BOpt.TransposeConvOptions)
    os_t, w, x = c.ins[0], c.ins[1], c.ins[2]
    b = c.ins[3] if len(c.ins) > 3 else None
    for what, t, rank in (("input", x, 4), ("output", c.outs[0], 4), ("filter", w, 4), ("bias", b, 1)):
        c.rank(what, t, rank)
    if os_t is None or os_t.data is None:
        raise c.err("the output_shape operand must be a constant (dynamic output shapes are not supported)")
    want = [int(v) for v in np.asarray(os_t.data).reshape(-1)]
    y_shape = [int(d) for d in c.outs[0].shape]
    if want != y_shape:
        raise c.err(f"output_shape operand {want} differs from the output tensor's shape {y_shape}")
    if w.shape[3] != x.shape[3]:
        raise c.err(f"filter depth {w.shape[3]} differs from the input depth {x.shape[3]}")
    if w.shape[0] != y_shape[3]:
        raise c.err(f"filter has {w.shape[0]} output channels, the output {y_shape[3]}")
    if b is not None and b.shape[0] != w.shape[0]:
        raise c.err(f"bias has {b.shape[0]} entries for {w.shape[0]} output channels")
    attrs = c.positive(stride_h=o.StrideH(), stride_w=o.StrideW())
    attrs.update(padding=c.padding(o), act=c.act(o))
    return attrs


# MediaPipe's custom op "Convolution2DTransposeBias" (mediapipe/util/tflite/operations/transpose_conv_bias.cc):
# a float TRANSPOSE_CONV with a bias and no output_shape operand. Its custom_options are not a flexbuffer but the
# raw bytes of TFLite's C struct TfLiteTransposeConvParams (builtin_op_data.h), which the kernel reads from
# node->custom_initial_data: int32 little-endian padding (TfLitePadding: 0 unknown, 1 same, 2 valid),
# stride_width, stride_height (12 bytes; fields newer TFLite versions append, such as the fused activation, are
# neither written by MediaPipe's converter nor read by its kernel). The output size is the kernel's Prepare:
# out = stride * (in - 1) + k - pad, pad = max(0, k - (in - 1) % stride - 1) for SAME and 0 for VALID, the
# output's top/left padding pad // 2 - the same geometry as TRANSPOSE_CONV given that output size.
MP_TRANSPOSE_CONV_BIAS = MEDIAPIPE_TRANSPOSE_CONV_BIAS  # the custom code (the registry's conv.py declares it)
_MP_PADDINGS = {1: "same", 2: "valid"}


def mp_transpose_conv_out_size(padding: str, in_size: int, k: int, stride: int) -> int:
    """Output height or width of Convolution2DTransposeBias (its Prepare)."""
    pad = max(0, k - (in_size - 1) % stride - 1) if padding == "same" else 0
    return stride * (in_size - 1) + k - pad


def _parse_mp_transpose_conv_bias(c: _OpCtx) -> dict[str, Any]:
    """Convolution2DTransposeBias: inputs (input, weights [O,KH,KW,I], bias), float only; read as transpose_conv."""
    raw = c.op.CustomOptionsAsNumpy()
    raw = b"" if isinstance(raw, int) else raw.tobytes()
    if len(raw) < 12 or len(raw) % 4:
        raise c.err(f"custom_options hold {len(raw)} bytes, expected the 12 of TfLiteTransposeConvParams "
                    "(int32 padding, stride_width, stride_height)")
    pad_code, stride_w, stride_h = struct.unpack_from("<3i", raw, 0)
    if pad_code not in _MP_PADDINGS:
        raise c.err(f"custom_options padding code {pad_code} is not SAME (1) or VALID (2)")
    x, w, b, y = c.ins[0], c.ins[1], c.ins[2], c.outs[0]
    if any(t is None for t in (x, w, b)):
        raise c.err("input, weights and bias must all be present")
    for what, t, rank in (("input", x, 4), ("output", y, 4), ("filter", w, 4), ("bias", b, 1)):
        c.rank(what, t, rank)
    for what, t in (("input", x), ("filter", w), ("bias", b), ("output", y)):
        if t.dtype != "float32":
            raise c.err(f"{what} {t.name!r} is {t.dtype}; this custom op is float32 only")
    attrs = c.positive(stride_h=stride_h, stride_w=stride_w)
    attrs.update(padding=_MP_PADDINGS[pad_code], act="none")
    if w.shape[3] != x.shape[3]:
        raise c.err(f"filter depth {w.shape[3]} differs from the input depth {x.shape[3]}")
    if b.shape[0] != w.shape[0]:
        raise c.err(f"bias has {b.shape[0]} entries for {w.shape[0]} output channels")
    want = [x.shape[0], mp_transpose_conv_out_size(attrs["padding"], x.shape[1], w.shape[1], stride_h),
            mp_transpose_conv_out_size(attrs["padding"], x.shape[2], w.shape[2], stride_w), w.shape[0]]
    if [int(d) for d in y.shape] != want:
        raise c.err(f"output shape {list(y.shape)} differs from {want}, what input {list(x.shape)}, filter "
                    f"{list(w.shape)}, strides ({stride_h}, {stride_w}) and {attrs['padding'].upper()} padding give")
    return attrs


def _add_output_shape_constant(tensors: dict[str, Tensor], y_name: str) -> str:
    """An int32[4] constant holding y's shape (the IR's output_shape operand of transpose_conv), under a fresh name."""
    name = f"{y_name}/output_shape"
    while name in tensors:
        name += "_"
    shape = [int(d) for d in tensors[y_name].shape]
    tensors[name] = Tensor(name=name, shape=[4], dtype="int32", data=np.asarray(shape, dtype=np.int32))
    return name


# Option parsers by TFLite code (builtin or custom); a code without one has no attrs. Which IR op a code becomes,
# and its operand counts, is the op registry's (stages/ops/).
_PARSERS: dict[int | str, Callable[[_OpCtx], dict[str, Any]]] = {
    BO.CONV_2D: _parse_conv,
    BO.DEPTHWISE_CONV_2D: _parse_dwconv,
    BO.FULLY_CONNECTED: _parse_fc,
    BO.ADD: _parse_add,
    BO.MUL: _parse_mul,
    BO.SUB: _parse_sub,
    BO.LEAKY_RELU: _parse_leaky_relu,
    BO.AVERAGE_POOL_2D: _parse_pool,
    BO.MAX_POOL_2D: _parse_pool,
    BO.MEAN: _parse_mean,
    BO.RESHAPE: _parse_reshape,
    BO.SOFTMAX: _parse_softmax,
    BO.PADV2: _parse_padv2,
    BO.CONCATENATION: _parse_concat,
    BO.PRELU: _parse_prelu,
    BO.STRIDED_SLICE: _parse_strided_slice,
    BO.TRANSPOSE_CONV: _parse_transpose_conv,
    BO.RESIZE_BILINEAR: _parse_resize(tflite.ResizeBilinearOptions, BOpt.ResizeBilinearOptions),
    BO.RESIZE_NEAREST_NEIGHBOR: _parse_resize(tflite.ResizeNearestNeighborOptions, BOpt.ResizeNearestNeighborOptions),
    MP_TRANSPOSE_CONV_BIAS: _parse_mp_transpose_conv_bias,
}
_Handler = tuple[str, tuple[int, int, int], Callable[[_OpCtx], dict[str, Any]]]


def _handler(op_type: str, b: Builtin, key: int | str) -> _Handler:
    parse = ops.REGISTRY[op_type].read_options or _PARSERS.get(key, _no_attrs)
    return op_type, (b.min_inputs, b.max_inputs, b.outputs), parse


# builtin code -> (IR op type, (min inputs, max inputs, outputs), option parser), from the op registry
_HANDLERS: dict[int, _Handler] = {getattr(BO, code): _handler(op_type, b, getattr(BO, code))
                                  for code, (op_type, b) in ops.TFLITE_BUILTINS.items()}
# custom code -> as _HANDLERS. Any other custom op is refused with its name and operator index.
_CUSTOM_HANDLERS: dict[str, _Handler] = {code: _handler(op_type, b, code)
                                         for code, (op_type, b) in ops.TFLITE_CUSTOM.items()}


def _int_list(arr: Any) -> list[int]:
    return [] if isinstance(arr, int) else [int(x) for x in arr]


def _float_list(arr: Any) -> list[float]:
    return [] if isinstance(arr, int) else [float(x) for x in arr]
