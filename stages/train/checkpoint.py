"""Host side of the firmware's checkpoints (`*.ttck`, layout: stages/c_emit/api.py): read, check, describe.

    read_checkpoint(raw, layout) -> Checkpoint        describe(path, layout) -> text for `tinytrain inspect`
    describe_artifact(path) -> the same, with the layout found beside a build's stage folders (or a refusal)

`layout` is codegen's io_layout.json: its "checkpoint" entry names the state tensors (weights, optimizer state,
PRNG streams) with their offsets, sizes and dtypes. The same checks as tt_checkpoint_load: size, magic,
version, model id, CRC32.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tinytrain.stages.c_emit.api import CKPT_HEADER, CKPT_MAGIC, CKPT_VERSION

_HEAD = struct.Struct("<4sIIIIIII")


class CheckpointError(ValueError):
    """A checkpoint that is truncated, corrupted, or made for another model."""


@dataclass
class Checkpoint:
    steps: int
    model_id: int
    tensors: dict[str, np.ndarray]
    roles: dict[str, str]


def read_checkpoint(raw: bytes, layout: Mapping[str, Any] | None = None) -> Checkpoint:
    if len(raw) < CKPT_HEADER + 4:
        raise CheckpointError(f"checkpoint truncated ({len(raw)} bytes)")
    magic, version, model_id, total, steps, pending, state, _ = _HEAD.unpack_from(raw)
    if magic != CKPT_MAGIC:
        raise CheckpointError(f"not a tinytrain checkpoint (magic {magic!r})")
    if version != CKPT_VERSION:
        raise CheckpointError(f"checkpoint version {version}, expected {CKPT_VERSION}")
    if total != len(raw) or total != CKPT_HEADER + state + 4:
        raise CheckpointError(f"checkpoint truncated or padded: {len(raw)} bytes, its header says {total}")
    crc = struct.unpack_from("<I", raw, total - 4)[0]
    if zlib.crc32(raw[:total - 4]) & 0xFFFFFFFF != crc:
        raise CheckpointError("checkpoint CRC mismatch (torn write or corrupted bytes)")
    if pending:
        raise CheckpointError(f"checkpoint saved with {pending} samples pending")
    tensors: dict[str, np.ndarray] = {}
    roles: dict[str, str] = {}
    ck = (layout or {}).get("checkpoint")
    if ck is not None:
        if int(ck["model_id"]) != model_id:
            raise CheckpointError(f"checkpoint of another model (id {model_id:08x}, this model {int(ck['model_id']):08x})")
        for t in ck["tensors"]:
            dt = np.dtype(t["dtype"]).newbyteorder("<")
            tensors[t["name"]] = np.frombuffer(raw, dt, int(t["nbytes"]) // dt.itemsize, int(t["offset"]))
            roles[t["name"]] = t["role"]
    return Checkpoint(steps=steps, model_id=model_id, tensors=tensors, roles=roles)


def describe(path: Path, layout: Mapping[str, Any] | None = None) -> str:
    """Step, model id and per state tensor its role, size and L2 norm (optimizer moments show how far Adam got)."""
    c = read_checkpoint(Path(path).read_bytes(), layout)
    lines = [f"checkpoint: version {CKPT_VERSION}, step {c.steps}, model id {c.model_id:08x}, CRC ok"]
    ls = loss_scale(c, layout)
    if ls is None:
        lines.append(f"  (no loss scale: {(layout or {}).get('precision', 'int8')} training needs none)")
    else:
        lines.append(f"  fp16-mixed loss scale {ls['scale']:g} ({ls['kind']}), {ls['skipped_steps']} steps skipped, "
                     f"{ls['good_steps']} finite steps since the last change")
    for name, arr in c.tensors.items():
        norm = float(np.linalg.norm(arr.astype(np.float64)))
        lines.append(f"  {c.roles[name]:<9} {name:<48} {arr.nbytes:>8} B  |x|_2 = {norm:.6g}")
    return "\n".join(lines)


def loss_scale(c: Checkpoint, layout: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """fp16-mixed's loss-scale state in a checkpoint (optimizer state, stages/train/fp16_mixed.py): resuming continues
    from this scale and these counters; None for other precisions."""
    ls = (layout or {}).get("loss_scale")
    if not ls or ls.get("scale_tensor") not in c.tensors:
        return None
    return {"kind": ls.get("kind"), "scale": float(c.tensors[ls["scale_tensor"]].reshape(-1)[0]),
            "skipped_steps": int(c.tensors[ls["skipped_steps_tensor"]].reshape(-1)[0]),
            "good_steps": int(c.tensors[ls["good_steps_tensor"]].reshape(-1)[0])}


def describe_artifact(path: Path) -> str:
    """A checkpoint artifact (build/<name>/emulate-run/trained.ttck) read with codegen's layout from the sibling
    stage folder (build/<name>/codegen/io_layout.json); without it, the header only. A bad one says why."""
    import json

    lay = Path(path).absolute().parent.parent / "codegen" / "io_layout.json"
    try:
        return describe(path, json.loads(lay.read_text()) if lay.is_file() else None) + "\n"
    except CheckpointError as e:
        return f"{Path(path).name}: refused: {e}\n"
