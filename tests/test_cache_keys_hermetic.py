"""A stage's cache key covers every tinytrain module it can run (issue 11, point 4).

The key's implementation part is computed from the imports (cache/imports.py). These tests edit a temporary copy of
the package module by module and check that exactly the stages whose code reaches the edited module get a new key,
check the computed closures against edges known from reading the code and against what Python really loads, and
check that `explain` names the edited module. Nothing is built: keys are computed directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tinytrain
from tinytrain.cache.imports import ModuleFile, import_closure
from tinytrain.cache.keys import action_key
from tinytrain.pipeline.preimage import impl_digests, stage_preimage
from tinytrain.pipeline.spec import load_spec
from tinytrain.pipeline.stage_graph import STAGES

PKG = Path(tinytrain.__file__).parent


def _module_name(rel: Path) -> str:
    parts = rel.with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("tinytrain", *parts))


@pytest.fixture
def pkg_copy(tmp_path, monkeypatch) -> dict[str, Path]:
    """The package's Python sources copied to tmp_path/tinytrain, and tinytrain.__file__ pointed there (the key
    reads sources from the package folder, never from the imported modules). Returns {module name: copied file}."""
    dst = tmp_path / "tinytrain"
    modules: dict[str, Path] = {}
    for src in sorted(PKG.rglob("*.py")):
        rel = src.relative_to(PKG)
        # Only the package's own sources: not the tests and benchmarks, nor a virtualenv (.venv), build output or
        # caches that may sit in the checkout.
        if rel.parts[0] in ("tests", "bench", "build") or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)
        modules[_module_name(rel)] = dst / rel
    monkeypatch.setattr(tinytrain, "__file__", str(dst / "__init__.py"))
    return modules


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "net.tflite").write_bytes(b"model")
    (tmp_path / "tinytrain.yaml").write_text("model: {path: net.tflite}\n")
    return load_spec(tmp_path / "tinytrain.yaml")


def _keys(spec) -> dict[str, str]:
    return {st.name: action_key(stage_preimage(st, spec, {}, "")) for st in STAGES}


def _closure(stage_name: str) -> set[str]:
    st = next(s for s in STAGES if s.name == stage_name)
    return {k for k in impl_digests(st) if not k.startswith("files:")}


def test_editing_a_module_changes_exactly_the_keys_of_the_stages_that_reach_it(pkg_copy, spec):
    closures = {st.name: _closure(st.name) for st in STAGES}
    for name, mods in closures.items():
        # Every module in a closure is a file of the (copied) package, and the stage's own module is one.
        assert mods <= set(pkg_copy), (name, mods - set(pkg_copy))
        assert next(s.impl for s in STAGES if s.name == name) in mods
    outside = set(pkg_copy) - set().union(*closures.values())
    assert outside, "some package module (the CLI, the cache store, ...) is in no stage's closure"
    before = _keys(spec)
    for module, path in sorted(pkg_copy.items()):
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit that changes no behaviour still changes the source\n")
        after = _keys(spec)
        changed = {s for s in before if after[s] != before[s]}
        assert changed == {s for s, mods in closures.items() if module in mods}, module
        path.write_bytes(original)
    assert _keys(spec) == before


def test_known_import_edges_are_in_the_closures(pkg_copy):
    from tinytrain.stages import codegen
    from tinytrain.stages.ops import conv_forward

    autodiff = _closure("autodiff")
    # autodiff reaches grad_ops through qas, and geometry through the executor.
    assert {"tinytrain.stages.quant.qas", "tinytrain.stages.golden.grad_ops", "tinytrain.stages.model.geometry"} <= autodiff
    # codegen shapes transposed convolutions with a function of the conv op module (reached as conv_forward.*).
    assert codegen.__dict__.get("transpose_conv_geometry") is None  # not a name imported into codegen
    assert conv_forward.transpose_conv_geometry.__module__ in _closure("codegen")
    # sparse-plan plans the graph autodiff would emit, as reorder would schedule it.
    assert {"tinytrain.stages.autodiff", "tinytrain.stages.reorder"} <= _closure("sparse-plan")
    # Packages whose __init__ runs on import are covered; modules no stage imports are not.
    assert {"tinytrain", "tinytrain.stages"} <= _closure("load")
    assert "tinytrain.pipeline.cli" not in set().union(*(_closure(s.name) for s in STAGES))


_LOADED = """
import importlib, json, sys
out = {}
for stage, module in json.loads(sys.argv[1]).items():
    for name in [m for m in sys.modules if m == "tinytrain" or m.startswith("tinytrain.")]:
        del sys.modules[name]
    importlib.import_module(module)
    out[stage] = sorted(m for m in sys.modules if m == "tinytrain" or m.startswith("tinytrain."))
print(json.dumps(out))
"""


def test_the_closure_covers_every_module_python_loads_when_importing_the_stage():
    """An outside reference for the static analysis: what the interpreter itself imports (module-level imports
    only, so the computed closure, which also follows imports inside functions, must contain it)."""
    stages = {st.name: st.impl for st in STAGES if st.impl}
    proc = subprocess.run([sys.executable, "-c", _LOADED, json.dumps(stages)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(PKG.parent)}, cwd=PKG.parent)
    loaded = json.loads(proc.stdout)
    for name in stages:
        assert set(loaded[name]) <= _closure(name), (name, set(loaded[name]) - _closure(name))


def test_import_forms_are_all_followed(tmp_path):
    """Absolute, from-import of a submodule or of a name, relative (from a module and from a package __init__),
    nested in a function, and dotted imports that run their packages' __init__ files."""
    root = tmp_path / "pk"
    files = {
        "__init__.py": "",
        "a.py": "import os\nfrom pk import b\nfrom .c import thing\n\ndef f():\n    from pk.sub import d\n",
        "b.py": "import pk.sub.e\n",
        "c.py": "thing = 1\n",
        "sub/__init__.py": "from . import f\nfrom .. import g\n",
        "sub/d.py": "",
        "sub/e.py": "",
        "sub/f.py": "",
        "g.py": "from .c import *\n",
        "unrelated.py": "import pk.a\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = import_closure(ModuleFile("pk.a", root / "a.py", False), root, "pk")
    assert set(found) == {"pk", "pk.a", "pk.b", "pk.c", "pk.sub", "pk.sub.d", "pk.sub.e", "pk.sub.f", "pk.g"}
    assert found["pk.sub"] == root / "sub" / "__init__.py"
    # A module outside the package is followed into the package, never into other top-level packages.
    (tmp_path / "outside.py").write_text("import json\nimport pk.c\n")
    found = import_closure(ModuleFile("outside", tmp_path / "outside.py", False), root, "pk")
    assert set(found) == {"outside", "pk", "pk.c"}


def test_explain_names_the_edited_module_and_the_stage_reruns(fake_project, pkg_copy):
    """A stage that imports geometry: after an edit to geometry.py the stage is not restored, and explain says why."""
    from tinytrain.pipeline.console import BuildLog
    from tinytrain.pipeline.planner import explain, plan
    from tinytrain.pipeline.runner import build
    from tinytrain.pipeline.workspace import open_cache

    stage_a = fake_project.module_file("a")
    stage_a.write_text("from tinytrain.stages.model import geometry  # noqa: F401\n" + stage_a.read_text())
    spec = load_spec(fake_project.spec_path)
    cache = open_cache(spec)
    r = build(spec, cache, BuildLog(quiet=True), stages=fake_project.table(), until="c")
    assert r.error is None and fake_project.calls() == ["a", "b", "c"]

    geometry = pkg_copy["tinytrain.stages.model.geometry"]
    geometry.write_text(geometry.read_text() + "\n# edited\n")
    items = {i.stage.name: i for i in plan(spec, cache, fake_project.table())}
    assert items["a"].state == "will run" and items["a"].reason == "source changed (tinytrain.stages.model.geometry)"
    text = "\n".join(explain(spec, cache, "a", fake_project.table()))
    assert "impl.tinytrain.stages.model.geometry" in text and "source changed (tinytrain.stages.model.geometry)" in text
    # Editing a module that stage a does not reach keeps it cached.
    geometry.write_text(geometry.read_text().removesuffix("\n# edited\n"))
    cli = pkg_copy["tinytrain.pipeline.cli"]
    cli.write_text(cli.read_text() + "\n# edited\n")
    items = {i.stage.name: i for i in plan(spec, cache, fake_project.table())}
    assert items["a"].state == "cached"


def _cross_compile_keys(tmp_path, monkeypatch, probe_answer: str) -> dict[str, str]:
    """cross-compile's key per board with the host ISA probe answering `probe_answer` (other tools answer as here)."""
    from tinytrain.pipeline import preimage
    from tinytrain.pipeline.stage_graph import stage
    from tinytrain.stages.device.boards import BOARD_NAMES, HOST_ISA_PROBE

    real = preimage.tool_identity
    monkeypatch.setattr(preimage, "tool_identity",
                        lambda cmd: probe_answer if tuple(cmd) == HOST_ISA_PROBE else real(cmd))
    (tmp_path / "net.tflite").write_bytes(b"model")
    keys = {}
    for board in BOARD_NAMES:
        (tmp_path / "tinytrain.yaml").write_text(f"model: {{path: net.tflite}}\ntarget: {{board: {board}}}\n")
        keys[board] = action_key(stage_preimage(stage("cross-compile"), load_spec(tmp_path / "tinytrain.yaml"), {}, ""))
    return keys


def test_the_host_isa_probe_keys_the_host_board_only(tmp_path, monkeypatch):
    """A build machine whose CPU makes the probe answer otherwise rebuilds the host board's program (its -march
    changes), and keeps every emulated board's firmware cached (their flags do not depend on this machine)."""
    from tinytrain.stages.device.boards import BOARDS

    plain = _cross_compile_keys(tmp_path, monkeypatch, "default")
    avx2 = _cross_compile_keys(tmp_path, monkeypatch, "-march=x86-64-v3")
    changed = {b for b in plain if plain[b] != avx2[b]}
    assert changed == {b.name for b in BOARDS.values() if b.host} == {"host"}
    assert len(set(plain.values())) == len(plain)    # and the boards' keys differ from each other


def test_a_tool_enters_the_key_only_for_the_config_values_it_names(tmp_path):
    import sys

    from tinytrain.pipeline.stage_graph import StageDef, Tool

    (tmp_path / "net.tflite").write_bytes(b"model")
    python = (sys.executable, "--version")
    st = StageDef("x", ("target.board",), (), None, tools=(Tool(python, ("target.board", ("m4-256k",))),))
    for board, expect in (("m4-256k", {" ".join(python): f"Python {sys.version.split()[0]}"}), ("host", {})):
        (tmp_path / "tinytrain.yaml").write_text(f"model: {{path: net.tflite}}\ntarget: {{board: {board}}}\n")
        assert stage_preimage(st, load_spec(tmp_path / "tinytrain.yaml"), {}, "")["tools"] == expect
    # A condition on a field the stage does not read (so not in its key) is refused when the table is made.
    with pytest.raises(ValueError, match="not in the stage's config"):
        StageDef("y", ("train.epochs",), (), None, tools=(Tool(python, ("target.board", ("host",))),))
