"""Analytic memory model of sparse-update options, in bytes (DESIGN §3, §6).

The `auto` search prices thousands of candidate plans, so it cannot build a training graph and run the `reorder`
stage's exact planner (stages/planning/arena.py) on each; sparse-plan runs that planner once, on the plan it chose
(sparse_plan.exact_peak), and decides `fits` on it. This module is the fast predictor in between. It mirrors what
the exact planner measures, without building graphs:

Simulated peak of a plan (`simulate`, `estimate`)
  An abstract program of the training step, with only the tensors the planner puts in SRAM. Its backward is the
  op modules' own emission (OpDef.backward, stages/ops/backward.py), the one autodiff runs, through a builder that
  records steps and sizes instead of ops (`StepBuilder`); this module adds the exact planner's view of it:
    forward              the inference ops (the final softmax / float-I/O dequantize that training drops are left
                         out); activations at their own itemsize (int8: 1 byte), graph input included.
    loss                 int8 head dequantized to fp32 (`deq/<head>`), labels (int32[1]) or an fp32 MSE target,
                         the fp32 loss, the fp32 head gradient.
    backward             in reverse op order, only ops a trained parameter reaches: fan-out shares summed by
                         grad_accumulate; int8 clamp gradients (straight-through estimator, reads the int8 output,
                         which is therefore kept from forward to backward) or float act_grad — or, where that is
                         all that reads the output after the forward, autodiff's 1-bit mask instead (`clamp_mask`
                         right after the producer, ceil(n/8) bytes; `mask_grad` in place); weight gradients of
                         the trained slice in fp32 from the fp32 dequantized input slice (`dequantize_slice`,
                         int8; float graphs read x itself); bias gradients; input gradients (the int8 weight is
                         dequantized inside the kernel: memplan.fused_dequantize, no fp32 copy); pools, mean,
                         reshape, pad, concat, add, softmax and element-wise ops as autodiff emits them.
    updates              with `reorder` (the default, as the reorder stage): each update right after its gradient
                         is complete (TTE's in-place update: the weight's after its input gradient, which still
                         reads the old weight; the bias's after its gradient), so its gradient dies there; without:
                         all updates at the end (every parameter gradient lives until then).
  Lifetimes are the planner's: from the writing op (graph inputs: step 0) to the last reader (the loss: to the end),
  with its in-place sharing (memplan.IN_PLACE_OPS: an output takes over an input that dies at that op; depthwise
  adds one output channel of scratch). The peak is the largest sum of live transient buffers (each rounded up to
  the arena alignment, as the arena places them) plus the resident parameters.
  Resident (the whole step, SRAM): the trained weight slice (ceil(r·C_in) input channels, weight itemsize), trained
  biases (int32 4 B), and per trained tensor (on the gradient's shape, fp32): optimizer state (0 sgd, 1 momentum,
  2 adam, 1 rmsprop), the batch accumulator when batch_size > 1, the QAS master copy (int8 weights, master_copy),
  a 4-byte PRNG state per QAS tensor with stochastic rounding, Adam's step counter.
  What this does not do is the arena's placement, nor the planner's other schedules: the exact planner also tries
  the memory-greedy order (sometimes up to ~15 % less) and its best-fit placement may add fragmentation (up to
  ~10 % on the fixtures, usually < 1 %). Measured against the exact planner (tests/test_sparse_plan.py,
  test_simulated_peak_tracks_the_exact_planner: every int8 fixture model, the digits CNN, float fixtures,
  MobileNetV2-w0.35; full / last_k / bias_only / manual / the TTE scheme; sgd, adam with batch 4 and master copy,
  momentum with stochastic rounding and no reordering, MSE): with 1-bit masks, the reorder stage's row streams
  (frozen conv chains row by row, where that lowers the forward's peak), channel streams (a conv / FC weight
  gradient computed right before its update, one output channel at a time) and hidden-channel streams (a backward
  between two 1x1 convs one hidden channel at a time, channel_stream.merge_steps; the search's region terms leave
  them out: an upper bound) mirrored, estimate / exact peak is in
  [0.98, 1.04], median 1.000 over the 160 cases. The position stream of a pooled head's gradient is mirrored as
  one step holding its tensors whole-group (merge_positions: with the model input fed row by row the MobileNetV2
  TTE plan's peak is there); the exact planner's other orders are not.

Per-option costs for the search (`bias_option`, `weight_cost`; an additive model, so that a knapsack applies)
  region term of k  the simulated peak of "biases of the last k layers" (gradients flow down to the k-th last
                    layer e): forward, saved activations, gradient buffers, bias parameters — everything but
                    weights.
  weight term of l at ratio r
                    the resident part (slice copy, state, accumulator, master copy) plus the most l's transients
                    can raise the peak of any region holding it (`_excess`, read off each region's live profile,
                    no extra simulation): with region peak P and at most A bytes live during l's backward steps,
                    the fp32 weight gradient and dequantized input slice T lift those steps to A + T, so the peak
                    rises by at most max(0, A + T - P); plus l's input activation buffer when nothing else keeps it
                    until then. Without reordering every gradient lives until the end: the whole T.
  A plan costs region(k) + the sum of its weight terms. Why an upper bound of the estimate: with in-place updates
  each weight's transients exist only around its own backward steps, so several weights raise the peak by at
  most the largest of their excesses, and the sum bounds that; the excess is the largest over the regions the
  layer can sit in (the live set at a layer's steps grows with the region's depth faster than the region's peak
  when that peak is in the forward, so a single reference region would under-price it). Measured (same tests):
  the additive price is never below the estimate; over random plans it is median 1.02x, p90 1.27x the exact
  peak, up to ~2x for full updates (many weight layers, one peak). sparse-plan verifies the chosen plan with the
  exact planner and re-searches under a corrected capacity (sparse_plan.verified_auto).
What neither counts: code, stack and the runtime's own buffers (the board's `runtime_reserve_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from tinytrain.stages import autodiff
from tinytrain.stages.model.ir import Graph, numel
from tinytrain.stages.planning.arena import CHANNEL_SCRATCH_OPS, depth_multiplier
from tinytrain.stages.ops import CONVERSION_OPS, LOSS_DROPS, REGISTRY, TRAINABLE_OPS
from tinytrain.stages.ops.backward import gather, output_mask, slice_shape
from tinytrain.stages.ops import CONV2D
from tinytrain.stages.quant.qas import STATE_COUNT
from tinytrain.stages.planning import channel_stream
from tinytrain.stages.planning.abstract_program import (FP32, StepBuilder, aligned, fused_read, live_profile,
                                                       mask_steps, merge_positions)
from tinytrain.stages.planning.fp16_memory import RESIDENT_SCALARS, fp16_steps
from tinytrain.stages.planning.streams import (MAX_ROW_OPS, fed_inputs, row_geometry, row_op_ok, sink_over_inputs,
                                              window_rows)
from tinytrain.stages.planning.train_plan import RATIOS, TrainPlan, _has_bias, _in_channels

OPTIMIZER_STATE = STATE_COUNT
WEIGHT_RATIOS = tuple(r for r in RATIOS if r > 0)
LOSSES = autodiff.LOSSES
_LAYER_OPS = TRAINABLE_OPS


@dataclass(frozen=True)
class MemorySettings:
    """What besides the plan changes training memory (autodiff's, the optimizer's and reorder's choices)."""

    optimizer: str = "sgd"
    batch_size: int = 1
    master_copy: bool = False
    loss: str = "cross_entropy"
    rounding: str = "nearest"          # QAS rounding: stochastic keeps a PRNG state per trained int8 tensor
    reorder: bool = True               # train.reorder.enabled: in-place updates, or every gradient until the end
    masks: bool | None = None          # autodiff's 1-bit activation masks (None: autodiff.MASKS, its default)
    # train.outputs (stages/losses.Head, several outputs): the exact peak builds them all; the estimate here models
    # the first output with `loss` (its first head's loss)
    heads: tuple = ()
    # train.precision fp16-mixed (stages/train/fp16_mixed.py): saved activations at 2 bytes, the overflow check
    # (planning/fp16_memory.py models its forms)
    fp16_mixed: bool = False

    def __post_init__(self):
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"unknown optimizer {self.optimizer!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}")

    def to_json(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "batch_size": int(self.batch_size), "master_copy": bool(self.master_copy),
                "loss": self.loss, "rounding": self.rounding, "reorder": bool(self.reorder),
                **({"heads": [[h.name, h.loss, h.weight] for h in self.heads]} if self.heads else {}),
                **({"precision": "fp16-mixed"} if self.fp16_mixed else {})}


@dataclass(frozen=True)
class Layer:
    """A trainable layer of the graph."""

    op_index: int
    type: str
    weight: str
    bias: str | None
    c_in: int
    c_out: int
    name: str          # short, readable: the weight tensor's name up to the first ';'

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op_index, "type": self.type, "name": self.name, "weight": self.weight,
                "bias": self.bias, "c_in": self.c_in, "c_out": self.c_out}


def channels(c_in: int, ratio: float) -> int:
    """Input channels trained at `ratio` (the rule of train_plan.resolve)."""
    return int(math.ceil(ratio * c_in - 1e-9))


def short_name(name: str) -> str:
    return name.split(";")[0]


class MemoryModel:
    """Memory of every option of one graph under one MemorySettings."""

    def __init__(self, graph: Graph, settings: MemorySettings = MemorySettings()):
        self.g = graph
        self.s = settings
        self.layers = [self._layer(i) for i in TrainPlan.trainable_ops(graph)]
        self.by_op = {lay.op_index: lay for lay in self.layers}
        self._fwd, self._head = self._training_forward()
        self.forward_peak = self._forward_peak()
        self._region_cache: dict[tuple[int, bool], dict[str, Any]] = {}
        self._weight_cache: dict[tuple[int, int], dict[str, int]] = {}

    def _layer(self, i: int) -> Layer:
        op = self.g.ops[i]
        w = self.g.tensors[op.inputs[1]]
        y = self.g.tensors[op.outputs[0]]
        return Layer(i, op.type, w.name, op.inputs[2] if _has_bias(self.g, i) else None, _in_channels(self.g, i),
                     int(y.shape[-1]), short_name(w.name))

    # ---- resident parameters ---------------------------------------------------------------------------------
    def _is_qas(self, name: str) -> bool:
        t = self.g.tensors[name]
        return t.dtype in ("int8", "int32") and t.quant is not None

    def _param_cost(self, name: str, copy_elems: int, grad_elems: int, is_weight: bool) -> dict[str, int]:
        """Resident bytes of one trained tensor, by component (each its own arena buffer, hence aligned)."""
        t = self.g.tensors[name]
        qas = self._is_qas(name)
        st = OPTIMIZER_STATE[self.s.optimizer]
        master = self.s.master_copy and qas and is_weight and t.dtype == "int8"
        # autodiff: a master copy forces nearest rounding; otherwise QAS tensors keep a PRNG state when stochastic.
        prng = qas and not master and self.s.rounding == "stochastic"
        return {"copy": aligned(copy_elems * int(np.dtype(t.dtype).itemsize)),
                "optimizer_state": st * aligned(grad_elems * FP32) + (aligned(4) if prng else 0),
                "accumulator": aligned(grad_elems * FP32) if self.s.batch_size > 1 else 0,
                "master_copy": aligned(grad_elems * FP32) if master else 0}

    def _weight_elems(self, op_index: int, n: int) -> tuple[int, int]:
        """(elements of the resident slice, elements of its gradient) for n trained input channels. The resident
        slice is counted as memplan.counted_bytes does (n on the weight's last axis); a depthwise gradient has
        n·multiplier there."""
        lay = self.by_op[op_index]
        w = self.g.tensors[lay.weight]
        per = numel(w.shape) // int(w.shape[-1])
        return per * n, numel(REGISTRY[lay.type].backward.grad_shape(self.g, self.g.ops[op_index], n))

    def bias_param_cost(self, op_index: int) -> dict[str, int]:
        lay = self.by_op[op_index]
        if lay.bias is None:
            return {"params": 0, "total": 0}
        n = numel(self.g.tensors[lay.bias].shape)
        parts = self._param_cost(lay.bias, n, n, is_weight=False)
        out = {"params": n, "bias_copy": parts.pop("copy"), **parts}
        out["total"] = sum(v for k, v in out.items() if k != "params")
        return out

    def _resident(self, biases: Iterable[int], weights: dict[int, int]) -> tuple[int, int]:
        """(bias bytes, weight bytes) resident for the whole step, Adam's step counter with the biases. A tensor
        that several layers share (the converter dedupes identical constants) is one tensor in SRAM."""
        b_ops = {self.by_op[i].bias: i for i in sorted(biases) if self.by_op[i].bias is not None}
        b = sum(self.bias_param_cost(i)["total"] for i in b_ops.values())
        wk: dict[str, tuple[int, int]] = {}
        for i, n in sorted(weights.items()):
            name = self.by_op[i].weight
            if name not in wk or n > wk[name][1]:
                wk[name] = (i, n)
        w = 0
        for name, (i, n) in wk.items():
            ce, ge = self._weight_elems(i, n)
            w += sum(self._param_cost(name, ce, ge, is_weight=True).values())
        if self.s.optimizer == "adam" and (b or w):
            b += aligned(4)
        return b, w

    # ---- the simulated training step ------------------------------------------------------------------------
    def _act(self, name: str | None) -> bool:
        return name is not None and self.g.tensors[name].data is None

    def _bytes(self, name: str, fp32: bool = False) -> int:
        t = self.g.tensors[name]
        n = numel(t.shape)   # 1 for a scalar
        return n * (FP32 if fp32 else int(np.dtype(t.dtype).itemsize))

    def _training_forward(self) -> tuple[list[int], str]:
        """Forward ops of the training step and the loss's head tensor: a float-I/O conversion of an int8 head and
        the inference-only activation a loss on logits drops (cross-entropy: a final softmax; ops.LOSS_DROPS) are
        dropped, as stages/losses.prepare_heads does."""
        g = self.g
        fwd = list(range(len(g.ops)))
        head = g.outputs[0] if g.outputs else None
        prod = {t: i for i in fwd for t in g.ops[i].outputs}
        if head in prod and g.ops[prod[head]].type in CONVERSION_OPS \
                and g.tensors[g.ops[prod[head]].inputs[0]].dtype == "int8":
            i = prod.pop(head)
            fwd.remove(i)
            head = g.ops[i].inputs[0]
        drops = LOSS_DROPS.get(self.s.loss)
        if drops and head in prod and g.ops[prod[head]].type == drops:
            i = prod[head]
            fwd.remove(i)
            head = g.ops[i].inputs[0]
        return fwd, head

    def _forward_steps(self, sizes: dict[str, int]) -> list[tuple[str, list[str], list[str]]]:
        steps = []
        for i in self._fwd:
            op = self.g.ops[i]
            typ = op.type
            if typ in CHANNEL_SCRATCH_OPS and depth_multiplier(self.g, op) != 1:
                typ += "/m"           # the planner computes it in place only for multiplier 1
            for t in op.outputs:
                sizes[t] = self._bytes(t)
            steps.append((typ, [t for t in op.inputs if self._act(t)], list(op.outputs)))
        return steps

    def _forward_peak(self) -> int:
        """The training forward alone (an inference step), with the planner's in-place sharing and row streams."""
        sizes = {t: self._bytes(t) for t in self.g.inputs if self._act(t)}
        steps = self._forward_steps(sizes)
        self._stream_rows(steps, sizes, set(), set())
        outs = [self._head] if self._head in sizes else []
        return max(live_profile(sizes, steps, [t for t in self.g.inputs if t in sizes], outs, self.g)[0],
                   default=0)

    def _stream_rows(self, steps: list[tuple[str, list[str], list[str]]], sizes: dict[str, int],
                     params: set[str], backward_read: set[int]) -> int:
        """The reorder stage's row streams (stages/planning/streams.py `rows`) on the forward steps (one per op of
        self._fwd, at the start of `steps`): a chain of frozen conv / depthwise ops whose intermediate outputs
        only the next op reads (not a trained layer, not an op whose output the backward reads: `backward_read`)
        becomes one step that reads and writes all of them, the intermediates at their window's bytes, when that
        lowers the forward's live peak (the stage keeps a stream only when it lowers the arena). Returns how many
        forward steps remain."""
        g = self.g
        n = len(self._fwd)
        readers: dict[str, list[int]] = {}
        for i in self._fwd:
            for t in g.ops[i].inputs:
                if t is not None:
                    readers.setdefault(t, []).append(i)
        trained = dict.fromkeys(params)
        ok = [row_op_ok(g, g.ops[i], trained) for i in self._fwd]
        inputs = [t for t in g.inputs if t in sizes]
        outs = [self._head] if self._head in sizes else []
        k = n - 1
        while k > 0:                     # from the end, so the indices of the chains still to merge hold
            j = k
            while j > 0 and ok[j] and ok[j - 1] and k - j + 1 < MAX_ROW_OPS:
                a, b = g.ops[self._fwd[j - 1]], g.ops[self._fwd[j]]
                t = a.outputs[0]
                if b.inputs[0] != t or readers.get(t) != [self._fwd[j]] or self._fwd[j - 1] in backward_read:
                    break
                j -= 1
            if j < k:
                chain = [self._fwd[i] for i in range(j, k + 1)]
                window = {g.ops[c].outputs[0]: window_rows(row_geometry(g, g.ops[d])) *
                          row_geometry(g, g.ops[c])["out_row"] for c, d in zip(chain, chain[1:])}
                sink = g.ops[chain[-1]].outputs[0]
                merged = ("stream_rows", [x for x in steps[j][1]] + list(window), list(window) + [sink])
                # the sink written over the chain's input rows it has read (streams.sink_over_inputs, when that
                # input dies there): its own buffer starts after the stream, as the planner places it
                x = g.ops[chain[0]].inputs[0]
                geo0 = row_geometry(g, g.ops[chain[0]])
                if x in g.inputs and x in sizes and fed_inputs(g, chain, [x], readers):
                    # the model input fed row by row (streams.fed_inputs): its window only, nothing written over it
                    window[x] = window_rows(geo0) * geo0["in_row"]
                    over = [merged]
                elif x in sizes and readers.get(x) == [chain[0]] and x not in outs and sizes[x] >= sizes[sink] \
                        and sink_over_inputs([row_geometry(g, g.ops[c]) for c in chain],
                                             [[-1]] + [[m] for m in range(len(chain) - 1)], 1) == [0]:
                    over = [merged[:2] + (list(window),), ("stream_rows_sink", [], [sink])]
                else:
                    over = [merged]
                trial = steps[:j] + over + steps[k + 1:n]
                trial_sizes = {**sizes, **window}
                live0 = live_profile(sizes, steps[:n], inputs, outs, g)[0]
                live1 = live_profile(trial_sizes, trial, inputs, outs, g)[0]
                before, after = max(live0, default=0), max(live1, default=0)
                # kept when it lowers the peak, or its own steps without raising the peak (the stage's prune keeps a
                # stream whose removal raises the arena: a chain below the forward's peak now may hold the peak once
                # an earlier chain is streamed, e.g. block 2 after the stem's image is fed row by row)
                if after < before or (after == before and max(live1[j:j + len(over)], default=0)
                                      < max(live0[j:k + 1], default=0)):
                    steps[j:k + 1] = over
                    sizes.update(window)
                    n -= k - j + 1 - len(over)
            k = j - 1
        return n

    def simulate(self, biases: Iterable[int], weights: dict[int, int], reach: int | None = None) -> dict[str, int]:
        """Simulated peak of training the biases of ops `biases` and the first n input channels of the weights
        of ops `weights` ({op: n}); `reach` is an op the gradient must reach even if it trains nothing there (a
        bias region whose earliest layer has no bias). See the module docstring."""
        return {k: v for k, v in self._simulate(biases, weights, reach).items() if not k.startswith("_")}

    def _simulate(self, biases: Iterable[int], weights: dict[int, int], reach: int | None = None,
                  hidden: bool = True) -> dict[str, Any]:
        """simulate(), plus the live bytes per step (`_live`), each transient's last step (`_end`) and buffer
        bytes (`_held`), and each layer's backward steps (`_windows`: op -> (first, last); the step before when
        it has none)."""
        g, s = self.g, self.s
        windows: dict[int, tuple[int, int]] = {}
        biases = {i for i in biases if self.by_op[i].bias is not None}
        weights = {i: int(n) for i, n in weights.items() if n > 0}
        sizes: dict[str, int] = {t: self._bytes(t) for t in g.inputs if self._act(t)}
        inputs = list(sizes)
        steps = self._forward_steps(sizes)
        head = self._head
        # ---- which ops the gradient reaches. Trained parameters are tensors: the converter shares identical
        # constants (e.g. two zero biases), and every layer reading a trained tensor gets a share of its gradient.
        wk: dict[str, int] = {}
        for i, n in weights.items():
            wk[self.by_op[i].weight] = max(wk.get(self.by_op[i].weight, 0), n)
        bias_on = {self.by_op[i].bias for i in biases}
        params = set(wk) | bias_on
        needs: set[str] = set()
        op_needs: dict[int, bool] = {}
        readers: dict[str, int] = {}
        for i in self._fwd:
            op = g.ops[i]
            n = i == reach or any(t is not None and (t in needs or t in params) for t in op.inputs)
            op_needs[i] = n
            if n:
                needs.update(op.outputs)
            for t in op.inputs[1:3] if op.type in _LAYER_OPS else ():
                if t in params:
                    readers[t] = readers.get(t, 0) + 1
        pgrads: dict[str, list[str]] = {}
        contrib: dict[str, list[str]] = {}
        pending: list[str] = []

        def share(t: str | None, i: int) -> str | None:
            if t is None or t not in needs:
                return None
            name, k = f"grad/{t}#{i}", 1
            while name in sizes:
                name, k = f"grad/{t}#{i}.{k}", k + 1
            sizes[name] = self._bytes(t, fp32=True)
            contrib.setdefault(t, []).append(name)
            return name

        def update(grad: str) -> None:
            if s.reorder:
                steps.append(("update", [grad], []))
            else:
                pending.append(grad)

        sb = StepBuilder(self, steps, sizes, share, update, wk, bias_on, pgrads,
                          whole=lambda p: readers.get(p, 1) == 1)
        # ---- loss
        head_in = sb.deq.real_now(head)
        lab = "train/labels" if s.loss == "cross_entropy" else "train/target"
        sizes[lab] = 4 if s.loss == "cross_entropy" else self._bytes(head, fp32=True)
        inputs.append(lab)
        sizes["train/loss"] = 4
        gh = f"grad/{head}"
        sizes[gh] = self._bytes(head, fp32=True)
        steps.append(("loss", [head_in, lab], ["train/loss", gh]))
        contrib[head] = [gh]

        # Frozen forward chains run row by row (reorder's row streams) where that lowers the forward's peak; the
        # backward reads the outputs of the ops the gradient passes through.
        n_fwd = self._stream_rows(steps, sizes, params, {i for i in self._fwd if op_needs[i]}) if s.reorder \
            else len(self._fwd)
        positions: list[tuple[str, str]] = []
        for i in reversed(self._fwd):
            op = g.ops[i]
            if not op_needs[i]:
                continue
            if len(op.outputs) > 1:   # a multi-output op (split), as autodiff emits it
                start = len(steps)
                dys = [gather(sb, contrib, y) for y in op.outputs]
                if any(dys):
                    REGISTRY[op.type].backward(sb, op, i, dys)
                    sb.finish(start)
                continue
            y = op.outputs[0]
            if not contrib.get(y):
                continue
            start = len(steps)
            dy = gather(sb, contrib, y)
            d = REGISTRY[op.type]
            dz = output_mask(sb, d, op, dy)
            if dz != dy and dy in sb.bcast and self._position_streamed(op, wk, s.reorder):
                # reorder's position stream: mean_grad -> mask -> bias / 1x1 input gradient, one position at a time
                sizes[dy] = sizes[dz] = int(g.tensors[y].shape[-1]) * FP32
                positions.append((dy, dz))
            d.backward(sb, op, i, dz)   # the op module's emission, as autodiff runs it
            sb.finish(start)
            if d.trainable:
                windows[i] = (start, len(steps) - 1) if len(steps) > start else (start - 1, start - 1)
        # A parameter shared by several layers: its shares are summed after the backward, then it updates.
        for p, parts in pgrads.items():
            if len(parts) > 1:
                update(gather(sb, pgrads, p, like=parts[0]))
        if pending:
            steps.append(("update", pending, []))
        if (autodiff.MASKS if s.masks is None else s.masks):
            k = mask_steps(steps, n_fwd, sb.maskable, sizes, g)
            windows = {i: (a + k, b + k) for i, (a, b) in windows.items()}   # the masks went into the forward
            n_fwd += k
        for dy, dz in positions:   # after the masks, which rewrite the steps that read activations
            remap = merge_positions(steps, dy, dz)
            windows = {i: (remap.get(a, a), remap.get(b, b)) for i, (a, b) in windows.items()}
        if hidden and s.reorder and s.batch_size == 1 and not s.fp16_mixed:
            # reorder's hidden-channel streams (an inverted-residual backward one hidden channel at a time); in the
            # search's region terms too: a weight that would break a chain (a depthwise's) pays the difference in
            # its own term (weight_cost, _breaks_chains)
            remap = channel_stream.merge_steps(steps, sizes, g)
            windows = {i: (remap.get(a, a), remap.get(b, b)) for i, (a, b) in windows.items()}
        live, end, held = live_profile(sizes, steps, inputs, ["train/loss"], g)
        if s.fp16_mixed:   # the fp16-mixed forms of the program (planning/fp16_memory.py): the smallest one
            forms = fp16_steps(steps, n_fwd, sizes, g, s.batch_size == 1, inputs, sb.streamed)
            profiles = [(live_profile(sizes, st, inputs, ["train/loss"], g), len(st) - len(steps),
                         getattr(st, "position", None)) for _, st in forms]
            (live, end, held), shift, moved = min(profiles, key=lambda pr: max(pr[0][0], default=0))
            # a layer's backward steps: the last pass's, after whatever was inserted before them
            windows = {i: (a + shift, b + shift) for i, (a, b) in windows.items()}
            if moved is not None:   # a form in the memory-greedy order: the span of the window's steps' new places
                windows = {i: (min(moved[a:b + 1]), max(moved[a:b + 1])) if moved[a:b + 1] else (a, b)
                           for i, (a, b) in windows.items()}
        transient = max(live, default=0)
        b, w = self._resident(biases, weights)
        if s.fp16_mixed:
            b += RESIDENT_SCALARS * aligned(4)
        return {"total": int(transient + b + w), "transient": int(transient), "bias_params": int(b),
                "weights": int(w), "_live": live, "_end": end, "_held": held, "_windows": windows}

    # ---- per-option costs (the search's additive model) ------------------------------------------------------
    def region_cost(self, earliest: int) -> dict[str, Any]:
        """Simulated peak of the biases of every layer at or after op `earliest`, the gradient flowing down to
        it (the search's region term)."""
        return {k: v for k, v in self._region(earliest).items() if not k.startswith("_")}

    def _region(self, earliest: int, hidden: bool = True) -> dict[str, Any]:
        """The region's simulation with the hidden-channel streams the stage would run for its biases (hidden), or
        without them (what a plan training a weight that breaks a chain gets, _breaks_chains)."""
        if (earliest, hidden) not in self._region_cache:
            chosen = [lay.op_index for lay in self.layers if lay.op_index >= earliest]
            self._region_cache[(earliest, hidden)] = self._simulate(chosen, {}, reach=earliest, hidden=hidden)
        return self._region_cache[(earliest, hidden)]

    def _breaks_chains(self, op_index: int) -> bool:
        """Training this layer's weights may break a hidden-channel chain: its weight gradient is not a 1x1 conv's
        (hidden_role "weight"), the only weight gradient a chain runs row by row (channel_stream.py): a depthwise's
        reads a chain's gradient plane whole."""
        lay = self.by_op[op_index]
        gw = REGISTRY.get(f"{lay.type}_grad_weight")
        w = self.g.tensors[lay.weight].shape
        return gw is None or gw.hidden_role != "weight" or len(w) != 4 or int(w[1]) != 1 or int(w[2]) != 1

    def _chain_break_cost(self, op_index: int) -> int:
        """The most the hidden streams lower the peak of any region holding layer op_index (0 where its weights
        keep every chain): what a plan pays when training them makes the stage run those regions unstreamed."""
        if not self._breaks_chains(op_index):
            return 0
        return max((self._region(e, False)["transient"] - self._region(e)["transient"]
                    for e in (other.op_index for other in self.layers if other.op_index <= op_index)
                    if op_index in self._region(e)["_windows"]), default=0)

    def bias_option(self, k: int) -> dict[str, Any]:
        """The `auto` search's bias option: biases of the last k trainable layers (their gradients flow down to
        the k-th last layer)."""
        chosen = self.layers[len(self.layers) - k:]
        region = self.region_cost(chosen[0].op_index)
        return {"k": k, "earliest_op": chosen[0].op_index, "earliest": chosen[0].name,
                "biases": sum(lay.bias is not None for lay in chosen), "transient": region["transient"],
                "bias_params": region["bias_params"], "total": region["total"]}

    def _position_streamed(self, op, wk: dict[str, int], reorder: bool) -> bool:
        """stages/planning/streams.py's position stream applies to the gradient of this op's (masked) output: a 1x1
        stride-1 conv2d with N = 1 whose weights are not trained (a weight gradient would read every position)."""
        if not reorder or op.type != CONV2D.name or op.inputs[1] in wk:
            return False
        w, y = self.g.tensors[op.inputs[1]].shape, self.g.tensors[op.outputs[0]].shape
        return (int(w[1]) == 1 and int(w[2]) == 1 and int(op.attrs.get("stride_h", 1)) == 1
                and int(op.attrs.get("stride_w", 1)) == 1 and len(y) == 4 and int(y[0]) == 1)

    def weight_cost(self, op_index: int, ratio: float) -> dict[str, int]:
        """Bytes of training layer `op_index`'s weights at `ratio`: resident parts, and the most its transients can
        raise the peak of a region holding it (`_excess`; see the module docstring)."""
        lay = self.by_op[op_index]
        n = channels(lay.c_in, ratio)
        ce, ge = self._weight_elems(op_index, n)
        parts = self._param_cost(lay.weight, ce, ge, is_weight=True) if n else dict.fromkeys(
            ("copy", "optimizer_state", "accumulator", "master_copy"), 0)
        resident = sum(parts.values())
        key = (op_index, n)
        if key not in self._weight_cache:
            self._weight_cache[key] = {"transient": self._excess(op_index, n) + self._chain_break_cost(op_index)
                                       if n else 0}
        out = {"channels": n, "params": ce, "weight_copy": parts["copy"], "optimizer_state": parts["optimizer_state"],
               "accumulator": parts["accumulator"], "master_copy": parts["master_copy"],
               "transient": self._weight_cache[key]["transient"]}
        out["total"] = resident + out["transient"]
        return out

    def _excess(self, op_index: int, n: int) -> int:
        """How much training layer op_index's weights (n input channels) can raise the simulated peak of any
        region that contains it (the largest over regions e <= op_index, read off each region's live profile):
        in region e with peak P, layer l's backward steps reach at most A bytes; the weights add their fp32
        gradient (alive from the weight-gradient op to the update after the input gradient) and, for int8, the
        fp32 dequantized input slice (alive at the weight-gradient op), so those steps reach at most A + T, and
        the peak rises by at most max(0, A + T - P); plus the layer's input activation if nothing else keeps it
        until then (it is kept from the forward on). Without reordering every gradient lives until the updates
        at the end, so the whole T counts."""
        lay = self.by_op[op_index]
        g = self.g
        x = g.ops[op_index].inputs[0]
        w = g.tensors[lay.weight]
        t = aligned(self._weight_elems(op_index, n)[1] * FP32)
        depth = REGISTRY[lay.type].backward.slice_depth(g, g.ops[op_index])
        if w.dtype == "int8" and not fused_read(g, REGISTRY[f"{lay.type}_grad_weight"], 1, x, True, depth):
            t += aligned(numel(slice_shape(g, x, n, depth)) * FP32)
        best = 0
        for e in (other.op_index for other in self.layers if other.op_index <= op_index):
            r = self._region(e, not self._breaks_chains(op_index))
            win = r["_windows"].get(op_index)
            if win is None:
                continue          # the gradient of region e does not reach this layer (another branch)
            # Kept alive longer, x keeps its whole buffer: an in-place output (a forward depthwise) shares its
            # input's, which may be larger.
            ext = r["_held"].get(x, 0) if self._act(x) and r["_end"].get(x, -1) < win[0] else 0
            if self.s.reorder:
                a = max(r["_live"][win[0]:win[1] + 1])
                best = max(best, ext + max(0, a + t - r["transient"]))
            else:
                best = max(best, ext + t)
        return int(best)

    # ---- a whole plan ---------------------------------------------------------------------------------------
    def estimate(self, plan: TrainPlan) -> dict[str, Any]:
        """Simulated peak of an arbitrary plan, with a per-layer breakdown (the options' costs)."""
        layers = plan.resolve(self.g)
        if not any(r.train_bias or r.in_channels > 0 for r in layers):
            return {"total": 0, "transient": 0, "bias_params": 0, "weights": 0, "per_layer": []}
        sim = self.simulate([r.op_index for r in layers if r.train_bias],
                            {r.op_index: r.in_channels for r in layers if r.in_channels > 0})
        rows = []
        for r in layers:
            b = self.bias_param_cost(r.op_index)["total"] if r.train_bias else 0
            w = self.weight_cost(r.op_index, r.weight_ratio) if r.in_channels > 0 else {"total": 0, "channels": 0}
            rows.append({"op": r.op_index, "name": self.by_op[r.op_index].name, "bias": b,
                         "weight_ratio": r.weight_ratio, "channels": w["channels"], "weight": w["total"]})
        return {**sim, "forward_peak": self.forward_peak, "per_layer": rows}

    def table(self) -> dict[str, Any]:
        """Memory of every option (memory.json)."""
        return {
            "settings": self.s.to_json(),
            "forward_peak": self.forward_peak,
            "layers": [lay.to_json() for lay in self.layers],
            "bias_options": [self.bias_option(k) for k in range(1, len(self.layers) + 1)],
            "weight_options": [{"op": lay.op_index, "name": lay.name, "ratio": r, **self.weight_cost(lay.op_index, r)}
                               for lay in self.layers for r in WEIGHT_RATIOS],
        }


def kb(n: float) -> str:
    """Bytes as KB (1024) with one decimal, the unit budgets are given in."""
    return f"{n / 1024:.1f} KB"
