"""Which tinytrain modules a module reaches through its imports, found by reading the source (DESIGN §4).

A stage's implementation version must cover every module whose code can change its result. A hand-kept list
drifts (a new `from tinytrain.stages.x import y`, or one inside a function, is easy to miss), and a missed module
means an edit to it restores a stale artifact. So the list is computed: the static imports of the stage's module,
followed transitively, restricted to the tinytrain package (third-party libraries are versioned by the
environment, not by this digest).

Static analysis, not `sys.modules` after an import: it needs no import (so no side effects and no dependency on
what happens to be loaded already), and it sees imports inside functions that a given run may not execute.
It covers `import tinytrain.x`, `from tinytrain.x import y` (y a submodule or a name), relative imports, at any
depth in the file. It over-approximates on purpose (an import under `if TYPE_CHECKING:` counts): a key that
changes once too often costs a rebuild, one that fails to change restores a wrong artifact. Importing a module
runs its packages' `__init__` files, so those are in the closure too.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModuleFile:
    name: str
    path: Path
    is_package: bool


@functools.lru_cache(maxsize=None)
def package_module_file(root: Path, package: str, name: str) -> ModuleFile | None:
    """The source file of module `name` inside the package `package` whose folder is `root`; None if absent.
    Memoised: which modules exist does not change while a process runs (their text may, and is read each time)."""
    if name != package and not name.startswith(package + "."):
        return None
    parts = name.split(".")[1:]
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return ModuleFile(name, base / "__init__.py", True)
    if parts and base.with_suffix(".py").is_file():
        return ModuleFile(name, base.with_suffix(".py"), False)
    return None


def import_closure(start: ModuleFile, root: Path, package: str) -> dict[str, Path]:
    """`start` and every module of `package` (folder `root`) it reaches by imports, as {module name: file}.

    `start` may live outside the package (a test's stage module); only package modules are followed from it."""
    found: dict[str, Path] = {start.name: start.path}
    todo = [start]
    while todo:
        mod = todo.pop()
        for name in sorted(_imported(mod.name, mod.is_package, mod.path.read_bytes())):
            # Importing a.b.c first runs a/__init__ and a/b/__init__.
            for prefix in _prefixes(name):
                if prefix in found:
                    continue
                target = package_module_file(root, package, prefix)
                if target is not None:
                    found[prefix] = target.path
                    todo.append(target)
    return found


def third_party_imports(closure: dict[str, Path], package: str) -> frozenset[str]:
    """Top-level names of the non-standard-library modules that the modules of `closure` import (numpy,
    matplotlib, ...): a new version of one of them can change a stage's bytes, so their versions belong in the key."""
    names: set[str] = set()
    for name, path in closure.items():
        for imported in _imported(name, path.name == "__init__.py", path.read_bytes()):
            top = imported.split(".")[0]
            if top and top != package and top not in sys.stdlib_module_names and top != "__future__":
                names.add(top)
    return frozenset(names)


def _statements(tree: ast.AST):
    """Every statement of a module, nested ones included (function and class bodies, if/try/with/for/match
    branches). An import is a statement, so this finds all `ast.walk` finds while skipping the expressions, which
    are most of a module's nodes (issue 14: the scan was a second of every build)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, name, ()):
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    yield child
                    todo.append(child)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@functools.lru_cache(maxsize=None)
def _imported(module: str, is_package: bool, source: bytes) -> frozenset[str]:
    """Absolute names a module's source may import: for `from m import y`, both m and m.y (y may be a
    submodule; a name that is not one resolves to no file and drops out). Memoised on the source text itself,
    so a `status` or `build` parses each file once per process and an edited file is parsed again."""
    tree = ast.parse(source, filename=module)
    # The package a relative import is relative to: the module itself for an __init__, else its parent.
    here = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(here):
                    continue  # beyond the top package: an ImportError at run time, nothing to follow
                base_parts = here[:len(here) - (node.level - 1)]
                if node.module:
                    base_parts = [*base_parts, *node.module.split(".")]
                base = ".".join(base_parts)
            else:
                base = node.module or ""
            if not base:
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return frozenset(names)
