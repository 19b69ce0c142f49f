"""The stage DAG as text, Mermaid or Graphviz dot (`tinytrain graph`)."""

from __future__ import annotations

from typing import Mapping, Sequence

from tinytrain.pipeline.stage_graph import StageDef

FORMATS = ("text", "mermaid", "dot")


def render(stages: Sequence[StageDef], fmt: str = "text", states: Mapping[str, str] | None = None) -> str:
    """`states` (stage -> "cached", "will run", ...) annotates the nodes when a spec was given."""
    states = states or {}
    if fmt == "mermaid":
        return _mermaid(stages, states)
    if fmt == "dot":
        return _dot(stages, states)
    return _text(stages, states)


def _state(st: StageDef, states: Mapping[str, str]) -> str:
    return states.get(st.name) or ("not implemented" if st.impl is None else "")


def _text(stages: Sequence[StageDef], states: Mapping[str, str]) -> str:
    rows = [("stage", "after", "reads (config)", "state" if states else "implementation")]
    for st in stages:
        rows.append((st.name, ", ".join(st.deps) or "-", ", ".join(st.config) or "-",
                     _state(st, states) if states else (st.impl or "(not implemented)")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _mermaid(stages: Sequence[StageDef], states: Mapping[str, str]) -> str:
    ids = {st.name: f"s{i}" for i, st in enumerate(stages)}
    out = ["flowchart LR"]
    for st in stages:
        label = st.name + "<br/><small>" + ", ".join(st.config) + "</small>"
        state = _state(st, states)
        if state:
            label += f"<br/><i>{state}</i>"
        out.append(f'  {ids[st.name]}["{label}"]')
    for st in stages:
        for d in st.deps:
            out.append(f"  {ids[d]} --> {ids[st.name]}")
    missing = [ids[st.name] for st in stages if st.impl is None]
    if missing:
        out.append("  classDef todo stroke-dasharray: 5 5")
        out.append(f"  class {','.join(missing)} todo")
    return "\n".join(out) + "\n"


def _dot(stages: Sequence[StageDef], states: Mapping[str, str]) -> str:
    out = ["digraph tinytrain {", "  rankdir=LR;", "  node [shape=box, fontname=Helvetica];"]
    for st in stages:
        label = st.name + "\\n" + ", ".join(st.config)
        state = _state(st, states)
        if state:
            label += f"\\n({state})"
        style = ', style=dashed' if st.impl is None else ""
        out.append(f'  "{st.name}" [label="{label}"{style}];')
    for st in stages:
        for d in st.deps:
            out.append(f'  "{d}" -> "{st.name}";')
    out.append("}")
    return "\n".join(out) + "\n"
