"""The intermediate representation every stage reads and writes (DESIGN §5).

A Graph holds named tensors and a list of ops in execution order. Layout is NHWC as in TFLite.
Constant data (weights, biases, shape operands) lives in `Tensor.data`; activations have none.

On disk a graph is two files: `graph.json` (canonical JSON: sorted keys, no data) and
`tensors.npz` (one array per constant tensor, keyed by tensor name). Both are written
deterministically so that the same graph always yields the same bytes (the cache relies on it).

Op vocabulary: the op registry (stages/ops/, one module per op family) declares every op type, its operands,
outputs and attrs; `python -c "from tinytrain.stages import ops; print(ops.catalogue())"` prints the table.
`padding` is "same" or "valid"; `act` is one of ACTIVATIONS. Optional inputs are None.
Training graphs add gradient, loss and update ops in the same form (registered there too).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

IR_VERSION = 1

DTYPES = ("float32", "float16", "int8", "int16", "int32", "int64", "uint8", "bool")
ROLES = ("activation", "input", "output", "weight", "bias", "constant", "gradient", "optimizer_state")
ACTIVATIONS = ("none", "relu", "relu6", "relu_n1_to_1", "tanh")

_SHORT_DTYPE = {"float32": "f32", "float16": "f16", "int8": "i8", "int16": "i16", "int32": "i32",
                "int64": "i64", "uint8": "u8", "bool": "b"}



def numel(shape: Iterable[int]) -> int:
    """Elements of a tensor of this shape (1 for a scalar's empty shape)."""
    return int(np.prod(list(shape), dtype=np.int64))

@dataclass
class QuantParams:
    """Affine quantization: real = scale * (q - zero_point); per-channel along `axis` when len(scale) > 1."""

    scale: list[float]
    zero_point: list[int]
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1

    def to_json(self) -> dict[str, Any]:
        return {"scale": [float(s) for s in self.scale], "zero_point": [int(z) for z in self.zero_point],
                "axis": int(self.axis)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "QuantParams":
        return cls(scale=list(d["scale"]), zero_point=list(d["zero_point"]), axis=int(d.get("axis", 0)))


@dataclass
class Tensor:
    name: str
    shape: list[int]
    dtype: str
    role: str = "activation"
    quant: QuantParams | None = None
    # Index of this tensor in the original model file (for weights-only export); None if synthesised.
    source_index: int | None = None
    data: np.ndarray | None = field(default=None, repr=False)

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def short_type(self) -> str:
        return f"{_SHORT_DTYPE.get(self.dtype, self.dtype)}[{','.join(str(d) for d in self.shape)}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": [int(d) for d in self.shape],
            "dtype": self.dtype,
            "role": self.role,
            "quant": self.quant.to_json() if self.quant else None,
            "source_index": self.source_index,
            "has_data": self.data is not None,
        }


@dataclass
class Op:
    type: str
    inputs: list[str | None]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    # Operator index in the original model file (for error messages); None if synthesised.
    source_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "attrs": _jsonable(self.attrs), "source_index": self.source_index}


@dataclass
class Graph:
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- queries -------------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def producers(self) -> dict[str, int]:
        """tensor name -> index of the op that writes it."""
        return {t: i for i, op in enumerate(self.ops) for t in op.outputs}

    def consumers(self) -> dict[str, list[int]]:
        """tensor name -> indices of the ops that read it (in op order, repeated if read twice)."""
        out: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                if t is not None:
                    out.setdefault(t, []).append(i)
        return out

    def constants(self) -> Iterable[Tensor]:
        return (t for t in self.tensors.values() if t.data is not None)

    def validate(self) -> None:
        """Structural checks: every referenced tensor exists, each tensor is written at most once,
        ops are in an order where inputs are ready before use."""
        ready = set(self.inputs) | {t.name for t in self.constants()}
        written: set[str] = set()
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                if t is None:
                    continue
                if t not in self.tensors:
                    raise ValueError(f"op #{i} {op.type} reads unknown tensor {t!r}")
                if t not in ready:
                    raise ValueError(f"op #{i} {op.type} reads {t!r} before it is produced")
            for t in op.outputs:
                if t not in self.tensors:
                    raise ValueError(f"op #{i} {op.type} writes unknown tensor {t!r}")
                if t in written:
                    raise ValueError(f"tensor {t!r} is written twice (op #{i} {op.type})")
                written.add(t)
                ready.add(t)
        for t in self.outputs:
            if t not in ready:
                raise ValueError(f"graph output {t!r} is never produced")

    # ---- serialisation -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "ir_version": IR_VERSION,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "meta": _jsonable(self.meta),
            "tensors": [self.tensors[k].to_json() for k in self.tensors],
            "ops": [op.to_json() for op in self.ops],
        }

    def save(self, directory: Path, stem: str = "") -> tuple[Path, Path]:
        """Write `<stem>graph.json` and `<stem>tensors.npz` into `directory`; returns both paths."""
        directory = Path(directory)
        gpath, tpath = directory / f"{stem}graph.json", directory / f"{stem}tensors.npz"
        gpath.write_text(canonical_json(self.to_json()) + "\n")
        tpath.write_bytes(npz_bytes({t.name: t.data for t in self.constants()}))
        return gpath, tpath

    @classmethod
    def load(cls, directory: Path, stem: str = "") -> "Graph":
        directory = Path(directory)
        doc = json.loads((directory / f"{stem}graph.json").read_text())
        if doc.get("ir_version") != IR_VERSION:
            raise ValueError(f"IR version {doc.get('ir_version')} is not {IR_VERSION}")
        with np.load(directory / f"{stem}tensors.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        tensors: dict[str, Tensor] = {}
        for td in doc["tensors"]:
            tensors[td["name"]] = Tensor(
                name=td["name"], shape=list(td["shape"]), dtype=td["dtype"], role=td["role"],
                quant=QuantParams.from_json(td["quant"]) if td["quant"] else None,
                source_index=td["source_index"],
                data=arrays.get(td["name"]) if td["has_data"] else None,
            )
        ops = [Op(type=o["type"], inputs=list(o["inputs"]), outputs=list(o["outputs"]),
                  attrs=dict(o["attrs"]), source_index=o["source_index"]) for o in doc["ops"]]
        return cls(tensors=tensors, ops=ops, inputs=list(doc["inputs"]), outputs=list(doc["outputs"]),
                   meta=dict(doc.get("meta", {})))

    # ---- readable form -------------------------------------------------------------------------
    def to_text(self) -> str:
        """One line per op, e.g.
        %12:i8[1,16,16,32] = conv2d(%11, @w3:i8[32,3,3,16], @b3:i32[32]) stride=1 pad=same act=relu6
        `%` marks activations, `@` constants."""
        lines = []
        for name in self.inputs:
            lines.append(f"input {_ref(self.tensors[name])}{_qtext(self.tensors[name])}")
        for i, op in enumerate(self.ops):
            outs = ", ".join(_ref(self.tensors[t]) for t in op.outputs)
            ins = ", ".join("_" if t is None else _ref(self.tensors[t]) for t in op.inputs)
            attrs = " ".join(f"{k}={_attr_text(v)}" for k, v in sorted(op.attrs.items()))
            src = f"  # op {op.source_index}" if op.source_index is not None else ""
            lines.append(f"{outs} = {op.type}({ins}){(' ' + attrs) if attrs else ''}{src}".rstrip())
        lines.append("output " + ", ".join(_ref(self.tensors[t]) for t in self.outputs))
        return "\n".join(lines) + "\n"


def _ref(t: Tensor) -> str:
    sigil = "@" if t.data is not None else "%"
    return f"{sigil}{t.name}:{t.short_type()}"


def _qtext(t: Tensor) -> str:
    if t.quant is None:
        return ""
    if t.quant.per_channel:
        return f" q=per-channel[{len(t.quant.scale)}] axis={t.quant.axis}"
    return f" q=(s={t.quant.scale[0]:.6g}, zp={t.quant.zero_point[0]})"


def _attr_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_attr_text(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _jsonable(v: Any) -> Any:
    """numpy scalars/arrays and tuples -> plain JSON types."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def canonical_json(obj: Any) -> str:
    """The one JSON form used for anything that is hashed or diffed: sorted keys, no spaces."""
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """A deterministic .npz: `np.savez` stamps zip entries with the current time, so the bytes
    would change on every run and defeat content addressing. We write the zip ourselves with a
    fixed timestamp and sorted entries."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            # np.ascontiguousarray would turn a 0-d array (e.g. MEAN's scalar axes) into shape (1,).
            arr = np.asarray(arrays[name], order="C")
            item = io.BytesIO()
            np.lib.format.write_array(item, arr, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, item.getvalue())
    return buf.getvalue()
