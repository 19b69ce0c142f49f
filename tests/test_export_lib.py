"""`tinytrain export`: the exported library folder builds with CMake for the host and its example trains
(issue 12, item 2). The ARM/QEMU build of the exported folder is not tested yet."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.export_lib import export_library
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.tflite_reader import read_model
from tinytrain.stages.train_plan import TrainPlan

FIX = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None, reason="no cmake / cc")
@pytest.mark.parametrize("fixture,opt", [("mlp_float", "adam"), ("mlp_int8", "sgd")])
def test_exported_library_builds_with_cmake_and_its_example_trains(fixture, opt, tmp_path):
    g = read_model(FIX / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.01), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "cg")
    layout = json.loads((tmp_path / "cg" / "io_layout.json").read_text())
    rng = np.random.default_rng(0)
    shape = [8] + layout["input"]["shape"][1:]
    x = (rng.integers(-128, 128, shape).astype(np.int8) if layout["input"]["dtype"] == "int8"
         else rng.standard_normal(shape).astype(np.float32))
    y = rng.integers(0, layout["num_classes"], 8)
    lib = export_library(tmp_path / "cg", None, tmp_path / "lib", "mlp", (x, y))
    names = {p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}
    assert {"CMakeLists.txt", "library.json", "library.properties", "README.md", "src/tt_model.h", "src/tt_model.c",
            "examples/train_from_flash/train_from_flash.c"} <= names
    assert "src/tt_driver.c" not in names and not any("tt_platform" in n for n in names)
    readme = (lib / "README.md").read_text()
    assert "add_subdirectory" in readme and "library.json" in readme and "tt_train_sample" in readme
    b = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(lib), "-B", str(b), "-DTT_BUILD_EXAMPLES=ON",
                    "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(b)], check=True, capture_output=True)
    r = subprocess.run([str(b / "train_from_flash")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    losses = [float(ln.split()[4]) for ln in lines if ln.startswith("epoch")]
    assert len(losses) == 3 and all(np.isfinite(losses)) and "steps 24" in lines[2]
    assert "CRC mismatch" in r.stdout and "checkpoint" in lines[-1] and ": ok," in lines[-1]
