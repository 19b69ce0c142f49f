"""tinytrain int8 training against PyTorch fp32 training of the same layers, on the same split and sample order
(issue 17, item 4).

    PYTHONPATH=... python bench/int8_vs_fp32.py [tinytrain.yaml.example] [--seeds 3] [--epochs N]
        [--optimizers sgd,momentum,adam,rmsprop] [--plans auto,full] [--json out.json]

For every optimizer at its usual learning rate (SGD 0.01, momentum 0.9 at 0.01, Adam 0.001, RMSProp 0.001) and
plan (the spec's `auto` plan as sparse-plan picks it for that optimizer, and `full`):
  int8   the quantize stage's int8 graph trained by the numpy golden model (stages/golden/train_step.py) with QAS and
         nearest rounding, stochastic rounding, or the fp32 master copy. The golden model is what the device runs:
         tests/test_codegen.py pins the generated C's trained int8/int32 tensors to it bit for bit after 20 steps
         (QEMU identical to the host build), so this is the device's training without a build per cell (a build
         and a QEMU run per cell would take hours on the shared machine). Over whole runs the fp32 backward's
         last-bit differences (C vs numpy, within 1e-5) can flip an occasional rounding: a host build of the
         example (Adam, auto, seed 0) matched the golden model exactly with nearest rounding and to one test
         sample with the master copy;
  fp32   the load stage's float model mirrored in PyTorch (tests/torch_mirror.py), the same layers trained
         (a weight trained on a slice of its input channels gets its other channels' gradient zeroed), batch 1,
         softmax cross-entropy on the logits, torch.optim with the hyper-parameters the firmware uses.
Sample order: seed 0 is the train split's file order (what the firmware streams, every epoch the same); seed s > 0
is a fixed seeded permutation of it, the same for both sides and every epoch. Accuracy: top-1 on the test split
(int8 on the reference executor's int8 kernels, bit-exact to the device's forward). Prints mean ± spread (sample
standard deviation over the seeds) per cell and the gap int8 − fp32.

This is a benchmark (minutes), not a test: the accuracy claims of issue 17 live here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from tinytrain.stages.golden import train_step as te  # noqa: E402
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph  # noqa: E402
from tinytrain.stages.golden.forward import run_graph  # noqa: E402
from tinytrain.stages.model.ir import Graph  # noqa: E402
from tinytrain.stages.planning.train_plan import TrainPlan  # noqa: E402

# The optimizers' usual learning rates (issue 17, "Defaults that work").
USUAL_LR = {"sgd": 0.01, "momentum": 0.01, "adam": 0.001, "rmsprop": 0.001}
MODES = {"nearest": QASOptions(True, "nearest", False), "stochastic": QASOptions(True, "stochastic", False),
         "master": QASOptions(True, "nearest", True)}
EVAL_BATCH = 256


# ---- what the pipeline gives: int8 graph, float graph, the plan, the data ----------------------------------

def prepare(spec_path: Path, kind: str, work: Path) -> dict:
    """The spec built up to sparse-plan with optimizer `kind` (its auto plan prices the optimizer's state):
    the quantize stage's int8 graph, the load stage's float graph and the auto plan."""
    from tinytrain.pipeline.api import build

    r = build(spec_path, until="sparse-plan", **{"train.optimizer.kind": kind, "build.out_dir": str(work / "build"),
                                                 "build.cache_dir": str(work / "cache")})
    plan = TrainPlan.from_json(json.loads(r.stages["sparse-plan"].artifacts["train_plan.json"].read_text()))
    return {"spec": r.spec, "qgraph": Graph.load(r.stages["quantize"].folder),
            "fgraph": Graph.load(r.stages["load"].folder), "auto": plan,
            "summary": r.stages["sparse-plan"].summary}


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


# ---- issue 17 item 2, as an experiment: head-room for the trained weights' scales ------------------------------

def widen(qgraph: Graph, plan: TrainPlan, k: float, k_out: float = 1.0) -> Graph:
    """A copy of `qgraph` whose trained int8 weights have k times their per-channel scale (q' = round(q / k), half
    away from zero) and whose int32 biases follow (their scale is s_in·s_W: b' = round(b / k)), so the layer
    computes about the same function with room for its weights to grow k-fold before they saturate; k_out widens
    the layer's int8 output activation's scale too (its calibrated range clamps the logits a new class needs). The
    golden model and the generated C both take their requantisation from the graph's scales, so they stay
    bit-exact to each other on the widened graph; only the forward's precision changes (log2 k bits)."""
    import copy

    from tinytrain.stages.quant import qas

    if k == 1 and k_out == 1:
        return qgraph
    g = Graph(tensors=dict(qgraph.tensors), ops=qgraph.ops, inputs=qgraph.inputs, outputs=qgraph.outputs,
              meta=qgraph.meta)
    for lay in plan.resolve(qgraph):
        if not lay.in_channels:        # a bias-only layer keeps its scales (the bias's is tied to the weight's)
            continue
        for name in [lay.weight] + ([lay.bias_tensor] if lay.bias_tensor else []):
            t = copy.deepcopy(qgraph.tensors[name])
            lo, hi = (-127, 127) if t.dtype == "int8" else (qas.INT32_MIN, qas.INT32_MAX)
            v = np.asarray(t.data, np.float64) / k
            t.data = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), lo, hi).astype(t.data.dtype)
            t.quant.scale = [float(s) * k for s in t.quant.scale]
            g.tensors[name] = t
        out = qgraph.ops[lay.op_index].outputs[0]
        if k_out != 1 and qgraph.tensors[out].quant is not None:
            # the layer's int8 output clamps at its calibrated range: its consumers read the new scale from the graph
            t = copy.deepcopy(qgraph.tensors[out])
            t.quant.scale = [float(s) * k_out for s in t.quant.scale]
            g.tensors[out] = t
    return g


# ---- int8: the golden model ------------------------------------------------------------------------------

def train_int8(qgraph: Graph, plan: TrainPlan, kind: str, lr: float, mode: str, x, y, order, epochs: int,
               seed: int) -> tuple[dict[str, np.ndarray], dict]:
    tg = build_training_graph(qgraph, plan, "cross_entropy", OptimizerSpec(kind=kind), 1, MODES[mode])
    runtime = {"learning_rate": lr, "seed": seed}
    state = te.init_state(tg, runtime)
    for _ in range(epochs):
        for i in order:
            te.train_step(tg, state, x[i:i + 1], y[i:i + 1], runtime)
    params = {n: state[n] for n in tg.meta["train"]["trained"]}
    return params, {"saturated": {n: int(np.sum(np.abs(p.astype(np.int64)) >= 127)) for n, p in params.items()
                                  if p.dtype == np.int8}}


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


# ---- fp32: PyTorch -------------------------------------------------------------------------------------

def train_fp32(fgraph: Graph, names: dict[str, int | None], kind: str, lr: float, x, y, order, epochs: int):
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
        p.requires_grad_(True)
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=lr),
           "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=D.momentum),
           "adam": lambda: torch.optim.Adam(params, lr=lr, betas=(D.beta1, D.beta2), eps=D.eps),
           "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr, alpha=D.alpha, eps=D.eps)}[kind]()
    logits = _logits_tensor(fgraph)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="?", default=str(REPO / "tinytrain.yaml.example"))
    ap.add_argument("--seeds", type=int, default=3, help="sample orders (seed 0 = the file order)")
    ap.add_argument("--epochs", type=int, default=None, help="default: the spec's train.epochs")
    ap.add_argument("--optimizers", default=",".join(USUAL_LR))
    ap.add_argument("--plans", default="auto,full")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--headroom", type=float, default=1.0,
                    help="experiment (issue 17 item 2): widen the trained weights' scales k-fold (see widen)")
    ap.add_argument("--headroom-out", type=float, default=1.0,
                    help="experiment: widen the trained layers' output activation scales k-fold too")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--work", default="/tmp/tinytrain-int8-vs-fp32", help="build folder and cache of the bench")
    a = ap.parse_args(argv)
    kinds, plans, modes = a.optimizers.split(","), a.plans.split(","), a.modes.split(",")
    bad = [k for k in kinds if k not in USUAL_LR] + [p for p in plans if p not in ("auto", "full")] \
        + [m for m in modes if m not in MODES]
    if bad:
        print(f"int8_vs_fp32: unknown optimizer, plan or mode {bad[0]!r}", file=sys.stderr)
        return 2
    from tinytrain.stages.train.data import load_dataset

    seeds = list(range(a.seeds))
    rows, runs = [], []
    t0 = time.time()
    for kind in kinds:
        lr = USUAL_LR[kind]
        prep = prepare(Path(a.spec), kind, Path(a.work))
        spec = prep["spec"]
        ds = load_dataset(spec.data)
        epochs = a.epochs or int(spec.train.epochs)
        x, y, xt, yt = ds.x_train, ds.y_train, ds.x_test, ds.y_test
        ords = orders(len(x), seeds)
        for plan_name in plans:
            plan = prep["auto"] if plan_name == "auto" else TrainPlan.full(prep["qgraph"])
            names = trained_names(prep["qgraph"], plan)
            qg = widen(prep["qgraph"], plan, a.headroom, a.headroom_out)
            fp = []
            for s in seeds:
                m, logits = train_fp32(prep["fgraph"], names, kind, lr, x, y, ords[s], epochs)
                fp.append(accuracy_fp32(m, logits, xt, yt))
                runs.append({"optimizer": kind, "plan": plan_name, "side": "fp32", "seed": s, "accuracy": fp[-1]})
            fm, fs = mean_sd(fp)
            for mode in modes:
                acc, sat = [], []
                for s in seeds:
                    params, info = train_int8(qg, plan, kind, lr, mode, x, y, ords[s], epochs, s)
                    acc.append(accuracy_int8(qg, params, xt, yt))
                    sat.append(sum(info["saturated"].values()))
                    runs.append({"optimizer": kind, "plan": plan_name, "side": "int8", "mode": mode, "seed": s,
                                 "accuracy": acc[-1], "saturated": info["saturated"]})
                im, isd = mean_sd(acc)
                rows.append((kind, lr, plan_name, mode, im, isd, fm, fs, int(np.max(sat))))
                print(f"{kind:<8} lr {lr:<6g} {plan_name:<5} {mode:<10} int8 {im:5.1f} ± {isd:3.1f}   "
                      f"fp32 {fm:5.1f} ± {fs:3.1f}   gap {im - fm:+5.1f}   saturated ≤ {rows[-1][-1]}  "
                      f"[{time.time() - t0:.0f} s]", flush=True)
    print()
    print(table(rows, len(seeds), epochs)
          + (f" Experiment: trained weights' scales widened {a.headroom:g}-fold, their layers' outputs' "
             f"{a.headroom_out:g}-fold." if (a.headroom, a.headroom_out) != (1, 1) else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({"seeds": seeds, "epochs": epochs, "runs": runs}, indent=1) + "\n")
    return 0


def table(rows: list[tuple], n_seeds: int, epochs: int) -> str:
    out = ["| optimizer (lr) | plan | int8 rounding | int8 % | fp32 % | gap | int8 weights at ±127 |",
           "|---|---|---|---|---|---|---|"]
    for kind, lr, plan, mode, im, isd, fm, fs, sat in rows:
        out.append(f"| {kind} ({lr:g}) | {plan} | {mode} | {im:.1f} ± {isd:.1f} | {fm:.1f} ± {fs:.1f} | "
                   f"{im - fm:+.1f} | {sat} |")
    out.append(f"\n{n_seeds} sample orders, {epochs} epochs, batch 1; ± is the standard deviation over the orders.")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
