"""The numpy reference executor: runs any forward IR graph (DESIGN §5, §6), float32 or int8.

    run_graph(graph, feeds, keep_intermediates=False) -> {tensor name: array}

Activations carry a leading batch dimension of any size N (the IR's own dim 0 is the batch the model file was
made with, usually 1); every op works on all N samples at once and no result depends on N. Constants (weights,
biases, shape operands) have no batch dimension, and neither does anything computed from constants only (e.g. a
DEQUANTIZE of float16 weights).

The kernels are the op modules' (stages/ops/<family>.py, `OpDef.forward(ctx)`, ctx a `_Ctx`: the op, its operand
values and tensors); this module runs the graph, checks feeds and results, and dispatches. The kernels' arithmetic
is that of TFLite's reference kernels (`tensorflow/lite/kernels/internal/reference/`), which is also what TFLite
Micro runs:
  - int8: integer accumulation, per-channel requantization with QuantizeMultiplier /
    MultiplyByQuantizedMultiplier (double rounding), fused activations as clamps in the output's int space;
    the fixed-point helpers live in `int8_arith`. Bit-exact against LiteRT's BUILTIN_REF resolver.
  - float32: every accumulation runs in float32 in the reference kernels' loop order (filter y, filter x, input
    channel; pooling windows row by row), so results match the reference bit for bit on the fixtures (SOFTMAX
    aside: numpy's exp and libm's expf differ in the last bit, < 4e-7 relative) and do not depend on the batch
    size (a BLAS matmul would change its blocking with N).
  - int8 FULLY_CONNECTED: LiteRT's reference kernel rescales in double, TFLite Micro in fixed point; int8
    RELU/RELU6/MUL multipliers and LOGISTIC/TANH also differ in detail; see `run_graph(fc_requant=...)`. TFLite
    Micro's int8 RELU6 ignores the output quantization (a TFLM quirk we do not copy: we follow LiteRT's
    QuantizedReluX, which requantizes).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.ops import FORWARD_OPS, REGISTRY

__all__ = ["run_graph", "run_op", "supported_ops", "ExecutionError", "FC_REQUANT_MODES"]


class ExecutionError(ModelError):
    """The graph cannot be run as given (bad feeds, a construct the executor does not support)."""


def supported_ops() -> list[str]:
    return sorted(_KERNELS)


FC_REQUANT_MODES = ("fixed_point", "litert_double")


def run_graph(graph: Graph, feeds: dict[str, np.ndarray], keep_intermediates: bool = False, *,
              fc_requant: str = "fixed_point") -> dict[str, np.ndarray]:
    """Run `graph` on `feeds` (graph input name -> array with a leading batch dim).

    Returns the graph outputs, or with keep_intermediates every non-constant tensor (inputs included).

    fc_requant picks how an int8 FULLY_CONNECTED rescales its int32 accumulator:
      "fixed_point"   (default) MultiplyByQuantizedMultiplier, double rounding: TFLite Micro's kernel and the
                      reference_integer_ops fixed-point overload, i.e. what the generated C runs on the MCU;
      "litert_double" round(double(acc) * s_in * s_w / s_out): what LiteRT's BUILTIN_REF FULLY_CONNECTED runs
                      (fully_connected.cc FullyConnected[PerChannel]Int8<kReference> call the float-scale
                      overload). The two differ by 1 LSB on near-ties.
    The same switch picks LiteRT's or TFLite Micro's arithmetic wherever else the two runtimes differ: int8
    RELU/RELU6 and MUL form their multiplier from float (LiteRT) or double (TFLM) scale ratios, and int8
    LOGISTIC/TANH are a float-filled lookup table in LiteRT, gemmlowp fixed point in TFLM (the two agreed on
    every input of every scale we swept). Every other op is the same in both."""
    if fc_requant not in FC_REQUANT_MODES:
        raise ValueError(f"fc_requant must be one of {FC_REQUANT_MODES}, got {fc_requant!r}")
    values: dict[str, np.ndarray] = {}
    batched: set[str] = set()
    for t in graph.constants():
        values[t.name] = t.data
    n = _check_feeds(graph, feeds, values, batched)
    for i, op in enumerate(graph.ops):
        kernel = _KERNELS.get(op.type)
        if kernel is None:
            raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else i,
                                     where="the reference executor",
                                     hint=f"the executor runs: {', '.join(supported_ops())}")
        for name in op.inputs:
            if name is not None and name not in values:
                raise ExecutionError(f"op #{i} {op.type} reads {name!r}, which has no value")
        ctx = _Ctx(graph, op, i, values, n, fc_requant)
        try:
            outs = kernel(ctx)
        except (ValueError, NotImplementedError) as e:
            raise ExecutionError(f"op #{i} {op.type} ({op.outputs[0]}): {e}") from None
        is_batched = any(name in batched for name in op.inputs if name is not None)
        for name, arr in zip(op.outputs, outs):
            t = graph.tensors[name]
            arr = np.asarray(arr)
            if arr.dtype != np.dtype(t.dtype):
                raise ExecutionError(f"op #{i} {op.type} produced {arr.dtype} for {name!r}, declared {t.dtype}")
            want = ([n] + list(t.shape[1:])) if is_batched else list(t.shape)
            if list(arr.shape) != want:
                raise ExecutionError(f"op #{i} {op.type} produced shape {list(arr.shape)} for {name!r}, "
                                     f"expected {want}")
            values[name] = arr
            if is_batched:
                batched.add(name)
    if keep_intermediates:
        return {k: v for k, v in values.items() if graph.tensors[k].data is None}
    return {k: values[k] for k in graph.outputs}


def run_op(graph: Graph, op: Op, values: dict[str, np.ndarray], *, index: int = 0, n: int = 1,
           fc_requant: str = "fixed_point") -> list[np.ndarray]:
    """Run one forward op on `values` (tensor name -> array, constants included): its outputs, in order.
    For callers that schedule ops themselves (the training executor); no shape checks beyond the kernel's."""
    kernel = _KERNELS.get(op.type)
    if kernel is None:
        raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else index,
                                 where="the reference executor")
    return kernel(_Ctx(graph, op, index, values, n, fc_requant))


def _check_feeds(graph: Graph, feeds: dict[str, np.ndarray], values: dict, batched: set) -> int:
    missing = [k for k in graph.inputs if k not in feeds]
    extra = [k for k in feeds if k not in graph.inputs]
    if missing or extra:
        raise ExecutionError(f"feeds do not match the graph inputs {graph.inputs}: "
                             f"missing {missing}, unexpected {extra}")
    n = None
    for name in graph.inputs:
        t = graph.tensors[name]
        arr = np.asarray(feeds[name])
        if list(arr.shape[1:]) != list(t.shape[1:]) or arr.ndim != len(t.shape):
            raise ExecutionError(f"input {name!r}: got shape {list(arr.shape)}, expected [N, "
                                 f"{', '.join(str(d) for d in t.shape[1:])}] (batch first)")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise ExecutionError(f"inputs disagree on the batch size ({n} vs {arr.shape[0]} for {name!r})")
        if t.dtype in ("int8", "int16", "int32", "uint8"):
            if not np.issubdtype(arr.dtype, np.integer):
                raise ExecutionError(f"input {name!r} is {t.dtype}: feed integers (quantize first), got {arr.dtype}")
            info = np.iinfo(t.dtype)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise ExecutionError(f"input {name!r}: values outside the {t.dtype} range")
        arr = arr.astype(t.dtype, copy=False)
        values[name] = arr
        batched.add(name)
    return int(n or 0)


class _Ctx:
    """What a forward kernel sees of its op: attrs, operand values x(i), operand / result tensors tin(i) / tout(i),
    the batch size n and the runtime switch fc_requant."""

    def __init__(self, graph: Graph, op: Op, index: int, values: dict[str, np.ndarray], n: int,
                 fc_requant: str = "fixed_point"):
        self.graph, self.op, self.index, self.values, self.n = graph, op, index, values, n
        self.fc_requant = fc_requant
        self.attrs: dict[str, Any] = op.attrs

    def x(self, i: int = 0) -> np.ndarray | None:
        name = self.op.inputs[i] if i < len(self.op.inputs) else None
        return None if name is None else self.values[name]

    def tin(self, i: int = 0) -> Tensor | None:
        name = self.op.inputs[i] if i < len(self.op.inputs) else None
        return None if name is None else self.graph.tensors[name]

    def tout(self, i: int = 0) -> Tensor:
        return self.graph.tensors[self.op.outputs[i]]

    def quantized(self) -> bool:
        return self.tin(0).dtype == "int8"



def _kernel_table() -> dict[str, Callable[[_Ctx], list[np.ndarray]]]:
    """op type -> its kernel. Every forward op of the registry brings one (OpDef.forward): a missing one fails at
    import."""
    missing = [name for name in FORWARD_OPS if REGISTRY[name].forward is None]
    if missing:
        raise ImportError(f"forward ops without a numpy kernel (OpDef.forward): {', '.join(missing)}")
    return {name: REGISTRY[name].forward for name in FORWARD_OPS}


_KERNELS = _kernel_table()
