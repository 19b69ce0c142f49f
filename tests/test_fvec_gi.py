"""Helium conv2d input gradient of fp16-mixed (kernels_c/tt_fvec_gi.c, `target.kernels: mve` on the Cortex-M55):
tt_conv2d_grad_input_f32_split_hdx (dy fp32), tt_conv2d_grad_input_hdy_split_hdx and _rep (the positions stream's
per-pixel call), tt_conv2d_grad_input_hdy_f32_split, built with and without Helium and run in QEMU on random shapes
(1x1 / 3x3 / 2x3, stride 1 and 2, padding, dilation, channel counts that are not multiples of 4, more than 64 output
channels, trained slices n < in_c): the output bytes must be the portable kernels', and numpy's float32 arithmetic in
the portable order (then float16 rounding) gives them too.

Operands: fp16 dy of any bits but NaN (subnormals, +-0, +-Inf, 65504), weights with +-0, large values and values at
the 2^-79 bound; cases whose weights (or fp32 dy) fail the kernel's check must still give the portable bytes (the
fallback ran: the program records the check's answer), and the unchecked Helium walk on them gives other bytes (the
check is needed). A NaN dy is left out: its payload is the one thing the Helium lanes do not keep (tt_fvec_mve.h)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")
KERNELS = ["ops/tt_conv2d.c", "tt_fvec_gi.c", "tt_common.c", "tt_f16.c"]

# kinds: what the program calls
F32DY_HDX, HDY_HDX, HDY_F32DX, REP, RAW_HDY_F32DX, RAW_F32DY_F32DX = range(6)

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_kernels.h"
#include "tt_platform.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_gi.h"
#define HELIUM 1
#else
#define HELIUM 0
#endif

static uint32_t buf32[40 * 1024], out32[8 * 1024];
#if HELIUM
static uint32_t scratch32[4 * 1024];   /* the checked walk's output when only its answer is wanted */
#endif
#define buf ((uint8_t *)buf32)

static int32_t rd32(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); }

int tt_main(void) {
    long size = tt_read_file("cases.bin", buf, sizeof buf32);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf), k = 0;   /* k: output words so far */
    const uint8_t *p = buf + 4;
    int32_t flags[256];
    for (int32_t c = 0; c < cases; ++c) {
        /* kind, n, the 16 dims, dy bytes, w words, w_slice words; then dy, w, w_slice (each word-aligned) */
        const int32_t kind = rd32(p), n = rd32(p + 4);
        tt_conv_dims d;
        memcpy(&d, p + 8, sizeof d);
        const int32_t dyb = rd32(p + 72), wn = rd32(p + 76), wsn = rd32(p + 80);
        const uint8_t *dyp = p + 84;
        const float *w = (const float *)(const void *)(dyp + ((dyb + 3) & ~3));
        const float *ws = wsn > 0 ? w + wn : w;
        const int32_t px = d.batches * d.in_h * d.in_w, dxn = px * d.in_c;
        const float *dyf = (const float *)(const void *)dyp;
        const uint16_t *dyh = (const uint16_t *)(const void *)dyp;
        float *dxf = (float *)(void *)(out32 + k);
        uint16_t *dxh = (uint16_t *)(void *)(out32 + k);
        int32_t flag = -2;
        if (kind == 0) {
#if HELIUM
            flag = tt_fvec_gi(&d, dyf, 0, w, ws, n, 0, (uint16_t *)(void *)scratch32);
#endif
            tt_conv2d_grad_input_f32_split_hdx(&d, dyf, w, ws, n, dxh);
        } else if (kind == 1) {
#if HELIUM
            flag = tt_fvec_gi(&d, 0, dyh, w, ws, n, 0, (uint16_t *)(void *)scratch32);
#endif
            if (c % 2 == 0) tt_conv2d_grad_input_hdy_split_hdx(&d, dyh, w, ws, n, dxh);
            else {   /* a const weight's call: checked at the first call, the answer kept for the second */
                int32_t ok = -1;
                tt_conv2d_grad_input_hdy_split_hdx_rep(&d, dyh, w, ws, n, &ok, dxh);
                memset(dxh, 0xA5, 2u * (uint32_t)dxn);
                tt_conv2d_grad_input_hdy_split_hdx_rep(&d, dyh, w, ws, n, &ok, dxh);
            }
        } else if (kind == 2) {
#if HELIUM
            flag = tt_fvec_gi(&d, 0, dyh, w, ws, n, (float *)(void *)scratch32, 0);
#endif
            if (c % 2 == 0) tt_conv2d_grad_input_hdy_f32_split(&d, dyh, w, ws, n, dxf);
            else {
                int32_t ok = -1;
                tt_conv2d_grad_input_hdy_f32_split_rep(&d, dyh, w, ws, n, &ok, dxf);
                memset(dxf, 0xA5, 4u * (uint32_t)dxn);
                tt_conv2d_grad_input_hdy_f32_split_rep(&d, dyh, w, ws, n, &ok, dxf);
            }
        } else if (kind == 3) {   /* the positions stream: one input pixel (and its one output pixel) per call */
            tt_conv_dims one = d;
            int32_t q, ok = -1;
            one.batches = one.in_h = one.in_w = one.out_h = one.out_w = 1;
            for (q = 0; q < px; ++q) {
                tt_conv2d_grad_input_hdy_split_hdx_rep(&one, dyh + q * d.out_c, w, ws, n, &ok, dxh + q * d.in_c);
            }
            flag = ok;
        } else if (kind == 4) {   /* unchecked Helium walk (portable: the kernel) */
#if HELIUM
            tt_fvec_gi_run(&d, 0, dyh, w, ws, n, dxf, 0);
#else
            tt_conv2d_grad_input_hdy_f32_split(&d, dyh, w, ws, n, dxf);
#endif
        } else {
#if HELIUM
            tt_fvec_gi_run(&d, dyf, 0, w, ws, n, dxf, 0);
#else
            tt_conv2d_grad_input_f32_split(&d, dyf, w, ws, n, dxf);
#endif
        }
        flags[c] = flag;
        k += (kind == 0 || kind == 1 || kind == 3) ? (dxn + 1) / 2 : dxn;
        p = (const uint8_t *)(w + wn + wsn);
    }
    if (tt_write_file("flags.bin", flags, (size_t)cases * 4u) != 0) return 1;
    return tt_write_file("out.bin", out32, (size_t)k * 4u) == 0 ? 0 : 1;
}
"""

# fp16 bit patterns every fp16 dy draws from besides random ones: +-0, subnormals, the smallest normal, 1, 65504, Inf
_F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                       0x7C00, 0xFC00], np.uint16)
_BOUND = np.float32(2.0 ** -79)   # the smallest weight magnitude the fp16-dy walk allows


def _f16_dy(rng, size: int) -> np.ndarray:
    bits = rng.integers(0, 0x10000, size).astype(np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits)    # no NaN / Inf from the random bits
    small = (rng.standard_normal(size) * 2).astype(np.float16).view(np.uint16)
    pick = rng.random(size)
    out = np.where(pick < 0.45, small, bits)
    out = np.where(pick > 0.97, rng.choice(_F16_EDGES, size), out)
    return out.astype(np.uint16)


def _weights(rng, size: int, tiny: float | None = None) -> np.ndarray:
    w = (rng.standard_normal(size) * 0.3).astype(np.float32)
    pick = rng.random(size)
    w = np.where(pick < 0.05, np.float32(0.0), w)
    w = np.where((pick >= 0.05) & (pick < 0.08), np.float32(-0.0), w)
    w = np.where((pick >= 0.08) & (pick < 0.1), _BOUND * np.sign(w), w)
    w = np.where((pick >= 0.1) & (pick < 0.11), np.float32(3e33) * np.sign(w), w)
    w = np.where((pick >= 0.11) & (pick < 0.13), w * np.float32(2.0 ** -60), w)
    if tiny is not None:
        w[rng.integers(0, size)] = np.float32(tiny)
    return w.astype(np.float32)


def _dims(rng, kind: int):
    """(16 dims, n) of a random conv: 1x1 / 3x3 / 2x3 filters, stride 1 / 2, padding, dilation, batches."""
    shape = rng.integers(0, 4) if kind != REP else 0
    kh, kw = [(1, 1), (3, 3), (2, 3), (3, 3)][shape]
    sh = sw = int(rng.integers(1, 3)) if shape else 1
    dil = 2 if shape == 3 else 1
    ih, iw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    pt, pl = (int(rng.integers(0, kh)), int(rng.integers(0, kw))) if shape else (0, 0)
    eh, ew = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    oh, ow = max(1, (ih + 2 * pt - eh) // sh + 1), max(1, (iw + 2 * pl - ew) // sw + 1)
    ic = int(rng.choice([1, 3, 4, 7, 16, 19] + ([33, 40] if not shape else [])))
    oc = int(rng.choice([1, 2, 5, 9, 17] + ([64, 70] if not shape else [])))
    b = int(rng.integers(1, 3))
    n = int(rng.choice([0, ic, int(rng.integers(0, ic + 1))]))
    return [b, ih, iw, ic, oh, ow, oc, kh, kw, sh, sw, dil, dil, pt, pl, 1], n


def _reference(dims, n, dy, w, ws, f16_out: bool) -> bytes:
    """numpy float32 in the portable order: acc = 0; per in-image tap s = 0, s += dy[o] * w[o, tap, :] for o in
    order, acc += s; then float16 (round to nearest even) or the float32 bits."""
    b, ih, iw, ic, oh, ow, oc, kh, kw, sh, sw, dh, dw, pt, pl, _ = dims
    dy = dy.reshape(b, oh, ow, oc).astype(np.float32)
    whole = w.reshape(oc, kh * kw, ic)
    part = ws.reshape(oc, kh * kw, n) if n > 0 else None
    rows = np.concatenate([part, whole[:, :, n:]], axis=2) if n > 0 else whole
    dx = np.zeros((b, ih, iw, ic), np.float32)
    with np.errstate(all="ignore"):
        for bb in range(b):
            for y in range(ih):
                for x in range(iw):
                    acc = np.zeros(ic, np.float32)
                    for ky in range(kh):
                        ty = y + pt - ky * dh
                        if ty < 0 or ty % sh or ty // sh >= oh:
                            continue
                        for kx in range(kw):
                            tx = x + pl - kx * dw
                            if tx < 0 or tx % sw or tx // sw >= ow:
                                continue
                            s = np.zeros(ic, np.float32)
                            g = dy[bb, ty // sh, tx // sw]
                            for o in range(oc):
                                s = s + g[o] * rows[o, ky * kw + kx]
                            acc = acc + s
                    dx[bb, y, x] = acc
        # no operand is a NaN, so a NaN result is one the arithmetic made: Arm's default NaN (x86's has the sign set)
        if f16_out:
            return np.where(np.isnan(dx), np.uint16(0x7E00), dx.astype(np.float16).view(np.uint16)).tobytes()
        return np.where(np.isnan(dx), np.uint32(0x7FC00000), dx.view(np.uint32)).tobytes()


def _pinned(rng, n: int, e: int) -> np.ndarray:
    """n fp32 values whose nonzero ones all have biased exponent e (any mantissa, either sign), about a tenth zeros
    (never the first: the smallest exponent is e even in a one-element tensor)."""
    v = ((1.0 + rng.random(n)) * 2.0 ** (e - 127) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    v = np.where(rng.random(n) < 0.1, np.float32(0.0), v).astype(np.float32)
    if n:
        v[0] = np.float32(1.5 * 2.0 ** (e - 127))
    return v


def _case(rng, kind: int, tiny: float | None = None, dy_scale: float | None = None,
          exps: tuple[int, int] | None = None):
    """exps: (dy's, w's) biased exponents, every nonzero value pinned to them (fp32 dy only)."""
    dims, n = _dims(rng, kind)
    b, ih, iw, ic, oh, ow, oc, kh, kw = dims[:9]
    if kind == REP:   # the positions stream: a 1x1 stride-1 conv, dy the input pixel's own row
        dims = [b, ih, iw, ic, ih, iw, oc, 1, 1, 1, 1, 1, 1, 0, 0, 1]
        oh, ow = ih, iw
    ndy = b * oh * ow * oc
    w = _weights(rng, oc * dims[7] * dims[8] * ic, tiny)
    ws = _weights(rng, oc * dims[7] * dims[8] * n, tiny if n else None) if n else np.zeros(0, np.float32)
    if exps is not None:
        w = _pinned(rng, w.size, exps[1])
        ws = _pinned(rng, ws.size, exps[1])
    if kind in (F32DY_HDX, RAW_F32DY_F32DX):
        scale = np.float32(dy_scale if dy_scale is not None else 1.0)
        dy = (rng.standard_normal(ndy) * scale).astype(np.float32)
        dy = np.where(rng.random(ndy) < 0.1, np.float32(0.0), dy).astype(np.float32)
        if exps is not None:
            dy = _pinned(rng, ndy, exps[0])
        dyb, dyv = dy.tobytes(), dy
    else:
        dyh = _f16_dy(rng, ndy)
        dyb, dyv = dyh.astype("<u2").tobytes(), dyh.view(np.float16).astype(np.float32)
    head = np.array([kind, n, *dims, len(dyb), len(w), len(ws)], "<i4").tobytes()
    pad = b"\0" * (-len(dyb) % 4)
    blob = head + dyb + pad + (w.tobytes() + ws.tobytes() if n else w.tobytes())
    f16_out = kind in (F32DY_HDX, HDY_HDX, REP)
    want = _reference(dims, n, dyv, w, ws if n else w, f16_out)
    want += b"\0" * (-len(want) % 4)
    return blob, want


@pytest.fixture(scope="module")
def firmware(tmp_path_factory):
    """The test program built for the M55 without and with Helium (once for the module): {"portable"|"mve": elf}."""
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board

    tmp = tmp_path_factory.mktemp("fvec_gi")
    prog = tmp / "prog"
    prog.mkdir()
    (prog / "gi.c").write_text(PROG)
    b = get_board(BOARD)
    return {name: build_firmware(b, prog, tmp / f"build-{name}", kernels=KERNELS, defines=defines).elf
            for name, defines in (("portable", {}), ("mve", {"TT_USE_MVE": "1"}))}


def _run(firmware, name: str, tmp: Path, blob: bytes, cases: int):
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    ran = run_firmware(get_board(BOARD), firmware[name], tmp / f"run-{name}",
                       {"cases.bin": np.int32(cases).tobytes() + blob}, timeout_s=120)
    return ran.files["out.bin"], np.frombuffer(ran.files["flags.bin"], "<i4")


def _suite():
    """(blob, per-case expected bytes or None, expected Helium flag) for every case."""
    rng = np.random.default_rng(13)
    out = []
    for kind in (F32DY_HDX, HDY_HDX, HDY_F32DX, REP):
        for _ in range(7):
            out.append((*_case(rng, kind), 1))
        # a weight below 2^-79 (not zero) or subnormal: the fp16-dy check fails; for an fp32 dy the exponent sum does
        for tiny in (1e-30, 1e-40):
            out.append((*_case(rng, kind, tiny=tiny), 0))
    out.append((*_case(rng, F32DY_HDX, dy_scale=2.0 ** -90), 0))   # dy tiny: 2^-90 * |w| can be subnormal
    # the fp32-dy bound at its edge (tt_fvec_gi.c: the smallest exponents of dy and w must sum to 151, products >=
    # 2^-103): 150 declines, 151 runs, whichever side holds the small exponent
    for e_dy, e_w, flag in ((24, 126, 0), (25, 126, 1), (126, 24, 0), (126, 25, 1)):
        out.append((*_case(rng, F32DY_HDX, exps=(e_dy, e_w)), flag))
    return out


@needs_arm
def test_helium_input_gradient_equals_portable_and_numpy_in_qemu(firmware, tmp_path):
    suite = _suite()
    blob = b"".join(c[0] for c in suite)
    want = b"".join(c[1] for c in suite)
    port, _ = _run(firmware, "portable", tmp_path, blob, len(suite))
    mve, flags = _run(firmware, "mve", tmp_path, blob, len(suite))
    assert port == want   # the portable kernels against numpy's float32 arithmetic in their order
    assert mve == port    # Helium (or its fallback) against the portable kernels, byte for byte
    # the Helium walk ran exactly where the operands allow it, and the fallback everywhere else
    assert [int(f) for f in flags] == [c[2] for c in suite]


@needs_arm
def test_the_unchecked_helium_walk_differs_where_the_check_refuses(firmware, tmp_path):
    """Operands that fail the check (a weight 1e-37 with an fp16 dy; fp32 dy and weights near 2^-70, each passing
    tt_fvec_ok) make subnormal products: MVE flushes them, so without the check the bits would differ."""
    rng = np.random.default_rng(5)
    blobs = []
    for kind in (RAW_HDY_F32DX, RAW_F32DY_F32DX):
        dims = [1, 2, 2, 5, 2, 2, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1]
        w = np.full(3 * 5, np.float32(1e-37) if kind == RAW_HDY_F32DX else np.float32(2.0 ** -70), np.float32)
        if kind == RAW_HDY_F32DX:   # fp16 normals in [2^-14, 2^-4): every product below 2^-126
            dyb = rng.integers(0x0400, 0x2C00, 12).astype("<u2").tobytes()
        else:   # [2^-70, 2^-69) * 2^-70: subnormal products and sums
            dyb = (rng.random(12).astype(np.float32) * np.float32(2.0 ** -70) + np.float32(2.0 ** -70)).tobytes()
        head = np.array([kind, 0, *dims, len(dyb), len(w), 0], "<i4").tobytes()
        blobs.append(head + dyb + b"\0" * (-len(dyb) % 4) + w.tobytes())
    blob = b"".join(blobs)
    port, _ = _run(firmware, "portable", tmp_path, blob, 2)
    mve, _ = _run(firmware, "mve", tmp_path, blob, 2)
    port_f, mve_f = np.frombuffer(port, np.float32).reshape(2, -1), np.frombuffer(mve, np.float32).reshape(2, -1)
    for k in range(2):
        assert np.all(port_f[k] != 0)   # the scalar FPU keeps the subnormal products
        assert np.all(mve_f[k] == 0)    # Helium flushed them
