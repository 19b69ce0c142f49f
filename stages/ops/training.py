"""Ops only training graphs hold (stages/autodiff.py emits them): gradient plumbing, 1-bit masks, losses and
updates; the C of the losses, accumulations and updates (gen: codegen's generator)."""

from __future__ import annotations

import math

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.c_emit.literals import ACT_ENUM, CodegenError, flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.quant.qas import STATE_COUNT
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.ops.base import OpDef
from tinytrain.stages.ops.train_kernels import float_update, qas_update, run_batch_accumulate, run_step_counter

# runtime value -> field of the firmware's runtime config (tt_cfg), read by the update calls
RUNTIME_FIELDS = {"learning_rate": "learning_rate", "momentum": "momentum", "beta1": "beta1", "beta2": "beta2",
                  "eps": "eps", "alpha": "alpha", "weight_decay": "weight_decay"}


# ---- C (gen: codegen's generator)

def _c_act_grad(gen, op: Op) -> list[str]:
    dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    n = numel(gen.g.tensors[dy].shape)
    if fp16_io.is_f16(gen, dy) or gen.g.tensors[dx].dtype == "float16":   # fp16-mixed: fp16 dy and / or dx
        return [f"tt_act_grad_f16({n}, {ACT_ENUM[op.attrs['act']]}, {fp16_io.pair(gen, dy)}, {fp16_io.pair(gen, y)}, "
                f"{fp16_io.pair(gen, dx, True)});"]
    if y in gen.fused:   # fp16-mixed: the saved fp16 output itself (planning/fp16_memory.fused_widen)
        return [f"tt_act_grad_hy_f32({n}, {ACT_ENUM[op.attrs['act']]}, {gen.loc(dy)}, {gen.loc(gen.fused[y])}, "
                f"{gen.loc(dx)});"]
    return [f"tt_act_grad_f32({n}, {ACT_ENUM[op.attrs['act']]}, {gen.loc(dy)}, {gen.loc(y)}, {gen.loc(dx)});"]


def _c_int8_clamp_grad(gen, op: Op) -> list[str]:
    dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    n = numel(gen.g.tensors[dy].shape)
    return [f"tt_int8_clamp_grad_f32({n}, {int(op.attrs['lo'])}, {int(op.attrs['hi'])}, {gen.loc(dy)}, "
            f"{gen.loc(y)}, {gen.loc(dx)});"]


def _c_clamp_mask(gen, op: Op) -> list[str]:
    """autodiff's 1-bit mask of a forward output (kernels_c/tt_mask.h): bit i = lo < y[i] < hi."""
    y, mask = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[y].shape)
    lo, hi = op.attrs["lo"], op.attrs.get("hi")
    if gen.is_int8(y):
        return [f"tt_clamp_mask_s8({n}, {int(lo)}, {int(hi)}, {gen.loc(y)}, {gen.loc(mask)});"]
    fn = "tt_clamp_mask_hy" if fp16_io.is_f16(gen, y) else "tt_clamp_mask_f32"   # fp16-mixed: y widened as read
    return [f"{fn}({n}, {flit(lo)}, {flit(math.inf if hi is None else hi)}, {fp16_io.loc(gen, y)}, "
            f"{gen.loc(mask)});"]


def _c_mask_grad(gen, op: Op) -> list[str]:
    """dz = dy where the mask bit is set (in place over dy when the plan shares their buffer)."""
    dy, mask, dz = op.inputs[0], op.inputs[1], op.outputs[0]
    n = numel(gen.g.tensors[dy].shape)
    if fp16_io.is_f16(gen, dy) or fp16_io.is_f16(gen, dz):   # fp16-mixed: fp16 dy and / or dz
        return [f"tt_mask_grad_f16({n}, 0, {gen.loc(mask)}, {fp16_io.pair(gen, dy)}, {fp16_io.pair(gen, dz, True)});"]
    return [f"tt_mask_grad_f32({n}, 0, {gen.loc(mask)}, {gen.loc(dy)}, {gen.loc(dz)});"]


def _c_bias_grad(gen, op: Op) -> list[str]:
    dz, db = op.inputs[0], op.outputs[0]
    c = gen.g.tensors[dz].shape[-1]
    rows = numel(gen.g.tensors[dz].shape) // c
    fn = "tt_bias_grad_hy_f32" if fp16_io.is_f16(gen, dz) else "tt_bias_grad_f32"   # fp16-mixed: dz widened
    return [f"{fn}({rows}, {c}, {fp16_io.loc(gen, dz)}, {gen.loc(db)});"]


def _c_grad_accumulate(gen, op: Op) -> list[str]:
    y = op.outputs[0]
    n = numel(gen.g.tensors[y].shape)
    ptrs = gen.uid("tt_g")
    if any(fp16_io.is_f16(gen, t) for t in op.inputs) or gen.g.tensors[y].dtype == "float16":
        # fp16-mixed (OpDef.fp16_operands: every share / fp16_output): each share's pointer of its type, the other 0
        hs = [fp16_io.is_f16(gen, t) for t in op.inputs]
        xf = ", ".join("(const float *)0" if h else gen.loc(t) for t, h in zip(op.inputs, hs))
        xh = ", ".join(fp16_io.loc(gen, t) if h else "(const uint16_t *)0" for t, h in zip(op.inputs, hs))
        return [f"{{ const float *const {ptrs}f[{len(op.inputs)}] = {{{xf}}};",
                f"  const uint16_t *const {ptrs}h[{len(op.inputs)}] = {{{xh}}};",
                f"  tt_sum_f16({len(op.inputs)}, {ptrs}f, {ptrs}h, {n}, {fp16_io.pair(gen, y, True)}); }}"]
    return [f"{{ const float *const {ptrs}[{len(op.inputs)}] = {{{', '.join(gen.loc(t) for t in op.inputs)}}};",
            f"  tt_sum_f32({len(op.inputs)}, {ptrs}, {n}, {gen.loc(y)}); }}"]


def _c_batch_accumulate(gen, op: Op) -> list[str]:
    acc, g = op.inputs
    n = numel(gen.g.tensors[acc].shape)
    return [f"tt_accumulate_f32({n}, {gen.loc(acc)}, {gen.loc(g)});"]


def loss_call(op_type: str, shape: list[int], pred: str, target: str, target_dtype: str, offset: int, grad: str,
              result: str, delta: float | None = None) -> list[str]:
    """C lines computing `result = loss` and the gradient `grad` of loss op `op_type` on a prediction `pred` of
    `shape`, reading the targets at `target` + `offset` (a float class index for cross-entropy on a float target
    row: several heads). Shared by the training step (the ops' emitters below) and codegen's evaluation of heads."""
    from tinytrain.stages.train.losses import HUBER_DELTA

    rows, per = (int(shape[0]), numel(shape[1:])) if len(shape) > 1 else (1, numel(shape))
    tgt = f"{target} + {offset}" if offset else target
    if op_type == "softmax_ce_loss":
        depth = int(shape[-1])
        if target_dtype == "int32":
            return [f"{result} = tt_softmax_cross_entropy_f32({numel(shape) // depth}, {depth}, {pred}, {tgt}, "
                    f"{grad});"]
        if numel(shape) != depth:
            raise CodegenError(f"softmax_ce_loss on a float target row: one row of logits, not {list(shape)}")
        return [f"{{ const int32_t tt_lab = (int32_t)({target}[{offset}]);",
                f"  {result} = tt_softmax_cross_entropy_f32(1, {depth}, {pred}, &tt_lab, {grad}); }}"]
    if op_type == "mse_loss":
        return [f"{result} = tt_mse_f32({rows}, {per}, {pred}, {tgt}, {grad});"]
    if op_type == "bce_logits_loss":
        return [f"{result} = tt_bce_logits_f32({rows}, {per}, {pred}, {tgt}, {grad});"]
    if op_type == "huber_loss":
        d = HUBER_DELTA if delta is None else delta
        return [f"{result} = tt_huber_f32({rows}, {per}, {flit(d)}, {pred}, {tgt}, {grad});"]
    raise CodegenError(f"no C kernel for loss op {op_type}")


def _c_loss(gen, op: Op) -> list[str]:
    """A loss op (stages/train/losses.py): its kernel on the head's slice of the target (attr offset: several heads),
    then the head's weight (attr weight) on loss and gradient. Single-head ops have neither attr and keep their C.
    mse: grad_ops.mse_loss's dy order (bit-exact); the loss sums sequentially (numpy sums pairwise from 8 elements
    on, so the loss may differ in the last ulp for K >= 8)."""
    y, t = op.inputs
    loss, dy = op.outputs
    ys, ts = gen.g.tensors[y].shape, gen.g.tensors[t].shape
    off = op.attrs.get("offset")
    if off is None:  # one head: the target tensor is exactly this head's
        if op.type == "softmax_ce_loss":
            depth = ys[-1]
            if numel(ys) // depth != numel(ts):
                raise CodegenError(f"softmax_ce_loss: {numel(ys) // depth} rows of logits for {numel(ts)} label(s): "
                                   "not a classifier head")
        elif numel(ts) != numel(ys):
            raise CodegenError(f"{op.type}: target {t!r} {ts} does not match the prediction {ys}")
    lines = loss_call(op.type, ys, gen.loc(y), gen.loc(t), gen.g.tensors[t].dtype, int(off or 0), gen.loc(dy),
                      f"{gen.loc(loss)}[0]", op.attrs.get("delta"))
    if "weight" in op.attrs:
        lines.append(f"{gen.loc(loss)}[0] = tt_loss_weight_f32({numel(ys)}, {flit(float(op.attrs['weight']))}, "
                     f"{gen.loc(loss)}[0], {gen.loc(dy)});")
    return lines


def _c_loss_sum(gen, op: Op) -> list[str]:
    # losses.loss_sum: 0 + l0 + l1 + ... in head order, float32.
    out = f"{gen.loc(op.outputs[0])}[0]"
    return [f"{out} = 0.0f;"] + [f"{out} += {gen.loc(t)}[0];" for t in op.inputs]


# ---- updates

def _rt(gen, op: Op, key: str) -> str:
    ref = op.attrs.get(f"{key}_ref")
    if ref is None:
        if key == "weight_decay":
            return "0.0f"
        return flit(gen.meta["runtime_defaults"][key])
    name = ref.split(".", 1)[1] if ref.startswith("runtime.") else ref
    if name not in RUNTIME_FIELDS:
        raise CodegenError(f"runtime value {name!r} is not in runtime.bin")
    return f"tt_cfg.{RUNTIME_FIELDS[name]}"


def _c_reset(gen, op: Op, gname: str) -> list[str]:
    if op.attrs.get("reset_grad"):
        return [f"memset({gen.loc(gname)}, 0, {numel(gen.g.tensors[gname].shape) * 4});"]
    return []


def _c_float_update(gen, op: Op, body) -> list[str]:
    p, gname = op.inputs[0], op.inputs[1]
    rows, cols, n = gen.trained_slice(p, gname)
    rows = gen.chunk_rows or rows
    sl = gen.uid("tt_sl")
    gen.globals.append(f"static const tt_slice {sl} = {{{rows}, {cols}, {n}}};")
    scale = flit(1.0 / float(op.attrs.get("batch_size", 1)))
    return body(sl, scale) + _c_reset(gen, op, gname)


def _c_sgd_update(gen, op: Op) -> list[str]:
    p, g = op.inputs[0], op.inputs[1]
    return _c_float_update(gen, op, lambda sl, sc: [
        f"{{ const tt_sgd_params pp = {{{_rt(gen, op, 'learning_rate')}, {sc}, {_rt(gen, op, 'weight_decay')}}};",
        f"  tt_sgd_f32(&{sl}, &pp, {gen.ploc(p)}, {gen.ploc(g)}); }}"])


def _c_momentum_update(gen, op: Op) -> list[str]:
    p, g, buf = op.inputs[:3]
    return _c_float_update(gen, op, lambda sl, sc: [
        f"{{ const tt_momentum_params pp = {{{_rt(gen, op, 'learning_rate')}, {_rt(gen, op, 'momentum')}, {sc}, "
        f"{_rt(gen, op, 'weight_decay')}}};",
        f"  tt_momentum_f32(&{sl}, &pp, {gen.ploc(p)}, {gen.ploc(g)}, {gen.ploc(buf)}); }}"])


def _c_adam_update(gen, op: Op) -> list[str]:
    p, g, m, v, step = op.inputs[:5]
    return _c_float_update(gen, op, lambda sl, sc: [
        "{ tt_adam_params pp;",
        f"  tt_adam_prepare((double){_rt(gen, op, 'learning_rate')}, (double){_rt(gen, op, 'beta1')}, "
        f"(double){_rt(gen, op, 'beta2')}, (double){_rt(gen, op, 'eps')}, {gen.ploc(step)}[0], {sc}, "
        f"{_rt(gen, op, 'weight_decay')}, &pp);",
        f"  tt_adam_f32(&{sl}, &pp, {gen.ploc(p)}, {gen.ploc(g)}, {gen.ploc(m)}, {gen.ploc(v)}); }}"])


def _c_rmsprop_update(gen, op: Op) -> list[str]:
    p, g, sq = op.inputs[:3]
    return _c_float_update(gen, op, lambda sl, sc: [
        f"{{ const tt_rmsprop_params pp = {{{_rt(gen, op, 'learning_rate')}, {_rt(gen, op, 'alpha')}, "
        f"(float)(1.0 - (double){_rt(gen, op, 'alpha')}), {_rt(gen, op, 'eps')}, {sc}, "
        f"{_rt(gen, op, 'weight_decay')}}};",
        f"  tt_rmsprop_f32(&{sl}, &pp, {gen.ploc(p)}, {gen.ploc(g)}, {gen.ploc(sq)}); }}"])


def _c_step_counter(gen, op: Op) -> list[str]:
    return [f"{gen.loc(op.inputs[0])}[0] += 1;"]


def _c_qas(gen, op: Op, kind: str) -> list[str]:
    """qas_<kind>_update: one tt_qas_update call (stages/quant/qas.py has the semantics)."""
    a = op.attrs
    p, gname, scale = op.inputs[:3]
    ns = STATE_COUNT[kind]
    states = op.inputs[3:3 + ns]
    pos = 3 + ns
    step = None
    if kind == "adam":
        step = op.inputs[pos]
        pos += 1
    master = None
    if a.get("master"):
        master = op.inputs[pos]
        pos += 1
    rng = op.inputs[pos] if a.get("rounding") == "stochastic" and master is None else None
    pt = gen.g.tensors[p]
    rows, cols, n = gen.trained_slice(p, gname)
    axis = int(a["axis"]) % max(len(pt.shape), 1)
    if len(pt.shape) <= 1 or axis == len(pt.shape) - 1:
        rpc = 0
    elif axis == 0:
        rpc = rows // pt.shape[0]
    else:
        raise CodegenError(f"QAS scale along axis {axis} of {pt.shape}")
    sc_count = numel(gen.g.tensors[scale].shape)
    if gen.chunk_rows is not None:
        if rpc <= 0:
            raise CodegenError(f"streamed QAS update of {p}: scales not along the output channels")
        rows = gen.chunk_rows
    lo, hi = a["bounds"]
    kinds = {"sgd": "TT_OPT_SGD", "momentum": "TT_OPT_MOMENTUM", "adam": "TT_OPT_ADAM",
             "rmsprop": "TT_OPT_RMSPROP"}
    rounding = "TT_ROUND_STOCHASTIC" if a.get("rounding") == "stochastic" else "TT_ROUND_NEAREST"
    wd = _rt(gen, op, "weight_decay") if "weight_decay_ref" in a else "0.0f"
    lines = ["{ tt_qas_params pp;",
             "  memset(&pp, 0, sizeof pp);",
             f"  pp.kind = {kinds[kind]}; pp.qas = {1 if a.get('qas', True) else 0}; pp.rounding = {rounding};",
             f"  pp.lo = {'INT32_MIN' if int(lo) == -(1 << 31) else int(lo)}; pp.hi = {int(hi)};",
             f"  pp.batch_scale = {flit(1.0 / float(a.get('batch_size', 1)))}; "
             f"pp.lr = {_rt(gen, op, 'learning_rate')}; pp.weight_decay = {wd};"]
    if kind == "momentum":
        lines.append(f"  pp.momentum = {_rt(gen, op, 'momentum')};")
    elif kind == "adam":
        lines += ["  { tt_adam_params ap;",
                  f"    tt_adam_prepare((double){_rt(gen, op, 'learning_rate')}, (double){_rt(gen, op, 'beta1')}, "
                  f"(double){_rt(gen, op, 'beta2')}, (double){_rt(gen, op, 'eps')}, {gen.ploc(step)}[0], 1.0f, "
                  "0.0f, &ap);",
                  "    pp.one_minus_beta1 = ap.one_minus_beta1; pp.beta2 = ap.beta2; "
                  "pp.one_minus_beta2 = ap.one_minus_beta2;",
                  "    pp.lr_over_bc1 = ap.lr_over_bc1; pp.sqrt_bc2 = ap.sqrt_bc2; pp.eps = ap.eps; }"]
    elif kind == "rmsprop":
        lines.append(f"  pp.alpha = {_rt(gen, op, 'alpha')}; pp.one_minus_alpha = "
                     f"(float)(1.0 - (double){_rt(gen, op, 'alpha')}); pp.eps = {_rt(gen, op, 'eps')};")
    st0 = gen.ploc(states[0]) if ns >= 1 else "0"
    st1 = gen.ploc(states[1]) if ns >= 2 else "0"
    ms = gen.ploc(master) if master else "0"
    rg = f"(uint32_t *){gen.ploc(rng)}" if rng else "0"
    lines.append(f"  tt_qas_update(&pp, {rows}, {cols}, {n}, {rpc}, {sc_count}, {gen.ploc(scale)}, "
                 f"{gen.ploc(p)}, {1 if pt.dtype == 'int32' else 0}, {gen.ploc(gname)}, {st0}, {st1}, {ms}, "
                 f"{rg}); }}")
    return lines + _c_reset(gen, op, gname)



def _qas_emitter(kind: str):
    return lambda gen, op: _c_qas(gen, op, kind)


_UPDATE_ATTRS = ("n", "batch_size", "reset_grad", "<hyper-parameter>_ref")
_QAS_ATTRS = _UPDATE_ATTRS + ("qas", "rounding", "master", "axis", "bounds", "stream", "seed_ref")

# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_act_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.act_grad(v(0), v(1), a["act"])]


def _run_bias_grad(op, v, shape, tensor):
    return [go.bias_grad(v(0))]


def _run_int8_clamp_grad(op, v, shape, tensor):
    a = op.attrs
    y = np.asarray(v(1))
    dz = np.where((y > a["lo"]) & (y < a["hi"]), np.asarray(v(0), dtype=np.float32), np.float32(0))
    return [dz.astype(np.float32)]


def _run_clamp_mask(op, v, shape, tensor):
    a = op.attrs
    return [go.clamp_mask(v(0), a["lo"], a.get("hi"))]


def _run_mask_grad(op, v, shape, tensor):
    return [go.mask_grad(v(0), v(1))]


def _run_grad_accumulate(op, v, shape, tensor):
    return [go.grad_sum([v(j) for j in range(len(op.inputs))])]


# Loss kernels: the golden model (stages/train/losses.py), which applies the offset and weight attrs of several heads.

def _run_softmax_ce_loss(op, v, shape, tensor):
    from tinytrain.stages.train import losses
    return losses.run_loss_op(op, v, go.softmax_ce_loss, class_target=True)


def _run_mse_loss(op, v, shape, tensor):
    from tinytrain.stages.train import losses
    return losses.run_loss_op(op, v, go.mse_loss)


def _run_bce_logits_loss(op, v, shape, tensor):
    from tinytrain.stages.train import losses
    return losses.run_loss_op(op, v, losses.bce_logits_loss)


def _run_huber_loss(op, v, shape, tensor):
    from tinytrain.stages.train import losses
    delta = float(op.attrs.get("delta", losses.HUBER_DELTA))
    return losses.run_loss_op(op, v, lambda y, t: losses.huber_loss(y, t, delta))


def _run_loss_sum(op, v, shape, tensor):
    from tinytrain.stages.train import losses
    return [losses.loss_sum([v(j) for j in range(len(op.inputs))])]


_LOSS_ATTRS = ("offset", "weight")
LOSS_SUM = "loss_sum"   # the op adding several heads' losses (stages/train/losses.py emits it)


# The gradient plumbing autodiff and the memory model add themselves (masks, sums, the step counter): named, so
# that they spell these ops through their definitions (GRAD_ACCUMULATE.name), never by a string of their own.
ACT_GRAD = OpDef("act_grad", kind="backward", signature="dy, y -> dz", attrs=("act",),
                 note="mask from the forward output y; tanh: dy*(1 - y^2)", masks_gradient=True, in_place="any",
                 fp16_operands=(0, 1), fp16_output=True, run=_run_act_grad, c=_c_act_grad)
INT8_CLAMP_GRAD = OpDef("int8_clamp_grad", kind="backward", signature="dy, y_q -> dz", attrs=("lo", "hi"),
                        note="straight-through estimator: dz = dy where lo < y_q < hi, else 0", masks_gradient=True,
                        in_place="first", hidden_role="mask", run=_run_int8_clamp_grad, c=_c_int8_clamp_grad)
CLAMP_MASK = OpDef("clamp_mask", kind="aux", signature="y -> mask", attrs=("lo", "hi"),
                   note="uint8[ceil(n/8)], bit i = 1 where lo < y_i < hi", run=_run_clamp_mask,
                   c=_c_clamp_mask, fp16_operands=(0,))
MASK_GRAD = OpDef("mask_grad", kind="backward", signature="dy, mask -> dz", note="dz = dy where the bit is set",
                  masks_gradient=True, in_place="first", hidden_role="mask", run=_run_mask_grad, c=_c_mask_grad,
                  fp16_operands=(0,), fp16_output=True)
BIAS_GRAD = OpDef("bias_grad", kind="backward", signature="dz -> db", hidden_role="sum", run=_run_bias_grad,
                  c=_c_bias_grad, fp16_operands=(0,))
GRAD_ACCUMULATE = OpDef("grad_accumulate", kind="backward", signature="g0, g1, ... -> g",
                        note="a tensor read by several ops", in_place="any", c=_c_grad_accumulate,
                        run=_run_grad_accumulate, fp16_operands="all",   # tt_sum_f16: each share fp16 or fp32
                        fp16_output=True)
BATCH_ACCUMULATE = OpDef("batch_accumulate", kind="aux", signature="acc, g -> acc", eager=True,
                         c=_c_batch_accumulate, run=run_batch_accumulate)
STEP_COUNTER = OpDef("step_counter", kind="aux", signature="step -> step", c=_c_step_counter, run=run_step_counter)
SOFTMAX_CE_LOSS = OpDef("softmax_ce_loss", kind="loss", signature="logits, labels:int32[1] -> loss:f32[], dlogits",
                        attrs=_LOSS_ATTRS, note="fused, stable; several heads: a float class index in the target row",
                        loss="cross_entropy", c=_c_loss, run=_run_softmax_ce_loss)

OPS = (
    ACT_GRAD, INT8_CLAMP_GRAD, CLAMP_MASK, MASK_GRAD, BIAS_GRAD, GRAD_ACCUMULATE, BATCH_ACCUMULATE,
    # Losses, in the order of the spec's loss names (stages/train/losses.py); attrs only with several heads / a weight.
    SOFTMAX_CE_LOSS,
    OpDef("mse_loss", kind="loss", signature="y, target -> loss, dy", attrs=_LOSS_ATTRS, loss="mse",
          c=_c_loss, run=_run_mse_loss),
    OpDef("bce_logits_loss", kind="loss", signature="z, target -> loss, dz", attrs=_LOSS_ATTRS,
          note="binary cross-entropy with logits", loss="bce", c=_c_loss, run=_run_bce_logits_loss),
    OpDef("huber_loss", kind="loss", signature="y, target -> loss, dy", attrs=_LOSS_ATTRS + ("delta",),
          note="delta 1 (PyTorch HuberLoss)", loss="huber", c=_c_loss, run=_run_huber_loss),
    OpDef(LOSS_SUM, kind="loss", signature="l0, l1, ... -> loss", note="several heads: their weighted losses",
          c=_c_loss_sum, run=_run_loss_sum),
    STEP_COUNTER,
    OpDef("sgd_update", kind="update", signature="w, g -> w", attrs=_UPDATE_ATTRS, optimizer="sgd", eager=True,
          c=_c_sgd_update, run=float_update("sgd")),
    OpDef("momentum_update", kind="update", signature="w, g, buf -> w, buf", attrs=_UPDATE_ATTRS,
          optimizer="momentum", eager=True, c=_c_momentum_update, run=float_update("momentum")),
    OpDef("adam_update", kind="update", signature="w, g, m, v, step -> w, m, v", attrs=_UPDATE_ATTRS,
          optimizer="adam", eager=True, c=_c_adam_update, run=float_update("adam")),
    OpDef("rmsprop_update", kind="update", signature="w, g, sq -> w, sq", attrs=_UPDATE_ATTRS,
          optimizer="rmsprop", eager=True, c=_c_rmsprop_update, run=float_update("rmsprop")),
    OpDef("qas_sgd_update", kind="update", signature="p, g, scale [, master] [, prng] -> p [, master] [, prng]",
          attrs=_QAS_ATTRS, optimizer="sgd", qas=True, eager=True,
          c=_qas_emitter("sgd"), run=qas_update("sgd")),
    OpDef("qas_momentum_update", kind="update", signature="p, g, scale, buf [, master] [, prng] -> p, buf, ...",
          attrs=_QAS_ATTRS, optimizer="momentum", qas=True, eager=True,
          c=_qas_emitter("momentum"), run=qas_update("momentum")),
    OpDef("qas_adam_update", kind="update", signature="p, g, scale, m, v, step [, master] [, prng] -> p, m, v, ...",
          attrs=_QAS_ATTRS, optimizer="adam", qas=True, eager=True,
          c=_qas_emitter("adam"), run=qas_update("adam")),
    OpDef("qas_rmsprop_update", kind="update", signature="p, g, scale, sq [, master] [, prng] -> p, sq, ...",
          attrs=_QAS_ATTRS, optimizer="rmsprop", qas=True, eager=True,
          c=_qas_emitter("rmsprop"), run=qas_update("rmsprop")),
)
