"""Zoo variants made from a shipped zoo file at first use, deterministically, without TensorFlow (stages/model/zoo.py).

    with_input_size(graph, h, w) -> the same network at another input resolution (fully convolutional up to its
                                   global pooling: the weights are unchanged, every activation shape is recomputed)
    dequantized(graph)           -> the float32 network: every int8/int32 constant as its real values
                                   (scale * (q - zero_point)), activations float32, no quantization parameters
    derive(base_file, recipe, out_dir) -> the variant's .tflite (written by stages/model/tflite_writer.py, whose
                                   bytes depend only on the graph), cached under a name keyed by the base file's
                                   hash and the recipe

So `zoo:mbv2-w0.35-96` and `zoo:mbv2-w0.35-128-float` cost no repository space: they are the shipped converter-made
int8 MobileNetV2 at 96x96, and its float twin (its activation ranges are those the converter calibrated at 128; at
96 the same pretrained weights see the same kind of images, smaller).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np

from tinytrain.cache.fs_ops import atomic_write_bytes
from tinytrain.stages.model.ir import Graph

# Bump when a recipe's output changes: cached variants are keyed by it.
DERIVE_VERSION = 1


def with_input_size(graph: Graph, h: int, w: int) -> Graph:
    """`graph` with its one NHWC input at h x w; each activation's shape is what the numpy executor's kernel of
    its op makes of the new input (every op's own shape rule, op by op), constants are shared."""
    from tinytrain.stages.golden import forward

    if len(graph.inputs) != 1 or len(graph.tensors[graph.inputs[0]].shape) != 4:
        raise ValueError("a new input size needs one NHWC input")
    g = copy.copy(graph)
    g.tensors = {n: copy.copy(t) for n, t in graph.tensors.items()}
    x = g.tensors[g.inputs[0]]
    x.shape = [1, int(h), int(w), int(x.shape[3])]
    values = {t.name: t.data for t in g.constants()}
    values[x.name] = np.zeros(x.shape, dtype=x.dtype)
    for i, op in enumerate(g.ops):
        kernel = forward._KERNELS.get(op.type)
        if kernel is None:
            raise ValueError(f"op #{i} {op.type}: the executor has no kernel to size it")
        for name, arr in zip(op.outputs, kernel(forward._Ctx(g, op, i, values, 1))):
            values[name] = np.asarray(arr)
            g.tensors[name].shape = [int(d) for d in values[name].shape]
    g.validate()
    return g


def dequantized(graph: Graph) -> Graph:
    """The float32 twin of an int8 graph: constants dequantized, activations float32, quantization dropped.
    Ops that only convert between int8 and float (QUANTIZE / DEQUANTIZE) would become copies: refused."""
    from tinytrain.stages import ops

    conv = [op.type for op in graph.ops if op.type in ops.CONVERSION_OPS]
    if conv:
        raise ValueError(f"the graph converts between types ({', '.join(sorted(set(conv)))}): no float twin")
    g = copy.copy(graph)
    g.tensors = {}
    for name, t in graph.tensors.items():
        t = copy.copy(t)
        if t.dtype in ("int8", "int32") and t.quant is not None:
            if t.is_constant:
                q = t.quant
                data = np.asarray(t.data, np.float64)
                scale, zp = np.asarray(q.scale, np.float64), np.asarray(q.zero_point, np.float64)
                if len(scale) > 1:  # per channel along q.axis
                    bshape = [1] * data.ndim
                    bshape[int(q.axis) % data.ndim] = len(scale)
                    scale, zp = scale.reshape(bshape), zp.reshape(bshape)
                t.data = ((data - zp) * scale).astype(np.float32)
            t.dtype, t.quant = "float32", None
        g.tensors[name] = t
    g.validate()
    return g


RECIPES = {
    "float": lambda g, arg: dequantized(g),
    "size": lambda g, arg: with_input_size(g, arg, arg),
}


def derive(base: Path, recipe: list[tuple[str, int | None]], out_dir: Path) -> Path:
    """The variant of zoo file `base` that `recipe` (steps of RECIPES, in order) makes, as a .tflite in
    `out_dir` (made once; the name holds the base file's hash and the recipe, so a changed base remakes it)."""
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.model.tflite_writer import model_bytes

    digest = hashlib.sha256(Path(base).read_bytes()).hexdigest()[:16]
    tag = "-".join(f"{k}{'' if a is None else a}" for k, a in recipe)
    path = Path(out_dir) / f"{Path(base).stem}-{tag}-v{DERIVE_VERSION}-{digest}.tflite"
    if path.is_file():
        return path
    g = read_model(base)
    for step, arg in recipe:
        g = RECIPES[step](g, arg)
    data = model_bytes(g, description=f"tinytrain zoo: {Path(base).name} {tag}")
    atomic_write_bytes(path, data)   # a concurrent build sees the whole file or none
    return path
