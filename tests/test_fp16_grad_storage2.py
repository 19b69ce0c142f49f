"""fp16-mixed gradients stored as fp16, second part (issue 13): a fan-out's gradient sum (grad_accumulate), the sub and
mul gradients read and write fp16 gradients, and the depthwise weight gradient reads an fp16 output gradient, where
stages/train/fp16_mixed.fp16_written makes the tensor a 2-byte one. Their kernels compute in fp32 and round once on
store, so they must give the bits of the fp32 kernels between a widening and tt_round_f16 (the fp32-slot path they
replace): checked against numpy (float32 arithmetic, numpy's float16 conversion) and against the fp32 kernels
themselves, on every fp16 class of value, in place too. On an inverted-residual block with every layer trained (the
block input's gradient is a fan-out sum) and on a model with a broadcast mul and a sub, the rewritten graphs train
with the unfused graphs' bits in the golden model, the estimate meets the exact plan, and (slow) the host C equals
the golden model bit for bit."""

from __future__ import annotations

import ctypes
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from kernel_lib import host_kernel_lib  # noqa: E402 (tests/ is on sys.path)
from tinytrain.stages.golden import grad_ops
from tinytrain.stages.model.ir import Graph, Op
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from tinytrain.stages.reorder import plan_schedules

sys.path.insert(0, str(Path(__file__).parent))
from test_fp16_grad_storage import (OUT, SMALL, _as, _bc, _bits, _bits_nan_as_one, _f16, _halves, _p,  # noqa: E402
                                    _pair, _trains_alike)
from test_fp16_written import _fused_and_unfused, _makers, _written  # noqa: E402
from test_fp16_written_block import _block_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("f16g2") / "libf16g2.so"
    return host_kernel_lib(out, ["tt_f16.c", "tt_common.c", "tt_train_ops.c", "ops/tt_grad_accumulate.c",
                                 "ops/tt_mul.c", "ops/tt_add.c", "ops/tt_depthwise_conv2d.c"])


def _ptrs(arrays, ctype):
    return (ctype * len(arrays))(*[None if a is None else a.ctypes.data_as(ctype) for a in arrays])


# ---- grad_accumulate ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_inputs", [2, 3])
def test_gradient_sum_forms_give_the_fp32_sum_rounded(lib, n_inputs):
    """y = x0 + x1 (+ x2) in fp32 in reader order, each share and y fp32 or fp16: the fp32 kernel (tt_sum_f32) on the
    widened shares, rounded where y is fp16."""
    rng = np.random.default_rng(n_inputs)
    n = 257
    xs16 = [_halves(rng, n) for _ in range(n_inputs)]
    with np.errstate(invalid="ignore", over="ignore"):
        ref = xs16[0].astype(np.float32)
        for x in xs16[1:]:
            ref = (ref + x.astype(np.float32)).astype(np.float32)
    wide = [x.astype(np.float32) for x in xs16]
    slot = np.empty(n, np.float32)
    lib.tt_sum_f32(n_inputs, _ptrs(wide, ctypes.c_void_p), n, _p(slot))
    assert _bits_nan_as_one(slot) == _bits_nan_as_one(ref)
    for form in range(1 << (n_inputs + 1)):
        halves = [bool(form >> j & 1) for j in range(n_inputs)]
        hy = bool(form >> n_inputs & 1)
        xs = [_as(x, h) for x, h in zip(xs16, halves)]
        y = np.empty(n, np.float16 if hy else np.float32)
        lib.tt_sum_f16(n_inputs, _ptrs([None if h else x for x, h in zip(xs, halves)], ctypes.c_void_p),
                       _ptrs([x if h else None for x, h in zip(xs, halves)], ctypes.c_void_p), n, *_pair(y, hy))
        want = _f16(ref) if hy else ref
        assert _bits_nan_as_one(y) == _bits_nan_as_one(want), (halves, hy)
        if hy:   # the fp32-slot path: the fp32 kernel's sum, rounded
            assert _bits_nan_as_one(y) == _bits_nan_as_one(_f16(slot))


def test_gradient_sum_in_place_over_a_narrower_or_wider_share(lib):
    """y written over share 0 (memplan's in-place sharing): an fp32 y over an fp16 share runs from the end, an fp16 y
    over an fp32 share behind what it reads; both give the out-of-place bits."""
    rng = np.random.default_rng(11)
    n = 101
    a16, b16 = _halves(rng, n, nan=False), _halves(rng, n, nan=False)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (a16.astype(np.float32) + b16.astype(np.float32)).astype(np.float32)
    buf = np.zeros(4 * n, np.uint8)
    buf[:2 * n] = np.frombuffer(a16.tobytes(), np.uint8)
    lib.tt_sum_f16(2, _ptrs([None, None], ctypes.c_void_p), _ptrs([buf, b16], ctypes.c_void_p), n, _p(buf), None)
    assert _bits(buf.view(np.float32)) == _bits(want)
    buf = np.frombuffer(a16.astype(np.float32).tobytes(), np.uint8).copy()
    lib.tt_sum_f16(2, _ptrs([buf, None], ctypes.c_void_p), _ptrs([None, b16], ctypes.c_void_p), n, None, _p(buf))
    assert _bits(buf[:2 * n].view(np.float16)) == _bits(_f16(want))


# ---- sub_grad and mul_grad ------------------------------------------------------------------------------------------

def _sequential_reduce(terms: np.ndarray, dshape) -> np.ndarray:
    """Each element of an operand of shape `dshape` broadcast to OUT: its terms summed one at a time in dz's
    row-major order from +0 (the C's association); a dz-sized operand is the terms themselves."""
    n = int(np.prod(dshape))
    flat = terms.reshape(-1)
    if n == flat.size:
        return flat.copy()
    ref = np.zeros(n, np.float32)
    targets = np.broadcast_to(np.arange(n).reshape(dshape), OUT).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        for k, j in enumerate(targets):
            ref[j] = np.float32(ref[j] + flat[k])
    return ref


@pytest.mark.parametrize("dshape", SMALL)
def test_sub_gradient_of_b_gives_the_negated_reduction_rounded(lib, dshape):
    """sub_grad's b operand (sign -1) through tt_unbroadcast_f16: each term negated, then summed in fp32 in
    tt_unbroadcast_f32's order and rounded once (an exact cancellation stays +0); the fp32 kernel's sums, rounded,
    are the same bits."""
    rng = np.random.default_rng(3 + sum(dshape))
    dz16 = _halves(rng, int(np.prod(OUT))).reshape(OUT)
    n = int(np.prod(dshape))
    ref = _sequential_reduce(-dz16.astype(np.float32), dshape)
    bc = _bc(OUT, dshape)
    slot = np.empty(n, np.float32)
    with np.errstate(invalid="ignore"):
        lib.tt_unbroadcast_f32(ctypes.byref(bc), ctypes.c_float(-1.0), _p(dz16.astype(np.float32)), _p(slot), n)
    assert _bits_nan_as_one(slot) == _bits_nan_as_one(ref)
    for hdz in (False, True):
        for hdx in (False, True):
            dz = _as(dz16, hdz)
            dx = np.empty(n, np.float16 if hdx else np.float32)
            lib.tt_unbroadcast_f16(ctypes.byref(bc), ctypes.c_float(-1.0), *_pair(dz, hdz), *_pair(dx, hdx), n)
            want = _f16(ref) if hdx else ref
            assert _bits_nan_as_one(dx) == _bits_nan_as_one(want), (hdz, hdx)
            if hdx:
                assert _bits_nan_as_one(dx) == _bits_nan_as_one(_f16(slot)), hdz


@pytest.mark.parametrize("dshape", SMALL)
@pytest.mark.parametrize("other_full", [True, False])
def test_mul_gradient_forms_give_the_fp32_kernel_rounded(lib, dshape, other_full):
    """d = unbroadcast(dz * other) to d's shape, dz, other and d each fp32 or fp16: each product in fp32, each
    element of a reduced d summed in tt_mul_grad_f32's order and rounded once; the fp32 kernel, rounded, gives the
    same bits. `other` is the mul's other operand: of dz's shape, or broadcast itself (a row, a per-channel vector)."""
    rng = np.random.default_rng(len(dshape) * 7 + int(other_full) + sum(dshape))
    oshape = OUT if other_full else (1, 1, 1, OUT[3])
    dz16 = _halves(rng, int(np.prod(OUT))).reshape(OUT)
    o16 = _halves(rng, int(np.prod(oshape))).reshape(oshape)
    n = int(np.prod(dshape))
    with np.errstate(invalid="ignore", over="ignore"):
        terms = (dz16.astype(np.float32) * o16.astype(np.float32)).astype(np.float32)
    ref = _sequential_reduce(terms, dshape)
    bc = _bc(OUT, dshape, oshape)
    slot = np.empty(n, np.float32)
    lib.tt_mul_grad_f32(ctypes.byref(bc), _p(dz16.astype(np.float32)), _p(o16.astype(np.float32)), _p(slot), n)
    assert _bits_nan_as_one(slot) == _bits_nan_as_one(ref)
    for form in range(8):
        hdz, ho, hd = bool(form & 1), bool(form & 2), bool(form & 4)
        dz, o = _as(dz16, hdz), _as(o16, ho)
        d = np.empty(n, np.float16 if hd else np.float32)
        lib.tt_mul_grad_f16(ctypes.byref(bc), *_pair(dz, hdz), *_pair(o, ho), *_pair(d, hd), n)
        want = _f16(ref) if hd else ref
        assert _bits_nan_as_one(d) == _bits_nan_as_one(want), (hdz, ho, hd)
        if hd:
            assert _bits_nan_as_one(d) == _bits_nan_as_one(_f16(slot)), (hdz, ho)


@pytest.mark.parametrize("dshape", SMALL + [(3, 4, 1), (5,)])
def test_the_golden_sub_and_mul_gradients_sum_in_the_c_order(lib, dshape):
    """stages/golden/fp16_exact's sub_grad and mul_grad (the golden model's for fp16-mixed and int8 graphs) give the
    fp32 kernels' bits (numpy's axis sums associate differently)."""
    from tinytrain.stages.golden import fp16_exact

    rng = np.random.default_rng(len(dshape))
    dz = rng.standard_normal(OUT).astype(np.float32)
    other = rng.standard_normal(OUT).astype(np.float32)
    n = int(np.prod(dshape))
    padded = (1,) * (4 - len(dshape)) + tuple(dshape)
    shape = lambda t: list(dshape)  # noqa: E731
    got = np.empty(n, np.float32)
    lib.tt_unbroadcast_f32(ctypes.byref(_bc(OUT, padded)), ctypes.c_float(-1.0), _p(dz), _p(got), n)
    sub = Op("sub_grad", ["dz"], ["db"], {"which": [1]})
    assert _bits(fp16_exact.run_sub_grad(sub, lambda j: dz, shape)[0]) == _bits(got)
    lib.tt_mul_grad_f32(ctypes.byref(_bc(OUT, padded, OUT)), _p(dz), _p(other), _p(got), n)
    mul = Op("mul_grad", ["dz", "o"], ["d"], {})
    assert _bits(fp16_exact.run_mul_grad(mul, lambda j: (dz, other)[j], shape)[0]) == _bits(got)
    # an exact cancellation: C's -a + a from +0 is +0, where the negated sum would be -0
    pair = np.zeros(OUT, np.float32)
    pair[0, 0, 0, 0], pair[1, 0, 0, 0] = 1.5, -1.5
    got1 = np.empty(1, np.float32)
    lib.tt_unbroadcast_f32(ctypes.byref(_bc(OUT, (1, 1, 1, 1))), ctypes.c_float(-1.0), _p(pair), _p(got1), 1)
    mine = fp16_exact.run_sub_grad(sub, lambda j: pair, lambda t: [1, 1, 1, 1])[0]
    assert _bits(mine) == _bits(got1) == _bits(np.zeros(1, np.float32))


# ---- the depthwise weight gradient ----------------------------------------------------------------------------------

def _dims(h: int, c: int, k: int, stride: int, pad: int, mult: int):
    o = (h + 2 * pad - k) // stride + 1
    return (ctypes.c_int32 * 16)(1, h, h, c, o, o, c * mult, k, k, stride, stride, 1, 1, pad, pad, mult), o


@pytest.mark.parametrize("k, stride, pad, mult, trained", [(3, 1, 1, 1, 6), (3, 2, 1, 1, 5), (5, 1, 2, 2, 3),
                                                           (1, 1, 0, 1, 6)])
def test_depthwise_weight_gradient_reads_an_fp16_output_gradient(lib, k, stride, pad, mult, trained):
    """tt_depthwise_conv2d_grad_weight_hdy_f32 (dz fp16, x fp32 or fp16) gives the fp32 kernel's bits on the widened
    values (every fp16 class of value in dz and x), and on finite values the golden model's
    (grad_ops.depthwise_conv2d_grad_weight); `trained`: the filters of input channels [0, k) only."""
    h, c = 7, 6
    d, o = _dims(h, c, k, stride, pad, mult)
    rng = np.random.default_rng(k * 10 + stride + mult)
    for nan in (True, False):
        dz16 = _halves(rng, o * o * c * mult, nan=nan).reshape(1, o, o, c * mult)
        x16 = _halves(rng, h * h * c, nan=nan).reshape(1, h, h, c)
        if not nan:   # finite, moderate values: the golden model's numpy kernel as the outside reference
            dz16 = rng.standard_normal(dz16.shape).astype(np.float16)
            x16 = rng.standard_normal(x16.shape).astype(np.float16)
        ref = np.empty((k * k, trained * mult), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            lib.tt_depthwise_conv2d_grad_weight_f32(d, trained, _p(dz16.astype(np.float32)),
                                                    _p(x16.astype(np.float32)), _p(ref))
        for hx in (False, True):
            got = np.empty_like(ref)
            x = _as(x16, hx)
            lib.tt_depthwise_conv2d_grad_weight_hdy_f32(d, trained, _p(np.ascontiguousarray(dz16)), *_pair(x, hx),
                                                        _p(got))
            assert _bits_nan_as_one(got) == _bits_nan_as_one(ref), (nan, hx)
        if not nan:
            attrs = {"stride_h": stride, "stride_w": stride, "dilation_h": 1, "dilation_w": 1,
                     "padding": "same" if pad else "valid", "depth_multiplier": mult}
            gold = grad_ops.depthwise_conv2d_grad_weight(dz16.astype(np.float32), x16.astype(np.float32),
                                                         [1, k, k, c * mult], attrs, trained)
            assert _bits(np.asarray(gold, np.float32).reshape(ref.shape)) == _bits(ref)


# ---- the graphs -----------------------------------------------------------------------------------------------------

H, C = 6, 8


def _block_all_trained(tmp: Path):
    """tests/test_fp16_written_block.py's inverted-residual block with every layer trained: conv A's output feeds the
    expand conv and the residual add, so its gradient is a fan-out sum (grad_accumulate of the expand's input gradient
    and the add's gradient share)."""
    g = _block_model(tmp)
    plan = TrainPlan([LayerPlan(op, bias=True, weight_ratio=1.0) for op in TrainPlan.trainable_ops(g)])
    return g, plan


def _sub_mul_model(tmp: Path) -> Graph:
    """conv A (relu) -> 1x1 conv B (relu6) -> r = B's global mean kept as [1, 1, 1, C] -> m = A * r (a per-channel
    broadcast: squeeze-excitation's scaling) -> s = m - B -> global mean -> FC. A and B each fan out (A: conv B, mul;
    B: the mean, the sub), so their gradients are sums; mul_grad reduces to r's shape, sub_grad negates B's share."""
    ts = {}
    t, w, b = _makers(ts, np.random.default_rng(9))
    geo = {"stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1}
    x = t("x", [1, H, H, 3], "input")
    axes = t("axes", [2], "const", np.array([1, 2], np.int32))
    ts["axes"].dtype = "int32"
    ops = [Op("conv2d", [x, w("a/w", [C, 3, 3, 3], 0.4), b("a/b", C)], [t("a", [1, H, H, C])],
              {**geo, "padding": "same", "act": "relu"}),
           Op("conv2d", ["a", w("b/w", [C, 1, 1, C], 0.5), b("b/b", C)], [t("bb", [1, H, H, C])],
              {**geo, "padding": "valid", "act": "relu6"}),
           Op("mean", ["bb", axes], [t("r", [1, 1, 1, C])], {"keep_dims": True}),
           Op("mul", ["a", "r"], [t("m", [1, H, H, C])], {"act": "none"}),
           Op("sub", ["m", "bb"], [t("s", [1, H, H, C])], {"act": "none"}),
           Op("mean", ["s", axes], [t("q", [1, C])], {"keep_dims": False}),
           Op("fully_connected", ["q", w("fc/w", [5, C], 0.3), b("fc/b", 5)], [t("y", [1, 5])],
              {"act": "none", "keep_num_dims": False})]
    ts["y"].role = "output"
    g = Graph(ts, ops, ["x"], ["y"])
    g.validate()
    write_model(g, tmp / "submul.tflite")
    return read_model(tmp / "submul.tflite")


def _sub_mul_all_trained(tmp: Path):
    g = _sub_mul_model(tmp)
    return g, TrainPlan([LayerPlan(op, bias=True, weight_ratio=1.0) for op in TrainPlan.trainable_ops(g)])


MODELS = {"block": _block_all_trained, "sub_mul": _sub_mul_all_trained}
POLICY = {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2}


def _train_graph(g: Graph, plan: TrainPlan):
    return build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))


@pytest.mark.parametrize("which", sorted(MODELS))
def test_fan_out_sub_and_mul_gradients_are_fp16_with_the_same_bits(which, tmp_path):
    """The fan-out sums, the sub / mul gradients and the depthwise weight gradient's dz are 2-byte tensors written and
    read by their kernels (no rounding op after them), the arena falls below the unfused graph's, the golden model
    trains both with the same bits, and sparse-plan's estimate meets the exact planner."""
    from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
    from tinytrain.stages.planning.plan_exact import exact_peak

    g, plan = MODELS[which](tmp_path)
    g16, ref = _fused_and_unfused(_train_graph(g, plan), POLICY)
    written = _written(g16)
    sums = [op for op in g16.ops if op.type == "grad_accumulate"]
    assert sums and all(o in written for op in sums for o in op.outputs)
    assert all(g16.tensors[t].dtype == "float16" for op in sums for t in op.inputs)
    if which == "block":
        dw = [op for op in g16.ops if op.type == "depthwise_conv2d_grad_weight"]
        assert dw and all(g16.tensors[op.inputs[0]].dtype == "float16" for op in dw)
    else:
        kinds = set(written.values())
        assert {"mul_grad", "sub_grad", "grad_accumulate"} <= kinds, kinds
        reduced = [o for op in g16.ops if op.type == "mul_grad" for o in op.outputs
                   if g16.tensors[o].shape == [1, 1, 1, C]]
        assert reduced and all(o in written for o in reduced)
    assert not {t for op in g16.ops if op.type == "round_f16" for t in op.inputs} & set(written)
    assert plan_schedules(g16, True)[1].arena < plan_schedules(ref, True)[1].arena
    _trains_alike(g16, ref, (H, H, 3), 5)
    st = MemorySettings(optimizer="sgd", batch_size=1, fp16_mixed=True)
    est = MemoryModel(g, st).estimate(plan)["total"]
    exact = exact_peak(g, plan, st, qas=False)["peak_bytes"]
    assert 0.95 <= est / exact <= 1.05, (est, exact)


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(MODELS))
def test_host_matches_golden_with_fp16_sums_and_sub_mul_gradients(which, tmp_path):
    """The graphs above compiled for the host (to_fp16_mixed's own choice of form, momentum): per-step losses, loss
    scale, skipped steps and trained weights equal the golden model's bit for bit, with the new kernels in the
    program (~15 s each: slow)."""
    from test_codegen import _data
    from test_fp16_codegen import _golden, _host_run, _scale

    from tinytrain.stages.train import fp16_mixed
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    g, plan = MODELS[which](tmp_path)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="momentum"), 1)
    tg = fp16_mixed.to_fp16_mixed(tg, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 2})
    x, y = _data(tg, 10)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9)
    res, losses, weights, _ = _host_run(tg, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    want = {"block": ("tt_sum_f16(", "tt_depthwise_conv2d_grad_weight_hdy_f32("),
            "sub_mul": ("tt_sum_f16(", "tt_mul_grad_f16(", "tt_unbroadcast_f16(")}[which]
    for fn in want:
        assert fn in src, fn
    state, scales, skipped, means = _golden(tg, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert _scale(res) == scales[-1] and res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name


@needs_cc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="no arm-none-eabi-gcc / qemu-system-arm")
def test_the_m55_gives_the_golden_bits_with_fp16_sums_and_depthwise_dz(tmp_path):
    """The block with every layer trained built for the Cortex-M55 board (mps3-an547, QEMU): the golden model's
    per-step losses and trained weights, bit for bit, as the host gives them (~10 s: slow)."""
    import json

    from test_codegen import _data
    from test_fp16_codegen import _golden

    from tinytrain.stages import codegen
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import get_board
    from tinytrain.stages.device.launch import run_firmware
    from tinytrain.stages.train import fp16_mixed
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    g, plan = MODELS["block"](tmp_path)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="momentum"), 1)
    tg = fp16_mixed.to_fp16_mixed(tg, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 2})
    x, y = _data(tg, 6)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    assert "tt_sum_f16(" in src and "tt_depthwise_conv2d_grad_weight_hdy_f32(" in src
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    board = get_board("mps3-an547")
    b = build_firmware(board, tmp_path / "prog", tmp_path / "build")
    run_firmware(board, b.elf, tmp_path / "run", {"runtime.bin": cfg.to_bytes(), "train.ttds": tmp_path / "train.ttds",
                                                  "test.ttds": tmp_path / "test.ttds"}, 600)
    losses = np.frombuffer((tmp_path / "run" / "losses.bin").read_bytes(), "<f4")
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    wb = (tmp_path / "run" / "weights.bin").read_bytes()
    state, _, _, means = _golden(tg, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    for t in io["trained_tensors"]:
        got = np.frombuffer(wb[t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        assert got.tobytes() == state[t["name"]].tobytes(), t["name"]
