"""bench/int8_vs_fp32.py's host engine (issue 17): the int8 side trained by the real build's native firmware must be
the golden engine's training, bit for bit, for any sample order and runtime seed; and its command line refuses what
it cannot do in one line (exit 2).

The slow test builds the digits example for the host board (about 10 s cold: sparse-plan's probe and the C build),
then trains 40 samples in a permuted order for 2 epochs with stochastic rounding (the PRNG seeded by the order's
seed) on the firmware and on the golden model, and compares the trained int8/int32 tensors and the test accuracy;
on the file order it also compares with the pipeline's own emulate-run (run.json, weights.bin). The bench's
`--check` does the same on any cell (README: digits and MobileNetV2 cells checked that way)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import int8_vs_fp32 as bench  # noqa: E402


@pytest.mark.parametrize("argv, says", [
    (["--no-rescale"], "--no-rescale needs --engine golden"),
    (["--engine", "golden", "--check"], "--check compares the host engine"),
    (["/nonexistent/spec.yaml", "--seeds", "1"], "spec file not found"),
])
def test_refusals(argv, says, capsys):
    assert bench.cli(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_mode_keys_name_every_int8_mode():
    # every int8 mode the golden engine forces has the spec keys that ask a build for the same rule
    from tinytrain.pipeline.api import load_spec

    for mode, rule in bench.MODES.items():
        if mode == "default" or mode in bench.FP32_MODES:
            continue
        q = load_spec(REPO / "tinytrain.yaml.example", **bench.MODE_KEYS[mode]).train.qas
        assert (q.rounding, q.master_copy) == (rule.rounding, rule.master_copy)


@pytest.mark.slow
def test_host_engine_is_the_golden_engine(tmp_path):
    from tinytrain.stages.train.data import load_dataset

    spec, kind = REPO / "tinytrain.yaml.example", "momentum"
    prep = bench.prepare(spec, kind, tmp_path, "auto", {})
    hb = bench.prepare_host(spec, kind, tmp_path, "auto", "stochastic", {}, prep["budget_bytes"])
    assert hb["qas"] == bench.MODES["stochastic"]
    # the host build, planned with the spec board's budget, trains the layers and scales the spec's board would
    assert bench.TrainPlan.from_json(json.loads(hb["train_plan"])).layers == prep["plan"].layers
    ds = load_dataset(prep["spec"].data)
    n = 40
    x, y = ds.x_train[:n], ds.y_train[:n]
    for seed in (0, 3):
        order = bench.orders(n, [seed])[seed]
        params, info, acc = bench.train_host(hb, 0.01, order, 2, seed, n)
        assert bench.check_host(hb, kind, 0.01, params, info, acc, x, y, ds.x_test, ds.y_test, order, 2, seed) is None
        # the check has teeth: another seed's stochastic rounding is another training
        assert not all(np.array_equal(params[k], v) for k, v in
                       bench.train_int8(hb["qgraph"], hb["plan"], kind, 0.01, hb["qas"], x, y, order, 2,
                                        seed + 1)[0].items())
