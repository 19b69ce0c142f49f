"""The Cortex-M55 cycle table (stages/device/cycles.py): Helium and low-overhead-loop encodings classed from their
bits where QEMU's disassembler (capstone) does not decode them, blocks re-walked to the instructions that really ran,
and the table applied exactly; plus a QEMU trace of Helium code whose count agrees with QEMU's own."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tinytrain.stages.device.cycles import COSTS, TraceReader, classify, classify_raw, estimate, parse_insn, realign

M55 = COSTS["cortex-m55"]


@pytest.mark.parametrize("h1, h2, cls, base, writes_pc", [
    (0xED93, 0x1F00, "mve_load", "vldr", False),      # vldrw.u32 q0, [r3]
    (0xECB5, 0x5E10, "mve_load", "vldr", False),      # vldrb.u8 q2, [r5], #16
    (0xFD98, 0x4F00, "mve_load", "vldr", False),      # vldrh.u32 q2, [r0] (widening)
    (0xED81, 0x7F00, "mve_store", "vstr", False),     # vstrw.32 q3, [r1]
    (0xECAD, 0x6F04, "mve_store", "vstr", False),     # vstrh.32 q3, [r5], #8 (narrowing)
    (0xEEF4, 0x4F26, "mve_vector", "mve", False),     # vmladava.s8 r4, q2, q3
    (0xEEF1, 0xCF26, "mve_vector", "mve", False),     # vaddva.s8 ip, q3
    (0xFE37, 0x6F03, "mve_vector", "mve", False),     # vpsel q3, q3, q1
    (0xFE2F, 0x0F02, "mve_vector", "mve", False),     # vcmp.i32 eq, q7, q1
    (0xEE3F, 0x2E05, "mve_vector", "mve", False),     # vcvtb.f16.f32 q1, q2
    (0xFE3F, 0x0E05, "mve_vector", "mve", False),     # vcvtb.f32.f16 q0, q2
    (0xFE71, 0x0F4D, "mve_predicate", "vpst", False),
    (0xF002, 0xE801, "mve_predicate", "vctp", False),  # vctp.8 r2
    (0xF013, 0xE801, "mve_predicate", "vctp", False),  # vctp.16 r3
    (0xEEFD, 0x3A10, "fp_arith", "vmrs", False),      # vmrs r3, p0
    (0xEEED, 0x0A10, "fp_arith", "vmsr", False),      # vmsr p0, r0
    (0xF04E, 0xE001, "alu", "dls", False),            # dls lr, lr
    (0xF04E, 0xC005, "branch", "wls", True),          # wls lr, lr, <after the loop>
    (0xF00F, 0xC00B, "branch", "le", True),           # le lr, <loop start>
    (0xF01F, 0xC00B, "branch", "le", True),           # letp
])
def test_raw_classes(h1, h2, cls, base, writes_pc):
    i = classify_raw(0x100, h1, h2)
    assert (i.cls, i.base, i.writes_pc, i.size) == (cls, base, writes_pc, 4)


def test_capstone_decoded_helium_is_a_vector_instruction_and_scalar_fp_is_not():
    assert classify(0, 4, "vand", "q0, q2, q0").cls == "mve_vector"
    assert classify(0, 4, "vdup.32", "q4, r0").cls == "mve_vector"
    assert classify(0, 4, "vshr.u32", "q2, q2, #0xd").cls == "mve_vector"
    assert classify(0, 4, "vadd.f32", "s0, s1, s2").cls == "fp_arith"
    assert classify(0, 4, "vmla.f32", "s0, s1, s2").cls == "fp_mac"


# capstone's listing of a Helium loop as QEMU 7.2 logs it: `.byte` for undecoded first halfwords, the second halfword
# then decoded on its own (0x2e05 as `cmp`), or - when it looks like a 32-bit prefix (0xe801) - swallowing the next
# instruction's first halfword; MVE loads as LDC.
LOOP = """\
IN: kern
0x00001000:  ed93 1f00  ldc      p15, c1, [r3]
0x00001004:  f002       .byte    0x02, 0xf0
0x00001006:  e801 fe71  stmdb    r1, {r0, r4, r5, r6, sb, sl, fp, ip, sp, lr, pc}
0x0000100a:  0f4d       lsrs     r5, r1, #0x1d
0x0000100c:  ee3f       .byte    0x3f, 0xee
0x0000100e:  2e05       cmp      r6, #5
0x00001010:  3301       adds     r3, #1
0x00001012:  f00f       .byte    0x0f, 0xf0
0x00001014:  c00b       stm      r0!, {r0, r1, r3}

"""
EXIT = """\
IN: kern
0x00001016:  4770       bx       lr

"""


def _trace(addr: int, sym: str, n: int) -> str:
    return f"Trace {n}: 0x2000{addr:04x} [00000000/{addr:08x}/00000000/00000000] {sym}\n"


def test_a_helium_block_is_realigned_to_the_instructions_that_ran():
    insns = [i for i in (parse_insn(ln) for ln in LOOP.splitlines()) if i]
    assert len(insns) == 9  # capstone's view: 9 "instructions"
    real = realign(insns)
    assert [(i.addr, i.size, i.base, i.cls) for i in real] == [
        (0x1000, 4, "vldr", "mve_load"), (0x1004, 4, "vctp", "mve_predicate"), (0x1008, 4, "vpst", "mve_predicate"),
        (0x100C, 4, "mve", "mve_vector"), (0x1010, 2, "add", "alu"), (0x1012, 4, "le", "branch")]
    plain = [parse_insn("0x00000800:  4770       bx       lr")]
    assert realign(plain) == plain  # blocks without undecoded lines are left alone (all M4/M7 code)


def test_the_m55_table_is_applied_exactly():
    # the loop runs 3 times (LE taken twice, then falls through to bx lr)
    log = LOOP + _trace(0x1000, "kern", 1) + _trace(0x1000, "kern", 1) + _trace(0x1000, "kern", 1) + EXIT \
        + _trace(0x1016, "kern", 2)
    prof = TraceReader(None, None).feed_all(log.splitlines())
    assert prof.instructions == 3 * 6 + 1
    mix = prof.mix()
    assert (mix["mve_load"], mix["mve_predicate"], mix["mve_vector"], mix["alu"]) == (3, 6, 3, 3)
    assert (mix["branch_taken"], mix["branch_not_taken"]) == (2 + 0, 1 + 1)  # LE: 2 taken, 1 not; bx: last block
    # per pass: vldr 2 + vctp 1 + vpst 1 + vcvtb 2 + adds 1 + le 1 (not taken) = 8; a taken LE costs 1 (no refill)
    body = 2 + 1 + 1 + 2 + 1 + 1
    assert M55.static_cost(realign([i for i in (parse_insn(ln) for ln in LOOP.splitlines()) if i])) == body
    assert prof.cycles(M55) == 3 * body + 2 * (M55.loop_end_taken - M55.branch_not_taken) + 1
    doc = estimate(prof, "cortex-m55")
    assert doc["cycles_per_step"] == 3 * body + 1 and list(doc["by_core"]) == ["cortex-m55"]
    with pytest.raises(ValueError, match="Helium"):
        estimate(prof, "cortex-m7")  # the M7 cannot run this trace


def test_a_wls_that_skips_its_loop_pays_the_refill():
    log = ("IN: k\n0x00002000:  f04e       .byte    0x4e, 0xf0\n0x00002002:  c005       stm      r0!, {r0, r2}\n\n"
           + _trace(0x2000, "k", 1) + "IN: k\n0x0000200c:  4770       bx       lr\n\n" + _trace(0x200C, "k", 2))
    prof = TraceReader(None, None).feed_all(log.splitlines())
    assert prof.instructions == 2 and prof.mix()["branch_taken"] == 1
    assert prof.cycles(M55) == M55.branch_taken + M55.branch_not_taken


def test_scalar_code_costs_the_same_as_the_m7_model():
    """The M55's scalar model is the M7's single-issue one except a taken branch (1 + P); portable kernels' traces
    are costed for all three cores."""
    for k in ("alu", "mul_mac", "divide", "fp_arith", "fp_mac", "fp_div_sqrt", "fp_load", "fp_store"):
        assert M55.fixed[k] == COSTS["cortex-m7"].fixed[k]
    assert (M55.load_store, M55.pair, M55.per_two_regs, M55.branch_taken) == (1, 1, True, 3)
    log = ("IN: k\n0x00003000:  3301       adds     r3, #1\n0x00003002:  4770       bx       lr\n\n"
           + _trace(0x3000, "k", 1))
    doc = estimate(TraceReader(None, None).feed_all(log.splitlines()), "cortex-m55")
    assert set(doc["by_core"]) == {"cortex-m4", "cortex-m7", "cortex-m55"} and doc["cycles_per_step"] == 2


PROG = r"""
#include <stdint.h>
#include "tt_dot.h"
#include "tt_f16.h"
#include "tt_platform.h"
static int8_t x[999], w[4 * 999];
static float f[1000];
static uint16_t h[1000];
int tt_main(void) {
    int32_t acc[4] = {0, 0, 0, 0}, s = 0;
    for (int i = 0; i < 999; ++i) x[i] = (int8_t)(i * 7);
    for (int i = 0; i < 4 * 999; ++i) w[i] = (int8_t)(i * 13);
    for (int i = 0; i < 1000; ++i) f[i] = (float)i * 0.37f;
    for (int r = 0; r < 20; ++r) {
        s += tt_dot_s8(x, w, 999 - r, r);
        tt_dot4_raw_s8(x, w, 999, 999 - r, acc);
        tt_cast_f32_f16(1000u - (uint32_t)r, f, h);
        tt_cast_f16_f32(1000u - (uint32_t)r, h, f);
    }
    tt_log("s=%ld %ld\n", (long)s, (long)acc[0]);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="needs arm-none-eabi-gcc and qemu-system-arm")
def test_a_helium_trace_counts_what_qemu_counts(tmp_path):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import trace_firmware

    (tmp_path / "prog").mkdir()
    (tmp_path / "prog" / "k.c").write_text(PROG)
    board = get_board("mps3-an547")
    built = build_firmware(board, tmp_path / "prog", tmp_path / "b", kernels=["tt_f16.c"],
                           defines={"TT_USE_MVE": "1", "TT_USE_DSP": "1"})
    reader = TraceReader("tt_main", "tt_exit")
    console, _ = trace_firmware(board, built.elf, tmp_path / "r", {}, reader.feed, lambda: False,
                                timeout_s=120)
    mix = reader.profile.mix()
    assert mix["mve_vector"] > 1000 and mix["mve_load"] > 1000 and mix["mve_predicate"] > 20
    assert mix.get("other", 0) < 50  # nothing left undecoded but the startup's few system instructions
    # QEMU's own count (-icount, from reset to the exit line) and the trace's window (tt_main to tt_exit) differ by
    # the startup code only: a few dozen instructions. Without the re-walk every Helium instruction would count twice.
    qemu = int(re.search(r"@tt exit code=0 instructions=(\d+)", console).group(1))
    assert abs(reader.profile.instructions - qemu) < 50, (reader.profile.instructions, qemu)
    doc = estimate(reader.profile, "cortex-m55")
    assert doc["instructions_traced"] < doc["cycles_per_step"] < 3 * doc["instructions_traced"]


def test_inspect_shows_an_m55_trace_with_helium(tmp_path):
    """`tinytrain inspect` of a run.json whose traced step has Helium instructions: only the M55 has a figure."""
    import json

    from tinytrain.stages import emulate_run

    log = LOOP + _trace(0x1000, "kern", 1) + EXIT + _trace(0x1016, "kern", 2)
    est = {"traced": True, **estimate(TraceReader(None, None).feed_all(log.splitlines()), "cortex-m55")}
    doc = {"summary": "s", "loss": {"steps": 1, "first": 1.0, "last": 1.0}, "accuracy": {"before": 1, "after": 2},
           "cycles_per_step_estimate": est, "gate": {"reason": "r"},
           "export": {"weights": 1, "wof": "w", "wof_n_buffers": 1, "wof_tensors": [], "tflite": "t"},
           "memory": {"flash_used": 1, "flash_available": 2, "sram_used": 1, "sram_available": 2}}
    (tmp_path / "run.json").write_text(json.dumps(doc))
    text = emulate_run.inspect(tmp_path / "run.json")
    line = next(ln for ln in text.splitlines() if ln.startswith("cycles per step"))
    assert f"Cortex-M55 ≈{est['cycles_per_step']} (CPI" in line and "M7" not in line and "mve_vector" in line
