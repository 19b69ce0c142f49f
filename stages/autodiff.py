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
  act_grad:                      dy, y -> dz;                act (mask from the forward output y)
  conv2d_grad_input:             dz, w -> dx;                the forward's geometry attrs
  conv2d_grad_weight:            dz, x -> dw;                geometry, in_channels (k: dw is w[..., :k]), w_shape
  depthwise_conv2d_grad_input:   dz, w -> dx;                geometry, depth_multiplier
  depthwise_conv2d_grad_weight:  dz, x -> dw;                geometry, in_channels (dw is w[..., :k·M])
  fully_connected_grad_input:    dz, w -> dx
  fully_connected_grad_weight:   dz, x -> dw;                in_channels
  bias_grad:                     dz -> db
  add_grad:                      dz -> da?, db?              (unbroadcast to each operand's shape)
  average_pool2d_grad:           dz -> dx;                   the forward's pooling attrs
  max_pool2d_grad:               dz, x -> dx;                the forward's pooling attrs
  mean_grad:                     dy, axes -> dx
  reshape_grad, pad_grad:        dy (, paddings) -> dx
  concatenation_grad:            dz -> dx0?, dx1?, ...;      axis, sizes
  softmax_grad:                  dy, y -> dx;                beta
  grad_accumulate:               g0, g1, ... -> g            (a tensor read by several ops: onert's
                                                               BackPropAccumulator)
Losses: softmax_ce_loss(logits, labels:int32[1]) -> loss:f32[], dlogits  (fused, stable; the model's final
softmax is dropped from the training forward); mse_loss(y, target) -> loss, dy (mean over the sample's elements).
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

Float graphs only for now: int8 (QAS, DESIGN §6) raises NotImplementedError.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.ir import Graph, Op, Tensor
from tinytrain.stages.train_plan import TrainPlan

LOSSES = ("cross_entropy", "mse")
OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")

# Forward ops the backward pass knows.
DIFFERENTIABLE = ("conv2d", "depthwise_conv2d", "fully_connected", "add", "average_pool2d", "max_pool2d", "mean",
                  "reshape", "pad", "concatenation", "relu", "relu6", "softmax")


@dataclass
class OptimizerSpec:
    """Which optimizer (changes the program: state tensors and update ops) and the default values of its
    runtime hyper-parameters (they do not change the program)."""

    kind: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    alpha: float = 0.99
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
                         batch_size: int = 1) -> Graph:
    if loss not in LOSSES:
        raise UserError(f"unknown loss {loss!r}", hint=f"choose one of {', '.join(LOSSES)}")
    if int(batch_size) < 1:
        raise UserError(f"batch size must be >= 1 (got {batch_size})")
    batch_size = int(batch_size)
    if len(graph.outputs) != 1:
        raise UserError(f"training needs a model with one output (this one has {len(graph.outputs)})")
    for i, op in enumerate(graph.ops):
        for name in op.inputs + op.outputs:
            if name is not None and graph.tensors[name].dtype not in ("float32", "int32", "int64"):
                raise NotImplementedError(f"autodiff of {graph.tensors[name].dtype} tensors (op #{i} {op.type}): "
                                          "int8 training (QAS) is not implemented yet")

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

    # ---- forward (+ loss head) ----------------------------------------------------------------------------
    fwd = [copy.deepcopy(op) for op in graph.ops]
    head = graph.outputs[0]
    producers = {t: i for i, op in enumerate(fwd) for t in op.outputs}
    if loss == "cross_entropy" and head in producers and fwd[producers[head]].type == "softmax":
        # The fused loss wants logits; the softmax exists only for inference.
        sm = fwd.pop(producers[head])
        if float(sm.attrs.get("beta", 1.0)) != 1.0:
            raise NotImplementedError("cross-entropy on a softmax with beta != 1")
        head = sm.inputs[0]
    for op in fwd:
        if op.type not in DIFFERENTIABLE and op.type not in ("quantize", "dequantize"):
            raise NotImplementedError(f"backward of op {op.type!r}")
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

    head_t = g.tensors[head]
    loss_t = b.tensor("train/loss", [], role="output")
    if loss == "cross_entropy":
        lab = b.tensor("train/labels", [1], role="input", dtype="int32")
        contrib = {head: [b.tensor(f"grad/{head}", head_t)]}
        b.emit("softmax_ce_loss", [head, lab], [loss_t, contrib[head][0]])
    else:
        lab = b.tensor("train/target", head_t, role="input")
        contrib = {head: [b.tensor(f"grad/{head}", head_t)]}
        b.emit("mse_loss", [head, lab], [loss_t, contrib[head][0]])
    g.inputs.append(lab)
    g.outputs = [loss_t]

    # ---- backward -----------------------------------------------------------------------------------------
    pgrads: dict[str, list[str]] = {}

    def gather(t: str) -> str | None:
        parts = contrib.get(t)
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        out = b.tensor(f"grad/{t}", g.tensors[t])
        b.emit("grad_accumulate", parts, [out])
        return out

    def share(t: str, i: int) -> str | None:
        """A name for op i's contribution to dL/dt, or None when t needs no gradient."""
        if t is None or t not in needs:
            return None
        name = b.tensor(f"grad/{t}#{i}", g.tensors[t])
        contrib.setdefault(t, []).append(name)
        return name

    def pshare(p: str, i: int, shape: list[int]) -> str:
        name = b.tensor(f"grad/{p}#{i}", shape)
        pgrads.setdefault(p, []).append(name)
        return name

    for i in range(len(fwd) - 1, -1, -1):
        op = fwd[i]
        if not op_needs[i]:
            continue
        dy = gather(op.outputs[0])
        if dy is None:
            continue  # its output does not reach the loss
        a = dict(op.attrs)
        y = op.outputs[0]
        act = a.get("act", "none")
        if act != "none":
            dz = b.tensor(f"grad/{y}:pre", g.tensors[y])
            b.emit("act_grad", [dy, y], [dz], act=act)
        else:
            dz = dy
        geo = {k: v for k, v in a.items() if k != "act"}
        t = op.type
        if t in ("conv2d", "depthwise_conv2d", "fully_connected"):
            x, w = op.inputs[0], op.inputs[1]
            bias = op.inputs[2] if len(op.inputs) > 2 else None
            wt = g.tensors[w]
            if w in wk:
                k = wk[w]
                shape = list(wt.shape)
                shape[-1] = k * (shape[-1] // g.tensors[x].shape[-1]) if t == "depthwise_conv2d" else k
                b.emit(f"{t}_grad_weight", [dz, x], [pshare(w, i, shape)], **geo, in_channels=k,
                       w_shape=list(wt.shape))
            if bias in bias_on:
                b.emit("bias_grad", [dz], [pshare(bias, i, g.tensors[bias].shape)])
            dx = share(x, i)
            if dx:
                b.emit(f"{t}_grad_input", [dz, w], [dx], **geo)
        elif t == "add":
            outs = [share(op.inputs[0], i), share(op.inputs[1], i)]
            b.emit("add_grad", [dz], [o for o in outs if o], which=[j for j, o in enumerate(outs) if o])
        elif t == "average_pool2d":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("average_pool2d_grad", [dz], [dx], **geo)
        elif t == "max_pool2d":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("max_pool2d_grad", [dz, op.inputs[0]], [dx], **geo)
        elif t == "mean":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("mean_grad", [dz, op.inputs[1]], [dx], **geo)
        elif t == "reshape":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("reshape_grad", [dz], [dx])
        elif t == "pad":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("pad_grad", [dz, op.inputs[1]], [dx])
        elif t == "concatenation":
            ins = [n for n in op.inputs if n is not None]
            axis = int(a.get("axis", -1)) % len(g.tensors[y].shape)
            outs = [share(n, i) for n in ins]
            b.emit("concatenation_grad", [dz], [o for o in outs if o], axis=axis,
                   sizes=[int(g.tensors[n].shape[axis]) for n in ins], which=[j for j, o in enumerate(outs) if o])
        elif t in ("relu", "relu6"):
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("act_grad", [dz, y], [dx], act=t)
        elif t == "softmax":
            dx = share(op.inputs[0], i)
            if dx:
                b.emit("softmax_grad", [dz, y], [dx], beta=float(a.get("beta", 1.0)))
        else:
            raise NotImplementedError(f"backward of op {t!r}")

    # One gradient per trained parameter.
    final: dict[str, str] = {}
    for p in sorted(trained, key=lambda n: list(g.tensors).index(n)):
        parts = pgrads.get(p, [])
        if not parts:
            raise UserError(f"trained tensor {p!r} does not reach the loss")
        if len(parts) == 1:
            final[p] = parts[0]
        else:
            final[p] = b.tensor(f"grad/{p}", g.tensors[parts[0]])
            b.emit("grad_accumulate", parts, [final[p]])

    if batch_size > 1:
        for p, gname in final.items():
            acc = b.tensor(f"acc/{p}", g.tensors[gname], data=np.zeros(g.tensors[gname].shape, np.float32))
            b.emit("batch_accumulate", [acc, gname], [acc])
            final[p] = acc
    sample_ops = len(b.ops)

    # ---- updates ------------------------------------------------------------------------------------------
    kind = optimizer.kind
    refs = {f"{k}_ref": f"runtime.{k}" for k in optimizer.runtime_defaults()}
    common = dict(batch_size=batch_size, reset_grad=batch_size > 1, **refs)
    step = None
    if kind == "adam":
        step = b.tensor("opt/step", [], role="optimizer_state", dtype="int32", data=np.zeros((), np.int32))
        b.emit("step_counter", [step], [step])
    state: list[str] = []
    for p, gname in final.items():
        gshape = g.tensors[gname].shape
        n = wk.get(p)
        attrs = dict(common)
        if n is not None and list(gshape) != list(g.tensors[p].shape):
            attrs["n"] = int(gshape[-1])

        def st(suffix: str) -> str:
            name = b.tensor(f"opt/{p}/{suffix}", gshape, role="optimizer_state",
                            data=np.zeros(gshape, np.float32))
            state.append(name)
            return name
        if kind == "sgd":
            b.emit("sgd_update", [p, gname], [p], **attrs)
        elif kind == "momentum":
            buf = st("momentum")
            b.emit("momentum_update", [p, gname, buf], [p, buf], **attrs)
        elif kind == "adam":
            m, v = st("m"), st("v")
            b.emit("adam_update", [p, gname, m, v, step], [p, m, v], **attrs)
        else:
            sq = st("square_avg")
            b.emit("rmsprop_update", [p, gname, sq], [p, sq], **attrs)

    g.ops = b.ops
    g.meta["train"] = {
        "loss": loss,
        "batch_size": batch_size,
        "optimizer": optimizer.kind,
        "runtime_defaults": optimizer.runtime_defaults(),
        "sample_ops": sample_ops,
        "loss_tensor": loss_t,
        "prediction": head,
        "label_input": lab,
        "trained": {p: {"gradient": final[p], "n": wk.get(p)} for p in final},
        "accumulators": [final[p] for p in final] if batch_size > 1 else [],
        "optimizer_state": ([step] if step else []) + state,
        "plan": plan.to_json(),
    }
    g.validate()
    return g


def run(ctx) -> Any:
    """Stage entry (until sparse-plan exists the plan comes from the config: `train.update` as a TrainPlan JSON
    document, or absent for a full update)."""
    from tinytrain.pipeline.contract import StageResult

    src = None
    for stage in ("quantize", "load"):
        try:
            src = ctx.input_dir(stage)
            break
        except KeyError:
            continue
    if src is None:
        raise UserError("autodiff needs the IR of quantize or load")
    graph = Graph.load(src)
    cfg = ctx.config
    upd = cfg.get("train.update")
    plan = TrainPlan.from_json(upd) if isinstance(upd, dict) and "layers" in upd else TrainPlan.full(graph)
    opt = cfg.get("train.optimizer") or "sgd"
    opt_spec = OptimizerSpec(kind=opt if isinstance(opt, str) else getattr(opt, "kind", "sgd"))
    tg = build_training_graph(graph, plan, cfg.get("train.loss") or "cross_entropy", opt_spec,
                              int(cfg.get("train.batch_size") or 1))
    tg.save(ctx.out_dir, stem="train_")
    (ctx.out_dir / "train_graph.txt").write_text(tg.to_text())
    n_grad = sum(1 for op in tg.ops if "grad" in op.type or op.type.endswith("_loss"))
    return StageResult(summary=f"{len(tg.ops)} ops ({n_grad} backward), {len(tg.meta['train']['trained'])} "
                               f"trained tensors", metrics={"ops": len(tg.ops), "backward_ops": n_grad})
