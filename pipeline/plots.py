"""The build's pictures, drawn with matplotlib: the loss curve (emulate-run), the memory timeline (reorder) and the
per-layer SRAM / flash chart (the report).

Each function takes plain numbers (no stage objects), so the stage that owns the data decides what is drawn and
this module only how. Every picture is written twice, as SVG (text kept as text: searchable, small) and PNG.

Byte-determinism: a stage's artifacts are cached under a key computed from its inputs, so the same data must give
the same bytes. Matplotlib's SVG writer salts its element ids with a random value and stamps a date; both are
fixed here (`svg.hashsalt`, `metadata={"Date": None}`), the PNG gets no "Software" stamp, and the figure is drawn
through the Agg canvas directly (no pyplot: no global figure state, no GUI backend).
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from tinytrain.cache.fs_ops import atomic_write_bytes

# Text stays text in the SVG (the op names must be findable), ids are salted with a constant, fonts are the
# DejaVu Sans bundled with matplotlib (the same glyphs on every machine).
_RC = {"svg.hashsalt": "tinytrain", "svg.fonttype": "none", "font.family": "DejaVu Sans", "font.size": 9,
       "axes.titlesize": 10, "path.simplify": True}
_SVG_META = {"Date": None, "Creator": "tinytrain (matplotlib)"}
_PNG_META = {"Software": None}
DPI = 110

ROLE_COLORS = {"weight": "#4c72b0", "bias": "#55a868", "optimizer_state": "#8172b2", "accumulator": "#937860",
               "master_copy": "#da8bc3", "input": "#8c8c8c", "activation": "#dd8452", "gradient": "#c44e52",
               "scratch": "#ccb974"}
# The per-layer chart's SRAM categories (memplan roles grouped) and flash.
CATEGORY_COLORS = {"weights": "#4c72b0", "activations": "#dd8452", "gradients": "#c44e52",
                   "optimizer state": "#8172b2", "flash": "#55a868"}


@dataclass(frozen=True)
class Picture:
    svg: bytes
    png: bytes

    def write(self, stem: Path) -> tuple[Path, Path]:
        """Write `<stem>.svg` and `<stem>.png`; returns both paths."""
        stem = Path(stem)
        svg, png = stem.with_suffix(".svg"), stem.with_suffix(".png")
        atomic_write_bytes(svg, self.svg)   # an interrupted build never leaves half a picture
        atomic_write_bytes(png, self.png)
        return svg, png


def _render(fig: Figure) -> Picture:
    FigureCanvasAgg(fig)
    with matplotlib.rc_context(_RC):
        s, p = io.BytesIO(), io.BytesIO()
        fig.savefig(s, format="svg", metadata=_SVG_META)
        fig.savefig(p, format="png", metadata=_PNG_META, dpi=DPI)
    return Picture(s.getvalue(), p.getvalue())


def _figure(w: float, h: float) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(w, h), layout="constrained")


def _title(fig: Figure, title: str, width: int = 110) -> None:
    # Wrapped by hand so a long summary line is never cut at the figure's edge.
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, width)), fontsize=10)


# ---- loss ----------------------------------------------------------------------------------------------------

def moving_average(v: Sequence[float], window: int) -> list[float]:
    """Centred mean over `window` values (fewer at both ends). Centred, not trailing: a trailing mean starts with
    the first sample alone, which says nothing about the loss at the start of training."""
    n = len(v)
    prefix = [0.0]
    for x in v:
        prefix.append(prefix[-1] + x)
    half = window // 2
    out = []
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i - half + window)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def loss_limits(losses: Sequence[float], smooth: Sequence[float], means: Sequence[float]) -> tuple[float, float]:
    """Log-scale y-limits of the loss plot. Why a log scale: the per-sample losses (batch 1) of a model meeting new
    classes drop from ~10 to ~0.1 within a few hundred steps and then keep falling slowly; on a linear axis the
    first steps squash the rest of the run into a flat line at the bottom, while a log axis shows both the fall
    and the later per-epoch progress. Why limits from the smoothed curve and percentiles, not the extremes: a
    sample already classified right costs 1e-6 and one confidently wrong costs 30+; those single samples would
    stretch the axis over decades that carry no trend. The points beyond the limits are counted in a note."""
    pos = sorted(x for x in losses if math.isfinite(x) and x > 0)
    ref = [x for x in list(smooth) + list(means) if math.isfinite(x) and x > 0]
    if not pos or not ref:
        return 1e-3, 1.0
    hi = max(max(ref), pos[min(len(pos) - 1, math.ceil(0.995 * len(pos)) - 1)])
    lo = min(ref)
    return lo / 4, hi * 1.6


def loss_figure(losses: Sequence[float], steps_per_epoch: int | None, title: str = "",
                epoch_means: Sequence[float] | None = None,
                accuracy: Sequence[tuple[int, float, str]] = (), accuracy_name: str = "test accuracy (%)"
                ) -> Picture:
    """Loss per training step (dots), a centred moving average, the per-epoch means (one level per epoch) and,
    on the right axis, the measured test accuracy points given as (step, value, label) -- only what was measured:
    the firmware measures before and after training, so there are two points and no line between them."""
    n = len(losses)
    steps = list(range(1, n + 1))
    fig = _figure(8.6, 4.4)
    ax = fig.add_subplot()
    window = max(1, min(100, n // 30))
    smooth = moving_average(list(losses), window)
    means = [m for m in (epoch_means or [])]
    lo, hi = loss_limits(losses, smooth, means)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    if n:
        ax.plot(steps, [x if x > 0 else float("nan") for x in losses], ".", color="#6baed6", ms=2.2, alpha=0.6,
                mew=0, label="loss of each step (one sample)", rasterized=True)
        ax.plot(steps, smooth, color="#08519c", lw=1.6, label=f"moving average ({window} steps, centred)")
    if steps_per_epoch and n:
        for e in range(1, n // steps_per_epoch):
            ax.axvline(e * steps_per_epoch + 0.5, color="#999", lw=0.8, ls="--")
        for e, m in enumerate(means):
            a, b = e * steps_per_epoch + 1, (e + 1) * steps_per_epoch
            ax.hlines(m, a, b, color="#e6550d", lw=2.2, label="epoch mean" if e == 0 else None)
            ax.annotate(f"epoch {e + 1} mean {m:.3g}", ((a + b) / 2, m), xytext=(0, 5), textcoords="offset points",
                        ha="center", va="bottom", color="#a63603", fontsize=8, zorder=5,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    below, above = sum(1 for x in losses if x < lo), sum(1 for x in losses if x > hi)
    if below or above:
        ax.text(0.995, 0.015, f"not shown: {below} step(s) below {lo:.2g}, {above} above {hi:.2g}",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="#555")
    ax.set_xlim(-0.015 * n, n * 1.015 + 1)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10], integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("training step (one sample per step)")
    ax.set_ylabel("loss (log scale)")
    ax.grid(axis="y", color="#eee")
    handles, labels = ax.get_legend_handles_labels()
    pts = [(s, v, lab) for s, v, lab in accuracy if v is not None and math.isfinite(v)]
    if pts:
        ax2 = ax.twinx()
        ax2.plot([s for s, _, _ in pts], [v for _, v, _ in pts], "D", color="#31a354", ms=6, ls="none",
                 label=accuracy_name + ", measured")
        for s, v, lab in pts:
            left = s < n / 2
            ax2.annotate(f"{lab}: {v:.1f}" if "%" in accuracy_name else f"{lab}: {v:.3g}", (s, v), xytext=(8 if left else -8, 0), textcoords="offset points",
                         ha="left" if left else "right", va="center", color="#006d2c", fontsize=8)
        if "%" in accuracy_name:
            ax2.set_ylim(0, 105)
        ax2.set_ylabel(accuracy_name, color="#006d2c")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, ncols=min(len(labels), 4), frameon=False,
               markerscale=1.5)
    _title(fig, title)
    return _render(fig)


# ---- memory timeline -----------------------------------------------------------------------------------------

def memory_figure(live_by_role: Sequence[Mapping[str, int]], step_labels: Sequence[str], arena: int,
                  lower_bound: int, plain_live: Sequence[int] = (), plain_arena: int | None = None,
                  plain_labels: Sequence[str] = (), roles: Sequence[str] = tuple(ROLE_COLORS), title: str = ""
                  ) -> Picture:
    """Live bytes per step of the chosen schedule, stacked by role, with its arena and lower bound; the plain
    order's live bytes (no reordering) as a line for comparison; the peak step of each marked on the curve and
    named by its op under the plot (op names are long: in the plot they would cover the curves)."""
    n = len(live_by_role)
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    xs = list(range(n))
    base = [0.0] * n
    used_roles = [r for r in roles if any(d.get(r, 0) for d in live_by_role)]
    for role in used_roles:
        top = [b + d.get(role, 0) / 1024 for b, d in zip(base, live_by_role)]
        ax.fill_between(xs, base, top, step="mid", color=ROLE_COLORS.get(role, "#999"), lw=0,
                        label=role.replace("_", " "))
        base = top
    totals = base
    ax.axhline(arena / 1024, color="black", lw=1, label=f"arena {arena / 1024:.1f} KB")
    ax.axhline(lower_bound / 1024, color="#555", lw=1, ls=":", label=f"lower bound {lower_bound / 1024:.1f} KB")
    plain = [v / 1024 for v in plain_live]
    tops = [arena / 1024, lower_bound / 1024, *totals, *plain]
    if plain:
        ax.step(range(len(plain)), plain, where="mid", color="#d62728", lw=1.2, ls="--",
                label="without reordering (plain order)")
        if plain_arena is not None:
            ax.axhline(plain_arena / 1024, color="#d62728", lw=0.8, ls="-.",
                       label=f"arena without reordering {plain_arena / 1024:.1f} KB")
            tops.append(plain_arena / 1024)
    ax.set_ylim(0, max(tops + [0.001]) * 1.2)
    notes = []
    if n:
        s = max(range(n), key=lambda i: (totals[i], -i))
        ax.plot([s], [totals[s]], "v", color="black", ms=7, label="peak of the schedule")
        notes.append(f"peak {totals[s]:.1f} KB at step {s}: {step_labels[s] if s < len(step_labels) else '?'}")
    if plain:
        p = max(range(len(plain)), key=lambda i: (plain[i], -i))
        ax.plot([p], [plain[p]], "v", color="#d62728", ms=7, mfc="white", label="peak of the plain order")
        notes.append(f"plain-order peak {plain[p]:.1f} KB at step {p}: "
                     f"{plain_labels[p] if p < len(plain_labels) else '?'}")
    ax.set_xlim(-0.5, max(n, len(plain), 1) - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 5, 10], integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} KB"))
    ax.set_xlabel("step of the schedule (one op per step)")
    ax.set_ylabel("live bytes")
    ax.grid(axis="y", color="#eee")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), fontsize=8, ha="left", va="bottom", wrap=False)
        fig.get_layout_engine().set(rect=(0, 0.045 * len(notes) + 0.01, 1, 1 - 0.045 * len(notes) - 0.01))
    _title(fig, title)
    return _render(fig)


# ---- per-layer SRAM and flash -------------------------------------------------------------------------------

def layers_figure(layers: Sequence[str], sram: Mapping[str, Sequence[int]], flash: Sequence[int] | None,
                  title: str = "") -> Picture:
    """Horizontal bars, one row per layer: SRAM stacked by category (left), flash constants (right). What the
    bars count is said beside the picture (the report), where there is room for a sentence."""
    k = len(layers)
    fig = _figure(9.0, max(2.8, 1.8 + 0.34 * k))
    panels = 2 if flash is not None else 1
    axes = fig.subplots(1, panels, sharey=True, width_ratios=[3, 2][:panels], squeeze=False)[0]
    ys = list(range(k))
    left = [0.0] * k
    ax = axes[0]
    for cat, vals in sram.items():
        if not any(vals):
            continue
        kbs = [v / 1024 for v in vals]
        ax.barh(ys, kbs, left=left, color=CATEGORY_COLORS.get(cat, "#999"), label=cat, height=0.7)
        left = [a + b for a, b in zip(left, kbs)]
    for y, v in zip(ys, left):
        if v:
            ax.annotate(f"{v:.1f} KB", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(ys, list(layers))
    ax.invert_yaxis()
    ax.set_xlim(0, max(left + [0.001]) * 1.2)
    ax.set_xlabel("SRAM: the layer's arena buffers")
    ax.set_title("SRAM")
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} KB"))
        a.grid(axis="x", color="#eee")
        a.set_axisbelow(True)
    if flash is not None:
        fx = axes[1]
        kbs = [v / 1024 for v in flash]
        fx.barh(ys, kbs, color=CATEGORY_COLORS["flash"], height=0.7, label="flash")
        for y, v in zip(ys, kbs):
            if v:
                fx.annotate(f"{v:.1f} KB", (v, y), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8)
        fx.set_xlim(0, max(kbs + [0.001]) * 1.3)
        fx.set_xlabel("flash: the layer's constants")
        fx.set_title("flash")
    handles, labels = [], []
    for a in axes:
        h, lab = a.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8, frameon=False)
    _title(fig, title)
    return _render(fig)
