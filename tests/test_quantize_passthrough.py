"""quantize's pass-through of an already-int8 model (issue 14 item 4): validated and saved, not executed unless the
spec asks for its accuracy."""

import json

import numpy as np
import pytest

from tinytrain.pipeline.errors import UserError
from tinytrain.stages import quantize
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_reader import read_model

from test_quantize import FIX, make_ctx, npz_data


def test_int8_model_with_data_is_not_executed_unless_asked(tmp_path, monkeypatch):
    """issue 14 item 4: an already-int8 model passes through without running it (the data's shape is still
    checked); quantize.eval_samples asks for the int8 accuracy on that many test samples."""
    from tinytrain.stages.golden.forward import run_graph

    g = read_model(FIX / "convnet_int8.tflite")
    shape = g.tensors[g.inputs[0]].shape
    k = int(g.tensors[g.outputs[0]].shape[-1])
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (12, *shape[1:])).astype(np.float32)
    y = rng.integers(0, k, 12)
    data = npz_data(tmp_path, x_train=x, y_train=y, x_test=x, y_test=y)
    runs = []
    monkeypatch.setattr(quantize, "_outputs", lambda graph, xs: runs.append(len(xs)) or _logits(graph, xs))

    def _logits(graph, xs):
        q = quantize._run(graph, xs, keep=False)[graph.outputs[0]]
        return quantize._real(np.asarray(q), graph.tensors[graph.outputs[0]])

    quantize.run(make_ctx(tmp_path / "a", g, data))
    rep = json.loads((tmp_path / "a" / "quantize" / "report.json").read_text())
    assert runs == [] and rep["model"] == {} and any("eval_samples" in n for n in rep["notes"])
    assert Graph.load(tmp_path / "a" / "quantize").to_json() == g.to_json()

    quantize.run(make_ctx(tmp_path / "b", g, data, eval_samples=5))
    rep = json.loads((tmp_path / "b" / "quantize" / "report.json").read_text())
    assert runs == [5] and rep["model"]["eval_samples"] == 5
    q = run_graph(g, {g.inputs[0]: np.clip(np.round(x[:5] / g.tensors[g.inputs[0]].quant.scale[0])
                                              + g.tensors[g.inputs[0]].quant.zero_point[0], -128, 127)
                      .astype(np.int8)})[g.outputs[0]]
    assert rep["model"]["acc_int8"] == float(np.mean(np.asarray(q).reshape(5, -1).argmax(1) == y[:5]))

    (tmp_path / "c").mkdir()
    bad = npz_data(tmp_path / "c", x_train=x[:, :3], y_train=y, x_test=x[:, :3], y_test=y)
    with pytest.raises(UserError):
        quantize.run(make_ctx(tmp_path / "c", g, bad))
