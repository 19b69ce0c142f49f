"""The stack section sized from the linked code's worst-case call depth (stages/device/stack_bound.py), not a fixed reserve.

The analysis is checked on hand-written disassembly (frames, calls, tail calls, indirect calls, interrupts, what
it refuses), and on real firmware in QEMU: the painted stack's measured high-water mark stays within the bound,
and the stack the linker reserves is the bound.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tinytrain.stages.device import stack_bound as sb
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.device.boards import BOARD_DIR, get_board
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.train.data import write_stream
from tests.test_boards import ARM_MISSING, _program, needs_arm

DIS = """
firmware.elf:     file format elf32-littlearm

Disassembly of section .text:

00000100 <Reset_Handler>:
 100:	push	{r3, lr}
 102:	bl	200 <main_fn>
 106:	b.n	106 <Reset_Handler+0x6>

00000200 <main_fn>:
 200:	stmdb	sp!, {r4, r5, r6, r7, r8, lr}
 204:	vpush	{d8-d9}
 208:	sub	sp, #16
 20a:	bl	300 <leaf>
 20e:	blx	r3
 210:	add	sp, #16
 212:	vpop	{d8-d9}
 216:	ldmia.w	sp!, {r4, r5, r6, r7, r8, pc}
 21a:	.word	0x00000401

00000300 <leaf>:
 300:	sub.w	sp, sp, #512
 304:	add.w	sp, sp, #512
 308:	b.w	500 <shared_tail>

00000400 <callback>:
 400:	push	{r4, r5, r6, lr}
 402:	pop	{r4, r5, r6, pc}

00000500 <shared_tail>:
 500:	str.w	lr, [sp, #-4]!
 504:	ldr.w	pc, [sp], #4

00000600 <SysTick_Handler>:
 600:	push	{r4, lr}
 602:	pop	{r4, pc}

00000700 <Fault_Handler>:
 700:	ldr	r3, [pc, #4]
 702:	mov	sp, r3
 704:	sub	sp, #40
 706:	b.n	706 <Fault_Handler+0x6>
"""
VECTORS = [0x2000_1000, 0x101, 0x701, 0x701, 0, 0x601]


def test_frames_calls_tail_calls_and_indirect_calls():
    funcs = sb.parse_disassembly(DIS)
    f = funcs["main_fn"]
    assert f.frame == 6 * 4 + 2 * 8 + 16 and f.indirect and f.calls == {"leaf"}
    assert funcs["leaf"].frame == 512 and funcs["leaf"].calls == {"shared_tail"}  # b.w into another function
    assert funcs["shared_tail"].frame == 4 and funcs["callback"].frame == 16
    assert funcs["Reset_Handler"].frame == 8 and funcs["Reset_Handler"].calls == {"main_fn"}
    assert funcs["Fault_Handler"].rebases and funcs["Fault_Handler"].frame == 40
    # The literal pool word 0x401 takes callback's address: the blx r3 may reach it.
    b = sb.bound_of(funcs, {0x401, 0x12345678}, VECTORS)
    assert b.indirect_targets == ["callback"]
    program = 8 + 56 + max(512 + 4, 16)
    assert b.program_bytes == program and b.chain == ["Reset_Handler", "main_fn", "leaf", "shared_tail"]
    # SysTick may interrupt anywhere (exception frame + its own 8 bytes); the fault handler re-bases SP.
    assert b.interrupt_bytes == sb.EXCEPTION_FRAME + 8
    assert b.bytes == -(-(program + sb.EXCEPTION_FRAME + 8) // 8) * 8


def test_without_the_address_taken_the_indirect_call_reaches_nothing():
    b = sb.bound_of(sb.parse_disassembly(DIS), set(), VECTORS)
    assert b.indirect_targets == [] and b.program_bytes == 8 + 56 + 516


@pytest.mark.parametrize("line, why", [
    (" 20c:\tsub\tsp, r2", "moves SP by an amount"),
    (" 20c:\tbl\t200 <main_fn>", "recursion: main_fn -> main_fn"),
])
def test_what_cannot_be_bounded_is_refused(line, why):
    text = DIS.replace(" 20e:\tblx\tr3", line)
    with pytest.raises(sb.StackBoundError, match=why):
        sb.bound_of(sb.parse_disassembly(text), set(), VECTORS)


def _selftest_data(tmp: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    path = tmp / "data.ttds"
    write_stream(path, x, rng.integers(0, 10, 8).astype(np.int64))
    return path


@needs_arm
def test_auto_stack_is_the_bound_and_covers_the_measured_high_water(tmp_path):
    """The board self-test (TTDS in, float results out, the printf subset) linked with stack_bytes="auto": the
    stack section is the bound, the program runs in QEMU, and its painted high-water mark is inside it."""
    prog = tmp_path / "prog"
    prog.mkdir()
    shutil.copy(BOARD_DIR / "selftest.c", prog)
    board = get_board("stm32f746-disco")
    built = build_firmware(board, prog, tmp_path / "build", kernels=[], stack_bytes="auto")
    size = json.loads((tmp_path / "build" / "size.json").read_text())
    bound = size["stack_bound"]
    assert "deepest_chain" in bound and bound["deepest_chain"][0] == "Reset_Handler"
    assert size["sram"]["stack"] == bound["bytes"] < board.stack_bytes
    assert bound["bytes"] == sb.stack_bound(built.elf).bytes  # the relinked firmware has the bound it was sized for
    ran = run_firmware(board, built.elf, tmp_path / "run", {"data.ttds": _selftest_data(tmp_path)},
                       timeout_s=30)
    assert ran.exit_code == 0 and ran.stack_size == bound["bytes"]
    assert 0 < ran.stack_high_water <= ran.stack_size


@pytest.mark.slow
@pytest.mark.skipif(ARM_MISSING is not None, reason=ARM_MISSING or "")
def test_example_firmware_stack_is_sized_by_its_code_and_covers_its_run(tmp_path, capsys):
    """tinytrain.yaml.example on the STM32F746 (~15 s): codegen asks for "auto", cross-compile reserves the bound,
    and the training run's measured high-water mark stays inside it."""
    from tests.test_emulate_run import _e2e

    _, build, _ = _e2e(tmp_path, capsys, "stm32f746-disco", epochs=1, max_train_samples=30)
    assert json.loads((build / "codegen" / "sources.json").read_text())["stack_bytes"] == "auto"
    size = json.loads((build / "cross-compile" / "size.json").read_text())
    run = json.loads((build / "emulate-run" / "run.json").read_text())
    assert size["sram"]["stack"] == size["stack_bound"]["bytes"] == run["stack"]["size_bytes"]
    assert 0 < run["stack"]["high_water_bytes"] <= run["stack"]["size_bytes"] < 4096


def test_a_call_into_its_own_body_counts_the_frame_twice():
    """libgcc's __aeabi_dmul calls a local subroutine with `bleq` to a label inside itself: not recursion."""
    text = DIS.replace(" 402:\tpop\t{r4, r5, r6, pc}", " 402:\tbleq\t404 <callback+0x4>\n 404:\tpop\t{r4, r5, r6, pc}")
    text = text.replace("sp, sp, #512", "sp, sp, #8")
    funcs = sb.parse_disassembly(text)
    assert funcs["callback"].local_sub and funcs["callback"].calls == set()
    b = sb.bound_of(funcs, {0x401}, VECTORS)
    assert b.program_bytes == 8 + 56 + 2 * 16 and b.chain == ["Reset_Handler", "main_fn", "callback"]


@needs_arm
def test_too_big_for_ram_says_so_with_the_stack_it_would_get(tmp_path):
    """A program over the board's SRAM with stack_bytes="auto": the message counts the bound, not the board's
    16 KB default nor the 8-byte stack of the first link."""
    import re

    from tinytrain.pipeline.errors import UserError
    from tests.test_boards import BIG_RAM, _program

    with pytest.raises(UserError) as e:
        build_firmware(get_board("stm32f746-disco"), _program(tmp_path, "big", BIG_RAM), tmp_path / "out",
                       kernels=[], stack_bytes="auto")
    msg = str(e.value)
    over = int(re.search(r"SRAM over by \d+\.\d KB \((\d+) bytes\)", msg).group(1))
    stack = re.search(r"\(stack (\d+) B \+", msg)
    assert stack and 256 < int(stack.group(1)) < 2048, msg
    assert 80 * 1024 + int(stack.group(1)) < over < 80 * 1024 + 2 * int(stack.group(1)) + 1024  # + a little data


COINCIDENCE = r'''
#include <stdint.h>
#include "tt_platform.h"
/* A constant table (think: a layer's int32 biases) whose last word may equal victim's Thumb address. */
const volatile uint32_t tt_table[4] = {1u, 2u, 3u, @MAGIC@u};
static int (*volatile tt_cb)(int);
static int other(int n) { return n + 1; }
__attribute__((noinline)) int victim(int n) { return n > 0 ? tt_cb(n - 1) : 0; }
int tt_main(void) { tt_cb = other; return victim((int)(tt_table[3] & 1u)) == 1 ? 0 : 1; }
'''


@needs_arm
def test_a_constant_equal_to_a_function_address_is_no_address(tmp_path):
    """cross-compile links with --emit-relocs, so only words an absolute relocation wrote count as stored
    addresses: a table entry that happens to equal victim | 1 does not make victim's indirect call recursive. The same
    ELF without its relocations falls back to every word (the over-estimate) and is refused as recursive."""
    import subprocess

    board = get_board("stm32f746-disco")
    first = build_firmware(board, _program(tmp_path, "p0", COINCIDENCE.replace("@MAGIC@", "0")), tmp_path / "b0",
                           kernels=[])
    nm = subprocess.run(["arm-none-eabi-nm", str(first.elf)], capture_output=True, text=True, check=True).stdout
    victim = int(next(ln.split()[0] for ln in nm.splitlines() if ln.endswith(" victim")), 16)
    built = build_firmware(board, _program(tmp_path, "p1", COINCIDENCE.replace("@MAGIC@", str(victim | 1))),
                           tmp_path / "b1", kernels=[])
    nm1 = subprocess.run(["arm-none-eabi-nm", str(built.elf)], capture_output=True, text=True, check=True).stdout
    assert f"{victim:08x} T victim" in nm1  # the same layout: the table now holds victim's Thumb address
    bound = sb.stack_bound(built.elf)
    assert "victim" not in bound.to_json()["indirect_targets"] and "other" in bound.to_json()["indirect_targets"]
    bare = tmp_path / "bare.elf"
    subprocess.run(["arm-none-eabi-objcopy", "--remove-relocations=*", str(built.elf), str(bare)], check=True)
    with pytest.raises(sb.StackBoundError, match="recursion"):
        sb.stack_bound(bare)
