"""A cycle estimate for one training step, from QEMU's own execution log (issue 14, item 2).

QEMU counts instructions, not cycles. Debian's QEMU 7.2 ships no TCG plugin header, so instead of a
plugin we read QEMU's logging: `-d in_asm,exec,nochain` prints every translation block (TB) once, as
disassembled instructions ("IN:" blocks), and a "Trace" line each time a TB starts executing
(`nochain` makes every execution go through the logging path). From that we get, per TB, its
instructions and how often it ran; whether a TB that ends in a branch took it is read off the
address of the TB that ran next. Each instruction is put in a class and costed with a table for the
Cortex-M4 and one for the Cortex-M7.

Two corrections keep the counts exact: a TB whose execution QEMU rewinds to recompile it for an I/O
access ("cpu_io_recompile: rewound execution of TB to X") ran only its instructions before X, and a
TB announced by "Trace" but then not entered ("Stopped execution of TB chain before ...") did not run.
An exception taken in the middle of a TB is not corrected for (none happens inside a training step).

The window: only the TBs between the first entry into `start_symbol` and the following entry into
`stop_symbol` count (the Trace line carries the symbol of the TB's function). For a training step
that is `tt_train_sample` up to `tt_progress`: the forward, backward and update of the first step
(every sample of the batch) and the loss write; the sample read (`tt_ttds_next`) is outside it.

Cost tables (zero-wait-state memory: TCM / SRAM / flash behind a cache that never misses; no
interrupts; the barrel shifter and IT folding ignored):

  Cortex-M4 -- ARM Cortex-M4 Technical Reference Manual (DDI 0439, r0p1), Table 3-1 "Cortex-M4
  instruction set summary" and the FPU chapter's instruction table: ALU, saturating, packing and all
  multiplies incl. the long and DSP MACs (SMLAD, SMLAL, SMULxy ...) 1 cycle; SDIV/UDIV 2-12 (early
  termination: we charge the upper end, 12); LDR/STR (any width) 2, but 1 when it follows another
  single load/store ("neighbouring load and store single instructions can pipeline their address
  and data phases"); LDRD/STRD 3; LDM/STM/PUSH/POP 1+N; a branch taken 1+P, not taken 1; TBB/TBH
  2+P; a load into PC (POP {..,pc}, LDR pc) adds P; P, the pipeline refill, is 1-3 in the TRM: we
  take 2. FPU: VADD/VSUB/VMUL/VNMUL/VABS/VNEG/VCMP/VCVT/VMOV/VMRS 1, VMLA/VMLS/VNMLA/VNMLS/VFMA/VFMS
  3, VDIV/VSQRT 14, VLDR/VSTR 2, VLDM/VSTM/VPUSH/VPOP 1+N (N in 32-bit words).

  Cortex-M7 -- ARM does not publish a cycle table for the M7 (its TRM, DDI 0489, has none). We model
  it as a SINGLE-ISSUE pipelined core: every instruction issues in 1 cycle, including loads/stores
  (64-bit TCM/AXI interface: LDRD/STRD 1, LDM/STM/VLDM/VSTM ceil(N/2)), multiplies and MACs; SDIV/UDIV
  12 as on the M4; VMLA/VMLS (not fused: a multiply then an add) 2; VDIV/VSQRT 14 (not pipelined); a
  taken branch 2 (1 + one refill cycle: predicted by the branch target cache), not taken 1; a load
  into PC 2 extra. Dual issue is IGNORED (it would lower the figure, by up to 2x for ideal pairs) and
  so are result-latency stalls (load-use, MAC chains; they would raise it): the M7 figure is an
  issue-slot count, not a pipeline simulation.

  Cortex-M55 -- its TRM (Arm 101051) publishes no per-instruction cycle table either. Scalar code is modelled
  like the M7 above, single-issue (the M55's scalar pipeline is in-order): 1 cycle per instruction with its 64-bit
  TCM interface (LDRD/STRD 1, LDM/STM/VLDM/VSTM ceil(N/2)), SDIV/UDIV 12, VMLA 2, VDIV/VSQRT 14, a taken branch
  1 + P with P = 2, a load into PC 2 extra. Low-overhead loops (Armv8.1-M LOB): DLS and a WLS that enters its
  loop 1; a taken LE 1 -- ASSUMED: LOB exists so that the core can keep the loop's start and branch back without a
  refill; a WLS that skips its loop 1 + P.
  Helium (MVE): the M55 is a DUAL-BEAT implementation (two 32-bit beats per cycle), so every 128-bit vector
  instruction - loads and stores (VLDR/VSTR, 64 bits of TCM per cycle), integer and floating-point arithmetic,
  multiply-accumulate and across-vector reductions (VMLADAV, VADDV), VCVT, VPSEL, VCMP - takes 2 cycles. VPST and
  VCTP, and VMRS/VMSR of P0 (no vector data), take 1. Beat overlap between a vector load/store and the next
  arithmetic instruction (the architecture lets the two share cycles) is IGNORED: the MVE figure is an upper
  bound in that respect, as the M7's is in ignoring dual issue. All three tables live in `COSTS`, one fact each.

QEMU 7.2's disassembler (capstone) does not know most MVE encodings: it prints `.byte` for the first halfword and
then decodes the second halfword as an instruction of its own, or shows MVE loads/stores as coprocessor LDC/STC.
A block with any of those is re-walked from the raw halfwords the log shows (the Thumb length rule gives the true
boundaries) and each undecoded instruction is classed from its encoding (`classify_raw`), so the counts stay exact.

`python -m tinytrain.stages.device.cycles LOG` estimates from a saved log (QEMU's -D file).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

# ---- instruction classes -------------------------------------------------------------------------

CLASSES = ("alu", "mul_mac", "divide", "load", "load_pair", "load_multiple", "store", "store_pair",
           "store_multiple", "branch", "fp_arith", "fp_mac", "fp_div_sqrt", "fp_load", "fp_store",
           "fp_load_multiple", "fp_store_multiple", "barrier", "mve_load", "mve_store", "mve_vector",
           "mve_predicate", "other")
MVE_CLASSES = ("mve_load", "mve_store", "mve_vector", "mve_predicate")

_CONDS = ("eq", "ne", "cs", "hs", "cc", "lo", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt", "gt", "le", "al")

_MUL = {"mul", "mla", "mls", "smull", "umull", "smlal", "umlal", "umaal",
        "smulbb", "smulbt", "smultb", "smultt", "smulwb", "smulwt",
        "smlabb", "smlabt", "smlatb", "smlatt", "smlawb", "smlawt",
        "smlalbb", "smlalbt", "smlaltb", "smlaltt",
        "smlad", "smladx", "smlsd", "smlsdx", "smuad", "smuadx", "smusd", "smusdx",
        "smlald", "smlaldx", "smlsld", "smlsldx", "smmul", "smmulr", "smmla", "smmlar", "smmls", "smmlsr",
        "usad8", "usada8"}
_DIV = {"sdiv", "udiv"}
_LOAD = {"ldr", "ldrb", "ldrh", "ldrsb", "ldrsh", "ldrex", "ldrexb", "ldrexh", "ldrt", "ldrbt", "ldrht",
         "ldrsbt", "ldrsht", "pld", "pli"}
_STORE = {"str", "strb", "strh", "strex", "strexb", "strexh", "strt", "strbt", "strht"}
_LDM = {"ldm", "ldmia", "ldmfd", "ldmdb", "ldmea", "pop"}
_STM = {"stm", "stmia", "stmea", "stmdb", "stmfd", "push"}
_BRANCH = {"b", "bl", "bx", "blx", "cbz", "cbnz", "tbb", "tbh", "le", "letp", "wls", "wlstp"}
_BARRIER = {"dsb", "dmb", "isb"}
_FP_MAC = {"vmla", "vmls", "vnmla", "vnmls", "vfma", "vfms", "vfnma", "vfnms"}
_FP_DIV = {"vdiv", "vsqrt"}
_FP_LOAD, _FP_STORE = {"vldr"}, {"vstr"}
_FP_LDM, _FP_STM = {"vldm", "vldmia", "vldmdb", "vpop"}, {"vstm", "vstmia", "vstmdb", "vpush"}
_OTHER = {"svc", "bkpt", "udf", "wfi", "wfe", "sev", "cpsid", "cpsie", "mrs", "msr"}
_KNOWN_ALU = {"it", "nop", "teq", "tst", "cmp", "cmn", "mov", "movw", "movt", "mvn", "add", "addw", "adc", "sub",
              "subw", "sbc", "rsb", "and", "orr", "orn", "eor", "bic", "lsl", "lsr", "asr", "ror", "rrx", "adr",
              "clz", "rbit", "rev", "rev16", "revsh", "sxtb", "sxth", "uxtb", "uxth", "sxtab", "sxtah", "uxtab",
              "uxtah", "sxtb16", "uxtb16", "sxtab16", "uxtab16", "bfi", "bfc", "sbfx", "ubfx", "ssat", "usat",
              "ssat16", "usat16", "qadd", "qsub", "qdadd", "qdsub", "pkhbt", "pkhtb", "sel", "sadd16", "ssub16",
              "sadd8", "ssub8", "uadd16", "usub16", "uadd8", "usub8", "qadd16", "qsub16", "qadd8", "qsub8",
              "shadd16", "shsub16", "uhadd16", "uhsub16", "sasx", "ssax", "uasx", "usax", "qasx", "qsax", "neg"}
_ALL = (_MUL | _DIV | _LOAD | _STORE | _LDM | _STM | _BRANCH | _BARRIER | _FP_MAC | _FP_DIV | _FP_LOAD
        | _FP_STORE | _FP_LDM | _FP_STM | _OTHER | _KNOWN_ALU)


@dataclass(frozen=True)
class Insn:
    addr: int
    size: int          # bytes: 2 or 4
    mnemonic: str      # as disassembled, e.g. "ldr.w", "smlad", "vmla.f32", "bne"
    operands: str
    base: str          # without width qualifier, condition, flag-setting `s`, FP type: "ldr", "b", "vmla"
    cls: str           # one of CLASSES
    regs: int = 0      # registers (32-bit words) moved by a multiple load/store
    writes_pc: bool = False   # a branch, or a load / move into PC
    conditional: bool = False
    raw: tuple[int, ...] = ()  # the halfwords as the log shows them


def _strip(m: str) -> tuple[str, bool]:
    """Mnemonic -> (base, conditional). "ldr.w" -> "ldr", "bne" -> "b", "subs" -> "sub", "vmla.f32" -> "vmla"."""
    m = m.lower().split(".", 1)[0]
    if m in _ALL:
        return m, False
    if len(m) > 2 and m[-2:] in _CONDS:       # inside an IT block, or a conditional branch
        c = m[:-2]
        if c in _ALL:
            return c, True
        if c.endswith("s") and c[:-1] in _ALL:
            return c[:-1], True
    if m.endswith("s") and m[:-1] in _ALL:     # flag-setting form: adds, lsls, muls, ...
        return m[:-1], False
    return m, False


def _reglist(operands: str) -> tuple[int, bool]:
    """{r4, r5, pc} -> (3, True); {d8, d9} -> (4 words, False); {s0-s3} -> 4."""
    m = re.search(r"\{([^}]*)\}", operands)
    if not m:
        return 0, False
    words, pc = 0, False
    for part in (p.strip() for p in m.group(1).split(",") if p.strip()):
        scale = 2 if part.startswith("d") else 1
        rng = re.fullmatch(r"([a-z]+)(\d+)\s*-\s*[a-z]+(\d+)", part)
        words += scale * (int(rng.group(3)) - int(rng.group(2)) + 1) if rng else scale
        pc = pc or part == "pc"
    return words, pc


# Mnemonic sets -> class, tried in this order; the multiple loads / stores count the registers they move.
_BY_NAME = ((_MUL, "mul_mac"), (_DIV, "divide"), (_LOAD, "load"), ({"ldrd"}, "load_pair"), ({"strd"}, "store_pair"),
            (_STORE, "store"), (_LDM, "load_multiple"), (_STM, "store_multiple"), (_BRANCH, "branch"),
            (_FP_MAC, "fp_mac"), (_FP_DIV, "fp_div_sqrt"), (_FP_LOAD, "fp_load"), (_FP_STORE, "fp_store"),
            (_FP_LDM, "fp_load_multiple"), (_FP_STM, "fp_store_multiple"), (_BARRIER, "barrier"))
_MULTIPLE = ("load_multiple", "store_multiple", "fp_load_multiple", "fp_store_multiple")


def classify(addr: int, size: int, mnemonic: str, operands: str) -> Insn:
    base, cond = _strip(mnemonic)
    ops = operands.strip().lower()
    first = ops.split(",", 1)[0].strip()
    regs, writes_pc = 0, False
    cls = next((c for names, c in _BY_NAME if base in names), None)
    if cls in _MULTIPLE:
        regs, pc = _reglist(ops)
        writes_pc = pc and cls == "load_multiple"
    elif cls in ("load", "branch"):
        writes_pc = cls == "branch" or first == "pc"
    elif cls is None and base.startswith("v"):   # MVE: one capstone does know (VAND, VDUP ...) on q registers
        cls = "mve_vector" if re.search(r"\bq\d", ops) else "fp_arith"
    elif cls is None:
        cls = "other" if base in _OTHER else "alu"
        writes_pc = cls == "alu" and first == "pc" and base in ("mov", "add")
    if base in ("ldrd",) and first == "pc":
        writes_pc = True
    return Insn(addr, size, mnemonic, operands, base, cls, regs, writes_pc, cond)


_INSN_RE = re.compile(r"^0x([0-9a-f]+):\s+([0-9a-f]{4})((?: [0-9a-f]{4})?)\s+(\S+)\s*(.*?)\s*$")

# What capstone prints for an encoding it does not decode (MVE): the raw first halfword, or the coprocessor
# instructions whose space MVE reuses (an M-profile core without a coprocessor never runs the real ones).
_UNDECODED = {".byte", ".short", ".hword", ".word", ".inst", "ldc", "ldc2", "ldcl", "ldc2l", "stc", "stc2", "stcl",
              "stc2l", "cdp", "cdp2", "mcr", "mcr2", "mrc", "mrc2", "mcrr", "mcrr2", "mrrc", "mrrc2"}


def _is_wide(first: int) -> bool:
    """Thumb: a halfword whose top five bits are 11101, 11110 or 11111 starts a 32-bit instruction."""
    return (first >> 11) in (0b11101, 0b11110, 0b11111)


def parse_insn(line: str) -> Insn | None:
    """One instruction line of an "IN:" block: `0x00000884:  e92d 4ff0  push.w   {r4, lr}` (Thumb)."""
    m = _INSN_RE.match(line)
    if not m:
        return None
    first = int(m.group(2), 16)
    raw = (first, int(m.group(3), 16)) if m.group(3).strip() else (first,)
    size = 4 if _is_wide(first) else 2
    i = classify(int(m.group(1), 16), size, m.group(4), m.group(5))
    return Insn(i.addr, i.size, i.mnemonic, i.operands, i.base, i.cls, i.regs, i.writes_pc, i.conditional, raw)


def classify_raw(addr: int, h1: int, h2: int | None) -> Insn:
    """An instruction capstone did not decode, from its encoding (Armv8.1-M ARM): the low-overhead-loop branches
    and MVE. 16-bit ones (never MVE) are `other`."""
    def insn(base: str, cls: str, writes_pc: bool = False) -> Insn:
        raw = (h1,) if h2 is None else (h1, h2)
        return Insn(addr, 2 * len(raw), base, " ".join(f"{h:04x}" for h in raw), base, cls, 0, writes_pc, False, raw)

    if h2 is None:
        return insn("undecoded16", "other")
    if (h1 & 0xFFD0) == 0xF040 and (h2 & 0xF001) == 0xE001:
        return insn("dls", "alu")                          # DLS / DLSTP: sets LR, no branch
    if (h1 & 0xFFD0) == 0xF040 and (h2 & 0xF001) == 0xC001:
        return insn("wls", "branch", True)                 # WLS / WLSTP: branches past the loop when LR = 0
    if (h1 & 0xFFCF) == 0xF00F and (h2 & 0xF001) == 0xC001:
        return insn("le", "branch", True)                  # LE / LETP: back to the loop start while LR > 1
    if (h1 & 0xFFC0) == 0xF000 and h2 == 0xE801:
        return insn("vctp", "mve_predicate")
    if (h1 & 0xFFBF) == 0xFE31 and (h2 & 0x1FFF) == 0x0F4D:
        return insn("vpst", "mve_predicate")
    if (h1 & 0xFFEF) == 0xEEED and (h2 & 0x0FFF) == 0x0A10:
        return insn("vmsr" if not h1 & 0x10 else "vmrs", "fp_arith")  # VMSR/VMRS P0 (or VPR): a register move
    if (h1 & 0xEE00) == 0xEC00 and ((h2 >> 9) & 0x7) == 0x7:
        # VLDR/VSTR of a Q register, widening/narrowing, gather/scatter: the LDC/STC-shaped space, coprocessor 14/15
        return insn("vldr" if h1 & 0x10 else "vstr", "mve_load" if h1 & 0x10 else "mve_store")
    if (h1 & 0xEF00) == 0xEE00 or (h1 & 0xEF00) == 0xEF00 or (h1 & 0xEC00) == 0xEC00:
        return insn("mve", "mve_vector")                   # vector data processing, incl. VMLADAV, VCVT, VPSEL
    return insn("undecoded", "other")


def realign(insns: list[Insn]) -> list[Insn]:
    """A block as capstone listed it -> the instructions that really ran: when any line is undecoded (an MVE
    encoding), re-walk the block's halfwords from its start with the Thumb length rule, keeping capstone's decoding
    where it started an instruction of the right size at the right address and classing the rest from their
    encodings. Blocks without undecoded lines are returned as they are (all M4/M7 code)."""
    if not any(i.base in _UNDECODED or i.mnemonic.lower() in _UNDECODED for i in insns):
        return insns
    hw: dict[int, int] = {}
    for i in insns:
        for k, h in enumerate(i.raw):
            hw.setdefault(i.addr + 2 * k, h)
    listed = {i.addr: i for i in insns}
    out: list[Insn] = []
    a = insns[0].addr
    while a in hw:
        h1 = hw[a]
        wide = _is_wide(h1)
        if wide and a + 2 not in hw:
            break                                          # the block's bytes end mid-instruction: not executed
        known = listed.get(a)
        if known is not None and known.size == (4 if wide else 2) and known.base not in _UNDECODED \
                and known.mnemonic.lower() not in _UNDECODED:
            out.append(known)
        else:
            out.append(classify_raw(a, h1, hw[a + 2] if wide else None))
        a += 4 if wide else 2
    return out


# ---- cost tables ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostModel:
    name: str
    cpu: str
    refill: int          # P: cycles to refill the pipeline after a taken branch / PC write
    fixed: dict[str, int]  # class -> cycles (classes whose cost does not depend on context)
    load_store: int      # a single LDR/STR ...
    load_store_pipelined: int  # ... that follows another single LDR/STR
    pair: int            # LDRD / STRD
    multiple_base: int   # LDM/STM: base + per_reg(N)
    per_two_regs: bool   # True: ceil(N/2) (64-bit path), False: N
    branch_not_taken: int
    branch_taken: int    # including the refill
    table_branch: int    # TBB/TBH (taken by definition), including the refill
    source: str
    vector: bool = False  # runs Helium (MVE): the only tables that can cost a trace with MVE instructions
    loop_end_taken: int = 0  # LE back to the loop start (low-overhead loops, Armv8.1-M only)

    def static_cost(self, insns: list[Insn]) -> int:
        """Cycles of a run of instructions, a taken branch at the end counted as NOT taken (see taken_extra)."""
        total, prev_single = 0, False
        for i in insns:
            single = i.cls in ("load", "store")
            if single:
                c = self.load_store_pipelined if prev_single else self.load_store
            elif i.cls in ("load_pair", "store_pair"):
                c = self.pair
            elif i.cls in ("load_multiple", "store_multiple", "fp_load_multiple", "fp_store_multiple"):
                n = max(i.regs, 1)
                c = self.multiple_base + (math.ceil(n / 2) if self.per_two_regs else n)
            elif i.cls == "branch":
                c = self.table_branch if i.base in ("tbb", "tbh") else self.branch_not_taken
            else:
                c = self.fixed[i.cls]
            if i.writes_pc and i.cls != "branch":
                c += self.refill  # POP {.., pc}, LDR pc, MOV pc: always a refill
            total += c
            prev_single = single
        return total

    def taken_extra(self, last: Insn) -> int:
        """Extra cycles when the TB's last instruction, a branch, was taken."""
        if last.base in ("le", "letp") and self.loop_end_taken:
            return self.loop_end_taken - self.branch_not_taken
        if last.cls == "branch" and last.base not in ("tbb", "tbh"):
            return self.branch_taken - self.branch_not_taken
        return 0


_COMMON_FIXED = {"alu": 1, "mul_mac": 1, "divide": 12, "barrier": 1, "other": 1, "fp_arith": 1,
                 "fp_div_sqrt": 14}
# Helium on the dual-beat Cortex-M55: 4 beats per 128-bit instruction, 2 per cycle; VPST / VCTP have no vector data.
MVE_DUAL_BEAT = {"mve_load": 2, "mve_store": 2, "mve_vector": 2, "mve_predicate": 1}

COSTS: dict[str, CostModel] = {
    "cortex-m4": CostModel(
        "cortex-m4", "cortex-m4", refill=2,
        fixed={**_COMMON_FIXED, "fp_mac": 3, "fp_load": 2, "fp_store": 2},
        load_store=2, load_store_pipelined=1, pair=3, multiple_base=1, per_two_regs=False,
        branch_not_taken=1, branch_taken=1 + 2, table_branch=2 + 2,
        source="ARM Cortex-M4 TRM (DDI 0439) Table 3-1 and the FPU instruction table; P=2, divides 12"),
    "cortex-m7": CostModel(
        "cortex-m7", "cortex-m7", refill=2,
        fixed={**_COMMON_FIXED, "fp_mac": 2, "fp_load": 1, "fp_store": 1},
        load_store=1, load_store_pipelined=1, pair=1, multiple_base=0, per_two_regs=True,
        branch_not_taken=1, branch_taken=2, table_branch=1 + 2,
        source="single-issue model (ARM publishes no M7 cycle table): 1 cycle per instruction, 64-bit "
               "loads/stores, taken branch 2, VMLA 2, VDIV/VSQRT 14, divides 12; dual issue and stalls ignored"),
    "cortex-m55": CostModel(
        "cortex-m55", "cortex-m55", refill=2,
        fixed={**_COMMON_FIXED, "fp_mac": 2, "fp_load": 1, "fp_store": 1, **MVE_DUAL_BEAT},
        load_store=1, load_store_pipelined=1, pair=1, multiple_base=0, per_two_regs=True,
        branch_not_taken=1, branch_taken=1 + 2, table_branch=1 + 2, vector=True, loop_end_taken=1,
        source="in-order single-issue scalar model (ARM publishes no M55 cycle table): 1 cycle per instruction, "
               "64-bit TCM loads/stores, taken branch 1+P (P=2), LE 1 (cached loop start), VMLA 2, VDIV/VSQRT 14, "
               "divides 12; Helium dual-beat: 2 cycles per vector instruction (VPST/VCTP 1), beat overlap ignored"),
}

ASSUMPTIONS = ("zero-wait-state memory (TCM/SRAM, flash behind an ART/cache that never misses), no interrupts; "
               "M4: the TRM's Table 3-1 with pipeline refill P=2 and SDIV/UDIV at their 12-cycle upper bound; "
               "M7: single-issue issue-slot count (dual issue ignored, result-latency stalls ignored); "
               "M55: single-issue scalar, Helium dual-beat (2 cycles per 128-bit vector instruction, beat overlap "
               "ignored), zero-wait ITCM/DTCM")


# ---- the trace -----------------------------------------------------------------------------------

@dataclass
class _Block:
    insns: list[Insn]

    @property
    def fallthrough(self) -> int:
        last = self.insns[-1]
        return last.addr + last.size

    @property
    def ends_in_branch(self) -> bool:
        return self.insns[-1].writes_pc


@dataclass
class TraceProfile:
    """What ran inside the window: per TB, its instructions, executions and taken final branches."""
    blocks: list[_Block] = field(default_factory=list)
    runs: Counter = field(default_factory=Counter)          # block index -> full executions
    taken: Counter = field(default_factory=Counter)         # block index -> executions whose last branch was taken
    partial: Counter = field(default_factory=Counter)       # (block index, instructions run) -> count
    opened: bool = False
    closed: bool = False

    @property
    def instructions(self) -> int:
        return (sum(len(self.blocks[b].insns) * n for b, n in self.runs.items())
                + sum(k * n for (_, k), n in self.partial.items()))

    def mix(self) -> dict[str, int]:
        """Executed instructions per class; branches split into taken / not taken; registers moved by
        multiple loads/stores."""
        out: Counter = Counter()
        for b, n in self.runs.items():
            blk = self.blocks[b]
            for i in blk.insns:
                out[i.cls] += n
                if i.regs:
                    out["registers_multiple"] += n * i.regs
            if blk.insns[-1].cls == "branch":
                out["branch_taken"] += self.taken[b]
                out["branch_not_taken"] += n - self.taken[b]
        for (b, k), n in self.partial.items():
            for i in self.blocks[b].insns[:k]:
                out[i.cls] += n
        return {k: int(out[k]) for k in (*CLASSES, "branch_taken", "branch_not_taken", "registers_multiple")
                if out[k]}

    def cycles(self, model: CostModel) -> int:
        total = 0
        for b, n in self.runs.items():
            blk = self.blocks[b]
            total += n * model.static_cost(blk.insns) + self.taken[b] * model.taken_extra(blk.insns[-1])
        for (b, k), n in self.partial.items():
            total += n * model.static_cost(self.blocks[b].insns[:k])
        return total


_TRACE_RE = re.compile(r"^Trace \d+: (0x[0-9a-f]+) \[([0-9a-f]+)/([0-9a-f]+)/([0-9a-f]+)/([0-9a-f]+)\] ?(\S*)")
_REWOUND_RE = re.compile(r"^cpu_io_recompile: rewound execution of TB to ([0-9a-f]+)")
_STOPPED_RE = re.compile(r"^Stopped execution of TB chain before (0x[0-9a-f]+)")


# a training step starts in either entry: a driver whose model input is fed row by row (streams.fed_inputs)
# calls tt_train_sample_rows
TRAIN_ENTRIES = ("tt_train_sample", "tt_train_sample_rows")


class TraceReader:
    """Consumes QEMU's `-d in_asm,exec,nochain` log line by line (`feed`), counting only inside the
    window [first TB of `start_symbol`, next TB of `stop_symbol`). `start_symbol=None` counts from the
    first TB, `stop_symbol=None` to the end."""

    def __init__(self, start_symbol: str | tuple[str, ...] | None = TRAIN_ENTRIES,
                 stop_symbol: str | None = "tt_progress"):
        self.start = (start_symbol,) if isinstance(start_symbol, str) else start_symbol
        self.stop = stop_symbol
        self.profile = TraceProfile(opened=start_symbol is None)
        self._by_line: dict[str, int] = {}    # Trace line -> block index (a TB prints the same line each run)
        self._pending: list[Insn] | None = None  # the "IN:" block being read / not yet bound to its TB
        self._reading = False
        self._prev: int | None = None         # block index of the last counted execution (branch outcome)
        self._last_line: str | None = None

    def feed(self, line: str) -> None:
        if line.startswith("Trace "):
            self._trace(line)
        elif self._reading:
            insn = parse_insn(line)
            if insn is not None:
                assert self._pending is not None
                self._pending.append(insn)
            elif not line.strip():
                self._reading = False
        elif line.startswith("IN:"):
            self._pending, self._reading = [], True
        elif line.startswith("cpu_io_recompile"):
            self._rewound(line)
        elif line.startswith("Stopped execution"):
            self._stopped(line)

    def feed_all(self, lines: Iterable[str]) -> TraceProfile:
        for ln in lines:
            self.feed(ln.rstrip("\n"))
        return self.profile

    def _trace(self, line: str) -> None:
        p = self.profile
        if p.closed:
            return
        self._reading = False
        key = line.rstrip("\n")
        info = self._by_line.get(key)
        if self._pending or info is None:
            m = _TRACE_RE.match(key)
            if m is None:
                return
            pc = int(m.group(3), 16)
            if self._pending and pc == self._pending[0].addr:  # the translation just logged is this TB's
                p.blocks.append(_Block(realign(self._pending)))
                info = self._by_line[key] = (len(p.blocks) - 1, m.group(6), pc)
                self._pending = None
            if info is None:
                raise ValueError(f"QEMU trace: the TB at {pc:#x} ran without its instructions in the log "
                                 "(run with -d in_asm,exec,nochain from the start)")
        idx, symbol, pc = info
        if not p.opened:
            if symbol not in self.start:
                return
            p.opened = True
        elif self.stop is not None and symbol == self.stop:
            self._close_branch(pc)
            p.closed = True
            return
        self._close_branch(pc)
        p.runs[idx] += 1
        self._prev, self._last_line = idx, key

    def _close_branch(self, next_pc: int) -> None:
        """The previous TB's last instruction wrote PC: it was taken when the next TB is not its fall-through."""
        if self._prev is not None:
            blk = self.profile.blocks[self._prev]
            if blk.ends_in_branch and next_pc != blk.fallthrough:
                self.profile.taken[self._prev] += 1
        self._prev = None

    def _rewound(self, line: str) -> None:
        m = _REWOUND_RE.match(line)
        p = self.profile
        if not m or self._prev is None or p.closed:
            return
        blk = p.blocks[self._prev]
        to = int(m.group(1), 16)
        k = sum(1 for i in blk.insns if i.addr < to)
        p.runs[self._prev] -= 1
        if k:
            p.partial[(self._prev, k)] += 1
        self._prev = None  # it ended mid-block: no branch outcome

    def _stopped(self, line: str) -> None:
        m = _STOPPED_RE.match(line)
        p = self.profile
        if not m or self._prev is None or self._last_line is None or p.closed:
            return
        if self._last_line.split(" ", 3)[2] == m.group(1):  # that TB was announced but not entered
            p.runs[self._prev] -= 1
            self._prev = None


# ---- report --------------------------------------------------------------------------------------

def estimate(profile: TraceProfile, cpu: str, clock_hz: int | None = None) -> dict[str, Any]:
    """run.json's `cycles_per_step_estimate`: cycles on `cpu` (and the other core for comparison),
    the instruction mix, CPI, and ms at `clock_hz`."""
    if cpu not in COSTS:
        raise ValueError(f"no cycle table for {cpu!r} (have {', '.join(COSTS)})")
    n = profile.instructions
    mix = profile.mix()
    has_mve = any(mix.get(c) for c in MVE_CLASSES)  # the other cores cannot run those: no figure for them
    per_model = {k: profile.cycles(m) for k, m in COSTS.items() if m.vector or not has_mve}
    if cpu not in per_model:
        raise ValueError(f"the trace has Helium (MVE) instructions, which {cpu} does not have")
    cycles = per_model[cpu]
    doc: dict[str, Any] = {
        "cpu": cpu, "cycles_per_step": cycles, "instructions_traced": n,
        "cycles_per_instruction": round(cycles / n, 4) if n else None,
        "by_core": {k: {"cycles": v, "cpi": round(v / n, 4) if n else None, "source": COSTS[k].source}
                    for k, v in per_model.items()},
        "mix": mix,
        "assumptions": ASSUMPTIONS,
        "how": ("QEMU -d in_asm,exec,nochain over one training step (tt_train_sample up to tt_progress: "
                "forward, backward, update, loss write), each instruction costed by class (stages/device/cycles.py)"),
    }
    if clock_hz:
        doc.update(clock_hz=clock_hz, ms_per_step=cycles / clock_hz * 1e3)
    return doc


def estimate_step(board: Any, elf: Path, files: dict[str, bytes], workdir: Path, *, clock_hz: int | None = None,
                  timeout_s: float = 600.0) -> dict[str, Any]:
    """Trace one training step of `elf` on `board` in QEMU and estimate its cycles. `files` must make the firmware
    stop after one step without evaluating (runtime.bin flags 0, stop_after_steps 1): the trace then covers little
    more than the window."""
    from tinytrain.stages.device.launch import trace_firmware

    reader = TraceReader()
    _console, wall = trace_firmware(board, elf, workdir, files, reader.feed, lambda: reader.profile.closed,
                                    timeout_s=timeout_s)
    if not reader.profile.closed:
        raise RuntimeError(f"the QEMU trace ended before the first training step finished ({wall:.0f} s)")
    doc = estimate(reader.profile, board.cpu, clock_hz)
    doc["trace_wall_s"] = round(wall, 3)
    return doc


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tinytrain.stages.device.cycles",
                                 description="cycle estimate from a saved QEMU -d in_asm,exec,nochain log")
    ap.add_argument("log", type=Path)
    ap.add_argument("--cpu", default="cortex-m7", choices=sorted(COSTS))
    ap.add_argument("--start", default=",".join(TRAIN_ENTRIES), help="the window's first symbol(s), comma-separated")
    ap.add_argument("--stop", default="tt_progress")
    a = ap.parse_args(argv)
    with open(a.log, encoding="utf-8", errors="replace") as f:
        prof = TraceReader(tuple(a.start.split(",")) if a.start else None, a.stop or None).feed_all(f)
    doc = estimate(prof, a.cpu)
    print(f"{doc['instructions_traced']} instructions, {doc['cycles_per_step']} cycles on {a.cpu} "
          f"(CPI {doc['cycles_per_instruction']}); mix: {doc['mix']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["COSTS", "CostModel", "Insn", "MVE_CLASSES", "TraceProfile", "TraceReader", "classify", "classify_raw",
           "estimate", "estimate_step", "parse_insn", "realign"]
