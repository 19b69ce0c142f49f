"""The C call of a data-movement kernel (depth_to_space, resize, strided_slice, transpose): one input read into one
output in another order by a kernel that cannot write over its input. The forward picks the int8 or float32
variant by the input's dtype; the gradient kernel is float32 and reads dy into dx. Written once here so that each
op module only says which kernel and which parameters."""

from __future__ import annotations

from tinytrain.stages.c_emit.literals import CodegenError
from tinytrain.stages.model.ir import Op


def _apart(gen, op: Op, src: str, dst: str, what: str) -> None:
    if gen.same_place(src, dst):
        raise CodegenError(f"{op.type} {dst!r} planned in place over {what} (the kernel cannot)")


def forward_call(gen, op: Op, kernel: str, args: str) -> list[str]:
    """`<kernel>_s8(args, x, y);` or `<kernel>_f32(...)` for the op's first input x and first output y."""
    x, y = op.inputs[0], op.outputs[0]
    _apart(gen, op, x, y, "its input")
    return [f"{kernel}_{'s8' if gen.is_int8(x) else 'f32'}({args}, {gen.loc(x)}, {gen.loc(y)});"]


def grad_call(gen, op: Op, kernel: str, args: str) -> list[str]:
    """`<kernel>(args, dy, dx);` for the gradient op's first input dy and first output dx."""
    dy, dx = op.inputs[0], op.outputs[0]
    _apart(gen, op, dy, dx, "dy")
    return [f"{kernel}({args}, {gen.loc(dy)}, {gen.loc(dx)});"]
