"""The builder interface an op's backward emission writes to (`OpDef.backward`).

An op module says once which backward ops its op needs and what they read; two builders run that description:
stages/autodiff.py builds the training IR from it, and stages/planning/memory_model.py's analytic memory model builds its
abstract program of the training step from it (sizes and lifetimes only), so the two cannot disagree.

    backward(bb, op, i, dz)   op: the forward op (number i of the forward); dz: the gradient of its output after
                              any activation / clamp mask (`output_mask`, which both callers run first)
"""

from __future__ import annotations

from typing import Protocol

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.ops.quant import DEQUANTIZE, DEQUANTIZE_SLICE
from tinytrain.stages.ops.training import ACT_GRAD, BIAS_GRAD, GRAD_ACCUMULATE, INT8_CLAMP_GRAD

# Float act_grad activations a 1-bit mask can replace: act -> (lo, hi) with the gradient passing where lo < y < hi
# (hi None: no upper bound), exactly grad_ops.act_grad's test.
MASK_ACTS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


class BackwardBuilder(Protocol):
    g: Graph   # the forward graph's tensors (shapes, dtypes)

    def share(self, t: str | None, i: int) -> str | None:
        """A new gradient tensor for op i's share of dL/dt (fan-out shares are summed later), or None when t
        needs no gradient (a constant, or nothing trained below it)."""

    def real(self, t: str) -> str:
        """What a backward op reads for operand t: t itself, or its float32 copy when t is int8 (dequantized once
        per sample)."""

    def emit(self, type_: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        """Append one backward op."""

    def gradient(self, name: str, like: str) -> str:
        """A new float32 gradient tensor `name` of tensor `like`'s shape: a forward tensor (an output gradient
        after its mask), or a gradient made before (a shared parameter's summed gradient, of its shares' shape)."""

    def copy(self, name: str, shape: list[int]) -> str:
        """A new float32 activation tensor `name` of this shape (a dequantized copy, `Dequantizer`)."""

    def weight_channels(self, w: str) -> int:
        """The input channels of weight w that train (0: w does not train)."""

    def trains_bias(self, b: str | None) -> bool:
        """Whether bias b trains."""

    def param_grad(self, p: str, i: int, shape: list[int]) -> str:
        """A new gradient tensor for op i's share of dL/dp of a trained parameter, of the trained slice's shape."""

    def real_slice(self, x: str, k: int, depth: int | None) -> str:
        """The saved int8 input x of a weight gradient, only its trained slice x[..., :k] (depth: the first k
        columns of x's rows of `depth`), as float32 (dequantize_slice, once per sample)."""


def gather(bb: BackwardBuilder, shares: dict[str, list[str]], t: str, like: str | None = None) -> str | None:
    """dL/dt from its shares (`share`'s or `param_grad`'s, one per reading op): the one share, or their sum
    (grad_accumulate into a new gradient grad/<t>, shaped like t, or like `like`: a trained parameter's shares
    cover its trained slice); None when no share reached t. Autodiff and the memory model both sum fan-out
    gradients here (before they run the backward of t's producer) and a shared parameter's shares (after the
    backward)."""
    parts = shares.get(t)
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    out = bb.gradient(f"grad/{t}", like or t)
    bb.emit(GRAD_ACCUMULATE.name, list(parts), [out])
    return out


class Dequantizer:
    """The backward's float32 copies of int8 tensors (`BackwardBuilder.real` / `real_slice` of both builders), each
    tensor or slice made once per sample: dequantize(t) -> deq/<t>, dequantize_slice(x) -> deq/<x>[:k], emitted
    through the builder (`copy`, `emit`). Autodiff emits a copy when it is asked for (every emission in stages/ops
    asks right before the op that reads it). The memory model prices the graph after the exact planner fused
    some copies into their readers (memplan.fused_dequantize), so it passes `fuses(reader, k, t, sliced, depth)`:
    a copy is then only named when asked for and emitted where a backward op first reads it (`reads`), unless
    that reader, reading it as its operand k, fuses it and reads the int8 tensor itself."""

    def __init__(self, bb: BackwardBuilder, fuses=None):
        self.bb, self.fuses = bb, fuses
        self.done: dict[tuple, str] = {}    # (t, k, depth) -> its copy
        self.named: dict[str, tuple] = {}   # copies named, not yet emitted (lazy)

    def real(self, t: str) -> str:
        return self._get(t, None, None) if self.bb.g.tensors[t].dtype == "int8" else t

    def real_slice(self, x: str, k: int, depth: int | None) -> str:
        """x[..., :k] as float32 (depth: the first k columns of x's rows of `depth`)."""
        return self._get(x, k, depth)

    def real_now(self, t: str) -> str:
        """real(t), emitted now even when lazy: for a reader outside the backward builder (the loss)."""
        t = self.real(t)
        return self._emit(t, self.named.pop(t)) if t in self.named else t

    def reads(self, reader, inputs: list[str]) -> list[str]:
        """What a backward op (OpDef `reader`) reads for its inputs: a named copy it is the first to read is
        emitted now, or, where the reader fuses it, replaced by the int8 tensor."""
        out = []
        for k, t in enumerate(inputs):
            key = self.named.get(t)
            if key is not None:
                t = key[0] if self.fuses(reader, k, key[0], key[1] is not None, key[2]) \
                    else self._emit(t, self.named.pop(t))
            out.append(t)
        return out

    def _get(self, t: str, k: int | None, depth: int | None) -> str:
        key = (t, k, depth)
        if key in self.done:
            return self.done[key]
        name = f"deq/{t}" + ("" if k is None else f"[:{k}]")
        if self.fuses is not None:
            self.named[name] = key
            return name
        return self._emit(name, key)

    def _emit(self, name: str, key: tuple) -> str:
        t, k, depth = key
        bb = self.bb
        if k is None:
            bb.copy(name, list(bb.g.tensors[t].shape))
            bb.emit(DEQUANTIZE.name, [t], [name])
        else:
            bb.copy(name, slice_shape(bb.g, t, k, depth))
            bb.emit(DEQUANTIZE_SLICE.name, [t], [name], channels=int(k),
                    **({} if depth is None else {"depth": int(depth)}))
        self.done[key] = name
        return name


def geometry(op: Op) -> dict:
    """The forward's attrs without its fused activation (the backward ops' geometry attrs)."""
    return {k: v for k, v in op.attrs.items() if k != "act"}


def input_backward(bb: BackwardBuilder, op: Op, i: int, dz: str, reads: tuple = (), attrs: dict | None = None,
                   type_: str | None = None) -> None:
    """<op>_grad(dz, *reads) -> dx for the op's first input: reads are further operands taken as they are (a
    max pool's int8 input: only its argmax matters; shape constants)."""
    dx = bb.share(op.inputs[0], i)
    if dx:
        bb.emit(type_ or f"{op.type}_grad", [dz, *reads], [dx], **(attrs or {}))


def unary_backward(bb: BackwardBuilder, op: Op, i: int, dz: str, reads: str = "x", extra_inputs: int = 0,
                   attrs: dict | None = None) -> None:
    """<op>_grad(dz, x or y, [op's inputs 1..extra_inputs]) -> dx: an element-wise derivative that reads the
    forward input (reads="x") or output ("y"), real-valued, and the op's further (constant) operands."""
    dx = bb.share(op.inputs[0], i)
    if not dx:
        return
    ins = [dz, bb.real(op.inputs[0] if reads == "x" else op.outputs[0])]
    ins += [bb.real(t) for t in op.inputs[1:1 + extra_inputs]]
    bb.emit(f"{op.type}_grad", ins, [dx], **(attrs or {}))


def mask_bounds(type_: str, attrs: dict, y: Tensor) -> tuple | None:
    """(lo, hi) when a backward op of `type_` reading the forward output y only masks a gradient with it (the
    gradient passes where lo < y < hi): int8_clamp_grad of an int8 y, act_grad of a relu-like float y. A 1-bit mask
    of y can then replace y (autodiff's clamp_mask / mask_grad)."""
    if type_ == INT8_CLAMP_GRAD.name and y.dtype == "int8":
        return int(attrs["lo"]), int(attrs["hi"])
    if type_ == ACT_GRAD.name and y.dtype == "float32" and attrs.get("act") in MASK_ACTS:
        return MASK_ACTS[attrs["act"]]
    return None


def insert_masks(steps: list, n_fwd: int, io, bounds_of, mask_step, mask_reader) -> int:
    """The 1-bit masks of a training step, on autodiff's ops or the memory model's abstract steps alike: a forward
    output y (produced by steps[:n_fwd]) whose every reader after the forward only masks a gradient with it, all
    with the same (lo, hi) (`bounds_of(j, y)`: those of steps[j], None for any other reader), gets `mask_step(y, lo_hi)
    -> (step, mask)` (a clamp_mask) right after its producer, and each reader becomes `mask_reader(step, mask)` (a
    mask_grad). `io(step)` -> (inputs, outputs). Returns how many steps went into the forward."""
    readers: dict[str, list[int]] = {}
    for j in range(n_fwd, len(steps)):
        for t in dict.fromkeys(io(steps[j])[0]):
            if t is not None:
                readers.setdefault(t, []).append(j)
    producer = {t: i for i in range(n_fwd) for t in io(steps[i])[1]}
    after: dict[int, list] = {}
    for y, js in readers.items():
        if y not in producer:
            continue
        bounds = {bounds_of(j, y) for j in js}
        if len(bounds) != 1 or None in bounds:
            continue
        step, mask = mask_step(y, bounds.pop())
        after.setdefault(producer[y], []).append(step)
        for j in js:
            steps[j] = mask_reader(steps[j], mask)
    if not after:
        return 0
    new: list = []
    for i, st in enumerate(steps):
        new.append(st)
        new.extend(after.get(i, []))
    steps[:] = new
    return sum(len(v) for v in after.values())


def _int8_output(g: Graph, op: Op) -> tuple[float, int] | None:
    y = g.tensors[op.outputs[0]]
    if y.dtype != "int8" or y.quant is None:
        return None
    return float(y.quant.scale[0]), int(y.quant.zero_point[0])


def output_mask(bb: BackwardBuilder, d, op: Op, dy: str) -> str:
    """dz, the gradient of op's output before its fused activation / int8 clamp (d: the op's OpDef). Int8 ops that
    requantize (d.clamp_masked) or have a fused act: the straight-through estimator int8_clamp_grad(dy, y_q),
    dz = dy where the forward did not clamp ([lo, hi]: CalculateActivationRangeQuantized of the act, the int8 range
    at least); float ops with a fused act: act_grad(dy, y). A standalone clamp (relu, relu6: d.op_clamp) masks in
    its own backward (`clamp_backward`)."""
    y = op.outputs[0]
    act = op.attrs.get("act", "none")
    q = _int8_output(bb.g, op)
    if q is not None and d.op_clamp is None and (d.clamp_masked or act != "none"):
        lo, hi = ia.activation_range(act, *q)
        dz = bb.gradient(f"grad/{y}:pre", y)
        bb.emit(INT8_CLAMP_GRAD.name, [dy, y], [dz], lo=lo, hi=hi)
        return dz
    if act != "none" and bb.g.tensors[y].dtype != "int8":
        dz = bb.gradient(f"grad/{y}:pre", y)
        bb.emit(ACT_GRAD.name, [dy, y], [dz], act=act)
        return dz
    return dy


def clamp_backward(lo_hi: tuple[float, float | None]):
    """The backward of a standalone clamp to [lo, hi] real units (relu, relu6): int8_clamp_grad(dz, y_q) over the
    op's int range (its op range: QuantizedReluX), or float act_grad(dz, y) of the op's name."""
    def backward(bb: BackwardBuilder, op: Op, i: int, dz: str) -> None:
        dx = bb.share(op.inputs[0], i)
        if not dx:
            return
        y = op.outputs[0]
        q = _int8_output(bb.g, op)
        if q is not None:
            lo, hi = ia.relu_op_range(*lo_hi, *q)
            bb.emit(INT8_CLAMP_GRAD.name, [dz, y], [dx], lo=lo, hi=hi)
        else:
            bb.emit(ACT_GRAD.name, [dz, y], [dx], act=op.type)
    return backward


def slice_shape(g: Graph, x: str, k: int, depth: int | None) -> list[int]:
    """The shape of x[..., :k] (depth: the first k columns of x's rows of `depth`), a weight gradient's input."""
    shape = [int(d) for d in g.tensors[x].shape]
    if depth is not None:
        n = 1
        for d in shape:
            n *= d
        return [n // depth, k]
    return shape[:-1] + [k]


class LayerBackward:
    """The backward of a weighted layer (operands x, w, b?), `backward(bb, op, i, dz)`:
    <op>_grad_weight(dz, x's trained slice) -> dw of the trained input channels (k = in_channels), bias_grad(dz)
    -> db, <op>_grad_input(dz, w as real values) -> dx. A weight gradient of an int8 layer reads only the trained
    slice of its saved input, dequantized. depthwise: the weight's last axis holds k·M channels for k input
    channels (attr `multiplier` M where the int8 slice hides it); flat (fully connected): the slice is the first k
    columns of x's rows of the weight's depth."""

    def __init__(self, depthwise: bool = False, flat: bool = False):
        self.depthwise, self.flat = depthwise, flat

    def multiplier(self, g: Graph, op: Op) -> int:
        return g.tensors[op.inputs[1]].shape[-1] // g.tensors[op.inputs[0]].shape[-1] if self.depthwise else 1

    def grad_shape(self, g: Graph, op: Op, k: int) -> list[int]:
        """The weight gradient's shape for k trained input channels."""
        shape = list(g.tensors[op.inputs[1]].shape)
        shape[-1] = k * self.multiplier(g, op)
        return shape

    def slice_depth(self, g: Graph, op: Op) -> int | None:
        return int(g.tensors[op.inputs[1]].shape[-1]) if self.flat else None

    def __call__(self, bb: BackwardBuilder, op: Op, i: int, dz: str) -> None:
        x, w = op.inputs[0], op.inputs[1]
        bias = op.inputs[2] if len(op.inputs) > 2 else None
        wt = bb.g.tensors[w]
        geo = geometry(op)
        k = bb.weight_channels(w)
        if k:
            extra = {}
            xs = x
            if wt.dtype == "int8":
                xs = bb.real_slice(x, k, self.slice_depth(bb.g, op))
                if self.depthwise:
                    extra["multiplier"] = int(self.multiplier(bb.g, op))
            bb.emit(f"{op.type}_grad_weight", [dz, xs], [bb.param_grad(w, i, self.grad_shape(bb.g, op, k))], **geo,
                    in_channels=k, w_shape=list(wt.shape), **extra)
        if bb.trains_bias(bias):
            bb.emit(BIAS_GRAD.name, [dz], [bb.param_grad(bias, i, bb.g.tensors[bias].shape)])
        dx = bb.share(x, i)
        if dx:
            bb.emit(f"{op.type}_grad_input", [dz, bb.real(w)], [dx], **geo)
