"""train.precision fp32 / fp16-mixed on an int8 model file: the quantize stage trains the file's dequantized float
copy (stages/quant/dequantize.py), never int8 under a float label; int8 precision is unchanged; a stateful int8 model
(no float copy) is refused by quantize with one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinytrain
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.golden.train_step import train
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.tflite_reader import read_model

FIX = Path(__file__).resolve().parent / "fixtures"
MODEL = FIX / "convnet_int8.tflite"
STATEFUL = FIX / "stateful" / "stream_kws_int8.tflite"


def _data(tmp: Path) -> Path:
    g = read_model(MODEL)
    k = int(g.tensors[g.outputs[0]].shape[-1])
    rng = np.random.default_rng(0)
    y = rng.integers(0, k, 24)
    x = (rng.normal(0, 0.3, (24, 16, 16, 3)) + (y[:, None, None, None] / k - 0.5)).astype(np.float32)
    np.savez(tmp / "d.npz", x_train=x[:16], y_train=y[:16], x_test=x[16:], y_test=y[16:])
    return tmp / "d.npz"


def _build(tmp: Path, precision: str, until: str = "autodiff"):
    spec = {"name": f"c_{precision}", "model": {"path": str(MODEL)},
            "data": {"source": "npz", "path": str(_data(tmp))}, "target": {"board": "host"},
            "train": {"precision": precision, "learning_rate": 0.05, "epochs": 2, "update": {"scheme": "full"}},
            "build": {"out_dir": str(tmp / "build")}}
    (tmp / "s.yaml").write_text(json.dumps(spec))
    return tinytrain.build(tmp / "s.yaml", until=until, cache_dir=tmp / "cache")


def _expected_floats(g: Graph) -> dict[str, np.ndarray]:
    """Every quantized constant's real value, computed here from the file's int8 data and scales."""
    out = {}
    for n, t in g.tensors.items():
        if t.data is None or t.quant is None or t.dtype not in ("int8", "int32"):
            continue
        s = np.asarray(t.quant.scale, np.float64)
        z = np.asarray(t.quant.zero_point, np.float64)
        if s.size > 1:
            shape = [1] * t.data.ndim
            shape[t.quant.axis] = -1
            s, z = s.reshape(shape), z.reshape(shape)
        out[n] = ((t.data.astype(np.float64) - z) * s).astype(np.float32)
    return out


@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed"])
def test_float_precisions_train_the_int8_file_s_dequantized_copy(tmp_path, precision):
    r = _build(tmp_path, precision)
    src = read_model(MODEL)
    want = _expected_floats(src)
    summary = f"int8 model file: training its dequantized float copy, {len(want)} constants"
    assert r.stages["quantize"].summary == summary
    rep = json.loads(r.artifact("quantize", "report.json").read_text())
    assert rep["notes"] == [r.stages["quantize"].summary] and "dequantized" in rep["mode"]
    q = Graph.load(r.artifact("quantize", "graph.json").parent)
    assert not any(t.dtype in ("int8", "uint8", "int16") for t in q.tensors.values())
    assert not any(op.type in ("quantize", "dequantize") for op in q.ops)
    for n, w in want.items():
        assert q.tensors[n].dtype == "float32"
        np.testing.assert_array_equal(q.tensors[n].data, w)
    # A proper float graph: on the fixture's input it predicts what the int8 file predicts.
    x = np.load(FIX / "convnet.input.npy").astype(np.float32)
    t_in, t_out = src.tensors[src.inputs[0]], src.tensors[src.outputs[0]]
    xq = np.clip(np.round(x / t_in.quant.scale[0]) + t_in.quant.zero_point[0], -128, 127).astype(np.int8)
    yq = (run_graph(src, {src.inputs[0]: xq})[src.outputs[0]].astype(np.float64) - t_out.quant.zero_point[0]) \
        * t_out.quant.scale[0]
    yf = run_graph(q, {q.inputs[0]: x})[q.outputs[0]]
    assert np.argmax(yf) == np.argmax(yq) and np.max(np.abs(yf - yq)) < 0.05
    # autodiff trains float: no int8 tensor, no QAS
    ad = r.stages["autodiff"].summary
    assert "int8" not in ad and "QAS" not in ad
    tg = Graph.load(r.artifact("autodiff", "train_graph.json").parent, "train_")
    assert tg.meta["train"]["precision"] == ("float32" if precision == "fp32" else "fp16-mixed")
    assert "qas" not in tg.meta["train"]
    # ... and the golden model of that training graph learns: finite losses that fall
    z = np.load(tmp_path / "d.npz")
    losses, _ = train(tg, z["x_train"][:4], z["y_train"][:4], steps=12, shuffle=False)
    assert np.all(np.isfinite(losses)) and np.mean(losses[-4:]) < np.mean(losses[:4])


def test_int8_precision_still_trains_the_file_as_it_is(tmp_path):
    r = _build(tmp_path, "int8", until="autodiff")
    assert r.stages["quantize"].summary.startswith("int8: model already int8")
    q = Graph.load(r.artifact("quantize", "graph.json").parent)
    assert q.to_json() == read_model(MODEL).to_json()
    tg = Graph.load(r.artifact("autodiff", "train_graph.json").parent, "train_")
    assert tg.meta["train"]["precision"] == "int8" and "qas" in tg.meta["train"]


@pytest.mark.parametrize("precision, length", [("fp32", 4), ("fp16-mixed", 4), ("fp32", None)])
def test_a_stateful_int8_model_is_refused_in_float_with_one_line(tmp_path, precision, length):
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (8, length or 1, 3, 10)).astype(np.float32)
    x = x if length else x[:, 0]
    np.savez(tmp_path / "d.npz", x_train=x[:6], y_train=np.arange(6) % 2, x_test=x[6:], y_test=np.arange(2) % 2)
    model = {"path": str(STATEFUL), **({"sequence_length": length} if length else {})}
    spec = {"name": "kws", "model": model, "data": {"source": "npz", "path": str(tmp_path / "d.npz")},
            "target": {"board": "host"}, "train": {"precision": precision},
            "build": {"out_dir": str(tmp_path / "build")}}
    (tmp_path / "kws.yaml").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "tinytrain", "build", "-q", "--until", "autodiff",
                        "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "kws.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "hint" not in r.stderr
    assert STATEFUL.name in errors[0] and "stateful int8" in errors[0]
    assert "train.precision: int8" in errors[0] and "float model file" in errors[0]
    assert not (tmp_path / "build" / "kws" / "sparse-plan").exists()


@pytest.mark.parametrize("name", ["mbv2_block_int8", "residual_int8", "convnet_int8_floatio", "mlp_f16",
                                  "prelu_block_f16"])
def test_the_dequantized_copy_is_a_float_graph_computing_what_the_file_computes(name):
    """No int8 / float16 tensor and no conversion op left (an unpacking DEQUANTIZE of float16 weights is folded),
    and on the fixture's input the copy's output is the file's to within the int8 model's rounding."""
    from tinytrain.stages.quant.dequantize import dequantize_graph

    g = read_model(FIX / f"{name}.tflite")
    f = dequantize_graph(g)
    assert all(t.dtype in ("float32", "int32", "int64") for t in f.tensors.values())
    assert not any(op.type in ("quantize", "dequantize") for op in f.ops)
    base = name.replace("_floatio", "").rsplit("_", 1)[0]
    x = np.load(FIX / f"{base}.input.npy").astype(np.float32)
    t_in, t_out = g.tensors[g.inputs[0]], g.tensors[g.outputs[0]]
    xg = x if t_in.dtype != "int8" else \
        np.clip(np.round(x / t_in.quant.scale[0]) + t_in.quant.zero_point[0], -128, 127).astype(np.int8)
    want = np.asarray(run_graph(g, {g.inputs[0]: xg})[g.outputs[0]], np.float64)
    if t_out.dtype == "int8":
        want = (want - t_out.quant.zero_point[0]) * t_out.quant.scale[0]
    got = run_graph(f, {f.inputs[0]: x})[f.outputs[0]]
    tol = 0 if name.endswith("_f16") else 0.05 * np.max(np.abs(want))
    assert np.max(np.abs(got - want)) <= tol


@pytest.mark.slow
def test_fp32_on_the_int8_file_trains_float_on_the_host(tmp_path):
    """The whole pipeline on the host board: fp32 on the int8 file runs float training whose losses are finite and
    differ from the int8 (QAS) run's on the same data and order."""
    losses = {}
    for precision in ("fp32", "int8"):
        (tmp_path / precision).mkdir()
        r = _build(tmp_path / precision, precision, until="emulate-run")
        run = json.loads(r.artifact("emulate-run", "run.json").read_text())
        losses[precision] = run["loss"]["epoch_mean"]
    assert np.all(np.isfinite(losses["fp32"])) and losses["fp32"] != losses["int8"]
    assert losses["fp32"][-1] < losses["fp32"][0]


def test_the_wof_leaves_out_what_the_int8_file_stores_in_another_dtype(tmp_path):
    """A .wof holds each tensor in the model file's own dtype: the dequantized copy's trained float32 weights have no
    place in the int8 file's tensor slots, so wof_data lists them as not in the .wof instead of writing float32 bytes
    where a reader expects int8 ones; a float model's weights still go in."""
    from tinytrain.stages.device import export

    res = _build(tmp_path, "fp32", until="quantize")
    g = Graph.load(res.out_dir / "quantize")
    weights = [n for n, t in g.tensors.items() if t.role == "weight" and t.source_index is not None]
    assert weights and all(g.meta["dtype_in_file"][n] == "int8" for n in weights)
    data, missing = export.wof_data(g, {n: g.tensors[n].data for n in weights})
    assert data == {} and sorted(missing) == sorted(weights)
    flt = read_model(Path(__file__).parent / "fixtures" / "convnet_float.tflite")
    w = next(n for n, t in flt.tensors.items() if t.role == "weight" and t.source_index is not None)
    data, missing = export.wof_data(flt, {w: flt.tensors[w].data})
    assert list(data) == [flt.tensors[w].source_index] and missing == []
