"""Trained weights out of the firmware and back into files people use (DESIGN §3, emulate-run).

The firmware writes `weights.bin`: the final bytes of every trained tensor, concatenated in the
order of codegen's `io_layout.json` "trained_tensors" (each entry: name, dtype, shape, offset,
nbytes, source_index). From it:

  * `parse_weights(layout, blob)`   -> {tensor name: array of the tensor's dtype and shape}
  * `apply_weights(graph, trained)` -> a copy of the int8 IR with those tensors' data replaced
  * `write_tflite(graph, path)`     -> the updated IR as .tflite (stages/model/tflite_writer.py), which
                                      LiteRT runs bit-exactly like our executor (tests)
  * `wof_data(graph, trained)`      -> {original tensor index: bytes} for stages/model/wof.py

Every check here fails loudly: a weights.bin whose size or layout does not match the model would
otherwise become a silently wrong model file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tinytrain.pipeline.errors import StageFailed
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_writer import write_model


class ExportError(StageFailed):
    """weights.bin and the layout / the model disagree."""


def parse_weights(layout: Sequence[Mapping[str, Any]], blob: bytes) -> dict[str, np.ndarray]:
    """Cut `blob` (weights.bin) into the tensors `layout` describes; sizes and ranges are checked."""
    out: dict[str, np.ndarray] = {}
    end_max = 0
    for entry in layout:
        name, dtype = str(entry["name"]), np.dtype(str(entry["dtype"])).newbyteorder("<")
        shape = [int(d) for d in entry["shape"]]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes != want:
            raise ExportError(f"io_layout.json: trained tensor {name!r} {entry['dtype']}{shape} is {want} bytes, "
                              f"the layout says {nbytes}")
        if offset < 0 or offset + nbytes > len(blob):
            raise ExportError(f"weights.bin has {len(blob)} bytes but trained tensor {name!r} needs bytes "
                              f"{offset}..{offset + nbytes} (a firmware that wrote too little?)")
        out[name] = np.frombuffer(blob, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset) \
            .reshape(shape).astype(dtype.newbyteorder("="))
        end_max = max(end_max, offset + nbytes)
    if end_max != len(blob):
        raise ExportError(f"weights.bin has {len(blob)} bytes, the trained tensors of io_layout.json {end_max}")
    return out


def resolve(graph: Graph, layout: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """layout name -> tensor name in `graph` (by name, else by original tensor index)."""
    by_index = {t.source_index: n for n, t in graph.tensors.items() if t.source_index is not None}
    names: dict[str, str] = {}
    for entry in layout:
        name = str(entry["name"])
        if name in graph.tensors:
            names[name] = name
        elif entry.get("source_index") is not None and int(entry["source_index"]) in by_index:
            names[name] = by_index[int(entry["source_index"])]
        else:
            raise ExportError(f"trained tensor {name!r} is not a tensor of the int8 model "
                              f"(source_index {entry.get('source_index')})")
    return names


def apply_weights(graph: Graph, trained: Mapping[str, np.ndarray],
                  names: Mapping[str, str] | None = None) -> Graph:
    """A copy of `graph` whose tensors named in `trained` hold the new data (dtype and shape checked)."""
    g = copy.deepcopy(graph)
    for lname, arr in trained.items():
        tname = (names or {}).get(lname, lname)
        t = g.tensors.get(tname)
        if t is None or t.data is None:
            raise ExportError(f"trained tensor {lname!r} is not a constant of the model")
        if list(arr.shape) != list(t.shape) or np.dtype(arr.dtype) != np.dtype(t.dtype):
            raise ExportError(f"trained tensor {lname!r}: firmware gives {arr.dtype}{list(arr.shape)}, "
                              f"the model has {t.dtype}{list(t.shape)}")
        t.data = np.array(arr, dtype=t.dtype, copy=True)
    return g


def original_weights(graph: Graph, layout: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The model's own data of the trained tensors (what the gate exports when it rejects a run)."""
    names = resolve(graph, layout)
    return {ln: np.array(graph.tensors[tn].data, copy=True) for ln, tn in names.items()}


def wof_data(graph: Graph, trained: Mapping[str, np.ndarray],
             names: Mapping[str, str] | None = None) -> tuple[dict[int, bytes], list[str]]:
    """({original tensor index: little-endian bytes}, names of trained tensors the original model
    file does not have, or has in another dtype (an int8 file's dequantized copy: meta dtype_in_file), which a .wof
    cannot hold)."""
    data: dict[int, bytes] = {}
    missing: list[str] = []
    other_dtype = graph.meta.get("dtype_in_file", {})
    for lname, arr in trained.items():
        t = graph.tensors[(names or {}).get(lname, lname)]
        if t.source_index is None or t.name in other_dtype:
            missing.append(lname)
            continue
        data[int(t.source_index)] = np.ascontiguousarray(arr, dtype=np.dtype(t.dtype).newbyteorder("<")).tobytes()
    return data, missing


def write_tflite(graph: Graph, path: Path) -> None:
    write_model(graph, Path(path), description="tinytrain: trained on device")


def model_tensor_count(path: Path) -> int:
    """Tensors of subgraph 0 of a .tflite / .circle file (the .wof's n_buffers)."""
    import tflite

    buf = Path(path).read_bytes()
    model = tflite.Model.GetRootAsModel(buf, 0)
    if model.SubgraphsLength() < 1:
        raise ExportError(f"{path}: the model has no subgraph")
    return int(model.Subgraphs(0).TensorsLength())


def graph_tensor_count(graph_json: Mapping[str, Any]) -> int:
    """Fallback when the model file is not at hand: one past the highest original tensor index the
    IR knows (misses unused tensors at the end of the file, so the model file is preferred)."""
    idx = [t["source_index"] for t in graph_json.get("tensors", []) if t.get("source_index") is not None]
    return max(idx) + 1 if idx else 0
