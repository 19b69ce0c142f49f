"""`tinytrain export`: the exported library folder builds with CMake for the host and, with arm-none-eabi, for every
MCU board, and its example trains on both (issue 12, item 2). On a board the example runs in QEMU and prints the
same lines as on the host (losses bit for bit); the README's per-board memory figures for tt_model.c equal what the
linker map of the board build shows (parsed here from the map text, independently of the export's ELF reader).
The `tinytrain export` verb: exit 0 and the folder; a file as --to is one line and exit 2.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.pipeline.export_lib import export_library
from tinytrain.stages import codegen
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.device.boards import BOARDS, get_board
from tinytrain.stages.device.launch import run_firmware
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import TrainPlan

FIX = Path(__file__).resolve().parent / "fixtures"
ROOT = FIX.parent.parent
MCU = [b for b in BOARDS if not BOARDS[b].host]
need_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None, reason="no cmake / cc")
need_arm = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                              reason="no arm-none-eabi-gcc / qemu-system-arm")


def _export(fixture: str, opt: str, out: Path) -> Path:
    g = read_model(FIX / f"{fixture}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(kind=opt, learning_rate=0.01), 1)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), out / "cg")
    layout = json.loads((out / "cg" / "io_layout.json").read_text())
    rng = np.random.default_rng(0)
    shape = [8] + layout["input"]["shape"][1:]
    x = (rng.integers(-128, 128, shape).astype(np.int8) if layout["input"]["dtype"] == "int8"
         else rng.standard_normal(shape).astype(np.float32))
    y = rng.integers(0, layout["num_classes"], 8)
    return export_library(out / "cg", None, out / "lib", "mlp", (x, y))


def _cmake(lib: Path, build: Path, *args: str) -> None:
    for cmd in (["cmake", "-S", str(lib), "-B", str(build), "-DTT_BUILD_EXAMPLES=ON",
                 "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror", *args], ["cmake", "--build", str(build)]):
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def _host_lines(lib: Path, build: Path) -> list[str]:
    _cmake(lib, build)
    r = subprocess.run([str(build / "train_from_flash")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


@need_cmake
@pytest.mark.parametrize("fixture,opt", [("mlp_float", "adam"), ("mlp_int8", "sgd")])
def test_exported_library_builds_with_cmake_and_its_example_trains(fixture, opt, tmp_path):
    lib = _export(fixture, opt, tmp_path)
    names = {p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}
    assert {"CMakeLists.txt", "library.json", "library.properties", "README.md", "src/tt_model.h", "src/tt_model.c",
            "examples/train_from_flash/train_from_flash.c", "boards/arm-none-eabi.cmake", "boards/startup.c",
            "boards/cortexm_sections.ld"} | {f"boards/{BOARDS[b].linker_script}" for b in MCU} <= names
    # The library proper is src/: no semihosting driver, no platform layer (those are boards/, for the example).
    assert "src/tt_driver.c" not in names and not any("tt_platform" in n or "semihost" in n for n in names
                                                       if n.startswith("src/"))
    readme = (lib / "README.md").read_text()
    assert "add_subdirectory" in readme and "library.json" in readme and "tt_train_sample" in readme
    lines = _host_lines(lib, tmp_path / "build")
    losses = [float(ln.split()[4]) for ln in lines if ln.startswith("epoch")]
    assert len(losses) == 3 and all(np.isfinite(losses)) and "steps 24" in lines[2]
    assert "CRC mismatch" in "\n".join(lines) and "checkpoint" in lines[-1] and ": ok," in lines[-1]


_MAP_ROW = re.compile(r"^ (\.[\w.$]+)\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S+)$", re.M)


def _map_figures(map_text: str, obj_suffix: str) -> dict[str, int]:
    """Flash and SRAM of one object's input sections, as the GNU ld map lists them (a long section name puts
    address, size and object on the next line)."""
    text = re.sub(r"^ (\.[\w.$]+)\n\s+(0x)", r" \1 \2", map_text, flags=re.M)
    text = text.split("Linker script and memory map", 1)[1]   # not the discarded-sections list above it
    flash = sram = 0
    for name, _addr, size, obj in _MAP_ROW.findall(text):
        if not obj.endswith(obj_suffix):
            continue
        n = int(size, 16)
        if name.startswith((".text", ".rodata")):
            flash += n
        elif name.startswith(".data"):
            flash, sram = flash + n, sram + n
        elif name.startswith(".bss"):
            sram += n
    return {"flash": flash, "sram": sram}


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    lib = _export("mlp_int8", "sgd", out)
    return lib, _host_lines(lib, out / "host")


@need_cmake
@need_arm
@pytest.mark.slow
@pytest.mark.parametrize("board", MCU)
def test_exported_example_runs_in_qemu_like_the_host_and_the_readme_memory_is_the_maps(board, int8_export, tmp_path):
    lib, host = int8_export
    b = get_board(board)
    _cmake(lib, tmp_path / "build", f"-DCMAKE_TOOLCHAIN_FILE={lib / 'boards' / 'arm-none-eabi.cmake'}",
           f"-DTT_BOARD={board}")
    r = run_firmware(b, tmp_path / "build" / "train_from_flash.elf", tmp_path / "run", None, 120,
                     results_name=None, losses_name=None)
    console = [ln for ln in r.console.splitlines() if not ln.startswith("@tt ")]
    assert console == host          # losses to the bit, checkpoint refused then restored, same arena high water
    figures = _map_figures((tmp_path / "build" / "train_from_flash.map").read_text(), "(tt_model.c.obj)")
    assert figures["flash"] > 0 and figures["sram"] >= json.loads((lib.parent / "cg" / "codegen.json").read_text())[
        "arena_bytes"]
    row = next(ln for ln in (lib / "README.md").read_text().splitlines() if ln.startswith(f"| {board} |"))
    assert row == f"| {board} | {figures['flash']} B | {figures['sram']} B |"


def _verb_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "t.yaml"
    spec.write_text(f"""name: t
model: {{path: {FIX / 'digits_cnn_float.tflite'}}}
data: {{source: digits}}
quantize: {{enabled: false}}
train: {{epochs: 1, max_train_samples: 8}}
target: {{board: host}}
build: {{out_dir: {tmp_path / 'build'}, cache_dir: {tmp_path / 'cache'}}}
""")
    return spec


CLI = [sys.executable, "-m", "tinytrain"]


@need_cmake
@pytest.mark.slow
def test_the_export_verb_writes_the_folder(tmp_path):
    """`tinytrain export` on a host-board spec (builds up to cross-compile: ~35 s): exit 0 and the folder."""
    r = subprocess.run([*CLI, "export", str(_verb_spec(tmp_path)), "--to", str(tmp_path / "lib")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in ("src/tt_model.h", "src/tt_model.c", "CMakeLists.txt", "library.json", "library.properties", "README.md",
              "examples/train_from_flash/train_from_flash.c", "boards/arm-none-eabi.cmake"):
        assert (tmp_path / "lib" / f).is_file(), f
    assert "library in" in r.stdout


@pytest.mark.parametrize("what", ["file", "full folder"])
def test_the_export_verb_refuses_a_bad_destination_before_building(what, tmp_path):
    to = tmp_path / "dest"
    if what == "file":
        to.write_text("x")
    else:
        to.mkdir()
        (to / "keep.txt").write_text("mine")
    r = subprocess.run([*CLI, "export", str(_verb_spec(tmp_path)), "--to", str(to)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and str(to) in r.stderr, r.stderr
    assert not (tmp_path / "build").exists()     # refused before any stage ran
