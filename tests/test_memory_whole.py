"""bench/memory_mbv2.py's whole-SRAM account of a build: arena + stack + the rest of .data/.bss, the arena's
resident trained state by role and its busiest step, read from the build's artifacts (a made-up build here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _whole_sram():
    sys.path.insert(0, str(BENCH))
    try:
        return __import__("memory_mbv2").whole_sram
    finally:
        sys.path.remove(str(BENCH))


def _write(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_whole_sram_splits_the_firmware_sram_and_finds_the_busiest_step(tmp_path):
    whole_sram = _whole_sram()
    assert whole_sram(tmp_path) is None  # not built
    _write(tmp_path / "cross-compile" / "size.json", {
        "board": "b", "sram": {"stack": 1000, "data": 100, "bss": 5300, "heap": 0, "used": 6400},
        "top_symbols": {"sram": [{"name": "tt_arena", "size": 5000}, {"name": "buf.0", "size": 300}]},
        "stack_bound": {"bytes": 1000, "how": "bound"}})
    buffers = [{"start": 0, "end": 3, "size": 1000, "role": "weight"},
               {"start": 0, "end": 3, "size": 400, "role": "bias"},
               {"start": 0, "end": 1, "size": 2000, "role": "input"},
               {"start": 1, "end": 2, "size": 3000, "role": "gradient"},
               {"start": 2, "end": 3, "size": 500, "role": "activation"}]
    _write(tmp_path / "reorder" / "memplan.json", {"arena_bytes": 5000, "steps": 4, "buffers": buffers})
    _write(tmp_path / "reorder" / "schedule.json",
           {"ops": [{"op": 10 + i, "step": i, "type": "softmax_ce_loss" if i == 1 else f"t{i}"} for i in range(4)]})
    _write(tmp_path / "emulate-run" / "run.json",
           {"stack": {"high_water_bytes": 700}, "arena": {"used_bytes": 5000}})
    w = whole_sram(tmp_path)
    assert w["whole_bytes"] == 6400 == w["arena_bytes"] + w["stack_bytes"] + w["other_static_bytes"]
    assert w["other_static_bytes"] == 400 and w["other_static_largest"] == [{"name": "buf.0", "size": 300}]
    assert w["resident_by_role"] == {"weight": 1000, "bias": 400}
    assert w["stack_high_water_bytes"] == 700 and w["stack_how"] == "bound" and w["arena_measured_bytes"] == 5000
    # step 1: 1400 resident + 2000 input + 3000 gradient; step 2: 1400 + 3000 + 500
    assert w["peak"] == {"step": 1, "op": 11, "type": "softmax_ce_loss", "live_bytes": 6400,
                         "transient_by_role": {"input": 2000, "gradient": 3000}}
    # the forward: the steps before the loss
    assert w["forward_peak"] == {"step": 0, "op": 10, "type": "t0", "live_bytes": 3400}
