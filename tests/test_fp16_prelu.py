"""fp16-mixed PReLU (issue 13): prelu reads and writes fp16 itself (OpDef.fp16_operands (0,) / fp16_output, C
tt_prelu_f16), so MediaPipe's BlazeBlocks (conv -> prelu -> depthwise -> prelu -> conv -> add -> prelu) keep their
results in 2-byte tensors. Before, every prelu read and wrote fp32, which cut the chain of fp16 results at each block:
in bench/coverage.py's fp16-mixed run on mps3-an547 face_landmark needed the same 671.0 KB as fp32 (its frozen
prefix's prelu results, fp32) and stopped at sparse-plan; planned with prelu writing fp16 its arena is 359.0 KB.

The fixture is tests/fixtures/prelu_block_float.tflite (tests/make_fixtures.py: a BlazeBlock in small, by TensorFlow's
converter). The reference is the same training graph with the fp16-written fusion off (fp32 slots rounded in place):
the golden model must train both with the same bits, the kernel must give the golden model's values bit for bit,
and sparse-plan's estimate must meet the plan."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from fp16_plan_checks import estimate_over_exact, fp16_arena_falls  # noqa: E402
from kernel_lib import host_kernel_lib  # noqa: E402 (tests/ is on sys.path)
from tinytrain.stages.golden import fp16 as f16ref
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from test_fp16_written import _assert_trains_alike, _fused_and_unfused, _written  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
KDIR = ROOT / "kernels_c"
H, CLASSES = 8, 5


def _model():
    return read_model(FIX / "prelu_block_float.tflite")


def _graphs(plan_of):
    g = _model()
    plan = plan_of(g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))
    return (g, plan, *_fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2}))


def _head_only(g) -> TrainPlan:
    *_, fc = TrainPlan.trainable_ops(g)
    return TrainPlan([LayerPlan(fc, bias=True, weight_ratio=1.0)])


def _all_layers(g) -> TrainPlan:
    return TrainPlan([LayerPlan(i, bias=True, weight_ratio=1.0) for i in TrainPlan.trainable_ops(g)])


def test_the_frozen_blazeblock_is_fp16_through_its_prelus():
    """Only the FC trains: every result of the block (conv, prelu, depthwise, prelu, conv, add, prelu) is a 2-byte
    tensor with no rounding op (its row streams stay whole), the arena falls and the estimate meets the plan. (The
    reference keeps a frozen prefix's results fp32, unrounded: fp16_mixed.prefix_results; the slow host test below
    checks these bits against the golden model.)"""
    g, plan, g16, ref = _graphs(_head_only)
    block = [op.outputs[0] for op in g.ops[:7]]
    assert [op.type for op in g.ops[:7]] == ["conv2d", "prelu", "depthwise_conv2d", "prelu", "conv2d", "add", "prelu"]
    written = _written(g16)
    assert set(block) <= set(written), {t: g16.tensors[t].dtype for t in block}
    assert not _written(ref)
    assert not [op for op in g16.ops if op.type == "round_f16" and set(op.inputs) & set(block)]
    fp16_arena_falls(g16, ref)
    ratio = estimate_over_exact(g, plan)
    assert 0.95 <= ratio <= 1.05, ratio


def test_a_trained_blazeblock_writes_its_prelus_as_fp16_with_the_unfused_bits():
    """Every layer trains: the prelus are in the backward's reach (their inputs saved, prelu_grad), and the fused
    graph still trains with the unfused graph's bits."""
    _, _, g16, ref = _graphs(_all_layers)
    assert "prelu" in set(_written(g16).values())
    _assert_trains_alike(g16, ref, H, CLASSES)


def _lib(tmp: Path) -> ctypes.CDLL:
    out = tmp / "libprelu16.so"
    return host_kernel_lib(out, ["ops/tt_prelu.c", "tt_common.c"], "-O1")


class _Bc(ctypes.Structure):
    _fields_ = [("shape", ctypes.c_int32 * 4), ("a_stride", ctypes.c_int32 * 4), ("b_stride", ctypes.c_int32 * 4)]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_prelu_f16_kernel_gives_the_golden_bits(tmp_path):
    """tt_prelu_f16 in its four forms (x fp32 / fp16, y fp32 / fp16) against tt_prelu_f32's definition on the widened
    input, rounded once when y is fp16 (the golden model's fp16 rounding): bit for bit, negative zeros, subnormals,
    infinities and values whose product rounds included."""
    lib = _lib(tmp_path)
    rng = np.random.default_rng(7)
    h, w, c = 5, 6, 7
    x = (rng.standard_normal((1, h, w, c)) * np.float32(2.0) ** rng.integers(-20, 12, (1, h, w, c))).astype(np.float32)
    x.flat[:6] = [0.0, -0.0, np.inf, -np.inf, 6.0e-8, -6.0e-8]
    alpha = rng.uniform(-0.5, 1.5, (1, 1, c)).astype(np.float32)
    bc = _Bc((1, h, w, c), (h * w * c, w * c, c, 1), (0, 0, 0, 1))
    p = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    for x_is_16 in (False, True):
        xv = f16ref.to_f16(x).astype(np.float32) if x_is_16 else x
        want = np.where(xv >= 0, xv, xv * alpha).astype(np.float32)
        xh = np.ascontiguousarray(f16ref.to_f16(x)) if x_is_16 else None
        yf, yh = np.zeros_like(x), np.zeros(x.shape, np.float16)
        args = (p(x), None) if not x_is_16 else (None, p(xh))
        lib.tt_prelu_f16(ctypes.byref(bc), *args, p(alpha), p(yf), None)
        assert yf.tobytes() == want.tobytes()
        lib.tt_prelu_f16(ctypes.byref(bc), *args, p(alpha), None, p(yh))
        assert yh.tobytes() == f16ref.to_f16(want).tobytes()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_host_build_of_the_fp16_blazeblock_has_the_golden_bits(tmp_path):
    """The frozen fp16 block on the host (row-streamed where the planner streams it): per-step losses, loss scale and
    the trained weights equal the golden model's bit for bit (~15 s: slow)."""
    from test_fp16_codegen import _golden, _host_run

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    _, _, g16, _ = _graphs(_head_only)
    x = np.random.default_rng(3).standard_normal((8, H, H, 3)).astype(np.float32)
    y = np.arange(8) % CLASSES
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    res, losses, weights, _ = _host_run(g16, x, y, tmp_path, cfg)
    assert "tt_prelu_f16" in (tmp_path / "prog" / "tt_model.c").read_text()
    state, scales, skipped, means = _golden(g16, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("arm-none-eabi-gcc") is None
                    or shutil.which("qemu-system-arm") is None, reason="no cc / arm-none-eabi-gcc / qemu-system-arm")
@pytest.mark.parametrize("scheme", ["full", "last_k"])
def test_fp16_blazeblock_trains_in_qemu_with_the_host_bits(tmp_path, scheme):
    """The fixture built for the host and for the Cortex-M55 in QEMU (every layer trained; only the FC, the block a
    frozen fp16 prefix): the per-step losses, the trained weights, the loss scale and the skipped steps are the same
    bits (tt_f16_read / tt_f16_narrow are VCVTB on the M55, integer C on the host)."""
    import json

    import tinytrain

    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, H, H, 3)).astype(np.float32)
    y = rng.integers(0, CLASSES, 16)
    np.savez(tmp_path / "d.npz", x_train=x[:12], y_train=y[:12], x_test=x[12:], y_test=y[12:])
    runs = {}
    for board in ("host", "mps3-an547"):
        r = tinytrain.build({
            "name": f"prelu-block-{scheme}-{board}", "model": {"path": str(FIX / "prelu_block_float.tflite")},
            "data": {"source": "npz", "path": str(tmp_path / "d.npz"), "task": "classification"},
            "train": {"precision": "fp16-mixed", "loss": "cross_entropy", "epochs": 2,
                      "update": {"scheme": scheme, **({"k": 1} if scheme == "last_k" else {})}},
            "target": {"board": board},
            "build": {"out_dir": str(tmp_path / "build"), "cache_dir": str(tmp_path / "c")}})
        runs[board] = (json.loads(r.artifact("emulate-run", "run.json").read_text()),
                       r.artifact("emulate-run", "weights.bin").read_bytes(),
                       r.artifact("codegen", "tt_model.c").read_text())
    (host, hw, src), (dev, dw, _) = runs["host"], runs["mps3-an547"]
    assert "tt_prelu_f16" in src
    assert dev["loss"]["per_step"] == host["loss"]["per_step"] and dw == hw
    assert dev["loss_scale"] == host["loss_scale"]
