"""Weights-only format (`.wof`): the trained tensors of a model, indexed like the model file's tensors.

The format is onert-micro's (Samsung ONE, seed 000 "Proposal for a file structure containing only
trainable weights"). The seed's table gives the field offsets 0, 2, 4, 8 and 4 + N*4; read with
onert-micro's reader (`OMWeightOnlyFormatReader`: MAGIC_NUMBER = 0, SCHEMA_VERSION = 2,
NUM_BUFFERS = 4, FIRST_OFFSET = 8; magic 429, schema version 1 read as one byte) that means:

    offset       size   field
    0            2      magic number, u16 = 429 (0x01AD)
    2            1      schema version, u8 = 1
    3            1      reserved, u8 = 0        (the seed's RESERVED column sits between 2 and 4: one byte)
    4            4      n_buffers N, u32 = the number of tensors in the ORIGINAL model file (subgraph 0)
    8            4*N    offset[k], u32, k = 0..N-1: where tensor k's data starts, from the start of the file
                        (offset N-1 therefore sits at 4 + N*4, as in the seed's table)
    8 + 4*N      ...    the data of each trained tensor, in tensor-index order, each starting on a
                        16-byte boundary (zero padding between), little-endian, C order, the tensor's
                        own dtype (int8 weights, int32 biases, float32 for float models)

All integers are little-endian (the byte order of every MCU we target and of onert-micro's memcpy).

A tensor with no trained data gets offset 0 (ABSENT). The seed's text says "-1 if there is no data",
but onert-micro's reader (`buffer()`) treats 0 as "no data" and would turn 0xFFFFFFFF into a pointer
past the end, and 0 can never be a real data offset (the header is there), so 0 is what we write.
`read_wof` accepts both 0 and 0xFFFFFFFF (the seed's -1) as "no data", and `write_wof(absent=...)`
can write the seed's -1 for a reader that wants it.

The file does not store sizes: a tensor's length is what its shape and dtype in the model say
(`read_wof` takes them as `sizes`); without them, a tensor's data is assumed to run up to the next
offset (or the end of the file), padding included.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Mapping

MAGIC = 429
SCHEMA_VERSION = 1
HEADER = struct.Struct("<HBBI")    # magic u16, schema version u8, reserved u8, n_buffers u32
HEADER_SIZE = HEADER.size          # 8
ABSENT = 0                         # what we write for "no data" (onert-micro's reader)
ABSENT_SEED = 0xFFFFFFFF           # the seed's "-1" as a u32; accepted on read
ALIGN = 16


class WofError(ValueError):
    """A .wof file that does not follow the format."""


def wof_bytes(n_buffers: int, data: Mapping[int, bytes], *, absent: int = ABSENT) -> bytes:
    """The .wof image: `data` maps an original tensor index (0..n_buffers-1) to its bytes."""
    if absent not in (ABSENT, ABSENT_SEED):
        raise ValueError("absent must be 0 or 0xFFFFFFFF")
    bad = [k for k in data if not 0 <= int(k) < n_buffers]
    if bad:
        raise WofError(f"tensor index {bad[0]} is outside the model's {n_buffers} tensors")
    offsets = [absent] * n_buffers
    body = bytearray()
    pos = HEADER_SIZE + 4 * n_buffers
    for k in sorted(data):
        blob = bytes(data[k])
        pad = (-pos) % ALIGN
        body += b"\0" * pad
        pos += pad
        offsets[k] = pos
        body += blob
        pos += len(blob)
    return HEADER.pack(MAGIC, SCHEMA_VERSION, 0, n_buffers) + struct.pack(f"<{n_buffers}I", *offsets) + bytes(body)


def write_wof(path: Path, n_buffers: int, data: Mapping[int, bytes], *, absent: int = ABSENT) -> None:
    Path(path).write_bytes(wof_bytes(n_buffers, data, absent=absent))


def read_wof(source: Path | bytes, sizes: Mapping[int, int] | None = None) -> tuple[int, dict[int, bytes]]:
    """(n_buffers, {tensor index: bytes}) of a .wof file or image. `sizes` (tensor index -> byte
    length, from the model) cuts each tensor's data exactly; without it, data runs to the next offset."""
    raw = Path(source).read_bytes() if isinstance(source, (str, Path)) else bytes(source)
    if len(raw) < HEADER_SIZE:
        raise WofError(f".wof too short ({len(raw)} bytes)")
    magic, version, _reserved, n = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise WofError(f"not a .wof file (magic {magic}, expected {MAGIC})")
    if version != SCHEMA_VERSION:
        raise WofError(f".wof schema version {version}, expected {SCHEMA_VERSION}")
    table_end = HEADER_SIZE + 4 * n
    if len(raw) < table_end:
        raise WofError(f".wof truncated: {n} offsets need {table_end} bytes, the file has {len(raw)}")
    offsets = struct.unpack_from(f"<{n}I", raw, HEADER_SIZE)
    present = sorted((off, k) for k, off in enumerate(offsets) if off not in (ABSENT, ABSENT_SEED))
    out: dict[int, bytes] = {}
    for i, (off, k) in enumerate(present):
        if off < table_end or off > len(raw):
            raise WofError(f".wof offset of tensor {k} ({off}) is outside the data area")
        if sizes is not None and k in sizes:
            end = off + int(sizes[k])
        else:
            end = present[i + 1][0] if i + 1 < len(present) else len(raw)
        if end > len(raw):
            raise WofError(f".wof data of tensor {k} runs past the end of the file")
        out[k] = raw[off:end]
    return n, out


def describe(path: Path) -> str:
    """Readable view for `tinytrain inspect`: header and one line per tensor with data."""
    n, data = read_wof(path)
    raw = Path(path).read_bytes()
    offsets = struct.unpack_from(f"<{n}I", raw, HEADER_SIZE)
    lines = [f".wof: magic {MAGIC}, schema version {SCHEMA_VERSION}, n_buffers {n} "
             f"(tensors of the original model), {len(data)} with data, {len(raw)} bytes", ""]
    for k, blob in sorted(data.items()):
        lines.append(f"  tensor {k:>4}: offset {offsets[k]:>8}, {len(blob)} bytes (to the next offset)")
    return "\n".join(lines) + "\n"
