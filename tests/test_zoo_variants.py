"""Zoo variants made from the shipped MobileNetV2 at first use (stages/model/zoo.py DERIVED, zoo_derive.py): the same
bytes every time, and each a model LiteRT runs as our reference executor does (outside reference: LiteRT's
reference kernels on the written file)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from litert_oracle import run_litert
from tinytrain.pipeline.errors import UserError
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model import zoo
from tinytrain.stages.model.tflite_reader import read_model


@pytest.fixture()
def zoo_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTRAIN_ZOO_DIR", str(tmp_path / "zoo"))
    return tmp_path / "zoo"


def _images(size: int, n: int = 2) -> np.ndarray:
    rng = np.random.default_rng(11)
    return rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def test_variants_resolve_to_the_same_bytes_every_time(zoo_dir, tmp_path, monkeypatch):
    assert {"mbv2-w0.35-96", "mbv2-w0.35-128-float", "mbv2-w0.35-96-float"} <= set(zoo.names())
    first = zoo.resolve("zoo:mbv2-w0.35-96")
    assert first.parent == zoo_dir
    assert zoo.resolve("zoo:mbv2-w0.35-96") == first   # made once, then reused
    monkeypatch.setenv("TINYTRAIN_ZOO_DIR", str(tmp_path / "again"))
    assert zoo.resolve("zoo:mbv2-w0.35-96-int8").read_bytes() == first.read_bytes()
    with pytest.raises(UserError, match="zoo:mbv2-w0.35-96-float"):
        zoo.resolve("zoo:mbv2-w0.35-64")


def test_the_96_variant_is_the_128_network_at_96_and_litert_agrees_bit_for_bit(zoo_dir):
    g96, g128 = read_model(zoo.resolve("zoo:mbv2-w0.35-96")), read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    assert g96.tensors[g96.inputs[0]].shape == [1, 96, 96, 3] and g96.tensors[g96.outputs[0]].shape == [1, 10]
    assert [op.type for op in g96.ops] == [op.type for op in g128.ops]
    for name, t in g128.tensors.items():
        if t.is_constant:
            np.testing.assert_array_equal(g96.tensors[name].data, t.data)
    q = g96.tensors[g96.inputs[0]].quant
    x = np.clip(np.round(_images(96) / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)
    ours = run_graph(g96, {g96.inputs[0]: x}, fc_requant="litert_double")[g96.outputs[0]]
    np.testing.assert_array_equal(ours, run_litert(zoo.resolve("zoo:mbv2-w0.35-96"), [x]).outputs[0])


@pytest.mark.parametrize("size", [128, 96])
def test_the_float_variant_is_the_int8_network_dequantized(zoo_dir, size):
    name = f"zoo:mbv2-w0.35-{size}"
    gf, gq = read_model(zoo.resolve(name + "-float")), read_model(zoo.resolve(name))
    assert not any(t.dtype == "int8" or t.quant is not None for t in gf.tensors.values())  # int32: axes only
    x = _images(size)
    ours = run_graph(gf, {gf.inputs[0]: x})[gf.outputs[0]]
    np.testing.assert_allclose(run_litert(zoo.resolve(name + "-float"), [x]).outputs[0], ours, atol=1e-5)
    # The int8 network on the same images: the float twin's probabilities within a few int8 steps of it.
    q = gq.tensors[gq.inputs[0]].quant
    xq = np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)
    oq = gq.tensors[gq.outputs[0]].quant
    p8 = (run_graph(gq, {gq.inputs[0]: xq})[gq.outputs[0]].astype(np.float32) - oq.zero_point[0]) * oq.scale[0]
    assert np.abs(p8 - ours).max() < 0.1


@pytest.mark.slow  # auto measures ~60 options of a MobileNetV2 at 96, then a QEMU run: minutes (10 on a loaded machine)
def test_the_96_float_variant_trains_with_the_default_plan_within_the_board(zoo_dir, tmp_path):
    import sys
    from pathlib import Path

    import yaml

    import tinytrain

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import mbv2_variants
    finally:
        sys.path.pop(0)
    data = mbv2_variants.data_for(96, tmp_path)
    spec = yaml.safe_load((bench / "mbv2_auto.yaml").read_text())
    spec["model"]["path"] = "zoo:mbv2-w0.35-96-float"
    spec["data"]["path"] = str(data)
    spec["train"].update(max_train_samples=10, epochs=1)
    spec["build"]["out_dir"] = str(tmp_path / "build")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = tinytrain.build(tmp_path / "s.yaml", cache_dir=tmp_path / "cache")
    assert r.ok, r.error
    plan = json.loads(r.artifact("sparse-plan", "plan.json").read_text())
    assert plan["scheme"] == "auto" and plan["layers"]           # auto chose something to train
    size = json.loads(r.artifact("cross-compile", "size.json").read_text())
    assert size["sram"]["used"] <= size["sram"]["available"] and size["flash"]["used"] <= size["flash"]["available"]
    run = json.loads(r.artifact("emulate-run", "run.json").read_text())
    assert run["steps"] == 10 and run["accuracy"]["after"]["total"] == 50
