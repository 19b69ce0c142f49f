"""tinytrain int8 training against PyTorch fp32 training of the same layers, on the same split and sample order
(issue 17, item 4).

    PYTHONPATH=... python bench/int8_vs_fp32.py [SPEC] [--engine host|golden] [--check] [--seeds 3] [--first-seed 0]
        [--epochs N] [--lr LR] [--optimizers sgd,momentum,adam,rmsprop] [--plans auto,full]
        [--modes default,nearest,stochastic,master,fp32-twin,fp32-clamp] [--no-rescale] [--json out.json]
        [--set KEY=VALUE ...]
    PYTHONPATH=... python bench/int8_vs_fp32.py --merge a.json b.json ...   # one table from runs shared out by order

SPEC: tinytrain.yaml.example (digits) by default; bench/mbv2_tte.yaml for MobileNetV2 with the TTE sparse scheme
(its `auto` row is the spec's own manual plan; write its data first with bench/make_mbv2_data.py, e.g. a larger
test split: `make_mbv2_data.py --test-per-class 100 --out build/bench-data/mbv2_synth_t100.npz` and
`--set data.path=build/bench-data/mbv2_synth_t100.npz`; --set overrides any spec key, as `tinytrain build --set`).
For every optimizer at its usual learning rate (SGD 0.01, momentum 0.9 at 0.01, Adam 0.001, RMSProp 0.001) and
plan (`auto`: the spec's own plan as sparse-plan picks it for that optimizer; `full`):
  int8   the quantize stage's int8 graph with the scales sparse-plan widened for head-room (stages/quant/rescale.py),
         trained with the update rule of the mode: `default` is the planner's choice from the spec's defaults
         (train_plan.json: the fp32 master copy or stochastic rounding where nearest rounding would erase the
         updates), printed per row; nearest / stochastic / master ask for that rule. Two engines train it:
    host (the default)  the real pipeline: the spec built for the `host` board up to cross-compile (sparse-plan
         given the spec board's memory budget, train.update.budget_kb, so that it plans what the spec's board gets:
         the bench stops if the default build's train_plan.json differs from the spec board's), the mode asked
         through its spec keys (MODE_KEYS: train.qas.rounding / master_copy), and per sample order the native
         firmware run on emulate-run's own run files with the train split's first n samples written in that order
         (the firmware trains in file order) and the order's seed as the runtime seed (stochastic rounding's PRNG);
         the trained tensors from its weights.bin, the accuracy from its results.json (the test split evaluated by
         the firmware). A MobileNetV2 step takes milliseconds. A build that asks for nearest rounding where the
         planner sees the updates vanish gets the planner's remedy instead: that mode is then reported as not
         measured (only the golden engine can force it). --no-rescale needs the golden engine.
    golden (--engine golden)  the numpy golden model (stages/golden/train_step.py) on the same graph, plan and rule
         (prepare()'s: the spec board's build; the forced modes keep the default's plan and scales), test accuracy
         on the reference executor's int8 kernels; minutes per MobileNetV2 order. It is what the device runs:
         tests/test_codegen.py pins the generated C's trained int8/int32 tensors to it bit for bit (QEMU identical
         to the host build; tests/test_rescale.py on a rescaled graph), and the golden model runs an int8 graph's
         fp32 backward in the C kernels' order (stages/golden/train_step.py EXACT_PRECISIONS).
    --check (host engine) trains every int8 cell and order with the golden model too and requires the firmware's
         trained tensors bit for bit and its accuracy, and on order 0 the pipeline's own emulate-run (run.json's
         accuracy, weights.bin); tests/test_int8_bench_host.py does the same on digits (slow).
  fp32   the load stage's float model (a model that comes int8, like the zoo's MobileNetV2: its int8 graph
         dequantized) mirrored in PyTorch (tests/torch_mirror.py), the same layers trained (a weight trained on a
         slice of its input channels gets its other channels' gradient zeroed), batch 1, softmax cross-entropy on
         the logits, torch.optim with the hyper-parameters the firmware uses.
  fp32-twin (mode) fp32 again with every trained parameter one float32 ulp up at the start: its gap to fp32 is the
         comparison's resolution. A training that amplifies a last-bit difference (a learning rate at the edge of
         divergence) ends elsewhere for any perturbation, int8 rounding or one ulp alike.
  fp32-clamp (mode) fp32 with every trained int8 weight clamped after each step to the real values of ±127 at the
         scales the int8 side trains with: what the weights' saturation alone costs.
Both train on the spec's train.max_train_samples first samples (all when null) for train.epochs epochs.
Sample order: seed 0 is the train split's file order (what the firmware streams, every epoch the same); seed s > 0
is a fixed seeded permutation of it, the same for both sides and every epoch. Accuracy: top-1 on the test split.
Prints mean ± spread (sample standard deviation over the seeds) per cell and the gap int8 − fp32: its mean over the
orders (each order paired) ± its standard error, the resolution of the mean (the fp32-twin row gives the same for
one ulp: where that is wide, fp32 itself is chaotic at the learning rate, and only many orders resolve a gap; --lr
gives a rate where it is not).

This is a benchmark (minutes), not a test: the accuracy claims of issue 17 live here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from tinytrain.cache.fs_ops import atomic_write_bytes  # noqa: E402
from tinytrain.stages.golden import train_step as te  # noqa: E402
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph  # noqa: E402
from tinytrain.stages.golden.forward import run_graph  # noqa: E402
from tinytrain.stages.model.ir import Graph  # noqa: E402
from tinytrain.stages.planning.train_plan import TrainPlan  # noqa: E402

# The optimizers' usual learning rates (issue 17, "Defaults that work").
USUAL_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 0.001, "rmsprop": 0.001}
MODES = {"default": None, "nearest": QASOptions(True, "nearest", False),
         "stochastic": QASOptions(True, "stochastic", False),
         "master": QASOptions(True, "nearest", True),
         # not int8: fp32 again with every trained parameter moved by one float32 ulp at the start. Its gap to fp32
         # is the comparison's own resolution: where training amplifies a last-bit difference (a chaotic run), no
         # int8 rule can be told from fp32 more finely than that.
         "fp32-twin": None,
         # not int8 either: fp32 with every trained int8 weight clamped after each step to the real values of ±127 at
         # the scales the int8 side trains with (the planner's rescale included). Its gap to fp32 is what the weights'
         # saturation alone costs (the digits diagnosis: clamping fp32 reproduced most of momentum's drop).
         "fp32-clamp": None}
FP32_MODES = ("fp32-twin", "fp32-clamp")
FP32_LABEL = {"fp32-twin": "(fp32, parameters +1 ulp: the resolution)",
              "fp32-clamp": "(fp32, weights clamped to the int8 range)"}
EVAL_BATCH = 256


# ---- what the pipeline gives: int8 graph, float graph, the plan, the data ----------------------------------

def prepare(spec_path: Path, kind: str, work: Path, plan: str, overrides: dict | None = None) -> dict:
    """The spec built up to sparse-plan with optimizer `kind` and, for plan "full", scheme full (the planner's
    update check and rescale are then made for that plan): the quantize stage's int8 graph, the float graph
    (the load stage's, or the int8 one dequantized when the model came quantized), the plan and the planner's
    choice (train_plan.json: `qas` when it changed the spec's rule, `rescale` when it widened scales)."""
    from tinytrain.pipeline.api import build
    from tinytrain.stages.quant.dequantize import dequantize_graph

    over = {**(overrides or {}), "train.optimizer.kind": kind, "build.out_dir": str(work / "build"),
            "build.cache_dir": str(work / "cache")}
    if plan == "full":
        over["train.update.scheme"] = "full"
    r = build(spec_path, until="sparse-plan", **over)
    tp = json.loads(r.stages["sparse-plan"].artifacts["train_plan.json"].read_text())
    qgraph = Graph.load(r.stages["quantize"].folder)
    fgraph = Graph.load(r.stages["load"].folder)
    if any(t.dtype == "int8" for t in fgraph.tensors.values()):
        fgraph = dequantize_graph(qgraph)
    q = r.spec.train.qas
    qas = tp.get("qas") or {"enabled": q.enabled, "rounding": q.rounding, "master_copy": q.master_copy}
    budget = json.loads(r.stages["sparse-plan"].artifacts["plan.json"].read_text()).get("budget_bytes")
    return {"spec": r.spec, "qgraph": qgraph, "fgraph": fgraph, "plan": TrainPlan.from_json(tp),
            "qas": QASOptions(bool(qas["enabled"]), str(qas["rounding"]), bool(qas["master_copy"])),
            "rescale": tp.get("rescale"), "summary": r.stages["sparse-plan"].summary, "budget_bytes": budget,
            "train_plan": r.stages["sparse-plan"].artifacts["train_plan.json"].read_bytes()}


def choice_text(prep: dict) -> str:
    """The planner's choice in a few words: the update rule, and the widest rescale."""
    q = prep["qas"]
    rule = "master copy" if q.master_copy else q.rounding
    w = (prep["rescale"] or {}).get("weights") or {}
    o = (prep["rescale"] or {}).get("outputs") or {}
    if w:
        n = sum(sum(f > 1 for f in k) for k in w.values())
        rule += f", {n} ch ×≤{max(max(k) for k in w.values())}"
    if o:
        rule += f", out ×{max(o.values())}"
    return rule


def trained_names(graph: Graph, plan: TrainPlan) -> dict[str, int | None]:
    """Tensor name -> input channels trained (None: all) of every parameter `plan` trains."""
    out: dict[str, int | None] = {}
    for lay in plan.resolve(graph):
        if lay.in_channels:
            out[lay.weight] = None if lay.weight_ratio >= 1.0 else lay.in_channels * _per_channel(graph, lay)
        if lay.train_bias:
            out[lay.bias_tensor] = None
    return out


def _per_channel(graph: Graph, lay) -> int:
    """Elements of the weight's last axis per trained input channel (a depthwise multiplier spreads one input
    channel over several output columns)."""
    op = graph.ops[lay.op_index]
    if op.type == "depthwise_conv2d":
        return int(graph.tensors[lay.weight].shape[-1]) // int(graph.tensors[op.inputs[0]].shape[-1])
    return 1


def orders(n: int, seeds: list[int]) -> dict[int, np.ndarray]:
    return {s: (np.arange(n) if s == 0 else np.random.default_rng(s).permutation(n)) for s in seeds}


# ---- int8: the golden model ------------------------------------------------------------------------------

def train_int8(qgraph: Graph, plan: TrainPlan, kind: str, lr: float, rule: QASOptions, x, y, order, epochs: int,
               seed: int) -> tuple[dict[str, np.ndarray], dict]:
    tg = build_training_graph(qgraph, plan, "cross_entropy", OptimizerSpec(kind=kind), 1, rule)
    runtime = {"learning_rate": lr, "seed": seed}
    state = te.init_state(tg, runtime)
    for _ in range(epochs):
        for i in order:
            te.train_step(tg, state, x[i:i + 1], y[i:i + 1], runtime)
    params = {n: state[n] for n in tg.meta["train"]["trained"]}
    return params, {"saturated": _saturated(params)}


def accuracy_int8(qgraph: Graph, params: dict[str, np.ndarray], x, y) -> float:
    g = _with(qgraph, params)
    inp = g.tensors[g.inputs[0]]
    correct = 0
    for i in range(0, len(x), EVAL_BATCH):
        xb = np.concatenate([te._feed(x[j:j + 1], inp) for j in range(i, min(i + EVAL_BATCH, len(x)))])
        out = np.asarray(run_graph(g, {g.inputs[0]: xb})[g.outputs[0]]).reshape(len(xb), -1)
        correct += int(np.sum(np.argmax(out, axis=1) == y[i:i + EVAL_BATCH]))
    return correct / len(x)


def _with(graph: Graph, params: dict[str, np.ndarray]) -> Graph:
    import copy

    g = Graph(tensors=dict(graph.tensors), ops=graph.ops, inputs=graph.inputs, outputs=graph.outputs,
              meta=graph.meta)
    for name, arr in params.items():
        g.tensors[name] = copy.copy(graph.tensors[name])
        g.tensors[name].data = np.asarray(arr, graph.tensors[name].data.dtype)
    return g


# ---- int8: the native host build ---------------------------------------------------------------------------

# How each int8 mode is asked of a real build: the spec keys sparse-plan and autodiff read. `default` leaves the
# spec's own (the planner may then replace nearest rounding by a master copy or stochastic rounding). A build that
# asks for stochastic rounding or a master copy keeps it (update_check.decide); one that asks for nearest rounding
# gets the planner's remedy when the rounding would erase the updates, so `nearest` cannot always be built: the
# host engine then says so (ModeNotBuilt) and only the golden engine can force it.
MODE_KEYS = {"default": {},
             "nearest": {"train.qas.rounding": "nearest", "train.qas.master_copy": False},
             "stochastic": {"train.qas.rounding": "stochastic", "train.qas.master_copy": False},
             "master": {"train.qas.rounding": "nearest", "train.qas.master_copy": True}}
HOST_TIMEOUT_S = 3600.0


class ModeNotBuilt(Exception):
    """The mode's spec keys build another update rule (the planner replaced it)."""


def prepare_host(spec_path: Path, kind: str, work: Path, plan: str, mode: str, overrides: dict | None,
                 budget_bytes: int | None) -> dict:
    """The spec built for the `host` board up to cross-compile, with optimizer `kind`, plan "full" or the spec's
    own, the mode's spec keys, and the spec board's memory budget (`budget_bytes`, sparse-plan's plan.json; the
    host board has no limit, and the budget decides the auto plan and the planner's master copy vs stochastic
    rounding). Gives the native firmware, its io_layout, the int8 graph as autodiff trained it (rescaled), the plan
    and the update rule the build compiled; the same keys as `prepare` where they mean the same."""
    from tinytrain.pipeline.api import build

    over = {**(overrides or {}), **MODE_KEYS[mode], "train.optimizer.kind": kind, "target.board": "host",
            "build.out_dir": str(work / "build-host"), "build.cache_dir": str(work / "cache")}
    if plan == "full":
        over["train.update.scheme"] = "full"
    if budget_bytes is not None:
        over["train.update.budget_kb"] = budget_bytes / 1024   # resolve_budget: int(round(kb * 1024)), exact
    r = build(spec_path, until="cross-compile", **over)
    tp_path = r.stages["sparse-plan"].artifacts["train_plan.json"]
    tp = json.loads(tp_path.read_text())
    q = r.spec.train.qas
    qas = tp.get("qas") or {"enabled": q.enabled, "rounding": q.rounding, "master_copy": q.master_copy}
    rule = QASOptions(bool(qas["enabled"]), str(qas["rounding"]), bool(qas["master_copy"]))
    if mode != "default" and mode not in FP32_MODES and rule != MODES[mode]:
        raise ModeNotBuilt(f"the spec keys of mode {mode} build {_rule_name(rule)} (the planner's choice, "
                           f"train_plan.json); only --engine golden forces {mode}")
    from tinytrain.stages.quant import rescale

    qgraph = rescale.planned(Graph.load(r.stages["quantize"].folder), tp_path)
    layout = json.loads(r.stages["codegen"].artifacts["io_layout.json"].read_text())
    return {"spec": r.spec, "elf": r.stages["cross-compile"].artifacts["firmware.elf"], "layout": layout,
            "qgraph": qgraph, "plan": TrainPlan.from_json(tp), "qas": rule, "rescale": tp.get("rescale"),
            "train_plan": tp_path.read_bytes(), "overrides": over, "spec_path": spec_path, "streams": None}


def _rule_name(rule: QASOptions) -> str:
    return "the fp32 master copy" if rule.master_copy else f"{rule.rounding} rounding"


def _host_streams(hb: dict, n: int) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
    """emulate-run's own run files for this build (test.ttds; the train samples quantized as the stage streams
    them), and the first `n` train records (x, y) to permute per order. Made once per build."""
    from tinytrain.stages import emulate_run as er
    from tinytrain.stages.train.data import read_stream

    if hb["streams"] is None:
        rc = er.runtime_config(_runtime_cfg(hb, 0.01, 1, 0))
        files, _ = er.run_files(hb["spec"].data, hb["layout"], rc, hb["qgraph"])
        with tempfile.TemporaryDirectory(prefix="tinytrain-bench-") as tmp:
            p = Path(tmp) / "train.ttds"
            p.write_bytes(files["train.ttds"])
            x, y = read_stream(p)
        hb["streams"] = (files, x, y)
    files, x, y = hb["streams"]
    return files, x[:n], y[:n]


def _runtime_cfg(hb: dict, lr: float, epochs: int, seed: int) -> dict:
    """The runtime keys emulate-run's runtime_config reads, for one run: every record of the stream (the order's
    n samples), the optimizer's hyper-parameters from the spec."""
    return {"train.learning_rate": lr, "train.epochs": epochs, "train.seed": seed, "train.batch_size": 1,
            "train.optimizer": hb["spec"].train.optimizer, "train.max_train_samples": 0}


def train_host(hb: dict, lr: float, order: np.ndarray, epochs: int, seed: int, n: int
               ) -> tuple[dict[str, np.ndarray], dict, float]:
    """One run of the build's native firmware: the first `n` train samples in `order` (the stream written in that
    order: the firmware trains in file order, every epoch the same), `epochs` epochs at `lr`, runtime seed `seed`
    (the stochastic rounding's PRNG, as the golden engine's), then the test split evaluated by the firmware.
    Returns the trained tensors (graph names -> arrays, from weights.bin), the saturation counts and the accuracy
    (results.json acc_after)."""
    from tinytrain.stages import emulate_run as er
    from tinytrain.stages.device import export
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.train.runtime_config import FLAG_EVAL_AFTER

    files, x, y = _host_streams(hb, n)
    rc = dataclasses.replace(er.runtime_config(_runtime_cfg(hb, lr, epochs, seed)), flags=FLAG_EVAL_AFTER)
    with tempfile.TemporaryDirectory(prefix="tinytrain-bench-") as tmp:
        p = Path(tmp) / "train.ttds"
        write_stream(p, x[order], y[order])
        run = {**files, "train.ttds": p.read_bytes(), "runtime.bin": rc.to_bytes()}
        exe = er._private_copy(hb["elf"], Path(tmp))
        result = run_firmware(get_board("host"), exe, Path(tmp) / "run", run, HOST_TIMEOUT_S, losses_name=None)
    out = er.collect(result, hb["layout"], rc)
    entries = hb["layout"]["trained_tensors"]
    names = export.resolve(hb["qgraph"], entries)
    params = {names[k]: v for k, v in export.parse_weights(entries, out["weights"]).items()}
    acc = out["results"]["acc_after"]
    return params, {"saturated": _saturated(params), "weights_bin": out["weights"]}, \
        int(acc["correct"]) / int(acc["total"])


def stage_run(hb: dict, lr: float, epochs: int, n: int) -> tuple[float, bytes]:
    """The pipeline's own emulate-run of the build on the file order (seed 0, the gate off): run.json's accuracy
    after training and weights.bin. The bench's direct runs must reproduce it (--check)."""
    from tinytrain.pipeline.api import build

    r = build(hb["spec_path"], until="emulate-run", **hb["overrides"], **{
        "train.learning_rate": lr, "train.epochs": epochs, "train.seed": 0, "train.gate.enabled": False,
        "train.max_train_samples": n})
    a = r.stages["emulate-run"].artifacts
    acc = json.loads(a["run.json"].read_text())["accuracy"]["after"]
    return int(acc["correct"]) / int(acc["total"]), a["weights.bin"].read_bytes()


def _saturated(params: dict[str, np.ndarray]) -> dict[str, int]:
    return {n: int(np.sum(np.abs(p.astype(np.int64)) >= 127)) for n, p in params.items() if p.dtype == np.int8}


def check_host(hb: dict, kind: str, lr: float, params: dict, info: dict, acc: float, x, y, xt, yt, order,
               epochs: int, seed: int) -> str | None:
    """--check: the golden engine on the host build's own graph, plan and update rule, same order and seed, must end
    with the firmware's trained tensors bit for bit and its accuracy; order 0 (the file order) must also be what the
    pipeline's emulate-run stage gives (run.json's accuracy, weights.bin). The difference in words, or None."""
    gold, _ = train_int8(hb["qgraph"], hb["plan"], kind, lr, hb["qas"], x, y, order, epochs, seed)
    differ = sorted(n for n in set(gold) | set(params)
                    if n not in gold or n not in params or not np.array_equal(gold[n], params[n]))
    if differ:
        return f"the golden model's trained tensors differ from the firmware's: {', '.join(differ)}"
    g_acc = accuracy_int8(hb["qgraph"], gold, xt, yt)
    if g_acc != acc:
        return f"accuracy: firmware {acc:.4f}, golden model {g_acc:.4f}"
    if seed == 0 and np.array_equal(order, np.arange(len(order))):
        s_acc, s_weights = stage_run(hb, lr, epochs, len(order))
        if s_acc != acc or s_weights != info["weights_bin"]:
            return f"the pipeline's emulate-run gives {s_acc:.4f} (weights equal: {s_weights == info['weights_bin']})"
    return None


# ---- fp32: PyTorch -------------------------------------------------------------------------------------

def weight_limits(qgraph: Graph, names: dict[str, int | None]) -> dict[str, np.ndarray]:
    """Per trained int8 weight of `qgraph` (the scales the int8 side trains with), the real value of ±127 per
    element (its channel's scale × 127, broadcast along the quantisation axis): the range an int8 weight cannot
    leave. For the fp32-clamp mode."""
    out = {}
    for n in names:
        t = qgraph.tensors[n]
        if t.dtype != "int8" or t.quant is None:
            continue
        s = np.asarray(t.quant.scale, np.float32) * np.float32(127)
        shape = [1] * len(t.shape)
        if s.size > 1:
            shape[t.quant.axis] = -1
        out[n] = np.broadcast_to(s.reshape(shape), tuple(t.shape)).copy()
    return out


def train_fp32(fgraph: Graph, names: dict[str, int | None], kind: str, lr: float, x, y, order, epochs: int,
               nudge: bool = False, limits: dict[str, np.ndarray] | None = None):
    import torch
    import torch.nn.functional as F
    from torch_mirror import TorchMirror

    from tinytrain.stages.train.runtime_config import OPTIMIZER_DEFAULTS as D

    torch.set_num_threads(1)     # batch 1: threads only add overhead (and the machine is shared)
    torch.manual_seed(0)
    m = TorchMirror(fgraph)
    for p in m.parameters():
        p.requires_grad_(False)
    params = [m.param(n) for n in names]
    for p in params:
        if nudge:        # the fp32 twin: one ulp up, far below any int8 step
            with torch.no_grad():
                p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
        p.requires_grad_(True)
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=lr),
           "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=D.momentum),
           "adam": lambda: torch.optim.Adam(params, lr=lr, betas=(D.beta1, D.beta2), eps=D.eps),
           "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr, alpha=D.alpha, eps=D.eps)}[kind]()
    logits = _logits_tensor(fgraph)
    lim_t = {n: torch.tensor(v) for n, v in (limits or {}).items()}
    xt, yt = torch.tensor(np.asarray(x, np.float32)), torch.tensor(np.asarray(y, np.int64))
    for _ in range(epochs):
        for i in order:
            opt.zero_grad()
            loss = F.cross_entropy(m(xt[i:i + 1], upto=logits).reshape(1, -1), yt[i:i + 1])
            loss.backward()
            for n, k in names.items():
                if k is not None:
                    m.param(n).grad[..., k:] = 0
            opt.step()
            if limits:       # fp32-clamp: the weights kept inside the int8 range (nothing else of int8)
                with torch.no_grad():
                    for n, lim in lim_t.items():
                        p = m.param(n)
                        p.copy_(torch.minimum(torch.maximum(p, -lim), lim))
    return m, logits


def accuracy_fp32(m, logits: str, x, y) -> float:
    import torch

    with torch.no_grad():
        out = m(torch.tensor(np.asarray(x, np.float32)), upto=logits).reshape(len(x), -1).numpy()
    return float(np.mean(np.argmax(out, axis=1) == y))


def _logits_tensor(g: Graph) -> str:
    """The input of the final softmax (the loss is softmax cross-entropy on logits, as autodiff fuses it)."""
    out = g.outputs[0]
    for op in g.ops:
        if op.outputs[0] == out and op.type == "softmax":
            return op.inputs[0]
    return out


# ---- the table ---------------------------------------------------------------------------------------------

def mean_sd(v: list[float]) -> tuple[float, float]:
    a = np.asarray(v, np.float64) * 100
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def standard_error(sd: float, n: int) -> float:
    """The standard error of a mean over n sample orders (sd: their sample standard deviation)."""
    return sd / np.sqrt(n) if n > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="?", default=str(REPO / "tinytrain.yaml.example"))
    ap.add_argument("--seeds", type=int, default=3, help="sample orders (seed 0 = the file order)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the orders are first-seed .. first-seed + seeds − 1 (to share the orders out between "
                         "processes; each order's figures do not depend on the others)")
    ap.add_argument("--epochs", type=int, default=None, help="default: the spec's train.epochs")
    ap.add_argument("--lr", type=float, default=None,
                    help="one learning rate for every optimizer instead of its usual one (e.g. a rate at which fp32 "
                         "itself is stable)")
    ap.add_argument("--optimizers", default=",".join(USUAL_LR))
    ap.add_argument("--plans", default="auto,full", help="auto: the spec's own plan (whatever its scheme); full")
    ap.add_argument("--modes", default="default,nearest,stochastic,master",
                    help="default: the planner's choice with the spec's defaults; nearest, stochastic, master: that "
                         "update rule forced (the planner's rescale still applies); fp32-twin: fp32 with the trained "
                         "parameters one ulp off, whose gap to fp32 is the comparison's resolution; fp32-clamp: fp32 "
                         "with the trained int8 weights' range (±127 at the scales the int8 side trains with), what "
                         "saturation alone costs")
    ap.add_argument("--no-rescale", action="store_true",
                    help="train the quantize stage's graph as it is (the planner's rescale left out), to compare")
    ap.add_argument("--engine", choices=("host", "golden"), default="host",
                    help="what trains the int8 side: host (default), the real build's native firmware; golden, the "
                         "numpy golden model (bit-identical, ~1000x slower on MobileNetV2)")
    ap.add_argument("--check", action="store_true",
                    help="with --engine host: also train every int8 cell and order with the golden model and require "
                         "the same trained tensors and accuracy, and order 0 with the pipeline's own emulate-run "
                         "(run.json, weights.bin); exit 1 on any difference")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--work", default="/tmp/tinytrain-int8-vs-fp32", help="build folder and cache of the bench")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a spec key (a path relative to the working directory), e.g. data.path=...")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="print the table of earlier runs' --json files (paired per order) and exit; with --epochs and "
                         "--test-samples for its footnote")
    ap.add_argument("--test-samples", type=int, default=360, help="with --merge: the test split's size")
    a = ap.parse_args(argv)
    if a.merge:
        missing = [m for m in a.merge if not Path(m).is_file()]
        if missing:
            print(f"int8_vs_fp32: no such file {missing[0]}", file=sys.stderr)
            return 2
        try:
            rows = merge([Path(m) for m in a.merge])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"int8_vs_fp32: --merge needs this bench's --json files ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        print(table(rows, a.epochs or 3, a.test_samples))
        return 0
    overrides = {}
    for kv in a.set:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            print(f"int8_vs_fp32: --set wants KEY=VALUE, not {kv!r}", file=sys.stderr)
            return 2
        overrides[key] = str(Path(value).resolve()) if key.endswith(".path") else value
    kinds, plans, modes = a.optimizers.split(","), a.plans.split(","), a.modes.split(",")
    bad = [k for k in kinds if k not in USUAL_LR] + [p for p in plans if p not in ("auto", "full")] \
        + [m for m in modes if m not in MODES]
    if bad:
        print(f"int8_vs_fp32: unknown optimizer, plan or mode {bad[0]!r}", file=sys.stderr)
        return 2
    if a.engine == "host" and a.no_rescale:
        print("int8_vs_fp32: --no-rescale needs --engine golden (a build always trains the planner's scales)",
              file=sys.stderr)
        return 2
    if a.check and a.engine != "host":
        print("int8_vs_fp32: --check compares the host engine with the golden one: use it with --engine host",
              file=sys.stderr)
        return 2
    if a.seeds < 1 or a.first_seed < 0 or (a.lr is not None and not a.lr > 0):
        print("int8_vs_fp32: --seeds wants at least 1, --first-seed at least 0 and --lr a positive number",
              file=sys.stderr)
        return 2
    from tinytrain.stages.quant import rescale
    from tinytrain.stages.train.data import load_dataset

    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    rows, runs = [], []
    t0 = time.time()
    for kind in kinds:
        lr = a.lr if a.lr is not None else USUAL_LR[kind]
        for plan_name in plans:
            prep = prepare(Path(a.spec), kind, Path(a.work), plan_name, overrides)
            spec = prep["spec"]
            ds = load_dataset(spec.data)
            epochs = a.epochs or int(spec.train.epochs)
            n = spec.train.max_train_samples or len(ds.x_train)
            x, y, xt, yt = ds.x_train[:n], ds.y_train[:n], ds.x_test, ds.y_test
            ords = orders(len(x), seeds)
            plan = prep["plan"]
            names = trained_names(prep["qgraph"], plan)
            qg = prep["qgraph"] if a.no_rescale else rescale.apply(prep["qgraph"], prep["rescale"])
            chosen = choice_text(prep) if not a.no_rescale else choice_text({**prep, "rescale": None})
            fp = []
            for s in seeds:
                m, logits = train_fp32(prep["fgraph"], names, kind, lr, x, y, ords[s], epochs)
                fp.append(accuracy_fp32(m, logits, xt, yt))
                runs.append({"optimizer": kind, "lr": lr, "plan": plan_name, "side": "fp32", "seed": s,
                             "accuracy": fp[-1]})
            fm, fs = mean_sd(fp)
            for mode in modes:
                rule, label, host, choice = prep["qas"] if mode == "default" else MODES[mode], mode, None, chosen
                if a.engine == "host" and mode not in FP32_MODES:
                    try:
                        host = prepare_host(Path(a.spec), kind, Path(a.work), plan_name, mode, overrides,
                                            prep["budget_bytes"])
                    except ModeNotBuilt as e:
                        print(f"{kind:<8} lr {lr:<6g} {plan_name:<5} {mode:<36} not measured: {e}", flush=True)
                        continue
                    # the host build plans with the spec board's budget: its plan must be the one the golden
                    # engine trains (the spec's board), or the row would compare another build
                    if mode == "default" and host["train_plan"] != prep["train_plan"]:
                        print(f"int8_vs_fp32: the host build of {kind} {plan_name} planned otherwise than the "
                              f"spec's board (train_plan.json differs)", file=sys.stderr)
                        return 1
                    rule, choice = host["qas"], choice_text(host)
                    if mode != "default":
                        label = f"{mode}: {choice}"
                if mode == "default":
                    label = f"default: {choice}"
                elif mode in FP32_MODES:
                    label = FP32_LABEL[mode]
                acc, sat, start = [], [], None
                for s in seeds:
                    if mode in FP32_MODES:
                        lim = weight_limits(qg, names) if mode == "fp32-clamp" else None
                        m, logits = train_fp32(prep["fgraph"], names, kind, lr, x, y, ords[s], epochs,
                                               nudge=mode == "fp32-twin", limits=lim)
                        acc.append(accuracy_fp32(m, logits, xt, yt))
                        sat.append(0)
                        runs.append({"optimizer": kind, "lr": lr, "plan": plan_name, "side": mode, "seed": s,
                                     "accuracy": acc[-1]})
                        continue
                    if host is not None:
                        params, info, acc_s = train_host(host, lr, ords[s], epochs, s, len(x))
                        if a.check:
                            bad = check_host(host, kind, lr, params, info, acc_s, x, y, xt, yt, ords[s], epochs, s)
                            if bad:
                                print(f"int8_vs_fp32: --check: {kind} {plan_name} {mode} order {s}: {bad}",
                                      file=sys.stderr)
                                return 1
                    else:
                        params, info = train_int8(qg, plan, kind, lr, rule, x, y, ords[s], epochs, s)
                        acc_s = accuracy_int8(qg, params, xt, yt)
                    acc.append(acc_s)
                    sat.append(sum(info["saturated"].values()))
                    g_start = host["qgraph"] if host is not None else qg
                    start = sum(_saturated({n: g_start.tensors[n].data for n in params}).values())
                    runs.append({"optimizer": kind, "lr": lr, "plan": plan_name, "side": "int8", "mode": mode,
                                 "engine": a.engine, "seed": s, "choice": choice, "accuracy": acc[-1],
                                 "saturated": info["saturated"], "saturated_start": start})
                im, isd = mean_sd(acc)
                # the gap per sample order (int8 and fp32 saw the same order): the orders' own spread cancels
                gm, gs = mean_sd([a_ - f_ for a_, f_ in zip(acc, fp)])
                rows.append((kind, lr, plan_name, label, im, isd, fm, fs, gs, _sat_text(int(np.max(sat)), start),
                             len(seeds)))
                print(f"{kind:<8} lr {lr:<6g} {plan_name:<5} {label:<36} int8 {im:5.1f} ± {isd:3.1f}   "
                      f"fp32 {fm:5.1f} ± {fs:3.1f}   gap {gm:+5.1f} ± {standard_error(gs, len(seeds)):3.1f} "
                      f"(sd {gs:3.1f})   saturated ≤ {rows[-1][-2]}  [{time.time() - t0:.0f} s]", flush=True)
                if a.json:      # after every row: a long run interrupted keeps what it measured
                    _write_json(Path(a.json), seeds, epochs, runs)
    print()
    print(table(rows, epochs, len(xt), a.no_rescale))
    return 0


def _sat_text(after: int, start: int | None) -> str:
    """The table's saturation cell: the most int8 weights at ±127 after training over the orders, and how many were
    there before training (per-channel quantisation puts each channel's largest weight at ±127)."""
    return f"{after}" if start is None else f"{after} (start {start})"


def _write_json(path: Path, seeds: list[int], epochs: int, runs: list[dict]) -> None:
    # rewritten after every row so that an interrupted run keeps what it measured: atomically, or a Ctrl-C during
    # the write would lose all of it
    atomic_write_bytes(path, (json.dumps({"seeds": seeds, "epochs": epochs, "runs": runs}, indent=1) + "\n").encode())


def table(rows: list[tuple], epochs: int, n_test: int, no_rescale: bool = False) -> str:
    out = ["| optimizer (lr) | plan | int8 update (default: the planner's choice) | orders | int8 % | fp32 % | "
           "gap ± s.e. (sd) | int8 weights at ±127 after (start) |", "|---|---|---|---|---|---|---|---|"]
    for kind, lr, plan, mode, im, isd, fm, fs, gs, sat, n in rows:
        out.append(f"| {kind} ({lr:g}) | {plan} | {mode} | {n} | {im:.1f} ± {isd:.1f} | {fm:.1f} ± {fs:.1f} | "
                   f"{im - fm:+.1f} ± {standard_error(gs, n):.1f} ({gs:.1f}) | {sat} |")
    out.append(f"\n{epochs} epochs, batch 1, {n_test} test samples; int8 and fp32: mean ± standard deviation over the "
               f"sample orders; gap: mean of int8 − fp32 per order ± its standard error (its standard deviation)"
               + ("; the planner's rescale left out (--no-rescale)." if no_rescale else "."))
    return "\n".join(out)


def merge(paths: list[Path]) -> list[tuple]:
    """The table's rows from the JSON of several runs (e.g. the orders shared out with --first-seed): every int8 mode
    and fp32 twin paired with fp32 on the orders both have. A run without `lr` took the optimizer's usual one."""
    runs = [r for p in paths for r in json.loads(p.read_text())["runs"]]
    fp: dict[tuple, dict[int, float]] = {}
    other: dict[tuple, dict[int, dict]] = {}
    for r in runs:
        key = (r["optimizer"], float(r.get("lr", USUAL_LR[r["optimizer"]])), r["plan"])
        if r["side"] == "fp32":
            fp.setdefault(key, {})[r["seed"]] = r["accuracy"]
        else:
            mode = r.get("mode", r["side"])
            other.setdefault(key + (mode,), {})[r["seed"]] = r
    rows = []
    for (kind, lr, plan, mode), by_seed in other.items():
        seeds = sorted(set(by_seed) & set(fp.get((kind, lr, plan), {})))
        if not seeds:
            continue
        acc = [by_seed[s]["accuracy"] for s in seeds]
        ref = [fp[(kind, lr, plan)][s] for s in seeds]
        first = by_seed[seeds[0]]
        label = (FP32_LABEL[mode] if mode in FP32_MODES else
                 f"default: {first['choice']}" if mode == "default" else
                 f"{mode}: {first['choice']}" if first.get("engine") == "host" else mode)
        sat = _sat_text(max((sum(by_seed[s].get("saturated", {}).values()) for s in seeds), default=0),
                        by_seed[seeds[0]].get("saturated_start"))
        im, isd = mean_sd(acc)
        fm, fs = mean_sd(ref)
        rows.append((kind, lr, plan, label, im, isd, fm, fs, mean_sd([a - f for a, f in zip(acc, ref)])[1], sat,
                     len(seeds)))
    return rows


def cli(argv: list[str] | None = None) -> int:
    """main() with a user's error (a spec that does not load, an override the spec refuses, a build that fails) as
    one line and exit 2, as `tinytrain build` gives it."""
    from tinytrain.pipeline.errors import TinytrainError
    try:
        return main(argv)
    except TinytrainError as e:
        print(f"int8_vs_fp32: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
