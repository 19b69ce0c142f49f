"""Compile-time autodiff: forward IR + plan -> training IR (forward, loss, backward and update ops) (DESIGN §3, §5).

    build_training_graph(graph, plan, loss, optimizer, batch_size) -> Graph

The training IR is an ordinary Graph. Its ops run in two phases, split at `meta["train"]["sample_ops"]`:

  per sample   ops[:sample_ops]  forward (batch 1), the loss op, backward ops, and with batch_size > 1 one
                                 `batch_accumulate` per trained tensor (acc += g);
  per step     ops[sample_ops:]  (`step_counter` for Adam) then one update op per trained tensor.

A batch of B is B runs of the sample phase then one step (the MCU's memory holds one sample's activations plus
the accumulators, not B samples); the loss op gives the per-sample loss and the update divides by B, which is
PyTorch's mean reduction over the batch.

Backward op vocabulary (type: inputs -> outputs; attrs). `dy` is the gradient of the op's output; gradients are
float32 tensors with role "gradient", named grad/<tensor> (a reader's share of a fan-out: grad/<tensor>#<op>):
  act_grad:                      dy, y -> dz;                act (mask from the forward output y; tanh:
                                                              dy·(1 − y²))
  conv2d_grad_input:             dz, w -> dx;                the forward's geometry attrs
  conv2d_grad_weight:            dz, x -> dw;                geometry, in_channels (k: dw is w[..., :k]), w_shape
  depthwise_conv2d_grad_input:   dz, w -> dx;                geometry, depth_multiplier
  depthwise_conv2d_grad_weight:  dz, x -> dw;                geometry, in_channels (dw is w[..., :k·M])
  fully_connected_grad_input:    dz, w -> dx
  transpose_conv_grad_input:     dz, w -> dx;                the forward's attrs (stride, padding): the conv2d of
                                                              dz with w of the same geometry
  transpose_conv_grad_weight:    dz, x -> dw;                as conv2d_grad_weight (emitted once TrainPlan lets a
                                                              transpose_conv train; today it is frozen, its bias and
                                                              weights never train, gradients flow through it)
  fully_connected_grad_weight:   dz, x -> dw;                in_channels
  bias_grad:                     dz -> db
  add_grad:                      dz -> da?, db?              (unbroadcast to each operand's shape)
  average_pool2d_grad:           dz -> dx;                   the forward's pooling attrs
  max_pool2d_grad:               dz, x -> dx;                the forward's pooling attrs
  mean_grad:                     dy, axes -> dx
  reshape_grad, pad_grad:        dy (, paddings) -> dx
  concatenation_grad:            dz -> dx0?, dx1?, ...;      axis, sizes
  softmax_grad:                  dy, y -> dx;                beta
  mul_grad:                      dz, other -> d              one op per operand that needs a gradient: d =
                                                              unbroadcast(dz·other) to that operand's shape (a
                                                              constant operand, e.g. a BatchNorm scale, gets none)
  sub_grad:                      dz -> da?, db?;             which (a: +dz, b: −dz; unbroadcast as add_grad)
  logistic_grad:                 dy, y -> dx                 dy·(1 − y)·y from the forward output y
  tanh_grad:                     dy, y -> dx                 dy·(1 − y²) from the forward output y
  hard_swish_grad:               dy, x -> dx                 from the forward input: 0 for x ≤ −3, dy for x ≥ 3,
                                                              dy·(x/3 + 1/2) between (PyTorch's kinks)
  leaky_relu_grad:               dy, x -> dx;                alpha (dy where x > 0, alpha·dy elsewhere)
  prelu_grad:                    dy, x, alpha -> dx          the input gradient only (alpha is a constant)
  strided_slice_grad:            dy -> dx;                   starts, stops, strides (dy scattered into zeros of
                                                              x's shape; shrunk axes restored)
  resize_bilinear_grad:          dy -> dx;                   align_corners, half_pixel_centers (dy scattered to
                                                              the four source pixels with the float forward's
                                                              weights)
  resize_nearest_neighbor_grad:  dy -> dx;                   (as above; dy summed into the copied source pixel)
  grad_accumulate:               g0, g1, ... -> g            (a tensor read by several ops: onert's
                                                               BackPropAccumulator)
Losses: softmax_ce_loss(logits, labels:int32[1]) -> loss:f32[], dlogits  (fused, stable; the model's final
softmax is dropped from the training forward); mse_loss(y, target) -> loss, dy (mean over the sample's elements);
bce_logits_loss, huber_loss (same form); attrs weight, offset; loss_sum(l0, l1, ...) -> loss. `loss` is a loss name
(the model's single output) or a list of heads (output, loss, weight: spec train.outputs): stages/train/losses.py says
which tensor each head's loss reads, prunes outputs not trained and emits the loss ops.
Updates (in place: the weight and state tensors are both inputs and outputs; the trained slice is w[..., :n]):
  batch_accumulate(acc, g) -> acc
  sgd_update(w, g) -> w;               momentum_update(w, g, buf) -> w, buf
  adam_update(w, g, m, v, step) -> w, m, v;   rmsprop_update(w, g, sq) -> w, sq;   step_counter(step) -> step
  attrs: n (trained channels on the last axis, absent = all), batch_size (g is divided by it), reset_grad (the
  accumulator is zeroed after use), and `<name>_ref="runtime.<key>"` for every hyper-parameter: learning rate,
  momentum, betas, eps, alpha and weight decay are runtime values (DESIGN §3), read from the executor's `runtime`
  dict or the firmware's runtime config, so changing them needs no rebuild. Their defaults are in
  meta["train"]["runtime_defaults"].

Pruning: only tensors that depend on a trained parameter get a gradient, so nothing flows below the earliest
trained layer; frozen weights get no gradient; a weight trained at ratio r gets a gradient of ceil(r·C_in) input
channels only. A parameter read by several ops (the converter shares identical constants) gets the sum.

Int8 graphs (the quantize stage's real int8 IR; DESIGN §6, TTE's QAS). The forward is the int8 IR's own ops,
unchanged (bit-exact with the executor: the forward the MCU runs). The backward runs in fp32 on real values;
every gradient is the float32 gradient of the *real* tensor (dL/dx for x = s·(x_q − z)). Extra ops:
  dequantize:        x_q -> x_f                  the executor's op (reference Dequantize); inserted for the loss's
                                                 logits/output (`deq/<head>`), for the weights an input gradient
                                                 reads (`deq/<w>`, per channel) and for an int8 softmax's output
  dequantize_slice:  x_q -> x_f;  channels=k [, depth=D]
                     the saved int8 input of a weight gradient, only its trained slice: x[..., :k] (FC: the first
                     k columns of x's rows of D = the weight's depth), as float32: f32(q − zp) · f32(scale), one
                     float32 multiply (bit-equal to the reference's double product rounded to float)
  int8_clamp_grad:   dy, y_q -> dz;   lo, hi     straight-through estimator: dz = dy where lo < y_q < hi, else 0.
                     [lo, hi] is the int range the forward clamped y_q to (CalculateActivationRangeQuantized of
                     the fused act, the int8 range at least; RELU/RELU6 ops: their op range). Emitted for ops that
                     requantize (conv2d, depthwise_conv2d, fully_connected, add, mean, quantize, relu, relu6, mul, sub,
                     hard_swish, leaky_relu, prelu) and for any op with a fused act; it replaces act_grad in
                     int8 graphs. It compares integers: exact, and no fp32 copy of y is needed.
  *_grad_weight read the dequantized slice (depthwise: attr multiplier = M, since the slice hides it); *_grad_input
  read the dequantized weights; max_pool2d_grad reads x_q itself (only its argmax matters, which int8 keeps).
  The element-wise ops' backward reads what its derivative needs, dequantized (`deq/<t>`, once per sample):
  mul_grad the other operand (an int8 constant included); logistic_grad / tanh_grad the int8 forward output (their
  derivative is a function of y); hard_swish_grad, leaky_relu_grad and prelu_grad the int8 input (prelu: and its
  int8 alpha). mul, sub, hard_swish, leaky_relu and prelu requantize, so int8_clamp_grad masks their outputs
  (mul/sub: the fused act's range, at least the int8 range; the others: the int8 range). logistic and tanh get no
  mask: their int8 output range is the function's own range (fixed scales 1/256 and 1/128), so y_q at a bound
  means the curve is flat there and the derivative from the dequantized y is already ~0 — an STE mask would only
  drop the small remaining slope. strided_slice_grad moves dz as it is (the slice copies int8 values); so do the
  resize grads (the int8 resizes interpolate raw values with the input's parameters and never clamp: no mask).
Updates of int8 weights / int32 biases (stages/quant/qas.py has the exact float32 formulas, rounding and PRNG):
  qas_sgd_update(p, g, scale [, master] [, prng]) -> p [, master] [, prng]
  qas_momentum_update(p, g, scale, buf [, master] [, prng]) -> p, buf [, master] [, prng]
  qas_adam_update(p, g, scale, m, v, step [, master] [, prng]) -> p, m, v [, master] [, prng]
  qas_rmsprop_update(p, g, scale, sq [, master] [, prng]) -> p, sq [, master] [, prng]
  `scale` is a float32 constant `qas/<p>/scale` indexed along attr `axis` (weights: s_W per output channel; biases:
  s_x·s_W, the product taken in double then rounded to float32); attrs as the float updates (n, batch_size,
  reset_grad, *_ref) plus qas (true: Δ = −d/scale; false: the naive Δ = −d on G_W̄ = scale·G_W), rounding
  (nearest | stochastic; "nearest" whenever a master copy is used), master (bool), bounds [lo, hi] ([−127, 127]
  weights, int32 range biases), and for stochastic rounding stream (the PRNG stream index) and
  seed_ref="runtime.seed" (the PRNG state `opt/<p>/prng`, int32 holding uint32 bits, is seeded at run time).
  Master copies (`opt/<p>/master`, fp32, integer units, trained slice only, int8 weights only) are listed in
  meta["train"]["qas"]["master_copies"]; PRNG states are optimizer state.
1-bit activation masks (build_training_graph(masks=True), the default: module flag MASKS). Where every reader of a
forward output y after the forward is one int8_clamp_grad, or one act_grad of relu / relu6 / relu_n1_to_1, the
backward keeps a bit mask of y instead of y itself:
  clamp_mask:  y -> mask;  lo, hi       forward, right after y's producer: mask uint8[ceil(n/8)], bit i (byte i // 8,
                                        LSB first) of y's flat element i = 1 where lo < y_i < hi (hi null: no upper
                                        bound). int8 y: lo, hi the int8_clamp_grad's ints (integer compare); float
                                        y: relu (0, null), relu6 (0, 6), relu_n1_to_1 (-1, 1), float32 compare as
                                        act_grad (NaN: 0; +inf passes relu).
  mask_grad:   dy, mask -> dz           backward, in place of the masking op: dz = dy where the bit is set, else 0.0f
                                        (bit-identical to the op it replaces).
Where anything else reads y after the forward (a weight gradient's dequantize_slice / input, max_pool2d_grad,
softmax_grad, a dequantize, the loss), the ops stay as above: y lives anyway and a mask would cost extra.
meta["train"]["qas"]: enabled, rounding, master_copy, scales, master_copies, prng_states, prediction_float.
meta["train"]["phases"]: op counts of forward, loss (incl. the head's dequantize), backward, accumulate, update.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UnsupportedOpError, UserError
from tinytrain.stages import ops
from tinytrain.stages.ops import BATCH_ACCUMULATE, CLAMP_MASK, MASK_GRAD, STEP_COUNTER
from tinytrain.stages.model.ir import Graph, Op, Tensor, numel
# LOSSES is re-exported: plan_memory and others read autodiff.LOSSES.
from tinytrain.stages.train.losses import LOSSES, emit_losses, heads_from, loss_config, prepare_heads  # noqa: F401
from tinytrain.stages.ops.backward import Dequantizer, gather, insert_masks, mask_bounds, output_mask
from tinytrain.stages.quant.qas import BIAS_RANGE, ROUNDINGS, STATE_NAMES, WEIGHT_RANGE, seed_state
from tinytrain.stages.train.runtime_config import OPTIMIZER_DEFAULTS
from tinytrain.stages.planning.train_plan import TrainPlan

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
# Default of build_training_graph(masks=...): 1-bit activation masks for the backward (clamp_mask / mask_grad).
MASKS = True

# Forward ops the backward pass knows (the op registry's trait).
DIFFERENTIABLE = ops.DIFFERENTIABLE


@dataclass
class OptimizerSpec:
    """Which optimizer (changes the program: state tensors and update ops) and the default values of its
    runtime hyper-parameters (they do not change the program)."""

    kind: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = OPTIMIZER_DEFAULTS.momentum
    beta1: float = OPTIMIZER_DEFAULTS.beta1
    beta2: float = OPTIMIZER_DEFAULTS.beta2
    eps: float = OPTIMIZER_DEFAULTS.eps
    alpha: float = OPTIMIZER_DEFAULTS.alpha
    weight_decay: float = 0.0

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise UserError(f"unknown optimizer {self.kind!r}", hint=f"choose one of {', '.join(OPTIMIZERS)}")

    def runtime_defaults(self) -> dict[str, float]:
        keys = {"sgd": ("learning_rate", "weight_decay"),
                "momentum": ("learning_rate", "momentum", "weight_decay"),
                "adam": ("learning_rate", "beta1", "beta2", "eps", "weight_decay"),
                "rmsprop": ("learning_rate", "alpha", "eps", "weight_decay")}[self.kind]
        d = asdict(self)
        return {k: float(d[k]) for k in keys}


@dataclass
class QASOptions:
    """How int8 parameters update (config `train.qas`, DESIGN §6; formulas in stages/quant/qas.py). Ignored for float
    graphs."""

    enabled: bool = True
    rounding: str = "nearest"
    master_copy: bool = False

    def __post_init__(self):
        if self.rounding not in ROUNDINGS:
            raise UserError(f"unknown QAS rounding {self.rounding!r}", hint=f"choose one of {', '.join(ROUNDINGS)}")

    @classmethod
    def from_config(cls, cfg: Any) -> "QASOptions":
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        d = cfg.model_dump() if hasattr(cfg, "model_dump") else dict(cfg)
        return cls(bool(d.get("enabled", True)), str(d.get("rounding", "nearest")), bool(d.get("master_copy", False)))


class _Builder:
    def __init__(self, graph: Graph):
        self.g = graph
        self.ops: list[Op] = []

    def tensor(self, name: str, like: Tensor | list[int], role: str = "gradient", dtype: str = "float32",
               data: np.ndarray | None = None) -> str:
        shape = list(like.shape) if isinstance(like, Tensor) else list(like)
        if name in self.g.tensors:
            raise ValueError(f"tensor name {name!r} is taken")
        self.g.tensors[name] = Tensor(name, shape, dtype, role=role, data=data)
        return name

    def emit(self, type_: str, inputs: list[str | None], outputs: list[str], **attrs) -> None:
        self.ops.append(Op(type_, list(inputs), list(outputs), dict(attrs)))


def build_training_graph(graph: Graph, plan: TrainPlan, loss: str, optimizer: OptimizerSpec,
                         batch_size: int = 1, qas: QASOptions | None = None, masks: bool | None = None) -> Graph:
    """The training IR of `graph` (float32, or int8 from the quantize stage: then `qas` says how int8 parameters
    update; default QASOptions()). `masks` (default: the module's MASKS) saves 1-bit activation masks instead of
    activations that the backward only masks a gradient with (clamp_mask / mask_grad, see `_use_masks`)."""
    heads = heads_from(loss, list(graph.outputs))
    if int(batch_size) < 1:
        raise UserError(f"batch size must be >= 1 (got {batch_size})")
    batch_size = int(batch_size)
    int8 = False
    for i, op in enumerate(graph.ops):
        for name in op.inputs + op.outputs:
            if name is None:
                continue
            dt = graph.tensors[name].dtype
            if dt == "int8":
                int8 = True
            elif dt not in ("float32", "int32", "int64"):
                raise NotImplementedError(f"autodiff of {dt} tensors (op #{i} {op.type})")
    qas = qas or QASOptions()

    layers = plan.resolve(graph)
    g = Graph(tensors={k: copy.copy(t) for k, t in graph.tensors.items()}, ops=[], inputs=list(graph.inputs),
              outputs=[], meta=copy.deepcopy(graph.meta))
    b = _Builder(g)

    # Trained parameters: tensor -> trained input channels (weights) / True (biases). Shared tensors take the
    # widest slice any layer asks for.
    wk: dict[str, int] = {}
    bias_on: set[str] = set()
    for lay in layers:
        if lay.in_channels > 0:
            wk[lay.weight] = max(wk.get(lay.weight, 0), lay.in_channels)
        if lay.train_bias and lay.bias_tensor:
            bias_on.add(lay.bias_tensor)
    trained = set(wk) | bias_on
    # The layer that reads each trained parameter (QAS needs its input activation's scale for the bias).
    producers_of_param = {p: graph.ops[lay.op_index] for lay in layers
                          for p in (lay.weight, lay.bias_tensor) if p is not None}

    # ---- forward (+ loss head) ----------------------------------------------------------------------------
    fwd = [copy.deepcopy(op) for op in graph.ops]
    fwd, head_of = prepare_heads(g, fwd, heads)
    # Parameters of pruned outputs (not trained) get no gradient: they are not trained.
    read = {t for op in fwd for t in op.inputs if t is not None}
    wk = {p: k for p, k in wk.items() if p in read}
    bias_on &= read
    trained = set(wk) | bias_on
    for i, op in enumerate(fwd):
        if op.type not in DIFFERENTIABLE and op.type not in ops.CONVERSION_OPS:
            # A user error, not a crash: the model loads and quantizes, only training it needs this op's backward.
            raise UnsupportedOpError(op.type, op.source_index if op.source_index is not None else i,
                                     where="autodiff (no backward for this op yet)",
                                     hint=f"autodiff differentiates: {', '.join(DIFFERENTIABLE)}")
    b.ops.extend(fwd)

    needs: set[str] = set()  # activations that depend on a trained parameter
    op_needs: list[bool] = []
    for op in fwd:
        n = any(t is not None and (t in needs or t in trained) for t in op.inputs)
        op_needs.append(n)
        if n:
            needs.update(op.outputs)
    if not trained:
        raise UserError("the plan trains nothing", hint="name at least one layer's bias or weights")

    n_fwd = len(b.ops)
    contrib: dict[str, list[str]] = {}
    pgrads: dict[str, list[str]] = {}

    def share(t: str, i: int) -> str | None:
        """A name for op i's contribution to dL/dt, or None when t needs no gradient."""
        if t is None or t not in needs:
            return None
        name, k = f"grad/{t}#{i}", 1
        while name in g.tensors:  # the op reads t twice (mul(x, x), add(x, x)): one share per read
            name, k = f"grad/{t}#{i}.{k}", k + 1
        name = b.tensor(name, g.tensors[t])
        contrib.setdefault(t, []).append(name)
        return name

    def pshare(p: str, i: int, shape: list[int]) -> str:
        name = b.tensor(f"grad/{p}#{i}", shape)
        pgrads.setdefault(p, []).append(name)
        return name

    bb = _GraphBackward(b, share, pshare, wk, bias_on)
    lab, loss_t, head_in = emit_losses(b, heads, head_of, bb.deq, contrib)
    head = head_of[heads[0].name]
    n_loss = len(b.ops) - n_fwd
    g.inputs.append(lab)
    g.outputs = [loss_t]

    # ---- backward -----------------------------------------------------------------------------------------
    for i in range(len(fwd) - 1, -1, -1):
        op = fwd[i]
        if not op_needs[i]:
            continue
        if len(op.outputs) > 1:
            # a multi-output op (split; no fused activation): one gradient per output, None where none flows
            dys = [gather(bb, contrib, y) for y in op.outputs]
            if any(dys):
                ops.REGISTRY[op.type].backward(bb, op, i, dys)
            continue
        dy = gather(bb, contrib, op.outputs[0])
        if dy is None:
            continue  # its output does not reach the loss
        d = ops.REGISTRY[op.type]
        # the op module's emission (stages/ops/), shared with plan_memory's memory model
        d.backward(bb, op, i, output_mask(bb, d, op, dy))

    # One gradient per trained parameter.
    final: dict[str, str] = {}
    for p in sorted(trained, key=lambda n: list(g.tensors).index(n)):
        if not pgrads.get(p):
            raise UserError(f"trained tensor {p!r} does not reach the loss")
        final[p] = gather(bb, pgrads, p, like=pgrads[p][0])

    if batch_size > 1:
        for p, gname in final.items():
            acc = b.tensor(f"acc/{p}", g.tensors[gname], data=np.zeros(g.tensors[gname].shape, np.float32))
            b.emit(BATCH_ACCUMULATE.name, [acc, gname], [acc])
            final[p] = acc
    sample_ops = len(b.ops)

    # ---- updates ------------------------------------------------------------------------------------------
    kind = optimizer.kind
    refs = {f"{k}_ref": f"runtime.{k}" for k in optimizer.runtime_defaults()}
    common = dict(batch_size=batch_size, reset_grad=batch_size > 1, **refs)
    step = None
    if kind == "adam":
        step = b.tensor("opt/step", [], role="optimizer_state", dtype="int32", data=np.zeros((), np.int32))
        b.emit(STEP_COUNTER.name, [step], [step])
    state: list[str] = []
    masters: dict[str, str] = {}
    prngs: dict[str, str] = {}
    scales: dict[str, str] = {}
    for p, gname in final.items():
        gshape = g.tensors[gname].shape
        n = wk.get(p)
        attrs = dict(common)
        if n is not None and list(gshape) != list(g.tensors[p].shape):
            attrs["n"] = int(gshape[-1])

        def st(suffix: str, dtype: str = "float32", data: np.ndarray | None = None, shape=gshape) -> str:
            name = b.tensor(f"opt/{p}/{suffix}", list(shape), role="optimizer_state", dtype=dtype,
                            data=np.zeros(shape, np.float32) if data is None else data)
            state.append(name)
            return name
        if g.tensors[p].dtype in ("int8", "int32") and g.tensors[p].quant is not None:
            _emit_qas_update(b, g, p, gname, kind, attrs, step, st, qas, producers_of_param[p], wk, masters,
                             prngs, scales)
            continue
        states = [st(suffix) for suffix in STATE_NAMES[kind]]
        b.emit(ops.update_op(kind, qas=False), [p, gname, *states] + ([step] if kind == "adam" else []),
               [p, *states], **attrs)

    if (MASKS if masks is None else masks):
        added = _use_masks(b, n_fwd)
        n_fwd += added
        sample_ops += added
    g.ops = b.ops
    n_acc = len(final) if batch_size > 1 else 0
    defaults = optimizer.runtime_defaults()
    if prngs:
        defaults["seed"] = 0.0
    g.meta["train"] = {
        "loss": heads[0].loss if len(heads) == 1 else "multi",
        "heads": [{"output": h.name, "tensor": head_of[h.name], "loss": h.loss, "weight": h.weight}
                  for h in heads],
        "batch_size": batch_size,
        "optimizer": optimizer.kind,
        "runtime_defaults": defaults,
        "sample_ops": sample_ops,
        "loss_tensor": loss_t,
        "prediction": head,
        "label_input": lab,
        "trained": {p: {"gradient": final[p], "n": wk.get(p)} for p in final},
        "accumulators": [final[p] for p in final] if batch_size > 1 else [],
        "optimizer_state": ([step] if step else []) + state,
        "plan": plan.to_json(),
        "precision": "int8" if int8 else "float32",
        "phases": {"forward": n_fwd, "loss": n_loss, "backward": sample_ops - n_fwd - n_loss - n_acc,
                   "accumulate": n_acc, "update": len(b.ops) - sample_ops},
    }
    if int8:
        g.meta["train"]["qas"] = {"enabled": qas.enabled, "rounding": qas.rounding, "master_copy": qas.master_copy,
                                  "scales": scales, "master_copies": masters, "prng_states": prngs,
                                  "prediction_float": head_in}
    g.validate()
    return g


def _mask_bounds(g: Graph, op: Op, y: str) -> tuple | None:
    """(lo, hi) when op only masks a gradient with the forward output y (its second input), else None (a graph
    output or constant y is kept)."""
    if len(op.inputs) != 2 or op.inputs[1] != y or op.inputs[0] == y or y in g.outputs \
            or g.tensors[y].data is not None:
        return None
    return mask_bounds(op.type, op.attrs, g.tensors[y])


def _use_masks(b: _Builder, n_fwd: int) -> int:
    """Replace the saved activation y of every int8_clamp_grad / act_grad (relu, relu6, relu_n1_to_1) by a 1-bit
    mask, where those ops are all that reads y after the forward (ops[n_fwd:]: the loss, backward, updates): a
    `clamp_mask(y) -> mask/<y>` right after y's producer (uint8[ceil(n/8)], 1 where the gradient passes), and
    `mask_grad(dy, mask) -> dz` in place of the masking op. y then dies in the forward (1/8 of an int8 activation,
    1/32 of a float one). Where anything else reads y in the backward (a weight gradient's input, max_pool2d_grad,
    softmax_grad, a dequantize, the loss) y is kept anyway and the op is left as it is: a mask would cost extra.
    The masks are computed in the per-sample forward and read in the same sample's backward (batch > 1 runs the
    sample phase once per sample, masks included). Returns how many clamp_mask ops went into the forward.
    backward.insert_masks does it, on the memory model's abstract steps too."""
    g = b.g

    def mask_step(y: str, lo_hi: tuple) -> tuple[Op, str]:
        n = numel(g.tensors[y].shape)
        mask = b.tensor(f"mask/{y}", [(n + 7) // 8], role="activation", dtype="uint8")
        return Op(CLAMP_MASK.name, [y], [mask], {"lo": lo_hi[0], "hi": lo_hi[1]}), mask

    def mask_reader(old: Op, mask: str) -> Op:
        return Op(MASK_GRAD.name, [old.inputs[0], mask], list(old.outputs), {}, source_index=old.source_index)

    return insert_masks(b.ops, n_fwd, lambda op: (op.inputs, op.outputs), lambda j, y: _mask_bounds(g, b.ops[j], y),
                        mask_step, mask_reader)


class _GraphBackward:
    """The BackwardBuilder (stages/ops/backward.py) that writes the training IR: op modules emit through it."""

    def __init__(self, b: _Builder, share, param_grad, wk: dict[str, int], bias_on: set[str]):
        self.b, self._share, self._param_grad = b, share, param_grad
        self.g = b.g
        self._wk, self._bias_on = wk, bias_on
        self.deq = Dequantizer(self)

    def share(self, t: str | None, i: int) -> str | None:
        return self._share(t, i)

    def param_grad(self, p: str, i: int, shape: list[int]) -> str:
        return self._param_grad(p, i, shape)

    def real(self, t: str) -> str:
        return self.deq.real(t)

    def real_slice(self, x: str, k: int, depth: int | None) -> str:
        return self.deq.real_slice(x, k, depth)

    def emit(self, type_: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.b.emit(type_, inputs, outputs, **attrs)

    def gradient(self, name: str, like: str) -> str:
        return self.b.tensor(name, self.g.tensors[like])

    def copy(self, name: str, shape: list[int]) -> str:
        return self.b.tensor(name, shape, role="activation")

    def weight_channels(self, w: str) -> int:
        return self._wk.get(w, 0)

    def trains_bias(self, b: str | None) -> bool:
        return b is not None and b in self._bias_on


def _channel_scales(t: Tensor, channels: int) -> np.ndarray:
    sc = np.asarray(t.quant.scale, np.float64).reshape(-1)
    return np.broadcast_to(sc, (channels,)) if len(sc) == 1 else sc


def _emit_qas_update(b: _Builder, g: Graph, p: str, gname: str, kind: str, attrs: dict, step: str | None, st,
                     qas: QASOptions, layer: Op, wk: dict, masters: dict, prngs: dict, scales: dict) -> None:
    """One qas_<kind>_update of an int8 weight or int32 bias (semantics: stages/quant/qas.py)."""
    pt = g.tensors[p]
    is_weight = pt.dtype == "int8"
    if is_weight:
        axis = int(pt.quant.axis) if pt.quant.per_channel else ops.REGISTRY[layer.type].out_channel_axis
        scale = _channel_scales(pt, int(pt.shape[axis])).astype(np.float32)
        bounds = WEIGHT_RANGE
    else:
        x_t, w_t = g.tensors[layer.inputs[0]], g.tensors[layer.inputs[1]]
        if x_t.quant is None or w_t.quant is None:
            raise UserError(f"int32 bias {p!r} trains with QAS, but its layer's input or weights are not quantized")
        axis = 0
        # s_B = s_x · s_W[c]: the accumulator's scale, the product taken in double as TFLite's Prepare does.
        scale = (float(x_t.quant.scale[0]) * _channel_scales(w_t, int(pt.shape[0]))).astype(np.float32)
        bounds = BIAS_RANGE
    sname = b.tensor(f"qas/{p}/scale", [len(scale)], role="constant", data=scale)
    scales[p] = sname
    n = attrs.get("n")
    gshape = g.tensors[gname].shape
    ins, outs = [p, gname, sname], [p]
    for suffix in STATE_NAMES[kind]:
        name = st(suffix)
        ins.append(name)
        outs.append(name)
    if kind == "adam":
        ins.append(step)
    master = qas.master_copy and is_weight
    rounding = "nearest" if master else qas.rounding
    if master:
        sl = (Ellipsis,) if n is None else (Ellipsis, slice(0, int(n)))
        m = b.tensor(f"opt/{p}/master", gshape, role="optimizer_state",
                     data=np.ascontiguousarray(np.asarray(pt.data)[sl].astype(np.float32)))
        masters[p] = m
        ins.append(m)
        outs.append(m)
    extra: dict[str, Any] = {}
    if rounding == "stochastic":
        stream = len(prngs)
        r = st("prng", dtype="int32", data=np.array(seed_state(0, stream), np.uint32).view(np.int32).reshape(()),
               shape=[])
        prngs[p] = r
        ins.append(r)
        outs.append(r)
        extra = {"stream": stream, "seed_ref": "runtime.seed"}
    b.emit(ops.update_op(kind, qas=True), ins, outs, **attrs, qas=bool(qas.enabled), rounding=rounding, master=master,
           axis=axis, bounds=[int(bounds[0]), int(bounds[1])], **extra)


def _read_plan(ctx, graph: Graph) -> tuple[TrainPlan, str]:
    """The plan from sparse-plan's plan.json (TrainPlan JSON at top level or under "plan" / "train_plan"), or a
    full update when no sparse-plan artifacts were given."""
    import json

    try:
        folder = ctx.input_dir("sparse-plan")
    except KeyError:
        return TrainPlan.full(graph), "full (no sparse-plan input)"
    # train_plan.json holds the plan alone (the stage table declares it as autodiff's only sparse-plan input);
    # plan.json, with the budget and estimates, is the fallback for plans written by hand or older builds.
    path = folder / "train_plan.json"
    if not path.exists():
        path = folder / "plan.json"
    if not path.exists():
        raise UserError(f"sparse-plan produced no plan.json in {path.parent}")
    doc = json.loads(path.read_text())
    for cand in (doc, doc.get("plan"), doc.get("train_plan")):
        if isinstance(cand, dict) and isinstance(cand.get("layers"), list):
            return TrainPlan.from_json(cand), str(doc.get("scheme", "sparse-plan"))
    raise UserError(f"{path} holds no TrainPlan (a 'layers' list at the top level or under 'plan')",
                    hint='expected {"version": 1, "layers": [{"layer": 5, "bias": true, "weight_ratio": 0.125}]}')


def _planned_qas(ctx) -> dict | None:
    """The int8 update rule sparse-plan chose over train.qas because the requested one would erase most updates
    (stages/quant/update_check.py: stochastic rounding or a master copy; train_plan.json carries `qas` only then)."""
    import json

    try:
        path = ctx.input_dir("sparse-plan") / "train_plan.json"
    except KeyError:
        return None
    if not path.exists():
        return None
    q = json.loads(path.read_text()).get("qas")
    return q if isinstance(q, dict) else None


def _optimizer_from_config(opt: Any) -> OptimizerSpec:
    """train.optimizer (pipeline/spec.py OptimizerSpec, a dict or a kind) -> this module's OptimizerSpec; the
    spec's values become the runtime defaults (rho is RMSProp's alpha)."""
    if opt is None:
        return OptimizerSpec()
    if isinstance(opt, str):
        return OptimizerSpec(kind=opt)
    d = opt.model_dump() if hasattr(opt, "model_dump") else dict(opt)
    kw = {k: float(d[k]) for k in ("momentum", "beta1", "beta2", "eps") if k in d}
    if "rho" in d:
        kw["alpha"] = float(d["rho"])
    return OptimizerSpec(kind=d.get("kind", "sgd"), **kw)


def _fmt_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def summarize(tg: Graph) -> dict[str, Any]:
    """summary.json of the stage: ops by phase, trained parameters and the bytes training adds."""
    tr = tg.meta["train"]
    trained = {}
    for p, d in tr["trained"].items():
        gshape = tg.tensors[d["gradient"]].shape
        trained[p] = {"dtype": tg.tensors[p].dtype, "shape": list(tg.tensors[p].shape), "trained_shape": list(gshape),
                      "elements": numel(gshape)}
    qas = tr.get("qas")
    masters = set((qas or {}).get("master_copies", {}).values())
    grads = [t for t in tg.tensors.values() if t.role == "gradient"]
    return {
        "precision": tr.get("precision", "float32"),
        "qas": qas and {k: qas[k] for k in ("enabled", "rounding", "master_copy")},
        "loss": tr["loss"], "optimizer": tr["optimizer"], "batch_size": tr["batch_size"],
        "ops": len(tg.ops), "ops_by_phase": tr["phases"],
        "op_types": {t: sum(1 for op in tg.ops if op.type == t) for t in sorted({op.type for op in tg.ops})},
        "trained": trained,
        "trained_params": sum(v["elements"] for v in trained.values()),
        "parameter_gradient_bytes": sum(tg.tensors[d["gradient"]].nbytes for d in tr["trained"].values()),
        "gradient_tensor_bytes": sum(t.nbytes for t in grads),
        "optimizer_state_bytes": sum(tg.tensors[n].nbytes for n in tr["optimizer_state"]),
        "master_copy_bytes": sum(tg.tensors[n].nbytes for n in masters),
        "accumulator_bytes": sum(tg.tensors[n].nbytes for n in tr["accumulators"]),
        "loss_scale": tr.get("loss_scale"),
    }


def summary_line(s: dict[str, Any]) -> str:
    ph = s["ops_by_phase"]
    mode = "fp32"
    if s["precision"] == "fp16-mixed":
        ls = s.get("loss_scale") or {}
        mode = f"fp16-mixed (fp16 activations and gradients, fp32 weights), {ls.get('kind', '?')} loss scale " \
               f"{ls.get('init_scale', 0):g}"
    elif s["precision"] == "int8":
        q = s["qas"]
        mode = ("int8+QAS" if q["enabled"] else "int8 (no QAS)") + f", {q['rounding']}" \
            + (", master copy" if q["master_copy"] else "")
    mem = s.get("memory_vs_fp32")
    if mem:
        mode += (f"; arena {mem['arena_bytes'] / 1024:.1f} KB vs fp32 {mem['arena_bytes_fp32'] / 1024:.1f} KB, saved "
                 f"activations {mem['saved_activation_bytes'] / 1024:.1f} KB vs "
                 f"{mem['saved_activation_bytes_fp32'] / 1024:.1f} KB")
    return (f"train graph: {ph['forward']} fwd + {ph['loss'] + ph['backward'] + ph['accumulate']} bwd + "
            f"{ph['update']} update ops, {_fmt_count(s['trained_params'])} trained params, {mode}")


def run(ctx) -> Any:
    """Stage `autodiff`: the IR of quantize (int8, or float when quantization is off) + sparse-plan's plan.json
    -> train_graph.json, train_tensors.npz, train_graph.txt, summary.json."""
    import json

    from tinytrain.pipeline.contract import StageResult

    src = None
    for stage in ("quantize", "load"):
        try:
            src = ctx.input_dir(stage)
            break
        except KeyError:
            continue
    if src is None:
        raise UserError("autodiff needs the IR of quantize (or load)")
    from tinytrain.stages.quant import rescale

    # with the wider scales sparse-plan chose for trained int8 weights that would saturate (train_plan.json)
    graph = rescale.planned(Graph.load(src), ctx.inputs.get("sparse-plan/train_plan.json"))
    cfg = ctx.config
    plan, scheme = _read_plan(ctx, graph)
    tg = build_training_graph(graph, plan, loss_config(cfg),
                              _optimizer_from_config(cfg.get("train.optimizer")),
                              int(cfg.get("train.batch_size") or 1),
                              QASOptions.from_config(_planned_qas(ctx) or cfg.get("train.qas")))
    memory = None
    if cfg.get("train.precision") == "fp16-mixed":
        from tinytrain.stages.train.fp16_mixed import memory_against_fp32, to_fp16_mixed
        reorder = cfg.get("train.reorder.enabled")
        reorder = True if reorder is None else bool(reorder)
        fp32 = copy.deepcopy(tg)
        tg = to_fp16_mixed(tg, cfg.get("train.loss_scale"), reorder)
        memory = memory_against_fp32(fp32, tg, reorder)
        (ctx.out_dir / "precision.json").write_text(json.dumps(memory, indent=1, sort_keys=True) + "\n")
    tg.save(ctx.out_dir, stem="train_")
    (ctx.out_dir / "train_graph.txt").write_text(tg.to_text())
    summ = summarize(tg)
    summ["plan_scheme"] = scheme
    if memory is not None:
        summ["memory_vs_fp32"] = memory
    (ctx.out_dir / "summary.json").write_text(json.dumps(summ, indent=2, sort_keys=True) + "\n")
    ph = summ["ops_by_phase"]
    return StageResult(summary=summary_line(summ),
                       metrics={"ops": len(tg.ops), "backward_ops": ph["loss"] + ph["backward"],
                                "update_ops": ph["update"], "trained_params": summ["trained_params"],
                                "precision": summ["precision"],
                                "optimizer_state_bytes": summ["optimizer_state_bytes"]})
