"""Ops added for third-party models (PRELU, STRIDED_SLICE), each against LiteRT's reference kernels.

Fixtures: tests/fixtures/ops/, made by tests/make_op_fixtures.py with the TF converter (float and full-int8).
  - the executor on the converter's float and int8 files: float tensors within rtol 1e-5 of LiteRT BUILTIN_REF,
    int8 outputs and every int8 intermediate bit-exact;
  - our PTQ of the float file, written by our writer, run in LiteRT: bit-identical to our executor, intermediates
    included (the alpha zero point, both PRELU branches, slices with stride 2, stride -1 and shrink_axis);
  - autodiff names the op it cannot differentiate instead of crashing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.errors import UnsupportedOpError
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages import quantize
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model

import litert_oracle as oracle

OPS = Path(__file__).resolve().parent / "fixtures" / "ops"
FLOAT_RTOL = 1e-5


_batch = oracle.probe_batch


def _compare_all(g: Graph, path: Path, x: np.ndarray, fc_requant: str = "fixed_point") -> int:
    """Every activation of `g` (read from `path`) against LiteRT's tensor of the same file index."""
    return _compare(g, path, x, oracle.run_litert, fc_requant)


def _compare(g: Graph, path: Path, x: np.ndarray, runner, fc_requant: str) -> int:
    return len(oracle.compare_activations(g, path, x, runner, fc_requant, float_rtol=FLOAT_RTOL))


@pytest.mark.parametrize("variant", ["float", "int8"])
def test_converter_model_matches_litert(variant):
    path = OPS / f"prelu_slice_{variant}.tflite"
    g = read_model(path)
    assert [op.type for op in g.ops] == ["conv2d", "prelu", "strided_slice", "conv2d", "prelu", "strided_slice"]
    x = _batch(g, np.load(OPS / "prelu_slice.input.npy"))
    assert _compare_all(g, path, x) == 7


def test_reader_resolves_strided_slice_masks():
    g = read_model(OPS / "prelu_slice_float.tflite")
    s1, s2 = [op for op in g.ops if op.type == "strided_slice"]
    # x[:, 1:7:2, ::-1, 2:8]: begin/end masks on axes 0 and 2, stride -1 runs 7 -> 0 (stop -1 = before index 0).
    assert (s1.attrs["starts"], s1.attrs["stops"], s1.attrs["strides"]) == ([0, 1, 7, 2], [1, 7, -1, 8], [1, 2, -1, 1])
    # x[:, :, 1, :]: axis 2 shrinks to the single index 1.
    assert s2.attrs["shrink_axis_mask"] == 4 and (s2.attrs["starts"][2], s2.attrs["stops"][2]) == (1, 2)


def test_our_int8_export_of_prelu_and_slices_is_bit_exact_in_litert(tmp_path):
    g = read_model(OPS / "prelu_slice_float.tflite")
    sample = np.load(OPS / "prelu_slice.input.npy")
    rng = np.random.default_rng(3)
    calib = rng.normal(size=(64,) + sample.shape[1:]).astype(np.float32)
    q, report = quantize.quantize_model(g, calib, QuantizeSpec(), sample)
    assert report["model"]["output_sqnr_db"] > 25
    alphas = [q.tensors[op.inputs[1]] for op in q.ops if op.type == "prelu"]
    assert all(a.dtype == "int8" and not a.quant.per_channel for a in alphas)
    for op in q.ops:
        if op.type == "strided_slice":  # a copy: the output keeps the input's parameters
            assert q.tensors[op.outputs[0]].quant == q.tensors[op.inputs[0]].quant
    path = tmp_path / "prelu_slice_ours_int8.tflite"
    write_model(q, path)
    back = read_model(path)
    x = _batch(back, sample)
    assert _compare_all(back, path, x, fc_requant="litert_double") == 7
    # Both PRELU branches ran: some inputs below their zero point, some above.
    vals = run_graph(back, {back.inputs[0]: x}, keep_intermediates=True)
    for op in back.ops:
        if op.type == "prelu":
            zin = back.tensors[op.inputs[0]].quant.zero_point[0]
            v = vals[op.inputs[0]]
            assert (v < zin).any() and (v > zin).any()


def test_prelu_float_kernel_is_the_reference_formula():
    g = read_model(OPS / "prelu_slice_float.tflite")
    op = next(o for o in g.ops if o.type == "prelu")
    x = np.random.default_rng(0).normal(size=(2,) + tuple(g.tensors[op.inputs[0]].shape[1:])).astype(np.float32)
    from tinytrain.stages.golden.forward import run_op
    alpha = g.tensors[op.inputs[1]].data
    (y,) = run_op(g, op, {op.inputs[0]: x, op.inputs[1]: alpha}, n=2)
    np.testing.assert_array_equal(y, np.where(x >= 0, x, x * alpha))


def test_autodiff_names_an_op_it_cannot_differentiate():
    """An op without a backward rule (here one renamed to a type nobody knows) stops autodiff with its name and
    index, never a crash."""
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(OPS / "prelu_slice_float.tflite")
    g.ops[1].type = "frobnicate"
    with pytest.raises(UnsupportedOpError, match=r"unsupported op frobnicate at operator index 1 in autodiff"):
        build_training_graph(g, TrainPlan.last_k(g, 1), "mse", OptimizerSpec("sgd"), 1)


@pytest.mark.parametrize("name", ["prelu_slice", "act_arith", "bn_input"])
def test_autodiff_builds_training_graphs_through_the_new_ops(name):
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(OPS / f"{name}_float.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec("sgd"), 1)
    tg.validate()
    assert any(op.type.endswith("_update") for op in tg.ops)


# ---- MUL, SUB, LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU ----------------------------------------------------------
#
# act_arith (converter-made): CONV_2D -> LOGISTIC, TANH -> MUL (fused RELU) -> SUB -> HARD_SWISH -> LEAKY_RELU
# -> MUL by a constant [8] -> SUB of a constant [1,1,8] (fused RELU6). bn_input: BatchNorm on the input, which the
# converter leaves as MUL + ADD with per-channel constants, -> CONV_2D.
#
# LiteRT (BUILTIN_REF) is compared with fc_requant="litert_double", TFLite Micro with the default "fixed_point":
# the two differ in how some kernels form their multipliers (MUL: float vs double scale ratio; FULLY_CONNECTED)
# and int8 LOGISTIC/TANH run a float-filled table in LiteRT, gemmlowp fixed point in TFLM.

from tinytrain.stages.model.ir import Op, QuantParams, Tensor  # noqa: E402
from tinytrain.stages.golden import int8_arith as ia  # noqa: E402

NEW_OPS = ["conv2d", "logistic", "tanh", "mul", "sub", "hard_swish", "leaky_relu", "mul", "sub"]


def _compare_with(g: Graph, path: Path, x: np.ndarray, backend: str) -> int:
    """LiteRT is compared in its own rounding mode, TFLite Micro in the default (fixed-point) one."""
    if backend == "litert":
        return _compare(g, path, x, oracle.run_litert, "litert_double")
    return _compare(g, path, x, oracle.run_tflm, "fixed_point")


def _backends(variant: str) -> list[str]:
    # TFLite Micro runs int8 only (its float kernels are not what the MCU runs; the wheel lacks some).
    return ["litert"] + (["tflm"] if variant == "int8" and oracle.tflm_available() else [])


@pytest.mark.parametrize("variant", ["float", "int8"])
def test_converter_act_arith_matches_litert_and_tflm(variant):
    path = OPS / f"act_arith_{variant}.tflite"
    g = read_model(path)
    assert [op.type for op in g.ops] == NEW_OPS
    muls = [op for op in g.ops if op.type == "mul"]
    subs = [op for op in g.ops if op.type == "sub"]
    assert muls[0].attrs["act"] == "relu" and subs[1].attrs["act"] == "relu6"
    # The constant operands broadcast: [8] against [1,6,6,8], [1,1,8] against [1,6,6,8].
    assert g.tensors[muls[1].inputs[1]].shape == [8] and g.tensors[subs[1].inputs[1]].shape == [1, 1, 8]
    assert abs(next(op for op in g.ops if op.type == "leaky_relu").attrs["alpha"] - 0.2) < 1e-7
    x = _batch(g, np.load(OPS / "act_arith.input.npy"))
    for backend in _backends(variant):
        assert _compare_with(g, path, x, backend) == 10


@pytest.mark.parametrize("variant", ["float", "int8"])
def test_converter_unfused_batchnorm_matches_litert_and_tflm(variant):
    path = OPS / f"bn_input_{variant}.tflite"
    g = read_model(path)
    assert [op.type for op in g.ops] == ["mul", "add", "conv2d"]
    x = _batch(g, np.load(OPS / "bn_input.input.npy"))
    for backend in _backends(variant):
        assert _compare_with(g, path, x, backend) == 4


@pytest.mark.parametrize("name", ["act_arith", "bn_input"])
def test_our_int8_export_of_new_ops_is_bit_exact(name, tmp_path):
    g = read_model(OPS / f"{name}_float.tflite")
    sample = np.load(OPS / f"{name}.input.npy")
    calib = np.random.default_rng(3).normal(size=(64,) + sample.shape[1:]).astype(np.float32)
    q, report = quantize.quantize_model(g, calib, QuantizeSpec(), sample)
    assert report["model"]["output_sqnr_db"] > (15 if name == "act_arith" else 30)
    assert [op.type for op in q.ops] == [op.type for op in g.ops]
    for op in q.ops:
        qp = q.tensors[op.outputs[0]].quant
        if op.type == "logistic":
            assert (qp.scale[0], qp.zero_point[0]) == (1 / 256, -128)
        if op.type == "tanh":
            assert (qp.scale[0], qp.zero_point[0]) == (1 / 128, 0)
        if op.type in ("mul", "sub", "add"):
            # Constant operands (BatchNorm's scale and offset here, unfoldable on the input) are int8 per tensor.
            for n in op.inputs:
                t = q.tensors[n]
                assert t.dtype == "int8" and not t.quant.per_channel
    path = tmp_path / f"{name}_ours_int8.tflite"
    write_model(q, path)
    back = read_model(path)
    x = _batch(back, sample)
    for backend in ["litert"] + (["tflm"] if oracle.tflm_available() else []):
        assert _compare_with(back, path, x, backend) == len(back.ops) + 1


# -- parameter sweeps: every int8 input value, many scales -------------------------------------------------------

def _aq(s: float, z: int) -> QuantParams:
    return QuantParams([float(np.float32(s))], [int(z)], 0)


def _sweep_graph(seed: int, k: int) -> Graph:
    """k independent [1,256] int8 inputs with random (scale, zero point), each through every new op (and RELU),
    with random output parameters: fed all 256 values, the graph covers every table entry and both sides of every
    branch for k parameter sets at once."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, Tensor] = {}
    ops, ins, outs = [], [], []

    def t(name, qp, role="activation"):
        tensors[name] = Tensor(name, [1, 256], "int8", role=role, quant=qp)
        return name

    for i in range(k):
        s_in = float(np.exp(rng.uniform(np.log(0.003), np.log(0.3))))
        x = t(f"x{i}", _aq(s_in, rng.integers(-100, 100)), "input")
        ins.append(x)

        def op(kind, inputs, qp, **attrs):
            out = t(f"{kind}{i}", qp)
            ops.append(Op(kind, inputs, [out], attrs))
            outs.append(out)
            return out

        lg = op("logistic", [x], _aq(1 / 256, -128))
        op("tanh", [x], _aq(1 / 128, 0))
        op("hard_swish", [x], _aq(s_in * rng.uniform(0.3, 1.5), rng.integers(-128, -60)))
        op("leaky_relu", [x], _aq(s_in * rng.uniform(0.5, 1.5), rng.integers(-50, 50)),
           alpha=float(np.float32(rng.uniform(-0.5, 0.9))))
        op("relu", [x], _aq(s_in * rng.uniform(0.5, 1.5), rng.integers(-128, -100)))
        op("mul", [x, x], _aq(s_in * s_in * 128 * rng.uniform(0.5, 4), rng.integers(-128, 0)), act="none")
        op("sub", [x, lg], _aq(s_in * rng.uniform(1, 3), rng.integers(-20, 20)), act="relu")
    for n in outs:
        tensors[n].role = "output"
    g = Graph(tensors, ops, ins, outs)
    g.validate()
    return g


def _run_outputs(g: Graph, path: Path, backend: str, feeds: list[np.ndarray]) -> list[str]:
    mode = "litert_double" if backend == "litert" else "fixed_point"
    ours = run_graph(g, dict(zip(g.inputs, feeds)), fc_requant=mode)
    res = (oracle.run_litert if backend == "litert" else oracle.run_tflm)(path, feeds)
    return [f"{n}: {int((ours[n] != r.reshape(ours[n].shape)).sum())} differ"
            for n, r in zip(g.outputs, res.outputs) if not np.array_equal(ours[n], r.reshape(ours[n].shape))]


@pytest.mark.parametrize("backend", ["litert", "tflm"])
def test_new_int8_ops_bit_exact_over_all_inputs_and_many_scales(backend, tmp_path):
    if backend == "tflm" and not oracle.tflm_available():
        pytest.skip("the tflite-micro wheel is not installed")
    g = _sweep_graph(11, 24)
    path = tmp_path / "sweep.tflite"
    write_model(g, path)
    feeds = [np.arange(-128, 128, dtype=np.int8)[None] for _ in g.inputs]
    assert _run_outputs(g, path, backend, feeds) == []


def test_int8_logistic_and_tanh_table_and_fixed_point_agree():
    """LiteRT's float-filled table and TFLM's gemmlowp fixed point: two algorithms, one answer on every input
    value of every scale we tried (each is also checked against its runtime above)."""
    rng = np.random.default_rng(0)
    x = np.arange(-128, 128)
    for _ in range(100):
        s = float(np.float32(np.exp(rng.uniform(np.log(0.001), np.log(1.0)))))
        z = int(rng.integers(-128, 128))
        m, sh, r = ia.logistic_tanh_params(s)
        np.testing.assert_array_equal(ia.logistic_int8_fixed(x, z, m, sh, r),
                                      ia.apply_lut(x, ia.lut_int8(s, z, 1 / 256, -128, ia.logistic_f32)))
        np.testing.assert_array_equal(ia.tanh_int8_fixed(x, z, m, sh, r),
                                      ia.apply_lut(x, ia.lut_int8(s, z, 1 / 128, 0, ia.tanhf)))


# -- multipliers formed in float, not double ---------------------------------------------------------------------

def _float_vs_double_case(kind: str, seed: int = 5):
    """Scales whose float-formed multiplier (what LiteRT's Prepare computes) and double-formed one round to
    different Q0.31 mantissas AND give a different int8 output for some input: a kernel computing in the wrong
    precision fails on it."""
    rng = np.random.default_rng(seed)
    x = np.arange(-128, 128, dtype=np.int64)
    for _ in range(200000):
        s_in, s_out = (float(np.float32(v)) for v in np.exp(rng.uniform(-6, 0, 2)))
        z_in = int(rng.integers(-128, 128))
        if kind == "relu":
            z_out = -128
            f = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
            d = ia.quantize_multiplier(s_in / s_out)
            v = x - z_in
        else:  # mul of the input by itself
            s_out = float(np.float32(s_in * s_in * 128 * np.exp(rng.uniform(-1, 1))))
            z_out = 0
            f = ia.quantize_multiplier(ia.f32(np.float32(np.float32(s_in) * np.float32(s_in)) / np.float32(s_out)))
            d = ia.quantize_multiplier(s_in * s_in / s_out)
            v = (x - z_in) ** 2
        if f == d:
            continue
        yf = ia.multiply_by_quantized_multiplier(v, *f) + z_out
        yd = ia.multiply_by_quantized_multiplier(v, *d) + z_out
        keep = (np.clip(yf, -128, 127) != np.clip(yd, -128, 127))
        if kind == "relu":
            keep &= v >= 0
        if keep.any():
            return s_in, z_in, s_out, z_out
    raise AssertionError(f"no discriminating scales found for {kind}")


@pytest.mark.parametrize("kind", ["relu", "mul"])
@pytest.mark.parametrize("backend", ["litert", "tflm"])
def test_int8_multiplier_precision_matches_each_runtime(kind, backend, tmp_path):
    """LiteRT's ReluPrepare and MulPrepare divide float scales in float, TFLite Micro's in double; for these
    scales the two give different multipliers and a different output for some input value, so each runtime is
    matched only by its own mode (fc_requant="litert_double" / "fixed_point")."""
    if backend == "tflm" and not oracle.tflm_available():
        pytest.skip("the tflite-micro wheel is not installed")
    s_in, z_in, s_out, z_out = _float_vs_double_case(kind)
    x = Tensor("x", [1, 256], "int8", role="input", quant=_aq(s_in, z_in))
    y = Tensor("y", [1, 256], "int8", role="output", quant=_aq(s_out, z_out))
    op = Op("relu", ["x"], ["y"]) if kind == "relu" else Op("mul", ["x", "x"], ["y"], {"act": "none"})
    g = Graph({"x": x, "y": y}, [op], ["x"], ["y"])
    path = tmp_path / f"{kind}.tflite"
    write_model(g, path)
    feeds = [np.arange(-128, 128, dtype=np.int8)[None]]
    assert _run_outputs(g, path, backend, feeds) == []
    other = run_graph(g, {"x": feeds[0]}, fc_requant="fixed_point" if backend == "litert" else "litert_double")
    assert not np.array_equal(other["y"], run_graph(g, {"x": feeds[0]}, fc_requant="litert_double" if backend == "litert" else "fixed_point")["y"])


def test_reader_rejects_operands_that_do_not_broadcast(tmp_path):
    from tinytrain.pipeline.errors import ModelError

    x = Tensor("x", [1, 4, 3], "float32", role="input")
    c = Tensor("c", [2], "float32", data=np.ones(2, np.float32))
    y = Tensor("y", [1, 4, 3], "float32", role="output")
    g = Graph({"x": x, "c": c, "y": y}, [Op("mul", ["x", "c"], ["y"], {"act": "none"})], ["x"], ["y"])
    write_model(g, tmp_path / "bad.tflite")
    with pytest.raises(ModelError, match="do not broadcast"):
        read_model(tmp_path / "bad.tflite")
