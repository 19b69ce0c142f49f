"""The worst-case stack depth of a linked Cortex-M firmware, from its machine code (cross-compile sizes the stack
section with it instead of a fixed reserve).

    bound = stack_bound(elf)      # StackBound(bytes, chain, ...) or StackBoundError saying why not

How: `arm-none-eabi-objdump -d` of the linked ELF gives every function's instructions. A function's frame is the
most its own instructions move SP down (push / stmdb sp! / vpush / sub sp, #N / str ..., [sp, #-N]!), counted
from its entry; its depth is its frame plus the deepest of its callees (bl, and branches to another function:
tail calls). An indirect call (blx rN, bx rN) may reach any function whose address the program takes: a stored
address of a Thumb function (address | 1) in a loaded section but the vector table, or a movw/movt pair that builds
one. When the ELF keeps the link's relocations (cross-compile links with --emit-relocs), the stored addresses are the
words its absolute relocations (R_ARM_ABS32, R_ARM_TARGET1) wrote; a constant that merely equals a function's
address (a bias of 785 = tt_main | 1 in a weight table) is then no address. Without relocations every aligned word
counts, which can only over-estimate. The roots are the vector table's: the reset handler runs the program; each other handler may
interrupt it once, on top of the CPU's exception frame (26 words with the FPU's lazy context, + 4 bytes of
alignment). A handler that moves SP to a register's value (the fault handler re-bases SP at the stack top before
it reports) does not add to the program's depth: it needs only its own.

Everything is computed from the bytes of the ELF, so the same firmware always gets the same bound (the stage's
cache stays correct). The bound is an over-estimate of any run's measured high-water mark (every path the code
could take, not only the ones a run takes). A call into a function's own body (libgcc's assembly calls local
subroutines so) counts the frame twice. What it cannot bound it refuses to guess (cross-compile then keeps the
board's default stack and says why): recursion, an SP moved by a register amount (alloca, variable-length
arrays), an unknown SP write.
"""

from __future__ import annotations

import bisect
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

OBJDUMP = "arm-none-eabi-objdump"
# Exception entry with the FPU enabled and lazy stacking: R0-R3, R12, LR, PC, xPSR, S0-S15, FPSCR, reserved (26
# words), plus 4 bytes when SP was not 8-byte aligned.
EXCEPTION_FRAME = 26 * 4 + 4
ALIGN = 8  # AAPCS: SP is 8-byte aligned at public interfaces; the linker script aligns the stack section so

_FUNC_RE = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")
_INSN_RE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_TARGET_RE = re.compile(r"^(?:[a-z0-9]+,\s*)?([0-9a-f]+) <")
_IMM_RE = re.compile(r"#(-?(?:0x[0-9a-f]+|\d+))")
_BRANCHES = re.compile(r"^(b|bl|blx|cbz|cbnz)(eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al)?(\.n|\.w)?$")


class StackBoundError(Exception):
    """The stack depth cannot be bounded from the machine code (the message says which function and why)."""


@dataclass
class Function:
    name: str
    addr: int
    frame: int = 0                        # most bytes its own instructions push below its entry SP
    targets: set[int] = field(default_factory=set)   # addresses it branches to (b: tail calls or local jumps)
    bl_targets: set[int] = field(default_factory=set)  # addresses it calls (bl: a call even into itself)
    calls: set[str] = field(default_factory=set)     # functions among them (resolved by address_calls)
    indirect: bool = False                # has an indirect call (blx rN / bx rN)
    local_sub: bool = False               # calls into its own body (bl to a label inside it: libgcc's assembly)
    rebases: bool = False                 # moves SP to a register's value (mov sp, rN)
    dynamic: str | None = None            # an SP change it cannot bound, as disassembled
    consts: set[int] = field(default_factory=set)  # movw/movt pairs it builds


@dataclass
class StackBound:
    bytes: int                            # the stack the firmware needs, rounded up to ALIGN
    chain: list[str]                      # the deepest call chain (reset handler first)
    program_bytes: int                    # depth of the reset handler's call tree alone
    interrupt_bytes: int                  # what interrupts add on top (exception frames + handlers)
    indirect_targets: list[str]           # functions an indirect call may reach

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "program_bytes": self.program_bytes, "interrupt_bytes": self.interrupt_bytes,
                "deepest_chain": self.chain, "indirect_targets": self.indirect_targets,
                "how": "worst-case call graph of the linked machine code (stages/device/stack_bound.py)"}


def stack_bound(elf: Path, objdump: str = OBJDUMP) -> StackBound:
    if shutil.which(objdump) is None:
        raise StackBoundError(f"{objdump} is not installed")
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(elf)], capture_output=True, text=True,
                          errors="replace")
    if proc.returncode != 0:
        raise StackBoundError(f"{objdump} failed: {proc.stderr.strip()[:200]}")
    funcs = parse_disassembly(proc.stdout)
    words, vectors = _elf_words(Path(elf))
    return bound_of(funcs, words, vectors)


def parse_disassembly(text: str) -> dict[str, Function]:
    funcs: dict[str, Function] = {}
    cur: Function | None = None
    depth = 0
    movw: dict[str, int] = {}
    for line in text.splitlines():
        m = _FUNC_RE.match(line)
        if m:
            cur = funcs.setdefault(m.group(2), Function(m.group(2), int(m.group(1), 16)))
            depth, movw = 0, {}
            continue
        m = _INSN_RE.match(line)
        if cur is None or not m:
            continue
        mnem, ops = m.group(2), m.group(3).split(";")[0].split("@")[0].strip()
        if mnem.startswith("."):
            continue  # a literal pool word (.word/.short), not an instruction
        depth = _sp_effect(cur, mnem, ops, depth)
        cur.frame = max(cur.frame, depth)
        _calls(cur, mnem, ops)
        _consts(cur, mnem, ops, movw)
    resolve_calls(funcs)
    return funcs


def _reg_count(ops: str) -> int:
    """Bytes of a register list `{r4, r5, lr}` / `{d8-d15}` / `{s16-s31}`."""
    body = ops[ops.index("{") + 1:ops.index("}")]
    n = 0
    for part in (p.strip() for p in body.split(",")):
        size = 8 if part.startswith("d") else 4
        if "-" in part:
            a, b = part.split("-")
            n += (int(b.strip()[1:]) - int(a.strip()[1:]) + 1) * size
        else:
            n += size
    return n


def _imm(ops: str) -> int:
    m = _IMM_RE.search(ops)
    if m is None:
        raise ValueError(ops)
    return int(m.group(1), 0)


def _sp_effect(f: Function, mnem: str, ops: str, depth: int) -> int:
    """SP depth after one instruction (bytes below the function's entry SP)."""
    base = mnem.split(".")[0]
    if base in ("push", "vpush") or (ops.startswith("sp!") and base in ("stmdb", "stmfd", "vstmdb")):
        return depth + _reg_count(ops)
    if base in ("pop", "vpop") or (ops.startswith("sp!") and base in ("ldmia", "ldmfd", "ldm", "vldmia")):
        return max(0, depth - _reg_count(ops))
    if re.match(r"^(str|strd|strb|strh)$", base) and re.search(r"\[sp, #-\d+\]!", ops):
        return depth + -_imm(ops.split("[sp")[1])
    if re.match(r"^(ldr|ldrd)$", base) and re.search(r"\[sp\], #\d+", ops):
        return max(0, depth - _imm(ops.split("[sp]")[1]))
    if not re.match(r"^sp\s*,", ops):
        return depth  # SP is not the destination
    rest = [o.strip() for o in ops.split(",")[1:]]
    if base in ("sub", "subw", "add", "addw") and rest and rest[-1].startswith("#") and rest[0] in ("sp", rest[-1]):
        n = _imm(rest[-1])
        return depth + n if base.startswith("sub") else max(0, depth - n)
    if base == "mov" and len(rest) == 1 and re.match(r"^r\d+$|^ip$|^fp$|^sl$", rest[0]):
        f.rebases = True
        return depth
    f.dynamic = f.dynamic or f"{mnem} {ops}"
    return depth


def _calls(f: Function, mnem: str, ops: str) -> None:
    m = _BRANCHES.match(mnem)
    if m is None:
        if mnem.startswith("bx") or mnem.startswith("blx"):
            reg = ops.strip()
            if reg != "lr":
                f.indirect = True
        elif re.match(r"^(ldr|mov|pop|ldmia)", mnem) and re.search(r"\bpc\b", ops.split(",")[0] + "}"):
            if mnem.startswith("mov") or (mnem.startswith("ldr") and "[sp]" not in ops):
                f.indirect = True  # a jump through a register or a table (pop {.., pc} is a return)
        return
    if m.group(1) == "blx" and not _TARGET_RE.search(ops):
        f.indirect = True
        return
    t = _TARGET_RE.search(ops)
    if t is None:
        if m.group(1) in ("bl", "blx"):
            f.indirect = True
        return
    (f.bl_targets if m.group(1) in ("bl", "blx") else f.targets).add(int(t.group(1), 16))


def resolve_calls(funcs: dict[str, Function]) -> None:
    """A branch whose target lies in another function is a call (bl) or a tail call (b): by address, since
    objdump names a target after the nearest symbol, which may be an absolute one (__stack_size)."""
    starts = sorted((f.addr, f.name) for f in funcs.values())
    addrs = [a for a, _ in starts]
    for f in funcs.values():
        for t in f.targets | f.bl_targets:
            k = bisect.bisect_right(addrs, t) - 1
            if k < 0:
                raise StackBoundError(f"{f.name} branches to {t:#x}, before any function")
            if starts[k][1] != f.name:
                f.calls.add(starts[k][1])
            elif t in f.bl_targets:
                if t == f.addr:
                    f.calls.add(f.name)  # calls its own entry: recursion, refused by bound_of
                else:
                    f.local_sub = True


def _consts(f: Function, mnem: str, ops: str, movw: dict[str, int]) -> None:
    parts = [o.strip() for o in ops.split(",")]
    if mnem.startswith("movw") and len(parts) == 2 and parts[1].startswith("#"):
        movw[parts[0]] = _imm(parts[1]) & 0xFFFF
    elif mnem.startswith("movt") and len(parts) == 2 and parts[0] in movw:
        f.consts.add(((_imm(parts[1]) & 0xFFFF) << 16) | movw.pop(parts[0]))


# Relocation types that store a symbol's absolute address in a data word (ARM ELF ABI): R_ARM_ABS32, R_ARM_TARGET1.
_ABS_RELOCS = (2, 38)
SHT_REL, SHT_NOBITS = 9, 8


def _elf_words(path: Path) -> tuple[set[int], list[int]]:
    """The words of the loaded sections but the vector table that may hold a code address, and the vector table's
    words: with relocation sections, the words absolute relocations wrote; without, every aligned word."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 1 or data[5] != 1:
        raise StackBoundError(f"{path} is not a little-endian ELF32 file")
    shoff, = struct.unpack_from("<I", data, 0x20)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
    heads = [struct.unpack_from("<IIIIIIIIII", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]
    words: set[int] = set()
    vectors: list[int] = []
    relocated: dict[int, list[int]] = {}  # loaded section index -> offsets (in it) of words an absolute reloc wrote
    for _name, typ, _fl, _addr, off, size, _link, info, _al, entsize in heads:
        if typ == SHT_REL and heads[info][2] & 0x2:
            for k in range(0, size - size % (entsize or 8), entsize or 8):
                r_offset, r_info = struct.unpack_from("<II", data, off + k)
                if r_info & 0xFF in _ABS_RELOCS:
                    relocated.setdefault(info, []).append(r_offset - heads[info][3])
    has_relocs = any(h[1] == SHT_REL for h in heads)
    for index, (name_off, typ, flags, _addr, off, size, *_) in enumerate(heads):
        if not flags & 0x2 or typ == SHT_NOBITS:  # not loaded, or NOBITS (.bss, .stack): nothing stored
            continue
        name = data[names_off + name_off:data.index(b"\0", names_off + name_off)].decode()
        chunk = data[off:off + size - size % 4]
        if name == ".isr_vector":
            vectors = list(struct.unpack(f"<{len(chunk) // 4}I", chunk))
        elif has_relocs:
            words.update(struct.unpack_from("<I", chunk, o)[0] for o in relocated.get(index, ()) if o + 4 <= len(chunk))
        else:
            words.update(struct.unpack(f"<{len(chunk) // 4}I", chunk))
    if not vectors:
        raise StackBoundError(f"{path} has no .isr_vector section")
    return words, vectors


def bound_of(funcs: dict[str, Function], words: set[int], vectors: list[int]) -> StackBound:
    by_addr = {f.addr: f for f in funcs.values()}
    taken = set()
    for f in funcs.values():
        for v in f.consts:
            words.add(v)
    for v in words:
        if v & 1 and (v & ~1) in by_addr:
            taken.add(by_addr[v & ~1].name)
    indirect = sorted(taken)
    memo: dict[str, tuple[int, list[str]]] = {}
    active: list[str] = []

    def depth(name: str) -> tuple[int, list[str]]:
        if name in memo:
            return memo[name]
        f = funcs.get(name)
        if f is None:
            raise StackBoundError(f"a call reaches {name!r}, which is not a function of the program")
        if name in active:
            cycle = active[active.index(name):] + [name]
            raise StackBoundError(f"recursion: {' -> '.join(cycle)}")
        if f.dynamic:
            raise StackBoundError(f"{name} moves SP by an amount the code does not state: {f.dynamic}")
        active.append(name)
        callees = sorted(f.calls | (taken if f.indirect else set()))
        best, chain = 0, []
        for c in callees:
            d, ch = depth(c)
            if d > best:
                best, chain = d, ch
        active.pop()
        # a local subroutine runs on top of the body, and pushes no more than the body does: the frame counts twice
        memo[name] = (f.frame * (2 if f.local_sub else 1) + best, [name] + chain)
        return memo[name]

    if len(vectors) < 2 or (vectors[1] & ~1) not in by_addr:
        raise StackBoundError("the vector table's reset entry is not a function of the program")
    program, chain = depth(by_addr[vectors[1] & ~1].name)
    handlers = sorted({by_addr[v & ~1].name for v in vectors[2:] if v and (v & ~1) in by_addr})
    nested, alone = 0, 0
    for h in handlers:
        d, _ = depth(h)
        if funcs[h].rebases:
            alone = max(alone, EXCEPTION_FRAME + d)  # runs from the stack top, not on top of the program
        else:
            nested += EXCEPTION_FRAME + d  # each may interrupt the program (and the others) once
    total = max(program + nested, alone)
    return StackBound(-(-total // ALIGN) * ALIGN, chain, program, nested, indirect)
