"""The C kernel library's layout (kernels_c/README.md), derived from the op registry so that it cannot drift:
every registered forward or backward op whose codegen emits a kernel call has its file kernels_c/ops/tt_<op>.c
and a C test — lines in the C test driver's dispatch table (tests/c/tt_test_driver.c, KERNELS), or conformance
cases (tests/op_cases/: tests/test_op_conformance.py compiles the C codegen writes for the op and its emitted
backward ops under ASan/UBSan against numpy, so a new op needs no driver lines) — and every driver line runs
kernels of the op file it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tinytrain.stages import ops
from tinytrain.stages.codegen import _Gen

import op_cases

ROOT = Path(__file__).resolve().parents[1]
OPS_DIR = ROOT / "kernels_c" / "ops"
DRIVER = ROOT / "tests" / "c" / "tt_test_driver.c"
# Driver lines of support code that is no op (kernels_c/*.c): padding geometry, losses, optimizers, QAS updates.
SUPPORT = {"geometry", "loss", "optimizer", "qas"}
# The kinds that own a file in kernels_c/ops/; losses, updates and the aux ops are the support code's.
OP_KINDS = ("forward", "backward")


def _emits_c(d: ops.OpDef) -> bool:
    return d.c is not None or hasattr(_Gen, "op_" + d.name)


def home(d: ops.OpDef) -> str:
    """The op whose kernels_c/ops/tt_<op>.c holds d's kernels: a backward op's forward op (`of`); an op without a
    file of its own that shares its C emitter with other ops (relu / relu6, split_even / split_v) runs their one
    set of kernels, in the first such op's file."""
    if d.of:
        return d.of
    if not (OPS_DIR / f"tt_{d.name}.c").is_file() and d.c is not None:
        return next(e.name for e in ops.REGISTRY.values() if e.c is d.c)
    return d.name


COVERED = [d for d in ops.REGISTRY.values() if d.kind in OP_KINDS and _emits_c(d)]


def driver_table() -> list[tuple[str, str, str]]:
    """(op, case name, driver function) per line of the driver's KERNELS table."""
    text = DRIVER.read_text()
    table = text[text.index("static const tt_driver_op KERNELS[]"):]
    table = table[:table.index("};")]
    return re.findall(r'\{"(\w+)", "(\w+)", (k_\w+)\}', table)


def kernel_definitions() -> dict[str, str]:
    """Exported kernel function -> the op of the kernels_c/ops/ file that defines it."""
    out: dict[str, str] = {}
    for path in sorted(OPS_DIR.glob("tt_*.c")):
        # a definition: the signature followed by its body (the interface block's prototypes end in ';')
        for name in re.findall(r"^(?!static)[a-z_0-9]+\s+\*?(tt_\w+)\([^;{]*\)\s*\{", path.read_text(), re.M):
            assert name not in out, f"{name} is defined in two op files"
            out[name] = path.stem[len("tt_"):]
    return out


def test_the_registry_has_ops_with_c_code():
    assert len(COVERED) > 30 and {"conv2d", "conv2d_grad_input", "act_grad"} <= {d.name for d in COVERED}


@pytest.mark.parametrize("d", COVERED, ids=lambda d: d.name)
def test_every_op_with_c_code_has_its_kernel_file_and_a_c_test(d):
    op = home(d)
    assert (OPS_DIR / f"tt_{op}.c").is_file(), f"{d.name}: its kernels belong in kernels_c/ops/tt_{op}.c"
    assert op in {o for o, _, _ in driver_table()} or op in op_cases.load(), \
        f"{d.name}: no line for {op!r} in the driver's KERNELS table and no conformance cases in tests/op_cases/"


def test_every_kernel_file_is_a_registered_op():
    for path in OPS_DIR.glob("*.c"):
        name = path.stem[len("tt_"):]
        assert path.stem.startswith("tt_") and name in ops.REGISTRY, f"{path.name} names no registered op"
    assert not list(OPS_DIR.glob("*.h")), "op files share code through kernels_c/*.h, not headers in ops/"
    # export ships kernels_c/ and kernels_c/ops/ flat in one src/ folder
    clash = {p.name for p in OPS_DIR.glob("*.c")} & {p.name for p in OPS_DIR.parent.glob("*.[ch]")}
    assert not clash, f"{clash} in both kernels_c/ and kernels_c/ops/"


def test_driver_lines_run_the_kernels_of_the_op_they_name():
    text = DRIVER.read_text()
    defs = kernel_definitions()
    table = driver_table()
    names = [n for _, n, _ in table]
    assert len(names) == len(set(names)), "a case name dispatches twice"
    assert "strcmp(op, KERNELS[k].name)" in text and "IS(" not in text, "dispatch is the table, no string chain"
    for op, name, fn in table:
        assert op in ops.REGISTRY or op in SUPPORT, f"{name}: {op!r} is neither an op nor a support concern"
        m = re.search(r"static void " + fn + r"\(void\)[^{]*\{(.*?)\n\}", text, re.S)
        assert m, f"{name}: driver function {fn} not found"
        called = {t for t in re.findall(r"\btt_\w+", m.group(1)) if t in defs}
        if op in SUPPORT:
            assert not called, f"{name}: a support line runs op kernels {called}"
        else:
            assert called and {defs[t] for t in called} == {op}, f"{name} ({op}) runs {called}"


def test_the_cross_compile_key_covers_every_kernel_source_it_builds(tmp_path, monkeypatch):
    """Each folder cross-compile builds kernels from is a source pattern of its cache key, and editing an op file
    changes the key's digest of that pattern."""
    import shutil

    import tinytrain
    from tinytrain.pipeline.preimage import package_files_digest
    from tinytrain.pipeline.stage_graph import stage
    from tinytrain.stages.cross_compile import KERNEL_SOURCE_GLOBS

    patterns = stage("cross-compile").source_files
    assert all(f"kernels_c/{g}" in patterns for g in KERNEL_SOURCE_GLOBS)
    fake = tmp_path / "tinytrain"
    shutil.copytree(OPS_DIR, fake / "kernels_c" / "ops")
    (fake / "__init__.py").write_text("")
    monkeypatch.setattr(tinytrain, "__file__", str(fake / "__init__.py"))
    before = package_files_digest("kernels_c/ops/*.c")
    conv = fake / "kernels_c" / "ops" / "tt_conv2d.c"
    conv.write_text(conv.read_text() + "\n/* edited */\n")
    assert package_files_digest("kernels_c/ops/*.c") != before


# ---- the op prototypes: each op file's TT_INTERFACE block, gathered into tt_ops.h (stages/c_emit/ops_header.py)

# Headers that still declare some op files' kernels: tt_train_ops.h and tt_mask.h, the training program's extras
# (in-place depthwise, the int8 clamp and mask gradients), which their own C tests compile without the rest of the
# library. tt_kernels.h declares no op file's kernel (it is listed so that a stray prototype there is caught).
LEGACY_HEADERS = ("tt_kernels.h", "tt_train_ops.h", "tt_mask.h")


def _declared(text: str) -> set[str]:
    return set(re.findall(r"^[a-z_0-9]+\s+\*?(tt_\w+)\([^;{]*\);", text, re.M | re.S))


def test_every_op_file_declares_its_own_kernels():
    """A kernel exported by an op file is declared in that file's interface block and nowhere else, so adding an op
    edits no header; and the blocks hold nothing the files do not define."""
    from tinytrain.stages.c_emit import ops_header

    header = set().union(*(_declared((ROOT / "kernels_c" / h).read_text()) for h in LEGACY_HEADERS))
    defs = kernel_definitions()
    for path in sorted(OPS_DIR.glob("tt_*.c")):
        op = path.stem[len("tt_"):]
        mine = {n for n, o in defs.items() if o == op}
        block = ops_header.interface_block(path)
        if block is None:
            assert mine <= header, f"{path.name}: {mine - header} declared nowhere (its TT_INTERFACE block)"
            continue
        assert _declared(block) == mine, f"{path.name}: block declares {_declared(block)}, file defines {mine}"
        assert not (mine & header), f"{path.name}: {mine & header} also declared in {LEGACY_HEADERS}"


def test_tt_ops_h_is_the_blocks_in_file_order_and_deterministic(tmp_path):
    from tinytrain.stages.c_emit import ops_header

    text = ops_header.render()
    assert text == ops_header.render() and str(ROOT) not in text
    names = re.findall(r"^/\* ---- ops/(tt_\w+\.c) \*/$", text, re.M)
    assert names == sorted(names) and len(names) == sum(ops_header.interface_block(p) is not None
                                                        for p in OPS_DIR.glob("tt_*.c"))
    assert ops_header.write(tmp_path).read_text() == text
    bad = tmp_path / "ops"
    bad.mkdir()
    (bad / "tt_x.c").write_text(f"{ops_header.BEGIN}\n#define X 1\n{ops_header.END}\n")
    with pytest.raises(ops_header.InterfaceError):
        ops_header.render(bad)
    (bad / "tt_x.c").write_text(f"{ops_header.BEGIN}\nvoid tt_x(void);\n")
    with pytest.raises(ops_header.InterfaceError):
        ops_header.render(bad)


def test_cross_compile_key_covers_the_header_generator():
    """The generator is in cross-compile's import closure (its key's impl digest) and its inputs, the op files,
    are a source pattern of the key."""
    from tinytrain.cache.keys import module_closure
    from tinytrain.pipeline.stage_graph import stage

    st = stage("cross-compile")
    assert "tinytrain.stages.c_emit.ops_header" in module_closure(st.impl)
    assert "kernels_c/ops/*.c" in st.source_files
