"""Binary element-wise ops with numpy broadcasting: add, sub, mul, and their backward ops: the backward emission
(autodiff and the memory model) and the C of the forward and gradient calls. A smaller operand gets a
`tt_broadcast` (rank-4 output shape and per-operand strides, 0 on broadcast axes); the backward reduces over the
broadcast axes with the same struct (tt_unbroadcast_f32, tt_mul_grad_f32). Also their numpy float and int8 kernels
(the executor's), the int8 parameters computed once for the kernel and the C."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import FLOAT_BOUNDS, CodegenError, flit, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.golden.kernel_common import float_act, qparams
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.ops.base import Builtin, OpDef, input_dtype, version_by_dtype

_NOTE = ("numpy broadcasting, either operand may be a constant such as BatchNorm's per-channel scale [C]; a "
         "constant never spans the batch axis")


# ---- int8 parameters (one computation for the numpy kernel and the C)

_ADD_LEFT_SHIFT = 20


def add_sub_params(s1: float, s2: float, so: float) -> tuple[int, int, int, int, int, int]:
    """add.cc / sub.cc Prepare, 8-bit general path: left shift 20; `2 * std::max(float, float)` is a float, the
    multipliers are then computed in double. -> (m1, sh1, m2, sh2, m_out, sh_out)."""
    twice_max = float(np.float32(2) * np.float32(max(s1, s2)))
    m1, sh1 = ia.quantize_multiplier_smaller_than_one_exp(s1 / twice_max)
    m2, sh2 = ia.quantize_multiplier_smaller_than_one_exp(s2 / twice_max)
    mo, sho = ia.quantize_multiplier_smaller_than_one_exp(
        twice_max / float(np.float32((1 << _ADD_LEFT_SHIFT) * np.float32(so))))
    return m1, sh1, m2, sh2, mo, sho


def mul_multiplier(s1: float, s2: float, so: float, litert: bool = False) -> tuple[int, int]:
    """The multiplier of s_a * s_b / s_out. LiteRT's MulPrepare forms that ratio in float (promoted to double only
    for QuantizeMultiplier); TFLite Micro's CalculateOpDataMul in double from the float32 scales."""
    if litert:
        return ia.quantize_multiplier(ia.f32(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(so)))
    return ia.quantize_multiplier(ia.f32(s1) * ia.f32(s2) / ia.f32(so))


# ---- numpy forward (the executor's kernels; ctx: executor._Ctx)

def _int8_binary(ctx, act: str):
    """(s1, z1), (s2, z2), (so, zo): the two operands' and the output's quantization, and (lo, hi): the output's
    int8 range under the fused activation."""
    (s1, z1), (s2, z2), (so, zo) = qparams(ctx.tin(0)), qparams(ctx.tin(1)), qparams(ctx.tout())
    return (s1, z1), (s2, z2), (so, zo), ia.activation_range(act, so, zo)


def _add_or_sub(ctx, sign: int) -> list[np.ndarray]:
    a, b = ctx.x(0), ctx.x(1)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        (s1, z1), (s2, z2), (so, zo), (lo, hi) = _int8_binary(ctx, act)
        m1, sh1, m2, sh2, mo, sho = add_sub_params(s1, s2, so)
        v1 = ia.wrap32((a.astype(np.int64) - z1) * (1 << _ADD_LEFT_SHIFT))
        v2 = ia.wrap32((b.astype(np.int64) - z2) * (1 << _ADD_LEFT_SHIFT))
        r1 = ia.multiply_by_quantized_multiplier_smaller_than_one_exp(v1, m1, sh1)
        r2 = ia.multiply_by_quantized_multiplier_smaller_than_one_exp(v2, m2, sh2)
        raw = ia.multiply_by_quantized_multiplier_smaller_than_one_exp(ia.wrap32(r1 + sign * r2), mo, sho) + zo
        return [np.clip(raw, lo, hi).astype(np.int8)]
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    return [float_act(fa + fb if sign > 0 else fa - fb, act).astype(np.float32)]


def _add(ctx) -> list[np.ndarray]:
    return _add_or_sub(ctx, 1)


def _sub(ctx) -> list[np.ndarray]:
    """sub.cc: float a - b; int8 is ADD's general 8-bit path (PrepareGeneralSubOp computes the same left shift 20
    and multipliers as add.cc) with the rescaled second operand subtracted (reference_ops::SubElementwise)."""
    return _add_or_sub(ctx, -1)


def _mul(ctx) -> list[np.ndarray]:
    """mul.cc / reference_integer_ops::MulElementwise: one requantization of the int32 product
    (a - z_a) * (b - z_b) by s_a * s_b / s_out, + output zero point, clamped to the fused activation's range.
    fc_requant="litert_double" picks LiteRT's multiplier, the default TFLite Micro's (mul_multiplier)."""
    a, b = ctx.x(0), ctx.x(1)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        (s1, z1), (s2, z2), (so, zo), (lo, hi) = _int8_binary(ctx, act)
        mult, shift = mul_multiplier(s1, s2, so, litert=ctx.fc_requant == "litert_double")
        prod = ia.wrap32((a.astype(np.int64) - z1) * (b.astype(np.int64) - z2))
        raw = ia.multiply_by_quantized_multiplier(prod, mult, shift) + zo
        return [np.clip(raw, lo, hi).astype(np.int8)]
    return [float_act(a.astype(np.float32) * b.astype(np.float32), act).astype(np.float32)]


# ---- backward

def _add_sub_backward(bb, op, i, dz):
    """One <op>_grad reads dz alone and writes the share of each operand that needs one (`which`)."""
    outs = [bb.share(op.inputs[0], i), bb.share(op.inputs[1], i)]
    if any(outs):
        bb.emit(f"{op.type}_grad", [dz], [o for o in outs if o], which=[j for j, o in enumerate(outs) if o])


def _mul_backward(bb, op, i, dz):
    """One mul_grad per operand that needs a gradient, reading the other operand (real-valued)."""
    for j in (0, 1):
        d = bb.share(op.inputs[j], i)
        if d:
            bb.emit("mul_grad", [dz, bb.real(op.inputs[1 - j])], [d])

# ---- C (gen: codegen's generator: loc, qp, uid, globals, bcast, copy_call)

def _c_add_sub_params(gen, a: str, b: str, y: str, act: str) -> str:
    """A const tt_add_params_s8 (add_sub_params)."""
    s1, z1 = gen.qp(a)
    s2, z2 = gen.qp(b)
    so, zo = gen.qp(y)
    left_shift = _ADD_LEFT_SHIFT
    m1, sh1, m2, sh2, mo, sho = add_sub_params(s1, s2, so)
    lo, hi = ia.activation_range(act, so, zo)
    name = gen.uid("tt_ap")
    gen.globals.append(f"static const tt_add_params_s8 {name} = {{{z1}, {z2}, {zo}, {left_shift}, {m1}, "
                        f"{sh1}, {m2}, {sh2}, {mo}, {sho}, {lo}, {hi}}};")
    return name


def _c_add(gen, op: Op) -> list[str]:
    a, b = op.inputs[0], op.inputs[1]
    y = op.outputs[0]
    n = numel(gen.g.tensors[y].shape)
    act = op.attrs.get("act", "none")
    same = gen.g.tensors[a].shape == gen.g.tensors[b].shape
    if gen.is_int8(a):
        p = _c_add_sub_params(gen, a, b, y, act)
        if same:
            return [f"tt_add_s8(&{p}, {n}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]
        return [f"tt_add_s8_broadcast(&{p}, &{gen.bcast(y, a, b)}, {gen.loc(a)}, {gen.loc(b)}, "
                f"{gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    if any(fp16_io.is_f16(gen, t) for t in (a, b, y)):   # fp16-mixed: OpDef.fp16_operands / fp16_output
        args = f"{fp16_io.pair(gen, a)}, {fp16_io.pair(gen, b)}, {fp16_io.pair(gen, y, True)}"
        if same and gen.g.tensors[a].shape == gen.g.tensors[y].shape:
            return [f"tt_add_f16({n}, {flit(lo)}, {flit(hi)}, {args});"]
        # the broadcasting kernel writes behind what it reads only over an operand of y's shape
        if any(gen.g.tensors[t].shape != gen.g.tensors[y].shape and gen.same_place(t, y) for t in (a, b)):
            raise CodegenError(f"add {y}: planned over its broadcast operand (no fp16 kernel writes there)")
        return [f"tt_add_f16_broadcast(&{gen.bcast(y, a, b)}, {flit(lo)}, {flit(hi)}, {args});"]
    if same:
        return [f"tt_add_f32({n}, {flit(lo)}, {flit(hi)}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]
    return [f"tt_add_f32_broadcast(&{gen.bcast(y, a, b)}, {flit(lo)}, {flit(hi)}, {gen.loc(a)}, "
            f"{gen.loc(b)}, {gen.loc(y)});"]


def _c_sub(gen, op: Op) -> list[str]:
    a, b = op.inputs[0], op.inputs[1]
    y = op.outputs[0]
    act = op.attrs.get("act", "none")
    bc = gen.bcast(y, a, b)
    if gen.is_int8(a):
        p = _c_add_sub_params(gen, a, b, y, act)
        return [f"tt_sub_s8(&{p}, &{bc}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    return [f"tt_sub_f32(&{bc}, {flit(lo)}, {flit(hi)}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]


def _c_mul(gen, op: Op) -> list[str]:
    a, b = op.inputs[0], op.inputs[1]
    y = op.outputs[0]
    act = op.attrs.get("act", "none")
    bc = gen.bcast(y, a, b)
    if gen.is_int8(a):
        s1, z1 = gen.qp(a)
        s2, z2 = gen.qp(b)
        so, zo = gen.qp(y)
        m, sh = mul_multiplier(s1, s2, so)   # TFLite Micro's (the executor's default)
        lo, hi = ia.activation_range(act, so, zo)
        name = gen.uid("tt_mu")
        gen.globals.append(f"static const tt_mul_params_s8 {name} = {{{z1}, {z2}, {zo}, {m}, {sh}, {lo}, {hi}}};")
        return [f"tt_mul_s8(&{name}, &{bc}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    return [f"tt_mul_f32(&{bc}, {flit(lo)}, {flit(hi)}, {gen.loc(a)}, {gen.loc(b)}, {gen.loc(y)});"]


def _c_unbroadcast(gen, dz: str, d: str, sign: float) -> list[str]:
    """d = sign * dz reduced to d's shape: add_grad's and sub_grad's call per operand, fp32 or (fp16-mixed: OpDef
    fp16_operands / fp16_output) fp16 on either side."""
    n = numel(gen.g.tensors[d].shape)
    if fp16_io.is_f16(gen, dz) or gen.g.tensors[d].dtype == "float16":
        if sign > 0 and gen.same_place(dz, d) and gen.g.tensors[dz].dtype == gen.g.tensors[d].dtype:
            return [f"/* {d} aliases {dz} */"]
        return [f"tt_unbroadcast_f16(&{gen.bcast(dz, d)}, {flit(sign)}, {fp16_io.pair(gen, dz)}, "
                f"{fp16_io.pair(gen, d, True)}, {n});"]
    if sign > 0 and gen.g.tensors[d].shape == gen.g.tensors[dz].shape:
        return gen.copy_call(dz, d)
    return [f"tt_unbroadcast_f32(&{gen.bcast(dz, d)}, {flit(sign)}, {gen.loc(dz)}, {gen.loc(d)}, {n});"]


def _c_add_grad(gen, op: Op) -> list[str]:
    return [ln for o in op.outputs for ln in _c_unbroadcast(gen, op.inputs[0], o, 1.0)]


def _c_sub_grad(gen, op: Op) -> list[str]:
    return [ln for o, j in zip(op.outputs, op.attrs["which"])
            for ln in _c_unbroadcast(gen, op.inputs[0], o, -1.0 if int(j) == 1 else 1.0)]


def _c_mul_grad(gen, op: Op) -> list[str]:
    dz, other, d = op.inputs[0], op.inputs[1], op.outputs[0]
    n = numel(gen.g.tensors[d].shape)
    if any(fp16_io.is_f16(gen, t) for t in (dz, other)) or gen.g.tensors[d].dtype == "float16":   # fp16-mixed:
        # OpDef.fp16_operands (dz, and other: a saved fp16 activation read itself) / fp16_output
        return [f"tt_mul_grad_f16(&{gen.bcast(dz, d, other)}, {fp16_io.pair(gen, dz)}, {fp16_io.pair(gen, other)}, "
                f"{fp16_io.pair(gen, d, True)}, {n});"]
    return [f"tt_mul_grad_f32(&{gen.bcast(dz, d, other)}, {gen.loc(dz)}, {gen.loc(other)}, {gen.loc(d)}, "
            f"{n});"]


# ---- numpy kernels of the backward ops (the training executor's; v(j): the value of input j, shape(t): a
# tensor's shape)

def _run_add_grad(op, v, shape, tensor):
    return [go.unbroadcast(v(0), shape(o)) for o in op.outputs]


def _run_mul_grad(op, v, shape, tensor):
    return [go.mul_grad(v(0), v(1), shape(op.outputs[0]))]


def _run_sub_grad(op, v, shape, tensor):
    a = op.attrs
    return [go.sub_grad(v(0), shape(o), -1.0 if j == 1 else 1.0) for o, j in zip(op.outputs, a["which"])]


# ---- TFLite op versions (op_version.cc)

def _mul_version(graph, op) -> int:
    """3 for an int8 MUL whose rescale s_a * s_b / s_out is >= 1, else 2 for int8; 4 for int16."""
    if input_dtype(graph, op) == "int8":
        s = [graph.tensors[n].quant for n in (op.inputs[0], op.inputs[1], op.outputs[0])]
        if all(q is not None for q in s) and s[0].scale[0] * s[1].scale[0] / s[2].scale[0] >= 1.0:
            return 3
        return 2
    return {"int16": 4}.get(input_dtype(graph, op), 1)


# named: the golden model's C-order kernel table (stages/ops/fp16.exact_kernels) spells them through their definitions
ADD_GRAD = OpDef("add_grad", kind="backward", of="add", signature="dz -> da?, db?", attrs=("which",),
                 note="unbroadcast to each operand's shape", c=_c_add_grad, run=_run_add_grad, fp16_operands=(0,),
                 fp16_output=True)
MUL_GRAD = OpDef("mul_grad", kind="backward", of="mul", signature="dz, other -> d",
                 note="one op per operand that needs a gradient: unbroadcast(dz*other)", c=_c_mul_grad,
                 run=_run_mul_grad, fp16_operands=(0, 1), fp16_output=True)
SUB_GRAD = OpDef("sub_grad", kind="backward", of="sub", signature="dz -> da?, db?", attrs=("which",),
                 note="a: +dz, b: -dz; unbroadcast as add_grad", c=_c_sub_grad, run=_run_sub_grad,
                 fp16_operands=(0,), fp16_output=True)

OPS = (
    OpDef("add", row_stream="local", signature="a, b -> y", attrs=("act",), tflite=(Builtin("ADD", 2, 2),), differentiable=True,
          clamp_masked=True, const_operands_per_tensor=True, in_place="any", bn_affine="shift", forward=_add,
          backward=_add_sub_backward, c=_c_add, version=version_by_dtype({"int8": 2, "int16": 3}),
          fp16_operands=(0, 1), fp16_output=True),
    OpDef("mul", row_stream="local", signature="a, b -> y", attrs=("act",), note="a * b; " + _NOTE, tflite=(Builtin("MUL", 2, 2),),
          differentiable=True, clamp_masked=True, const_operands_per_tensor=True, bn_affine="scale", forward=_mul,
          backward=_mul_backward, c=_c_mul, version=_mul_version),
    OpDef("sub", row_stream="local", signature="a, b -> y", attrs=("act",), note="a - b; " + _NOTE, tflite=(Builtin("SUB", 2, 2),),
          differentiable=True, clamp_masked=True, const_operands_per_tensor=True, bn_affine="unshift", forward=_sub,
          backward=_add_sub_backward, c=_c_sub, version=version_by_dtype({"int8": 2, "int16": 3})),
    ADD_GRAD,
    MUL_GRAD,
    SUB_GRAD,
)
