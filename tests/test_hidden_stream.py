"""Hidden-channel streams (stages/planning/channel_stream.py): an inverted-residual block's backward (project 1x1
input gradient -> masks, bias gradients -> depthwise input gradient -> expand weight gradient + update and input
gradient) run one hidden channel at a time. The planner finds the chain on the converter-made MBv2 block fixture,
the memory plan counts its gradients one plane each, and the streamed program gives the unstreamed program's bytes
and the golden model's (int8: exactly; float: the unstreamed C's bytes)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from test_codegen import FIX, _data, _golden, _run, _with_classifier_head
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.arena import MemOptions, check_plan, plan_memory
from tinytrain.stages.planning.schedule import in_place_update_order, is_valid_order
from tinytrain.stages.planning.streams import find_streams, prune_streams
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.train.runtime_config import RuntimeConfig


def _block(fixture: str, ratio: float = 1.0, opt: str = "sgd", masks: bool = True, rounding: str = "nearest"):
    """The block with a classifier head; trained: every bias, the expand conv's weights at `ratio` (the
    depthwise and project weights stay frozen: their gradients would read every hidden channel's plane)."""
    g = _with_classifier_head(read_model(FIX / f"{fixture}.tflite"))
    layers = TrainPlan.trainable_ops(g)
    convs = [i for i in layers if g.ops[i].type == "conv2d"]
    expand = convs[0]
    plan = TrainPlan([LayerPlan(i, bias=True, weight_ratio=ratio if i == expand else 0.0) for i in layers])
    qas = QASOptions(True, rounding, False) if "int8" in fixture else None
    return build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.05), 1, qas,
                                masks=masks)


def _hidden_plan(tg):
    order, streams = find_streams(tg, in_place_update_order(tg))
    assert is_valid_order(tg, order)
    hidden = [s for s in streams if s.kind == "hidden"]
    return order, streams, hidden


def test_chain_found_and_counted_one_plane():
    tg = _block("mbv2_block_int8")
    order, streams, hidden = _hidden_plan(tg)
    assert len(hidden) == 1
    st = hidden[0]
    types = [tg.ops[i].type for i in st.ops]
    assert types[0] == "conv2d_grad_input" and "depthwise_conv2d_grad_input" in types
    # the block reads the model input: no input gradient below it (MobileNetV2's blocks: tests/test_streams.py)
    assert "conv2d_grad_weight" in types and types.count("conv2d_grad_input") == 1
    # every plane is 16x16 of one channel, fp32; the expand weight gradient one row of 8 input channels
    assert sorted(set(st.chunked.values())) == [8 * 4, 16 * 16 * 4]
    # the channels stream of the expand weight went into it, and comes back when the hidden stream is dropped
    assert not any(s.kind == "channels" for s in streams) and [s.kind for s in st.replaces] == ["channels"]
    mp = plan_memory(tg, order, MemOptions(), streams)
    check_plan(mp)
    plain = plan_memory(tg, order, MemOptions(), [s for s in streams if s is not st] + st.replaces)
    # the 16x16x48 fp32 hidden gradient (48 KB, the depthwise's input gradient in place over it) never exists whole
    assert mp.arena < plain.arena - 36 * 1024
    kept, best = prune_streams(lambda sts, below: plan_memory(tg, order, MemOptions(), sts, place_below=below),
                               streams)
    assert st in kept and best.arena == mp.arena


def test_no_chain_when_the_depthwise_weight_trains():
    """A depthwise weight gradient reads every hidden channel's plane at once: no hidden stream."""
    g = _with_classifier_head(read_model(FIX / "mbv2_block_int8.tflite"))
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec("sgd"), 1,
                              QASOptions(True, "nearest", False))
    assert not _hidden_plan(tg)[2]


CASES = {
    "int8-sgd": dict(fixture="mbv2_block_int8"),
    "int8-split-momentum-stochastic-nomask": dict(fixture="mbv2_block_int8", ratio=0.5, opt="momentum",
                                                  rounding="stochastic", masks=False),
    "float-sgd": dict(fixture="mbv2_block_float"),
    # Adam's bias steps are ~3,300 integer units: one bias came out 1 off while the golden model summed its fp32
    # gradients in numpy's order (stages/golden/train_step.py EXACT_PRECISIONS)
    "int8-adam": dict(fixture="mbv2_block_int8", opt="adam"),
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("case", list(CASES))
def test_streamed_program_is_bit_identical(case, tmp_path):
    v = CASES[case]
    tg = _block(**v)
    order, streams, hidden = _hidden_plan(tg)
    assert hidden
    mp = plan_memory(tg, order, MemOptions(), streams)
    unstreamed = plan_memory(tg, order, MemOptions(), [s for s in streams if s.kind != "hidden"]
                             + [r for s in hidden for r in s.replaces])
    x, y = _data(tg, 3, seed=5)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:1], y[:1])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9, seed=3)
    data = {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}

    def firmware(plan, name, **kw):
        summ = codegen.generate(tg, plan.order, plan.to_json(), tmp_path / name / "prog")
        out = _run("host", tmp_path / name / "prog", tmp_path / name / "b", tmp_path / name / "r", cfg, data, **kw)
        assert json.loads(out["results.json"])["arena_bytes_planned"] == plan.arena == summ["arena_bytes"]
        return out

    out = firmware(mp, "streamed", sanitize=("address", "undefined"))
    prog = (tmp_path / "streamed" / "prog" / "tt_model.c").read_text()
    assert "tt_hs_pw_grad_in_f32(" in prog or "tt_hs_pw_grad_in_mask_f32(" in prog  # the start, masked or not
    ref = firmware(unstreamed, "plain")
    assert out["losses.bin"] == ref["losses.bin"] and out["weights.bin"] == ref["weights.bin"]
    if "float" in v["fixture"]:
        return  # fp32 C and numpy round differently: the claim is that streaming changes no bit of the C
    want, state = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "streamed" / "prog" / "io_layout.json").read_text())
    for t in io["trained_tensors"]:
        got = np.frombuffer(out["weights.bin"][t["offset"]:t["offset"] + t["nbytes"]], t["dtype"]).reshape(t["shape"])
        np.testing.assert_array_equal(got, state[t["name"]], err_msg=t["name"])


def test_mbv2_block_chains_end_in_the_expand_input_gradient():
    """MobileNetV2's TTE plan (tests/test_streams.py builds the same graph): blocks 10-15's backward are chains; the
    trained blocks' chains end in the expand's input gradient (summed over the hidden channels) and its weight rows
    with their QAS update; block 10's (biases only, nothing trained below it) ends at the depthwise."""
    from test_streams import _mbv2_tte

    from tinytrain.stages.planning.channel_stream import hidden_candidates

    g, plan = _mbv2_tte()
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec("sgd"), 1,
                              QASOptions(enabled=True, rounding="nearest", master_copy=False))
    chains = {c["members"][0]: c for c in hidden_candidates(tg)}
    full = [c for c in chains.values() if c["ends"] and c["weights"]]
    # blocks 11-13 (192 hidden channels), 14-15 (336; block 15's expand weight split at 1/8)
    assert sorted(c["channels"] for c in full) == [192, 192, 192, 336, 336]
    for c in full:
        assert len(c["planes"]) == 4 and len(c["sums"]) == 2   # two masks, the depthwise; two bias gradients
        (gw, upd), = c["weights"]
        assert tg.ops[upd].inputs[0] == tg.ops[c["ends"][0]].inputs[1].removeprefix("deq/")  # the same expand weight
    assert any(not c["ends"] and not c["weights"] and len(c["planes"]) == 4 for c in chains.values())


def _fake_gen(bufs, arena, order=tuple(range(10, 20))):
    """A stand-in for codegen's generator with just what _free_arena reads: a schedule and a plan's buffers
    (offset, size, first step, last step)."""
    from types import SimpleNamespace
    return SimpleNamespace(order=list(order), arena=arena,
                           plan={"buffers": [dict(offset=o, size=n, start=a, end=b) for o, n, a, b in bufs]})


def test_free_arena_finds_only_room_idle_over_the_stream():
    """_free_arena on a hand-made plan. The stream is ops 15, 14, 16: schedule steps 4..6 (its ops' positions in
    the order, not their numbers)."""
    from types import SimpleNamespace

    from tinytrain.stages.c_emit.hidden_stream import _free_arena
    from tinytrain.stages.planning.arena import ALIGN
    assert ALIGN == 16   # the offsets below are written for it
    st = SimpleNamespace(ops=[15, 14, 16])
    bufs = [(0, 32, 0, 4),      # ends at the stream's first step: live
            (32, 16, 6, 9),     # starts at its last step: live
            (48, 64, 0, 3),     # dies the step before it: idle
            (112, 64, 7, 9),    # born the step after it: idle
            (176, 80, 0, 9),    # live across the whole stream
            (0, 0, 5, 5)]       # empty: holds nothing
    gen = _fake_gen(bufs, 256)
    assert _free_arena(gen, st, 16, []) == 48      # neither touching buffer's room is given out
    assert _free_arena(gen, st, 128, []) == 48     # the idle gap [48, 176) is exactly 128 bytes
    assert _free_arena(gen, st, 129, []) is None   # past the live buffer at 176 only 80 bytes remain: none
    assert _free_arena(_fake_gen(bufs, 256 + 129), st, 129, []) == 256   # a larger arena: room at its very end
    # room already given to an earlier copy (sizes need not be aligned: 48 + 60 rounds up to 112)
    assert _free_arena(gen, st, 64, [(48, 60)]) == 112
    assert _free_arena(gen, st, 65, [(48, 60)]) is None
    assert _free_arena(gen, st, 64, [(48, 64), (112, 64)]) is None
    # an unaligned end: the next offset is rounded up to ALIGN, and the gap measured from there
    gen = _fake_gen([(0, 20, 4, 6), (40, 24, 5, 5)], 128)
    assert _free_arena(gen, st, 8, []) == 32
    assert _free_arena(gen, st, 9, []) == 64


def _copy_case():
    """The CASES entry whose expand layer's int8 input the stream copies to floats in idle arena room."""
    v = CASES["int8-split-momentum-stochastic-nomask"]
    tg = _block(**v)
    order, streams, hidden = _hidden_plan(tg)
    return tg, plan_memory(tg, order, MemOptions(), streams), hidden


def test_float_copy_lies_in_room_idle_over_the_stream(tmp_path):
    """No compiler: the generated C of the copy case dequantizes the expand input once (tt_hs_dequant_rows), to an
    aligned offset of the arena whose [offset, offset + need) meets no planned buffer live over the stream's steps."""
    import re

    from tinytrain.stages.planning.arena import ALIGN
    tg, mp, (st,) = _copy_case()
    doc = mp.to_json()
    codegen.generate(tg, mp.order, doc, tmp_path / "prog")
    prog = (tmp_path / "prog" / "tt_model.c").read_text()
    calls = re.findall(r"tt_hs_dequant_rows\((\d+), (\d+), (\d+), .*\(tt_arena \+ (\d+)\)\)\);", prog)
    assert len(calls) == 1
    p, _, k, at = map(int, calls[0])
    need = p * k * 4
    assert at % ALIGN == 0 and at + need <= doc["arena_bytes"]
    pos = [mp.order.index(i) for i in st.ops]
    a, b = min(pos), max(pos)
    live = [buf for buf in doc["buffers"] if buf["size"] > 0 and buf["start"] <= b and buf["end"] >= a]
    assert live
    for buf in live:
        assert at + need <= buf["offset"] or buf["offset"] + buf["size"] <= at, buf["name"]


def test_fused_input_lives_until_the_stream_ends():
    """The expand weight gradient reads the block's int8 input through a fused dequantize (no fp32 copy): inside
    the hidden stream it reads it on every channel's pass, so the int8 buffer lives to the stream's last step (it
    ended at the gradient's own step, before the stream's end) and counts in every step's live bytes."""
    from tinytrain.stages.planning.arena import fused_dequantize
    tg, mp, (st,) = _copy_case()
    fused = fused_dequantize(tg)
    pos = [mp.order.index(i) for i in st.ops]
    a, b = min(pos), max(pos)
    by_tensor = {t: buf for buf in mp.buffers for t in buf.tensors}
    srcs = {fused[t] for i in st.ops for t in tg.ops[i].inputs if t in fused and fused[t] in by_tensor}
    assert srcs   # the case reads one (the weight gradient is not the stream's last op)
    for src in srcs:
        buf = by_tensor[src]
        assert buf.start <= a and buf.end >= b, (src, buf.start, buf.end, a, b)
        for s in range(a, b + 1):
            assert mp.live_by_role[s][buf.role] >= buf.size
    # every other buffer live while the stream runs meets it in time: none may sit over it
    check_plan(mp)


def test_float16_member_is_refused():
    """The hidden-channel kernels are fp32: a float16 tensor in the stream is a CodegenError, not wrong C."""
    from tinytrain.stages.c_emit.hidden_stream import stream_hidden
    from tinytrain.stages.c_emit.literals import CodegenError
    tg, mp, (st,) = _copy_case()
    gen = codegen._Gen(tg, mp.order, mp.to_json())
    assert stream_hidden(gen, st)   # fp32: C
    plane = tg.ops[st.ops[0]].outputs[0]   # the start's hidden-gradient plane
    tg.tensors[plane].dtype = "float16"
    with pytest.raises(CodegenError, match="float16"):
        stream_hidden(gen, st)
