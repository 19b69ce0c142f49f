"""fp16-mixed training (issue 13) compiled to C and run on the host, against the golden model, bit for bit.

The golden model runs fp16-mixed graphs with the fp32 backward and loss kernels in the C's order of operations
(stages/golden/fp16_exact.py), so every fp16 rounding agrees: losses, trained weights, the loss scale and the skipped
steps are compared exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.train.fp16_mixed import to_fp16_mixed
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.device.boards import get_board
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.train.runtime_config import RuntimeConfig

FIX = Path(__file__).parent / "fixtures"
RT_KEYS = ("learning_rate", "momentum", "beta1", "beta2", "eps", "alpha", "weight_decay")
# Each test builds a host firmware (~15 s): slow (run with -m slow).
pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler"), pytest.mark.slow]


def _graph(opt: str, batch: int, policy: dict, grads_fp16: bool | None = None, check_first: bool | None = None):
    g = read_model(FIX / "digits_cnn_float.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt), batch)
    return to_fp16_mixed(tg, policy, grads_fp16=grads_fp16, check_first=check_first)


def _host_run(tg, x, y, tmp: Path, cfg: RuntimeConfig):
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp / "prog")
    write_stream(tmp / "train.ttds", x, y)
    write_stream(tmp / "test.ttds", x[:8], y[:8])
    board = get_board("host")
    b = build_firmware(board, tmp / "prog", tmp / "build")
    run_firmware(board, b.elf, tmp / "run", {"runtime.bin": cfg.to_bytes(), "train.ttds": tmp / "train.ttds",
                                             "test.ttds": tmp / "test.ttds"}, 300)
    res = json.loads((tmp / "run" / "results.json").read_text())
    losses = np.frombuffer((tmp / "run" / "losses.bin").read_bytes(), "<f4")
    io = json.loads((tmp / "prog" / "io_layout.json").read_text())
    wb = (tmp / "run" / "weights.bin").read_bytes()
    weights = {t["name"]: np.frombuffer(wb[t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
               for t in io["trained_tensors"]}
    return res, losses, weights, mp


def _golden(tg, x, y, cfg, batch):
    back = RuntimeConfig.from_bytes(cfg.to_bytes())
    rt = {k: float(getattr(back, k)) for k in RT_KEYS}
    state = te.init_state(tg, rt)
    scales, skipped, means = [], [], []
    meta = tg.meta["train"]["loss_scale"]
    with np.errstate(all="ignore"):
        for i in range(len(x) // batch):
            means.append(te.train_step(tg, state, x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch], rt))
            scales.append(float(state[meta["scale_tensor"]]))
            skipped.append(int(state[meta["skipped_steps_tensor"]]))
    return state, scales, skipped, means


def _digits(n: int):
    x = np.load(FIX / "digits_cnn.input.npy").astype(np.float32)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(x), n)
    return x[idx], rng.integers(0, 10, n)


def _scale(res) -> float:
    return float(np.uint32(res["loss_scale_bits"]).view(np.float32))


@pytest.mark.parametrize("opt, batch, grads_fp16, check_first", [
    ("sgd", 1, True, False), ("momentum", 1, False, False), ("adam", 2, None, None),
    ("sgd", 1, None, True), ("adam", 1, None, True)])
def test_host_fp16_mixed_matches_golden(opt, batch, grads_fp16, check_first, tmp_path):
    """check_first: the overflow check's own backward pass, then in-place and channel-streamed updates."""
    # growth every 3 finite steps from 2^20: the run both backs off (overflows) and grows
    tg = _graph(opt, batch, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 3}, grads_fp16,
                check_first)
    assert tg.meta["train"]["loss_scale"]["check_first"] is bool(check_first)
    x, y = _digits(12 * batch)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9, alpha=0.99, eps=1e-7, batch_size=batch)
    res, losses, weights, mp = _host_run(tg, x, y, tmp_path, cfg)
    state, scales, skipped, means = _golden(tg, x, y, cfg, batch)
    assert res["steps"] == 12 and res["loss_nan"] is False
    assert _scale(res) == scales[-1] and res["skipped_steps"] == skipped[-1]
    assert 0 < skipped[-1] < 12 and len(set(scales)) > 2    # the policy was exercised both ways
    per_step = [np.float32(sum(losses[i * batch:(i + 1) * batch], np.float32(0)) / np.float32(batch))
                for i in range(12)]
    assert np.array(per_step, np.float32).tobytes() == np.array(means, np.float32).tobytes()
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name
    assert res["arena_bytes_planned"] == mp.arena
    if check_first:   # the weight gradients run channel by channel in both passes
        assert sum(st.kind == "channels" for st in mp.streams) >= 2


def test_overflow_skips_the_step_and_halves_the_scale_bit_exact(tmp_path):
    """A huge loss scale makes every fp16 gradient Inf: each step is skipped (weights and optimizer state untouched,
    bit for bit), the scale halves per step; C and golden agree exactly."""
    init = 2.0 ** 100
    tg = _graph("momentum", 1, {"kind": "dynamic", "init_scale": init, "max_scale": 2.0 ** 120}, check_first=True)
    x, y = _digits(5)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9)
    res, _, weights, _ = _host_run(tg, x, y, tmp_path, cfg)
    state, scales, skipped, _ = _golden(tg, x, y, cfg, 1)
    assert scales == [init * 0.5 ** k for k in range(1, 6)] and skipped == [1, 2, 3, 4, 5]
    assert _scale(res) == scales[-1] == 2.0 ** 95 and res["skipped_steps"] == 5
    for name, got in weights.items():
        orig = np.asarray(tg.tensors[name].data)
        assert got.tobytes() == orig.astype(got.dtype).tobytes() == state[name].tobytes(), name
    for name in tg.meta["train"]["optimizer_state"]:
        if name.startswith("opt/"):
            assert not np.asarray(state[name]).any(), name    # momentum buffers never moved


def test_static_scale_counts_skips_without_changing(tmp_path):
    tg = _graph("sgd", 1, {"kind": "static", "init_scale": 2.0 ** 100, "max_scale": 2.0 ** 100})
    x, y = _digits(3)
    res, _, _, _ = _host_run(tg, x, y, tmp_path, RuntimeConfig(learning_rate=0.01, epochs=1))
    assert _scale(res) == 2.0 ** 100 and res["skipped_steps"] == 3


@pytest.mark.parametrize("fixture, opt, reads_fp16", [
    ("dwsep_float", "momentum", "tt_depthwise_conv2d_grad_weight_hx_f32"),
    ("residual_float", "adam", "tt_conv2d_grad_weight_hdy_hx_f32_range"),   # its dz is written as fp16 too
    ("convnet_float", "sgd", "tt_conv2d_grad_weight_hdy_hx_f32_range")])   # its dz is written as fp16 too
def test_host_fp16_mixed_matches_golden_on_fixtures(fixture, opt, reads_fp16, tmp_path):
    """Depthwise convolutions, residual adds (fan-out gradients) and a conv net: the same bits as the golden model;
    `reads_fp16`: a weight gradient kernel that reads the saved fp16 input itself (no fp32 copy) is in the C."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_codegen import _data

    g = read_model(FIX / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt), 1)
    tg = to_fp16_mixed(tg, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 2})
    x, y = _data(tg, 10)
    cfg = RuntimeConfig(learning_rate=0.01, epochs=1, momentum=0.9, alpha=0.99, eps=1e-7)
    res, losses, weights, _ = _host_run(tg, x, y, tmp_path, cfg)
    assert f"{reads_fp16}(" in (tmp_path / "prog" / "tt_model.c").read_text()
    state, scales, skipped, means = _golden(tg, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert _scale(res) == scales[-1] and res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name
