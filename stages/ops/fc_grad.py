"""The C of fully_connected's gradient ops (OpDef.c; gen: codegen's generator): the input gradient reads a
fused int8 weight directly (`_qw_f32`); the weight gradient reads the k trained columns of x (the int8 path's
dequantized slice holds only those) and computes one output channel `o` inside a channel stream."""

from __future__ import annotations

from tinytrain.stages.c_emit.literals import CodegenError, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops import fp16_io


def c_fully_connected_grad_input(gen, op: Op) -> list[str]:
    dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    o, depth = gen.g.tensors[w].shape
    rows = numel(gen.g.tensors[dx].shape) // depth
    if fp16_io.is_f16(gen, dz) or gen.g.tensors[dx].dtype == "float16":   # fp16-mixed (OpDef.fp16_operands / _output)
        if w in gen.fused:
            raise CodegenError(f"fully_connected_grad_input {dx}: an fp16 gradient with an int8 weight")
        return [f"tt_fully_connected_grad_input_f16({rows}, {depth}, {o}, {fp16_io.pair(gen, dz)}, {gen.loc(w)}, "
                f"{fp16_io.pair(gen, dx, True)});"]
    if w in gen.fused:
        wq = gen.fused[w]
        sc, zp = gen.dq_tables(wq, 0, o)
        return [f"tt_fully_connected_grad_input_qw_f32({rows}, {depth}, {o}, {gen.loc(dz)}, {gen.loc(wq)}, "
                f"{sc}, {zp}, {gen.loc(dx)});"]
    return [f"tt_fully_connected_grad_input_f32({rows}, {depth}, {o}, {gen.loc(dz)}, {gen.loc(w)}, "
            f"{gen.loc(dx)});"]


def c_fully_connected_grad_weight(gen, op: Op) -> list[str]:
    dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
    o, depth = op.attrs["w_shape"]
    k = int(op.attrs.get("in_channels") or depth)
    rows = numel(gen.g.tensors[dz].shape) // o
    xdepth = numel(gen.g.tensors[x].shape) // rows  # the int8 path hands over only the k trained columns
    if xdepth == k and k != depth:
        depth_arg = k
    else:
        depth_arg = depth
    if fp16_io.is_f16(gen, dz):   # fp16-mixed: dz written as fp16 by its kernel (OpDef.fp16_operands)
        if x in gen.fused and not fp16_io.is_f16(gen, x):
            raise CodegenError(f"fully_connected_grad_weight {dw}: an fp16 gradient with an int8 input")
        o0, o1 = ("o", "o + 1") if gen.chunk_rows is not None else ("0", str(o))
        return [f"tt_fully_connected_grad_weight_hdy_range({rows}, {depth_arg}, {o}, {k}, {o0}, {o1}, "
                f"{fp16_io.loc(gen, dz)}, {fp16_io.pair(gen, x)}, {gen.loc(dw)});"]
    if x in gen.fused:   # fp16-mixed: the saved fp16 input itself (fp16_memory.fused_widen)
        o0, o1 = ("o", "o + 1") if gen.chunk_rows is not None else ("0", str(o))
        return [f"tt_fully_connected_grad_weight_hx_f32_range({rows}, {depth_arg}, {o}, {k}, {o0}, {o1}, "
                f"{gen.loc(dz)}, {gen.loc(gen.fused[x])}, {gen.loc(dw)});"]
    if gen.chunk_rows is not None:
        return [f"tt_fully_connected_grad_weight_f32_range({rows}, {depth_arg}, {o}, {k}, o, o + 1, "
                f"{gen.loc(dz)}, {gen.loc(x)}, {gen.loc(dw)});"]
    return [f"tt_fully_connected_grad_weight_f32({rows}, {depth_arg}, {o}, {k}, {gen.loc(dz)}, {gen.loc(x)}, "
            f"{gen.loc(dw)});"]
