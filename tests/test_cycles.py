"""The cycle estimate (stages/device/cycles.py): instruction classes, the cost tables and the QEMU log reader, on
hand-written log snippets in the format QEMU 7.2 prints with -d in_asm,exec,nochain (exact counts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tinytrain.stages.device.cycles import COSTS, TRAIN_ENTRIES, TraceReader, classify, estimate, parse_insn

M4, M7 = COSTS["cortex-m4"], COSTS["cortex-m7"]
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mnemonic, operands, cls, base, cond", [
    ("smlad", "r0, r1, r2, r0", "mul_mac", "smlad", False),
    ("mla", "r0, r1, r2, r3", "mul_mac", "mla", False),
    ("muls", "r0, r1, r0", "mul_mac", "mul", False),
    ("smlal", "r0, r1, r2, r3", "mul_mac", "smlal", False),
    ("sdiv", "r0, r1, r2", "divide", "sdiv", False),
    ("ldr.w", "r3, [r4, #0xd88]", "load", "ldr", False),
    ("ldrsb", "r3, [r1], #1", "load", "ldrsb", False),
    ("ldrhs", "r3, [r1]", "load", "ldr", True),          # ldr + condition hs, not ldrh + s
    ("strblo", "r3, [r1]", "store", "strb", True),
    ("ldrd", "r2, r3, [r1, #8]", "load_pair", "ldrd", False),
    ("bne", "#0x1450", "branch", "b", True),
    ("bls", "#0x1450", "branch", "b", True),             # b + ls, not bl + s
    ("bl", "#0x5da0", "branch", "bl", False),
    ("bxne", "lr", "branch", "bx", True),
    ("cbz", "r3, #0x20", "branch", "cbz", False),
    ("lsls", "r3, r3, #2", "alu", "lsl", False),
    ("sbcs", "r3, r3, r2", "alu", "sbc", False),         # sbc + s, not sb + cs
    ("movne", "r0, #1", "alu", "mov", True),
    ("itt", "ne", "alu", "itt", False),
    ("sxtb16", "r2, r3", "alu", "sxtb16", False),
    ("vmla.f32", "s0, s1, s2", "fp_mac", "vmla", False),
    ("vmls.f32", "s0, s1, s2", "fp_mac", "vmls", False),
    ("vadd.f32", "s0, s1, s2", "fp_arith", "vadd", False),
    ("vdiv.f32", "s0, s1, s2", "fp_div_sqrt", "vdiv", False),
    ("vldr", "s0, [r3]", "fp_load", "vldr", False),
    ("dsb", "sy", "barrier", "dsb", False),
])
def test_classes(mnemonic, operands, cls, base, cond):
    i = classify(0, 4, mnemonic, operands)
    assert (i.cls, i.base, i.conditional) == (cls, base, cond)


def test_register_lists_and_pc_writes():
    pop = classify(0, 2, "pop", "{r4, r5, pc}")
    assert (pop.cls, pop.regs, pop.writes_pc) == ("load_multiple", 3, True)
    push = classify(0, 4, "push.w", "{r4, r5, r6, r7, r8, sb, sl, fp, lr}")
    assert (push.cls, push.regs, push.writes_pc) == ("store_multiple", 9, False)
    vpush = classify(0, 4, "vpush", "{d8, d9, d10}")
    assert (vpush.cls, vpush.regs) == ("fp_store_multiple", 6)   # six 32-bit words
    vldm = classify(0, 4, "vldmia", "r0!, {s0-s3}")
    assert (vldm.cls, vldm.regs) == ("fp_load_multiple", 4)
    assert classify(0, 4, "ldr.w", "pc, [sp], #4").writes_pc
    assert classify(0, 2, "mov", "pc, lr").writes_pc and not classify(0, 2, "mov", "r0, lr").writes_pc


def test_parse_insn_sizes():
    i = parse_insn("0x00005e70:  f04f 24e0  mov.w    r4, #-0x1fff2000")
    assert (i.addr, i.size, i.base, i.operands) == (0x5E70, 4, "mov", "r4, #-0x1fff2000")
    j = parse_insn("0x00005e74:  b508       push     {r3, lr}")
    assert (j.addr, j.size, j.cls, j.regs) == (0x5E74, 2, "store_multiple", 2)
    assert parse_insn("Trace 0: 0x7f [0/0/0/0] f") is None


def test_static_costs_follow_the_tables():
    seq = [classify(0, 4, "ldr", "r0, [r1]"), classify(4, 4, "ldr", "r2, [r1, #4]"),
           classify(8, 4, "str", "r2, [r3]"), classify(12, 2, "adds", "r0, r0, r2"),
           classify(14, 4, "ldr", "r0, [r1]")]
    # M4: the first single load 2, the loads/stores right after it pipeline to 1 each, the ALU 1, then 2 again
    assert M4.static_cost(seq) == 2 + 1 + 1 + 1 + 2
    assert M7.static_cost(seq) == 5
    pop = [classify(0, 2, "pop", "{r4, r5, pc}")]
    assert M4.static_cost(pop) == 1 + 3 + 2      # 1 + N + P
    assert M7.static_cost(pop) == 2 + 2          # ceil(N/2) + refill
    fp = [classify(0, 4, "vmla.f32", "s0, s1, s2"), classify(4, 4, "vdiv.f32", "s0, s1, s2"),
          classify(8, 4, "sdiv", "r0, r1, r2"), classify(12, 4, "smlad", "r0, r1, r2, r0")]
    assert M4.static_cost(fp) == 3 + 14 + 12 + 1
    assert M7.static_cost(fp) == 2 + 14 + 12 + 1
    b = classify(0, 2, "bne", "#0x10")
    assert M4.static_cost([b]) == 1 and M4.taken_extra(b) == 2
    assert M7.static_cost([b]) == 1 and M7.taken_extra(b) == 1


# A loop: `main` calls `work`, whose 3-instruction body runs 3 times (the back-branch taken twice), then returns;
# a TB before the window, one rewound for I/O, one announced but stopped, and the stop symbol.
LOG = """\
----------------
IN: main
0x00000100:  b508       push     {r3, lr}
0x00000102:  f000 f801  bl       #0x108

Trace 0: 0x7f0000000100 [00800400/00000100/00000010/ff020200] main
----------------
IN: work
0x00000108:  6808       ldr      r0, [r1]
0x0000010a:  fb00 f000  mul      r0, r0, r0
0x0000010e:  3a01       subs     r2, #1
0x00000110:  d1fa       bne      #0x108

Trace 0: 0x7f0000000200 [00800400/00000108/00000010/ff020200] work
Trace 0: 0x7f0000000200 [00800400/00000108/00000010/ff020200] work
Trace 0: 0x7f0000000200 [00800400/00000108/00000010/ff020200] work
Stopped execution of TB chain before 0x7f0000000200 [00000108] work
Trace 0: 0x7f0000000200 [00800400/00000108/00000010/ff020200] work
----------------
IN: work
0x00000112:  6008       str      r0, [r1]
0x00000114:  6048       str      r0, [r1, #4]
0x00000116:  4770       bx       lr

Trace 0: 0x7f0000000300 [00800400/00000112/00000010/ff020200] work
cpu_io_recompile: rewound execution of TB to 00000114
----------------
IN: work
0x00000114:  6048       str      r0, [r1, #4]

Trace 0: 0x7f0000000400 [00800400/00000114/00000010/ff038201] work
----------------
IN: work
0x00000116:  4770       bx       lr

Trace 0: 0x7f0000000500 [00800400/00000116/00000010/ff020200] work
----------------
IN: done
0x00000106:  bd08       pop      {r3, pc}

Trace 0: 0x7f0000000600 [00800400/00000106/00000010/ff020200] done
Trace 0: 0x7f0000000200 [00800400/00000108/00000010/ff020200] work
"""


def test_reader_counts_a_window_exactly():
    prof = TraceReader("work", "done").feed_all(LOG.splitlines())
    assert prof.closed
    # 3 loop bodies (12) + the first str of the rewound TB (1) + the one-insn str TB (1) + bx (1)
    assert prof.instructions == 3 * 4 + 1 + 1 + 1
    mix = prof.mix()
    assert mix == {"load": 3, "mul_mac": 3, "alu": 3, "store": 2, "branch": 4,
                   "branch_taken": 3, "branch_not_taken": 1}
    # M4: loop body ldr 2 + mul 1 + subs 1 + bne 1 = 5, +2 when taken (twice); the rewound str 2; the str 2;
    # bx 1 + P = 3
    assert prof.cycles(M4) == 3 * 5 + 2 * 2 + 2 + 2 + 3
    # M7: everything 1, the two taken bne +1, the bx taken +1
    assert prof.cycles(M7) == 15 + 2 + 1
    doc = estimate(prof, "cortex-m7", clock_hz=1_000_000)
    assert doc["cycles_per_step"] == 18 and doc["instructions_traced"] == 15
    assert doc["by_core"]["cortex-m4"]["cycles"] == 26
    assert doc["ms_per_step"] == pytest.approx(18 / 1e6 * 1e3)


@pytest.mark.parametrize("entry", TRAIN_ENTRIES)
def test_default_window_opens_at_either_training_entry(entry):
    # a driver whose input is fed row by row enters a step through tt_train_sample_rows, not tt_train_sample
    log = LOG.replace(" work", f" {entry}").replace(" done", " tt_progress")
    assert TraceReader().feed_all(log.splitlines()).instructions == 3 * 4 + 1 + 1 + 1
    assert TraceReader("tt_no_such_entry").feed_all(log.splitlines()).instructions == 0


def test_reader_without_a_window_counts_everything_and_refuses_unknown_blocks():
    prof = TraceReader(None, None).feed_all(LOG.splitlines())
    assert prof.instructions == 2 + 15 + 1 + 4     # + main's two + pop + the last loop body
    with pytest.raises(ValueError, match="without its instructions"):
        TraceReader(None, None).feed_all(["Trace 0: 0x7f00 [00800400/00000108/00000010/ff020200] work"])


def test_unknown_cpu_is_refused():
    with pytest.raises(ValueError, match="no cycle table"):
        estimate(TraceReader().profile, "cortex-m0")


# ---- against QEMU: the digits example's real firmware ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                    reason="qemu-system-arm / arm-none-eabi-gcc not installed")
def test_example_step_traced_agrees_with_the_firmwares_own_count(tmp_path):
    import tinytrain

    r = tinytrain.build(str(REPO / "tinytrain.yaml.example"), cache_dir=tmp_path / "cache",
                        build={"out_dir": str(tmp_path / "out")})  # 3 epochs: the trace is < 20 % of the run
    doc = json.loads((r.out_dir / "emulate-run" / "run.json").read_text())
    est = doc["cycles_per_step_estimate"]
    assert est["traced"], est
    # The outside reference: the firmware's SysTick count of the same step (40-instruction ticks; the trace window
    # leaves out the sample read, a few hundred instructions).
    assert est["instructions_traced"] == pytest.approx(doc["instructions"]["per_step_min"], rel=0.01)
    mix = est["mix"]
    classes = sum(v for k, v in mix.items() if k not in ("branch_taken", "branch_not_taken", "registers_multiple"))
    assert classes == est["instructions_traced"]
    assert mix["branch_taken"] + mix["branch_not_taken"] == mix["branch"]
    m4, m7 = est["by_core"]["cortex-m4"]["cycles"], est["by_core"]["cortex-m7"]["cycles"]
    assert est["instructions_traced"] < m7 < m4 and est["cycles_per_step"] == m7
    assert "cycles/step est. (cortex-m7)" in doc["summary"]


def test_emulate_run_traces_only_when_cheap(monkeypatch):
    from types import SimpleNamespace

    from tinytrain.stages import emulate_run
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    seen = []

    def fake_trace(board, elf, files, workdir, **kw):
        seen.append(files["runtime.bin"])
        return {"cpu": board.cpu, "cycles_per_step": 7, "trace_wall_s": 0.1}

    monkeypatch.setattr(emulate_run.cycles, "estimate_step", fake_trace)

    def decide(board: str, per_step: int, total: int) -> dict:
        ctx = SimpleNamespace(progress=lambda *a, **k: None)
        return emulate_run.cycle_estimate(get_board(board), Path("fw.elf"), {"train.ttds": b""},
                                          RuntimeConfig(0.01, 3), {"instructions_per_step_max": per_step},
                                          SimpleNamespace(instructions=total), 60.0, ctx)

    assert decide("host", 0, 0)["traced"] is False
    # MobileNetV2-like: 162 M per step, 16 G in the run -> a trace would be ~60 % of it
    big = decide("stm32f746-disco", 162_000_000, 16_000_000_000)
    assert big["traced"] is False and "20%" in big["reason"] and not seen
    # the digits example: 306 k per step, 1.4 G in the run
    small = decide("m4-256k", 306_000, 1_400_000_000)
    assert small == {"traced": True, "cpu": "cortex-m4", "cycles_per_step": 7}   # no wall time in the artifact
    one = RuntimeConfig(0.01, 1, flags=0, stop_after_steps=1).to_bytes()
    assert seen == [one]       # one step, no evaluation
