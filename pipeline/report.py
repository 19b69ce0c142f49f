"""The build's final report: `build/<name>/report.md`, the same as one self-contained `report.html` (pictures
inlined), the per-layer memory chart `layers.svg`/`.png` beside them, and the summary block `tinytrain build`
ends with.

Rule: every figure comes from an artifact the user can open, and the report links that file next to it.
Nothing is recomputed from the spec or the cache here; the runner's own record of the build (which stages
ran or were restored, the cache counters) is itself written as an artifact first, `build/<name>/build.json`.
A stage without artifacts (not built yet, failed, not implemented) gets one line saying so, so a report
exists after any build, however far it got.

Every value read goes through `Artifacts.get`, which remembers (file, JSON path, value): the tests check
each remembered value against the file and its rendering against the report text.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tinytrain.cache.fs_ops import atomic_write_bytes
from tinytrain.pipeline.stage_graph import STAGE_NAMES
from tinytrain.stages.readable import human_count

REPORT_NAME = "report.md"
HTML_NAME = "report.html"
LAYERS_STEM = "layers"          # layers.svg / layers.png: SRAM and flash per layer, drawn by the report
BUILD_RECORD = "build.json"
_MISSING = object()

# MIT TTE's published figure (MobileNetV2-w0.35 @128, sparse update, STM32F746 @216 MHz); emulate-run
# copies it into run.json, which is where the report reads it from.
TTE_NOTE = "TTE: MobileNetV2-w0.35 @128 on STM32F746, comparable only for that model and scheme"


@dataclass
class Artifacts:
    root: Path                                   # build/<name>/
    used: list[tuple[str, tuple, Any]] = field(default_factory=list)
    _cache: dict[str, Any] = field(default_factory=dict)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def doc(self, rel: str) -> Any:
        if rel not in self._cache:
            try:
                self._cache[rel] = json.loads((self.root / rel).read_text())
            except (OSError, json.JSONDecodeError):
                self._cache[rel] = None
        return self._cache[rel]

    def get(self, rel: str, *path: Any, default: Any = None) -> Any:
        """The value at `path` in JSON artifact `rel` (None/default when absent); remembered for the tests."""
        v: Any = self.doc(rel)
        for p in path:
            if isinstance(v, dict) and p in v:
                v = v[p]
            elif isinstance(v, list) and isinstance(p, int) and -len(v) <= p < len(v):
                v = v[p]
            else:
                return default
        if v is None:
            return default
        self.used.append((rel, tuple(path), v))
        return v

    def text(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except OSError:
            return None

    def files(self, stage: str) -> list[tuple[str, int]]:
        d = self.root / stage
        if not d.is_dir():
            return []
        return sorted((p.relative_to(self.root).as_posix(), p.stat().st_size)
                      for p in d.rglob("*") if p.is_file() and p.name != "manifest.json")


# ---- formatting ----------------------------------------------------------------------------------

def kb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1024:.1f} KB"


def pct(x: float | None, already_pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f}%" if already_pct else f"{100 * x:.1f}%"


def count(n: float | None) -> str:
    return "n/a" if n is None else human_count(n)


def link(rel: str) -> str:
    return f"[{rel}]({rel})"


# ---- the report ----------------------------------------------------------------------------------

def write_report(build_dir: Path, layers_picture: bool = True) -> Path:
    """Write build/<name>/report.md, report.html and the per-layer chart from the artifacts there (the chart not
    when `layers_picture` is False: the runner drew it already); returns report.md's path."""
    build_dir = Path(build_dir)
    if layers_picture:
        write_layers_picture(build_dir)
    text, _ = render(build_dir)
    path = build_dir / REPORT_NAME
    # An interrupted build never leaves half a report. Not durable (no fsync): every build writes it again from
    # its artifacts, so one lost to a power cut costs nothing a build does not redo (fs_ops.atomic_write_bytes).
    atomic_write_bytes(path, text.encode(), durable=False)
    atomic_write_bytes(build_dir / HTML_NAME, to_html(text, build_dir).encode(), durable=False)
    return path



def layer_table(a: "Artifacts"):
    """SRAM and flash per layer (pipeline.memory_breakdown), or None before autodiff and reorder have run."""
    from tinytrain.pipeline.memory_breakdown import layer_table as table

    graph, memplan = a.doc("autodiff/train_graph.json"), a.doc("reorder/memplan.json")
    if not isinstance(graph, dict) or not isinstance(memplan, dict):
        return None
    host = a.get("cross-compile/size.json", "host", default=True)
    program = a.text("codegen/tt_model.c") if not host else None
    mapfile = a.text("cross-compile/firmware.map") if not host else None
    return table(graph, memplan, program, mapfile)


# The stages whose artifacts the per-layer chart reads (layer_table): once they are built the chart is final, and the
# runner draws it while the stages after them run (pipeline/runner.py).
LAYERS_PICTURE_STAGES = ("autodiff", "reorder", "codegen", "cross-compile")


def write_layers_picture(build_dir: Path) -> bool:
    """Draw layers.svg/.png beside report.md (False, and stale pictures removed, when the data is missing)."""
    from tinytrain.pipeline.plots import layers_figure

    build_dir = Path(build_dir)
    t = layer_table(Artifacts(build_dir))
    if t is None or not t.names:
        for ext in (".svg", ".png"):
            (build_dir / LAYERS_STEM).with_suffix(ext).unlink(missing_ok=True)
        return False
    name = Artifacts(build_dir).get(BUILD_RECORD, "name", default=build_dir.name)
    layers_figure(t.names, t.sram, t.flash, title=f"{name}: memory per layer").write(build_dir / LAYERS_STEM)
    return True


def render(build_dir: Path) -> tuple[str, Artifacts]:
    a = Artifacts(Path(build_dir))
    name = a.get(BUILD_RECORD, "name", default=Path(build_dir).name)
    out = [f"# tinytrain build report: {name}", "",
           "Every figure below is read from the artifact linked beside it (paths relative to this file); "
           "open the file to check it.", ""]
    for title, fn in _SECTIONS:
        out += [f"## {title}", ""]
        out += fn(a)
        out.append("")
    return "\n".join(out).rstrip() + "\n", a


def _not_built(stage: str) -> list[str]:
    return [f"_Not built: no artifacts in `{stage}/` (the build stopped before it, or it failed)._"]


def _build(a: Artifacts) -> list[str]:
    if not a.exists(BUILD_RECORD):
        return ["_No build record (build.json): the report was written outside `tinytrain build`._"]
    lines = [f"Source: {link(BUILD_RECORD)}", ""]
    spec = a.get(BUILD_RECORD, "spec")
    if spec:
        lines.append(f"Spec: `{spec}`")
    ok = a.get(BUILD_RECORD, "ok")
    err = a.get(BUILD_RECORD, "error")
    lines.append(f"Result: {'ok' if ok else 'failed'}" + (f" — {err.splitlines()[0]}" if err else ""))
    lines.append("")
    lines += ["| stage | state | time | summary |", "|---|---|---|---|"]
    stages = a.get(BUILD_RECORD, "stages", default=[])
    for i, st in enumerate(stages):
        state = a.get(BUILD_RECORD, "stages", i, "state", default="")
        summ = (a.get(BUILD_RECORD, "stages", i, "summary", default="") or "").replace("|", "\\|")
        lines.append(f"| {st.get('stage')} | {state} | {_stage_time(a, i, st.get('stage'), state)} | {summ} |")
    ran, cached = a.get(BUILD_RECORD, "ran", default=[]), a.get(BUILD_RECORD, "cached", default=[])
    hits, misses = a.get(BUILD_RECORD, "cache", "hits"), a.get(BUILD_RECORD, "cache", "misses")
    lines += ["", f"Cache: {len(cached)} stage(s) restored from the cache, {len(ran)} ran"
              + (f" (cache counters: {hits} hits, {misses} misses)" if hits is not None else "") + "."]
    return lines


def _stage_time(a: Artifacts, i: int, stage: str, state: str) -> str:
    """A stage restored from the cache took no time in this build: show how long it took when it ran, which
    the cache entry keeps and the stage folder's manifest.json repeats."""
    if state == "cached":
        orig = a.get(f"{stage}/manifest.json", "duration_s")
        return f"none; {_secs(orig)} when it ran" if orig is not None else "none (restored)"
    return _secs(a.get(BUILD_RECORD, "stages", i, "duration_s", default=0.0))


def _secs(d: float) -> str:
    return f"{d:.2f} s" if d >= 0.01 or d == 0 else f"{d * 1000:.1f} ms"


def _model(a: Artifacts) -> list[str]:
    f = "load/summary.json"
    if not a.exists(f):
        return _not_built("load")
    lines = [f"Source: {link(f)}, graph: {link('load/graph.txt')}", "",
             f"- {a.get(f, 'ops')} ops, {a.get(f, 'params')} parameters ({kb(a.get(f, 'param_bytes'))}), "
             f"{count(a.get(f, 'macs'))} MACs, {a.get(f, 'dtype')}"]
    for kind in ("inputs", "outputs"):
        for i, _ in enumerate(a.get(f, kind, default=[])):
            lines.append(f"- {kind[:-1]} `{a.get(f, kind, i, 'name')}`: {a.get(f, kind, i, 'dtype')}"
                         f"{a.get(f, kind, i, 'shape')}")
    ops = a.get(f, "ops_by_type", default={})
    if ops:
        lines.append("- op types: " + ", ".join(f"{k} ×{v}" for k, v in ops.items()))
    return lines


def _quantize(a: Artifacts) -> list[str]:
    f = "quantize/report.json"
    if not a.exists(f):
        return _not_built("quantize")
    lines = [f"Source: {link(f)} (per tensor: {link('quantize/report.txt')}), int8 model: "
             f"{link('quantize/model_int8.tflite')}", ""]
    af, ai = a.get(f, "model", "acc_float"), a.get(f, "model", "acc_int8")
    split, n = a.get(f, "model", "eval_split", default="test"), a.get(f, "model", "eval_samples")
    if af is not None or ai is not None:
        lines.append(f"- accuracy on the {split} split ({n} samples): float {pct(af)}, int8 {pct(ai)}")
    agree = a.get(f, "model", "agreement")
    if agree is not None:
        lines.append(f"- float and int8 predictions agree on {pct(agree)} of the samples")
    sq = a.get(f, "model", "output_sqnr_db")
    if sq is not None:
        lines.append(f"- output SQNR {sq:.1f} dB; worst tensor {a.get(f, 'model', 'worst_sqnr_db'):.1f} dB "
                     f"(`{a.get(f, 'model', 'worst_tensor')}`)")
    mode = a.get(f, "mode")
    if mode:
        lines.append(f"- mode: {mode}")
    return lines


def _plan(a: Artifacts) -> list[str]:
    f = "sparse-plan/plan.txt"
    if not a.exists(f):
        return _not_built("sparse-plan")
    text = a.text(f) or ""
    return [f"Source: {link(f)} (machine-readable: {link('sparse-plan/plan.json')})", "", "```", text.rstrip(), "```"]


def _autodiff(a: Artifacts) -> list[str]:
    f = "autodiff/summary.json"
    if not a.exists(f):
        return _not_built("autodiff")
    ph = a.get(f, "ops_by_phase", default={})
    phases = ", ".join(f"{k} {v}" for k, v in ph.items())
    return [f"Source: {link(f)}, graph: {link('autodiff/train_graph.txt')}", "",
            f"- {a.get(f, 'ops')} ops ({phases})",
            f"- {a.get(f, 'trained_params')} trained parameters, precision {a.get(f, 'precision')}, "
            f"loss {a.get(f, 'loss')}, optimizer {_name(a.get(f, 'optimizer'))}, batch {a.get(f, 'batch_size')}",
            f"- training adds: parameter gradients {kb(a.get(f, 'parameter_gradient_bytes'))}, optimizer state "
            f"{kb(a.get(f, 'optimizer_state_bytes'))}"]


def _name(v: Any) -> str:
    return str(v.get("kind", v)) if isinstance(v, dict) else str(v)


def _reorder(a: Artifacts) -> list[str]:
    f = "reorder/memplan.json"
    if not a.exists(f):
        return _not_built("reorder")
    peak, lb = a.get(f, "arena_bytes"), a.get(f, "lower_bound_bytes")
    plain = a.get(f, "plain_peak_bytes")
    lines = [f"Source: {link(f)}, schedule: {link('reorder/schedule.txt')}", "",
             f"- peak (arena) {kb(peak)}, lower bound {kb(lb)}"
             + (f" (+{100 * (peak - lb) / lb:.1f}%)" if peak and lb else ""),
             f"- without reordering: {kb(plain)}; schedule chosen: {a.get(f, 'schedule')}"]
    for st in a.get(f, "streams") or []:
        lines.append(f"- {st['kind']} stream over ops {st['ops']}: its streamed tensors take "
                     f"{kb(sum(st['chunked'].values()))} instead of whole")
    if a.exists("reorder/memory.svg"):
        lines += ["", "![memory timeline](reorder/memory.svg)", "",
                  "Live bytes at each step of the chosen schedule (stacked by role) and of the plain order "
                  "(dashed); the op at each peak is named under the picture"
                  + (f" (PNG: {link('reorder/memory.png')})." if a.exists("reorder/memory.png") else ".")]
    return lines


def _codegen(a: Artifacts) -> list[str]:
    f = "codegen/codegen.json"
    if not a.exists(f) and not a.exists("codegen/io_layout.json"):
        return _not_built("codegen")
    lines = [f"Source: {link(f)}, program: {link('codegen/tt_model.c')}, layout: {link('codegen/io_layout.json')}",
             ""]
    if a.exists(f):
        lines.append(f"- {a.get(f, 'lines')} lines of C, {a.get(f, 'kernel_calls')} kernel calls, "
                     f"arena {kb(a.get(f, 'arena_bytes'))}, constants {kb(a.get(f, 'const_bytes'))}")
    tt = a.get("codegen/io_layout.json", "trained_tensors", default=[])
    if tt:
        lines.append(f"- {len(tt)} trained tensor(s), {kb(a.get('codegen/io_layout.json', 'weights_bytes'))} "
                     f"of weights handed back in weights.bin")
    return lines


def _firmware(a: Artifacts) -> list[str]:
    f = "cross-compile/size.json"
    if not a.exists(f):
        return _not_built("cross-compile")
    board = a.get(f, "board")
    lines = [f"Source: {link(f)}, map: {link('cross-compile/firmware.map')}, ELF: "
             f"{link('cross-compile/firmware.elf')}", ""]
    if a.get(f, "host"):
        lines.append(f"- {board}: native executable, {kb(a.get(f, 'flash', 'used'))} code + data (no limits)")
        return lines
    lines += [f"- board {board}",
              f"- flash {kb(a.get(f, 'flash', 'used'))} of {kb(a.get(f, 'flash', 'available'))} "
              f"(text {kb(a.get(f, 'flash', 'text'))}, rodata {kb(a.get(f, 'flash', 'rodata'))}, "
              f"data image {kb(a.get(f, 'flash', 'data'))})",
              f"- SRAM {kb(a.get(f, 'sram', 'used'))} of {kb(a.get(f, 'sram', 'available'))} "
              f"(static data+bss {kb(a.get(f, 'sram', 'static'))}, stack reserve {kb(a.get(f, 'sram', 'stack'))})",
              f"- fits the board: {'yes' if a.get(f, 'fits') else 'NO'}"]
    return lines


def _training(a: Artifacts) -> list[str]:
    f = "emulate-run/run.json"
    if not a.exists(f):
        return _not_built("emulate-run")
    lines = [f"Source: {link(f)}, log: {link('emulate-run/run.log')}", "",
             f"**{a.get(f, 'summary')}**", ""]
    b, af = a.get(f, "accuracy", "before_pct"), a.get(f, "accuracy", "after_pct")
    n = a.get(f, "accuracy", "before", "total")
    lines.append(f"- accuracy on the test split ({n} samples): {pct(b, True)} before → {pct(af, True)} after "
                 f"training on {a.get(f, 'board')}")
    lines.append(f"- {a.get(f, 'loss', 'steps')} training steps ({a.get(f, 'runtime', 'epochs')} epochs of "
                 f"{a.get(f, 'data', 'train_samples_per_epoch')} samples), learning rate "
                 f"{a.get(f, 'runtime', 'learning_rate'):g}; {_loss_trend(a, f)}")
    lines.append(f"- improvement gate: {a.get(f, 'gate', 'reason')}")
    if a.get(f, "instructions", "counted"):
        lines.append(f"- instructions per training step: {count(a.get(f, 'instructions', 'per_step_mean'))} mean "
                     f"(min {count(a.get(f, 'instructions', 'per_step_min'))}, max "
                     f"{count(a.get(f, 'instructions', 'per_step_max'))}); "
                     f"{count(a.get(f, 'instructions', 'total_train'))} in all")
        c = a.get(f, "cycles_estimate")
        if c:
            ms, clk = a.get(f, "cycles_estimate", "ms_per_step"), a.get(f, "cycles_estimate", "clock_hz")
            tte_ms = a.get(f, "cycles_estimate", "tte_reference", "ms_per_step")
            tte_cyc = a.get(f, "cycles_estimate", "tte_reference", "cycles_per_step")
            ratio = a.get(f, "cycles_estimate", "tte_reference", "ratio")
            lines.append(f"- estimated {ms:.2f} ms per step at {clk / 1e6:.0f} MHz (1 cycle per instruction); "
                         f"TTE: {tte_ms:g} ms ≈ {count(tte_cyc)} cycles per step — ours is {ratio:.3g}× that "
                         f"({TTE_NOTE})")
    else:
        lines.append("- instructions per step: not counted (host run)")
    hw, ss = a.get(f, "stack", "high_water_bytes"), a.get(f, "stack", "size_bytes")
    if hw:
        lines.append(f"- stack high-water mark {kb(hw)} of {kb(ss)} reserved")
    lines.append(f"- arena: {kb(a.get(f, 'arena', 'used_bytes'))} used of {kb(a.get(f, 'arena', 'planned_bytes'))} "
                 f"planned")
    lines.append(f"- exported ({a.get(f, 'export', 'weights')} weights): {link('emulate-run/trained.wof')} "
                 f"(weights-only format, {a.get(f, 'export', 'wof_n_buffers')} buffers), "
                 f"{link('emulate-run/trained_int8.tflite')}; the firmware's own output: "
                 f"{link('emulate-run/weights.bin')}")
    if a.exists("emulate-run/loss.svg"):
        lines += ["", "![loss per step](emulate-run/loss.svg)"]
        if a.exists("emulate-run/loss.png"):
            lines += ["", f"PNG: {link('emulate-run/loss.png')}"]
    return lines


def _loss_trend(a: Artifacts, f: str) -> str:
    """Per-epoch means of the loss: single steps (batch 1) jump between 1e-6 and 10+, so the first and the
    last step say nothing about the trend."""
    means = a.get(f, "loss", "epoch_mean")
    if means:
        return "mean loss per epoch " + " → ".join(f"{a.get(f, 'loss', 'epoch_mean', i):.3g}"
                                                   for i in range(len(means)))
    first, last = a.get(f, "loss", "first"), a.get(f, "loss", "last")
    if first is None or last is None:
        return "no loss recorded"
    return f"loss of the first step {first:.4g}, of the last step {last:.4g} (single samples, not a trend)"


def _layers(a: Artifacts) -> list[str]:
    t = layer_table(a)
    if t is None:
        return ["_Needs the artifacts of autodiff (`autodiff/train_graph.json`) and reorder "
                "(`reorder/memplan.json`)._"]
    src = [link("reorder/memplan.json"), link("autodiff/train_graph.json")]
    if t.flash is not None:
        src += [link("codegen/tt_model.c"), link("cross-compile/firmware.map")]
    lines = ["Source: " + ", ".join(src), ""]
    if a.exists(f"{LAYERS_STEM}.svg"):
        lines += [f"![memory per layer]({LAYERS_STEM}.svg)", ""]
    cats = list(t.sram)
    head = ["layer", *[f"SRAM {c}" for c in cats], *(["flash"] if t.flash is not None else [])]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, name in enumerate(t.names):
        cells = [name, *[_kb0(t.sram[c][i]) for c in cats], *([_kb0(t.flash[i])] if t.flash is not None else [])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"- {n}" for n in t.notes]
    if t.flash is None:
        lines.append("- flash per layer: no linker map of a board build (host builds have none)")
    elif t.flash_unassigned:
        lines.append(f"- model constants not attributable to a layer: {kb(t.flash_unassigned)}")
    parts = _flash_parts(a)
    if parts:
        total = sum(parts.values())
        used = a.get("cross-compile/size.json", "flash", "used", default=0)
        lines += ["", f"Flash by part of the firmware, from {link('cross-compile/firmware.map')}: {total} B of the "
                  f"{used} B used (the rest is alignment padding between sections):", "", "| part | flash |",
                  "|---|---|"]
        lines += [f"| {k} | {kb(v)} |" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])]
    return lines


def _kb0(n: int) -> str:
    return kb(n) if n else "–"


def _flash_parts(a: Artifacts) -> dict[str, int]:
    from tinytrain.pipeline.memory_breakdown import flash_outputs, flash_parts, map_sections

    size, text = a.doc("cross-compile/size.json"), a.text("cross-compile/firmware.map")
    if not isinstance(size, dict) or size.get("host") or not text:
        return {}
    return flash_parts(map_sections(text, flash_outputs(size)))


def _where(a: Artifacts) -> list[str]:
    lines = ["| stage | artifacts |", "|---|---|"]
    for st in STAGE_NAMES:
        files = a.files(st)
        shown = ", ".join(f"{link(p)} ({kb(s) if s >= 1024 else f'{s} B'})" for p, s in files) or "—"
        lines.append(f"| {st} | {shown} |")
    return lines


_SECTIONS: tuple[tuple[str, Callable[[Artifacts], list[str]]], ...] = (
    ("Build", _build), ("Model (load)", _model), ("Quantization (quantize)", _quantize),
    ("Training plan (sparse-plan)", _plan), ("Training graph (autodiff)", _autodiff),
    ("Memory plan (reorder)", _reorder), ("Generated code (codegen)", _codegen),
    ("Firmware (cross-compile)", _firmware), ("Memory per layer (SRAM and flash)", _layers),
    ("On-device training (emulate-run)", _training),
    ("Where everything is", _where),
)
SECTION_TITLES = tuple(t for t, _ in _SECTIONS)


# ---- HTML ------------------------------------------------------------------------------------------------------

_CSS = ("body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;line-height:1.45;"
        "color:#222}table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.25em .5em;"
        "text-align:left;vertical-align:top}code,pre{background:#f5f5f5}pre{padding:.6em;overflow-x:auto}"
        "img{max-width:100%;height:auto}")
_IMG = re.compile(r'<img src="([^"]+)" alt="([^"]*)"\s*/?>')


def to_html(markdown: str, build_dir: Path) -> str:
    """report.md as one self-contained HTML file: every picture inlined (the PNG beside an SVG, as a data: URI;
    matplotlib's SVGs share element ids, so several inline SVGs in one page could clash), no stylesheet, script
    or font fetched. Links to artifacts stay relative: they work when the file sits in the build folder, and
    nothing on the page needs them to show."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)

    def inline(m: re.Match) -> str:
        rel = html.unescape(m.group(1))
        path = Path(build_dir) / rel
        png = path.with_suffix(".png")
        if png.is_file():
            data, mime = png.read_bytes(), "image/png"
        elif path.is_file():
            data, mime = path.read_bytes(), "image/svg+xml" if path.suffix == ".svg" else "application/octet-stream"
        else:
            return f"<em>[missing picture: {html.escape(rel)}]</em>"
        return f'<img src="data:{mime};base64,{base64.b64encode(data).decode()}" alt="{m.group(2)}">'

    body = _IMG.sub(inline, body)
    title = html.escape(markdown.splitlines()[0].lstrip("# ") if markdown else "tinytrain report")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


# ---- the CLI's closing block -----------------------------------------------------------------------

def summary_block(build_dir: Path, shown: Callable[[Path], str] = str) -> list[str]:
    """The lines `tinytrain build` ends with: each figure with the artifact it comes from."""
    root = Path(build_dir)
    a = Artifacts(root)
    rows: list[tuple[str, str]] = []
    run = "emulate-run/run.json"
    if a.exists(run):
        n = a.get(run, "accuracy", "before", "total")
        rows.append((f"accuracy (test split, {n} samples): {pct(a.get(run, 'accuracy', 'before_pct'), True)} → "
                     f"{pct(a.get(run, 'accuracy', 'after_pct'), True)}"
                     + ("" if a.get(run, "gate", "accepted", default=True)
                        else " — gate rejected the run, original weights exported"), run))
        if a.get(run, "instructions", "counted"):
            ms = a.get(run, "cycles_estimate", "ms_per_step")
            clk = a.get(run, "cycles_estimate", "clock_hz")
            rows.append((f"instructions per training step: {count(a.get(run, 'instructions', 'per_step_mean'))}"
                         + (f" (≈{ms:.1f} ms @{clk / 1e6:.0f} MHz; TTE MobileNetV2: 373 ms)" if ms else ""), run))
        else:
            rows.append(("instructions per training step: not counted on host", run))
    else:
        q = "quantize/report.json"
        if a.exists(q) and a.get(q, "model", "acc_int8") is not None:
            rows.append((f"int8 accuracy before training: {pct(a.get(q, 'model', 'acc_int8'))} "
                         f"(no on-device run yet)", q))
    size = "cross-compile/size.json"
    if a.exists(size) and not a.get(size, "host"):
        # No heap: static data + bss (the arena is in it) + the stack reserve is the SRAM peak by construction.
        rows.append((f"peak SRAM {kb(a.get(size, 'sram', 'used'))} / {kb(a.get(size, 'sram', 'available'))}, flash "
                     f"{kb(a.get(size, 'flash', 'used'))} / {kb(a.get(size, 'flash', 'available'))} on "
                     f"{a.get(size, 'board')} ({'fits' if a.get(size, 'fits') else 'DOES NOT FIT'})", size))
        if a.exists(run) and a.get(run, "stack", "high_water_bytes"):
            rows.append((f"measured: arena {kb(a.get(run, 'arena', 'used_bytes'))} (planned "
                         f"{kb(a.get(run, 'arena', 'planned_bytes'))}), stack high-water "
                         f"{kb(a.get(run, 'stack', 'high_water_bytes'))}", run))
    elif a.exists("reorder/memplan.json"):
        mp = "reorder/memplan.json"
        rows.append((f"planned peak memory (arena) {kb(a.get(mp, 'arena_bytes'))}", mp))
    if a.exists(BUILD_RECORD):
        cached, ran = a.get(BUILD_RECORD, "cached", default=[]), a.get(BUILD_RECORD, "ran", default=[])
        rows.append((f"cache: {len(cached)} stage(s) restored, {len(ran)} ran", BUILD_RECORD))
    if not rows:
        return []
    width = max(len(t) for t, _ in rows)
    lines = ["summary:"]
    lines += [f"  {t.ljust(width)}  {shown(root / src)}" for t, src in rows]
    lines.append(f"  artifacts: {shown(root)}/<stage>/   report: {shown(root / REPORT_NAME)} "
                 f"(and {HTML_NAME})")
    return lines
