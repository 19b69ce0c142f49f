"""Post-training quantization of a float IR into an int8 IR, per the TFLite int8 quantization spec
(https://ai.google.dev/edge/litert/models/quantization_spec):

  weights      int8, symmetric (zero point 0), values in [-127, 127]; per output channel
               (conv axis 0, depthwise axis 3, fully-connected axis 0) or per tensor
  activations  int8, asymmetric, one (scale, zero point) per tensor, real 0 exactly representable
  biases       int32, zero point 0, scale s_in * s_w[c]
  op rules     softmax and logistic outputs (1/256, -128), tanh output (1/128, 0); reshape / max pool / average pool / pad /
               concatenation / strided slice / resize outputs share their input's (scale, zero point), so these
               tensors are put in one group whose range is the union of its members' ranges;
               prelu's constant alpha is int8 per tensor over its own range (asymmetric, like an
               activation: the kernel takes an alpha zero point), its output is calibrated; so is a
               constant operand of add / mul / sub (BatchNorm's scale and offset when they could not be
               folded); mul, sub, hard_swish and leaky_relu outputs are calibrated

Steps: `prepare` (constants to float32, NaN check, BN folding, ReLU fusion) -> calibration (elsewhere)
-> `quantize_graph`. `validate_int8` checks a graph that arrives already quantized.

Tensor names are kept, so the float and int8 graphs can be compared tensor by tensor.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages import ops
from tinytrain.stages.model import bn_fold
from tinytrain.stages.quant.calibrate import QMAX, QMIN, activation_qparams
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor

# The op registry's traits (stages/ops/): which ops quantize; the layers (weights per output channel, int32 bias
# s_in * s_w[c], as the converter does; transpose_conv too, though it is no BatchNorm folding target); ops whose
# int8 kernels do no rescaling (output, and for concatenation every input, shares params; resizes interpolate raw
# int8 values); output encodings the int8 kernels hard-code (LiteRT checks LOGISTIC's; TANH's fixed-point kernel
# assumes it); ops whose constant operand is quantized per tensor like an activation.
INT8_OPS = ops.INT8_OPS
LINEAR_OPS = ops.LAYER_OPS
SHARED_PARAM_OPS = ops.SHARED_PARAM_OPS
FIXED_OUTPUT_PARAMS = ops.FIXED_OUTPUT_PARAMS
INT32_MAX = 2**31 - 1


def _shared_inputs(op: Op) -> list[str | None]:
    """The inputs whose int8 parameters a SHARED_PARAM_OPS op's output shares."""
    return list(op.inputs) if ops.REGISTRY[op.type].shared_qparams == "all" else list(op.inputs[:1])


# ---- prepare -----------------------------------------------------------------------------------

def prepare(graph: Graph) -> tuple[Graph, list[str]]:
    """The float graph that calibration runs and quantization transforms: float16 / int8 constant
    weights behind DEQUANTIZE become float32 constants, weights are checked for NaN/inf, BatchNorm
    MUL/ADD pairs are folded and standalone ReLUs fused. Returns the graph and notes."""
    g = copy.deepcopy(graph)
    notes: list[str] = []
    notes += dequantize_constants(g)
    _check_finite(g)
    _set_param_roles(g)
    notes += _unshare_params(g)
    g, fold_notes = bn_fold.fold(g)
    notes += fold_notes
    for i, op in enumerate(g.ops):
        if op.type not in INT8_OPS:
            raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else i,
                                     where="quantize", hint=f"int8 quantization supports {', '.join(INT8_OPS)}")
    g.validate()
    return g, notes


def dequantize_constants(g: Graph) -> list[str]:
    """In place: each constant a file stores compressed behind an unpacking op (a DEQUANTIZE of float16 or int8
    weights) becomes the float32 constant the op makes, with the stored constant's role (weight / bias), and the op
    goes. Float training needs this as int8 calibration does: a layer trains only constant weights. Returns notes."""
    notes = []
    keep = []
    for op in g.ops:
        src = g.tensors.get(op.inputs[0]) if op.type in ops.UNPACK_OPS and op.inputs else None
        if src is None or src.data is None:
            keep.append(op)
            continue
        out = g.tensors[op.outputs[0]]
        data = np.asarray(src.data)
        if src.dtype in ("int8", "int16", "int32", "uint8") and src.quant is not None:
            data = _dequant(data, src.quant)
        out.data = data.astype(np.float32)
        out.dtype = "float32"
        out.quant = None
        out.role = src.role if src.role in ("weight", "bias") else "constant"
        if out.source_index is None:
            out.source_index = src.source_index
        notes.append(f"dequantized {src.dtype} constant {src.name} -> {out.name}")
    g.ops = keep
    used = {t for op in g.ops for t in op.inputs if t}
    for name in [n for n, t in g.tensors.items() if t.data is not None and n not in used and n not in g.outputs]:
        del g.tensors[name]
    return notes


def _unshare_params(g: Graph) -> list[str]:
    """Give every linear op its own weight and bias tensors. The converter merges constants with equal
    bytes (two convs with the same bias, say), but int8 needs one copy per op: a bias's scale depends
    on the op's input scale, and BN folding must change one op only."""
    notes = []
    seen: set[str] = set()
    for i, op in enumerate(g.ops):
        if op.type not in LINEAR_OPS:
            continue
        for k in (1, 2):
            name = op.inputs[k] if len(op.inputs) > k else None
            if not name or g.tensors[name].data is None:
                continue
            if name in seen:
                new, j = f"{name}/{i}", 1
                while new in g.tensors:
                    new, j = f"{name}/{i}.{j}", j + 1
                t = copy.deepcopy(g.tensors[name])
                t.name, t.source_index = new, None
                g.tensors[new] = t
                op.inputs[k] = new
                notes.append(f"copied {name} shared by several ops -> {new}")
            else:
                seen.add(name)
    return notes


def _set_param_roles(g: Graph) -> None:
    for op in g.ops:
        if op.type in LINEAR_OPS:
            for name, role in zip(op.inputs[1:3], ("weight", "bias")):
                if name and g.tensors[name].data is not None:
                    g.tensors[name].role = role


def _dequant(q: np.ndarray, qp: QuantParams) -> np.ndarray:
    scale = np.asarray(qp.scale, np.float64)
    zp = np.asarray(qp.zero_point, np.float64)
    if qp.per_channel:
        shape = [1] * q.ndim
        shape[qp.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q.astype(np.float64) - zp) * scale


def _check_finite(g: Graph) -> None:
    for t in g.constants():
        if t.dtype in ("float32", "float16") and not np.all(np.isfinite(t.data)):
            bad = int(np.size(t.data) - np.count_nonzero(np.isfinite(t.data)))
            raise ModelError(f"constant tensor {t.name!r} ({t.role}, shape {t.shape}) holds {bad} NaN/inf "
                             f"value(s): the float model is broken and cannot be quantized",
                             hint="re-export the model; check the training run for divergence")


# ---- activation groups -------------------------------------------------------------------------

class _UnionFind:
    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def activation_params(g: Graph, ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, int]]:
    """(scale, zero point) of every activation tensor, honouring the op constraints."""
    acts = [n for n, t in g.tensors.items() if t.data is None]
    uf = _UnionFind()
    for n in acts:
        uf.find(n)
    fixed: dict[str, tuple[float, int]] = {}
    clamp: dict[str, tuple[float, float]] = {}
    for op in g.ops:
        if op.type in SHARED_PARAM_OPS:
            for x in _shared_inputs(op):
                if x is not None and g.tensors[x].data is None:
                    for y in op.outputs:   # every output of a multi-output op (split)
                        uf.union(y, x)
        if op.type in FIXED_OUTPUT_PARAMS:
            fixed[op.outputs[0]] = FIXED_OUTPUT_PARAMS[op.type]
        act = op.type if op.type in ops.OP_CLAMPS else op.attrs.get("act", "none")
        if act == "relu":
            clamp[op.outputs[0]] = (0.0, np.inf)
        elif act == "relu6":
            clamp[op.outputs[0]] = (0.0, 6.0)
        elif act == "relu_n1_to_1":
            clamp[op.outputs[0]] = (-1.0, 1.0)

    groups: dict[str, list[str]] = {}
    for n in acts:
        groups.setdefault(uf.find(n), []).append(n)
    params: dict[str, tuple[float, int]] = {}
    for members in groups.values():
        fx = {fixed[m] for m in members if m in fixed}
        if len(fx) > 1:
            raise ModelError(f"tensors {members} must share int8 parameters but two softmax/logistic/tanh "
                             f"outputs fix them differently")
        if fx:
            p = fx.pop()
        else:
            # A fused activation bounds a tensor's range whatever calibration saw, so ReLU's floor
            # is exactly the zero point and ReLU6's ceiling never wastes codes above 6. The group
            # then covers the union of its members' bounded ranges.
            seen = []
            for m in members:
                if m in ranges:
                    lo, hi = ranges[m]
                    if m in clamp:
                        lo, hi = max(lo, clamp[m][0]), min(hi, clamp[m][1])
                    seen.append((lo, max(lo, hi)))
            if not seen:
                raise ModelError(f"no calibration range for tensors {members}: they are never computed "
                                 f"from the graph inputs")
            p = activation_qparams(min(r[0] for r in seen), max(r[1] for r in seen))
        for m in members:
            params[m] = p
    return params


# ---- quantize ----------------------------------------------------------------------------------

def weight_scales(w: np.ndarray, axis: int | None, bias: np.ndarray | None, s_in: float) -> np.ndarray:
    """Symmetric scales (one per channel along `axis`, or one if axis is None). The scale is raised
    where the int32 bias b / (s_in * s_w) would overflow, and an all-zero channel gets scale 1
    (any scale is exact for zeros, and 0 would divide by zero in the kernels)."""
    if axis is None:
        amax = np.array([np.max(np.abs(w))], np.float64)
    else:
        amax = np.max(np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)), axis=1).astype(np.float64)
    s = amax / QMAX
    if bias is not None:
        need = np.abs(bias.astype(np.float64)) / (s_in * (INT32_MAX // 2))
        s = np.maximum(s, need.max() if axis is None else need)
    s[s == 0] = 1.0
    # float32 as the .tflite file stores them (see calibrate.activation_qparams).
    return s.astype(np.float32).astype(np.float64)


@dataclass
class QuantizeOptions:
    per_channel: bool = True
    io: str = "int8"   # "int8" or "float"


def quantize_graph(g: Graph, ranges: dict[str, tuple[float, float]],
                   options: QuantizeOptions = QuantizeOptions()) -> Graph:
    """The int8 graph of a prepared float graph `g`, given each activation's calibrated range."""
    params = activation_params(g, ranges)
    q = copy.deepcopy(g)
    for name, t in q.tensors.items():
        if t.data is None:
            s, z = params[name]
            t.dtype = "int8"
            t.quant = QuantParams([s], [z], 0)

    done: set[str] = set()
    for op in q.ops:
        if op.type in LINEAR_OPS:
            _quantize_linear(q, op, options.per_channel, done)
        elif op.type in ops.CONST_OPERAND_OPS:
            # A constant operand (a learned offset, a fixed feature map, PReLU's slopes) is quantized per
            # tensor over its own range, like an activation.
            for x in op.inputs:
                t = q.tensors[x] if x else None
                if t is not None and t.data is not None and t.dtype == "float32" and x not in done:
                    s, z = activation_qparams(float(t.data.min()), float(t.data.max()))
                    t.data = np.clip(np.round(t.data / s) + z, QMIN, QMAX).astype(np.int8)
                    t.dtype, t.quant = "int8", QuantParams([s], [z], 0)
                    done.add(x)
    for t in q.tensors.values():
        if t.data is not None and t.dtype in ("float32", "float16"):
            users = [o.type for o in q.ops if t.name in o.inputs]
            raise ModelError(f"float constant {t.name!r} (read by {users}) has no int8 form")

    if options.io == "float":
        _float_boundaries(q, g)
    q.meta = dict(q.meta)
    q.meta["quantized"] = {"per_channel": options.per_channel, "io": options.io}
    q.validate()
    return q


def _quantize_linear(q: Graph, op: Op, per_channel: bool, done: set[str]) -> None:
    x, wname = op.inputs[0], op.inputs[1]
    bname = op.inputs[2] if len(op.inputs) > 2 else None
    s_in = q.tensors[x].quant.scale[0]
    w = q.tensors[wname]
    b = q.tensors[bname] if bname else None
    if wname in done or (bname and bname in done):
        raise ModelError(f"{op.type} -> {op.outputs[0]}: weight {wname!r} or bias {bname!r} is shared "
                         f"with another op (prepare() copies shared parameters; was it skipped?)")
    if w.data is None:
        raise ModelError(f"{op.type} -> {op.outputs[0]}: weights {wname!r} are not constant; int8 "
                         f"kernels need constant weights")
    axis = bn_fold.out_channel_axis(op.type) if per_channel else None
    wf = np.asarray(w.data, np.float64)
    bf = np.asarray(b.data, np.float64) if b is not None else None
    s_w = weight_scales(wf, axis, bf, s_in)
    shape = [1] * wf.ndim
    if axis is not None:
        shape[axis] = -1
    w.data = np.clip(np.round(wf / s_w.reshape(shape)), -QMAX, QMAX).astype(np.int8)
    w.dtype = "int8"
    w.role = "weight"
    w.quant = QuantParams([float(s) for s in s_w], [0] * len(s_w), axis if axis is not None else 0)
    done.add(wname)
    if b is not None:
        channels = wf.shape[bn_fold.out_channel_axis(op.type)]
        s_b = s_in * (s_w if len(s_w) == channels else np.full(channels, s_w[0]))
        b.data = np.clip(np.round(bf / s_b), -INT32_MAX, INT32_MAX).astype(np.int32)
        b.dtype = "int32"
        b.role = "bias"
        b.quant = QuantParams([float(np.float32(s)) for s in s_b], [0] * channels, 0)
        done.add(bname)


def _float_boundaries(q: Graph, g: Graph) -> None:
    """float32 graph inputs/outputs, with QUANTIZE after each input and DEQUANTIZE before each output.
    The I/O tensors keep their names (callers feed by name); the int8 tensors next to them get `/q`."""
    front, back = [], []
    for name in q.inputs:
        inner = _rename(q, name, name + "/q")
        q.tensors[name] = Tensor(name=name, shape=list(q.tensors[inner].shape), dtype="float32", role="input",
                                 source_index=g.tensors[name].source_index)
        q.tensors[inner].role, q.tensors[inner].source_index = "activation", None
        front.append(Op(ops.QUANTIZE.name, [name], [inner]))
    for name in q.outputs:
        inner = _rename(q, name, name + "/q")
        q.tensors[name] = Tensor(name=name, shape=list(q.tensors[inner].shape), dtype="float32",
                                 role="output", source_index=g.tensors[name].source_index)
        q.tensors[inner].role, q.tensors[inner].source_index = "activation", None
        back.append(Op(ops.DEQUANTIZE.name, [inner], [name]))
    q.ops = front + q.ops + back


def _rename(q: Graph, old: str, new: str) -> str:
    t = q.tensors.pop(old)
    t.name = new
    q.tensors[new] = t
    for op in q.ops:
        op.inputs = [new if x == old else x for x in op.inputs]
        op.outputs = [new if x == old else x for x in op.outputs]
    return new


def float_name(q: Graph, name: str) -> str:
    """The float-graph tensor an int8-graph tensor stands for."""
    return name[:-2] if name.endswith("/q") else name


# ---- already-int8 models -----------------------------------------------------------------------

def is_quantized(g: Graph) -> bool:
    """True when the model already computes in int8 (converter full-int8 output, with or without float
    I/O). int8 weights behind DEQUANTIZE in a float graph (dynamic-range models) do not count: those
    are dequantized by `prepare` and quantized afresh."""
    return any(t.dtype == "int8" and t.data is None for t in g.tensors.values())


def validate_int8(g: Graph, rel_tol: float = 1e-4) -> list[str]:
    """Every inconsistency that would make an int8 graph compute something other than what its
    params say; empty when the graph is a valid TFLite-int8 graph."""
    problems: list[str] = []
    for t in g.tensors.values():
        if t.dtype == "int8" and t.quant is None:
            problems.append(f"tensor {t.name!r} is int8 but has no quantization parameters")
        if t.quant is not None:
            if any((not np.isfinite(s)) or s <= 0 for s in t.quant.scale):
                problems.append(f"tensor {t.name!r} has a non-positive or non-finite scale {t.quant.scale}")
            if t.data is None and t.dtype == "int8" and t.quant.per_channel:
                problems.append(f"activation {t.name!r} is per-channel quantized; activations must be per-tensor")
            if t.dtype == "int8" and any(not QMIN <= z <= QMAX for z in t.quant.zero_point):
                problems.append(f"tensor {t.name!r} has zero point {t.quant.zero_point} outside int8")
        if t.data is not None and t.dtype in ("float32", "float16") and not np.all(np.isfinite(t.data)):
            problems.append(f"constant {t.name!r} holds NaN/inf")
    for i, op in enumerate(g.ops):
        where = f"op #{i} {op.type} -> {op.outputs[0]}"
        dts = [g.tensors[x].dtype for x in op.inputs[:1] if x]
        if op.type in LINEAR_OPS and dts == ["int8"]:
            x, w = g.tensors[op.inputs[0]], g.tensors[op.inputs[1]]
            b = g.tensors[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] else None
            if w.dtype != "int8" or w.quant is None:
                problems.append(f"{where}: weights {w.name!r} are {w.dtype} with no int8 quantization")
                continue
            if any(z != 0 for z in w.quant.zero_point):
                problems.append(f"{where}: weights {w.name!r} have non-zero zero points (must be symmetric)")
            axis = bn_fold.out_channel_axis(op.type)
            if w.quant.per_channel and (w.quant.axis != axis or len(w.quant.scale) != w.shape[axis]):
                problems.append(f"{where}: weights {w.name!r} per-channel along axis {w.quant.axis} with "
                                f"{len(w.quant.scale)} scales; expected axis {axis} with {w.shape[axis]}")
            if b is not None and x.quant is not None:
                if b.dtype != "int32" or b.quant is None:
                    problems.append(f"{where}: bias {b.name!r} is {b.dtype}; int8 kernels need an int32 bias")
                else:
                    expect = x.quant.scale[0] * np.asarray(w.quant.scale, np.float64)
                    got = np.asarray(b.quant.scale, np.float64)
                    if got.size == 1 and expect.size > 1:
                        got = np.full_like(expect, got[0])
                    if expect.size == 1 and got.size > 1:
                        expect = np.full_like(got, expect[0])
                    if got.shape != expect.shape or np.any(np.abs(got - expect) > rel_tol * expect):
                        worst = float(np.max(np.abs(got - expect) / expect)) if got.shape == expect.shape else None
                        problems.append(f"{where}: bias {b.name!r} scale is not input scale x weight scale "
                                        f"({x.quant.scale[0]:.6g} x w); relative error "
                                        f"{worst if worst is not None else 'shape mismatch'}")
        if op.type in FIXED_OUTPUT_PARAMS and g.tensors[op.outputs[0]].dtype == "int8":
            qp = g.tensors[op.outputs[0]].quant
            want_s, want_z = FIXED_OUTPUT_PARAMS[op.type]
            if qp is not None and (abs(qp.scale[0] - want_s) > 1e-9 or qp.zero_point[0] != want_z):
                problems.append(f"{where}: int8 {op.type} output must have scale 1/{round(1 / want_s)} and zero "
                                f"point {want_z}, has {qp.scale[0]:.6g}, {qp.zero_point[0]}")
        if op.type in SHARED_PARAM_OPS:
            out = g.tensors[op.outputs[0]]
            for x in _shared_inputs(op):
                t = g.tensors[x]
                if out.dtype == "int8" and t.quant is not None and out.quant is not None and (
                        abs(t.quant.scale[0] - out.quant.scale[0]) > rel_tol * out.quant.scale[0]
                        or t.quant.zero_point[0] != out.quant.zero_point[0]):
                    problems.append(f"{where}: input {x!r} (s={t.quant.scale[0]:.6g}, zp={t.quant.zero_point[0]})"
                                    f" and output (s={out.quant.scale[0]:.6g}, zp={out.quant.zero_point[0]}) "
                                    f"must share int8 parameters")
        if op.type in INT8_OPS and op.type not in ops.CONVERSION_OPS:
            kinds = {g.tensors[x].dtype for x in list(op.inputs[:1]) + op.outputs if x}
            if "int8" in kinds and kinds - {"int8"}:
                problems.append(f"{where}: mixes int8 and {sorted(kinds - {'int8'})} activations")
    return problems
