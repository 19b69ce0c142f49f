"""Helium fp16 conversions and Inf/NaN scans (kernels_c/tt_f16_mve.h, `target.kernels: mve`) against the portable
scalar conversions of kernels_c/tt_f16.c, in QEMU on the Cortex-M55: all 65,536 fp16 values, about 2.8 million fp32
values (every sign and exponent with the mantissas where rounding changes, and random bit patterns), in place and out
of place, every length 0..67; plus the same program on the host (portable only) giving the same output bytes, and
numpy's float16 for every value numpy converts the same way (all but NaN payloads). The kernels' per-element
conversions (tt_f16_read, tt_f16_narrow: scalar VCVTBs on the M55) are checked on the same values.

tests/test_fp16_kernels.py checks the portable scalar conversions against numpy on their own."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_f16.h"
#include "tt_platform.h"

#ifndef TT_F16_MVE_BUILD
#define TT_F16_MVE_BUILD 0
#endif

#define CHUNK 1024u
#ifndef RANDOM_CHUNKS
#define RANDOM_CHUNKS 2048u
#endif
static float xf[CHUNK + 8], yf[CHUNK + 8];
static uint16_t xh[CHUNK + 8], yh[CHUNK + 8];
static float all_f32[65536];          /* tt_cast_f16_f32 of every fp16 value (written to all.bin) */
static uint16_t round_trip[65536];    /* tt_cast_f32_f16 of those (written to back.bin) */
static uint32_t bad, checked;
/* loss scales: powers of two from 2^-126 (its reciprocal 2^126 is normal) to 2^127 (whose reciprocal is subnormal:
 * divided), and others */
static float scales[] = {3.0f, 65536.0f, 0.5f, 1.0f, 0x1p-126f, 0x1p126f, 0x1p127f, 0x1p-127f, -4.0f, 1e-3f};
#define NSCALES (sizeof scales / sizeof scales[0])
static uint32_t rng = 0x2545F491u;

static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static uint32_t bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

static void miss(const char *what, uint32_t in, uint32_t got, uint32_t want) {
    if (bad < 8u) tt_log("MISMATCH %s in=%08lx got=%08lx want=%08lx\n", what, (unsigned long)in, (unsigned long)got, (unsigned long)want);
    ++bad;
}

/* n fp32 values in xf: every array function against the scalar reference, out of place and in place. */
static void check_f32(uint32_t n) {
    uint32_t i, k;
    tt_cast_f32_f16(n, xf, yh);
    tt_round_f16(n, xf, yf);
    for (i = 0; i < n; ++i) {
        uint16_t want = tt_f32_to_f16(xf[i]);
        if (yh[i] != want) miss("cast_f32_f16", bits(xf[i]), yh[i], want);
        if (tt_f16_narrow(xf[i]) != want) miss("f16_narrow", bits(xf[i]), tt_f16_narrow(xf[i]), want);
        if (bits(yf[i]) != bits(tt_f16_to_f32(want))) miss("round_f16", bits(xf[i]), bits(yf[i]), bits(tt_f16_to_f32(want)));
    }
    memcpy(yf, xf, n * 4u);                              /* in place: the fp16 results over the start of the floats */
    tt_cast_f32_f16(n, yf, (uint16_t *)(void *)yf);
    for (i = 0; i < n; ++i) {
        uint16_t got = ((uint16_t *)(void *)yf)[i];
        if (got != yh[i]) miss("cast_f32_f16 in place", bits(xf[i]), got, yh[i]);
    }
    memcpy(yf, xf, n * 4u);
    tt_round_f16(n, yf, yf);
    for (i = 0; i < n; ++i) {
        if (bits(yf[i]) != bits(tt_f16_to_f32(yh[i]))) miss("round_f16 in place", bits(xf[i]), bits(yf[i]), 0);
    }
    for (k = 0; k < NSCALES; ++k) {
        tt_unscale_f32(n, xf, scales[k], yf);
        for (i = 0; i < n; ++i) {
            float w = xf[i] / scales[k];
            if (bits(yf[i]) != bits(w)) miss("unscale_f32", bits(xf[i]), bits(yf[i]), bits(w));
        }
    }
    {   /* the scan: the reference loop is written out here (tt_nonfinite_f32 itself takes the Helium path) */
        int want = 0;
        for (i = 0; i < n; ++i) want |= (bits(xf[i]) & 0x7F800000u) == 0x7F800000u;
        if (tt_nonfinite_f32(n, xf) != want) miss("nonfinite_f32", n, (uint32_t)!want, (uint32_t)want);
    }
    checked += n;
}

/* n fp16 values in xh. */
static void check_f16(uint32_t n) {
    uint32_t i, k;
    int want = 0;
    tt_cast_f16_f32(n, xh, yf);
    for (i = 0; i < n; ++i) {
        if (bits(yf[i]) != bits(tt_f16_to_f32(xh[i]))) miss("cast_f16_f32", xh[i], bits(yf[i]), bits(tt_f16_to_f32(xh[i])));
    }
    memcpy(yf, xh, n * 2u);                              /* in place: the floats over the fp16 values */
    tt_cast_f16_f32(n, (const uint16_t *)(const void *)yf, yf);
    for (i = 0; i < n; ++i) {
        if (bits(yf[i]) != bits(tt_f16_to_f32(xh[i]))) miss("cast_f16_f32 in place", xh[i], bits(yf[i]), 0);
    }
    for (k = 0; k < NSCALES; ++k) {                      /* powers of two take the exact multiply */
        const float s = scales[k];
        tt_unscale_f16(n, xh, s, yf);
        for (i = 0; i < n; ++i) {
            float w = tt_f16_to_f32(xh[i]) / s;
            if (bits(yf[i]) != bits(w)) miss("unscale_f16", xh[i], bits(yf[i]), bits(w));
        }
    }
    for (i = 0; i < n; ++i) want |= (xh[i] & 0x7C00u) == 0x7C00u;
    if (tt_nonfinite_f16(n, xh) != want) miss("nonfinite_f16", n, (uint32_t)!want, (uint32_t)want);
    checked += n;
}

int tt_main(void) {
    uint32_t i, k, e, s, r;
    static const uint32_t man_fixed[] = {0u, 1u, 2u, 0x7FFFFFu, 0x7FFFFEu, 0x400000u, 0x400001u, 0x3FFFFFu, 0x7FE000u,
                                         0x7FF000u, 0x7FEFFFu, 0x7FF001u, 0x001000u, 0x000FFFu, 0x001001u, 0x003000u};
    uint64_t t0 = tt_instructions(), t1;
    /* 1. every fp16 value, in chunks */
    for (i = 0; i < 65536u; i += CHUNK) {
        for (k = 0; k < CHUNK; ++k) xh[k] = (uint16_t)(i + k);
        check_f16(CHUNK);
        for (k = 0; k < CHUNK; ++k) {   /* the kernels' read (one VCVTB on the M55): the same, a signalling NaN quiet */
            const uint16_t h = xh[k];
            const int snan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0u && (h & 0x200u) == 0u;
            const uint32_t got = bits(tt_f16_read(h)), want = bits(tt_f16_to_f32(h));
            if (got != want && !(snan && got == bits(tt_f16_to_f32((uint16_t)(h | 0x200u))))) miss("f16_read", h, got, want);
        }
        tt_cast_f16_f32(CHUNK, xh, all_f32 + i);
        tt_cast_f32_f16(CHUNK, all_f32 + i, round_trip + i);
    }
    /* 2. every length 0..67 at a few offsets, random fp16 patterns with Inf/NaN now and then */
    for (r = 0; r < 40u; ++r) {
        for (k = 0; k < 68u; ++k) {
            for (i = 0; i < k; ++i) {
                uint32_t v = next();
                xh[i] = (uint16_t)((v & 7u) == 0u ? (v >> 8) | 0x7C00u : (v >> 8) & 0x7BFFu);
                xf[i] = (v & 15u) == 0u ? from_bits((v >> 4) | 0x7F800000u) : from_bits(next() & 0xBFFFFFFFu);
            }
            check_f16(k);
            check_f32(k);
        }
    }
    /* 3. every sign and exponent with mantissas at the rounding boundaries of every shift, and random ones */
    for (s = 0; s < 2u; ++s) {
        for (e = 0; e < 256u; ++e) {
            uint32_t m = 0;
            for (k = 0; k < sizeof man_fixed / sizeof man_fixed[0]; ++k) xf[m++] = from_bits(s << 31 | e << 23 | man_fixed[k]);
            for (k = 0; k < 23u; ++k) {                   /* the half, half +- 1 ulp and 3/2 points of a 2^k ulp */
                uint32_t h = 1u << k;
                xf[m++] = from_bits(s << 31 | e << 23 | h);
                xf[m++] = from_bits(s << 31 | e << 23 | (h - 1u));
                xf[m++] = from_bits(s << 31 | e << 23 | (h + 1u));
                xf[m++] = from_bits(s << 31 | e << 23 | ((3u * h) & 0x7FFFFFu));
                xf[m++] = from_bits(s << 31 | e << 23 | ((h | (2u * h)) ^ 0x7FFFFFu));
            }
            while (m < CHUNK) xf[m++] = from_bits(s << 31 | e << 23 | (next() & 0x7FFFFFu));
            check_f32(CHUNK);
        }
    }
    /* 4. random bit patterns: anywhere, and in the exponents fp16 can hold (2^-26 .. 2^17) */
    for (r = 0; r < RANDOM_CHUNKS; ++r) {
        for (k = 0; k < CHUNK; ++k) {
            uint32_t v = next();
            xf[k] = (r & 1u) ? from_bits(v) : from_bits((v & 0x807FFFFFu) | ((101u + (v >> 8) % 44u) << 23));
        }
        check_f32(CHUNK);
    }
    t1 = tt_instructions();
    tt_log("mve=%d checked=%lu mismatches=%lu instructions=%llu\n", TT_F16_MVE_BUILD, (unsigned long)checked,
           (unsigned long)bad, (unsigned long long)(t1 - t0));
    if (tt_write_file("all.bin", all_f32, sizeof all_f32) != 0) return 1;
    if (tt_write_file("back.bin", round_trip, sizeof round_trip) != 0) return 1;
    return bad == 0u ? 0 : 1;
}
"""


def _run(board: str, tmp: Path, defines: dict[str, str], sanitize: tuple[str, ...] = ()):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "f16.c").write_text(PROG)
    b = get_board(board)
    tag = "-".join([board, *defines])
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=["tt_f16.c"], defines=defines, sanitize=sanitize)
    ran = run_firmware(b, built.elf, tmp / f"run-{tag}", {}, timeout_s=300, check=False)
    m = re.search(r"mve=(\d) checked=(\d+) mismatches=(\d+)", ran.console)
    assert m, ran.console[-2000:]
    if not b.host:  # the Helium conversions are really in the firmware
        import subprocess
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(built.elf)], capture_output=True,
                             text=True, check=True).stdout
        assert ("vcvtb.f32.f16" in dis) == ("TT_USE_MVE" in defines)
        assert re.search(r"vcvtb\.f16\.f32\s+s\d+, s\d+", dis)  # tt_f16_narrow: the scalar VCVTB on every M55 build
    return ran, int(m.group(1)), int(m.group(2)), int(m.group(3))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")
def test_the_array_functions_equal_the_scalar_reference_on_the_host(tmp_path):
    """The portable side of the test below on its own (fast): casts in and out of place, the scans, and the unscale
    whose power-of-two scales multiply by the exact reciprocal instead of dividing - the same bits as the division;
    under ASan/UBSan."""
    ran, flag, checked, bad = _run("host", tmp_path, {"RANDOM_CHUNKS": "128u"}, sanitize=("address", "undefined"))
    assert flag == 0 and bad == 0 and checked == checked_values(128) and "runtime error" not in ran.log


def checked_values(random_chunks: int = 2048) -> int:
    return 65536 + 40 * 2 * sum(range(68)) + 2 * 256 * 1024 + random_chunks * 1024


@needs_arm
@pytest.mark.slow
def test_helium_fp16_conversions_equal_the_portable_ones_in_qemu(tmp_path):
    mve, flag, checked, bad = _run(BOARD, tmp_path, {"TT_USE_MVE": "1", "TT_F16_MVE_BUILD": "1"})
    assert "MISMATCH" not in mve.console and bad == 0, mve.console[-2000:]
    assert flag == 1 and checked == checked_values()
    # the same program, portable, on the host: the same bytes
    host, flag_h, checked_h, bad_h = _run("host", tmp_path, {})
    assert bad_h == 0 and checked_h == checked
    assert mve.files["all.bin"] == host.files["all.bin"] and mve.files["back.bin"] == host.files["back.bin"]
    # and numpy's float16, except NaN payloads (numpy neither quiets nor keeps them the way Arm's scalar VCVT does)
    every = np.arange(65536, dtype=np.uint16)
    got = np.frombuffer(mve.files["all.bin"], np.float32)
    want = every.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert (got[nan].view(np.uint32) == (((every[nan].astype(np.uint32) & 0x8000) << 16) | 0x7F800000
                                           | ((every[nan].astype(np.uint32) & 0x3FF) << 13))).all()
    back = np.frombuffer(mve.files["back.bin"], np.uint16)
    assert (back[~nan] == every[~nan]).all()  # every non-NaN fp16 value survives the round trip


def test_the_only_float_vector_instructions_are_the_two_vcvts(tmp_path):
    """tt_f16.c built for `kernels: mve` with the board's flags (+nomve.fp): -Werror clean, no floating-point vector
    instruction from the compiler (fp32 vector arithmetic flushes subnormals, tt_f16_mve.h says why), and the two
    hand-encoded VCVTs disassemble as what they mean."""
    import subprocess

    from tinytrain.stages.device.boards import get_board

    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("arm-none-eabi-objdump") is None:
        pytest.skip("needs arm-none-eabi-gcc and objdump")
    root = Path(__file__).resolve().parents[1]
    flags = [*get_board(BOARD).cflags, "-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O2",
             "-DTT_USE_MVE=1", f"-I{root / 'kernels_c'}"]
    assert "-mcpu=cortex-m55+nomve.fp" in flags
    obj = tmp_path / "f16.o"
    subprocess.run(["arm-none-eabi-gcc", *flags, "-c", "-o", str(obj), str(root / "kernels_c" / "tt_f16.c")], check=True)
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    vec_fp = re.findall(r"\t(v\w+)\.[fF](?:16|32)[.\w]*\s+q\d", dis)
    assert set(vec_fp) == {"vcvtb"}, vec_fp
    assert re.search(r"vcvtb\.f16\.f32\s+q\d, q\d", dis) and re.search(r"vcvtb\.f32\.f16\s+q\d, q\d", dis)
    assert re.search(r"vcmp\.u32", dis) and "vpsel" in dis  # the NaN fix-ups (unsigned compares on the bits)
