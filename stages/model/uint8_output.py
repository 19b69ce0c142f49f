"""uint8 model outputs that only re-encode an int8 tensor (microWakeWord's score, issue 10).

The IR has no uint8 dtype: int8 is what the kernels, the quantizer and training compute with. The one place real
models have uint8 is a final QUANTIZE int8 -> uint8 of an output, at the same scale (microWakeWord: scale 1/256,
zero points -128 -> 0): a re-encoding of the same real values, u8 = clamp(i8 + (zp_u8 - zp_i8), 0, 255), exact
(the requantization multiplier is 1). Such an output is read as its int8 input: training sees the same real values
(the loss is identical), and the re-encoding is kept in graph.meta["output_uint8"] so the library can hand out the
model's own uint8 bytes (stages/c_emit/stream.py).

    find(model_bytes) -> [Reencoding]    graph outputs made that way (subgraph 0), from the flatbuffer
    load_outputs(found, names) -> the model.outputs list with each such output replaced by its int8 input

A uint8 tensor anywhere else (a uint8 input, uint8 activations, a QUANTIZE to uint8 with another scale) is still
refused by the reader with the tensor's name: those need uint8 kernels throughout, which no model here needs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tflite.BuiltinOperator import BuiltinOperator as BO
from tflite.TensorType import TensorType as TT


@dataclass(frozen=True)
class Reencoding:
    output: str          # the uint8 graph output
    source: str          # the int8 tensor the QUANTIZE reads (the graph output after load)
    scale: float
    zero_point: int      # the uint8 output's
    offset: int          # zp_u8 - zp_i8: u8 = clamp(i8 + offset, 0, 255)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _scalar_quant(t: Any) -> tuple[float, int] | None:
    q = t.Quantization()
    if q is None or q.ScaleLength() != 1 or q.ZeroPointLength() != 1:
        return None
    return float(q.Scale(0)), int(q.ZeroPoint(0))


def find(model: Any) -> list[Reencoding]:
    """The graph outputs of subgraph 0 that a QUANTIZE makes from an int8 tensor, as uint8 at the same scale.
    `model` is the tflite.Model; names are decoded as the reader does (its unique names are passed separately)."""
    sg = model.Subgraphs(0)
    outs = set(int(i) for i in (sg.OutputsAsNumpy() if sg.OutputsLength() else []))
    found = []
    for idx in range(sg.OperatorsLength()):
        op = sg.Operators(idx)
        if op.OutputsLength() != 1 or op.InputsLength() != 1 or int(op.Outputs(0)) not in outs:
            continue
        oc = model.OperatorCodes(op.OpcodeIndex())
        if max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode())) != BO.QUANTIZE:
            continue
        src, dst = sg.Tensors(int(op.Inputs(0))), sg.Tensors(int(op.Outputs(0)))
        if src.Type() != TT.INT8 or dst.Type() != TT.UINT8:
            continue
        qs, qd = _scalar_quant(src), _scalar_quant(dst)
        if qs is None or qd is None or qs[0] != qd[0]:
            continue  # another scale: a real requantization, not a re-encoding
        found.append(Reencoding(output=str(int(op.Outputs(0))), source=str(int(op.Inputs(0))), scale=qd[0],
                                zero_point=qd[1], offset=qd[1] - qs[1]))
    return found


def named(found: list[Reencoding], names: list[str]) -> list[Reencoding]:
    """`find`'s tensor indices -> the reader's tensor names."""
    return [Reencoding(output=names[int(r.output)], source=names[int(r.source)], scale=r.scale,
                       zero_point=r.zero_point, offset=r.offset) for r in found]


def load_outputs(found: list[Reencoding], outputs: list[str]) -> list[str]:
    by = {r.output: r.source for r in found}
    return [by.get(n, n) for n in outputs]


def summary(meta: dict[str, Any]) -> str:
    """load's summary-line part ("" when no output was re-encoded)."""
    enc = meta.get("output_uint8") or {}
    return "".join(f"; uint8 output {r['output']!r} read as its int8 source {src!r} (same scale, zero point "
                   f"{r['offset']:+d})" for src, r in enc.items())
