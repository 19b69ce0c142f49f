"""Updates that never vanish silently (issue 17, item 1): at plan time, measure per trained int8/int32 tensor how
many of its updates nearest rounding erases, and choose what carries them.

An int8 weight moves by Δ = −d/s integer steps per update (stages/quant/qas.py; d the optimizer's step, s the tensor's
scale). With nearest rounding every |Δ| < 1/2 rounds to 0: the update is lost, on every step, for ever. Adam at
lr 0.001 takes steps of about lr per element, so a weight with s > 0.002 loses nearly all of them; with QAS off
(Δ = −d with the gradient scaled by s) almost every update is lost.

The probe (`probe`): the chosen plan's training graph, built for the build's optimizer and QAS setting with
nearest rounding and no master copy (the path whose losses are measured), runs PROBE_STEPS steps of the golden
model (stages/golden/train_step.py) on held-out train samples (contribution.holdout_split's tuning samples: the test
split stays unseen) at the optimizer's usual learning rate (USUAL_LEARNING_RATE: the build's own rate is a runtime
value, see there). Before each real update, the update op runs once more on
copies of its parameter and optimizer state with a zero fp32 "master copy" (qas.qas_update with master=0 sets
master = Δ exactly, since 0 + Δ is exact), so Δ is the device's own float32 value, not a re-derivation. Per
tensor:
  updates   elements with Δ ≠ 0, summed over the steps;
  lost      of those, the ones with round_nearest(Δ) = 0 (|Δ| < 1/2): the rounding erases them;
  lost_fraction = lost / updates; lost_mass = Σ|Δ| over the lost ones / Σ|Δ| (how much of the total movement
  they carry); median_abs_delta in integer steps; saturated: elements at ±127 (int8) after the probe;
  output_clamped: share of the layer's int8 outputs at −128 or 127 over the probe (its gradient stops there), where
  that end is not its fused activation's own bound (ReLU's 0, ReLU6's 6: no wider scale moves those);
  reach: per output channel of an int8 weight, the largest |q + ΣΔ| of its free trajectory (stages/quant/rescale.py);
  output_over (output_reach=True): per factor ×2^j, the share of the layer's outputs that would clamp with its
  output scale that much wider (_OutputReach).
sparse-plan's probe runs one pass over the train split's size (at most REACH_STEPS_MAX steps), first on the
quantiser's graph to choose the weights' head-room (stages/quant/rescale.py), then on the graph with those weights
widened, for the outputs' head-room and the decision below (wider scales shrink every Δ in int8 steps; the outputs'
wider scales are not probed again); emulate-run's re-check runs PROBE_STEPS.
A tensor *vanishes* when lost_mass > LOST_THRESHOLD: the rounding erases most of its movement. (lost_fraction
alone misleads: softmax cross-entropy gives most elements tiny but nonzero gradients every step, so SGD loses
~90 % of its update *elements* on the digits example yet matches fp32, its large updates surviving.)

The decision (`decide`), when some tensor vanishes and the build uses nearest rounding without a master copy:
  1. the fp32 master copy (4 bytes per trained weight element; it accumulates Δ exactly as fp32 training does)
     if the plan's exact peak with it fits the budget (or there is no budget);
  2. else stochastic rounding (one 4-byte PRNG state per update op; unbiased: E[round] = Δ) if that fits, or if
     the plan is over the budget without it too (a fixed scheme: the PRNG's bytes do not decide it);
  3. else no change and a warning: the stage summary and run.json (emulate-run reads update_check.json) give the
     fraction of updates lost per tensor.
With QAS off neither remedy helps (the update itself is s² times too small: a master copy would accumulate it
faithfully and still barely move), so the answer is the warning, saying why and to enable train.qas.
A build that already asks for stochastic rounding or a master copy is left as it is; the probe is still reported.
The choice is recorded as `qas` {enabled, rounding, master_copy} in plan.json and train_plan.json (what autodiff
reads), with its cost in bytes (exact peak with the choice minus without).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import numpy as np

from tinytrain.stages.quant import qas as qas_mod
from tinytrain.stages.quant import rescale
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.ir import Graph, canonical_json, npz_bytes
from tinytrain.stages.ops import STEP_COUNTER
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.train.losses import Head

PROBE_STEPS = 32          # golden-model steps of emulate-run's re-check (digits: well under a second)
REACH_STEPS_MAX = 2048    # sparse-plan's probe: one pass over the train split's size in steps, at most this many
LOST_THRESHOLD = 0.5      # a tensor "vanishes" when the rounding erases more than this share of its movement
_SHADOW_MASTER = "update_check/shadow_master"

__all__ = ["probe", "decide", "check", "peaks", "train_plan_fields", "recheck", "for_run", "vanishing",
           "summary_suffix", "text", "USUAL_LEARNING_RATE", "PROBE_STEPS", "LOST_THRESHOLD"]


# ---- the probe -----------------------------------------------------------------------------------------------

def _shadow_delta(op, values: dict[str, np.ndarray], runtime: dict, defaults: dict) -> np.ndarray:
    """The Δ (float32, integer units, trained slice) that update `op` applies now, from copies of its parameter and
    state: the op re-run with a zero master copy and nearest rounding leaves master = 0 + Δ = Δ. (Weight decay
    would read the zero copy as the weight; the firmware's runtime record sets it to 0.)"""
    if op.attrs.get("master") or op.attrs.get("rounding") != "nearest":
        raise ValueError("the probe graph must use nearest rounding without a master copy")
    p = values[op.inputs[0]]
    kind = op.type[len("qas_"):-len("_update")]
    n_state = qas_mod.STATE_COUNT[kind] + (1 if kind == "adam" else 0)   # adam: m, v and the step counter
    ins = list(op.inputs[:3 + n_state])
    shadow = dict(values)
    for name in ins[3:]:
        shadow[name] = np.array(values[name], copy=True)
    shadow[ins[0]] = np.array(p, copy=True)
    n = op.attrs.get("n")
    shadow[_SHADOW_MASTER] = np.zeros(p[qas_mod.go._slice(n)].shape, np.float32)
    sop = dataclasses.replace(op, inputs=ins + [_SHADOW_MASTER],
                              attrs={**op.attrs, "master": True, "rounding": "nearest", "reset_grad": False})
    te._qas_update(sop, shadow, runtime, defaults)
    return shadow[_SHADOW_MASTER]


class FrozenOps:
    """The forward ops of a training graph whose outputs depend on the sample alone: every input is the model input,
    a constant that training does not change, or another such op's output. A sparse plan freezes most of the network
    (MobileNetV2's TTE scheme: the first 36 layers, the large early ones), and the probe visits each held-out sample
    several times (one pass over the train split's size, twice: before and after the rescale), so it computes these
    ops once per sample (`PrefixCache`) instead of on every visit: the same kernels on the same values, the same
    bits. `frontier`: the prefix's outputs that anything else reads, the only ones kept; `fingerprint`: a digest of
    everything the prefix computes from (ops, attributes, constants, quantisation), so that two graphs share cached
    values only when their prefixes are the same computation. (The analysis' planning/frozen_prefix.py cuts a float
    graph at one tensor and runs the parts batched; the probe runs its int8 training graph op by op on the golden
    model, so it keeps these ops' outputs instead.)"""

    def __init__(self, tg: Graph, state: dict[str, np.ndarray]):
        meta = tg.meta["train"]
        split = int(meta["sample_ops"])
        x_name = next(n for n in tg.inputs if n != meta["label_input"])
        known: set[str] = {x_name}
        self.ops: set[int] = set()
        for i, op in enumerate(tg.ops[:split]):
            if op.type in te._FORWARD_OPS and all(n is None or n in known or self._constant(tg, n, state)
                                                     for n in op.inputs):
                self.ops.add(i)
                known.update(op.outputs)
        produced = {n for i in self.ops for n in tg.ops[i].outputs}
        read = {n for i, op in enumerate(tg.ops) if i not in self.ops for n in op.inputs if n is not None}
        self.frontier = produced & (read | set(tg.outputs))
        self.last = max(self.ops) if self.ops else -1
        # ir's one hashed form of a graph's structure (canonical_json) and of its constants (npz_bytes)
        names = sorted({n for i in self.ops for n in tg.ops[i].inputs + tg.ops[i].outputs if n is not None})
        structure = {"ops": [[i, tg.ops[i].type, tg.ops[i].inputs, tg.ops[i].outputs, tg.ops[i].attrs]
                             for i in sorted(self.ops)],
                     "tensors": {n: [tg.tensors[n].shape, tg.tensors[n].dtype,
                                     tg.tensors[n].quant.to_json() if tg.tensors[n].quant else None]
                                 for n in names}}
        h = hashlib.sha256(canonical_json(structure).encode())
        h.update(npz_bytes({n: tg.tensors[n].data for n in names if tg.tensors[n].data is not None}))
        self.fingerprint = h.hexdigest()

    @staticmethod
    def _constant(tg: Graph, name: str, state: dict[str, np.ndarray]) -> bool:
        return name not in state and tg.tensors[name].data is not None


class PrefixCache:
    """A frozen prefix's frontier values per sample of one probe data set `x` (FrozenOps), shared by the probes
    of one check. A value that is no frontier is never read after its prefix: it is left out (a placeholder that any
    arithmetic would refuse)."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._memo: dict[tuple[str, int], dict[str, np.ndarray]] = {}

    def forward_op(self, prefix: FrozenOps, sample: int) -> Callable | None:
        """run_sample's `forward_op` for sample `sample` of x (None: nothing frozen, the default forward)."""
        from tinytrain.stages.golden import forward as fwd_exec

        if not prefix.ops:
            return None
        key = (prefix.fingerprint, sample)
        hit = self._memo.get(key)
        if hit is not None:
            def cached(g: Graph, op, values: dict, *, index: int, n: int) -> list[np.ndarray]:
                if index in prefix.ops:
                    return [np.array(hit[o], copy=True) if o in hit else _NOT_KEPT for o in op.outputs]
                return fwd_exec.run_op(g, op, values, index=index, n=n)
            return cached
        kept: dict[str, np.ndarray] = {}

        def first(g: Graph, op, values: dict, *, index: int, n: int) -> list[np.ndarray]:
            outs = fwd_exec.run_op(g, op, values, index=index, n=n)
            if index in prefix.ops:
                kept.update((o, np.array(a, copy=True)) for o, a in zip(op.outputs, outs) if o in prefix.frontier)
                if index == prefix.last:
                    self._memo[key] = kept
            return outs
        return first


_NOT_KEPT = np.array(None, dtype=object)


def probe(graph: Graph, plan: TrainPlan, *, loss: Any, optimizer: str, qas_enabled: bool, learning_rate: float,
          x: np.ndarray, y: np.ndarray, steps: int = PROBE_STEPS, batch_size: int = 1,
          seed: int = 0, prefix_cache: PrefixCache | None = None,
          output_reach: bool = False) -> dict[str, dict[str, Any]]:
    """Per trained int8/int32 tensor: updates, lost, lost_fraction, lost_mass, median_abs_delta, saturated (see the
    module docstring). Empty for a float graph (nothing is rounded). `prefix_cache` (for this `x`): the frozen
    prefix's values computed by an earlier probe of the same samples, and kept for a later one. `output_reach`:
    also `output_over` per tensor (`_OutputReach`), for the output head-room (stages/quant/rescale.py)."""
    from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph

    tg = build_training_graph(graph, plan, loss, OptimizerSpec(kind=optimizer), batch_size,
                              QASOptions(qas_enabled, "nearest", False))
    meta = tg.meta["train"]
    ops = [op for op in tg.ops[int(meta["sample_ops"]):] if op.type in te._QAS_UPDATES]
    if not ops:
        return {}
    runtime = {"learning_rate": float(learning_rate), "seed": int(seed)}
    defaults = meta["runtime_defaults"]
    state = te.init_state(tg, runtime)
    if prefix_cache is None or prefix_cache.x is not x:
        prefix_cache = PrefixCache(x)
    prefix = FrozenOps(tg, state)
    acc = {op.inputs[0]: {"updates": 0, "lost": 0, "mass": 0.0, "lost_mass": 0.0, "deltas": []} for op in ops}
    # Where each int8 weight would go if its range did not stop it: its starting value plus every Δ the update
    # computed (the float trajectory a master copy without a clamp would follow). Its largest |value| per output
    # channel over the probe, in int8 steps, is the spread the training reaches (stages/quant/rescale.py).
    free = {op.inputs[0]: state[op.inputs[0]][qas_mod.go._slice(op.attrs.get("n"))].astype(np.float64)
            for op in ops if state[op.inputs[0]].dtype == np.int8}
    axis = {op.inputs[0]: int(op.attrs.get("axis", 0)) for op in ops}
    reach = {p: _channel_max(np.abs(u), axis[p]) for p, u in free.items()}
    # The int8 output of each trained parameter's layer: at its range's ends it clamps, and the gradient stops
    # there (issue 17 item 2: a classifier head whose logits need more room than calibration gave them).
    outputs = {p: op.outputs[0] for op in graph.ops for p in op.inputs[1:3]
               if p in acc and graph.tensors[op.outputs[0]].dtype == "int8"}
    clamped = {p: [0, 0] for p in outputs}
    layer_act = {op.outputs[0]: op.attrs.get("act", "none") for op in graph.ops}
    ends = {o: _clamp_codes(graph.tensors[o], layer_act[o]) for o in outputs.values()}
    wider = _OutputReach(tg, set(outputs.values()), layer_act) if output_reach else None
    n = len(x)
    order = np.random.default_rng(seed).permutation(n)
    # One BLAS thread: the probe's products are batch-1 sized, and a second thread only spins (MobileNetV2: 5.6 s
    # of CPU on two threads, 1.3 s on one, same bits; in emulate-run it runs beside QEMU, whose core it would take).
    from threadpoolctl import threadpool_limits

    with np.errstate(all="ignore"), threadpool_limits(limits=1, user_api="blas"):
        for k in range(steps):
            idx = [order[(k * batch_size + j) % n] for j in range(batch_size)]
            last = None
            for i in idx:
                last = te.run_sample(tg, state, x[i:i + 1], y[i:i + 1], prefix_cache.forward_op(prefix, int(i)),
                                     backward_op=te.numpy_backward)
                # Once per output: a layer's weight and bias share it, and the head-room count reads it too.
                at_ends = {o: int(np.sum(np.isin(np.asarray(last[o]), ends[o]))) for o in ends}
                for p, o in outputs.items():
                    clamped[p][0] += at_ends[o]
                    clamped[p][1] += int(np.asarray(last[o]).size)
                if wider is not None:
                    wider.visit(last, at_ends)
            for op in tg.ops[int(meta["sample_ops"]):]:
                if op.type == STEP_COUNTER.name:
                    state[op.inputs[0]][...] += 1
                    last[op.inputs[0]] = state[op.inputs[0]]
                    continue
                if op.type in te._QAS_UPDATES:
                    d = _shadow_delta(op, last, runtime, defaults)
                    a = acc[op.inputs[0]]
                    moving = d != 0
                    gone = moving & (qas_mod.round_nearest(d) == 0)
                    a["updates"] += int(moving.sum())
                    a["lost"] += int(gone.sum())
                    a["mass"] += float(np.abs(d[moving]).astype(np.float64).sum())
                    a["lost_mass"] += float(np.abs(d[gone]).astype(np.float64).sum())
                    a["deltas"].append(np.abs(d[moving]))
                    p = op.inputs[0]
                    if p in free:
                        free[p] += d
                        reach[p] = np.maximum(reach[p], _channel_max(np.abs(free[p]), axis[p]))
                    te._qas_update(op, last, runtime, defaults)
                else:
                    te._update(op, last, runtime, defaults)
    out = {}
    for name, a in acc.items():
        p = state[name]
        deltas = np.concatenate(a["deltas"]) if a["deltas"] else np.zeros(0, np.float32)
        lo, hi = (qas_mod.WEIGHT_RANGE if p.dtype == np.int8 else qas_mod.BIAS_RANGE)
        out[name] = {"dtype": str(p.dtype), "elements": int(np.prod(tg.tensors[meta["trained"][name]["gradient"]]
                                                                  .shape, dtype=np.int64)),
                     "updates": a["updates"], "lost": a["lost"],
                     "lost_fraction": a["lost"] / a["updates"] if a["updates"] else 0.0,
                     "lost_mass": a["lost_mass"] / a["mass"] if a["mass"] > 0 else 0.0,
                     "median_abs_delta": float(np.median(deltas)) if deltas.size else 0.0,
                     "saturated": int(np.sum((p <= lo) | (p >= hi))) if p.dtype == np.int8 else 0,
                     "output_clamped": clamped[name][0] / clamped[name][1] if clamped.get(name, [0, 0])[1] else 0.0}
        if name in reach:
            out[name]["reach"] = [round(float(r), 3) for r in reach[name]]
            out[name]["axis"] = axis[name]
        if wider is not None and name in outputs:
            out[name]["output_over"] = wider.shares(outputs[name], clamped[name][1])
    return out


class _OutputReach:
    """How much wider a trained layer's int8 output would have to be to stop clamping: `output_over[j]` is the share
    of its values over the probe that clamp with the output scale ×2^j (j = 0: the scale as it is; rescale.py's
    factors, up to MAX_FACTOR). Where a sample's output clamps at ×2^(j−1), its layer is run once more on the same
    operands with the output scale ×2^j (the reference executor's int8 kernel, the output tensor's copy the only
    change) and its values at that scale's clamp codes counted, until none clamps or the widest factor: exact counts,
    the cost of a layer's forward only on the samples that clamp."""

    def __init__(self, tg: Graph, outputs: set[str], layer_act: dict[str, str]):
        from tinytrain.stages.model.ir import QuantParams

        split = int(tg.meta["train"]["sample_ops"])
        self.steps = int(np.log2(rescale.MAX_FACTOR))
        self.counts = {o: np.zeros(self.steps + 1, np.int64) for o in outputs}
        self.runs: dict[str, list[tuple[Graph, Any, int, list[int]]]] = {}
        for i, op in enumerate(tg.ops[:split]):
            o = op.outputs[0] if op.outputs else None
            if o not in outputs or op.type not in te._FORWARD_OPS:
                continue
            t = tg.tensors[o]
            self.runs[o] = []
            for j in range(1, self.steps + 1):
                wide = dataclasses.replace(t, quant=QuantParams([float(np.float32(s * 2 ** j)) for s in t.quant.scale],
                                                                list(t.quant.zero_point), t.quant.axis))
                g = Graph(tensors={**tg.tensors, o: wide}, ops=tg.ops, inputs=tg.inputs, outputs=tg.outputs,
                          meta=tg.meta)
                self.runs[o].append((g, op, i, _clamp_codes(wide, layer_act.get(o, "none"))))

    def visit(self, values: dict[str, np.ndarray], clamped_now: dict[str, int]) -> None:
        from tinytrain.stages.golden import forward as fwd_exec

        for o, n in clamped_now.items():
            self.counts[o][0] += n
            for j, (g, op, i, ends) in enumerate(self.runs.get(o, ()), start=1):
                if n == 0:
                    break
                n = int(np.sum(np.isin(np.asarray(fwd_exec.run_op(g, op, values, index=i, n=1)[0]), ends)))
                self.counts[o][j] += n

    def shares(self, o: str, total: int) -> list[float]:
        return [float(c) / total if total else 0.0 for c in self.counts[o]]


# A fused activation's own bounds (real values): an int8 code at one of them is the activation, not a clamp.
_ACT_BOUNDS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def _clamp_codes(t, act: str) -> list[int]:
    """The int8 codes of tensor `t` that are a clamp of its range, not its activation's bound: −128 unless it stands
    for the activation's floor (a fused ReLU's output has zero point −128: −128 is real 0), 127 unless it stands
    for its ceiling (ReLU6's 6)."""
    s, z = float(t.quant.scale[0]), int(t.quant.zero_point[0])
    lo, hi = _ACT_BOUNDS.get(act, (None, None))
    codes = []
    if lo is None or (-128 - z) * s < lo - s / 2:
        codes.append(-128)
    if hi is None or (127 - z) * s < hi - s / 2:
        codes.append(127)
    return codes


def _channel_max(a: np.ndarray, axis: int) -> np.ndarray:
    """max over every axis but `axis` (the quantisation's channel axis)."""
    return np.max(np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1), axis=1)


# ---- the decision --------------------------------------------------------------------------------------------

def vanishing(tensors: dict[str, dict[str, Any]], threshold: float = LOST_THRESHOLD) -> list[str]:
    return sorted(n for n, t in tensors.items() if t["updates"] and t["lost_mass"] > threshold)


def decide(tensors: dict[str, dict[str, Any]], *, qas_enabled: bool, rounding: str, master_copy: bool,
           budget: int | None, peak: Callable[[str, bool], int | None]) -> dict[str, Any]:
    """The QAS setting to build with and why. `peak(rounding, master_copy)`: the plan's peak bytes with that
    setting (None: unknown). Returns {qas: {enabled, rounding, master_copy}, action, vanishing, cost_bytes,
    warning, reason}."""
    vanish = vanishing(tensors)
    keep = {"enabled": qas_enabled, "rounding": rounding, "master_copy": master_copy}
    doc: dict[str, Any] = {"qas": keep, "requested": dict(keep), "vanishing": vanish, "action": "none",
                           "cost_bytes": 0, "warning": None, "threshold": LOST_THRESHOLD}
    if not vanish:
        doc["reason"] = f"no trained tensor loses more than {LOST_THRESHOLD:.0%} of its movement to rounding"
        return doc
    worst = max(vanish, key=lambda n: tensors[n]["lost_mass"])
    lost = f"{tensors[worst]['lost_mass']:.0%} of the update of {worst}"
    if master_copy or rounding != "nearest":
        carried = "the fp32 master copy" if master_copy else "stochastic rounding"
        doc.update(action="kept", reason=f"{lost} is below half an int8 step; {carried} (as the spec asks) "
                                         f"carries them")
        return doc
    if not qas_enabled:
        doc.update(action="warn", warning=f"train.qas.enabled is false: {lost} is rounded away (the int8 update is "
                                          f"lr·g·s, s² times smaller than the fp32 step in int8 units), so the "
                                          f"model barely learns; set train.qas.enabled: true")
        doc["reason"] = "without QAS neither a master copy nor stochastic rounding restores the update's size"
        return doc
    options = (("nearest", True, "fp32 master copy"), ("stochastic", False, "stochastic rounding"))
    if hasattr(peak, "prefetch"):   # all three are reported: computed side by side where the caller can
        peak.prefetch([("nearest", False)] + [(r, m) for r, m, _ in options])
    base = peak("nearest", False)
    doc["peaks_bytes"] = {"nearest": base, **{("master_copy" if m else r): peak(r, m) for r, m, _ in options}}
    # A plan over the budget even without a remedy (a fixed scheme is reported, not refused) still gets stochastic
    # rounding: its few bytes of PRNG state do not decide whether the plan fits, the rest of the plan does.
    over = base is not None and budget is not None and base > budget
    for rnd, master, what in options:
        p = doc["peaks_bytes"]["master_copy" if master else rnd]
        if p is not None and (budget is None or p <= budget or (over and not master)):
            fits = (f" and fits the budget ({p} of {budget} bytes)" if budget is not None and p <= budget else
                    f" (the plan is over the budget without it too: {base} of {budget} bytes)" if over else
                    " (no memory limit)")
            doc.update(qas={"enabled": True, "rounding": rnd, "master_copy": master},
                       action="master_copy" if master else "stochastic",
                       cost_bytes=(p - base) if base is not None else None, peak_bytes=p,
                       reason=f"{lost} is below half an int8 step and nearest rounding erases it; the {what} "
                              f"carries it" + fits)
            return doc
    doc.update(action="warn",
               warning=f"{lost} is below half an int8 step and nearest rounding erases it; neither an fp32 "
                       f"master copy nor stochastic rounding fits the budget ({budget} bytes)",
               reason="no remedy fits the budget")
    return doc


# ---- the stage's use ------------------------------------------------------------------------------------------

class _Peaks:
    """peak(rounding, master_copy): see `peaks`. `prefetch(settings)` hands them to `exact_peak.many` when the
    caller's exact_peak can compute several side by side (sparse_plan's does, on every core)."""

    def __init__(self, graph: Graph, plan: TrainPlan, settings, qas_enabled: bool, exact_peak: Callable):
        self.graph, self.plan, self.settings, self.qas, self.exact_peak = graph, plan, settings, qas_enabled, exact_peak

    def _settings(self, rounding: str, master_copy: bool):
        return dataclasses.replace(self.settings, rounding=rounding, master_copy=master_copy)

    def prefetch(self, keys: list[tuple[str, bool]]) -> None:
        many = getattr(self.exact_peak, "many", None)
        if many is not None:
            many(self.graph, self.plan, [self._settings(*k) for k in keys], self.qas)

    def __call__(self, rounding: str, master_copy: bool) -> int | None:
        from tinytrain.pipeline.errors import UserError
        from tinytrain.stages.planning.memory_model import MemoryModel

        s = self._settings(rounding, master_copy)
        try:
            return int(self.exact_peak(self.graph, self.plan, s, self.qas)["peak_bytes"])
        except (UserError, NotImplementedError):
            return int(MemoryModel(self.graph, s).estimate(self.plan)["total"])


def peaks(graph: Graph, plan: TrainPlan, settings, qas_enabled: bool,
          exact_peak: Callable) -> Callable[[str, bool], int | None]:
    """peak(rounding, master_copy): the plan's exact peak (sparse_plan.exact_peak: autodiff's graph, reorder's
    planner) with that QAS setting, else plan_memory's estimate when autodiff cannot build the graph."""
    return _Peaks(graph, plan, settings, qas_enabled, exact_peak)


# The learning rate the planner probes at: the optimizer's usual one (issue 17). The build's own rate is a runtime
# value (changing it reruns only emulate-run, DESIGN §3), so the compiled choice cannot depend on it; emulate-run
# re-runs the probe at the run's rate with the compiled setting and warns in run.json (`recheck`).
USUAL_LEARNING_RATE = {"sgd": 0.01, "momentum": 0.01, "adam": 0.001, "rmsprop": 0.001}


def _qas_enabled(config: dict[str, Any]) -> bool:
    q = config.get("train.qas")
    return bool(q.get("enabled", True) if isinstance(q, dict) else getattr(q, "enabled", True))


def _int8(graph: Graph) -> bool:
    return any(t.dtype in ("int8", "int32") and t.quant is not None and t.data is not None
               for t in graph.tensors.values())


def _probe_data(graph: Graph, data: Any, analysis: Any, loss: Any) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Held-out train samples to probe with (the analysis' task: `loss` a loss name, or the heads of train.outputs,
    whose targets are the heads' rows back to back) and the train split's size (the probe's horizon), or None when
    the data cannot train this model with this loss (a stage downstream refuses the mix with its own message; the
    probe has nothing to say then)."""
    from tinytrain.pipeline.errors import UserError
    from tinytrain.stages.planning import contribution_measure as cm
    from tinytrain.stages.train.data import load_dataset

    ds = load_dataset(data)
    try:
        task = cm.task_of(graph, ds, loss)
        cm.check_model(graph, task)
    except UserError:
        return None
    x, y, _, _ = cm.holdout_split(task.data or ds, cm.AnalysisSettings.from_spec(analysis), task.y)
    return x, y, len(ds.x_train)


def check(graph: Graph, plan: TrainPlan, config: dict[str, Any], settings, analysis: Any, budget: int | None,
          exact_peak: Callable) -> dict[str, Any] | None:
    """sparse-plan's call: probe the plan on held-out train samples at the optimizer's usual learning rate and
    decide. `settings`: the stage's MemorySettings (optimizer, batch size, loss, QAS rounding and master copy);
    `exact_peak`: sparse_plan's. None for a float graph or without data."""
    data = config.get("data")
    if data is None or not _int8(graph):
        return None
    qas_on = _qas_enabled(config)
    lr = USUAL_LEARNING_RATE[settings.optimizer]
    loss = list(settings.heads) if settings.heads else settings.loss
    xy = _probe_data(graph, data, analysis, loss)
    if xy is None:
        return None
    x, y, n_train = xy
    steps = max(PROBE_STEPS, min(n_train, REACH_STEPS_MAX))
    kw = dict(plan=plan, loss=loss, optimizer=settings.optimizer, qas_enabled=qas_on, learning_rate=lr, x=x, y=y,
              batch_size=settings.batch_size, steps=steps, prefix_cache=PrefixCache(x))
    first = probe(graph, **kw)
    if not first:
        return None
    # Head-room first (stages/quant/rescale.py): a channel the probe moved past ±127 gets a wider scale. Its
    # updates then shrink k-fold in int8 steps, so the rounding is judged on the rescaled graph, probed again; that
    # probe, whose weights are free to move, also measures how far the widened layers' outputs pass their range,
    # which chooses the outputs' head-room.
    widen = rescale.choose(graph, first)
    wide = rescale.apply(graph, widen)
    tensors = first
    if wide is not graph:   # the second probe, and the outputs' factors it measured
        tensors = probe(wide, **kw, output_reach=True)
        widen = rescale.choose(graph, first, tensors)
        wide = rescale.apply(graph, widen)
    doc = decide(tensors, qas_enabled=qas_on, rounding=settings.rounding, master_copy=settings.master_copy,
                 budget=budget, peak=peaks(wide, plan, settings, qas_on, exact_peak))
    # the loss the probe trained (a name, or the heads of train.outputs): emulate-run's recheck trains the same
    probe_loss = [[h.name, h.loss, h.weight] for h in loss] if isinstance(loss, list) else loss
    saturation = {n: {"elements": t["elements"], "before_rescale": first[n]["saturated"],
                      "after_rescale": t["saturated"]} for n, t in tensors.items() if t["dtype"] == "int8"}
    return {**doc, "learning_rate": lr, "learning_rate_source": f"the usual rate of {settings.optimizer}",
            "probe_steps": steps, "tensors": tensors, "loss": probe_loss, "rescale": widen,
            "saturation": saturation}


def recheck(graph: Graph, plan_doc: dict[str, Any], planned: dict[str, Any], *, optimizer: str, loss: Any,
            batch_size: int, learning_rate: float, data: Any) -> dict[str, Any] | None:
    """emulate-run's call (run.json `updates`): the probe at the run's learning rate, judged against the setting
    the plan compiled (`planned`: sparse-plan's update_check.json). None when the plan made no check."""
    if not planned or planned.get("applies") is False:
        return None
    plan = TrainPlan.from_json(plan_doc)
    q = planned["qas"]
    tensors = probe(graph, plan, loss=loss, optimizer=optimizer, qas_enabled=bool(q["enabled"]),
                    learning_rate=learning_rate, x=data[0], y=data[1], batch_size=batch_size)
    vanish = vanishing(tensors)
    carried = q["enabled"] and (q["master_copy"] or q["rounding"] != "nearest")
    warning = None
    if vanish and not carried:
        worst = max(vanish, key=lambda n: tensors[n]["lost_mass"])
        why = ("train.qas.enabled is false: the int8 update is lr·g·s, s² times smaller than the fp32 step"
               if not q["enabled"] else "nearest rounding erases updates below half an int8 step")
        warning = (f"{tensors[worst]['lost_mass']:.0%} of the update of {worst} is lost at learning rate "
                   f"{learning_rate:g} ({why})")
    return {"learning_rate": float(learning_rate), "qas": q, "vanishing": vanish, "warning": warning,
            "rescale": planned.get("rescale") or {"weights": {}, "outputs": {}},
            "lost_mass": {n: t["lost_mass"] for n, t in tensors.items()},
            "lost_fraction": {n: t["lost_fraction"] for n, t in tensors.items()},
            "probe_steps": PROBE_STEPS}


def for_run(inputs: dict[str, Any], graph: Graph, config: dict[str, Any], layout: dict[str, Any],
            learning_rate: float) -> dict[str, Any] | None:
    """run.json's `updates` (emulate-run): `recheck` from sparse-plan's update_check.json and train_plan.json
    (None when the build has no sparse-plan check, e.g. a float model)."""
    import json

    paths = [inputs.get(f"sparse-plan/{n}") for n in ("update_check.json", "train_plan.json")]
    if any(p is None for p in paths) or config.get("data") is None:
        return None
    planned, plan_doc = (json.loads(open(p).read()) for p in paths)
    if planned.get("applies") is False:
        return None
    opt = config.get("train.optimizer")
    kind = opt if isinstance(opt, str) else (opt.get("kind", "sgd") if isinstance(opt, dict)
                                             else getattr(opt, "kind", "sgd"))
    probed = planned.get("loss")     # what sparse-plan's probe trained: a loss name or [name, loss, weight] heads
    if isinstance(probed, list):
        loss: Any = [Head(str(n), str(k), float(w)) for n, k, w in probed]
    else:
        loss = "mse" if layout.get("loss") == "mse" else "cross_entropy"
    xy = _probe_data(graph, config["data"], None, loss)
    if xy is None:
        return None
    xy = xy[:2]
    # What the firmware was compiled with, from its own checkpoint layout (master copies and PRNG streams are
    # state it keeps), not from what the plan asked: the two agree only when autodiff applied the plan's choice.
    state = (layout.get("checkpoint") or {}).get("tensors") or []
    compiled = {"enabled": bool(planned["qas"]["enabled"]),
                "rounding": "stochastic" if any(t.get("role") == "prng" for t in state) else "nearest",
                "master_copy": any(str(t.get("name", "")).endswith("/master") for t in state)}
    if "checkpoint" in layout:
        planned = {**planned, "qas": compiled}
    return recheck(graph, plan_doc, planned, optimizer=str(kind or "sgd"), loss=loss,
                   batch_size=int(config.get("train.batch_size") or 1), learning_rate=float(learning_rate),
                   data=xy)


def train_plan_fields(doc: dict[str, Any] | None) -> dict[str, Any]:
    """What train_plan.json (autodiff's input) gains: the QAS setting, only when the check changed it, and the
    wider scales (stages/quant/rescale.py), only when there are any (an unchanged plan keeps its bytes, so autodiff
    and the stages after it stay cached)."""
    out: dict[str, Any] = {}
    if doc and doc["qas"] != doc["requested"]:
        out["qas"] = doc["qas"]
    widen = (doc or {}).get("rescale") or {}
    if widen.get("weights") or widen.get("outputs"):
        out["rescale"] = widen
    return out


def summary_suffix(doc: dict[str, Any] | None) -> str:
    if not doc:
        return ""
    head = rescale.summary_suffix(doc.get("rescale"))
    if doc["action"] in ("none", "kept"):
        return head
    if doc["action"] == "warn":
        return head + " — WARNING: " + doc["warning"]
    what = "fp32 master copy" if doc["qas"]["master_copy"] else "stochastic rounding"
    return head + f"; {what} (+{doc['cost_bytes']} B): updates below half an int8 step would vanish"


def text(doc: dict[str, Any] | None) -> str:
    """plan.txt's section."""
    if not doc:
        return ""
    lines = ["", f"int8 updates (probe: {doc['probe_steps']} golden-model steps at lr {doc['learning_rate']:g}, "
                 f"held-out train samples{', on the graph with its weights rescaled' if _widened(doc) else ''}; lost = "
                 f"|Δ| < 1/2 step, erased by nearest rounding; at ±127: weights saturated after the probe; output "
                 f"clamped: at the output's own scale, before any widening of it):"]
    width = max(len(n) for n in doc["tensors"])
    lines.append(f"  {'tensor':<{width}}  {'updates':>8} {'lost':>7} {'of mass':>8} {'median |Δ|':>11} "
                 f"{'at ±127':>8} {'output clamped':>15}")
    for n, t in doc["tensors"].items():
        lines.append(f"  {n:<{width}}  {t['updates']:>8} {t['lost_fraction']:>7.1%} {t['lost_mass']:>8.1%} "
                     f"{t['median_abs_delta']:>11.3g} {t['saturated']:>8} {t['output_clamped']:>15.1%}")
    q = doc["qas"]
    lines.append(f"update rounding: {q['rounding']}{', fp32 master copy' if q['master_copy'] else ''}"
                 f"{'' if q['enabled'] else ', QAS off'} ({doc['action']}: {doc['reason']}"
                 + (f"; costs {doc['cost_bytes']} bytes" if doc["action"] in ("master_copy", "stochastic") else "")
                 + ")")
    if doc.get("warning"):
        lines.append("WARNING: " + doc["warning"])
    sat = doc.get("saturation") or {}
    if _widened(doc):
        lines.append("weights at ±127 after the probe, before → after the rescale: "
                     + ", ".join(f"{n} {v['before_rescale']} → {v['after_rescale']} of {v['elements']}"
                                 for n, v in sat.items()))
    return "\n".join(lines) + "\n" + rescale.text(doc.get("rescale"))


def _widened(doc: dict[str, Any]) -> bool:
    w = doc.get("rescale") or {}
    return bool(w.get("weights") or w.get("outputs"))
