"""The builder interface an op's backward emission writes to (`OpDef.backward`).

An op module says once which backward ops its op needs and what they read; two builders run that description:
stages/autodiff.py builds the training IR from it, and stages/plan_memory.py's analytic memory model builds its
abstract program of the training step from it (sizes and lifetimes only), so the two cannot disagree.

    backward(bb, op, i, dz)   op: the forward op (number i of the forward); dz: the gradient of its output after
                              any activation / clamp mask (the caller emits that part)
"""

from __future__ import annotations

from typing import Protocol

from ..ir import Graph, Op


class BackwardBuilder(Protocol):
    g: Graph   # the forward graph's tensors (shapes, dtypes)

    def share(self, t: str | None, i: int) -> str | None:
        """A new gradient tensor for op i's share of dL/dt (fan-out shares are summed later), or None when t
        needs no gradient (a constant, or nothing trained below it)."""

    def real(self, t: str) -> str:
        """What a backward op reads for operand t: t itself, or its float32 copy when t is int8 (dequantized once
        per sample)."""

    def emit(self, type_: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        """Append one backward op."""


def geometry(op: Op) -> dict:
    """The forward's attrs without its fused activation (the backward ops' geometry attrs)."""
    return {k: v for k, v in op.attrs.items() if k != "act"}


def input_backward(bb: BackwardBuilder, op: Op, i: int, dz: str, reads: tuple = (), attrs: dict | None = None,
                   type_: str | None = None) -> None:
    """<op>_grad(dz, *reads) -> dx for the op's first input: reads are further operands taken as they are (a
    max pool's int8 input: only its argmax matters; shape constants)."""
    dx = bb.share(op.inputs[0], i)
    if dx:
        bb.emit(type_ or f"{op.type}_grad", [dz, *reads], [dx], **(attrs or {}))


def unary_backward(bb: BackwardBuilder, op: Op, i: int, dz: str, reads: str = "x", extra_inputs: int = 0,
                   attrs: dict | None = None) -> None:
    """<op>_grad(dz, x or y, [op's inputs 1..extra_inputs]) -> dx: an element-wise derivative that reads the
    forward input (reads="x") or output ("y"), real-valued, and the op's further (constant) operands."""
    dx = bb.share(op.inputs[0], i)
    if not dx:
        return
    ins = [dz, bb.real(op.inputs[0] if reads == "x" else op.outputs[0])]
    ins += [bb.real(t) for t in op.inputs[1:1 + extra_inputs]]
    bb.emit(f"{op.type}_grad", ins, [dx], **(attrs or {}))
