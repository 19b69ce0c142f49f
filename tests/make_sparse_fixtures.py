"""Write tests/fixtures/sparse/sparse_fc.tflite: two FULLY_CONNECTED layers whose weights are stored sparse
(TFLite `SparsityParameters`) and reach the layers through DENSIFY, as a converter with sparsity optimisation
writes them (MediaPipe's *_sparse models do the same with float16 weights).

    python tests/make_sparse_fixtures.py

  x[1,8] -> FC(w1 = DENSIFY(w1_sparse), b1) -> h[1,4] -> FC(w2 = DENSIFY(w2_sparse), no bias) -> y[1,3]

w1 [4, 8]: dim 1 cut into blocks of 2 (block_map [1]): levels (rows DENSE 4, column blocks SPARSE_CSR with uint8
  segments/indices, offset in block DENSE 2), traversal order [0, 1, 2].
w2 [3, 4]: column-major (traversal order [1, 0]): columns DENSE 4, rows SPARSE_CSR with int32 vectors.
The encoder below is written from the schema's description; tests/test_densify.py checks what `load` decodes
against LiteRT's own DENSIFY (a reference we did not write).
"""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator as BO
from tflite.BuiltinOptions import BuiltinOptions as BOpt
from tflite.TensorType import TensorType as TT

from test_load import _buffer, _fc_options, _ints, _opcode, _operator, _subgraph, _vec

# Not in fixtures/load/: load drops the sparse tensors and DENSIFY, so the file's tensor indices cannot survive
# the writer's round trip that tests/test_tflite_writer.py checks on every fixture there.
OUT = Path(__file__).resolve().parent / "fixtures" / "sparse" / "sparse_fc.tflite"
DENSE, CSR = 0, 1
INT32_VEC, UINT8_VEC = 1, 3


def weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded weights with whole zero blocks (w1) and zero entries (w2), and a bias."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 0.5, size=(4, 8)).astype(np.float32)
    for r, blk in ((0, 1), (0, 3), (1, 0), (2, 1), (2, 2), (2, 3), (3, 2)):
        w1[r, 2 * blk:2 * blk + 2] = 0.0
    w2 = rng.normal(0, 0.5, size=(3, 4)).astype(np.float32)
    w2[[0, 2, 1, 2], [0, 0, 1, 3]] = 0.0
    return w1, w2, np.array([0.1, -0.2, 0.3, 0.0], np.float32)


def encode_blocked_rows(w: np.ndarray, block: int) -> tuple[np.ndarray, list, list]:
    """w1's encoding: values, CSR segments and indices of the non-zero column blocks of each row."""
    values, segments, indices = [], [0], []
    for row in w:
        blocks = row.reshape(-1, block)
        for j, blk in enumerate(blocks):
            if np.any(blk != 0):
                indices.append(j)
                values.extend(blk)
        segments.append(len(indices))
    return np.array(values, np.float32), segments, indices


def encode_column_major(w: np.ndarray) -> tuple[np.ndarray, list, list]:
    """w2's encoding: for each column (dense), the non-zero rows (CSR)."""
    values, segments, indices = [], [0], []
    for c in range(w.shape[1]):
        for r in range(w.shape[0]):
            if w[r, c] != 0:
                indices.append(r)
                values.append(w[r, c])
        segments.append(len(indices))
    return np.array(values, np.float32), segments, indices


def _index_vector(b, kind: int, values: list) -> int:
    if kind == UINT8_VEC:
        data = b.CreateNumpyVector(np.array(values, np.uint8))
        tflite.Uint8VectorStart(b)
        tflite.Uint8VectorAddValues(b, data)
        return tflite.Uint8VectorEnd(b)
    data = b.CreateNumpyVector(np.array(values, np.int32))
    tflite.Int32VectorStart(b)
    tflite.Int32VectorAddValues(b, data)
    return tflite.Int32VectorEnd(b)


def _dim(b, fmt: int, dense_size: int = 0, kind: int = 0, segments: list | None = None,
         indices: list | None = None) -> int:
    seg = _index_vector(b, kind, segments) if fmt == CSR else None
    idx = _index_vector(b, kind, indices) if fmt == CSR else None
    tflite.DimensionMetadataStart(b)
    tflite.DimensionMetadataAddFormat(b, fmt)
    tflite.DimensionMetadataAddDenseSize(b, dense_size)
    if fmt == CSR:
        tflite.DimensionMetadataAddArraySegmentsType(b, kind)
        tflite.DimensionMetadataAddArraySegments(b, seg)
        tflite.DimensionMetadataAddArrayIndicesType(b, kind)
        tflite.DimensionMetadataAddArrayIndices(b, idx)
    return tflite.DimensionMetadataEnd(b)


def _sparsity(b, traversal: list, block_map: list, dims: list) -> int:
    trav = _ints(b, traversal, tflite.SparsityParametersStartTraversalOrderVector)
    bmap = _ints(b, block_map, tflite.SparsityParametersStartBlockMapVector) if block_map else None
    dvec = _vec(b, tflite.SparsityParametersStartDimMetadataVector, dims)
    tflite.SparsityParametersStart(b)
    tflite.SparsityParametersAddTraversalOrder(b, trav)
    if bmap is not None:
        tflite.SparsityParametersAddBlockMap(b, bmap)
    tflite.SparsityParametersAddDimMetadata(b, dvec)
    return tflite.SparsityParametersEnd(b)


def _tensor(b, name: str, shape: list, buffer_index: int, sparsity: int | None = None) -> int:
    n = b.CreateString(name)
    s = _ints(b, shape, tflite.TensorStartShapeVector)
    tflite.TensorStart(b)
    tflite.TensorAddName(b, n)
    tflite.TensorAddShape(b, s)
    tflite.TensorAddType(b, TT.FLOAT32)
    tflite.TensorAddBuffer(b, buffer_index)
    if sparsity is not None:
        tflite.TensorAddSparsity(b, sparsity)
    return tflite.TensorEnd(b)


def build() -> bytes:
    w1, w2, b1 = weights()
    v1, seg1, idx1 = encode_blocked_rows(w1, 2)
    v2, seg2, idx2 = encode_column_major(w2)
    b = flatbuffers.Builder(4096)
    buffers = [_buffer(b, None, None), _buffer(b, v1.tobytes(), None), _buffer(b, v2.tobytes(), None),
               _buffer(b, b1.tobytes(), None)]
    sp1 = _sparsity(b, [0, 1, 2], [1], [_dim(b, DENSE, 4), _dim(b, CSR, 0, UINT8_VEC, seg1, idx1), _dim(b, DENSE, 2)])
    sp2 = _sparsity(b, [1, 0], [], [_dim(b, DENSE, 4), _dim(b, CSR, 0, INT32_VEC, seg2, idx2)])
    # 0 x, 1 w1_sparse, 2 w1, 3 b1, 4 h, 5 w2_sparse, 6 w2, 7 y
    tensors = [_tensor(b, "x", [1, 8], 0), _tensor(b, "w1_sparse", [4, 8], 1, sp1), _tensor(b, "w1", [4, 8], 0),
               _tensor(b, "b1", [4], 3), _tensor(b, "h", [1, 4], 0), _tensor(b, "w2_sparse", [3, 4], 2, sp2),
               _tensor(b, "w2", [3, 4], 0), _tensor(b, "y", [1, 3], 0)]
    fc = {"opt": (BOpt.FullyConnectedOptions, _fc_options)}   # relu
    ops = [_operator(b, {"code": 0, "inputs": [1], "outputs": [2]}),
           _operator(b, {"code": 1, "inputs": [0, 2, 3], "outputs": [4], **fc}),
           _operator(b, {"code": 0, "inputs": [5], "outputs": [6]}),
           _operator(b, {"code": 1, "inputs": [4, 6, -1], "outputs": [7], **fc})]
    sg = _subgraph(b, tensors, ops, [0], [7], "main")
    codes = [_opcode(b, BO.DENSIFY, BO.DENSIFY, None), _opcode(b, BO.FULLY_CONNECTED, BO.FULLY_CONNECTED, None)]
    desc = b.CreateString("tests/make_sparse_fixtures.py")
    code_vec = _vec(b, tflite.ModelStartOperatorCodesVector, codes)
    sg_vec = _vec(b, tflite.ModelStartSubgraphsVector, [sg])
    buf_vec = _vec(b, tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, code_vec)
    tflite.ModelAddSubgraphs(b, sg_vec)
    tflite.ModelAddBuffers(b, buf_vec)
    tflite.ModelAddDescription(b, desc)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(build())
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
