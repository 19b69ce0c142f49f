"""The product card's folders are mapped under the `tinytrain` import namespace; prove a
non-editable install (a built wheel) holds every package and the C kernel data, and works from
another folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_editable_install_imports_from_the_checkout():
    import tinytrain.pipeline.contract as contract
    import tinytrain.stages.model.ir as ir

    assert Path(ir.__file__).resolve() == REPO / "stages" / "model" / "ir.py"
    assert Path(contract.__file__).resolve() == REPO / "pipeline" / "contract.py"


def test_wheel_install_works_outside_the_checkout(tmp_path):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"))
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheel_dir), str(src)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("tinytrain-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("tinytrain/__init__.py", "tinytrain/pipeline/cli.py", "tinytrain/stages/model/ir.py",
                   "tinytrain/stages/load.py", "tinytrain/cache/store.py", "tinytrain/kernels_c/tt_kernels.h",
                   "tinytrain/kernels_c/boards/startup.c",
                   "tinytrain/kernels_c/boards/stm32f746-disco.ld",
                   "tinytrain/stages/model/zoo_models/mbv2_w035_128_int8.tflite"):
        assert module in names, f"{module} missing from the wheel"
    # every kernel source ships, the one-op-per-file kernels (kernels_c/ops/) included
    kernels = [p for g in ("*.[ch]", "ops/*.[ch]") for p in (REPO / "kernels_c").glob(g)]
    assert any(p.parent.name == "ops" for p in kernels)
    for p in kernels:
        assert f"tinytrain/{p.relative_to(REPO).as_posix()}" in names, f"{p.name} missing from the wheel"
    assert not any(n.startswith("tinytrain/tests/") for n in names), "tests must not ship in the wheel"

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    probe = ("import tinytrain.stages.model.ir as ir, tinytrain.pipeline.cli as cli; "
             "print(ir.__file__); print(callable(cli.main))")
    # -I: isolated mode, so neither the checkout nor the editable finder can shadow the wheel.
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {probe}"],
                         check=True, capture_output=True, text=True, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(target)), out
    assert out[1] == "True"
