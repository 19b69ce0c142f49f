"""The float graph an int8 graph stands for: what fp32 / fp16-mixed training trains when the model file is int8
(the quantize stage, quantize.enabled: false), and what the contribution analysis fine-tunes.

Every constant with quantization parameters becomes its real value, (q - zero_point) x scale per channel, as a
float32 constant; float16 constants become float32; activations become float32 and the activations' QUANTIZE /
DEQUANTIZE ops disappear (their output is their input: in float they are the identity up to int8 rounding), and
a DEQUANTIZE that unpacks a constant (float16 or weight-only int8 weights) is folded into the float32 constant.
Tensor names, roles and source indices are kept; int32 / int64 tensors that are not quantized values (shapes,
indices) stay as they are.
"""

from __future__ import annotations

import copy

import numpy as np

from tinytrain.stages.model.ir import Graph
from tinytrain.stages.ops import CONVERSION_OPS  # the registry's float <-> int8 conversions
from tinytrain.stages.quant import ptq

QUANTIZED_DTYPES = ("int8", "int16", "int32", "uint8")


def dequantize_graph(graph: Graph) -> Graph:
    """The float copy of `graph` (see the module). A float graph comes back unchanged (a copy)."""
    g = copy.deepcopy(graph)
    # Constants a file stores compressed behind an unpacking DEQUANTIZE (float16 / weight-only int8) first become
    # the float32 constants the op makes: a DEQUANTIZE of a float32 constant would be no graph at all.
    ptq.dequantize_constants(g)
    alias: dict[str, str] = {}
    keep = []
    for op in g.ops:
        if op.type in CONVERSION_OPS and g.tensors[op.inputs[0]].data is None:
            src = op.inputs[0]
            alias[op.outputs[0]] = alias.get(src, src)
            continue
        op.inputs = [alias.get(t, t) if t else t for t in op.inputs]
        keep.append(op)
    g.ops = keep
    g.outputs = [alias.get(t, t) for t in g.outputs]
    for name in alias:
        g.tensors.pop(name, None)
    in_file: dict[str, str] = {}   # constants whose dtype in the model file is no longer theirs
    for t in g.tensors.values():
        if t.data is not None:
            if t.quant is not None and t.dtype in QUANTIZED_DTYPES:
                in_file[t.name] = t.dtype
                q = t.quant
                scale = np.asarray(q.scale, np.float64)
                zp = np.asarray(q.zero_point, np.float64)
                if len(q.scale) > 1:
                    shape = [1] * t.data.ndim
                    shape[q.axis] = -1
                    scale, zp = scale.reshape(shape), zp.reshape(shape)
                t.data = ((np.asarray(t.data, np.float64) - zp) * scale).astype(np.float32)
                t.dtype, t.quant = "float32", None
            elif t.dtype == "float16":
                in_file[t.name] = t.dtype
                t.data, t.dtype = t.data.astype(np.float32), "float32"
        elif t.dtype in ("int8", "int16", "uint8", "float16"):
            t.dtype, t.quant = "float32", None
    for name in g.outputs:
        g.tensors[name].role = "output"
    # A uint8 output load read as its int8 source (stages/model/uint8_output.py) is a float output now.
    g.meta.pop("output_uint8", None)
    # A .wof holds a tensor in the model file's own dtype (stages/model/wof.py): trained float32 values of a tensor the
    # file stores as int8 have no place there (export.wof_data lists them as not in the .wof).
    if in_file:
        g.meta["dtype_in_file"] = {**g.meta.get("dtype_in_file", {}), **in_file}
    g.validate()
    return g


def dequantized_constants(before: Graph, after: Graph) -> int:
    """How many of `before`'s quantized (or float16) constants `after` holds as float32."""
    return sum(1 for n, t in before.tensors.items()
               if t.data is not None and (t.dtype == "float16" or (t.quant is not None and t.dtype in QUANTIZED_DTYPES))
               and n in after.tensors and after.tensors[n].dtype == "float32")
