"""The quantize stage: float IR -> int8 IR that LiteRT's reference kernels run bit for bit like our
executor (DESIGN §8.2), accuracy close to the TF converter's int8 model, clear errors on bad input."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.contract import StageContext
from tinytrain.pipeline.errors import ModelError, UserError
from tinytrain.pipeline.spec_data import DataSpec
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages import quantize
from tinytrain.stages.model import bn_fold
from tinytrain.stages.quant import calibrate
from tinytrain.stages.quant import ptq
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model

FIX = Path(__file__).parent / "fixtures"
FLOAT_MODELS = ["mlp", "convnet", "residual", "dwsep", "mbv2_block"]


def run_graph(graph, feeds, keep_intermediates=False):
    # Compared with LiteRT's BUILTIN_REF, whose int8 FULLY_CONNECTED rescales in double precision
    # (TFLite Micro and our C use the fixed-point multiplier; tests/test_executor_litert.py covers both).
    from tinytrain.stages.golden.forward import run_graph as rg
    return rg(graph, feeds, keep_intermediates=keep_intermediates, fc_requant="litert_double")


# LiteRT can abort the whole process on a graph it rejects, which must fail one test, not pytest:
# it runs in a child process, with the reference kernels (the default XNNPACK path requantizes in fp32).
_LITERT = """
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType
it = Interpreter(model_path=sys.argv[1], experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
it.allocate_tensors()
xs = np.load(sys.argv[2])
i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
outs = []
for k in range(len(xs)):
    it.set_tensor(i, xs[k:k + 1])
    it.invoke()
    outs.append(it.get_tensor(o).copy())
np.save(sys.argv[3], np.concatenate(outs))
"""


def litert(model: Path, xs: np.ndarray, tmp: Path) -> np.ndarray:
    """First output of `model` for each sample of `xs` (batch 1 each), by LiteRT's reference kernels."""
    np.save(tmp / "x.npy", xs)
    r = subprocess.run([sys.executable, "-c", _LITERT, str(model), str(tmp / "x.npy"), str(tmp / "y.npy")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(tmp / "y.npy")


def gaussian(graph: Graph, n: int, seed: int = 0) -> np.ndarray:
    # The fixtures' converter calibrated on N(0, 1) inputs; so do we.
    shape = graph.tensors[graph.inputs[0]].shape[1:]
    return np.random.default_rng(seed).normal(size=[n] + shape).astype(np.float32)


def quantize_fixture(name: str, **spec):
    g = read_model(FIX / f"{name}.tflite")
    x_eval = np.load(FIX / f"{name.rsplit('_', 1)[0]}.input.npy")
    q, report = quantize.quantize_model(g, gaussian(g, 32), QuantizeSpec(num_samples=32, **spec), x_eval)
    return g, q, report, x_eval


def as_int8_feed(q: Graph, x: np.ndarray) -> np.ndarray:
    t = q.tensors[q.inputs[0]]
    if t.dtype != "int8":
        return x.astype(np.float32)
    return np.clip(np.round(x / t.quant.scale[0]) + t.quant.zero_point[0], -128, 127).astype(np.int8)


def make_ctx(tmp: Path, graph: Graph, data: DataSpec | None, **spec) -> StageContext:
    load, out = tmp / "load", tmp / "quantize"
    load.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    graph.save(load)
    return StageContext(config={"quantize": QuantizeSpec(**spec), "data": data},
                        inputs={"load/graph.json": load / "graph.json", "load/tensors.npz": load / "tensors.npz"},
                        out_dir=out)


def npz_data(tmp: Path, **arrays) -> DataSpec:
    path = tmp / "data.npz"
    np.savez(path, **arrays)
    return DataSpec(source="npz", path=path)


# ---- int8 graph structure ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["convnet_float", "dwsep_float"])
def test_int8_graph_follows_tflite_spec(name):
    _, q, _, _ = quantize_fixture(name)
    assert ptq.validate_int8(q) == []
    for op in q.ops:
        if op.type in bn_fold.LINEAR_OPS:
            x, w, b = (q.tensors[n] for n in op.inputs[:3])
            axis = bn_fold.out_channel_axis(op.type)
            assert w.dtype == "int8" and w.quant.axis == axis and len(w.quant.scale) == w.shape[axis]
            assert set(w.quant.zero_point) == {0} and np.abs(w.data.astype(int)).max() <= 127
            assert b.dtype == "int32"
            np.testing.assert_allclose(b.quant.scale, x.quant.scale[0] * np.asarray(w.quant.scale), rtol=1e-6)
        if op.type == "softmax":
            assert q.tensors[op.outputs[0]].quant.scale == [1 / 256] and q.tensors[op.outputs[0]].quant.zero_point == [-128]
        if op.type in ptq.SHARED_PARAM_OPS:
            for x in op.inputs if op.type == "concatenation" else op.inputs[:1]:
                assert q.tensors[x].quant.to_json() == q.tensors[op.outputs[0]].quant.to_json()
    assert {q.tensors[n].dtype for n in q.inputs + q.outputs} == {"int8"}


def test_float_io_adds_boundary_ops_only():
    _, q, _, _ = quantize_fixture("convnet_float", io="float")
    assert q.ops[0].type == "quantize" and q.ops[-1].type == "dequantize"
    assert sum(op.type in ("quantize", "dequantize") for op in q.ops) == 2
    assert {q.tensors[n].dtype for n in q.inputs + q.outputs} == {"float32"}


def test_per_tensor_weights_option():
    _, q, _, _ = quantize_fixture("convnet_float", per_channel=False)
    for op in q.ops:
        if op.type in bn_fold.LINEAR_OPS:
            assert len(q.tensors[op.inputs[1]].quant.scale) == 1


def test_fused_relu6_bounds_range_and_relu_floor_is_zero_point():
    _, q, report, _ = quantize_fixture("convnet_float")
    conv = next(op for op in q.ops if op.type == "conv2d" and op.attrs["act"] == "relu6")
    t = q.tensors[conv.outputs[0]]
    assert t.quant.zero_point == [-128] and t.quant.scale[0] * 255 <= 6.0 + 1e-6


# ---- bit-exactness vs LiteRT (DESIGN §8.2) -----------------------------------------------------

@pytest.mark.parametrize("name,opts", [(f"{m}_float", {}) for m in FLOAT_MODELS]
                         + [("convnet_float", {"io": "float"}), ("dwsep_float", {"per_channel": False}),
                            ("mbv2_block_float", {"calibration": "mse"}),
                            ("residual_float", {"calibration": "percentile"})])
def test_exported_int8_model_runs_bit_exactly_in_litert(name, opts, tmp_path):
    _, q, _, x = quantize_fixture(name, **opts)
    path = tmp_path / "model_int8.tflite"
    write_model(q, path)
    feed = as_int8_feed(q, x)
    ours = np.concatenate([run_graph(q, {q.inputs[0]: feed[i:i + 1]})[q.outputs[0]] for i in range(len(x))])
    theirs = litert(path, feed, tmp_path)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("name", [f"{m}_f16" for m in FLOAT_MODELS])
def test_float16_models_quantize_bit_exactly(name, tmp_path):
    g, q, report, x = quantize_fixture(name)
    assert not any(t.dtype == "float16" for t in q.tensors.values())
    assert any("float16" in n for n in report["notes"])
    path = tmp_path / "m.tflite"
    write_model(q, path)
    feed = as_int8_feed(q, x)
    ours = np.concatenate([run_graph(q, {q.inputs[0]: feed[i:i + 1]})[q.outputs[0]] for i in range(len(x))])
    np.testing.assert_array_equal(ours, litert(path, feed, tmp_path))


def test_float16_weights_are_dequantized_first():
    g = read_model(FIX / "mlp_f16.tflite")
    prepared, notes = ptq.prepare(g)
    assert not any(op.type == "dequantize" for op in prepared.ops)
    assert all(t.dtype != "float16" for t in prepared.tensors.values())
    assert len(notes) == sum(op.type == "dequantize" for op in g.ops)


# ---- accuracy on digits ------------------------------------------------------------------------

def digits_npz(tmp: Path) -> tuple[DataSpec, np.ndarray, np.ndarray]:
    """The fixture's own split (tests/make_fixtures.py: digits 0-4, test_size 0.25, random_state 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    keep = d.target < 5
    x = (d.images[keep] / 16.0).astype(np.float32)[..., None]
    y = d.target[keep].astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return npz_data(tmp, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te), x_te, y_te


def test_digits_int8_accuracy_close_to_converter_and_float(tmp_path):
    data, x_te, y_te = digits_npz(tmp_path)
    ctx = make_ctx(tmp_path, read_model(FIX / "digits_cnn_float.tflite"), data)
    result = quantize.run(ctx)
    m = json.loads((ctx.out_dir / "report.json").read_text())["model"]
    conv = read_model(FIX / "digits_cnn_int8.tflite")
    conv_acc = quantize._accuracy(quantize._outputs(conv, x_te), y_te)
    assert m["eval_samples"] == len(x_te) == 226
    assert abs(m["acc_int8"] - conv_acc) <= 0.01
    assert abs(m["acc_int8"] - m["acc_float"]) <= 0.01
    assert m["output_sqnr_db"] > 30 and m["agreement"] >= 0.99
    assert "acc float" in result.summary and "SQNR" in result.summary
    for f in quantize.ARTIFACTS:
        assert (ctx.out_dir / f).is_file(), f
    again = Graph.load(ctx.out_dir)
    assert ptq.validate_int8(again) == []
    text = quantize.inspect(ctx.out_dir)
    assert "scale" in text and "SQNR" in text and "conv2d" in text


# ---- cache keys: calibration settings are quantize's business only ------------------------------

def test_calibration_settings_change_quantize_preimage_not_load(tmp_path):
    from tinytrain.pipeline.preimage import stage_preimage
    from tinytrain.pipeline.spec import Spec
    from tinytrain.pipeline.stage_graph import stage

    base = {"name": "t", "model": {"path": str(FIX / "digits_cnn_float.tflite")}, "data": {"source": "digits"}}
    a = Spec.model_validate(base)
    b = Spec.model_validate({**base, "quantize": {"calibration": "mse", "num_samples": 50}})
    for name, same in (("load", True), ("quantize", False)):
        pa = stage_preimage(stage(name), a, {}, "")
        pb = stage_preimage(stage(name), b, {}, "")
        assert (pa == pb) is same, name


# ---- bad inputs --------------------------------------------------------------------------------

def test_calibration_data_wrong_shape(tmp_path):
    g = read_model(FIX / "digits_cnn_float.tflite")
    x = np.zeros((20, 8, 8, 3), np.float32)
    ctx = make_ctx(tmp_path, g, npz_data(tmp_path, x_train=x, y_train=np.zeros(20, int),
                                         x_test=x[:4], y_test=np.zeros(4, int)))
    with pytest.raises(UserError, match=r"expected samples of \[8, 8, 1\] .* got \[8, 8, 3\]"):
        quantize.run(ctx)


def test_calibration_data_wrong_dtype():
    g = read_model(FIX / "digits_cnn_float.tflite")
    with pytest.raises(UserError, match="dtype int32, expected float"):
        quantize.quantize_model(g, np.zeros((4, 8, 8, 1), np.int32), QuantizeSpec())


def test_calibration_data_empty():
    g = read_model(FIX / "digits_cnn_float.tflite")
    with pytest.raises(UserError, match="no samples"):
        quantize.quantize_model(g, np.zeros((0, 8, 8, 1), np.float32), QuantizeSpec())


def test_calibration_data_nan():
    g = read_model(FIX / "digits_cnn_float.tflite")
    x = np.zeros((4, 8, 8, 1), np.float32)
    x[1, 2, 3, 0] = np.nan
    with pytest.raises(UserError, match="NaN"):
        quantize.quantize_model(g, x, QuantizeSpec())


def test_labels_out_of_range(tmp_path):
    g = read_model(FIX / "digits_cnn_float.tflite")   # 10 outputs
    x = np.random.default_rng(0).random((30, 8, 8, 1)).astype(np.float32)
    y = np.arange(30) % 12
    ctx = make_ctx(tmp_path, g, npz_data(tmp_path, x_train=x, y_train=y, x_test=x[:12], y_test=y[:12]))
    with pytest.raises(UserError, match=r"labels .*11.* 10 classes"):
        quantize.run(ctx)


def test_nan_in_weights_is_named():
    g = read_model(FIX / "digits_cnn_float.tflite")
    w = next(t for t in g.tensors.values() if t.data is not None and t.data.ndim == 4)
    w.data = w.data.copy()
    w.data[0, 0, 0, 0] = np.nan
    with pytest.raises(ModelError, match=f"{w.name}.*NaN"):
        quantize.quantize_model(g, np.zeros((4, 8, 8, 1), np.float32), QuantizeSpec())


def test_no_data_section_is_a_user_error(tmp_path):
    ctx = make_ctx(tmp_path, read_model(FIX / "digits_cnn_float.tflite"), None)
    with pytest.raises(UserError, match="no `data` section"):
        quantize.run(ctx)


def test_spec_rejects_unknown_fields_and_bad_percentile():
    with pytest.raises(Exception, match="extra"):
        QuantizeSpec(calibrate="minmax")
    with pytest.raises(Exception, match="percentile"):
        QuantizeSpec(percentile=120)


# ---- BatchNorm folding -------------------------------------------------------------------------

def bn_graph(op_type: str = "conv2d") -> Graph:
    """x -> conv (no act) -> mul(gamma/sigma) -> add(beta - mu*gamma/sigma) -> relu6, as an unfused
    float export carries inference BatchNorm."""
    rng = np.random.default_rng(3)
    c_in, c_out = 3, 4
    if op_type == "conv2d":
        w = rng.normal(size=(c_out, 3, 3, c_in)).astype(np.float32)
        attrs = dict(stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="same", act="none")
    else:
        c_out = c_in
        w = rng.normal(size=(1, 3, 3, c_out)).astype(np.float32)
        attrs = dict(stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="same", act="none",
                     depth_multiplier=1)
    t = {
        "x": Tensor("x", [1, 6, 6, c_in], "float32", role="input"),
        "w": Tensor("w", list(w.shape), "float32", role="weight", data=w),
        "b": Tensor("b", [c_out], "float32", role="bias", data=rng.normal(size=c_out).astype(np.float32)),
        "m": Tensor("m", [c_out], "float32", role="constant", data=rng.uniform(0.5, 2, c_out).astype(np.float32)),
        "a": Tensor("a", [1, 1, 1, c_out], "float32", role="constant",
                    data=rng.normal(size=(1, 1, 1, c_out)).astype(np.float32)),
        "y0": Tensor("y0", [1, 6, 6, c_out], "float32"),
        "y1": Tensor("y1", [1, 6, 6, c_out], "float32"),
        "y2": Tensor("y2", [1, 6, 6, c_out], "float32"),
        "y": Tensor("y", [1, 6, 6, c_out], "float32", role="output"),
    }
    ops = [Op(op_type, ["x", "w", "b"], ["y0"], attrs), Op("mul", ["y0", "m"], ["y1"], {"act": "none"}),
           Op("add", ["a", "y1"], ["y2"], {"act": "none"}), Op("relu6", ["y2"], ["y"])]
    return Graph(tensors=t, ops=ops, inputs=["x"], outputs=["y"])


@pytest.mark.parametrize("op_type", ["conv2d", "depthwise_conv2d"])
def test_bn_folding_equals_unfolded_graph(op_type):
    g = bn_graph(op_type)
    folded, notes = bn_fold.fold(g)
    assert [op.type for op in folded.ops] == [op_type] and folded.ops[0].attrs["act"] == "relu6"
    assert folded.ops[0].outputs == ["y"] and len(notes) == 3
    x = np.random.default_rng(4).normal(size=(2, 6, 6, g.tensors["x"].shape[3])).astype(np.float32) * 0.3
    # The unfolded reference: conv alone by the executor, then BN and ReLU6 in numpy.
    conv_only = copy.deepcopy(g)
    conv_only.ops = conv_only.ops[:1]
    conv_only.outputs = ["y0"]
    y0 = run_graph(conv_only, {"x": x})["y0"]
    ref = np.clip(y0 * g.tensors["m"].data + g.tensors["a"].data.reshape(-1), 0, 6)
    got = run_graph(folded, {"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_bn_folded_graph_quantizes():
    g = bn_graph()
    x = np.random.default_rng(5).normal(size=(16, 6, 6, 3)).astype(np.float32)
    q, report = quantize.quantize_model(g, x, QuantizeSpec())
    assert [op.type for op in q.ops] == ["conv2d"]
    assert any("folded mul" in n for n in report["notes"]) and report["model"]["output_sqnr_db"] > 30


def test_unfoldable_mul_stays_and_is_quantized_as_an_int8_op():
    g = bn_graph()
    g.ops[0].attrs["act"] = "relu"  # a fused activation between conv and MUL: not a BatchNorm fold
    prepared, _ = ptq.prepare(g)
    assert "mul" in [op.type for op in prepared.ops], "an unfoldable MUL must be kept, not folded"
    x = np.random.default_rng(0).normal(size=[8] + list(g.tensors[g.inputs[0]].shape[1:])).astype(np.float32)
    q, _ = quantize.quantize_model(g, x, QuantizeSpec(), x)
    mul = next(op for op in q.ops if op.type == "mul")
    assert q.tensors[mul.outputs[0]].dtype == "int8"
    assert all(q.tensors[t].dtype == "int8" for t in mul.inputs if t is not None)


# ---- already-int8 models -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["convnet_int8", "convnet_int8_floatio", "dwsep_int8"])
def test_int8_model_passes_through_validated(name, tmp_path):
    g = read_model(FIX / f"{name}.tflite")
    result = quantize.run(make_ctx(tmp_path, g, None))
    assert "already int8" in result.summary
    out = Graph.load(tmp_path / "quantize")
    assert out.to_json() == g.to_json()
    assert (tmp_path / "quantize" / "model_int8.tflite").is_file()


def test_inconsistent_int8_model_is_rejected_with_reason(tmp_path):
    g = read_model(FIX / "convnet_int8.tflite")
    conv = next(op for op in g.ops if op.type == "conv2d")
    b = g.tensors[conv.inputs[2]]
    b.quant.scale = [s * 2 for s in b.quant.scale]
    with pytest.raises(ModelError, match="bias .* scale is not input scale x weight scale"):
        quantize.run(make_ctx(tmp_path, g, None))


# ---- calibration observers ---------------------------------------------------------------------

def test_calibration_methods_clip_outliers():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(size=100_000), [80.0]]).astype(np.float32)
    obs = calibrate.RangeObserver()
    obs.update(v)
    assert obs.range("minmax") == (float(v.min()), 80.0)
    lo, hi = obs.range("percentile", 99.9)
    assert 2.5 < hi < 4 and -4 < lo < -2.5
    mlo, mhi = obs.range("mse")
    assert mhi < 80.0
    s, z = calibrate.activation_qparams(0.0, 6.0)
    assert z == -128 and s == pytest.approx(6 / 255)


# ---- a float model made by others --------------------------------------------------------------

def _sine():
    tflm = pytest.importorskip("tflite_micro")
    found = sorted(Path(tflm.__file__).parent.rglob("sine_float.tflite"))
    if not found:
        pytest.skip("tflite_micro wheel ships no sine_float.tflite")
    g = read_model(found[0])
    x = np.linspace(0, 2 * np.pi, 200, dtype=np.float32)[:, None]
    q, report = quantize.quantize_model(g, x, QuantizeSpec(), x[3::7])
    return q, report, x[3::7]


def test_third_party_sine_model_quantizes_with_sqnr_reported(tmp_path):
    """TFLite Micro's hello-world sine model, shipped inside the tflite_micro wheel."""
    q, report, x = _sine()
    assert report["model"]["output_sqnr_db"] > 25
    out = tmp_path / "sine_int8.tflite"
    write_model(q, out)
    feed = as_int8_feed(q, x)
    ours = run_graph(q, {q.inputs[0]: feed})[q.outputs[0]]
    theirs = litert(out, feed, tmp_path)
    assert np.abs(ours.astype(int) - theirs).max() <= 2


def test_third_party_sine_model_bit_exact(tmp_path):
    q, _, x = _sine()
    out = tmp_path / "sine_int8.tflite"
    write_model(q, out)
    feed = as_int8_feed(q, x)
    ours = run_graph(q, {q.inputs[0]: feed})[q.outputs[0]]
    np.testing.assert_array_equal(ours, litert(out, feed, tmp_path))


def test_regression_data_calibrates_and_reports_sqnr_without_accuracy(tmp_path):
    """Float targets (data.task: regression) need no labels: calibration uses the inputs, the report has SQNR."""
    from tinytrain.stages.train.data import load_dataset

    g = read_model(FIX / "convnet_float.tflite")
    shape = g.tensors[g.inputs[0]].shape
    rng = np.random.default_rng(0)
    x = rng.normal(size=[40] + list(shape[1:])).astype(np.float32)
    y = rng.normal(size=(40, 3)).astype(np.float32)
    npz = tmp_path / "reg.npz"
    np.savez(npz, x_train=x[:30], y_train=y[:30], x_test=x[30:], y_test=y[30:])
    data = DataSpec(source="npz", path=npz, task="regression")
    assert load_dataset(data).regression
    result = quantize.run(make_ctx(tmp_path, g, data, num_samples=16))
    report = json.loads((tmp_path / "quantize" / "report.json").read_text())
    assert report["model"]["output_sqnr_db"] > 10
    assert "acc" not in result.summary
