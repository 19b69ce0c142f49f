"""The fp16-mixed rewrite (stages/train/fp16_mixed.py) on the float fixtures: MLP, conv net, depthwise-separable and
residual (fan-out gradients), with each optimizer: the graph validates, keeps its structure (every original op once,
weights fp32, saved activations fp16), and trains like the fp32 graph within fp16's precision."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.train.fp16_mixed import to_fp16_mixed
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.ops import fp16 as f16

sys.path.insert(0, str(Path(__file__).parent))
from test_codegen import _data, _plan  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
CASES = [("mlp_float", "full", "sgd"), ("convnet_float", "full", "adam"), ("dwsep_float", "last_k", "momentum"),
         ("residual_float", "partial", "rmsprop")]
_OURS = {f16.CAST_F32_F16, f16.CAST_F16_F32, f16.ROUND_F16, f16.LOSS_SCALE_MUL, f16.AMP_CHECK, f16.AMP_UNSCALE,
         f16.AMP_UNSCALE_RESET, f16.LOSS_SCALE_UPDATE}


@pytest.mark.parametrize("fixture, scheme, opt", CASES, ids=["-".join(c) for c in CASES])
def test_rewrite_keeps_the_graph_and_trains_like_fp32(fixture, scheme, opt):
    g = read_model(FIX / f"{fixture}.tflite")
    build = lambda: build_training_graph(g, _plan(g, scheme), "cross_entropy", OptimizerSpec(kind=opt), 1)  # noqa: E731
    fp32, tg = build(), to_fp16_mixed(build(), {"kind": "static", "init_scale": 1024.0, "max_scale": 1024.0})
    meta = tg.meta["train"]
    chk = [op for op in tg.ops if op.type not in _OURS and any(t.startswith("chk/") for t in op.outputs)]
    assert [op.type for op in tg.ops if op.type not in _OURS and op not in chk] == [op.type for op in fp32.ops]
    # check_first: the overflow check's pass runs the fp32 graph's backward once more, nothing else
    ph = fp32.meta["train"]["phases"]
    head, split = int(ph["forward"]) + int(ph["loss"]), int(fp32.meta["train"]["sample_ops"])
    assert [op.type for op in chk] == ([op.type for op in fp32.ops[head:split]] if meta["loss_scale"]["check_first"]
                                       else [])
    assert meta["precision"] == "fp16-mixed" and meta["loss_scale"]["fp16_tensors"] >= 1
    assert all(tg.tensors[p].dtype == "float32" for p in meta["trained"])           # fp32 master weights
    assert all(tg.tensors[t].dtype == "float16" for op in tg.ops if op.type == f16.CAST_F32_F16
               for t in op.outputs)
    skip = [op for op in tg.ops[meta["sample_ops"]:] if op.attrs.get("skip_if")]
    assert len(skip) == len(meta["trained"]) + (opt == "adam")                       # updates (+ Adam's step)

    x, y = _data(tg, 4)
    s32, s16 = te.init_state(fp32), te.init_state(tg)
    rt = {"learning_rate": 0.01}
    l32 = [te.train_step(fp32, s32, x[i:i + 1], y[i:i + 1], rt) for i in range(4)]
    l16 = [te.train_step(tg, s16, x[i:i + 1], y[i:i + 1], rt) for i in range(4)]
    assert int(s16["amp/skipped_steps"]) == 0
    np.testing.assert_allclose(l16, l32, rtol=0.02, atol=1e-3)   # fp16 keeps ~3 significant digits per value
    for p in meta["trained"]:
        assert not np.array_equal(s16[p], np.asarray(tg.tensors[p].data)), p


def test_generated_c_guards_only_statements(tmp_path):
    """The ops an overflowing step skips are wrapped in `if (flag == 0)`; an op whose C is only a comment (a cast fused
    into its readers, an alias) gets no guard, so the C has no `if (...) {}` guarding nothing."""
    from tinytrain.stages import codegen
    from tinytrain.stages.reorder import plan_schedules

    g = read_model(FIX / "digits_cnn_float.tflite")
    tg = to_fp16_mixed(build_training_graph(g, _plan(g, "full"), "cross_entropy", OptimizerSpec(kind="sgd"), 1),
                       None, check_first=True)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path)
    lines = [ln.strip() for ln in (tmp_path / "tt_model.c").read_text().splitlines()]
    flag = tg.meta["train"]["loss_scale"]["flag_tensor"]
    guards = [i for i, ln in enumerate(lines) if ln.startswith("if (") and ln.endswith("[0] == 0) {")]
    skipped = [op for op in tg.ops if op.attrs.get("skip_if") == flag]
    assert guards and len(guards) < len(skipped)     # the fused casts' comments are not guarded
    for i in guards:
        body = lines[i + 1:lines.index("}", i)]
        assert any(ln and not ln.startswith("/*") for ln in body), lines[i:i + 3]
