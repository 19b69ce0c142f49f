"""Progress from a running program: run_firmware turns its "@tt progress" lines into reports with the step,
the epoch and the running loss read from the loss file as it grows; a piped build shows them."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tinytrain.stages.device.boards import get_board
from tinytrain.stages.device.launch import LOSS_WINDOW, run_firmware

REPO = Path(__file__).resolve().parents[1]

# Stands in for the host firmware: 6 training steps over 2 epochs, each appending its loss to losses.bin
# before it prints its progress line (the order the generated tt_main uses).
PROGRAM = """\
#!{python}
import struct, sys
losses = {losses!r}
with open("losses.bin", "wb") as f:
    for step, loss in enumerate(losses, 1):
        f.write(struct.pack("<f", loss))
        f.flush()
        print(f"@tt progress {{step}}/{{len(losses)}} training steps", flush=True)
"""


# Batch 2: two losses (one per sample) before each step's progress line. The whole program may have run before its
# first line is read (a loaded machine): the running loss must still be the one of the step the line names.
BATCH_PROGRAM = """\
#!{python}
import struct
losses = {losses!r}
with open("losses.bin", "wb") as f:
    for i, loss in enumerate(losses):
        f.write(struct.pack("<f", loss))
    f.flush()
for step in range(1, len(losses) // 2 + 1):
    print(f"@tt progress {{step}}/{{len(losses) // 2}} training steps", flush=True)
"""


def test_running_loss_is_the_one_of_the_step_named_even_when_read_late(tmp_path):
    losses = [8.0, 6.0, 4.0, 2.0, 1.0, 1.0]
    program = tmp_path / "fw.py"
    program.write_text(BATCH_PROGRAM.format(python=sys.executable, losses=losses))
    program.chmod(0o755)
    reports = []
    run_firmware(get_board("host"), program, tmp_path / "run", {}, timeout_s=60, epochs=1, samples_per_step=2,
                 progress=lambda message, fraction=None, **figures: reports.append(figures))
    assert [r["done"] for r in reports] == [1, 2, 3]
    assert [r["loss"] for r in reports] == pytest.approx([7.0, 5.0, 22.0 / 6])


def test_run_firmware_reports_step_epoch_and_running_loss(tmp_path):
    losses = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    program = tmp_path / "fw.py"
    program.write_text(PROGRAM.format(python=sys.executable, losses=losses))
    program.chmod(0o755)
    reports = []
    result = run_firmware(get_board("host"), program, tmp_path / "run", {}, timeout_s=60, epochs=2,
                          progress=lambda message, fraction=None, **figures: reports.append((message, fraction, figures)))
    assert result.ok and struct.unpack("<6f", result.files["losses.bin"]) == tuple(losses)
    assert [r[0] for r in reports] == ["training steps"] * 6
    assert [r[1] for r in reports] == pytest.approx([i / 6 for i in range(1, 7)])
    assert [r[2]["done"] for r in reports] == [1, 2, 3, 4, 5, 6] and {r[2]["total"] for r in reports} == {6}
    assert [r[2]["epoch"] for r in reports] == [1, 1, 1, 2, 2, 2] and {r[2]["epochs"] for r in reports} == {2}
    # the mean of the values written so far (fewer than LOSS_WINDOW here)
    assert LOSS_WINDOW > len(losses)
    assert [r[2]["loss"] for r in reports] == pytest.approx([sum(losses[:i]) / i for i in range(1, 7)])


def test_without_epochs_or_a_loss_file_only_the_step_is_reported(tmp_path):
    program = tmp_path / "fw.py"
    program.write_text(PROGRAM.format(python=sys.executable, losses=[1.0, 2.0]))
    program.chmod(0o755)
    reports = []
    run_firmware(get_board("host"), program, tmp_path / "run", {}, timeout_s=60, losses_name=None,
                 progress=lambda message, fraction=None, **figures: reports.append(figures))
    assert reports == [{"done": 1, "total": 2}, {"done": 2, "total": 2}]


@pytest.mark.slow
def test_piped_example_build_prints_training_progress(tmp_path):
    """The real thing: the example, piped, prints emulate-run's progress with epoch and loss."""
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("needs qemu-system-arm and arm-none-eabi-gcc")
    exe = Path(sys.executable).with_name("tinytrain")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    shutil.copy(REPO / "tinytrain.yaml.example", tmp_path / "tinytrain.yaml.example")
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "digits_cnn_float.tflite", tmp_path / "tests" / "fixtures")
    proc = subprocess.run([str(exe), "build", "tinytrain.yaml.example", "--cache-dir", str(tmp_path / "cache"),
                           "--progress-every", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[emulate-run] ") and " elapsed: " in ln]
    steps = [ln for ln in lines if "training steps" in ln]
    assert steps, textwrap.shorten(proc.stdout, 2000)
    assert all(", epoch " in ln and ", loss " in ln for ln in steps[1:])
    assert steps[-1].split(" elapsed: ")[1].startswith("training steps ") and "epoch 3/3" in steps[-1]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("[sparse-plan] ") and "measuring" in ln]
