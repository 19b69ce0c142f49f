"""Multi-output training (issue 10 item 2): heads named with loss and weight, binary cross-entropy with logits and
Huber losses, gradients of several heads meeting in a shared trunk, untrained outputs pruned, the multi-loss step
in C on the host board vs the numpy golden model, and the bad-input messages.

Outside references: PyTorch (BCEWithLogitsLoss, HuberLoss, autograd through the two-head MLP) and central finite
differences in float64. The model is tests/feature_models.two_head_mlp (written by the project's TFLite writer)."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch

from feature_models import features_mlp, two_head_mlp
from tinytrain.stages import codegen
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.train.data import write_stream
from tinytrain.stages.train.losses import Head, LossError, bce_logits_loss, huber_loss
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.train.runtime_config import RuntimeConfig
from tinytrain.stages.planning.train_plan import TrainPlan

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
HEADS = [Head("scores", "bce"), Head("boxes", "huber", 0.1)]


# ---- the losses against PyTorch and finite differences -----------------------------------------------------------

def _case(seed: int, shape=(3, 5)):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal(shape) * 4).astype(np.float32)
    z[0, 0], z[1, 1] = 40.0, -40.0  # far in the tails: the stable forms must not overflow
    return z, rng.uniform(0, 1, shape).astype(np.float32), (rng.standard_normal(shape) * 2).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1])
def test_bce_with_logits_matches_torch(seed):
    z, t, _ = _case(seed)
    loss, dz = bce_logits_loss(z, t)
    zt = torch.tensor(z, requires_grad=True)
    # Per sample mean over its elements, summed over samples = torch's per-row mean, summed.
    ref = torch.nn.functional.binary_cross_entropy_with_logits(zt, torch.tensor(t), reduction="none").mean(1).sum()
    ref.backward()
    assert float(loss) == pytest.approx(ref.item(), rel=1e-5)
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert np.isfinite(loss) and np.all(np.isfinite(dz))


@pytest.mark.parametrize("seed", [0, 1])
def test_huber_matches_torch(seed):
    _, _, y = _case(seed)
    t = np.random.default_rng(seed + 5).standard_normal(y.shape).astype(np.float32)
    loss, dy = huber_loss(y, t)
    yt = torch.tensor(y, requires_grad=True)
    ref = torch.nn.functional.huber_loss(yt, torch.tensor(t), reduction="none", delta=1.0).mean(1).sum()
    ref.backward()
    assert float(loss) == pytest.approx(ref.item(), rel=1e-5)
    np.testing.assert_allclose(dy, yt.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fn", [bce_logits_loss, huber_loss])
def test_loss_gradients_match_finite_differences(fn):
    rng = np.random.default_rng(3)
    y = (rng.standard_normal((2, 4)) * 2).astype(np.float32)
    t = rng.uniform(0, 1, (2, 4)).astype(np.float32)
    _, g = fn(y, t)
    h = 1e-3
    for idx in np.ndindex(y.shape):
        up, dn = y.astype(np.float64), y.astype(np.float64)
        up[idx] += h
        dn[idx] -= h
        num = (float(fn(up.astype(np.float32), t)[0]) - float(fn(dn.astype(np.float32), t)[0])) / (2 * h)
        assert g[idx] == pytest.approx(num, abs=2e-3), idx


# ---- autodiff: several heads -------------------------------------------------------------------------------------

def _torch_grads(g, x, ts, tb):
    """dL/dparam of L = bce(scores, ts) + 0.1 huber(boxes, tb) through the float model, by torch autograd."""
    p = {n: torch.tensor(g.tensors[n].data.astype(np.float64), requires_grad=True)
         for n in ("trunk/w", "trunk/b", "scores/w", "scores/b", "boxes/w", "boxes/b")}
    h = torch.relu(torch.tensor(x, dtype=torch.float64) @ p["trunk/w"].T + p["trunk/b"])
    s = h @ p["scores/w"].T + p["scores/b"]
    b = h @ p["boxes/w"].T + p["boxes/b"]
    loss = (torch.nn.functional.binary_cross_entropy_with_logits(s, torch.tensor(ts, dtype=torch.float64))
            + 0.1 * torch.nn.functional.huber_loss(b, torch.tensor(tb, dtype=torch.float64)))
    loss.backward()
    return loss.item(), {n: v.grad.numpy() for n, v in p.items()}


def _targets(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    ts = (rng.uniform(0, 1, (n, 3)) > 0.5).astype(np.float32)
    tb = (rng.standard_normal((n, 4)) * 2).astype(np.float32)
    return x, ts, tb, np.concatenate([ts, tb], axis=1)


def test_two_heads_accumulate_in_the_trunk_like_torch():
    g = two_head_mlp()
    tg = build_training_graph(g, TrainPlan.full(g), HEADS, OptimizerSpec("sgd"), 1)
    meta = tg.meta["train"]
    assert meta["loss"] == "multi" and [h["output"] for h in meta["heads"]] == ["scores", "boxes"]
    assert tg.tensors["train/target"].shape == [1, 7]
    types = [op.type for op in tg.ops]
    assert types.count("bce_logits_loss") == 1 and types.count("huber_loss") == 1 and "loss_sum" in types
    # The untrained output `aux` is pruned: no op, no tensors, nothing trained.
    assert not any("aux" in t for op in tg.ops for t in op.inputs + op.outputs if t)
    assert not any(n.startswith("aux") for n in tg.tensors) and "aux/w" not in meta["trained"]
    x, ts, tb, row = _targets(1)
    state = te.init_state(tg)
    values = te.run_sample(tg, state, x, row)
    want_loss, want = _torch_grads(g, x, ts, tb)
    assert float(values["train/loss"]) == pytest.approx(want_loss, rel=1e-5)
    for p, d in meta["trained"].items():
        np.testing.assert_allclose(values[d["gradient"]], want[p], rtol=1e-4, atol=1e-6, err_msg=p)


def test_single_output_is_the_one_element_case():
    g = features_mlp(8, 6, 3)
    a = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec("sgd"), 1)
    b = build_training_graph(g, TrainPlan.full(g), [Head("probs", "cross_entropy")], OptimizerSpec("sgd"), 1)
    assert [(o.type, o.inputs, o.outputs, o.attrs) for o in a.ops] == [(o.type, o.inputs, o.outputs, o.attrs)
                                                                      for o in b.ops]
    assert a.meta["train"] == b.meta["train"] and a.meta["train"]["label_input"] == "train/labels"


@pytest.mark.parametrize("heads, message", [
    ([Head("score", "bce")], r"names 'score', which is not an output of the model \(outputs: scores, boxes, aux\)"),
    ([Head("scores", "bce"), Head("scores", "mse")], "names 'scores' twice"),
    ([Head("scores", "hinge")], "unknown loss 'hinge'"),
    ([Head("scores", "bce", -1.0)], "weight must be a positive number"),
    ([], "train.outputs is empty"),
])
def test_bad_heads_are_one_line_user_errors(heads, message):
    g = two_head_mlp()
    with pytest.raises(LossError, match=message) as e:
        build_training_graph(g, TrainPlan.full(g), heads, OptimizerSpec("sgd"), 1)
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    if heads and heads[0].name == "score":
        assert e.value.hint == "did you mean 'scores'?"


def test_loss_that_does_not_fit_the_output():
    g = features_mlp(8, 6, 3)
    with pytest.raises(LossError, match=r"loss bce does not fit output 'probs' .*softmax's probabilities"):
        build_training_graph(g, TrainPlan.full(g), [Head("probs", "bce")], OptimizerSpec("sgd"), 1)
    one = features_mlp(8, 6, 1)
    with pytest.raises(LossError, match=r"loss cross_entropy does not fit output 'probs' \(float32 \[1, 1\]\)"):
        build_training_graph(one, TrainPlan.full(one), "cross_entropy", OptimizerSpec("sgd"), 1)
    with pytest.raises(LossError, match="the model has 3 outputs .*name the one"):
        build_training_graph(two_head_mlp(), TrainPlan.full(two_head_mlp()), "mse", OptimizerSpec("sgd"), 1)


# ---- the multi-loss step in C on the host board ------------------------------------------------------------------

def _golden_loss(tg, state, x, rows):
    """Mean training loss over samples with the golden model's forward + loss ops (no update)."""
    total = np.float32(0)
    for i in range(len(x)):
        total = np.float32(total + te.run_sample(tg, state, x[i:i + 1], rows[i:i + 1])["train/loss"])
    return float(np.float32(total / np.float32(len(x))))


@pytest.mark.slow  # ~9 s (sanitizer build); the int8 variant below runs by default
@needs_cc
def test_multi_loss_step_on_host_matches_the_golden_model(tmp_path):
    from test_codegen import _golden, _run

    g = two_head_mlp()
    tg = build_training_graph(g, TrainPlan.full(g), HEADS, OptimizerSpec("momentum", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    assert "tt_bce_logits_f32(" in src and "tt_huber_f32(" in src and "tt_loss_weight_f32(" in src
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    assert io["loss"] == "multi" and io["num_targets"] == 7 and [h["output"] for h in io["heads"]] == ["scores",
                                                                                                       "boxes"]
    x, _, _, rows = _targets(24, seed=1)
    write_stream(tmp_path / "train.ttds", x, None, targets=rows)
    write_stream(tmp_path / "test.ttds", x[:8], None, targets=rows[:8])
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1, momentum=0.9)
    out = _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg,
               {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"},
               sanitize=("address", "undefined"))
    want, state = _golden(tg, x, rows, cfg)
    losses = np.frombuffer(out["losses.bin"], "<f4")
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)
    for e in io["trained_tensors"]:
        got = np.frombuffer(out["weights.bin"][e["offset"]:e["offset"] + e["nbytes"]], e["dtype"]).reshape(e["shape"])
        np.testing.assert_allclose(got, state[e["name"]], rtol=1e-5, atol=1e-6, err_msg=e["name"])
    res = json.loads(out["results.json"])
    assert res["task"] == "loss" and res["loss_before_total"] == res["loss_after_total"] == 8
    bits = lambda k: struct.unpack("<f", struct.pack("<I", res[k]))[0]  # noqa: E731
    before = _golden_loss(tg, te.init_state(tg), x[:8], rows[:8])
    after = _golden_loss(tg, state, x[:8], rows[:8])
    assert bits("loss_before_bits") == pytest.approx(before, rel=1e-5)
    assert bits("loss_after_bits") == pytest.approx(after, rel=1e-5)
    assert after < before and res["loss_nan"] is False


# ---- the whole build: spec train.outputs, per-output .npz arrays, emulate-run ----------------------------------

def _build_spec(tmp_path, outputs, arrays: dict, model=None):
    from feature_models import write

    model = model or write(two_head_mlp(), tmp_path / "two_head.tflite")
    np.savez(tmp_path / "d.npz", **arrays)
    spec = {"name": "heads", "model": {"path": str(model)}, "data": {"source": "npz", "path": str(tmp_path / "d.npz")},
            "quantize": {"num_samples": 32},
            "train": {"update": {"scheme": "full"}, "outputs": outputs, "epochs": 3, "learning_rate": 0.05},
            "target": {"board": "host"},
            "build": {"out_dir": str(tmp_path / "build"), "cache_dir": str(tmp_path / "cache")}}
    p = tmp_path / "spec.yaml"
    p.write_text(json.dumps(spec))
    return p


def _arrays(n=80, boxes_shape=(4,)):
    x, ts, tb, _ = _targets(n, seed=2)
    # Learnable targets: fixed functions of the input.
    ts = (x[:, :3] > 0).astype(np.float32)
    tb = np.tanh(x[:, 3:3 + int(np.prod(boxes_shape))]).reshape(n, *boxes_shape).astype(np.float32)
    return {"x": x, "y_scores": ts, "y_boxes": tb}


OUTS = [{"name": "scores", "loss": "bce"}, {"name": "boxes", "loss": "huber", "weight": 0.5}]


@pytest.mark.slow  # ~10 s: a whole build on the host board
@needs_cc
def test_two_heads_train_end_to_end_on_the_host_board(tmp_path, capsys):
    from tinytrain.pipeline.cli import main

    code = main(["build", str(_build_spec(tmp_path, OUTS, _arrays()))])
    _, err = capsys.readouterr()
    assert code == 0, err
    run = json.loads((tmp_path / "build" / "heads" / "emulate-run" / "run.json").read_text())
    assert run["data"]["task"] == "outputs" and run["data"]["outputs"] == ["scores", "boxes"]
    assert run["data"]["targets"] == 7
    tl = run["test_loss"]
    assert tl["after"] < tl["before"] and run["gate"]["metric"] == "loss"


def _cli_error(tmp_path, capsys, spec) -> str:
    from tinytrain.pipeline.cli import main

    code = main(["build", str(spec), "--until", "emulate-run"])
    _, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_cli_unknown_output_name_suggests(tmp_path, capsys):
    spec = _build_spec(tmp_path, [{"name": "score", "loss": "bce"}], _arrays())
    line = _cli_error(tmp_path, capsys, spec)
    assert "'score', which is not an output of the model (outputs: scores, boxes, aux)" in line


@pytest.mark.slow  # ~6 s: builds up to emulate-run; test_run_files_for_named_outputs checks the same fast
@needs_cc
def test_cli_target_shape_mismatch(tmp_path, capsys):
    spec = _build_spec(tmp_path, OUTS, _arrays(boxes_shape=(3,)))
    line = _cli_error(tmp_path, capsys, spec)
    assert "data shape does not match output 'boxes': expected targets of [4] per sample" in line and "got [3]" in line


def test_cli_loss_that_does_not_fit(tmp_path, capsys):
    from feature_models import write

    model = write(features_mlp(16, 6, 3), tmp_path / "mlp.tflite")
    x = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    spec = _build_spec(tmp_path, [{"name": "probs", "loss": "bce"}],
                       {"x": x, "y_probs": np.zeros((40, 3), np.float32)}, model=model)
    line = _cli_error(tmp_path, capsys, spec)
    assert "loss bce does not fit output 'probs'" in line


def _int8_two_heads():
    from tinytrain.pipeline.spec_quantize import QuantizeSpec
    from tinytrain.stages.quantize import quantize_model

    calib = np.random.default_rng(4).standard_normal((32, 16)).astype(np.float32)
    q, _ = quantize_model(two_head_mlp(), calib, QuantizeSpec())
    return q


def _int8_build(tmp_path):
    q = _int8_two_heads()
    heads = [Head("scores", "bce"), Head("boxes", "huber", 0.25)]
    tg = build_training_graph(q, TrainPlan.full(q), heads, OptimizerSpec("sgd", learning_rate=0.02), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x, _, _, rows = _targets(16, seed=5)
    xq = np.clip(np.round(x * 40), -128, 127).astype(np.int8)
    write_stream(tmp_path / "train.ttds", xq, None, targets=rows)
    write_stream(tmp_path / "test.ttds", xq[:6], None, targets=rows[:6])
    data = {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}
    return tg, xq, rows, data


@needs_cc
def test_int8_two_heads_on_host_match_the_golden_model_bit_for_bit(tmp_path):
    from test_codegen import _check_trained, _golden, _run

    tg, xq, rows, data = _int8_build(tmp_path)
    cfg = RuntimeConfig(learning_rate=0.02, epochs=1)
    out = _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg, data)
    want, state = _golden(tg, xq, rows, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    trained = _check_trained(out, io, state, exact=True)  # int8: identical after 16 steps
    assert any(np.any(v != tg.tensors[n].data) for n, v in trained.items())  # the heads did train


@pytest.mark.slow  # ~8 s: two firmware builds and a QEMU run
@needs_cc
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_int8_two_heads_qemu_matches_host_bit_for_bit(tmp_path):
    from test_codegen import _run

    _, _, _, data = _int8_build(tmp_path)
    cfg = RuntimeConfig(learning_rate=0.02, epochs=1)
    host = _run("host", tmp_path / "prog", tmp_path / "bh", tmp_path / "rh", cfg, data)
    qemu = _run("stm32f746-disco", tmp_path / "prog", tmp_path / "bq", tmp_path / "rq", cfg, data)
    assert qemu["losses.bin"] == host["losses.bin"] and qemu["weights.bin"] == host["weights.bin"]
    rh, rq = json.loads(host["results.json"]), json.loads(qemu["results.json"])
    assert rq["loss_before_bits"] == rh["loss_before_bits"] and rq["loss_after_bits"] == rh["loss_after_bits"]


def test_run_files_for_named_outputs(tmp_path):
    """emulate-run's streams: TTDS version 2 whose targets are the heads' arrays back to back; mismatches are one
    line each (missing array, wrong shape, class index out of range)."""
    from tinytrain.pipeline.spec_data import DataSpec
    from tinytrain.stages import emulate_run
    from tinytrain.stages.train.data import DataError, read_stream

    a = _arrays(20)
    cls = np.arange(20) % 3
    np.savez(tmp_path / "d.npz", x=a["x"], y_boxes=a["y_boxes"], y_kind=cls)
    spec = DataSpec(source="npz", path=tmp_path / "d.npz", task="outputs", test_fraction=0.25)
    heads = [{"output": "boxes", "loss": "huber", "weight": 1.0, "shape": [1, 4]},
             {"output": "kind", "loss": "cross_entropy", "weight": 1.0, "shape": [1, 3]}]
    layout = {"input": {"shape": [1, 16], "dtype": "float32"}, "loss": "multi", "num_targets": 5, "heads": heads}
    files, info = emulate_run.run_files(spec, layout, RuntimeConfig(learning_rate=0.1))
    assert info["task"] == "outputs" and info["targets"] == 5 and info["test_samples"] == 5
    (tmp_path / "train.ttds").write_bytes(files["train.ttds"])
    x, _, t = read_stream(tmp_path / "train.ttds", targets=True)
    # Row i of the stream is some sample j: its boxes then its class index.
    j = [int(np.flatnonzero((a["x"] == xi).all(axis=1))[0]) for xi in x]
    np.testing.assert_array_equal(t[:, :4], a["y_boxes"][j])
    np.testing.assert_array_equal(t[:, 4], cls[j])
    with pytest.raises(DataError, match=r"no targets for output 'scores': expected an array y_scores .* "
                                        r"targets for \['boxes', 'kind'\]"):
        emulate_run.run_files(spec, {**layout, "heads": [{**heads[0], "output": "scores"}]}, RuntimeConfig())
    with pytest.raises(DataError, match=r"expected targets of \[6\] per sample \(the output is \[1, 6\]\), "
                                        r"got \[4\]"):
        emulate_run.run_files(spec, {**layout, "heads": [{**heads[0], "shape": [1, 6]}]}, RuntimeConfig())
    with pytest.raises(DataError, match=r"class indices \[N\] in 0..1"):
        emulate_run.run_files(spec, {**layout, "heads": [{**heads[1], "shape": [1, 2]}]}, RuntimeConfig())
    with pytest.raises(DataError, match=r"expected samples of \[8\] \(features\)"):
        emulate_run.run_files(spec, {**layout, "input": {"shape": [1, 8], "dtype": "float32"}}, RuntimeConfig())


def test_cli_several_outputs_without_names(tmp_path, capsys):
    """A model with several outputs and no train.outputs names them (the old "one output only" stop is gone), for
    scheme auto as for a fixed scheme (one line, exit 2)."""
    spec = _build_spec(tmp_path, OUTS, _arrays())
    doc = json.loads(spec.read_text())
    x = _arrays()["x"]
    np.savez(tmp_path / "c.npz", x=x, y=np.arange(len(x)) % 3)
    doc["train"].pop("outputs")
    doc["data"]["path"] = str(tmp_path / "c.npz")
    for scheme in ("auto", "full"):
        doc["train"]["update"] = {"scheme": scheme}
        spec.write_text(json.dumps(doc))
        line = _cli_error(tmp_path, capsys, spec)
        assert "the model has 3 outputs (scores, boxes, aux): name the one(s) to train in train.outputs" in line


@pytest.mark.slow  # ~10 s: a whole build on the host board
@needs_cc
def test_one_named_cross_entropy_output_trains_with_its_y_array(tmp_path, capsys):
    """train.outputs naming a single-output model's output with cross_entropy: the classification program (the
    one-element case), fed from the y_<output> array of the named-output data."""
    from feature_models import write
    from tinytrain.pipeline.cli import main

    model = write(features_mlp(16, 8, 3), tmp_path / "mlp.tflite")
    x = np.random.default_rng(0).standard_normal((90, 16)).astype(np.float32)
    y = np.argmax(x[:, :3], axis=1)
    spec = _build_spec(tmp_path, [{"name": "probs", "loss": "cross_entropy"}], {"x": x, "y_probs": y}, model=model)
    code = main(["build", str(spec)])
    _, err = capsys.readouterr()
    assert code == 0, err
    run = json.loads((tmp_path / "build" / "heads" / "emulate-run" / "run.json").read_text())
    assert run["accuracy"]["after_pct"] > run["accuracy"]["before_pct"]


# ---- the spec ----------------------------------------------------------------------------------------------------

def _load(tmp_path, train: dict, data: dict | None = None):
    from feature_models import write
    from tinytrain.pipeline.spec import load_spec

    model = write(two_head_mlp(), tmp_path / "m.tflite")
    doc = {"model": {"path": str(model)}, "train": train,
           "data": data or {"source": "npz", "path": str(tmp_path / "d.npz")}}
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    return load_spec(tmp_path / "s.yaml")


def test_spec_train_outputs(tmp_path):
    from tinytrain.pipeline.errors import SpecError

    s = _load(tmp_path, {"update": {"scheme": "full"}, "outputs": OUTS})
    assert [(o.name, o.loss, o.weight) for o in s.train.outputs] == [("scores", "bce", 1.0), ("boxes", "huber", 0.5)]
    assert s.data.task == "outputs"  # the default with named outputs
    for train, data, message in [
        ({"outputs": OUTS, "loss": "mse"}, None, "train.loss and train.outputs are both given"),
        ({"outputs": [OUTS[0], OUTS[0]]}, None, r"names \['scores'\] more than once"),
        ({"outputs": []}, None, "train.outputs is empty"),
        ({"outputs": [{"name": "scores", "loss": "hinge"}]}, None, "hinge"),
        ({"outputs": [{"name": "scores", "loss": "bce", "weight": 0}]}, None, "greater than 0"),
        ({"outputs": OUTS}, {"source": "npz", "path": "d.npz", "task": "regression"}, "set data.task: outputs"),
        ({}, {"source": "npz", "path": "d.npz", "task": "outputs"}, "train.outputs does not name them"),
    ]:
        with pytest.raises(SpecError, match=message) as e:
            _load(tmp_path, train, data)
        assert e.value.exit_code == 2


# ---- scheme auto on named outputs ------------------------------------------------------------------------------

def test_auto_scores_two_heads_by_their_total_weighted_loss(tmp_path):
    """scheme auto on the int8 two-head model with train.outputs: every option is scored by the share of the
    no-update total weighted loss (bce on scores + 0.5 huber on boxes) it removes; the plan's text speaks of that
    loss, not of accuracy or MSE. The held-out loss itself is checked against PyTorch."""
    from test_sparse_plan import make_ctx

    from tinytrain.pipeline.spec_data import DataSpec
    from tinytrain.stages.planning import contribution as C
    from tinytrain.stages import sparse_plan as SP

    q = _int8_two_heads()
    a = _arrays(160)
    np.savez(tmp_path / "d.npz", **a)
    data = DataSpec(source="npz", path=tmp_path / "d.npz", task="outputs")
    ctx = make_ctx(tmp_path, q, {"scheme": "auto", "analysis": {"samples": 48, "eval_samples": 48,
                                                                "learning_rate": 0.05}},
                   data=data, **{"train.outputs": OUTS})
    res = SP.run(ctx)
    table = json.loads((ctx.out_dir / "contributions.json").read_text())
    plan = json.loads((ctx.out_dir / "plan.json").read_text())
    ref = table["reference"]["loss"]
    assert table["task"] == "outputs" and "total weighted loss" in table["metric"] and ref > 0
    p = plan["predicted"]
    assert p["metric"] == "loss" and p["reference_loss"] == ref and "delta_accuracy" not in p
    assert p["measured_gain"] > 0                          # fine-tuning the chosen plan lowers the held-out loss
    # The untrained output's layer (aux, read from the input only) is pruned from training: never an option.
    from tinytrain.stages.planning.train_plan import TrainPlan
    aux = next(i for i in TrainPlan.trainable_ops(q) if q.ops[i].outputs[0] == "aux")
    assert len(TrainPlan.trainable_ops(q)) == 4 and len(table["layers"]) == 3
    assert aux not in {lay["op"] for lay in table["layers"]} | {d["layer"] for d in plan["layers"]}
    after = ref * (1 - p["measured_gain"])
    assert f"loss {ref:.4g} → {after:.4g} (measured)" in res.summary and "ΔAcc" not in res.summary
    text = (ctx.out_dir / "plan.txt").read_text()
    assert "total weighted loss of the trained outputs" in text and "reference (no update): loss" in text
    assert "accuracy" not in text and "MSE" not in text
    # The reference's held-out loss is the spec's weighted sum of the heads' losses (PyTorch's BCEWithLogitsLoss
    # and HuberLoss, per sample the mean over the elements), on the same held-out samples.
    settings = C.AnalysisSettings(samples=48, eval_samples=48, learning_rate=0.05)
    from tinytrain.stages.train.data import load_dataset

    ds = load_dataset(data)
    task = C.task_of(q, ds, OUTS)
    _, _, xe, ye = C.holdout_split(ds, settings, task.y)
    fg = C.dequantize_graph(q)
    from tinytrain.stages.golden import fast_float

    out = fast_float.run_graph(fg, {fg.inputs[0]: xe})
    z, b = (torch.tensor(np.asarray(out[n], np.float64)) for n in fg.outputs[:2])
    ts, tb = torch.tensor(ye[:, :3], dtype=torch.float64), torch.tensor(ye[:, 3:], dtype=torch.float64)
    want = (torch.nn.functional.binary_cross_entropy_with_logits(z, ts, reduction="none").mean(1)
            + 0.5 * torch.nn.functional.huber_loss(b, tb, reduction="none", delta=1.0).mean(1)).mean().item()
    assert ref == pytest.approx(want, rel=1e-5)


def test_sparse_plan_on_an_int8_model_with_several_outputs_and_an_mse_head(tmp_path):
    """A first head with an mse loss on an int8 model with several outputs: sparse-plan's update probe must not
    build a training graph for the bare loss name (it once said "name the one(s) to train in train.outputs" to a
    spec that did; MediaPipe's face detector hit it)."""
    from test_sparse_plan import make_ctx

    from tinytrain.pipeline.spec_data import DataSpec
    from tinytrain.stages import sparse_plan as SP

    q = _int8_two_heads()
    np.savez(tmp_path / "d.npz", **_arrays(64))
    data = DataSpec(source="npz", path=tmp_path / "d.npz", task="outputs")
    outs = [{"name": "boxes", "loss": "mse"}]
    ctx = make_ctx(tmp_path, q, {"scheme": "full"}, data=data, **{"train.outputs": outs})
    res = SP.run(ctx)
    plan = json.loads((ctx.out_dir / "plan.json").read_text())
    assert plan["layers"] and res.summary
    # the probe ran on the named head's targets (it once skipped every model with several outputs)
    check = json.loads((ctx.out_dir / "update_check.json").read_text())
    assert check["tensors"] and "boxes/w" in check["tensors"], check
