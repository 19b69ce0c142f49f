"""fp16-mixed results written as fp16 by their own kernels (issue 13; OpDef.fp16_output / fp16_operands,
stages/train/fp16_mixed.fp16_written): a transient result whose writer can round on store and whose every reader
reads fp16 is a 2-byte tensor with no fp32 copy, and the arithmetic is unchanged (fp32 inside, one rounding).

The model is MobileNetV2's tail in small: conv A (3x3, relu6) -> conv B (1x1, relu6; only its bias trains) ->
global mean -> FC. B's output (forward: conv2d writes fp16, clamp_mask and mean read it) and the mean's broadcast
gradient and its masked form (backward: mean_grad and mask_grad write fp16, mask_grad, bias_grad and
conv2d_grad_input read it; B's input gradient, written as fp16 and read by A's mask_grad and weight gradient)
are the fused tensors; the reference is the same graph with the fusion off (fp32 slots
rounded in place by round_f16), which the golden model must match bit for bit, and the C kernels must match the
golden model's values bit for bit."""

from __future__ import annotations

import copy
import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from kernel_lib import host_kernel_lib  # noqa: E402 (tests/ is on sys.path)
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train import fp16_mixed

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
H, C_A, C_B, CLASSES = 6, 8, 24, 5


def _makers(ts: dict[str, Tensor], rng):
    """A small float model's tensor makers, each adding to ts and giving the name: t (any role), w (a random weight of
    standard deviation `scale`), b (a random bias). Shared with tests/test_fp16_written_block.py."""
    def t(name, shape, role="activation", data=None):
        ts[name] = Tensor(name, list(shape), "float32", role=role, data=data)
        return name

    def w(name, shape, scale):
        return t(name, shape, "weight", (rng.standard_normal(shape) * scale).astype(np.float32))

    def b(name, n):
        return t(name, [n], "bias", (rng.standard_normal(n) * 0.1).astype(np.float32))

    return t, w, b


def _tail_model(tmp: Path) -> Graph:
    ts: dict[str, Tensor] = {}
    t, w, b = _makers(ts, np.random.default_rng(3))

    geo = {"stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1, "act": "relu6"}
    x = t("x", [1, H, H, 3], "input")
    ops = [Op("conv2d", [x, w("a/w", [C_A, 3, 3, 3], 0.4), b("a/b", C_A)], [t("a", [1, H, H, C_A])],
              {**geo, "padding": "same"}),
           Op("conv2d", ["a", w("b/w", [C_B, 1, 1, C_A], 0.5), b("b/b", C_B)], [t("b", [1, H, H, C_B])],
              {**geo, "padding": "valid"}),
           Op("mean", ["b", t("axes", [2], "const", np.array([1, 2], np.int32))], [t("m", [1, C_B])],
              {"keep_dims": False}),
           Op("fully_connected", ["m", w("fc/w", [CLASSES, C_B], 0.3), b("fc/b", CLASSES)], [t("y", [1, CLASSES])],
              {"act": "none", "keep_num_dims": False})]
    ts["axes"].dtype = "int32"
    ts["y"].role = "output"
    g = Graph(ts, ops, ["x"], ["y"])
    g.validate()
    write_model(g, tmp / "tail.tflite")
    return read_model(tmp / "tail.tflite")


def _plan(g: Graph) -> TrainPlan:
    layers = TrainPlan.trainable_ops(g)   # a, b, fc
    return TrainPlan([LayerPlan(layers[0], bias=True, weight_ratio=1.0), LayerPlan(layers[1], bias=True),
                      LayerPlan(layers[2], bias=True, weight_ratio=1.0)])


def _graphs(tmp: Path):
    g = _tail_model(tmp)
    plan = _plan(g)
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))
    return _fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2})


def _fused_and_unfused(tg: Graph, policy):
    """The fp16-mixed form of training graph tg with the fp16-written fusion, and the reference without it (its fp32
    slots rounded in place by round_f16). Shared with tests/test_fp16_written_block.py."""
    fused = fp16_mixed.to_fp16_mixed(copy.deepcopy(tg), policy, check_first=True)
    plain = fp16_mixed.fp16_written
    fp16_mixed.fp16_written = lambda *a: set()
    try:
        unfused = fp16_mixed.to_fp16_mixed(copy.deepcopy(tg), policy, check_first=True)
    finally:
        fp16_mixed.fp16_written = plain
    return fused, unfused


def _written(g: Graph) -> dict[str, str]:
    """{fp16 tensor: the op type that writes it} for the fp16 results no cast makes."""
    return {o: op.type for op in g.ops for o in op.outputs
            if g.tensors[o].dtype == "float16" and op.type != "cast_f32_f16"}


def test_fused_results_are_two_bytes_in_the_plan_and_train_with_the_same_bits(tmp_path):
    g16, ref = _graphs(tmp_path)
    written = _written(g16)
    assert not _written(ref)
    kinds = sorted(set(written.values()))
    assert kinds == ["conv2d", "conv2d_grad_input", "fully_connected_grad_input", "mask_grad", "mean_grad"], kinds
    assert g16.meta["train"]["loss_scale"]["fp16_written"] == len([o for o in written if not o.startswith("chk/")])
    # no rounding op follows them: the kernel rounds on store
    readers = {t for op in g16.ops if op.type == "round_f16" for t in op.inputs}
    assert not readers & set(written)
    # the plan gives each 2 bytes per element, and the arena falls by the fp32 slots it no longer needs
    _, p16, _, _ = plan_schedules(g16, True)
    _, p32, _, _ = plan_schedules(ref, True)
    size = {t: bf.size for bf in p16.buffers for t in (bf.tensors or [bf.name])}
    conv_out = next(o for o, k in written.items() if k == "conv2d" and g16.tensors[o].shape[-1] == C_B)
    assert g16.tensors[conv_out].nbytes == H * H * C_B * 2 and size[conv_out] <= H * H * C_B * 2 + 16
    assert p16.arena < p32.arena
    # without the rounding ops between them, mean_grad -> mask_grad -> bias / 1x1 input gradient run one position
    # at a time (the reorder stage's positions stream), in both backward passes
    assert [st.kind for st in p16.streams].count("positions") == 2
    # the golden model: the same losses, loss scales and trained weights, bit for bit
    _assert_trains_alike(g16, ref, H, CLASSES)


def _assert_trains_alike(g16: Graph, ref: Graph, h: int, classes: int):
    """The golden model trains fused graph g16 and its reference ref (input [1, h, h, 3], `classes` labels) six SGD
    steps with the same losses, trained weights and loss scale, bit for bit."""
    x = np.random.default_rng(0).standard_normal((6, h, h, 3)).astype(np.float32)
    y = np.arange(6) % classes
    runs = []
    for g in (g16, ref):
        st = te.init_state(g, {"learning_rate": 0.05})
        losses = [te.train_step(g, st, x[i:i + 1], y[i:i + 1], {"learning_rate": 0.05}) for i in range(6)]
        runs.append((np.array(losses, np.float32), st))
    (l16, s16), (l32, s32) = runs
    assert l16.tobytes() == l32.tobytes()
    for name in g16.meta["train"]["trained"]:
        assert s16[name].tobytes() == s32[name].tobytes(), name
    scale = g16.meta["train"]["loss_scale"]["scale_tensor"]
    assert s16[scale].tobytes() == s32[scale].tobytes()


def test_the_estimate_counts_the_fused_results_as_fp16(tmp_path):
    """sparse-plan's analytic model (planning/fp16_memory.py) halves the same tensors: it meets the exact planner
    (measured: 4,928 B both; without the fusion in the estimate 6,656 B, the unfused graph's arena 6,864 B)."""
    from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
    from tinytrain.stages.planning.plan_exact import exact_peak

    g = _tail_model(tmp_path)
    st = MemorySettings(optimizer="sgd", batch_size=1, fp16_mixed=True)
    est = MemoryModel(g, st).estimate(_plan(g))["total"]
    exact = exact_peak(g, _plan(g), st, qas=False)["peak_bytes"]
    assert 0.95 <= est / exact <= 1.05, (est, exact)


def _lib(tmp: Path) -> ctypes.CDLL:
    out = tmp / "libf16w.so"
    return host_kernel_lib(out, ["tt_f16.c", "tt_mask.c", "ops/tt_mask_grad.c", "ops/tt_mean.c",
                                 "ops/tt_bias_grad.c", "ops/tt_relu.c", "ops/tt_conv2d.c"], "-O1")


def _p(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _dims(*v: int):
    return (ctypes.c_int32 * 16)(*v)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_fp16_writing_kernels_give_the_golden_bits(tmp_path):
    """Each fused op's C kernel, fed the golden model's inputs of one training sample, writes the golden model's
    fp16 (or fp32) result bit for bit."""
    g16, _ = _graphs(tmp_path)
    lib = _lib(tmp_path)
    x = np.random.default_rng(1).standard_normal((1, H, H, 3)).astype(np.float32)
    st = te.init_state(g16, {"learning_rate": 0.05})
    v = te.run_sample(g16, st, x, np.array([2]))
    f = ctypes.c_float
    seen = set()
    for op in g16.ops[:g16.meta["train"]["sample_ops"]]:
        ins = [np.ascontiguousarray(v[t]) if t is not None else None for t in op.inputs]   # C order (ctypes)
        want = v[op.outputs[0]] if op.outputs else None
        if op.type == "conv2d" and g16.tensors[op.outputs[0]].dtype == "float16":
            wt, bias = (np.ascontiguousarray(a, np.float32) for a in ins[1:])
            got = np.zeros(want.shape, np.uint16)
            if ins[0].dtype == np.float16:   # B reads A's fp16 output
                lib.tt_conv2d_hx_hy_split(_dims(1, H, H, C_A, H, H, C_B, 1, 1, 1, 1, 1, 1, 0, 0, 1), f(0.0), f(6.0),
                                          _p(ins[0]), _p(wt), _p(wt), 0, _p(bias), _p(got))
            else:   # A reads the fp32 model input
                lib.tt_conv2d_f32_split_hy(_dims(1, H, H, 3, H, H, C_A, 3, 3, 1, 1, 1, 1, 1, 1, 1), f(0.0), f(6.0),
                                           _p(np.ascontiguousarray(ins[0], np.float32)), _p(wt), _p(wt), 0, _p(bias),
                                           _p(got))
        elif op.type == "clamp_mask" and ins[0].dtype == np.float16:
            got = np.zeros(want.shape, np.uint8)
            lib.tt_clamp_mask_hy(ins[0].size, f(op.attrs["lo"]), f(op.attrs["hi"]), _p(ins[0]), _p(got))
        elif op.type == "mean" and ins[0].dtype == np.float16:
            got = np.zeros(want.shape, np.float32)
            lib.tt_mean_hw_hx_f32(1, H, H, C_B, _p(ins[0]), _p(got))
        elif op.type == "mean_grad" and want.dtype == np.float16:
            got = np.zeros(want.shape, np.uint16)
            lib.tt_mean_hw_grad_f32_hy(1, H, H, C_B, _p(np.ascontiguousarray(ins[0], np.float32)), _p(got))
        elif op.type == "mask_grad" and want.dtype == np.float16:
            got = np.zeros(want.shape, np.uint16)
            lib.tt_mask_grad_f16(ins[0].size, 0, _p(ins[1]), None, _p(ins[0]), None, _p(got))
        elif op.type == "bias_grad" and ins[0].dtype == np.float16:
            got = np.zeros(want.shape, np.float32)
            lib.tt_bias_grad_hy_f32(ins[0].size // want.size, want.size, _p(ins[0]), _p(got))
        elif op.type == "conv2d_grad_input" and ins[0].dtype == np.float16:
            wt = np.ascontiguousarray(ins[1], np.float32)
            if want.dtype == np.float16:   # B's input gradient, read by A's fp16 mask_grad: written as fp16
                got = np.zeros(want.shape, np.uint16)
                lib.tt_conv2d_grad_input_hdy_split_hdx(_dims(1, H, H, C_A, H, H, C_B, 1, 1, 1, 1, 1, 1, 0, 0, 1),
                                                       _p(ins[0]), _p(wt), _p(wt), 0, _p(got))
            else:
                got = np.zeros(want.shape, np.float32)
                lib.tt_conv2d_grad_input_hdy_f32_split(_dims(1, H, H, C_A, H, H, C_B, 1, 1, 1, 1, 1, 1, 0, 0, 1),
                                                       _p(ins[0]), _p(wt), _p(wt), 0, _p(got))
        else:
            continue
        seen.add(op.type)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), op.type
    assert seen == {"conv2d", "clamp_mask", "mean", "mean_grad", "mask_grad", "bias_grad", "conv2d_grad_input"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_host_build_of_the_fused_graph_has_the_golden_bits(tmp_path):
    """The whole generated program (plan, codegen's kernel choice, in-place and streamed forms) on the host: per-step
    losses, loss scale and trained weights equal the golden model's bit for bit (~15 s: slow)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fp16_codegen import _golden, _host_run

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    g16, _ = _graphs(tmp_path)
    x = np.random.default_rng(2).standard_normal((8, H, H, 3)).astype(np.float32)
    y = np.arange(8) % CLASSES
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    res, losses, weights, _ = _host_run(g16, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    for fn in ("tt_conv2d_f32_split_hy", "tt_clamp_mask_hy", "tt_mean_hw_hx_f32", "tt_mean_hw_grad_positions_f16",
               "tt_mask_grad_f16", "tt_bias_grad_acc_hy_f32", "tt_conv2d_grad_input_hdy_split_hdx_rep",
               "tt_conv2d_grad_weight_hdy_f32_range", "tt_conv2d_hx_hy_split"):
        assert f"{fn}(" in src, fn
    state, scales, skipped, means = _golden(g16, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name


def test_the_plan_and_the_estimate_share_the_in_place_and_broadcast_rules():
    """fp16_written and its estimate (planning/fp16_memory) ask the same two predicates: which operand an op may
    write its result over, and whether an element-wise op that may write over any operand broadcasts one large
    enough to host its fp16 result (then its result stays fp32: a broadcast element is read again after the result
    covered it)."""
    from tinytrain.stages.planning import fp16_memory

    assert fp16_memory.in_place_at is fp16_mixed.in_place_at
    assert fp16_memory.broadcasts_in_place is fp16_mixed.broadcasts_in_place
    ts = {n: Tensor(n, s, "float32") for n, s in
          (("a", [1, 4, 4, 8]), ("row", [1, 1, 1, 8]), ("y", [1, 4, 4, 8]), ("m", [1, 1, 1, 8]),
           ("half", [1, 2, 4, 8]))}
    ts["k"] = Tensor("k", [8], "float32", role="const", data=np.ones(8, np.float32))
    g = Graph(ts, [], ["a"], ["y"])
    assert not fp16_mixed.broadcasts_in_place(g, Op("add", ["a", "a"], ["y"]), "y")
    # a broadcast operand whose fp32 bytes could hold an fp16 y: the planner might write y over it
    assert fp16_mixed.broadcasts_in_place(g, Op("add", ["a", "half"], ["y"]), "y")
    assert not fp16_mixed.broadcasts_in_place(g, Op("add", ["a", "row"], ["y"]), "y")   # too small to host y
    assert not fp16_mixed.broadcasts_in_place(g, Op("add", ["a", "k"], ["y"]), "y")   # a constant is no operand
    assert not fp16_mixed.broadcasts_in_place(g, Op("mask_grad", ["a", "m"], ["y"]), "y")  # writes over dy only
    assert not fp16_mixed.broadcasts_in_place(g, Op("conv2d", ["a", "row"], ["y"]), "y")   # not in place
    assert fp16_mixed.in_place_at("add", 0) and fp16_mixed.in_place_at("add", 1)
    assert fp16_mixed.in_place_at("mask_grad", 0) and not fp16_mixed.in_place_at("mask_grad", 1)
    assert not fp16_mixed.in_place_at("conv2d", 0)
