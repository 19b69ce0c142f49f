"""Activations: relu, relu6, logistic, tanh, hard_swish, leaky_relu, prelu, and their backward ops.

Here: the numpy float and int8 kernels (the executor's), the backward emission (autodiff and the memory model;
relu / relu6's is still autodiff's) and the C of the forward and gradient calls (int8 with TFLite Micro's
arithmetic, the parameters computed once for the kernel and the C).
"""

from __future__ import annotations

import math

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import CodegenError, flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import qparams
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.ops.backward import clamp_backward, unary_backward
from tinytrain.stages.ops.base import Builtin, OpDef, version_by_dtype

# the standalone clamps: (lo, hi) in real units, hi None = unbounded
_CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0)}
# int8 output encodings the kernels hard-code (LiteRT checks LOGISTIC's; TANH's fixed-point kernel assumes it)
_FIXED_OUTPUT = {"logistic": (1.0 / 256.0, -128), "tanh": (1.0 / 128.0, 0)}


# ---- int8 parameters (one computation for the numpy kernel and the C): each ratio formed in float from the
# tensor scales, as LeakyReluPrepare / PreluPrepare do, then quantized

def leaky_relu_multipliers(s_in: float, s_out: float, alpha: np.float32) -> tuple[int, int, int, int]:
    """(m, shift) of s_in / s_out (x >= z_in) and of s_in * alpha / s_out (below)."""
    mi, shi = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
    ma, sha = ia.quantize_multiplier(ia.f32(np.float32(np.float32(s_in) * alpha) / np.float32(s_out)))
    return mi, shi, ma, sha


def prelu_multipliers(s_in: float, s_a: float, s_out: float) -> tuple[int, int, int, int]:
    """(m, shift) of s_in / s_out (x >= z_in) and of s_in * s_alpha / s_out (on (x - z_in) * (alpha - z_a))."""
    m1, sh1 = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
    m2, sh2 = ia.quantize_multiplier(ia.f32(np.float32(np.float32(s_in) * np.float32(s_a)) / np.float32(s_out)))
    return m1, sh1, m2, sh2


def relu_multiplier(s_in: float, s_out: float, litert: bool = False) -> tuple[int, int]:
    """(m, shift) of s_in / s_out, the requantization of int8 RELU / RELU6 (activations.cc QuantizedReluX; the
    converter gives input and output different parameters). LiteRT's ReluPrepare divides the two float scales in
    float (`input->params.scale / output->params.scale`) and only then widens to double; TFLite Micro divides in
    double. The quotients round to different Q0.31 mantissas for some scale pairs (and then differ by an LSB on
    some inputs)."""
    if litert:
        return ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
    return ia.quantize_multiplier(float(s_in) / float(s_out))


def _check_fixed_output(op: str, s: float, z: int) -> None:
    # The fixed-point kernels hard-code the output encoding; other parameters would silently mean other numbers.
    want_s, want_z = _FIXED_OUTPUT[op]
    if z != want_z or abs(s - want_s) > 1e-6 * want_s:
        raise ValueError(f"int8 {op} output must have scale {want_s:g} and zero point {want_z} (got {s}, {z})")


# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _clamp(ctx) -> list[np.ndarray]:
    """relu / relu6: the standalone clamp to the op's (lo, hi)."""
    lo, hi = _CLAMPS[ctx.op.type]
    x = ctx.x(0)
    if ctx.quantized():
        # requantize from the input's to the output's parameters, then clamp; fc_requant="litert_double" takes
        # LiteRT's multiplier (relu_multiplier)
        s_in, z_in = qparams(ctx.tin(0))
        s_out, z_out = qparams(ctx.tout())
        mult, shift = relu_multiplier(s_in, s_out, litert=ctx.fc_requant == "litert_double")
        qlo, qhi = ia.relu_op_range(lo, hi, s_out, z_out)
        y = z_out + ia.multiply_by_quantized_multiplier(x.astype(np.int64) - z_in, mult, shift)
        return [np.clip(y, qlo, qhi).astype(np.int8)]
    y = np.maximum(x.astype(np.float32), np.float32(lo))
    if hi is not None:
        y = np.minimum(y, np.float32(hi))
    return [y.astype(np.float32)]


def _leaky_relu(ctx) -> list[np.ndarray]:
    """activations.cc LeakyRelu. float: `x > 0 ? x : x * alpha`. int8: reference_ops::QuantizeLeakyRelu, two
    multipliers (leaky_relu_multipliers)."""
    x = ctx.x(0)
    alpha = np.float32(ctx.attrs.get("alpha", 0.2))
    if ctx.quantized():
        s_in, z_in = qparams(ctx.tin(0))
        s_out, z_out = qparams(ctx.tout())
        m_id, sh_id, m_a, sh_a = leaky_relu_multipliers(s_in, s_out, alpha)
        v = x.astype(np.int64) - z_in
        y = np.where(v >= 0, ia.multiply_by_quantized_multiplier(v, m_id, sh_id),
                     ia.multiply_by_quantized_multiplier(v, m_a, sh_a)) + z_out
        return [np.clip(y, -128, 127).astype(np.int8)]
    xf = x.astype(np.float32)
    return [np.where(xf > np.float32(0), xf, xf * alpha).astype(np.float32)]


_LOGISTIC_CUTOFF_UPPER = np.float32(16.619047164916992188)
_LOGISTIC_CUTOFF_LOWER = np.float32(-9.0)


def _sigmoid_like_int8(ctx, f32, fixed) -> np.ndarray:
    """int8 LOGISTIC / TANH (the output parameters the kernels hard-code): LiteRT's table filled with the float
    function f32 (fc_requant="litert_double") or TFLite Micro's gemmlowp fixed point `fixed` (the default)."""
    s_in, z_in = qparams(ctx.tin(0))
    s_out, z_out = qparams(ctx.tout())
    _check_fixed_output(ctx.op.type, s_out, z_out)
    if ctx.fc_requant == "litert_double":
        return ia.apply_lut(ctx.x(0), ia.lut_int8(s_in, z_in, s_out, z_out, f32))
    mult, shift, radius = ia.logistic_tanh_params(s_in)
    return fixed(ctx.x(0), z_in, mult, shift, radius)


def _logistic(ctx) -> list[np.ndarray]:
    """float: reference_ops::Logistic (1 above 16.619, exp(x) below -9, else 1 / (1 + exp(-x)), in float).
    int8 (output (1/256, -128)): LiteRT's BUILTIN_REF kernel looks each value up in a table it fills with float
    math (fc_requant="litert_double"); TFLite Micro runs reference_integer_ops::Logistic, gemmlowp fixed point
    (the default). The two differ by an LSB on some inputs."""
    x = ctx.x(0)
    if ctx.quantized():
        return [_sigmoid_like_int8(ctx, ia.logistic_f32, ia.logistic_int8_fixed)]
    xf = x.astype(np.float32)
    # Each branch's exp only sees the inputs of its own range (clipped), so nothing overflows; the values in range
    # are the same bits as the unclipped formula.
    lo, hi = _LOGISTIC_CUTOFF_LOWER, _LOGISTIC_CUTOFF_UPPER
    mid = (np.float32(1) / (np.float32(1) + np.exp(-np.clip(xf, lo, hi)))).astype(np.float32)
    y = np.where(xf > hi, np.float32(1), np.where(xf < lo, np.exp(np.minimum(xf, lo)), mid))
    return [y.astype(np.float32)]


def _tanh(ctx) -> list[np.ndarray]:
    """float: std::tanh. int8 (output (1/128, 0)): as LOGISTIC, LiteRT's float-filled table or TFLite Micro's
    reference_integer_ops::Tanh."""
    x = ctx.x(0)
    if ctx.quantized():
        return [_sigmoid_like_int8(ctx, ia.tanhf, ia.tanh_int8_fixed)]
    return [np.tanh(x.astype(np.float32)).astype(np.float32)]


def _hard_swish(ctx) -> list[np.ndarray]:
    """float: reference_ops::HardSwish, x * min(6, max(0, x + 3)) / 6 in float. int8: its 16-bit fixed-point
    version (HardSwishPrepare's float-formed multipliers scaled down to Q0.15)."""
    x = ctx.x(0)
    if ctx.quantized():
        s_in, z_in = qparams(ctx.tin(0))
        s_out, z_out = qparams(ctx.tout())
        return [ia.hard_swish_int8(x, z_in, z_out, ia.hard_swish_params(s_in, s_out))]
    xf = x.astype(np.float32)
    r = np.minimum(np.float32(6), np.maximum(np.float32(0), xf + np.float32(3)))
    return [((xf * r) / np.float32(6)).astype(np.float32)]


def _prelu(ctx) -> list[np.ndarray]:
    """activations.cc PreluEval. float: ApplyPrelu, `x >= 0 ? x : x * alpha` in float32. int8:
    reference_ops::(Broadcast)Prelu4D: the non-negative side rescaled by s_in / s_out, the negative side
    by s_in * s_alpha / s_out on the int32 product (x - z_in) * (alpha - z_alpha) (prelu_multipliers)."""
    x, alpha = ctx.x(0), ctx.x(1)
    if alpha is None:
        raise ValueError("PRELU needs an alpha operand")
    if ctx.quantized():
        s_in, z_in = qparams(ctx.tin(0))
        s_a, z_a = qparams(ctx.tin(1))
        s_out, z_out = qparams(ctx.tout())
        m1, sh1, m2, sh2 = prelu_multipliers(s_in, s_a, s_out)
        xi = x.astype(np.int64) - z_in
        ai = np.broadcast_to(alpha.astype(np.int64) - z_a, xi.shape) if alpha.ndim <= xi.ndim else None
        if ai is None:
            raise ValueError(f"alpha of rank {alpha.ndim} does not broadcast to the input")
        pos = ia.multiply_by_quantized_multiplier(xi, m1, sh1)
        neg = ia.multiply_by_quantized_multiplier(ia.wrap32(xi * ai), m2, sh2)
        return [np.clip(np.where(xi >= 0, pos, neg) + z_out, -128, 127).astype(np.int8)]
    xf, af = x.astype(np.float32), alpha.astype(np.float32)
    return [np.where(xf >= np.float32(0), xf, xf * af).astype(np.float32)]


# ---- backward: the derivative of logistic and tanh is a function of the forward output y, the others' of the
# input x (prelu: and its alpha). Every operand is read as a real value (int8: dequantized).

def _from_output(bb, op, i, dz):
    unary_backward(bb, op, i, dz, reads="y")


def _from_input(bb, op, i, dz):
    unary_backward(bb, op, i, dz, reads="x")


def _leaky_relu_backward(bb, op, i, dz):
    unary_backward(bb, op, i, dz, reads="x", attrs={"alpha": float(op.attrs.get("alpha", 0.2))})


def _prelu_backward(bb, op, i, dz):
    unary_backward(bb, op, i, dz, reads="x", extra_inputs=1)


# ---- C (gen: codegen's generator: loc, qp, uid, globals, bcast)

def _c_logistic_tanh(gen, op: Op) -> list[str]:
    kind = op.type
    x, y = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[x].shape)
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_out, z_out = gen.qp(y)
        want = _FIXED_OUTPUT[kind]
        if z_out != want[1] or abs(s_out - want[0]) > 1e-6 * want[0]:
            raise CodegenError(f"int8 {kind} output must have scale {want[0]:g} and zero point {want[1]}")
        m, ls, radius = ia.logistic_tanh_params(s_in)
        return [f"tt_{kind}_s8({n}, {z_in}, {m}, {ls}, {radius}, {gen.loc(x)}, {gen.loc(y)});"]
    return [f"tt_{kind}_f32({n}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_hard_swish(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[x].shape)
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_out, z_out = gen.qp(y)
        try:
            om, oe, rm, re_ = ia.hard_swish_params(s_in, s_out)
        except ValueError as e:
            raise CodegenError(f"hard_swish {y!r}: {e}") from None
        name = gen.uid("tt_hs")
        gen.globals.append(f"static const tt_hard_swish_params_s8 {name} = {{{z_in}, {z_out}, {om}, {oe}, "
                            f"{rm}, {re_}}};")
        return [f"tt_hard_swish_s8(&{name}, {n}, {gen.loc(x)}, {gen.loc(y)});"]
    return [f"tt_hard_swish_f32({n}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_leaky_relu(gen, op: Op) -> list[str]:
    x, y = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[x].shape)
    alpha = np.float32(op.attrs.get("alpha", 0.2))
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_out, z_out = gen.qp(y)
        mi, shi, ma, sha = leaky_relu_multipliers(s_in, s_out, alpha)
        return [f"tt_leaky_relu_s8({n}, {z_in}, {z_out}, {mi}, {shi}, {ma}, {sha}, {gen.loc(x)}, "
                f"{gen.loc(y)});"]
    return [f"tt_leaky_relu_f32({n}, {flit(alpha)}, {gen.loc(x)}, {gen.loc(y)});"]


def _c_prelu(gen, op: Op) -> list[str]:
    x, al, y = op.inputs[0], op.inputs[1], op.outputs[0]
    bc = gen.bcast(y, x, al)
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_a, z_a = gen.qp(al)
        s_out, z_out = gen.qp(y)
        m1, sh1, m2, sh2 = prelu_multipliers(s_in, s_a, s_out)
        name = gen.uid("tt_pr")
        gen.globals.append(f"static const tt_prelu_params_s8 {name} = {{{z_in}, {z_a}, {z_out}, {m1}, {sh1}, "
                            f"{m2}, {sh2}}};")
        return [f"tt_prelu_s8(&{name}, &{bc}, {gen.loc(x)}, {gen.loc(al)}, {gen.loc(y)});"]
    if fp16_io.is_f16(gen, x) or gen.g.tensors[y].dtype == "float16":   # fp16-mixed: OpDef.fp16_operands / _output
        return [f"tt_prelu_f16(&{bc}, {fp16_io.pair(gen, x)}, {gen.loc(al)}, {fp16_io.pair(gen, y, True)});"]
    return [f"tt_prelu_f32(&{bc}, {gen.loc(x)}, {gen.loc(al)}, {gen.loc(y)});"]


def _c_unary_grad(gen, op: Op, *extra: str) -> list[str]:
    """tt_<op>_grad_f32(n, [extra, ]dy, x or y, dx)."""
    kind = op.type[:-len("_grad")]
    dy, v, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    n = numel(gen.g.tensors[dy].shape)
    pre = "".join(f"{e}, " for e in extra)
    return [f"tt_{kind}_grad_f32({n}, {pre}{gen.loc(dy)}, {gen.loc(v)}, {gen.loc(dx)});"]


def _c_leaky_relu_grad(gen, op: Op) -> list[str]:
    return _c_unary_grad(gen, op, flit(op.attrs["alpha"]))


def _c_prelu_grad(gen, op: Op) -> list[str]:
    dy, x, al, dx = op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]
    return [f"tt_prelu_grad_f32(&{gen.bcast(dy, x, al)}, {gen.loc(dy)}, {gen.loc(x)}, {gen.loc(al)}, "
            f"{gen.loc(dx)});"]


# ---- C (gen: codegen's generator)

def _c_clamp(gen, op: Op) -> list[str]:
    """relu / relu6: the standalone clamp (int8: QuantizedReluX requantizes)."""
    lo, hi = _CLAMPS[op.type]
    x, y = op.inputs[0], op.outputs[0]
    n = numel(gen.g.tensors[x].shape)
    if gen.is_int8(x):
        s_in, z_in = gen.qp(x)
        s_out, z_out = gen.qp(y)
        mult, shift = relu_multiplier(s_in, s_out)   # TFLite Micro's (the executor's default)
        qlo, qhi = ia.relu_op_range(lo, hi, s_out, z_out)
        return [f"tt_relu_s8({n}, {z_in}, {z_out}, {mult}, {shift}, {qlo}, {qhi}, {gen.loc(x)}, "
                f"{gen.loc(y)});"]
    lims = f"{flit(lo)}, {flit(math.inf if hi is None else hi)}"
    if fp16_io.is_f16(gen, x) or gen.g.tensors[y].dtype == "float16":   # fp16-mixed: OpDef.fp16_operands / _output
        return [f"tt_clamp_f16({n}, {lims}, {fp16_io.pair(gen, x)}, {fp16_io.pair(gen, y, True)});"]
    return [f"tt_clamp_f32({n}, {lims}, {gen.loc(x)}, {gen.loc(y)});"]


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_logistic_grad(op, v, shape, tensor):
    return [go.logistic_grad(v(0), v(1))]


def _run_tanh_grad(op, v, shape, tensor):
    return [go.tanh_grad(v(0), v(1))]


def _run_hard_swish_grad(op, v, shape, tensor):
    return [go.hard_swish_grad(v(0), v(1))]


def _run_leaky_relu_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.leaky_relu_grad(v(0), v(1), a["alpha"])]


def _run_prelu_grad(op, v, shape, tensor):
    return [go.prelu_grad(v(0), v(1), v(2))]


# ---- TFLite op versions (op_version.cc)


OPS = (
    OpDef("relu", row_stream="local", signature="x -> y", tflite=(Builtin("RELU", 1, 1),), differentiable=True,
          op_clamp=_CLAMPS["relu"], in_place="any", forward=_clamp, c=_c_clamp, fp16_operands=(0,), fp16_output=True,
          version=version_by_dtype({"int8": 2, "int16": 3}), backward=clamp_backward(_CLAMPS["relu"])),
    OpDef("relu6", row_stream="local", signature="x -> y", tflite=(Builtin("RELU6", 1, 1),), differentiable=True,
          op_clamp=_CLAMPS["relu6"], in_place="any", forward=_clamp, c=_c_clamp, fp16_operands=(0,), fp16_output=True,
          version=version_by_dtype({"int8": 2, "int16": 3}), backward=clamp_backward(_CLAMPS["relu6"])),
    OpDef("logistic", row_stream="local", signature="x -> y", note="int8: output fixed at (1/256, -128)",
          tflite=(Builtin("LOGISTIC", 1, 1),), differentiable=True, fixed_output=_FIXED_OUTPUT["logistic"],
          dropped_by="bce",
          forward=_logistic, backward=_from_output, c=_c_logistic_tanh,
          version=version_by_dtype({"int8": 2, "int16": 3})),
    OpDef("tanh", row_stream="local", signature="x -> y", note="int8: output fixed at (1/128, 0)", tflite=(Builtin("TANH", 1, 1),),
          differentiable=True, fixed_output=_FIXED_OUTPUT["tanh"], forward=_tanh, backward=_from_output,
          c=_c_logistic_tanh, version=version_by_dtype({"int8": 2, "int16": 3})),
    OpDef("hard_swish", row_stream="local", signature="x -> y", note="x * relu6(x + 3) / 6", tflite=(Builtin("HARD_SWISH", 1, 1),),
          differentiable=True, clamp_masked=True, forward=_hard_swish, backward=_from_input, c=_c_hard_swish),
    OpDef("leaky_relu", row_stream="local", signature="x -> y", attrs=("alpha",), note="y = x > 0 ? x : x * alpha",
          tflite=(Builtin("LEAKY_RELU", 1, 1),), differentiable=True, clamp_masked=True,
          forward=_leaky_relu, backward=_leaky_relu_backward, c=_c_leaky_relu),
    OpDef("prelu", row_stream="local", signature="x, alpha -> y",
          note="alpha constant, broadcast over x without the batch axis; y = x >= 0 ? x : x * alpha",
          tflite=(Builtin("PRELU", 2, 2),), differentiable=True, clamp_masked=True, const_operands_per_tensor=True,
          forward=_prelu, backward=_prelu_backward, c=_c_prelu, fp16_operands=(0,), fp16_output=True),
    OpDef("logistic_grad", kind="backward", of="logistic", signature="dy, y -> dx", note="dy*(1 - y)*y",
          c=_c_unary_grad, run=_run_logistic_grad),
    OpDef("tanh_grad", kind="backward", of="tanh", signature="dy, y -> dx", note="dy*(1 - y^2)", c=_c_unary_grad,
          run=_run_tanh_grad),
    OpDef("hard_swish_grad", kind="backward", of="hard_swish", signature="dy, x -> dx", c=_c_unary_grad,
          run=_run_hard_swish_grad),
    OpDef("leaky_relu_grad", kind="backward", of="leaky_relu", signature="dy, x -> dx", attrs=("alpha",),
          c=_c_leaky_relu_grad, run=_run_leaky_relu_grad),
    OpDef("prelu_grad", kind="backward", of="prelu", signature="dy, x, alpha -> dx",
          note="the input gradient only (alpha is a constant)", c=_c_prelu_grad, run=_run_prelu_grad),
)
