"""fp16-mixed (issue 13), third set of fp16-capable ops: the standalone clamps (relu, relu6) read fp16 as well as write
it, max_pool2d reads and writes fp16, pad reads and writes fp16 and pad_grad reads and writes fp16 gradients. Before,
each of them cut a chain of 2-byte results (bench/coverage_fp16-mixed.md: face_detection_short_range's frozen prefix
stayed fp32 around them, its peak at fp32's size). Their kernels compute in fp32 and round once on store, so each must
give the bits of its fp32 kernel on the widened operand followed by numpy's fp16 rounding: checked against numpy and
against the fp32 kernels, on every class of fp16 value, in place where the op runs in place. On a small model
(conv -> relu6 -> pad -> max_pool2d -> conv -> relu -> mean -> FC) the tensors become 2-byte ones, the fused graph
trains with the unfused graph's bits in the golden model, the estimate meets the plan and (slow) host C == golden."""

from __future__ import annotations

import ctypes
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

sys.path.insert(0, str(Path(__file__).parent))
from fp16_plan_checks import estimate_over_exact, fp16_arena_falls  # noqa: E402
from kernel_lib import host_kernel_lib  # noqa: E402
from test_fp16_grad_storage import _bits, _bits_nan_as_one, _f16, _halves, _p, _pair  # noqa: E402
from test_fp16_written import _assert_trains_alike, _fused_and_unfused, _makers, _written  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
H, C_A, C_B, CLASSES = 8, 8, 12, 5


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("f16ops") / "libf16ops.so"
    return host_kernel_lib(out, ["tt_f16.c", "tt_common.c", "ops/tt_relu.c", "ops/tt_max_pool2d.c", "ops/tt_pad.c"],
                           "-O1")


# ---- relu / relu6 (tt_clamp_f16) ----------------------------------------------------------------------------------

CLAMPS = {"relu": (0.0, np.inf), "relu6": (0.0, 6.0)}


def _clamp_ref(x32: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """tt_act_clamp's definition in float32: below lo -> lo, then above hi -> hi, anything else as it is (a NaN stays
    NaN, -0 stays -0: np.maximum(-0.0, 0.0) would give +0)."""
    y = np.where(x32 < np.float32(lo), np.float32(lo), x32)
    return np.where(y > np.float32(hi), np.float32(hi), y).astype(np.float32)


@pytest.mark.parametrize("act", sorted(CLAMPS))
def test_clamp_forms_give_the_fp32_kernel_rounded(lib, act):
    """x fp32 / fp16, y fp32 / fp16: numpy's clamp on the widened x (equal to tt_clamp_f32's bits), rounded where y is
    fp16; every fp16 class of value (NaNs, infinities, subnormals, signed zeros, the clamp's edges)."""
    lo, hi = CLAMPS[act]
    rng = np.random.default_rng(1 if act == "relu" else 2)
    n = 301
    x16 = _halves(rng, n)
    x16[-4:] = np.array([6.0, 6.00390625, 5.99609375, -0.0], np.float16)
    ref32 = _clamp_ref(x16.astype(np.float32), lo, hi)
    slot = np.empty(n, np.float32)
    lib.tt_clamp_f32(n, ctypes.c_float(lo), ctypes.c_float(hi), _p(x16.astype(np.float32)), _p(slot))
    assert _bits(slot) == _bits(ref32)
    for hx in (False, True):
        for hy in (False, True):
            x = np.ascontiguousarray(x16) if hx else x16.astype(np.float32)
            y = np.empty(n, np.float16 if hy else np.float32)
            lib.tt_clamp_f16(n, ctypes.c_float(lo), ctypes.c_float(hi), *_pair(x, hx), *_pair(y, hy))
            assert _bits(y) == _bits(_f16(ref32) if hy else ref32), (hx, hy)


def test_clamp_in_place_in_every_form(lib):
    """y written over x (relu's in_place="any"): fp16 over fp16, fp16 over fp32 (behind what is read) and fp32 over
    fp16 (from the end) give the out-of-place bits."""
    rng = np.random.default_rng(5)
    n = 157
    x16 = _halves(rng, n)
    ref32 = _clamp_ref(x16.astype(np.float32), 0.0, 6.0)
    six = (ctypes.c_float(0.0), ctypes.c_float(6.0))
    for hx, hy in ((True, True), (False, True), (True, False), (False, False)):
        buf = np.zeros(4 * n, np.uint8)
        src = (x16 if hx else x16.astype(np.float32)).tobytes()
        buf[:len(src)] = np.frombuffer(src, np.uint8)
        lib.tt_clamp_f16(n, *six, *_pair(buf, hx), *_pair(buf, hy))
        got = buf[:2 * n].view(np.float16) if hy else buf.view(np.float32)
        assert _bits(got) == _bits(_f16(ref32) if hy else ref32), (hx, hy)


# ---- max_pool2d (tt_max_pool2d_f16) ------------------------------------------------------------------------------

class _PoolDims(ctypes.Structure):   # tt_kernels.h's tt_pool_dims
    _fields_ = [(f, ctypes.c_int32) for f in ("batches", "in_h", "in_w", "channels", "out_h", "out_w", "filter_h",
                                              "filter_w", "stride_h", "stride_w", "pad_top", "pad_left")]


def _max_pool_ref(x: np.ndarray, d: _PoolDims, lo: float, hi: float) -> np.ndarray:
    """tt_max_pool2d_f32's definition in float32 (x [h, w, c]): a window's first tap, then any larger (a NaN is never
    larger); a window clipped by the padding starts at -FLT_MAX instead; then the clamp (_clamp_ref)."""
    y = np.empty((d.out_h, d.out_w, d.channels), np.float32)
    for oy in range(d.out_h):
        for ox in range(d.out_w):
            y0, x0 = oy * d.stride_h - d.pad_top, ox * d.stride_w - d.pad_left
            rows = range(max(y0, 0), min(y0 + d.filter_h, d.in_h))
            cols = range(max(x0, 0), min(x0 + d.filter_w, d.in_w))
            clipped = len(rows) < d.filter_h or len(cols) < d.filter_w
            for c in range(d.channels):
                best, first = np.float32(np.finfo(np.float32).min), True
                for iy in rows:
                    for ix in cols:
                        v = x[iy, ix, c]
                        if (first and not clipped) or v > best:
                            best = v
                        first = False
                y[oy, ox, c] = best
    return _clamp_ref(y, lo, hi)


@pytest.mark.parametrize("geo", [(3, 2, 1, "relu6"), (2, 2, 0, "none")], ids=["3x3s2_same_relu6", "2x2s2_valid"])
def test_max_pool_forms_give_the_fp32_kernel_rounded(lib, geo):
    """x fp32 / fp16, y fp32 / fp16 on every fp16 class of value (windows clipped by the padding, NaN taps first and
    later, ties of +-0): numpy's definition and tt_max_pool2d_f32 on the widened x, rounded where y is fp16."""
    k, st, pad, act = geo
    h, w, c = 7, 6, 5
    oh, ow = (h + 2 * pad - k) // st + 1, (w + 2 * pad - k) // st + 1
    d = _PoolDims(1, h, w, c, oh, ow, k, k, st, st, pad, pad)
    lo, hi = {"none": (-np.inf, np.inf), "relu6": (0.0, 6.0)}[act]
    x16 = _halves(np.random.default_rng(k), h * w * c).reshape(h, w, c)
    ref32 = _max_pool_ref(x16.astype(np.float32), d, lo, hi)
    slot = np.empty(ref32.shape, np.float32)
    lims = (ctypes.c_float(lo), ctypes.c_float(hi))
    lib.tt_max_pool2d_f32(ctypes.byref(d), *lims, _p(x16.astype(np.float32)), _p(slot))
    assert _bits(slot) == _bits(ref32)
    for hx in (False, True):
        for hy in (False, True):
            x = np.ascontiguousarray(x16) if hx else x16.astype(np.float32)
            y = np.empty(ref32.shape, np.float16 if hy else np.float32)
            lib.tt_max_pool2d_f16(ctypes.byref(d), *lims, *_pair(x, hx), *_pair(y, hy))
            assert _bits(y) == _bits(_f16(ref32) if hy else ref32), (hx, hy)


def test_max_pool_grad_reads_an_fp16_dy_with_the_fp32_sums(lib):
    """tt_max_pool2d_grad_hdy (overlapping windows: dx sums several dy in fp32) on an fp16 dy, the forward input fp32
    or fp16, gives tt_max_pool2d_grad_f32's bits on the widened dy; the summed values' NaNs compared as NaN-ness."""
    h, w, c, k, st, pad = 7, 6, 5, 3, 2, 1
    oh, ow = (h + 2 * pad - k) // st + 1, (w + 2 * pad - k) // st + 1
    d = _PoolDims(1, h, w, c, oh, ow, k, k, st, st, pad, pad)
    rng = np.random.default_rng(31)
    x16 = _halves(rng, h * w * c, nan=False).reshape(h, w, c)
    dy16 = _halves(rng, oh * ow * c).reshape(oh, ow, c)
    want = np.empty((h, w, c), np.float32)
    with np.errstate(all="ignore"):
        lib.tt_max_pool2d_grad_f32(ctypes.byref(d), _p(dy16.astype(np.float32)), _p(x16.astype(np.float32)),
                                   _p(want))
        for hx in (False, True):
            x = np.ascontiguousarray(x16) if hx else x16.astype(np.float32)
            dx = np.full((h, w, c), 7, np.float32)
            lib.tt_max_pool2d_grad_hdy(ctypes.byref(d), _p(np.ascontiguousarray(dy16)), *_pair(x, hx), _p(dx))
            assert _bits_nan_as_one(dx) == _bits_nan_as_one(want), hx
    # and numpy's: each dy to its window's first maximum (strict >, taps in row-major order, padding taps skipped),
    # added in fp32 in output order (the reference above shares the kernels' walk, so it cannot catch a wrong tap)
    ref = np.zeros((h, w, c), np.float32)
    xf, dyf = x16.astype(np.float32), dy16.astype(np.float32)
    with np.errstate(all="ignore"):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    best = None
                    for ky in range(k):
                        for kx in range(k):
                            iy, ix = oy * st - pad + ky, ox * st - pad + kx
                            if 0 <= iy < h and 0 <= ix < w and (best is None or xf[iy, ix, ch] > xf[best][ch]):
                                best = (iy, ix)
                    ref[best][ch] = np.float32(ref[best][ch] + dyf[oy, ox, ch])
    assert _bits_nan_as_one(want) == _bits_nan_as_one(ref)


# ---- pad and pad_grad (tt_pad_f16, tt_pad_grad_f16) -------------------------------------------------------------

PADS = np.array([[0, 0], [1, 2], [2, 0], [0, 1]], np.int32)   # before, after of each NHWC dim


def test_pad_and_pad_grad_forms_give_the_fp32_kernels_rounded(lib):
    """pad: np.pad with 0.0 on the widened x; pad_grad: dy's slice at the pads; both equal to tt_pad_f32 /
    tt_pad_grad_f32 on the widened operand, and in each of the four forms rounded where the result is fp16, on every
    fp16 class of value (an fp16 -> fp16 copy keeps the bits: the quiet NaNs' payloads too)."""
    shape = (1, 4, 3, 5)
    x16 = _halves(np.random.default_rng(21), int(np.prod(shape))).reshape(shape)
    ref32 = np.pad(x16.astype(np.float32), PADS, constant_values=np.float32(0))
    dy16 = _halves(np.random.default_rng(22), ref32.size).reshape(ref32.shape)
    gref32 = dy16.astype(np.float32)[:, 1:1 + shape[1], 2:2 + shape[2], 0:shape[3]]
    dims = np.array(shape, np.int32)
    pads = np.ascontiguousarray(PADS.reshape(-1))
    slot, gslot = np.empty(ref32.shape, np.float32), np.empty(shape, np.float32)
    lib.tt_pad_f32(_p(dims), _p(pads), ctypes.c_float(0.0), _p(x16.astype(np.float32)), _p(slot))
    lib.tt_pad_grad_f32(_p(dims), _p(pads), _p(dy16.astype(np.float32)), _p(gslot))
    assert _bits(slot) == _bits(ref32) and _bits(gslot) == _bits(gref32)
    for hx in (False, True):
        for hy in (False, True):
            x = np.ascontiguousarray(x16) if hx else x16.astype(np.float32)
            y = np.full(ref32.shape, 7, np.float16 if hy else np.float32)
            lib.tt_pad_f16(_p(dims), _p(pads), ctypes.c_float(0.0), *_pair(x, hx), *_pair(y, hy))
            assert _bits(y) == _bits(_f16(ref32) if hy else ref32), ("pad", hx, hy)
            dy = np.ascontiguousarray(dy16) if hx else dy16.astype(np.float32)
            dx = np.full(shape, 7, np.float16 if hy else np.float32)
            lib.tt_pad_grad_f16(_p(dims), _p(pads), *_pair(dy, hx), *_pair(dx, hy))
            assert _bits(dx) == _bits(_f16(gref32) if hy else gref32), ("pad_grad", hx, hy)


# ---- the graph: conv -> relu6 -> pad -> max_pool2d -> conv -> relu -> mean -> FC -----------------------------------

def _model(tmp: Path) -> Graph:
    ts: dict[str, Tensor] = {}
    t, w, b = _makers(ts, np.random.default_rng(11))
    geo = {"stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1, "act": "none"}
    x = t("x", [1, H, H, 3], "input")
    ops = [Op("conv2d", [x, w("a/w", [C_A, 3, 3, 3], 0.4), b("a/b", C_A)], [t("a", [1, H, H, C_A])],
              {**geo, "padding": "same"}),
           Op("relu6", ["a"], [t("r", [1, H, H, C_A])], {}),
           Op("pad", ["r", t("pads", [4, 2], "const", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))],
              [t("q", [1, H + 2, H + 2, C_A])], {}),
           Op("max_pool2d", ["q"], [t("m", [1, H // 2 + 1, H // 2 + 1, C_A])],
              {"filter_h": 2, "filter_w": 2, "stride_h": 2, "stride_w": 2, "padding": "valid", "act": "none"}),
           Op("conv2d", ["m", w("c/w", [C_B, 1, 1, C_A], 0.5), b("c/b", C_B)],
              [t("c", [1, H // 2 + 1, H // 2 + 1, C_B])], {**geo, "padding": "valid"}),
           Op("relu", ["c"], [t("s", [1, H // 2 + 1, H // 2 + 1, C_B])], {}),
           Op("mean", ["s", t("axes", [2], "const", np.array([1, 2], np.int32))], [t("u", [1, C_B])],
              {"keep_dims": False}),
           Op("fully_connected", ["u", w("fc/w", [CLASSES, C_B], 0.3), b("fc/b", CLASSES)], [t("y", [1, CLASSES])],
              {"act": "none", "keep_num_dims": False})]
    ts["axes"].dtype = ts["pads"].dtype = "int32"
    ts["y"].role = "output"
    g = Graph(ts, ops, ["x"], ["y"])
    g.validate()
    write_model(g, tmp / "ops3.tflite")
    return read_model(tmp / "ops3.tflite")


def _head_only(g) -> TrainPlan:
    *_, fc = TrainPlan.trainable_ops(g)
    return TrainPlan([LayerPlan(fc, bias=True, weight_ratio=1.0)])


def _all_layers(g) -> TrainPlan:
    return TrainPlan([LayerPlan(i, bias=True, weight_ratio=1.0) for i in TrainPlan.trainable_ops(g)])


def _graphs(tmp: Path, plan_of):
    g = _model(tmp)
    plan = plan_of(g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))
    return (g, plan, *_fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2}))


def _by_writer(g16: Graph, g: Graph) -> dict[str, str]:
    """{op type of the model: dtype of its result in the fp16-mixed graph} for the frozen prefix's ops."""
    return {op.type: g16.tensors[op.outputs[0]].dtype for op in g.ops if op.outputs[0] in g16.tensors}


def test_the_frozen_prefix_is_fp16_through_the_clamps(tmp_path):
    """Only the FC trains: every result of the prefix is a 2-byte tensor (relu6 and relu read the convs' fp16 results,
    pad and the max pool read and write fp16); no rounding op follows
    the fp16 results (the kernels round on store), the arena falls and the estimate meets the plan. (The reference
    keeps a frozen prefix's results fp32, unrounded: fp16_mixed.prefix_results; the slow host test checks these bits
    against the golden model.)"""
    g, plan, g16, ref = _graphs(tmp_path, _head_only)
    assert [op.type for op in g.ops][:6] == ["conv2d", "relu6", "pad", "max_pool2d", "conv2d", "relu"]
    written = _written(g16)
    assert all(g16.tensors[t].dtype == "float16" for t in ("a", "r", "q", "m", "c", "s")), written
    assert g16.tensors["x"].dtype == "float32" and not _written(ref)
    assert not [op for op in g16.ops if op.type == "round_f16" and set(op.inputs) & set(written)]
    fp16_arena_falls(g16, ref)
    ratio = estimate_over_exact(g, plan)
    # measured 2,016 / 1,600 B (before relu6, pad and max_pool2d read and wrote fp16 both were 2,544 B): the plan
    # falls further than the estimate, which still counts part of the prefix's row stream at fp32's size
    # (planning/fp16_memory is not this change's); it stays above the plan, as a budget check needs
    assert 1.0 <= ratio <= 1.3, ratio


def test_every_layer_trained_trains_with_the_unfused_bits(tmp_path):
    """Every layer trains: relu6 reads the conv's fp16 result and pad_grad writes an fp16 gradient (read by relu6's
    mask_grad), and the fused graph trains with the unfused graph's bits."""
    _, _, g16, ref = _graphs(tmp_path, _all_layers)
    written = _written(g16)
    assert {"relu6", "pad_grad"} <= set(written.values()), written
    # the max pool's gradient reads its fp16 dy (the 1x1 conv's input gradient) itself
    mpg = [op for op in g16.ops if op.type == "max_pool2d_grad"]
    assert mpg and all(g16.tensors[op.inputs[0]].dtype == "float16" for op in mpg)
    _assert_trains_alike(g16, ref, H, CLASSES)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("plan_of", [_head_only, _all_layers], ids=["frozen_prefix", "all_layers"])
def test_host_build_has_the_golden_bits(tmp_path, plan_of):
    """The fused graph on the host (row-streamed where the planner streams it): per-step losses, loss scale and the
    trained weights equal the golden model's bit for bit (~15 s each: slow)."""
    from test_fp16_codegen import _golden, _host_run

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    _, _, g16, _ = _graphs(tmp_path, plan_of)
    x = np.random.default_rng(3).standard_normal((8, H, H, 3)).astype(np.float32)
    y = np.arange(8) % CLASSES
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    res, losses, weights, _ = _host_run(g16, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    if plan_of is _head_only:
        assert "tt_clamp_f16" in src and "tt_max_pool2d_f16" in src and "tt_pad_f16" in src
    else:
        assert "tt_pad_grad_f16" in src and "tt_max_pool2d_grad_hdy" in src
    state, scales, skipped, means = _golden(g16, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name
