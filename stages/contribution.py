"""Contribution analysis (TTE §2.2): how much accuracy each sparse-update option buys.

Measured by short fine-tuning runs, each a *unit* of its own (one TrainPlan, fine-tuned then scored):
  reference      the model as it is (no update)
  bias k         biases of the last k trainable layers, k = 1..K           Δ_b(k)   = acc(bias k) - acc(reference)
  weight l, r    the same biases down to layer l (k_l = its position from the end + 1) plus l's weights at ratio r
                                                                           Δ_w(l,r) = acc(weight l,r) - acc(bias k_l)
so a layer's weight gain is measured against the bias-only update whose gradient already reaches it (TTE's
"vs bias-only"), and the K bias runs double as the weight runs' references: K + 4·K + 1 runs in all.

How a unit runs (`make_measure`): the int8 graph from `quantize` is dequantized to float (weights and biases to
their real values, activations float32, QUANTIZE/DEQUANTIZE dropped) and trained with the float training path
(autodiff.build_training_graph + train_executor.train): SGD, batch 1, fused softmax cross-entropy, for
`analysis.steps` steps (default: one pass over `analysis.samples`), seeded. It is scored by top-1 accuracy on
`analysis.eval_samples` other samples. Both sets are a seeded split of the TRAIN split: the test split stays
unseen, so the accuracy the user reports later is honest. Float fine-tuning stands in for int8 + QAS, which TTE
shows tracks it; it is much faster and the ranking of options is what matters.

Nothing here depends on the memory budget: re-planning with another budget reuses the whole table.
Caching: each unit's key is sha256 of {graph content digest, data digest, the unit's plan (weights by tensor
name), the analysis settings}. `UnitCache` keeps one JSON file per key in a folder (given by the runner when it
provides one); `analyse(..., known=...)` also reuses the units of an earlier contributions.json. A unit whose
inputs did not change is never measured twice.

Stage use: `run(ctx)` is a stand-alone stage (`contribution`, config: train.update.scheme,
train.update.analysis, data; deps: quantize) whose contributions.json `sparse-plan` reads, so that a budget change
reruns only the search. Without that stage `sparse-plan` calls `analyse` itself.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinytrain.pipeline.contract import StageContext, StageResult, no_progress
from tinytrain.pipeline.errors import UserError
from tinytrain.stages.ir import Graph, canonical_json, npz_bytes
from tinytrain.stages.plan_memory import WEIGHT_RATIOS, channels, short_name
from tinytrain.stages.train_plan import LayerPlan, TrainPlan, _has_bias, _in_channels

TABLE_VERSION = 1
UNIT_VERSION = 1
EVAL_BATCH = 64

Measure = Callable[[TrainPlan | None], dict[str, float]]


class ContributionError(UserError):
    """Contribution analysis cannot run on this model or data."""


@dataclass(frozen=True)
class AnalysisSettings:
    samples: int = 256
    eval_samples: int = 256
    steps: int | None = None
    learning_rate: float = 0.01
    seed: int = 0
    max_layers: int | None = None

    @classmethod
    def from_spec(cls, spec: Any) -> "AnalysisSettings":
        if spec is None:
            return cls()
        d = spec if isinstance(spec, dict) else spec.model_dump()
        return cls(**{k: d[k] for k in asdict(cls()) if k in d})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def unit_json(self) -> dict[str, Any]:
        """What changes a unit's result: not max_layers (it only says which units exist)."""
        d = asdict(self)
        d.pop("max_layers")
        return d


# ---- digests and the unit cache ---------------------------------------------------------------------

def graph_digest(graph: Graph) -> str:
    h = hashlib.sha256()
    h.update(canonical_json(graph.to_json()).encode())
    h.update(npz_bytes({t.name: t.data for t in graph.constants()}))
    return h.hexdigest()


def unit_key(graph_dig: str, data_dig: str, plan: TrainPlan | None, settings: AnalysisSettings) -> str:
    doc = {"unit_version": UNIT_VERSION, "graph": graph_dig, "data": data_dig,
           "plan": plan.to_json() if plan is not None else None, "settings": settings.unit_json()}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


class UnitCache:
    """One JSON file per measured unit: <dir>/<key[:2]>/<key>.json, written atomically (temp + rename), so two
    builds measuring at once at worst measure a unit twice."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("key") == key and "accuracy" in doc else None

    def put(self, key: str, doc: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({**doc, "key": key}, sort_keys=True))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# ---- units -------------------------------------------------------------------------------------------

def trainable_layers(graph: Graph) -> list[int]:
    return TrainPlan.trainable_ops(graph)


def units(graph: Graph, settings: AnalysisSettings) -> list[tuple[str, dict[str, Any], TrainPlan | None]]:
    """(unit id, description, plan) for every measurement, plans naming layers by weight tensor (names survive
    dequantization, op indices do not)."""
    ops = trainable_layers(graph)
    depth = len(ops) if settings.max_layers is None else min(settings.max_layers, len(ops))

    def bias_plan(k: int, extra: tuple[int, float] | None = None) -> TrainPlan:
        lps = []
        for i in ops[len(ops) - k:]:
            w = graph.ops[i].inputs[1]
            ratio = extra[1] if extra and extra[0] == i else 0.0
            lps.append(LayerPlan(w, bias=_has_bias(graph, i), weight_ratio=ratio))
        return TrainPlan(lps)

    out: list[tuple[str, dict[str, Any], TrainPlan | None]] = [("reference", {"kind": "reference"}, None)]
    for k in range(1, depth + 1):
        out.append((f"bias:{k}", {"kind": "bias", "k": k, "earliest_op": ops[len(ops) - k]}, bias_plan(k)))
    for pos in range(depth):
        i = ops[len(ops) - 1 - pos]
        for r in WEIGHT_RATIOS:
            out.append((f"weight:{i}:{r}", {"kind": "weight", "op": i, "ratio": r, "position": pos,
                                            "channels": channels(_in_channels(graph, i), r),
                                            "reference_k": pos + 1},
                        bias_plan(pos + 1, (i, r))))
    return out


def analyse(graph: Graph, measure: Measure, settings: AnalysisSettings, *, graph_dig: str, data_dig: str,
            cache: UnitCache | None = None, known: dict[str, Any] | None = None,
            progress=no_progress) -> dict[str, Any]:
    """The contribution table (contributions.json). `measure(plan)` -> {"accuracy": ..., ...} runs one unit;
    it is called only for units found neither in `cache` nor in `known` (an earlier table)."""
    prior = {u["key"]: u for u in (known or {}).get("units", []) if "key" in u and "accuracy" in u}
    todo = units(graph, settings)
    rows: list[dict[str, Any]] = []
    measured = reused = 0
    for n, (uid, desc, plan) in enumerate(todo):
        key = unit_key(graph_dig, data_dig, plan, settings)
        doc = prior.get(key) or (cache.get(key) if cache else None)
        if doc is None:
            progress(f"measuring {uid} ({n + 1}/{len(todo)})", n / max(1, len(todo)))
            res = measure(plan)
            doc = {"accuracy": float(res["accuracy"]),
                   **{k: float(v) for k, v in res.items() if k != "accuracy" and isinstance(v, (int, float))}}
            measured += 1
            if cache:
                cache.put(key, doc)
        else:
            reused += 1
        row = {"id": uid, **desc, "key": key, "plan": plan.to_json() if plan else None,
               **{k: v for k, v in doc.items() if k not in ("key", "id", "plan") and k not in desc}}
        rows.append(row)
    return _table(graph, settings, graph_dig, data_dig, rows, measured, reused)


def _table(graph: Graph, settings: AnalysisSettings, gd: str, dd: str, rows: list[dict[str, Any]],
           measured: int, reused: int) -> dict[str, Any]:
    by_id = {r["id"]: r for r in rows}
    ref = by_id["reference"]["accuracy"]
    bias, weights = [], []
    for r in rows:
        if r["kind"] == "bias":
            bias.append({"k": r["k"], "earliest_op": r["earliest_op"], "accuracy": r["accuracy"],
                         "delta": r["accuracy"] - ref})
        elif r["kind"] == "weight":
            base = by_id[f"bias:{r['reference_k']}"]["accuracy"]
            weights.append({"op": r["op"], "ratio": r["ratio"], "position": r["position"],
                            "channels": r["channels"], "accuracy": r["accuracy"],
                            "reference_k": r["reference_k"], "delta": r["accuracy"] - base})
    ops = trainable_layers(graph)
    return {"version": TABLE_VERSION, "metric": "top-1 accuracy on held-out train samples (fraction)",
            "graph": gd, "data": dd, "settings": settings.to_json(),
            "layers": [{"op": i, "name": short_name(graph.ops[i].inputs[1]), "type": graph.ops[i].type,
                        "position": len(ops) - 1 - n} for n, i in enumerate(ops)],
            "reference": {"accuracy": ref}, "bias": bias, "weights": weights, "units": rows,
            "measured": measured, "reused": reused}


def table_matches(table: dict[str, Any] | None, graph_dig: str, settings: AnalysisSettings) -> bool:
    return (isinstance(table, dict) and table.get("version") == TABLE_VERSION and table.get("graph") == graph_dig
            and table.get("settings") == settings.to_json())


# ---- the float measurement --------------------------------------------------------------------------

def dequantize_graph(graph: Graph) -> Graph:
    """The float graph an int8 graph stands for: constants with quantization parameters become their real values
    (float32), activations float32, and QUANTIZE/DEQUANTIZE ops disappear (their output is their input). Tensor
    names are kept. A float graph comes back unchanged (a copy)."""
    g = copy.deepcopy(graph)
    alias: dict[str, str] = {}
    keep = []
    for op in g.ops:
        if op.type in ("quantize", "dequantize") and g.tensors[op.inputs[0]].data is None:
            src = op.inputs[0]
            alias[op.outputs[0]] = alias.get(src, src)
            continue
        op.inputs = [alias.get(t, t) if t else t for t in op.inputs]
        keep.append(op)
    g.ops = keep
    g.outputs = [alias.get(t, t) for t in g.outputs]
    for name in alias:
        g.tensors.pop(name, None)
    for t in g.tensors.values():
        if t.data is not None:
            if t.quant is not None and t.dtype in ("int8", "int16", "int32", "uint8"):
                q = t.quant
                scale = np.asarray(q.scale, np.float64)
                zp = np.asarray(q.zero_point, np.float64)
                if len(q.scale) > 1:
                    shape = [1] * t.data.ndim
                    shape[q.axis] = -1
                    scale, zp = scale.reshape(shape), zp.reshape(shape)
                t.data = ((np.asarray(t.data, np.float64) - zp) * scale).astype(np.float32)
                t.dtype, t.quant = "float32", None
            elif t.dtype == "float16":
                t.data, t.dtype = t.data.astype(np.float32), "float32"
        elif t.dtype in ("int8", "int16", "uint8", "float16"):
            t.dtype, t.quant = "float32", None
    for name in g.outputs:
        g.tensors[name].role = "output"
    g.validate()
    return g


def holdout_split(ds, settings: AnalysisSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_tune, y_tune, x_eval, y_eval): disjoint, seeded subsets of the TRAIN split."""
    n = len(ds.x_train)
    if n < 2:
        raise ContributionError(f"contribution analysis needs at least 2 train samples, the data has {n}")
    want = settings.samples + settings.eval_samples
    n_eval = settings.eval_samples if n >= want else max(1, round(n * settings.eval_samples / want))
    n_tune = min(settings.samples, n - n_eval)
    perm = np.random.default_rng(settings.seed).permutation(n)
    ev, tu = np.sort(perm[:n_eval]), np.sort(perm[n_eval:n_eval + n_tune])
    return ds.x_train[tu], ds.y_train[tu], ds.x_train[ev], ds.y_train[ev]


def num_classes(graph: Graph) -> int | None:
    shape = graph.tensors[graph.outputs[0]].shape
    return int(shape[-1]) if len(graph.outputs) == 1 and len(shape) in (1, 2) and shape[-1] > 1 else None


def make_measure(graph: Graph, ds, settings: AnalysisSettings) -> Measure:
    """The real measurement: float fine-tuning of `plan` on the tuning split, accuracy on the eval split."""
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.data import check_compatible
    from tinytrain.stages.train_executor import train

    k = num_classes(graph)
    if k is None:
        raise ContributionError("scheme auto scores options by classification accuracy, but the model's output "
                                f"{graph.tensors[graph.outputs[0]].shape} is not a class vector",
                                hint="use scheme manual, last_k or bias_only for this model")
    check_compatible(ds, graph.tensors[graph.inputs[0]].shape, k)
    fg = dequantize_graph(graph)
    x_tu, y_tu, x_ev, y_ev = holdout_split(ds, settings)
    steps = settings.steps or len(x_tu)
    opt = OptimizerSpec(kind="sgd", learning_rate=settings.learning_rate)

    def measure(plan: TrainPlan | None) -> dict[str, float]:
        params: dict[str, np.ndarray] = {}
        out: dict[str, float] = {}
        if plan is not None:
            tg = build_training_graph(fg, plan, "cross_entropy", opt, 1)
            losses, state = train(tg, x_tu, y_tu, steps=steps, seed=settings.seed)
            params = {n: state[n] for n in tg.meta["train"]["trained"]}
            tail = losses[-max(1, len(losses) // 10):]
            out["train_loss"] = float(np.mean(tail)) if np.all(np.isfinite(tail)) else float("nan")
        acc = evaluate(fg, params, x_ev, y_ev)
        out["accuracy"] = acc
        if not np.isfinite(out.get("train_loss", 0.0)):
            out.pop("train_loss")   # a diverged run scores its (poor) accuracy; JSON has no NaN
        return out

    return measure


def evaluate(fg: Graph, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of float graph `fg` with `params` (tensor name -> array) substituted."""
    from tinytrain.stages.executor import run_graph

    g = Graph(tensors=dict(fg.tensors), ops=fg.ops, inputs=fg.inputs, outputs=fg.outputs, meta=fg.meta)
    for name, arr in params.items():
        g.tensors[name] = copy.copy(fg.tensors[name])
        g.tensors[name].data = np.asarray(arr, np.float32)
    correct = 0
    for i in range(0, len(x), EVAL_BATCH):
        outs = run_graph(g, {g.inputs[0]: x[i:i + EVAL_BATCH].astype(np.float32)})
        pred = np.asarray(outs[g.outputs[0]]).reshape(len(x[i:i + EVAL_BATCH]), -1)
        if not np.all(np.isfinite(pred)):
            continue      # a diverged run: count its samples as wrong
        correct += int(np.sum(np.argmax(pred, axis=1) == y[i:i + EVAL_BATCH]))
    return correct / max(1, len(x))


# ---- stage -------------------------------------------------------------------------------------------

def load_graph(ctx: StageContext) -> Graph:
    for stage in ("quantize", "load"):
        try:
            return Graph.load(ctx.input_dir(stage))
        except KeyError:
            continue
    raise UserError("sparse-plan needs the IR of the quantize stage")


def unit_cache_of(ctx: StageContext) -> UnitCache | None:
    """The runner hands each stage a persistent folder for sub-stage units; each measurement is one unit there."""
    d = ctx.unit_cache_dir
    return UnitCache(Path(d) / "contribution") if d else None


def compute_table(graph: Graph, data_spec: Any, settings: AnalysisSettings, *, cache: UnitCache | None = None,
                  known: dict[str, Any] | None = None, progress=no_progress) -> dict[str, Any]:
    """Load the data and analyse (what both `run` and sparse-plan's fallback do)."""
    if data_spec is None:
        raise ContributionError("scheme auto measures each option by fine-tuning on the train data, but the spec "
                                "has no `data` section",
                                hint="add data: {source: ...}, or choose scheme manual / last_k / bias_only")
    from tinytrain.stages.data import load_dataset

    if isinstance(data_spec, dict):
        from tinytrain.pipeline.spec_data import DataSpec
        data_spec = DataSpec.model_validate(data_spec)
    ds = load_dataset(data_spec)
    measure = make_measure(graph, ds, settings)
    return analyse(graph, measure, settings, graph_dig=graph_digest(graph), data_dig=ds.digest(), cache=cache,
                   known=known, progress=progress)


def run(ctx: StageContext) -> StageResult:
    scheme = ctx.config.get("train.update.scheme", "auto")
    settings = AnalysisSettings.from_spec(ctx.config.get("train.update.analysis"))
    graph = load_graph(ctx)
    out = Path(ctx.out_dir)
    if scheme != "auto":
        doc = {"version": TABLE_VERSION, "skipped": f"scheme {scheme} needs no contribution analysis"}
        (out / "contributions.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return StageResult(summary=f"skipped (scheme {scheme})", metrics={"measured": 0})
    table = compute_table(graph, ctx.config.get("data"), settings, cache=unit_cache_of(ctx), progress=ctx.progress)
    write_table(out / "contributions.json", table)
    (out / "contributions.txt").write_text(table_text(table))
    return StageResult(summary=f"{table['measured']} units measured, {table['reused']} reused; reference acc "
                               f"{table['reference']['accuracy']:.1%}",
                       metrics={"measured": table["measured"], "reused": table["reused"],
                                "reference_accuracy": table["reference"]["accuracy"]})


def write_table(path: Path, table: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(table, indent=2, sort_keys=True, allow_nan=False) + "\n")


def table_text(table: dict[str, Any]) -> str:
    if "skipped" in table:
        return table["skipped"] + "\n"
    s = table["settings"]
    lines = [f"contribution analysis: {s['samples']} tuning / {s['eval_samples']} held-out train samples, "
             f"{s['steps'] or 'one pass'} steps, SGD lr {s['learning_rate']}, seed {s['seed']}",
             f"reference (no update): accuracy {table['reference']['accuracy']:.2%}", "",
             "biases of the last k layers (Δ vs no update, points)"]
    names = {lay["op"]: lay["name"] for lay in table["layers"]}
    for b in table["bias"]:
        lines.append(f"  k={b['k']:<3} down to {names.get(b['earliest_op'], b['earliest_op'])}: "
                     f"acc {b['accuracy']:.2%}  Δ {100 * b['delta']:+.1f}")
    lines += ["", "weights (Δ vs the bias-only update reaching the layer, points)",
              f"  {'op':>4}  {'layer':<40} " + " ".join(f"{r:>7g}" for r in WEIGHT_RATIOS)]
    by_op: dict[int, dict[float, float]] = {}
    for w in table["weights"]:
        by_op.setdefault(w["op"], {})[w["ratio"]] = w["delta"]
    for op in sorted(by_op, reverse=True):
        lines.append(f"  {op:>4}  {names.get(op, str(op))[:40]:<40} "
                     + " ".join(f"{100 * by_op[op].get(r, float('nan')):>+7.1f}" for r in WEIGHT_RATIOS))
    lines.append(f"\n{table.get('measured', 0)} units measured, {table.get('reused', 0)} reused")
    return "\n".join(lines) + "\n"


def inspect(path: Path) -> str | None:
    path = Path(path)
    if path.is_dir():
        path = path / "contributions.json"
    if path.name == "contributions.json":
        return table_text(json.loads(path.read_text()))
    return None
