"""Helium fp16-mixed elementwise kernels (kernels_c/tt_f16_mve_ops.h, `target.kernels: mve`): the fp32 and fp16
activation clamp masks, the mask gradient's three fp16 forms and the global mean's fp16 gradient, built with and
without Helium for the Cortex-M55 and run in QEMU on random shapes and edge values (+-0, subnormals, +-Inf, NaNs with
payloads, signalling NaNs, fp16 overflow, the bounds and their neighbours, bounds that fp16 cannot hold, NaN bounds,
in place and out of place): the output bytes must be the portable kernels', and numpy's compares and float16 casts
give the same (NaN payloads by the kernels' stated rule).

And the board's floating-point mode (kernels_c/boards/startup.c): FPSCR's AHP, DN, FZ, RMode and FZ16 are 0 in
tt_main, and with that Helium's fp16 arithmetic (VADD.F16 / VMUL.F16, which take FZ16 from FPSCR) equals the portable
widen-operate-narrow on every fp16 value against a set of second operands (subnormal results included) but for
NaN payloads, while with FZ16 = 1 it does not: the fact tt_f16_mve_ops.h states for fp16 vector arithmetic."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

BOARD = "mps3-an547"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="needs arm-none-eabi-gcc and qemu-system-arm")
KERNELS = ["tt_mask.c", "ops/tt_mask_grad.c", "ops/tt_mean.c"]

PROG = r"""
#include <stdint.h>
#include <string.h>
#include "tt_kernels.h"
#include "tt_mask.h"
#include "tt_platform.h"

static uint32_t buf32[40 * 1024], out32[40 * 1024], work32[2 * 1024];   /* word-aligned */
#define buf ((uint8_t *)buf32)
#define out ((uint8_t *)out32)
#define work ((uint8_t *)work32)

static int32_t rd32(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); }
static float rdf(const uint8_t *p) { float f; uint32_t b = (uint32_t)rd32(p); memcpy(&f, &b, 4); return f; }

int tt_main(void) {
    long size = tt_read_file("cases.bin", buf, sizeof buf32);
    if (size < 4) tt_fail("no cases.bin");
    int32_t cases = rd32(buf), k = 0;
    const uint8_t *p = buf + 4;
    for (int32_t c = 0; c < cases; ++c) {
        /* kind, n, arg (bit offset / c), inplace, lo, hi, in-bytes, out-bytes, mask-bytes; then input, mask */
        const int32_t kind = rd32(p), n = rd32(p + 4), arg = rd32(p + 8), inplace = rd32(p + 12);
        const float lo = rdf(p + 16), hi = rdf(p + 20);
        const int32_t inb = rd32(p + 24), outb = rd32(p + 28), mb = rd32(p + 32);
        const uint8_t *in = p + 36, *mask = in + inb;    /* in: copied to work before use */
        uint8_t *dst = inplace ? work : out + k;
        memcpy(work, in, (size_t)inb);
        if (kind == 0) tt_clamp_mask_f32(n, lo, hi, (const float *)(const void *)work, out + k);
        else if (kind == 1) tt_clamp_mask_hy(n, lo, hi, (const uint16_t *)(const void *)work, out + k);
        else if (kind == 2) tt_mask_grad_f16(n, arg, mask, 0, (const uint16_t *)(const void *)work, 0, (uint16_t *)(void *)dst);
        else if (kind == 3) tt_mask_grad_f16(n, arg, mask, (const float *)(const void *)work, 0, 0, (uint16_t *)(void *)dst);
        else if (kind == 4) tt_mask_grad_f16(n, arg, mask, 0, (const uint16_t *)(const void *)work, (float *)(void *)(out + k), 0);
        else tt_mean_hw_grad_f32_hy(1, n / arg, 1, arg, (const float *)(const void *)work, (uint16_t *)(void *)(out + k));
        if (inplace && kind >= 2) memcpy(out + k, work, (size_t)outb);
        k += (outb + 3) & ~3;   /* every output starts word-aligned (the case's padding is zeros) */
        p = in + inb + mb;
    }
    return tt_write_file("out.bin", out, (size_t)k) == 0 ? 0 : 1;
}
"""

_F32_EDGES = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754944e-38, np.inf, -np.inf, 6.0, -6.0, 1.0, -1.0,
                       3.4028235e38, -3.4028235e38, 65504.0, 65519.996, 65520.0, -65520.0, 5.9604645e-08, 2.9802322e-08,
                       2.9802326e-08, -2.9802322e-08, 6.1035156e-05, 6.0975552e-05], np.float32)
_F32_NANS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA02000],
                     np.uint32).view(np.float32)
_F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x3BFF, 0x3C01, 0x4600,
                       0x45FF, 0x4601, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7DFF,
                       0x7FFF, 0xFFFF, 0x0200], np.uint16)
# (lo, hi): relu, relu6, relu_n1_to_1, an unbounded hi, bounds fp16 cannot hold (between fp16 values, beyond 65504,
# tinier than its subnormals), +-0, infinite and NaN bounds
_BOUNDS = [(0.0, np.inf), (0.0, 6.0), (-1.0, 1.0), (0.0, 3.4028235e38), (-np.inf, np.inf), (0.1, 5.99), (-0.1, 1e10),
           (-1e-30, 1e-30), (-0.0, 2.9802322e-08), (65504.0, 70000.0), (-1e10, -65504.0), (1e10, np.inf),
           (np.inf, np.inf), (-np.inf, -np.inf), (np.nan, 6.0), (0.0, np.nan), (6.0, 0.0), (1.0000001, 1.0000002),
           (-6.0000005, 5.9999995)]


def _f16_bits(x: np.ndarray) -> np.ndarray:
    """tt_f16_narrow: numpy's float16 cast (nearest even, overflow to Inf), a NaN as sign | 0x7E00 | top payload."""
    b = x.view(np.uint32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((b >> 16) & 0x8000) | 0x7E00 | ((b & 0x7FFFFF) >> 13), h).astype(np.uint16)


def _f32_of_f16(h: np.ndarray, quiet: bool) -> np.ndarray:
    """fp16 bits widened; a NaN as sign | 0x7F800000 | payload << 13, quieted where the kernels read with a VCVTB."""
    h = h.astype(np.uint32)
    nan = (h & 0x7FFF) > 0x7C00
    q = np.where(nan & quiet, h | 0x200, h)
    w = h.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    return np.where(nan, ((q & 0x8000) << 16) | 0x7F800000 | ((q & 0x3FF) << 13), w).astype(np.uint32)


def _cases(seed: int = 5):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        near = np.concatenate([np.nextafter(_F32_EDGES, np.float32(np.inf)),
                               np.nextafter(_F32_EDGES, np.float32(-np.inf))]).astype(np.float32)
    pool32 = np.concatenate([_F32_EDGES, _F32_NANS, near])
    sizes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 255] + [int(s) for s in rng.integers(1, 900, 12)]
    cases, blob = [], []

    def f32s(n):
        return np.where(rng.random(n) < 0.5, rng.choice(pool32, n),
                        (rng.standard_normal(n) * 8).astype(np.float32)).astype(np.float32)

    def f16s(n):
        with np.errstate(over="ignore"):
            near16 = f32s(n).astype(np.float16).view(np.uint16)
        pick = rng.random(n)
        return np.where(pick < 0.3, rng.choice(_F16_EDGES, n),
                        np.where(pick < 0.6, rng.integers(0, 2 ** 16, n), near16)).astype(np.uint16)

    for j, n in enumerate(sizes):
        for kind in range(6):
            lo, hi = _BOUNDS[(j + kind) % len(_BOUNDS)] if kind < 2 else (0.0, 0.0)
            arg, inplace, mask = 0, 0, b""
            if kind == 0:
                x = f32s(n)
            elif kind in (1, 2, 4):
                x = f16s(n)
            elif kind == 3:
                x = f32s(n)
            if kind in (2, 3, 4):
                arg = int(rng.integers(0, 32))
                bits = rng.integers(0, 2, arg + n).astype(np.uint8)
                mask = np.packbits(bits, bitorder="little").tobytes()
                keep = bits[arg:].astype(bool)
                inplace = int(kind != 4 and rng.random() < 0.4)
            if kind == 5:   # the mean's gradient: arg channels, n // arg positions
                arg = int(rng.integers(1, 40))
                n = arg * int(rng.integers(1, 12))
                x = f32s(arg)
            if kind == 0:
                y, outb = x, (n + 7) // 8
            elif kind == 1:
                y, outb = x.view(np.float16).astype(np.float32), (n + 7) // 8
            if kind in (0, 1):
                with np.errstate(invalid="ignore"):
                    keep = (y > np.float32(lo)) & ((y < np.float32(hi)) if hi <= 3.4028235e38 else True)
                want = np.packbits(keep.astype(np.uint8), bitorder="little").tobytes()
            elif kind == 2:
                want, outb = np.where(keep, x, 0).astype("<u2").tobytes(), 2 * n
            elif kind == 3:
                want, outb = np.where(keep, _f16_bits(x), 0).astype("<u2").tobytes(), 2 * n
            elif kind == 4:
                want, outb = {q: np.where(keep, _f32_of_f16(x, q), 0).astype("<u4").tobytes() for q in (0, 1)}, 4 * n
            else:
                with np.errstate(invalid="ignore"):
                    q = (x / np.float32(n // arg)).astype(np.float32)
                want, outb = np.tile(_f16_bits(q), n // arg).astype("<u2").tobytes(), 2 * n
            inb = x.nbytes
            blob.append(np.array([kind, n, arg, inplace], "<i4").tobytes() + np.array([lo, hi], "<f4").tobytes()
                        + np.array([inb, outb, len(mask)], "<i4").tobytes() + x.tobytes() + mask)
            cases.append(want)
    return cases, np.int32(len(cases)).tobytes() + b"".join(blob)


def _numpy(cases, quiet: bool) -> bytes:
    """The expected out.bin: each case's bytes padded with zeros to a word."""
    parts = (w[int(quiet)] if isinstance(w, dict) else w for w in cases)
    return b"".join(w + bytes(-len(w) % 4) for w in parts)


def _run(board: str, tmp: Path, defines: dict[str, str], blob: bytes):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "ops.c").write_text(PROG)
    b = get_board(board)
    tag = "-".join([board, *defines])
    built = build_firmware(b, prog, tmp / f"build-{tag}", kernels=KERNELS, defines=defines)
    ran = run_firmware(b, built.elf, tmp / f"run-{tag}", {"cases.bin": blob}, timeout_s=120)
    return ran.files["out.bin"], built.elf


@needs_arm
def test_helium_fp16_ops_equal_the_portable_kernels_in_qemu(tmp_path):
    cases, blob = _cases()
    mve, elf = _run(BOARD, tmp_path, {"TT_USE_MVE": "1"}, blob)
    port, elf_port = _run(BOARD, tmp_path, {}, blob)
    assert port == _numpy(cases, quiet=True)  # the portable kernels against numpy (the M55 reads fp16 with VCVTB)
    assert mve == port   # Helium against the portable kernels, byte for byte
    dis = {e: subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(e)], capture_output=True,
                             text=True, check=True).stdout for e in (elf, elf_port)}
    assert "vaddv" in dis[elf] and "vaddv" not in dis[elf_port]  # the Helium paths are what ran
    # no floating-point vector arithmetic from the compiler: only tt_f16_mve.h's two VCVT words
    assert not re.findall(r"\tv(?!cvt)\w+\.f(?:16|32)\s+q\d", dis[elf])


@pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")
def test_the_same_program_on_the_host_gives_numpys_bytes(tmp_path):
    cases, blob = _cases()
    import subprocess

    from tinytrain.stages.device.boards import HOST_ISA_PROBE, host_isa_flags

    host, _ = _run("host", tmp_path, {"TT_USE_MVE": "1"}, blob)  # TT_USE_MVE is harmless where there is no MVE
    # the host build reads fp16 with F16C's VCVTPH2PS when the host board targets x86-64-v3 (a signalling NaN comes
    # out quiet, as on the M55), else in integer code (it stays signalling)
    probe = subprocess.run(HOST_ISA_PROBE, capture_output=True, text=True, check=True).stdout.splitlines()
    f16c = "-march=x86-64-v3" in host_isa_flags(probe[0] if probe else "")
    assert host == _numpy(cases, quiet=f16c)


FP_PROG = r"""
#include <stdint.h>
#include <string.h>
#include <arm_mve.h>
#include "tt_f16.h"
#include "tt_platform.h"

/* Helium's fp16 arithmetic, which the board compiles without (+nomve.fp): assembled here on its own. */
#define TT_F16_OP(name, insn)                                                                                   \
    static uint16x8_t name(uint16x8_t a, uint16x8_t b) {                                                          \
        uint16x8_t d;                                                                                             \
        __asm__(".arch_extension mve.fp\n\t" insn " %q0, %q1, %q2" : "=w"(d) : "w"(a), "w"(b));                   \
        return d;                                                                                                 \
    }
TT_F16_OP(vadd16, "vadd.f16")
TT_F16_OP(vmul16, "vmul.f16")

static uint32_t fpscr(void) { uint32_t f; __asm__ volatile("vmrs %0, fpscr" : "=r"(f)); return f; }
static uint32_t rng = 0x9E3779B9u;
static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }

/* every fp16 a against the second operands b: lanes whose portable result is not a NaN (Helium gives the default
 * NaN) must be equal; counts the subnormal results compared */
static uint32_t run(int mul, const uint16_t *bs, uint32_t nb, uint32_t *checked, uint32_t *subnormal, int log) {
    uint32_t bad = 0, a0, j, k;
    for (j = 0; j < nb; ++j) {
        const uint16x8_t b = vdupq_n_u16(bs[j]);
        for (a0 = 0; a0 < 65536u; a0 += 8u) {
            uint16_t av[8], got[8];
            for (k = 0; k < 8u; ++k) av[k] = (uint16_t)(a0 + k);
            vst1q_u16(got, mul ? vmul16(vld1q_u16(av), b) : vadd16(vld1q_u16(av), b));
            for (k = 0; k < 8u; ++k) {
                const float x = tt_f16_widen(av[k]), y = tt_f16_widen(bs[j]);
                const uint16_t want = tt_f16_narrow(mul ? x * y : x + y);
                if ((want & 0x7FFFu) > 0x7C00u) continue;
                ++*checked;
                *subnormal += (want & 0x7C00u) == 0u && (want & 0x3FFu) != 0u;
                if (got[k] != want) {
                    if (log && bad < 4u) tt_log("MISMATCH %s a=%04x b=%04x got=%04x want=%04x\n", mul ? "mul" : "add", av[k], bs[j], got[k], want);
                    ++bad;
                }
            }
        }
    }
    return bad;
}

int tt_main(void) {
    static uint16_t bs[24] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x3800, 0x1400,
                              0x1000, 0x0C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x3C01, 0x3555, 0xC248, 0x0200, 0x2400};
    uint32_t n = 22, checked = 0, sub = 0, bad, flushed = 0, c2 = 0, s2 = 0;
    const uint32_t mode = fpscr() & ((7u << 24) | (3u << 22) | (1u << 19));
    while (n < 24u) bs[n++] = (uint16_t)(next() & 0xFFFFu);
    bad = run(1, bs, n, &checked, &sub, 1) + run(0, bs, n, &checked, &sub, 1);
    __asm__ volatile("vmsr fpscr, %0" : : "r"(fpscr() | (1u << 19)) : "memory");   /* FZ16 = 1 */
    flushed = run(1, bs, n, &c2, &s2, 0);
    __asm__ volatile("vmsr fpscr, %0" : : "r"(fpscr() & ~(1u << 19)) : "memory");
    tt_log("mode=%08lx checked=%lu subnormal=%lu mismatches=%lu fz16_mismatches=%lu\n", (unsigned long)mode,
           (unsigned long)checked, (unsigned long)sub, (unsigned long)bad, (unsigned long)flushed);
    return 0;
}
"""


@needs_arm
def test_the_m55_starts_in_ieee_mode_and_its_fp16_arithmetic_is_the_portable_formula(tmp_path):
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "fp.c").write_text(FP_PROG)
    b = get_board(BOARD)
    built = build_firmware(b, prog, tmp_path / "build", kernels=[], defines={})
    ran = run_firmware(b, built.elf, tmp_path / "run", {}, timeout_s=300, check=False)
    m = re.search(r"mode=([0-9a-f]+) checked=(\d+) subnormal=(\d+) mismatches=(\d+) fz16_mismatches=(\d+)",
                  ran.console)
    assert m, ran.console[-2000:]
    mode, checked, subnormal, bad, flushed = int(m.group(1), 16), *map(int, m.groups()[1:])
    assert mode == 0                     # AHP, DN, FZ, RMode and FZ16 all 0 when tt_main starts
    assert bad == 0, ran.console[-2000:]
    assert checked > 2 * 65536 * 20 and subnormal > 10_000   # subnormal results were really compared
    assert flushed > 1000                # FZ16 = 1 would change them: the startup's setting matters
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", "-marmv8.1-m.main", str(built.elf)], capture_output=True,
                         text=True, check=True).stdout
    assert "vmul.f16" in dis and "vadd.f16" in dis


@needs_arm
@pytest.mark.slow
def test_fp16_mixed_training_with_helium_masks_is_bit_identical_to_portable(tmp_path, capsys):
    """End to end: the example with every layer trained (`scheme: full`, so its backward runs the clamp masks and
    mask gradients) in fp16-mixed on the M55, portable against `mve`: the same losses, loss scale, accuracy and
    weights. (MobileNetV2 fp16-mixed, which also runs the fp16 mask gradients and the mean's fp16 gradient, gives the
    same weights for both in bench/m55_kernels.py --mbv2: too slow for a test.)"""
    import json

    import yaml

    from tinytrain.pipeline.cli import main

    repo = Path(__file__).resolve().parents[1]

    def build(kernels: str) -> dict:
        doc = yaml.safe_load((repo / "tinytrain.yaml.example").read_text())
        doc["model"]["path"] = str(repo / doc["model"]["path"])
        doc["target"].update(board=BOARD, kernels=kernels)
        doc["train"]["update"].update(budget_kb=200, scheme="full")
        doc["train"].update(epochs=1, max_train_samples=40, precision="fp16-mixed")
        doc["build"] = {"out_dir": str(tmp_path / "build")}
        doc["name"] = "digits"   # one build folder: the stages before cross-compile are shared
        spec = tmp_path / "digits.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert main(["build", str(spec)]) == 0
        b = tmp_path / "build" / "digits"
        return {"run": json.loads((b / "emulate-run" / "run.json").read_text()),
                "weights": (b / "emulate-run" / "weights.bin").read_bytes(),
                "model": (b / "codegen" / "tt_model.c").read_text()}

    port, mve = build("portable"), build("mve")
    capsys.readouterr()
    # what this exercises: a clamp mask and a mask gradient (their fp32 or, where the tensors are fp16, fp16 forms)
    assert re.search(r"tt_clamp_mask_(f32|hy)\(", mve["model"]) and re.search(r"tt_mask_grad_f(32|16)\(", mve["model"])
    assert mve["weights"] == port["weights"]
    assert mve["run"]["loss"]["per_step"] == port["run"]["loss"]["per_step"]
    assert mve["run"]["accuracy"] == port["run"]["accuracy"]
    assert mve["run"].get("loss_scale") == port["run"].get("loss_scale")
