"""`tinytrain export SPEC --to DIR`: the model's training library as a self-contained folder (issue 12, item 2).

    DIR/src/            tt_model.c, tt_model.h (the C API, stages/c_emit/api.py) and the kernels_c/ files
    DIR/examples/train_from_flash/train_from_flash.c   trains on samples kept in a const array (flash)
    DIR/CMakeLists.txt  library target `tinytrain_<name>` (+ the example with -DTT_BUILD_EXAMPLES=ON)
    DIR/boards/         the QEMU stand-in boards of stages/device/boards.py: startup, semihosting console, linker scripts
                        and an arm-none-eabi toolchain file, so `-DTT_BOARD=<board>` builds the example as firmware
                        that runs in qemu-system-arm. A product links its own startup instead; the library itself
                        (src/) needs none of boards/.
    DIR/library.json    PlatformIO;  DIR/library.properties  Arduino
    DIR/README.md       the API in a snippet, how to add the folder to a project, memory figures

The README's memory figures per board are measured, not estimated: src/tt_model.c is compiled with
arm-none-eabi-gcc and the flags the exported CMakeLists.txt uses (LIB_CFLAGS + the board's CPU flags) and its
sections summed -- what the linker map of any program linking the library shows for tt_model.c (a test links the
example for every board and compares with the map).

The sources are codegen's (built or restored from the cache up to cross-compile, whose size.json gives the
linked memory figures of the board build); the emulate-run driver (tt_driver.c) is left out: it is the
semihosting test harness, not part of the library.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.pipeline.errors import UserError
from tinytrain.stages.c_emit import ops_header

KERNELS = Path(__file__).resolve().parent.parent / "kernels_c"
EXAMPLE_SAMPLES = 16
# Compile flags of the exported library (CMakeLists.txt) and of the README's measurement: one list for both.
# -ffp-contract=off as in cross-compile (DESIGN section 6): host and board builds round alike.
LIB_CFLAGS = ("-O2", "-ffunction-sections", "-fdata-sections", "-ffp-contract=off")
# Board support the example needs on a QEMU stand-in board (from kernels_c/boards/, copied to DIR/boards/).
BOARD_FILES = ("startup.c", "semihost.c", "semihost.h", "platform_semihost.c", "tt_common.c", "tt_platform.h",
               "cortexm_sections.ld")


def export_spec(spec: Any, cache: Any, log: Any, to: Path) -> Path:
    from tinytrain.pipeline.runner import build
    from tinytrain.pipeline.workspace import stage_dir

    _check_destination(Path(to))
    result = build(spec, cache, log, until="cross-compile")
    if result.error is not None:
        raise result.error
    cg, cc = stage_dir(spec, "codegen"), stage_dir(spec, "cross-compile")
    samples = _samples(spec, json.loads((cg / "io_layout.json").read_text()))
    return export_library(cg, cc / "size.json", Path(to), spec.name, samples)


def _samples(spec: Any, layout: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from tinytrain.stages.train.data import load_dataset
    from tinytrain.stages.emulate_run import quantize_input

    data = getattr(spec, "data", None)
    if data is None:
        raise UserError("export needs data for the example, but the spec has no `data` section")
    ds = load_dataset(data)
    n = min(EXAMPLE_SAMPLES, len(ds.y_train))
    return quantize_input(ds.x_train[:n], layout["input"]), np.asarray(ds.y_train[:n])


def _check_destination(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--to {out} is a file, not a folder: name a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--to {out} exists and is not empty: export into a new folder")


def _c_ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"


def export_library(codegen_dir: Path, size_json: Path | None, out: Path, name: str,
                   samples: tuple[np.ndarray, np.ndarray]) -> Path:
    out = Path(out)
    _check_destination(out)
    src = out / "src"
    src.mkdir(parents=True)
    for f in ("tt_model.c", "tt_model.h"):
        shutil.copyfile(Path(codegen_dir) / f, src / f)
    # flat: the one-op-per-file kernels (kernels_c/ops/) include the shared headers by name, found in src/ too
    for p in sorted(KERNELS.glob("*.[ch]")) + sorted(KERNELS.glob("ops/*.[ch]")):
        shutil.copyfile(p, src / p.name)
    ops_header.write(src)   # tt_kernels.h's op prototypes, gathered from the op files (stages/c_emit/ops_header.py)
    layout = json.loads((Path(codegen_dir) / "io_layout.json").read_text())
    cgj = json.loads((Path(codegen_dir) / "codegen.json").read_text())
    size = json.loads(Path(size_json).read_text()) if size_json and Path(size_json).is_file() else {}
    lib = f"tinytrain_{_c_ident(name)}"
    ex = out / "examples" / "train_from_flash"
    ex.mkdir(parents=True)
    (ex / "train_from_flash.c").write_text(_example(layout, *samples))
    _copy_boards(out / "boards")
    (out / "CMakeLists.txt").write_text(_cmake(lib))
    (out / "library.json").write_text(json.dumps({
        "name": lib, "version": "1.0.0", "description": f"On-device training of {name} (generated by tinytrain)",
        "frameworks": "*", "platforms": "*",
        "build": {"srcDir": "src", "includeDir": "src", "flags": ["-std=c99"]}}, indent=2) + "\n")
    (out / "library.properties").write_text(
        f"name={lib}\nversion=1.0.0\nauthor=tinytrain\nmaintainer=tinytrain\n"
        f"sentence=On-device training of {name}.\nparagraph=Generated by tinytrain: tt_model.h.\n"
        "category=Data Processing\nurl=https://example.invalid/tinytrain\narchitectures=*\n")
    (out / "README.md").write_text(_readme(lib, name, layout, cgj, size, measure_library(src / "tt_model.c")))
    return out


def _mcu_boards() -> list[Any]:
    from tinytrain.stages.device.boards import BOARDS

    return [b for b in BOARDS.values() if not b.host]


def _copy_boards(dest: Path) -> None:
    from tinytrain.stages.device.boards import BOARD_DIR

    dest.mkdir()
    for f in BOARD_FILES + tuple(sorted({b.linker_script for b in _mcu_boards()})):
        shutil.copyfile(BOARD_DIR / f, dest / f)
    (dest / "arm-none-eabi.cmake").write_text(
        "# Toolchain file for the boards/ builds:\n"
        "#   cmake -DCMAKE_TOOLCHAIN_FILE=boards/arm-none-eabi.cmake -DTT_BOARD=<board> -DTT_BUILD_EXAMPLES=ON\n"
        "set(CMAKE_SYSTEM_NAME Generic)\nset(CMAKE_SYSTEM_PROCESSOR arm)\n"
        "set(CMAKE_C_COMPILER arm-none-eabi-gcc)\n"
        "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # no startup code to link a test program with\n")


def measure_library(model_c: Path) -> dict[str, dict[str, int]]:
    """Per MCU board: bytes of flash (code + constants + the .data image) and of static SRAM (.data + .bss, the
    arena included) that src/tt_model.c takes, compiled as the exported CMakeLists.txt compiles it. Empty when
    arm-none-eabi-gcc is not installed (the README then says so)."""
    from tinytrain.stages.cross_compile import ARM_CC
    from tinytrain.stages.device.elf_size import SHF_ALLOC, SHF_WRITE, SHT_NOBITS, read_elf

    if shutil.which(ARM_CC) is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="tt-export-") as tmp:
        for b in _mcu_boards():
            obj = Path(tmp) / f"{b.name}.o"
            proc = subprocess.run([ARM_CC, "-std=c99", *LIB_CFLAGS, *b.cflags, "-I", str(model_c.parent), "-c",
                                   str(model_c), "-o", str(obj)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise UserError(f"tt_model.c does not compile for {b.name}: {proc.stderr.strip().splitlines()[0]}")
            sections, _ = read_elf(obj)
            flash = sram = 0
            for sec in sections:
                if not sec.flags & SHF_ALLOC:
                    continue
                if sec.flags & SHF_WRITE:
                    sram += sec.size
                    flash += 0 if sec.type == SHT_NOBITS else sec.size
                else:
                    flash += sec.size
            out[b.name] = {"flash": flash, "sram": sram}
    return out


def _example(layout: dict[str, Any], x: np.ndarray, y: np.ndarray) -> str:
    int8 = layout["input"]["dtype"] == "int8"
    ct = "int8_t" if int8 else "float"
    flat = x.reshape(len(x), -1)
    rows = ",\n".join("    {" + ", ".join(str(int(v)) if int8 else repr(float(v)) + "f" for v in r) + "}"
                      for r in flat)
    regression = layout.get("loss") == "mse"
    if regression:
        k = int(layout["num_targets"])
        yt = np.asarray(y, np.float32).reshape(len(y), k)
        tdecl = (f"static const float targets[{len(y)}][{k}] = {{\n" +
                 ",\n".join("    {" + ", ".join(repr(float(v)) + "f" for v in r) + "}" for r in yt) + "\n};")
        tref = "targets[i]"
    else:
        tdecl = f"static const int32_t labels[{len(y)}] = {{{', '.join(str(int(v)) for v in y)}}};"
        tref = "&labels[i]"
    return f"""/* Trains the model on {len(flat)} samples kept in flash, 3 epochs, then checkpoints and restores. */
#include <stdint.h>
#include <string.h>

#include "tt_model.h"

#ifdef TT_EXAMPLE_ON_BOARD   /* -DTT_BOARD=...: a QEMU stand-in board of boards/, console over semihosting */
#include "tt_platform.h"
#define TT_EXAMPLE_PRINT tt_log
#define TT_EXAMPLE_MAIN tt_main
#else
#include <stdio.h>
#define TT_EXAMPLE_PRINT printf
#define TT_EXAMPLE_MAIN main
#endif

/* Losses are printed as a decimal made with integer arithmetic and as their bits, so every board's console
 * (whose printf has no %f) compares with the host's byte for byte. */
static void print_loss(uint32_t epoch, float loss)
{{
    uint32_t bits;
    long whole = (long)loss;
    long micro = (long)((loss - (float)whole) * 1000000.0f);
    memcpy(&bits, &loss, sizeof bits);
    TT_EXAMPLE_PRINT("epoch %lu mean loss %ld.%06ld bits %08lx steps %lu\\n", (unsigned long)epoch, whole, micro,
                     (unsigned long)bits, (unsigned long)tt_steps_done());
}}

#define N_SAMPLES {len(flat)}u
static const {ct} samples[N_SAMPLES][TT_INPUT_BYTES / sizeof({ct})] = {{
{rows}
}};
{tdecl}

static uint8_t checkpoint[TT_CHECKPOINT_BYTES];

int TT_EXAMPLE_MAIN(void)
{{
    uint32_t epoch, i;
    int rc;
    tt_init();
    tt_set_learning_rate(0.01f);
    for (epoch = 0; epoch < 3u; ++epoch) {{
        float sum = 0.0f;
        for (i = 0; i < N_SAMPLES; ++i) {{
            tt_train_sample(samples[i], {tref});
            sum += tt_loss_last();
        }}
        print_loss(epoch, sum / (float)N_SAMPLES);
    }}
    tt_apply_update();
    rc = tt_checkpoint_save(checkpoint);
    checkpoint[40] ^= 1u;   /* a flipped bit is refused... */
    TT_EXAMPLE_PRINT("corrupted checkpoint: %s\\n", tt_strerror(tt_checkpoint_load(checkpoint, sizeof checkpoint)));
    checkpoint[40] ^= 1u;   /* ...the intact one restores */
    rc = rc != TT_OK ? rc : tt_checkpoint_load(checkpoint, sizeof checkpoint);
    TT_EXAMPLE_PRINT("checkpoint %lu bytes: %s, arena high water %lu of %lu bytes\\n",
                     (unsigned long)tt_checkpoint_size(), tt_strerror(rc), (unsigned long)tt_arena_high_water(),
                     (unsigned long)tt_arena_bytes());
    return rc == TT_OK ? 0 : 1;
}}
"""


def _cmake(lib: str) -> str:
    boards = "\n".join(
        f'elseif(TT_BOARD STREQUAL "{b.name}")\n  set(TT_CPU_FLAGS {" ".join(b.cflags)})\n'
        f'  set(TT_LINKER_SCRIPT {b.linker_script})\n  set(TT_INSNS_PER_TICK {b.instructions_per_tick.numerator})\n'
        f'  set(TT_INSNS_PER_TICK_DEN {b.instructions_per_tick.denominator})'
        for b in _mcu_boards())
    names = " ".join(b.name for b in _mcu_boards())
    return f"""cmake_minimum_required(VERSION 3.13)
project({lib} C)

# TT_BOARD: build for one of the QEMU stand-in boards in boards/ ({names}), with
#   -DCMAKE_TOOLCHAIN_FILE=boards/arm-none-eabi.cmake; the example then runs in qemu-system-arm.
set(TT_BOARD "" CACHE STRING "QEMU stand-in board of boards/ to build the example for (empty: this machine)")
if(TT_BOARD STREQUAL "")
{boards}
else()
  message(FATAL_ERROR "unknown TT_BOARD ${{TT_BOARD}}; known: {names}")
endif()
if(TT_CPU_FLAGS)
  add_compile_options(${{TT_CPU_FLAGS}})
  add_link_options(${{TT_CPU_FLAGS}})
endif()

file(GLOB TT_SOURCES ${{CMAKE_CURRENT_LIST_DIR}}/src/*.c)
add_library({lib} STATIC ${{TT_SOURCES}})
target_include_directories({lib} PUBLIC ${{CMAKE_CURRENT_LIST_DIR}}/src)
target_compile_options({lib} PRIVATE {" ".join(LIB_CFLAGS)})
set_target_properties({lib} PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON)
if(TT_BOARD)
  target_link_libraries({lib} PUBLIC m)
else()
  find_library(TT_LIBM m)
  if(TT_LIBM)
    target_link_libraries({lib} PUBLIC ${{TT_LIBM}})
  endif()
endif()

option(TT_BUILD_EXAMPLES "build examples/" OFF)
if(TT_BUILD_EXAMPLES)
  set(TT_EXAMPLE examples/train_from_flash/train_from_flash.c)
  if(TT_BOARD)
    set(B ${{CMAKE_CURRENT_LIST_DIR}}/boards)
    add_executable(train_from_flash ${{TT_EXAMPLE}} ${{B}}/startup.c ${{B}}/semihost.c ${{B}}/platform_semihost.c
                   ${{B}}/tt_common.c)
    target_include_directories(train_from_flash PRIVATE ${{B}})
    target_compile_definitions(train_from_flash PRIVATE TT_EXAMPLE_ON_BOARD=1 TT_BOARD_NAME="${{TT_BOARD}}"
                               TT_INSNS_PER_TICK=${{TT_INSNS_PER_TICK}}
                               TT_INSNS_PER_TICK_DEN=${{TT_INSNS_PER_TICK_DEN}})
    # No --gc-sections: the map then shows all of tt_model.c, the figures the README reports.
    target_link_options(train_from_flash PRIVATE -nostartfiles --specs=nano.specs -L${{B}}
                        -T${{B}}/${{TT_LINKER_SCRIPT}} -Wl,-Map=train_from_flash.map)
    set_target_properties(train_from_flash PROPERTIES SUFFIX .elf)
  else()
    add_executable(train_from_flash ${{TT_EXAMPLE}})
  endif()
  set_target_properties(train_from_flash PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON)
  target_link_libraries(train_from_flash PRIVATE {lib})
endif()
"""


_CTYPES = {"int8": "int8_t", "uint8": "uint8_t", "float32": "float"}


def _stream_readme(layout: dict[str, Any]) -> str:
    """The README's part for a stateful streaming model (io_layout.json "stream", stages/c_emit/stream.py)."""
    s = layout.get("stream")
    if not s:
        return ""
    if not s.get("available"):
        return f"## Stateful model\n\nTrained unrolled; the library has no per-frame API: {s['reason']}\n\n"
    fr, out = s["frame"], s["output"]
    names = ", ".join(f"`{v['variable']}` ({v['bytes']} B)" for v in s["variables"])
    return f"""## Streaming: one frame per call

The model is stateful (a streaming keyword spotter): training takes sequences of frames, but a product runs it
one invocation per frame, as TFLite Micro invokes the original file. The state stays in SRAM between calls
({names}: `TT_STREAM_STATE_BYTES` = {s['state_bytes']} B), one invocation's activations take
`TT_STREAM_ARENA_BYTES` = {s['arena_bytes']} B; both static, outside the training arena. `tt_init` resets the
state; after `tt_train_sample` the next frame uses the trained weights.

```c
static {_CTYPES.get(fr['dtype'], 'float')} frame[TT_STREAM_FRAME_BYTES / sizeof(frame[0])];    /* {fr['dtype']}{fr['shape']} */
static {_CTYPES.get(out['dtype'], 'float')} score[TT_STREAM_OUTPUT_BYTES / sizeof(score[0])];  /* {out['dtype']}{out['shape']} */

tt_init();
tt_stream_reset();                 /* the initial state, as the model's init subgraph sets it */
for (;;) {{
    read_features(frame);
    tt_stream_step(frame, score);  /* one invocation: reads and updates the state */
}}
```

"""


def _readme(lib: str, name: str, layout: dict[str, Any], cgj: dict[str, Any], size: dict[str, Any],
            measured: dict[str, dict[str, int]]) -> str:
    inp = layout["input"]
    ck = layout.get("checkpoint", {})
    mem = [f"| arena (SRAM, static) | {cgj['arena_bytes']} B |",
           f"| whole weights outside the arena (SRAM) | {cgj.get('sram_outside_arena_bytes', 0)} B |",
           f"| constants (flash) | {cgj['const_bytes']} B |",
           f"| checkpoint | {ck.get('bytes', '?')} B |",
           f"| .wof weights image | {layout.get('wof', {}).get('bytes', '?')} B |"]
    if size.get("flash") and size.get("sram") and not size.get("host"):
        mem.append(f"| the emulate-run firmware for {size['board']} (library + test driver + board support) | "
                   f"flash {size['flash']['used']} B, SRAM {size['sram']['used']} B "
                   f"(stack {size['sram']['stack']} B) |")
    per_board = ("\n".join(f"| {b} | {m['flash']} B | {m['sram']} B |" for b, m in measured.items())
                 if measured else "| (arm-none-eabi-gcc was not installed at export: not measured) | | |")
    q = (f"int8, quantize with scale {inp['scale']} and zero point {inp['zero_point']}" if inp["dtype"] == "int8"
         else "float32")
    return f"""# {lib}

On-device training of `{name}`, generated by tinytrain. The API is `src/tt_model.h`; no heap, one static arena.
Input: {inp['dtype']}{list(inp['shape'])} ({q}); batch size {layout['batch_size']}.

```c
#include "tt_model.h"

static uint8_t ckpt[TT_CHECKPOINT_BYTES];

tt_init();                                   /* original weights, fresh optimizer state */
if (flash_read(ckpt, sizeof ckpt) == 0 && tt_checkpoint_load(ckpt, sizeof ckpt) != TT_OK) {{
    /* torn or corrupted: refused, training starts from the original weights */
}}
tt_set_learning_rate(0.01f);
read_sensor(image);                          /* the whole input in your buffer */
tt_train_sample(image, &label);              /* update applied every TT_BATCH_SIZE samples */
/* or line by line from the sensor (TT_INPUT_FED 1: the input is never whole in SRAM; TT_INPUT_ROWS rows of
   TT_INPUT_ROW_BYTES, asked in order): int read_line(void *cam, uint32_t row, void *dst, uint32_t bytes); */
tt_train_sample_rows(read_line, cam, &label);
float loss = tt_loss_last();
tt_predict(input, output);
if (tt_checkpoint_save(ckpt) == TT_OK) flash_write(ckpt, sizeof ckpt);
```

Also: `tt_evaluate_begin/add/end`, `tt_weights_size/read/export/import` (.wof, onert-micro's weights-only
format), `tt_checkpoint_save_to/load_from` (streaming, for flash pages), `tt_set_momentum/beta1/beta2/eps/alpha/
weight_decay/seed`, `tt_apply_update`, `tt_steps_done`, `tt_arena_high_water`, `tt_strerror`.

{_stream_readme(layout)}## Adding it to a project

* **CMake**: `add_subdirectory(path/to/{lib})` and `target_link_libraries(app PRIVATE {lib})`
  (`-DTT_BUILD_EXAMPLES=ON` builds `examples/train_from_flash`).
* **PlatformIO**: put the folder in `lib/` (or `lib_deps = file://path/to/{lib}`); `library.json` is read.
* **Arduino**: copy the folder into `~/Arduino/libraries/` (or Sketch > Include Library > Add .ZIP); `library.properties`.

## Memory

| what | bytes |
|---|---|
{chr(10).join(mem)}

What `src/tt_model.c` takes per board, compiled with `{" ".join(LIB_CFLAGS)}` and the board's CPU flags
(arm-none-eabi-gcc): what a linker map shows for it. Kernels come on top, only those the model calls.

| board | tt_model.c flash (code, constants, .data image) | tt_model.c static SRAM (.data + .bss, arena included) |
|---|---|---|
{per_board}

## Trying the example

* Host: `cmake -S . -B build -DTT_BUILD_EXAMPLES=ON && cmake --build build && build/train_from_flash`
* A QEMU stand-in board (`boards/`: startup, semihosting console, linker script; a product uses its own):
  `cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=boards/arm-none-eabi.cmake -DTT_BOARD=m4-256k -DTT_BUILD_EXAMPLES=ON`,
  `cmake --build build-arm`, then `qemu-system-arm -M mps2-an386 -cpu cortex-m4 -nographic -monitor none
  -semihosting-config enable=on,target=native -kernel build-arm/train_from_flash.elf`
  (boards: {", ".join(f"`{b.name}` (-M {b.qemu_machine} -cpu {b.qemu_cpu})" for b in _mcu_boards())}).
"""
