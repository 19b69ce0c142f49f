"""Flash and SRAM use of a linked program, read from its ELF file's sections and symbols (cross-compile's size
report: what `build` prints and what "does not fit" is measured against)."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinytrain.pipeline.errors import StageFailed
from tinytrain.stages.device.boards import Board


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    flags: int
    addr: int
    size: int
    index: int


@dataclass(frozen=True)
class ElfSymbol:
    name: str
    value: int
    size: int
    type: int   # 1 object, 2 function
    shndx: int


SHT_SYMTAB, SHT_NOBITS = 2, 8
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4


def read_elf(path: Path) -> tuple[list[ElfSection], list[ElfSymbol]]:
    """Section headers and symbols of a little-endian ELF32 or ELF64 file (all we need of ELF)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[5] != 1:
        raise StageFailed(f"{path} is not a little-endian ELF file")
    is64 = data[4] == 2
    if is64:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sh_fmt, sym_fmt, sym_size = "<IIQQQQIIQQ", "<IBBHQQ", 24
    else:
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
        sh_fmt, sym_fmt, sym_size = "<IIIIIIIIII", "<IIIBBH", 16
    raw = [struct.unpack_from(sh_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    strtab_off = raw[shstrndx][4]

    def cstr(off: int) -> str:
        end = data.index(b"\0", off)
        return data[off:end].decode("utf-8", "replace")

    sections = [ElfSection(cstr(strtab_off + r[0]), r[1], r[2], r[3], r[5], i) for i, r in enumerate(raw)]
    symbols: list[ElfSymbol] = []
    for r in raw:
        if r[1] != SHT_SYMTAB:
            continue
        str_off = raw[r[6]][4]
        for k in range(r[5] // sym_size):
            off = r[4] + k * sym_size
            if is64:
                name, info, _other, shndx, value, size = struct.unpack_from(sym_fmt, data, off)
            else:
                name, value, size, info, _other, shndx = struct.unpack_from(sym_fmt, data, off)
            if size and (info & 0xF) in (1, 2):
                symbols.append(ElfSymbol(cstr(str_off + name), value, size, info & 0xF, shndx))
    return sections, symbols


def size_report(board: Board, elf: Path) -> dict[str, Any]:
    """Flash and SRAM use by section and by region, checked against the board.

    flash = .isr_vector + .text (+ unwind tables, init arrays) + .rodata + the .data image;
    SRAM = .stack + .data + .bss + .heap. Sections that are not loaded (debug info) do not count.
    """
    sections, symbols = read_elf(elf)
    table: dict[str, dict[str, Any]] = {}
    flash = {"vectors": 0, "text": 0, "rodata": 0, "data": 0}
    sram = {"stack": 0, "data": 0, "bss": 0, "heap": 0}
    region_of: dict[int, str] = {}
    for s in sections:
        if not s.flags & SHF_ALLOC or (s.size == 0 and s.name not in (".heap", ".stack")):
            continue
        in_ram = s.addr >= board.sram_origin if not board.host else bool(s.flags & SHF_WRITE)
        if not in_ram:
            key = ("vectors" if s.name == ".isr_vector" else
                   "rodata" if s.name.startswith(".rodata") else "text")
            flash[key] += s.size
            region = "flash"
        elif s.name == ".stack":
            sram["stack"] += s.size
            region = "sram"
        elif s.name == ".heap":
            sram["heap"] += s.size
            region = "sram"
        elif s.type == SHT_NOBITS:
            sram["bss"] += s.size
            region = "sram"
        else:  # initialised data: lives in SRAM, its initial image in flash
            sram["data"] += s.size
            flash["data"] += s.size
            region = "sram+flash"
        region_of[s.index] = region
        table[s.name] = {"addr": s.addr, "size": s.size, "region": region}

    def top(region: str) -> list[dict[str, Any]]:
        syms = [y for y in symbols if region in region_of.get(y.shndx, "")]
        syms.sort(key=lambda y: (-y.size, y.name))
        return [{"name": y.name, "size": y.size, "kind": "function" if y.type == 2 else "object"} for y in syms[:10]]

    flash_used, sram_used = sum(flash.values()), sum(sram.values())
    report: dict[str, Any] = {
        "board": board.name,
        "host": board.host,
        "sections": table,
        "flash": {**flash, "parts": list(flash), "used": flash_used,
                  "available": board.flash_bytes or None,
                  "free": board.flash_bytes - flash_used if board.flash_bytes else None},
        "sram": {**sram, "parts": list(sram), "used": sram_used,
                 "available": board.sram_bytes or None,
                 "free": board.sram_bytes - sram_used if board.sram_bytes else None,
                 "static": sram["data"] + sram["bss"]},
        "top_symbols": {"flash": top("flash"), "sram": top("sram")},
    }
    report["fits"] = board.host or (flash_used <= board.flash_bytes and sram_used <= board.sram_bytes)
    return report

