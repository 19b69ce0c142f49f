"""Board support, cross-compile and the firmware runner, proven with small hand-written programs.

The self-test program (kernels_c/boards/selftest.c) streams a TTDS file in, computes float
results and writes them out; it must give the same bytes natively and in QEMU on every board.
Other tiny programs check the failure paths: too big for RAM or flash, a HardFault, a stack
overflow, a hang, a program-reported failure, malloc.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.contract import StageContext
from tinytrain.pipeline.errors import StageFailed, UserError
from tinytrain.pipeline.spec import TargetSpec
from tinytrain.stages import cross_compile
from tinytrain.stages.device.boards import BOARD_DIR, BOARDS, get_board
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.device.launch import EmulationError, run_firmware


def _arm_toolchain_missing() -> str | None:
    if shutil.which("arm-none-eabi-gcc") is None:
        return "arm-none-eabi-gcc is not installed (CI installs gcc-arm-none-eabi)"
    spec = subprocess.run(["arm-none-eabi-gcc", "-print-file-name=nano.specs"], capture_output=True, text=True)
    if not Path(spec.stdout.strip()).is_absolute():
        return "newlib for arm-none-eabi is not installed (CI installs libnewlib-arm-none-eabi)"
    if shutil.which("qemu-system-arm") is None:
        return "qemu-system-arm is not installed (CI installs qemu-system-arm)"
    return None


ARM_MISSING = _arm_toolchain_missing()
needs_arm = pytest.mark.skipif(ARM_MISSING is not None, reason=ARM_MISSING or "")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")

ARM_BOARDS = [name for name, b in BOARDS.items() if not b.host]


def _board_param(name: str):
    return pytest.param(name, marks=needs_cc if BOARDS[name].host else needs_arm)


def _program(tmp: Path, name: str, source: str) -> Path:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.c").write_text(source)
    return d


def _build(board: str, program: Path, out: Path, **kw):
    return build_firmware(get_board(board), program, out, kernels=[], **kw)


def _failure(board: str, tmp: Path, name: str, source: str) -> pytest.ExceptionInfo:
    """`source` built for `board` and run: the EmulationError it must end with."""
    built = _build(board, _program(tmp, name, source), tmp / "out")
    with pytest.raises(EmulationError) as e:
        run_firmware(get_board(board), built.elf, tmp / "run", {}, timeout_s=10)
    return e


# ---- the registry ---------------------------------------------------------------------------------

def test_registry_matches_linker_scripts_and_spec():
    for name, b in BOARDS.items():
        assert TargetSpec(board=name).board == name
        if b.host:
            assert b.budget_bytes is None
            continue
        text = b.linker_script_path.read_text()
        regions = {m[0]: (int(m[1], 16), int(m[2]) * 1024) for m in re.findall(
            r"(\w+)\s*\([rwx]+\)\s*:\s*ORIGIN\s*=\s*(0x[0-9a-fA-F]+),\s*LENGTH\s*=\s*(\d+)K", text)}
        assert regions["FLASH"] == (b.flash_origin, b.flash_bytes), name
        assert regions["RAM"] == (b.sram_origin, b.sram_bytes), name
        # The vector table sits at the boot address 0, in flash or (mps3-an547) in a region of its own.
        vectors = re.search(r'REGION_ALIAS\("VECTORS",\s*(\w+)\)', text).group(1)
        assert regions[vectors][0] == 0, name
        stack = re.search(r"__stack_size\s*=\s*DEFINED\(__stack_size\)\s*\?\s*__stack_size\s*:\s*(\d+)K", text)
        assert int(stack.group(1)) * 1024 == b.stack_bytes, name
        assert b.runtime_reserve_bytes >= b.stack_bytes and 0 < b.budget_bytes < b.sram_bytes
    assert get_board("stm32f746-disco").sram_bytes == 320 * 1024
    assert get_board("stm32f746-disco").qemu_machine == "mps2-an500"
    m55 = get_board("mps3-an547")
    assert m55.half_precision and m55.mve and m55.instructions_per_tick == Fraction(125, 4)
    assert get_board("host").half_precision and not any(b.mve for b in BOARDS.values() if b is not m55)
    with pytest.raises(KeyError, match="known boards"):
        get_board("pc")


# ---- the self-test on every board ----------------------------------------------------------------

@pytest.fixture(scope="module")
def selftest_data(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((120, 24)).astype(np.float32)
    y = rng.integers(0, 10, 120)
    path = tmp_path_factory.mktemp("data") / "data.ttds"
    write_stream(path, x, y)
    return path, x, y


@pytest.fixture(scope="module")
def selftest_runs(tmp_path_factory, selftest_data):
    """board -> (BuildResult, RunResult) for every board whose toolchain is present."""
    tmp = tmp_path_factory.mktemp("selftest")
    prog = tmp / "prog"
    prog.mkdir()
    shutil.copy(BOARD_DIR / "selftest.c", prog)
    runs = {}
    for name, b in BOARDS.items():
        if (b.host and shutil.which("cc") is None) or (not b.host and ARM_MISSING):
            continue
        built = _build(name, prog, tmp / "build" / name)
        ran = run_firmware(b, built.elf, tmp / "run" / name, {"data.ttds": selftest_data[0]}, timeout_s=30)
        runs[name] = (built, ran)
    return runs


@pytest.mark.parametrize("board", [_board_param(n) for n in BOARDS])
def test_selftest_runs_and_matches_numpy(board, selftest_runs, selftest_data):
    _, x, y = selftest_data
    built, ran = selftest_runs[board]
    assert ran.exit_code == 0 and ran.results["records"] == len(x) and ran.results["dim"] == x.shape[1]
    assert ran.results["classes"][:10] == np.bincount(y, minlength=10).tolist()
    # The C sums in record order in float32: so does this loop, one rounding per addition.
    total = np.float32(0)
    for v in x.reshape(-1):
        total = np.float32(total + v)
    assert ran.results["sum_bits"] == int(total.view(np.uint32))
    assert len(ran.files["dots.bin"]) == 4 * len(x)
    if BOARDS[board].host:
        assert ran.instructions is None and ran.stack_high_water is None
    else:
        stack = BOARDS[board].stack_bytes
        assert ran.stack_size == stack and 0 < ran.stack_high_water < stack
        assert ran.instructions > 10_000
        metrics = json.loads(ran.files["metrics.json"])
        assert metrics["board"] == board and 0 < metrics["instructions_first_pass"] < ran.instructions


@needs_cc
@needs_arm
def test_qemu_results_bit_identical_to_host(selftest_runs):
    _, host = selftest_runs["host"]
    for board in ARM_BOARDS:
        _, ran = selftest_runs[board]
        assert ran.files["results.json"] == host.files["results.json"], board
        assert ran.files["dots.bin"] == host.files["dots.bin"], board


@needs_arm
def test_instruction_count_is_deterministic(selftest_runs, selftest_data, tmp_path):
    built, first = selftest_runs["stm32f746-disco"]
    again = run_firmware(get_board("stm32f746-disco"), built.elf, tmp_path, {"data.ttds": selftest_data[0]}, 30)
    assert again.instructions == first.instructions
    assert again.stack_high_water == first.stack_high_water
    assert again.files["metrics.json"] == first.files["metrics.json"]


LOOP = r"""
#include "tt_platform.h"
int tt_main(void) {
    uint32_t n = 1000000;
    uint64_t t0 = tt_instructions();
    /* exactly 2 instructions per iteration */
    __asm__ volatile("1: subs %0, %0, #1\n\t bne 1b" : "+r"(n) : : "cc");
    uint64_t t1 = tt_instructions();
    tt_log("loop %llu\n", (unsigned long long)(t1 - t0));
    return 0;
}
"""


@needs_arm
@pytest.mark.parametrize("board", ["stm32f746-disco", "m4-128k", "mps3-an547"])
def test_instruction_count_is_calibrated(board, tmp_path):
    built = _build(board, _program(tmp_path, "loop", LOOP), tmp_path / "out")
    ran = run_firmware(get_board(board), built.elf, tmp_path / "run", {}, 30)
    counted = int(re.search(r"loop (\d+)", ran.console).group(1))
    assert 2_000_000 <= counted <= 2_000_000 + 200  # resolution 40 (31.25 at 32 MHz) instructions + the two reads


# ---- size report and fit check ---------------------------------------------------------------------

@needs_arm
@pytest.mark.parametrize("board", ARM_BOARDS)
def test_size_json_matches_arm_none_eabi_size(board, selftest_runs):
    built, _ = selftest_runs[board]
    size = json.loads((built.elf.parent / "size.json").read_text())
    assert size == built.size
    sysv = subprocess.run(["arm-none-eabi-size", "-A", "-d", str(built.elf)], capture_output=True, text=True,
                          check=True).stdout
    tool = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\.\S+)\s+(\d+)\s+\d+", sysv, re.M)}
    for name, sec in size["sections"].items():
        assert sec["size"] == tool[name], name
    berkeley = subprocess.run(["arm-none-eabi-size", "-B", "-d", str(built.elf)], capture_output=True, text=True,
                              check=True).stdout.splitlines()[1].split()
    text, data, bss = map(int, berkeley[:3])
    b = BOARDS[board]
    assert size["flash"]["used"] == text + data
    assert size["sram"]["used"] == data + bss  # bss here includes the .stack and .heap sections
    assert size["sram"]["stack"] == b.stack_bytes and size["sram"]["heap"] == 0
    assert size["flash"]["available"] == b.flash_bytes and size["sram"]["available"] == b.sram_bytes
    assert size["flash"]["free"] == b.flash_bytes - size["flash"]["used"] and size["fits"]
    assert (built.elf.parent / "firmware.map").read_text().count("tt_main") >= 1


BIG_RAM = r"""
#include "tt_platform.h"
static volatile uint8_t big_arena[400 * 1024];
int tt_main(void) { big_arena[12345] = 1; return big_arena[12345] - 1; }
"""

BIG_FLASH = r"""
#include "tt_platform.h"
const uint8_t frozen_weights[1100 * 1024] = {1, 2, 3};
int tt_main(void) { volatile const uint8_t *p = frozen_weights; return p[2] - 3; }
"""


@needs_arm
def test_too_big_for_ram_says_by_how_much(tmp_path):
    with pytest.raises(UserError) as e:
        _build("stm32f746-disco", _program(tmp_path, "big", BIG_RAM), tmp_path / "out")
    msg = str(e.value)
    m = re.search(r"SRAM over by (\d+\.\d) KB \((\d+) bytes\)", msg)
    assert m, msg
    # 400 KB arena + 16 KB stack + a little runtime data, against 320 KB
    over = int(m.group(2))
    assert 96 * 1024 < over < 100 * 1024 and float(m.group(1)) == round(over / 1024, 1)
    assert "big_arena 400.0 KB" in msg and "flash over" not in msg
    assert e.value.exit_code == 2


@needs_arm
def test_too_big_for_flash_says_by_how_much(tmp_path):
    with pytest.raises(UserError) as e:
        _build("m4-128k", _program(tmp_path, "blob", BIG_FLASH), tmp_path / "out")
    msg = str(e.value)
    m = re.search(r"flash over by (\d+\.\d) KB \((\d+) bytes\)", msg)
    assert m, msg
    assert 588 * 1024 < int(m.group(2)) < 600 * 1024 and "frozen_weights 1100.0 KB" in msg
    assert "SRAM over" not in msg


# 6 MB of constants: more than the measuring link's regions were (4 MB), as a float model's weights are
HUGE_FLASH = r"""
#include "tt_platform.h"
const uint8_t frozen_weights[6 * 1024 * 1024] = {1, 2, 3};
int tt_main(void) { volatile const uint8_t *p = frozen_weights; return p[2] - 3; }
"""


@needs_arm
def test_far_too_big_for_flash_still_says_by_how_much(tmp_path):
    """A program of many MB (MediaPipe's hand_landmark_full in fp16-mixed: 10 MB of fp32 weights) gets the
    board's shortfall, not the measuring link's own overflow ("linking for mps3-an547 failed")."""
    with pytest.raises(UserError) as e:
        _build("mps3-an547", _program(tmp_path, "blob", HUGE_FLASH), tmp_path / "out")
    msg = str(e.value)
    m = re.search(r"flash over by (\d+\.\d) KB \((\d+) bytes\)", msg)
    assert m, msg
    assert 4 * 1024 * 1024 < int(m.group(2)) < 4 * 1024 * 1024 + 64 * 1024 and "frozen_weights 6144.0 KB" in msg


# ---- failures at run time --------------------------------------------------------------------------

BAD_POINTER = r"""
#include "tt_platform.h"
int tt_main(void) {
    tt_log("reading through a bad pointer\n");
    return (int)*(volatile uint32_t *)0x30000000u;  /* nothing is mapped there on mps2 */
}
"""

RECURSE = r"""
#include "tt_platform.h"
uint32_t deep(uint32_t n);
uint32_t deep(uint32_t n) { volatile uint32_t pad[32]; pad[n & 31] = n; return n ? deep(n - 1) + pad[3] : 0; }
int tt_main(void) { return (int)deep(1000000); }
"""

HANG = r"""
#include "tt_platform.h"
int tt_main(void) { tt_log("spinning\n"); for (volatile int i = 0; ; i++) { } }
"""

FAIL = r"""
#include "tt_platform.h"
int tt_main(void) { tt_fail("loss is NaN at step 3"); }
"""

MALLOC = r"""
#include <stdlib.h>
#include "tt_platform.h"
int tt_main(void) { char *p = malloc(16); return p == 0; }
"""


@needs_arm
@pytest.mark.parametrize("board", ["stm32f746-disco", "m4-256k"])
def test_bad_pointer_is_a_hardfault_with_registers(board, tmp_path):
    e = _failure(board, tmp_path, "bad", BAD_POINTER)
    msg = str(e.value)
    assert e.value.kind == "fault" and e.value.result.exit_code == 103
    assert "HardFault" in msg and "BFAR=0x30000000" in msg and "PC=0x" in msg
    assert "reading through a bad pointer" in msg  # the console's last lines come with it


@needs_arm
@pytest.mark.parametrize("board", ["m4-128k", "mps3-an547"])  # PMSAv7 and PMSAv8 MPUs
def test_stack_overflow_is_caught(board, tmp_path):
    e = _failure(board, tmp_path, "deep", RECURSE)
    assert e.value.kind == "fault" and "stack overflow" in str(e.value)


CONST_WRITE = r"""
#include "tt_platform.h"
const uint32_t frozen[4] = {1, 2, 3, 4};
int tt_main(void) {
    volatile uint32_t *p = (volatile uint32_t *)(uintptr_t)frozen;  /* casting const away */
    p[1] = 7;
    return (int)p[1];
}
"""

UNMAPPED = r"""
#include "tt_platform.h"
int tt_main(void) {
    tt_log("reading outside the board's memories\n");
    return (int)*(volatile uint32_t *)0x21000000u;  /* the AN547's ISRAM: QEMU maps it, the board does not */
}
"""


@needs_arm
@pytest.mark.parametrize("board", ["stm32f746-disco", "mps3-an547"])
def test_write_to_const_data_faults(board, tmp_path):
    e = _failure(board, tmp_path, "cw", CONST_WRITE)
    assert e.value.kind == "fault" and "write to flash" in str(e.value)


@needs_arm
def test_pmsav8_mpu_maps_only_the_boards_memories(tmp_path):
    """mps3-an547: the MPU's background map is off, so memory QEMU has but the board's budget leaves out faults."""
    e = _failure("mps3-an547", tmp_path, "far", UNMAPPED)
    msg = str(e.value)
    assert e.value.kind == "fault" and "MemManage: bad data address 0x21000000" in msg and "PC=0x" in msg
    assert "on mps3-an547" in msg


@pytest.mark.parametrize("board", [_board_param("host"), _board_param("stm32f746-disco")])
def test_hang_is_stopped_by_the_timeout(board, tmp_path):
    built = _build(board, _program(tmp_path, "hang", HANG), tmp_path / "out")
    start = time.monotonic()
    with pytest.raises(EmulationError) as e:
        run_firmware(get_board(board), built.elf, tmp_path / "run", {}, timeout_s=1.0)
    assert time.monotonic() - start < 8
    assert e.value.kind == "timeout" and "did not finish within 1 s" in str(e.value)
    assert "spinning" in str(e.value) and "target.timeout_s" in str(e.value)


@pytest.mark.parametrize("board", [_board_param("host"), _board_param("m4-256k")])
def test_program_failure_is_reported(board, tmp_path):
    e = _failure(board, tmp_path, "fail", FAIL)
    assert e.value.kind == "failed" and "loss is NaN at step 3 (exit code 1)" in str(e.value)


@needs_arm
def test_malloc_does_not_link_on_boards(tmp_path):
    with pytest.raises(StageFailed, match="malloc"):
        _build("m4-128k", _program(tmp_path, "heap", MALLOC), tmp_path / "out")


# ---- host extras and the stage -----------------------------------------------------------------------

@needs_cc
def test_selftest_clean_under_sanitizers(tmp_path, selftest_runs, selftest_data):
    prog = tmp_path / "prog"
    prog.mkdir()
    shutil.copy(BOARD_DIR / "selftest.c", prog)
    built = _build("host", prog, tmp_path / "out", sanitize=("address", "undefined"))
    ran = run_firmware(get_board("host"), built.elf, tmp_path / "run", {"data.ttds": selftest_data[0]}, 60)
    assert ran.files["results.json"] == selftest_runs["host"][1].files["results.json"]
    assert "runtime error" not in ran.log


@pytest.mark.parametrize("board", [_board_param("host"), _board_param("m4-128k")])
def test_stage_run_builds_from_the_codegen_folder(board, tmp_path):
    codegen = tmp_path / "codegen"
    codegen.mkdir()
    shutil.copy(BOARD_DIR / "selftest.c", codegen)
    (codegen / "sources.json").write_text(json.dumps({"kernels": [], "defines": {"TT_EXAMPLE": "3"}}))
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(
        config={"target.board": board, "target.cflags": [], "target.kernels": "portable"},
        inputs={"codegen/selftest.c": codegen / "selftest.c", "codegen/sources.json": codegen / "sources.json"},
        out_dir=out)
    result = cross_compile.run(ctx)
    # An emulated board also gets the same program built natively, for emulate-run's evaluation.
    extra = [] if board == "host" else ["host_eval.elf"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["build.json", "firmware.elf", "firmware.map", "size.json",
                                                            *extra])
    build = json.loads((out / "build.json").read_text())
    assert ("host_eval" in build) == (board != "host") and build.get("host_eval", {"built": True})["built"]
    assert "-DTT_EXAMPLE=3" in build["cflags"] and "-DTT_KERNELS_PORTABLE=1" in build["cflags"]
    assert all(not s.startswith("/") for s in build["sources"])
    assert result.metrics["board"] == board and board in result.summary or "host" in result.summary
    # Reproducible: a second build gives the same bytes (emulate-run's cache key depends on it).
    out2 = tmp_path / "out2"
    out2.mkdir()
    cross_compile.run(StageContext(config=ctx.config, inputs=ctx.inputs, out_dir=out2))
    for name in ("firmware.elf", "firmware.map", "size.json"):
        assert (out / name).read_bytes() == (out2 / name).read_bytes(), name
