"""cross-compile's ObjectCache and prewarm (issue 14: a cold MobileNetV2 build): kernel-library objects compiled
once, by an earlier build or in the background while the stages before cross-compile run, and copied into the build.
What is linked must be the same bytes as a build that compiles everything itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tinytrain.stages import cross_compile
from tinytrain.stages.cross_compile import ObjectCache, build_firmware, prewarm
from tinytrain.stages.device.boards import get_board

from test_cross_compile_prune import PROGRAM

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("nice") is None,
                              reason="no native C compiler (cc) or no nice")


@pytest.fixture
def counted(monkeypatch):
    """The units each build_firmware call compiled (by source file name)."""
    seen: list[str] = []
    real = cross_compile._compile_command

    def spy(u, deps=False):
        seen.append(u.src.name)
        return real(u, deps)
    monkeypatch.setattr(cross_compile, "_compile_command", spy)
    return seen


def _program(root: Path, headers: dict[str, str] | None = None) -> Path:
    prog = root / "prog"
    prog.mkdir()
    (prog / "main.c").write_text(PROGRAM)
    for name, text in (headers or {}).items():
        (prog / name).write_text(text)
    return prog


@needs_cc
def test_cached_objects_link_the_same_program(tmp_path, counted):
    board = get_board("host")
    prog = _program(tmp_path)
    plain = build_firmware(board, prog, tmp_path / "plain")
    compiled = list(counted)
    cache = ObjectCache(tmp_path / "objects")
    first = build_firmware(board, prog, tmp_path / "first", objects=cache)
    assert sorted(counted[len(compiled):]) == sorted(compiled)      # an empty cache: everything compiled
    del counted[:]
    again = build_firmware(board, prog, tmp_path / "again", objects=cache)
    assert counted == ["main.c"]                                   # the library and board support: copied
    assert plain.elf.read_bytes() == first.elf.read_bytes() == again.elf.read_bytes()
    # other flags are other objects
    del counted[:]
    build_firmware(board, prog, tmp_path / "flags", objects=cache, extra_cflags=["-DTT_UNUSED_FLAG=1"])
    assert sorted(counted) == sorted(compiled)
    # `--force cross-compile` (refresh): compiled again
    del counted[:]
    build_firmware(board, prog, tmp_path / "refresh", objects=ObjectCache(tmp_path / "objects", refresh=True))
    assert sorted(counted) == sorted(compiled)


@needs_cc
def test_a_program_header_that_could_shadow_a_library_one_is_not_trusted(tmp_path, counted):
    """The program folder comes first on the include path: a program file named like a header a cached object read
    could have replaced it, so that object is compiled again (and what the program's header says is what counts)."""
    board = get_board("host")
    cache = ObjectCache(tmp_path / "objects")
    build_firmware(board, _program(tmp_path), tmp_path / "first", objects=cache)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    kernels_h = (cross_compile.KERNELS_DIR / "tt_kernels.h").read_text()
    del counted[:]
    build_firmware(board, _program(shadow, {"tt_kernels.h": kernels_h}), tmp_path / "second", objects=cache)
    again = {n for n in counted if n != "main.c"}
    assert again, "a library file that includes tt_kernels.h was taken from the cache"
    (tmp_path / "plain").mkdir()
    del counted[:]
    build_firmware(board, _program(tmp_path / "plain"), tmp_path / "third", objects=cache)
    assert counted == ["main.c"]


@needs_cc
def test_prewarm_compiles_what_the_build_then_copies(tmp_path, counted, monkeypatch):
    """prewarm (started by the runner while earlier stages run) fills the cache with the build's own objects."""
    monkeypatch.setattr(cross_compile, "_idle_core", lambda: True)
    real = cross_compile._library_files
    monkeypatch.setattr(cross_compile, "_library_files",
                        lambda work: [p for p in real(work) if p.name == "tt_relu.c"])
    started = prewarm({"target.board": "host", "target.kernels": "portable"}, tmp_path / "units")
    assert started is not None
    started._thread.join(timeout=300)   # let it finish here (the runner stops it when cross-compile's turn comes)
    assert not started._thread.is_alive()
    started.stop()
    assert started.compiled > 0
    del counted[:]
    board = get_board("host")
    prog = _program(tmp_path)
    warm = build_firmware(board, prog, tmp_path / "warm", defines=cross_compile.kernel_defines("portable"),
                          objects=ObjectCache(tmp_path / "units" / "objects"))
    assert counted == ["main.c"]
    cold = build_firmware(board, prog, tmp_path / "cold", defines=cross_compile.kernel_defines("portable"))
    assert warm.elf.read_bytes() == cold.elf.read_bytes()


def test_prewarm_runs_only_on_a_core_left_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(cross_compile, "worker_count", lambda: 2)
    monkeypatch.setattr(cross_compile, "_running_now", lambda: 2)     # this process and one other: no idle core
    assert not cross_compile._idle_core() and prewarm({"target.board": "host"}, tmp_path) is None
    monkeypatch.setattr(cross_compile, "_running_now", lambda: 1)     # this process alone
    assert cross_compile._idle_core()
    monkeypatch.setattr(cross_compile, "worker_count", lambda: 1)
    assert not cross_compile._idle_core()


@needs_cc
def test_a_cache_that_cannot_be_written_only_loses_the_objects(tmp_path):
    (tmp_path / "not-a-folder").write_text("a file where the cache would go")
    r = build_firmware(get_board("host"), _program(tmp_path), tmp_path / "out",
                       objects=ObjectCache(tmp_path / "not-a-folder" / "objects"))
    assert r.elf.is_file()


def test_a_fetched_object_counts_as_used_for_the_stores_gc(tmp_path):
    """fetch refreshes the object's mtime (its last use for `tinytrain cache gc`, as a lookup does for an entry)."""
    import os

    u = cross_compile._Unit("cc", ("-O2",), Path("src/kernels_c/tt_relu.c"), Path("obj/kernels_c/tt_relu.o"))
    cache = ObjectCache(tmp_path / "objects")
    obj, meta = cache._paths("ab" * 32)
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"object")
    meta.write_text('{"headers": ["tt_kernels.h"]}')
    for p in (obj, meta):
        os.utime(p, (1000.0, 1000.0))
    (tmp_path / "work" / "obj" / "kernels_c").mkdir(parents=True)
    assert cache.fetch(tmp_path / "work", u, "ab" * 32, {"main.c"})
    assert (tmp_path / "work" / u.obj).read_bytes() == b"object"
    assert obj.stat().st_mtime > 1000.0 and meta.stat().st_mtime > 1000.0
