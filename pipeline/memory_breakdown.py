"""Where the bytes go, per layer and per part of the firmware, read from a build's artifacts (for the report).

SRAM per layer: reorder's memplan.json lists every arena buffer with its role; autodiff's train_graph.json says
which op makes or uses each tensor. A buffer belongs to the layer (an op of the original model: `source_index`
set) that produces its tensor or, for a tensor no op produces (weights, optimizer state, the input), to the first
layer-owned op that reads it; a tensor made by a training op (dequantize, loss, gradient, update) belongs to the
layer of that op's first input that has one. So a layer's gradients are the ones its backward ops compute.
The sum over layers is the bytes planned, not the arena: buffers that live at different steps share arena space.

Flash per layer: the generated program (codegen/tt_model.c) puts each constant in its own `static const` array,
named in a comment above it or used by the kernel call under an op comment; the linker map
(cross-compile/firmware.map, built with -fdata-sections) gives each array's size after linking. The flash
breakdown by part (model constants, model code, kernels, board runtime, C library) comes from the same map.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# memplan roles -> the chart's SRAM categories
CATEGORIES = {"weights": ("weight", "bias", "master_copy"), "activations": ("input", "activation", "scratch"),
              "gradients": ("gradient", "accumulator"), "optimizer state": ("optimizer_state",)}
OTHER = "not attributable to a layer"


@dataclass
class LayerTable:
    names: list[str]                                   # row labels, in graph order; OTHER last if used
    sram: dict[str, list[int]]                         # category -> bytes per row
    flash: list[int] | None                            # bytes of constants per row (None: no map to read)
    flash_unassigned: int = 0                          # model constants the table could not place
    notes: list[str] = field(default_factory=list)


# ---- the training graph: which layer owns a tensor -----------------------------------------------------------

def _short(name: str) -> str:
    parts = name.split(";")[0].split("/")
    return "/".join(parts[-2:])


def tensor_owners(graph: Mapping[str, Any]) -> tuple[list[str], dict[str, int]]:
    """-> (layer labels, tensor name -> layer index) for a training graph in its JSON form."""
    ops = list(graph.get("ops") or [])
    produced = {t for op in ops for t in op.get("outputs", [])}
    labels: list[str] = []
    owner: dict[str, int] = {}
    for op in ops:
        ins, outs = list(op.get("inputs", [])), list(op.get("outputs", []))
        if op.get("source_index") is not None:
            layer = len(labels)
            labels.append(f"{_short(outs[0]) if outs else '?'} ({op.get('type')})")
        else:
            layer = next((owner[t] for t in ins if t in owner), None)
            if layer is None:
                continue
        for t in outs:
            owner.setdefault(t, layer)
        for t in ins:
            if t not in produced:
                owner.setdefault(t, layer)
    return labels, owner


# ---- the linker map ------------------------------------------------------------------------------------------

_IN_ONE = re.compile(r"^ (\.[\w.$]+)\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)\s+(\S.*)$")
_IN_NAME = re.compile(r"^ (\.[\w.$]+)\s*$")
_IN_REST = re.compile(r"^\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)\s+(\S.*)$")


def map_sections(text: str, outputs: Iterable[str]) -> list[tuple[str, str, int, str]]:
    """Input sections placed in the named output sections: (output, input section, size, object file).
    GNU ld writes a long input-section name on its own line and the address, size and file on the next."""
    wanted = set(outputs)
    rows: list[tuple[str, str, int, str]] = []
    current, pending = None, None
    for line in text.splitlines():
        if line[:1] == ".":                    # an output section starts at column 0
            current, pending = line.split()[0], None
            continue
        if current not in wanted:
            continue
        m = _IN_ONE.match(line)
        if m:
            rows.append((current, m.group(1), int(m.group(3), 16), m.group(4).strip()))
            pending = None
            continue
        m = _IN_NAME.match(line)
        if m:
            pending = m.group(1)
            continue
        m = _IN_REST.match(line)
        if m and pending:
            rows.append((current, pending, int(m.group(2), 16), m.group(3).strip()))
        pending = None
    return [r for r in rows if r[2] > 0]


def flash_outputs(size: Mapping[str, Any]) -> list[str]:
    """Output sections stored in flash, as size.json (cross-compile) classifies them."""
    return [name for name, s in (size.get("sections") or {}).items() if "flash" in str(s.get("region", ""))]


def flash_parts(rows: list[tuple[str, str, int, str]]) -> dict[str, int]:
    """Flash bytes by part of the firmware: the model's constants and code, the kernels, the board runtime,
    the C library, the rest (vector table, linker padding is not counted)."""
    parts = {"model constants": 0, "model code": 0, "model messages": 0, "kernels": 0, "board runtime": 0,
             "C library": 0, "other": 0}
    for out, sec, n, obj in rows:
        if "tt_model.o" in obj:
            kind = ("model code" if sec.startswith(".text") else
                    "model messages" if ".str" in sec else "model constants")
            parts[kind] += n
        elif "/boards/" in obj:
            parts["board runtime"] += n
        elif "kernels_c/" in obj:
            parts["kernels"] += n
        elif re.search(r"lib(c|m|gcc|c_nano|nosys)[\w.-]*\.a", obj):
            parts["C library"] += n
        else:
            parts["other"] += n
    return {k: v for k, v in parts.items() if v}


# ---- the generated program: which layer owns a constant --------------------------------------------------------

_CONST = re.compile(r"^static const [\w ]+?\b(tt_\w+)\s*(\[[^\]]*\])?\s*=")
_SYM = re.compile(r"\btt_[a-z]+\d+\b")
_OP = re.compile(r"^\s*/\* ([\w ]+): (.+) \*/\s*$")
_NAMED = re.compile(r"^/\* (?:initial )?(.+) \*/$")


def constant_owners(program: str, owner: Mapping[str, int]) -> dict[str, int]:
    """Symbol of each `static const` array -> layer, from the tensor named above it, else from the first op
    comment whose code uses it (directly or through another constant, e.g. a requantization record)."""
    lines = program.splitlines()
    defined: dict[str, int] = {}
    uses: dict[str, set[str]] = {}       # constant -> constants its initializer names
    i = 0
    while i < len(lines):
        m = _CONST.match(lines[i])
        if m:
            sym = m.group(1)
            body = lines[i]
            j = i
            while ";" not in lines[j] and j + 1 < len(lines):
                j += 1
                body += lines[j]
            uses[sym] = set(_SYM.findall(body.split("=", 1)[1]))
            named = _NAMED.match(lines[i - 1].strip()) if i else None
            if named and named.group(1) in owner:
                defined[sym] = owner[named.group(1)]
            i = j + 1
            continue
        i += 1
    result = dict(defined)
    layer = None
    for line in lines:
        m = _OP.match(line)
        if m:
            names = [n.strip() for n in m.group(2).split("->")[-1].split(", ")]
            layer = next((owner[n] for n in names if n in owner), None)
            continue
        if layer is None or _CONST.match(line):
            continue
        todo = [s for s in _SYM.findall(line) if s in uses]
        while todo:
            s = todo.pop()
            if s not in result:
                result[s] = layer
                todo += [u for u in uses.get(s, ()) if u in uses]
    return result


# ---- the table -------------------------------------------------------------------------------------------------

def layer_table(graph: Mapping[str, Any], memplan: Mapping[str, Any], program: str | None = None,
                map_text: str | None = None) -> LayerTable:
    labels, owner = tensor_owners(graph)
    rows = len(labels) + 1                       # + OTHER
    role_cat = {r: c for c, rs in CATEGORIES.items() for r in rs}
    sram = {c: [0] * rows for c in CATEGORIES}
    for b in memplan.get("buffers") or []:
        tensors = b.get("tensors") or [b.get("name")]
        layer = next((owner[t] for t in tensors if t in owner), len(labels))
        sram[role_cat.get(b.get("role"), "activations")][layer] += int(b.get("size") or 0)
    flash: list[int] | None = None
    unassigned = 0
    notes = ["SRAM: bytes of each layer's arena buffers over the whole step (buffers that live at different "
             "steps share space, so the sum is more than the arena)"]
    if program is not None and map_text is not None:
        sizes = {sec.split(".rodata.", 1)[1]: n for _, sec, n, obj in map_sections(map_text, (".rodata",))
                 if sec.startswith(".rodata.tt_") and "." not in sec[len(".rodata."):] and "tt_model.o" in obj}
        if sizes:
            flash = [0] * rows
            consts = constant_owners(program, owner)
            for sym, n in sizes.items():
                if sym in consts:
                    flash[consts[sym]] += n
                else:
                    unassigned += n
            notes.append("flash: the layer's constant arrays (weights, biases, requantization) as linked; "
                         "trained weights count their initial values")
    keep = [i for i in range(rows) if any(sram[c][i] for c in sram) or (flash and flash[i])]
    names = [labels[i] if i < len(labels) else OTHER for i in keep]
    return LayerTable(names, {c: [v[i] for i in keep] for c, v in sram.items()},
                      [flash[i] for i in keep] if flash is not None else None, unassigned, notes)
