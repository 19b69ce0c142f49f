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
