"""Ops only training graphs hold (stages/autodiff.py emits them): gradient plumbing, 1-bit masks, losses and
updates."""

from __future__ import annotations

from .base import OpDef

_UPDATE_ATTRS = ("n", "batch_size", "reset_grad", "<hyper-parameter>_ref")
_QAS_ATTRS = _UPDATE_ATTRS + ("qas", "rounding", "master", "axis", "bounds", "stream", "seed_ref")

OPS = (
    OpDef("act_grad", kind="backward", signature="dy, y -> dz", attrs=("act",),
          note="mask from the forward output y; tanh: dy*(1 - y^2)", masks_gradient=True, in_place="any"),
    OpDef("int8_clamp_grad", kind="backward", signature="dy, y_q -> dz", attrs=("lo", "hi"),
          note="straight-through estimator: dz = dy where lo < y_q < hi, else 0", masks_gradient=True,
          in_place="first"),
    OpDef("clamp_mask", kind="aux", signature="y -> mask", attrs=("lo", "hi"),
          note="uint8[ceil(n/8)], bit i = 1 where lo < y_i < hi"),
    OpDef("mask_grad", kind="backward", signature="dy, mask -> dz", note="dz = dy where the bit is set",
          masks_gradient=True, in_place="first"),
    OpDef("bias_grad", kind="backward", signature="dz -> db"),
    OpDef("grad_accumulate", kind="backward", signature="g0, g1, ... -> g",
          note="a tensor read by several ops", in_place="any"),
    OpDef("batch_accumulate", kind="aux", signature="acc, g -> acc", eager=True),
    OpDef("softmax_ce_loss", kind="loss", signature="logits, labels:int32[1] -> loss:f32[], dlogits"),
    OpDef("mse_loss", kind="loss", signature="y, target -> loss, dy"),
    OpDef("step_counter", kind="aux", signature="step -> step"),
    OpDef("sgd_update", kind="update", signature="w, g -> w", attrs=_UPDATE_ATTRS, optimizer="sgd", eager=True),
    OpDef("momentum_update", kind="update", signature="w, g, buf -> w, buf", attrs=_UPDATE_ATTRS,
          optimizer="momentum", eager=True),
    OpDef("adam_update", kind="update", signature="w, g, m, v, step -> w, m, v", attrs=_UPDATE_ATTRS,
          optimizer="adam", eager=True),
    OpDef("rmsprop_update", kind="update", signature="w, g, sq -> w, sq", attrs=_UPDATE_ATTRS,
          optimizer="rmsprop", eager=True),
    OpDef("qas_sgd_update", kind="update", signature="p, g, scale [, master] [, prng] -> p [, master] [, prng]",
          attrs=_QAS_ATTRS, optimizer="sgd", qas=True, eager=True),
    OpDef("qas_momentum_update", kind="update", signature="p, g, scale, buf [, master] [, prng] -> p, buf, ...",
          attrs=_QAS_ATTRS, optimizer="momentum", qas=True, eager=True),
    OpDef("qas_adam_update", kind="update", signature="p, g, scale, m, v, step [, master] [, prng] -> p, m, v, ...",
          attrs=_QAS_ATTRS, optimizer="adam", qas=True, eager=True),
    OpDef("qas_rmsprop_update", kind="update", signature="p, g, scale, sq [, master] [, prng] -> p, sq, ...",
          attrs=_QAS_ATTRS, optimizer="rmsprop", qas=True, eager=True),
)
