"""Instructions per int8 forward layer of a built model on the Cortex-M7 board, portable against `kernels: dsp`, and
the bits of both (QEMU -icount, deterministic).

Reads the int8 conv / depthwise calls of a build's generated program (build/<name>/codegen/tt_model.c: their
geometry, and whether a call runs in place, with a split weight or inside a row stream, one output row per call),
writes a small firmware that runs each layer once on pseudo-random int8 data and weights (a fixed generator, the
same bytes in both builds) and prints instructions per layer and per MAC. The outputs of every layer are written to
a file and compared between the portable and the DSP build: they must be the same bytes.

    .venv/bin/python bench/kernels_m7.py                       # build/mbv2_tte (run bench/profile_mbv2.py first)
    .venv/bin/python bench/kernels_m7.py --build build/digits --only dsp

A layer's figure is the kernel's own cost for that geometry and the synthetic data's requantisation (the real
weights' values do not change the instruction count of the integer kernels, only the data-dependent clamp).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BOARD = "stm32f746-disco"
KERNEL_FILES = ["ops/tt_conv2d.c", "ops/tt_depthwise_conv2d.c", "tt_common.c"]  # what the program calls


@dataclass(frozen=True)
class Layer:
    kind: str            # conv | split | dw | dw_inplace
    dims: tuple[int, ...]  # tt_conv_dims' 16 fields
    rows: bool           # called one output row at a time (a row stream)
    n: int = 0           # split: trained input channels
    act: tuple[int, int] = (-128, 127)  # the output clamp
    bias_bits: int = 14  # |bias| < 2^bias_bits (large ones take the kernels' general requantisation)

    @property
    def macs(self) -> int:
        b, _, _, ic, oh, ow, oc, kh, kw = self.dims[:9]
        per = kh * kw * (1 if self.kind.startswith("dw") else ic)
        return b * oh * ow * oc * per

    def label(self) -> str:
        b, ih, iw, ic, oh, ow, oc, kh, kw, sh = self.dims[:10]
        return f"{self.kind}{' rows' if self.rows else ''} {ih}x{iw}x{ic} -> {oh}x{ow}x{oc} k{kh}x{kw} s{sh}"


_DIMS = re.compile(r"static const tt_conv_dims (tt_cd\d+) = \{([^}]*)\};")
_CALL = re.compile(r"\b(tt_conv2d_s8_split|tt_conv2d_s8|tt_depthwise_conv2d_s8_inplace|tt_depthwise_conv2d_s8)\("
                   r"\s*&?(\w+)")


def layers_of(model_c: Path) -> list[Layer]:
    """The int8 forward layers of one training step's forward (each call site once), in program order."""
    text = model_c.read_text()
    dims = {m[1]: tuple(int(v) for v in m[2].split(",")) for m in _DIMS.finditer(text)}
    out: list[Layer] = []
    seen: set[tuple] = set()
    # row-stream kernels copy a dims struct into `d` and set in_h / pad_top / out_h: "d = tt_cdN;" before the call
    for fn in re.finditer(r"static void (tt_rows_fn\d+)\(.*?\n}\n", text, re.S):
        for case in re.finditer(r"d = (tt_cd\d+);.*?(tt_conv2d_s8_split|tt_conv2d_s8|tt_depthwise_conv2d_s8)\(",
                                fn[0], re.S):
            kind = {"tt_conv2d_s8": "conv", "tt_depthwise_conv2d_s8": "dw"}.get(case[2], "split")
            key = (kind, case[1], True)
            if key not in seen:
                seen.add(key)
                out.append(Layer(kind, dims[case[1]], True))
    for m in _CALL.finditer(text):
        if m[2] == "d" or m[2] not in dims:
            continue
        kind = {"tt_conv2d_s8": "conv", "tt_conv2d_s8_split": "split", "tt_depthwise_conv2d_s8": "dw",
                "tt_depthwise_conv2d_s8_inplace": "dw_inplace"}[m[1]]
        n = 0
        if kind == "split":
            args = text[m.end():m.end() + 400].split(",")
            n = int(args[4].strip()) if len(args) > 4 and args[4].strip().isdigit() else 1
        key = (kind, m[2], False)
        if key not in seen:
            seen.add(key)
            out.append(Layer(kind, dims[m[2]], False, n))
    return out


def program(layers: list[Layer]) -> str:
    """A tt_main running every layer once, logging its instruction count and writing all outputs to out.bin."""
    cases = []
    for i, l in enumerate(layers):
        d = ", ".join(map(str, l.dims))
        b, ih, iw, ic, oh, ow, oc, kh, kw, sh, sw, dh, dw, pt, pl, mult = l.dims
        w_len = (kh * kw * oc) if l.kind.startswith("dw") else oc * kh * kw * ic
        x_len = (kh * iw * ic) if l.rows else b * ih * iw * ic
        y_len = b * oh * ow * oc
        call = {
            "conv": "tt_conv2d_s8(&dd, &q, xr, W, B, yr);",
            "split": f"tt_conv2d_s8_split(&dd, &q, xr, W, W + {w_len}, {l.n}, B, yr);",
            "dw": "tt_depthwise_conv2d_s8(&dd, &q, xr, W, B, yr);",
            "dw_inplace": "tt_depthwise_conv2d_s8_inplace(&dd, &q, X, W, B, S);",
        }[l.kind]
        if l.rows:
            # one output row per call, with the input rows it reads (as tt_stream.c passes them)
            body = f"""
        for (r = 0; r < {oh}; ++r) {{
            const int32_t top = r * {sh} - {pt};
            const int32_t lo = top > 0 ? top : 0;
            const int32_t hi = top + {(kh - 1) * dh} < {ih - 1} ? top + {(kh - 1) * dh} : {ih - 1};
            const int8_t *xr = X; /* the same input rows every time: the window's bytes do not change the count */
            int8_t *yr = Y;
            tt_conv_dims dd = d;
            dd.in_h = hi - lo + 1;
            dd.pad_top = {pt} - r * {sh} + lo;
            dd.out_h = 1;
            t0 = tt_instructions();
            {call}
            t1 += tt_instructions() - t0;
            if (tt_write(fd, Y, {ow * oc}) != 0) return 3;
        }}"""
        else:
            body = f"""
        {{ const int8_t *xr = X; int8_t *yr = Y; const tt_conv_dims dd = d; (void)xr; (void)yr;
           t0 = tt_instructions(); {call} t1 = tt_instructions() - t0; }}
        if (tt_write(fd, {"X" if l.kind == "dw_inplace" else "Y"}, {y_len}) != 0) return 3;"""
        cases.append(f"""
    {{ /* {l.label()} */
        const tt_conv_dims d = {{{d}}};
        const tt_requant_s8 q = {{-7, 3, {l.act[0]}, {l.act[1]}, M, SH, 1}};
        fill(X, {x_len}, {i * 7 + 1}u);
        fill32(B, {oc}, {i * 7 + 3}u, {l.bias_bits}); fill(Y, {y_len}, 0u);
        for (j = 0; j < {oc}; ++j) {{ M[j] = 1073741824 + (int32_t)(rnd() & 0x3FFFFFFF); SH[j] = -(int32_t)(6 + rnd() % 4); }}
        t1 = 0;{body}
        tt_log("@layer {i} %lu\\n", (unsigned long)t1);
    }}""")
    sizes = [max(l.dims[7] * l.dims[2] * l.dims[3], l.dims[5] * l.dims[6]) if l.rows else
             max(l.dims[0] * l.dims[1] * l.dims[2] * l.dims[3], l.dims[0] * l.dims[4] * l.dims[5] * l.dims[6])
             for l in layers]
    wmax = max(2 * l.dims[6] * l.dims[7] * l.dims[8] * (1 if l.kind.startswith("dw") else l.dims[3])
               for l in layers)
    omax = max(l.dims[6] for l in layers)
    smax = max(l.dims[4] * l.dims[5] for l in layers)
    import numpy as np

    weights = ",".join(map(str, np.random.default_rng(5).integers(-128, 128, wmax).tolist()))
    return f"""#include <stdint.h>
#include "tt_platform.h"
#include "tt_kernels.h"

static uint32_t state = 1u;
static uint32_t rnd(void) {{ state = state * 1664525u + 1013904223u; return state >> 8; }}
static void fill(int8_t *p, int32_t n, uint32_t seed) {{ int32_t i; if (seed) state = seed; for (i = 0; i < n; ++i) p[i] = (int8_t)(rnd() & 0xFF); }}
static void fill32(int32_t *p, int32_t n, uint32_t seed, int bits) {{ int32_t i; state = seed; for (i = 0; i < n; ++i) p[i] = (int32_t)(((rnd() << 8) ^ rnd()) & ((1u << bits) - 1u)) - (int32_t)(1u << (bits - 1)); }}
static int8_t X[{max(sizes)}], Y[{max(sizes)}], S[{smax}];
static const int8_t W[{wmax}] = {{{weights}}}; /* in flash, as a model's frozen weights */
static int32_t B[{omax}], M[{omax}], SH[{omax}];

int tt_main(void)
{{
    uint64_t t0, t1;
    int32_t r, j;
    const int fd = tt_open("out.bin", TT_WRITE);
    (void)r; (void)S;
    if (fd < 0) return 2;
{''.join(cases)}
    tt_close(fd);
    return 0;
}}
"""


def run(layers: list[Layer], kernels: str, work: Path) -> tuple[list[int], bytes]:
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware

    prog = work / f"prog-{kernels}"
    prog.mkdir(parents=True, exist_ok=True)
    (prog / "bench.c").write_text(program(layers))
    board = get_board(BOARD)
    built = build_firmware(board, prog, work / f"build-{kernels}", kernels=KERNEL_FILES,
                           defines={"TT_USE_DSP": "1"} if kernels == "dsp" else None)
    ran = run_firmware(board, built.elf, work / f"run-{kernels}", {}, timeout_s=600, results_name=None)
    counts = [int(m[1]) for m in re.finditer(r"@layer \d+ (\d+)", ran.console)]
    return counts, ran.files["out.bin"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "mbv2_tte")
    ap.add_argument("--only", choices=("both", "dsp", "portable"), default="both")
    args = ap.parse_args(argv)
    model_c = args.build / "codegen" / "tt_model.c"
    if not model_c.is_file():
        print(f"error: {model_c} not found: build the model first", file=sys.stderr)
        return 2
    layers = layers_of(model_c)
    if not layers:
        print(f"error: {model_c} calls no int8 conv or depthwise kernel (a float or fp16-mixed build?)", file=sys.stderr)
        return 2
    kinds = ("portable", "dsp") if args.only == "both" else (args.only,)
    with tempfile.TemporaryDirectory(prefix="tt-kernels-m7-") as tmp:
        res = {k: run(layers, k, Path(tmp)) for k in kinds}
    if len(kinds) == 2 and res["portable"][1] != res["dsp"][1]:
        print("MISMATCH: the DSP build's outputs differ from the portable build's")
        return 1
    tot = {k: 0 for k in kinds}
    print(f"{'layer':52s} " + " ".join(f"{k:>10s} {'/MAC':>5s}" for k in kinds))
    for i, l in enumerate(layers):
        cells = []
        for k in kinds:
            c = res[k][0][i]
            tot[k] += c
            cells.append(f"{c / 1e6:9.3f}M {c / l.macs:5.2f}")
        print(f"{l.label():52s} " + " ".join(cells))
    macs = sum(l.macs for l in layers)
    print(f"{'total (each call site once)':52s} " + " ".join(f"{tot[k] / 1e6:9.3f}M {tot[k] / macs:5.2f}"
                                                             for k in kinds))
    if len(kinds) == 2:
        print("outputs: identical bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
