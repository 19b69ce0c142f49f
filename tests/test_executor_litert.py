"""The reference executor against oracles we did not write (DESIGN §8, rung 1).

For every converter-made fixture (tests/fixtures/*.tflite, made by tests/make_fixtures.py):
  - LiteRT with OpResolverType.BUILTIN_REF (TFLite's reference kernels, not XNNPACK) in a child process:
    int8 outputs and every int8 intermediate tensor bit-exact; float ones within rtol 1e-5;
  - TFLite Micro's Python interpreter, where the wheel is installed and the model runs there;
  - batch independence: a batch of N gives what N runs of one give, bit for bit.
Plus unit tests of the fixed-point helpers on their edge cases.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages.golden.forward import ExecutionError, run_graph
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor

import litert_oracle as oracle

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL_FILES = sorted(p.name for p in FIXTURES.glob("*.tflite"))
FLOAT_RTOL = 1e-5

pytestmark = pytest.mark.skipif(not MODEL_FILES, reason="no fixtures; run tests/make_fixtures.py")


def _read_model(path: Path) -> Graph:
    from tinytrain.stages.model.tflite_reader import read_model

    return read_model(path)


def _base_name(fname: str) -> str:
    stem = fname[:-len(".tflite")]
    for suffix in ("_int8_floatio", "_float", "_int8", "_f16"):
        if stem.endswith(suffix):
            return stem[:-len(suffix)]
    return stem


@lru_cache(maxsize=None)
def _case(fname: str) -> tuple[Graph, np.ndarray]:
    """The graph and a test batch: the saved sample, wider random inputs, and for int8 inputs the full int8
    range (uniform noise, all -128, all 127) to drive every saturation path."""
    graph = _read_model(FIXTURES / fname)
    inp = graph.tensors[graph.inputs[0]]
    sample = np.load(FIXTURES / f"{_base_name(fname)}.input.npy")
    rng = np.random.default_rng(7)
    shape = tuple(inp.shape[1:])
    if inp.dtype == "int8":
        s, z = inp.quant.scale[0], inp.quant.zero_point[0]
        q = np.clip(np.round(sample / s) + z, -128, 127).astype(np.int8)
        noise = rng.integers(-128, 128, size=(2,) + shape).astype(np.int8)
        edges = np.stack([np.full(shape, -128, np.int8), np.full(shape, 127, np.int8)])
        batch = np.concatenate([q, noise, edges])
    else:
        wide = (rng.normal(size=(2,) + shape) * 3).astype(np.float32)
        batch = np.concatenate([sample.astype(np.float32), wide])
    return graph, batch


@lru_cache(maxsize=None)
def _litert(fname: str) -> oracle.OracleResult:
    graph, batch = _case(fname)
    return oracle.run_litert(FIXTURES / fname, [batch])


def _compare(graph: Graph, ours: dict[str, np.ndarray], res: oracle.OracleResult, n: int,
             skip: set[str] = frozenset(), require_all: bool = True) -> tuple[int, list[str]]:
    """Compare every non-constant IR tensor with the oracle's tensor of the same file index."""
    problems, checked = [], 0
    producers = graph.producers()
    for name, t in graph.tensors.items():
        if t.data is not None or t.source_index is None or name not in ours or name in skip:
            continue
        theirs = res.tensors.get(t.source_index)
        if theirs is None:
            if require_all:
                problems.append(f"{name}: oracle has no tensor #{t.source_index}")
            continue
        shape = tuple(t.shape)
        theirs = np.asarray(theirs).reshape((n,) + shape)
        mine = ours[name]
        if mine.shape == shape and name not in graph.inputs and n != 1:
            theirs = theirs[0]  # computed from constants only (e.g. dequantized float16 weights)
        else:
            mine = mine.reshape((n,) + shape)
        op = graph.ops[producers[name]].type if name in producers else "input"
        checked += 1
        if t.dtype == "float32":
            atol = 1e-6 * max(1.0, float(np.abs(theirs).max(initial=0.0)))
            if not np.allclose(mine, theirs, rtol=FLOAT_RTOL, atol=atol):
                err = np.max(np.abs(mine - theirs) / (np.abs(theirs) + atol))
                problems.append(f"{name} ({op}): float mismatch, max rel err {err:.3g}")
        elif not np.array_equal(mine, theirs):
            d = np.abs(mine.astype(np.int64) - theirs.astype(np.int64))
            problems.append(f"{name} ({op}, {t.dtype}): {int((d > 0).sum())}/{d.size} elements differ, "
                            f"max |diff| {int(d.max())}")
    return checked, problems


# ---- LiteRT BUILTIN_REF -------------------------------------------------------------------------

@pytest.mark.parametrize("fname", MODEL_FILES)
def test_matches_litert_reference_kernels(fname):
    graph, batch = _case(fname)
    res = _litert(fname)
    # LiteRT's reference FULLY_CONNECTED rescales in double (see run_graph's fc_requant); everything else is the
    # executor's default fixed-point arithmetic.
    ours = run_graph(graph, {graph.inputs[0]: batch}, keep_intermediates=True, fc_requant="litert_double")
    n = batch.shape[0]
    checked, problems = _compare(graph, ours, res, n)
    assert not problems, f"{fname}: " + "; ".join(problems)
    assert checked >= len(graph.ops)  # every op's output was compared
    for i, name in enumerate(graph.outputs):  # and the outputs by their own route too
        theirs = res.outputs[i].reshape(ours[name].shape)
        if ours[name].dtype == np.int8:
            np.testing.assert_array_equal(ours[name], theirs)
        else:
            np.testing.assert_allclose(ours[name], theirs, rtol=FLOAT_RTOL, atol=1e-7)


def test_fixtures_cover_the_op_vocabulary():
    seen = {(op.type, _case(f)[0].tensors[op.inputs[0]].dtype) for f in MODEL_FILES for op in _case(f)[0].ops}
    for op in ("conv2d", "depthwise_conv2d", "fully_connected", "add", "average_pool2d", "max_pool2d", "mean",
               "reshape", "softmax", "relu", "relu6", "pad", "concatenation"):
        assert (op, "float32") in seen and (op, "int8") in seen, op
    assert ("quantize", "float32") in seen and ("dequantize", "int8") in seen and ("dequantize", "float16") in seen


@pytest.mark.parametrize("fname", [f for f in MODEL_FILES if f.startswith(("residual", "dwsep"))])
def test_batch_size_does_not_change_results(fname):
    graph, batch = _case(fname)
    whole = run_graph(graph, {graph.inputs[0]: batch}, keep_intermediates=True)
    for i in (0, batch.shape[0] - 1):
        one = run_graph(graph, {graph.inputs[0]: batch[i:i + 1]}, keep_intermediates=True)
        for name, arr in one.items():
            if name in graph.inputs or arr.shape[:1] != (1,) or whole[name].shape[0] != batch.shape[0]:
                continue
            np.testing.assert_array_equal(whole[name][i:i + 1], arr, err_msg=name)


def test_digits_float_accuracy_matches_the_recorded_one():
    info = json.loads((FIXTURES / "digits_cnn_float.json").read_text())
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    keep = d.target < 5
    x = (d.images[keep] / 16.0).astype(np.float32)[..., None]
    _, x_te, _, y_te = train_test_split(x, d.target[keep], test_size=0.25, random_state=0, stratify=d.target[keep])
    graph = _read_model(FIXTURES / "digits_cnn_float.tflite")
    probs = run_graph(graph, {graph.inputs[0]: x_te})[graph.outputs[0]]
    assert probs.shape == (len(y_te), 10)
    acc = float(np.mean(probs.argmax(axis=1) == y_te))
    assert acc == pytest.approx(info["float_test_accuracy"], abs=1e-12)


# ---- TFLite Micro -------------------------------------------------------------------------------

def _tflm_relu6_divergence(graph: Graph) -> tuple[set[str], list[Op]]:
    """TFLM's int8 RELU6 (micro/kernels/activations_common.cc Relu6Prepare) clamps to [zp_in, q(6)] in the
    *input's* parameters and ignores the output's; LiteRT's (activations.cc QuantizedReluX) requantizes to the
    output's. The converter does give them different parameters, so from such an op on, TFLM is not the
    oracle: return the tensors downstream of it and the ops themselves."""
    bad_ops = [op for op in graph.ops if op.type == "relu6" and graph.tensors[op.inputs[0]].dtype == "int8"
               and graph.tensors[op.inputs[0]].quant.to_json() != graph.tensors[op.outputs[0]].quant.to_json()]
    tainted = {op.outputs[0] for op in bad_ops}
    for op in graph.ops:
        if any(i in tainted for i in op.inputs if i is not None):
            tainted.update(op.outputs)
    return tainted, bad_ops


@pytest.mark.skipif(not oracle.tflm_available(), reason="tflite_micro wheel not installed")
@pytest.mark.parametrize("fname", MODEL_FILES)
def test_matches_tflite_micro(fname):
    graph, batch = _case(fname)
    if any(t.dtype == "float16" for t in graph.tensors.values()):
        pytest.skip("TFLite Micro has no float16 DEQUANTIZE kernel (allocation fails)")
    res = oracle.run_tflm(FIXTURES / fname, [batch])
    ours = run_graph(graph, {graph.inputs[0]: batch}, keep_intermediates=True)
    tainted, bad_ops = _tflm_relu6_divergence(graph)
    checked, problems = _compare(graph, ours, res, batch.shape[0], skip=tainted, require_all=False)
    assert not problems, f"{fname} vs TFLM: " + "; ".join(problems)
    assert checked >= 1
    for op in bad_ops:  # the divergence is exactly TFLM's kernel behaviour, nothing else
        x_t = graph.tensors[op.inputs[0]]
        s, z = x_t.quant.scale[0], x_t.quant.zero_point[0]
        six = int(np.clip(np.round(np.float32(6.0) / np.float32(s)) + z, -128, 127))
        want = np.clip(ours[op.inputs[0]], z, six)
        got = res.tensors[graph.tensors[op.outputs[0]].source_index].reshape(want.shape)
        np.testing.assert_array_equal(got, want)


def test_fc_rescale_modes_differ_only_on_near_ties():
    """TFLM (and our default) rescale FULLY_CONNECTED with the fixed-point multiplier and double rounding; LiteRT's
    BUILTIN_REF with a double. On this fixture the two disagree on a handful of accumulators whose real value sits
    within a hair of .5: by exactly 1, and only on FC outputs and what is computed from them."""
    fname = "softmax_sweep_int8.tflite"
    graph, batch = _case(fname)
    fixed = run_graph(graph, {graph.inputs[0]: batch}, keep_intermediates=True)
    double = run_graph(graph, {graph.inputs[0]: batch}, keep_intermediates=True, fc_requant="litert_double")
    fc_outs = {op.outputs[0] for op in graph.ops if op.type == "fully_connected"}
    differing = {k for k in fixed if not np.array_equal(fixed[k], double[k])}
    assert differing & fc_outs, "expected at least one near-tie on this fixture"
    for k in differing & fc_outs:
        assert np.abs(fixed[k].astype(int) - double[k].astype(int)).max() == 1
    downstream = {op.outputs[0] for op in graph.ops if set(op.inputs) & (differing | fc_outs)}
    assert differing <= fc_outs | downstream
    with pytest.raises(ValueError):
        run_graph(graph, {graph.inputs[0]: batch}, fc_requant="single")


# ---- fixed-point helpers ------------------------------------------------------------------------

def test_srdhm_saturates_int32_min_squared():
    assert ia.saturating_rounding_doubling_high_mul(ia.INT32_MIN, ia.INT32_MIN) == ia.INT32_MAX
    # Only that one product saturates.
    assert ia.saturating_rounding_doubling_high_mul(ia.INT32_MIN, ia.INT32_MAX) == -ia.INT32_MAX
    assert ia.saturating_rounding_doubling_high_mul(ia.INT32_MAX, ia.INT32_MAX) == ia.INT32_MAX - 1


def test_srdhm_rounding_is_asymmetric_like_gemmlowp():
    # a*b / 2^31 = +0.5 rounds up; -0.5 rounds to 0 (the nudge is 1 - 2^30 for negatives, then truncation).
    assert ia.saturating_rounding_doubling_high_mul(1, 1 << 30) == 1
    assert ia.saturating_rounding_doubling_high_mul(-1, 1 << 30) == 0
    assert ia.saturating_rounding_doubling_high_mul(-3, 1 << 30) == -1  # -1.5 -> -1
    assert ia.saturating_rounding_doubling_high_mul(3, 1 << 30) == 2    # 1.5 -> 2
    assert ia.saturating_rounding_doubling_high_mul(1 << 30, 1 << 30) == 1 << 29


def test_rounding_divide_by_pot_ties_away_from_zero():
    x = np.array([5, -5, 3, -3, 4, -4, 6, -6, 7, -7, 0, ia.INT32_MAX, ia.INT32_MIN])
    np.testing.assert_array_equal(ia.rounding_divide_by_pot(x, 1), [3, -3, 2, -2, 2, -2, 3, -3, 4, -4, 0, 1 << 30,
                                                                    -(1 << 30)])
    np.testing.assert_array_equal(ia.rounding_divide_by_pot([6, -6, 5, -5, 10, -10], 2), [2, -2, 1, -1, 3, -3])
    np.testing.assert_array_equal(ia.rounding_divide_by_pot([123, -123], 0), [123, -123])
    assert ia.rounding_divide_by_pot(ia.INT32_MIN, 31) == -1
    # Per-channel exponents broadcast.
    np.testing.assert_array_equal(ia.rounding_divide_by_pot([[10, 10, 10]], [0, 1, 2]), [[10, 5, 3]])
    with pytest.raises(ValueError):
        ia.rounding_divide_by_pot(1, -1)


def test_multiply_by_quantized_multiplier_shifts():
    q, s = ia.quantize_multiplier(0.75)
    assert (q, s) == (3 << 29, 0)
    assert ia.multiply_by_quantized_multiplier(100, q, s) == 75
    assert ia.multiply_by_quantized_multiplier(-101, q, s) == -76     # -75.75
    q, s = ia.quantize_multiplier(0.75 / 8)                            # negative shift: a rounding right shift
    assert s == -3 and ia.multiply_by_quantized_multiplier(1000, q, s) == 94  # 93.75
    assert ia.multiply_by_quantized_multiplier(-1000, q, s) == -94
    assert ia.multiply_by_quantized_multiplier(4, q, s) == 0          # 0.375
    assert ia.multiply_by_quantized_multiplier(-4, q, s) == 0
    q, s = ia.quantize_multiplier(3.0)                                 # positive shift: int32 left shift first
    assert s == 2 and ia.multiply_by_quantized_multiplier(7, q, s) == 21
    # The left shift wraps like the C int32 multiply, then the product is taken: no silent widening.
    big = (1 << 30) + 1
    assert ia.multiply_by_quantized_multiplier(big, q, s) == ia.saturating_rounding_doubling_high_mul(
        ia.wrap32(big * 4), q)
    # Ties: +1.5 -> 2 but -1.5 -> -1 (SRDHM's nudge), whereas RoundingDivideByPOT sends -1.5 to -2.
    q, s = ia.quantize_multiplier(0.5)
    assert ia.multiply_by_quantized_multiplier(3, q, s) == 2 and ia.multiply_by_quantized_multiplier(-3, q, s) == -1
    q, s = ia.quantize_multiplier(0.25)                                 # same product, rounded by the shift
    assert s == -1 and ia.multiply_by_quantized_multiplier(6, q, s) == 2
    assert ia.multiply_by_quantized_multiplier(-6, q, s) == -2


def test_quantize_multiplier_edges():
    assert ia.quantize_multiplier(0.0) == (0, 0)
    assert ia.quantize_multiplier(1.0) == (1 << 30, 1)
    assert ia.quantize_multiplier(0.5) == (1 << 30, 0)
    assert ia.quantize_multiplier(1.0 - 2.0 ** -40) == (1 << 30, 1)   # mantissa rounds to 2^31: halved
    assert ia.quantize_multiplier(2.0 ** -40) == (0, 0)                # shift below -31 flushes to zero
    q, s = ia.quantize_multiplier(2.0 ** -31)
    assert (q, s) == (1 << 30, -30)
    with pytest.raises(ValueError):
        ia.quantize_multiplier_smaller_than_one_exp(1.5)


def test_round_half_away_from_zero():
    assert [ia.round_half_away(v) for v in (2.5, -2.5, 0.5, -0.5, 1.4999999999999998, 0.49999999999999994)] == \
        [3, -3, 1, -1, 1, 0]
    from tinytrain.stages.golden.int8_arith import round_half_away_array as _round_half_away_f32

    v = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.49999997], dtype=np.float32)
    np.testing.assert_array_equal(_round_half_away_f32(v), [1, -1, 2, 3, -3, 0, 0])


def test_activation_range_uses_float32_division():
    assert ia.activation_range("relu6", 6.0 / 255, -128) == (-128, 127)
    assert ia.activation_range("relu", 0.1, 5) == (5, 127)
    assert ia.activation_range("none", 0.1, 5) == (-128, 127)
    assert ia.activation_range("relu_n1_to_1", 0.01, 0) == (-100, 100)


def test_exp_on_negative_values_tracks_exp():
    a = -np.arange(0, 32 << 26, 12345677, dtype=np.int64)               # Q5.26 in (-32, 0]
    got = ia.exp_on_negative_values(a, 5) / 2.0 ** 31
    np.testing.assert_allclose(got, np.exp(a / 2.0 ** 26), atol=2e-7)
    assert ia.exp_on_negative_values(0, 5) == ia.INT32_MAX


def test_reciprocal_tracks_one_over_x():
    x = np.arange(0, 1 << 31, 9876543, dtype=np.int64)                 # Q0.31 in [0, 1)
    got = ia.one_over_one_plus_x_for_x_in_0_1(x) / 2.0 ** 31
    np.testing.assert_allclose(got, 1.0 / (1.0 + x / 2.0 ** 31), atol=1e-8)
    raw, bits = ia.get_reciprocal(np.array([3 << 19]), 12)             # 3.0 in Q12.19
    assert int(bits[0]) == 1 and abs(raw[0] / 2.0 ** 31 * 2.0 ** -bits[0] - 1 / 3) < 1e-8


def test_count_leading_zeros():
    np.testing.assert_array_equal(ia.count_leading_zeros32([0, 1, 2, 3, (1 << 31) - 1, -1, ia.INT32_MIN]),
                                  [32, 31, 30, 30, 1, 0, 0])


def test_softmax_int8_close_to_float_softmax():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, size=(64, 10)).astype(np.int8)
    scale = 0.1
    mult, shift, diff_min = ia.softmax_params(1.0, scale)
    got = (ia.softmax_int8(x, mult, shift, diff_min).astype(np.int64) + 128) / 256.0
    z = x.astype(np.float64) * scale
    want = np.exp(z - z.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    assert np.abs(got - want).max() <= 1.5 / 256


# ---- ops the converter fixtures cannot reach ----------------------------------------------------

def _tiny_graph(op_type: str, inputs: list[Tensor], output: Tensor, attrs: dict, consts=()) -> Graph:
    tensors = {t.name: t for t in list(inputs) + [output] + list(consts)}
    op = Op(op_type, [t.name for t in inputs] + [c.name for c in consts], [output.name], attrs)
    return Graph(tensors=tensors, ops=[op], inputs=[t.name for t in inputs], outputs=[output.name])


def test_int8_requantize_quantize_op():
    x = Tensor("x", [1, 4], "int8", quant=QuantParams([0.5], [3]))
    y = Tensor("y", [1, 4], "int8", quant=QuantParams([0.2], [-10]))
    g = _tiny_graph("quantize", [x], y, {})
    xv = np.array([[-128, 3, 4, 127]], dtype=np.int8)
    out = run_graph(g, {"x": xv})["y"]
    # (q - 3) * 2.5 - 10 through MultiplyByQuantizedMultiplier, saturated.
    np.testing.assert_array_equal(out, [[-128, -10, -7, 127]])
    # 5, -5, -2.5, -7.5 before the offset: with a positive shift only SRDHM rounds, and it sends negative ties
    # towards zero.
    xv = np.array([[5, 1, 2, 0]], dtype=np.int8)
    np.testing.assert_array_equal(run_graph(g, {"x": xv})["y"], [[-5, -15, -12, -17]])


def test_float_quantize_rounds_half_away():
    x = Tensor("x", [1, 5], "float32")
    y = Tensor("y", [1, 5], "int8", quant=QuantParams([0.5], [0]))
    g = _tiny_graph("quantize", [x], y, {})
    out = run_graph(g, {"x": np.array([[0.25, -0.25, 0.75, 100.0, -100.0]], np.float32)})["y"]
    np.testing.assert_array_equal(out, [[1, -1, 2, 127, -128]])


def test_concatenation_requantizes_differing_inputs():
    a = Tensor("a", [1, 2], "int8", quant=QuantParams([0.1], [0]))
    b = Tensor("b", [1, 2], "int8", quant=QuantParams([0.2], [10]))
    y = Tensor("y", [1, 4], "int8", quant=QuantParams([0.1], [0]))
    g = _tiny_graph("concatenation", [a, b], y, {"axis": 1, "act": "none"})
    out = run_graph(g, {"a": np.array([[1, -2]], np.int8), "b": np.array([[11, 100]], np.int8)})["y"]
    np.testing.assert_array_equal(out, [[1, -2, 2, 127]])


def test_bad_feeds_are_clear_errors():
    graph, batch = _case(MODEL_FILES[0])
    with pytest.raises(ExecutionError, match="batch first"):
        run_graph(graph, {graph.inputs[0]: batch[0]})
    with pytest.raises(ExecutionError, match="missing"):
        run_graph(graph, {})
