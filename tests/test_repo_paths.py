"""Commands in the docs and the benchmark scripts use the interpreter a fresh set-up creates (`.ci/setup` makes
`.venv/`, as the README says), not a path from one developer's machine."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_interpreter_paths_are_the_readmes_venv():
    files = [REPO / "README.md", REPO / "tinytrain.yaml.example", *sorted((REPO / "bench").glob("*"))]
    found = {}
    for f in files:
        if f.is_file() and f.suffix in (".md", ".py", ".yaml", ".example"):
            for m in re.finditer(r"\S*/bin/python3?\b", f.read_text()):
                found.setdefault(m.group(0), []).append(f.name)
    assert ".venv/bin/python" in found and ".venv/" in (REPO / ".ci" / "setup").read_text()
    assert set(found) == {".venv/bin/python"}, found
