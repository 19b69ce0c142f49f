"""`model.outputs`: cutting a model at named tensors (stages/model/prune.py, the reader's skip of ops after the cut,
and the load error that suggests the cut for an unsupported op that only post-processes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tflite.BuiltinOperator import BuiltinOperator as BO
from tflite.BuiltinOptions import BuiltinOptions as BOpt

from test_load import OPS_FLOAT, _code, _fc_options, write_model
from tinytrain.pipeline.cli import main
from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.prune import needed_ops, prune_graph
from tinytrain.stages.model.tflite_reader import read_model

FC = {"opt": (BOpt.FullyConnectedOptions, _fc_options)}


def _tensors(*names):
    base = [{"name": "x", "shape": [1, 3]},
            {"name": "w", "shape": [2, 3], "data": np.arange(6, dtype=np.float32).reshape(2, 3)},
            {"name": "b", "shape": [2], "data": np.array([0.5, -0.5], np.float32)}]
    return base + [{"name": n, "shape": [1, 2]} for n in names]


def post_processed(tmp_path: Path) -> Path:
    """x -> FULLY_CONNECTED -> features -> CUSTOM(MyPostProc) -> decoded (the model's output)."""
    return write_model(tmp_path, "post.tflite", tensors=_tensors("features", "decoded"),
                       ops=[{"code": 0, "inputs": [0, 1, 2], "outputs": [3], **FC},
                            {"code": 1, "inputs": [3], "outputs": [4]}],
                       outputs=[4], opcodes=[_code(BO.FULLY_CONNECTED), (BO.CUSTOM, BO.CUSTOM, "MyPostProc")])


def custom_inside(tmp_path: Path) -> Path:
    """x -> CUSTOM(Inner) -> h -> FULLY_CONNECTED -> y: the custom op is part of the model, not after it."""
    tensors = [{"name": "x", "shape": [1, 3]}, {"name": "h", "shape": [1, 3]}] + _tensors("y")[1:]
    return write_model(tmp_path, "inside.tflite", tensors=tensors,
                       ops=[{"code": 1, "inputs": [0], "outputs": [1]},
                            {"code": 0, "inputs": [1, 2, 3], "outputs": [4], **FC}],
                       outputs=[4], opcodes=[_code(BO.FULLY_CONNECTED), (BO.CUSTOM, BO.CUSTOM, "Inner")])


def custom_in_a_branch(tmp_path: Path) -> Path:
    """x -> FC -> f (an output) -> CUSTOM(Branch) -> c -> RELU -> r (an output): a supported op follows."""
    return write_model(tmp_path, "branch.tflite", tensors=_tensors("f", "c", "r"),
                       ops=[{"code": 0, "inputs": [0, 1, 2], "outputs": [3], **FC},
                            {"code": 1, "inputs": [3], "outputs": [4]}, {"code": 2, "inputs": [4], "outputs": [5]}],
                       outputs=[5, 3], opcodes=[_code(BO.FULLY_CONNECTED), (BO.CUSTOM, BO.CUSTOM, "Branch"),
                                                _code(BO.RELU)])


def test_needed_ops_walks_back_from_the_targets():
    # 0: a -> b; 1: b -> c; 2: a -> d (a side branch); 3: c, d -> e
    io = [(["a"], ["b"]), (["b"], ["c"]), (["a"], ["d"]), (["c", "d", None], ["e"])]
    assert needed_ops(io, ["e"]) == {0, 1, 2, 3}
    assert needed_ops(io, ["c"]) == {0, 1}
    assert needed_ops(io, ["d", "b"]) == {0, 2}
    assert needed_ops(io, ["a"]) == set()


def test_trailing_custom_op_error_suggests_the_cut(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        read_model(post_processed(tmp_path))
    assert "CUSTOM(MyPostProc) at operator index 1" in e.value.message
    assert 'only post-process' in e.value.hint and '`outputs: ["features"]`' in e.value.hint


def test_custom_op_inside_the_model_gets_no_cut_suggestion(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        read_model(custom_inside(tmp_path))
    assert "outputs:" not in e.value.hint


def test_custom_op_in_a_branch_suggests_the_outputs_it_does_not_touch(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        read_model(custom_in_a_branch(tmp_path))
    assert 'outputs ["f"] do not depend on the unsupported op' in e.value.hint
    g = read_model(custom_in_a_branch(tmp_path), outputs=["f"])
    assert [op.type for op in g.ops] == ["fully_connected"] and g.outputs == ["f"]


def test_reader_skips_unsupported_ops_after_the_cut(tmp_path):
    g = read_model(post_processed(tmp_path), outputs=["features"])
    assert [op.type for op in g.ops] == ["fully_connected"]
    assert g.outputs == ["features"] and "decoded" not in g.tensors
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([0.5, -0.5], np.float32)
    np.testing.assert_allclose(run_graph(g, {"x": x})["features"], np.maximum(x @ w.T + b, 0), rtol=1e-6)


def test_unknown_output_name_suggests_close_names(tmp_path):
    with pytest.raises(ModelError, match=r"model.outputs names tensor 'featurs', which the model does not have; "
                                         r"did you mean 'features'"):
        read_model(post_processed(tmp_path), outputs=["featurs"])


def test_prune_graph_keeps_what_the_intermediate_needs_and_computes_the_same():
    g = read_model(OPS_FLOAT)
    mid = next(op for op in g.ops if op.type == "add").outputs[0]
    p = prune_graph(g, [mid])
    assert p.outputs == [mid] and p.ops[-1].type == "add"
    assert len(p.ops) < len(g.ops) and p.meta["pruned_ops"] == len(g.ops) - len(p.ops)
    assert all(name in g.tensors for name in p.tensors) and len(p.tensors) < len(g.tensors)
    x = np.random.default_rng(0).uniform(0, 1, size=(2, *g.tensors[g.inputs[0]].shape[1:])).astype(np.float32)
    full = run_graph(g, {g.inputs[0]: x}, keep_intermediates=True)
    np.testing.assert_array_equal(run_graph(p, {p.inputs[0]: x})[mid], full[mid])
    assert g.outputs != p.outputs, "prune_graph must not change its argument"


def test_prune_graph_refuses_a_constant():
    g = read_model(OPS_FLOAT)
    weight = g.ops[0].inputs[1]
    with pytest.raises(ModelError, match="is a constant"):
        prune_graph(g, [weight])


def _spec(folder: Path, outputs: str) -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(f"name: cut\nmodel:\n  path: model.tflite\n  outputs: {outputs}\ndata:\n  source: digits\n")
    return spec


def test_cli_unknown_output_is_one_line_exit_2(tmp_path, capsys):
    shutil.copy(post_processed(tmp_path), tmp_path / "model.tflite")
    code = main(["build", str(_spec(tmp_path, "[nope_tensor]")), "--until", "load",
                 "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "'nope_tensor'" in err and "`tinytrain inspect SPEC load`" in err
    assert len([ln for ln in err.splitlines() if "nope_tensor" in ln]) == 1


def test_cli_cut_loads_the_model_with_a_trailing_custom_op(tmp_path, capsys):
    shutil.copy(post_processed(tmp_path), tmp_path / "model.tflite")
    code = main(["build", str(_spec(tmp_path, "[features]")), "--until", "load",
                 "--cache-dir", str(tmp_path / "cache")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "cut at features (model.outputs)" in out.out + out.err
    graph_txt = (tmp_path / "build" / "cut" / "load" / "graph.txt").read_text()
    assert "MyPostProc" not in graph_txt and "fully_connected" in graph_txt


def test_spec_refuses_an_empty_outputs_list(tmp_path, capsys):
    shutil.copy(post_processed(tmp_path), tmp_path / "model.tflite")
    code = main(["build", str(_spec(tmp_path, "[]")), "--until", "load", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2 and "model.outputs" in err and "Traceback" not in err
