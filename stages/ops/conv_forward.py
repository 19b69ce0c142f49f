"""The forward of the convolutions (conv2d, depthwise_conv2d, transpose_conv): their numpy float and int8 kernels
(the executor's; TFLite's reference arithmetic, see stages/golden/forward.py) and the C of their kernel calls (gen:
codegen's generator). conv.py registers them; their backward ops are conv.py's."""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.c_emit.literals import FLOAT_BOUNDS, CodegenError, flit
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops import fp16_io
from tinytrain.stages.golden.kernel_common import float_act, qparams
from tinytrain.stages.ops.layer_common import channel_multipliers, conv_geometry, padded, tap, weight_zp


# ---- numpy forward (ctx: executor._Ctx)

def _int8_out(ctx, acc: np.ndarray, b: np.ndarray | None, channels: int, act: str) -> np.ndarray:
    """A convolution's int8 output from its exact int64 accumulator: + the int32 bias, wrapped to int32 like the
    kernels' accumulator, requantized per output channel (channel_multipliers), + the output zero point, clamped
    to the fused activation's quantized range."""
    y_t = ctx.tout()
    if b is not None:
        acc = acc + b.astype(np.int64)
    mult, shift = channel_multipliers(ctx.tin(0), ctx.tin(1), y_t, channels)
    s_out, z_out = qparams(y_t)
    lo, hi = ia.activation_range(act, s_out, z_out)
    return ia.requantize(ia.wrap32(acc), mult, shift, z_out, lo, hi).astype(np.int8)


def _float_out(acc: np.ndarray, b: np.ndarray | None, act: str) -> np.ndarray:
    """A convolution's float32 output: + bias (added last, as the reference kernels), then the fused activation."""
    if b is not None:
        acc = acc + b.astype(np.float32)
    return float_act(acc, act).astype(np.float32)


def conv2d(ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, kh, kw, ci = w.shape
    if x.shape[3] != ci:
        raise NotImplementedError(f"grouped convolution (input depth {x.shape[3]}, filter depth {ci})")
    oh, ow, pt, pl, sh, sw, dh, dw = conv_geometry(ctx, x, kh, kw)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        _, zin = qparams(ctx.tin(0))
        # Skipped out-of-image taps == taps on (input - zero point) padded with 0.
        xs = x.astype(np.int64) - zin
        xp, _ = padded(xs, oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0)
        cols = np.concatenate([tap(xp, ky, kx, oh, ow, sh, sw, dh, dw)
                               for ky in range(kh) for kx in range(kw)], axis=-1)
        wz = w.astype(np.int64) - weight_zp(ctx.tin(1), o)[:, None, None, None]
        return [_int8_out(ctx, ia.exact_matmul(cols, wz.reshape(o, -1).T), b, o, act)]
    xp, _ = padded(x.astype(np.float32), oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0.0)
    wf = w.astype(np.float32)
    acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.float32)
    for ky in range(kh):
        for kx in range(kw):
            patch = tap(xp, ky, kx, oh, ow, sh, sw, dh, dw)
            for c in range(ci):
                acc += patch[..., c:c + 1] * wf[:, ky, kx, c]
    return [_float_out(acc, b, act)]


def depthwise_conv2d(ctx) -> list[np.ndarray]:
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    _, kh, kw, o = w.shape
    c_in = x.shape[3]
    mult = int(ctx.attrs.get("depth_multiplier", o // max(c_in, 1)) or 1)
    if o != c_in * mult:
        # Newer converters may write depth_multiplier 0/1 and let the filter shape decide.
        if o % c_in:
            raise ValueError(f"depthwise filter has {o} channels for {c_in} input channels")
        mult = o // c_in
    src = np.arange(o) // mult  # output channel ic * mult + m reads input channel ic
    oh, ow, pt, pl, sh, sw, dh, dw = conv_geometry(ctx, x, kh, kw)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        _, zin = qparams(ctx.tin(0))
        xs = (x.astype(np.int64) - zin)[..., src]
        xp, _ = padded(xs, oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0)
        wz = w[0].astype(np.int64) - weight_zp(ctx.tin(1), o)
        acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.int64)
        for ky in range(kh):
            for kx in range(kw):
                acc += tap(xp, ky, kx, oh, ow, sh, sw, dh, dw) * wz[ky, kx]
        return [_int8_out(ctx, acc, b, o, act)]
    xp, _ = padded(x.astype(np.float32)[..., src], oh, ow, pt, pl, kh, kw, sh, sw, dh, dw, 0.0)
    wf = w[0].astype(np.float32)
    acc = np.zeros((x.shape[0], oh, ow, o), dtype=np.float32)
    for ky in range(kh):
        for kx in range(kw):
            acc += tap(xp, ky, kx, oh, ow, sh, sw, dh, dw) * wf[ky, kx]
    return [_float_out(acc, b, act)]


def transpose_conv_geometry(attrs: dict, x_shape, y_shape, kh: int, kw: int) -> tuple[int, int, int, int]:
    """(stride_h, stride_w, pad_top, pad_left) of TRANSPOSE_CONV: ComputePaddingHeightWidth with the op's *output*
    as the convolution's input (transpose_conv.cc / TFLM Prepare), dilation 1; the odd SAME pixel lies after."""
    sh, sw = int(attrs["stride_h"]), int(attrs["stride_w"])
    _, pt = out_size_and_pad(attrs["padding"], int(y_shape[1]), kh, sh)
    _, pl = out_size_and_pad(attrs["padding"], int(y_shape[2]), kw, sw)
    return sh, sw, pt, pl


def transpose_conv(ctx) -> list[np.ndarray]:
    """reference_ops::TransposeConv (float) / reference_integer_ops::TransposeConv (int8, per channel): every input
    pixel scatters x * w[:, ky, kx, :] into the output at (iy*s - pad + ky, ix*s - pad + kx); taps outside the
    output are dropped; then bias, requantization (int8) and the activation clamp.
    float: accumulated in float32 in the reference's order for each output element (input row, input column,
    input channel ascending, i.e. ky and kx descending), starting from 0, bias added last: bit-equal to the
    reference. int8: the int32 scratch sum (exact here, wrapped to int32 like the reference's), per-channel
    MultiplyByQuantizedMultiplier, then the fused activation's quantized range as conv2d (older TFLite Micro and
    LiteRT sources passed kTfLiteActNone and clamped to the int8 range only; the runtimes we test against, LiteRT
    2.x and TFLite Micro, clamp to the activation: tests/test_transpose_conv.py checks both on a range wider than
    RELU6's). LiteRT and TFLite Micro agree on every case tested, so there is no runtime switch."""
    x, w, b = ctx.x(0), ctx.x(1), ctx.x(2)
    o, kh, kw, ci = w.shape
    if x.shape[3] != ci:
        raise ValueError(f"filter depth {ci} differs from the input depth {x.shape[3]}")
    y_t = ctx.tout()
    oh, ow = int(y_t.shape[1]), int(y_t.shape[2])
    sh, sw, pt, pl = transpose_conv_geometry(ctx.attrs, x.shape, y_t.shape, kh, kw)
    n, h, wd = x.shape[0], x.shape[1], x.shape[2]
    # Output buffer with every tap in range: rows [-pt, ...) of the output start at row 0 here.
    full_h = max((h - 1) * sh + kh, pt + oh)
    full_w = max((wd - 1) * sw + kw, pl + ow)
    act = ctx.attrs.get("act", "none")
    if ctx.quantized():
        _, zin = qparams(ctx.tin(0))
        xs = x.astype(np.int64) - zin
        wz = w.astype(np.int64)  # reference_integer_ops::TransposeConv applies no filter offset
        acc = np.zeros((n, full_h, full_w, o), dtype=np.int64)
        for ky in range(kh):
            for kx in range(kw):
                acc[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :] += xs @ wz[:, ky, kx, :].T
        # the reference's int32 scratch wraps; + bias and the wrap again commute with it (mod 2^32)
        return [_int8_out(ctx, acc[:, pt:pt + oh, pl:pl + ow, :], b, o, act)]
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    acc = np.zeros((n, full_h, full_w, o), dtype=np.float32)
    for ky in range(kh - 1, -1, -1):
        for kx in range(kw - 1, -1, -1):
            dst = acc[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :]
            for c in range(ci):
                dst += xf[..., c:c + 1] * wf[:, ky, kx, c]
    return [_float_out(np.ascontiguousarray(acc[:, pt:pt + oh, pl:pl + ow, :]), b, act)]


# ---- C (gen: codegen's generator; io: a row stream's sub-problem, codegen.stream_rows)

def reuses_weight_check(gen, op: Op) -> bool:
    """Whether op's row-stream call (io=, codegen.stream_rows) takes the name of an int32 that the stream sets to -1
    before its first row and the kernel keeps its weight check in: the fp16 forms with a float weight
    (tt_conv2d_*_rep, tt_depthwise_conv2d_hx_hy_rep; the Helium kernels check weight, bias and clamp once per
    stream run, which stays right for a trained weight: no update runs inside a forward stream)."""
    x, w, y = op.inputs[0], op.inputs[1], op.outputs[0]
    if gen.is_int8(x) or gen.is_int8(w):
        return False
    from tinytrain.stages import ops   # the registry (this module is imported while it is being built)

    hx, hy = fp16_io.is_f16(gen, x), gen.g.tensors[y].dtype == "float16"
    kind = ops.get(op.type).fast_float   # "conv" (conv2d) or "depthwise": the op names live in ops/conv.py
    if kind == "depthwise":
        return hx and hy
    return kind == "conv" and (hx or hy)


def c_conv2d(gen, op: Op, io: dict[str, str] | None = None) -> list[str]:
    x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
    y = op.outputs[0]
    o, kh, kw, ci = gen.g.tensors[w].shape
    d, xe, ye = gen.row_io(io, gen.conv_dims(op, x, y, kh, kw), x, y)
    bias = gen.loc(b) if b else "0"
    act = op.attrs.get("act", "none")
    if gen.is_int8(x):
        q = gen.requant(x, w, y, act, o)
        if w in gen.split:
            whole, part, n = gen.weight_args(w)
            return [f"tt_conv2d_s8_split({d}, &{q}, {xe}, {whole}, {part}, {n}, {bias}, {ye});"]
        return [f"tt_conv2d_s8({d}, &{q}, {xe}, {gen.loc(w)}, {bias}, {ye});"]
    lo, hi = FLOAT_BOUNDS[act]
    hx, hy = fp16_io.is_f16(gen, x), gen.g.tensors[y].dtype == "float16"
    if hx or hy:   # fp16-mixed: x widened as it is read, y rounded to fp16 on store (OpDef.fp16_operands / _output)
        whole, part, n = gen.weight_args(w) if w in gen.split else (gen.loc(w), gen.loc(w), 0)
        fn = {(False, True): "tt_conv2d_f32_split_hy", (True, False): "tt_conv2d_hx_f32_split",
              (True, True): "tt_conv2d_hx_hy_split"}[hx, hy]
        # the weight check kept: per row-stream run (reuses_weight_check), or for good where weight and bias are const
        ok = io.get("w_ok") if io is not None else gen.const_check_flag(w, *([b] if b else []))
        if ok is not None:
            return [f"{fn}_rep({d}, {flit(lo)}, {flit(hi)}, {xe}, {whole}, {part}, {n}, {bias}, &{ok}, {ye});"]
        return [f"{fn}({d}, {flit(lo)}, {flit(hi)}, {xe}, {whole}, {part}, {n}, {bias}, {ye});"]
    if w in gen.split:
        whole, part, n = gen.weight_args(w)
        return [f"tt_conv2d_f32_split({d}, {flit(lo)}, {flit(hi)}, {xe}, {whole}, {part}, {n}, {bias}, {ye});"]
    return [f"tt_conv2d_f32({d}, {flit(lo)}, {flit(hi)}, {xe}, {gen.loc(w)}, {bias}, {ye});"]


def c_depthwise_conv2d(gen, op: Op, io: dict[str, str] | None = None) -> list[str]:
    x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
    y = op.outputs[0]
    _, kh, kw, o = gen.g.tensors[w].shape
    mult = o // gen.g.tensors[x].shape[3]
    d = gen.conv_dims(op, x, y, kh, kw, mult)
    bias = gen.loc(b) if b else "0"
    act = op.attrs.get("act", "none")
    if io is not None:
        dd, xe, ye = gen.row_io(io, d, x, y)
        if fp16_io.both_f16(gen, x, y, "depthwise"):   # fp16-mixed's frozen prefix
            lo, hi = FLOAT_BOUNDS[act]
            if "w_ok" in io:   # reuses_weight_check
                return [f"tt_depthwise_conv2d_hx_hy_rep({dd}, {flit(lo)}, {flit(hi)}, {xe}, {gen.loc(w)}, {bias}, "
                        f"&{io['w_ok']}, {ye});"]
            return [f"tt_depthwise_conv2d_hx_hy({dd}, {flit(lo)}, {flit(hi)}, {xe}, {gen.loc(w)}, {bias}, {ye});"]
        if gen.is_int8(x):
            q = gen.requant(x, w, y, act, o)
            return [f"tt_depthwise_conv2d_s8({dd}, &{q}, {xe}, {gen.loc(w)}, {bias}, {ye});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_depthwise_conv2d_f32({dd}, {flit(lo)}, {flit(hi)}, {xe}, {gen.loc(w)}, {bias}, {ye});"]
    inplace = gen.same_place(x, y)
    if inplace:
        if y not in gen.scratch:
            raise CodegenError(f"in-place depthwise {y} has no scratch buffer in the plan")
        scr = f"({gen.ctype(y)} *)(tt_arena + {gen.scratch[y]})"
    if gen.is_int8(x):
        q = gen.requant(x, w, y, act, o)
        if inplace:
            return [f"tt_depthwise_conv2d_s8_inplace(&{d}, &{q}, {gen.loc(x)}, {gen.loc(w)}, {bias}, {scr});"]
        return [f"tt_depthwise_conv2d_s8(&{d}, &{q}, {gen.loc(x)}, {gen.loc(w)}, {bias}, {gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    if fp16_io.both_f16(gen, x, y, "depthwise"):
        if inplace:
            return [f"tt_depthwise_conv2d_hx_hy_inplace(&{d}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, {gen.loc(w)}, "
                    f"{bias}, {scr});"]
        return [f"tt_depthwise_conv2d_hx_hy(&{d}, {flit(lo)}, {flit(hi)}, {fp16_io.loc(gen, x)}, {gen.loc(w)}, "
                f"{bias}, {gen.loc(y)});"]
    if inplace:
        return [f"tt_depthwise_conv2d_f32_inplace(&{d}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, {gen.loc(w)}, "
                f"{bias}, {scr});"]
    return [f"tt_depthwise_conv2d_f32(&{d}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, {gen.loc(w)}, {bias}, "
            f"{gen.loc(y)});"]


def c_transpose_conv(gen, op: Op) -> list[str]:
    x, w = op.inputs[0], op.inputs[1]
    b = op.inputs[2] if len(op.inputs) > 2 else None
    y = op.outputs[0]
    o, kh, kw, _ = gen.g.tensors[w].shape
    d = gen.tconv_dims(op, x, y, kh, kw)
    bias = gen.loc(b) if b else "0"
    act = op.attrs.get("act", "none")
    if gen.is_int8(x):
        q = gen.requant(x, w, y, act, o)
        return [f"tt_transpose_conv_s8(&{d}, &{q}, {gen.loc(x)}, {gen.loc(w)}, {bias}, {gen.loc(y)});"]
    lo, hi = FLOAT_BOUNDS[act]
    return [f"tt_transpose_conv_f32(&{d}, {flit(lo)}, {flit(hi)}, {gen.loc(x)}, {gen.loc(w)}, {bias}, "
            f"{gen.loc(y)});"]
