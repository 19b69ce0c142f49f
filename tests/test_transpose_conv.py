"""TRANSPOSE_CONV end to end: reader, writer, executor, PTQ, autodiff, C kernels and codegen.

Fixtures: tests/fixtures/tconv/, made by tests/make_transpose_conv_fixtures.py with the TF converter (Keras
Conv2DTranspose: stride 1 and 2, (2, 1), SAME and VALID, with and without bias, fused RELU / RELU6; float and
full-int8).
  - the executor on the converter's files: every tensor bit-exact against LiteRT BUILTIN_REF and TFLite Micro,
    float included (it accumulates in the reference kernel's order);
  - our writer: round trip of the converter's graphs and of hand-built ones, LiteRT runs the files we write;
  - the int8 clamp: LiteRT and TFLite Micro both ignore a fused activation in int8 (kTfLiteActNone), checked on
    a graph whose output range is wider than RELU6's;
  - our PTQ of the float file: per-channel weights on axis 0, int32 bias; LiteRT and TFLM bit-exact on it;
  - backward ops against float64 finite differences; training through a frozen transpose_conv;
  - C kernels against the executor (int8 bit-exact, float within a few ulp) and the generated code.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from test_grad_ops import fd_grad  # the same float64 central differences
from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.ops.conv_forward import transpose_conv_geometry
from tinytrain.stages.ops.layer_common import channel_multipliers
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import model_bytes, write_model

import litert_oracle as oracle

TC = Path(__file__).resolve().parent / "fixtures" / "tconv"
MODELS = ["tconv_a", "tconv_b"]


_batch = oracle.probe_batch


def _compare(g: Graph, path: Path, x: np.ndarray, runner, fc_requant: str = "fixed_point") -> int:
    return len(oracle.compare_activations(g, path, x, runner, fc_requant))     # float32 bit for bit too


# ---- reader ------------------------------------------------------------------------------------------------

def test_reader_reorders_operands_and_reads_options():
    g = read_model(TC / "tconv_b_float.tflite")
    assert [op.type for op in g.ops] == ["conv2d", "transpose_conv", "transpose_conv"]
    t1, t2 = g.ops[1], g.ops[2]
    assert t1.inputs[0] == g.ops[0].outputs[0]
    assert g.tensors[t1.inputs[1]].shape == [3, 3, 2, 4] and g.tensors[t1.inputs[1]].role == "weight"
    assert g.tensors[t1.inputs[2]].role == "bias"
    assert g.tensors[t1.inputs[3]].dtype == "int32" and list(g.tensors[t1.inputs[3]].data) == [1, 11, 5, 3]
    assert t1.attrs == {"stride_h": 2, "stride_w": 1, "padding": "valid", "act": "relu6"}
    assert t2.inputs[2] is None and t2.attrs == {"stride_h": 1, "stride_w": 1, "padding": "same", "act": "none"}
    gi = read_model(TC / "tconv_a_int8.tflite")
    w = gi.tensors[gi.ops[0].inputs[1]]
    assert w.dtype == "int8" and w.quant.axis == 0 and len(w.quant.scale) == 6
    assert gi.tensors[gi.ops[0].inputs[2]].dtype == "int32"


def test_reader_refuses_an_output_shape_that_disagrees(tmp_path):
    from tinytrain.pipeline.errors import ModelError
    g = read_model(TC / "tconv_a_float.tflite")
    os_name = g.ops[0].inputs[3]
    g.tensors[os_name].data = np.array([1, 9, 9, 6], np.int32)
    write_model(g, tmp_path / "bad.tflite")
    with pytest.raises(ModelError, match=r"TRANSPOSE_CONV.*output_shape operand \[1, 9, 9, 6\]"):
        read_model(tmp_path / "bad.tflite")


# ---- executor against LiteRT and TFLite Micro ------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["float", "int8"])
@pytest.mark.parametrize("model", MODELS)
def test_converter_model_matches_litert_and_tflm(model, variant):
    path = TC / f"{model}_{variant}.tflite"
    g = read_model(path)
    x = _batch(g, np.load(TC / f"{model}.input.npy"))
    n = _compare(g, path, x, oracle.run_litert)
    if oracle.tflm_available():
        assert _compare(g, path, x, oracle.run_tflm) == n


# ---- writer ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["float", "int8"])
@pytest.mark.parametrize("model", MODELS)
def test_writer_round_trip(model, variant, tmp_path):
    g = read_model(TC / f"{model}_{variant}.tflite")
    path = tmp_path / "rt.tflite"
    write_model(g, path)
    back = read_model(path)
    assert [(op.type, op.attrs) for op in back.ops] == [(op.type, op.attrs) for op in g.ops]
    for op, bop in zip(g.ops, back.ops):
        assert [i is None for i in op.inputs] == [i is None for i in bop.inputs]
        for a, b in zip(op.inputs, bop.inputs):
            if a is not None:
                ta, tb = g.tensors[a], back.tensors[b]
                assert (ta.shape, ta.dtype, ta.role) == (tb.shape, tb.dtype, tb.role)
                if ta.data is not None:
                    np.testing.assert_array_equal(ta.data, tb.data)
    x = _batch(back, np.load(TC / f"{model}.input.npy"))
    _compare(back, path, x, oracle.run_litert)
    assert model_bytes(back) == model_bytes(g)  # deterministic, and the reorder is an exact inverse


def _tconv_graph(dtype: str, *, stride=(2, 2), padding="same", act="relu6", bias=True, in_hw=(3, 4), cin=3,
                 cout=4, k=(3, 3), out_hw=None, out_q=(0.05, -20), seed=0) -> Graph:
    rng = np.random.default_rng(seed)
    h, w = in_hw
    if out_hw is None:
        oh = h * stride[0] if padding == "same" else (h - 1) * stride[0] + max(k[0], stride[0])
        ow = w * stride[1] if padding == "same" else (w - 1) * stride[1] + max(k[1], stride[1])
    else:
        oh, ow = out_hw
    q = dtype == "int8"
    t: dict[str, Tensor] = {}
    qi = QuantParams([0.04], [3]) if q else None
    t["x"] = Tensor("x", [1, h, w, cin], dtype, role="input", quant=qi)
    wf = rng.normal(0, 0.4, size=(cout, k[0], k[1], cin)).astype(np.float32)
    if q:
        ws = list(rng.uniform(0.004, 0.02, cout))
        t["w"] = Tensor("w", list(wf.shape), "int8", role="weight", quant=QuantParams(ws, [0] * cout, 0),
                        data=rng.integers(-127, 128, size=wf.shape).astype(np.int8))
    else:
        t["w"] = Tensor("w", list(wf.shape), "float32", role="weight", data=wf)
    ins = ["x", "w", None, "os"]
    if bias:
        if q:
            t["b"] = Tensor("b", [cout], "int32", role="bias",
                            quant=QuantParams([0.04 * s for s in ws], [0] * cout, 0),
                            data=rng.integers(-3000, 3000, cout).astype(np.int32))
        else:
            t["b"] = Tensor("b", [cout], "float32", role="bias", data=rng.normal(0, 0.5, cout).astype(np.float32))
        ins[2] = "b"
    t["os"] = Tensor("os", [4], "int32", role="constant", data=np.array([1, oh, ow, cout], np.int32))
    t["y"] = Tensor("y", [1, oh, ow, cout], dtype, role="output", quant=QuantParams([out_q[0]], [out_q[1]]) if q else None)
    op = Op("transpose_conv", ins, ["y"], {"stride_h": stride[0], "stride_w": stride[1], "padding": padding,
                                          "act": act})
    g = Graph(t, [op], ["x"], ["y"])
    g.validate()
    return g


def _feed(g: Graph, n: int = 3, seed: int = 1) -> np.ndarray:
    t = g.tensors["x"]
    rng = np.random.default_rng(seed)
    if t.dtype == "int8":
        return rng.integers(-128, 128, size=[n] + t.shape[1:]).astype(np.int8)
    return rng.normal(0, 1.5, size=[n] + t.shape[1:]).astype(np.float32)


GEOMS = [dict(stride=(2, 2), padding="same"), dict(stride=(1, 1), padding="valid"),
         dict(stride=(2, 1), padding="valid", k=(3, 2)), dict(stride=(1, 2), padding="same", bias=False, act="none"),
         dict(stride=(3, 3), padding="valid", k=(2, 2)), dict(stride=(2, 2), padding="same", k=(4, 3), act="relu"),
         # An output larger than the natural size (output_padding): the extra rows get bias only.
         dict(stride=(2, 2), padding="valid", k=(3, 3), out_hw=(8, 10))]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("gi", range(len(GEOMS)))
def test_hand_built_graphs_written_by_us_match_litert_and_tflm(dtype, gi, tmp_path):
    """Our writer's files in LiteRT and TFLM, bit-exact with the executor: strides 1..3, non-square kernels,
    stride > kernel, no bias, an enlarged output; int8 with an output range wider than the fused RELU6/RELU."""
    g = _tconv_graph(dtype, **GEOMS[gi], seed=gi)
    path = tmp_path / "g.tflite"
    write_model(g, path)
    back = read_model(path)
    x = _feed(back)
    _compare(back, path, x, oracle.run_litert)
    if oracle.tflm_available():
        _compare(back, path, x, oracle.run_tflm)


def test_int8_fused_activation_clamps_in_both_runtimes(tmp_path):
    """The output range [-0.0, 11.75] of s=0.05, z=-20 reaches below 0 and above 6, so the RELU6 clamp shows:
    LiteRT and TFLM both clamp to the activation's quantized range (older sources passed kTfLiteActNone and
    would not), and so does the executor."""
    g = _tconv_graph("int8", act="relu6", out_q=(0.05, -20))
    path = tmp_path / "g.tflite"
    write_model(g, path)
    x = _feed(g, 4)
    ours = run_graph(g, {"x": x})["y"]
    lo, hi = ia.activation_range("relu6", 0.05, -20)
    assert ours.min() == lo and ours.max() == hi
    assert np.array_equal(ours, oracle.run_litert(path, [x]).outputs[0].reshape(ours.shape))
    if oracle.tflm_available():
        assert np.array_equal(ours, oracle.run_tflm(path, [x]).outputs[0].reshape(ours.shape))


# ---- PTQ ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
def test_our_ptq_is_per_channel_and_bit_exact_in_litert_and_tflm(model, tmp_path):
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages import quantize

    g = read_model(TC / f"{model}_float.tflite")
    sample = np.load(TC / f"{model}.input.npy")
    calib = np.random.default_rng(3).normal(size=(64,) + sample.shape[1:]).astype(np.float32)
    q, report = quantize.quantize_model(g, calib, QuantizeSpec(), sample)
    assert report["model"]["output_sqnr_db"] > 25
    for op in q.ops:
        if op.type != "transpose_conv":
            continue
        w = q.tensors[op.inputs[1]]
        assert w.dtype == "int8" and w.quant.axis == 0 and len(w.quant.scale) == w.shape[0]
        assert set(w.quant.zero_point) == {0} and np.abs(w.data).max() == 127
        if op.inputs[2] is not None:
            b = q.tensors[op.inputs[2]]
            s_in = q.tensors[op.inputs[0]].quant.scale[0]
            assert b.dtype == "int32"
            np.testing.assert_allclose(b.quant.scale, s_in * np.asarray(w.quant.scale), rtol=1e-6)
        assert q.tensors[op.inputs[3]].dtype == "int32"
    path = tmp_path / "ours_int8.tflite"
    write_model(q, path)
    back = read_model(path)
    x = _batch(back, sample)
    n = _compare(back, path, x, oracle.run_litert)
    if oracle.tflm_available():
        assert _compare(back, path, x, oracle.run_tflm) == n


# ---- backward ops against finite differences ------------------------------------------------------------------

def _tconv64(x, w, a, y_hw):
    """float64 transpose conv straight from the definition (scatter), no bias."""
    o, kh, kw, ci = w.shape
    sh, sw = a["stride_h"], a["stride_w"]
    from tinytrain.stages.model.geometry import out_size_and_pad
    _, pt = out_size_and_pad(a["padding"], y_hw[0], kh, sh)
    _, pl = out_size_and_pad(a["padding"], y_hw[1], kw, sw)
    y = np.zeros((x.shape[0], y_hw[0], y_hw[1], o))
    for iy in range(x.shape[1]):
        for ix in range(x.shape[2]):
            for ky in range(kh):
                for kx in range(kw):
                    oy, ox = iy * sh - pt + ky, ix * sw - pl + kx
                    if 0 <= oy < y_hw[0] and 0 <= ox < y_hw[1]:
                        y[:, oy, ox, :] += x[:, iy, ix, :] @ w[:, ky, kx, :].T
    return y


@pytest.mark.parametrize("gi", range(len(GEOMS)))
def test_grad_ops_against_finite_differences(gi):
    from tinytrain.stages.golden import grad_ops as go

    geo = dict(GEOMS[gi])
    g = _tconv_graph("float32", **geo, seed=10 + gi)
    op = g.ops[0]
    a = op.attrs
    w = g.tensors["w"].data.astype(np.float64)
    y_hw = g.tensors["y"].shape[1:3]
    rng = np.random.default_rng(gi)
    x = rng.normal(size=[2] + g.tensors["x"].shape[1:])
    # The executor's forward (float32, no bias / act) is the float64 definition.
    g0 = copy.deepcopy(g)
    g0.ops[0].inputs[2] = None
    g0.ops[0].attrs = dict(a, act="none")
    np.testing.assert_allclose(run_graph(g0, {"x": x.astype(np.float32)})["y"], _tconv64(x, w, a, y_hw),
                               rtol=1e-5, atol=1e-5)
    r = rng.normal(size=[2] + list(y_hw) + [w.shape[0]])
    dx = go.transpose_conv_grad_input(r, w, x.shape, a)
    np.testing.assert_allclose(dx, fd_grad(lambda v: _tconv64(v, w, a, y_hw), x, r), rtol=1e-4, atol=1e-5)
    dw = go.transpose_conv_grad_weight(r, x, w.shape, a)
    np.testing.assert_allclose(dw, fd_grad(lambda v: _tconv64(x, v, a, y_hw), w, r), rtol=1e-4, atol=1e-5)
    k = max(1, w.shape[3] - 1)
    np.testing.assert_array_equal(go.transpose_conv_grad_weight(r, x, w.shape, a, k), dw[..., :k].astype(np.float32))
    # bias: the sum of dy over all but the channel
    np.testing.assert_allclose(go.bias_grad(r), r.reshape(-1, w.shape[0]).sum(0), rtol=1e-5)


# ---- training through a frozen transpose_conv -----------------------------------------------------------------

def _loss_fd_check(g: Graph, param: str, x: np.ndarray, target: np.ndarray, got: np.ndarray):
    """MSE loss of the float graph as a function of `param`, central differences (a few entries). RELU6 clamps
    half of the first transpose conv's outputs, so a step may cross a kink: an entry passes when the
    difference quotient at one of two step sizes agrees."""
    base = g.tensors[param].data.astype(np.float32).copy()

    def loss(p):
        g.tensors[param].data = p.astype(np.float32)
        y = run_graph(g, {g.inputs[0]: x})[g.outputs[0]].astype(np.float64)
        return float(np.mean((y - target) ** 2))
    idx = np.random.default_rng(0).choice(base.size, size=min(8, base.size), replace=False)
    for i in idx:
        fds = []
        for eps in (1e-3, 1e-4):
            p = base.astype(np.float64).reshape(-1)
            p[i] += eps
            lp = loss(p.reshape(base.shape))
            p[i] -= 2 * eps
            lm = loss(p.reshape(base.shape))
            fds.append((lp - lm) / (2 * eps))
        assert any(abs(float(got.reshape(-1)[i]) - f) <= 2e-2 * abs(f) + 3e-4 for f in fds), (i, got.reshape(-1)[i], fds)
    g.tensors[param].data = base


def test_training_graph_backpropagates_through_transpose_conv():
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.golden import train_step as te
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(TC / "tconv_b_float.tflite")
    plan = TrainPlan.full(g)
    assert [g.ops[lp.layer].type for lp in plan.layers] == ["conv2d"]
    tg = build_training_graph(g, plan, "mse", OptimizerSpec("sgd"), 1)
    types = [op.type for op in tg.ops]
    assert types.count("transpose_conv_grad_input") == 2 and "transpose_conv_grad_weight" not in types
    x = np.load(TC / "tconv_b.input.npy")[:1]
    target = np.random.default_rng(1).normal(size=[1] + g.tensors[g.outputs[0]].shape[1:]).astype(np.float32)
    state = te.init_state(tg)
    vals = te.run_sample(tg, state, x, target)
    conv = g.ops[0]
    w_grad, b_grad = f"grad/{conv.inputs[1]}#0", f"grad/{conv.inputs[2]}#0"
    _loss_fd_check(g, conv.inputs[1], x, target, vals[w_grad])
    _loss_fd_check(g, conv.inputs[2], x, target, vals[b_grad])


def test_int8_training_graph_masks_and_dequantizes():
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.golden import train_step as te
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(TC / "tconv_b_int8.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec("sgd"), 1)
    gi = [op for op in tg.ops if op.type == "transpose_conv_grad_input"]
    assert len(gi) == 2 and all(op.inputs[1].startswith("deq/") for op in gi)
    # Both transpose convs requantize: their output gradients pass an STE mask (int8_clamp_grad or mask_grad).
    masked = {op.inputs[0] for op in tg.ops if op.type in ("int8_clamp_grad", "mask_grad")}
    for op in g.ops[1:]:
        assert any(m.startswith(f"grad/{op.outputs[0]}") for m in masked)
    x = np.load(TC / "tconv_b.input.npy")
    target = np.zeros([1] + g.tensors[g.outputs[0]].shape[1:], np.float32)
    vals = te.run_sample(tg, te.init_state(tg), x[:1], target)
    assert np.isfinite(vals["train/loss"])
    conv_b = g.ops[0].inputs[2]
    assert np.abs(vals[f"grad/{conv_b}#0"]).max() > 0  # the gradient reached the conv below both tconvs


def test_a_plan_that_trains_a_transpose_conv_is_refused_by_name():
    from tinytrain.stages.planning.train_plan import LayerPlan, PlanError, TrainPlan

    g = read_model(TC / "tconv_b_float.tflite")
    for name in (1, g.ops[1].inputs[1], g.ops[1].outputs[0]):
        with pytest.raises(PlanError, match=r"op 1 transpose_conv, TRANSPOSE_CONV.*cannot be trained"):
            TrainPlan([LayerPlan(name, bias=True, weight_ratio=1.0)]).resolve(g)


# ---- C kernels against the executor ----------------------------------------------------------------------------

from test_kernels_c import Batch, driver  # noqa: E402,F401  (the compiled host driver fixture)


def _dims(g: Graph) -> list[int]:
    x, y, w = g.tensors["x"], g.tensors["y"], g.tensors["w"]
    o, kh, kw, _ = w.shape
    sh, sw, pt, pl = transpose_conv_geometry(g.ops[0].attrs, x.shape, y.shape, kh, kw)
    return [x.shape[0], x.shape[1], x.shape[2], x.shape[3], y.shape[1], y.shape[2], o, kh, kw, sh, sw, 1, 1, pt, pl, 1]


@pytest.mark.parametrize("gi", range(len(GEOMS)))
def test_c_kernels_match_the_executor(gi, driver, tmp_path):
    batch = Batch(driver, tmp_path)
    refs = []
    for dtype in ("int8", "float32"):
        geo = dict(GEOMS[gi], bias=True)
        g = _tconv_graph(dtype, **geo, seed=20 + gi)
        x = _feed(g, 2, seed=gi)
        g.tensors["x"].shape[0] = 2
        g.tensors["y"].shape[0] = 2
        y = run_graph(g, {"x": x})["y"]
        dims = _dims(g)
        w, b = g.tensors["w"].data, g.tensors["b"].data
        act = g.ops[0].attrs["act"]
        if dtype == "int8":
            xt, yt, wt = g.tensors["x"], g.tensors["y"], g.tensors["w"]
            mult, shift = channel_multipliers(xt, wt, yt, w.shape[0])
            lo, hi = ia.activation_range(act, yt.quant.scale[0], yt.quant.zero_point[0])
            ints = dims + [xt.quant.zero_point[0], yt.quant.zero_point[0], lo, hi, 1]
            k = batch.add("transpose_conv_s8", ints, [], [x, w, b, mult.astype(np.int32), shift.astype(np.int32),
                                                         np.zeros_like(y)])
            refs.append((k, 5, y, 0))
        else:
            lo, hi = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0)}[act]
            k = batch.add("transpose_conv_f32", dims, [lo, hi], [x, w, b, np.zeros_like(y)])
            refs.append((k, 3, y, 0))
            from tinytrain.stages.golden import grad_ops as go
            rng = np.random.default_rng(gi)
            dy = rng.normal(size=y.shape).astype(np.float32)
            dx = go.transpose_conv_grad_input(dy, w, x.shape, g.ops[0].attrs)
            k = batch.add("transpose_conv_grad_input_f32", dims, [], [dy, w, np.zeros_like(x)])
            refs.append((k, 2, dx, 1e-5))
            kk = max(1, w.shape[3] - 1)
            dw = go.transpose_conv_grad_weight(dy, x, w.shape, g.ops[0].attrs, kk)
            k = batch.add("transpose_conv_grad_weight_f32", dims + [kk], [], [dy, x, np.zeros_like(dw)])
            refs.append((k, 2, dw, 1e-5))
    res = batch.run()
    for k, slot, want, tol in refs:
        got = res[k][slot]
        if tol == 0:
            assert np.array_equal(got, want), (k, int((got != want).sum()))
        else:
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---- generated firmware (host build, ASan/UBSan) against the golden model -------------------------------------

@pytest.mark.parametrize("fixture", ["tconv_b_float", "tconv_b_int8", "tconv_a_int8"])
def test_generated_code_trains_like_the_golden_model(fixture, tmp_path):
    """As test_codegen.test_new_ops_train_like_the_golden_model: the converter's fixture with a classifier head,
    trained on the host: int8 forward bit-exact, losses within 1e-5, parameters identical (int8) / within 1e-5.
    tconv_a has no trainable layer below its transpose convs, so only the head trains there (forward only)."""
    import json

    import test_codegen as tc
    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.reorder import plan_schedules
    from tinytrain.stages.train.runtime_config import RuntimeConfig
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = tc._with_classifier_head(read_model(TC / f"{fixture}.tflite"))
    opt = "sgd" if fixture.endswith("int8") else "adam"
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    assert ("tt_transpose_conv_s8(" if fixture.endswith("int8") else "tt_transpose_conv_f32(") in src
    if fixture.startswith("tconv_b"):
        assert "tt_transpose_conv_grad_input_f32(" in src
    x, y = tc._data(tg, tc.STEPS)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:8], y[:8])
    cfg = RuntimeConfig(learning_rate=0.05 if opt == "sgd" else 0.01, epochs=1)
    out = tc._host_run_dumped(tmp_path, cfg)
    tc._check_first_evaluation(tg, x, tmp_path)
    want, state = tc._golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    tc._check_trained(out, json.loads((tmp_path / "prog" / "io_layout.json").read_text()), state)
