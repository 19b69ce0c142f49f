"""Ops of fp16-mixed training graphs (stages/train/fp16_mixed.py emits them; issue 13): the casts between fp16 storage
and the fp32 kernels, and loss scaling. numpy kernels: stages/golden/fp16.py; C: kernels_c/tt_f16.[ch].

  cast_f32_f16:       x:f32 -> y:f16        round to nearest even (an op's fp32 result stored as fp16)
  cast_f16_f32:       x:f16 -> y:f32        exact (an fp16 tensor read by an fp32 kernel)
  round_f16:          x:f32 -> y:f32        f32(f16(x)): an fp16 value kept in an fp32 slot (in place)
  loss_scale_mul:     g, scale -> gs        the loss's gradient times the loss scale (fp32 multiply)
  amp_check:          g0, g1, ..., [prev] -> flag   1 when a gradient holds Inf/NaN (the step is skipped) or
                      the previous check's flag `prev` (an int32 last input: check_first's chained checks) is set
  amp_unscale:        g, scale -> g32       g / scale in fp32 (in place)
  amp_unscale_reset:  acc, scale -> g32     the same from a batch accumulator, which is then zeroed
  loss_scale_update:  scale, good, skipped, flag -> scale, good, skipped   the policy (attrs kind, growth,
                      backoff, interval, min_scale, max_scale)
An update op (and Adam's step counter) carries attr `skip_if` = the flag tensor, its last input: it does nothing when
the flag is set (golden: stages/golden/train_step.py; C: stages/codegen.py wraps its call in `if (!flag)`).
"""

from __future__ import annotations

import numpy as np

from tinytrain.stages.c_emit.literals import flit, numel
from tinytrain.stages.golden import fp16 as h
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops import conv, elementwise, training
from tinytrain.stages.ops import fully_connected as fc
from tinytrain.stages.ops.base import OpDef


# The op names stages/train/fp16_mixed.py emits (op-name literals live in stages/ops/), and the training ops it
# handles: Adam's step counter (skipped with the updates) and the batch accumulation.
CAST_F32_F16, CAST_F16_F32, ROUND_F16 = "cast_f32_f16", "cast_f16_f32", "round_f16"
LOSS_SCALE_MUL, AMP_CHECK, LOSS_SCALE_UPDATE = "loss_scale_mul", "amp_check", "loss_scale_update"
AMP_UNSCALE, AMP_UNSCALE_RESET = "amp_unscale", "amp_unscale_reset"
STEP_COUNTER, BATCH_ACCUMULATE = training.STEP_COUNTER.name, training.BATCH_ACCUMULATE.name
# element-wise ops a weight gradient may pass through on its way to its update (or to its check) inside a channels
# stream (stages/planning/streams.py): each handles one output channel of the gradient at a time (_chunk_n)
CHANNEL_CHAIN_OPS = (ROUND_F16, AMP_UNSCALE)
CHANNEL_END_OPS = (AMP_CHECK,)


def exact_kernels() -> dict:
    """op -> its fp32 kernel in the C's order of operations (stages/golden/fp16_exact.py), which the golden model
    runs for fp16-mixed graphs so that every fp16 rounding matches the C."""
    from tinytrain.stages.golden import fp16_exact as ex

    return {training.SOFTMAX_CE_LOSS.name: ex.run_softmax_ce, training.BIAS_GRAD.name: ex.run_bias_grad,
            elementwise.ADD_GRAD.name: ex.run_add_grad, elementwise.SUB_GRAD.name: ex.run_sub_grad,
            elementwise.MUL_GRAD.name: ex.run_mul_grad,
            fc.FULLY_CONNECTED_GRAD_INPUT.name: ex.run_fc_grad_input,
            fc.FULLY_CONNECTED_GRAD_WEIGHT.name: ex.run_fc_grad_weight,
            conv.CONV2D_GRAD_INPUT.name: ex.run_conv2d_grad_input,
            conv.CONV2D_GRAD_WEIGHT.name: ex.run_conv2d_grad_weight}


def _n(gen, name: str) -> int:
    return numel(gen.g.tensors[name].shape)


def _c_cast_f32_f16(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    return [f"tt_cast_f32_f16({_n(gen, x)}u, {gen.loc(x)}, {gen.loc(y)});"]


def _c_cast_f16_f32(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    if y in gen.fused:
        return [f"/* fused: its readers widen {x.split(';')[0]} as they read it */"]
    return [f"tt_cast_f16_f32({_n(gen, x)}u, {gen.loc(x)}, {gen.loc(y)});"]


def _c_round_f16(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    return [f"tt_round_f16({_chunk_n(gen, x)}u, {gen.loc(x)}, {gen.loc(y)});"]


def _c_loss_scale_mul(gen, op: Op) -> list[str]:
    g, s, y = op.inputs[0], op.inputs[1], op.outputs[0]
    return [f"tt_scale_f32({_n(gen, g)}u, {gen.loc(g)}, {gen.loc(s)}[0], {gen.loc(y)});"]


def _c_amp_check(gen, op: Op) -> list[str]:
    """In a channels stream (stages/planning/streams.py: gen.chunk_rows is set, `o` is the channel) a gradient
    holds one output channel and the flag accumulates over the channels: channel 0 starts from `prev` (or 0)."""
    flag = gen.loc(op.outputs[0])
    streamed = gen.chunk_rows is not None
    terms = []
    prev = "0"
    for g in op.inputs:
        t = gen.g.tensors[g]
        if t.dtype == "int32":
            prev = f"{gen.loc(g)}[0]"
            continue
        fn = "tt_nonfinite_f16" if t.dtype == "float16" else "tt_nonfinite_f32"
        terms.append(f"{fn}({_chunk_n(gen, g)}u, {gen.loc(g)})")
    if streamed:
        prev = f"(o == 0 ? {prev} : {flag}[0])"
    if prev != "0":
        terms.insert(0, prev)
    return [f"{flag}[0] = ({' | '.join(terms)}) ? 1 : 0;"]


def _chunk_n(gen, name: str) -> int:
    """Elements of `name` one call handles: a whole tensor, or in a channels stream one output channel of it."""
    n = _n(gen, name)
    if gen.chunk_rows is not None:
        shape = gen.g.tensors[name].shape
        n //= int(shape[0])
    return n


def _c_amp_unscale(gen, op: Op) -> list[str]:
    g, s, y = op.inputs[0], op.inputs[1], op.outputs[0]
    fn = "tt_unscale_f16" if gen.g.tensors[g].dtype == "float16" else "tt_unscale_f32"
    lines = [f"{fn}({_chunk_n(gen, g)}u, {gen.loc(g)}, {gen.loc(s)}[0], {gen.loc(y)});"]
    if op.type == AMP_UNSCALE_RESET:
        lines.append(f"memset({gen.loc(g)}, 0, {gen.g.tensors[g].nbytes}u);")
    return lines


def _c_loss_scale_update(gen, op: Op) -> list[str]:
    a = op.attrs
    s, good, skipped, flag = (gen.loc(t) for t in op.inputs)
    p = gen.uid("tt_lsp")
    gen.globals.append(f"static const tt_loss_scale_params {p} = {{{1 if a['kind'] == 'dynamic' else 0}, "
                       f"{flit(a['growth'])}, {flit(a['backoff'])}, {int(a['interval'])}, {flit(a['min_scale'])}, "
                       f"{flit(a['max_scale'])}}};")
    return [f"tt_loss_scale_update(&{p}, {s}, {good}, {skipped}, {flag}[0]);"]


def _run_cast_f32_f16(op, v, shape, tensor, hp=None):
    return [h.to_f16(v(0))]


def _run_cast_f16_f32(op, v, shape, tensor, hp=None):
    return [h.to_f32(v(0))]


def _run_round_f16(op, v, shape, tensor, hp=None):
    return [h.to_f32(h.to_f16(v(0)))]


def _run_loss_scale_mul(op, v, shape, tensor, hp=None):
    return [h.scale_grad(v(0), v(1))]


def _run_amp_check(op, v, shape, tensor, hp=None):
    vals = [np.asarray(v(j)) for j in range(len(op.inputs))]
    prev = any(int(x.reshape(-1)[0]) for x in vals if x.dtype == np.int32)
    return [np.array(int(prev) | h.nonfinite([x for x in vals if x.dtype != np.int32]), np.int32)]


def _run_amp_unscale(op, v, shape, tensor, hp=None):
    out = h.unscale(v(0), v(1))
    if op.type == AMP_UNSCALE_RESET:
        v(0)[...] = 0
    return [out]


def _run_loss_scale_update(op, v, shape, tensor, hp=None):
    a = op.attrs
    h.update_scale(v(0), v(1), v(2), int(v(3)), dynamic=a["kind"] == "dynamic", growth=a["growth"],
                   backoff=a["backoff"], interval=int(a["interval"]), lo=a["min_scale"], hi=a["max_scale"])
    return []


OPS = (
    OpDef(CAST_F32_F16, kind="aux", signature="x:f32 -> y:f16", note="round to nearest even",
          run=_run_cast_f32_f16, c=_c_cast_f32_f16),
    OpDef(CAST_F16_F32, kind="aux", signature="x:f16 -> y:f32", note="exact",
          run=_run_cast_f16_f32, c=_c_cast_f16_f32),
    OpDef(ROUND_F16, kind="aux", signature="x:f32 -> y:f32", note="an fp16 value in an fp32 slot",
          in_place="first", row_stream="local", run=_run_round_f16, c=_c_round_f16),
    OpDef(LOSS_SCALE_MUL, kind="aux", signature="g, scale -> gs", note="the loss gradient times the loss scale",
          in_place="first", run=_run_loss_scale_mul, c=_c_loss_scale_mul),
    OpDef(AMP_CHECK, kind="aux", signature="g0, g1, ... -> flag:int32", note="1 when a gradient is not finite",
          run=_run_amp_check, c=_c_amp_check),
    OpDef(AMP_UNSCALE, kind="aux", signature="g, scale -> g32", note="g / scale in fp32 before the update",
          in_place="first", run=_run_amp_unscale, c=_c_amp_unscale),
    OpDef(AMP_UNSCALE_RESET, kind="aux", signature="acc, scale -> g32",
          note="g / scale from a batch accumulator, zeroed after", run=_run_amp_unscale, c=_c_amp_unscale),
    OpDef(LOSS_SCALE_UPDATE, kind="aux", signature="scale, good, skipped, flag -> scale, good, skipped",
          attrs=("kind", "growth", "backoff", "interval", "min_scale", "max_scale"),
          note="skip counter, backoff on overflow, growth after `interval` finite steps",
          run=_run_loss_scale_update, c=_c_loss_scale_update),
)
