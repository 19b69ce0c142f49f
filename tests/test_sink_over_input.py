"""A row stream's sink written over the input it has consumed (streams.sink_over_inputs, arena._sink_host).

While a row stream runs, its outside input (e.g. the camera image) is read top to bottom and its sink's output is
written top to bottom; once the rows under a sink row are read for the last time, that row may go where they were.
The planner simulates the C pull schedule to prove it, and the memory plan then places the sink's buffer at the
input's offset (it follows it). The C that runs such a plan is checked bit for bit against the golden model by
tests/test_streams.py (test_mbv2_streamed_c_matches_golden_model: MobileNetV2's stem writes blocks 0-1's output over
the image, in training and in the evaluation forward).
"""

from __future__ import annotations

import pytest

from tinytrain.stages.model import zoo
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.arena import MemOptions, check_plan, plan_memory
from tinytrain.stages.planning.streams import Stream, find_streams, sink_over_inputs


def _conv(in_h, out_h, stride, span, in_row, out_row, pad_top=0):
    return {"in_h": in_h, "out_h": out_h, "stride": stride, "pad_top": pad_top, "span": span,
            "in_rows": [in_row], "in_row": in_row, "out_row": out_row}


def test_sink_over_the_image_its_first_conv_has_read():
    # a 3x3 stride-2 conv on an 8-row image (24 B rows), then a 1x1 sink of 16 B rows: sink row r covers image
    # bytes the conv read for the last time when it made row r / 3 at the latest
    geos = [_conv(8, 4, 2, 3, 24, 32), _conv(4, 4, 1, 1, 32, 16)]
    assert sink_over_inputs(geos, [[-1], [0]], 1) == [0]


def test_sink_rows_wider_than_what_was_read_are_refused():
    # 64 B sink rows: sink row 1 covers image rows 2..5, and the conv reads rows 4..6 for its next row afterwards
    geos = [_conv(8, 4, 2, 3, 24, 32), _conv(4, 4, 1, 1, 32, 64)]
    assert sink_over_inputs(geos, [[-1], [0]], 1) == []


def test_a_sink_that_reads_the_input_in_the_same_call_is_refused():
    # a residual ADD as the sink: it reads image row r in the very call that writes sink row r over it
    geos = [_conv(4, 4, 1, 1, 16, 16), {**_conv(4, 4, 1, 1, 16, 16), "in_rows": [16, 16]}]
    assert sink_over_inputs(geos, [[-1], [0, -1]], 1) == []


@pytest.fixture(scope="module")
def mbv2_forward():
    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    order, streams = find_streams(g, list(range(len(g.ops))))
    return g, order, streams


def test_mbv2_stem_output_goes_where_the_image_was(mbv2_forward):
    g, order, streams = mbv2_forward
    rows = [s for s in streams if s.kind == "rows"]
    x = g.inputs[0]
    # The stem's stream is fed the image row by row now (streams.fed_inputs): the image is never whole, so
    # nothing goes over it. Planned as a whole image instead (the stream without its feed: what a program whose
    # caller writes the whole input runs), the stem's output goes where the image was.
    assert rows and rows[0].info.get("fed") == [x] and rows[0].info["sink_over"] == []
    stem = rows[0]
    unfed = Stream(stem.kind, stem.ops, {t: n for t, n in stem.chunked.items() if t != x},
                   {**{k: v for k, v in stem.info.items() if k != "fed"}, "sink_over": [x],
                    "windows": {t: w for t, w in stem.info["windows"].items() if t != x}})
    # (and, as find_streams does, no stream's output over the stem's, which is then itself over the image)
    stem_out = g.ops[stem.ops[-1]].outputs[0]
    streams = [unfed if s is stem else
               Stream(s.kind, s.ops, s.chunked,
                      {**s.info, "sink_over": [t for t in s.info["sink_over"] if t != stem_out]})
               if s.kind == "rows" else s for s in streams]
    rows = [s for s in streams if s.kind == "rows"]
    plan = plan_memory(g, order, MemOptions(), streams)
    check_plan(plan)
    sink = g.ops[rows[0].ops[-1]].outputs[0]
    host = next(b for b in plan.buffers if x in b.tensors)
    follower = next(b for b in plan.buffers if sink in b.tensors)
    assert follower.follows is host and follower.offset == host.offset and follower.start == host.end + 1
    # the same streams without the overwrite: the image and the 32x32x8 output side by side while the stem runs
    plain = [Stream(s.kind, s.ops, s.chunked, {**s.info, "sink_over": []}) for s in streams]
    before = plan_memory(g, order, MemOptions(), plain)
    check_plan(before)
    n_stem = len(rows[0].ops)
    stem_live = max(sum(d.values()) for d in plan.live_by_role[:n_stem])
    assert max(sum(d.values()) for d in before.live_by_role[:n_stem]) - stem_live == 32 * 32 * 8
    assert plan.arena < before.arena
