"""The hidden-channel stream kernels and the depthwise one-channel input gradient in the DSP build (`kernels: dsp`:
float pairs moved by VLDM / VSTM, eight pixels per pass) give the portable build's bytes on random chain shapes, run
on the Cortex-M7 board in QEMU: odd pixel counts and odd channel counts (the pair loops' tails), split int8 weights,
float weights, strides 1 and 2, padding or none; the masked start (tt_hs_pw_grad_in_mask_f32) on random masks. The DSP firmware runs fewer instructions in total (an inequality on
QEMU's deterministic counts, no timing). The portable kernels themselves are checked against the golden model by
tests/test_hidden_stream.py and tests/test_kernels_c.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")

KERNELS = ["tt_hidden_stream.c", "ops/tt_depthwise_conv2d.c", "tt_common.c"]  # what the program calls


def _cases(n: int) -> list[dict]:
    rng = np.random.default_rng(11)
    out = []
    for i in range(n):
        h, w = int(rng.integers(2, 9)), int(rng.integers(2, 9))
        s = int(rng.integers(1, 3))
        pad = int(rng.integers(0, 2))
        oh, ow = (h + 2 * pad - 3) // s + 1, (w + 2 * pad - 3) // s + 1
        if oh < 1 or ow < 1:
            pad, oh, ow = 1, (h - 1) // s + 1, (w - 1) // s + 1
        out.append({"C": int(rng.integers(2, 6)), "P": oh * ow, "K": int(rng.integers(1, 20)), "IC": int(rng.integers(1, 20)),
                    "n": int(rng.integers(0, 4)) if i % 3 == 0 else 0, "float": i % 4 == 1, "h": h, "w": w, "s": s,
                    "pad": pad, "oh": oh, "ow": ow})
    return out


def _program(cases: list[dict]) -> str:
    body = []
    for i, c in enumerate(cases):
        C, P, K, IC, n, h, w = c["C"], c["P"], c["K"], c["IC"], min(c["n"], c["IC"]), c["h"], c["w"]
        PA = h * w
        fw = c["float"]
        wq_args = ("WF, WF2, 0, 0" if fw else f"0, 0, WQ, {'WQ2' if n else '0'}")
        acc_args = ("WF3, WF4, 0, 0" if fw else f"0, 0, WQ3, {'WQ4' if n else '0'}")
        body.append(f"""
    {{ const tt_conv_dims dd = {{1, {h}, {w}, 1, {c['oh']}, {c['ow']}, 1, 3, 3, {c['s']}, {c['s']}, 1, 1, {c['pad']}, {c['pad']}, 1}};
       int32_t o; float wc[9];
       fillf(DZ, {P * K}, {i + 1}u); fill(WQ, {K * C}, 3u); fill(WQ2, {K * n + 1}, 4u); fill(WQ3, {C * IC}, 5u);
       fill(WQ4, {C * n + 1}, 6u); fillf(WF, {K * C}, 7u); fillf(WF2, {K * n + 1}, 8u); fillf(WF3, {C * IC}, 9u);
       fillf(WF4, {C * n + 1}, 10u); fill(XQ, {PA * IC}, 11u);
       memset(DX, 0, sizeof DX);
       for (o = 0; o < {C}; ++o) {{
         tt_hs_pw_grad_in_f32({P}, {K}, {C}, o, DZ, {wq_args}, {n}, SC, ZP, DH1);
         fill((int8_t *)MK, {(P * C + 7) // 8}, 12u + (uint32_t)o);
         tt_hs_pw_grad_in_mask_f32({P}, {K}, {C}, o, DZ, {wq_args}, {n}, SC, ZP, MK, DH3, DB);
         if (tt_write(fd, DH3, {4 * P}) != 0 || tt_write(fd, DB, 4) != 0) return 3;
         tt_hs_dw_taps(9, {C}, o, {'WF' if fw else '0'}, WQ, SC, ZP, wc);
         tt_depthwise_conv2d_grad_input_channel_f32(&dd, DH1, wc, 1, 0, 0, 0.0f, DH2, 1, 0);
         for (j = 0; j < {PA}; ++j) if ((j * 7 + o) % 5 < 2) DH2[j] = (j & 1) ? -0.0f : 0.0f; /* masked pixels */
         tt_hs_pw_grad_in_acc_f32({PA}, {IC}, o, DH2, {acc_args}, {n}, SC, ZP, DX);
         if (tt_write(fd, DH1, {4 * P}) != 0 || tt_write(fd, DH2, {4 * PA}) != 0) return 3;
       }}
       if (tt_write(fd, DX, {4 * PA * IC}) != 0) return 3;
    }}""")
    return """#include <stdint.h>
#include <string.h>
#include "tt_platform.h"
#include "tt_kernels.h"
static uint32_t state = 1u;
static uint32_t rnd(void) { state = state * 1664525u + 1013904223u; return state >> 8; }
static void fill(int8_t *p, int32_t n, uint32_t seed) { int32_t i; state = seed; for (i = 0; i < n; ++i) p[i] = (int8_t)(rnd() & 0xFF); }
/* a quarter zeros (as masked gradients), the rest of either sign */
static void fillf(float *p, int32_t n, uint32_t seed) { int32_t i; state = seed; for (i = 0; i < n; ++i) { uint32_t r = rnd(); p[i] = (r & 3u) == 0 ? 0.0f : ((float)(int32_t)(r & 0xFFFF) - 32768.0f) * 1e-4f; } }
static uint8_t MK[512];
static float DH3[128], DB[1];
static float DZ[2048], DH1[128], DH2[128], DX[2048], WF[256], WF2[128], WF3[256], WF4[128], SC[32];
static int8_t WQ[256], WQ2[128], WQ3[256], WQ4[128], XQ[2048];
static int32_t ZP[32];
int tt_main(void)
{
    int32_t j;
    uint64_t t0;
    const int fd = tt_open("out.bin", TT_WRITE);
    if (fd < 0) return 2;
    for (j = 0; j < 32; ++j) { SC[j] = 0.01f * (float)(1 + j % 7); ZP[j] = j % 5 - 2; }
    t0 = tt_instructions();
""" + "".join(body) + """
    tt_log("@total %lu\\n", (unsigned long)(tt_instructions() - t0));
    tt_close(fd);
    return 0;
}
"""


def _run(cases: list[dict], kernels: str, work: Path) -> tuple[int, bytes]:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = work / f"prog-{kernels}"
    prog.mkdir(parents=True)
    (prog / "bench.c").write_text(_program(cases))
    board = get_board("stm32f746-disco")
    built = build_firmware(board, prog, work / f"build-{kernels}", kernels=KERNELS,
                           defines={"TT_USE_DSP": "1"} if kernels == "dsp" else None)
    ran = run_firmware(board, built.elf, work / f"run-{kernels}", {}, timeout_s=600, results_name=None)
    return int(re.search(r"@total (\d+)", ran.console)[1]), ran.files["out.bin"]


@pytest.mark.slow  # two firmware builds and QEMU runs: ~10-20 s
@needs_arm
def test_hidden_stream_dsp_kernels_give_the_portable_bits_in_qemu(tmp_path):
    cases = _cases(10)
    assert {c["s"] for c in cases} == {1, 2} and any(c["P"] % 8 for c in cases) and any(c["K"] % 2 for c in cases)
    port_n, port = _run(cases, "portable", tmp_path)
    dsp_n, dsp = _run(cases, "dsp", tmp_path)
    assert len(port) > 0 and dsp == port
    assert dsp_n < port_n
