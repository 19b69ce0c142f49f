"""The board registry: every target tinytrain can build firmware for, as data.

A board says how to compile for it (CPU and float-ABI flags), what memory it has (the fit check,
and the sparse-plan stage's budget: `sram_bytes - runtime_reserve_bytes`), and how to run it
(QEMU machine and CPU, or natively for `host`). Its linker script in `kernels_c/boards/` carries
the same sizes; a test keeps the two equal.

This module imports nothing from the rest of tinytrain, so the spec can take its board choices
from here without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

# kernels_c/boards/: linker scripts, startup, semihosting, the tt_platform API.
BOARD_DIR = Path(__file__).resolve().parents[2] / "kernels_c" / "boards"

# Board-support sources, by platform kind. The program itself defines tt_main().
COMMON_SOURCES = ("tt_common.c", "tt_ttds.c")
CORTEX_M_SOURCES = ("startup.c", "semihost.c", "platform_semihost.c")
HOST_SOURCES = ("platform_host.c",)

# QEMU runs with `-icount shift=0`: each guest instruction advances virtual time by 2**0 ns, so
# a SysTick on the mps2 machines' 25 MHz system clock ticks once per 40 instructions.
MPS2_SYSCLK_HZ = 25_000_000
# QEMU's mps3-an547 (hw/arm/mps2-tz.c: sysclk_frq) clocks the SSE-300 and its SysTick at 32 MHz:
# one tick per 31.25 instructions, so the count is scaled by a fraction (125/4), not an integer.
MPS3_AN547_SYSCLK_HZ = 32_000_000


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    cpu: str                          # "cortex-m7", "cortex-m4", ... or "host"
    cflags: tuple[str, ...]           # CPU / FPU / float-ABI flags (compile and link)
    sram_bytes: int                   # 0 for host: no limit
    flash_bytes: int                  # 0 for host: no limit
    stack_bytes: int                  # the stack section the linker script reserves
    # What the memory plan must leave to the runtime: the stack plus the runtime's own static
    # data (platform, TTDS record state, formatter buffers on the stack, fault frame).
    runtime_reserve_bytes: int
    qemu_machine: str | None = None
    qemu_cpu: str | None = None
    linker_script: str | None = None  # file name in kernels_c/boards/
    flash_origin: int = 0x0000_0000
    sram_origin: int = 0x2000_0000
    sysclk_hz: int = MPS2_SYSCLK_HZ   # the emulated machine's clock (SysTick in QEMU)
    core_clock_hz: int | None = None  # the real part's core clock: run.json's ms per step (None: host)
    host: bool = False
    half_precision: bool = False      # native fp16 arithmetic (or, on host, a portable fallback)
    mve: bool = False                 # Armv8.1-M MVE (Helium): `target.kernels: mve` is allowed

    @property
    def linker_script_path(self) -> Path | None:
        return BOARD_DIR / self.linker_script if self.linker_script else None

    @property
    def budget_bytes(self) -> int | None:
        """SRAM a training program may plan for (arena + trainable data), or None on host."""
        return None if self.host else self.sram_bytes - self.runtime_reserve_bytes

    @property
    def instructions_per_tick(self) -> Fraction:
        """Instructions per SysTick tick at 1 ns per instruction (exact: 40 at 25 MHz, 125/4 at 32 MHz)."""
        return Fraction(1_000_000_000, self.sysclk_hz)

    @property
    def tick_defines(self) -> dict[str, str]:
        """-D flags for startup.c's tt_instructions(): instructions = ticks * NUM / DEN."""
        r = self.instructions_per_tick
        return {"TT_INSNS_PER_TICK": str(r.numerator), "TT_INSNS_PER_TICK_DEN": str(r.denominator)}

    @property
    def support_sources(self) -> tuple[Path, ...]:
        names = COMMON_SOURCES + (HOST_SOURCES if self.host else CORTEX_M_SOURCES)
        return tuple(BOARD_DIR / n for n in names)

    def summary(self) -> str:
        if self.host:
            return f"{self.name}: native C on this machine"
        return (f"{self.name}: {self.cpu}, {self.sram_bytes // 1024} KB SRAM, {self.flash_bytes // 1024} KB flash "
                f"(QEMU {self.qemu_machine})")


_M7_FLAGS = ("-mthumb", "-mcpu=cortex-m7", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard")
_M4_FLAGS = ("-mthumb", "-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard")
# gcc 12's -mcpu=cortex-m55 is the full core (MVE with floating point, double-precision FPU, scalar fp16
# arithmetic), as the AN547's M55 is configured and QEMU emulates it. +nomve.fp keeps MVE's floating-point
# vector instructions out of the compiler's hands: they always flush subnormals to zero (architecturally; QEMU does
# too), while the scalar FPU and the host keep them, and gcc -O2 would auto-vectorize plain float loops with them
# (tt_conv2d.c), so results would no longer be the host's bits. The one exception is written by hand: the
# kernels_c/tt_fvec_*.c units (`kernels: mve` only) switch MVE floating point on for themselves, auto-vectorizer off,
# and use it only where kernels_c/tt_fvec_mve.h's operand condition proves that no lane can see a subnormal
# (otherwise their portable loop runs). Integer MVE (__ARM_FEATURE_MVE == 1, `kernels: mve`) and scalar fp16
# (__ARM_FEATURE_FP16_SCALAR_ARITHMETIC) stay. -mfpu=auto takes the FPU from the CPU name.
_M55_FLAGS = ("-mthumb", "-mcpu=cortex-m55+nomve.fp", "-mfpu=auto", "-mfloat-abi=hard")
KB = 1024

BOARDS: dict[str, Board] = {b.name: b for b in (
    # -O3 (after BASE_CFLAGS' -O2, so it wins) for speed; bit-identical to -O2 and to QEMU because
    # -ffp-contract=off stays and no -ffast-math: IEEE results do not depend on the optimisation level. Portable
    # on purpose (no -march=native): the cache key knows the compiler's version, not the build machine's CPU.
    # TT_USE_HOST_SIMD: SSE2 int8 inner products where the compiler targets x86-64 (kernels_c/tt_simd.h; SSE2 is
    # in every x86-64 CPU; elsewhere the define does nothing); integer sums, so the same bits.
    Board("host", "native C on the build machine (cc); no memory limits", "host", ("-O3", "-DTT_USE_HOST_SIMD=1"),
          0, 0, 0, 0, host=True,
          half_precision=True),
    # STM32F746NG has a single-precision FPU (FPv5-SP); QEMU's M7 has double too, so the flags,
    # not the emulator, keep doubles in software as on the real part.
    Board("stm32f746-disco", "STM32F746G-DISCO: Cortex-M7 @216 MHz, 320 KB SRAM, 1 MB flash", "cortex-m7",
          _M7_FLAGS, 320 * KB, 1024 * KB, 16 * KB, 20 * KB, "mps2-an500", "cortex-m7", "stm32f746-disco.ld",
          core_clock_hz=216_000_000),
    Board("m4-256k", "Cortex-M4F with 256 KB SRAM, 1 MB flash (STM32F429-class)", "cortex-m4",
          _M4_FLAGS, 256 * KB, 1024 * KB, 16 * KB, 20 * KB, "mps2-an386", "cortex-m4", "m4-256k.ld",
          core_clock_hz=180_000_000),
    Board("m4-128k", "Cortex-M4F with 128 KB SRAM, 512 KB flash (STM32F411-class)", "cortex-m4",
          _M4_FLAGS, 128 * KB, 512 * KB, 8 * KB, 12 * KB, "mps2-an386", "cortex-m4", "m4-128k.ld",
          core_clock_hz=100_000_000),
    # Arm MPS3 AN547 (Corstone SSE-300, Cortex-M55 with MVE-FP). It has no on-chip flash: the MPS3 loads the
    # image into its code memories, so "flash" (code and frozen weights) is the 2 MB code SRAM at 0x01000000,
    # and the vector table sits in the ITCM at the boot address 0 (kernels_c/boards/mps3-an547.ld). The budget
    # is the 512 KB DTCM (4 x 128 KB at 0x20000000, the core's zero-wait data memory); the 4 MB ISRAM at
    # 0x21000000 stays out of it, as memory a product shares with the rest of the system (the AN547's Ethos-U55).
    Board("mps3-an547", "Arm MPS3 AN547: Cortex-M55 (Helium/MVE, fp16) @32 MHz, 512 KB DTCM, 2 MB code SRAM",
          "cortex-m55", _M55_FLAGS, 512 * KB, 2048 * KB, 16 * KB, 20 * KB, "mps3-an547", "cortex-m55",
          "mps3-an547.ld", flash_origin=0x0100_0000, sysclk_hz=MPS3_AN547_SYSCLK_HZ,
          core_clock_hz=MPS3_AN547_SYSCLK_HZ, half_precision=True, mve=True),
)}

BOARD_NAMES: tuple[str, ...] = tuple(BOARDS)

# The `host` board's instruction set (issue 14): x86-64-v3 (AVX2, BMI2; any x86 CPU since ~2015) when the host
# compiler targets x86-64 and this machine runs it, else the compiler's default target. On MobileNetV2 it makes a
# training step ~8 % faster (bench/speed.py); the bits stay the same (IEEE operations, -ffp-contract=off, no
# -ffast-math). The choice depends on the build machine, so the probe that makes it is one of cross-compile's
# `tools` for the host board (pipeline/stage_graph.py `Tool.only_for`): its first output line is part of that
# board's cache key, and a cached host build is never reused on a machine that would have chosen otherwise (nor run
# there); the other boards' keys leave it out (their firmware does not depend on this machine's CPU). It prints the flags to add, or
# "default". Linux names the ISA's features in /proc/cpuinfo only when the OS supports them (AVX: XSAVE enabled);
# LZCNT is "abm". Where there is no /proc/cpuinfo the default target stays.
HOST_ISA_PROBE: tuple[str, ...] = ("sh", "-c", (
    'case "$(cc -dumpmachine 2>/dev/null)" in x86_64*) ;; *) echo default; exit 0;; esac; '
    "for f in avx avx2 bmi1 bmi2 f16c fma abm movbe xsave; do "
    'grep -qw "$f" /proc/cpuinfo 2>/dev/null || { echo default; exit 0; }; done; '
    "echo '-march=x86-64-v3'"))


def host_isa_flags(probe_output: str) -> tuple[str, ...]:
    """The -march flags HOST_ISA_PROBE's first line asks for (none for "default" or anything unexpected)."""
    flags = tuple(probe_output.split())
    return flags if flags and all(f.startswith("-march=") for f in flags) else ()


def get_board(name: str) -> Board:
    try:
        return BOARDS[name]
    except KeyError:
        raise KeyError(f"unknown board {name!r}; known boards: {', '.join(BOARD_NAMES)}") from None


def describe_boards() -> str:
    """One line per board, for the spec's field description and `--help`."""
    return "; ".join(b.summary() for b in BOARDS.values())
