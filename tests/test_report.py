"""report.md and the closing summary of `tinytrain build`: every section is there, every figure comes from an
artifact, and a build that stopped early still gets a report of what exists.

The build folder here is written by hand with distinctive numbers, so that a figure taken from the wrong
place (or computed instead of read) shows up as a mismatch.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from tinytrain.pipeline import report as rp
from tinytrain.pipeline.stage_graph import STAGE_NAMES


def _w(root: Path, rel: str, doc) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))


def full_build(root: Path) -> Path:
    _w(root, "build.json", {"name": "demo", "spec": "/x/demo.yaml", "ok": True, "error": None,
                            "ran": ["emulate-run"], "cached": ["load", "quantize", "sparse-plan", "autodiff",
                                                               "reorder", "codegen", "cross-compile"],
                            "cache": {"hits": 7, "misses": 1},
                            "stages": [{"stage": s, "state": "cached", "duration_s": 0.0, "summary": f"{s} ok"}
                                       for s in STAGE_NAMES[:-1]]
                            + [{"stage": "emulate-run", "state": "ran", "duration_s": 12.34, "summary": "trained"}]})
    _w(root, "load/summary.json", {"ops": 17, "params": 4321, "param_bytes": 17284, "macs": 2_345_678,
                                   "dtype": "float", "ops_by_type": {"conv2d": 3, "fully_connected": 1},
                                   "inputs": [{"name": "x", "shape": [1, 8, 8, 1], "dtype": "float32"}],
                                   "outputs": [{"name": "y", "shape": [1, 10], "dtype": "float32"}]})
    _w(root, "load/graph.txt", "input x\n")
    _w(root, "quantize/report.json", {"mode": "ptq", "model": {
        "acc_float": 0.4911, "acc_int8": 0.4877, "agreement": 0.9833, "eval_samples": 361, "eval_split": "test",
        "output_sqnr_db": 37.25, "worst_sqnr_db": 31.5, "worst_tensor": "conv_b"}})
    _w(root, "sparse-plan/plan.txt", "auto: 1 layer + last 1 biases, est. 13.4 KB of 300 KB budget\n")
    _w(root, "autodiff/summary.json", {"ops": 23, "ops_by_phase": {"forward": 5, "loss": 2, "backward": 9,
                                                                   "accumulate": 0, "update": 7},
                                       "trained_params": 2570, "precision": "int8", "loss": "cross_entropy",
                                       "optimizer": {"kind": "sgd"}, "batch_size": 1,
                                       "parameter_gradient_bytes": 10280, "optimizer_state_bytes": 0})
    # A two-layer training graph: conv (layer 0), fc (layer 1) and the training ops, which belong to the layer
    # of their first input that has one (loss and gradient -> fc; the update reads fc's weight).
    _w(root, "autodiff/train_graph.json", {"ops": [
        {"type": "conv2d", "source_index": 0, "inputs": ["x", "w0", "b0"], "outputs": ["a0"]},
        {"type": "fully_connected", "source_index": 1, "inputs": ["a0", "w1", "b1"], "outputs": ["y"]},
        {"type": "softmax_ce_loss", "source_index": None, "inputs": ["y", "labels"], "outputs": ["loss", "g_y"]},
        {"type": "fully_connected_grad_weight", "source_index": None, "inputs": ["g_y", "a0"], "outputs": ["g_w1"]},
        {"type": "sgd_update", "source_index": None, "inputs": ["w1", "g_w1", "m_w1"], "outputs": []}]})
    buffers = [("x", "input", 64), ("a0", "activation", 777), ("w1", "weight", 2600), ("y", "activation", 40),
               ("labels", "input", 4), ("loss", "activation", 4), ("g_y", "gradient", 40),
               ("g_w1", "gradient", 1111), ("m_w1", "optimizer_state", 2222)]
    _w(root, "reorder/memplan.json", {"arena_bytes": 14000, "lower_bound_bytes": 13000, "plain_peak_bytes": 20480,
                                      "schedule": "in_place",
                                      "buffers": [{"name": n, "tensors": [n], "role": r, "size": b, "start": 0,
                                                   "end": 1, "offset": 0} for n, r, b in buffers]})
    # The generated program names each constant above it or uses it under an op comment; the map sizes them.
    _w(root, "codegen/tt_model.c", "\n".join([
        "/* w0 */", "static const int8_t tt_c1[72] = {", "    1, 2", "};",
        "static const int32_t tt_mult2[8] = {1};", "static const tt_requant_s8 tt_rq3 = {0, tt_mult2};",
        "/* initial w1 */", "static const int8_t tt_i4[2600] = {", "    0", "};",
        "static void tt_forward(void)", "{", "    /* conv2d: a0 */", "    tt_conv2d_s8(&tt_rq3, tt_c1);",
        "    /* fully_connected: y */", "    tt_fully_connected_s8(tt_i4);", "}", ""]))
    _w(root, "cross-compile/firmware.map", "\n".join([
        "Memory Configuration", "", ".text           0x00000100     0x1900",
        " *(.text .text.*)", " .text.tt_main  0x00000100      0x800 obj/program/tt_model.o",
        " .text.tt_conv2d_s8", "                0x00000900     0x1000 obj/kernels_c/tt_conv.o",
        " .text.memcpy   0x00001900      0x100 /usr/lib/libc_nano.a(lib_a-memcpy.o)",
        ".rodata         0x00002100      0xab4", " .rodata.tt_c1  0x00002100       0x48 obj/program/tt_model.o",
        " .rodata.tt_mult2", "                0x00002148       0x20 obj/program/tt_model.o",
        " .rodata.tt_rq3", "                0x00002168       0x1c obj/program/tt_model.o",
        " .rodata.tt_i4  0x00002184      0xa28 obj/program/tt_model.o",
        " .rodata.tt_main.str1.4", "                0x00002bac       0x30 obj/program/tt_model.o",
        " *fill*         0x00002bdc        0x4 ",
        ".bss            0x20000000      0x400", " .bss.tt_arena  0x20000000      0x400 obj/program/tt_model.o", ""]))
    _w(root, "reorder/memory.svg", "<svg/>")
    _w(root, "codegen/codegen.json", {"lines": 594, "kernel_calls": 10, "arena_bytes": 14000, "const_bytes": 4300})
    _w(root, "codegen/io_layout.json", {"trained_tensors": [{"name": "w"}, {"name": "b"}], "weights_bytes": 2600})
    _w(root, "cross-compile/size.json", {"board": "stm32f746-disco", "host": False, "fits": True,
                                         "sections": {".text": {"region": "flash"}, ".rodata": {"region": "flash"},
                                                      ".bss": {"region": "sram"}},
                                         "flash": {"used": 19968, "available": 1048576, "text": 13107,
                                                   "rodata": 6451, "data": 120},
                                         "sram": {"used": 33894, "available": 327680, "static": 17510,
                                                  "stack": 16384}})
    _w(root, "emulate-run/run.json", {
        "summary": "trained 3 epochs on stm32f746-disco: acc 49.4% → 95.0%", "board": "stm32f746-disco",
        "runtime": {"epochs": 3, "learning_rate": 0.01},
        "data": {"train_samples_per_epoch": 1437},
        "accuracy": {"before": {"correct": 178, "total": 360}, "after": {"correct": 342, "total": 360},
                     "before_pct": 49.4444, "after_pct": 95.0},
        "loss": {"steps": 4311, "first": 1.55e-06, "last": 0.5268, "epoch_mean": [0.5954, 0.1387, 0.1016]},
        "gate": {"accepted": True, "reason": "accuracy 49.4% -> 95.0% (change +45.6 >= +0.0 points): kept"},
        "instructions": {"counted": True, "per_step_mean": 1_066_000.0, "per_step_min": 1_060_000,
                         "per_step_max": 1_080_000, "total_train": 4_590_000_000},
        "cycles_estimate": {"clock_hz": 216_000_000, "ms_per_step": 4.935, "tte_reference": {
            "ms_per_step": 373.0, "cycles_per_step": 80_568_000.0, "ratio": 0.01323}},
        "stack": {"high_water_bytes": 820, "size_bytes": 16384},
        "arena": {"planned_bytes": 13936, "used_bytes": 13924},
        "export": {"weights": "trained", "wof_n_buffers": 13}})
    _w(root, "emulate-run/loss.svg", "<svg/>")
    for i, stage in enumerate(STAGE_NAMES[:-1]):       # restored from the cache: the manifest keeps the run time
        _w(root, f"{stage}/manifest.json", {"duration_s": 1.25 + i, "key": "k", "outputs": []})
    _w(root, "emulate-run/trained.wof", "x")
    return root


def _renderings(v) -> set[str]:
    """The ways the report may print a number read from an artifact."""
    out = {str(v)}
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        out |= {f"{f:g}", f"{f:.1f}", f"{f:.2f}", f"{f:.4g}", f"{f:.3g}", rp.kb(f), rp.count(f), rp.pct(f),
                rp.pct(f, True), f"{f / 1e6:.0f}", f"{f:.2f} s"}
    return out


def test_report_has_every_section_and_every_number_matches_its_artifact(tmp_path):
    root = full_build(tmp_path / "build" / "demo")
    path = rp.write_report(root)
    text = path.read_text()
    assert path == root / "report.md"
    for title in rp.SECTION_TITLES:
        assert f"## {title}" in text
    assert "_Not built" not in text
    _, arts = rp.render(root)
    numbers = [(rel, p, v) for rel, p, v in arts.used if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) > 40
    for rel, p, v in numbers:
        # the value is really in the file at that place ...
        doc = json.loads((root / rel).read_text())
        for k in p:
            doc = doc[k]
        assert doc == v
        # ... and the report prints it in one of its formats
        assert any(r in text for r in _renderings(v)), (rel, p, v)
    # Spot checks of the formatting that matters to a reader, each beside its source link.
    for expected in ("49.4% before → 95.0% after", "float 49.1%, int8 48.8%", "361 samples",
                     "flash 19.5 KB of 1024.0 KB", "SRAM 33.1 KB of 320.0 KB", "peak (arena) 13.7 KB, lower bound 12.7 KB",
                     "1.07M mean", "4.93 ms per step at 216 MHz", "373 ms", "80.6M cycles", "0.0132×",
                     "stack high-water mark 0.8 KB of 16.0 KB", "13.6 KB used of 13.6 KB planned",
                     "1 ran (cache counters: 7 hits, 1 misses)", "594 lines of C",
                     "[emulate-run/run.json](emulate-run/run.json)", "![loss per step](emulate-run/loss.svg)",
                     "![memory timeline](reorder/memory.svg)", "[emulate-run/trained.wof](emulate-run/trained.wof)",
                     "auto: 1 layer + last 1 biases"):
        assert expected in text, expected


def test_report_shows_epoch_means_not_single_steps(tmp_path):
    text = rp.write_report(full_build(tmp_path / "demo")).read_text()
    assert "mean loss per epoch 0.595 → 0.139 → 0.102" in text
    assert "1.55e-06" not in text and "0.5268" not in text


def test_a_cached_stage_shows_the_time_it_took_when_it_ran(tmp_path):
    text = rp.write_report(full_build(tmp_path / "demo")).read_text()
    assert "| quantize | cached | none; 2.25 s when it ran |" in text
    assert "| emulate-run | ran | 12.34 s |" in text
    assert "0.00 s" not in text


def test_layer_table_attributes_buffers_and_constants_to_layers(tmp_path):
    root = full_build(tmp_path / "demo")
    t = rp.layer_table(rp.Artifacts(root))
    assert t.names == ["a0 (conv2d)", "y (fully_connected)"]
    assert t.sram == {"weights": [0, 2600], "activations": [64 + 777, 40 + 4 + 4], "gradients": [0, 40 + 1111],
                      "optimizer state": [0, 2222]}
    # conv: its weight (named), the requantization record (used by its call) and the multipliers the record
    # names; fc: the initial values of its trained weight. The message strings are no layer's.
    assert t.flash == [0x48 + 0x1c + 0x20, 0xa28] and t.flash_unassigned == 0
    assert rp._flash_parts(rp.Artifacts(root)) == {"model code": 0x800, "kernels": 0x1000, "C library": 0x100,
                                                   "model constants": 0x48 + 0x20 + 0x1c + 0xa28,
                                                   "model messages": 0x30}


def test_report_draws_the_layer_chart_and_writes_a_self_contained_html(tmp_path):
    root = full_build(tmp_path / "demo")
    rp.write_report(root)
    text = (root / "report.md").read_text()
    assert "![memory per layer](layers.svg)" in text
    assert "| y (fully_connected) | 2.5 KB | 0.0 KB | 1.1 KB | 2.2 KB | 2.5 KB |" in text
    svg = (root / "layers.svg").read_text()
    assert "y (fully_connected)" in svg and "optimizer state" in svg
    assert (root / "layers.png").read_bytes().startswith(b"\x89PNG")
    page = (root / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page
    # Self-contained: every picture is a data: URI, nothing is fetched (no scripts, stylesheets, remote URLs).
    srcs = re.findall(r'\bsrc="([^"]*)"', page)
    assert len(srcs) == 3 and all(s.startswith("data:image/") for s in srcs)
    assert not re.search(r"<(script|link|iframe|object)\b", page) and "http://" not in page \
        and "https://" not in page
    assert all(not h.startswith(("/", "//")) and ":" not in h for h in re.findall(r'\bhref="([^"]*)"', page))
    # The layer chart's PNG is the one inlined.
    assert base64.b64encode((root / "layers.png").read_bytes()).decode() in page
    # Same artifacts, same bytes.
    before = {p: (root / p).read_bytes() for p in ("report.md", "report.html", "layers.svg", "layers.png")}
    rp.write_report(root)
    assert before == {p: (root / p).read_bytes() for p in before}


def test_runner_draws_the_layer_chart_while_later_stages_run_with_the_reports_bytes(tmp_path):
    """The runner draws the per-layer chart in a forked process once its stages are built (pipeline/runner.py,
    _EarlyPicture); the report then skips it. Same files as the report drawing it at the end."""
    from tinytrain.pipeline.runner import _EarlyPicture

    early_dir, late_dir = full_build(tmp_path / "early"), full_build(tmp_path / "late")
    early = _EarlyPicture(early_dir, set(STAGE_NAMES))
    for stage in STAGE_NAMES[:-1]:
        assert early.proc is None or stage not in rp.LAYERS_PICTURE_STAGES
        early.stage_done(stage)
    assert early.proc is not None and early.wait()
    rp.write_report(early_dir, layers_picture=False)
    rp.write_report(late_dir)
    names = ("report.md", "report.html", "layers.svg", "layers.png")
    assert {p: (early_dir / p).read_bytes() for p in names} == {p: (late_dir / p).read_bytes() for p in names}
    # Nothing after the chart's stages (--until cross-compile), or not all of them built: the report draws it.
    assert not _EarlyPicture(early_dir, set(rp.LAYERS_PICTURE_STAGES)).wanted
    assert not _EarlyPicture(early_dir, set(STAGE_NAMES) - {"codegen"}).wanted


def test_a_failing_early_chart_is_drawn_once_more_at_most(tmp_path, monkeypatch):
    """When the forked draw fails, Background draws the chart once more in this process; when that fails too, the
    report does not try a third time: wait() says so (error), a chart left by an earlier build is removed, and the
    report is written without it."""
    from tinytrain.pipeline.runner import _EarlyPicture

    root, tries = tmp_path / "b", tmp_path / "tries"
    root.mkdir()
    (root / "layers.svg").write_text("<svg>an earlier build's</svg>")

    def broken(build_dir):
        with open(tries, "a") as f:     # a file: the forked try counts too
            f.write("try\n")
        raise RuntimeError("no room for the chart")
    monkeypatch.setattr(rp, "write_layers_picture", broken)
    early = _EarlyPicture(root, set(STAGE_NAMES))
    for stage in rp.LAYERS_PICTURE_STAGES:
        early.stage_done(stage)
    forked = early.proc is not None and early.proc._future is not None
    assert early.wait() and early.error == "RuntimeError: no room for the chart"
    assert tries.read_text().count("try") == (2 if forked else 1)
    assert not (root / "layers.svg").exists()
    text = rp.write_report(root, layers_picture=False).read_text()
    assert "layers.svg" not in text and tries.read_text().count("try") == (2 if forked else 1)


def test_report_of_a_partial_build_says_what_is_missing(tmp_path):
    root = tmp_path / "b"
    _w(root, "load/summary.json", {"ops": 3, "params": 10, "param_bytes": 40, "macs": 100, "dtype": "float",
                                   "inputs": [], "outputs": []})
    text = rp.write_report(root).read_text()
    assert "3 ops, 10 parameters" in text
    for stage in ("quantize", "sparse-plan", "autodiff", "reorder", "codegen", "cross-compile", "emulate-run"):
        assert f"_Not built: no artifacts in `{stage}/`" in text
    assert rp.summary_block(root) == []


def test_summary_block_reads_artifacts_and_names_them(tmp_path):
    root = full_build(tmp_path / "demo")
    lines = rp.summary_block(root)
    text = "\n".join(lines)
    assert lines[0] == "summary:"
    assert "accuracy (test split, 360 samples): 49.4% → 95.0%" in text
    assert "1.07M (≈4.9 ms @216 MHz; TTE MobileNetV2: 373 ms)" in text
    assert "SRAM 33.1 KB / 320.0 KB, flash 19.5 KB / 1024.0 KB on stm32f746-disco (fits)" in text
    assert "arena 13.6 KB (planned 13.6 KB), stack high-water 0.8 KB" in text
    assert "cache: 7 stage(s) restored, 1 ran" in text
    for line in lines[1:-1]:
        src = line.rsplit(None, 1)[-1]
        assert Path(src).is_file(), line
    assert str(root / "report.md") in lines[-1]


def test_rejected_gate_is_in_the_summary(tmp_path):
    root = full_build(tmp_path / "demo")
    doc = json.loads((root / "emulate-run/run.json").read_text())
    doc["gate"] = {"accepted": False, "reason": "rejected, the ORIGINAL weights are exported"}
    _w(root, "emulate-run/run.json", doc)
    assert "gate rejected the run, original weights exported" in "\n".join(rp.summary_block(root))
    assert "rejected, the ORIGINAL weights are exported" in rp.write_report(root).read_text()


@pytest.mark.parametrize("n,expected", [(999, "999"), (1_066_000, "1.07M"), (80_568_000, "80.6M"), (4.59e9, "4.59G")])
def test_count_format(n, expected):
    assert rp.count(n) == expected


def test_host_build_has_sram_per_layer_but_no_flash(tmp_path):
    root = full_build(tmp_path / "demo")
    size = json.loads((root / "cross-compile/size.json").read_text())
    _w(root, "cross-compile/size.json", {**size, "host": True})
    text = rp.write_report(root).read_text()
    t = rp.layer_table(rp.Artifacts(root))
    assert t.flash is None and t.sram["optimizer state"] == [0, 2222]
    assert "flash per layer: no linker map of a board build" in text and "Flash by part" not in text
    assert (root / "layers.svg").is_file()
