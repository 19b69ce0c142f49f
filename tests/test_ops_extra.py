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
from tinytrain.stages.executor import run_graph
from tinytrain.stages.ir import Graph
from tinytrain.stages.tflite_reader import read_model
from tinytrain.stages.tflite_writer import write_model

import litert_oracle as oracle

OPS = Path(__file__).resolve().parent / "fixtures" / "ops"
FLOAT_RTOL = 1e-5


def _batch(g: Graph, sample: np.ndarray) -> np.ndarray:
    inp = g.tensors[g.inputs[0]]
    rng = np.random.default_rng(7)
    wide = (rng.normal(size=(2,) + sample.shape[1:]) * 3).astype(np.float32)
    x = np.concatenate([sample.astype(np.float32), wide])
    if inp.dtype != "int8":
        return x
    s, z = inp.quant.scale[0], inp.quant.zero_point[0]
    q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
    edges = np.stack([np.full(sample.shape[1:], -128, np.int8), np.full(sample.shape[1:], 127, np.int8)])
    return np.concatenate([q, edges])


def _compare_all(g: Graph, path: Path, x: np.ndarray, fc_requant: str = "fixed_point") -> int:
    """Every activation of `g` (read from `path`) against LiteRT's tensor of the same file index."""
    ours = run_graph(g, {g.inputs[0]: x}, keep_intermediates=True, fc_requant=fc_requant)
    res = oracle.run_litert(path, [x])
    checked, bad = 0, []
    for name, t in g.tensors.items():
        if t.data is not None:
            continue
        theirs = res.tensors[t.source_index].reshape(ours[name].shape)
        checked += 1
        if t.dtype == "float32":
            atol = 1e-6 * max(1.0, float(np.abs(theirs).max(initial=0.0)))
            if not np.allclose(ours[name], theirs, rtol=FLOAT_RTOL, atol=atol):
                bad.append(f"{name}: float mismatch")
        elif not np.array_equal(ours[name], theirs):
            bad.append(f"{name} ({t.dtype}): {int((ours[name] != theirs).sum())} elements differ")
    assert not bad, bad
    return checked


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
    from tinytrain.stages.executor import run_op
    alpha = g.tensors[op.inputs[1]].data
    (y,) = run_op(g, op, {op.inputs[0]: x, op.inputs[1]: alpha}, n=2)
    np.testing.assert_array_equal(y, np.where(x >= 0, x, x * alpha))


def test_autodiff_names_an_op_it_cannot_differentiate():
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.train_plan import TrainPlan

    g = read_model(OPS / "prelu_slice_float.tflite")
    with pytest.raises(UnsupportedOpError, match=r"unsupported op prelu at operator index 1 in autodiff"):
        build_training_graph(g, TrainPlan.last_k(g, 1), "mse", OptimizerSpec("sgd"), 1)
