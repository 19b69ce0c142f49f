"""The .tflite writer: structure of the flatbuffer, LiteRT runs what it writes (reference kernels,
in a child process), hand-built graphs give the numbers TFLite's semantics say, and every fixture
survives read -> write -> read unchanged and runs bit-identically to the original file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tflite

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor
from tinytrain.stages.model.tflite_writer import TfliteWriteError, model_bytes, write_model

from writer_graphs import Case, all_cases, float_cases, int8_cases

HERE = Path(__file__).parent
FIXTURES = sorted((HERE / "fixtures").glob("*.tflite")) + sorted((HERE / "fixtures" / "load").glob("*.tflite"))


# ---- LiteRT in a child process --------------------------------------------------------------------

def run_litert(jobs: list[tuple[Path, list[np.ndarray]]], work: Path, *, tflm_outputs: list[int] | None = None
               ) -> list[list[np.ndarray]]:
    """Run each (model, feeds) in one child process; returns the outputs of each job in order.
    With `tflm_outputs` (number of outputs of each job), TFLite Micro runs them instead of LiteRT."""
    spec = []
    for i, (model, feeds) in enumerate(jobs):
        feeds_path, out_path = work / f"feeds{i}.npz", work / f"out{i}.npz"
        np.savez(feeds_path, **{f"in{k}": x for k, x in enumerate(feeds)})
        job = {"model": str(model), "feeds": str(feeds_path), "out": str(out_path)}
        if tflm_outputs is not None:
            job.update(runtime="tflm", n_out=tflm_outputs[i])
        spec.append(job)
    (work / "jobs.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(HERE / "writer_litert.py"), str(work / "jobs.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"LiteRT failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    results = []
    for job in spec:
        with np.load(job["out"]) as z:
            results.append([z[f"out{k}"] for k in range(len(z.files))])
    return results


@pytest.fixture(scope="module")
def hand_built(tmp_path_factory) -> list[tuple[Case, list[np.ndarray]]]:
    """Every hand-built case written and run once (one child process for all: start-up dominates)."""
    work = tmp_path_factory.mktemp("hand_built")
    cases = all_cases()
    jobs = []
    for case in cases:
        path = work / f"{case.name}.tflite"
        write_model(case.graph, path)
        jobs.append((path, [case.feeds[n] for n in case.graph.inputs]))
    return list(zip(cases, run_litert(jobs, work)))


def _has_tflm() -> bool:
    try:
        import tflite_micro  # noqa: F401
    except ImportError:
        return False
    return True


def _executor():
    try:
        from tinytrain.stages.golden.forward import run_graph
    except ImportError:
        return None
    return run_graph


# ---- hand-built graphs ----------------------------------------------------------------------------

def test_hand_built_cases_cover_every_op_type():
    from tinytrain.stages.model.tflite_writer import SUPPORTED_OPS

    import op_cases

    used = {op.type for case in all_cases() for op in case.graph.ops}
    assert used <= set(SUPPORTED_OPS)
    # an op added since has its writer checked by tests/test_op_conformance.py (converter fixture -> written file)
    assert set(SUPPORTED_OPS) <= used | set(op_cases.load())


def test_hand_built_outputs_have_the_ir_shapes_and_dtypes(hand_built):
    for case, outs in hand_built:
        for name, y in zip(case.graph.outputs, outs):
            t = case.graph.tensors[name]
            assert (list(y.shape), str(y.dtype)) == (t.shape, t.dtype), f"{case.name}: {name}"


@pytest.mark.parametrize("name", [c.name for c in float_cases()])
def test_hand_built_float_graph_computes_what_tflite_semantics_say(hand_built, name):
    """A numpy reference of each op's semantics; a wrongly written option (swapped strides, lost
    dilation, keep_dims, beta, axis...) changes these numbers."""
    case, outs = next((c, o) for c, o in hand_built if c.name == name)
    for out_name, y in zip(case.graph.outputs, outs):
        np.testing.assert_allclose(y, case.expected[out_name], rtol=1e-5, atol=1e-5, err_msg=f"{name}: {out_name}")


def test_hand_built_int8_graphs_run_and_are_not_trivial(hand_built):
    for case, outs in hand_built:
        if case.name not in {c.name for c in int8_cases()}:
            continue
        for y in outs:
            assert len(np.unique(y)) > 1, f"{case.name}: constant output, the graph is not exercised"


@pytest.mark.skipif(not _has_tflm(), reason="the tflite-micro wheel is not installed")
def test_hand_built_graphs_run_bit_identically_in_tflite_micro(hand_built, tmp_path):
    """What the MCU runs. TFLM has no float16 DEQUANTIZE, so that case is left out."""
    cases = [(c, o) for c, o in hand_built if not any(
        op.type == "dequantize" and c.graph.tensors[op.inputs[0]].dtype == "float16" for op in c.graph.ops)]
    jobs = []
    for case, _ in cases:
        path = tmp_path / f"{case.name}.tflite"
        write_model(case.graph, path)
        jobs.append((path, [case.feeds[n] for n in case.graph.inputs]))
    micro = run_litert(jobs, tmp_path, tflm_outputs=[len(c.graph.outputs) for c, _ in cases])
    for (case, ref), outs in zip(cases, micro):
        for a, b in zip(ref, outs):
            if a.dtype == np.float32:
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=case.name)
            else:
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), case.name


def test_hand_built_graphs_match_the_numpy_executor(hand_built):
    run_graph = _executor()
    if run_graph is None:
        pytest.skip("tinytrain.stages.golden.forward is not there yet")
    for case, outs in hand_built:
        ours = run_graph(case.graph, case.feeds)
        for name, y in zip(case.graph.outputs, outs):
            mine = ours[name] if isinstance(ours, dict) else ours[case.graph.outputs.index(name)]
            if y.dtype == np.float32:
                np.testing.assert_allclose(mine, y, rtol=1e-5, atol=1e-6, err_msg=f"{case.name}: {name}")
            else:
                np.testing.assert_array_equal(mine, y, err_msg=f"{case.name}: {name}")


# ---- flatbuffer structure -------------------------------------------------------------------------

def _model(data: bytes) -> tflite.Model:
    return tflite.Model.GetRootAsModel(data, 0)


def test_file_identifier_version_and_sentinel_buffer():
    data = model_bytes(all_cases()[0].graph)
    m = _model(data)
    assert data[4:8] == b"TFL3" and m.Version() == 3
    assert m.SubgraphsLength() == 1 and m.Buffers(0).DataLength() == 0
    assert m.Description() == b"tinytrain"


def test_constant_data_is_16_byte_aligned_and_activations_use_buffer_0():
    for case in all_cases():
        data = model_bytes(case.graph)
        m, sg = _model(data), _model(data).Subgraphs(0)
        base = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            ir = case.graph.tensors.get(t.Name().decode())
            if ir is None:      # the zero bias the writer adds to a bias-less conv
                continue
            if ir.data is None:
                assert t.Buffer() == 0
                continue
            buf = m.Buffers(t.Buffer()).DataAsNumpy()
            assert (buf.__array_interface__["data"][0] - base) % 16 == 0, f"{case.name}: {ir.name}"
            assert buf.tobytes() == np.ascontiguousarray(ir.data).astype(ir.dtype).tobytes()


def test_operator_codes_tensors_and_quantization_fields():
    case = next(c for c in int8_cases() if c.name == "conv2d_i8")
    sg = _model(model_bytes(case.graph)).Subgraphs(0)
    m = _model(model_bytes(case.graph))
    code = m.OperatorCodes(0)
    assert (code.BuiltinCode(), code.DeprecatedBuiltinCode(), code.Version()) == (3, 3, 3)
    names = [sg.Tensors(i).Name().decode() for i in range(sg.TensorsLength())]
    w = sg.Tensors(names.index("t1"))
    ir_w = case.graph.tensors["t1"]
    assert w.ShapeAsNumpy().tolist() == ir_w.shape == w.ShapeSignatureAsNumpy().tolist()
    assert w.Type() == tflite.TensorType.INT8
    q = w.Quantization()
    np.testing.assert_array_equal(q.ScaleAsNumpy(), np.float32(ir_w.quant.scale))
    assert q.ZeroPointAsNumpy().tolist() == [0] * 4 and q.QuantizedDimension() == 0
    assert sg.InputsAsNumpy().tolist() == [names.index(n) for n in case.graph.inputs]
    assert sg.OutputsAsNumpy().tolist() == [names.index(n) for n in case.graph.outputs]


def test_deprecated_code_saturates_at_127_for_large_builtin_codes():
    case = next(c for c in int8_cases() if c.name == "quantize_dequantize")   # QUANTIZE is 114 (< 127)
    m = _model(model_bytes(case.graph))
    for i in range(m.OperatorCodesLength()):
        c = m.OperatorCodes(i)
        assert c.DeprecatedBuiltinCode() == min(c.BuiltinCode(), 127)


def test_missing_bias_is_minus_one_for_fc_and_left_out_for_conv():
    fc = next(c for c in float_cases() if c.name == "fully_connected_keepdims_f32")
    assert _model(model_bytes(fc.graph)).Subgraphs(0).Operators(0).InputsAsNumpy().tolist()[2] == -1


def test_missing_conv_bias_becomes_a_zero_bias_and_the_graph_is_untouched():
    conv = next(c for c in float_cases() if c.name == "conv2d_nobias_dilated_f32")
    before = conv.graph.to_json()
    sg = _model(model_bytes(conv.graph)).Subgraphs(0)
    bias = sg.Tensors(sg.Operators(0).Inputs(2))
    assert bias.ShapeAsNumpy().tolist() == [3] and bias.Type() == tflite.TensorType.FLOAT32
    assert conv.graph.to_json() == before


def test_output_is_deterministic():
    for case in all_cases():
        assert model_bytes(case.graph) == model_bytes(case.graph)
    # Rebuilt from scratch (fresh arrays, fresh dicts): still the same bytes.
    assert model_bytes(all_cases()[3].graph) == model_bytes(all_cases()[3].graph)


def test_tensor_order_follows_source_index():
    case = all_cases()[0]
    g = case.graph
    names = list(g.tensors)
    for i, n in enumerate(reversed(names)):
        g.tensors[n].source_index = i
    sg = _model(model_bytes(g)).Subgraphs(0)
    assert [sg.Tensors(i).Name().decode() for i in range(sg.TensorsLength())] == list(reversed(names))


def test_circle_output_has_cir0_identifier(tmp_path):
    write_model(all_cases()[0].graph, tmp_path / "m.circle")
    data = (tmp_path / "m.circle").read_bytes()
    assert data[4:8] == b"CIR0"
    assert model_bytes(all_cases()[0].graph, circle=True) == data


def test_write_is_atomic_and_leaves_no_temp_file(tmp_path):
    write_model(all_cases()[0].graph, tmp_path / "m.tflite")
    assert [p.name for p in tmp_path.iterdir()] == ["m.tflite"]


# ---- errors ---------------------------------------------------------------------------------------

def _tiny(op: Op, **tensors: Tensor) -> Graph:
    ts = {"x": Tensor("x", [1, 4], "float32", role="input"), "y": Tensor("y", [1, 4], "float32")}
    ts.update(tensors)
    return Graph(ts, [op], ["x"], ["y"])


def test_unknown_op_names_the_op_and_its_index():
    g = _tiny(Op("sgd_update", ["x"], ["y"]))
    with pytest.raises(UnsupportedOpError, match=r"sgd_update at operator index 0"):
        model_bytes(g)


@pytest.mark.parametrize("op, tensors, message", [
    (Op("softmax", ["x"], ["y"], {"beta": 1.0}), {"x": Tensor("x", [1, 4], "complex64")}, "dtype complex64"),
    (Op("concatenation", ["x"], ["y"], {}), {}, "attribute 'axis' is missing"),
    (Op("max_pool2d", ["x"], ["y"], dict(filter_h=1, filter_w=1, stride_h=1, stride_w=1, padding="full")),
     {}, "padding 'full'"),
    (Op("add", ["x", "x"], ["y"], {"act": "gelu"}), {}, "activation 'gelu'"),
    (Op("relu", ["x"], ["y"]), {"x": Tensor("x", [1, 4], "int8", quant=QuantParams([0.1, 0.2], [0, 0], 1))},
     "per-channel scales do not match"),
    (Op("add", ["x", "c"], ["y"]), {"c": Tensor("c", [1, 4], "float32", data=np.zeros(3, np.float32))},
     "data has 3 elements"),
    (Op("relu", ["z"], ["y"]), {}, "unknown tensor 'z'"),
])
def test_bad_graphs_give_clear_errors(op, tensors, message):
    with pytest.raises(TfliteWriteError, match=message) as e:
        model_bytes(_tiny(op, **tensors))
    assert isinstance(e.value, ModelError)


# ---- fixtures: read -> write -> read, and LiteRT on both files -----------------------------------

def _reader():
    try:
        from tinytrain.stages.model.tflite_reader import read_model
    except ImportError:
        pytest.skip("tinytrain.stages.model.tflite_reader is not there yet")
    return read_model


def _readable_fixtures() -> list[Path]:
    from tinytrain.pipeline.errors import ModelError as _ME
    try:
        from tinytrain.stages.model.tflite_reader import read_model
    except ImportError:
        return []
    ok = []
    for f in FIXTURES:
        try:
            read_model(f)
        except _ME:
            continue        # fixtures that test the reader's rejections (dynamic shapes, unsupported ops)
        ok.append(f)
    return ok


READABLE = _readable_fixtures()


def _assert_same_graph(a: Graph, b: Graph, where: str) -> None:
    ja, jb = a.to_json(), b.to_json()
    ja["meta"].pop("description", None)
    jb["meta"].pop("description", None)
    for key in ja:
        assert ja[key] == jb[key], f"{where}: {key} differs"
    for name, t in a.tensors.items():
        if t.data is not None:
            u = b.tensors[name].data
            assert u.dtype == t.data.dtype and np.array_equal(u, t.data), f"{where}: data of {name}"


def test_some_fixtures_are_readable():
    _reader()
    assert len(READABLE) >= 10, READABLE


@pytest.mark.parametrize("fixture", READABLE, ids=lambda p: p.name)
def test_fixture_round_trips_through_the_ir(fixture, tmp_path):
    read_model = _reader()
    g = read_model(fixture)
    write_model(g, tmp_path / fixture.name)
    _assert_same_graph(g, read_model(tmp_path / fixture.name), fixture.name)
    # Writing the re-read graph again gives the very same bytes: the writer is a fixed point.
    assert model_bytes(read_model(tmp_path / fixture.name)) == model_bytes(g)
    circle = tmp_path / (fixture.stem + ".circle")
    write_model(g, circle)
    g_circle = read_model(circle)
    assert (g_circle.meta.pop("format"), g_circle.meta.pop("schema_version")) == ("circle", 0)
    g_circle.meta.update(format=g.meta["format"], schema_version=g.meta["schema_version"])
    _assert_same_graph(g, g_circle, f"{fixture.name} as .circle")


def _fixture_feeds(g: Graph, rng: np.random.Generator) -> list[np.ndarray]:
    feeds = []
    for name in g.inputs:
        t = g.tensors[name]
        if t.dtype == "int8":
            feeds.append(rng.integers(-128, 128, size=t.shape, dtype=np.int8))
        else:
            feeds.append(rng.normal(size=t.shape).astype(t.dtype))
    return feeds


def test_rewritten_fixtures_run_bit_identically_in_litert(tmp_path):
    read_model = _reader()
    rng = np.random.default_rng(7)
    jobs = []
    for f in READABLE:
        g = read_model(f)
        out = tmp_path / f"rewritten_{f.name}"
        write_model(g, out)
        feeds = _fixture_feeds(g, rng)
        jobs += [(f, feeds), (out, feeds)]
    results = run_litert(jobs, tmp_path)
    for i, f in enumerate(READABLE):
        original, rewritten = results[2 * i], results[2 * i + 1]
        assert len(original) == len(rewritten)
        for a, b in zip(original, rewritten):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{f.name}: outputs differ"


@pytest.mark.skipif(not _has_tflm(), reason="the tflite-micro wheel is not installed")
def test_rewritten_int8_fixtures_run_bit_identically_in_tflite_micro(tmp_path):
    """The MCU runtime gives the same bits on our file as on the converter's. (Compared with TFLM on
    the original rather than with LiteRT: TFLM and LiteRT's reference kernels disagree on
    dwsep_int8.tflite itself, which is not the writer's business.)"""
    read_model = _reader()
    rng = np.random.default_rng(11)
    graphs = {f: read_model(f) for f in READABLE if "int8" in f.name}
    jobs = []
    for f, g in graphs.items():
        out = tmp_path / f"rewritten_{f.name}"
        write_model(g, out)
        feeds = _fixture_feeds(g, rng)
        jobs += [(f, feeds), (out, feeds)]
    assert len(graphs) >= 4
    results = run_litert(jobs, tmp_path, tflm_outputs=[len(g.outputs) for g in graphs.values() for _ in "ab"])
    for i, f in enumerate(graphs):
        for a, b in zip(results[2 * i], results[2 * i + 1]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f.name
