"""The Cortex-M55 board (mps3-an547, issue 13 item 4): the example trains on it in QEMU with the same bits as on
the host, and `target.kernels: mve` (Helium int8 dot products, kernels_c/tt_dot_mve.h) gives the same bits as
the portable kernels.

Board-level checks (self-test, calibration, MPU faults) are in tests/test_boards.py, parametrized over every board.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tinytrain.stages.c_emit import ops_header

REPO = Path(__file__).resolve().parents[1]
BOARD = "mps3-an547"

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")


def _spec(tmp: Path, name: str, board: str, kernels: str = "portable") -> Path:
    import yaml

    doc = yaml.safe_load((REPO / "tinytrain.yaml.example").read_text())
    doc["model"]["path"] = str(REPO / doc["model"]["path"])
    doc["target"].update(board=board, kernels=kernels)
    # One budget for both boards, so that sparse-plan picks the same update plan (host has no SRAM limit).
    doc["train"]["update"]["budget_kb"] = 200
    doc["train"].update(epochs=1, max_train_samples=60)
    doc["build"] = {"out_dir": str(tmp / "build")}
    doc["name"] = name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _build(spec: Path, name: str) -> dict:
    from tinytrain.pipeline.cli import main

    assert main(["build", str(spec)]) == 0
    b = spec.parent / "build" / name
    return {"run": json.loads((b / "emulate-run" / "run.json").read_text()),
            "weights": (b / "emulate-run" / "weights.bin").read_bytes(),
            "cflags": json.loads((b / "cross-compile" / "build.json").read_text())["cflags"],
            "elf": (b / "cross-compile" / "firmware.elf").read_bytes()}


@needs_arm
@pytest.mark.slow
def test_example_trains_on_the_m55_bit_identical_to_host(tmp_path, capsys):
    host = _build(_spec(tmp_path, "host", "host"), "host")
    m55 = _build(_spec(tmp_path, "m55", BOARD), "m55")
    capsys.readouterr()
    assert "-mcpu=cortex-m55+nomve.fp" in m55["cflags"]
    assert m55["weights"] == host["weights"]
    assert m55["run"]["loss"]["per_step"] == host["run"]["loss"]["per_step"]
    assert m55["run"]["accuracy"] == host["run"]["accuracy"]
    assert m55["run"]["loss"]["steps"] == 60
    assert m55["run"]["instructions"]["counted"] and m55["run"]["instructions"]["per_step_mean"] > 0
    est = m55["run"]["cycles_estimate"]    # the AN547 image's 32 MHz core clock: a time per step
    assert est["clock_hz"] == 32_000_000
    assert est["ms_per_step"] == pytest.approx(m55["run"]["instructions"]["per_step_mean"] / 32e3)


def test_the_m55_has_its_fpga_images_clock():
    """The MPS3 AN547 runs its SSE-300 and Cortex-M55 at the FPGA image's 32 MHz main clock (QEMU's mps2-tz.c
    sysclk_frq; Arm's AN547 application note), the clock its SysTick and cycle / ms figures use."""
    from tinytrain.stages.device.boards import BOARDS, get_board
    from tinytrain.stages.emulate_run import BOARD_CLOCK_HZ

    assert BOARD_CLOCK_HZ[BOARD] == 32_000_000 and get_board(BOARD).sysclk_hz == 32_000_000
    assert {b.name for b in BOARDS.values() if not b.host} <= set(BOARD_CLOCK_HZ)


# ---- Helium dot products against the reference loops and numpy ------------------------------------------------------

DOTS = r"""
#include <stdint.h>
#include "tt_dot.h"
#include "tt_platform.h"

#ifndef TT_DOT_MVE
#define TT_DOT_MVE 0 /* host, or a build without TT_USE_MVE: both columns are the reference loop */
#endif

static uint8_t buf[64 * 1024];
static int32_t out[16 * 256];

static int32_t rd32(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); }

int tt_main(void) {
    long size = tt_read_file("cases.bin", buf, sizeof buf);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf), k = 0;
    const uint8_t *p = buf + 4;
    uint64_t t_fast = 0, t_ref = 0;
    for (int32_t c = 0; c < cases; ++c) {
        int32_t n = rd32(p), z = rd32(p + 4), start = rd32(p + 8);
        const int8_t *x = (const int8_t *)(p + 12), *w = x + n;
        int32_t a[4] = {start, -start, start, 1}, r[4] = {start, -start, start, 1};
        uint64_t t0 = tt_instructions();
        out[k] = tt_dot_s8(x, w, n, z);
        tt_dot4_raw_s8(x, w, n, n, a);
        out[k + 2] = tt_dot1_raw_s8(x, w + 3 * n, n);
        uint64_t t1 = tt_instructions();
        out[k + 1] = (tt_dot_s8)(x, w, n, z);
        (tt_dot4_raw_s8)(x, w, n, n, r);
        out[k + 3] = (tt_dot1_raw_s8)(x, w + 3 * n, n);
        uint64_t t2 = tt_instructions();
        t_fast += t1 - t0;
        t_ref += t2 - t1;
        for (int j = 0; j < 4; ++j) {
            out[k + 4 + j] = a[j];
            out[k + 8 + j] = r[j];
        }
        k += 12;
        p += 12 + 5 * n;
    }
    tt_log("mve=%d instructions fast=%llu reference=%llu\n", TT_DOT_MVE, (unsigned long long)t_fast,
           (unsigned long long)t_ref);
    return tt_write_file("out.bin", out, (size_t)k * 4) == 0 ? 0 : 1;
}
"""


def _dot_cases(seed: int = 5):
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = [0, 1, 2, 15, 16, 17, 31, 32, 33, 48, 64, 100, 255, 256, 257, 300]
    sizes += [int(s) for s in rng.integers(1, 400, 40)]
    cases, blob = [], [np.int32(len(sizes)).tobytes()]
    for i, n in enumerate(sizes):
        lo_hi = (i % 3 == 0)  # every third case at the int8 extremes only: the largest products
        x = rng.choice(np.array([-128, 127], np.int8), n) if lo_hi else rng.integers(-128, 128, n).astype(np.int8)
        w = rng.choice(np.array([-128, 127], np.int8), (4, n)) if lo_hi else rng.integers(-128, 128, (4, n)).astype(np.int8)
        z, start = int(rng.integers(-128, 128)), int(rng.integers(-1000, 1000))
        blob += [np.array([n, z, start], "<i4").tobytes(), x.tobytes(), w.tobytes()]
        cases.append((x.astype(np.int64), w.astype(np.int64), z, start))
    return cases, b"".join(blob)


def _check_dots(out: bytes, cases) -> None:
    import numpy as np

    got = np.frombuffer(out, "<i4").reshape(len(cases), 12).astype(np.int64)
    for (x, w, z, start), row in zip(cases, got):
        n = len(x)
        dot = int(((x - z) * w[0]).sum())
        raw = [int((x * w[j]).sum()) for j in range(4)] if n else [0] * 4
        want4 = [start + raw[0], -start + raw[1], start + raw[2], 1 + raw[3]]
        assert row[0] == row[1] == dot, n
        assert row[2] == row[3] == raw[3], n
        assert list(row[4:8]) == list(row[8:12]) == want4, n


def _run_dots(board: str, tmp: Path, sanitize: tuple[str, ...] = ()):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "dots.c").write_text(DOTS)
    cases, blob = _dot_cases()
    b = get_board(board)
    built = build_firmware(b, prog, tmp / f"build-{board}", kernels=[], defines={"TT_USE_MVE": "1"}, sanitize=sanitize)
    ran = run_firmware(b, built.elf, tmp / f"run-{board}", {"cases.bin": blob}, timeout_s=60)
    _check_dots(ran.files["out.bin"], cases)
    return ran


@needs_arm
def test_mve_dot_products_equal_the_reference_loops_and_numpy_in_qemu(tmp_path):
    ran = _run_dots(BOARD, tmp_path)
    assert "mve=1" in ran.console  # the Helium path really ran (the reference loops are the other column)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")
def test_dot_products_on_host_under_sanitizers(tmp_path):
    ran = _run_dots("host", tmp_path, sanitize=("address", "undefined"))
    assert "mve=0" in ran.console and "runtime error" not in ran.log


# ---- target.kernels: mve, end to end ---------------------------------------------------------------------------------

def test_mve_kernels_are_refused_on_a_board_without_helium():
    from pydantic import ValidationError

    from tinytrain.pipeline.spec import TargetSpec

    assert TargetSpec(board=BOARD, kernels="mve").kernels == "mve"
    for board in ("host", "stm32f746-disco", "m4-128k"):
        with pytest.raises(ValidationError, match=f"kernels mve needs a board with Helium \\(MVE\\); {board}"):
            TargetSpec(board=board, kernels="mve")


def test_mve_refusal_is_one_line_and_exit_2(tmp_path, capsys):
    from tinytrain.pipeline.cli import main

    spec = _spec(tmp_path, "bad", "stm32f746-disco", "mve")
    assert main(["status", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "kernels mve needs a board with Helium (MVE)" in err
    assert "mps3-an547" in err and "Traceback" not in err


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "fp16-mixed"])
def test_example_with_mve_kernels_trains_bit_identically_to_portable(precision, tmp_path, capsys):
    """int8: the Helium dot products; fp16-mixed: the Helium fp16 casts and Inf/NaN scans (tt_f16_mve.h)."""
    import yaml

    def spec(kernels: str) -> Path:  # both are digits.yaml: one build folder, shared stages before cross-compile
        path = _spec(tmp_path, "digits", BOARD, kernels)
        doc = yaml.safe_load(path.read_text())
        doc["train"]["precision"] = precision
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    port = _build(spec("portable"), "digits")
    mve = _build(spec("mve"), "digits")
    capsys.readouterr()
    assert "-DTT_USE_MVE=1" in mve["cflags"] and "-DTT_USE_MVE=1" not in port["cflags"]
    assert mve["elf"] != port["elf"]
    assert mve["weights"] == port["weights"]
    assert mve["run"]["loss"]["per_step"] == port["run"]["loss"]["per_step"]
    assert mve["run"]["accuracy"] == port["run"]["accuracy"]
    assert mve["run"].get("loss_scale") == port["run"].get("loss_scale")  # fp16-mixed: the same scale and skips


# ---- why the board compiles without MVE floating point -------------------------------------------------------------

FLUSH = r"""
#include <arm_mve.h>
#include "tt_platform.h"
int tt_main(void) {
    volatile float a = 1e-20f, b = 1e-20f;  /* a * b = 1e-40: a subnormal float */
    float scalar = a * b;
    float vector = vgetq_lane_f32(vmulq_f32(vdupq_n_f32(a), vdupq_n_f32(b)), 0);
    tt_log("scalar %08lx vector %08lx\n", (unsigned long)tt_f32_bits(scalar), (unsigned long)tt_f32_bits(vector));
    return 0;
}
"""


@needs_arm
def test_mve_float_flushes_subnormals_so_the_board_leaves_it_out(tmp_path):
    """MVE's float vector instructions flush subnormals to zero (the scalar FPU and the host do not), so the board's
    flags (+nomve.fp) keep gcc from auto-vectorizing float loops with them; shown here with them forced back on."""
    import re
    import subprocess

    import numpy as np

    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    board = get_board(BOARD)
    assert "-mcpu=cortex-m55+nomve.fp" in board.cflags
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "flush.c").write_text(FLUSH)
    built = build_firmware(board, prog, tmp_path / "b", kernels=[], extra_cflags=["-mcpu=cortex-m55"])
    ran = run_firmware(board, built.elf, tmp_path / "r", {}, timeout_s=30)
    scalar, vector = (int(v, 16) for v in re.search(r"scalar (\w+) vector (\w+)", ran.console).groups())
    assert scalar == int((np.float32(1e-20) * np.float32(1e-20)).view(np.uint32)) != 0 and vector == 0
    # With the board's own flags, no kernel compiles to a float vector instruction.
    conv = subprocess.run(["arm-none-eabi-gcc", *board.cflags, "-std=c99", "-O2", "-ffp-contract=off",
                           f"-I{REPO / 'kernels_c'}", f"-I{ops_header.include_dir()}", "-S", "-o", "-",
                           str(REPO / "kernels_c" / "ops" / "tt_conv2d.c")],
                          capture_output=True, text=True, check=True).stdout
    assert not re.search(r"\sv\w+\.f(16|32)\s+q\d", conv)
    with_fp = subprocess.run(["arm-none-eabi-gcc", "-mthumb", "-mcpu=cortex-m55", "-mfloat-abi=hard", "-std=c99", "-O2",
                              "-ffp-contract=off", f"-I{REPO / 'kernels_c'}", f"-I{ops_header.include_dir()}", "-S", "-o", "-",
                              str(REPO / "kernels_c" / "ops" / "tt_conv2d.c")], capture_output=True, text=True,
                             check=True).stdout
    assert re.search(r"\sv\w+\.f32\s+q\d", with_fp)  # what the flag prevents


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["convnet_float", "dwsep_float"])
def test_fp32_training_on_the_m55_is_bit_identical_to_host(fixture, tmp_path):
    """fp32 models (the float conv / depthwise kernels and their backward) train on the M55 with the host's bits."""
    import numpy as np

    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware
    from tinytrain.stages.model.tflite_reader import read_model
    from tinytrain.stages.planning.train_plan import TrainPlan
    from tinytrain.stages.reorder import plan_schedules
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    g = read_model(REPO / "tests" / "fixtures" / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind="sgd", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    meta = tg.meta["train"]
    x_t = tg.tensors[[t for t in tg.inputs if t != meta["label_input"]][0]]
    rng = np.random.default_rng(11)
    x = rng.standard_normal([8] + list(x_t.shape[1:])).astype(np.float32)
    y = rng.integers(0, tg.tensors[meta["prediction"]].shape[-1], 8)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    out = {}
    for board in ("host", BOARD):
        b = get_board(board)
        built = build_firmware(b, tmp_path / "prog", tmp_path / f"b-{board}")
        files = {"runtime.bin": RuntimeConfig(learning_rate=0.05, epochs=1).to_bytes(),
                 "train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}
        ran = run_firmware(b, built.elf, tmp_path / f"r-{board}", files, 120)
        out[board] = (ran.files["losses.bin"], ran.files["weights.bin"])
    assert out[BOARD] == out["host"]
