"""fp16-mixed gradients stored as fp16 by the ops that make and read them (issue 13): act_grad, mean_grad and add_grad
read an fp16 gradient and write an fp16 one, and a broadcasting add (forward and gradient) reads and writes fp16,
where stages/train/fp16_mixed.fp16_written decides the tensor is a 2-byte one. Their kernels compute in fp32 and
round once on store, so they must give the bits of the fp32 kernels between a widening and tt_round_f16 (the
fp32-slot path they replace): checked here against numpy (float32 arithmetic, numpy's float16 conversion) and
against the fp32 kernels themselves, on every fp16 class of value, in place too; the rewritten graphs train with the
unfused graphs' bits in the golden model, and (slow) the host C equals the golden model bit for bit, and QEMU's
Cortex-M55 equals the host, on the example with every layer trained."""

from __future__ import annotations

import copy
import ctypes
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from kernel_lib import host_kernel_lib  # noqa: E402 (tests/ is on sys.path)
from tinytrain.stages.model.ir import Graph, Op
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train import fp16_mixed

sys.path.insert(0, str(Path(__file__).parent))
from test_fp16_written import _fused_and_unfused, _makers, _written  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
FIX = ROOT / "tests" / "fixtures"
ACTS = {"none": 0, "relu": 1, "relu6": 2, "relu_n1_to_1": 3}
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


# ---- the kernels against numpy and against the fp32 kernels ------------------------------------------------------

@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("f16g") / "libf16g.so"
    return host_kernel_lib(out, ["tt_f16.c", "tt_common.c", "ops/tt_act_grad.c", "ops/tt_mean.c", "ops/tt_add.c"],
                           "-O1")


def _p(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def _halves(rng, n: int, nan: bool = True) -> np.ndarray:
    """n fp16 values over every class: random bit patterns (normals, subnormals, +-0, +-Inf, quiet NaNs: what
    tt_f16_narrow can make), the edges of the activation masks among them."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    edges = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
                      0x3C00, 0xBC00, 0x4600, 0x45FF, 0x4601, 0x3BFF, 0xBBFF], np.uint16)
    bits[:len(edges)] = edges[:n]
    is_nan = (bits & 0x7C00) == 0x7C00
    is_nan &= (bits & 0x03FF) != 0
    bits[is_nan] |= 0x0200                        # quiet: a stored fp16 NaN is a rounding's result
    if not nan:
        bits[is_nan] = 0x3555
    return bits.view(np.float16)


def _f16(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, np.float32).astype(np.float16)


def _as(v16: np.ndarray, half: bool):
    """A value held as an fp16 tensor (half) or as an fp32 slot holding the same value."""
    return np.ascontiguousarray(v16) if half else v16.astype(np.float32)


def _pair(x, half: bool):
    return (None, _p(x)) if half else (_p(x), None)


def _bits(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _bits_nan_as_one(a) -> bytes:
    """_bits with every NaN as one pattern: a sum of two NaNs keeps either payload (IEEE leaves it open, and the
    compiler may swap the operands of an addition), so only NaN-ness is the sum's."""
    a = np.array(a)
    a[np.isnan(a)] = np.nan
    return a.tobytes()


@pytest.mark.parametrize("act", sorted(ACTS))
def test_act_grad_forms_give_the_fp32_kernel_rounded(lib, act):
    rng = np.random.default_rng(ACTS[act])
    n = 203
    dy16, y16 = _halves(rng, n), _halves(rng, n)
    y32 = y16.astype(np.float32)
    keep = {"none": np.ones(n, bool), "relu": y32 > 0, "relu6": (y32 > 0) & (y32 < 6),
            "relu_n1_to_1": (y32 > -1) & (y32 < 1)}[act]
    ref32 = np.where(keep, dy16.astype(np.float32), np.float32(0))   # the fp32 kernel on the widened values
    # the fp32 kernel itself (tt_act_grad_f32), rounded: the fp32-slot path
    slot = np.empty(n, np.float32)
    lib.tt_act_grad_f32(n, ACTS[act], _p(dy16.astype(np.float32)), _p(y32), _p(slot))
    assert _bits(slot) == _bits(ref32)
    for hdy in (False, True):
        for hy in (False, True):
            for hdx in (False, True):
                dy, y = _as(dy16, hdy), _as(y16, hy)
                dx = np.empty(n, np.float16 if hdx else np.float32)
                lib.tt_act_grad_f16(n, ACTS[act], *_pair(dy, hdy), *_pair(y, hy), *_pair(dx, hdx))
                want = _f16(ref32) if hdx else ref32
                assert _bits(dx) == _bits(want), (hdy, hy, hdx)


def test_act_grad_in_place_over_a_narrower_or_wider_gradient(lib):
    """dx written over dy: an fp16 dx over an fp32 dy (behind what it reads) and an fp32 dx over an fp16 dy (from the
    end) give the out-of-place bits."""
    rng = np.random.default_rng(7)
    n = 101
    dy16, y16 = _halves(rng, n), _halves(rng, n)
    want = np.where(y16.astype(np.float32) > 0, dy16.astype(np.float32), np.float32(0))
    buf = np.zeros(4 * n, np.uint8)
    buf[:2 * n] = np.frombuffer(dy16.tobytes(), np.uint8)
    lib.tt_act_grad_f16(n, ACTS["relu"], None, _p(buf), None, _p(y16), _p(buf), None)
    assert _bits(buf.view(np.float32)) == _bits(want)
    buf = np.frombuffer(dy16.astype(np.float32).tobytes(), np.uint8).copy()
    lib.tt_act_grad_f16(n, ACTS["relu"], _p(buf), None, None, _p(y16), None, _p(buf))
    assert _bits(buf[:2 * n].view(np.float16)) == _bits(_f16(want))


@pytest.mark.parametrize("h, w", [(6, 6), (4, 4), (1, 1), (3, 5)])
def test_mean_grad_forms_give_the_division_rounded(lib, h, w):
    """dy / count at every position (count a power of two or not: the positions form multiplies by 1 / count there,
    the same bits), dy and dx each fp32 or fp16; the fp32 kernel too (its quotient now computed once per channel)."""
    rng = np.random.default_rng(h * 10 + w)
    b, c, count = 2, 19, h * w
    dy16 = _halves(rng, b * c)
    q = (dy16.astype(np.float32) / np.float32(count)).reshape(b, 1, c)
    ref = np.broadcast_to(q, (b, count, c))
    dx = np.empty(b * count * c, np.float32)
    lib.tt_mean_hw_grad_f32(b, h, w, c, _p(dy16.astype(np.float32)), _p(dx))
    assert _bits(dx) == _bits(ref)
    for hdy in (False, True):
        for hdx in (False, True):
            dy = _as(dy16, hdy)
            dx = np.empty(b * count * c, np.float16 if hdx else np.float32)
            lib.tt_mean_hw_grad_f16(b, h, w, c, *_pair(dy, hdy), *_pair(dx, hdx))
            assert _bits(dx) == _bits(_f16(ref) if hdx else ref), (hdy, hdx)
            # the positions stream: positions at a time of one sample's gradient
            for positions in (1, 3):
                dx = np.empty(positions * c, np.float16 if hdx else np.float32)
                lib.tt_mean_hw_grad_positions_f16(positions, count, c, *_pair(dy[:c], hdy), *_pair(dx, hdx))
                want = np.broadcast_to(q[0], (positions, c))
                assert _bits(dx) == _bits(_f16(want) if hdx else want), (hdy, hdx, positions)


class _Bc(ctypes.Structure):
    _fields_ = [("shape", ctypes.c_int32 * 4), ("a_stride", ctypes.c_int32 * 4), ("b_stride", ctypes.c_int32 * 4)]


def _bc(out, a, b=None) -> _Bc:
    """codegen.bcast's tt_broadcast: the output's shape, each operand's strides (0 where it is broadcast)."""
    def strides(sh):
        st, acc = [0] * 4, 1
        for d in range(3, -1, -1):
            st[d] = acc if sh[d] != 1 else 0
            acc *= sh[d]
        return st
    return _Bc((ctypes.c_int32 * 4)(*out), (ctypes.c_int32 * 4)(*strides(a)),
               (ctypes.c_int32 * 4)(*strides(b if b is not None else a)))


OUT = (2, 3, 4, 5)
SMALL = [(1, 1, 1, 5), (1, 3, 1, 1), (2, 1, 4, 1), (1, 1, 1, 1), OUT]


@pytest.mark.parametrize("bshape", SMALL)
@pytest.mark.parametrize("act, lo, hi", [("none", -np.inf, np.inf), ("relu6", 0.0, 6.0)])
def test_broadcasting_add_forms_give_the_fp32_sum_rounded(lib, bshape, act, lo, hi):
    rng = np.random.default_rng(len(bshape) + int(hi if np.isfinite(hi) else 1))
    a16 = _halves(rng, int(np.prod(OUT)), nan=False).reshape(OUT)
    b16 = _halves(rng, int(np.prod(bshape)), nan=False).reshape(bshape)
    with np.errstate(invalid="ignore"):
        s = a16.astype(np.float32) + b16.astype(np.float32)
        ref = np.where(s < lo, np.float32(lo), np.where(s > hi, np.float32(hi), s)).astype(np.float32)
    y32 = np.empty(OUT, np.float32)
    lib.tt_add_f32_broadcast(ctypes.byref(_bc(OUT, OUT, bshape)), ctypes.c_float(lo), ctypes.c_float(hi),
                             _p(a16.astype(np.float32)), _p(b16.astype(np.float32)), _p(y32))
    assert _bits(y32) == _bits(ref)
    for ha in (False, True):
        for hb in (False, True):
            for hy in (False, True):
                a, b = _as(a16, ha), _as(b16, hb)
                y = np.empty(OUT, np.float16 if hy else np.float32)
                lib.tt_add_f16_broadcast(ctypes.byref(_bc(OUT, OUT, bshape)), ctypes.c_float(lo), ctypes.c_float(hi),
                                         *_pair(a, ha), *_pair(b, hb), *_pair(y, hy))
                assert _bits(y) == _bits(_f16(ref) if hy else ref), (ha, hb, hy)
    # in place over the operand of y's shape: an fp32 y over an fp16 a, an fp16 y over an fp32 a
    buf = np.zeros(4 * a16.size, np.uint8)
    buf[:2 * a16.size] = np.frombuffer(a16.tobytes(), np.uint8)
    lib.tt_add_f16_broadcast(ctypes.byref(_bc(OUT, OUT, bshape)), ctypes.c_float(lo), ctypes.c_float(hi), None,
                             _p(buf), None, _p(b16), _p(buf), None)
    assert _bits(buf.view(np.float32)) == _bits(ref)
    buf = np.frombuffer(a16.astype(np.float32).tobytes(), np.uint8).copy()
    lib.tt_add_f16_broadcast(ctypes.byref(_bc(OUT, OUT, bshape)), ctypes.c_float(lo), ctypes.c_float(hi), _p(buf),
                             None, None, _p(b16), None, _p(buf))
    assert _bits(buf[:2 * a16.size].view(np.float16)) == _bits(_f16(ref))


@pytest.mark.parametrize("dshape", SMALL)
def test_add_gradient_forms_give_the_fp32_reduction_rounded(lib, dshape):
    """The gradient of an operand broadcast to dz's shape: each element summed in fp32 in tt_unbroadcast_f32's
    order (dz's row-major order, from +0; a sequential sum here) and rounded once; the fp32 kernel's own sums,
    rounded, are the same bits."""
    rng = np.random.default_rng(sum(dshape))
    dz16 = _halves(rng, int(np.prod(OUT))).reshape(OUT)
    n = int(np.prod(dshape))
    dz32 = dz16.astype(np.float32)
    if n == dz16.size:
        ref = dz32.reshape(-1).copy()
    else:
        ref = np.zeros(n, np.float32)
        idx = np.arange(n).reshape(dshape)
        targets = np.broadcast_to(idx, OUT).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            for k, j in enumerate(targets):          # one element at a time, in order: the C's association
                ref[j] = np.float32(ref[j] + dz32.reshape(-1)[k])
    bc = _bc(OUT, dshape)
    slot = np.empty(n, np.float32)
    with np.errstate(invalid="ignore"):
        lib.tt_unbroadcast_f32(ctypes.byref(bc), ctypes.c_float(1.0), _p(dz32), _p(slot), n)
    assert _bits_nan_as_one(slot) == _bits_nan_as_one(ref)
    for hdz in (False, True):
        for hdx in (False, True):
            dz = _as(dz16, hdz)
            dx = np.empty(n, np.float16 if hdx else np.float32)
            lib.tt_unbroadcast_f16(ctypes.byref(bc), ctypes.c_float(1.0), *_pair(dz, hdz), *_pair(dx, hdx), n)
            want = _f16(ref) if hdx else ref
            assert _bits_nan_as_one(dx) == _bits_nan_as_one(want), (hdz, hdx)
            if hdx:   # and the fp32 kernel's sums rounded: the fp32-slot path's bits
                assert _bits_nan_as_one(dx) == _bits_nan_as_one(_f16(slot)), hdz
    if n == dz16.size:   # the copy in place: an fp32 dx over an fp16 dz (from the end)
        buf = np.zeros(4 * n, np.uint8)
        buf[:2 * n] = np.frombuffer(dz16.tobytes(), np.uint8)
        lib.tt_unbroadcast_f16(ctypes.byref(bc), ctypes.c_float(1.0), None, _p(buf), _p(buf), None, n)
        assert _bits(buf.view(np.float32)) == _bits(ref)


@pytest.mark.parametrize("dshape", SMALL + [(3, 4, 1), (5,)])
def test_the_golden_add_gradient_sums_in_the_c_order(lib, dshape):
    """stages/golden/fp16_exact.unbroadcast (the golden model's add_grad for fp16-mixed and int8 graphs) gives
    tt_unbroadcast_f32's bits on fp32 data (numpy's axis sums associate differently: their last bits differ)."""
    from tinytrain.stages.golden import fp16_exact

    dz = np.random.default_rng(len(dshape)).standard_normal(OUT).astype(np.float32)
    n = int(np.prod(dshape))
    padded = (1,) * (4 - len(dshape)) + tuple(dshape)
    got = np.empty(n, np.float32)
    lib.tt_unbroadcast_f32(ctypes.byref(_bc(OUT, padded)), ctypes.c_float(1.0), _p(dz), _p(got), n)
    assert _bits(fp16_exact.unbroadcast(dz, dshape)) == _bits(got)


# ---- the graphs ---------------------------------------------------------------------------------------------------


def _digits_full():
    g = read_model(FIX / "digits_cnn_float.tflite")
    return build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                                QASOptions(False))


def test_example_act_grad_reads_and_writes_fp16_with_the_same_bits():
    """The example, every layer trained: the first conv's input gradient (written by conv2d_grad_input) and its
    masked form (act_grad) are 2-byte tensors read by the weight and bias gradients, with no rounding op; the arena
    falls below the unfused graph's and fp32's on the same plan; the golden model trains both alike."""
    tg = _digits_full()
    a32 = plan_schedules(copy.deepcopy(tg), True)[1].arena
    g16, ref = _fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2})
    acts = [op for op in g16.ops if op.type == "act_grad"]
    assert acts and all(g16.tensors[op.inputs[0]].dtype == g16.tensors[op.outputs[0]].dtype == "float16"
                        for op in acts)
    rounded = {t for op in g16.ops if op.type == "round_f16" for t in op.inputs}
    assert not rounded & set(_written(g16))
    a16, aref = plan_schedules(g16, True)[1].arena, plan_schedules(ref, True)[1].arena
    assert a16 < aref and a16 < a32
    _trains_alike(g16, ref, (8, 8, 1), 10)


@pytest.mark.parametrize("grads_fp16", [True, False])
def test_bias_gradients_are_stored_as_the_weight_gradients_are(grads_fp16):
    """The trained gradients wait for the overflow check in the one-pass forms, stored whichever way plans the smaller
    arena (fp16_mixed.to_fp16_mixed's grads_fp16): the bias gradients follow the same choice as the weight gradients
    (fp16 tensors, or fp32 slots holding fp16 values)."""
    tg = fp16_mixed.to_fp16_mixed(_digits_full(), grads_fp16=grads_fp16, check_first=False)
    trained = tg.meta["train"]["trained"]
    kinds = {tg.tensors[d["gradient"]].dtype for d in trained.values()}
    assert kinds == {"float16" if grads_fp16 else "float32"}
    biases = [d["gradient"] for p, d in trained.items() if tg.tensors[p].role == "bias"]
    assert len(biases) == 3


def _trains_alike(g16: Graph, ref: Graph, shape, classes: int, steps: int = 6):
    from tinytrain.stages.golden import train_step as te

    x = np.random.default_rng(0).standard_normal((steps, *shape)).astype(np.float32)
    y = np.arange(steps) % classes
    runs = []
    for g in (g16, ref):
        st = te.init_state(g, {"learning_rate": 0.05})
        losses = [te.train_step(g, st, x[i:i + 1], y[i:i + 1], {"learning_rate": 0.05}) for i in range(steps)]
        runs.append((np.array(losses, np.float32), st))
    (l16, s16), (l32, s32) = runs
    assert l16.tobytes() == l32.tobytes()
    for name in g16.meta["train"]["trained"]:
        assert s16[name].tobytes() == s32[name].tobytes(), name


H, C = 6, 8


def _broadcast_model(tmp: Path) -> Graph:
    """conv A (relu) -> its global mean kept as [1, 1, 1, C] -> add(A, mean) (a row broadcast over H, W) -> 1x1 conv
    B (relu6) -> global mean -> FC: the add's gradient reaches the mean through a reduction over H, W."""
    ts = {}
    t, w, b = _makers(ts, np.random.default_rng(5))
    geo = {"stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1}
    x = t("x", [1, H, H, 3], "input")
    axes = t("axes", [2], "const", np.array([1, 2], np.int32))
    ts["axes"].dtype = "int32"
    ops = [Op("conv2d", [x, w("a/w", [C, 3, 3, 3], 0.4), b("a/b", C)], [t("a", [1, H, H, C])],
              {**geo, "padding": "same", "act": "relu"}),
           Op("mean", ["a", axes], [t("r", [1, 1, 1, C])], {"keep_dims": True}),
           Op("add", ["a", "r"], [t("s", [1, H, H, C])], {"act": "none"}),
           Op("conv2d", ["s", w("b/w", [C, 1, 1, C], 0.5), b("b/b", C)], [t("bb", [1, H, H, C])],
              {**geo, "padding": "valid", "act": "relu6"}),
           Op("mean", ["bb", axes], [t("m", [1, C])], {"keep_dims": False}),
           Op("fully_connected", ["m", w("fc/w", [5, C], 0.3), b("fc/b", 5)], [t("y", [1, 5])],
              {"act": "none", "keep_num_dims": False})]
    ts["y"].role = "output"
    g = Graph(ts, ops, ["x"], ["y"])
    g.validate()
    write_model(g, tmp / "bcast.tflite")
    return read_model(tmp / "bcast.tflite")


def _bcast_plan(g: Graph) -> TrainPlan:
    """Conv A and the FC trained, conv B's bias only: the add's result is then read by B's forward alone (a transient,
    not saved for a weight gradient)."""
    from tinytrain.stages.planning.train_plan import LayerPlan

    layers = TrainPlan.trainable_ops(g)   # a, b, fc
    return TrainPlan([LayerPlan(layers[0], bias=True, weight_ratio=1.0), LayerPlan(layers[1], bias=True),
                      LayerPlan(layers[2], bias=True, weight_ratio=1.0)])


def _broadcast_graphs(tmp: Path):
    g = _broadcast_model(tmp)
    tg = build_training_graph(g, _bcast_plan(g), "cross_entropy", OptimizerSpec(kind="sgd"), 1,
                              QASOptions(False))
    return g, _fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2})


def test_broadcasting_add_and_its_gradient_are_fp16_with_the_same_bits(tmp_path):
    """The add of a row broadcast over H, W writes its fp16 result, and its gradient op writes the row's reduced
    gradient as fp16 (mean_grad reads it); the golden model trains the graph with the unfused graph's bits, and the
    sparse-plan estimate meets the exact planner."""
    from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
    from tinytrain.stages.planning.plan_exact import exact_peak

    g, (g16, ref) = _broadcast_graphs(tmp_path)
    written = _written(g16)
    adds = [op for op in g16.ops if op.type == "add"]
    assert adds and all(o in written for op in adds for o in op.outputs)
    reduced = [o for op in g16.ops if op.type == "add_grad" for o in op.outputs
               if g16.tensors[o].shape == [1, 1, 1, C]]
    assert reduced and all(o in written for o in reduced)
    assert plan_schedules(g16, True)[1].arena < plan_schedules(ref, True)[1].arena
    _trains_alike(g16, ref, (H, H, 3), 5)
    st = MemorySettings(optimizer="sgd", batch_size=1, fp16_mixed=True)
    est = MemoryModel(g, st).estimate(_bcast_plan(g))["total"]
    exact = exact_peak(g, _bcast_plan(g), st, qas=False)["peak_bytes"]
    assert 0.95 <= est / exact <= 1.05, (est, exact)


# ---- host C == golden, QEMU == host (slow: each builds a firmware) ---------------------------------------------

def _with_a_head(path: Path, tmp: Path, classes: int = 3) -> Graph:
    """The model at `path` (one NHWC feature-map output) with a global mean and an FC classifier after it, so that it
    trains on class labels (the training stream's targets)."""
    g = read_model(path)
    ts = dict(g.tensors)
    t, w, b = _makers(ts, np.random.default_rng(2))
    out = g.outputs[0]
    ts[out].role = "activation"
    c = ts[out].shape[-1]
    axes = t("head/axes", [2], "const", np.array([1, 2], np.int32))
    ts[axes].dtype = "int32"
    ops = list(g.ops) + [
        Op("mean", [out, axes], [t("head/m", [1, c])], {"keep_dims": False}),
        Op("fully_connected", ["head/m", w("head/w", [classes, c], 0.5), b("head/b", classes)],
           [t("head/y", [1, classes], "output")], {"act": "none", "keep_num_dims": False})]
    h = Graph(ts, ops, list(g.inputs), ["head/y"])
    h.validate()
    write_model(h, tmp / "headed.tflite")
    return read_model(tmp / "headed.tflite")


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("which", ["broadcast", "bn_input", "bn_input_prefix"])
def test_host_matches_golden_with_a_broadcasting_add(which, tmp_path):
    """The graph above, and the fixture with a broadcasting add (tests/fixtures/ops/bn_input_float.tflite: a
    per-channel constant added to the input, with a classifier head) compiled for the host: the golden model's
    losses, loss scale and trained weights, bit for bit. Every layer trained, the add's result is saved for the
    conv's weight gradient (fp32, cast); with the head alone trained (bn_input_prefix) it is a frozen-prefix result
    the conv reads as fp16, which the broadcasting add writes itself."""
    from test_codegen import _data
    from test_fp16_codegen import _golden, _host_run, _scale

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    g = _broadcast_model(tmp_path) if which == "broadcast" else _with_a_head(FIX / "ops" / "bn_input_float.tflite",
                                                                          tmp_path)
    plan = {"broadcast": _bcast_plan, "bn_input": TrainPlan.full,
            "bn_input_prefix": lambda g: TrainPlan.last_k(g, 1)}[which](g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="momentum"), 1)
    tg = fp16_mixed.to_fp16_mixed(tg, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 2})
    x, y = _data(tg, 10)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9)
    res, losses, weights, _ = _host_run(tg, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    if which == "broadcast":
        assert "tt_add_f16_broadcast(" in src and "tt_unbroadcast_f16(" in src
    if which == "bn_input_prefix":
        assert "tt_add_f16_broadcast(" in src
    state, scales, skipped, means = _golden(tg, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert _scale(res) == scales[-1] and res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name


@needs_cc
@pytest.mark.slow
def test_example_every_layer_trained_on_the_m55_has_the_host_bits(tmp_path):
    """The example in fp16-mixed with `scheme: full` (act_grad and the conv gradients on fp16 tensors): QEMU's
    Cortex-M55 gives the host's per-step losses, loss scale, skipped steps and trained weights."""
    import tinytrain

    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None:
        pytest.skip("no arm-none-eabi-gcc / qemu-system-arm")
    runs = {}
    for board in ("host", "mps3-an547"):
        spec = {"name": f"f16g-{board}", "model": {"path": str(FIX / "digits_cnn_float.tflite")},
                "data": {"source": "digits"},
                "train": {"precision": "fp16-mixed", "epochs": 1, "max_train_samples": 120,
                          "update": {"scheme": "full"}},
                "target": {"board": board}, "build": {"out_dir": str(tmp_path / "build")}}
        r = tinytrain.build(spec)
        src = r.artifact("codegen", "tt_model.c").read_text()
        runs[board] = (json.loads(r.artifact("emulate-run", "run.json").read_text()),
                       r.artifact("emulate-run", "weights.bin").read_bytes(), src)
    (host, hw, src), (dev, dw, _) = runs["host"], runs["mps3-an547"]
    assert "tt_act_grad_f16(" in src
    assert dev["loss"]["per_step"] == host["loss"]["per_step"]
    assert dev["loss_scale"]["final"] == host["loss_scale"]["final"]
    assert dev["loss_scale"]["skipped_steps"] == host["loss_scale"]["skipped_steps"]
    assert dw == hw
