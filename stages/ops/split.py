"""SPLIT and SPLIT_V: one input cut along one axis into several outputs (pure data movement: int8 outputs keep the
input's parameters), and their backward, the concatenation of the outputs' gradients (zeros for an output no
gradient reaches).

IR operands as in the file (the writer writes them back unchanged): split_even (SPLIT) [axis, x], split_v
[x, size_splits, axis]. The reader resolves the attrs: `axis` (non-negative, never the batch axis 0) and
`sizes`, one extent per output.
"""

from __future__ import annotations

import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions

from tinytrain.stages.c_emit.literals import CodegenError, numel
from tinytrain.stages.model.ir import Op
from tinytrain.stages.ops.base import Builtin, OpDef

_DATA = {"split_even": 1, "split_v": 0}   # which operand is the tensor cut


def data_input(op: Op) -> str:
    return op.inputs[_DATA[op.type]]


# ---- numpy

def _forward(ctx) -> list[np.ndarray]:
    x = ctx.x(_DATA[ctx.op.type])
    cuts = np.cumsum(ctx.attrs["sizes"])[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=int(ctx.attrs["axis"]))]


def _run_grad(op, v, shape, tensor):
    a = op.attrs
    dx = np.zeros(shape(op.outputs[0]), np.float32)
    axis, offsets = int(a["axis"]), np.concatenate([[0], np.cumsum(a["sizes"])])
    for k, j in enumerate(a["which"]):
        index = [slice(None)] * dx.ndim
        index[axis] = slice(int(offsets[j]), int(offsets[j + 1]))
        dx[tuple(index)] = v(k)
    return [dx]


def _backward(bb, op, i, dz):
    """dz: one gradient per output (None where none flows)."""
    dx = bb.share(data_input(op), i)
    parts = [(j, d) for j, d in enumerate(dz) if d is not None]
    if dx and parts:
        bb.emit("split_grad", [d for _, d in parts], [dx], axis=int(op.attrs["axis"]),
                sizes=[int(s) for s in op.attrs["sizes"]], which=[j for j, _ in parts])


# ---- .tflite options

def _axis(c, t, rank: int) -> int:
    if t is None or t.data is None or np.asarray(t.data).size != 1:
        raise c.err("the axis operand must be a constant scalar")
    axis = int(np.asarray(t.data).reshape(-1)[0])
    axis = axis + rank if axis < 0 else axis
    if not 1 <= axis < rank:
        raise c.err(f"split along axis {axis} of a rank-{rank} tensor (axis 0 is the batch)")
    return axis


def _check(c, sizes: list[int], extent: int) -> list[int]:
    if len(sizes) != len(c.outs) or any(s < 0 for s in sizes) or sum(sizes) != extent:
        raise c.err(f"split sizes {sizes} do not cut an extent of {extent} into {len(c.outs)} outputs")
    return sizes


def _read_split(c) -> dict:
    x = c.ins[1]
    axis = _axis(c, c.ins[0], len(x.shape))
    n = int(c.options(tflite.SplitOptions, BuiltinOptions.SplitOptions).NumSplits())
    if n != len(c.outs) or n < 1 or x.shape[axis] % n:
        raise c.err(f"num_splits {n} does not split {x.shape[axis]} evenly into {len(c.outs)} outputs")
    return {"axis": axis, "sizes": _check(c, [x.shape[axis] // n] * n, x.shape[axis])}


def _read_split_v(c) -> dict:
    x, sz = c.ins[0], c.ins[1]
    axis = _axis(c, c.ins[2], len(x.shape))
    if sz is None or sz.data is None:
        raise c.err("size_splits must be a constant")
    sizes = [int(s) for s in np.asarray(sz.data).reshape(-1)]
    if sizes.count(-1) == 1:   # one size may be -1: the rest of the axis
        sizes[sizes.index(-1)] = x.shape[axis] - (sum(sizes) + 1)
    return {"axis": axis, "sizes": _check(c, sizes, x.shape[axis])}


def _write_split(b, op):
    tflite.SplitOptionsStart(b)
    tflite.SplitOptionsAddNumSplits(b, len(op.outputs))
    return BuiltinOptions.SplitOptions, tflite.SplitOptionsEnd(b)


def _write_split_v(b, op):
    tflite.SplitVOptionsStart(b)
    tflite.SplitVOptionsAddNumSplits(b, len(op.outputs))
    return BuiltinOptions.SplitVOptions, tflite.SplitVOptionsEnd(b)


def _version(graph, op) -> int:
    """op_version.cc: int8 2 (int16 3 for SPLIT, not produced here); else 1."""
    return 2 if graph.tensors[data_input(op)].dtype == "int8" else 1


# ---- C (gen: codegen's generator); kernels_c/ops/tt_split_even.c (split_v shares it)

def _geometry(gen, x: str, axis: int, sizes: list[int]) -> tuple[str, int]:
    """(const table of each part's contiguous run: size * the elements after the axis, the runs' count)."""
    xs = [int(d) for d in gen.g.tensors[x].shape]
    rest = numel(xs[axis + 1:])
    return gen.const_table("tt_inner", "int32_t", [int(s) * rest for s in sizes]), numel(xs[:axis])


def _c(gen, op: Op) -> list[str]:
    x = data_input(op)
    if any(gen.same_place(x, y) for y in op.outputs):
        raise CodegenError(f"{op.type} {op.outputs[0]!r} planned in place over its input (the kernel cannot)")
    inner, outer = _geometry(gen, x, int(op.attrs["axis"]), op.attrs["sizes"])
    ct, suffix = gen.ctype(x), "s8" if gen.is_int8(x) else "f32"
    ptrs = gen.uid("tt_out")
    return [f"{{ {ct} *const {ptrs}[{len(op.outputs)}] = {{{', '.join(gen.loc(y) for y in op.outputs)}}};",
            f"  tt_split_{suffix}({len(op.outputs)}, {inner}, {outer}, {gen.loc(x)}, {ptrs}); }}"]


def _c_grad(gen, op: Op) -> list[str]:
    dx = op.outputs[0]
    sizes, which = op.attrs["sizes"], [int(j) for j in op.attrs["which"]]
    inner, outer = _geometry(gen, dx, int(op.attrs["axis"]), sizes)
    src = ["0"] * len(sizes)     # a part no gradient reaches: NULL, the kernel writes zeros there
    for j, dy in zip(which, op.inputs):
        if gen.same_place(dy, dx):
            raise CodegenError(f"split_grad {dx!r} planned in place over {dy!r} (the kernel cannot)")
        src[j] = gen.loc(dy)
    ptrs = gen.uid("tt_in")
    return [f"{{ const float *const {ptrs}[{len(sizes)}] = {{{', '.join(src)}}};",
            f"  tt_split_grad_f32({len(sizes)}, {inner}, {outer}, {ptrs}, {gen.loc(dx)}); }}"]


OPS = (
    OpDef("split_even", signature="axis, x -> y0, y1, ...", attrs=("axis", "sizes"),
          note="SPLIT: equal parts; axis resolved (>= 1), sizes one extent per output (IR name: not the word split)",
          tflite=(Builtin("SPLIT", 2, 2, outputs=0),), read_options=_read_split, write_options=_write_split,
          version=_version, differentiable=True, shared_qparams="all", forward=_forward, backward=_backward, c=_c),
    OpDef("split_v", signature="x, size_splits, axis -> y0, y1, ...", attrs=("axis", "sizes"),
          note="parts of the given sizes (one -1 resolved by the reader)",
          tflite=(Builtin("SPLIT_V", 3, 3, outputs=0),), read_options=_read_split_v, write_options=_write_split_v,
          version=_version, differentiable=True, shared_qparams="first", forward=_forward, backward=_backward,
          c=_c),
    OpDef("split_grad", kind="backward", of="split_even", signature="dy_j... -> dx",
          attrs=("axis", "sizes", "which"),
          note="the outputs' gradients concatenated back (which: the outputs they belong to; zeros elsewhere)",
          c=_c_grad, run=_run_grad),
)
