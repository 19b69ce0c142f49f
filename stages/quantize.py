"""Stage `quantize`: the float IR from `load` -> a real int8 IR (TFLite int8 spec), calibrated on
samples of the train split, with a report of what int8 costs (DESIGN §3, §6, §8.2).

Artifacts
  graph.json, tensors.npz   the int8 IR (for an already-int8 model: the validated input IR); with
                            quantize.enabled: false the float IR (for an int8 model file: its dequantized
                            float copy, stages/quant/dequantize.py)
  graph.txt                 one line per op
  model_int8.tflite         the int8 IR written as .tflite (LiteRT / TFLite Micro run it)
  report.json, report.txt   per tensor: scale, zero point, calibrated range, clipped fraction and
                            SQNR vs the float model on held-out samples; per model: float and int8
                            accuracy on the test split and their agreement; notes (folds, dequantized
                            float16 weights)

The work is split by job: ptq.py transforms graphs, calibrate.py picks ranges, bn_fold.py folds
BatchNorm; this module wires them to data, the executor and the artifacts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tinytrain.pipeline.contract import StageContext, StageResult, no_progress
from tinytrain.pipeline.errors import ModelError, UserError
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages import ops
from tinytrain.stages.quant import calibrate
from tinytrain.stages.quant import ptq
from tinytrain.stages.quant.dequantize import dequantize_graph, dequantized_constants
from tinytrain.stages.model import state
from tinytrain.stages.model.ir import Graph

ARTIFACTS = ("graph.json", "tensors.npz", "graph.txt", "model_int8.tflite", "report.json", "report.txt")
BATCH = 64
SQNR_CAP_DB = 150.0   # a tensor int8 reproduces exactly has infinite SQNR; JSON has no infinity


class QuantizeError(UserError):
    """The model or data cannot be quantized as configured."""


# ---- stage -------------------------------------------------------------------------------------

def run(ctx: StageContext) -> StageResult:
    spec = ctx.config.get("quantize")
    spec = spec if isinstance(spec, QuantizeSpec) else QuantizeSpec.model_validate(spec or {})
    data_spec = ctx.config.get("data")
    out = Path(ctx.out_dir)
    graph = Graph.load(ctx.input_dir("load"))
    int8_file = ptq.is_quantized(graph)
    if int8_file and not spec.enabled:
        refuse_stateful_float(graph)
    state.refuse_training(graph, "quantize")
    if int8_file and spec.enabled:
        return _passthrough(ctx, graph, data_spec, out, spec)
    if not spec.enabled:
        return _float(out, graph, int8_file)
    if data_spec is None:
        raise QuantizeError("quantize needs calibration data but the spec has no `data` section",
                            hint="add data: {source: digits} (or npz / images), or quantize.enabled: false")

    ctx.progress("loading data", 0.0)
    ds = _load_data(data_spec)
    check_data(graph, ds)
    calib = _calibration_samples(ds, spec)
    x_eval, y_eval, split = _eval_set(ds, calib, spec)
    qgraph, report = quantize_model(graph, calib, spec, x_eval, y_eval, split=split, progress=ctx.progress)

    ctx.progress("writing artifacts", 0.9)
    _save(out, qgraph)
    _write_report(out, report)
    return StageResult(summary=summary_line(report), metrics=_metrics(report))


def _float(out: Path, graph: Graph, int8_file: bool) -> StageResult:
    """quantize.enabled: false (train.precision fp32 / fp16-mixed): the float graph they train. An int8 model file
    gives its dequantized float copy (the int8 weights x their scales as float32 constants, the activations'
    quantize / dequantize gone), so what trains is what the precision says, never int8 under a float label."""
    if int8_file:
        fgraph = dequantize_graph(graph)
        n = dequantized_constants(graph, fgraph)
        note = f"int8 model file: training its dequantized float copy, {n} constants"
        graph, notes = fgraph, [note]
        mode, summary = "float (quantize.enabled: false): int8 model file dequantized", note
    else:
        graph, notes = float_graph(graph)
        mode = "float (quantize.enabled: false)"
        unpacked = f"; {len(notes)} compressed constants unpacked to float32" if notes else ""
        summary = f"float: quantization disabled, float graph passed through{unpacked}"
    graph.save(out)
    (out / "graph.txt").write_text(graph.to_text())
    _write_report(out, {"mode": mode, "tensors": [], "model": {}, "notes": notes})
    return StageResult(summary=summary, metrics={"quantized": False, "dequantized_int8": int8_file})


def refuse_stateful_float(graph: Graph) -> None:
    """A stateful int8 model (state variables, unrolled or not) has no float copy to train: its state is stored as
    int8 bytes between invocations and its one-invocation program (meta["unrolled"]["step"]) is int8. One line
    naming the file and the ways out."""
    svars = graph.meta.get("state") or graph.meta.get("unrolled", {}).get("variables")
    if not svars:
        return
    where = graph.meta.get("file") or "the model file"
    raise QuantizeError(f"{where}: a stateful int8 model ({len(svars)} state variables) cannot be trained in float "
                        f"(its state is int8 between invocations): set train.precision: int8, or give a float "
                        f"model file")


def float_graph(graph: Graph) -> tuple[Graph, list[str]]:
    """The float graph fp32 and fp16-mixed train (quantize.enabled: false): the loaded graph with the weights a
    file stores as float16 or int8 behind a DEQUANTIZE (TFLite's float16 and weight-only quantization, MediaPipe's
    models) unpacked to float32 constants, so their layers can train (and the master weights are fp32); frozen ones
    then sit in flash as float32 too. Returns the graph and one note per unpacked constant."""
    notes = ptq.dequantize_constants(graph)
    if notes:
        graph.validate()
    return graph, notes


def quantize_model(graph: Graph, calib: np.ndarray, spec: QuantizeSpec, x_eval: np.ndarray | None = None,
                   y_eval: np.ndarray | None = None, *, split: str = "test",
                   progress=no_progress) -> tuple[Graph, dict[str, Any]]:
    """The int8 graph of float `graph` calibrated on `calib` (float samples, batch first), and its
    report measured on `x_eval` (default: the calibration samples) with labels `y_eval` if given."""
    check_samples(graph, calib, "calibration samples")
    float_graph, notes = ptq.prepare(graph)
    progress(f"calibrating on {len(calib)} samples ({spec.calibration})", 0.2)
    ranges, _ = calibrate_graph(float_graph, calib, spec)
    qgraph = ptq.quantize_graph(float_graph, ranges, ptq.QuantizeOptions(spec.per_channel, spec.io))
    progress("evaluating int8 vs float", 0.6)
    if x_eval is None or len(x_eval) == 0:
        x_eval, y_eval, split = calib, None, "calibration"
    check_samples(graph, x_eval, f"{split} samples")
    report = evaluate(float_graph, qgraph, x_eval, y_eval, split=split)
    report["calibration"] = {"method": spec.calibration,
                             "percentile": spec.percentile if spec.calibration == "percentile" else None,
                             "samples": int(len(calib)), "seed": spec.seed,
                             "ranges": {n: [float(lo), float(hi)] for n, (lo, hi) in sorted(ranges.items())}}
    report["notes"] = notes
    report["mode"] = "ptq"
    return qgraph, report


def _passthrough(ctx: StageContext, graph: Graph, data_spec, out: Path, spec: QuantizeSpec) -> StageResult:
    """An already-int8 model passes through validated, without being executed: running it only to report its
    accuracy cost more than the rest of the stage (MobileNetV2: seconds and ~1 GB; emulate-run measures the
    accuracy before training anyway). Asked for, with `quantize.eval_samples`, the report gets the int8 accuracy
    on that many test samples. The data's shape is checked either way."""
    problems = ptq.validate_int8(graph)
    if problems:
        raise ModelError("the model is already int8 but its quantization is inconsistent:\n  - "
                         + "\n  - ".join(problems),
                         hint="re-convert it with the TFLite converter, or give quantize the float model")
    report: dict[str, Any] = {"mode": "passthrough (model already int8, validated)", "notes": [],
                              "tensors": tensor_table(graph), "model": {}}
    if data_spec is not None:
        ds = _load_data(data_spec)
        check_data(graph, ds)
        if len(ds.x_test) and spec.eval_samples is not None:
            x, y = ds.x_test[:spec.eval_samples], ds.y_test[:spec.eval_samples]
            logits = _outputs(graph, x)
            report["model"] = {"eval_split": "test", "eval_samples": int(len(x)), "acc_int8": _accuracy(logits, y)}
        elif len(ds.x_test):
            report["notes"].append("not executed: set quantize.eval_samples to report the int8 accuracy of the "
                                   "model as it is")
    _save(out, graph)
    _write_report(out, report)
    return StageResult(summary=summary_line(report), metrics=_metrics(report))


# ---- data --------------------------------------------------------------------------------------

def _load_data(data_spec):
    from tinytrain.stages.train.data import load_dataset
    return load_dataset(data_spec)


def _calibration_samples(ds, spec: QuantizeSpec) -> np.ndarray:
    from tinytrain.stages.train.data import calibration_samples
    x = calibration_samples(ds, spec.num_samples, spec.seed)
    return x[0] if isinstance(x, tuple) else x


def _single_input(graph: Graph) -> str:
    if len(graph.inputs) != 1:
        raise QuantizeError(f"calibration feeds one input tensor, the model has {len(graph.inputs)}: "
                            f"{graph.inputs}")
    return graph.inputs[0]


def num_classes(graph: Graph) -> int | None:
    """Classes of a classifier ([1, K] or [K] output); None when the output is not a class vector."""
    shape = graph.tensors[graph.outputs[0]].shape
    return int(shape[-1]) if len(shape) in (1, 2) and shape[-1] > 1 else None


def check_samples(graph: Graph, x: np.ndarray, what: str) -> None:
    """Samples must be non-empty, float, finite and shaped like the model input (batch excluded)."""
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] == 0:
        raise QuantizeError(f"{what}: no samples (the train split is empty)",
                            hint="check data.classes / data.path; quantize calibrates on the train split")
    if not np.issubdtype(x.dtype, np.floating):
        raise QuantizeError(f"{what}: dtype {x.dtype}, expected float samples (the model's float input)",
                            hint="set data.scale/offset so raw values map to the floats the model was trained on")
    from tinytrain.stages.train.data import check_sample_shape

    check_sample_shape(x.shape[1:], graph.tensors[_single_input(graph)].shape, what)
    if not np.all(np.isfinite(x)):
        raise QuantizeError(f"{what}: {int(np.size(x) - np.count_nonzero(np.isfinite(x)))} NaN/inf values")


def check_data(graph: Graph, ds) -> None:
    name = _single_input(graph)
    state.check_sequence_samples(graph, ds.x_train.shape[1:], "data (train split)")
    check_samples(graph, ds.x_train, "data (train split)")
    if len(ds.x_test):
        check_samples(graph, ds.x_test, "data (test split)")
    if getattr(ds, "regression", False):
        # Float targets: calibration needs only the inputs; the report compares int8 with float outputs (SQNR).
        return
    k = num_classes(graph)
    for split, y in (("train", ds.y_train), ("test", ds.y_test)):
        y = np.asarray(y)
        if y.size == 0:
            continue
        if not np.issubdtype(y.dtype, np.integer):
            raise QuantizeError(f"data ({split} split): labels have dtype {y.dtype}, expected integers")
        if y.min() < 0 or (k is not None and y.max() >= k):
            raise QuantizeError(f"data ({split} split): labels range over [{int(y.min())}, {int(y.max())}] but "
                                f"the model {name!r} -> {graph.outputs[0]!r} has {k} classes (0..{(k or 1) - 1})",
                                hint="select and relabel classes with data.classes")


def _eval_set(ds, calib: np.ndarray, spec: QuantizeSpec) -> tuple[np.ndarray, np.ndarray | None, str]:
    if len(ds.x_test):
        n = len(ds.x_test) if spec.eval_samples is None else min(spec.eval_samples, len(ds.x_test))
        return ds.x_test[:n], (None if getattr(ds, "regression", False) else ds.y_test[:n]), "test"
    return calib, None, "calibration"


# ---- execution ---------------------------------------------------------------------------------

def _batches(x: np.ndarray) -> Iterator[np.ndarray]:
    for i in range(0, len(x), BATCH):
        yield x[i:i + BATCH]


def _run(graph: Graph, x: np.ndarray, keep: bool) -> dict[str, np.ndarray]:
    from tinytrain.stages.golden.forward import run_graph
    name = graph.inputs[0]
    t = graph.tensors[name]
    if t.dtype == "int8":
        s, z = t.quant.scale[0], t.quant.zero_point[0]
        x = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
    else:
        x = x.astype(np.float32)
    return run_graph(graph, {name: x}, keep_intermediates=keep)


def _outputs(graph: Graph, x: np.ndarray) -> np.ndarray:
    """Real-valued first output over all samples (dequantized when int8)."""
    out = graph.tensors[graph.outputs[0]]
    parts = []
    for xb in _batches(x):
        y = np.asarray(_run(graph, xb, keep=False)[out.name])
        parts.append(_real(y, out))
    return np.concatenate(parts)


def _real(v: np.ndarray, t) -> np.ndarray:
    if t.quant is None or t.dtype not in ("int8", "int16", "int32", "uint8"):
        return np.asarray(v, np.float64)
    return (np.asarray(v, np.float64) - t.quant.zero_point[0]) * t.quant.scale[0]


def calibrate_graph(g: Graph, x: np.ndarray, spec: QuantizeSpec):
    """Range of every activation of the float graph `g` over samples `x`."""
    names = [n for n, t in g.tensors.items() if t.data is None]
    obs = calibrate.observe(lambda xb: _run(g, xb, keep=True), _batches(x), names, seed=spec.seed)
    ranges = {n: o.range(spec.calibration, spec.percentile) for n, o in obs.items() if o.count}
    return ranges, obs


# ---- report ------------------------------------------------------------------------------------

def _accuracy(logits: np.ndarray, y: np.ndarray | None) -> float | None:
    if y is None or logits.ndim < 2 or logits.shape[-1] < 2:
        return None
    return float(np.mean(np.argmax(logits.reshape(len(y), -1), axis=1) == y))


def sqnr_db(signal_power: float, noise_power: float) -> float:
    if noise_power <= 0:
        return SQNR_CAP_DB
    if signal_power <= 0:
        return -SQNR_CAP_DB
    return float(min(SQNR_CAP_DB, 10.0 * math.log10(signal_power / noise_power)))


def evaluate(fg: Graph, qg: Graph, x: np.ndarray, y: np.ndarray | None, split: str = "test") -> dict[str, Any]:
    """Run float and int8 graphs on `x`; per-tensor SQNR and clipping, per-model accuracy."""
    pairs = [(n, ptq.float_name(qg, n)) for n, t in qg.tensors.items()
             if t.data is None and t.dtype == "int8"]
    acc = {n: {"signal": 0.0, "noise": 0.0, "clipped": 0, "count": 0} for n, _ in pairs}
    fout, qout = [], []
    out_f, out_q = fg.tensors[fg.outputs[0]], qg.tensors[qg.outputs[0]]
    for xb in _batches(x):
        fv = _run(fg, xb, keep=True)
        qv = _run(qg, xb, keep=True)
        fout.append(np.asarray(fv[out_f.name], np.float64))
        qout.append(_real(qv[out_q.name], out_q))
        for qn, fn in pairs:
            if qn not in qv or fn not in fv:
                continue
            t = qg.tensors[qn]
            f = np.asarray(fv[fn], np.float64)
            r = _real(qv[qn], t)
            s, z = t.quant.scale[0], t.quant.zero_point[0]
            lo, hi = (-128 - z - 0.5) * s, (127 - z + 0.5) * s
            a = acc[qn]
            a["signal"] += float(np.sum(f * f))
            a["noise"] += float(np.sum((f - r) ** 2))
            a["clipped"] += int(np.count_nonzero((f < lo) | (f > hi)))
            a["count"] += f.size
    tensors = tensor_table(qg)
    for row in tensors:
        a = acc.get(row["name"])
        if a and a["count"]:
            row["sqnr_db"] = round(sqnr_db(a["signal"], a["noise"]), 2)
            row["clipped_fraction"] = a["clipped"] / a["count"]
    fo, qo = np.concatenate(fout), np.concatenate(qout)
    out_rows = [r for r in tensors if r["name"] in qg.outputs or ptq.float_name(qg, r["name"]) in qg.outputs]
    model: dict[str, Any] = {
        "eval_split": split, "eval_samples": int(len(x)),
        "ops_quantized": sum(op.type not in ops.CONVERSION_OPS for op in qg.ops),
        "output_sqnr_db": round(sqnr_db(float(np.sum(fo * fo)), float(np.sum((fo - qo) ** 2))), 2),
    }
    # The worst interior tensor says where int8 hurts; inputs and outputs are reported on their own.
    boundary = set(qg.inputs) | set(qg.outputs) | {r["name"] for r in out_rows} | {
        n for n in qg.tensors if ptq.float_name(qg, n) in qg.inputs}
    scored = [r for r in tensors if "sqnr_db" in r and r["name"] not in boundary]
    if scored:
        worst = min(scored, key=lambda r: r["sqnr_db"])
        model["worst_tensor"], model["worst_sqnr_db"] = worst["name"], worst["sqnr_db"]
    model["output_tensors"] = [r["name"] for r in out_rows]
    if fo.ndim >= 2 and fo.shape[-1] > 1:
        model["agreement"] = float(np.mean(np.argmax(fo.reshape(len(x), -1), 1) == np.argmax(qo.reshape(len(x), -1), 1)))
    af, ai = _accuracy(fo, y), _accuracy(qo, y)
    if af is not None:
        model["acc_float"], model["acc_int8"] = af, ai
    return {"tensors": tensors, "model": model}


def tensor_table(g: Graph) -> list[dict[str, Any]]:
    rows = []
    order = list(dict.fromkeys(list(g.inputs) + [n for op in g.ops for n in op.outputs]))
    for n in order:
        t = g.tensors[n]
        if t.data is None and t.quant is not None and t.dtype == "int8":
            rows.append({"name": n, "shape": list(t.shape), "scale": t.quant.scale[0],
                         "zero_point": t.quant.zero_point[0],
                         "range": [(-128 - t.quant.zero_point[0]) * t.quant.scale[0],
                                   (127 - t.quant.zero_point[0]) * t.quant.scale[0]]})
    return rows


def short_name(name: str) -> str:
    """Converter tensor names join every fused TF op with ';': the first is the readable one."""
    return name.split(";")[0]


def summary_line(report: dict[str, Any]) -> str:
    m = report.get("model", {})
    if report.get("mode", "").startswith("passthrough"):
        acc = f", acc int8 {m['acc_int8']:.1%}" if m.get("acc_int8") is not None else ""
        return f"int8: model already int8, validated and passed through{acc}"
    parts = [f"int8: {m.get('ops_quantized', 0)} ops quantized, SQNR {m.get('output_sqnr_db', 0):.1f} dB"]
    if "worst_tensor" in m:
        parts[0] += f" (worst: {short_name(m['worst_tensor'])} {m['worst_sqnr_db']:.1f} dB)"
    if m.get("acc_float") is not None:
        parts.append(f"acc float {m['acc_float']:.1%} → int8 {m['acc_int8']:.1%}")
    return ", ".join(parts)


def _metrics(report: dict[str, Any]) -> dict[str, Any]:
    m = report.get("model", {})
    keys = ("ops_quantized", "output_sqnr_db", "worst_sqnr_db", "acc_float", "acc_int8", "agreement")
    return {"mode": report.get("mode"), **{k: m[k] for k in keys if k in m}}


def report_text(report: dict[str, Any]) -> str:
    lines = [summary_line(report), f"mode: {report.get('mode')}"]
    m = report.get("model", {})
    if m:
        lines.append("model: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in m.items() if k != "output_tensors"))
    cal = report.get("calibration")
    if cal:
        lines.append(f"calibration: {cal['method']}" + (f" p={cal['percentile']}" if cal.get("percentile") else "")
                     + f", {cal['samples']} train samples, seed {cal['seed']}")
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    rows = report.get("tensors", [])
    if rows:
        names = [short_name(r["name"]) for r in rows]
        w = max(len("tensor"), *(len(n) for n in names))
        lines += ["", f"{'tensor':<{w}}  {'shape':<16} {'scale':>11} {'zp':>5} {'range':>21} {'clipped':>8} {'SQNR dB':>8}"]
        for n, r in zip(names, rows):
            rng = f"[{r['range'][0]:.4g}, {r['range'][1]:.4g}]"
            clip = f"{r['clipped_fraction']:.3%}" if "clipped_fraction" in r else "-"
            sq = f"{r['sqnr_db']:.1f}" if "sqnr_db" in r else "-"
            lines.append(f"{n:<{w}}  {str(r['shape']):<16} {r['scale']:>11.5g} {r['zero_point']:>5} {rng:>21} "
                         f"{clip:>8} {sq:>8}")
    return "\n".join(lines) + "\n"


# ---- artifacts ---------------------------------------------------------------------------------

def _save(out: Path, g: Graph) -> None:
    from tinytrain.stages.model.tflite_writer import write_model
    g.save(out)
    (out / "graph.txt").write_text(g.to_text())
    write_model(g, out / "model_int8.tflite")


def _write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n")
    (out / "report.txt").write_text(report_text(report))


def inspect(path: Path) -> str | None:
    """Readable view of a quantize artifact: the report table by default; graph.txt as is; None (the
    generic view) for the other files."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if path.name == "graph.txt":
        return path.read_text()
    if path.name == "graph.json":
        return Graph.load(path.parent).to_text()
    if path.suffix == ".tflite":
        from tinytrain.stages.model.tflite_reader import read_model
        return read_model(path).to_text()
    if path.name != "report.json":
        return None
    return report_text(json.loads(path.read_text()))
