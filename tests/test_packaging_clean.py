"""Installing tinytrain prints no setuptools warnings: the license is an SPDX string and every folder Python
would see as a package (data folders included) is listed in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_building_the_package_prints_no_setuptools_warning(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"))
    out = tmp_path / "dist"
    # The build backend itself, as pip calls it (pip hides its output unless -v), for a wheel and an editable one.
    code = (f"from setuptools import build_meta as b; b.build_wheel({str(out)!r}); "
            f"b.build_editable({str(out)!r})")
    proc = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "Warning" in line]
    assert warnings == [], "\n".join(warnings)
    assert len(list(out.glob("tinytrain-*.whl"))) == 2
