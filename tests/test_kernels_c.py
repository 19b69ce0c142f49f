"""kernels_c/ (the C99 kernel library) against the numpy golden model (DESIGN §8 step 4).

All kernels and tests/c/tt_test_driver.c are compiled once per session for the host with ASan + UBSan
(-std=c99 -Wall -Wextra -Werror -ffp-contract=off). Each test writes its random cases as small binary files (the
format is in the driver's header comment), runs the driver once on all of them and compares with:
  - int8 forward: stages/golden/forward.py (+ int8_arith) on one-op graphs, bit-exact;
  - float forward: the same executor, within 1e-5 relative (in practice identical: same loop order);
  - backward, losses, float optimizers: stages/golden/grad_ops.py, within 1e-5 / 1e-6 relative;
  - int8 QAS update: the numpy reference `qas_update_ref` below (DESIGN §6 formula with the rounding rules
    documented in kernels_c/tt_kernels.h), exactly.
Every kernel file also cross-compiles warning-free for Cortex-M7 (skipped without arm-none-eabi-gcc).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.cross_compile import KERNEL_SOURCE_GLOBS
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
DRIVER = ROOT / "tests" / "c" / "tt_test_driver.c"
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]
HOST_FLAGS = CFLAGS + ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ARM_FLAGS = ["-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard"] + CFLAGS + ["-O2", "-c"]

F32 = np.float32
ACTS = ("none", "relu", "relu6")
FLOAT_BOUNDS = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0),
                "relu_n1_to_1": (-1.0, 1.0)}
ACT_ENUM = {"none": 0, "relu": 1, "relu6": 2, "relu_n1_to_1": 3}


def kernel_sources() -> list[Path]:
    """The kernel library as cross-compile builds it: the shared files, then one file per op (kernels_c/ops/)."""
    return [p for g in KERNEL_SOURCE_GLOBS for p in sorted(KDIR.glob(g))]


# ---- the compiled driver ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")  # one ~9 s ASan build, shared by every module that imports it
def driver(tmp_path_factory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("ttk") / "tt_test_driver"
    cmd = [cc, *HOST_FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", *map(str, kernel_sources()), str(DRIVER), "-lm", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"host build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return out


@pytest.fixture(scope="module")
def dsp_driver(tmp_path_factory) -> Path:
    """The driver with the ACLE DSP path of tt_dot.h enabled, the intrinsics emulated by tests/c/acle_host."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("ttk_dsp") / "tt_test_driver_dsp"
    cmd = [cc, *HOST_FLAGS, "-DTT_USE_DSP=1", "-D__ARM_FEATURE_DSP=1", "-D__ARM_FEATURE_SIMD32=1",
           f"-I{ROOT / 'tests' / 'c' / 'acle_host'}", f"-I{KDIR}", f"-I{ops_header.include_dir()}", *map(str, kernel_sources()), str(DRIVER), "-lm",
           "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"host DSP build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return out


@pytest.fixture(scope="module")
def sse_driver(tmp_path_factory) -> Path:
    """The driver as the native `host` board builds it (TT_USE_HOST_SIMD: SSE2 int8 inner products of tt_dot.h on
    x86-64; on another host the portable loops again)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("ttk_sse") / "tt_test_driver_sse"
    cmd = [cc, *HOST_FLAGS, "-DTT_USE_HOST_SIMD=1", f"-I{KDIR}", f"-I{ops_header.include_dir()}",
           *map(str, kernel_sources()), str(DRIVER), "-lm", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"host SSE2 build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return out


class Batch:
    """Cases for one driver run: add(op, ints, floats, buffers) -> index; run() -> per case, the buffers after the
    op as arrays of the dtype/shape they were given with."""

    def __init__(self, driver: Path, tmp: Path):
        self.driver, self.tmp, self.cases = driver, tmp, []

    def add(self, op: str, ints, floats, bufs) -> int:
        bufs = [np.ascontiguousarray(np.asarray(b)) if b is not None else None for b in bufs]
        self.cases.append((op, [int(i) for i in ints], [float(f) for f in floats], bufs))
        return len(self.cases) - 1

    def run(self, driver: Path | None = None, keep: bool = False) -> list[list[np.ndarray | None]]:
        """Run the cases (through `driver` if given, e.g. the DSP build); keep=True leaves them for another run."""
        paths = []
        for k, (op, ints, floats, bufs) in enumerate(self.cases):
            blob = bytearray(op.encode().ljust(32, b"\0"))
            blob += struct.pack(f"<i{len(ints)}i", len(ints), *ints)
            blob += struct.pack(f"<i{len(floats)}d", len(floats), *floats)
            blob += struct.pack("<i", len(bufs))
            for b in bufs:
                raw = b"" if b is None else b.tobytes()
                blob += struct.pack("<i", len(raw)) + raw
            p = self.tmp / f"case{k:04d}.bin"
            p.write_bytes(bytes(blob))
            paths.append(p)
        res = subprocess.run([str(driver or self.driver), *map(str, paths)], capture_output=True, text=True)
        assert res.returncode == 0, f"driver failed ({res.returncode}):\n{res.stderr[-4000:]}"
        results = []
        for p, (_, _, _, bufs) in zip(paths, self.cases):
            data = p.with_suffix(".bin.out").read_bytes()
            pos, outs = 0, []
            for b in bufs:
                (n,) = struct.unpack_from("<i", data, pos)
                pos += 4
                if b is None:
                    outs.append(None)
                else:
                    outs.append(np.frombuffer(data[pos:pos + n], dtype=b.dtype).reshape(b.shape).copy())
                pos += n
            results.append(outs)
        if not keep:
            self.cases = []
        return results


@pytest.fixture
def batch(driver, tmp_path) -> Batch:
    return Batch(driver, tmp_path)


# ---- one-op graphs for the executor ----------------------------------------------------------------------------

def _f32s(x) -> float:
    return float(np.float32(x))


def _q(scale, zp, axis=0) -> QuantParams:
    scale = [_f32s(s) for s in np.atleast_1d(scale)]
    zp = [int(z) for z in np.atleast_1d(zp)]
    return QuantParams(scale=scale, zero_point=zp, axis=axis)


def _run(op_type: str, inputs: list[Tensor], out: Tensor, attrs: dict, feeds: dict) -> np.ndarray:
    tensors = {t.name: t for t in inputs if t is not None}
    tensors[out.name] = out
    g = Graph(tensors=tensors, ops=[Op(op_type, [t.name if t is not None else None for t in inputs], [out.name],
                                       attrs)],
              inputs=list(feeds), outputs=[out.name])
    return run_graph(g, feeds)[out.name]


def _conv_case(rng, depthwise: bool, quantized: bool):
    n = int(rng.integers(1, 3))
    h, w = int(rng.integers(3, 9)), int(rng.integers(3, 9))
    c = int(rng.integers(1, 6))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    sh, sw = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    dh, dw = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) if rng.random() < 0.4 else (1, 1)
    padding = "same" if rng.random() < 0.5 else "valid"
    if (h - (kh - 1) * dh) < 1 or (w - (kw - 1) * dw) < 1:
        padding = "same"
    mult = int(rng.integers(1, 4)) if depthwise else 1
    o = c * mult if depthwise else int(rng.integers(1, 7))
    act = str(rng.choice(ACTS))
    oh, pt = out_size_and_pad(padding, h, kh, sh, dh)
    ow, pl = out_size_and_pad(padding, w, kw, sw, dw)
    attrs = dict(stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, padding=padding, act=act)
    if depthwise:
        attrs["depth_multiplier"] = mult
    wshape = [1, kh, kw, o] if depthwise else [o, kh, kw, c]
    dims = [n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl, mult]
    has_bias = rng.random() < 0.8
    if quantized:
        sx, zx = _f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-128, 128))
        per_channel = rng.random() < 0.7
        sws = rng.uniform(0.002, 0.03, size=o if per_channel else 1).astype(np.float32)
        sy, zy = _f32s(rng.uniform(0.02, 0.6)), int(rng.integers(-60, 60))
        x = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
        wq = rng.integers(-127, 128, size=wshape).astype(np.int8)
        b = rng.integers(-3000, 3000, size=o).astype(np.int32) if has_bias else None
        xt = Tensor("x", [n, h, w, c], "int8", quant=_q(sx, zx))
        wt = Tensor("w", wshape, "int8", role="weight", quant=_q(sws, [0] * len(sws), 3 if depthwise else 0),
                    data=wq)
        bt = (Tensor("b", [o], "int32", role="bias", quant=_q(sx * sws, [0] * len(sws)), data=b)
              if has_bias else None)
        yt = Tensor("y", [n, oh, ow, o], "int8", quant=_q(sy, zy))
        ref = _run("depthwise_conv2d" if depthwise else "conv2d", [xt, wt, bt], yt, attrs, {"x": x})
        pairs = [ia.quantize_multiplier(float(sx) * float(s) / float(sy)) for s in sws]
        lo, hi = ia.activation_range(act, sy, zy)
        ints = dims + [zx, zy, lo, hi, int(per_channel)]
        bufs = [x, wq, b, np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32),
                np.zeros((n, oh, ow, o), np.int8)]
        return ints, [], bufs, ref
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wf = rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if has_bias else None
    xt = Tensor("x", [n, h, w, c], "float32")
    wt = Tensor("w", wshape, "float32", role="weight", data=wf)
    bt = Tensor("b", [o], "float32", role="bias", data=b) if has_bias else None
    yt = Tensor("y", [n, oh, ow, o], "float32")
    ref = _run("depthwise_conv2d" if depthwise else "conv2d", [xt, wt, bt], yt, attrs, {"x": x})
    return dims, list(FLOAT_BOUNDS[act]), [x, wf, b, np.zeros((n, oh, ow, o), np.float32)], ref


def _assert_close(got, ref, rtol=1e-5):
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-30)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol, atol=rtol * scale)


# ---- fixed-point helpers (through the ops that use them) -------------------------------------------------------

def test_requantize_op_matches_multiply_by_quantized_multiplier_edges(batch):
    """tt_requantize_s8 is MBQM(x - z_in) + z_out, clamped: drive the fixed-point helpers over their edge cases
    (ties, negative values, left and right shifts, tiny and huge multipliers)."""
    rng = np.random.default_rng(1)
    x = np.arange(-128, 128, dtype=np.int8)
    cases = []
    for real in [1.0, 0.5, 0.25, 1 / 3, 2.0, 7.5, 100.0, 1e-3, 1e-6, 0.999999, 0.75, 3.0 / 256]:
        cases.append(real)
    cases += list(rng.uniform(1e-4, 50.0, size=20))
    idx = []
    for real in cases:
        m, s = ia.quantize_multiplier(real)
        zin, zout = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
        ref = np.clip(ia.multiply_by_quantized_multiplier(x.astype(np.int64) - zin, m, s) + zout, -128, 127)
        idx.append((batch.add("requantize_s8", [x.size, zin, zout, m, s], [], [x, np.zeros_like(x)]), ref))
    out = batch.run()
    for k, ref in idx:
        np.testing.assert_array_equal(out[k][1], ref.astype(np.int8))


# ---- int8 forward, bit-exact -----------------------------------------------------------------------------------

@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_int8_bit_exact(batch, dsp_driver, sse_driver, depthwise):
    """Also through the DSP build (tt_dot.h with emulated SXTAB16/SMLAD) and the host build's SSE2: identical bits."""
    rng = np.random.default_rng(10 + depthwise)
    refs = []
    for _ in range(40):
        ints, floats, bufs, ref = _conv_case(rng, depthwise, True)
        refs.append((batch.add("depthwise_conv2d_s8" if depthwise else "conv2d_s8", ints, floats, bufs), ref))
    out = batch.run(keep=True)
    out_dsp = batch.run(driver=dsp_driver, keep=True)
    out_sse = batch.run(driver=sse_driver)
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][5], ref)
        np.testing.assert_array_equal(out_dsp[k][5], ref)
        np.testing.assert_array_equal(out_sse[k][5], ref)


def _wide_conv_geom(rng, depthwise: bool):
    """Geometry with more channels than _conv_case (blocks of four output channels and their remainders, DSP words
    and tails, interior and border pixels)."""
    n = int(rng.integers(1, 3))
    h, w = int(rng.integers(2, 11)), int(rng.integers(2, 11))
    c = int(rng.integers(1, 41))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    sh, sw = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    dh, dw = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) if rng.random() < 0.3 else (1, 1)
    padding = "same" if rng.random() < 0.6 else "valid"
    if (h - (kh - 1) * dh) < 1 or (w - (kw - 1) * dw) < 1:
        padding = "same"
    o = c if depthwise else int(rng.integers(1, 41))
    oh, pt = out_size_and_pad(padding, h, kh, sh, dh)
    ow, pl = out_size_and_pad(padding, w, kw, sw, dw)
    attrs = dict(stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, padding=padding)
    dims = [n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl, 1]
    return dims, attrs, (n, h, w, c), (n, oh, ow, o), ((1, kh, kw, o) if depthwise else (o, kh, kw, c))


def _assert_depthwise_both_builds(batch, dsp_driver, refs, sse_driver=None):
    """Runs the batch with the portable and the DSP driver (and the host SSE2 one if given); each ("y" | "xy", case,
    reference) must match in all (out of place: the output operand; in place: the input buffer's first elements)."""
    out = batch.run(keep=True)
    out_dsp = batch.run(driver=dsp_driver, keep=sse_driver is not None)
    out_sse = batch.run(driver=sse_driver) if sse_driver is not None else out
    for where, k, ref in refs:
        for got in (out[k], out_dsp[k], out_sse[k]):
            if where == "y":
                np.testing.assert_array_equal(got[5], ref)
            else:
                np.testing.assert_array_equal(got[0].reshape(-1)[:ref.size], ref.reshape(-1))


def test_conv_int8_specialised_paths_bit_exact(batch, dsp_driver, sse_driver):
    """The blocked / interior fast paths of conv2d_s8, the split-weight conv and the in-place depthwise on wider
    layers, portable and DSP builds: identical to the executor bit for bit (split == the merged weight; in-place ==
    out-of-place)."""
    rng = np.random.default_rng(31)
    refs = []
    for i in range(36):
        depthwise = i % 3 == 2
        dims, attrs, xs, ys, wshape = _wide_conv_geom(rng, depthwise)
        act = str(rng.choice(ACTS))
        attrs["act"] = act
        if depthwise:
            attrs["depth_multiplier"] = 1
        o = ys[3]
        sx, zx = _f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-128, 128))
        per_channel = rng.random() < 0.7
        sws = rng.uniform(0.002, 0.03, size=o if per_channel else 1).astype(np.float32)
        sy, zy = _f32s(rng.uniform(0.05, 0.8)), int(rng.integers(-60, 60))
        x = rng.integers(-128, 128, size=xs).astype(np.int8)
        wq = rng.integers(-127, 128, size=wshape).astype(np.int8)
        b = rng.integers(-3000, 3000, size=o).astype(np.int32) if rng.random() < 0.8 else None
        xt = Tensor("x", list(xs), "int8", quant=_q(sx, zx))
        wt = Tensor("w", list(wshape), "int8", role="weight", quant=_q(sws, [0] * len(sws), 3 if depthwise else 0),
                    data=wq)
        bt = Tensor("b", [o], "int32", role="bias", quant=_q(sx * sws, [0] * len(sws)), data=b) if b is not None else None
        yt = Tensor("y", list(ys), "int8", quant=_q(sy, zy))
        ref = _run("depthwise_conv2d" if depthwise else "conv2d", [xt, wt, bt], yt, attrs, {"x": x})
        pairs = [ia.quantize_multiplier(float(sx) * float(s) / float(sy)) for s in sws]
        lo, hi = ia.activation_range(act, sy, zy)
        ints = dims + [zx, zy, lo, hi, int(per_channel)]
        mult = np.array([p[0] for p in pairs], np.int32)
        shift = np.array([p[1] for p in pairs], np.int32)
        y0 = np.zeros(ys, np.int8)
        if not depthwise:
            refs.append(("y", batch.add("conv2d_s8", ints, [], [x, wq, b, mult, shift, y0]), ref))
            k = int(rng.integers(0, xs[3] + 1))
            stale = wq.copy()
            stale[..., :k] = rng.integers(-127, 128, size=stale[..., :k].shape)  # never read
            refs.append(("y", batch.add("conv2d_s8_split", ints + [k],
                                        [], [x, stale, b, mult, shift, y0, np.ascontiguousarray(wq[..., :k])]), ref))
        elif ys[1] * ys[2] <= xs[1] * xs[2]:  # in place: the output fits in the input's buffer
            refs.append(("xy", batch.add("depthwise_conv2d_s8_inplace", ints, [],
                                         [x.copy(), wq, b, mult, shift, np.zeros(ys[1] * ys[2], np.int8)]), ref))
        else:
            refs.append(("y", batch.add("depthwise_conv2d_s8", ints, [], [x, wq, b, mult, shift, y0]), ref))
    _assert_depthwise_both_builds(batch, dsp_driver, refs, sse_driver)


def test_depthwise_int8_wide_rows_in_place_bit_exact(batch, dsp_driver):
    """Wide rows in place: the DSP build's int16-row depthwise takes them in strips of 32 outputs over its ring of
    three rows (w = 70, 300), a small map as one padded plane (w = 9), with strides 1 and 2 and odd channel counts:
    identical to the executor, both builds."""
    rng = np.random.default_rng(77)
    refs = []
    for w, c, s in ((70, 5, 1), (70, 13, 2), (300, 3, 1), (9, 11, 1)):
        h = 3 if w > 10 else 9
        oh, pt = out_size_and_pad("same", h, 3, s, 1)
        ow, pl = out_size_and_pad("same", w, 3, s, 1)
        attrs = dict(stride_h=s, stride_w=s, dilation_h=1, dilation_w=1, padding="same", act="relu6",
                     depth_multiplier=1)
        dims = [1, h, w, c, oh, ow, c, 3, 3, s, s, 1, 1, pt, pl, 1]
        sx, zx = _f32s(0.05), int(rng.integers(-128, 128))
        sws = rng.uniform(0.002, 0.03, size=c).astype(np.float32)
        sy, zy = _f32s(0.3), int(rng.integers(-60, 60))
        x = rng.integers(-128, 128, size=(1, h, w, c)).astype(np.int8)
        wq = rng.integers(-127, 128, size=(1, 3, 3, c)).astype(np.int8)
        b = rng.integers(-3000, 3000, size=c).astype(np.int32)
        xt = Tensor("x", [1, h, w, c], "int8", quant=_q(sx, zx))
        wt = Tensor("w", [1, 3, 3, c], "int8", role="weight", quant=_q(sws, [0] * c, 3), data=wq)
        bt = Tensor("b", [c], "int32", role="bias", quant=_q(sx * sws, [0] * c), data=b)
        yt = Tensor("y", [1, oh, ow, c], "int8", quant=_q(sy, zy))
        ref = _run("depthwise_conv2d", [xt, wt, bt], yt, attrs, {"x": x})
        pairs = [ia.quantize_multiplier(float(sx) * float(v) / float(sy)) for v in sws]
        lo, hi = ia.activation_range("relu6", sy, zy)
        ints = dims + [zx, zy, lo, hi, 1]
        mult = np.array([p[0] for p in pairs], np.int32)
        shift = np.array([p[1] for p in pairs], np.int32)
        refs.append(("xy", batch.add("depthwise_conv2d_s8_inplace", ints, [],
                                     [x.copy(), wq, b, mult, shift, np.zeros(oh * ow, np.int8)]), ref))
        refs.append(("y", batch.add("depthwise_conv2d_s8", ints, [],
                                    [x, wq, b, mult, shift, np.zeros((1, oh, ow, c), np.int8)]), ref))
    _assert_depthwise_both_builds(batch, dsp_driver, refs)


def test_depthwise_int8_channel_groups_bit_exact(batch, dsp_driver):
    """Whole words of channels (in_c % 4 == 0): the DSP build's depthwise takes four channels at a time (their ring
    rows filled together, raw x padded with z_x), whole, in place (a small map; one strip per row, strides 1 and 2,
    batches) and one output row per call as a row stream calls it (the rows it reads, its top padding); identical
    to the executor, both builds, under ASan / UBSan."""
    rng = np.random.default_rng(414)
    refs = []
    for i, (w, c, s, n, h) in enumerate(((5, 4, 1, 1, 6), (9, 8, 2, 2, 9), (33, 12, 1, 1, 5), (40, 16, 2, 1, 7),
                                         (64, 8, 1, 1, 4), (70, 4, 2, 2, 5), (16, 48, 1, 2, 16), (16, 20, 2, 1, 16),
                                         (31, 4, 1, 1, 3), (8, 24, 1, 1, 8))):
        act = ("relu6", "none")[i % 2]
        oh, pt = out_size_and_pad("same", h, 3, s, 1)
        ow, pl = out_size_and_pad("same", w, 3, s, 1)
        attrs = dict(stride_h=s, stride_w=s, dilation_h=1, dilation_w=1, padding="same", act=act,
                     depth_multiplier=1)
        dims = [n, h, w, c, oh, ow, c, 3, 3, s, s, 1, 1, pt, pl, 1]
        sx, zx = _f32s(0.05), int(rng.integers(-128, 128))
        sws = rng.uniform(0.002, 0.03, size=c).astype(np.float32)
        sy, zy = _f32s(0.3), int(rng.integers(-60, 60))
        x = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
        wq = rng.integers(-127, 128, size=(1, 3, 3, c)).astype(np.int8)
        b = rng.integers(-3000, 3000, size=c).astype(np.int32) if i % 3 else None
        xt = Tensor("x", [n, h, w, c], "int8", quant=_q(sx, zx))
        wt = Tensor("w", [1, 3, 3, c], "int8", role="weight", quant=_q(sws, [0] * c, 3), data=wq)
        bt = Tensor("b", [c], "int32", role="bias", quant=_q(sx * sws, [0] * c), data=b) if b is not None else None
        yt = Tensor("y", [n, oh, ow, c], "int8", quant=_q(sy, zy))
        ref = _run("depthwise_conv2d", [xt, wt, bt], yt, attrs, {"x": x})
        pairs = [ia.quantize_multiplier(float(sx) * float(v) / float(sy)) for v in sws]
        lo, hi = ia.activation_range(act, sy, zy)
        tail = [zx, zy, lo, hi, 1]
        mult = np.array([p[0] for p in pairs], np.int32)
        shift = np.array([p[1] for p in pairs], np.int32)
        refs.append(("y", batch.add("depthwise_conv2d_s8", dims + tail, [],
                                    [x, wq, b, mult, shift, np.zeros((n, oh, ow, c), np.int8)]), ref))
        if oh * ow <= h * w:
            refs.append(("xy", batch.add("depthwise_conv2d_s8_inplace", dims + tail, [],
                                         [x.copy(), wq, b, mult, shift, np.zeros(oh * ow, np.int8)]), ref))
        if n == 1:
            for r in range(oh):  # one output row per call over the input rows it reads (tt_stream.c's calls)
                top = r * s - pt
                r0, r1 = max(top, 0), min(top + 2, h - 1)
                rd = [1, r1 - r0 + 1, w, c, 1, ow, c, 3, 3, s, s, 1, 1, pt - r * s + r0, pl, 1]
                refs.append(("y", batch.add("depthwise_conv2d_s8", rd + tail, [],
                                            [np.ascontiguousarray(x[:, r0:r1 + 1]), wq, b, mult, shift,
                                             np.zeros((1, 1, ow, c), np.int8)]), ref[:, r:r + 1]))
    _assert_depthwise_both_builds(batch, dsp_driver, refs)


def test_grad_input_qw_equals_float_kernel_on_dequantized_weight(batch):
    """conv / depthwise input gradients reading int8 weights (blocked over input channels, tap lists) give the bits
    of the float kernels on the dequantized weight: the same float32 operations in the same order."""
    rng = np.random.default_rng(32)
    pairs = []
    for i in range(30):
        depthwise = i % 2 == 1
        dims, attrs, xs, ys, wshape = _wide_conv_geom(rng, depthwise)
        o = ys[3]
        dy = rng.standard_normal(ys).astype(np.float32)
        wq = rng.integers(-127, 128, size=wshape).astype(np.int8)
        scale = rng.uniform(0.001, 0.05, size=o).astype(np.float32)
        zp = rng.integers(-3, 4, size=o).astype(np.int32)
        axis = 3 if depthwise else 0
        shp = [1, 1, 1, 1]
        shp[axis] = o
        wf = ((wq.astype(np.int32) - zp.reshape(shp)).astype(np.float32) * scale.reshape(shp)).astype(np.float32)
        dx0 = np.zeros(xs, np.float32)
        if depthwise:
            a = batch.add("dw_conv2d_grad_input_qw_f32", dims, [], [dy, wq, scale, zp, dx0])
            f = batch.add("depthwise_conv2d_grad_input_f32", dims, [], [dy, wf, dx0])
            pairs.append((a, 4, f, 2, go.depthwise_conv2d_grad_input(dy, wf, xs, attrs)))
        else:
            k = int(rng.integers(0, xs[3] + 1))
            stale = wq.copy()
            stale[..., :k] = rng.integers(-127, 128, size=stale[..., :k].shape)
            a = batch.add("conv2d_grad_input_qw_f32", dims + [k], [],
                          [dy, stale, np.ascontiguousarray(wq[..., :k]), scale, zp, dx0])
            f = batch.add("conv2d_grad_input_f32", dims, [], [dy, wf, dx0])
            pairs.append((a, 5, f, 2, go.conv2d_grad_input(dy, wf, xs, attrs)))
    out = batch.run()
    for a, ia_, f, if_, ref in pairs:
        np.testing.assert_array_equal(out[a][ia_].view(np.uint32), out[f][if_].view(np.uint32))
        _assert_close(out[a][ia_], ref)


def _sparse_grad(rng, shape):
    """A gradient as ReLU-like masks leave it: a random share of +0 and -0 entries, some whole channels zero."""
    dy = rng.standard_normal(shape).astype(np.float32)
    dy[rng.random(shape) < rng.uniform(0.0, 0.95)] = 0.0
    dy[rng.random(shape) < 0.1] = -0.0
    dead = rng.random(shape[-1]) < 0.3
    dy[..., dead] = np.where(rng.random(dy[..., dead].shape) < 0.5, np.float32(0.0), np.float32(-0.0))
    return dy


def test_pointwise_gradients_skip_zero_gradients_bit_exactly(batch):
    """1x1 input and weight gradients of int8 operands skip +-0 gradient entries (whole chunks of up to 128 output
    channels / pixels included): the bits equal the float kernels' on the dequantized operand, which add every
    product. Wide layers, single pixels (the classifier's streamed positions) and weight-gradient channel ranges."""
    rng = np.random.default_rng(33)
    pairs = []
    for i in range(24):
        n = int(rng.integers(1, 3))
        h, w = (1, 1) if i % 4 == 0 else (int(rng.integers(1, 13)), int(rng.integers(1, 13)))
        c, o = int(rng.integers(1, 50)), int(rng.integers(1, 300))
        dims = [n, h, w, c, h, w, o, 1, 1, 1, 1, 1, 1, 0, 0, 1]
        xs, ys = (n, h, w, c), (n, h, w, o)
        dy = _sparse_grad(rng, ys)
        wq = rng.integers(-127, 128, size=(o, 1, 1, c)).astype(np.int8)
        scale = rng.uniform(0.001, 0.05, size=o).astype(np.float32)
        zp = (np.zeros(o) if i % 3 else rng.integers(-3, 4, size=o)).astype(np.int32)
        wf = ((wq.astype(np.int32) - zp.reshape(-1, 1, 1, 1)).astype(np.float32)
              * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        k = int(rng.integers(0, c + 1))
        a = batch.add("conv2d_grad_input_qw_f32", dims + [k], [],
                      [dy, wq, np.ascontiguousarray(wq[..., :k]), scale, zp, np.zeros(xs, np.float32)])
        f = batch.add("conv2d_grad_input_f32", dims, [], [dy, wf, np.zeros(xs, np.float32)])
        pairs.append((a, 5, f, 2, None))
        xq = rng.integers(-128, 128, size=xs).astype(np.int8)
        xsc, xz = np.float32(rng.uniform(0.005, 0.1)), int(rng.integers(-20, 21))
        xf = ((xq.astype(np.int32) - xz).astype(np.float32) * xsc).astype(np.float32)
        kw = int(rng.integers(1, c + 1))
        o0 = int(rng.integers(0, o))
        o1 = int(rng.integers(o0 + 1, o + 1))
        a = batch.add("conv2d_grad_weight_qx_f32", dims + [kw, o0, o1, xz], [],
                      [dy, xq, np.array([xsc], np.float32), np.zeros((o1 - o0, 1, 1, kw), np.float32)])
        f = batch.add("conv2d_grad_weight_f32", dims + [kw], [], [dy, xf, np.zeros((o, 1, 1, kw), np.float32)])
        pairs.append((a, 3, f, 2, (o0, o1)))
    out = batch.run()
    for a, ia_, f, if_, rows in pairs:
        got, want = out[a][ia_], out[f][if_]
        if rows is not None:
            want = want.reshape(-1, got.size // max(rows[1] - rows[0], 1))[rows[0]:rows[1]]
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32))


def test_pointwise_input_gradient_by_output_channel_ranges_bit_exactly(batch):
    """The 1x1 int8-weight input gradient over output-channel ranges (the positions stream: a block of channels of
    every position at a time, sums carried in dx) gives the bits of the float kernel on the dequantized weight,
    with or without the broadcast row hint (com: masked copies of it take the shared product, other values the
    plain one), split weights, zero points, +-0 gradients, many pixel blocks; and the fully connected int8-weight
    input gradient (the same sums) the float FC kernel's bits."""
    rng = np.random.default_rng(34)
    cases, refs = [], []
    for i in range(16):
        pixels = int(rng.choice([1, 2, 3, 5, 16, 17, 40]))
        c, o = int(rng.integers(1, 40)), int(rng.integers(1, 200))
        com = rng.standard_normal(o).astype(np.float32)
        mask = rng.random((pixels, o)) < rng.uniform(0.1, 1.0)
        dy = np.where(mask, com, np.float32(0.0)).astype(np.float32)
        if i % 3 == 1:   # some entries not copies of the row, some -0
            other = rng.random((pixels, o)) < 0.2
            dy[other] = rng.standard_normal(int(other.sum())).astype(np.float32)
            dy[rng.random((pixels, o)) < 0.05] = -0.0
        if i % 4 == 3:
            dy = _sparse_grad(rng, (pixels, o))
        wq = rng.integers(-127, 128, size=(o, 1, 1, c)).astype(np.int8)
        scale = rng.uniform(0.001, 0.05, size=o).astype(np.float32)
        zp = (np.zeros(o) if i % 2 else rng.integers(-3, 4, size=o)).astype(np.int32)
        wf = ((wq.astype(np.int32) - zp.reshape(-1, 1, 1, 1)).astype(np.float32)
              * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        k = int(rng.integers(0, c + 1))
        cuts = sorted({0, o, *(int(x) for x in rng.integers(1, o + 1, size=int(rng.integers(0, 4))))})
        ranges = [(o0, o1, [np.ascontiguousarray(dy[:, o0:o1]), com[o0:o1], wq, np.ascontiguousarray(wq[..., :k]),
                            scale, zp]) for o0, o1 in zip(cuts[:-1], cuts[1:])]
        dims = [1, pixels, 1, c, pixels, 1, o, 1, 1, 1, 1, 1, 1, 0, 0, 1]
        cases.append(dict(pixels=pixels, c=c, k=k, com=i % 2 == 0, ranges=ranges, dx=np.full((pixels, c), np.nan,
                                                                                            np.float32)))
        f = batch.add("conv2d_grad_input_f32", dims, [], [dy.reshape(1, pixels, 1, o), wf,
                                                           np.zeros((1, pixels, 1, c), np.float32)])
        fcq = batch.add("fc_grad_input_qw_f32", [pixels, c, o], [], [dy, wq, scale, zp,
                                                                      np.zeros((pixels, c), np.float32)])
        fcf = batch.add("fully_connected_grad_input_f32", [pixels, c, o], [],
                        [dy, wf.reshape(o, c), np.zeros((pixels, c), np.float32)])
        refs.append((f, fcq, fcf))
    out = batch.run()
    for (f, fcq, fcf) in refs:
        np.testing.assert_array_equal(out[fcq][4].view(np.uint32), out[fcf][2].view(np.uint32))
    # the ranges one after the other, dx carried from each call to the next (the first writes every element: NaN
    # would survive an element it left out)
    step = 0
    while any(step < len(cs["ranges"]) for cs in cases):
        ids = {}
        for n, cs in enumerate(cases):
            if step < len(cs["ranges"]):
                o0, o1, bufs = cs["ranges"][step]
                ids[n] = batch.add("conv2d_gi_qw_f32_oc", [cs["pixels"], cs["c"], o0, o1, cs["k"], int(cs["com"])],
                                   [], bufs + [cs["dx"]])
        res = batch.run()
        for n, a in ids.items():
            cases[n]["dx"] = res[a][6]
        step += 1
    for cs, (f, _, _) in zip(cases, refs):
        np.testing.assert_array_equal(cs["dx"].reshape(-1).view(np.uint32), out[f][2].reshape(-1).view(np.uint32))


@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_float_close(batch, depthwise):
    rng = np.random.default_rng(20 + depthwise)
    refs = []
    for _ in range(30):
        ints, floats, bufs, ref = _conv_case(rng, depthwise, False)
        refs.append((batch.add("depthwise_conv2d_f32" if depthwise else "conv2d_f32", ints, floats, bufs), ref))
    out = batch.run()
    for k, ref in refs:
        _assert_close(out[k][3], ref)


def _fc_case(rng, quantized: bool):
    rows, depth, o = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 12))
    act = str(rng.choice(ACTS))
    has_bias = rng.random() < 0.8
    attrs = dict(act=act, keep_num_dims=False)
    if quantized:
        sx, zx = _f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-128, 128))
        per_channel = rng.random() < 0.5
        sws = rng.uniform(0.002, 0.03, size=o if per_channel else 1).astype(np.float32)
        sy, zy = _f32s(rng.uniform(0.05, 1.0)), int(rng.integers(-60, 60))
        x = rng.integers(-128, 128, size=(rows, depth)).astype(np.int8)
        wq = rng.integers(-127, 128, size=(o, depth)).astype(np.int8)
        b = rng.integers(-3000, 3000, size=o).astype(np.int32) if has_bias else None
        xt = Tensor("x", [rows, depth], "int8", quant=_q(sx, zx))
        wt = Tensor("w", [o, depth], "int8", role="weight", quant=_q(sws, [0] * len(sws)), data=wq)
        bt = Tensor("b", [o], "int32", role="bias", quant=_q(sx * sws, [0] * len(sws)), data=b) if has_bias else None
        yt = Tensor("y", [rows, o], "int8", quant=_q(sy, zy))
        ref = _run("fully_connected", [xt, wt, bt], yt, attrs, {"x": x})
        pairs = [ia.quantize_multiplier(float(sx) * float(s) / float(sy)) for s in sws]
        lo, hi = ia.activation_range(act, sy, zy)
        ints = [rows, depth, o, zx, zy, lo, hi, int(per_channel)]
        bufs = [x, wq, b, np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32),
                np.zeros((rows, o), np.int8)]
        return ints, [], bufs, ref
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    wf = rng.standard_normal((o, depth)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if has_bias else None
    xt = Tensor("x", [rows, depth], "float32")
    wt = Tensor("w", [o, depth], "float32", role="weight", data=wf)
    bt = Tensor("b", [o], "float32", role="bias", data=b) if has_bias else None
    yt = Tensor("y", [rows, o], "float32")
    ref = _run("fully_connected", [xt, wt, bt], yt, attrs, {"x": x})
    return [rows, depth, o], list(FLOAT_BOUNDS[act]), [x, wf, b, np.zeros((rows, o), np.float32)], ref


@pytest.mark.parametrize("quantized", [True, False])
def test_fully_connected(batch, dsp_driver, sse_driver, quantized):
    rng = np.random.default_rng(30 + quantized)
    refs = []
    for _ in range(40):
        ints, floats, bufs, ref = _fc_case(rng, quantized)
        refs.append((batch.add("fully_connected_s8" if quantized else "fully_connected_f32", ints, floats, bufs), ref))
    out = batch.run(keep=quantized)
    out_dsp = batch.run(driver=dsp_driver, keep=True) if quantized else None
    out_sse = batch.run(driver=sse_driver) if quantized else None
    for k, ref in refs:
        if quantized:
            np.testing.assert_array_equal(out[k][5], ref)
            np.testing.assert_array_equal(out_dsp[k][5], ref)
            np.testing.assert_array_equal(out_sse[k][5], ref)
        else:
            _assert_close(out[k][3], ref)


def test_add(batch, dsp_driver):
    """int8 and float32 add against the executor; the DSP build's int8 add (its one-SMMLAR rescalings, the ACLE
    emulated on the host) gives the same bytes."""
    rng = np.random.default_rng(40)
    refs = []
    every = np.arange(-128, 128, dtype=np.int8)
    for case in range(34):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 8))]
        act = str(rng.choice(ACTS))
        s1, s2, so = (_f32s(rng.uniform(0.005, 0.2)) for _ in range(3))
        z1, z2, zo = (int(rng.integers(-128, 128)) for _ in range(3))
        a = rng.integers(-128, 128, size=shape).astype(np.int8)
        b = rng.integers(-128, 128, size=shape).astype(np.int8)
        if case >= 30:  # every pair of int8 operands (and equal scales once: both shifts 0)
            shape = [1, 256, 256, 1]
            a, b = np.repeat(every, 256).reshape(shape), np.tile(every, 256).reshape(shape)
            s2 = s1 if case == 30 else s2
        ta, tb = Tensor("a", shape, "int8", quant=_q(s1, z1)), Tensor("b", shape, "int8", quant=_q(s2, z2))
        ref = _run("add", [ta, tb], Tensor("y", shape, "int8", quant=_q(so, zo)), {"act": act}, {"a": a, "b": b})
        # add.cc Prepare, as executor._add computes it.
        twice_max = float(np.float32(2) * np.float32(max(s1, s2)))
        m1, sh1 = ia.quantize_multiplier_smaller_than_one_exp(s1 / twice_max)
        m2, sh2 = ia.quantize_multiplier_smaller_than_one_exp(s2 / twice_max)
        mo, sho = ia.quantize_multiplier_smaller_than_one_exp(
            twice_max / float(np.float32((1 << 20) * np.float32(so))))
        lo, hi = ia.activation_range(act, so, zo)
        ints = [z1, z2, zo, 20, m1, sh1, m2, sh2, mo, sho, lo, hi, a.size]
        refs.append((batch.add("add_s8", ints, [], [a, b, np.zeros_like(a)]), ref, 2))
        af, bf = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
        reff = _run("add", [Tensor("a", shape, "float32"), Tensor("b", shape, "float32")],
                    Tensor("y", shape, "float32"), {"act": act}, {"a": af, "b": bf})
        refs.append((batch.add("add_f32", [af.size], FLOAT_BOUNDS[act], [af, bf, np.zeros_like(af)]), reff, 2))
    out_dsp = batch.run(driver=dsp_driver, keep=True)
    out = batch.run()
    for k, ref, j in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out_dsp[k][j], ref)
    for k, ref, j in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][j], ref)
        else:
            _assert_close(out[k][j], ref)


def _pool_geometry(rng):
    n, h, w, c = int(rng.integers(1, 3)), int(rng.integers(2, 9)), int(rng.integers(2, 9)), int(rng.integers(1, 5))
    fh, fw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    sh, sw = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    padding = "same" if (rng.random() < 0.5 or fh > h or fw > w) else "valid"
    oh, pt = out_size_and_pad(padding, h, fh, sh)
    ow, pl = out_size_and_pad(padding, w, fw, sw)
    attrs = dict(filter_h=fh, filter_w=fw, stride_h=sh, stride_w=sw, padding=padding)
    return (n, h, w, c), (oh, ow), [n, h, w, c, oh, ow, fh, fw, sh, sw, pt, pl], attrs


@pytest.mark.parametrize("kind", ["average_pool2d", "max_pool2d"])
def test_pooling(batch, kind):
    rng = np.random.default_rng(50 + len(kind))
    refs = []
    for _ in range(40):
        (n, h, w, c), (oh, ow), dims, attrs = _pool_geometry(rng)
        act = str(rng.choice(ACTS))
        attrs["act"] = act
        s, z = _f32s(rng.uniform(0.01, 0.2)), int(rng.integers(-100, 100))
        x = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
        ref = _run(kind, [Tensor("x", [n, h, w, c], "int8", quant=_q(s, z))],
                   Tensor("y", [n, oh, ow, c], "int8", quant=_q(s, z)), attrs, {"x": x})
        lo, hi = ia.activation_range(act, s, z)
        refs.append((batch.add(kind + "_s8", dims + [lo, hi], [], [x, np.zeros((n, oh, ow, c), np.int8)]), ref))
        xf = rng.standard_normal((n, h, w, c)).astype(np.float32) * 4
        reff = _run(kind, [Tensor("x", [n, h, w, c], "float32")], Tensor("y", [n, oh, ow, c], "float32"), attrs,
                    {"x": xf})
        refs.append((batch.add(kind + "_f32", dims, FLOAT_BOUNDS[act],
                               [xf, np.zeros((n, oh, ow, c), np.float32)]), reff))
    out = batch.run()
    for k, ref in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][1], ref)
        else:
            _assert_close(out[k][1], ref)


def _mean_params(count, s_in, z_in, s_out, z_out):
    """executor._quantized_mean's parameter folding."""
    mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
    extra = min(count.bit_length() - 1, 32, 31 + shift)
    mult = int((mult << extra) // count) if extra >= 0 else int((mult >> -extra) // count)
    return mult, shift - extra


def test_mean(batch):
    rng = np.random.default_rng(60)
    refs = []
    for _ in range(30):
        n, h, w, c = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        si, so = _f32s(rng.uniform(0.01, 0.2)), _f32s(rng.uniform(0.005, 0.2))
        zi, zo = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
        x = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
        axes = Tensor("axes", [2], "int32", role="constant", data=np.array([1, 2], np.int32))
        ref = _run("mean", [Tensor("x", [n, h, w, c], "int8", quant=_q(si, zi)), axes],
                   Tensor("y", [n, c], "int8", quant=_q(so, zo)), {"keep_dims": False}, {"x": x})
        m, s = _mean_params(h * w, si, zi, so, zo)
        refs.append((batch.add("mean_s8", [zi, zo, m, s, n, h, w, c], [], [x, np.zeros((n, c), np.int8)]), ref))
        xf = rng.standard_normal((n, h, w, c)).astype(np.float32)
        reff = _run("mean", [Tensor("x", [n, h, w, c], "float32"), axes], Tensor("y", [n, c], "float32"),
                    {"keep_dims": False}, {"x": xf})
        refs.append((batch.add("mean_f32", [n, h, w, c], [], [xf, np.zeros((n, c), np.float32)]), reff))
    out = batch.run()
    for k, ref in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][1], ref)
        else:
            _assert_close(out[k][1], ref)


def test_softmax(batch):
    rng = np.random.default_rng(70)
    refs = []
    for i in range(40):
        rows, depth = int(rng.integers(1, 5)), int(rng.integers(1, 40))
        beta = 1.0 if i % 2 else _f32s(rng.uniform(0.3, 2.0))
        si, zi = _f32s(rng.uniform(0.005, 0.5)), int(rng.integers(-128, 128))
        x = rng.integers(-128, 128, size=(rows, depth)).astype(np.int8)
        if i % 5 == 0:
            x[:, : depth // 2] = 127  # ties of the row max
        ref = _run("softmax", [Tensor("x", [rows, depth], "int8", quant=_q(si, zi))],
                   Tensor("y", [rows, depth], "int8", quant=_q(1 / 256, -128)), {"beta": beta}, {"x": x})
        mult, lshift, diff_min = ia.softmax_params(beta, si)
        refs.append((batch.add("softmax_s8", [rows, depth, mult, lshift, diff_min], [],
                               [x, np.zeros_like(x)]), ref))
        xf = (rng.standard_normal((rows, depth)) * 5).astype(np.float32)
        reff = _run("softmax", [Tensor("x", [rows, depth], "float32")], Tensor("y", [rows, depth], "float32"),
                    {"beta": beta}, {"x": xf})
        refs.append((batch.add("softmax_f32", [rows, depth], [beta], [xf, np.zeros_like(xf)]), reff))
    out = batch.run()
    for k, ref in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][1], ref)
        else:
            _assert_close(out[k][1], ref)


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_relu(batch, kind):
    rng = np.random.default_rng(80 + len(kind))
    refs = []
    for _ in range(20):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 50))]
        si, so = _f32s(rng.uniform(0.005, 0.2)), _f32s(rng.uniform(0.005, 0.2))
        zi, zo = int(rng.integers(-128, 128)), int(rng.integers(-128, 0))
        x = rng.integers(-128, 128, size=shape).astype(np.int8)
        ref = _run(kind, [Tensor("x", shape, "int8", quant=_q(si, zi))], Tensor("y", shape, "int8", quant=_q(so, zo)),
                   {}, {"x": x})
        m, s = ia.quantize_multiplier(float(si) / float(so))
        qlo, qhi = ia.relu_op_range(0.0, 6.0 if kind == "relu6" else None, so, zo)
        refs.append((batch.add("relu_s8", [x.size, zi, zo, m, s, qlo, qhi], [], [x, np.zeros_like(x)]), ref))
        xf = (rng.standard_normal(shape) * 5).astype(np.float32)
        reff = _run(kind, [Tensor("x", shape, "float32")], Tensor("y", shape, "float32"), {}, {"x": xf})
        refs.append((batch.add("clamp_f32", [xf.size], FLOAT_BOUNDS[kind], [xf, np.zeros_like(xf)]), reff))
    out = batch.run()
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][1], ref)


def test_quantize_dequantize(batch):
    rng = np.random.default_rng(90)
    refs = []
    for _ in range(20):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 60))]
        s, z = _f32s(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
        xf = (rng.standard_normal(shape) * 10).astype(np.float32)
        xf.flat[:5] = (np.arange(5) + 0.5) * np.float32(s)  # exact-ish ties
        ref = _run("quantize", [Tensor("x", shape, "float32")], Tensor("y", shape, "int8", quant=_q(s, z)), {},
                   {"x": xf})
        refs.append((batch.add("quantize_f32_s8", [xf.size, z], [s], [xf, np.zeros(shape, np.int8)]), ref))
        s2, z2 = _f32s(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
        x = rng.integers(-128, 128, size=shape).astype(np.int8)
        ref = _run("quantize", [Tensor("x", shape, "int8", quant=_q(s, z))],
                   Tensor("y", shape, "int8", quant=_q(s2, z2)), {}, {"x": x})
        m, sh = ia.quantize_multiplier(float(s) / float(s2))
        refs.append((batch.add("requantize_s8", [x.size, z, z2, m, sh], [], [x, np.zeros_like(x)]), ref))
        ref = _run("dequantize", [Tensor("x", shape, "int8", quant=_q(s, z))], Tensor("y", shape, "float32"), {},
                   {"x": x})
        refs.append((batch.add("dequantize_s8_f32", [x.size, z], [s], [x, np.zeros(shape, np.float32)]), ref))
    # Per channel (weights along axis 0 and along the last axis).
    for axis in (0, 3):
        shape = [4, 2, 3, 5]
        ch = shape[axis]
        sc = rng.uniform(0.001, 0.1, size=ch).astype(np.float32)
        zp = rng.integers(-5, 5, size=ch).astype(np.int32)
        w = rng.integers(-127, 128, size=shape).astype(np.int8)
        wt = Tensor("w", shape, "int8", role="weight", quant=_q(sc, zp, axis), data=w)
        g = Graph(tensors={"w": wt, "y": Tensor("y", shape, "float32")}, ops=[Op("dequantize", ["w"], ["y"], {})],
                  inputs=[], outputs=["y"])
        ref = run_graph(g, {})["y"]
        outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
        refs.append((batch.add("dequantize_per_channel_s8_f32", [outer, ch, inner], [],
                               [sc, zp, w, np.zeros(shape, np.float32)]), ref))
    out = batch.run()
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][-1], ref)


def test_pad_concat_copy(batch):
    rng = np.random.default_rng(100)
    refs = []
    for _ in range(15):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 5))]
        pads = np.zeros((4, 2), np.int32)
        pads[1:] = rng.integers(0, 3, size=(3, 2))
        s, z = _f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-128, 128))
        x = rng.integers(-128, 128, size=shape).astype(np.int8)
        pt = Tensor("p", [4, 2], "int32", role="constant", data=pads)
        oshape = [shape[d] + int(pads[d].sum()) for d in range(4)]
        ref = _run("pad", [Tensor("x", shape, "int8", quant=_q(s, z)), pt],
                   Tensor("y", oshape, "int8", quant=_q(s, z)), {}, {"x": x})
        refs.append((batch.add("pad_s8", shape + list(pads.reshape(-1)) + [z], [], [x, np.zeros(oshape, np.int8)]),
                     ref, 1))
        xf = rng.standard_normal(shape).astype(np.float32)
        reff = _run("pad", [Tensor("x", shape, "float32"), pt], Tensor("y", oshape, "float32"), {}, {"x": xf})
        refs.append((batch.add("pad_f32", shape + list(pads.reshape(-1)), [0.0], [xf, np.zeros(oshape, np.float32)]),
                     reff, 1))
        # concatenation along a random non-batch axis, 1..3 inputs, sometimes with differing quant params
        axis = int(rng.integers(1, 4))
        k = int(rng.integers(1, 4))
        shapes = []
        for _ in range(k):
            sh_ = list(shape)
            sh_[axis] = int(rng.integers(1, 4))
            shapes.append(sh_)
        oshape = list(shape)
        oshape[axis] = sum(sh_[axis] for sh_ in shapes)
        act = str(rng.choice(ACTS))
        so, zo = _f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-100, 100))
        mixed = rng.random() < 0.5
        qs = [(_f32s(rng.uniform(0.01, 0.1)), int(rng.integers(-100, 100))) if mixed and rng.random() < 0.7
              else (so, zo) for _ in range(k)]
        xs = [rng.integers(-128, 128, size=sh_).astype(np.int8) for sh_ in shapes]
        ins = [Tensor(f"x{i}", sh_, "int8", quant=_q(*q)) for i, (sh_, q) in enumerate(zip(shapes, qs))]
        ref = _run("concatenation", ins, Tensor("y", oshape, "int8", quant=_q(so, zo)), {"axis": axis, "act": act},
                   {f"x{i}": x_ for i, x_ in enumerate(xs)})
        outer = int(np.prod(shape[:axis]))
        inner = [int(np.prod(sh_[axis:])) for sh_ in shapes]
        lo, hi = ia.activation_range(act, so, zo)
        use_q = int(mixed or act != "none")
        refs.append((batch.add("concatenation_s8", [k, outer, use_q, zo, lo, hi] + inner, [so],
                               [np.array([q[0] for q in qs], np.float32), np.array([q[1] for q in qs], np.int32)]
                               + xs + [np.zeros(oshape, np.int8)]), ref, 2 + k))
        xfs = [rng.standard_normal(sh_).astype(np.float32) for sh_ in shapes]
        reff = _run("concatenation", [Tensor(f"x{i}", sh_, "float32") for i, sh_ in enumerate(shapes)],
                    Tensor("y", oshape, "float32"), {"axis": axis, "act": act},
                    {f"x{i}": x_ for i, x_ in enumerate(xfs)})
        refs.append((batch.add("concatenation_f32", [k, outer] + inner, FLOAT_BOUNDS[act],
                               xfs + [np.zeros(oshape, np.float32)]), reff, k))
        refs.append((batch.add("copy_s8", [x.size], [], [x, np.zeros_like(x)]), x, 1))
        refs.append((batch.add("copy_f32", [xf.size], [], [xf, np.zeros_like(xf)]), xf, 1))
    out = batch.run()
    for k, ref, j in refs:
        np.testing.assert_array_equal(out[k][j], ref)


def test_out_size_and_pad(batch):
    refs = []
    for same in (0, 1):
        for n in range(1, 9):
            for f in range(1, 4):
                for s in (1, 2, 3):
                    for d in (1, 2):
                        if not same and (f - 1) * d + 1 > n:
                            continue
                        ref = out_size_and_pad("same" if same else "valid", n, f, s, d)
                        refs.append((batch.add("out_size_and_pad", [same, n, f, s, d], [],
                                               [np.zeros(2, np.int32)]), ref))
    out = batch.run()
    for k, ref in refs:
        assert tuple(out[k][0]) == ref


# ---- broadcasting binary ops, activations, strided slice (kernels_c/ops/) -------------------------------------

def _bcast_ints(out_shape, *operands) -> list[int]:
    """tt_broadcast as ints: the output's rank-4 shape, then each operand's element strides (numpy broadcasting:
    shapes aligned to the right, stride 0 along an axis of extent 1)."""
    def pad(sh):
        sh = [int(d) for d in sh]
        return [1] * (4 - len(sh)) + sh
    ints = pad(out_shape)
    for sh in operands:
        p = pad(sh)
        st, acc = [0] * 4, 1
        for d in range(3, -1, -1):
            st[d] = acc if p[d] != 1 else 0
            acc *= p[d]
        ints += st
    return ints


def _bcast_shapes(rng):
    """(feed shape with the batch, constant shape) pairs that broadcast, and the output shape."""
    n, h, w, c = (int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 6)))
    full = [n, h, w, c]
    kind = int(rng.integers(0, 6))
    a = list(full)
    b = {0: [c], 1: [1, 1, c], 2: [h, 1, c], 3: [1], 4: list(full), 5: [h, w, 1]}[kind]
    if kind == 4 and rng.random() < 0.5:
        a[2] = 1  # both operands broadcast: a over W, the output takes W from b
        b = [1, h, w, c]
    out = list(np.broadcast_shapes(tuple(a), tuple(b)))
    return a, b, out


def _const(name, data, dtype, quant=None):
    return Tensor(name, list(np.shape(data)), dtype, role="constant", quant=quant, data=data)


def test_add_sub_mul_broadcast(batch):
    """int8 ADD (broadcast), SUB, MUL bit-exact with the executor (TFLite Micro's multipliers); either operand may be
    the broadcast constant; float within 1e-5."""
    rng = np.random.default_rng(110)
    refs = []
    for t in range(60):
        kind = ("add", "sub", "mul")[t % 3]
        fshape, cshape, oshape = _bcast_shapes(rng)
        act = str(rng.choice(ACTS))
        swap = rng.random() < 0.4  # the constant is the first operand
        s1, s2, so = (_f32s(rng.uniform(0.005, 0.2)) for _ in range(3))
        if kind == "mul":
            so = _f32s(s1 * s2 * rng.uniform(20, 200))
        z1, z2, zo = (int(rng.integers(-128, 128)) for _ in range(3))
        xf = rng.integers(-128, 128, size=fshape).astype(np.int8)
        xc = rng.integers(-128, 128, size=cshape).astype(np.int8)
        tf, tc = Tensor("x", fshape, "int8", quant=_q(s1, z1)), _const("c", xc, "int8", _q(s2, z2))
        ins = [tc, tf] if swap else [tf, tc]
        (sa, za), (sb, zb) = ((s2, z2), (s1, z1)) if swap else ((s1, z1), (s2, z2))
        a, b = (xc, xf) if swap else (xf, xc)
        ref = _run(kind, ins, Tensor("y", oshape, "int8", quant=_q(so, zo)), {"act": act}, {"x": xf})
        bc = _bcast_ints(oshape, a.shape, b.shape)
        lo, hi = ia.activation_range(act, so, zo)
        if kind == "mul":
            m, sh = ia.quantize_multiplier(ia.f32(sa) * ia.f32(sb) / ia.f32(so))
            refs.append((batch.add("mul_s8", [za, zb, zo, m, sh, lo, hi] + bc, [], [a, b, np.zeros(oshape, np.int8)]),
                         ref))
        else:
            twice_max = float(np.float32(2) * np.float32(max(sa, sb)))
            m1, sh1 = ia.quantize_multiplier_smaller_than_one_exp(sa / twice_max)
            m2, sh2 = ia.quantize_multiplier_smaller_than_one_exp(sb / twice_max)
            mo, sho = ia.quantize_multiplier_smaller_than_one_exp(
                twice_max / float(np.float32((1 << 20) * np.float32(so))))
            ints = [za, zb, zo, 20, m1, sh1, m2, sh2, mo, sho, lo, hi] + bc
            refs.append((batch.add("sub_s8" if kind == "sub" else "add_s8_broadcast", ints, [],
                                   [a, b, np.zeros(oshape, np.int8)]), ref))
        ff = rng.standard_normal(fshape).astype(np.float32) * 3
        fc = rng.standard_normal(cshape).astype(np.float32) * 3
        tf, tc = Tensor("x", fshape, "float32"), _const("c", fc, "float32")
        reff = _run(kind, [tc, tf] if swap else [tf, tc], Tensor("y", oshape, "float32"), {"act": act}, {"x": ff})
        af, bf = (fc, ff) if swap else (ff, fc)
        name = {"add": "add_f32_broadcast", "sub": "sub_f32", "mul": "mul_f32"}[kind]
        refs.append((batch.add(name, bc, FLOAT_BOUNDS[act], [af, bf, np.zeros(oshape, np.float32)]), reff))
    out = batch.run()
    for k, ref in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][2], ref)
        else:
            _assert_close(out[k][2], ref)


@pytest.mark.parametrize("kind", ["logistic", "tanh"])
def test_logistic_tanh(batch, kind):
    """int8: every input value, many input scales (gemmlowp fixed point, saturation radius), bit-exact; float:
    tt_expf / tt_tanhf within 1e-5 of numpy, from tiny to saturating inputs."""
    rng = np.random.default_rng(120 + len(kind))
    refs = []
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    out_q = (1 / 256, -128) if kind == "logistic" else (1 / 128, 0)
    for t in range(30):
        si = _f32s(10 ** rng.uniform(-3.5, 0.5)) if t else _f32s(0.04658001288771629)
        zi = int(rng.integers(-128, 128))
        ref = _run(kind, [Tensor("x", [1, 256], "int8", quant=_q(si, zi))],
                   Tensor("y", [1, 256], "int8", quant=_q(*out_q)), {}, {"x": x})
        m, ls, radius = ia.logistic_tanh_params(si)
        refs.append((batch.add(kind + "_s8", [256, zi, m, ls, radius], [], [x, np.zeros_like(x)]), ref))
    for t in range(10):
        xf = (rng.standard_normal((2, 200)) * 10.0 ** (t % 5 - 3)).astype(np.float32)  # 1e-3 .. 10
        xf[0, :8] = [0.0, -0.0, 1e-8, -3e-5, 20.0, -20.0, 16.7, -9.5]
        reff = _run(kind, [Tensor("x", [2, 200], "float32")], Tensor("y", [2, 200], "float32"), {}, {"x": xf})
        refs.append((batch.add(kind + "_f32", [xf.size], [], [xf, np.zeros_like(xf)]), reff))
    out = batch.run()
    for k, ref in refs:
        if ref.dtype == np.int8:
            np.testing.assert_array_equal(out[k][1], ref)
        else:
            np.testing.assert_allclose(out[k][1], ref, rtol=1e-5, atol=1e-30)


def test_hard_swish_leaky_relu(batch):
    rng = np.random.default_rng(130)
    refs = []
    x = np.arange(-128, 128, dtype=np.int8).reshape(2, 128)
    for t in range(30):
        si = _f32s(rng.uniform(0.005, 0.3))
        so = _f32s(si * rng.uniform(0.2, 2.0))
        zi, zo = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
        ref = _run("hard_swish", [Tensor("x", [2, 128], "int8", quant=_q(si, zi))],
                   Tensor("y", [2, 128], "int8", quant=_q(so, zo)), {}, {"x": x})
        om, oe, rm, re_ = ia.hard_swish_params(si, so)
        refs.append((batch.add("hard_swish_s8", [256, zi, zo, om, oe, rm, re_], [], [x, np.zeros_like(x)]), ref))
        alpha = _f32s(rng.choice([0.2, 0.01, rng.uniform(-0.5, 1.5)]))
        ref = _run("leaky_relu", [Tensor("x", [2, 128], "int8", quant=_q(si, zi))],
                   Tensor("y", [2, 128], "int8", quant=_q(so, zo)), {"alpha": alpha}, {"x": x})
        mi, shi = ia.quantize_multiplier(ia.f32(np.float32(si) / np.float32(so)))
        ma, sha = ia.quantize_multiplier(ia.f32(np.float32(np.float32(si) * np.float32(alpha)) / np.float32(so)))
        refs.append((batch.add("leaky_relu_s8", [256, zi, zo, mi, shi, ma, sha], [], [x, np.zeros_like(x)]), ref))
        xf = (rng.standard_normal((3, 40)) * 4).astype(np.float32)
        xf[0, :4] = [-3.0, 3.0, 0.0, -0.0]
        reff = _run("hard_swish", [Tensor("x", [3, 40], "float32")], Tensor("y", [3, 40], "float32"), {}, {"x": xf})
        refs.append((batch.add("hard_swish_f32", [xf.size], [], [xf, np.zeros_like(xf)]), reff))
        reff = _run("leaky_relu", [Tensor("x", [3, 40], "float32")], Tensor("y", [3, 40], "float32"),
                    {"alpha": alpha}, {"x": xf})
        refs.append((batch.add("leaky_relu_f32", [xf.size], [alpha], [xf, np.zeros_like(xf)]), reff))
    out = batch.run()
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][1], ref)  # float too: the same float32 operations in the same order


def test_prelu(batch):
    rng = np.random.default_rng(140)
    refs = []
    for _ in range(30):
        n, h, w, c = int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 6))
        ashape = [[1, 1, c], [h, w, c], [c], [1]][int(rng.integers(0, 4))]
        si, sa, so = _f32s(rng.uniform(0.01, 0.1)), _f32s(rng.uniform(0.002, 0.01)), _f32s(rng.uniform(0.01, 0.1))
        zi, za, zo = int(rng.integers(-128, 128)), int(rng.integers(-20, 20)), int(rng.integers(-128, 128))
        x = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
        al = rng.integers(-128, 128, size=ashape).astype(np.int8)
        ref = _run("prelu", [Tensor("x", [n, h, w, c], "int8", quant=_q(si, zi)), _const("a", al, "int8", _q(sa, za))],
                   Tensor("y", [n, h, w, c], "int8", quant=_q(so, zo)), {}, {"x": x})
        m1, sh1 = ia.quantize_multiplier(ia.f32(np.float32(si) / np.float32(so)))
        m2, sh2 = ia.quantize_multiplier(ia.f32(np.float32(np.float32(si) * np.float32(sa)) / np.float32(so)))
        bc = _bcast_ints(x.shape, x.shape, al.shape)
        refs.append((batch.add("prelu_s8", [zi, za, zo, m1, sh1, m2, sh2] + bc, [], [x, al, np.zeros_like(x)]), ref))
        xf = rng.standard_normal((n, h, w, c)).astype(np.float32)
        af = rng.uniform(-0.5, 0.8, size=ashape).astype(np.float32)
        reff = _run("prelu", [Tensor("x", [n, h, w, c], "float32"), _const("a", af, "float32")],
                    Tensor("y", [n, h, w, c], "float32"), {}, {"x": xf})
        refs.append((batch.add("prelu_f32", bc, [], [xf, af, np.zeros_like(xf)]), reff))
    out = batch.run()
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][2], ref)


def _strided_case(rng):
    """A random strided slice of a rank-4 tensor: attrs as the reader resolves them (axis 0 whole; negative steps
    with stop -1 meaning past index 0), the tt_strided_slice_params ints, the output shape with and without the
    shrunk axes."""
    shape = [int(rng.integers(1, 3))] + [int(rng.integers(1, 7)) for _ in range(3)]
    starts, stops, strides, ext = [0], [shape[0]], [1], [shape[0]]
    shrink = []
    for d in range(1, 4):
        step = int(rng.choice([1, 1, 2, 3, -1, -2]))
        if rng.random() < 0.2:
            i = int(rng.integers(0, shape[d]))
            a, b, step = i, i + 1, 1
            shrink.append(d)
        elif step > 0:
            a = int(rng.integers(0, shape[d]))
            b = int(rng.integers(a + 1, shape[d] + 1))
        else:
            a = int(rng.integers(0, shape[d]))
            b = int(rng.integers(-1, a))
        starts.append(a)
        stops.append(b)
        strides.append(step)
        ext.append(len(range(a, b, step)))
    attrs = dict(starts=starts, stops=stops, strides=strides)
    oshape = [e for d, e in enumerate(ext) if d not in shrink]
    ints = shape + ext + starts + strides
    return shape, ext, oshape, attrs, ints


def test_strided_slice(batch):
    rng = np.random.default_rng(150)
    refs = []
    for _ in range(40):
        shape, _, oshape, attrs, ints = _strided_case(rng)
        x = rng.integers(-128, 128, size=shape).astype(np.int8)
        ref = _run("strided_slice", [Tensor("x", shape, "int8", quant=_q(0.1, 3))],
                   Tensor("y", oshape, "int8", quant=_q(0.1, 3)), attrs, {"x": x})
        refs.append((batch.add("strided_slice_s8", ints, [], [x, np.zeros(oshape, np.int8)]), ref))
        xf = rng.standard_normal(shape).astype(np.float32)
        reff = _run("strided_slice", [Tensor("x", shape, "float32")], Tensor("y", oshape, "float32"), attrs,
                    {"x": xf})
        refs.append((batch.add("strided_slice_f32", ints, [], [xf, np.zeros(oshape, np.float32)]), reff))
    out = batch.run()
    for k, ref in refs:
        np.testing.assert_array_equal(out[k][1], ref)


# ---- float32 backward (grad_ops) ------------------------------------------------------------------------------

def _conv_geom_case(rng, depthwise: bool):
    n = int(rng.integers(1, 3))
    h, w, c = int(rng.integers(3, 9)), int(rng.integers(3, 9)), int(rng.integers(1, 6))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    sh, sw = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    dh, dw = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) if rng.random() < 0.4 else (1, 1)
    padding = "same" if rng.random() < 0.5 else "valid"
    if (h - (kh - 1) * dh) < 1 or (w - (kw - 1) * dw) < 1:
        padding = "same"
    mult = int(rng.integers(1, 4)) if depthwise else 1
    o = c * mult if depthwise else int(rng.integers(1, 7))
    oh, pt = out_size_and_pad(padding, h, kh, sh, dh)
    ow, pl = out_size_and_pad(padding, w, kw, sw, dw)
    attrs = dict(stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, padding=padding)
    dims = [n, h, w, c, oh, ow, o, kh, kw, sh, sw, dh, dw, pt, pl, mult]
    wshape = (1, kh, kw, o) if depthwise else (o, kh, kw, c)
    return dims, attrs, (n, h, w, c), (n, oh, ow, o), wshape


@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_backward(batch, depthwise):
    rng = np.random.default_rng(200 + depthwise)
    pre = "depthwise_conv2d" if depthwise else "conv2d"
    gi = go.depthwise_conv2d_grad_input if depthwise else go.conv2d_grad_input
    gw = go.depthwise_conv2d_grad_weight if depthwise else go.conv2d_grad_weight
    refs = []
    cases = [_conv_geom_case(rng, depthwise) for _ in range(30)]
    if depthwise:
        # filters taller than three rows with 3-wide rows (the one-channel input gradient's unrolled 3-wide rows
        # take at most three filter rows), with and without a depth multiplier
        for kh, mult in ((5, 1), (4, 2)):
            oh, pt = out_size_and_pad("same", 7, kh, 1, 1)
            ow, pl = out_size_and_pad("same", 6, 3, 1, 1)
            attrs = dict(stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="same")
            cases.append(([1, 7, 6, 3, oh, ow, 3 * mult, kh, 3, 1, 1, 1, 1, pt, pl, mult], attrs, (1, 7, 6, 3),
                          (1, oh, ow, 3 * mult), (1, kh, 3, 3 * mult)))
    for dims, attrs, xs, ys, wshape in cases:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(wshape).astype(np.float32)
        dy = rng.standard_normal(ys).astype(np.float32)
        k = int(rng.integers(1, xs[3] + 1))
        refs.append((batch.add(pre + "_grad_input_f32", dims, [], [dy, w, np.zeros(xs, np.float32)]),
                     gi(dy, w, xs, attrs)))
        ref_w = gw(dy, x, wshape, attrs, k)
        refs.append((batch.add(pre + "_grad_weight_f32", dims + [k], [], [dy, x, np.zeros(ref_w.shape, np.float32)]),
                     ref_w))
    out = batch.run()
    for i, ref in refs:
        _assert_close(out[i][2], ref)


def test_fully_connected_and_bias_backward(batch):
    rng = np.random.default_rng(210)
    refs = []
    for _ in range(30):
        rows, depth, o = int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(rng.integers(1, 12))
        k = int(rng.integers(1, depth + 1))
        x = rng.standard_normal((rows, depth)).astype(np.float32)
        w = rng.standard_normal((o, depth)).astype(np.float32)
        dy = rng.standard_normal((rows, o)).astype(np.float32)
        refs.append((batch.add("fully_connected_grad_input_f32", [rows, depth, o], [],
                               [dy, w, np.zeros_like(x)]), go.fully_connected_grad_input(dy, w, x.shape), 2))
        refs.append((batch.add("fully_connected_grad_weight_f32", [rows, depth, o, k], [],
                               [dy, x, np.zeros((o, k), np.float32)]),
                     go.fully_connected_grad_weight(dy, x, w.shape, k), 2))
        dy4 = rng.standard_normal((rows, 3, 2, o)).astype(np.float32)
        refs.append((batch.add("bias_grad_f32", [rows * 6, o], [], [dy4, np.zeros(o, np.float32)]),
                     go.bias_grad(dy4), 1))
    out = batch.run()
    for i, ref, j in refs:
        _assert_close(out[i][j], ref)


def test_pool_mean_backward(batch):
    rng = np.random.default_rng(220)
    refs = []
    for _ in range(30):
        (n, h, w, c), (oh, ow), dims, attrs = _pool_geometry(rng)
        dy = rng.standard_normal((n, oh, ow, c)).astype(np.float32)
        x = rng.integers(-4, 5, size=(n, h, w, c)).astype(np.float32)  # small integers: many ties
        refs.append((batch.add("average_pool2d_grad_f32", dims, [], [dy, np.zeros(x.shape, np.float32)]),
                     go.average_pool2d_grad(dy, x.shape, attrs), 1))
        refs.append((batch.add("max_pool2d_grad_f32", dims, [], [dy, x, np.zeros(x.shape, np.float32)]),
                     go.max_pool2d_grad(dy, x, attrs), 2))
        dym = rng.standard_normal((n, 1, 1, c)).astype(np.float32)
        refs.append((batch.add("mean_hw_grad_f32", [n, h, w, c], [], [dym, np.zeros(x.shape, np.float32)]),
                     go.mean_grad(dym, x.shape, [1, 2]), 1))
    out = batch.run()
    for i, ref, j in refs:
        _assert_close(out[i][j], ref)


def test_data_movement_and_activation_backward(batch):
    rng = np.random.default_rng(230)
    refs = []
    for _ in range(20):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 5))]
        pads = np.zeros((4, 2), np.int64)
        pads[1:] = rng.integers(0, 3, size=(3, 2))
        oshape = [shape[d] + int(pads[d].sum()) for d in range(4)]
        dy = rng.standard_normal(oshape).astype(np.float32)
        refs.append((batch.add("pad_grad_f32", shape + list(pads.reshape(-1)), [], [dy, np.zeros(shape, np.float32)]),
                     [go.pad_grad(dy, pads)], [1]))
        axis = int(rng.integers(1, 4))
        sizes = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4)))]
        cshape = list(shape)
        cshape[axis] = sum(sizes)
        dyc = rng.standard_normal(cshape).astype(np.float32)
        parts = go.concatenation_grad(dyc, sizes, axis)
        inner = [int(np.prod(p.shape[axis:])) for p in parts]
        refs.append((batch.add("concatenation_grad_f32", [len(sizes), int(np.prod(shape[:axis]))] + inner, [],
                               [dyc] + [np.zeros(p.shape, np.float32) for p in parts]),
                     parts, list(range(1, 1 + len(parts)))))
        for act in ("none", "relu", "relu6", "relu_n1_to_1"):
            y = rng.choice(np.array([-1, 0, 1, 6, 0.5, 3, -0.5, 7], np.float32), size=shape)
            g = rng.standard_normal(shape).astype(np.float32)
            refs.append((batch.add("act_grad_f32", [g.size, ACT_ENUM[act]], [], [g, y, np.zeros_like(g)]),
                         [go.act_grad(g, y, act)], [2]))
        rows, depth = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        beta = float(rng.choice([1.0, _f32s(0.7)]))
        z = rng.standard_normal((rows, depth)).astype(np.float32)
        ys = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        ys = ys.astype(np.float32)
        g = rng.standard_normal((rows, depth)).astype(np.float32)
        refs.append((batch.add("softmax_grad_f32", [rows, depth], [beta], [g, ys, np.zeros_like(g)]),
                     [go.softmax_grad(g, ys, beta)], [2]))
        gs = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
        refs.append((batch.add("accumulate_f32", [gs[0].size], [], [gs[0], gs[1]]), [go.grad_sum(gs)], [0]))
    out = batch.run()
    for i, ref, js in refs:
        for r, j in zip(ref, js):
            _assert_close(out[i][j], r)


def test_clamp_and_mask_gradients(batch):
    """int8_clamp_grad (lo < y_q < hi passes dy) and mask_grad (a 1-bit mask from any bit offset) vs the training
    executor's kernels, bit for bit; dz written over dy as the schedule runs them in place."""
    from tinytrain.stages import ops

    rng = np.random.default_rng(236)
    run_clamp = ops.get("int8_clamp_grad").run
    refs = []
    for _ in range(12):
        n = int(rng.integers(1, 90))
        lo, hi = sorted(int(v) for v in rng.integers(-128, 128, size=2))
        y = rng.integers(-128, 128, size=n).astype(np.int8)
        y[rng.integers(0, n, size=max(1, n // 4))] = lo  # the bounds themselves are masked
        dy = rng.standard_normal(n).astype(np.float32)
        op = Op("int8_clamp_grad", ["dy", "y"], ["dz"], {"lo": lo, "hi": hi})
        want = run_clamp(op, lambda j, vals=(dy, y): vals[j], None, None)[0]
        refs.append((batch.add("int8_clamp_grad_f32", [n, lo, hi], [], [dy, y, dy.copy()]), want, 2))
        off = int(rng.integers(0, 20))
        mask = rng.integers(0, 256, size=(off + n + 7) // 8).astype(np.uint8)
        mask[rng.random(mask.size) < 0.3] = 0      # whole bytes set / clear: the byte-at-a-time paths
        mask[rng.random(mask.size) < 0.3] = 255
        refs.append((batch.add("mask_grad_f32", [n, off], [], [mask, dy, dy.copy()]),
                     go.mask_grad(dy, mask, bit_offset=off), 2))
    out = batch.run()
    for i, want, j in refs:
        assert np.array_equal(out[i][j].view(np.uint32), np.asarray(want, np.float32).reshape(-1).view(np.uint32))


def test_elementwise_backward(batch):
    """unbroadcast (add/sub grads, both signs), mul_grad, the activation grads and the strided-slice scatter vs
    grad_ops, within 1e-5 (sums over broadcast axes run in another order than numpy's pairwise sums)."""
    rng = np.random.default_rng(235)
    refs = []
    for _ in range(30):
        fshape, cshape, oshape = _bcast_shapes(rng)
        dy = rng.standard_normal(oshape).astype(np.float32)
        for shp in (fshape, cshape):
            sign = float(rng.choice([1.0, -1.0]))
            ref = go.sub_grad(dy, shp, sign)
            size = int(np.prod(shp))
            refs.append((batch.add("unbroadcast_f32", [size] + _bcast_ints(oshape, shp), [sign],
                                   [dy, np.zeros(shp, np.float32)]), ref, 1))
            other = cshape if shp is fshape else fshape
            o = rng.standard_normal(other).astype(np.float32)
            ref = go.mul_grad(dy, o, shp)
            refs.append((batch.add("mul_grad_f32", [size] + _bcast_ints(oshape, shp, other), [],
                                   [dy, o, np.zeros(shp, np.float32)]), ref, 2))
        shape = list(oshape)
        g = rng.standard_normal(shape).astype(np.float32)
        y = rng.uniform(0, 1, size=shape).astype(np.float32)
        refs.append((batch.add("logistic_grad_f32", [g.size], [], [g, y, np.zeros_like(g)]), go.logistic_grad(g, y), 2))
        yt = rng.uniform(-1, 1, size=shape).astype(np.float32)
        refs.append((batch.add("tanh_grad_f32", [g.size], [], [g, yt, np.zeros_like(g)]), go.tanh_grad(g, yt), 2))
        x = rng.choice(np.array([-3, 3, 0, -4, 5, 1.5, -0.5, 2.9], np.float32), size=shape)
        x = np.where(rng.random(shape) < 0.5, x, rng.standard_normal(shape) * 4).astype(np.float32)
        refs.append((batch.add("hard_swish_grad_f32", [g.size], [], [g, x, np.zeros_like(g)]),
                     go.hard_swish_grad(g, x), 2))
        alpha = _f32s(rng.uniform(-0.5, 1.0))
        refs.append((batch.add("leaky_relu_grad_f32", [g.size], [alpha], [g, x, np.zeros_like(g)]),
                     go.leaky_relu_grad(g, x, alpha), 2))
        al = rng.uniform(-0.5, 0.8, size=shape[-1:] if rng.random() < 0.5 else [1] + shape[1:]).astype(np.float32)
        refs.append((batch.add("prelu_grad_f32", _bcast_ints(shape, shape, al.shape), [],
                               [g, x, al, np.zeros_like(g)]), go.prelu_grad(g, x, al), 3))
        xshape, ext, oshp, attrs, ints = _strided_case(rng)
        dys = rng.standard_normal(oshp).astype(np.float32)
        refs.append((batch.add("strided_slice_grad_f32", ints, [], [dys, np.full(xshape, np.nan, np.float32)]),
                     go.strided_slice_grad(dys, xshape, attrs["starts"], attrs["stops"], attrs["strides"]), 1))
    out = batch.run()
    for i, ref, j in refs:
        _assert_close(out[i][j], ref)


def test_losses(batch):
    rng = np.random.default_rng(240)
    refs = []
    for t in range(30):
        rows, depth = int(rng.integers(1, 5)), int(rng.integers(2, 20))
        z = (rng.standard_normal((rows, depth)) * (30 if t % 3 == 0 else 2)).astype(np.float32)  # large: stability
        lab = rng.integers(0, depth, size=rows).astype(np.int32)
        loss, d = go.softmax_ce_loss(z, lab)
        refs.append((batch.add("softmax_cross_entropy_f32", [rows, depth], [],
                               [z, lab, np.zeros_like(z), np.zeros(1, np.float32)]), loss, d))
        y = rng.standard_normal((rows, depth)).astype(np.float32)
        tg = rng.standard_normal((rows, depth)).astype(np.float32)
        loss, d = go.mse_loss(y, tg)
        refs.append((batch.add("mse_f32", [rows, depth], [], [y, tg, np.zeros_like(y), np.zeros(1, np.float32)]),
                     loss, d))
    out = batch.run()
    for i, loss, d in refs:
        _assert_close(out[i][2], d)
        _assert_close(out[i][3][0], loss)


# ---- optimizer updates -----------------------------------------------------------------------------------------

def _slice_case(rng):
    rows, cols = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    n = int(rng.integers(1, cols + 1))
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    g = rng.standard_normal((rows, n)).astype(np.float32)
    return rows, cols, n, w, g


def test_float_optimizers(batch):
    rng = np.random.default_rng(300)
    refs = []
    for t in range(20):
        scale = 1.0 if t % 2 else _f32s(1 / 8)
        wd = 0.0 if t % 3 else 1e-3
        rows, cols, n, w, g = _slice_case(rng)
        ref = w.copy()
        go.sgd_update(ref, g, 0.05, scale, wd, n)
        refs.append((batch.add("sgd_f32", [rows, cols, n], [_f32s(0.05), _f32s(scale), _f32s(wd)], [w, g]),
                     [ref], [0]))
        buf = rng.standard_normal((rows, n)).astype(np.float32)
        ref, rbuf = w.copy(), buf.copy()
        go.momentum_update(ref, g, rbuf, 0.05, 0.9, scale, wd, n)
        refs.append((batch.add("momentum_f32", [rows, cols, n], [_f32s(0.05), _f32s(0.9), _f32s(scale), _f32s(wd)],
                               [w, g, buf]), [ref, rbuf], [0, 2]))
        m = rng.standard_normal((rows, n)).astype(np.float32) * 0.1
        v = np.abs(rng.standard_normal((rows, n))).astype(np.float32) * 0.01
        step = int(rng.integers(1, 20))
        ref, rm, rv = w.copy(), m.copy(), v.copy()
        go.adam_update(ref, g, rm, rv, step, 1e-3, 0.9, 0.999, 1e-8, scale, wd, n)
        refs.append((batch.add("adam_f32", [rows, cols, n, step], [1e-3, 0.9, 0.999, 1e-8, _f32s(scale), _f32s(wd)],
                               [w, g, m, v]), [ref, rm, rv], [0, 2, 3]))
        sq = np.abs(rng.standard_normal((rows, n))).astype(np.float32) * 0.01
        ref, rsq = w.copy(), sq.copy()
        go.rmsprop_update(ref, g, rsq, 1e-2, 0.99, 1e-8, scale, wd, n)
        refs.append((batch.add("rmsprop_f32", [rows, cols, n],
                               [_f32s(1e-2), _f32s(0.99), _f32s(1 - 0.99), _f32s(1e-8), _f32s(scale), _f32s(wd)],
                               [w, g, sq]), [ref, rsq], [0, 2]))
    out = batch.run()
    for i, ref, js in refs:
        for r, j in zip(ref, js):
            np.testing.assert_allclose(out[i][j], r, rtol=1e-6, atol=1e-7)


# ---- int8 QAS update: numpy mirror of kernels_c/tt_qas.c -------------------------------------------------------

def xorshift32(state: int, count: int) -> tuple[np.ndarray, int]:
    """Marsaglia xorshift32 (13, 17, 5): `count` outputs and the final state."""
    out = np.empty(count, dtype=np.uint32)
    x = int(state)
    for i in range(count):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out[i] = x
    return out, x


def _qas_round(v: np.ndarray, rounding: int, state: int) -> tuple[np.ndarray, int]:
    if rounding == 1:
        draws, state = xorshift32(state, v.size)
        u = (draws >> np.uint32(8)).astype(np.float32) * F32(1.0 / 16777216.0)
        return np.floor((v.reshape(-1) + u).astype(F32)).reshape(v.shape), state
    return np.floor((v + F32(0.5)).astype(F32)), state


def qas_update_ref(w, g, w_scale, lr, rows_per_channel, n, rounding, master, state, x_scale=1.0, bias=False):
    """DESIGN §6 QAS: x = -(g * factor[c]) with factor = lr / (s_x * s_w[c]) (float32); round (nearest:
    floor(x + 0.5), stochastic: floor(x + u), u from xorshift32 in row-major order); add and clamp, or with a
    master copy accumulate the unrounded value. Returns (w, master, state)."""
    factor = (F32(lr) / (F32(x_scale) * np.asarray(w_scale, F32))).astype(F32)
    w = w.copy()
    if bias:
        ch = np.arange(g.shape[0])
        lo, hi = F32(-2147483648.0), F32(2147483520.0)
    else:
        rows = g.shape[0]
        ch = (np.arange(rows)[:, None] // rows_per_channel * np.ones((1, n), np.int64) if rows_per_channel
              else np.arange(n)[None, :] * np.ones((rows, 1), np.int64))
        lo, hi = F32(-127), F32(127)
    x = -(g * factor[ch]).astype(F32)
    view = w if bias else w[:, :n]
    if master is not None:
        m = np.clip((master + x).astype(F32), lo, hi)
        r, state = _qas_round(m, rounding, state)
        view[...] = np.clip(r, lo, hi).astype(np.int64)
        return w, m, state
    r, state = _qas_round(x, rounding, state)
    limit = (-(2 ** 31), 2 ** 31 - 1) if bias else (-127, 127)
    view[...] = np.clip(view.astype(np.int64) + r.astype(np.int64), *limit)
    return w, None, state


def test_qas_int8_update_exact(batch):
    rng = np.random.default_rng(400)
    refs = []
    for t in range(40):
        rounding = t % 2
        use_master = (t // 2) % 2 == 1
        seed = int(rng.integers(1, 2 ** 32))
        kind = t % 3  # conv [O,KH,KW,I], fc [O,I], depthwise [1,KH,KW,C*M]
        if kind == 0:
            o, kh, kw, i = (int(rng.integers(1, 6)) for _ in range(4))
            rows, cols, rpc, ch = o * kh * kw, i, kh * kw, o
            n = int(rng.integers(1, cols + 1))
        elif kind == 1:
            o, i = int(rng.integers(1, 10)), int(rng.integers(1, 20))
            rows, cols, rpc, ch = o, i, 1, o
            n = int(rng.integers(1, cols + 1))
        else:
            kh, kw, c, mlt = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 6)), 2
            rows, cols, rpc, ch = kh * kw, c * mlt, 0, c * mlt
            n = int(rng.integers(1, c + 1)) * mlt
        w = rng.integers(-127, 128, size=(rows, cols)).astype(np.int8)
        w.flat[:3] = [127, -127, 126][: min(3, w.size)]  # saturation
        s_w = rng.uniform(0.002, 0.02, size=ch).astype(np.float32)
        g = (rng.standard_normal((rows, n)) * 0.5).astype(np.float32)
        g.flat[0] = -50.0  # a large step: saturates
        lr = _f32s(0.05)
        master = (w[:, :n].astype(np.float32) + rng.uniform(-0.5, 0.5, size=(rows, n)).astype(np.float32)
                  if use_master else None)
        rw, rm, rstate = qas_update_ref(w, g, s_w, lr, rpc, n, rounding, master, seed)
        bufs = [s_w, w, g, master if use_master else None, np.array([seed], np.uint32)]
        refs.append((batch.add("qas_s8", [rows, cols, n, rpc, rounding, ch], [lr], bufs), rw, rm, rstate))
        # bias: int32 with scale s_x * s_w
        s_x = _f32s(rng.uniform(0.01, 0.1))
        b = rng.integers(-5000, 5000, size=ch).astype(np.int32)
        b[0] = 2 ** 31 - 3
        gb = (rng.standard_normal(ch) * 0.2).astype(np.float32)
        gb[0] = -1e3
        mb = b.astype(np.float32) if use_master else None
        rb, rmb, rsb = qas_update_ref(b, gb, s_w, lr, 0, 0, rounding, mb, seed, x_scale=s_x, bias=True)
        refs.append((batch.add("qas_bias_s32", [ch, rounding], [lr, s_x],
                               [s_w, b, gb, mb, np.array([seed], np.uint32)]), rb, rmb, rsb))
    out = batch.run()
    for i, rw, rm, rstate in refs:
        np.testing.assert_array_equal(out[i][1], rw)
        if rm is not None:
            np.testing.assert_array_equal(out[i][3], rm)
        assert int(out[i][4][0]) == rstate


def test_xorshift32_sequence(batch):
    k = batch.add("xorshift32", [1000], [], [np.array([2463534242], np.uint32), np.zeros(1000, np.uint32)])
    out = batch.run()[k]
    ref, state = xorshift32(2463534242, 1000)
    np.testing.assert_array_equal(out[1], ref)
    assert int(out[0][0]) == state
    assert ref[0] == 723471715  # Marsaglia's published first output for this seed


# ---- cross compilation -----------------------------------------------------------------------------------------

ARM_CORES = {"cortex-m7": ["-mcpu=cortex-m7", "-mfpu=fpv5-d16"], "cortex-m4": ["-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16"]}


@pytest.mark.parametrize("core", sorted(ARM_CORES))
@pytest.mark.parametrize("dsp", [False, True])
def test_every_kernel_cross_compiles_warning_free(tmp_path, core, dsp):
    cc = shutil.which("arm-none-eabi-gcc")
    if cc is None:
        pytest.skip("arm-none-eabi-gcc is not installed")
    flags = ARM_CORES[core] + ["-mthumb", "-mfloat-abi=hard"] + CFLAGS + ["-O2", f"-I{KDIR}", f"-I{ops_header.include_dir()}"]
    flags += ["-DTT_USE_DSP=1"] if dsp else []
    for src in kernel_sources():
        res = subprocess.run([cc, *flags, "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))],
                             capture_output=True, text=True)
        assert res.returncode == 0 and not res.stderr.strip(), f"{src.name} ({core}):\n{res.stderr}"
    # The DSP build really uses the SIMD instructions (and the portable one does not).
    asm = subprocess.run([cc, *flags, "-S", "-o", "-", str(KDIR / "ops" / "tt_fully_connected.c")], capture_output=True,
                         text=True, check=True).stdout
    assert ("smlad" in asm) == dsp


# ---- tt_qas_update (tt_train_ops.c) against the plain per-element loop it replaced ------------------------------
# The specialised kernel must give byte-identical parameters, state, master copies and PRNG state to the loop that
# stages/quant/qas.py was first transcribed into (kept here verbatim as ref_qas_update), for every optimizer x rounding
# x master x QAS on/off x weight decay x int8/int32 x scale layout, including ties, steps beyond 2^24 / 2^31 /
# 2^40, infinities and NaN (the paths outside the int32 fast path). Only the sign bit of a NaN in the float
# state may differ (compiler folding of x + (-d)); parameters and PRNG state must match byte for byte.

_QAS_REF_C = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tt_train_ops.h"
#define REF_DELTA_LIMIT 1099511627776.0f /* 2^40 */

static inline float ref_clip(float v)
{
    if (v < -REF_DELTA_LIMIT) {
        return -REF_DELTA_LIMIT;
    }
    if (v > REF_DELTA_LIMIT) {
        return REF_DELTA_LIMIT;
    }
    return v;
}

/* round half away from zero of |v| <= 2^40 (qas.round_nearest: trunc, then the exact fraction). */
static inline int64_t ref_round_away(float v)
{
    const int64_t t = (int64_t)v;
    const float frac = v - (float)t;
    return t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
}

static inline int64_t ref_floor64(float v)
{
    const int64_t t = (int64_t)v;
    return ((float)t > v) ? t - 1 : t;
}

static void ref_qas_update(const tt_qas_params *p, int32_t rows, int32_t cols, int32_t n, int32_t rows_per_channel,
                   int32_t scale_count, const float *scale, void *param, int32_t is_int32, const float *g,
                   float *state0, float *state1, float *master, uint32_t *rng)
{
    int32_t r, j;
    int8_t *p8 = (int8_t *)param;
    int32_t *p32 = (int32_t *)param;
    for (r = 0; r < rows; ++r) {
        for (j = 0; j < n; ++j) {
            const int32_t k = r * n + j;
            const int32_t at = r * cols + j;
            const int32_t ch = scale_count == 1 ? 0 : (rows_per_channel > 0 ? r / rows_per_channel : j);
            const float s = scale[ch];
            const int64_t cur_int = is_int32 ? (int64_t)p32[at] : (int64_t)p8[at];
            const float cur = master != 0 ? master[k] : (float)cur_int;
            float gg = g[k] * p->batch_scale;
            float d, delta;
            int64_t v;
            if (p->qas) {
                if (p->weight_decay != 0.0f) {
                    gg = gg + p->weight_decay * (s * cur);
                }
            } else {
                gg = gg * s;
                if (p->weight_decay != 0.0f) {
                    gg = gg + p->weight_decay * cur;
                }
            }
            switch (p->kind) {
            case TT_OPT_MOMENTUM:
                state0[k] = state0[k] * p->momentum;
                state0[k] = state0[k] + gg;
                d = p->lr * state0[k];
                break;
            case TT_OPT_ADAM: {
                float denom;
                state0[k] = state0[k] + (gg - state0[k]) * p->one_minus_beta1;
                state1[k] = state1[k] * p->beta2;
                state1[k] = state1[k] + p->one_minus_beta2 * gg * gg;
                denom = sqrtf(state1[k]) / p->sqrt_bc2 + p->eps;
                d = p->lr_over_bc1 * state0[k] / denom;
                break;
            }
            case TT_OPT_RMSPROP:
                state0[k] = state0[k] * p->alpha;
                state0[k] = state0[k] + p->one_minus_alpha * gg * gg;
                d = p->lr * gg / (sqrtf(state0[k]) + p->eps);
                break;
            default:
                d = p->lr * gg;
                break;
            }
            delta = p->qas ? (-d) / s : -d;
            if (master != 0) {
                master[k] = master[k] + delta;
                v = master[k] != master[k] ? cur_int : ref_round_away(ref_clip(master[k]));
            } else if (delta != delta) {
                v = cur_int; /* NaN: the parameter keeps its value (the loss check stops training) */
            } else if (p->rounding == TT_ROUND_STOCHASTIC) {
                const float u = (float)(tt_xorshift32(rng) >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
                v = cur_int + ref_floor64(ref_clip(delta) + u);
            } else {
                v = cur_int + ref_round_away(ref_clip(delta));
            }
            if (v < p->lo) {
                v = p->lo;
            }
            if (v > p->hi) {
                v = p->hi;
            }
            if (is_int32) {
                p32[at] = (int32_t)v;
            } else {
                p8[at] = (int8_t)v;
            }
        }
    }
}

static void *rd(FILE *f, size_t n) { void *p = malloc(n ? n : 1); if (n && fread(p, 1, n, f) != n) exit(3); return p; }
int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "rb"), *o = fopen(argv[2], "wb");
    int32_t ncase, t;
    (void)argc;
    if (fread(&ncase, 4, 1, f) != 1) return 2;
    for (t = 0; t < ncase; ++t) {
        int32_t h[7], pass;
        tt_qas_params pp;
        float *scale, *g, *st[2][2], *ms[2];
        void *par[2];
        uint32_t rng[2];
        size_t psz, ne;
        if (fread(h, 4, 7, f) != 7 || fread(&pp, sizeof pp, 1, f) != 1) return 2;
        /* h: rows, cols, n, rows_per_channel, scale_count, is_int32, flags (1 state0, 2 state1, 4 master, 8 rng) */
        psz = (size_t)h[0] * (size_t)h[1] * (h[5] ? 4u : 1u);
        ne = (size_t)h[0] * (size_t)h[2];
        scale = rd(f, 4u * (size_t)h[4]);
        g = rd(f, 4u * ne);
        par[0] = rd(f, psz);
        st[0][0] = rd(f, 4u * ne); st[0][1] = rd(f, 4u * ne); ms[0] = rd(f, 4u * ne);
        if (fread(&rng[0], 4, 1, f) != 1) return 2;
        par[1] = malloc(psz ? psz : 1); memcpy(par[1], par[0], psz);
        st[1][0] = malloc(4u * ne + 4); memcpy(st[1][0], st[0][0], 4u * ne);
        st[1][1] = malloc(4u * ne + 4); memcpy(st[1][1], st[0][1], 4u * ne);
        ms[1] = malloc(4u * ne + 4); memcpy(ms[1], ms[0], 4u * ne);
        rng[1] = rng[0];
        for (pass = 0; pass < 2; ++pass) {
            int32_t step;
            for (step = 0; step < 3; ++step) {
                (pass ? tt_qas_update : ref_qas_update)(&pp, h[0], h[1], h[2], h[3], h[4], scale, par[pass], h[5], g,
                    (h[6] & 1) ? st[pass][0] : 0, (h[6] & 2) ? st[pass][1] : 0, (h[6] & 4) ? ms[pass] : 0,
                    (h[6] & 8) ? &rng[pass] : 0);
            }
            fwrite(par[pass], 1, psz, o);
            fwrite(st[pass][0], 4, ne, o); fwrite(st[pass][1], 4, ne, o); fwrite(ms[pass], 4, ne, o);
            fwrite(&rng[pass], 4, 1, o);
        }
    }
    fclose(o);
    return 0;
}
"""

_PARAMS = np.dtype([("kind", "<i4"), ("qas", "<i4"), ("rounding", "<i4"), ("lo", "<i4"), ("hi", "<i4"),
                    ("f", "<f4", (12,))])  # tt_qas_params: 5 ints, then 12 floats in declaration order


def _qas_case(rng, kind, rounding, master, qas, wd, is32, layout):
    rows, n = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    cols = n + int(rng.integers(0, 3))
    if layout == "row":
        rpc = int(rng.integers(1, 3))
        rows = rows * rpc
        sc = rows // rpc
    elif layout == "col":
        rpc, sc = 0, n
    else:
        rpc, sc = int(rng.integers(0, 2)), 1
    scale = (rng.uniform(1e-4, 5e-2, sc)).astype(F32)
    ne = rows * n
    if is32:
        lo, hi = -(1 << 31), (1 << 31) - 1
        p = rng.integers(-3000, 3000, rows * cols).astype(np.int32)
        p[rng.random(p.size) < 0.2] = hi - 3
        p[rng.random(p.size) < 0.2] = lo + 3
    else:
        lo, hi = -127, 127
        p = rng.integers(-128, 128, rows * cols).astype(np.int8)
    g = (rng.standard_normal(ne) * 10.0 ** rng.uniform(-3, 2, ne)).astype(F32)
    # edge values: exact ties (with lr = s = 1 and QAS off: steps of k + 0.5), huge and non-finite gradients
    special = np.array([0.5, -0.5, 1.5, -2.5, 3e7, -3e7, 5e9, -5e9, 3e12, -3e12, np.inf, -np.inf, np.nan, 0.0],
                       F32)
    pick = rng.random(ne) < 0.3
    g[pick] = rng.choice(special, int(pick.sum()))
    f = np.zeros(12, F32)
    # batch_scale, lr, wd, momentum, 1-b1, b2, 1-b2, lr/bc1, sqrt_bc2, alpha, 1-alpha, eps
    f[:] = [rng.choice([1.0, 0.5]), rng.choice([1.0, 0.01]), wd, 0.9, 0.1, 0.999, 0.001, 0.05, 0.3, 0.99, 0.01,
              1e-8]
    prm = np.zeros(1, _PARAMS)
    prm["kind"], prm["qas"], prm["rounding"], prm["lo"], prm["hi"], prm["f"] = kind, qas, rounding, lo, hi, f
    st0 = (rng.standard_normal(ne) * 0.1).astype(F32)
    st1 = np.abs(rng.standard_normal(ne) * 0.1).astype(F32)
    ms = p.reshape(rows, cols)[:, :n].astype(F32).reshape(-1) + rng.uniform(-0.5, 0.5, ne).astype(F32)
    if is32:
        ms = np.clip(ms, -1e6, 1e6).astype(F32)
    flags = (1 if kind in (1, 2, 3) else 0) | (2 if kind == 2 else 0) | (4 if master else 0)
    flags |= 8 if (rounding == 1 and not master) else 0
    head = np.array([rows, cols, n, rpc, sc, int(is32), flags], np.int32)
    seed = np.array([rng.integers(1, 2 ** 32)], np.uint32)
    blob = b"".join(a.tobytes() for a in (head, prm, scale, g, p, st0, st1, ms, seed))
    size = p.nbytes + 3 * 4 * ne + 4
    return blob, size, ne


def test_qas_update_specialised_equals_plain_loop(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    src = tmp_path / "qas_ref.c"
    src.write_text(_QAS_REF_C)
    exe = tmp_path / "qas_ref"
    cmd = [cc, *HOST_FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", str(KDIR / "tt_train_ops.c"), str(KDIR / "tt_qas.c"),
           *[str(s) for s in kernel_sources() if s.name not in ("tt_train_ops.c", "tt_qas.c")], str(src), "-lm",
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rng = np.random.default_rng(7)
    blobs, sizes, names, ne_of = [], [], [], []
    for kind in range(4):
        for rounding in (0, 1):
            for master in (False, True):
                for qas in (0, 1):
                    for wd in (0.0, 1e-3):
                        for is32 in (False, True):
                            for layout in ("row", "col", "one"):
                                for _ in range(2):
                                    b, s, ne = _qas_case(rng, kind, rounding, master, qas, wd, is32, layout)
                                    ne_of.append(ne)
                                    blobs.append(b)
                                    sizes.append(s)
                                    names.append((kind, rounding, master, qas, wd, is32, layout))
    (tmp_path / "in.bin").write_bytes(struct.pack("<i", len(blobs)) + b"".join(blobs))
    import os

    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}  # the harness never frees its case buffers
    res = subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr
    out = (tmp_path / "out.bin").read_bytes()
    pos = 0
    for name_i, (name, s) in enumerate(zip(names, sizes)):
        ref, new = out[pos:pos + s], out[pos + s:pos + 2 * s]
        pos += 2 * s
        if ref != new:
            # NaN bits may differ (the compiler may fold x + (-d) into x - d, which flips a NaN's sign; a NaN
            # stops training anyway): parameters and PRNG state byte for byte, float state up to NaN bits.
            psz = s - 4 - 3 * 4 * ne_of[name_i]
            assert ref[:psz] == new[:psz] and ref[-4:] == new[-4:], f"tt_qas_update differs for {name}"
            a = np.frombuffer(ref[psz:-4], F32)
            b = np.frombuffer(new[psz:-4], F32)
            same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
            assert same.all(), f"tt_qas_update state differs for {name}"
    assert pos == len(out)
