"""The op registry (stages/ops/): one place for what the pipeline knows about an op.

Checks that every consumer's table agrees with the registry (reader, writer, executor, codegen, training executor),
and that no list of op names is written outside stages/ops/: a scan of stages/ for collection literals holding two
or more registered op names, and for op-name string literals per module, against allow-lists that may only shrink
(each entry is exact, so fixing a place fails the test until its entry is lowered or removed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tflite

from tinytrain.stages import codegen, ops
from tinytrain.stages.golden import forward as executor
from tinytrain.stages.model import tflite_reader
from tinytrain.stages.model import tflite_writer
from tinytrain.stages.model.ir import ACTIVATIONS

STAGES = Path(__file__).resolve().parents[1] / "stages"

# Collection literals (tuple / list / set, dict keys) of >= 2 registered op names still written outside
# stages/ops/: per module, how many, and why each stays (the reason is shown when the test fails). None left: a
# fact about several ops is a trait of each (OpDef.bn_affine, OpDef.fast_float, ...).
LISTS_LEFT: dict[str, tuple[int, str]] = {}

# String literals equal to a registered op name (activation names excluded: they are also `act` values; stage
# names used as stage names, see _stage_name_use), per module outside stages/ops/, and why each stays. None left:
# the ops a stage adds or tests by itself (gradient plumbing, conversions) are spelled through their definitions
# (ops.GRAD_ACCUMULATE.name).
LITERALS_LEFT: dict[str, tuple[int, str]] = {}

# Modules whose strings are not IR op names even when they spell one: cycles.py classes Arm mnemonics ("add", "mul"),
# stack_bound.py reads them from the disassembly ("push", "sub sp").
NOT_IR_MODULES = {"device/cycles.py", "device/stack_bound.py"}


def _op_names() -> set[str]:
    # act names ("relu", "relu6", "tanh") are also fused-activation values: a literal of them is not an op name
    return set(ops.REGISTRY) - set(ACTIVATIONS)


def _modules():
    for p in sorted(STAGES.rglob("*.py")):
        rel = p.relative_to(STAGES)
        if rel.parts[0] == "ops" or str(rel) in NOT_IR_MODULES:
            continue
        yield str(rel), ast.parse(p.read_text())


# Stage names that are also op names ("quantize"): a literal naming a stage where a stage is meant is no op name.
_STAGE_CALLS = {"input_dir", "refuse_training", "get"}   # ctx.input_dir(stage), state.refuse_training(g, stage),
#                                                           ctx.config.get(stage's config slice)


def _stage_name_use(node: ast.Constant, parent: ast.AST, grand: ast.AST | None) -> bool:
    from tinytrain.pipeline.stage_graph import STAGE_NAMES

    if node.value not in STAGE_NAMES:
        return False
    if isinstance(parent, ast.Call) and isinstance(parent.func, (ast.Attribute, ast.Name)):
        name = parent.func.attr if isinstance(parent.func, ast.Attribute) else parent.func.id
        return name in _STAGE_CALLS
    if isinstance(parent, ast.keyword):
        return parent.arg == "where"          # an error's `where`: the stage that refuses
    # for stage in ("quantize", "load"): the stages whose graph to read
    return (isinstance(parent, ast.Tuple) and isinstance(grand, ast.For) and isinstance(grand.target, ast.Name)
            and grand.target.id == "stage")


def _scan() -> tuple[dict[str, int], dict[str, int]]:
    names = _op_names()
    lists: dict[str, int] = {}
    literals: dict[str, int] = {}
    for rel, tree in _modules():
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            elems = None
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                elems = node.elts
            elif isinstance(node, ast.Dict):
                elems = [k for k in node.keys if k is not None]
            if elems is not None:
                hits = [e for e in elems if isinstance(e, ast.Constant) and e.value in names
                        and not _stage_name_use(e, node, parents.get(node))]
                if len(hits) >= 2:
                    lists[rel] = lists.get(rel, 0) + 1
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                parent = parents.get(node)
                if not _stage_name_use(node, parent, parents.get(parent)):
                    literals[rel] = literals.get(rel, 0) + 1
    return lists, literals


def test_no_op_name_list_outside_the_registry():
    lists, _ = _scan()
    want = {k: n for k, (n, _) in LISTS_LEFT.items()}
    why = "\n".join(f"  {k}: {r}" for k, (_, r) in LISTS_LEFT.items())
    assert lists == want, ("a list of op names outside stages/ops/ (derive it from the registry), or a fixed one "
                           f"whose LISTS_LEFT entry must shrink: {lists}\nthe lists that stay, and why:\n{why}")


def test_op_name_literals_only_shrink():
    _, literals = _scan()
    want = {k: n for k, (n, _) in LITERALS_LEFT.items() if n}
    why = "\n".join(f"  {k} ({n}): {r}" for k, (n, r) in LITERALS_LEFT.items())
    assert literals == want, ("op-name string literals per module changed: a new one belongs in the op's module "
                              f"(stages/ops/); a removed one lowers LITERALS_LEFT: {literals}\n"
                              f"the literals that stay, and why:\n{why}")


def _owners() -> dict[str, str]:
    return {d.name: mod.__name__.rsplit(".", 1)[1] + ".py" for mod in ops._FAMILIES for d in mod.OPS}


def test_each_op_name_is_written_in_its_own_module_only():
    """No op name in more than one place: inside stages/ops/ too, an op's name is a string only in the module that
    registers it; every other module (another op module, backward.py, a stage) refers to its definition."""
    owner = _owners()
    names = _op_names()
    stray = []
    for p in sorted((STAGES / "ops").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                    and owner[node.value] != p.name:
                stray.append(f"ops/{p.name}:{node.lineno} {node.value!r} (registered in ops/{owner[node.value]})")
    assert stray == []


def test_every_literal_left_says_why():
    for table in (LISTS_LEFT, LITERALS_LEFT):
        for module, (n, reason) in table.items():
            assert n > 0 and len(reason) > 30, f"{module}: a count and the reason it stays"


def test_registry_is_consistent():
    for name, d in ops.REGISTRY.items():
        if d.kind == "forward":
            assert d.tflite, f"forward op {name} has no .tflite spelling"
        else:   # only a forward op is written to a file: a version rule elsewhere is misplaced
            assert not d.tflite and not d.layer and not d.differentiable and d.version is None, name
        if d.of is not None:
            assert ops.REGISTRY[d.of].differentiable, f"{name} differentiates {d.of}, which is not differentiable"
        if d.layer:
            assert d.kind == "forward"
    assert set(ops.UPDATE_OPS) <= set(ops.EAGER_OPS)
    for kind in ("sgd", "momentum", "adam", "rmsprop"):
        assert ops.update_op(kind, qas=False) in ops.FLOAT_UPDATE_OPS
        assert ops.update_op(kind, qas=True) in ops.QAS_UPDATE_OPS
    with pytest.raises(KeyError):
        ops.update_op("lion", qas=False)


def test_every_consumer_covers_the_registry():
    forward = set(ops.FORWARD_OPS)
    assert set(executor.supported_ops()) == forward
    assert set(tflite_writer.SUPPORTED_OPS) == forward
    assert {op for op, _, _ in tflite_reader._HANDLERS.values()} == forward
    for d in ops.REGISTRY.values():
        for b in d.tflite:
            if not b.custom:
                assert hasattr(tflite.BuiltinOperator, b.code), f"{d.name}: no BuiltinOperator {b.code}"
    # codegen has C for every op a training graph can hold (the op module's emitter, or codegen's own)
    missing = [n for n, d in ops.REGISTRY.items() if d.c is None and not hasattr(codegen._Gen, "op_" + n)]
    assert missing == []


def test_catalogue_lists_every_forward_op():
    text = ops.catalogue("forward")
    for name in ops.FORWARD_OPS:
        assert f"  {name}:" in text


def test_new_ops_bring_their_backward_and_c():
    """The forward kernels, the backward emission and the C of every op are its op module's: a new op cannot add a
    branch to the executor, autodiff, plan_memory, the training executor or codegen."""
    own_backward = {n for n in ops.DIFFERENTIABLE if ops.REGISTRY[n].backward is None}
    assert own_backward == set()
    # every op a training graph adds (backward, loss, mask, accumulation, update) has its numpy kernel in its module
    own_run = {n for n, d in ops.REGISTRY.items() if d.kind != "forward" and d.run is None}
    assert own_run == set()
    own_c = {n for n, d in ops.REGISTRY.items() if d.c is None}
    assert own_c == set()
    # every forward op brings its numpy kernel (float and int8) and the C of its call: the executor and codegen
    # hold no forward op of their own
    assert [n for n in ops.FORWARD_OPS if ops.REGISTRY[n].forward is None or ops.REGISTRY[n].c is None] == []
    assert not [m for m in vars(codegen._Gen) if m.startswith("op_") and m[3:] in ops.FORWARD_OPS]


def test_codegen_and_the_training_executor_only_dispatch_training_ops():
    """No training op keeps a method of its own in codegen or a branch in the training executor."""
    from tinytrain.stages.golden import train_step as train_executor

    training = {n for n, d in ops.REGISTRY.items() if d.kind != "forward"}
    assert {n for n in training if hasattr(codegen._Gen, "op_" + n)} == set()
    src = Path(train_executor.__file__).read_text()
    assert [n for n in training if f'"{n}"' in src] == []


def test_autodiff_and_the_memory_model_run_one_backward_emission():
    """Both BackwardBuilders (autodiff's graph, plan_memory's abstract program) implement the whole interface, and
    neither holds an op's backward of its own: every differentiable op's emission is its OpDef.backward."""
    from tinytrain.stages import autodiff
    from tinytrain.stages.planning import abstract_program
    from tinytrain.stages.planning import memory_model as plan_memory
    from tinytrain.stages.ops.backward import BackwardBuilder

    methods = {n for n, v in vars(BackwardBuilder).items() if callable(v) and not n.startswith("_")}
    assert {"share", "real", "emit", "param_grad", "real_slice"} <= methods
    for cls in (autodiff._GraphBackward, abstract_program.StepBuilder):
        assert {n for n in methods if not callable(getattr(cls, n, None))} == set(), cls.__name__
    emitted = {n for n, d in ops.REGISTRY.items() if d.of is not None} | {"act_grad", "int8_clamp_grad", "bias_grad"}
    for mod in (autodiff, plan_memory, abstract_program):
        tree = ast.parse(Path(mod.__file__).read_text())
        hits = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in emitted}
        assert hits == set(), (mod.__name__, hits)
        # the backward's dequantized copies and the summing of gradient shares are backward.py's (Dequantizer,
        # gather), not written again in either builder
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert names & {"DEQUANTIZE", "DEQUANTIZE_SLICE", "GRAD_ACCUMULATE"} == set(), mod.__name__
