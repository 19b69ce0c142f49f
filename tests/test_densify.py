"""Sparse weights (TFLite SparsityParameters + DENSIFY) are decoded at load into plain constants.

Reference: LiteRT's own DENSIFY kernel, run on tests/fixtures/sparse/sparse_fc.tflite (made by
tests/make_sparse_fixtures.py: a blocked row-major CSR weight with uint8 index vectors, and a column-major one
with int32 vectors)."""

from __future__ import annotations

import numpy as np
import pytest
from tflite.BuiltinOperator import BuiltinOperator as BO

import litert_oracle as oracle
from test_load import write_model
from tinytrain.pipeline.errors import ModelError
from tinytrain.stages.model.densify import DENSE, SPARSE_CSR, DimMetadata, SparsityError, densify
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.tflite_reader import read_model

from make_sparse_fixtures import OUT as SPARSE_FC

# File tensor indices of the two DENSIFY outputs in the fixture (see make_sparse_fixtures.build).
W1_INDEX, W2_INDEX = 2, 6


@pytest.fixture(scope="module")
def litert():
    x = np.random.default_rng(0).normal(0, 1, size=(4, 8)).astype(np.float32)
    return x, oracle.run_litert(SPARSE_FC, [x])


def test_densify_disappears_and_weights_match_litert(litert):
    _, res = litert
    g = read_model(SPARSE_FC)
    assert [op.type for op in g.ops] == ["fully_connected", "fully_connected"]
    assert "w1_sparse" not in g.tensors and "w2_sparse" not in g.tensors
    w1, w2 = g.tensors["w1"], g.tensors["w2"]
    assert (w1.role, w2.role) == ("weight", "weight") and w1.data.dtype == np.float32
    np.testing.assert_array_equal(w1.data, res.tensors[W1_INDEX].reshape(-1, 4, 8)[0])
    np.testing.assert_array_equal(w2.data, res.tensors[W2_INDEX].reshape(-1, 3, 4)[0])
    assert (w1.source_index, w2.source_index) == (None, None)  # no tensor of the file holds the dense bytes
    assert 0 < np.count_nonzero(w1.data) < w1.data.size and 0 < np.count_nonzero(w2.data) < w2.data.size


def test_forward_matches_litert(litert):
    x, res = litert
    g = read_model(SPARSE_FC)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], res.outputs[0].reshape(len(x), 3), rtol=1e-5, atol=1e-6)


def test_decoder_by_hand():
    # [[0, 1, 0], [2, 0, 3]]: rows dense, columns CSR.
    dims = [DimMetadata(DENSE, 2), DimMetadata(SPARSE_CSR, segments=np.array([0, 1, 3]), indices=np.array([1, 0, 2]))]
    out = densify([2, 3], [0, 1], [], dims, np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(out, [[0, 1, 0], [2, 0, 3]])


@pytest.mark.parametrize("segments, indices, values, needle", [
    ([0, 1, 9], [1, 0, 2], 3, "segments"),        # a segment end beyond the indices
    ([0, 1, 3], [1, 0, 7], 3, "outside the shape"),  # a column index beyond 3 columns
    ([0, 1, 3], [1, 0, 2], 2, "buffer holds 2"),   # fewer values than the encoding addresses
])
def test_corrupt_encoding_is_refused(segments, indices, values, needle):
    dims = [DimMetadata(DENSE, 2), DimMetadata(SPARSE_CSR, segments=np.array(segments), indices=np.array(indices))]
    with pytest.raises(SparsityError, match=needle):
        densify([2, 3], [0, 1], [], dims, np.ones(values, np.float32))


def test_densify_of_an_activation_is_a_clear_error(tmp_path):
    # x[1,3] -> DENSIFY -> y: only constant weights can be densified at load.
    path = write_model(tmp_path, tensors=[{"name": "x", "shape": [1, 3]}, {"name": "y", "shape": [1, 3]}],
                       ops=[{"code": 0, "inputs": [0], "outputs": [1]}], outputs=[1],
                       opcodes=[(BO.DENSIFY, BO.DENSIFY, None)])
    with pytest.raises(ModelError, match=r"DENSIFY\) reads 'x', which is not a sparse constant"):
        read_model(path)
