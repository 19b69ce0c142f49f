"""Helium float32 backward kernels (kernels_c/tt_float_mve.h, `target.kernels: mve`): the activation mask (from an
fp32 or an fp16 forward output) and the 1-bit mask gradient, built with and without Helium for the Cortex-M55 and run in QEMU on random shapes and edge
values (+-0, subnormals, +-Inf, NaNs with payloads, the activation bounds and their neighbours, in place and out of
place): the output bytes must be the portable kernels' and the host's, and numpy's float compares give the same."""

from __future__ import annotations

import shutil
import subprocess
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
#include "tt_kernels.h"
#include "tt_platform.h"

static uint8_t buf[200 * 1024];
static float out[48 * 1024], dy[1024];

static int32_t rd32(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); }

int tt_main(void) {
    long size = tt_read_file("cases.bin", buf, sizeof buf);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf), k = 0;
    const uint8_t *p = buf + 4;
    for (int32_t c = 0; c < cases; ++c) {
        int32_t kind = rd32(p), n = rd32(p + 4), arg = rd32(p + 8), inplace = rd32(p + 12), mbytes = rd32(p + 16);
        const uint8_t *d = p + 20;
        float *dst = inplace ? dy : out + k;
        memcpy(dy, d, (size_t)n * 4u);
        if (kind == 0) {
            float y[1024];
            memcpy(y, d + 4 * n, (size_t)n * 4u);
            tt_act_grad_f32(n, (tt_act)arg, dy, y, dst);
        } else if (kind == 2) {
            uint16_t yh[1024];
            memcpy(yh, d + 4 * n, (size_t)n * 2u);
            tt_act_grad_hy_f32(n, (tt_act)arg, dy, yh, dst);
        } else {
            tt_mask_grad_f32(n, arg, d + 4 * n, dy, dst);
        }
        if (inplace) memcpy(out + k, dy, (size_t)n * 4u);
        k += n;
        p = d + 4 * n + (kind == 0 ? 4 * n : kind == 2 ? 2 * n : mbytes);
    }
    return tt_write_file("out.bin", out, (size_t)k * 4u) == 0 ? 0 : 1;
}
"""

_EDGES = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 1.1754944e-38, np.inf, -np.inf, 6.0, -6.0,
                   1.0, -1.0, 3.4028235e38, -3.4028235e38, 0.5, -0.5], np.float32)
_NANS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32).view(np.float32)


def _cases(seed: int = 3):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        near = np.concatenate([np.nextafter(_EDGES, np.float32(np.inf)), np.nextafter(_EDGES, np.float32(-np.inf))])
    pool = np.concatenate([_EDGES, _NANS, near.astype(np.float32)])
    sizes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 255] + [int(s) for s in rng.integers(1, 1024, 16)]
    cases, blob = [], []
    for j, n in enumerate(sizes):
        for kind in (0, 1, 2):
            y = np.where(rng.random(n) < 0.5, rng.choice(pool, n), (rng.standard_normal(n) * 4).astype(np.float32))
            y = y.astype(np.float32)
            dy = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)  # any bits, NaNs too
            inplace = int(rng.random() < 0.3)
            if kind == 0:
                arg = j % 4  # none, relu, relu6, relu_n1_to_1
                payload = y.tobytes()
                mbytes = 0
            elif kind == 2:   # an fp16 forward output (fp16-mixed): any bits, so every fp16 edge and NaN occurs
                arg = j % 4
                with np.errstate(over="ignore"):   # large fp32 values become fp16 Inf: an edge case too
                    near16 = y.astype(np.float16).view(np.uint16)
                yh = np.where(rng.random(n) < 0.5, rng.integers(0, 2 ** 16, n).astype(np.uint16), near16)
                payload, mbytes = yh.astype("<u2").tobytes(), 0
                y = yh.view(np.float16).astype(np.float32)
            else:
                arg = int(rng.integers(0, 32))
                bits = rng.integers(0, 2, arg + n).astype(np.uint8)
                mask = np.packbits(bits, bitorder="little")
                payload, mbytes = mask.tobytes(), len(mask)
                y = bits[arg:]
            blob.append(np.array([kind, n, arg, inplace, mbytes], "<i4").tobytes() + dy.tobytes() + payload)
            cases.append((kind, arg, dy, y))
    return cases, np.int32(len(cases)).tobytes() + b"".join(blob)


def _numpy(cases) -> bytes:
    out = []
    with np.errstate(invalid="ignore"):
        for kind, arg, dy, y in cases:
            if kind in (0, 2):
                keep = {0: np.ones(len(y), bool), 1: y > 0, 2: (y > 0) & (y < 6), 3: (y > -1) & (y < 1)}[arg]
            else:
                keep = y.astype(bool)
            out.append(np.where(keep, dy.view(np.uint32), np.uint32(0)).astype("<u4").tobytes())
    return b"".join(out)


def _run(board: str, tmp: Path, defines: dict[str, str], blob: bytes):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "grads.c").write_text(PROG)
    b = get_board(board)
    tag = "-".join([board, *defines])
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=["ops/tt_act_grad.c", "ops/tt_mask_grad.c"],
                           defines=defines)
    ran = run_firmware(b, built.elf, tmp / f"run-{tag}", {"cases.bin": blob}, timeout_s=120)
    return ran.files["out.bin"], built.elf


@needs_arm
def test_helium_float_masks_equal_the_portable_kernels_in_qemu(tmp_path):
    cases, blob = _cases()
    want = _numpy(cases)
    mve, elf = _run(BOARD, tmp_path, {"TT_USE_MVE": "1"}, blob)
    port, elf_port = _run(BOARD, tmp_path, {}, blob)
    assert port == want  # the portable kernels against numpy's float compares
    assert mve == port   # Helium against the portable kernels, byte for byte
    dis = {e: subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(e)], capture_output=True,
                             text=True, check=True).stdout for e in (elf, elf_port)}
    assert "vpsel" in dis[elf] and "vpsel" not in dis[elf_port]  # the Helium path is what ran


@pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")
def test_the_same_program_on_the_host_gives_numpys_bytes(tmp_path):
    cases, blob = _cases()
    host, _ = _run("host", tmp_path, {"TT_USE_MVE": "1"}, blob)  # TT_USE_MVE is harmless where there is no MVE
    assert host == _numpy(cases)
