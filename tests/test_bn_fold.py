"""BatchNorm that a float graph still carries as separate MUL/ADD (and SUB) ops: folded into the conv / depthwise
conv before it where that is possible, quantized as ordinary int8 ops where it is not.

  - foldable: a hand-built IR (the TF converter always folds BN that follows a conv, so it cannot make one),
    written with our .tflite writer and read back: CONV_2D -> MUL [C] -> ADD [C], and DEPTHWISE_CONV_2D -> MUL [C]
    -> SUB [C] (fused RELU6). quantize folds all of them; the folded float graph equals the unfolded one within
    1e-5; the int8 export runs bit-exactly in LiteRT and TFLite Micro.
  - not foldable: the converter's bn_input model (BatchNorm right on the input: MUL + ADD with per-channel
    constants before any layer); the MUL/ADD stay and become int8 ops with int8 constant operands.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages import quantize
from tinytrain.stages.model import bn_fold
from tinytrain.stages.quant import ptq
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model

import litert_oracle as oracle

OPS = Path(__file__).resolve().parent / "fixtures" / "ops"


def _unfolded_bn_graph() -> Graph:
    rng = np.random.default_rng(21)
    t: dict[str, Tensor] = {}

    def act(name, shape, role="activation"):
        t[name] = Tensor(name, shape, "float32", role=role)
        return name

    def const(name, arr, role="constant"):
        t[name] = Tensor(name, list(arr.shape), "float32", role=role, data=arr.astype(np.float32))
        return name

    x = act("x", [1, 6, 6, 3], "input")
    ops = [
        Op("conv2d", [x, const("w1", rng.normal(0, 0.5, (4, 3, 3, 3)), "weight"), const("b1", rng.normal(0, 0.1, 4), "bias")],
           [act("c1", [1, 6, 6, 4])], dict(stride_h=1, stride_w=1, dilation_h=1, dilation_w=1, padding="same", act="none")),
        # BN as the float graph carries it: y * (gamma / sqrt(var + eps)) + (beta - mean * that)
        Op("mul", ["c1", const("bn1_scale", rng.uniform(0.3, 2.5, 4))], [act("m1", [1, 6, 6, 4])], {"act": "none"}),
        Op("add", ["m1", const("bn1_offset", rng.normal(0, 0.7, 4))], [act("a1", [1, 6, 6, 4])], {"act": "relu"}),
        Op("depthwise_conv2d", ["a1", const("w2", rng.normal(0, 0.5, (1, 3, 3, 4)), "weight")], [act("c2", [1, 3, 3, 4])],
           dict(stride_h=2, stride_w=2, dilation_h=1, dilation_w=1, padding="same", depth_multiplier=1, act="none")),
        Op("mul", [const("bn2_scale", rng.uniform(-1.5, 1.5, (1, 1, 4))), "c2"], [act("m2", [1, 3, 3, 4])], {"act": "none"}),
        Op("sub", ["m2", const("bn2_offset", rng.normal(0, 0.5, 4))], [act("y", [1, 3, 3, 4], "output")], {"act": "relu6"}),
    ]
    g = Graph(t, ops, [x], ["y"])
    g.validate()
    return g


@pytest.fixture(scope="module")
def unfolded(tmp_path_factory) -> tuple[Graph, Path]:
    path = tmp_path_factory.mktemp("bn") / "conv_bn_unfolded.tflite"
    write_model(_unfolded_bn_graph(), path)
    g = read_model(path)
    assert [op.type for op in g.ops] == ["conv2d", "mul", "add", "depthwise_conv2d", "mul", "sub"]
    return g, path


def _samples(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(n, 6, 6, 3)) * 1.5).astype(np.float32)


def test_foldable_mul_add_sub_are_folded_and_compute_the_same(unfolded):
    g, path = unfolded
    folded, notes = ptq.prepare(g)
    assert [op.type for op in folded.ops] == ["conv2d", "depthwise_conv2d"]
    assert sum(n.startswith("folded") for n in notes) == 4, notes
    assert [op.attrs["act"] for op in folded.ops] == ["relu", "relu6"]   # the fused act of the last BN op
    x = _samples(8, 1)
    ref = run_graph(g, {g.inputs[0]: x})["y"]
    got = run_graph(folded, {folded.inputs[0]: x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    # The unfolded file itself is what LiteRT computes (MUL/ADD/SUB with broadcast constants, float).
    theirs = oracle.run_litert(path, [x]).outputs[0].reshape(ref.shape)
    np.testing.assert_allclose(ref, theirs, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))


def test_folded_int8_export_is_bit_exact_in_litert_and_tflm(unfolded, tmp_path):
    g, _ = unfolded
    q, report = quantize.quantize_model(g, _samples(64, 2), QuantizeSpec(), _samples(16, 3))
    assert [op.type for op in q.ops] == ["conv2d", "depthwise_conv2d"]
    assert report["model"]["output_sqnr_db"] > 30
    path = tmp_path / "folded_int8.tflite"
    write_model(q, path)
    back = read_model(path)
    x = np.random.default_rng(4).integers(-128, 128, size=(8, 6, 6, 3)).astype(np.int8)
    backends = [("litert_double", oracle.run_litert)] + ([("fixed_point", oracle.run_tflm)]
                                                         if oracle.tflm_available() else [])
    for mode, run in backends:
        ours = run_graph(back, {back.inputs[0]: x}, keep_intermediates=True, fc_requant=mode)
        res = run(path, [x])
        for name, t in back.tensors.items():
            if t.data is None:
                np.testing.assert_array_equal(ours[name], res.tensors[t.source_index].reshape(ours[name].shape),
                                              err_msg=f"{mode}: {name}")


def test_bn_on_the_input_is_not_foldable_and_is_quantized_as_int8_ops(tmp_path):
    g = read_model(OPS / "bn_input_float.tflite")
    prepared, notes = ptq.prepare(g)
    assert [op.type for op in prepared.ops] == ["mul", "add", "conv2d"]
    assert not any(n.startswith("folded") for n in notes)
    sample = np.load(OPS / "bn_input.input.npy")
    calib = np.random.default_rng(5).normal(size=(64,) + sample.shape[1:]).astype(np.float32)
    q, report = quantize.quantize_model(g, calib, QuantizeSpec(), sample)
    assert [op.type for op in q.ops] == ["mul", "add", "conv2d"]
    for op in q.ops[:2]:
        const = q.tensors[op.inputs[1]]
        assert const.dtype == "int8" and const.data is not None and const.shape == [3]
    assert report["model"]["output_sqnr_db"] > 30
    path = tmp_path / "bn_input_ours.tflite"
    write_model(q, path)
    back = read_model(path)
    x = np.random.default_rng(6).integers(-128, 128, size=(8, 6, 6, 3)).astype(np.int8)
    ours = run_graph(back, {back.inputs[0]: x}, keep_intermediates=True, fc_requant="litert_double")
    res = oracle.run_litert(path, [x])
    for name, t in back.tensors.items():
        if t.data is None:
            np.testing.assert_array_equal(ours[name], res.tensors[t.source_index].reshape(ours[name].shape), name)


def test_sub_from_a_constant_and_non_channel_vectors_are_not_folded():
    g = _unfolded_bn_graph()
    # c - conv (not what BN exports) and a vector along another axis stay as ops.
    g.ops[5].inputs = ["bn2_offset", "m2"]
    g.tensors["bn1_scale"].data = np.ones((6, 1, 1), np.float32)
    g.tensors["bn1_scale"].shape = [6, 1, 1]
    folded, notes = bn_fold.fold(g)
    kinds = [op.type for op in folded.ops]
    assert "sub" in kinds and kinds.count("mul") == 1 and kinds[:2] == ["conv2d", "mul"], (kinds, notes)
