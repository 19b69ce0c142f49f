"""Stateful streaming models (stages/model/state.py): resource variables read at load, and the numpy golden model run
over sequences of invocations against LiteRT invoking the same file T times.

Fixture: tests/fixtures/stateful/stream_kws_int8.tflite, made by tests/make_stateful_fixtures.py with the TF
converter (resource variables, variable quantization: microWakeWord's structure in miniature).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from litert_oracle import tflm_available
from litert_sequence import run_litert_sequence, run_tflm_sequence
from tinytrain.pipeline.errors import ModelError
from tinytrain.stages.model import state
from tinytrain.stages.model.ir import Graph
from tinytrain.stages.model.prune import prune_graph
from tinytrain.stages.model.tflite_reader import read_model

FIX = Path(__file__).resolve().parent / "fixtures" / "stateful"
MODEL = FIX / "stream_kws_int8.tflite"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_model(MODEL)


@pytest.fixture(scope="module")
def seqs() -> np.ndarray:
    return np.load(FIX / "stream_kws.input.npy")


@pytest.fixture(scope="module")
def litert(seqs) -> np.ndarray:
    return run_litert_sequence(MODEL, seqs)


def _outputs(g: Graph, x: np.ndarray, **kw) -> np.ndarray:
    steps = state.run_sequence(g, x, **kw)
    return np.stack([s[g.outputs[0]] for s in steps], axis=1)


def test_variables_become_state_inputs_with_their_initial_values(graph):
    svars = state.variables(graph)
    assert sorted(v.variable for v in svars) == ["stream0/states", "stream1/states"]
    assert state.model_inputs(graph) == ["serving_default_x:0"]
    assert graph.inputs == ["serving_default_x:0"] + [v.read for v in svars]
    assert not any(op.type in ("var_handle", "read_variable", "assign_variable") for op in graph.ops)
    for v in svars:
        t = graph.tensors[v.read]
        assert v.init.shape == tuple(t.shape) and v.init.dtype == np.dtype(t.dtype)
        # The converter initialises with zeros: the zero point of each int8 state.
        assert (v.init == t.quant.zero_point[0]).all()
        assert graph.tensors[v.assign].shape == t.shape
    assert {graph.tensors[v.read].shape[1] for v in svars} == {2, 3}


def test_golden_model_matches_litert_over_every_invocation(graph, seqs, litert):
    ours = _outputs(graph, seqs, fc_requant="litert_double")
    assert ours.shape == litert.shape == (4, 6, 2)
    np.testing.assert_array_equal(ours, litert)
    # The MCU's fixed-point FC rescaling may differ from LiteRT's double one by 1 LSB on near-ties, no more.
    fixed = _outputs(graph, seqs, fc_requant="fixed_point")
    assert np.abs(fixed.astype(int) - litert.astype(int)).max() <= 1


@pytest.mark.skipif(not tflm_available(), reason="tflite-micro not installed")
def test_golden_model_matches_tflite_micro_over_every_invocation(graph, seqs):
    # The fixed-point arithmetic the generated C runs, against TFLite Micro's resource variables.
    np.testing.assert_array_equal(_outputs(graph, seqs, fc_requant="fixed_point"), run_tflm_sequence(MODEL, seqs))


def test_state_carries_over_and_resets_per_sequence(graph, seqs, litert):
    # Each frame alone from the initial state (no carry-over) gives other outputs than LiteRT's sequence...
    frames = seqs.reshape(-1, 1, *seqs.shape[2:])
    alone = _outputs(graph, frames, fc_requant="litert_double").reshape(litert.shape)
    assert not np.array_equal(alone, litert)
    assert np.array_equal(alone[:, 0], litert[:, 0])  # ...except the first, which starts from the initial state
    # Sequences are independent: one run alone gives what it gives in a batch.
    one = _outputs(graph, seqs[2:3], fc_requant="litert_double")
    np.testing.assert_array_equal(one[0], litert[2])


def test_state_survives_the_ir_round_trip(graph, seqs, tmp_path):
    graph.save(tmp_path)
    back = Graph.load(tmp_path)
    assert back.meta["state"] == graph.meta["state"]
    for a, b in zip(state.variables(graph), state.variables(back)):
        np.testing.assert_array_equal(a.init, b.init)
    np.testing.assert_array_equal(_outputs(back, seqs), _outputs(graph, seqs))


def test_a_cut_keeps_what_the_state_needs(graph, seqs):
    # Cutting before the classifier (model.outputs) must not drop the ops that compute the next state: the cut
    # graph's feature at every step is the full graph's.
    from tinytrain.stages.golden.forward import run_graph

    feat = next(op.inputs[0] for op in graph.ops if op.type == "fully_connected")
    full = state.run_sequence(graph, seqs, run=lambda g, feeds, **kw: run_graph(g, feeds, **kw))
    want = []
    st = state.initial_state(graph, seqs.shape[0])
    for t in range(seqs.shape[1]):
        vals = run_graph(graph, {state.model_inputs(graph)[0]: seqs[:, t], **st}, keep_intermediates=True)
        want.append(vals[feat])
        st = {v.read: vals[v.assign] for v in state.variables(graph)}
    assert len(full) == seqs.shape[1]
    for g in (prune_graph(graph, [feat]), read_model(MODEL, outputs=[feat])):
        assert {v["variable"] for v in g.meta["state"]} == {"stream0/states", "stream1/states"}
        got = np.stack([s[feat] for s in state.run_sequence(g, seqs)], axis=1)
        np.testing.assert_array_equal(got, np.stack(want, axis=1))


def test_a_subgraph_that_is_not_a_variable_initialiser_is_refused_with_the_reason(tmp_path):
    from test_load import write_model

    with pytest.raises(ModelError, match=r"2 subgraphs .*subgraph #1 is not run by CALL_ONCE"):
        read_model(write_model(tmp_path, extra_subgraphs=1))


def test_a_uint8_output_that_only_re_encodes_is_read_as_its_int8_source(seqs):
    # microWakeWord's score is int8 requantized to uint8 at the same scale by a final QUANTIZE: load reads the model
    # as if cut before it (the same real values) and keeps the re-encoding for the library's uint8 output.
    path = FIX / "stream_kws_u8out.tflite"
    g = read_model(path)
    assert g.outputs == ["StatefulPartitionedCall:01"] and g.tensors[g.outputs[0]].dtype == "int8"
    enc = g.meta["output_uint8"]["StatefulPartitionedCall:01"]
    assert (enc["output"], enc["zero_point"], enc["offset"]) == ("StatefulPartitionedCall:0", 85, 128)
    ours = _outputs(g, seqs, fc_requant="litert_double").astype(np.int64)
    ref = run_litert_sequence(path, seqs).astype(np.int64)
    np.testing.assert_array_equal(np.clip(ours + enc["offset"], 0, 255), ref)
    assert "uint8 output 'StatefulPartitionedCall:0' read as its int8 source" in \
        __import__("tinytrain.stages.model.uint8_output", fromlist=["summary"]).summary(g.meta)
    # An explicit cut is the user's: no re-encoding is recorded.
    assert "output_uint8" not in read_model(path, outputs=["StatefulPartitionedCall:01"]).meta


def test_stages_that_take_one_stateless_input_stop_with_what_is_missing(graph):
    with pytest.raises(ModelError, match=r"(?s)stateful streaming model \(2 state variables: .*quantize needs each "
                                         r"training sample as a sequence.*model.sequence_length"):
        state.refuse_training(graph, "quantize")
    state.refuse_training(read_model(FIX.parent / "mlp_int8.tflite"), "quantize")  # stateless: no error
    with pytest.raises(ModelError, match="model.sequence_length is set but the model has no state variables"):
        state.for_training(read_model(FIX.parent / "mlp_int8.tflite"), 4, "mlp_int8.tflite")


# ---- training: the model unrolled over a sequence ------------------------------------------------------------------

def test_unrolled_graph_is_litert_over_the_sequence(graph, seqs, litert):
    from tinytrain.stages.golden.forward import run_graph

    for steps in (1, 3, seqs.shape[1]):
        u = state.unroll(graph, steps)
        assert u.inputs == ["serving_default_x:0/sequence"] and "state" not in u.meta
        assert u.tensors[u.inputs[0]].shape == [1, steps, 3, 10]
        out = run_graph(u, {u.inputs[0]: seqs[:, :steps]}, fc_requant="litert_double")[u.outputs[0]]
        np.testing.assert_array_equal(out, litert[:, steps - 1])
    # Only the last invocation's head is kept; every invocation's feature extractor is (it feeds the state).
    u = state.unroll(graph, 4)
    assert sum(op.type == "fully_connected" for op in u.ops) == 1
    assert sum(op.type == "conv2d" for op in u.ops) == 4


def test_only_layers_after_the_state_train(graph):
    from tinytrain.stages.planning.train_plan import TrainPlan

    u = state.unroll(graph, 4)
    # The conv's weights are shared by the 4 invocations (the gradient would not reach its earlier uses): frozen.
    assert [u.ops[i].type for i in TrainPlan.trainable_ops(u)] == ["fully_connected"]
    assert [graph.ops[i].type for i in TrainPlan.trainable_ops(graph)] == ["conv2d", "fully_connected"]


def _train_build(tmp_path, seqs):
    from tinytrain.stages import codegen
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.train.data import write_stream
    from tinytrain.stages.reorder import plan_schedules
    from tinytrain.stages.planning.train_plan import TrainPlan

    u = state.unroll(read_model(MODEL), seqs.shape[1])
    tg = build_training_graph(u, TrainPlan.full(u), "cross_entropy", OptimizerSpec("sgd", learning_rate=0.05), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    x = np.concatenate([seqs] * 3)  # 12 sequences
    y = (np.arange(len(x)) % 2).astype(np.int64)
    write_stream(tmp_path / "train.ttds", x, y)
    write_stream(tmp_path / "test.ttds", x[:4], y[:4])
    return tg, x, y, {"train.ttds": tmp_path / "train.ttds", "test.ttds": tmp_path / "test.ttds"}


@pytest.mark.slow  # a firmware build (~10 s on a shared machine)
@needs_cc
def test_sequence_training_in_c_on_the_host_matches_the_golden_model_bit_for_bit(tmp_path, seqs):
    from test_codegen import _check_trained, _golden, _run
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    tg, x, y, data = _train_build(tmp_path, seqs)
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    out = _run("host", tmp_path / "prog", tmp_path / "build", tmp_path / "run", cfg, data)
    want, st = _golden(tg, x, y, cfg)
    np.testing.assert_allclose(np.frombuffer(out["losses.bin"], "<f4"), want, rtol=1e-5, atol=1e-6)
    io = json.loads((tmp_path / "prog" / "io_layout.json").read_text())
    trained = _check_trained(out, io, st, exact=True)
    assert any(np.any(v != tg.tensors[n].data) for n, v in trained.items())


@pytest.mark.slow  # two firmware builds and a QEMU run
@needs_cc
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="arm-none-eabi-gcc or qemu-system-arm not installed")
def test_sequence_training_in_qemu_matches_the_host_bit_for_bit(tmp_path, seqs):
    from test_codegen import _run
    from tinytrain.stages.train.runtime_config import RuntimeConfig

    _, _, _, data = _train_build(tmp_path, seqs)
    cfg = RuntimeConfig(learning_rate=0.05, epochs=1)
    host = _run("host", tmp_path / "prog", tmp_path / "bh", tmp_path / "rh", cfg, data)
    qemu = _run("stm32f746-disco", tmp_path / "prog", tmp_path / "bq", tmp_path / "rq", cfg, data)
    assert qemu["losses.bin"] == host["losses.bin"] and qemu["weights.bin"] == host["weights.bin"]


def test_every_invocations_intermediate_matches_litert(graph, seqs):
    # An activation that feeds the state (the conv's output), at every invocation: the state evolution itself.
    conv = next(op for op in graph.ops if op.type == "conv2d").outputs[0]
    ref = run_litert_sequence(MODEL, seqs, tensor=graph.tensors[conv].source_index)
    cut = read_model(MODEL, outputs=[conv])  # the cut keeps the state's ops (test above)
    got = np.stack([s[conv] for s in state.run_sequence(cut, seqs)], axis=1)
    assert len(np.unique(ref)) > 10  # not a saturated constant
    np.testing.assert_array_equal(got, ref)


def test_load_summary_says_what_was_unrolled(graph):
    assert state.summary(state.unroll(graph, 4)) == ("; stateful: 2 state variables, unrolled over 4 invocations per "
                                                     "sample (1 layer(s) feed the state and stay frozen)")
    assert "set model.sequence_length" in state.summary(graph)
    assert state.summary(read_model(FIX.parent / "mlp_int8.tflite")) == ""


def test_sequence_data_of_the_wrong_shape_is_one_line_with_the_fix(graph):
    from tinytrain.pipeline.errors import UserError

    u = state.unroll(graph, 4)
    state.check_sequence_samples(u, (4, 3, 10), "data")
    with pytest.raises(UserError, match=r"expected \[4, 3, 10\], got \[6, 3, 10\]") as e:
        state.check_sequence_samples(u, (6, 3, 10), "data")
    assert e.value.hint == "set model.sequence_length: 6"
    with pytest.raises(UserError) as e:
        state.check_sequence_samples(u, (3, 10), "data")  # one invocation per sample, not a sequence
    assert e.value.hint == "reshape x to [N, 4, 3, 10]"
    state.check_sequence_samples(graph, (9,), "data")  # not unrolled: not this check's business


def test_the_spec_s_sequence_length_reaches_load_and_the_plan(tmp_path, seqs):
    import tinytrain

    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (24, 6, 3, 10)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x_train=x[:16], y_train=np.arange(16) % 2, x_test=x[16:], y_test=np.arange(8) % 2)
    spec = {"name": "kws", "model": {"path": str(MODEL), "sequence_length": 6},
            "data": {"source": "npz", "path": str(tmp_path / "d.npz")},
            "train": {"update": {"scheme": "last_k", "k": 1}}, "build": {"out_dir": str(tmp_path / "build")}}
    (tmp_path / "kws.yaml").write_text(json.dumps(spec))
    r = tinytrain.build(tmp_path / "kws.yaml", until="sparse-plan", cache_dir=tmp_path / "cache")
    assert "unrolled over 6 invocations per sample" in r.stages["load"].summary
    g = Graph.load(r.artifact("load", "graph.json").parent)
    assert g.inputs == ["serving_default_x:0/sequence"] and g.tensors[g.inputs[0]].shape == [1, 6, 3, 10]
    plan = json.loads(r.artifact("sparse-plan", "plan.json").read_text())
    assert [g.ops[d["layer"]].type if isinstance(d["layer"], int) else d["layer"] for d in plan["layers"]] \
        in (["fully_connected"], ["MatMul"])
