"""Float weights trained on a channel slice are split (issue 13: MobileNetV2's TTE scheme in fp16-mixed on the M55):
only the trained slice lives in SRAM, at its arena offset, and the float conv2d forward and input gradient read the
frozen channels from the flash original (tt_conv2d_f32_split, tt_conv2d_grad_input_f32_split). The same bits as the
golden model, fp32 and fp16-mixed; weights.bin holds the merged whole tensor."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.fp16_mixed import to_fp16_mixed
from tinytrain.stages.train.runtime_config import RuntimeConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_fp16_codegen import _golden, _host_run  # noqa: E402
from test_codegen import _data  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
# pointwise conv on 4 of 8 input channels (forward and input gradient read the split weight), conv 3x3 on 1 of 8
CASES = {"residual_float": ([(0, 0.5), (1, 0.125), (5, 1.0)], "momentum"),
         "convnet_float": ([(0, 1.0), (2, 0.25), (5, 1.0)], "sgd")}


def _graph(fixture: str, fp16: bool):
    g = read_model(FIX / f"{fixture}.tflite")
    layers, opt = CASES[fixture]
    plan = TrainPlan([LayerPlan(i, bias=True, weight_ratio=r) for i, r in layers])
    tg = build_training_graph(g, plan, "cross_entropy", OptimizerSpec(kind=opt), 1, QASOptions(False))
    return to_fp16_mixed(tg, {"kind": "dynamic", "init_scale": 2.0 ** 20, "growth_interval": 2}) if fp16 else tg


def test_float_partial_weights_are_split_in_the_generated_c(tmp_path):
    for fixture in CASES:
        tg = _graph(fixture, False)
        _, mp, _, _ = plan_schedules(tg, True)
        summ = codegen.generate(tg, mp.order, mp.to_json(), tmp_path / fixture)
        src = (tmp_path / fixture / "tt_model.c").read_text()
        partial = sorted(p for p, i in tg.meta["train"]["trained"].items()
                         if i["n"] is not None and i["n"] < tg.tensors[p].shape[-1])
        assert partial and summ["split_weights"] == partial
        assert summ["sram_outside_arena_bytes"] == 0 and "static float tt_s" not in src
        assert "tt_conv2d_f32_split(" in src


@pytest.mark.slow
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16-mixed"])
@pytest.mark.parametrize("fixture", sorted(CASES))
def test_split_float_weights_train_bit_exact(fixture, fp16, tmp_path):
    tg = _graph(fixture, fp16)
    x, y = _data(tg, 8)
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9)
    res, losses, weights, mp = _host_run(tg, x, y, tmp_path, cfg)
    if fp16:
        state, scales, skipped, means = _golden(tg, x, y, cfg, 1)
        assert losses.tobytes() == np.array(means, np.float32).tobytes()
        assert res["skipped_steps"] == skipped[-1]
    else:
        from tinytrain.stages.golden import train_step as te
        from test_fp16_codegen import RT_KEYS
        back = RuntimeConfig.from_bytes(cfg.to_bytes())
        rt = {k: float(getattr(back, k)) for k in RT_KEYS}
        state = te.init_state(tg, rt)
        means = [te.train_step(tg, state, x[i:i + 1], y[i:i + 1], rt) for i in range(len(x))]
        np.testing.assert_allclose(losses, means, rtol=1e-5, atol=1e-6)
    changed = 0
    for name, got in weights.items():   # merged: trained slice + flash channels
        if fp16:   # the golden model sums in the C's order for fp16-mixed graphs only
            assert got.tobytes() == np.asarray(state[name], got.dtype).tobytes(), name
        else:
            np.testing.assert_allclose(got, state[name], rtol=1e-5, atol=1e-6, err_msg=name)
        changed += int(np.count_nonzero(got != np.asarray(tg.tensors[name].data)))
    assert changed > 0 and res["arena_bytes_planned"] == mp.arena
