"""Shared test set-up.

- No test may read or fill the user's real tinytrain cache.
- `fake_project`: a spec plus a table of tiny stage modules that log every call to a file, for
  engine tests that must tell "restored from the cache" from "ran" (also across processes).
- The C compilers (`cc`, `gcc`, `arm-none-eabi-gcc`) are memoised per test run (tests/cc_memo.sh): hundreds of
  tests build programs from the same kernel library with the same flags, and each unit is compiled once per run.
  TINYTRAIN_TEST_NO_CC_MEMO=1 turns this off.
"""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tinytrain.pipeline.stage_graph import StageDef


MEMOISED_COMPILERS = ("cc", "gcc", "arm-none-eabi-gcc")  # the names stages/cross_compile.py and the tests run


@pytest.fixture(scope="session", autouse=True)
def _memoised_compilers(tmp_path_factory):
    """Put tests/cc_memo.sh first on PATH under each compiler's name, for this process and its children. The
    store is shared by the xdist workers of one run (a fresh run starts empty)."""
    if os.environ.get("TINYTRAIN_TEST_NO_CC_MEMO") == "1":
        yield
        return
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "cc-memo"
    store.mkdir(exist_ok=True)
    bin_dir = base / "cc-memo-bin"
    bin_dir.mkdir(exist_ok=True)
    template = (Path(__file__).resolve().parent / "cc_memo.sh").read_text()
    for name in MEMOISED_COMPILERS:
        real = shutil.which(name)
        if real is None:
            continue  # an absent compiler stays absent (tests skip or expect the error)
        front = bin_dir / name
        front.write_text(template.replace("@REAL@", shlex.quote(real)).replace("@STORE@", shlex.quote(str(store))))
        front.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        yield


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTRAIN_CACHE_DIR", str(tmp_path / "tinytrain-cache"))
    monkeypatch.delenv("TINYTRAIN_DEBUG", raising=False)


_HEADER = """\
import json, time
from pathlib import Path
from tinytrain.pipeline.contract import StageResult
from tinytrain.pipeline.errors import UserError
CALLS = Path({calls!r})
MARKER = Path({marker!r})

def run(ctx):
    with open(CALLS, "a") as f:
        f.write({name!r} + "\\n")
"""

_BODIES = {
    "a": """
    data = ctx.config["model"].path.read_bytes()
    (ctx.out_dir / "a.txt").write_bytes(data.upper())
    return StageResult(f"{len(data)} bytes", {"bytes": len(data)})
""",
    "b": """
    text = ctx.input("a/a.txt").read_text()
    (ctx.out_dir / "b.txt").write_text(text + str(ctx.config["quantize"].num_samples))
    (ctx.out_dir / "sub").mkdir()
    (ctx.out_dir / "sub" / "note.json").write_text(json.dumps({"chars": len(text)}))
    return StageResult("b done", {"chars": len(text)})
""",
    "c": """
    doc = {"lr": ctx.config["train.learning_rate"], "b": ctx.input("b/b.txt").read_text()}
    (ctx.out_dir / "c.json").write_text(json.dumps(doc))
    return StageResult("c done")
""",
    "boom": """
    (ctx.out_dir / "partial.txt").write_text("half")
    raise RuntimeError("boom")
""",
    "usererr": """
    raise UserError("the data is wrong")
""",
    "diskfull": """
    import errno
    (ctx.out_dir / "partial.txt").write_text("half")
    raise OSError(errno.ENOSPC, "No space left on device", str(ctx.out_dir / "big.bin"))
""",
    "sleeper": """
    (ctx.out_dir / "partial.txt").write_text("half")
    MARKER.write_text("started")
    time.sleep(float(ctx.config["quantize"].num_samples))
    (ctx.out_dir / "b.txt").write_text(ctx.input("a/a.txt").read_text() + str(ctx.config["quantize"].num_samples))
    return StageResult("slept")
""",
}

DEFAULT_SPEC = {
    "model": {"path": "net.tflite"},
    "quantize": {"num_samples": 10},
    "train": {"learning_rate": 0.01},
    "target": {"board": "host"},
    "build": {"out_dir": "out"},
}


@dataclass
class FakeProject:
    root: Path
    spec_path: Path
    calls_file: Path
    marker: Path
    prefix: str

    def module(self, kind: str) -> str:
        return f"{self.prefix}_{kind}"

    def module_file(self, kind: str) -> Path:
        return self.root / "stages" / f"{self.module(kind)}.py"

    def table(self, b: str = "b") -> tuple[StageDef, ...]:
        """a -> b -> c -> d(not implemented); `b` may be swapped for boom / usererr / diskfull / sleeper."""
        return (
            StageDef("a", ("model",), (), self.module("a")),
            StageDef("b", ("quantize",), ("a",), self.module(b)),
            StageDef("c", ("train.learning_rate",), ("b",), self.module("c")),
            StageDef("d", ("target",), ("c",), None),
        )

    def calls(self) -> list[str]:
        return self.calls_file.read_text().split() if self.calls_file.exists() else []

    def reset_calls(self) -> None:
        self.calls_file.unlink(missing_ok=True)

    def write_spec(self, **sections) -> Path:
        doc = copy.deepcopy(DEFAULT_SPEC)
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key].update(value)
            else:
                doc[key] = value
        self.spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return self.spec_path

    @property
    def out(self) -> Path:
        return self.root / "out" / "tinytrain"

    def driver(self, b: str = "b") -> Path:
        """A script that runs the CLI with this project's stage table (for subprocess tests)."""
        path = self.root / f"driver_{b}.py"
        path.write_text(
            "import sys\n"
            f"sys.path.insert(0, {str(self.root / 'stages')!r})\n"
            "from tinytrain.pipeline import stage_graph\n"
            "from tinytrain.pipeline.stage_graph import StageDef\n"
            f"stage_graph.STAGES = {self.table(b)!r}\n"
            "from tinytrain.pipeline.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))\n")
        return path


@pytest.fixture
def fake_project(tmp_path, monkeypatch) -> FakeProject:
    root = tmp_path / "proj"
    (root / "stages").mkdir(parents=True)
    (root / "net.tflite").write_bytes(b"fake model bytes\n")
    # Unique module names: sys.modules outlives a test, and each test has its own call log.
    proj = FakeProject(root, root / "tinytrain.yaml", root / "calls.log", root / "started",
                       f"ttfake_{uuid.uuid4().hex[:8]}")
    for kind, body in _BODIES.items():
        header = _HEADER.format(calls=str(proj.calls_file), marker=str(proj.marker), name=kind)
        proj.module_file(kind).write_text(header + textwrap.dedent(body).replace("\n", "\n    ").rstrip() + "\n")
    monkeypatch.syspath_prepend(str(root / "stages"))
    proj.write_spec()
    yield proj
    for kind in _BODIES:
        sys.modules.pop(proj.module(kind), None)
