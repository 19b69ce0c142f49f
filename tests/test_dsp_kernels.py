"""target.kernels: dsp end to end, and run-to-run determinism (issue 5: DSP variants "that give identical results").

The digits example is built for stm32f746-disco (Cortex-M7, which has the DSP extension) once with the portable
kernels and once with the DSP ones; both train in QEMU. The DSP firmware really is another program (cross-compile
passes TT_USE_DSP, the conv / fully-connected inner products use SMLAD), yet losses.bin's losses, weights.bin and the
accuracies are identical byte for byte. Running the portable firmware again gives the same bytes and the same
instruction counts (QEMU -icount is deterministic). Nothing here pins a timing: only equalities.
Kernel-level DSP == portable on wider layers: tests/test_kernels_c.py (emulated intrinsics, sanitizers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.model.geometry import out_size_and_pad

REPO = Path(__file__).resolve().parents[1]

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")


def _spec(tmp: Path, kernels: str) -> Path:
    import yaml

    doc = yaml.safe_load((REPO / "tinytrain.yaml.example").read_text())
    doc["model"]["path"] = str(REPO / doc["model"]["path"])
    doc["target"]["board"] = "stm32f746-disco"
    doc["target"]["kernels"] = kernels
    doc["train"].update(epochs=1, max_train_samples=60)
    doc["build"] = {"out_dir": str(tmp / "build")}
    path = tmp / f"digits-{kernels}.yaml"
    doc["name"] = "digits"  # one build folder and one cache: the two variants share every stage before codegen
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _build(spec: Path, *extra: str) -> dict:
    from tinytrain.pipeline.cli import main

    assert main(["build", str(spec), *extra]) == 0
    b = spec.parent / "build" / "digits"
    run = json.loads((b / "emulate-run" / "run.json").read_text())
    return {"run": run, "weights": (b / "emulate-run" / "weights.bin").read_bytes(),
            "elf": (b / "cross-compile" / "firmware.elf").read_bytes(),
            "cflags": json.loads((b / "cross-compile" / "build.json").read_text())["cflags"]}


@needs_arm
def test_dsp_and_portable_firmware_train_bit_identically_and_deterministically(tmp_path, capsys):
    port = _build(_spec(tmp_path, "portable"))
    again = _build(_spec(tmp_path, "portable"), "--force", "emulate-run")
    dsp = _build(_spec(tmp_path, "dsp"))
    capsys.readouterr()

    # The DSP build is really another program, compiled with the switch the kernels read.
    assert "-DTT_USE_DSP=1" in dsp["cflags"] and "-DTT_USE_DSP=1" not in port["cflags"]
    assert dsp["elf"] != port["elf"]

    for other in (again, dsp):
        assert other["weights"] == port["weights"]
        assert other["run"]["loss"]["per_step"] == port["run"]["loss"]["per_step"]
        assert other["run"]["accuracy"] == port["run"]["accuracy"]
    # The same firmware twice: the same instruction counts (no timing is pinned, only the repeat).
    assert again["run"]["instructions"] == port["run"]["instructions"]
    assert port["run"]["loss"]["steps"] == 60


@needs_arm
def test_dsp_object_code_uses_simd_only_when_asked(tmp_path):
    """The inner products of the conv kernel compile to SMLAD under TT_USE_DSP for the M7, and not without it."""
    cc = "arm-none-eabi-gcc"
    base = [cc, "-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard", "-std=c99", "-O2",
            "-ffp-contract=off", f"-I{REPO / 'kernels_c'}", f"-I{ops_header.include_dir()}", "-S", "-o", "-", str(REPO / "kernels_c" / "ops" / "tt_conv2d.c")]
    plain = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    simd = subprocess.run(base + ["-DTT_USE_DSP=1"], capture_output=True, text=True, check=True).stdout
    assert "smlad" in simd and "smlad" not in plain


@pytest.mark.slow
@needs_arm
def test_mbv2_dsp_firmware_trains_bit_identically_to_portable(tmp_path, capsys):
    """MobileNetV2 (bench/mbv2_tte.yaml, a few steps) in QEMU with the portable and the DSP kernels: every int8
    kernel the network uses (1x1 / 3x3 conv, depthwise in place and row-streamed, the split-weight conv) takes its
    SIMD path in one build and not in the other, and the losses, accuracies and trained weights agree byte for byte
    (the host tests compare the same kernels on random shapes through emulated intrinsics; this is the target)."""
    import sys

    import yaml

    from tinytrain.pipeline.cli import main

    sys.path.insert(0, str(REPO / "bench"))
    try:
        from make_mbv2_data import make
    finally:
        sys.path.remove(str(REPO / "bench"))
    data = make(tmp_path / "mbv2_synth.npz")
    runs = {}
    for kernels in ("portable", "dsp"):
        doc = yaml.safe_load((REPO / "bench" / "mbv2_tte.yaml").read_text())
        doc["data"]["path"] = str(data)
        doc["train"].update(epochs=1, max_train_samples=3)
        doc["target"]["kernels"] = kernels
        doc["build"] = {"out_dir": str(tmp_path / kernels), "cache_dir": str(tmp_path / "cache")}
        spec = tmp_path / f"mbv2-{kernels}.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert main(["build", str(spec)]) == 0, capsys.readouterr().out[-3000:]
        b = tmp_path / kernels / "mbv2_tte"
        runs[kernels] = (json.loads((b / "emulate-run" / "run.json").read_text()),
                         (b / "emulate-run" / "weights.bin").read_bytes())
    capsys.readouterr()
    (port, port_w), (dsp, dsp_w) = runs["portable"], runs["dsp"]
    assert dsp_w == port_w
    assert dsp["loss"]["per_step"] == port["loss"]["per_step"] and port["loss"]["steps"] == 3
    assert dsp["accuracy"] == port["accuracy"]
    # Another program: the DSP one runs fewer instructions (no figure pinned, only the inequality).
    assert dsp["instructions"]["per_step_mean"] < port["instructions"]["per_step_mean"]


def _random_layers(seed: int):
    """Random int8 conv / depthwise geometries covering the DSP kernels' paths: 1x1 blocks of four output channels
    and their remainders, the split weight, the 3x3 stem-like conv, 3x3 depthwise at stride 1 and 2 over rows wider
    than one ring strip (32 outputs), odd widths, in place, row by row (a row stream's calls), batches, a clamp
    narrower than int8 and biases too large for the one-SMMLAR requantisation; two fixed 1x1 layers whose input
    channels come in whole words, four more for the two-pixel pass's word and pixel counts, one of eight input
    channels, two split ones merged on the stack and two stem-like 3x3 layers."""
    import numpy as np

    Layer = _kernels_m7().Layer

    rng = np.random.default_rng(seed)
    out = []
    for i in range(14):
        kind = ["conv", "split", "dw", "dw_inplace"][i % 4]
        act = (-128, 127) if i % 3 else (-100, 90)
        bias_bits = 31 if i % 5 == 4 else 14
        b = 2 if i % 7 == 3 else 1
        h, w = int(rng.integers(3, 12)), int(rng.choice([5, 9, 33, 40, 67]))
        if kind in ("conv", "split"):
            k = 1 if kind == "split" or rng.random() < 0.6 else 3
            s = 1 if k == 1 else int(rng.integers(1, 3))
            ic = int(rng.integers(3, 40)) if k == 1 else 3
            oc = int(rng.integers(1, 14))
        else:
            k, s = 3, int(rng.integers(1, 3))
            ic = oc = int(rng.integers(1, 20))
        oh, pt = out_size_and_pad("same", h, k, s)
        ow, pl = out_size_and_pad("same", w, k, s)
        rows = kind in ("conv", "dw") and i % 2 == 0 and b == 1
        n = int(rng.integers(1, ic)) if kind == "split" else 0
        dims = (b, h, w, ic, oh, ow, oc, k, k, s, s, 1, 1, pt, pl, 1)
        out.append(Layer(kind, dims, rows, n, act, bias_bits))
    # 1x1 with whole words of input channels and the int8 range: the written-out pixel loop (a last block of 2)
    out.append(Layer("conv", (1, 5, 9, 16, 5, 9, 14, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 4, 33, 8, 4, 33, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), True))
    # the two-pixel x two-channel pass: odd and even word counts (C = 4, 12, 20, 24), odd and even pixel runs, a
    # single pixel, batches
    out.append(Layer("conv", (1, 3, 7, 4, 3, 7, 6, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (2, 2, 5, 12, 2, 5, 9, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 3, 1, 20, 3, 1, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 2, 6, 24, 2, 6, 12, 1, 1, 1, 1, 1, 1, 0, 0, 1), True))
    # eight input channels (one channel at a time over the pixels): runs of one pixel, batches, a last block of 3
    out.append(Layer("conv", (2, 3, 1, 8, 3, 1, 11, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    # eight input channels, pixel outside and channels inside: chunks of 24 channels and an odd last chunk, row by
    # row, a batch; and a clamp narrower than int8 (the per-block path)
    out.append(Layer("conv", (1, 3, 5, 8, 3, 5, 37, 1, 1, 1, 1, 1, 1, 0, 0, 1), True))
    out.append(Layer("conv", (2, 2, 3, 8, 2, 3, 20, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 2, 7, 8, 2, 7, 9, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 0, (-100, 90)))
    # split weights merged on the stack for the two-pixel pass (up to 64 input channels), odd pixel runs
    out.append(Layer("split", (1, 3, 5, 24, 3, 5, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 5))
    out.append(Layer("split", (2, 2, 3, 64, 2, 3, 6, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 13))
    # the widened-weight pass at its largest one-part input depth (192), in two parts (196; 260 over more pixels than
    # one group; a split one whose trained channels reach into the second part), past its largest (388: the
    # two-pixel pass), and a split one whose trained channels end inside a word
    out.append(Layer("conv", (1, 2, 5, 192, 2, 5, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 2, 3, 196, 2, 3, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("conv", (1, 3, 7, 260, 3, 7, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    out.append(Layer("split", (1, 2, 9, 200, 2, 9, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 150))
    out.append(Layer("conv", (1, 1, 3, 388, 1, 3, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False))
    # biases too large for the one-SMMLAR form on a whole 1x1 conv (its weight sums then computed after all), a
    # split one too
    out.append(Layer("conv", (1, 3, 5, 16, 3, 5, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 0, (-128, 127), 31))
    out.append(Layer("split", (1, 2, 5, 20, 2, 5, 4, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 6, (-128, 127), 31))
    out.append(Layer("split", (1, 3, 3, 36, 3, 3, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 17))
    # more pixels than input channels: the table's lanes and biases doubled (tt_pw4w_run2), a split one too
    out.append(Layer("split", (1, 4, 9, 12, 4, 9, 8, 1, 1, 1, 1, 1, 1, 0, 0, 1), False, 5))
    # a stem-like 3x3 over 3 channels at stride 2 (its interior through the im2col buffer), whole and row by row
    out.append(Layer("conv", (1, 9, 21, 3, 5, 11, 8, 3, 3, 2, 2, 1, 1, 0, 0, 1), True))
    out.append(Layer("conv", (2, 9, 21, 3, 5, 11, 12, 3, 3, 2, 2, 1, 1, 1, 1, 1), False))
    return out


def _kernels_m7():
    """bench/kernels_m7.py, imported without leaving bench/ on sys.path (its coverage.py would hide the package)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import kernels_m7
    finally:
        sys.path.remove(str(REPO / "bench"))
    return kernels_m7


@needs_arm
def test_dsp_kernels_in_qemu_give_the_portable_bits_on_random_shapes(tmp_path):
    """The DSP conv / depthwise kernels (SMLAD loops, the int16-row depthwise, the one-SMMLAR requantisation) run on
    the Cortex-M7 board in QEMU over random geometries and give the portable kernels' bytes; the DSP firmware runs
    fewer instructions in total (an inequality on QEMU's deterministic counts, no timing)."""
    run = _kernels_m7().run

    layers = _random_layers(14)
    port_counts, port = run(layers, "portable", tmp_path)
    dsp_counts, dsp = run(layers, "dsp", tmp_path)
    assert len(port) == len(dsp) > 0 and len(port_counts) == len(dsp_counts) == len(layers)
    assert dsp == port
    assert sum(dsp_counts) < sum(port_counts)
    # The hand-written loops keep the linked code's stack depth boundable (an SP-based STM once made stack_bound
    # give up, and a MobileNetV2 DSP build then fell back to the board's 16 KB stack).
    from tinytrain.stages.device.stack_bound import stack_bound

    assert stack_bound(tmp_path / "build-dsp" / "firmware.elf").bytes < 4096


@needs_arm
def test_small_window_convs_and_channel_group_depthwise_in_qemu_give_the_portable_bits(tmp_path):
    """The DSP build's row-im2col conv (a window of at most 32 bytes, whole blocks of four output channels: the stem;
    border outputs padded with z_x) and the four-channel depthwise (in_c % 4 == 0), on the Cortex-M7 board in QEMU:
    padding on every side, strides 1 and 2, 1x3 / 3x1 / 2x2 windows, batches, whole and row by row, in place, wide
    rows and more than sixteen output channels; the portable kernels' bytes."""
    km = _kernels_m7()
    Layer = km.Layer
    layers = []
    for b, h, w, ic, oc, kh, kw, s, rows in ((1, 9, 21, 3, 16, 3, 3, 2, True), (2, 7, 13, 3, 8, 3, 3, 1, False),
                                             (1, 6, 40, 2, 24, 3, 3, 2, True), (1, 5, 9, 4, 4, 1, 3, 1, False),
                                             (1, 8, 11, 1, 12, 3, 1, 2, False), (1, 6, 7, 6, 36, 2, 2, 1, True)):
        oh, pt = out_size_and_pad("same", h, kh, s)
        ow, pl = out_size_and_pad("same", w, kw, s)
        layers.append(Layer("conv", (b, h, w, ic, oh, ow, oc, kh, kw, s, s, 1, 1, pt, pl, 1), rows))
    for kind, b, h, w, c, s, rows in (("dw", 1, 5, 70, 8, 1, True), ("dw", 1, 6, 67, 12, 2, True),
                                      ("dw", 2, 9, 9, 16, 1, False), ("dw_inplace", 2, 10, 20, 8, 1, False),
                                      ("dw_inplace", 1, 12, 40, 4, 2, False), ("dw_inplace", 1, 5, 5, 20, 2, False)):
        oh, pt = out_size_and_pad("same", h, 3, s)
        ow, pl = out_size_and_pad("same", w, 3, s)
        layers.append(Layer(kind, (b, h, w, c, oh, ow, c, 3, 3, s, s, 1, 1, pt, pl, 1), rows))
    layers.append(Layer("conv", (1, 9, 21, 3, 5, 11, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1), False, act=(-100, 90)))
    layers.append(Layer("conv", (1, 9, 21, 3, 5, 11, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1), False, bias_bits=31))
    _, port = km.run(layers, "portable", tmp_path)
    _, dsp = km.run(layers, "dsp", tmp_path)
    assert len(port) == len(dsp) > 0
    assert dsp == port
