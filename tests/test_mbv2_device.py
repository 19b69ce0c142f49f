"""MobileNetV2-w0.35 @128 with the TTE-like sparse scheme on the STM32F746 (issue 5's device benchmark).

bench/mbv2_tte.yaml builds the zoo model for stm32f746-disco and fine-tunes it in QEMU on bench/make_mbv2_data.py's
shifted variant of the synthetic task the zoo model was pretrained on (tests/make_zoo.py); bench/instructions_mbv2.py
prints the instructions per step next to TTE's 373 ms and whether it learned. The fast tests check the spec names
the same layers as bench/memory_mbv2.py's scheme, that the data script is deterministic and small, that the zoo
model is alive (no layer stuck at its zero point, every trained parameter gets a non-zero gradient) and that the
same firmware learns on the host board; the slow one builds and runs it in QEMU twice (fit, arena high-water ==
plan, the loss goes down, weights change, deterministic instruction counts).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SPEC = BENCH / "mbv2_tte.yaml"
KB = 1024


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_spec_trains_the_layers_of_the_memory_benchmark():
    """The device spec's manual plan is bench/memory_mbv2.py's TTE-like scheme, layer for layer."""
    from tinytrain.pipeline.spec import load_spec
    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model

    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    plan, _ = _bench("memory_mbv2").tte_like_plan(g)
    want = {lp.layer: (lp.bias, lp.weight_ratio) for lp in plan.layers}
    spec = load_spec(SPEC)  # validated: "1/8" is 0.125
    assert spec.train.update.scheme == "manual"
    got = {int(k.lstrip("#")): (v.bias, float(v.weight_ratio)) for k, v in spec.train.update.layers.items()}
    assert got == want
    assert spec.target.board == "stm32f746-disco" and spec.train.batch_size == 1


def test_synthetic_data_is_deterministic_and_small(tmp_path):
    make = _bench("make_mbv2_data").make
    a, b = make(tmp_path / "a.npz"), make(tmp_path / "b.npz")
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size < 4 * KB * KB
    import numpy as np

    with np.load(a) as z:
        assert z["x_train"].shape[1:] == (128, 128, 3) and z["x_train"].dtype == np.uint8
        assert sorted(set(z["y_train"].tolist())) == list(range(10)) and len(z["y_test"]) >= 10
        # The first max_train_samples samples (what the device trains on) cover every class.
        n = yaml.safe_load(SPEC.read_text())["train"]["max_train_samples"]
        assert sorted(set(z["y_train"][:n].tolist())) == list(range(10))


def _zoo_graph():
    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model

    return read_model(zoo.resolve("zoo:mbv2-w0.35-128"))


def test_zoo_model_is_pretrained_and_no_layer_is_dead():
    """A seeded random MobileNetV2 is dead (Conv_1 at its zero point for every input); the zoo's is pretrained:
    every layer's output varies with the input, and the late layers the device trains keep live channels."""
    import numpy as np

    info = json.loads((REPO / "stages" / "model" / "zoo_models" / "mbv2_w035_128.json").read_text())
    assert (REPO / "stages" / "model" / "zoo_models" / "mbv2_w035_128_int8.tflite").stat().st_size < 700 * KB  # wheel size
    assert info["accuracy"]["source_heldout_int8"] >= 0.9          # it learned its pretraining task
    assert info["accuracy"]["shifted_int8"] < info["accuracy"]["source_heldout_int8"] - 0.1  # the shift hurts
    g = _zoo_graph()
    synth = _bench("synth_images")
    x = synth.images(np.arange(10), np.random.default_rng(0), "shifted")
    rows = _bench("activation_stats").layer_stats(g, x)
    assert len(rows) == len(g.ops)
    for r in rows:
        assert r["batch_spread"] > 0, r                    # the output depends on the input
        assert r["at_zero"] < 0.95, r                      # not stuck at the zero point
    conv1 = next(r for r in rows if r["name"].startswith("out_relu"))
    assert conv1["dead_channels"] < 0.5, conv1


def test_trained_layers_get_nonzero_gradients():
    """The int8 training graph of the TTE-like scheme (numpy golden model) gives every trained parameter a
    non-zero gradient on the fine-tuning data: training can move them."""
    import numpy as np

    from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
    from tinytrain.stages.golden.train_step import init_state, run_sample

    g = _zoo_graph()
    plan, _ = _bench("memory_mbv2").tte_like_plan(g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec("sgd"), 1, QASOptions())
    trained = tg.meta["train"]["trained"]
    assert len(trained) == 22 + 6
    z = _bench("make_mbv2_data").arrays()
    x = _bench("synth_images").to_model_input(z["x_train"][:2])
    state = init_state(tg)
    grads = {p: np.zeros(tg.tensors[d["gradient"]].shape, np.float64) for p, d in trained.items()}
    for i in range(2):
        v = run_sample(tg, state, x[i:i + 1], z["y_train"][i:i + 1])
        assert v[tg.meta["train"]["loss_tensor"]] > 0
        for p, d in trained.items():
            grads[p] += np.abs(v[d["gradient"]])
    dead = [p for p, gr in grads.items() if not gr.any()]
    assert not dead, f"zero gradient for {dead}"


# The whole SRAM of the QEMU build (tests/test_mbv2_device.py's slow test): 121,808 B = arena 119,648 + the stack
# (stages/device/stack_bound.py) + other .data/.bss (the driver's result buffers borrow the arena's input slot,
# now the stem's 3-row window of the image). It
# was 149,200 B with a fixed 4 KB stack and 1,216 B of static driver buffers, then 145,712 B with a 1,824 B stack:
# the faster 3x3 depthwise (issue 14) keeps a chunk of raw sums on the stack (tt_dw3x3_run's acc[], +104 B deepest),
# 145,816 B; then blocks 10-13's backward one hidden channel at a time (stages/planning/channel_stream.py): the
# arena 143,680 -> 131,776 B (whole 133,912 B), the forward's stem holding the whole image now its peak; then the image
# fed to the stem row by row (stages/planning/streams.py fed_inputs): arena 119,632 B, the peak in the backward;
# with H padding in row streams and their sum-of-squares tie-break (issue 10's coverage), 119,648 B.
MBV2_WHOLE_SRAM = 121808


def _spec_in(tmp: Path, board: str | None = None) -> Path:
    """bench/mbv2_tte.yaml with its data, build folder and cache in `tmp` (no side effects on the repository),
    optionally for another board."""
    doc = yaml.safe_load(SPEC.read_text())
    data = _bench("make_mbv2_data").make(tmp / "mbv2_synth.npz")
    doc["data"]["path"] = str(data)
    doc["build"] = {"out_dir": str(tmp / "build"), "cache_dir": str(tmp / "cache")}
    if board:
        doc["target"]["board"] = board
    path = tmp / "mbv2_tte.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _assert_learns(run: dict) -> None:
    """The fine-tuning learns: the epoch-mean loss (same samples each epoch) and the mean of the last quarter of the
    steps are below those of the first, test accuracy does not drop, and the firmware's weights changed."""
    spec = yaml.safe_load(SPEC.read_text())["train"]
    ln = _bench("instructions_mbv2").learning(run)
    assert run["loss"]["steps"] == spec["max_train_samples"] * spec["epochs"]
    assert len(ln["loss_epoch_mean"]) == spec["epochs"] >= 2
    assert ln["loss_epoch_mean"][-1] < 0.8 * ln["loss_epoch_mean"][0], ln
    # Single steps at batch 1 are noisy (a confidently wrong sample costs ~10): the epoch means fell with each of
    # four data seeds tried, the first-vs-last-quarter means with three of them; this is the shipped seed's.
    assert ln["loss_mean_last"] < 0.8 * ln["loss_mean_first"], ln
    assert ln["accuracy_after_pct"] >= ln["accuracy_before_pct"] + 5, ln   # 50 test samples: +5 points = 3 more right
    assert 40 <= ln["accuracy_before_pct"] <= 80, ln                      # the shift leaves something to learn
    # weights.bin holds the trained tensors as the firmware wrote them; elements_changed compares it with the
    # model's original values. Biases move in every trained layer; so do the fully trained expand weights.
    changed = {t["name"]: t["elements_changed"] for t in run["export"]["tensors"]}
    assert len(changed) == 22 + 6 and sum(v > 0 for v in changed.values()) >= 22, changed


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_mbv2_learns_on_the_host_board(tmp_path, capsys):
    """The same firmware built natively (board `host`, ~15 s): the zoo model fine-tunes on the shifted data."""
    from tinytrain.pipeline.cli import main

    spec = _spec_in(tmp_path, board="host")
    assert main(["build", str(spec), "--json"]) == 0, capsys.readouterr().out[-3000:]
    build = tmp_path / "build" / "mbv2_tte"
    run = json.loads((build / "emulate-run" / "run.json").read_text())
    _assert_learns(run)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_mbv2_builds_fits_trains_in_qemu_and_counts_deterministically(tmp_path, capsys):
    from tinytrain.pipeline.cli import main

    spec = _spec_in(tmp_path)
    assert main(["build", str(spec), "--json"]) == 0, capsys.readouterr().out[-3000:]
    capsys.readouterr()
    build = tmp_path / "build" / "mbv2_tte"
    r = _bench("instructions_mbv2").measure(build)
    # Fits the board: static SRAM + the stack (whose measured high-water is well inside it) <= 320 KB, flash <= 1 MB.
    assert r["fits"] and r["sram"]["used_bytes"] <= 320 * KB and r["flash"]["used_bytes"] <= 1024 * KB
    assert r["sram"]["static_bytes"] + r["sram"]["stack_bytes"] <= 320 * KB
    assert 0 < r["sram"]["stack_high_water_bytes"] <= r["sram"]["stack_bytes"]
    # Whole SRAM (arena + stack + .data/.bss): the stack is the linked code's worst-case depth (1928 B with
    # arm-none-eabi-gcc 12.2; measured high-water 1700 B), no static buffer outside the arena is over 96 B.
    whole = _bench("memory_mbv2").whole_sram(build)
    size = json.loads((build / "cross-compile" / "size.json").read_text())
    assert whole["whole_bytes"] == r["sram"]["used_bytes"] <= MBV2_WHOLE_SRAM <= 120 * KB   # issue 10's goal
    assert whole["stack_bytes"] == size["stack_bound"]["bytes"] < 4 * KB
    # the arena's size is its planned end rounded up to the 16-byte alignment; the paint measures the end itself
    assert whole["arena_bytes"] == r["arena"]["planned_peak_bytes"]
    assert whole["arena_measured_bytes"] == r["arena"]["planned_end_bytes"] > whole["arena_bytes"] - 16
    assert max(y["size"] for y in whole["other_static_largest"]) <= 96
    # The painted arena's high-water is the plan's, exactly; codegen keeps nothing trained outside the arena.
    assert r["arena"]["equal"] and r["arena"]["used_bytes"] == r["arena"]["planned_end_bytes"]
    cg = json.loads((build / "codegen" / "codegen.json").read_text())
    assert cg["sram_outside_arena_bytes"] == 0 and len(cg["split_weights"]) == 2  # the 1/8 and 1/4 layers
    assert r["steps"] == 40 and r["instructions_per_step"]["min"] > 0
    first = json.loads((build / "emulate-run" / "run.json").read_text())
    _assert_learns(first)
    text = _bench("instructions_mbv2").report(r)
    assert "373 ms" in text and "216 MHz" in text and "1 instruction ≈ 1 cycle" in text

    assert "test accuracy (50 samples)" in text and "loss  per epoch (mean)" in text

    # The same firmware and input give the same counts: run the emulator again.
    assert main(["build", str(spec), "--json", "--force", "emulate-run"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ran"] == ["emulate-run"], [(s["stage"], s["state"], s["reason"]) for s in res["stages"]]
    second = json.loads((build / "emulate-run" / "run.json").read_text())
    assert second["instructions"] == first["instructions"]
    assert second["loss"] == first["loss"] and second["arena"] == first["arena"]
