"""Stage `reorder`: schedule the training step and plan its static arena (DESIGN §3, §7).

Reads autodiff's training IR (`train_graph.json` + `train_tensors.npz`) and config `train.reorder`
(`enabled`: reorder, or keep autodiff's plain order). Writes
    schedule.json   the op order (indices into the training IR), its phases, and which schedule was chosen
    schedule.txt    one line per step: op, what it allocates and frees, live bytes after it
    memplan.json    per buffer/tensor size, first/last step, arena offset; arena (= peak), lower bound, the
                    peak of the plain order (full forward, full backward keeping all gradients, then updates)
    memory.svg/.png live bytes per step, stacked by role, with the arena and lower-bound lines, the plain order's
                    curve (no reordering) for comparison, and the op at each curve's peak named
Summary: `peak 141.2 KB (lower bound 139.8 KB, +1.0%), without reordering 335.0 KB`.

Which schedule: the candidates are the plain order, TTE's in-place update order (each update right after its
gradient) and the memory-greedy list schedule, each also with the streamed groups its order allows
(stages/planning/streams.py: groups of a frozen prefix row by row, the pooled head's gradient position by position, weight
gradient + update channel by channel); the one with the smallest arena wins (ties: smaller lower bound, then the
earlier candidate), so reordering never makes the peak worse than either of the first two. The winner keeps only
the streams that lower its arena, and its arena placement gets a local search (memplan._place), which brings
MobileNetV2's TTE-like plan from 3.6 % to 0.1 % over its lower bound. schedule.json / memplan.json list the
streams; codegen runs them.

Planned once per build: sparse-plan's exact peak plans the training graph autodiff then writes, and this stage's
plan of that graph is a lookup (ScheduleMemo, keyed by the graph's structure and the planning options).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.pipeline.plots import Picture, memory_figure
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.planning.arena import (
    MemOptions,
    MemPlan,
    ROLE_ORDER,
    _RESIDENT,
    check_plan,
    counted_bytes,
    kb,
    plan_memory,
    tensor_roles,
)
from tinytrain.stages.planning.streams import find_streams, prune_streams
from tinytrain.stages.planning.schedule import (
    in_place_update_order,
    is_valid_order,
    memory_greedy_order,
    phases,
    plain_order,
)

PLACEMENT_SEARCH = 400   # rounds of placement local search for the chosen plan (memplan._place)
ARTIFACTS = ("schedule.json", "schedule.txt", "memplan.json", "memory.svg", "memory.png")


class ScheduleMemo:
    """The last few plan_schedules results, by the training graph (ops, tensor names, shapes, dtypes, roles,
    quantization granularity, which tensors hold data, the bytes of the constants a schedule may read (_read_values),
    inputs, outputs, meta) and the planning options; not the quantization parameters' values, nor other values
    (weights, biases, float constants) that no schedule reads. sparse-plan plans the training graph autodiff will
    build (its exact peak) and the reorder stage plans the graph autodiff wrote, with the wider scales sparse-plan
    chose (stages/quant/rescale.py changes only such values): within one build (one process) the second is a
    lookup. Results are kept pickled, so a caller gets its own copy. Bounded: `auto` plans many graphs."""

    def __init__(self, size: int = 16):
        self.size = size
        self.hits = self.misses = 0
        self._memo: OrderedDict[str, bytes] = OrderedDict()

    @staticmethod
    def key(graph: Graph, *settings: Any) -> str:
        h = hashlib.sha256()
        tensors = []
        for t in graph.tensors.values():
            tensors.append([t.name, list(t.shape), t.dtype, t.role, None if t.quant is None else len(t.quant.scale),
                            t.data is None])
            if t.data is not None and _read_values(t):
                h.update(np.ascontiguousarray(t.data).tobytes())
        doc = {"ops": [[op.type, op.inputs, op.outputs, op.attrs] for op in graph.ops], "tensors": tensors,
               "inputs": graph.inputs, "outputs": graph.outputs, "meta": graph.meta,
               "settings": [repr(s) for s in settings]}
        h.update(json.dumps(doc, sort_keys=True, default=repr).encode())
        return h.hexdigest()

    def get(self, key: str) -> tuple | None:
        if key not in self._memo:
            self.misses += 1
            return None
        self.hits += 1
        self._memo.move_to_end(key)
        return pickle.loads(self._memo[key])

    def put(self, key: str, value: tuple) -> None:
        self.adopt(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def latest(self) -> tuple[str, bytes]:
        """The entry used last (planned or looked up), as stored: what a forked worker hands back to its parent."""
        return next(reversed(self._memo.items()))

    def adopt(self, key: str, raw: bytes) -> None:
        """Store a pickled entry (`put`'s, or `latest` of a worker's memo)."""
        self._memo[key] = raw
        self._memo.move_to_end(key)
        while len(self._memo) > self.size:
            self._memo.popitem(last=False)


def _read_values(t: Any) -> bool:
    """Whether a schedule may read the values of constant `t`: integer operands other than weights and biases (a PAD's
    paddings, shapes, axes). Weights and biases are trained state or flash contents and float constants are values
    (e.g. the QAS scales, which follow the quantization parameters): for those only whether they hold data counts."""
    if t.role in ("weight", "bias"):
        return False
    try:
        return np.dtype(t.dtype).kind in "iub"
    except TypeError:
        return True

SCHEDULES = ScheduleMemo()


def plan_schedules(graph: Graph, reorder: bool = True, options: MemOptions | None = None, streams: bool = True
                   ) -> tuple[str, MemPlan, MemPlan, dict[str, MemPlan]]:
    """-> (chosen candidate's name, its plan, the plain order's plan, every candidate's plan).
    With `reorder` and `streams`, each candidate also runs the streams its order allows (stages.streams), and
    the chosen one keeps those that lower its arena. Deterministic, so memoised (ScheduleMemo)."""
    options = options or MemOptions(master_copy=bool(graph.meta.get("train", {}).get("master_copy", False)))
    key = SCHEDULES.key(graph, bool(reorder), options, bool(streams), PLACEMENT_SEARCH)
    found = SCHEDULES.get(key)
    if found is None:
        found = _plan_schedules(graph, reorder, options, streams)
        SCHEDULES.put(key, found)
    return found


def _plan_schedules(graph: Graph, reorder: bool, options: MemOptions, streams: bool
                    ) -> tuple[str, MemPlan, MemPlan, dict[str, MemPlan]]:
    plain = plan_memory(graph, plain_order(graph), options)
    cands = {"plain": plain}
    orders = {"plain": plain_order(graph)}
    if reorder:
        sizes = counted_bytes(graph, options)
        resident = [t for t, r in tensor_roles(graph).items() if r in _RESIDENT]
        for name, order in (("in_place_update", in_place_update_order(graph)),
                            ("memory_greedy", memory_greedy_order(graph, sizes, resident))):
            if not is_valid_order(graph, order):
                raise AssertionError(f"schedule {name} breaks a dependency")
            cands[name] = plan_memory(graph, order, options)
            orders[name] = order
        if streams:
            for name in list(cands):
                order, found = find_streams(graph, orders[name])
                if found:
                    cands[name + "+streams"] = plan_memory(graph, order, options, found)
    names = list(cands)
    best = min(names, key=lambda n: (cands[n].arena, cands[n].lower_bound, names.index(n)))
    chosen = cands[best]
    kept = chosen.streams
    if kept:
        kept, _ = prune_streams(lambda sts, below: plan_memory(graph, chosen.order, options, sts,
                                                              place_below=below), kept)
    # the chosen plan's placement gets the local search (the candidates are compared on the greedy one)
    chosen = plan_memory(graph, chosen.order, options, kept, placement_search=PLACEMENT_SEARCH)
    cands[best] = chosen
    return best, chosen, plain, cands


def summary_line(plan: MemPlan, plain: MemPlan) -> str:
    over = 100.0 * (plan.arena - plan.lower_bound) / plan.lower_bound if plan.lower_bound else 0.0
    return (f"peak {kb(plan.arena)} (lower bound {kb(plan.lower_bound)}, +{over:.1f}%), "
            f"without reordering {kb(plain.arena)}")


def rows_line(graph: Graph, plan: MemPlan, cands: dict[str, MemPlan]) -> str:
    """What the row streams of `plan` run and what they save: "row-streamed 23 ops (#0 conv2d .. #22 add), without
    streams 320.0 KB" ("" when it has none)."""
    rows = [st for st in plan.streams if st.kind == "rows"]
    if not rows:
        return ""
    groups = ", ".join(f"#{st.ops[0]} {graph.ops[st.ops[0]].type} .. #{st.ops[-1]} {graph.ops[st.ops[-1]].type}"
                       for st in rows)
    without = min((p.arena for n, p in cands.items() if not n.endswith("+streams")), default=plan.arena)
    fed = [int(st.info["windows"][t]) for st in rows for t in st.info.get("fed", [])]
    feed = f", the model input fed row by row ({fed[0]} rows held)" if fed else ""
    return f"row-streamed {sum(len(st.ops) for st in rows)} ops ({groups}){feed}, without streams {kb(without)}"


def hidden_line(plan: MemPlan) -> str:
    """What the hidden-channel streams of `plan` run: "hidden-channel streamed 4 backward chains (192, 192, 192,
    144 channels)" ("" when it has none)."""
    hidden = [st for st in plan.streams if st.kind == "hidden"]
    if not hidden:
        return ""
    return (f"hidden-channel streamed {len(hidden)} backward chain{'s' if len(hidden) > 1 else ''} "
            f"({', '.join(str(st.info['channels']) for st in hidden)} channels)")


def run(ctx) -> Any:
    from tinytrain.pipeline.contract import StageResult

    src = ctx.input_dir("autodiff")
    graph = Graph.load(src, stem="train_")
    cfg = ctx.config.get("train.reorder")
    enabled = bool(getattr(cfg, "enabled", True)) if cfg is not None and not isinstance(cfg, dict) \
        else bool((cfg or {}).get("enabled", True))
    ctx.progress("scheduling", 0.1)
    chosen, plan, plain, cands = plan_schedules(graph, enabled)
    check_plan(plan)
    out = Path(ctx.out_dir)
    write_artifacts(out, graph, chosen, plan, plain, cands)
    extra = [t for t in (rows_line(graph, plan, cands), hidden_line(plan)) if t]
    return StageResult(summary="; ".join([summary_line(plan, plain)] + extra),
                       metrics={"peak_bytes": plan.arena, "lower_bound_bytes": plan.lower_bound,
                                "plain_peak_bytes": plain.arena, "schedule": chosen, "steps": plan.steps})


def write_artifacts(out: Path, graph: Graph, chosen: str, plan: MemPlan, plain: MemPlan,
                    cands: dict[str, MemPlan]) -> None:
    out = Path(out)
    sched = {"version": 1, "schedule": chosen, "order": plan.order,
             "phases": [[i for i in plan.order if i in set(ph)] for ph in phases(graph)],
             "ops": [{"step": s, "op": i, "type": graph.ops[i].type, "outputs": graph.ops[i].outputs}
                     for s, i in enumerate(plan.order)],
             "streams": [st.to_json() for st in plan.streams]}
    (out / "schedule.json").write_text(json.dumps(sched, indent=1, sort_keys=True) + "\n")
    (out / "schedule.txt").write_text(schedule_text(graph, plan))
    doc = plan.to_json()
    doc.update({"version": 1, "schedule": chosen, "summary": summary_line(plan, plain),
                "row_streams": rows_line(graph, plan, cands), "hidden_streams": hidden_line(plan),
                "plain_peak_bytes": plain.arena, "plain_lower_bound_bytes": plain.lower_bound,
                "candidates": {n: {"arena_bytes": p.arena, "lower_bound_bytes": p.lower_bound}
                               for n, p in cands.items()},
                "tensors": plan.tensor_rows()})
    (out / "memplan.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    memory_picture(graph, plan, plain, title="Memory over the training step: " + summary_line(plan, plain)
                   ).write(out / "memory")


def schedule_text(graph: Graph, plan: MemPlan) -> str:
    born: dict[int, list[str]] = {}
    dies: dict[int, list[str]] = {}
    for b in plan.buffers:
        if b.role in _RESIDENT:
            continue
        born.setdefault(b.start, []).append(b.name)
        dies.setdefault(b.end, []).append(b.name)
    tag = {i: f"  [{st.kind} stream {k}]" for k, st in enumerate(plan.streams) for i in st.ops}
    lines = [f"# {len(plan.order)} steps; arena {plan.arena} B, lower bound {plan.lower_bound} B; "
             f"resident {sum(b.size for b in plan.buffers if b.role in _RESIDENT)} B",
             *[f"# stream {k}: {st.kind}, ops {st.ops}, streamed tensors "
               + ", ".join(f"{_short(t)} {n} B" for t, n in st.chunked.items()) for k, st in enumerate(plan.streams)],
             "# step  op  live_bytes  type  -> outputs  | frees"]
    for s, i in enumerate(plan.order):
        op = graph.ops[i]
        live = sum(plan.live_by_role[s].values())
        frees = ", ".join(_short(t) for t in dies.get(s, []))
        lines.append(f"{s:5d} {i:4d} {live:10d}  {op.type}  -> {', '.join(_short(t) for t in op.outputs)}"
                     + (f"  | {frees}" if frees else "") + tag.get(i, ""))
    return "\n".join(lines) + "\n"


def _short(name: str) -> str:
    return name.split(";")[0]


# ---- picture ---------------------------------------------------------------------------------------------------

def step_labels(graph: Graph, plan: MemPlan) -> list[str]:
    """What runs at each step of `plan`, for the picture: op type and its (first) output."""
    return [f"{graph.ops[i].type} -> {_short(graph.ops[i].outputs[0]) if graph.ops[i].outputs else '-'}"
            for i in plan.order]


def memory_picture(graph: Graph, plan: MemPlan, plain: MemPlan, title: str = "") -> Picture:
    """Live bytes per step stacked by role, the plain order's curve beside it, each peak named by its op."""
    return memory_figure(plan.live_by_role, step_labels(graph, plan), plan.arena, plan.lower_bound,
                         plain_live=[sum(d.values()) for d in plain.live_by_role], plain_arena=plain.arena,
                         plain_labels=step_labels(graph, plain), roles=ROLE_ORDER, title=title)


# ---- inspect ---------------------------------------------------------------------------------------------------

def inspect(path: Path) -> str | None:
    """Readable view of memplan.json (or of the stage's folder): summary, candidates, bytes by role at the peak
    step, and the largest buffers. Other artifacts: None (the generic view)."""
    path = Path(path)
    if path.is_dir():
        path = path / "memplan.json"
    if path.name != "memplan.json":
        return None
    d = json.loads(path.read_text())
    lines = [d["summary"], f"schedule: {d['schedule']}  ({d['steps']} steps, align {d['options']['align']}, "
                           f"in-place ops {'on' if d['options']['in_place'] else 'off'})", ""]
    lines.append("candidates:")
    for n, c in d["candidates"].items():
        lines.append(f"  {n:<24} arena {kb(c['arena_bytes']):>10}  lower bound {kb(c['lower_bound_bytes']):>10}")
    if d.get("streams"):
        lines += ["", "streams (each op group runs interleaved, a slice at a time; stages/planning/streams.py):"]
        if d.get("row_streams"):
            lines.append(f"  {d['row_streams']}")
        for k, st in enumerate(d["streams"]):
            lines.append(f"  {k}: {st['kind']:<9} ops {st['ops']}")
            lines += [f"       {_short(t)}: {n} B while streamed" for t, n in st["chunked"].items()]
    by_role: dict[str, int] = {}
    for b in d["buffers"]:
        if b["role"] in _RESIDENT:
            by_role[b["role"]] = by_role.get(b["role"], 0) + b["size"]
    lines += ["", "resident (whole step): " + (", ".join(f"{r} {kb(v)}" for r, v in by_role.items()) or "none"),
              "", f"{'size':>9}  {'offset':>8}  {'steps':>11}  role        buffer"]
    for b in sorted(d["buffers"], key=lambda b: (-b["size"], b["name"]))[:25]:
        lines.append(f"{b['size']:>9}  {b['offset']:>8}  {b['start']:>5}-{b['end']:<5}  {b['role']:<10}  "
                     f"{_short(b['name'])}" + (f" (+{len(b['tensors']) - 1} in place)" if len(b["tensors"]) > 1
                                               else ""))
    return "\n".join(lines) + "\n"
