"""Helium fp32-vector depthwise kernels of fp16-mixed (kernels_c/tt_fvec_dw.c, `target.kernels: mve`): the forward
tt_depthwise_conv2d_hx_hy (out of place and in place) and the input gradient tt_depthwise_conv2d_grad_input_hdy_hdx
(out of place and in place), built for the Cortex-M55 with and without Helium and run in QEMU on random shapes
(1x1 .. 5x5 filters, stride 1 / 2 / 3, dilation, padding, channel counts that are not multiples of 4, batches, depth
multiplier 2 on the portable route) with fp16 operands that include subnormals, +-0, +-Inf and values near 65504, and
weights down to the 2^-79 bound of tt_fvec_ok:
 - the Helium bytes equal the portable kernels' bytes, and numpy's float32 sums in the kernels' tap order give the
   same (a NaN as a NaN);
 - weights that fail tt_fvec_ok (a subnormal, or 1e-36 whose products are subnormal) still give the portable bytes
   (the fallback ran), while the vector kernel called without its check on such an input gives other bytes (Helium
   flushes the subnormal product to -0, and +0 + -0 = +0 where the portable sum keeps a negative subnormal, whose
   fp16 is -0) - the guard is needed;
 - a NaN input with a payload comes out as the default NaN from Helium and with its payload from the portable code:
   the vector path is what ran for each kernel form;
 - the in-place forms write nothing past their one channel of scratch."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")
KERNELS = ["ops/tt_depthwise_conv2d.c", "tt_fvec_dw.c", "tt_common.c"]
FWD, FWD_INPLACE, GI, GI_INPLACE, RAW = range(5)

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_kernels.h"
#include "tt_platform.h"
#if defined(TT_USE_MVE) && TT_USE_MVE && defined(__ARM_FEATURE_MVE)
#include "tt_fvec_dw.h"
#define RAW_VECTOR 1
#else
#define RAW_VECTOR 0
#endif

static uint32_t buf32[56 * 1024], out32[32 * 1024];   /* sizes: _cases asserts that its cases fit */
static uint32_t xs32[12 * 1024], ws32[1024], bs32[256], scr32[1024];
static int32_t flags32[256];   /* tt_fvec_dw_ok's answer per case (Helium build; -1 elsewhere) */
#define CANARY 0xA5A5u
#define NCANARY 16

static int32_t rd32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

int tt_main(void) {
    uint8_t *buf = (uint8_t *)buf32, *out = (uint8_t *)out32;
    long size = tt_read_file("cases.bin", buf, sizeof buf32);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf), k = 0;
    const uint8_t *p = buf + 4;
    for (int32_t c = 0; c < cases; ++c) {
        int32_t h[18];
        float lo, hi;
        memcpy(h, p, sizeof h);
        memcpy(&lo, p + 72, 4);
        memcpy(&hi, p + 76, 4);
        p += 80;
        const int32_t kind = h[0], has_bias = h[17];
        tt_conv_dims d = {h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13], h[14],
                          h[15], h[16]};
        const int32_t n_in = d.batches * d.in_h * d.in_w * d.in_c, n_out = d.batches * d.out_h * d.out_w * d.out_c;
        const int32_t gi = kind == 2 || kind == 3, n_src = gi ? n_out : n_in, n_dst = gi ? n_in : n_out;
        const int32_t nw = d.k_h * d.k_w * d.out_c;
        uint16_t *xs = (uint16_t *)(void *)xs32, *dst = (uint16_t *)(void *)(out + k), *scr = (uint16_t *)(void *)scr32;
        float *ws = (float *)(void *)ws32, *bs = has_bias ? (float *)(void *)bs32 : 0;
        memcpy(xs, p, 2u * (uint32_t)n_src);
        p += 2 * n_src;
        memcpy(ws, p, 4u * (uint32_t)nw);
        p += 4 * nw;
        if (has_bias) {
            memcpy(bs, p, 4u * (uint32_t)d.out_c);
            p += 4 * d.out_c;
        }
#if RAW_VECTOR   /* the check the kernels make: the forward's with its bias and bounds, the input gradient's without */
        flags32[c] = kind >= 4 ? -1 : gi ? tt_fvec_dw_ok(&d, ws, 0, 0.0f, 0.0f) : tt_fvec_dw_ok(&d, ws, bs, lo, hi);
#else
        flags32[c] = -1;
#endif
        const int32_t n_scr = gi ? d.in_h * d.in_w : d.out_h * d.out_w;   /* one channel */
        for (int32_t i = 0; i < NCANARY; ++i) scr[n_scr + i] = CANARY;
        if (kind == 0 && c % 2 == 0) tt_depthwise_conv2d_hx_hy(&d, lo, hi, xs, ws, bs, dst);
        else if (kind == 0) {   /* a row stream's form: checked at the first call, the answer kept for the second */
            int32_t ok = -1;
            tt_depthwise_conv2d_hx_hy_rep(&d, lo, hi, xs, ws, bs, &ok, dst);
            memset(dst, 0xA5, 2u * (uint32_t)n_dst);
            tt_depthwise_conv2d_hx_hy_rep(&d, lo, hi, xs, ws, bs, &ok, dst);
        }
        else if (kind == 1) tt_depthwise_conv2d_hx_hy_inplace(&d, lo, hi, xs, ws, bs, scr);
        else if (kind == 2) tt_depthwise_conv2d_grad_input_hdy_hdx(&d, xs, ws, dst);
        else if (kind == 3) tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(&d, xs, ws, scr);
        else {
            /* the vector kernel without its operand check (Helium build), the portable kernel otherwise: a 1x1
               depthwise conv of one channel of n pixels, no bias, clamp to (lo, hi) */
#if RAW_VECTOR
            tt_fvec_dw_hx_hy_channel(&d, xs, ws, 0, lo, hi, dst, 1);
#else
            tt_depthwise_conv2d_hx_hy(&d, lo, hi, xs, ws, 0, dst);
#endif
        }
        if (kind == 1 || kind == 3) memcpy(dst, xs, 2u * (uint32_t)n_dst);   /* the result over the operand */
        for (int32_t i = 0; i < NCANARY; ++i) if (scr[n_scr + i] != CANARY) tt_fail("scratch overrun");
        k += (2 * n_dst + 3) & ~3;
    }
    if (tt_write_file("flags.bin", flags32, (size_t)cases * 4u) != 0) return 1;
    return tt_write_file("out.bin", out, (size_t)k) == 0 ? 0 : 1;
}
"""

_F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                       0x7C00, 0xFC00, 0x0200, 0x7BFE, 0x3555], np.uint16)
_BOUNDS = [(0.0, 6.0), (-np.inf, np.inf), (0.0, np.inf), (-1.0, 1.0), (-3.4028235e38, 3.4028235e38), (-0.0, 0.5)]


def _geometry(rng, kind: int, plain: bool = False) -> dict:
    """Random depthwise geometry; plain: a 3x3 filter, stride 1 or 2, multiplier 1, padding 1 (the vector path's
    common case, for the NaN probes)."""
    k_h, k_w = [(3, 3), (3, 3), (3, 3), (1, 1), (2, 3), (5, 5), (4, 4)][int(rng.integers(0, 7))]
    s = int(rng.choice([1, 1, 2, 2, 3]))
    dil = int(rng.choice([1, 1, 1, 2]))
    mult = 2 if kind in (FWD, GI) and rng.random() < 0.15 else 1
    in_h, in_w = int(rng.integers(1, 11)), int(rng.integers(1, 19))
    c = int(rng.choice([1, 3, 4, 5, 7, 8, 13]))
    if plain:
        k_h, k_w, s, dil, mult, in_h, in_w = 3, 3, int(rng.integers(1, 3)), 1, 1, 8, 16
    ek_h, ek_w = (k_h - 1) * dil + 1, (k_w - 1) * dil + 1
    pt, pl = int(rng.integers(0, ek_h)), int(rng.integers(0, ek_w))
    pb, pr = int(rng.integers(0, ek_h)), int(rng.integers(0, ek_w))
    if plain:
        pt = pl = pb = pr = 1
    out_h, out_w = (in_h + pt + pb - ek_h) // s + 1, (in_w + pl + pr - ek_w) // s + 1
    if out_h < 1 or out_w < 1:
        return _geometry(rng, kind, plain)
    batches = 2 if rng.random() < 0.25 else 1
    if kind == FWD_INPLACE and out_h * out_w > in_h * in_w:
        batches = 1   # y over x batch by batch: a larger y would overwrite the next batch's x before it is read
    return dict(batches=batches, in_h=in_h, in_w=in_w, in_c=c, out_h=out_h, out_w=out_w, out_c=c * mult, k_h=k_h,
                k_w=k_w, stride_h=s, stride_w=s, dilation_h=dil, dilation_w=dil, pad_top=pt, pad_left=pl, mult=mult)


def _f16(rng, n: int, inf: bool = True) -> np.ndarray:
    pick = rng.random(n)
    edges = _F16_EDGES if inf else _F16_EDGES[(_F16_EDGES & 0x7C00) != 0x7C00]
    normal = (rng.standard_normal(n) * 2).astype(np.float16).view(np.uint16)
    tiny = (rng.standard_normal(n) * 1e-6).astype(np.float16).view(np.uint16)   # fp16 subnormals
    return np.where(pick < 0.15, rng.choice(edges, n), np.where(pick < 0.3, tiny, normal)).astype(np.uint16)


def _weights(rng, n: int, fail: bool) -> np.ndarray:
    w = (rng.standard_normal(n) * 0.5).astype(np.float32)
    pick = rng.random(n)
    bound = np.float32(2.0 ** -79)
    near = np.array([bound, -bound, np.nextafter(bound, np.float32(1)), 0.0, -0.0, 3e4, -7e3], np.float32)
    w = np.where(pick < 0.2, rng.choice(near, n), w).astype(np.float32)
    if fail:   # one weight tt_fvec_ok refuses: an fp32 subnormal, or a normal so small that its products are subnormal
        w[int(rng.integers(0, n))] = rng.choice(np.array([1e-40, -1e-36, 1e-30], np.float32))
    return w


def _forward_ref(g: dict, x: np.ndarray, w: np.ndarray, bias, lo: float, hi: float) -> np.ndarray:
    """float32 sums in (filter y, filter x) order from +0 over the in-image taps, bias, clamp, fp16."""
    B, H, W, C, OH, OW, OC, M = (g[k] for k in ("batches", "in_h", "in_w", "in_c", "out_h", "out_w", "out_c", "mult"))
    xf = x.view(np.float16).astype(np.float32).reshape(B, H, W, C)
    oy, ox = np.arange(OH)[:, None], np.arange(OW)[None, :]
    s = np.zeros((B, OH, OW, OC), np.float32)
    ic = np.arange(OC) // M
    with np.errstate(invalid="ignore", over="ignore"):
        for ky in range(g["k_h"]):
            for kx in range(g["k_w"]):
                iy = oy * g["stride_h"] - g["pad_top"] + ky * g["dilation_h"]
                ix = ox * g["stride_w"] - g["pad_left"] + kx * g["dilation_w"]
                ok = ((iy >= 0) & (iy < H) & (ix >= 0) & (ix < W))[None, :, :, None]
                v = xf[:, np.clip(iy, 0, H - 1), np.clip(ix, 0, W - 1)][..., ic]
                s = np.where(ok, s + v * w.reshape(g["k_h"], g["k_w"], OC)[ky, kx], s).astype(np.float32)
        if bias is not None:
            s = (s + bias).astype(np.float32)
        s = np.where(s < np.float32(lo), np.float32(lo), s)
        s = np.where(s > np.float32(hi), np.float32(hi), s).astype(np.float32)
        return s.astype(np.float16).view(np.uint16).ravel()


def _grad_input_ref(g: dict, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dx: per multiplier s = +0, += dy * w over the taps that reach an output in (filter y, filter x) order; total =
    0 + s, then + s of each later multiplier; fp16."""
    B, H, W, C, OH, OW, OC, M = (g[k] for k in ("batches", "in_h", "in_w", "in_c", "out_h", "out_w", "out_c", "mult"))
    df = dy.view(np.float16).astype(np.float32).reshape(B, OH, OW, OC)
    wk = w.reshape(g["k_h"], g["k_w"], OC)
    iy, ix = np.arange(H)[:, None], np.arange(W)[None, :]
    total = np.zeros((B, H, W, C), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for m in range(M):
            oc = np.arange(C) * M + m
            s = np.zeros((B, H, W, C), np.float32)
            for ky in range(g["k_h"]):
                ty = iy + g["pad_top"] - ky * g["dilation_h"]
                for kx in range(g["k_w"]):
                    tx = ix + g["pad_left"] - kx * g["dilation_w"]
                    ok = ((ty >= 0) & (ty % g["stride_h"] == 0) & (ty // g["stride_h"] < OH) & (tx >= 0)
                          & (tx % g["stride_w"] == 0) & (tx // g["stride_w"] < OW))
                    v = df[:, np.clip(ty // g["stride_h"], 0, OH - 1), np.clip(tx // g["stride_w"], 0, OW - 1)][..., oc]
                    s = np.where(ok[None, :, :, None], s + v * wk[ky, kx, oc], s).astype(np.float32)
            total = (total + s).astype(np.float32)   # m = 0: 0 + s
        return total.astype(np.float16).view(np.uint16).ravel()


def _case(rng, kind: int, fail: bool = False, nan: bool = False):
    """(header + operands, expected fp16 output bits or None)."""
    if kind == RAW:
        n = int(rng.integers(5, 40))
        g = dict(batches=1, in_h=1, in_w=n, in_c=1, out_h=1, out_w=n, out_c=1, k_h=1, k_w=1, stride_h=1, stride_w=1,
                 dilation_h=1, dilation_w=1, pad_top=0, pad_left=0, mult=1)
        x = (rng.random(n) * 4e-3 + 1e-3).astype(np.float16).view(np.uint16)
        w = np.array([-1e-36], np.float32)   # x * w is a negative fp32 subnormal
        bias, (lo, hi) = None, (-np.inf, np.inf)
    else:
        g = _geometry(rng, kind, plain=nan)
        gi = kind in (GI, GI_INPLACE)
        n_src = g["batches"] * (g["out_h"] * g["out_w"] * g["out_c"] if gi else g["in_h"] * g["in_w"] * g["in_c"])
        x = _f16(rng, n_src, inf=rng.random() < 0.3)
        if nan:
            x[rng.integers(0, n_src, max(1, n_src // 8))] = 0x7D01   # a signalling NaN with a payload
        w = _weights(rng, g["k_h"] * g["k_w"] * g["out_c"], fail)
        bias = None
        if not gi and rng.random() < 0.7:
            bias = (rng.standard_normal(g["out_c"])).astype(np.float32)
            bias[rng.random(g["out_c"]) < 0.2] = -0.0
        lo, hi = _BOUNDS[int(rng.integers(0, len(_BOUNDS)))] if not gi else (0.0, 0.0)
    gi = kind in (GI, GI_INPLACE)
    want = None if nan else (_grad_input_ref(g, x, w) if gi else _forward_ref(g, x, w, bias, lo, hi))
    hdr = [kind] + [g[k] for k in ("batches", "in_h", "in_w", "in_c", "out_h", "out_w", "out_c", "k_h", "k_w",
                                   "stride_h", "stride_w", "dilation_h", "dilation_w", "pad_top", "pad_left", "mult")]
    blob = (np.array(hdr + [int(bias is not None)], "<i4").tobytes() + np.array([lo, hi], "<f4").tobytes()
            + x.astype("<u2").tobytes() + w.astype("<f4").tobytes() + (b"" if bias is None else bias.tobytes()))
    n_dst = g["batches"] * (g["in_h"] * g["in_w"] * g["in_c"] if gi else g["out_h"] * g["out_w"] * g["out_c"])
    assert max(len(x), n_dst) <= 2 * 12 * 1024 and max(g["in_h"] * g["in_w"], g["out_h"] * g["out_w"]) + 16 <= 2048
    # where the vector path may run: multiplier 1, at most TT_FVEC_DW_TAPS (9) taps, every weight checked fine (the
    # bounds and biases drawn here always are)
    ok = int(kind != RAW and not fail and g["mult"] == 1 and g["k_h"] * g["k_w"] <= 9)
    return blob, want, ok, n_dst


def _cases(seed: int = 13):
    rng = np.random.default_rng(seed)
    spec = ([(k, False, False) for k in (FWD, FWD_INPLACE, GI, GI_INPLACE) for _ in range(30)]
            + [(k, True, False) for k in (FWD, FWD_INPLACE, GI, GI_INPLACE) for _ in range(4)]
            + [(k, False, True) for k in (FWD, FWD_INPLACE, GI, GI_INPLACE)] + [(RAW, False, False)])
    cases = []
    for kind, fail, nan in spec:
        blob, want, ok, n = _case(rng, kind, fail, nan)
        cases.append((kind, fail, nan, blob, want, ok, n))
    blob = np.int32(len(cases)).tobytes() + b"".join(c[3] for c in cases)
    assert len(blob) <= 56 * 4096 and sum((2 * c[6] + 3) & ~3 for c in cases) <= 32 * 4096   # PROG's buffers
    return cases, blob


def _split(out: bytes, cases) -> list[np.ndarray]:
    parts, k = [], 0
    for *_, n in cases:
        parts.append(np.frombuffer(out[k: k + 2 * n], "<u2"))
        k += (2 * n + 3) & ~3
    assert k == len(out)
    return parts


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, every NaN counted as one value."""
    na, nb = (a & 0x7FFF) > 0x7C00, (b & 0x7FFF) > 0x7C00
    return bool(np.array_equal(na, nb) and np.array_equal(a[~na], b[~nb]))


def _run(tmp: Path, defines: dict[str, str], blob: bytes) -> tuple[bytes, np.ndarray]:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "dw.c").write_text(PROG)
    b = get_board(BOARD)
    tag = "-".join([BOARD, *defines]) or BOARD
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=KERNELS, defines=defines)
    ran = run_firmware(b, built.elf, tmp / f"run-{tag}", {"cases.bin": blob}, timeout_s=120)
    return ran.files["out.bin"], np.frombuffer(ran.files["flags.bin"], "<i4")


@needs_arm
def test_helium_depthwise_fp16_equals_the_portable_kernels_in_qemu(tmp_path):
    cases, blob = _cases()
    out, flags = _run(tmp_path, {"TT_USE_MVE": "1", "TT_USE_DSP": "1"}, blob)
    mve = _split(out, cases)
    port = _split(_run(tmp_path, {}, blob)[0], cases)
    # the vector path ran on exactly the cases where it may (and on enough of them, of every kind)
    assert [int(f) for f in flags] == [c[5] if c[0] != RAW else -1 for c in cases]
    assert all(sum(c[5] for c in cases if c[0] == k) >= 15 for k in (FWD, FWD_INPLACE, GI, GI_INPLACE))
    for (kind, fail, nan, _, want, _, _), m, p in zip(cases, mve, port):
        if kind == RAW:
            # the unguarded vector run on products that are fp32 subnormals: Helium flushes them (-0, fp16 +0
            # after the +0 start) where the portable kernel keeps them (fp16 -0): the guard is needed
            assert np.array_equal(p, want) and np.all(p == 0x8000)
            assert np.all(m == 0x0000)
        elif nan:
            # a NaN input: the default NaN from Helium, the payload from the portable code (the vector path ran)
            assert _same(m, p) and not np.array_equal(m, p), kind
        else:
            assert _same(p, want), (kind, fail)   # the portable kernels against numpy
            assert np.array_equal(m, p), (kind, fail)   # Helium against them, byte for byte (fallback if fail)
