"""The README is what a new user reads first: its two commands and its YAML reference must stay true."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tinytrain.pipeline.spec import json_schema
from tinytrain.pipeline.spec_docs import END, START, reference_markdown, replace_in

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _top_commands() -> list[str]:
    text = README.read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README must open with a bash block holding the two commands"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_yaml_reference_matches_the_schema():
    text = README.read_text()
    assert START in text and END in text
    expected = replace_in(text, reference_markdown(json_schema()))
    assert text == expected, "README's YAML reference is stale: run `tinytrain schema --markdown` and paste it"


def test_readme_opens_with_exactly_two_commands_and_ci_runs_the_test_one():
    main_job, tests = _top_commands()
    assert "tinytrain build tinytrain.yaml.example" in main_job
    assert "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text(), ".ci/run must call the README's test command"


@pytest.mark.slow
def test_readme_commands_work_in_a_fresh_clone(tmp_path):
    """As a new user would: clone, run the main job, then the tests (minus this test, which would recurse)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["TINYTRAIN_CACHE_DIR"] = str(tmp_path / "cache")
    main_job, tests = _top_commands()
    first = subprocess.run(["bash", "-c", main_job], cwd=clone, env=env, capture_output=True, text=True,
                           timeout=1800)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = subprocess.run(["bash", "-c", main_job], cwd=clone, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and " 0 ran" in (again.stdout + again.stderr), again.stderr[-2000:]
    second = subprocess.run(["bash", "-c", tests + " -k 'not fresh_clone'"], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=3000)
    assert second.returncode == 0, second.stdout[-3000:]
