"""Sparse constants as the TFLite schema stores them (`SparsityParameters`), decoded to dense arrays.

A converter run with sparsity optimisation stores a mostly-zero weight compressed and puts a DENSIFY op in front
of its reader; `load` decodes it here once and the op disappears (tflite_reader.py), so every later stage sees a
plain constant.

The format (TFLite schema, `SparsityParameters`): a tensor of rank n whose dims `block_map` (k of them) are cut
into blocks is seen as n + k dims: dim d < n is the block index along original dim d (the full index when d is
not blocked), dim n + b is the offset inside the block along original dim block_map[b]. `traversal_order` lists
these n + k dims in storage order, and `dim_metadata[level]` describes the level-th dim of that order:
  - DENSE: every index 0..dense_size-1 is present; child position = parent position * dense_size + index;
  - SPARSE_CSR: the children of parent position p are positions array_segments[p] .. array_segments[p+1] - 1,
    and the index of child position q along this dim is array_indices[q].
The root is position 0; the value of a leaf is values[its position at the last level].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DENSE, SPARSE_CSR = 0, 1


@dataclass(frozen=True)
class DimMetadata:
    format: int                          # DENSE or SPARSE_CSR
    dense_size: int = 0                  # DENSE: the dim's size
    segments: np.ndarray | None = None   # SPARSE_CSR
    indices: np.ndarray | None = None    # SPARSE_CSR


class SparsityError(ValueError):
    """The sparsity parameters contradict each other or the tensor's shape (a corrupt file)."""


def densify(shape: Sequence[int], traversal_order: Sequence[int], block_map: Sequence[int],
            dims: Sequence[DimMetadata], values: np.ndarray) -> np.ndarray:
    """The dense array of `shape` (dtype of `values`) that the sparse encoding describes; zeros elsewhere."""
    n, k = len(shape), len(block_map)
    if sorted(traversal_order) != list(range(n + k)) or len(dims) != n + k:
        raise SparsityError(f"traversal order {list(traversal_order)} and {len(dims)} dim metadata entries do not "
                            f"describe a rank-{n} tensor with {k} blocked dim(s)")
    if any(not 0 <= d < n for d in block_map):
        raise SparsityError(f"block map {list(block_map)} names a dim outside rank {n}")
    total = int(np.prod(shape, dtype=np.int64))
    pos = np.zeros(1, np.int64)
    coords = np.zeros((1, 0), np.int64)       # one column per level: the index along traversal_order[level]
    for level, m in enumerate(dims):
        if m.format == DENSE:
            size = int(m.dense_size)
            if size <= 0 or pos.size * size > total:  # no level has more positions than the tensor elements
                raise SparsityError(f"dim metadata {level}: dense size {size} does not fit the shape {list(shape)}")
            pos = (pos[:, None] * size + np.arange(size)).ravel()
            coords = np.concatenate([np.repeat(coords, size, axis=0), np.tile(np.arange(size), len(coords))[:, None]],
                                    axis=1)
        elif m.format == SPARSE_CSR:
            seg, idx = np.asarray(m.segments, np.int64), np.asarray(m.indices, np.int64)
            if pos.size and (pos.max() + 1 >= seg.size or seg[-1] > idx.size or np.any(np.diff(seg) < 0)):
                raise SparsityError(f"dim metadata {level}: array segments do not fit the positions or indices")
            counts = seg[pos + 1] - seg[pos]
            starts = np.repeat(seg[pos], counts)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            pos = starts + offsets
            coords = np.concatenate([np.repeat(coords, counts, axis=0), idx[pos][:, None]], axis=1)
        else:
            raise SparsityError(f"dim metadata {level}: unknown format {m.format}")
    if pos.size and pos.max() >= values.size:
        raise SparsityError(f"the encoding addresses value {int(pos.max())}, the buffer holds {values.size}")
    # Expanded dim e's index, then the original dims: block index * block size + offset in the block.
    level_of = {e: lv for lv, e in enumerate(traversal_order)}
    full = [coords[:, level_of[d]] for d in range(n)]
    for b, d in enumerate(block_map):
        lv = level_of[n + b]
        if dims[lv].format != DENSE:  # its size would be unknown; TFLite's converter keeps blocks dense
            raise SparsityError(f"the block dim of original dim {d} is sparse; blocks must be dense")
        block = int(dims[lv].dense_size)
        full[d] = full[d] * block + coords[:, lv]
    for d in range(n):
        if full[d].size and (full[d].min() < 0 or full[d].max() >= shape[d]):
            raise SparsityError(f"an index along dim {d} lies outside the shape {list(shape)}")
    out = np.zeros(tuple(shape), dtype=values.dtype)
    out[tuple(full)] = values[pos]
    return out


__all__ = ["DENSE", "SPARSE_CSR", "DimMetadata", "SparsityError", "densify"]
