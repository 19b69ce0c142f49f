"""Serialise an IR Graph to a `.tflite` flatbuffer (identifier TFL3, schema version 3) or `.circle` (CIR0).

This is the inverse of `tflite_reader.read_model`: quantize exports `model_int8.tflite` with it and
emulate-run will export trained weights with it, so it writes ANY graph in the ir.py op vocabulary,
not only graphs that came from a file.

Layout choices (all deterministic: the same graph always gives the same bytes):
- Tensors are written in `source_index` order when the graph came from a file (so tensor indices in
  the written file match the original, which the weights-only export relies on), then synthesised
  tensors in the graph's own order.
- Buffer 0 is the empty sentinel TFLite requires; every non-constant tensor points at it; each
  constant gets its own buffer, its data 16-byte aligned (TFLM and mmap users read it in place).
- Operator codes are listed in order of first use; each gets the op version the TFLite converter
  would give it for those tensor types (`_op_version`), since runtimes refuse versions they lack.
- `min_runtime_version` metadata is not written (it is optional and only informative).

`.circle` shares the TFLite schema for every field we write (the circle-only fields all sit after
them and default to TFLite's behaviour), so the same bytes with identifier CIR0 are a valid circle
model; the circle schema numbers its versions from 0, so that is the version written there.
"""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np
import tflite as fb
from tflite.BuiltinOperator import BuiltinOperator as BO

from tinytrain.cache.fs_ops import atomic_write_bytes
from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages import ops
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor

TFLITE_SCHEMA_VERSION = 3
CIRCLE_SCHEMA_VERSION = 0
DATA_ALIGNMENT = 16

_TENSOR_TYPE = {
    "float32": fb.TensorType.FLOAT32, "float16": fb.TensorType.FLOAT16, "int32": fb.TensorType.INT32,
    "uint8": fb.TensorType.UINT8, "int64": fb.TensorType.INT64, "bool": fb.TensorType.BOOL,
    "int16": fb.TensorType.INT16, "int8": fb.TensorType.INT8,
}
_ACT = {
    "none": fb.ActivationFunctionType.NONE, "relu": fb.ActivationFunctionType.RELU,
    "relu_n1_to_1": fb.ActivationFunctionType.RELU_N1_TO_1, "relu6": fb.ActivationFunctionType.RELU6,
    "tanh": fb.ActivationFunctionType.TANH,
}
_PADDING = {"same": fb.Padding.SAME, "valid": fb.Padding.VALID}
# IR op -> the BuiltinOperator it is written as (the op registry's first builtin spelling of it)
_BUILTIN = {name: getattr(fb.BuiltinOperator, d.builtin.code) for name, d in ops.REGISTRY.items()
            if d.builtin is not None}
SUPPORTED_OPS = tuple(_BUILTIN)


class TfliteWriteError(ModelError):
    """The graph cannot be expressed as a .tflite file (bad attr, dtype, or inconsistent data)."""


# ---- public API ---------------------------------------------------------------------------------

def model_bytes(graph: Graph, *, description: str = "tinytrain", circle: bool = False,
                metadata: dict[str, bytes] | None = None) -> bytes:
    """The flatbuffer of `graph` (TFL3, or CIR0 when `circle`); `metadata`: name -> bytes, each in a buffer of its
    own (e.g. circle's CIRCLE_TRAINING, stages/model/circle_training.py)."""
    _check_graph(graph)
    return _ModelBuilder(_with_conv_biases(graph), description, circle, metadata or {}).build()


def write_model(graph: Graph, path: Path, *, description: str = "tinytrain") -> None:
    """Write `graph` to `path`; a `.circle` suffix writes the circle flavour. Atomic (temp + rename)
    so that a killed build never leaves a half-written model behind."""
    write_model_bytes(graph, path, description=description)


def write_model_bytes(graph: Graph, path: Path, *, description: str = "tinytrain",
                      metadata: dict[str, bytes] | None = None) -> None:
    """write_model with metadata entries (model_bytes)."""
    path = Path(path)
    data = model_bytes(graph, description=description, circle=path.suffix.lower() == ".circle", metadata=metadata)
    atomic_write_bytes(path, data)


# ---- checks ---------------------------------------------------------------------------------------

def _check_graph(graph: Graph) -> None:
    try:
        graph.validate()
    except ValueError as e:
        raise TfliteWriteError(f"cannot write an inconsistent graph: {e}") from None
    for name in graph.inputs:
        if name not in graph.tensors:
            raise TfliteWriteError(f"graph input {name!r} is not a tensor of the graph")
    for i, op in enumerate(graph.ops):
        if op.type not in _BUILTIN:
            raise UnsupportedOpError(op.type, i, where="the .tflite writer",
                                     hint=f"ops a .tflite file can hold: {', '.join(SUPPORTED_OPS)}")
    for t in graph.tensors.values():
        _check_tensor(t)


def _check_tensor(t: Tensor) -> None:
    if t.dtype not in _TENSOR_TYPE:
        raise TfliteWriteError(f"tensor {t.name!r}: dtype {t.dtype} has no .tflite type")
    if t.data is not None and int(np.prod(t.shape, dtype=np.int64)) != t.data.size:
        raise TfliteWriteError(f"tensor {t.name!r}: data has {t.data.size} elements, shape "
                               f"{list(t.shape)} needs {int(np.prod(t.shape, dtype=np.int64))}")
    q = t.quant
    if q is None:
        return
    if len(q.scale) != len(q.zero_point):
        raise TfliteWriteError(f"tensor {t.name!r}: {len(q.scale)} scales but {len(q.zero_point)} zero points")
    if q.per_channel and not (0 <= q.axis < len(t.shape) and t.shape[q.axis] == len(q.scale)):
        raise TfliteWriteError(f"tensor {t.name!r}: {len(q.scale)} per-channel scales do not match "
                               f"dimension {q.axis} of shape {list(t.shape)}")


# ---- completion ------------------------------------------------------------------------------------

def _with_conv_biases(graph: Graph) -> Graph:
    """The IR allows a conv/depthwise conv without bias, TFLite does not (LiteRT's CONV_2D ensures
    `has_bias`; OpDef.bias_required), so a zero bias is added, as the converter does; FULLY_CONNECTED takes -1 as
    is. The caller's graph is left untouched."""
    missing = [i for i, op in enumerate(graph.ops)
               if ops.REGISTRY[op.type].bias_required and (len(op.inputs) < 3 or op.inputs[2] is None)]
    if not missing:
        return graph
    tensors, new_ops = dict(graph.tensors), list(graph.ops)
    for i in missing:
        op = new_ops[i]
        bias = _zero_bias(graph, op, _fresh_name(tensors, f"{op.outputs[0]}/zero_bias"))
        tensors[bias.name] = bias
        new_ops[i] = Op(op.type, [op.inputs[0], op.inputs[1], bias.name], list(op.outputs), dict(op.attrs),
                        op.source_index)
    return Graph(tensors, new_ops, list(graph.inputs), list(graph.outputs), dict(graph.meta))


def _zero_bias(graph: Graph, op: Op, name: str) -> Tensor:
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    channels = w.shape[ops.REGISTRY[op.type].out_channel_axis]
    dtype = {"int8": "int32", "int16": "int64"}.get(x.dtype, "float32")
    quant = None
    if dtype != "float32":
        if x.quant is None or w.quant is None:
            raise TfliteWriteError(f"{op.type} op writing {op.outputs}: quantized input without quantization parameters")
        w_scales = w.quant.scale if w.quant.per_channel else w.quant.scale * channels
        quant = QuantParams([x.quant.scale[0] * s for s in w_scales], [0] * channels, 0)
    return Tensor(name, [channels], dtype, role="bias", quant=quant, data=np.zeros(channels, dtype))


def _fresh_name(tensors: dict[str, Tensor], base: str) -> str:
    name, k = base, 1
    while name in tensors:
        name, k = f"{base}_{k}", k + 1
    return name


# ---- builder --------------------------------------------------------------------------------------

class _ModelBuilder:
    """One use: collects indices, then emits the flatbuffer bottom-up (children before parents,
    as flatbuffers requires)."""

    def __init__(self, graph: Graph, description: str, circle: bool, metadata: dict[str, bytes] | None = None):
        self.metadata = dict(metadata or {})
        self.g = graph
        self.description = description
        self.circle = circle
        self.order = _tensor_order(graph)
        self.index = {name: i for i, name in enumerate(self.order)}
        self.codes: list[tuple[int, int]] = []          # (builtin code, version), first-use order
        self.b = flatbuffers.Builder(1024 + sum(t.nbytes for t in graph.constants()) * 2)

    def build(self) -> bytes:
        b = self.b
        op_code_idx = [self._code_index(op) for op in self.g.ops]
        buffers = self._buffers()                       # data first: the largest, aligned part
        tensors = [self._tensor(name, buffers[1]) for name in self.order]
        operators = [self._operator(op, idx) for op, idx in zip(self.g.ops, op_code_idx)]
        subgraph = self._subgraph(tensors, operators)
        codes = [self._operator_code(code, ver) for code, ver in self.codes]
        desc = b.CreateString(self.description)
        metas = []
        for name, blob in self.metadata.items():
            data = _aligned_bytes(b, bytes(blob))
            fb.BufferStart(b)
            fb.BufferAddData(b, data)
            buffers[0].append(fb.BufferEnd(b))
            md_name = b.CreateString(name)
            fb.MetadataStart(b)
            fb.MetadataAddName(b, md_name)
            fb.MetadataAddBuffer(b, len(buffers[0]) - 1)
            metas.append(fb.MetadataEnd(b))

        codes_vec = _offset_vector(b, fb.ModelStartOperatorCodesVector, codes)
        subgraphs_vec = _offset_vector(b, fb.ModelStartSubgraphsVector, [subgraph])
        buffers_vec = _offset_vector(b, fb.ModelStartBuffersVector, buffers[0])
        metadata_vec = _offset_vector(b, fb.ModelStartMetadataVector, metas) if metas else 0
        fb.ModelStart(b)
        fb.ModelAddVersion(b, CIRCLE_SCHEMA_VERSION if self.circle else TFLITE_SCHEMA_VERSION)
        fb.ModelAddOperatorCodes(b, codes_vec)
        fb.ModelAddSubgraphs(b, subgraphs_vec)
        fb.ModelAddDescription(b, desc)
        fb.ModelAddBuffers(b, buffers_vec)
        if metas:
            fb.ModelAddMetadata(b, metadata_vec)
        b.Finish(fb.ModelEnd(b), file_identifier=b"CIR0" if self.circle else b"TFL3")
        return bytes(b.Output())

    # -- operator codes
    def _code_index(self, op: Op) -> int:
        key = (int(_BUILTIN[op.type]), _op_version(self.g, op))
        if key not in self.codes:
            self.codes.append(key)
        return self.codes.index(key)

    def _operator_code(self, code: int, version: int) -> int:
        b = self.b
        fb.OperatorCodeStart(b)
        # Readers before schema 2.3 only look at the byte field; 127 there means "see builtin_code".
        fb.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        fb.OperatorCodeAddVersion(b, version)
        fb.OperatorCodeAddBuiltinCode(b, code)
        return fb.OperatorCodeEnd(b)

    # -- buffers
    def _buffers(self) -> tuple[list[int], dict[str, int]]:
        """Buffer tables and tensor name -> buffer index (constants only)."""
        b = self.b
        fb.BufferStart(b)
        tables = [fb.BufferEnd(b)]
        buffer_of: dict[str, int] = {}
        for name in self.order:
            t = self.g.tensors[name]
            if t.data is None:
                continue
            data = _aligned_bytes(b, _tensor_bytes(t))
            fb.BufferStart(b)
            fb.BufferAddData(b, data)
            buffer_of[name] = len(tables)
            tables.append(fb.BufferEnd(b))
        return tables, buffer_of

    # -- tensors
    def _tensor(self, name: str, buffer_of: dict[str, int]) -> int:
        b, t = self.b, self.g.tensors[name]
        quant = self._quant(t) if t.quant is not None else None
        tname = b.CreateString(t.name)
        shape = _int32_vector(b, fb.TensorStartShapeVector, t.shape)
        signature = _int32_vector(b, fb.TensorStartShapeSignatureVector, t.shape)
        fb.TensorStart(b)
        fb.TensorAddShape(b, shape)
        fb.TensorAddType(b, _TENSOR_TYPE[t.dtype])
        fb.TensorAddBuffer(b, buffer_of.get(name, 0))
        fb.TensorAddName(b, tname)
        if quant is not None:
            fb.TensorAddQuantization(b, quant)
        fb.TensorAddShapeSignature(b, signature)
        return fb.TensorEnd(b)

    def _quant(self, t: Tensor) -> int:
        b, q = self.b, t.quant
        scale = b.CreateNumpyVector(np.asarray(q.scale, dtype="<f4"))
        zp = b.CreateNumpyVector(np.asarray(q.zero_point, dtype="<i8"))
        fb.QuantizationParametersStart(b)
        fb.QuantizationParametersAddScale(b, scale)
        fb.QuantizationParametersAddZeroPoint(b, zp)
        fb.QuantizationParametersAddQuantizedDimension(b, int(q.axis))
        return fb.QuantizationParametersEnd(b)

    # -- operators
    def _operator(self, op: Op, code_index: int) -> int:
        b = self.b
        opt_type, opt = _options(b, op)
        names = list(op.inputs)
        order = ops.REGISTRY[op.type].file_operands
        if order is not None:
            # the IR's layer order -> the file's (OpDef.file_operands); an absent trailing operand is left out
            names = [names[j] if j < len(names) else None for j in sorted(range(len(order)), key=order.__getitem__)]
            while names and names[-1] is None:
                names.pop()
        ins = _int32_vector(b, fb.OperatorStartInputsVector,
                            [-1 if t is None else self.index[t] for t in names])
        outs = _int32_vector(b, fb.OperatorStartOutputsVector, [self.index[t] for t in op.outputs])
        fb.OperatorStart(b)
        fb.OperatorAddOpcodeIndex(b, code_index)
        fb.OperatorAddInputs(b, ins)
        fb.OperatorAddOutputs(b, outs)
        if opt is not None:
            fb.OperatorAddBuiltinOptionsType(b, opt_type)
            fb.OperatorAddBuiltinOptions(b, opt)
        return fb.OperatorEnd(b)

    def _subgraph(self, tensors: list[int], operators: list[int]) -> int:
        b = self.b
        tensors_vec = _offset_vector(b, fb.SubGraphStartTensorsVector, tensors)
        ins = _int32_vector(b, fb.SubGraphStartInputsVector, [self.index[t] for t in self.g.inputs])
        outs = _int32_vector(b, fb.SubGraphStartOutputsVector, [self.index[t] for t in self.g.outputs])
        ops_vec = _offset_vector(b, fb.SubGraphStartOperatorsVector, operators)
        name = b.CreateString(str(self.g.meta.get("subgraph_name", "main")))
        fb.SubGraphStart(b)
        fb.SubGraphAddTensors(b, tensors_vec)
        fb.SubGraphAddInputs(b, ins)
        fb.SubGraphAddOutputs(b, outs)
        fb.SubGraphAddOperators(b, ops_vec)
        fb.SubGraphAddName(b, name)
        return fb.SubGraphEnd(b)


def _tensor_order(graph: Graph) -> list[str]:
    from_file = sorted((t.source_index, name) for name, t in graph.tensors.items() if t.source_index is not None)
    synthesised = [name for name, t in graph.tensors.items() if t.source_index is None]
    return [name for _, name in from_file] + synthesised


def _tensor_bytes(t: Tensor) -> bytes:
    return np.ascontiguousarray(t.data, dtype=np.dtype(t.dtype).newbyteorder("<")).tobytes()


# ---- flatbuffer helpers ---------------------------------------------------------------------------

def _aligned_bytes(b: flatbuffers.Builder, data: bytes) -> int:
    b.StartVector(1, len(data), DATA_ALIGNMENT)
    b.head -= len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def _int32_vector(b: flatbuffers.Builder, start, values) -> int:
    values = [int(v) for v in values]
    start(b, len(values))
    for v in reversed(values):
        b.PrependInt32(v)
    return b.EndVector()


def _offset_vector(b: flatbuffers.Builder, start, offsets: list[int]) -> int:
    start(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


# ---- builtin options ------------------------------------------------------------------------------

def _attr(op: Op, key: str, default=None):
    if key in op.attrs:
        return op.attrs[key]
    if default is None:
        raise TfliteWriteError(f"{op.type} op writing {op.outputs}: attribute {key!r} is missing")
    return default


def _act(op: Op) -> int:
    act = _attr(op, "act", "none")
    if act not in _ACT:
        raise TfliteWriteError(f"{op.type} op writing {op.outputs}: activation {act!r} is not one of {list(_ACT)}")
    return _ACT[act]


def _padding(op: Op) -> int:
    pad = _attr(op, "padding")
    if pad not in _PADDING:
        raise TfliteWriteError(f"{op.type} op writing {op.outputs}: padding {pad!r} is not 'same' or 'valid'")
    return _PADDING[pad]


def _options(b: flatbuffers.Builder, op: Op) -> tuple[int, int | None]:
    """(BuiltinOptions union type, table offset); (0, None) for ops without options."""
    writer = ops.REGISTRY[op.type].write_options or _OPTION_WRITERS.get(_BUILTIN[op.type])
    return (0, None) if writer is None else writer(b, op)


def _int(key: str, default=None):
    return lambda op: int(_attr(op, key, default))


def _bool(key: str):
    return lambda op: bool(_attr(op, key, False))


def _float(key: str, default=None):
    return lambda op: float(_attr(op, key, default))


def _table(table: str, *fields):
    """The writer of options table `table` (flatbuffers' <table>Start, <table>Add<field>, <table>End): each
    (field, value(op)) in the order given."""
    start, end = getattr(fb, f"{table}Start"), getattr(fb, f"{table}End")
    adds = [(getattr(fb, f"{table}Add{field}"), value) for field, value in fields]
    kind = getattr(fb.BuiltinOptions, table)

    def write(b, op):
        start(b)
        for add, value in adds:
            add(b, value(op))
        return kind, end(b)
    return write


def _reshape_options(b, op):
    new_shape = _int32_vector(b, fb.ReshapeOptionsStartNewShapeVector, _attr(op, "new_shape"))
    fb.ReshapeOptionsStart(b)
    fb.ReshapeOptionsAddNewShape(b, new_shape)
    return fb.BuiltinOptions.ReshapeOptions, fb.ReshapeOptionsEnd(b)


_STRIDES = (("Padding", _padding), ("StrideW", _int("stride_w")), ("StrideH", _int("stride_h")))
_DILATION = (("DilationWFactor", _int("dilation_w", 1)), ("DilationHFactor", _int("dilation_h", 1)))
_FUSED = ("FusedActivationFunction", _act)
_RESIZE = (("AlignCorners", _bool("align_corners")), ("HalfPixelCenters", _bool("half_pixel_centers")))
_POOL = _table("Pool2DOptions", *_STRIDES, ("FilterWidth", _int("filter_w")), ("FilterHeight", _int("filter_h")),
               _FUSED)

# BuiltinOperator -> its options writer (a code without one writes no options). The strided slice's
# begin/end/strides and a resize's size operand stay in the graph as constants.
_OPTION_WRITERS = {
    BO.CONV_2D: _table("Conv2DOptions", *_STRIDES, _FUSED, *_DILATION),
    BO.DEPTHWISE_CONV_2D: _table("DepthwiseConv2DOptions", *_STRIDES,
                                 ("DepthMultiplier", _int("depth_multiplier", 1)), _FUSED, *_DILATION),
    BO.FULLY_CONNECTED: _table("FullyConnectedOptions", _FUSED, ("KeepNumDims", _bool("keep_num_dims"))),
    BO.AVERAGE_POOL_2D: _POOL, BO.MAX_POOL_2D: _POOL,
    BO.ADD: _table("AddOptions", _FUSED), BO.MUL: _table("MulOptions", _FUSED), BO.SUB: _table("SubOptions", _FUSED),
    BO.MEAN: _table("ReducerOptions", ("KeepDims", _bool("keep_dims"))),
    BO.RESHAPE: _reshape_options,
    BO.SOFTMAX: _table("SoftmaxOptions", ("Beta", _float("beta", 1.0))),
    BO.CONCATENATION: _table("ConcatenationOptions", ("Axis", _int("axis")), _FUSED),
    BO.STRIDED_SLICE: _table("StridedSliceOptions", *((f"{m}Mask", _int(f"{attr}_mask", 0)) for m, attr in
                                                      (("Begin", "begin"), ("End", "end"), ("Ellipsis", "ellipsis"),
                                                       ("NewAxis", "new_axis"), ("ShrinkAxis", "shrink_axis"))),
                             ("Offset", _bool("offset"))),
    BO.LEAKY_RELU: _table("LeakyReluOptions", ("Alpha", _float("alpha"))),
    BO.TRANSPOSE_CONV: _table("TransposeConvOptions", *_STRIDES, _FUSED),
    BO.RESIZE_BILINEAR: _table("ResizeBilinearOptions", *_RESIZE),
    BO.RESIZE_NEAREST_NEIGHBOR: _table("ResizeNearestNeighborOptions", *_RESIZE),
    BO.PAD: _table("PadOptions"), BO.QUANTIZE: _table("QuantizeOptions"), BO.DEQUANTIZE: _table("DequantizeOptions"),
}


# ---- op versions ----------------------------------------------------------------------------------

def _op_version(graph: Graph, op: Op) -> int:
    """The version TFLite's converter assigns (the op registry's rule, stages/ops/). Kernels dispatch on tensor
    types, not on the version, but a runtime refuses a version it does not register, so too high is as bad as too
    low."""
    rule = ops.REGISTRY[op.type].version
    return 1 if rule is None else int(rule(graph, op))
