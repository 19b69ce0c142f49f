"""cross-compile: the generated C program + kernel library + board support -> firmware.elf.

Inputs: the codegen stage's folder (every `*.c` there is compiled; its headers are on the include
path) and, when present, its `sources.json`:

    {"kernels": ["conv2d_int8.c", ...],   # kernel-library files (relative to kernels_c/) to build;
                                          # absent or null: every kernels_c/*.c and kernels_c/ops/*.c
     "defines": {"TT_ARENA_BYTES": "4096"},   # extra -D for every file
     "stack_bytes": 12288}                # stack the linker script reserves (default: the board's);
                                          # "auto": the worst-case depth of the linked code (stages/device/stack_bound.py)

Outputs: `firmware.elf` (for `host`, a native executable), `firmware.map`, `size.json` (flash and
SRAM by section and by region against the board; with "auto", `stack_bound`: how the stack was sized),
`build.json` (flags and source digests).
A program that does not fit fails with a UserError saying how many KB each region is over.

For an emulated board, also `host_eval.elf`: the same program (same generated C, same kernels, same -D flags)
built natively with the host's `cc` and the host board support. emulate-run evaluates accuracy on it instead of in
QEMU (-ffp-contract=off on both sides, no -ffast-math, no libm transcendental: bit-identical by construction, and
emulate-run checks a sample of evaluations against QEMU). Its units are compiled in the same pool as the
firmware's, so on two cores it costs little wall time. It is -O1 (HOST_EVAL_CFLAGS), not the host board's -O3 nor
BASE_CFLAGS' -O2: on MobileNetV2 the evaluation of 50 test samples takes 0.33 s of CPU at -O1 and at -O2 alike, while
-O1 compiles in two thirds of -O2's time (tt_conv2d.c 0.57 vs 0.89 s), and that compile is on the build's critical
path. A host build that fails
(e.g. a `target.cflags` flag the host compiler does not know) is not an error: build.json says why and
emulate-run evaluates in QEMU as before.

Kernel-library objects are kept across builds in the runner's unit cache (ObjectCache, keyed by the compiler, the
flags and every file of the staged library; the program's own files are always compiled), and `prewarm`, which the
runner starts when the first stage of a build runs, compiles them at low priority on a core the machine leaves idle
while sparse-plan and the planning run: on MobileNetV2 the stage then compiles little more than the program
(issue 14: the cold build). The objects are the same bytes either way, so the ELFs are.

Every build is reproducible byte for byte: sources are copied into a scratch folder and compiled
by relative path, so no absolute path reaches the ELF or the map, and an unchanged program keeps
the same digest (the emulate-run cache key depends on it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from tinytrain.pipeline.contract import StageContext, StageResult, no_progress
from tinytrain.pipeline.errors import StageFailed, UserError
from tinytrain.stages.c_emit import ops_header
from tinytrain.cache.fs_ops import new_tmp
from tinytrain.cache.keys import tool_identity, tree_digest
from tinytrain.stages.device.boards import BOARD_DIR, HOST_ISA_PROBE, Board, get_board, host_isa_flags
from tinytrain.stages.device.elf_size import size_report
from tinytrain.stages.device.stack_bound import ALIGN, StackBoundError, stack_bound
from tinytrain.stages.planning.parallel import worker_count

KERNELS_DIR = BOARD_DIR.parent  # kernels_c/
# The kernel library's C files under kernels_c/: shared support, then one file per op (kernels_c/README.md).
KERNEL_SOURCE_GLOBS = ("*.c", "ops/*.c")

ARM_CC = "arm-none-eabi-gcc"
HOST_CC = "cc"
HOST_EVAL_ELF = "host_eval.elf"   # the native build emulate-run evaluates on (module docstring)

# DESIGN §6: -ffp-contract=off on host and target, so that no a*b+c becomes one fused rounding on
# one side only; that is what makes QEMU and host results bit-identical.
BASE_CFLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O2",
               "-ffunction-sections", "-fdata-sections")
# No start files (startup.c owns reset), newlib-nano for memcpy/memset and libm, and no syscall
# stubs on purpose: a program that calls malloc or printf fails to link instead of getting a
# heap or stdio the memory plan does not know about.
# --emit-relocs keeps the link's relocations in the ELF (not loaded: the image is the same bytes), so the stack bound
# (stages/device/stack_bound.py) knows which data words are addresses rather than constants that equal one.
ARM_LDFLAGS = ("-nostartfiles", "--specs=nano.specs", "-Wl,--gc-sections", "-Wl,--emit-relocs")
SANITIZE_FLAGS = ("-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g")

_OVERFLOW_RE = re.compile(r"region `(\w+)' overflowed by (\d+) bytes")
_UNDEFINED_RE = re.compile(r"undefined reference to `([^']+)'")


@dataclass
class BuildResult:
    board: Board
    elf: Path
    map: Path
    size: dict[str, Any]
    sources: list[str] = field(default_factory=list)  # as compiled, relative to the scratch folder
    cflags: list[str] = field(default_factory=list)
    ldflags: list[str] = field(default_factory=list)


# ---- the stage ----------------------------------------------------------------------------------

def run(ctx: StageContext) -> StageResult:
    board = get_board(ctx.config["target.board"])
    kernels_variant = ctx.config.get("target.kernels", "portable")
    user_cflags = list(ctx.config.get("target.cflags") or [])
    program_dir = ctx.input_dir("codegen")
    manifest = _read_sources_json(program_dir / "sources.json")
    defines = kernel_defines(kernels_variant)
    defines.update({str(k): str(v) for k, v in (manifest.get("defines") or {}).items()})
    result = build_firmware(
        board, program_dir, ctx.out_dir, kernels=manifest.get("kernels"), defines=defines,
        extra_cflags=user_cflags, stack_bytes=manifest.get("stack_bytes"), progress=ctx.progress,
        host_eval=not board.host,
        objects=ObjectCache(ctx.unit_cache_dir / "objects", ctx.refresh_units) if ctx.unit_cache_dir else None)
    return StageResult(_summary(result.size), _metrics(result.size))


def kernel_defines(variant: str | None) -> dict[str, str]:
    """-D flags of a `target.kernels` variant. `dsp` sets TT_USE_DSP, the switch tt_dot.h reads: the ACLE SIMD
    paths compile only where the core has the DSP extension (__ARM_FEATURE_DSP), so the same flag is harmless on
    host and on cores without it (they keep the portable loops, with identical results)."""
    if variant == "dsp":
        return {"TT_KERNELS_DSP": "1", "TT_USE_DSP": "1"}
    if variant == "mve":  # the DSP variants plus tt_dot_mve.h's Helium dot products (TT_USE_MVE, read by tt_dot.h)
        return {"TT_KERNELS_MVE": "1", "TT_USE_DSP": "1", "TT_USE_MVE": "1"}
    return {"TT_KERNELS_PORTABLE": "1"}


def _read_sources_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StageFailed(f"codegen's sources.json is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise StageFailed("codegen's sources.json must be an object")
    kernels = doc.get("kernels")
    if kernels is not None and not (isinstance(kernels, list) and all(isinstance(k, str) for k in kernels)):
        raise StageFailed("sources.json: `kernels` must be a list of file names under kernels_c/")
    return doc


def _summary(size: dict[str, Any]) -> str:
    if size.get("host"):
        return f"host executable, {size['flash']['used'] / 1024:.1f} KB code+data"
    f, s = size["flash"], size["sram"]
    return (f"{size['board']}: flash {f['used'] / 1024:.1f}/{f['available'] / 1024:.0f} KB, "
            f"SRAM {s['used'] / 1024:.1f}/{s['available'] / 1024:.0f} KB (stack {s['stack'] / 1024:.1f} KB)")


def _metrics(size: dict[str, Any]) -> dict[str, Any]:
    return {"board": size["board"], "flash_used": size["flash"]["used"], "sram_used": size["sram"]["used"],
            "flash_free": size["flash"].get("free"), "sram_free": size["sram"].get("free")}


# ---- building -----------------------------------------------------------------------------------

def build_firmware(board: Board, program_dir: Path, out_dir: Path, *,
                   kernels: Sequence[str] | None = None,
                   defines: dict[str, str] | None = None,
                   extra_cflags: Sequence[str] = (),
                   sanitize: Sequence[str] = (),
                   stack_bytes: int | str | None = None,
                   progress=no_progress,
                   host_eval: bool = False,
                   objects: "ObjectCache | None" = None) -> BuildResult:
    """Compile every `*.c` of `program_dir` (which defines `tt_main`), the kernel library files
    `kernels` (names under kernels_c/; None = every KERNEL_SOURCE_GLOBS file, [] = none) and the board
    support into `out_dir/firmware.elf` (+ firmware.map, size.json, build.json).

    `sanitize` (host only), e.g. ("address", "undefined"), adds -fsanitize=... for tests.
    `stack_bytes`: the stack section's size; None = the board's; "auto" = the worst-case depth of the linked code
    (linked once with the board's stack, measured by stages/device/stack_bound.py, linked again with that size; where
    the code cannot be bounded, the board's size stays and size.json's `stack_bound` says why).
    `host_eval` (an emulated board): also build `out_dir/host_eval.elf`, the same program for the host
    (module docstring); its units share the compile pool with the firmware's.
    `objects`: kernel-library objects kept across builds (ObjectCache), None: everything is compiled here.
    Raises UserError when the program does not fit the board, StageFailed when it does not build.
    """
    program_dir, out_dir = Path(program_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if sanitize and not board.host:
        raise UserError(f"-fsanitize needs the host board, not {board.name}")
    cc = HOST_CC if board.host else ARM_CC
    if shutil.which(cc) is None:
        raise UserError(f"the compiler for board {board.name} ({cc}) is not installed",
                        hint="install gcc-arm-none-eabi and libnewlib-arm-none-eabi" if not board.host else None)
    host_eval = host_eval and not board.host
    host_eval_doc: dict[str, Any] | None = None
    if host_eval and shutil.which(HOST_CC) is None:
        host_eval, host_eval_doc = False, {"built": False, "reason": f"no host C compiler ({HOST_CC})"}

    with tempfile.TemporaryDirectory(prefix="tt-cc-") as tmp:
        work = Path(tmp)
        sources = _stage_sources(work, board, program_dir, kernels)
        hboard = _host_eval_board() if host_eval else None
        spare: list[Path] = []
        if kernels is None:     # the whole library was asked for: compile only what the program can reach
            sources, spare = _reachable_library(work, sources, _support(board) + (_support(hboard) if hboard else []))
        cflags, hflags = _build_cflags(board, hboard, defines or {}, extra_cflags, sanitize)

        def units_of(files: Sequence[Path]) -> tuple[list[_Unit], list[_Unit]]:
            return _units(board, cflags, hboard, hflags, files)

        units, hunits = units_of(sources)
        hunits += _host_support_units(hboard, hflags)
        # The staged library's digest (part of every ObjectCache key), once: a link retry below compiles more files
        # of the same staged tree.
        tree = tree_digest(work / "src" / "kernels_c") if objects is not None else None
        failed = _compile_units(work, units + hunits, progress, objects, tree)
        _raise_compile_failures(cc, [failed[u] for u in units if u in failed])
        progress(f"linking for {board.name}", 0.95)
        auto = stack_bytes == "auto"
        if stack_bytes is not None and not auto and not isinstance(stack_bytes, int):
            raise StageFailed(f"stack_bytes must be a byte count or \"auto\", not {stack_bytes!r}")
        # "auto": a first link with the smallest stack (so that whatever fits links), measured, then the real one
        ldflags = _ldflags(board, extra_cflags, sanitize, ALIGN if auto else stack_bytes)
        elf, mapfile = work / "firmware.elf", work / "firmware.map"
        linked = [u.obj for u in units]
        proc = _link(work, cc, cflags, ldflags, linked, elf, mapfile, board)
        while proc.returncode != 0 and spare:
            # The scan missed a file (e.g. a call from a header's inline function): add the files defining what
            # the linker could not find, or all the rest when none does, and link again.
            missing = set(_UNDEFINED_RE.findall(proc.stderr))
            if not missing:
                break           # another link failure: reported below as it is
            more = [f for f in spare if _defined_names((work / f).read_text(errors="replace")) & missing] or spare
            spare = [f for f in spare if f not in more]
            fw, host = units_of(more)
            failed.update(_compile_units(work, fw + host, progress, objects, tree))
            _raise_compile_failures(cc, [failed[u] for u in fw if u in failed])
            # Library files keep their place in the link order (program, library, board support).
            order = {str(f): i for i, f in enumerate(_stage_order(work, board))}
            units = sorted(units + fw, key=lambda u: order.get(str(u.src), len(order)))
            hunits = sorted(hunits + host, key=lambda u: order.get(str(u.src), len(order)))
            sources = [u.src for u in units]
            linked = [u.obj for u in units]
            proc = _link(work, cc, cflags, ldflags, linked, elf, mapfile, board)
        bound = None
        if auto and not board.host and proc.returncode == 0:
            bound, ldflags = _size_stack(board, extra_cflags, sanitize, elf)
            proc = _link(work, cc, cflags, ldflags, linked, elf, mapfile, board)
            if proc.returncode == 0 and "deepest_chain" in bound and stack_bound(elf).bytes != bound["bytes"]:
                raise StageFailed("the stack bound changed when the firmware was relinked with it")
        if proc.returncode != 0:
            overflows = {m.group(1): int(m.group(2)) for m in _OVERFLOW_RE.finditer(proc.stderr)}
            if overflows and not board.host:
                size = _measure_unlimited(work, cc, cflags, ldflags, linked, board)
                if auto and bound is None:  # say what the program needs with the stack it would get
                    _, sized = _size_stack(board, extra_cflags, sanitize, work / "measure.elf")
                    size = _measure_unlimited(work, cc, cflags, sized, linked, board)
                raise _does_not_fit(board, size, overflows)
            raise StageFailed(_link_failure(board, proc.stderr))
        size = size_report(board, elf)
        if bound is not None:
            size["stack_bound"] = bound
        if not size["fits"]:  # the linker script is the first check; this one cannot disagree
            raise _does_not_fit(board, size, {})
        if hboard is not None:
            host_eval_doc = _link_host_eval(work, hunits, failed, hboard, extra_cflags, out_dir)
        shutil.copyfile(elf, out_dir / "firmware.elf")
        os.chmod(out_dir / "firmware.elf", 0o755)
        shutil.copyfile(mapfile, out_dir / "firmware.map")
        rel_sources = [str(s) for s in sources]
        build = {"board": board.name, "compiler": cc, "cflags": cflags, "ldflags": ldflags,
                 "sources": {s: _sha256(work / s) for s in rel_sources}}
        if host_eval_doc is not None:
            build["host_eval"] = host_eval_doc
    (out_dir / "size.json").write_text(json.dumps(size, indent=1) + "\n")
    (out_dir / "build.json").write_text(json.dumps(build, indent=1) + "\n")
    return BuildResult(board, out_dir / "firmware.elf", out_dir / "firmware.map", size, rel_sources, cflags, ldflags)


# The host evaluation build's optimisation (module docstring); after BASE_CFLAGS' -O2, so it is the one that counts.
HOST_EVAL_CFLAGS = ("-O1",)


def _host_eval_board() -> Board:
    """The host board with HOST_EVAL_CFLAGS for its own -O3 (module docstring; the optimisation level does not change
    IEEE results under -ffp-contract=off, and emulate-run checks a sample against QEMU on every run)."""
    return replace(get_board("host"), cflags=HOST_EVAL_CFLAGS)


def _support(board: Board) -> list[Path]:
    return [Path("src/kernels_c/boards") / p.name for p in board.support_sources]


def _units(board: Board, cflags: Sequence[str], hboard: Board | None, hflags: Sequence[str],
           files: Sequence[Path]) -> tuple[list["_Unit"], list["_Unit"]]:
    """The compilations of `files` for the board and, with `hboard`, for host_eval.elf (not the board's support)."""
    cc = HOST_CC if board.host else ARM_CC
    fw = [_Unit(cc, tuple(cflags), s, _object(s, "obj")) for s in files]
    host = [_Unit(HOST_CC, tuple(hflags), s, _object(s, "obj-host")) for s in files
            if s not in _support(board)] if hboard else []
    return fw, host


def _host_support_units(hboard: Board | None, hflags: Sequence[str]) -> list["_Unit"]:
    return [_Unit(HOST_CC, tuple(hflags), s, _object(s, "obj-host")) for s in _support(hboard)] if hboard else []


def _link_host_eval(work: Path, hunits: list["_Unit"], failed: dict["_Unit", str], hboard: Board,
                    extra_cflags: Sequence[str], out_dir: Path) -> dict[str, Any]:
    """Link host_eval.elf into `out_dir`; build.json's `host_eval` entry (built, or why not)."""
    bad = [failed[u] for u in hunits if u in failed]
    hflags = list(hunits[0].cflags)
    if bad:
        first = bad[0].splitlines()
        return {"built": False, "reason": f"the host compiler failed on {len(bad)} file(s): "
                                          + " | ".join(first[:3])}
    ldflags = _ldflags(hboard, extra_cflags, (), None)
    proc = _link(work, HOST_CC, hflags, ldflags, [u.obj for u in hunits], work / HOST_EVAL_ELF,
                 work / "host_eval.map", hboard)
    if proc.returncode != 0:
        return {"built": False, "reason": "linking for the host failed: " + " | ".join(proc.stderr.splitlines()[:3])}
    shutil.copyfile(work / HOST_EVAL_ELF, out_dir / HOST_EVAL_ELF)
    os.chmod(out_dir / HOST_EVAL_ELF, 0o755)
    return {"built": True, "elf": HOST_EVAL_ELF, "compiler": HOST_CC, "cflags": hflags, "ldflags": ldflags}


_STAGE_IGNORE = shutil.ignore_patterns("__pycache__", "*.py", "*.pyc")


def _stage_library(src: Path) -> None:
    """The kernel library as every build compiles it, under `src/kernels_c` (the build's stage and the prewarm
    share it: ObjectCache keys hash this tree, so the two must stage the very same bytes)."""
    shutil.copytree(KERNELS_DIR, src / "kernels_c", ignore=_STAGE_IGNORE)
    # tt_kernels.h includes the op prototypes gathered from the op files' interface blocks
    ops_header.write(src / "kernels_c", src / "kernels_c" / "ops")


def _stage_sources(work: Path, board: Board, program_dir: Path, kernels: Sequence[str] | None) -> list[Path]:
    """Copy program, kernel library and board support under `work/src/` and return the .c files
    to compile, relative to `work` (in a fixed order: program, kernels, board)."""
    src = work / "src"
    shutil.copytree(program_dir, src / "program", ignore=_STAGE_IGNORE)
    _stage_library(src)
    program = _program_files(work)
    if not program:
        raise StageFailed(f"no C sources (*.c) in {program_dir}")
    if kernels is None:
        lib = _library_files(work)
    else:
        lib = []
        for name in kernels:
            p = src / "kernels_c" / name
            if ".." in Path(name).parts or not p.is_file():
                raise StageFailed(f"sources.json names kernel {name!r}, which is not in kernels_c/")
            lib.append(p.relative_to(work))
    return program + lib + _support(board)


_TT_NAME_RE = re.compile(r"\btt_\w+")
_DEFINITION_RE = re.compile(r"\b(tt_\w+)\s*[(\[=;]")


def _reachable_library(work: Path, sources: list[Path], roots: list[Path]) -> tuple[list[Path], list[Path]]:
    """(sources to compile, spare library files): the kernel library files the program can reach, found from
    names alone, and the others. A file is reached when it defines a tt_ name that the program, the board support
    or a reached file mentions (a mention in a comment only adds a file). --gc-sections dropped the other files'
    code anyway, so the program's own code and data are the same bytes; on MobileNetV2 they were 25 of 48 files,
    a third of the compile time (issue 14). What can change is which libgcc member the linker pulls in: an unused
    tt_optim.c used to pull in the double division with the multiplication (448 B more flash, same instructions
    run). A name the scan misses (a call from a header's inline function; a library name without the tt_ prefix)
    fails the link, and build_firmware then adds the file that defines it, or every spare file."""
    lib = [s for s in sources if s.parts[:2] == ("src", "kernels_c") and s not in roots]
    text = {f: (work / f).read_text(errors="replace") for f in lib}
    defines = {f: _defined_names(text[f]) for f in lib}
    wanted: set[str] = set()
    for f in [s for s in sources if s not in lib] + [r for r in roots if r not in sources]:
        wanted |= set(_TT_NAME_RE.findall((work / f).read_text(errors="replace")))
    reached: set[Path] = set()
    grew = True
    while grew:
        grew = False
        for f in lib:
            if f not in reached and defines[f] & wanted:
                reached.add(f)
                wanted |= set(_TT_NAME_RE.findall(text[f]))
                grew = True
    return [s for s in sources if s not in lib or s in reached], [f for f in lib if f not in reached]


def _defined_names(text: str) -> set[str]:
    """tt_ names a C file may define at file scope: on a line that starts at column 0 and is not a directive, a
    comment, static, extern or typedef, the first tt_ name followed by (, [, = or ; (a prototype counts too:
    that only adds a file)."""
    names = set()
    for line in text.splitlines():
        if not line or line[0] in " \t#/*}{" or line.startswith(("static", "extern", "typedef")):
            continue
        m = _DEFINITION_RE.search(line)
        if m:
            names.add(m.group(1))
    return names


def _stage_order(work: Path, board: Board) -> list[Path]:
    """Every file `_stage_sources` compiles with the whole library, in its order (program, library, board)."""
    return _program_files(work) + _library_files(work) + _support(board)


def _program_files(work: Path) -> list[Path]:
    return sorted(p.relative_to(work) for p in (work / "src" / "program").glob("*.c"))


def _library_files(work: Path) -> list[Path]:
    return [p.relative_to(work) for g in KERNEL_SOURCE_GLOBS for p in sorted((work / "src" / "kernels_c").glob(g))]


def _build_cflags(board: Board, hboard: Board | None, defines: dict[str, str], extra: Sequence[str],
                  sanitize: Sequence[str]) -> tuple[list[str], list[str]]:
    """The board's and the host evaluation build's compile flags: one rule for the build and its prewarm, so the
    objects prewarm compiles are the ones the build looks up. The host board gets its instruction set as the cache
    key's probe found it (boards.HOST_ISA_PROBE); the host evaluation build stays on the compiler's default target."""
    isa = host_isa_flags(tool_identity(list(HOST_ISA_PROBE))) if board.host else ()
    cflags = _cflags(board, defines, (*isa, *extra), sanitize)
    return cflags, (_cflags(hboard, defines, extra, ()) if hboard else [])


def _cflags(board: Board, defines: dict[str, str], extra: Sequence[str], sanitize: Sequence[str]) -> list[str]:
    flags = [*BASE_CFLAGS, *board.cflags,
             "-Isrc/program", "-Isrc/kernels_c", "-Isrc/kernels_c/boards",
             f'-DTT_BOARD_NAME="{board.name}"']
    if board.host:
        flags.append("-DTT_HOST=1")
    else:
        flags += [f"-D{k}={v}" for k, v in board.tick_defines.items()]
    flags += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    if sanitize:
        flags += [f"-fsanitize={','.join(sanitize)}", *SANITIZE_FLAGS]
    return flags + list(extra)  # the user's flags last, so they can override ours


def _size_stack(board: Board, extra: Sequence[str], sanitize: Sequence[str],
                elf: Path) -> tuple[dict[str, Any], list[str]]:
    """size.json's `stack_bound` and the link flags that reserve it. The bound does not depend on where the stack
    ends (no instruction changes with the addresses of .data/.bss, only literal-pool words), so the relinked
    program has the bound it was sized for."""
    try:
        b = stack_bound(elf)
    except StackBoundError as e:
        return ({"bytes": board.stack_bytes, "how": f"the board's default: the code's depth is not bounded ({e})"},
                _ldflags(board, extra, sanitize, None))
    return b.to_json(), _ldflags(board, extra, sanitize, b.bytes)


def _ldflags(board: Board, extra: Sequence[str], sanitize: Sequence[str], stack_bytes: int | None) -> list[str]:
    if board.host:
        flags = ["-Wl,--gc-sections"]
        if sanitize:
            flags.append(f"-fsanitize={','.join(sanitize)}")
        return flags + list(extra)
    flags = [*ARM_LDFLAGS, "-Lsrc/kernels_c/boards", f"-Tsrc/kernels_c/boards/{board.linker_script}"]
    if stack_bytes is not None:
        flags.append(f"-Wl,--defsym=__stack_size={int(stack_bytes)}")
    return flags + list(extra)


@dataclass(frozen=True)
class _Unit:
    """One compilation: `cc cflags -c src -o obj`, both relative to the scratch folder."""
    cc: str
    cflags: tuple[str, ...]
    src: Path
    obj: Path


def _object(src: Path, obj_dir: str) -> Path:
    return Path(obj_dir) / src.relative_to("src").with_suffix(".o")


def _compile_units(work: Path, units: list[_Unit], progress, objects: "ObjectCache | None" = None,
                   tree: str | None = None) -> dict[_Unit, str]:
    """Compile every unit, as many at a time as there are cores (each gcc is one process on one core); returns
    the failed units with their compiler output. The largest files start first, so a long one does not run alone
    at the end while the other cores idle. With `objects`, a library unit compiled before (by an earlier build, or
    by `prewarm` while this build's earlier stages ran) is copied from there, and one compiled here is kept; `tree`:
    the staged library's tree_digest (work/src/kernels_c), which those objects' keys hash (given with `objects`)."""
    for u in units:
        (work / u.obj).parent.mkdir(parents=True, exist_ok=True)
    keys: dict[_Unit, str] = {}
    todo = list(units)
    if objects is not None:
        program = {p.name for p in (work / "src" / "program").rglob("*") if p.is_file()}
        keys = {u: objects.key(u, tree) for u in units if objects.cacheable(u)}
        todo = [u for u in units if u not in keys or not objects.fetch(work, u, keys[u], program)]

    def one(u: _Unit) -> tuple[_Unit, subprocess.CompletedProcess]:
        proc = subprocess.run(_compile_command(u, u in keys), cwd=work, capture_output=True, text=True,
                              errors="replace")
        if proc.returncode == 0 and u in keys:
            objects.store(work, u, keys[u])
        return u, proc

    order = sorted(todo, key=lambda u: -(work / u.src).stat().st_size)
    failed: dict[_Unit, str] = {}
    done = len(units) - len(todo)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for i, (u, proc) in enumerate(pool.map(one, order)):
            progress(f"compiled {u.src.name}", 0.9 * (done + i + 1) / len(units))
            if proc.returncode != 0:
                failed[u] = f"{u.src}:\n{proc.stderr.strip()}"
    return failed


def _compile_command(u: _Unit, deps: bool = False) -> list[str]:
    """`cc cflags -c src -o obj`; `deps`: also the headers it read, in `<obj>.d` (-MD, the object is the same)."""
    return [u.cc, *u.cflags, "-c", str(u.src), "-o", str(u.obj)] + (["-MD", "-MF", str(u.obj.with_suffix(".d"))]
                                                                     if deps else [])


def _raise_compile_failures(cc: str, failures: list[str]) -> None:
    if failures:
        text = "\n".join(failures)
        lines = text.splitlines()
        shown = "\n".join(lines[:60]) + (f"\n... ({len(lines) - 60} more lines)" if len(lines) > 60 else "")
        raise StageFailed(f"C compilation failed ({len(failures)} file(s), {cc} {' '.join(BASE_CFLAGS)}):\n{shown}")


def _link(work: Path, cc: str, cflags: list[str], ldflags: list[str], objects: list[Path], elf: Path,
          mapfile: Path, board: Board) -> subprocess.CompletedProcess:
    # The map file is named relative to `work` as well, so the map itself holds no scratch path.
    cmd = [cc, *cflags, *[str(o) for o in objects], *ldflags, f"-Wl,-Map={mapfile.name}", "-o", elf.name, "-lm"]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, errors="replace")


# The regions of the measuring link: as large as fits below every board's SRAM origin (0x20000000) from its flash
# origin (0 or 0x01000000), so no program the compiler can emit overflows them.
MEASURE_REGION = 256 * 1024 * 1024


def _measure_unlimited(work: Path, cc: str, cflags: list[str], ldflags: list[str], objects: list[Path],
                       board: Board) -> dict[str, Any]:
    """Link once more with regions of MEASURE_REGION bytes, only to measure what the program would need; the
    result is reported, never shipped. (4 MB regions, QEMU's RAMs, were too small for a float model's weights:
    MediaPipe's hand_landmark_full in fp16-mixed has 10 MB of fp32 constants, and its build stopped on this link's
    own overflow instead of saying by how much the board's flash is short.)"""
    roomy = work / "measure.ld"
    roomy.write_text(
        "MEMORY {\n"
        f"  FLASH (rx) : ORIGIN = {board.flash_origin:#x}, LENGTH = {MEASURE_REGION}\n"
        f"  RAM (rwx) : ORIGIN = {board.sram_origin:#x}, LENGTH = {MEASURE_REGION}\n"
        "}\n"
        'REGION_ALIAS("VECTORS", FLASH);\n'
        f"__stack_size = DEFINED(__stack_size) ? __stack_size : {board.stack_bytes};\n"
        "INCLUDE cortexm_sections.ld\n")
    flags = [f for f in ldflags if not f.startswith("-T")] + ["-Tmeasure.ld"]
    proc = subprocess.run([cc, *cflags, *[str(o) for o in objects], *flags, "-o", "measure.elf", "-lm"],
                          cwd=work, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        raise StageFailed(_link_failure(board, proc.stderr))
    return size_report(board, work / "measure.elf")


def _link_failure(board: Board, stderr: str) -> str:
    undefined = sorted(set(_UNDEFINED_RE.findall(stderr)))
    msg = f"linking for {board.name} failed:\n" + "\n".join(stderr.strip().splitlines()[:40])
    stdio = {"_sbrk", "_write", "_read", "_open", "_close", "_lseek", "_fstat", "_isatty", "_exit", "_kill",
             "_getpid", "_sbrk_r", "_write_r"}
    if not board.host and stdio & set(undefined):
        msg += ("\n(the program uses malloc, printf or another libc call that needs an operating system; "
                "on boards use the tt_platform.h API and the static arena instead)")
    return msg


def _does_not_fit(board: Board, size: dict[str, Any], overflows: dict[str, int]) -> UserError:
    lines = []
    for region, key, label in (("FLASH", "flash", "flash"), ("RAM", "sram", "SRAM")):
        r = size[key]
        over = max(r["used"] - r["available"], overflows.get(region, 0))
        if over <= 0:
            continue
        parts = " + ".join(f"{name} {_kb(r[name])}" for name in r["parts"] if r[name])
        # Only what is worth shrinking: symbols of at least 1 KB.
        top = ", ".join(f"{s['name']} {_kb(s['size'])}" for s in size["top_symbols"][key][:5] if s["size"] >= 1024)
        lines.append(f"{label} over by {over / 1024:.1f} KB ({over} bytes): needs {r['used'] / 1024:.1f} KB "
                     f"({parts}), the board has {r['available'] / 1024:.0f} KB"
                     + (f"; largest: {top}" if top else ""))
    if not lines:  # the linker said so but our measurement disagrees: report the linker's figures
        lines = [f"{region} overflowed by {n / 1024:.1f} KB ({n} bytes)" for region, n in overflows.items()]
    return UserError(f"the firmware does not fit {board.name}:\n  " + "\n  ".join(lines),
                     hint="train fewer parameters (train.update), pick a board with more memory, "
                          "or lower train.update.budget_kb")


def _kb(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- compiled library objects, kept across builds -----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _compiler_path(cc: str) -> str:
    """The compiler file `cc` runs (one PATH search per compiler, not per compiled unit), part of an object's key."""
    return os.path.realpath(shutil.which(cc) or cc)


class ObjectCache:
    """Compiled kernel-library objects in the runner's unit cache (StageContext.unit_cache_dir), so that a build
    compiles only its own program: an object is a function of the compiler, its flags and the staged kernel library
    (every file of it, the generated tt_ops.h included), and is found again by a key of those. Only the library's
    files and the board support (src/kernels_c/...) are kept, never the program's. An object whose file included
    one of the program's files is not stored; one that included a header with the name of a program file (the
    program folder comes first on the include path, so it could shadow it) is compiled again. Objects are the same
    bytes wherever they were compiled (relative paths, no debug info: flags that embed a path are not cached), so
    firmware.elf does not depend on where they came from. `prewarm` fills it while the stages before this one run."""

    def __init__(self, root: Path, refresh: bool = False):
        self.root, self.refresh = Path(root), refresh

    @staticmethod
    def cacheable(u: "_Unit") -> bool:
        return (u.src.parts[:2] == ("src", "kernels_c")
                and not any(f.startswith(_PATH_FLAGS) for f in u.cflags))

    def key(self, u: "_Unit", tree: str) -> str:
        doc = [_compiler_path(u.cc), tool_identity([u.cc, "--version"]), u.cc, list(u.cflags), str(u.src), tree]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.o", folder / f"{key}.json"

    def fetch(self, work: Path, u: "_Unit", key: str, program_names: set[str]) -> bool:
        """Copy the cached object of `u` to its place in `work`; False when there is none (or it may be stale)."""
        obj, meta = self._paths(key)
        if self.refresh or not obj.is_file():
            return False
        try:
            headers = set(json.loads(meta.read_text())["headers"])
        except (OSError, ValueError, KeyError):
            return False
        if headers & program_names:
            return False
        try:
            shutil.copyfile(obj, work / u.obj)
        except OSError:
            return False
        # mtime is the object's last use for the store's gc (cache.store.Cache.gc, --max-age and LRU), as for
        # the action entries; a cache that cannot be written keeps the old time.
        for path in (meta, obj):
            with contextlib.suppress(OSError):
                os.utime(path)
        return True

    def store(self, work: Path, u: "_Unit", key: str) -> None:
        """Keep the object `u` was just compiled to (with -MD: its headers are in `<obj>.d`)."""
        deps = _dependencies(work / u.obj.with_suffix(".d"))
        if deps is None or any(Path(d).parts[:2] == ("src", "program") for d in deps):
            return
        obj, meta = self._paths(key)
        try:
            obj.parent.mkdir(parents=True, exist_ok=True)
            # through the store's temporary names (its sweep removes those a killed build leaves), without fsync:
            # an object lost to a crash is only compiled again. The object last: who finds it finds its headers.
            for dest, data in ((meta, json.dumps({"headers": sorted({Path(d).name for d in deps})}).encode()),
                               (obj, (work / u.obj).read_bytes())):
                tmp = new_tmp(dest.parent)
                tmp.write_bytes(data)
                tmp.replace(dest)
        except OSError:
            pass    # a cache that cannot be written (full, read-only) only loses the object for later builds


# Flags under which an object holds a path of the folder it was compiled in (debug info, coverage, profiling):
# such objects are not cached.
_PATH_FLAGS = ("-g", "-fprofile", "-ftest-coverage", "--coverage", "-fsanitize")


def _dependencies(d_file: Path) -> list[str] | None:
    """The files of a gcc -MD dependency file (the object's sources and headers); None when it cannot be read."""
    try:
        text = d_file.read_text(errors="replace")
    except OSError:
        return None
    _, _, rest = text.partition(":")
    return [t for t in rest.replace("\\\n", " ").split() if t != "\\"]


def prewarm(config: dict[str, Any], unit_cache_dir: Path) -> "Prewarm | None":
    """The runner's hook (pipeline/runner.py, `prewarm`): while the stages before this one run (sparse-plan's probe
    and the planning leave a core idle for seconds), compile the kernel library for this build's board, kernels and
    flags into the ObjectCache, largest files first (the ones a program is likeliest to reach, and the longest to
    compile), so that this stage finds them and compiles little more than the program. Only on a core the machine
    leaves idle (_idle_core: a test suite on every core or a shared machine gets nothing), and its compilers run at
    a low priority. None when there is nothing to do."""
    if not _idle_core():
        return None
    try:
        board = get_board(config["target.board"])
    except KeyError:
        return None             # the stage reports an unknown board itself
    cc = HOST_CC if board.host else ARM_CC
    if shutil.which(cc) is None or shutil.which("nice") is None:
        return None
    defines = kernel_defines(config.get("target.kernels", "portable"))
    extra = list(config.get("target.cflags") or [])
    hboard = _host_eval_board() if not board.host and shutil.which(HOST_CC) else None
    cflags, hflags = _build_cflags(board, hboard, defines, extra, ())
    return Prewarm(ObjectCache(Path(unit_cache_dir) / "objects"), board, cflags, hboard, hflags)


def _idle_core() -> bool:
    """Whether another core is idle now: fewer processes running besides this one than cores besides its own.
    One core: never."""
    cores = worker_count()
    return cores >= 2 and _running_now() - 1 < cores - 1


def _running_now() -> float:
    """Processes running at this instant, this one included: Linux's /proc/loadavg (4th field); elsewhere the
    1-minute load average (+ this one) stands in."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] + 1 if hasattr(os, "getloadavg") else float("inf")


class Prewarm:
    """prewarm's work: one low-priority compiler at a time in a thread, until `stop()` (the stage is about to run:
    the compiler running then is stopped, its object not kept). Its objects are the build's own (the same sources,
    flags and relative paths), so what it finished is used and what it did not is compiled by the stage."""

    def __init__(self, objects: ObjectCache, board: Board, cflags: list[str], hboard: Board | None,
                 hflags: list[str]):
        self.objects, self.board, self.cflags, self.hboard, self.hflags = objects, board, cflags, hboard, hflags
        self.compiled = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="tinytrain-prewarm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="tt-prewarm-") as tmp:
                work = Path(tmp)
                src = work / "src"
                _stage_library(src)
                (src / "program").mkdir()
                fw, host = _units(self.board, self.cflags, self.hboard, self.hflags,
                                  _library_files(work) + _support(self.board))
                units = sorted(fw + host + _host_support_units(self.hboard, self.hflags),
                               key=lambda u: -(work / u.src).stat().st_size)
                tree = tree_digest(work / "src" / "kernels_c")
                for u in units:
                    key = self.objects.key(u, tree)
                    if self._stopped.is_set():
                        return
                    if self.objects.fetch(work, u, key, set()) or not self._compile(work, u):
                        continue
                    self.objects.store(work, u, key)
                    self.compiled += 1
        except Exception:   # noqa: BLE001 -- a prewarm that fails only loses its head start: the stage compiles
            return

    def _compile(self, work: Path, u: _Unit) -> bool:
        (work / u.obj).parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self._stopped.is_set():
                return False
            # its own process group: stop() ends the compiler driver and the cc1 / as it runs
            self._proc = subprocess.Popen(["nice", "-n", "10", *_compile_command(u, deps=True)], cwd=work,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
        ok = self._proc.wait() == 0
        with self._lock:
            self._proc = None
            return ok and not self._stopped.is_set()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            if self._proc is not None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._thread.join()
