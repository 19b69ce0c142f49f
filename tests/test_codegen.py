"""codegen: generated C training programs against the numpy golden model (DESIGN §8 step 4), and QEMU vs host.

Per case: fixture model -> training IR (autodiff) -> schedule + memory plan (reorder) -> C (codegen) -> host build
(-std=c99 -Wall -Wextra -Werror -ffp-contract=off + ASan/UBSan, TT_DUMP_TENSORS=1) -> run on a small TTDS set
(firmware protocol of stages/train/runtime_config.py). Checked:
  - int8 forward outputs (the prediction of every test sample, eval_out.bin) bit-exact vs stages/golden/forward.py,
    float forward within 1e-5 relative;
  - per-sample losses (losses.bin) vs stages/golden/train_step.py within 1e-5 relative (or 1e-6 absolute: a loss
    near 0 is log(1 + tiny), where one ulp of the sum is a large relative error on either side);
  - after 20 steps: int8/int32 trained tensors identical to the golden model, float ones within 1e-5 relative
    (of the tensor's largest magnitude) -- the gradients feed these, so this checks the fp32 backward too;
  - results.json (accuracy counts vs the executor, steps, arena planned/used).
One QEMU run (stm32f746-disco): results.json, losses.bin, weights.bin byte-identical to the host's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages import codegen
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.device.boards import get_board
from tinytrain.stages.cross_compile import build_firmware
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.runtime_config import RuntimeConfig
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

FIX = Path(__file__).resolve().parent / "fixtures"
STEPS = 20
RT_KEYS = ("learning_rate", "momentum", "beta1", "beta2", "eps", "alpha", "weight_decay")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


@pytest.fixture(scope="module")
def digits_int8():
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages.quantize import quantize_model

    g = read_model(FIX / "digits_cnn_float.tflite")
    x = np.load(FIX / "digits_cnn.input.npy").astype(np.float32)
    calib = np.concatenate([x, np.random.default_rng(1).uniform(0, 1, (32,) + x.shape[1:]).astype(np.float32)])
    qg, _ = quantize_model(g, calib, QuantizeSpec())
    return qg


def _plan(g, scheme: str) -> TrainPlan:
    if scheme == "full":
        return TrainPlan.full(g)
    if scheme == "last_k":
        return TrainPlan.last_k(g, 2)
    if scheme == "bias_only":
        return TrainPlan.bias_only(g)
    if scheme == "partial":
        ops = TrainPlan.trainable_ops(g)
        # The last layer whole, the one before on half of its input channels (sparse update, DESIGN §6).
        return TrainPlan([LayerPlan(ops[-2], bias=True, weight_ratio=0.5), LayerPlan(ops[-1], bias=True,
                                                                                    weight_ratio=1.0)])
    raise ValueError(scheme)


def _build_case(g, scheme, opt, out: Path, lr=0.05):
    tg = build_training_graph(g, _plan(g, scheme), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=lr), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    summ = codegen.generate(tg, mp.order, mp.to_json(), out / "prog")
    return tg, mp, summ


def _data(tg, n, seed=0):
    meta = tg.meta["train"]
    x_t = tg.tensors[[t for t in tg.inputs if t != meta["label_input"]][0]]
    rng = np.random.default_rng(seed)
    if x_t.dtype == "int8":
        x = rng.integers(-128, 128, size=[n] + list(x_t.shape[1:])).astype(np.int8)
    else:
        x = rng.standard_normal([n] + list(x_t.shape[1:])).astype(np.float32)
    k = tg.tensors[meta["prediction"]].shape[-1]
    return x, rng.integers(0, k, n)


def _run(board_name, prog: Path, build: Path, rundir: Path, cfg: RuntimeConfig, data: dict, sanitize=(),
         defines=None):
    board = get_board(board_name)
    b = build_firmware(board, prog, build, sanitize=sanitize, defines=defines or {})
    files = {"runtime.bin": cfg.to_bytes(), **data}
    run_firmware(board, b.elf, rundir, files, 300)
    return {n: (rundir / n).read_bytes() for n in ("results.json", "losses.bin", "weights.bin")}


def _host_and_qemu(tmp_path: Path, cfg: RuntimeConfig) -> tuple[dict, dict]:
    """tmp_path/prog trained on tmp_path's train.ttds / test.ttds natively and in QEMU (stm32f746-disco): the losses
    and trained weights must be the same bytes. Returns both results.json without the instruction counts (the host
    has no instruction counter: 0), for the caller to compare; the QEMU run's per-step count is checked here."""
    data = {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}
    host = _run("host", tmp_path / "prog", tmp_path / "bh", tmp_path / "rh", cfg, data)
    qemu = _run("stm32f746-disco", tmp_path / "prog", tmp_path / "bq", tmp_path / "rq", cfg, data)
    assert qemu["losses.bin"] == host["losses.bin"]
    assert qemu["weights.bin"] == host["weights.bin"]
    rh, rq = json.loads(host["results.json"]), json.loads(qemu["results.json"])
    assert rq["instructions_per_step_min"] > 0
    for r in (rh, rq):
        for k in ("instructions_total_train", "instructions_per_step_min", "instructions_per_step_max",
                  "instructions_per_step_mean"):
            r.pop(k)
    return rh, rq


def _host_run_dumped(tmp_path: Path, cfg: RuntimeConfig) -> dict:
    """tmp_path/prog trained on the host under ASan/UBSan on tmp_path's train.ttds / test.ttds, the evaluations'
    head outputs dumped (run/eval_out.bin)."""
    return _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg,
                {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
                sanitize=("address", "undefined"), defines={"TT_DUMP_TENSORS": "1"})


def _check_first_evaluation(tg, x, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The dumped head outputs of both evaluations (8 test samples before training, 8 after) and the golden
    forward of those samples, which the first evaluation equals (int8 bit for bit, float within 1e-5)."""
    head_t = tg.tensors[tg.meta["train"]["prediction"]]
    ev = np.frombuffer((tmp_path / "run" / "eval_out.bin").read_bytes(), head_t.dtype).reshape(16, -1)
    ref = _forward_ref(tg, x[:8]).reshape(8, -1)
    if head_t.dtype == "int8":
        np.testing.assert_array_equal(ev[:8], ref)
    else:
        np.testing.assert_allclose(ev[:8], ref, rtol=1e-5, atol=1e-6)
    return ev, ref


def _check_trained(out: dict, io: dict, state: dict, exact: bool = False) -> dict[str, np.ndarray]:
    """weights.bin's trained tensors equal the golden model's: int8 / int32 bit for bit, float32 within 1e-5 of the
    tensor's largest value (bit for bit too when `exact`). Returns them by name."""
    trained = {}
    for t in io["trained_tensors"]:
        got = np.frombuffer(out["weights.bin"][t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        exp = state[t["name"]]
        if t["dtype"] == "float32" and not exact:
            assert float(np.max(np.abs(got - exp))) <= 1e-5 * max(float(np.max(np.abs(exp))), 1e-30), t["name"]
        else:
            np.testing.assert_array_equal(got, exp, err_msg=t["name"])
        trained[t["name"]] = got
    return trained


def _golden(tg, x, y, cfg):
    back = RuntimeConfig.from_bytes(cfg.to_bytes())  # the f32 values the firmware reads
    rt = {k: float(getattr(back, k)) for k in RT_KEYS}
    state = te.init_state(tg, {**rt, "seed": cfg.seed})
    losses = [te.train_step(tg, state, x[i:i + 1], y[i:i + 1], rt) for i in range(len(x))]
    return np.array(losses, np.float32), state


def _forward_ref(tg, x):
    """The prediction head of the training forward, per sample, by the reference executor."""
    meta = tg.meta["train"]
    n_fwd = int(meta["phases"]["forward"])
    from tinytrain.stages.model.ir import Graph
    ops = [op for op in tg.ops[:n_fwd] if op.type != "clamp_mask"]   # autodiff's backward masks: not inference
    fg = Graph(tensors=tg.tensors, ops=ops, inputs=[t for t in tg.inputs if t != meta["label_input"]],
               outputs=[meta["prediction"]], meta={})
    return run_graph(fg, {fg.inputs[0]: x})[meta["prediction"]]


CASES = [
    ("mlp_float", "full", "sgd"),
    ("convnet_float", "full", "adam"),
    ("dwsep_float", "last_k", "momentum"),
    ("residual_float", "partial", "rmsprop"),
    ("mlp_int8", "full", "sgd"),
    ("convnet_int8", "full", "rmsprop"),
    ("dwsep_int8", "full", "adam"),
    ("residual_int8", "bias_only", "sgd"),
    ("digits", "full", "sgd"),
    ("digits", "last_k", "momentum"),
    ("digits", "partial", "sgd"),
]


@pytest.mark.parametrize("fixture,scheme,opt", CASES, ids=["-".join(c) for c in CASES])
def test_host_matches_golden_model(fixture, scheme, opt, tmp_path, digits_int8):
    g = digits_int8 if fixture == "digits" else read_model(FIX / f"{fixture}.tflite")
    tg, mp, summ = _build_case(g, scheme, opt, tmp_path)
    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:8], y[:8])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9, alpha=0.99, eps=1e-7)
    out = _host_run_dumped(tmp_path, cfg)
    res = json.loads(out["results.json"])
    meta = tg.meta["train"]

    # Forward: evaluated before (untrained weights) and after; compare the first evaluation.
    _, ref = _check_first_evaluation(tg, x, tmp_path)
    assert res["acc_before"] == {"correct": int((ref.argmax(axis=1) == y[:8]).sum()), "total": 8}

    losses = np.frombuffer(out["losses.bin"], "<f4")
    want, state = _golden(tg, x, y, cfg)
    assert losses.shape == (STEPS,)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)

    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    assert [t["name"] for t in io["trained_tensors"]] == list(meta["trained"])
    assert len(out["weights.bin"]) == io["weights_bytes"]
    _check_trained(out, io, state)

    assert res["protocol"] == 1 and res["steps"] == STEPS and res["samples"] == STEPS
    assert res["loss_nan"] is False
    assert res["arena_bytes_planned"] == mp.arena == summ["arena_bytes"]
    assert 0 < res["arena_bytes_used"] <= res["arena_bytes_planned"]


def test_codegen_artifacts_and_summary(tmp_path, digits_int8):
    _, _, summ = _build_case(digits_int8, "full", "sgd", tmp_path)
    prog = tmp_path / "prog"
    assert {p.name for p in prog.iterdir()} >= {"tt_model.c", "sources.json", "io_layout.json", "codegen.json"}
    src = (prog / "tt_model.c").read_text()
    assert "malloc" not in src and "printf(" not in src.replace("snprintf(", "")
    assert "static const int8_t" in src  # frozen weights in flash
    line = codegen.summary_line(summ)
    assert line.startswith("C: ") and "kernel calls" in line and "arena" in line


def test_nan_loss_stops_with_results(tmp_path):
    g = read_model(FIX / "mlp_float.tflite")
    tg, _, _ = _build_case(g, "full", "sgd", tmp_path, lr=1e30)
    x, y = _data(tg, 10)
    x = (x * 1e3).astype(np.float32)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:2], y[:2])
    board = get_board("host")
    b = build_firmware(board, tmp_path / "prog", tmp_path / "build")
    r = run_firmware(board, b.elf, tmp_path / "run", {"runtime.bin": RuntimeConfig(learning_rate=1e30).to_bytes(),
                                                      "train.ttds": tmp_path / "train.ttds",
                                                      "test.ttds": tmp_path / "test.ttds"}, 60, check=False)
    assert r.exit_code == 1
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["loss_nan"] is True


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_qemu_matches_host_bit_for_bit(tmp_path, digits_int8):
    tg, mp, _ = _build_case(digits_int8, "full", "sgd", tmp_path)
    x, y = _data(tg, 12, seed=3)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:6], y[:6])
    rh, rq = _host_and_qemu(tmp_path, RuntimeConfig(learning_rate=0.05, epochs=1))
    assert rq == rh
    assert rq["arena_bytes_used"] <= rq["arena_bytes_planned"] == mp.arena


QAS_CASES = [("convnet_int8", "stochastic", False, "sgd"), ("convnet_int8", "nearest", True, "adam"),
             ("dwsep_int8", "stochastic", False, "momentum")]


@pytest.mark.parametrize("fixture,rounding,master,opt", QAS_CASES,
                         ids=[f"{c[0]}-{c[1]}-{'master' if c[2] else 'nomaster'}-{c[3]}" for c in QAS_CASES])
def test_qas_variants_bit_exact(fixture, rounding, master, opt, tmp_path):
    """QAS rounding modes (stochastic: the xorshift32 streams seeded from runtime.bin's seed) and the fp32 master
    copy: int8/int32 parameters identical to stages/quant/qas.py after 20 steps."""
    from tinytrain.stages.autodiff import QASOptions

    g = read_model(FIX / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt), 1,
                              QASOptions(True, rounding, master))
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    cfg = RuntimeConfig(learning_rate=0.05, seed=7)
    out = _run("host", tmp_path / "prog", tmp_path / "b", tmp_path / "r", cfg,
               {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
               sanitize=("address", "undefined"))
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    _check_trained(out, json.loads((tmp_path / "prog" / "io_layout.json").read_text()), state, exact=True)


# ---- split weights, fused weight dequantize, exact arena high-water (issue 5: MobileNetV2 on the board) --------

SPLIT_CASES = {
    # conv 3x3 on 2 of 3 input channels, conv 3x3 on 2 of 8 (its input gradient reads the split weight), FC whole
    "convnet_int8": ([(0, 0.5), (2, 0.25), (5, 1.0)], "sgd"),
    # pointwise conv on 4 of 8 channels, conv 3x3 on 1 of 8, FC whole; momentum state is compact too
    "residual_int8": ([(0, 0.5), (1, 0.125), (5, 1.0)], "momentum"),
}


@pytest.mark.parametrize("fixture", sorted(SPLIT_CASES))
def test_split_weights_live_compact_in_the_arena_and_stay_bit_exact(fixture, tmp_path):
    """A weight trained on a channel slice keeps only that slice in SRAM, at its planned arena offset (the frozen
    channels are read from the flash original); the input gradients read int8 weights directly (no fp32 copy).
    Same numbers as the golden model, and nothing of the program's SRAM is outside the plan."""
    from tinytrain.stages.planning.arena import fused_dequantize

    g = read_model(FIX / f"{fixture}.tflite")
    layers, opt = SPLIT_CASES[fixture]
    plan = TrainPlan([LayerPlan(i, bias=True, weight_ratio=r) for i, r in layers])
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    summ = codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    partial = [p for p, i in tg.meta["train"]["trained"].items()
               if i["n"] is not None and i["n"] < tg.tensors[p].shape[-1]]
    assert len(partial) == 2 and summ["split_weights"] == sorted(partial)
    assert summ["sram_outside_arena_bytes"] == 0 and "static int8_t tt_s" not in src
    assert "tt_conv2d_s8_split(" in src and "tt_conv2d_grad_input_qw_f32(" in src
    fused = fused_dequantize(tg)
    assert fused and summ["fused_dequantize"] == len(fused)
    assert "tt_dequantize_per_channel_s8_f32" not in src  # every weight dequantize is fused
    planned = {t for b in mp.buffers for t in b.tensors}
    assert not set(fused) & planned  # the fp32 copies take no arena

    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9)
    out = _run("host", tmp_path / "prog", tmp_path / "b", tmp_path / "r", cfg,
               {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
               sanitize=("address", "undefined"))
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    trained = _check_trained(out, io, state, exact=True)  # weights.bin holds the merged whole tensor
    changed = sum(int(np.count_nonzero(v != tg.tensors[n].data)) for n, v in trained.items())
    assert changed > 0
    res = json.loads(out["results.json"])
    end = max(b.offset + b.size for b in mp.buffers if b.size)
    assert res["arena_end_planned"] == -(-end // 4) * 4 == res["arena_bytes_used"]
    assert res["arena_bytes_planned"] == mp.arena


def test_fused_weight_readers_run_before_the_weight_update(digits_int8):
    """A fused dequantize's readers read the int8 weight when they run, so schedule.dependencies makes the in-place
    update of a trained weight wait for them (they would read the updated weight otherwise)."""
    from tinytrain.stages.planning.arena import counted_bytes, fused_dequantize
    from tinytrain.stages.planning.schedule import dependencies

    tg = build_training_graph(digits_int8, _plan(digits_int8, "full"), "cross_entropy", OptimizerSpec(), 1)
    fused = fused_dequantize(tg)
    assert fused and not set(fused) & set(counted_bytes(tg))
    preds = dependencies(tg)
    checked = 0
    for i, op in enumerate(tg.ops):
        if op.type.startswith("qas_") and op.inputs[0] in fused.values():
            readers = [j for j, o in enumerate(tg.ops) if any(fused.get(t) == op.inputs[0] for t in o.inputs)]
            assert readers and all(j in preds[i] for j in readers)
            checked += 1
    assert checked > 0


# ---- ops added for converter models (MUL, SUB, broadcast ADD, LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU, PRELU,
# STRIDED_SLICE): the converter-made fixtures of tests/fixtures/ops/ trained on the host ------------------------

OPS = FIX / "ops"
HEAD_CLASSES = 4


def _with_classifier_head(g, seed=0):
    """The fixture graph (whose output is a feature map, no classifier) with a FULLY_CONNECTED head of
    HEAD_CLASSES logits on its flattened output, so that it trains with cross-entropy on integer labels (the
    firmware protocol streams labels). int8: per-channel symmetric weights, zero bias (scale s_x * s_w, as the
    converter), the logits' scale from the float logits of random inputs."""
    from tinytrain.stages.model.ir import Op, QuantParams, Tensor

    feat = g.outputs[0]
    ft = g.tensors[feat]
    depth = int(np.prod(ft.shape[1:]))
    rng = np.random.default_rng(seed)
    wf = (rng.standard_normal((HEAD_CLASSES, depth)) * (2.0 / np.sqrt(depth))).astype(np.float32)
    w, b, y = "head/w", "head/b", "head/logits"
    if ft.dtype == "int8":
        inp = g.tensors[g.inputs[0]]
        xin = rng.integers(-128, 128, size=[16] + list(inp.shape[1:])).astype(np.int8)
        s_x, z_x = float(ft.quant.scale[0]), int(ft.quant.zero_point[0])
        feats = (run_graph(g, {g.inputs[0]: xin})[feat].astype(np.float32) - z_x) * np.float32(s_x)
        s_w = (np.abs(wf).max(axis=1) / 127).astype(np.float32)
        wq = np.clip(np.round(wf / s_w[:, None]), -127, 127).astype(np.int8)
        s_y = float(np.abs(feats.reshape(16, -1) @ wf.T).max()) * 1.5 / 127
        g.tensors[w] = Tensor(w, [HEAD_CLASSES, depth], "int8", role="weight",
                              quant=QuantParams([float(s) for s in s_w], [0] * HEAD_CLASSES, 0), data=wq)
        g.tensors[b] = Tensor(b, [HEAD_CLASSES], "int32", role="bias",
                              quant=QuantParams([float(np.float32(s_x * float(s))) for s in s_w],
                                                [0] * HEAD_CLASSES, 0),
                              data=np.zeros(HEAD_CLASSES, np.int32))
        g.tensors[y] = Tensor(y, [1, HEAD_CLASSES], "int8", quant=QuantParams([float(np.float32(s_y))], [0]))
    else:
        g.tensors[w] = Tensor(w, [HEAD_CLASSES, depth], "float32", role="weight", data=wf)
        g.tensors[b] = Tensor(b, [HEAD_CLASSES], "float32", role="bias", data=np.zeros(HEAD_CLASSES, np.float32))
        g.tensors[y] = Tensor(y, [1, HEAD_CLASSES], "float32")
    g.ops.append(Op("fully_connected", [feat, w, b], [y], {"act": "none", "keep_num_dims": False}))
    g.outputs = [y]
    return g


# fixture -> C kernels the generated program must call (forward and backward), so the case really runs them
OP_CASES = {
    "act_arith_int8": ["tt_logistic_s8(", "tt_tanh_s8(", "tt_mul_s8(", "tt_sub_s8(", "tt_hard_swish_s8(",
                       "tt_leaky_relu_s8(", "tt_mul_grad_f32(", "tt_unbroadcast_f32(", "tt_logistic_grad_f32(",
                       "tt_tanh_grad_f32(", "tt_hard_swish_grad_f32(", "tt_leaky_relu_grad_f32("],
    "act_arith_float": ["tt_logistic_f32(", "tt_tanh_f32(", "tt_mul_f32(", "tt_sub_f32(", "tt_hard_swish_f32(",
                        "tt_leaky_relu_f32(", "tt_mul_grad_f32(", "tt_unbroadcast_f32(", "tt_logistic_grad_f32(",
                        "tt_tanh_grad_f32(", "tt_hard_swish_grad_f32(", "tt_leaky_relu_grad_f32("],
    "prelu_slice_int8": ["tt_prelu_s8(", "tt_strided_slice_s8(", "tt_prelu_grad_f32(", "tt_strided_slice_grad_f32("],
    "prelu_slice_float": ["tt_prelu_f32(", "tt_strided_slice_f32(", "tt_prelu_grad_f32(",
                          "tt_strided_slice_grad_f32("],
    "bn_input_int8": ["tt_mul_s8(", "tt_add_s8_broadcast("],
    "bn_input_float": ["tt_mul_f32(", "tt_add_f32_broadcast("],
}


@pytest.mark.parametrize("fixture", sorted(OP_CASES))
def test_new_ops_train_like_the_golden_model(fixture, tmp_path):
    """The converter's float and int8 fixtures (through a classifier head) trained 20 steps on the host (ASan/UBSan):
    int8 forward bit-exact, losses within 1e-5, int8/int32 parameters identical and float ones within 1e-5."""
    g = _with_classifier_head(read_model(OPS / f"{fixture}.tflite"))
    opt = "sgd" if fixture.endswith("int8") else "adam"
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    for call in OP_CASES[fixture]:
        assert call in src, call
    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:8], y[:8])
    cfg = RuntimeConfig(learning_rate=0.05 if opt == "sgd" else 0.01, epochs=1)
    out = _host_run_dumped(tmp_path, cfg)
    _check_first_evaluation(tg, x, tmp_path)
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    trained = _check_trained(out, io, state)
    changed = sum(int(np.count_nonzero(got != tg.tensors[n].data)) for n, got in trained.items())
    assert changed > 0  # training moved the parameters
    res = json.loads(out["results.json"])
    assert res["steps"] == STEPS and res["loss_nan"] is False
    assert 0 < res["arena_bytes_used"] <= res["arena_bytes_planned"] == mp.arena


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
@pytest.mark.parametrize("fixture", ["act_arith_float", "act_arith_int8"])
def test_new_ops_qemu_matches_host_bit_for_bit(fixture, tmp_path):
    """tt_expf / tt_tanhf and the fixed-point LOGISTIC / TANH / HARD_SWISH give the same bits on the Cortex-M7 as on
    the host: losses and trained weights byte-identical."""
    g = _with_classifier_head(read_model(OPS / f"{fixture}.tflite"))
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind="sgd", learning_rate=0.05),
                              1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x, y = _data(tg, 8, seed=5)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    rh, rq = _host_and_qemu(tmp_path, RuntimeConfig(learning_rate=0.05, epochs=1))
    assert rq == rh


# ---- in-place depthwise input gradient (memplan writes dx over the dying dz, one channel of scratch) ----------

INPLACE_DW_CASES = [("mbv2_block_float", "adam", "nearest"), ("mbv2_block_int8", "sgd", "stochastic"),
                    ("mbv2_block_int8", "adam", "nearest")]


@pytest.mark.parametrize("fixture,opt,rounding", INPLACE_DW_CASES, ids=["-".join(c) for c in INPLACE_DW_CASES])
def test_depthwise_grad_input_in_place_bit_exact(fixture, opt, rounding, tmp_path):
    """An MBv2 block (stride-1 SAME depthwise, multiplier 1) trained whole: the plan puts the depthwise input
    gradient over its output gradient with a scratch channel, the program calls the in-place kernels, and losses and
    trained parameters are byte-identical to the same schedule planned without in-place sharing (and match the
    golden model: int8/int32 exactly, float within 1e-5)."""
    from tinytrain.stages.autodiff import QASOptions
    from tinytrain.stages.planning.arena import MemOptions, plan_memory

    g = _with_classifier_head(read_model(FIX / f"{fixture}.tflite"))
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.05), 1,
                              QASOptions(True, rounding, False))
    _, mp, _, _ = plan_schedules(tg, True)
    mp0 = plan_memory(tg, mp.order, MemOptions(in_place=False, master_copy=mp.options.master_copy), mp.streams)
    dw = [op for op in tg.ops if op.type == "depthwise_conv2d_grad_input"]
    assert dw
    for plan, shared in ((mp, True), (mp0, False)):
        host = {t: b for b in plan.buffers for t in b.tensors}
        scratch = {b.name: b for b in plan.buffers if b.name.startswith("scratch/")}
        for op in dw:
            dz, dx = op.inputs[0], op.outputs[0]
            assert (host[dz] is host[dx]) == shared
            assert (f"scratch/{dx}" in scratch) == shared
            if shared:
                assert scratch[f"scratch/{dx}"].size == int(np.prod(tg.tensors[dx].shape[:-1])) * 4
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    codegen.generate(tg, mp0.order, mp0.to_json(), tmp_path / "prog0")
    src, src0 = ((tmp_path / p / "tt_model.c").read_text() for p in ("prog", "prog0"))
    kern = "tt_depthwise_conv2d_grad_input_qw_f32" if "int8" in fixture else "tt_depthwise_conv2d_grad_input_f32"
    assert src.count(kern + "_inplace(") == len(dw) and kern + "(" not in src
    assert src0.count(kern + "(") == len(dw) and "_inplace(" not in src0

    x, y = _data(tg, STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, seed=7, eps=1e-7)
    data = {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}
    out = _run("host", tmp_path / "prog", tmp_path / "b", tmp_path / "r", cfg, data, sanitize=("address", "undefined"))
    out0 = _run("host", tmp_path / "prog0", tmp_path / "b0", tmp_path / "r0", cfg, data)
    assert out["losses.bin"] == out0["losses.bin"] and out["weights.bin"] == out0["weights.bin"]
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    _check_trained(out, json.loads((tmp_path / "prog" / "io_layout.json").read_text()), state)
