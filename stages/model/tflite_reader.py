"""Read a `.tflite` / `.circle` flatbuffer into the IR (`stages/model/ir.py`).

The flatbuffer schema comes from the `tflite` package (generated accessors); circle files share the
schema family, so the same accessors read them. Only subgraph 0 is read, and only the ops listed in
`SUPPORTED_OPS`; anything else is a `ModelError` with a message meant for the user.

Robustness: the generated accessors trust every offset in the file, so a truncated or corrupted
file surfaces as struct/index/type errors deep inside them. All of that is turned into one
`ModelError`; vector lengths are also checked against the file size before we loop over them, so
that a corrupted length cannot make us spin over billions of entries.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator as BO
from tflite.TensorType import TensorType as TT

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages import ops
from tinytrain.stages.model import densify
from tinytrain.stages.model import prune
from tinytrain.stages.model import state
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor
from tinytrain.stages.model.tflite_options import (
    _CUSTOM_HANDLERS,
    _HANDLERS,
    _OpCtx,
    _add_output_shape_constant,
    _float_list,
    _int_list,
)

IDENTIFIERS = {b"TFL3": "tflite", b"CIR0": "circle"}
_FORMAT_TITLES = {"tflite": "TFLite", "circle": "circle"}

# Errors the generated accessors raise on bytes that are not a valid flatbuffer.
_PARSE_ERRORS = (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError,
                 AttributeError, KeyError, MemoryError, RecursionError)

_OP_NAMES: dict[int, str] = {v: k for k, v in vars(BO).items() if not k.startswith("_") and isinstance(v, int)}

_DTYPES = {TT.FLOAT32: "float32", TT.FLOAT16: "float16", TT.INT8: "int8", TT.INT32: "int32",
           TT.INT64: "int64"}
_TT_NAMES: dict[int, str] = {v: k for k, v in vars(TT).items() if not k.startswith("_") and isinstance(v, int)}

# Beyond anything a microcontroller model holds; larger means a corrupted shape field.
_MAX_ELEMENTS = 1 << 31


# Operand positions that hold a conv/fc layer's parameters (the rest of the constants are "constant").
_WEIGHT_SLOT = 1
_BIAS_SLOT = 2
_LAYER_OPS = ops.LAYER_OPS
_UNPACK_OPS = ops.UNPACK_OPS


# ---- public API ------------------------------------------------------------------------------------

def read_model(path: Path, fmt: str = "auto", outputs: list[str] | None = None) -> Graph:
    """Read subgraph 0 of a .tflite/.circle file into a validated Graph. Raises ModelError.
    `fmt` is model.format: "auto", "tflite" or "circle" (checked against the file identifier).
    `outputs` is model.outputs: these tensors become the outputs and ops they do not need are not read."""
    path = Path(path)
    buf = _read_bytes(path)
    detected = _check_identifier(buf, path, fmt)
    kind = _FORMAT_TITLES.get(detected, "TFLite")
    _check_root(buf, path, kind)
    reencoded = []
    if outputs is None:  # a final int8 -> uint8 QUANTIZE (microWakeWord): read as its int8 source
        outputs, reencoded = _uint8_outputs(buf)
    graph = _parse(buf, path, kind, outputs)
    if reencoded:
        graph.meta["output_uint8"] = {r.source: r.to_json() for r in reencoded}
    graph.meta["format"] = detected or (fmt if fmt != "auto" else _format_from_suffix(path))
    try:
        graph.validate()
    except ValueError as e:
        raise ModelError(f"{path}: inconsistent model graph: {e}") from None
    return graph


def _uint8_outputs(buf: bytes) -> tuple[list[str] | None, list]:
    """(model.outputs that read each uint8 re-encoded output as its int8 source, the re-encodings); (None, []) when
    the model has none (stages/model/uint8_output.py). A malformed file is left to _parse to report."""
    from tinytrain.stages.model import uint8_output

    try:
        import tflite

        model = tflite.Model.GetRootAs(buf, 0)
        found = uint8_output.find(model) if model.SubgraphsLength() else []
        if not found:
            return None, []
        sg = model.Subgraphs(0)
        names = _unique_names([_decode(sg.Tensors(i).Name()) for i in range(sg.TensorsLength())])
        found = uint8_output.named(found, names)
        return uint8_output.load_outputs(found, [names[int(i)] for i in sg.OutputsAsNumpy()]), found
    except _PARSE_ERRORS:
        return None, []


def tensor_dtype(ttype: int) -> str | None:
    """The IR dtype of a TFLite TensorType, None when the reader has none."""
    return _DTYPES.get(ttype)


def supported_ops() -> list[str]:
    # DENSIFY has no handler: it is decoded at load into a plain constant; the resource-variable ops become state.
    return sorted([_OP_NAMES[code] for code in _HANDLERS] + [_OP_NAMES[BO.DENSIFY]] + list(state.STATE_CODES.values())
                  + [f"CUSTOM({name})" for name in _CUSTOM_HANDLERS])


# ---- file level checks -----------------------------------------------------------------------------

# Checked before reading, so that a huge file is refused without being loaded into memory. The flatbuffer
# format caps a model at 2 GB; a model for a 1 MB-flash MCU, float source included, is far below this.
MAX_MODEL_BYTES = 256 << 20


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None
    if size > MAX_MODEL_BYTES:
        raise ModelError(f"{path}: {size / (1 << 20):.0f} MB is larger than any model a microcontroller can "
                         f"train (limit {MAX_MODEL_BYTES >> 20} MB); it was not read")
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None
    if not buf:
        raise ModelError(f"model file is empty: {path}")
    if len(buf) < 16:
        raise ModelError(f"{path}: file too small to be a TFLite model ({len(buf)} bytes)")
    return buf


def _check_identifier(buf: bytes, path: Path, fmt: str) -> str | None:
    """The detected format, or None for a file without identifier (legal in flatbuffers)."""
    ident = buf[4:8]
    detected = IDENTIFIERS.get(ident)
    if detected is None and _looks_like_identifier(ident):
        raise ModelError(
            f"{path}: not a TFLite or circle model (file identifier {ident.decode('ascii')!r}, "
            f"expected 'TFL3' or 'CIR0')")
    if detected is not None and fmt not in ("auto", detected):
        raise ModelError(f"{path}: model.format is {fmt!r} but the file is a {detected} model "
                         f"(identifier {ident.decode('ascii')!r})", hint="set model.format: auto")
    return detected


def _check_root(buf: bytes, path: Path, kind: str) -> None:
    root = struct.unpack_from("<I", buf, 0)[0]
    if not 8 <= root < len(buf):
        raise ModelError(f"{path}: not a valid {kind} flatbuffer (root table offset {root} outside the "
                         f"{len(buf)}-byte file: truncated or not a model)")


def _parse(buf: bytes, path: Path, kind: str, outputs: list[str] | None = None) -> Graph:
    try:
        return _Reader(buf, path, outputs).read()
    except ModelError:
        raise
    except _PARSE_ERRORS as e:
        raise ModelError(f"{path}: not a valid {kind} flatbuffer (corrupt or truncated file: "
                         f"{type(e).__name__}: {e})",
                         hint="re-export the model; check that the download or copy completed") from None


def _looks_like_identifier(ident: bytes) -> bool:
    # Without an identifier these bytes are part of a vtable/table: small binary numbers, rarely
    # four printable characters. Four printable characters are another file type (PK.., %PDF, ...).
    return len(ident) == 4 and all(32 < b < 127 for b in ident)


def _format_from_suffix(path: Path) -> str:
    return "circle" if path.suffix.lower() == ".circle" else "tflite"


# ---- the reader ------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, buf: bytes, path: Path, outputs: list[str] | None = None):
        self.buf = buf
        self.path = path
        self.requested = outputs  # model.outputs (names); self.targets: their tensor indices, once known
        self.targets: list[int] | None = None
        self.dense_of: dict[int, int] = {}  # DENSIFY output tensor -> its sparse constant input
        self.model = tflite.Model.GetRootAs(buf, 0)
        self.sg: Any = None
        self.raw_names: list[str] = []
        self.names: list[str] = []
        self.state_ops: list[tuple[int, int, Any]] = []  # resource-variable ops of subgraph 0 (stages/model/state.py)

    def err(self, message: str, hint: str | None = None) -> ModelError:
        return ModelError(f"{self.path}: {message}", hint=hint)

    def length(self, n: int, what: str, elem_bytes: int = 4) -> int:
        """Guard a vector length read from the file before looping over it."""
        if n < 0 or n * elem_bytes > len(self.buf):
            raise self.err(f"corrupt file: {what} claims {n} entries, more than the file can hold")
        return n

    def read(self) -> Graph:
        self.sg = self._subgraph0()
        ops_raw = self._operators()
        n_tensors = self.length(self.sg.TensorsLength(), "tensor table")
        g_inputs = self._index_list(self.sg.InputsAsNumpy(), n_tensors, "subgraph inputs")
        g_outputs = self._index_list(self.sg.OutputsAsNumpy(), n_tensors, "subgraph outputs")
        g_outputs = self.targets if self.targets is not None else g_outputs
        used = self._used_tensors(ops_raw, n_tensors) | set(g_inputs) | set(g_outputs)
        self.raw_names = [self._tensor_name(i) for i in range(n_tensors)]
        self.names = _unique_names(self.raw_names)
        # Tensors no op or graph I/O refers to (converter leftovers) are dropped.
        tensors = {self.names[i]: self._tensor(i) for i in sorted(used)}
        for out, src in self.dense_of.items():  # DENSIFY's output: the decoded sparse constant, under its name
            if self.names[out] in tensors:
                t = tensors[self.names[out]]
                # No tensor of the file holds these dense bytes (a .wof cannot patch them in): synthesised.
                t.data, t.source_index = self._tensor(src).data, None
        ops = [self._op(idx, *raw, tensors) for idx, raw in enumerate(ops_raw) if raw is not None]
        inputs, outputs = [self.names[i] for i in g_inputs], [self.names[i] for i in g_outputs]
        meta = self._meta(sorted(used))
        self._state_scan().attach(self.state_ops, tensors, inputs, meta)  # state reads: extra graph inputs
        _assign_roles(tensors, ops, inputs, outputs)
        return Graph(tensors=tensors, ops=ops, inputs=inputs, outputs=outputs, meta=meta)

    def _used_tensors(self, ops_raw: list, n_tensors: int) -> set[int]:
        used: set[int] = set()
        for _, _, ins, outs in filter(None, ops_raw):
            used.update(i for i in self._index_list(ins, n_tensors, "operator inputs", allow_missing=True) if i >= 0)
            used.update(self._index_list(outs, n_tensors, "operator outputs"))
        return used

    def _meta(self, used: list[int]) -> dict[str, Any]:
        meta: dict[str, Any] = {"schema_version": int(self.model.Version()),
                                "subgraph_name": _decode(self.sg.Name())}
        desc = _decode(self.model.Description())
        if desc:
            meta["description"] = desc
        renamed = {self.names[i]: self.raw_names[i] for i in used if self.names[i] != self.raw_names[i]}
        if renamed:
            meta["original_tensor_names"] = renamed
        return meta

    # -- structure --

    def _subgraph0(self) -> Any:
        n = self.length(self.model.SubgraphsLength(), "subgraph table")
        if n == 0:
            raise self.err("the model has no subgraph")
        problems = self._state_scan().problems(n) if n > 1 else []
        if problems:
            raise self.err(f"the model has {n} subgraphs ({self._describe_subgraphs(n)}); "
                           f"only subgraphs that initialise variables are supported besides the main one "
                           f"({'; '.join(problems)}){self._unsupported_everywhere(n)}",
                           hint="control flow (WHILE/IF) and multi-signature models are not supported; export a "
                                "single inference signature (variables set by a CALL_ONCE init subgraph are)")
        return self.model.Subgraphs(0)

    def _state_scan(self) -> state.Scan:
        n_codes = self.length(self.model.OperatorCodesLength(), "operator code table")
        return state.Scan(self, [self._opcode(j) for j in range(n_codes)])

    def _describe_subgraphs(self, n: int) -> str:
        signatures: dict[int, list[str]] = {}
        for j in range(self.length(self.model.SignatureDefsLength(), "signature table")):
            sig = self.model.SignatureDefs(j)
            signatures.setdefault(sig.SubgraphIndex(), []).append(_decode(sig.SignatureKey()))
        parts = []
        for i in range(min(n, 8)):
            sg = self.model.Subgraphs(i)
            name = _decode(sg.Name()) or "unnamed"
            sig = f", signature {'/'.join(signatures[i])}" if i in signatures else ""
            parts.append(f"#{i} {name!r}: {sg.OperatorsLength()} ops{sig}")
        return "; ".join(parts) + ("; ..." if n > 8 else "")

    def _unsupported_everywhere(self, n: int) -> str:
        """Every op of every subgraph that the reader lacks, as `NAME at #subgraph:index (+k more)`, so that a
        user learns in one error all that stands between the model and tinytrain, not only the first thing."""
        n_codes = self.length(self.model.OperatorCodesLength(), "operator code table")
        codes = [self._opcode(j) for j in range(n_codes)]
        found: dict[str, list[str]] = {}
        for i in range(n):
            sg = self.model.Subgraphs(i)
            for idx in range(self.length(sg.OperatorsLength(), "operator table")):
                k = sg.Operators(idx).OpcodeIndex()
                if k >= n_codes:
                    raise self.err(f"corrupt file: operator {idx} of subgraph {i} uses opcode index {k} of {n_codes}")
                code, custom = codes[k]
                if code != BO.DENSIFY and not state.is_state_code(code) and _handler_key(code, custom) is None:
                    found.setdefault(_op_display_name(code, custom), []).append(f"#{i}:{idx}")
        if not found:
            return ""
        parts = [f"{name} at {where[0]}" + (f" (+{len(where) - 1} more)" if len(where) > 1 else "")
                 for name, where in found.items()]
        return f"; unsupported ops (subgraph:index): {', '.join(parts)}"

    def _operators(self) -> list[tuple[int, Any, list[int], list[int]]]:
        """(builtin code, operator, input indices, output indices) per op; unsupported ops raise here,
        before any tensor is looked at, because that is the most useful error for such a model."""
        n_codes = self.length(self.model.OperatorCodesLength(), "operator code table")
        codes = [self._opcode(j) for j in range(n_codes)]
        n_ops = self.length(self.sg.OperatorsLength(), "operator table")
        io = self._cut_io(n_ops)
        needed = None
        if self.targets is not None:  # a cut keeps the state ops and what their assignments need
            state_idx, assigned = self._state_scan().main_state_ops()
            needed = prune.needed_ops(io, self.targets + assigned) | state_idx
        result, unsupported = [], []
        for idx in range(n_ops):
            op = self.sg.Operators(idx)
            if needed is not None and idx not in needed:
                result.append(None)  # after the cut (model.outputs): not read, supported or not
                continue
            k = op.OpcodeIndex()
            if k >= n_codes:
                raise self.err(f"corrupt file: operator {idx} uses opcode index {k} of {n_codes}")
            code, custom = codes[k]
            if code == BO.DENSIFY:  # decoded at load: its output becomes a plain constant (_sparse_data)
                result.append(None)
                self._densified(idx, *io[idx])
                continue
            if state.is_state_code(code):  # resource variables become graph state (stages/model/state.py)
                result.append(None)
                self.state_ops.append((idx, code, op))
                continue
            key = _handler_key(code, custom)
            if key is None:
                unsupported.append((idx, _op_display_name(code, custom)))
                continue
            result.append((key, op, _int_list(op.InputsAsNumpy()), _int_list(op.OutputsAsNumpy())))
        if unsupported:
            idx, name = unsupported[0]
            more = _also_unsupported(unsupported)
            cut = None if self.targets is not None else prune.cut_suggestion(
                io, [i for i, _ in unsupported], self._cut_names(), _int_list(self.sg.OutputsAsNumpy()))
            err = UnsupportedOpError(name, idx, where=str(self.path),
                                     hint=(f"{cut}; " if cut else "") +
                                     f"supported ops: {', '.join(supported_ops())}{more}")
            # Every (operator index, op name) the model needs and we lack, for callers that list them all.
            err.unsupported = list(unsupported)
            raise err
        return result

    # -- model.outputs (stages/model/prune.py): which ops the requested tensors need --

    def _cut_names(self) -> list[str]:
        n = self.length(self.sg.TensorsLength(), "tensor table")
        return _unique_names([self._tensor_name(i) for i in range(n)])

    def _cut_io(self, n_ops: int) -> list[tuple[list[int], list[int]]]:
        """(inputs, outputs) per operator; also resolves model.outputs to self.targets (unknown names raise)."""
        io = [(_int_list(o.InputsAsNumpy()), _int_list(o.OutputsAsNumpy()))
              for o in (self.sg.Operators(i) for i in range(n_ops))]
        if self.requested is not None:
            names = self._cut_names()
            prune.check_names(self.requested, names, str(self.path))
            index = {name: i for i, name in enumerate(names)}
            self.targets = [index[name] for name in self.requested]
        return io

    # -- sparse constants (stages/model/densify.py) --

    def _densified(self, idx: int, ins: list[int], outs: list[int]) -> None:
        n = self.length(self.sg.TensorsLength(), "tensor table")
        if len(ins) != 1 or len(outs) != 1 or not all(0 <= i < n for i in ins + outs):
            raise self.err(f"operator {idx} (DENSIFY) has {len(ins)} inputs and {len(outs)} outputs, expected 1 and 1")
        src = self.sg.Tensors(ins[0])
        if src.Sparsity() is None or src.Buffer() == 0:
            raise self.err(f"operator {idx} (DENSIFY) reads {self._tensor_name(ins[0])!r}, "
                           f"which is not a sparse constant; only constant weights can be densified at load")
        self.dense_of[outs[0]] = ins[0]

    def _sparse_data(self, t: Any, raw: bytes | None, dtype: str, shape: list[int], name: str) -> np.ndarray:
        sp = t.Sparsity()
        if raw is None:
            raise self.err(f"tensor {name!r} is sparse but holds no values; only sparse constants are supported")
        dims = []
        for j in range(self.length(sp.DimMetadataLength(), "sparsity dim metadata")):
            m = sp.DimMetadata(j)
            dims.append(densify.DimMetadata(format=m.Format(), dense_size=m.DenseSize(),
                                            segments=_sparse_index(m.ArraySegmentsType(), m.ArraySegments()),
                                            indices=_sparse_index(m.ArrayIndicesType(), m.ArrayIndices())))
        itemsize = np.dtype(dtype).itemsize
        if len(raw) % itemsize:
            raise self.err(f"sparse tensor {name!r}: {len(raw)} bytes are not whole {dtype} values")
        values = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
        try:
            return densify.densify(shape, _int_list(sp.TraversalOrderAsNumpy()), _int_list(sp.BlockMapAsNumpy()),
                                   dims, values)
        except densify.SparsityError as e:
            raise self.err(f"corrupt sparse tensor {name!r}: {e}") from None

    def _opcode(self, j: int) -> tuple[int, str]:
        oc = self.model.OperatorCodes(j)
        # Newer files keep codes >= 127 in `builtin_code` and a placeholder in the deprecated int8
        # field; older files only have the deprecated one. TFLite takes the larger of the two.
        code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
        return code, _decode(oc.CustomCode())

    def _index_list(self, arr: Any, n_tensors: int, what: str, allow_missing: bool = False) -> list[int]:
        idx = _int_list(arr)
        lo = -1 if allow_missing else 0
        bad = [i for i in idx if i < lo or i >= n_tensors]
        if bad:
            raise self.err(f"corrupt file: {what} refer to tensor {bad[0]} (the model has {n_tensors})")
        return idx

    # -- tensors --

    def _tensor_name(self, i: int) -> str:
        return _decode(self.sg.Tensors(i).Name())

    def _tensor(self, i: int) -> Tensor:
        t = self.sg.Tensors(i)
        name = self.names[i]
        shape = _int_list(t.ShapeAsNumpy())
        if any(d < 0 for d in shape):
            raise self.err(f"tensor {name!r} has a negative dimension in shape {shape}")
        if len(shape) > 8 or int(np.prod([float(d) for d in shape])) >= _MAX_ELEMENTS:
            raise self.err(f"tensor {name!r} has an implausible shape {shape}")
        self._check_static(t, name)
        data = self._buffer(t, name, shape)
        ttype = t.Type()
        dtype = _DTYPES.get(ttype)
        if dtype is None or (dtype == "int64" and data is None):
            tname = _TT_NAMES.get(ttype, f"type {ttype}")
            cut = self._conversion_cut(i, tname)
            raise self.err(f"tensor {name!r} has unsupported dtype {tname}",
                           hint=(f"{cut}; " if cut else "") + "supported: float32, float16, int8, int32 (and int64 "
                                "constants)")
        if t.Sparsity() is not None:
            data = self._sparse_data(t, data, dtype, shape, name)
        elif data is not None:
            data = self._decode_data(data, dtype, shape, name)
        return Tensor(name=name, shape=shape, dtype=dtype, quant=self._quant(t, name, shape),
                      source_index=i, data=data)

    def _conversion_cut(self, i: int, tname: str) -> str | None:
        """For a model output of a dtype we lack that a final QUANTIZE converts from a tensor we read (microWakeWord's
        int8 -> uint8 score): the model.outputs cut that trains on the tensor before it (stages/model/prune.py's wording)."""
        if i not in _int_list(self.sg.OutputsAsNumpy()):
            return None
        for idx in range(self.length(self.sg.OperatorsLength(), "operator table")):
            op = self.sg.Operators(idx)
            ins = _int_list(op.InputsAsNumpy())
            if i in _int_list(op.OutputsAsNumpy()) and ins and 0 <= ins[0] < self.sg.TensorsLength():
                code, _ = self._opcode(op.OpcodeIndex())
                if code == BO.QUANTIZE and self.sg.Tensors(ins[0]).Type() in _DTYPES:
                    listed = json.dumps([self.names[ins[0]]])  # JSON is YAML
                    return (f"the output only converts {listed} to {tname}: to train on it, add `outputs: {listed}` "
                            f"to the spec's `model` section")
        return None

    def _check_static(self, t: Any, name: str) -> None:
        sig = _int_list(t.ShapeSignatureAsNumpy())
        if any(d < 0 for d in sig[1:]):
            raise self.err(f"tensor {name!r} has a dynamic shape {sig} (-1 beyond the batch dimension)",
                           hint="export the model with fixed input shapes")

    def _buffer(self, t: Any, name: str, shape: list[int]) -> bytes | None:
        bi = t.Buffer()
        if bi == 0:  # buffer 0 is the schema's empty sentinel
            return None
        n_buffers = self.length(self.model.BuffersLength(), "buffer table")
        if bi >= n_buffers:
            raise self.err(f"corrupt file: tensor {name!r} refers to buffer {bi} of {n_buffers}")
        b = self.model.Buffers(bi)
        offset, size = int(b.Offset()), int(b.Size())
        if offset > 1:  # large-model format: data lives after the flatbuffer, addressed from file start
            if offset + size > len(self.buf):
                raise self.err(f"truncated file: buffer {bi} of tensor {name!r} needs bytes "
                               f"{offset}..{offset + size}, the file has {len(self.buf)}")
            return self.buf[offset:offset + size] if size else None
        raw = b.DataAsNumpy()
        if isinstance(raw, int) or raw.size == 0:
            return None
        return raw.tobytes()

    def _decode_data(self, raw: bytes, dtype: str, shape: list[int], name: str) -> np.ndarray:
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if len(raw) != want:
            raise self.err(f"tensor {name!r}: buffer has {len(raw)} bytes, shape {shape} of {dtype} "
                           f"needs {want}")
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)

    def _quant(self, t: Any, name: str, shape: list[int]) -> QuantParams | None:
        q = t.Quantization()
        if q is None:
            return None
        if q.DetailsType() != 0:
            raise self.err(f"tensor {name!r} uses custom quantization, which is not supported")
        scale = _float_list(q.ScaleAsNumpy())
        if not scale:
            return None  # min/max only: a float tensor with calibration ranges
        if not all(np.isfinite(scale)):
            raise self.err(f"tensor {name!r} has a non-finite quantization scale")
        zp = _int_list(q.ZeroPointAsNumpy()) or [0] * len(scale)
        axis = int(q.QuantizedDimension())
        if len(zp) != len(scale):
            raise self.err(f"tensor {name!r}: {len(scale)} quantization scales but {len(zp)} zero points")
        if len(scale) > 1 and (axis >= len(shape) or shape[axis] != len(scale)):
            raise self.err(f"tensor {name!r}: {len(scale)} per-channel scales do not match dimension "
                           f"{axis} of shape {shape}")
        return QuantParams(scale=scale, zero_point=zp, axis=axis)

    # -- ops --

    def _op(self, idx: int, code: int | str, op: Any, ins: list[int], outs: list[int],
            tensors: dict[str, Tensor]) -> Op:
        if isinstance(code, str):  # a custom op we read (_CUSTOM_HANDLERS)
            op_type, arity, parse = _CUSTOM_HANDLERS[code]
            op_name = f"CUSTOM({code})"
        else:
            op_type, arity, parse = _HANDLERS[code]
            op_name = _OP_NAMES[code]
        lo, hi, n_out = arity
        # n_out 0: any number >= 1 (SPLIT, SPLIT_V: the op's options check it)
        if not (lo <= len(ins) <= hi) or (len(outs) != n_out if n_out else not outs) or any(i < 0 for i in ins[:lo]):
            raise self.err(f"operator {idx} ({op_name}) has {len(ins)} inputs and {len(outs)} outputs, "
                           f"expected {lo}..{hi} inputs and {n_out} output(s)")
        in_names = [None if i < 0 else self.names[i] for i in ins]
        out_names = [self.names[i] for i in outs]
        ctx = _OpCtx(self, idx, op_name, op, [None if n is None else tensors[n] for n in in_names],
                     [tensors[n] for n in out_names])
        attrs = parse(ctx)
        if op_type == ops.PAD.name and len(in_names) == 3:
            in_names = in_names[:2]  # PADV2 whose pad value is what PAD uses (checked by the parser)
        if op_type == ops.TRANSPOSE_CONV.name and isinstance(code, str):
            # MediaPipe's [input, weights, bias] -> [x, w, b, output_shape], with an int32[4] constant for the
            # output shape that the file does not have (the writer then writes a standard TRANSPOSE_CONV).
            in_names = in_names + [_add_output_shape_constant(tensors, out_names[0])]
        elif ops.REGISTRY[op_type].file_operands is not None:
            # the file's operand order -> the IR's (OpDef.file_operands); an absent operand is None
            in_names = [in_names[k] if k < len(in_names) else None for k in ops.REGISTRY[op_type].file_operands]
        return Op(type=op_type, inputs=in_names, outputs=out_names, attrs=attrs, source_index=idx)


# ---- roles -----------------------------------------------------------------------------------------

def _assign_roles(tensors: dict[str, Tensor], ops: list[Op], inputs: list[str], outputs: list[str]) -> None:
    """weight/bias: the filter/bias operands of conv/dwconv/fc, also when they reach the layer
    through a DEQUANTIZE (float16 or int8 weights stored compressed); other constants: constant."""
    dequant_src = {op.outputs[0]: op.inputs[0] for op in ops
                   if op.type in _UNPACK_OPS and tensors[op.inputs[0]].is_constant}
    roles: dict[str, str] = {}
    for op in ops:
        if op.type not in _LAYER_OPS:
            continue
        for slot, role in ((_WEIGHT_SLOT, "weight"), (_BIAS_SLOT, "bias")):
            name = op.inputs[slot] if slot < len(op.inputs) else None
            name = dequant_src.get(name, name) if name is not None else None
            if name is not None and tensors[name].is_constant and roles.get(name) != "weight":
                roles[name] = role
    for t in tensors.values():
        if t.is_constant:
            t.role = roles.get(t.name, "constant")
    for name in inputs:
        if not tensors[name].is_constant:
            tensors[name].role = "input"
    for name in outputs:
        if not tensors[name].is_constant:
            tensors[name].role = "output"


# ---- helpers ---------------------------------------------------------------------------------------

def _unique_names(raw: list[str]) -> list[str]:
    """TFLite allows repeated and empty names; the IR keys tensors by name. Every member of a
    repeated group gets `_t<index>` (so a name never depends on which copy came first)."""
    counts: dict[str, int] = {}
    for n in raw:
        counts[n] = counts.get(n, 0) + 1
    taken = {n for n in raw if counts[n] == 1 and n}
    out = []
    for i, n in enumerate(raw):
        if n and counts[n] == 1:
            out.append(n)
            continue
        cand = f"{n}_t{i}" if n else f"t{i}"
        while cand in taken:
            cand += "_"
        taken.add(cand)
        out.append(cand)
    return out


def _decode(b: bytes | None) -> str:
    if not b:
        return ""
    # Control characters would break the text form and npz entry names.
    return "".join(ch if ch.isprintable() else "?" for ch in b.decode("utf-8", errors="replace"))


def _also_unsupported(unsupported: list[tuple[int, str]]) -> str:
    """Every other op name the model lacks support for, once each with its count and first index, so that
    a model with many unsupported ops (a custom op far down the graph) shows them all in one error."""
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for i, n in unsupported:
        first.setdefault(n, i)
        count[n] = count.get(n, 0) + 1
    head = unsupported[0][1]
    parts = []
    for n, i in first.items():
        k = count[n] - (1 if n == head else 0)
        if k <= 0:
            continue
        later = [j for j, m in unsupported[1:] if m == n]
        parts.append(f"{n} at {later[0]}" + (f" (+{k - 1} more)" if k > 1 else ""))
    return f"; also unsupported: {', '.join(parts)}" if parts else ""


def _handler_key(code: int, custom: str) -> int | str | None:
    """The key of the reader's handler for an operator code, or None when it has none (unsupported). A custom op we
    read has its custom code as its key (see _CUSTOM_HANDLERS)."""
    key: int | str = custom if code == BO.CUSTOM and custom in _CUSTOM_HANDLERS else code
    return key if key in _HANDLERS or key in _CUSTOM_HANDLERS else None


def _op_display_name(code: int, custom: str) -> str:
    if code == BO.CUSTOM:
        return f"CUSTOM({custom or '?'})"
    return _OP_NAMES.get(code, f"BUILTIN_{code}")


def _sparse_index(kind: int, table: Any) -> np.ndarray | None:
    """A SparseIndexVector union member (Int32Vector, Uint16Vector or Uint8Vector) as an int64 array."""
    from tflite.Int32Vector import Int32Vector
    from tflite.Uint8Vector import Uint8Vector
    from tflite.Uint16Vector import Uint16Vector

    cls = {1: Int32Vector, 2: Uint16Vector, 3: Uint8Vector}.get(kind)
    if cls is None or table is None:
        return None
    vec = cls()
    vec.Init(table.Bytes, table.Pos)
    values = vec.ValuesAsNumpy()
    return np.zeros(0, np.int64) if isinstance(values, int) else values.astype(np.int64)
