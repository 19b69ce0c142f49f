"""Stage `load`: read the model file named by `model.path` into the IR (DESIGN §3, §5).

Artifacts: `graph.json` + `tensors.npz` (the IR), `graph.txt` (one line per op) and `summary.json`
(op counts, parameters, MACs, activation bytes, I/O, model dtype).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.pipeline.contract import StageContext, StageResult
from tinytrain.pipeline.errors import ModelError
from tinytrain.stages import ops
from tinytrain.stages.model import state, uint8_output
from tinytrain.stages.model.ir import Graph, Op
from tinytrain.stages.model.prune import prune_graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.readable import human_count

ARTIFACTS = ("graph.json", "tensors.npz", "graph.txt", "summary.json")


def run(ctx: StageContext) -> StageResult:
    model = ctx.config["model"]
    fmt = getattr(model, "format", "auto") or "auto"
    fmt = str(getattr(fmt, "value", fmt))  # a str Enum or a Literal, whichever the spec uses
    ctx.progress(f"reading {Path(model.path).name}", 0.0)
    cut = getattr(model, "outputs", None)  # model.outputs: train on these tensors, drop what follows them
    graph = read_model(Path(model.path), fmt, cut)
    if cut:
        graph = prune_graph(graph, cut)
    graph = state.for_training(graph, getattr(model, "sequence_length", None), str(model.path))
    try:
        graph.validate()
    except ValueError as e:  # read_model validates already; this guards a reader regression
        raise ModelError(f"{model.path}: inconsistent model graph: {e}") from None
    warnings = check_constants(graph)
    ctx.progress("writing IR", 0.5)
    out = Path(ctx.out_dir)
    graph.save(out)
    (out / "graph.txt").write_text(graph.to_text())
    summary = summarize(graph)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    line = summary_line(summary) + (f"; cut at {', '.join(cut)} (model.outputs)" if cut else "") + state.summary(graph) + \
        uint8_output.summary(graph.meta) + "".join(f"; warning: {w}" for w in warnings)
    return StageResult(summary=line, metrics=_metrics(summary) | {"warnings": warnings})


# ---- sanity of the numbers in the file -------------------------------------------------------------

# A trained float weight or bias beyond this magnitude is almost surely a corrupt file (a flipped exponent
# bit turns 0.5 into 2e37) or a unit mistake: one such value sets its channel's int8 scale, so every other
# weight of that channel quantizes to zero. Real layers stay far below it, BN-folded ones included.
ABSURD_WEIGHT_MAGNITUDE = 1e4


def check_constants(graph: Graph) -> list[str]:
    """Refuse constants that are not finite (ModelError, naming the tensor and the op that reads it) and
    return one warning per weight or bias whose magnitude is absurd. Quantization scales must be finite
    and positive: a zero or infinite scale makes every value of the tensor meaningless."""
    readers = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name is not None:
                readers.setdefault(name, (i, op))
    def where(name: str) -> str:
        if name not in readers:
            return f"constant {name!r}"
        i, op = readers[name]
        idx = op.source_index if op.source_index is not None else i
        return f"{op.type} #{idx}'s input {name!r}"

    warnings = []
    for t in graph.tensors.values():
        if t.quant is not None:
            scales = np.asarray(t.quant.scale, dtype=np.float64)
            if scales.size and not (np.all(np.isfinite(scales)) and np.all(scales > 0)):
                raise ModelError(f"{where(t.name)} has a quantization scale that is not a positive finite "
                                 f"number ({scales[~(np.isfinite(scales) & (scales > 0))][0]:g}): the model "
                                 f"file is corrupt")
        if t.data is None or t.data.dtype.kind != "f":
            continue
        values = t.data.astype(np.float64, copy=False)
        finite = np.isfinite(values)
        if not finite.all():
            bad = values[~finite]
            raise ModelError(f"{where(t.name)} holds {bad.size} non-finite value(s) ({bad.flat[0]:g}): the "
                             f"model file is corrupt or was saved after a diverged training run")
        peak = float(np.abs(values).max(initial=0.0))
        if t.role in ("weight", "bias") and peak > ABSURD_WEIGHT_MAGNITUDE:
            warnings.append(f"{where(t.name)} has |value| up to {peak:.3g}: the file may be corrupt, and "
                            f"int8 quantization of that tensor will lose the rest of its values")
    return warnings


# ---- summary ---------------------------------------------------------------------------------------

def summarize(graph: Graph) -> dict[str, Any]:
    params = [t for t in graph.tensors.values() if t.role in ("weight", "bias") and t.is_constant]
    activations = [t.nbytes for t in graph.tensors.values() if not t.is_constant]
    return {
        "format": graph.meta.get("format", "tflite"),
        "ops": len(graph.ops),
        "ops_by_type": dict(sorted(Counter(op.type for op in graph.ops).items())),
        "params": int(sum(int(np.prod(t.shape, dtype=np.int64)) for t in params)),
        "param_bytes": int(sum(t.nbytes for t in params)),
        "macs": int(sum(op_macs(graph, op) for op in graph.ops)),
        "activation_bytes": {"largest": max(activations, default=0), "total": int(sum(activations))},
        "inputs": [_io(graph, n) for n in graph.inputs],
        "outputs": [_io(graph, n) for n in graph.outputs],
        "dtype": model_dtype(graph),
    }


def op_macs(graph: Graph, op: Op) -> int:
    """Multiply-accumulates of one op: each output element of a conv sums KH*KW*I products, of a
    depthwise conv KH*KW, of a fully connected layer I (the weight's inner dimension)."""
    d = ops.get(op.type)
    return 0 if d is None or d.macs is None else int(d.macs(graph, op))


def model_dtype(graph: Graph) -> str:
    """float | int8 | float16-weights | mixed, judged by the weights and the data the layers compute on."""
    weighted = [op for op in graph.ops if op.type in ops.TRAINABLE_OPS]
    weights = {t.dtype for t in graph.tensors.values() if t.role == "weight"}
    if weighted:
        compute = {graph.tensors[op.inputs[0]].dtype for op in weighted}
    else:
        compute = {t.dtype for t in graph.tensors.values()
                   if not t.is_constant and t.dtype in ("float32", "float16", "int8")}
    if compute == {"float32"} and weights <= {"float32"}:
        return "float"
    if compute == {"float32"} and "float16" in weights and weights <= {"float16", "float32"}:
        return "float16-weights"
    if compute == {"int8"} and weights <= {"int8"}:
        return "int8"
    return "mixed"


def _io(graph: Graph, name: str) -> dict[str, Any]:
    t = graph.tensors[name]
    d: dict[str, Any] = {"name": name, "shape": list(t.shape), "dtype": t.dtype}
    if t.quant is not None and not t.quant.per_channel:
        d["scale"], d["zero_point"] = t.quant.scale[0], t.quant.zero_point[0]
    return d


def _metrics(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("ops", "params", "param_bytes", "macs", "dtype")
    return {k: summary[k] for k in keys} | {"activation_bytes_largest": summary["activation_bytes"]["largest"]}


# ---- readable forms --------------------------------------------------------------------------------

def summary_line(s: dict[str, Any]) -> str:
    """e.g. `14 ops, 12.3k params (48.1 KB), 1.13M MACs, int8`."""
    return (f"{s['ops']} ops, {human_count(s['params'])} params ({human_bytes(s['param_bytes'])}), "
            f"{human_count(s['macs'])} MACs, {s['dtype']}")


def human_bytes(n: int) -> str:
    for div, suffix in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
        if n >= div:
            return f"{n / div:.1f} {suffix}"
    return f"{int(n)} B"


def inspect(path: Path) -> str | None:
    """Readable view of `summary.json` (or of a load output folder): the summary line, I/O and a table
    of op counts. Other artifacts: None, so that `pipeline.inspect_artifacts` shows its generic view."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    if path.name != "summary.json":
        return None
    return _summary_text(json.loads(path.read_text()))


def _summary_text(s: dict[str, Any]) -> str:
    lines = [summary_line(s), ""]
    for label, items in (("input", s["inputs"]), ("output", s["outputs"])):
        for io in items:
            q = f"  scale={io['scale']:.6g} zp={io['zero_point']}" if "scale" in io else ""
            lines.append(f"{label:<7} {io['name']}  {io['dtype']}{io['shape']}{q}")
    act = s["activation_bytes"]
    lines += [f"activations: largest {human_bytes(act['largest'])}, total {human_bytes(act['total'])}", ""]
    width = max([len("op")] + [len(k) for k in s["ops_by_type"]])
    lines.append(f"{'op':<{width}}  count")
    lines.append(f"{'-' * width}  -----")
    for op_type, count in sorted(s["ops_by_type"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{op_type:<{width}}  {count:>5}")
    lines.append(f"{'total':<{width}}  {s['ops']:>5}")
    return "\n".join(lines) + "\n"


__all__ = ["run", "inspect", "summarize", "summary_line", "op_macs", "model_dtype"]
