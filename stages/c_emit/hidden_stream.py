"""The C of a hidden-channel stream (stages/planning/channel_stream.py): one loop over the hidden channels `o`,
each iteration computing channel o of every gradient of the chain into its one-plane buffer
(kernels_c/tt_hidden_stream.h), the bias gradients' element o, row o of each 1x1 weight gradient and its update,
and adding channel o's share to each 1x1 input gradient the chain ends in (zeroed before the loop). In each
iteration the chain's ops run in schedule order, then the ends' accumulations, then the weight rows (whose
update must follow the accumulation that reads the old row)."""

from __future__ import annotations

from tinytrain.stages import ops
from tinytrain.stages.c_emit.literals import CodegenError, flit
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Op, numel
from tinytrain.stages.planning.arena import ALIGN
from tinytrain.stages.planning.channel_stream import MAX_TAPS
from tinytrain.stages.planning.streams import Stream

ROLES = ops.HIDDEN_ROLES


def _weight(gen, w: str, axis: int, channels: int) -> str:
    """The weight arguments (w, wpart, wq, part, n, scale, zero_point) of a tt_hs kernel: float, or int8 read
    through its fused dequantize (split weights: the whole flash original, the trained slice and its width)."""
    if w in gen.fused:
        wq = gen.fused[w]
        sc, zp = gen.dq_tables(wq, axis, channels)
        whole, part, n = gen.weight_args(wq)
        return f"0, 0, {whole}, {part}, {n}, {sc}, {zp}"
    whole, part, n = gen.weight_args(w)
    return f"{whole}, {part}, 0, 0, {n}, 0, 0"


def _start(gen, op: Op, c: int) -> list[str]:
    dz, w, h = op.inputs[0], op.inputs[1], op.outputs[0]
    k = int(gen.g.tensors[dz].shape[3])
    p = numel(gen.g.tensors[dz].shape) // k
    return [f"tt_hs_pw_grad_in_f32({p}, {k}, {c}, o, {gen.loc(dz)}, {_weight(gen, w, 0, k)}, {gen.loc(h)});"]


def _start_mask(gen, start: Op, rest: list[Op], c: int) -> tuple[list[str], int] | None:
    """The start's plane read only by a 1-bit mask right after it (and that mask's plane summed next by a bias
    gradient): one call that computes only the pixels the mask keeps (tt_hs_pw_grad_in_mask_f32), and how many
    ops of `rest` it covers; or None."""
    dz, w, h = start.inputs[0], start.inputs[1], start.outputs[0]
    if not rest or ROLES.get(rest[0].type) != "mask" or rest[0].inputs[0] != h:
        return None
    mop = rest[0]
    if gen.g.tensors[mop.inputs[1]].dtype != "uint8" or sum(h in op.inputs for op in rest) != 1:
        return None
    k = int(gen.g.tensors[dz].shape[3])
    p = numel(gen.g.tensors[dz].shape) // k
    if p != numel(gen.g.tensors[h].shape) // c:
        return None
    sop = rest[1] if len(rest) > 1 else None
    summed = sop is not None and ROLES.get(sop.type) == "sum" and sop.inputs[0] == mop.outputs[0]
    db = f"{gen.loc(sop.outputs[0])} + o" if summed else "0"
    return ([f"tt_hs_pw_grad_in_mask_f32({p}, {k}, {c}, o, {gen.loc(dz)}, {_weight(gen, w, 0, k)}, "
             f"{gen.loc(mop.inputs[1])}, {gen.loc(mop.outputs[0])}, {db});"], 2 if summed else 1)


def _mask(gen, op: Op, c: int) -> list[str]:
    dy, m, dz = op.inputs[0], op.inputs[1], op.outputs[0]
    p = numel(gen.g.tensors[dy].shape) // c
    if gen.g.tensors[m].dtype == "uint8":
        return [f"tt_hs_mask_grad_f32({p}, {c}, o, {gen.loc(m)}, {gen.loc(dy)}, {gen.loc(dz)});"]
    return [f"tt_hs_int8_clamp_grad_f32({p}, {c}, o, {int(op.attrs['lo'])}, {int(op.attrs['hi'])}, "
            f"{gen.loc(dy)}, {gen.loc(m)}, {gen.loc(dz)});"]


def _mask_sum(gen, op: Op, sop: Op, c: int) -> list[str] | None:
    """A 1-bit mask whose plane a bias gradient sums next: both in one pass (tt_hs_mask_bias_grad_f32), or None."""
    dy, m, dz = op.inputs[0], op.inputs[1], op.outputs[0]
    if gen.g.tensors[m].dtype != "uint8" or ROLES.get(sop.type) != "sum" or sop.inputs[0] != dz:
        return None
    p = numel(gen.g.tensors[dy].shape) // c
    return [f"tt_hs_mask_bias_grad_f32({p}, {c}, o, {gen.loc(m)}, {gen.loc(dy)}, {gen.loc(dz)}, "
            f"{gen.loc(sop.outputs[0])} + o);"]


def _depthwise(gen, op: Op, c: int) -> list[str]:
    dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    a = op.attrs
    xs, ws = gen.g.tensors[dx].shape, gen.g.tensors[w].shape
    kh, kw = int(ws[1]), int(ws[2])
    if kh * kw > MAX_TAPS:
        raise CodegenError(f"hidden stream: depthwise filter of {kh}x{kw} taps (at most {MAX_TAPS})")
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
    oh, pt = out_size_and_pad(a["padding"], int(xs[1]), kh, sh, dh)
    ow, pl = out_size_and_pad(a["padding"], int(xs[2]), kw, sw, dw)
    d = gen.uid("tt_cd")
    gen.globals.append(f"static const tt_conv_dims {d} = {{1, {xs[1]}, {xs[2]}, 1, {oh}, {ow}, 1, {kh}, {kw}, "
                       f"{sh}, {sw}, {dh}, {dw}, {pt}, {pl}, 1}};")
    if w in gen.fused:
        wq = gen.fused[w]
        sc, zp = gen.dq_tables(wq, 3, c)
        taps = f"0, {gen.loc(wq)}, {sc}, {zp}"
    else:
        taps = f"{gen.loc(w)}, 0, 0, 0"
    return [f"{{ float tt_wc[{kh * kw}];",
            f"  tt_hs_dw_taps({kh * kw}, {c}, o, {taps}, tt_wc);",
            f"  tt_depthwise_conv2d_grad_input_channel_f32(&{d}, {gen.loc(dz)}, tt_wc, 1, 0, 0, 0.0f, {gen.loc(dx)}, 1, 0); }}"]


def _sum(gen, op: Op, c: int) -> list[str]:
    dz, db = op.inputs[0], op.outputs[0]
    p = numel(gen.g.tensors[dz].shape) // c
    return [f"tt_bias_grad_f32({p}, 1, {gen.loc(dz)}, {gen.loc(db)} + o);"]


def _end(gen, op: Op, c: int) -> list[str]:
    dh, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
    ic = int(gen.g.tensors[dx].shape[3])
    p = numel(gen.g.tensors[dx].shape) // ic
    return [f"tt_hs_pw_grad_in_acc_f32({p}, {ic}, o, {gen.loc(dh)}, {_weight(gen, w, 0, c)}, {gen.loc(dx)});"]


def _free_arena(gen, st: Stream, need: int, taken: list[tuple[int, int]]) -> int | None:
    """An arena offset of `need` bytes that no buffer of the memory plan holds while stream `st` runs (its schedule
    steps [a, b]: buffers live over [start, end], both inclusive) nor `taken` (offset, size) already gives out, or
    None. The plan is not changed: the arena's size and every planned buffer stay as they are; the stream only
    uses room that sits idle during it. Offsets are rounded up to the plan's buffer alignment (arena.ALIGN)."""
    pos = {i: s for s, i in enumerate(gen.order)}
    a, b = min(pos[i] for i in st.ops), max(pos[i] for i in st.ops)
    used = sorted([(int(buf["offset"]), int(buf["offset"]) + int(buf["size"])) for buf in gen.plan["buffers"]
                   if int(buf["size"]) > 0 and int(buf["start"]) <= b and int(buf["end"]) >= a]
                  + [(o, o + n) for o, n in taken])
    at = 0
    for lo, hi in used:
        if lo - at >= need:
            break
        at = max(at, -(-hi // ALIGN) * ALIGN)
    return at if at + need <= gen.arena else None


def _weight_row(gen, gop: Op, uop: Op, c: int, st: Stream, pre: list[str],
                taken: list[tuple[int, int]]) -> list[str]:
    """Row o of a 1x1 weight gradient (the gradient plane as a one-channel dz) and its update (as a channels
    stream's: codegen.channel_offsets). An int8 input is dequantized once before the loop into arena room the
    stream leaves idle (_free_arena), when there is enough, instead of once per channel: the same floats."""
    dz, x, dw = gop.inputs[0], gop.inputs[1], gop.outputs[0]
    k = int(gop.attrs.get("in_channels") or gop.attrs["w_shape"][3])
    xq = gen.fused.get(x)
    xs = gen.g.tensors[xq if xq is not None else x].shape
    p = int(xs[1]) * int(xs[2])
    int8_x = xq is not None and gen.g.tensors[xq].dtype == "int8"
    at = _free_arena(gen, st, p * k * 4, taken) if int8_x and k > 0 else None
    if at is not None:
        s, z = gen.qp(xq)
        taken.append((at, p * k * 4))
        xf = f"((float *)(tt_arena + {at}))"
        pre.append(f"tt_hs_dequant_rows({p}, {xs[3]}, {k}, {gen.loc(xq)}, {flit(s)}, {z}, {xf});")
        return [f"tt_hs_pw_grad_w_f32({p}, {k}, {gen.loc(dz)}, {xf}, {gen.loc(dw)});"] + gen.update_row(uop, dw, c)
    d = gen.uid("tt_cd")
    gen.globals.append(f"static const tt_conv_dims {d} = {{1, {xs[1]}, {xs[2]}, {xs[3]}, {xs[1]}, {xs[2]}, 1, "
                       f"1, 1, 1, 1, 1, 1, 0, 0, 1}};")
    if xq is not None and gen.g.tensors[xq].dtype == "float16":   # fp16-mixed: the saved fp16 input itself
        grad = [f"tt_conv2d_grad_weight_hx_f32_range(&{d}, {k}, 0, 1, {gen.loc(dz)}, {gen.loc(xq)}, {gen.loc(dw)});"]
    elif xq is not None:
        s, z = gen.qp(xq)
        grad = [f"tt_conv2d_grad_weight_qx_f32_range(&{d}, {k}, 0, 1, {gen.loc(dz)}, {gen.loc(xq)}, {flit(s)}, "
                f"{z}, {gen.loc(dw)});"]
    else:
        grad = [f"tt_conv2d_grad_weight_f32_range(&{d}, {k}, 0, 1, {gen.loc(dz)}, {gen.loc(x)}, {gen.loc(dw)});"]
    return grad + gen.update_row(uop, dw, c)


def _check_fp32(gen, st: Stream, members: list[Op]) -> None:
    """The tt_hs_* kernels read and write fp32 (their int8 operands through fused dequantizes): a float16 tensor
    of a member op, or one a member reads through a fused widen, has no hidden-stream C. The one exception is the
    weight gradient's saved input, which _weight_row reads as fp16 itself (tt_conv2d_grad_weight_hx_f32_range)."""
    for op in members:
        for t in [*op.inputs, *op.outputs]:
            if t is None or (ROLES.get(op.type) == "weight" and len(op.inputs) > 1 and t == op.inputs[1]):
                continue
            for name in (t, gen.fused.get(t)):
                if name is not None and gen.g.tensors[name].dtype == "float16":
                    raise CodegenError(f"hidden stream {st.ops}: {op.type} tensor {name} is float16 "
                                       f"(the hidden-channel kernels are fp32 only)")


def stream_hidden(gen, st: Stream) -> list[str]:
    c = int(st.info["channels"])
    members = [gen.g.ops[i] for i in st.ops]
    _check_fp32(gen, st, members)
    start = members[0]
    if ROLES.get(start.type) != "mix":
        raise CodegenError(f"hidden stream {st.ops}: does not start with a 1x1 input gradient")
    updates = {op.inputs[1]: op for op in members if op.type in ops.UPDATE_OPS}
    rest = [op for op in members[1:] if op.type not in ops.UPDATE_OPS]
    fused: set[int] = set()  # ops already emitted with the one before them
    first = _start_mask(gen, start, rest, c)
    if first is not None:
        body, n_fused = first
        fused.update(range(n_fused))
    else:
        body = _start(gen, start, c)
    ends, rows, zero = [], [], []
    taken: list[tuple[int, int]] = []  # idle arena room given to float copies (_weight_row)
    for j, op in enumerate(rest):
        role = ROLES.get(op.type)
        if j in fused:
            continue
        if role == "mask":
            both = _mask_sum(gen, op, rest[j + 1], c) if j + 1 < len(rest) else None
            if both is not None:
                body += both
                fused.add(j + 1)
                continue
            body += _mask(gen, op, c)
        elif role == "channel":
            body += _depthwise(gen, op, c)
        elif role == "sum":
            body += _sum(gen, op, c)
        elif role == "mix":
            zero.append(f"memset({gen.loc(op.outputs[0])}, 0, {numel(gen.g.tensors[op.outputs[0]].shape) * 4});")
            ends += _end(gen, op, c)
        elif role == "weight":
            rows += _weight_row(gen, op, updates[op.outputs[0]], c, st, zero, taken)
        else:
            raise CodegenError(f"hidden stream {st.ops}: op {op.type} has no hidden-channel C")
    return ["{ int32_t o;", *["  " + ln for ln in zero], f"  for (o = 0; o < {c}; ++o) {{",
            *["    " + ln for ln in body + ends + rows], "  }", "}"]
