"""The 1x1 int8-weight input gradient's broadcast form (the positions stream, ops/tt_conv2d.c tt_gi1x1_bcast) on the
Cortex-M7 board in QEMU: the DSP build's hand-written VLDM / VSTM loops (add-only rows when every gradient is a masked
copy of the broadcast row, multiply-add rows when some are not) give the bits of the float kernel on the dequantized
weight, computed in the same firmware, and the portable build's bytes; so does the plain entry
(tt_conv2d_grad_input_qw_f32, which compares pixel 0's row instead of a broadcast one). Random shapes: pixel counts around the
16-pixel block, output-channel ranges with sums carried in dx, split weights, zero points, -0 and foreign gradients,
dense foreign gradients (pixel pairs sharing one list: tt_gi_mul_rows8x2).
Host-side coverage of the same C (ASan / UBSan): tests/test_kernels_c.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

BOARD = "stm32f746-disco"
KERNELS = ["ops/tt_conv2d.c", "tt_common.c"]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")]

# (pixels, in_c, out_c, trained slice n, zero points, gradient kind, output-channel cuts)
CASES = [(16, 24, 40, 0, False, "pure", (0, 40)),
         (16, 17, 37, 5, True, "pure", (0, 11, 30, 37)),
         (5, 8, 20, 0, False, "impure", (0, 20)),
         (21, 13, 33, 3, True, "impure", (0, 16, 33)),
         (4, 9, 18, 0, True, "negzero", (0, 7, 18)),
         (33, 40, 12, 0, False, "pure", (0, 12)),
         (16, 24, 40, 0, False, "dense", (0, 40)),
         (7, 16, 33, 5, True, "dense", (0, 20, 33)),
         (21, 9, 18, 0, True, "dense", (0, 18))]


def _program() -> str:
    px, ic, oc = (max(c[i] for c in CASES) for i in range(3))
    body = []
    for k, (p, c, o, n, zps, kind, cuts) in enumerate(CASES):
        calls = "".join(
            f"""
        for (i = 0; i < {p}; ++i) for (j = {a}; j < {b}; ++j) CH[i * {b - a} + j - {a}] = DY[i * {o} + j];
        tt_conv2d_grad_input_qw_f32_oc({p}, {c}, {a}, {b}, CH, COM + {a}, W, {'WS' if n else '0'}, {n}, SC, Z, DX);"""
            for a, b in zip(cuts[:-1], cuts[1:]))
        body.append(f"""
    {{ /* case {k}: {kind} */
        const tt_conv_dims d = {{1, {p}, 1, {c}, {p}, 1, {o}, 1, 1, 1, 1, 1, 1, 0, 0, 1}};
        state = {k * 11 + 3}u;
        for (j = 0; j < {o}; ++j) {{ COM[j] = frand(); SC[j] = 0.001f + (float)(rnd() & 1023) / 32768.0f;
                                    Z[j] = {'(int32_t)(rnd() % 7u) - 3' if zps else '0'}; }}
        for (i = 0; i < {o} * {c}; ++i) {{ W[i] = (int8_t)(rnd() & 0xFF); WS[i] = (int8_t)(rnd() & 0xFF); }}
        for (i = 0; i < {p}; ++i) for (j = 0; j < {o}; ++j) {{
            const uint32_t r = rnd() % 8u;
            DY[i * {o} + j] = r < 3u ? 0.0f : COM[j];
            if ({int(kind == 'impure')} && r == 3u) DY[i * {o} + j] = frand();
            if ({int(kind == 'negzero')} && r == 4u) DY[i * {o} + j] = -0.0f;
            if ({int(kind == 'dense')}) DY[i * {o} + j] = frand() + 9.0f; /* nonzero: pixel pairs of one list */
        }}
        for (j = 0; j < {o}; ++j) for (i = 0; i < {c}; ++i) {{
            const int8_t q = i < {n} ? WS[j * {n} + i] : W[j * {c} + i];
            WF[j * {c} + i] = (float)((int32_t)q - Z[j]) * SC[j];
        }}
        for (i = 0; i < {p} * {c}; ++i) DX[i] = 12345.0f;{calls}
        tt_conv2d_grad_input_f32(&d, DY, WF, DXF);
        for (i = 0; i < {p} * {c}; ++i) DX2[i] = 12345.0f;
        tt_conv2d_grad_input_qw_f32(&d, DY, W, {'WS' if n else 'W'}, {n}, SC, Z, DX2);
        if (tt_write(fd, DX, {p * c * 4}) != 0 || tt_write(fd, DXF, {p * c * 4}) != 0 ||
            tt_write(fd, DX2, {p * c * 4}) != 0) return 3;
    }}""")
    return f"""#include <stdint.h>
#include "tt_platform.h"
#include "tt_kernels.h"

static uint32_t state = 1u;
static uint32_t rnd(void) {{ state = state * 1664525u + 1013904223u; return state >> 8; }}
static float frand(void) {{ return (float)((int32_t)(rnd() & 0xFFFF) - 32768) / 4096.0f; }}
static float DY[{px * oc}], CH[{px * oc}], COM[{oc}], SC[{oc}], WF[{oc * ic}], DX[{px * ic}], DXF[{px * ic}], DX2[{px * ic}];
static int8_t W[{oc * ic}], WS[{oc * ic}];
static int32_t Z[{oc}];

int tt_main(void)
{{
    int32_t i, j;
    const int fd = tt_open("out.bin", TT_WRITE);
    if (fd < 0) return 2;
{''.join(body)}
    tt_close(fd);
    return 0;
}}
"""


def _run(kernels: str, work: Path) -> bytes:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = work / f"prog-{kernels}"
    prog.mkdir(parents=True, exist_ok=True)
    (prog / "gi.c").write_text(_program())
    board = get_board(BOARD)
    built = build_firmware(board, prog, work / f"build-{kernels}", kernels=KERNELS,
                           defines={"TT_USE_DSP": "1"} if kernels == "dsp" else None)
    ran = run_firmware(board, built.elf, work / f"run-{kernels}", {}, timeout_s=300, results_name=None,
                       losses_name=None)
    return ran.files["out.bin"]


def test_broadcast_input_gradient_in_qemu_gives_the_float_kernels_bits(tmp_path):
    dsp = _run("dsp", tmp_path)
    assert dsp == _run("portable", tmp_path)
    pos = 0
    for p, c, *_ in CASES:
        got = np.frombuffer(dsp, "<u4", p * c, pos)
        want = np.frombuffer(dsp, "<u4", p * c, pos + 4 * p * c)
        plain = np.frombuffer(dsp, "<u4", p * c, pos + 8 * p * c)  # tt_conv2d_grad_input_qw_f32: no broadcast row
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(plain, want)
        pos += 12 * p * c
    assert pos == len(dsp)
