"""train.precision and train.loss_scale (issue 13): defaults keep old specs' meaning; bad combinations are refused
at spec time with one line (the CLI exits 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.spec import load_spec
from tinytrain.stages.device.boards import BOARDS

MODEL = Path(__file__).parent / "fixtures" / "digits_cnn_float.tflite"


def _spec(tmp_path: Path, extra: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nmodel: {{path: {MODEL}}}\ndata: {{source: digits}}\n{extra}\n")
    return p


@pytest.mark.parametrize("extra, precision, quantize", [
    ("", "int8", True),                                           # an existing spec: int8 as before
    ("quantize: {enabled: false}", "fp32", False),                # an existing float spec: fp32 as before
    ("train: {precision: fp32}", "fp32", False),                  # precision sets quantize.enabled
    ("train: {precision: int8}", "int8", True),
    ("train: {precision: fp16-mixed}\ntarget: {board: host}", "fp16-mixed", False),
])
def test_precision_resolves_and_keeps_old_meanings(tmp_path, extra, precision, quantize):
    s = load_spec(_spec(tmp_path, extra))
    assert s.train.precision == precision
    assert s.quantize.enabled is quantize
    assert (s.train.loss_scale is not None) == (precision == "fp16-mixed")


def test_loss_scale_defaults_are_gradscalers(tmp_path):
    s = load_spec(_spec(tmp_path, "train: {precision: fp16-mixed}"))
    ls = s.train.loss_scale
    assert (ls.kind, ls.init_scale, ls.growth_factor, ls.backoff_factor, ls.growth_interval) == \
        ("dynamic", 65536.0, 2.0, 0.5, 2000)


@pytest.mark.parametrize("extra, words", [
    ("train: {precision: fp16-mixed}\ntarget: {board: stm32f746-disco}", "half-precision"),
    ("train: {precision: fp16-mixed}\ntarget: {board: m4-256k}", "half-precision"),
    ("train: {precision: fp16-mixed, loss_scale: {min_scale: 10, max_scale: 1}}", "above max_scale"),
    ("train: {precision: fp16-mixed, loss_scale: {init_scale: 1.0e+9}}", "outside [min_scale, max_scale]"),
    ("train: {precision: fp16-mixed, loss_scale: {max_scale: 3.0e+38}}", "overflows fp32"),
    ("train: {precision: fp16-mixed, loss_scale: {backoff_factor: 1.5}}", "backoff_factor"),
    ("train: {precision: fp16-mixed, loss_scale: {growth_factor: 1.0}}", "growth_factor"),
    ("train: {precision: fp16-mixed, loss_scale: {growth_interval: 0}}", "growth_interval"),
    ("train: {precision: fp32, loss_scale: {kind: static}}", "fp16-mixed only"),
    ("train: {precision: int8}\nquantize: {enabled: false}", "quantize.enabled"),
    ("train: {precision: fp16}", "precision"),
])
def test_bad_combinations_are_refused(tmp_path, extra, words):
    with pytest.raises(SpecError) as e:
        load_spec(_spec(tmp_path, extra))
    assert words in str(e.value)


def test_refusal_names_the_boards_with_half_precision(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec(_spec(tmp_path, "train: {precision: fp16-mixed}\ntarget: {board: m4-128k}"))
    able = [b.name for b in BOARDS.values() if b.half_precision]
    assert able and all(n in str(e.value) for n in able)
    assert BOARDS["host"].half_precision and not BOARDS["stm32f746-disco"].half_precision


def test_cli_refuses_with_one_line_and_exit_2(tmp_path):
    p = _spec(tmp_path, "train: {precision: fp16-mixed}\ntarget: {board: stm32f746-disco}")
    r = subprocess.run([sys.executable, "-m", "tinytrain", "status", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "half-precision" in lines[0] and "Traceback" not in r.stderr
