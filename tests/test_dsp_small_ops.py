"""The DSP forms of the small int8 ops of a training step (issue 14): tt_add_s8 (one SMMLAR per rescaling,
tt_requant.h's tt_requant_mmx) and tt_clamp_mask_s8 (four bytes per SSUB8 / SEL pair) give the portable kernels'
bytes; so do 1x1 convs whose blocks leave the widened-weight pass for the general requantization (a negative
multiplier: the weight sums the pass skips are then computed after all).

One program runs random cases of both kernels and writes every output to out.bin; it also checks
tt_requant_mmx_apply against the reference rescaling (tt_multiply_by_quantized_multiplier_smaller_than_one_exp + z)
on random values over its whole stated domain (m >= 0, shift 0..-22, |x| < 2^30), including the edges, and logs
the mismatches (a rescaling off by one in its last place seldom shows in an add's int8 output, so the primitive is
checked on its own). The program is built for the host under ASan / UBSan (portable, and the DSP path with the
ACLE emulated: tests/c/acle_host) and, when the ARM tools are there, for the Cortex-M7 board in QEMU (portable and
dsp, where the SMMLAR / SSUB8 / SEL instructions run); every build must write the same bytes (the host build leaves out the convs: C paths that tests/test_kernels_c.py
covers; on the device they are assembly).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tinytrain.stages.c_emit import ops_header

REPO = Path(__file__).resolve().parents[1]
KDIR = REPO / "kernels_c"

PROGRAM = r"""
#include <stdint.h>
#include "tt_kernels.h"
#include "tt_mask.h"
#include "tt_requant.h"

static uint32_t state = 12345u;
static uint32_t rnd(void) { state ^= state << 13; state ^= state >> 17; state ^= state << 5; return state; }
static int32_t between(int32_t lo, int32_t hi) { return lo + (int32_t)(rnd() % (uint32_t)(hi - lo + 1)); }

static int8_t A[600], B[600], Y[600];
static uint8_t OUT[80000];

/* tt_requant_mmx_apply against the reference on `count` random values; the number of mismatches. */
static int32_t check_mmx(int32_t count)
{
    int32_t k, bad = 0;
    for (k = 0; k < count; ++k) {
        tt_requant_mmx o;
        const int32_t e = between(0, 22), z = between(-128, 128);
        int32_t m = (int32_t)(rnd() >> 1), x = (int32_t)(rnd() >> 2) - (int32_t)(rnd() >> 2);
        if (k % 7 == 0) {
            m = k % 3 == 0 ? 0 : (k % 3 == 1 ? 1073741824 : 2147483647);
        }
        if (k % 11 == 0) {
            x = k % 2 ? 1073741823 : -1073741823;
        } else if (k % 13 == 0) {
            x = between(-4, 4);
        }
        if (!tt_requant_mmx_init(&o, m, -e, z)) {
            return -1;
        }
        if (tt_requant_mmx_apply(&o, 2 * x) != tt_multiply_by_quantized_multiplier_smaller_than_one_exp(x, m, -e) + z) {
            ++bad;
        }
    }
    return bad;
}

/* Random add and clamp-mask cases; their outputs appended to OUT. The number of bytes. */
static int32_t run_ops(void)
{
    int32_t used = 0, c, i;
    state = 2463534242u; /* the same cases whatever check_mmx drew */
    for (c = 0; c < 60; ++c) {
        tt_add_params_s8 p;
        const int32_t n = c < 4 ? c + 1 : between(1, 600);
        p.input1_zero_point = between(-128, 127);
        p.input2_zero_point = between(-128, 127);
        p.output_zero_point = between(-128, 127);
        p.left_shift = c % 17 == 16 ? 19 : 20; /* 19: not the fast form (the reference loop) */
        p.input1_multiplier = 1073741824 + (int32_t)(rnd() >> 2);
        p.input2_multiplier = c % 3 == 0 ? 1073741824 : 1073741824 + (int32_t)(rnd() >> 2);
        p.input1_shift = -between(0, 6);
        p.input2_shift = c % 3 == 0 ? 0 : -between(0, 6);
        p.output_multiplier = 1073741824 + (int32_t)(rnd() >> 2);
        p.output_shift = c % 13 == 12 ? -23 : (c % 19 == 18 ? 0 : -between(8, 22)); /* -23, 0: not the fast form */
        if (c % 2) {
            p.act_min = -128;
            p.act_max = 127;
        } else {
            p.act_min = between(-128, 0);
            p.act_max = between(p.act_min, 127);
        }
        for (i = 0; i < n; ++i) {
            A[i] = (int8_t)between(-128, 127);
            B[i] = (int8_t)between(-128, 127);
        }
        tt_add_s8(&p, n, A, B, Y);
        for (i = 0; i < n; ++i) {
            OUT[used++] = (uint8_t)Y[i];
        }
    }
    for (c = 0; c < 40; ++c) {
        const int32_t n = c < 9 ? c + 1 : between(1, 300);
        int32_t lo = between(-140, 140), hi = between(-140, 140);
        uint8_t m[40];
        if (c % 4 == 0) {
            lo = c % 8 == 0 ? -128 : 0;
            hi = c % 8 == 0 ? 127 : between(1, 127);
        }
        for (i = 0; i < n; ++i) {
            A[i] = (int8_t)(c % 5 == 0 ? between(lo - 2, lo + 2) : between(-128, 127));
        }
        tt_clamp_mask_s8(n, lo, hi, A, m);
        for (i = 0; i < (n + 7) / 8; ++i) {
            OUT[used++] = m[i];
        }
    }
#ifdef PW_CONV /* the device build: its conv paths are hand-written assembly (the host runs the C ones elsewhere) */
    for (c = 0; c < 6; ++c) { /* 1x1 convs (eight input channels, the widened-weight pass) with channels outside the
                                 one-SMMLAR form */
        static int8_t W[40 * 40];
        static int32_t bias[40], mult[40], shift[40];
        const int32_t ic = c < 2 ? 8 : 16 + 4 * c, oc = ic == 8 ? 40 : 24, hw = 12;
        const tt_conv_dims d = {1, 3, 4, ic, 3, 4, oc, 1, 1, 1, 1, 1, 1, 0, 0, 1};
        tt_requant_s8 q;
        for (i = 0; i < oc; ++i) {
            bias[i] = between(-3000, 3000);
            mult[i] = 1073741824 + (int32_t)(rnd() >> 2);
            shift[i] = -between(6, 9);
            if (c % 2 == 0 && (ic == 8 ? i == 30 : i % 4 == 1)) {
                /* a negative multiplier: the block takes the general requantization (eight input channels: in the
                 * second chunk of 24 output channels, after the first one's outputs are written) */
                mult[i] = -mult[i];
            }
        }
        for (i = 0; i < oc * ic; ++i) {
            W[i] = (int8_t)between(-128, 127);
        }
        for (i = 0; i < hw * ic; ++i) {
            A[i] = (int8_t)between(-128, 127);
        }
        q.input_zero_point = between(-20, 20);
        q.output_zero_point = between(-10, 10);
        q.act_min = -128;
        q.act_max = 127;
        q.multiplier = mult;
        q.shift = shift;
        q.per_channel = 1;
        tt_conv2d_s8(&d, &q, A, W, bias, Y);
        for (i = 0; i < hw * oc; ++i) {
            OUT[used++] = (uint8_t)Y[i];
        }
    }
#endif
    return used;
}
"""

MAIN_DEVICE = r"""
#include "tt_platform.h"
int tt_main(void)
{
    const int fd = tt_open("out.bin", TT_WRITE);
    int32_t n;
    if (fd < 0) return 2;
    tt_log("@mmx %ld\n", (long)check_mmx(COUNT));
    n = run_ops();
    if (tt_write(fd, OUT, (size_t)n) != 0) return 3;
    tt_close(fd);
    return 0;
}
"""

MAIN_HOST = r"""
#include <stdio.h>
int main(int argc, char **argv)
{
    FILE *f;
    int32_t n;
    (void)argc;
    printf("@mmx %ld\n", (long)check_mmx(COUNT));
    n = run_ops();
    f = fopen(argv[1], "wb");
    if (f == NULL || fwrite(OUT, 1, (size_t)n, f) != (size_t)n) return 3;
    fclose(f);
    return 0;
}
"""

KERNELS = ["ops/tt_add.c", "tt_mask.c", "tt_common.c", "tt_f16.c"]
SOURCES = [KDIR / k for k in KERNELS]


def _host(tmp: Path, dsp: bool) -> tuple[int, bytes]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    src = tmp / f"prog-{dsp}.c"
    src.write_text(PROGRAM + MAIN_HOST.replace("COUNT", "100000"))
    exe = tmp / f"prog-{dsp}"
    flags = ["-DTT_USE_DSP=1", "-D__ARM_FEATURE_DSP=1", "-D__ARM_FEATURE_SIMD32=1",
             f"-I{REPO / 'tests' / 'c' / 'acle_host'}"] if dsp else []
    cmd = [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=all", *flags, f"-I{KDIR}", f"-I{ops_header.include_dir()}", str(src),
           *map(str, SOURCES), "-lm", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = tmp / f"out-{dsp}.bin"
    run = subprocess.run([str(exe), str(out)], capture_output=True, text=True, check=True)
    return int(re.search(r"@mmx (-?\d+)", run.stdout)[1]), out.read_bytes()


def test_small_ops_dsp_path_gives_portable_bytes_on_host(tmp_path):
    """Host, ASan / UBSan: the emulated DSP path's bytes are the portable path's; the one-SMMLAR rescaling equals the
    reference on 100k random values (its C form: the SMMLAR's int64 emulation)."""
    bad_p, port = _host(tmp_path, False)
    bad_d, dsp = _host(tmp_path, True)
    assert bad_p == 0 and bad_d == 0
    assert len(port) > 10000 and dsp == port


needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")


@pytest.mark.slow  # two firmware builds and runs: ~13 s
@needs_arm
def test_small_ops_dsp_path_gives_portable_bytes_in_qemu(tmp_path):
    """Cortex-M7 in QEMU: SMMLAR / SSUB8 / SEL and the 1x1 conv's assembly on the device give the portable
    firmware's bytes, and the rescaling equals the reference on 20k random values there."""
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    board = get_board("stm32f746-disco")
    got = {}
    for kernels in ("portable", "dsp"):
        prog = tmp_path / f"prog-{kernels}"
        prog.mkdir()
        (prog / "prog.c").write_text(PROGRAM + MAIN_DEVICE.replace("COUNT", "20000"))
        built = build_firmware(board, prog, tmp_path / f"build-{kernels}",
                               kernels=[*KERNELS, "ops/tt_conv2d.c"],
                               defines={"PW_CONV": "1", **({"TT_USE_DSP": "1"} if kernels == "dsp" else {})})
        ran = run_firmware(board, built.elf, tmp_path / f"run-{kernels}", {}, timeout_s=300, results_name=None)
        got[kernels] = (int(re.search(r"@mmx (-?\d+)", ran.console)[1]), ran.files["out.bin"])
    assert got["portable"][0] == 0 and got["dsp"][0] == 0
    assert got["dsp"][1] == got["portable"][1]
    _, host = _host(tmp_path, False)  # the host's bytes: the same cases but the convs (which come last)
    assert got["dsp"][1].startswith(host) and len(got["dsp"][1]) > len(host)
