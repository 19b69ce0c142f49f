"""The C of the convolutions' gradient ops (OpDef.c of conv2d_grad_input / _weight, depthwise_conv2d_grad_input /
_weight, transpose_conv_grad_input / _weight; gen: codegen's generator). An input gradient whose int8 weight
memplan.fused_dequantize fuses reads the int8 weight (`*_qw_f32` kernels, split weights included); a conv2d weight
gradient whose per-tensor int8 input is fused reads that input (`_qx_f32_range`); inside a channel stream
(gen.chunk_rows) weight gradients compute one output channel `o`."""

from __future__ import annotations

from tinytrain.stages.c_emit.literals import CodegenError, flit
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops import fp16_io


def c_transpose_conv_grad_input(gen, op: Op) -> list[str]:
    dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    _, kh, kw, _ = gen.g.tensors[w].shape
    d = gen.tconv_dims(op, dx, dz, kh, kw)
    return [f"tt_transpose_conv_grad_input_f32(&{d}, {gen.loc(dz)}, {gen.loc(w)}, {gen.loc(dx)});"]


def c_transpose_conv_grad_weight(gen, op: Op) -> list[str]:
    dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
    o, kh, kw, ci = [int(v) for v in op.attrs["w_shape"]]
    k = int(op.attrs.get("in_channels", ci))
    if int(gen.g.tensors[x].shape[-1]) != ci:
        raise CodegenError(f"transpose_conv_grad_weight {dw!r}: reads a {gen.g.tensors[x].shape} input "
                           f"(a sliced int8 input is not supported)")
    d = gen.tconv_dims(op, x, dz, kh, kw)
    return [f"tt_transpose_conv_grad_weight_f32(&{d}, {k}, {gen.loc(dz)}, {gen.loc(x)}, {gen.loc(dw)});"]


def _grad_geo(gen, op: Op, x_shape, w_shape, dy: str, depthwise: bool, in_c: int | None = None,
              mult: int | None = None) -> str:
    """tt_conv_dims of the forward conv from the gradient op's attrs (x: the forward input's shape; mult: a
    depthwise multiplier known otherwise)."""
    a = op.attrs
    kh, kw = w_shape[1], w_shape[2]
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
    oh, pt = out_size_and_pad(a["padding"], x_shape[1], kh, sh, dh)
    ow, pl = out_size_and_pad(a["padding"], x_shape[2], kw, sw, dw)
    ys = gen.g.tensors[dy].shape
    c_in = x_shape[3] if in_c is None else in_c
    mult = mult or (int(a.get("multiplier") or a.get("depth_multiplier") or w_shape[3] // x_shape[3])
                    if depthwise else 1)
    name = gen.uid("tt_cd")
    gen.globals.append(f"static const tt_conv_dims {name} = {{{x_shape[0]}, {x_shape[1]}, {x_shape[2]}, {c_in}, "
                        f"{oh}, {ow}, {ys[3]}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {pt}, {pl}, {mult}}};")
    return name


def reuses_weight_check(gen, op: Op) -> bool:
    """Whether c_conv2d_grad_input, called once per input pixel with the same weight (the positions stream, io=),
    takes the name of an int32 (declared -1 before the loop) that keeps the kernel's weight check for the next call:
    fp16 dy and dx (tt_conv2d_grad_input_hdy_split_hdx_rep; the Helium walk checks its weight once per stream)."""
    return fp16_io.is_f16(gen, op.inputs[0]) and gen.g.tensors[op.outputs[0]].dtype == "float16"


def c_conv2d_grad_input(gen, op: Op, io: dict[str, str] | None = None) -> list[str]:
    """io (the positions stream): the dims, dz and dx expressions of one input pixel, and "w_ok" where
    reuses_weight_check holds."""
    dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    if io is None:
        d = "&" + _grad_geo(gen, op, gen.g.tensors[dx].shape, gen.g.tensors[w].shape, dz, False)
        dze, dxe = gen.loc(dz), gen.loc(dx)
    else:
        d, dze, dxe = io["d"], io["dz"], io["dx"]
    hdy, hdx = fp16_io.is_f16(gen, dz), gen.g.tensors[dx].dtype == "float16"
    if hdy or hdx:   # fp16-mixed: dz widened as it is read, dx rounded as it is stored (OpDef.fp16_operands / _output)
        if w in gen.fused:
            raise CodegenError("conv2d_grad_input: an fp16 gradient with an int8 weight (fp16-mixed trains floats)")
        whole, part, n = gen.weight_args(w) if w in gen.split else (gen.loc(w), gen.loc(w), 0)
        dze = dze if io is not None else fp16_io.loc(gen, dz)
        fn = {(True, False): "tt_conv2d_grad_input_hdy_f32_split", (False, True): "tt_conv2d_grad_input_f32_split_hdx",
              (True, True): "tt_conv2d_grad_input_hdy_split_hdx"}[hdy, hdx]
        if io is not None and "w_ok" in io:
            return [f"{fn}_rep({d}, {dze}, {whole}, {part}, {n}, &{io['w_ok']}, {dxe});"]
        if io is None and hdy:   # an fp16 dy: only the weight is checked, and a const weight once for good
            ok = gen.const_check_flag(w)
            if ok is not None:
                return [f"{fn}_rep({d}, {dze}, {whole}, {part}, {n}, &{ok}, {dxe});"]
        return [f"{fn}({d}, {dze}, {whole}, {part}, {n}, {dxe});"]
    if w in gen.fused:
        wq = gen.fused[w]
        sc, zp = gen.dq_tables(wq, 0, gen.g.tensors[wq].shape[0])
        whole, part, n = gen.weight_args(wq)
        return [f"tt_conv2d_grad_input_qw_f32({d}, {dze}, {whole}, {part}, {n}, {sc}, {zp}, {dxe});"]
    if w in gen.split:
        whole, part, n = gen.weight_args(w)
        return [f"tt_conv2d_grad_input_f32_split({d}, {dze}, {whole}, {part}, {n}, {dxe});"]
    return [f"tt_conv2d_grad_input_f32({d}, {dze}, {gen.loc(w)}, {dxe});"]


def c_depthwise_conv2d_grad_input(gen, op: Op) -> list[str]:
    dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    ws = gen.g.tensors[w].shape
    xs = gen.g.tensors[dx].shape
    d = _grad_geo(gen, op, xs, ws, dz, True)
    # memplan may put dx over a dying dz (depth multiplier 1): channel by channel through a scratch channel
    inplace = gen.same_place(dz, dx)
    if inplace and dx not in gen.scratch:
        raise CodegenError(f"in-place depthwise input gradient {dx} has no scratch buffer in the plan")
    scr = f"({gen.ctype(dx)} *)(tt_arena + {gen.scratch[dx]})" if inplace else ""
    if fp16_io.both_f16(gen, dz, dx, "depthwise input gradient"):
        if w in gen.fused:
            raise CodegenError(f"depthwise input gradient {dx}: fp16 with an int8 weight")
        if inplace:
            return [f"tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(&{d}, {gen.loc(dx)}, {gen.loc(w)}, {scr});"]
        return [f"tt_depthwise_conv2d_grad_input_hdy_hdx(&{d}, {fp16_io.loc(gen, dz)}, {gen.loc(w)}, "
                f"{gen.loc(dx)});"]
    if w in gen.fused:
        wq = gen.fused[w]
        sc, zp = gen.dq_tables(wq, 3, ws[3])
        if inplace:
            return [f"tt_depthwise_conv2d_grad_input_qw_f32_inplace(&{d}, {gen.loc(dx)}, {gen.loc(wq)}, {sc}, "
                    f"{zp}, {scr});"]
        return [f"tt_depthwise_conv2d_grad_input_qw_f32(&{d}, {gen.loc(dz)}, {gen.loc(wq)}, {sc}, {zp}, "
                f"{gen.loc(dx)});"]
    if inplace:
        return [f"tt_depthwise_conv2d_grad_input_f32_inplace(&{d}, {gen.loc(dx)}, {gen.loc(w)}, {scr});"]
    return [f"tt_depthwise_conv2d_grad_input_f32(&{d}, {gen.loc(dz)}, {gen.loc(w)}, {gen.loc(dx)});"]


def c_conv2d_grad_weight(gen, op: Op) -> list[str]:
    dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
    ws = list(op.attrs["w_shape"])
    k = int(op.attrs.get("in_channels") or ws[3])
    if fp16_io.is_f16(gen, dz):   # fp16-mixed: dz written as fp16 by its kernel, widened as it is read
        if x in gen.fused and gen.g.tensors[gen.fused[x]].dtype != "float16":
            raise CodegenError(f"conv2d_grad_weight {dw}: an fp16 gradient with an int8 input (fp16-mixed trains "
                               f"floats)")
        hx = fp16_io.is_f16(gen, x)
        d = _grad_geo(gen, op, gen.g.tensors[x].shape, ws, dz, False, in_c=gen.g.tensors[x].shape[3])
        o0, o1 = ("o", "o + 1") if gen.chunk_rows is not None else ("0", str(ws[0]))
        fn = "tt_conv2d_grad_weight_hdy_hx_f32_range" if hx else "tt_conv2d_grad_weight_hdy_f32_range"
        return [f"{fn}(&{d}, {k}, {o0}, {o1}, {fp16_io.loc(gen, dz)}, {fp16_io.loc(gen, x)}, {gen.loc(dw)});"]
    if x in gen.fused and gen.g.tensors[gen.fused[x]].dtype == "float16":   # fp16-mixed: the saved fp16 input itself
        d = _grad_geo(gen, op, gen.g.tensors[x].shape, ws, dz, False, in_c=gen.g.tensors[x].shape[3])
        o0, o1 = ("o", "o + 1") if gen.chunk_rows is not None else ("0", str(ws[0]))
        return [f"tt_conv2d_grad_weight_hx_f32_range(&{d}, {k}, {o0}, {o1}, {gen.loc(dz)}, {gen.loc(gen.fused[x])}, "
                f"{gen.loc(dw)});"]
    if x in gen.fused:  # the int8 activation itself, all its channels (memplan.fused_input_dequantize)
        xq = gen.fused[x]
        xs = gen.g.tensors[xq].shape
        d = _grad_geo(gen, op, xs, ws, dz, False, in_c=xs[3])
        s, z = gen.qp(xq)
        o0, o1 = ("o", "o + 1") if gen.chunk_rows is not None else ("0", str(ws[0]))
        return [f"tt_conv2d_grad_weight_qx_f32_range(&{d}, {k}, {o0}, {o1}, {gen.loc(dz)}, {gen.loc(xq)}, "
                f"{flit(s)}, {z}, {gen.loc(dw)});"]
    xs = gen.g.tensors[x].shape
    d = _grad_geo(gen, op, xs, ws, dz, False, in_c=xs[3])
    if gen.chunk_rows is not None:
        return [f"tt_conv2d_grad_weight_f32_range(&{d}, {k}, o, o + 1, {gen.loc(dz)}, {gen.loc(x)}, "
                f"{gen.loc(dw)});"]
    return [f"tt_conv2d_grad_weight_f32(&{d}, {k}, {gen.loc(dz)}, {gen.loc(x)}, {gen.loc(dw)});"]


def c_depthwise_conv2d_grad_weight(gen, op: Op) -> list[str]:
    dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
    ws = list(op.attrs["w_shape"])
    xs = gen.g.tensors[x].shape
    k = int(op.attrs.get("in_channels") or xs[3])
    name = _grad_geo(gen, op, xs, ws, dz, True, mult=int(op.attrs.get("multiplier") or 0) or ws[3] // xs[3])
    if fp16_io.is_f16(gen, dz):   # fp16-mixed: dz written as fp16 by its kernel, widened as it is read; x either
        if x in gen.fused and gen.g.tensors[gen.fused[x]].dtype != "float16":
            raise CodegenError(f"depthwise_conv2d_grad_weight {dw}: an fp16 gradient with an int8 input (fp16-mixed "
                               f"trains floats)")
        return [f"tt_depthwise_conv2d_grad_weight_hdy_f32(&{name}, {k}, {fp16_io.loc(gen, dz)}, "
                f"{fp16_io.pair(gen, x)}, {gen.loc(dw)});"]
    if fp16_io.is_f16(gen, x):   # fp16-mixed: the saved fp16 input itself
        return [f"tt_depthwise_conv2d_grad_weight_hx_f32(&{name}, {k}, {gen.loc(dz)}, {fp16_io.loc(gen, x)}, "
                f"{gen.loc(dw)});"]
    return [f"tt_depthwise_conv2d_grad_weight_f32(&{name}, {k}, {gen.loc(dz)}, {gen.loc(x)}, {gen.loc(dw)});"]
