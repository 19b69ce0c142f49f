"""fp16-mixed results written as fp16 through an inverted-residual block and an FC pair (issue 13; OpDef.fp16_output /
fp16_operands, stages/train/fp16_mixed.fp16_written), as tests/test_fp16_written.py does for MobileNetV2's tail.

The model: conv A (3x3, relu6) -> expand (1x1, relu6; weight and bias trained) -> depthwise (3x3, relu6; bias
trained) -> project (1x1; bias trained) -> add (with A's output) -> global mean -> FC1 (trained) -> FC2.
Fused here, beyond the tail's: the expand and depthwise outputs (conv2d and depthwise_conv2d write fp16; depthwise,
project conv2d and clamp_mask read it), the project's output and the residual sum (add reads and writes fp16), the
project's input gradient (conv2d_grad_input writes fp16), the depthwise input gradient
(depthwise_conv2d_grad_input: fp16 -> fp16, in place), the expand's weight gradient reading the fp16 dz, FC2's input
gradient (fully_connected_grad_input writes fp16) and FC1's weight gradient reading it. The reference
is the same graph with the fusion off (fp32 slots rounded in place by round_f16): the golden model must train with
its bits, each new C kernel must give the golden model's values bit for bit, and the estimate must meet the plan.
With only the FC pair trained, the block is the frozen prefix, written as fp16 by the same kernels (row-streamed)."""

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
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from test_fp16_written import _assert_trains_alike, _fused_and_unfused, _makers, _written  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
H, C_A, C_E, HID, CLASSES = 6, 8, 16, 12, 5


def _block_model(tmp: Path) -> Graph:
    ts: dict[str, Tensor] = {}
    t, w, b = _makers(ts, np.random.default_rng(5))

    geo = {"stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1}
    x = t("x", [1, H, H, 3], "input")
    ops = [Op("conv2d", [x, w("a/w", [C_A, 3, 3, 3], 0.4), b("a/b", C_A)], [t("a", [1, H, H, C_A])],
              {**geo, "padding": "same", "act": "relu6"}),
           Op("conv2d", ["a", w("e/w", [C_E, 1, 1, C_A], 0.4), b("e/b", C_E)], [t("e", [1, H, H, C_E])],
              {**geo, "padding": "valid", "act": "relu6"}),
           Op("depthwise_conv2d", ["e", w("d/w", [1, 3, 3, C_E], 0.4), b("d/b", C_E)], [t("d", [1, H, H, C_E])],
              {**geo, "padding": "same", "act": "relu6", "depth_multiplier": 1}),
           Op("conv2d", ["d", w("p/w", [C_A, 1, 1, C_E], 0.3), b("p/b", C_A)], [t("p", [1, H, H, C_A])],
              {**geo, "padding": "valid", "act": "none"}),
           Op("add", ["p", "a"], [t("s", [1, H, H, C_A])], {"act": "none"}),
           Op("mean", ["s", t("axes", [2], "const", np.array([1, 2], np.int32))], [t("m", [1, C_A])],
              {"keep_dims": False}),
           Op("fully_connected", ["m", w("f1/w", [HID, C_A], 0.5), b("f1/b", HID)], [t("h", [1, HID])],
              {"act": "none", "keep_num_dims": False}),
           Op("fully_connected", ["h", w("f2/w", [CLASSES, HID], 0.4), b("f2/b", CLASSES)], [t("y", [1, CLASSES])],
              {"act": "none", "keep_num_dims": False})]
    ts["axes"].dtype = "int32"
    ts["y"].role = "output"
    g = Graph(ts, ops, ["x"], ["y"])
    g.validate()
    write_model(g, tmp / "block.tflite")
    return read_model(tmp / "block.tflite")


def _plan(g: Graph) -> TrainPlan:
    a, e, d, p, f1, f2 = TrainPlan.trainable_ops(g)
    return TrainPlan([LayerPlan(e, bias=True, weight_ratio=1.0), LayerPlan(d, bias=True), LayerPlan(p, bias=True),
                      LayerPlan(f1, bias=True, weight_ratio=1.0), LayerPlan(f2, bias=True, weight_ratio=1.0)])


def _graphs(tmp: Path):
    g = _block_model(tmp)
    tg = build_training_graph(g, _plan(g), "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))
    return (g, *_fused_and_unfused(tg, {"kind": "dynamic", "init_scale": 2.0 ** 12, "growth_interval": 2}))


def test_block_results_are_fp16_and_train_with_the_unfused_bits(tmp_path):
    _, g16, ref = _graphs(tmp_path)
    written = _written(g16)
    assert not _written(ref)
    kinds = set(written.values())
    assert {"conv2d", "depthwise_conv2d", "add", "conv2d_grad_input", "depthwise_conv2d_grad_input",
            "fully_connected_grad_input", "mask_grad"} <= kinds, kinds
    # the fp16 readers read them: no rounding op after them, and the plan gives 2 bytes per element
    assert not {t for op in g16.ops if op.type == "round_f16" for t in op.inputs} & set(written)
    fp16_arena_falls(g16, ref)
    # the depthwise input gradient is fp16 -> fp16 and written over its input (the channel-in-place rule)
    dwgi = [op for op in g16.ops if op.type == "depthwise_conv2d_grad_input"]
    assert dwgi and all(g16.tensors[op.inputs[0]].dtype == g16.tensors[op.outputs[0]].dtype == "float16"
                        for op in dwgi)
    # the golden model: the same losses, loss scales and trained weights as the unfused graph, bit for bit
    _assert_trains_alike(g16, ref, H, CLASSES)


def test_the_estimate_meets_the_plan_with_the_block_fused(tmp_path):
    g = _block_model(tmp_path)
    ratio = estimate_over_exact(g, _plan(g))
    assert 0.95 <= ratio <= 1.05, ratio


def _lib(tmp: Path) -> ctypes.CDLL:
    out = tmp / "libf16b.so"
    return host_kernel_lib(out, ["ops/tt_conv2d.c", "ops/tt_depthwise_conv2d.c", "ops/tt_fully_connected.c",
                                 "ops/tt_add.c", "tt_common.c"])


def _p(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _dims(ci: int, co: int, k: int, pad: int, mult: int = 1):
    return (ctypes.c_int32 * 16)(1, H, H, ci, H, H, co, k, k, 1, 1, 1, 1, pad, pad, mult)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)


def _h(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float16)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_fp16_block_kernels_give_the_golden_bits(tmp_path):
    """Each new kernel fed the golden model's inputs of one training sample gives its result bit for bit (the forms
    the fixture's graph does not use: against the golden fp32 result rounded, which is what they are defined as)."""
    _, g16, _ = _graphs(tmp_path)
    lib = _lib(tmp_path)
    x = np.random.default_rng(1).standard_normal((1, H, H, 3)).astype(np.float32)
    st = te.init_state(g16, {"learning_rate": 0.05})
    v = te.run_sample(g16, st, x, np.array([2]))
    f = ctypes.c_float
    T = g16.tensors
    seen = set()
    for op in g16.ops[:g16.meta["train"]["sample_ops"]]:
        ins = [v[t] if t is not None else None for t in op.inputs]
        want = v[op.outputs[0]] if op.outputs else None
        o16 = bool(op.outputs) and T[op.outputs[0]].dtype == "float16"
        i16 = ins[0] is not None and getattr(ins[0], "dtype", None) == np.float16
        if op.type == "depthwise_conv2d" and o16:
            wt, bias = _f32(ins[1]), _f32(ins[2])
            got = np.zeros(want.shape, np.float16)
            lib.tt_depthwise_conv2d_hx_hy(_dims(C_E, C_E, 3, 1), f(0.0), f(6.0), _p(_h(ins[0])), _p(wt), _p(bias),
                                          _p(got))
            both = _h(ins[0]).copy()
            scr = np.zeros(H * H, np.float16)
            lib.tt_depthwise_conv2d_hx_hy_inplace(_dims(C_E, C_E, 3, 1), f(0.0), f(6.0), _p(both), _p(wt), _p(bias),
                                                  _p(scr))
            assert both.tobytes() == got.tobytes()
        elif op.type == "conv2d" and i16:
            wt, bias = _f32(ins[1]), _f32(ins[2])
            got = np.zeros(want.shape, np.float32)   # the project conv reads the depthwise's fp16 output
            lib.tt_conv2d_hx_f32_split(_dims(C_E, C_A, 1, 0), f(-np.inf), f(np.inf), _p(_h(ins[0])), _p(wt), _p(wt), 0,
                                       _p(bias), _p(got))
            hy = np.zeros(want.shape, np.float16)
            lib.tt_conv2d_hx_hy_split(_dims(C_E, C_A, 1, 0), f(-np.inf), f(np.inf), _p(_h(ins[0])), _p(wt), _p(wt), 0,
                                      _p(bias), _p(hy))
            assert hy.tobytes() == f16ref.to_f16(got).tobytes()   # the fp16-writing form: that sum, rounded
            got = hy if o16 else got
        elif op.type == "add" and o16:
            a, b = (np.ascontiguousarray(t) for t in ins)
            pa = (None, _p(a)) if a.dtype == np.float16 else (_p(_f32(a)), None)
            pb = (None, _p(b)) if b.dtype == np.float16 else (_p(_f32(b)), None)
            got = np.zeros(want.shape, np.float16)
            lib.tt_add_f16(a.size, f(-np.inf), f(np.inf), *pa, *pb, None, _p(got))
            over = _f32(a) if a.dtype != np.float16 else a.copy()   # written over operand a (in place)
            po = (None, _p(over)) if over.dtype == np.float16 else (_p(over), None)
            lib.tt_add_f16(a.size, f(-np.inf), f(np.inf), *po, *pb, None, _p(over))
            assert over.view(np.uint8)[:got.nbytes].tobytes() == got.tobytes()
        elif op.type == "conv2d_grad_input" and o16:
            wt = _f32(ins[1])
            ci, co = T[op.outputs[0]].shape[3], T[op.inputs[0]].shape[3]
            got = np.zeros(want.shape, np.float16)
            if i16:
                lib.tt_conv2d_grad_input_hdy_split_hdx(_dims(ci, co, 1, 0), _p(_h(ins[0])), _p(wt), _p(wt), 0, _p(got))
            else:
                lib.tt_conv2d_grad_input_f32_split_hdx(_dims(ci, co, 1, 0), _p(_f32(ins[0])), _p(wt), _p(wt), 0,
                                                       _p(got))
                hh = np.zeros(want.shape, np.float16)   # the fp16-dy form on the same values, widened
                lib.tt_conv2d_grad_input_hdy_split_hdx(_dims(ci, co, 1, 0), _p(_h(f16ref.to_f16(ins[0]))), _p(wt),
                                                       _p(wt), 0, _p(hh))
                assert np.array_equal(f16ref.to_f16(ins[0]).astype(np.float32), ins[0]) and hh.tobytes() == \
                    got.tobytes()
        elif op.type == "depthwise_conv2d_grad_input" and o16:
            wt = _f32(ins[1])
            got = np.zeros(want.shape, np.float16)
            lib.tt_depthwise_conv2d_grad_input_hdy_hdx(_dims(C_E, C_E, 3, 1), _p(_h(ins[0])), _p(wt), _p(got))
            both = _h(ins[0]).copy()
            scr = np.zeros(H * H, np.float16)
            lib.tt_depthwise_conv2d_grad_input_hdy_hdx_inplace(_dims(C_E, C_E, 3, 1), _p(both), _p(wt), _p(scr))
            assert both.tobytes() == got.tobytes()
        elif op.type == "conv2d_grad_weight" and i16:
            k = int(op.attrs.get("in_channels") or op.attrs["w_shape"][3])
            co = int(op.attrs["w_shape"][0])
            got = np.zeros(want.shape, np.float32)
            xin = ins[1]
            fn = lib.tt_conv2d_grad_weight_hdy_hx_f32_range if xin.dtype == np.float16 else \
                lib.tt_conv2d_grad_weight_hdy_f32_range
            fn(_dims(C_A, co, 1, 0), k, 0, co, _p(_h(ins[0])), _p(np.ascontiguousarray(xin)), _p(got))
            # one output channel at a time (a channels stream) gives the same rows
            rows = np.zeros(want.shape, np.float32)
            for o in range(co):
                fn(_dims(C_A, co, 1, 0), k, o, o + 1, _p(_h(ins[0])), _p(np.ascontiguousarray(xin)), _p(rows[o:]))
            assert rows.tobytes() == got.tobytes()
            if xin.dtype == np.float16:   # the fp32-x form on the same values
                f32x = np.zeros(want.shape, np.float32)
                lib.tt_conv2d_grad_weight_hdy_f32_range(_dims(C_A, co, 1, 0), k, 0, co, _p(_h(ins[0])),
                                                        _p(_f32(xin)), _p(f32x))
                assert f32x.tobytes() == got.tobytes()
        elif op.type == "fully_connected_grad_input" and o16:
            o, depth = T[op.inputs[1]].shape
            got = np.zeros(want.shape, np.float16)
            lib.tt_fully_connected_grad_input_f16(1, depth, o, _p(_f32(ins[0])), None, _p(_f32(ins[1])), None,
                                                  _p(got))
            wide = np.zeros(want.shape, np.float32)   # dy fp16 -> dx fp32, on the same (fp16) dy
            lib.tt_fully_connected_grad_input_f16(1, depth, o, None, _p(_h(ins[0])), _p(_f32(ins[1])), _p(wide), None)
            assert f16ref.to_f16(wide).tobytes() == got.tobytes()
        elif op.type == "fully_connected_grad_weight" and i16:
            o, depth = op.attrs["w_shape"]
            got = np.zeros(want.shape, np.float32)
            xin = np.ascontiguousarray(ins[1])
            xf, xh = (None, _p(xin)) if xin.dtype == np.float16 else (_p(_f32(xin)), None)
            lib.tt_fully_connected_grad_weight_hdy_range(1, depth, o, depth, 0, o, _p(_h(ins[0])), xf, xh, _p(got))
        else:
            continue
        seen.add(op.type)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), op.type
    assert seen == {"depthwise_conv2d", "conv2d", "add", "conv2d_grad_input", "depthwise_conv2d_grad_input",
                    "conv2d_grad_weight", "fully_connected_grad_input", "fully_connected_grad_weight"}, seen
    # an fp32 result written over an fp16 operand (a buffer big enough for the result): tt_add_f16 runs from the end,
    # so every element it reads is still the operand's (a forward loop would read elements it has already overwritten)
    rng = np.random.default_rng(5)
    a16 = rng.standard_normal(37).astype(np.float16)
    b32 = rng.standard_normal(37).astype(np.float32)
    buf = np.zeros(37, np.float32)
    buf.view(np.float16)[:37] = a16
    lib.tt_add_f16(37, f(-np.inf), f(np.inf), None, _p(buf), _p(b32), None, _p(buf), None)
    assert buf.tobytes() == (a16.astype(np.float32) + b32).tobytes()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_host_build_of_the_fused_block_has_the_golden_bits(tmp_path):
    """The whole generated program on the host: per-step losses, loss scale, skipped steps and trained weights equal
    the golden model's bit for bit, with the new kernels in it (~15 s: slow)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fp16_codegen import _golden, _host_run

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    _, g16, _ = _graphs(tmp_path)
    x = np.random.default_rng(2).standard_normal((8, H, H, 3)).astype(np.float32)
    y = np.arange(8) % CLASSES
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    res, losses, weights, _ = _host_run(g16, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    for fn in ("tt_depthwise_conv2d_hx_hy", "tt_conv2d_hx_hy_split", "tt_conv2d_grad_input_hdy_split_hdx",
               "tt_depthwise_conv2d_grad_input_hdy_hdx", "tt_conv2d_grad_weight_hdy_hx_f32_range",
               "tt_fully_connected_grad_input_f16", "tt_fully_connected_grad_weight_hdy_range", "tt_add_f16"):
        assert f"{fn}" in src, fn
    state, scales, skipped, means = _golden(g16, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name


def _prefix_graphs(tmp: Path):
    """Only the FC pair trains: the block is the frozen prefix (conv A .. add, the mean), whose results its kernels
    write as fp16 (fp16_mixed.prefix_results); the reference keeps the prefix fp32 (no fusion)."""
    g = _block_model(tmp)
    *_, f1, f2 = TrainPlan.trainable_ops(g)
    plan = TrainPlan([LayerPlan(f1, bias=True, weight_ratio=1.0), LayerPlan(f2, bias=True, weight_ratio=1.0)])
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind="sgd"), 1, QASOptions(False))
    return (g, plan, *_fused_and_unfused(tg, None))


def test_the_frozen_prefix_is_fp16_where_its_kernels_write_it(tmp_path):
    """The prefix's results are 2-byte tensors with no rounding op (its row streams stay whole), the model input
    stays fp32, the arena falls, and the estimate meets the plan."""
    g, plan, g16, ref = _prefix_graphs(tmp_path)
    pre = {"a", "e", "d", "p", "s"}
    assert all(g16.tensors[t].dtype == "float16" for t in pre) and g16.tensors["x"].dtype == "float32"
    assert all(ref.tensors[t].dtype == "float32" for t in pre)
    assert not [op for op in g16.ops if op.type == "round_f16" and set(op.inputs) & pre]
    fp16_arena_falls(g16, ref)
    ratio = estimate_over_exact(g, plan)
    assert 0.95 <= ratio <= 1.05, ratio


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_host_build_of_the_fp16_prefix_has_the_golden_bits(tmp_path):
    """The fp16 prefix on the host, row-streamed where the planner streams it: losses, loss scale and trained weights
    equal the golden model's bit for bit (~15 s: slow)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fp16_codegen import _golden, _host_run

    from tinytrain.stages.train.runtime_config import RuntimeConfig

    _, _, g16, _ = _prefix_graphs(tmp_path)
    x = np.random.default_rng(3).standard_normal((8, H, H, 3)).astype(np.float32)
    y = np.arange(8) % CLASSES
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    res, losses, weights, mp = _host_run(g16, x, y, tmp_path, cfg)
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    assert "tt_depthwise_conv2d_hx_hy" in src and "tt_add_f16" in src
    # the row streams' fp16 kernels check their weights once per stream run (conv_forward.reuses_weight_check)
    assert "tt_depthwise_conv2d_hx_hy_rep(" in src and "] = -1; }" in src
    state, scales, skipped, means = _golden(g16, x, y, cfg, 1)
    assert losses.tobytes() == np.array(means, np.float32).tobytes()
    assert res["skipped_steps"] == skipped[-1]
    for name, got in weights.items():
        assert got.tobytes() == state[name].tobytes(), name
