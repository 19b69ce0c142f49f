"""Helium fp32-vector weight gradients of fp16-mixed (kernels_c/tt_fvec_gw.c, `target.kernels: mve`): conv2d's
tt_conv2d_grad_weight_hdy_hx_f32_range / _hdy_f32_range / _hx_f32_range and the fully connected
tt_fully_connected_grad_weight_hdy_range / _hx_f32_range, built with and without Helium for the Cortex-M55 and run in
QEMU on random shapes (1x1 / 3x3 / 5x1, stride 1 / 2, padding, dilation, two images, trained slices k < in_c, channel
counts that are not multiples of 4, output-channel ranges) with fp16 subnormals, +-0, fp16's largest values and
infinities, and fp32 operands at and around the 2^-79 bound of tt_fvec_mve.h:
- the Helium build's dw bytes are the portable build's, which are numpy's float32 sums in the walk's order;
- the vector kernel ran where its operands allow (it returned 1) and fell back where an fp32 operand fails the check
  (a subnormal, a tiny normal, a value just below 2^-79, an infinity);
- run without the check on those operands, the vector loop gives other bits (the check is needed, and this test would
  see a kernel that skipped it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"
KERNELS = ["ops/tt_conv2d.c", "ops/tt_fully_connected.c", "tt_fvec_gw.c", "tt_common.c"]
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")

IN_WORDS, OUT_WORDS = 24 * 1024, 8 * 1024

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_kernels.h"
#include "tt_platform.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_gw.h"
#define MVE 1
#else
#define MVE 0
#endif

static uint32_t in32[IN_WORDS], out32[OUT_WORDS];
#if MVE
static uint32_t spare32[OUT_WORDS / 4];
#endif
static int32_t flags[256];

int tt_main(void) {
    long size = tt_read_file("cases.bin", in32, sizeof in32);
    if (size < 4) tt_fail("no cases.bin");
    const int32_t cases = (int32_t)in32[0];
    const uint32_t *h = in32 + 1;
    float *out = (float *)(void *)out32;
    int32_t c, at = 0;
    for (c = 0; c < cases; ++c) {
        /* op (0 conv, 1 fully connected, 2 conv without the check), dy fp16?, x fp16?, k, o0, o1, dims[16], dy words,
         * x words; then dy, x (fp16 data padded to a word) */
        const int32_t op = (int32_t)h[0], dyh = (int32_t)h[1], xh = (int32_t)h[2], k = (int32_t)h[3];
        const int32_t o0 = (int32_t)h[4], o1 = (int32_t)h[5], dyw = (int32_t)h[22], xw = (int32_t)h[23];
        tt_conv_dims d;
        memcpy(&d, h + 6, sizeof d);
        const void *dy = h + 24, *x = h + 24 + dyw;
        const int32_t n = op == 1 ? (o1 - o0) * k : (o1 - o0) * d.k_h * d.k_w * k;
        float *dw = out + at;
        memset(dw, 0xA5, (size_t)n * 4);   /* every element must be written */
        if (op == 1) {
            if (dyh) tt_fully_connected_grad_weight_hdy_range(d.batches, d.in_h, d.in_w, k, o0, o1, dy,
                                                              xh ? 0 : x, xh ? x : 0, dw);
            else tt_fully_connected_grad_weight_hx_f32_range(d.batches, d.in_h, d.in_w, k, o0, o1, dy, x, dw);
        } else if (op == 2 && MVE) {
#if MVE
            tt_fvec_gw_conv_unchecked(&d, k, o0, o1, dyh ? 0 : dy, dyh ? dy : 0, xh ? 0 : x, xh ? x : 0, dw);
#endif
        } else if (dyh && xh) {
            tt_conv2d_grad_weight_hdy_hx_f32_range(&d, k, o0, o1, dy, x, dw);
        } else if (dyh) {
            tt_conv2d_grad_weight_hdy_f32_range(&d, k, o0, o1, dy, x, dw);
        } else {
            tt_conv2d_grad_weight_hx_f32_range(&d, k, o0, o1, dy, x, dw);
        }
#if MVE
        /* did the vector kernel take these operands? (its result goes to a scratch) */
        if (op == 1) flags[c] = tt_fvec_gw_fc(d.batches, d.in_h, d.in_w, k, o0, o1, dyh ? 0 : dy, dyh ? dy : 0,
                                              xh ? 0 : x, xh ? x : 0, (float *)(void *)spare32);
        else flags[c] = tt_fvec_gw_conv(&d, k, o0, o1, dyh ? 0 : dy, dyh ? dy : 0, xh ? 0 : x, xh ? x : 0,
                                        (float *)(void *)spare32);
#else
        flags[c] = -1;
#endif
        at += n;
        h += 24 + dyw + xw;
    }
    if (tt_write_file("flags.bin", flags, (size_t)cases * 4) != 0) return 1;
    return tt_write_file("out.bin", out, (size_t)at * 4) == 0 ? 0 : 1;
}
""".replace("IN_WORDS", str(IN_WORDS)).replace("OUT_WORDS", str(OUT_WORDS))

_F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x0200],
                      np.uint16).view(np.float16)
_F32_EDGES = np.array([0.0, -0.0, 2.0 ** -79, -(2.0 ** -79), 2.0 ** -79 * (1 + 2.0 ** -23), 1e30, -1e30, 3e-24],
                      np.float32)
# fp32 operands tt_fvec_mve.h does not allow: a subnormal, a normal so tiny that its products are subnormal, the
# largest float below 2^-79, an infinity
_F32_BAD = {"subnormal": np.float32(1e-40), "tiny": np.float32(1e-36),
            "below": np.nextafter(np.float32(2.0 ** -79), np.float32(0)), "inf": np.float32(np.inf)}


def _f16s(rng, n: int, inf: bool = False) -> np.ndarray:
    """fp16 values of every magnitude (subnormals included), a tenth of them edge values."""
    v = (rng.standard_normal(n) * 2.0 ** rng.integers(-26, 9, n)).astype(np.float16)
    pick = rng.random(n) < 0.1
    v[pick] = rng.choice(_F16_EDGES, int(pick.sum()))
    if inf:
        v[rng.integers(0, n, 2)] = [np.inf, -np.inf]
    return v


def _f32s(rng, n: int) -> np.ndarray:
    """fp32 values the vector kernels take (+-0 or |v| >= 2^-79, finite), edges included."""
    v = (rng.standard_normal(n) * 2.0 ** rng.integers(-78, 40, n)).astype(np.float32)
    v[np.abs(v) < 2.0 ** -79] = 0.0
    pick = rng.random(n) < 0.1
    v[pick] = rng.choice(_F32_EDGES, int(pick.sum()))
    return v


def _walk(d: dict, ky: int, kx: int):
    """The (dy pixel, x pixel) pairs of one tap in tt_tap_walk's order: images, output rows, output columns."""
    for b in range(d["batches"]):
        for oy in range(d["out_h"]):
            iy = oy * d["stride_h"] + ky * d["dil_h"] - d["pad_top"]
            if not 0 <= iy < d["in_h"]:
                continue
            for ox in range(d["out_w"]):
                ix = ox * d["stride_w"] + kx * d["dil_w"] - d["pad_left"]
                if 0 <= ix < d["in_w"]:
                    yield (b * d["out_h"] + oy) * d["out_w"] + ox, (b * d["in_h"] + iy) * d["in_w"] + ix


def _reference(d: dict, k: int, o0: int, o1: int, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dw[o, ky, kx, c] = +0, then + dy * x pixel by pixel, each product and sum rounded to float32."""
    dy = dy.astype(np.float32).reshape(-1, d["out_c"])[:, o0:o1]
    x = x.astype(np.float32).reshape(-1, d["in_c"])[:, :k]
    dw = np.zeros((o1 - o0, d["k_h"], d["k_w"], k), np.float32)
    with np.errstate(all="ignore"):
        for ky in range(d["k_h"]):
            for kx in range(d["k_w"]):
                acc = np.zeros((o1 - o0, k), np.float32)
                for p, q in _walk(d, ky, kx):
                    acc = acc + dy[p][:, None] * x[q][None, :]
                dw[:, ky, kx] = acc
    return dw


def _conv(b, ih, iw, ic, oc, kh, kw, s, pad, dil=1):
    oh = (ih + 2 * pad - dil * (kh - 1) - 1) // s + 1
    ow = (iw + 2 * pad - dil * (kw - 1) - 1) // s + 1
    return dict(batches=b, in_h=ih, in_w=iw, in_c=ic, out_h=oh, out_w=ow, out_c=oc, k_h=kh, k_w=kw, stride_h=s,
                stride_w=s, dil_h=dil, dil_w=dil, pad_top=pad, pad_left=pad, dm=1)


# (dims, k, o0, o1, dy fp16, x fp16, infinities among the fp16 values)
CONV = [(_conv(1, 4, 4, 14, 5, 1, 1, 1, 0), 14, 0, 5, True, True, False),
        (_conv(1, 8, 8, 32, 3, 1, 1, 1, 0), 32, 1, 2, True, True, False),
        (_conv(1, 4, 4, 56, 6, 1, 1, 1, 0), 7, 2, 5, True, True, False),
        (_conv(2, 5, 6, 21, 4, 3, 3, 1, 1), 19, 0, 4, True, True, False),
        (_conv(1, 7, 7, 9, 3, 3, 3, 2, 1), 9, 0, 3, True, True, False),
        (_conv(1, 8, 8, 17, 2, 3, 3, 2, 0), 13, 1, 2, True, True, False),
        (_conv(1, 6, 5, 6, 3, 5, 1, 1, 2), 5, 0, 3, True, True, False),
        (_conv(1, 7, 7, 10, 2, 3, 3, 1, 2, 2), 10, 0, 2, True, True, False),
        (_conv(1, 6, 6, 11, 3, 1, 1, 2, 0), 3, 0, 3, True, True, False),
        (_conv(1, 4, 4, 8, 2, 3, 3, 1, 1), 8, 0, 2, True, True, True),
        (_conv(1, 5, 5, 23, 4, 3, 3, 1, 1), 22, 1, 4, True, False, False),
        (_conv(1, 4, 4, 12, 7, 1, 1, 1, 0), 12, 0, 7, True, False, False),
        (_conv(1, 6, 6, 18, 5, 3, 3, 2, 1), 18, 0, 5, False, True, False),
        (_conv(2, 4, 4, 16, 6, 1, 1, 1, 0), 15, 2, 3, False, True, False),
        (_conv(1, 4, 4, 16, 6, 1, 1, 1, 0), 16, 0, 6, False, True, False)]
# (rows, depth, out_c, k, o0, o1, dy fp16, x fp16)
FC = [(1, 40, 6, 40, 0, 6, True, True), (3, 19, 5, 17, 1, 4, True, True), (2, 24, 3, 24, 0, 3, True, False),
      (1, 13, 4, 9, 2, 3, True, False), (2, 33, 4, 33, 0, 4, False, True)]


def _cases(seed: int = 13):
    """(header words, dy, x, expected dw, vector kernel expected to run, op) for every case."""
    rng = np.random.default_rng(seed)
    out = []

    def add(op, d, k, o0, o1, dy, x, good):
        dims = [d["batches"], d["in_h"], d["in_w"], d["in_c"], d["out_h"], d["out_w"], d["out_c"], d["k_h"],
                d["k_w"], d["stride_h"], d["stride_w"], d["dil_h"], d["dil_w"], d["pad_top"], d["pad_left"], d["dm"]]
        out.append((op, dims, k, o0, o1, dy.copy(), x.copy(), _reference(d, k, o0, o1, dy, x), good))

    def operands(d, hdy, hx, inf=False):
        ny, nx = d["batches"] * d["out_h"] * d["out_w"] * d["out_c"], d["batches"] * d["in_h"] * d["in_w"] * d["in_c"]
        return (_f16s(rng, ny, inf) if hdy else _f32s(rng, ny)), (_f16s(rng, nx, inf) if hx else _f32s(rng, nx))

    for d, k, o0, o1, hdy, hx, inf in CONV:
        add(0, d, k, o0, o1, *operands(d, hdy, hx, inf), True)
    for rows, depth, oc, k, o0, o1, hdy, hx in FC:
        ref = _conv(rows, 1, 1, depth, oc, 1, 1, 1, 0)   # numpy's reference: rows images of one pixel
        dy, x = operands(ref, hdy, hx)
        # the program reads rows, depth and out_c from the first three dims
        out.append((1, [rows, depth, oc] + [1] * 13, k, o0, o1, dy, x, _reference(ref, k, o0, o1, dy, x)[:, 0, 0],
                    True))
    # fp32 operands that fail the check (the vector kernel must decline them): one bad element anywhere; and the whole
    # operand a subnormal or a tiny normal, where every product is subnormal or flushed: there the vector loop run
    # without the check gives other bits
    # (channel slice k = 7 of 9, output channels [1, 3) of 4: the bad element is one the call reads, in the slice or
    # in a dy column the gathered check walks)
    for name, bad in _F32_BAD.items():
        for hdy in (True, False):
            d = _conv(1, 4, 4, 9, 4, 3, 3, 1, 1)
            dy, x = operands(d, hdy, not hdy)
            f32 = (x.reshape(-1, 9)[:, :7] if hdy else dy.reshape(-1, 4)[:, 1:3])   # views
            f32[rng.integers(0, f32.shape[0]), rng.integers(0, f32.shape[1])] = bad
            add(0, d, 7, 1, 3, dy, x, False)
            if name in ("subnormal", "tiny"):
                f32[:] = bad
                add(0, d, 7, 1, 3, dy, x, False)
                add(2, d, 7, 1, 3, dy, x, None)
    return out


def _blob(cases) -> bytes:
    words = [np.array([len(cases)], "<u4")]
    for op, dims, k, o0, o1, dy, x, _, _ in cases:
        parts = []
        for a in (dy, x):
            b = a.tobytes()
            parts.append(np.frombuffer(b + bytes(-len(b) % 4), "<u4"))
        words.append(np.array([op, dy.dtype == np.float16, x.dtype == np.float16, k, o0, o1, *dims, parts[0].size,
                               parts[1].size], "<u4"))
        words.extend(parts)
    return np.concatenate(words).tobytes()


def _run(tmp: Path, defines: dict[str, str], blob: bytes):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "gw.c").write_text(PROG)
    b = get_board(BOARD)
    tag = "-".join([BOARD, *defines])
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=KERNELS, defines=defines)
    ran = run_firmware(b, built.elf, tmp / f"run-{tag}", {"cases.bin": blob}, timeout_s=120, results_name=None,
                       losses_name=None)
    return ran.files["out.bin"], np.frombuffer(ran.files["flags.bin"], "<i4"), built.elf


def _split(out: bytes, cases) -> list[np.ndarray]:
    res, at = [], 0
    for c in cases:
        n = c[7].size
        res.append(np.frombuffer(out, "<u4", n, at).reshape(c[7].shape))
        at += 4 * n
    assert at == len(out)
    return res


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-equal, but any NaN equals any NaN (numpy on x86 makes the negative default NaN, the Arm FPU the
    positive one)."""
    both = np.isnan(got.view(np.float32)) & np.isnan(want)
    return bool(np.array_equal(got[~both], want.view(np.uint32)[~both]))


@needs_arm
def test_helium_weight_gradients_equal_the_portable_kernels_in_qemu(tmp_path):
    cases = _cases()
    blob = _blob(cases)
    assert len(blob) <= 4 * IN_WORDS and sum(c[7].size for c in cases) <= OUT_WORDS
    mve, flags, elf = _run(tmp_path, {"TT_USE_MVE": "1", "TT_FVEC_GW_TEST": "1"}, blob)
    port, _, elf_port = _run(tmp_path, {"TT_FVEC_GW_TEST": "1"}, blob)
    got_mve, got_port = _split(mve, cases), _split(port, cases)
    checked = 0
    for i, c in enumerate(cases):
        op, good, ref = c[0], c[8], c[7]
        if op == 2:
            # the vector loop without the check on operands that fail it: other bits than the portable kernel's
            assert not np.array_equal(got_mve[i], got_port[i]), f"case {i}: the unchecked vector loop was exact"
            continue
        assert np.array_equal(got_mve[i], got_port[i]), f"case {i}: Helium differs from the portable kernel"
        assert _same_bits(got_port[i], ref), f"case {i}: the portable kernel differs from numpy"
        assert flags[i] == int(good), f"case {i}: vector kernel ran {flags[i]}, expected {int(good)}"
        checked += 1
    assert checked == len(CONV) + len(FC) + 2 * len(_F32_BAD) + 4
    dis = {e: subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(e)], capture_output=True,
                             text=True, check=True).stdout for e in (elf, elf_port)}
    assert "vmul.f32\tq" in dis[elf] and "vmul.f32\tq" not in dis[elf_port]
    assert "vfma" not in dis[elf]   # one rounding per product and per sum, as the portable C
