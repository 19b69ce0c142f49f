"""cross-compile compiles only the kernel library files a program can reach (issue 14: build time).

The scan works on names (every external name of the library starts with tt_); a file it misses makes the link fail,
and build_firmware then adds the file that defines the missing name. The linked program must be the one the whole
library gives: same code and data bytes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tinytrain.stages import cross_compile
from tinytrain.stages.cross_compile import _defined_names, _reachable_library, build_firmware
from tinytrain.stages.device.boards import get_board

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no native C compiler (cc)")

PROGRAM = """#include <stdint.h>
#include "tt_kernels.h"
int tt_main(void) {
    static float x[4] = {-1.0f, 0.5f, 7.0f, 3.0f}, y[4];
    tt_clamp_f32(4, 0.0f, 6.0f, x, y);
    return y[0] == 0.0f && y[1] == 0.5f && y[2] == 6.0f && y[3] == 3.0f ? 0 : 1;
}
"""


def _files(root: Path, files: dict[str, str]) -> list[Path]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return [Path(n) for n in files]


def test_defined_names_reads_file_scope_definitions_only():
    text = ("#include <stdint.h>\n#define tt_macro(x) (x)\nstatic int tt_local(int a) { return a; }\n"
            "extern int tt_elsewhere(void);\nint32_t tt_a(int x)\n{\n    return tt_b(x);\n}\n"
            "const int8_t tt_table[4] = {0};\nvoid\ntt_split_line(void) {}\n/* tt_comment(1) */\n")
    assert _defined_names(text) == {"tt_a", "tt_table", "tt_split_line"}


def test_reachable_library_follows_names_through_files(tmp_path):
    src = _files(tmp_path, {
        "src/program/main.c": "int tt_main(void) { return tt_a(); }\n",
        "src/kernels_c/a.c": "int tt_a(void) { return tt_b(); }\n",
        "src/kernels_c/ops/b.c": "int tt_b(void) { return 0; }\n",
        "src/kernels_c/ops/c.c": "int tt_c(void) { return tt_a(); }\n",   # calls into the used set, unused itself
        "src/kernels_c/boards/board.c": "void tt_board(void) { tt_main(); }\n",
    })
    used, spare = _reachable_library(tmp_path, src, [Path("src/kernels_c/boards/board.c")])
    assert used == [Path("src/program/main.c"), Path("src/kernels_c/a.c"), Path("src/kernels_c/ops/b.c"),
                    Path("src/kernels_c/boards/board.c")]
    assert spare == [Path("src/kernels_c/ops/c.c")]


def _image(elf: Path) -> bytes:
    out = elf.with_suffix(".bin")
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", "--only-section=.rodata",
                    "--only-section=.data", str(elf), str(out)], check=True)
    return out.read_bytes()


@pytest.mark.slow     # the whole kernel library compiled natively at -O3, three links
@needs_cc
def test_pruned_build_equals_whole_library_and_recovers_a_missed_file(tmp_path, monkeypatch):
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "main.c").write_text(PROGRAM)
    board = get_board("host")
    everything = [str(p.relative_to(cross_compile.KERNELS_DIR)) for g in cross_compile.KERNEL_SOURCE_GLOBS
                  for p in sorted(cross_compile.KERNELS_DIR.glob(g))]
    full = build_firmware(board, prog, tmp_path / "full", kernels=everything)
    pruned = build_firmware(board, prog, tmp_path / "pruned")
    assert "src/kernels_c/ops/tt_relu.c" in pruned.sources          # defines tt_clamp_f32
    assert len(pruned.sources) < len(full.sources)
    assert _image(pruned.elf) == _image(full.elf)
    assert subprocess.run([str(pruned.elf)], cwd=tmp_path).returncode == 0

    # A scan that misses the file: the link names tt_clamp_f32, and the file defining it is added.
    real = cross_compile._reachable_library

    def blind(work, sources, roots):
        used, spare = real(work, sources, roots)
        gone = [s for s in used if s.name == "tt_relu.c"]
        return [s for s in used if s not in gone], spare + gone
    monkeypatch.setattr(cross_compile, "_reachable_library", blind)
    # with kept objects: the staged library's digest (their keys) is taken once, not again for the retry
    digests = []
    real_digest = cross_compile.tree_digest
    monkeypatch.setattr(cross_compile, "tree_digest", lambda folder: digests.append(folder) or real_digest(folder))
    again = build_firmware(board, prog, tmp_path / "again", objects=cross_compile.ObjectCache(tmp_path / "objects"))
    assert again.sources == pruned.sources
    assert _image(again.elf) == _image(pruned.elf)
    assert len(digests) == 1
