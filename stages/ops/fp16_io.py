"""fp16-mixed (issue 13) operands of the kernels that read or write fp16 themselves, for the ops' C emitters.

An op whose OpDef has `fp16_operands` reads an fp16 tensor at those operands (widening each element where it uses
it: exact); one with `fp16_output` writes its float result as fp16, rounded once on store (the bits of its fp32
kernel followed by round_f16). stages/train/fp16_mixed.py stores a result as fp16 where its writer and all its
readers can (no fp32 copy of it exists), stages/planning/fp16_memory.py counts it so, and the emitters pick the
kernel from the tensors' dtypes through the functions here.
"""

from __future__ import annotations

from tinytrain.stages.c_emit.literals import CodegenError


def _source(gen, name: str) -> str:
    """The fp16 tensor the kernel reads for `name`: itself, or the source of an fp32 widening that the kernel does
    itself (planning/fp16_memory.fused_widen: gen.fused maps the never-made fp32 copy to it; gen.fused's int8
    dequantizations are not fp16 and stay as they are)."""
    src = gen.fused.get(name)
    return src if src is not None and gen.g.tensors[src].dtype == "float16" else name


def is_f16(gen, name: str) -> bool:
    """The kernel sees `name` as fp16."""
    return gen.g.tensors[_source(gen, name)].dtype == "float16"


def loc(gen, name: str) -> str:
    """The C expression of operand `name` as the kernel reads it."""
    return gen.loc(_source(gen, name))


def pair(gen, name: str, out: bool = False) -> str:
    """`f32, f16` pointer arguments of a kernel taking either (the other 0: tt_mask_grad_f16's form)."""
    const = "" if out else "const "
    if is_f16(gen, name):
        return f"({const}float *)0, {loc(gen, name)}"
    return f"{loc(gen, name)}, ({const}uint16_t *)0"


def both_f16(gen, src: str, dst: str, what: str) -> bool:
    """Whether a kernel that goes fp16 -> fp16 or fp32 -> fp32 only (a channel-by-channel in-place op:
    fp16_mixed.fp16_written keeps its operand and result alike) runs its fp16 form; fp16 on one side only is a
    planning bug, refused."""
    h_src, h_dst = is_f16(gen, src), gen.g.tensors[dst].dtype == "float16"
    if h_src != h_dst:
        raise CodegenError(f"{what} {dst}: fp16 on one side only")
    return h_src
