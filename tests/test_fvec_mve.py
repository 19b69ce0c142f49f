"""kernels_c/tt_fvec_mve.h in QEMU on the Cortex-M55: the operand check tt_fvec_ok against its definition (numpy, on
every exponent and sign with edge mantissas and random patterns, every length and alignment of the tail), the fp16
widening loads against numpy's float16, and the header's argument itself: products of fp16 values with fp32 values
that pass the check, summed lane by lane with VMUL + VADD.F32, equal the scalar FPU's VMUL + VADD bit for bit over
random sums that reach the bottom of the normal range, while the same sums with weights that fail the check do not
(MVE flushes the subnormals the scalar FPU keeps: the check is what makes the vector kernels exact)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"

pytestmark = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")

PROG = r"""
#include "tt_fvec_mve.h"   /* first: the unit is compiled with MVE floating point */
#include <string.h>
#include "tt_platform.h"

#define NOK 4096
#define NSUM 8000
#define TERMS 24
static uint32_t ok_in[NOK];
static uint8_t ok_out[NOK];
static uint16_t h_in[16384 + 8];
static float h_out[16384 + 8];
static uint32_t sums_ok[2 * NSUM], sums_bad[2 * NSUM];  /* (vector lane, scalar) bit pairs */
static uint32_t rng = 0x9E3779B9u;

static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* an fp16 value (as fp32) with a biased exponent 0..4 (subnormals included): small products, so that the sums
 * reach the bottom of the range */
static float rand_h(void) {
    float f[4];
    h_in[0] = (uint16_t)((next() & 0x83FFu) | ((next() % 5u) << 10));
    vst1q_f32(f, tt_fvec_ld_h4(h_in));
    return f[0];
}

/* an fp32 weight: biased exponent lo..lo+5, any mantissa and sign */
static float rand_w(uint32_t lo) {
    uint32_t e = lo + (next() % 6u);
    return from_bits((next() & 0x807FFFFFu) | (e << 23));
}

/* TERMS products summed from +0, one lane vector and the scalar FPU, in the same order */
static void sums(uint32_t *out, uint32_t wlo) {
    uint32_t s, t;
    for (s = 0; s < NSUM; ++s) {
        float x[TERMS], w[TERMS], acc = 0.0f, lanes[4];
        float32x4_t v = vdupq_n_f32(0.0f);
        for (t = 0; t < TERMS; ++t) {
            x[t] = rand_h();
            w[t] = rand_w(wlo);
        }
        for (t = 0; t < TERMS; ++t) {
            volatile float p = x[t] * w[t];  /* the portable kernels' two roundings (-ffp-contract=off) */
            acc = acc + p;
            v = vaddq_f32(v, vmulq_n_f32(vdupq_n_f32(x[t]), w[t]));
        }
        vst1q_f32(lanes, v);
        out[2 * s] = bits(lanes[0]);
        out[2 * s + 1] = bits(acc);
    }
}

int tt_main(void) {
    uint32_t i, n, bad = 0;
    static const uint32_t exps[] = {0, 1, 2, 46, 47, 48, 49, 100, 127, 200, 253, 254, 255};
    /* the check: edge exponents with edge mantissas, then random patterns */
    for (i = 0; i < NOK; ++i) {
        uint32_t e = exps[i % (sizeof exps / sizeof exps[0])], m = (i / 13u) % 3u;
        uint32_t mant = m == 0 ? 0u : m == 1 ? 1u : 0x7FFFFFu;
        ok_in[i] = i < 1024u ? (((i / 39u) & 1u) << 31) | (e << 23) | mant : next();
    }
    for (i = 0; i < NOK; ++i) ok_out[i] = (uint8_t)tt_fvec_ok((const float *)(const void *)(ok_in + i), 1);
    /* every length and start of a run of good values with one bad value placed anywhere in it */
    for (n = 1; n <= 13u && !bad; ++n) {
        uint32_t at;
        float run[16];
        for (i = 0; i < 16u; ++i) run[i] = 1.5f;
        if (!tt_fvec_ok(run, (int32_t)n)) bad = 1;
        for (at = 0; at < n; ++at) {
            run[at] = from_bits(1u);  /* the smallest subnormal */
            if (tt_fvec_ok(run, (int32_t)n) || !tt_fvec_ok(run, (int32_t)at)) bad = 1;
            run[at] = 1.5f;
        }
        run[n] = from_bits(0x7F800000u);  /* past the end: never read */
        if (!tt_fvec_ok(run, (int32_t)n)) bad = 1;
        run[n] = 1.5f;
    }
    /* widening: every fp16 value, four at a time (in four files of 16384), and as a 1..3 tail */
    for (n = 0; n < 4u; ++n) {
        static const char *const names[4] = {"h0.bin", "h1.bin", "h2.bin", "h3.bin"};
        for (i = 0; i < 16384u; ++i) h_in[i] = (uint16_t)(n * 16384u + i);
        for (i = 0; i < 16384u; i += 4) vst1q_f32(h_out + i, tt_fvec_ld_h4(h_in + i));
        if (tt_write_file(names[n], h_out, 16384 * 4)) return 1;
    }
    for (i = 1; i < 4u; ++i) {
        float t[4];
        uint32_t k;
        vst1q_f32(t, tt_fvec_ld_h4_z(h_in + 100 * i, (int32_t)i));
        for (k = 0; k < 4u; ++k)
            if (bits(t[k]) != (k < i ? bits(h_out[100 * i + k]) : 0u)) bad = 1;
    }
    sums(sums_ok, 48u);     /* weights from 2^-79 up: every sum exact in G(2^-126) */
    sums(sums_bad, 1u);     /* weights from the bottom of the normal range: products and sums go subnormal */
    tt_log("fvec bad=%lu\n", (unsigned long)bad);
    if (tt_write_file("ok_in.bin", ok_in, sizeof ok_in) || tt_write_file("ok_out.bin", ok_out, sizeof ok_out) ||
        tt_write_file("sums_ok.bin", sums_ok, sizeof sums_ok) ||
        tt_write_file("sums_bad.bin", sums_bad, sizeof sums_bad))
        return 1;
    return bad ? 1 : 0;
}
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    tmp = tmp_path_factory.mktemp("fvec")
    prog = tmp / "prog"
    prog.mkdir()
    (prog / "fvec.c").write_text(PROG)
    b = get_board(BOARD)
    built = build_firmware(b, prog, tmp / "build", kernels=[], defines={"TT_USE_MVE": "1"})
    run = run_firmware(b, built.elf, tmp / "run", {}, timeout_s=300, check=False)
    m = re.search(r"fvec bad=(\d+)", run.console)
    assert m and m.group(1) == "0", run.console[-2000:]
    return run


def test_the_operand_check_is_its_definition(ran):
    u = np.frombuffer(ran.files["ok_in.bin"], np.uint32)
    got = np.frombuffer(ran.files["ok_out.bin"], np.uint8).astype(bool)
    e = (u >> 23) & 0xFF
    want = ((u & 0x7FFFFFFF) == 0) | ((e >= 48) & (e <= 254))
    np.testing.assert_array_equal(got, want)
    assert want.sum() > 100 and (~want).sum() > 100  # both answers are exercised


def test_the_widening_load_is_numpys_float16(ran):
    got = np.frombuffer(b"".join(ran.files[f"h{k}.bin"] for k in range(4)), np.float32)
    every = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = ~np.isnan(every)
    np.testing.assert_array_equal(got[finite].view(np.uint32), every[finite].view(np.uint32))
    assert np.isnan(got[~finite]).all()


def test_guarded_vector_sums_are_the_scalar_fpus_and_unguarded_ones_are_not(ran):
    ok = np.frombuffer(ran.files["sums_ok.bin"], np.uint32).reshape(-1, 2)
    np.testing.assert_array_equal(ok[:, 0], ok[:, 1])
    # the sums reach the small end of the range the argument allows (so the test would see a flush)
    mags = np.abs(ok[:, 1].view(np.float32))
    assert mags[mags > 0].min() < 2.0 ** -95
    bad = np.frombuffer(ran.files["sums_bad.bin"], np.uint32).reshape(-1, 2)
    differs = bad[:, 0] != bad[:, 1]
    assert differs.sum() > 100
    # where they differ, the scalar FPU kept a subnormal somewhere that Helium flushed
    assert (np.abs(bad[differs, 1].view(np.float32)) < 2.0 ** -80).all()


def test_the_vector_kernels_make_no_indirect_call(tmp_path):
    """Every tt_fvec_*.c unit, built for `kernels: mve` with the board's flags, calls only named functions: the stack
    bound (stages/device/stack_bound.py) cannot follow a call through a register, and one such call makes every
    mps3-an547 build fall back to the board's 16 KB default stack in its SRAM figure (a table of function pointers in
    tt_fvec_conv.c once did: +14.5 KB on MobileNetV2)."""
    import subprocess

    from tinytrain.stages.c_emit import ops_header
    from tinytrain.stages.device.boards import get_board

    root = Path(__file__).resolve().parents[1]
    units = sorted((root / "kernels_c").glob("tt_fvec_*.c"))
    assert units
    flags = [*get_board(BOARD).cflags, "-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O3",
             "-DTT_USE_MVE=1", f"-I{root / 'kernels_c'}", f"-I{ops_header.include_dir()}"]
    for unit in units:
        obj = tmp_path / (unit.stem + ".o")
        subprocess.run(["arm-none-eabi-gcc", *flags, "-c", "-o", str(obj), str(unit)], check=True)
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(obj)], capture_output=True,
                             text=True, check=True).stdout
        through_register = [ln for ln in dis.splitlines() if re.search(r"\t(blx|bx)\s+r\d+\b", ln)]
        assert not through_register, (unit.name, through_register[:3])
