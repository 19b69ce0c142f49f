"""Command-line conventions: --version, -q/-v, colour (terminal, NO_COLOR, --color), progress in logs and
on a terminal, a reader that goes away (`| head -1`), and folders that are files."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tinytrain
from tinytrain.pipeline import stage_graph
from tinytrain.pipeline.cli import EXIT_BROKEN_PIPE, main
from tinytrain.pipeline.console import BuildLog
from tinytrain.pipeline.stage_graph import StageDef

EXE = Path(sys.executable).with_name("tinytrain")
ESC = "\x1b["

# A stage that reports three training steps with epoch and loss, the way emulate-run does.
PROGRESS_STAGE = """\
import time
from tinytrain.pipeline.contract import StageResult

def run(ctx):
    for i in range(1, 4):
        ctx.progress("training steps", done=i, total=3, epoch=1 + (i - 1) // 2, epochs=2, loss=1.0 / i)
        time.sleep(float(ctx.config["quantize"].num_samples) / 1000)
    (ctx.out_dir / "p.txt").write_text("trained")
    return StageResult("p done")
"""


def _table(fake) -> tuple[StageDef, ...]:
    module = fake.module("progress")
    (fake.root / "stages" / f"{module}.py").write_text(PROGRESS_STAGE)
    return (StageDef("a", ("model",), (), fake.module("a")),
            StageDef("p", ("quantize",), ("a",), module))


def _driver(fake) -> Path:
    """A script running the CLI with the progress table (for runs in a real process or on a terminal)."""
    path = fake.root / "driver_progress.py"
    path.write_text("import sys\n"
                    f"sys.path.insert(0, {str(fake.root / 'stages')!r})\n"
                    "from tinytrain.pipeline import stage_graph\n"
                    "from tinytrain.pipeline.stage_graph import StageDef\n"
                    f"stage_graph.STAGES = {_table(fake)!r}\n"
                    "from tinytrain.pipeline.cli import main\n"
                    "raise SystemExit(main(sys.argv[1:]))\n")
    return path


@pytest.fixture
def fake(fake_project, monkeypatch):
    monkeypatch.setattr(stage_graph, "STAGES", _table(fake_project))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return fake_project


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; returns the exit code and all it printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


# ---- --version, -q, -v ----------------------------------------------------------------------------

def test_version_in_a_real_process():
    if not EXE.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(EXE), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"tinytrain {tinytrain.__version__}"


def test_quiet_prints_only_the_final_result(fake, capsys):
    code, out, err = _run(capsys, "build", fake.spec_path, "-q")
    assert code == 0 and err == ""
    assert len(out.splitlines()) == 1 and out.startswith("build ok in ") and "2 ran, 0 cached" in out
    # before the command too, and errors still show
    code, out, err = _run(capsys, "-q", "build", fake.root / "missing.yaml")
    assert code == 2 and out == "" and err.startswith("error: ")


def test_verbose_shows_full_keys_timings_and_the_cache_folder(fake, capsys):
    code, out, _ = _run(capsys, "build", fake.spec_path)
    assert code == 0 and "cache folder" not in out and "restored in" not in out
    code, out, _ = _run(capsys, "-v", "build", fake.spec_path)
    _, doc, _ = _run(capsys, "build", fake.spec_path, "--json")
    full_keys = [s["key"] for s in json.loads(doc)["stages"]]
    assert code == 0 and len(full_keys[0]) == 64
    assert f"cache folder {os.environ['TINYTRAIN_CACHE_DIR']}" in out
    for key in full_keys:
        assert f"key {key}, restored in " in out
    code, out, _ = _run(capsys, "build", fake.spec_path, "-v", "--force", "p")
    assert f"[p] stored under key {full_keys[1]}" in out


def test_quiet_and_verbose_exclude_each_other(fake, capsys):
    code, _, err = _run(capsys, "build", fake.spec_path, "-q", "-v")
    assert code == 2 and "not allowed with argument" in err


# ---- colour -----------------------------------------------------------------------------------------

def test_no_colour_when_piped_unless_asked(fake, capsys):
    _run(capsys, "build", fake.spec_path)
    code, out, _ = _run(capsys, "build", fake.spec_path)  # cached lines are styled (dim) on a terminal
    assert code == 0 and ESC not in out
    code, out, _ = _run(capsys, "build", fake.spec_path, "--color", "always")
    assert code == 0 and f"{ESC}2m[a] cached" in out
    code, _, err = _run(capsys, "build", fake.spec_path, "--color", "sometimes")
    assert code == 2 and "invalid choice" in err


@pytest.mark.parametrize("no_color, flag, coloured", [
    ("", None, True), ("1", None, False), ("", "never", False), ("1", "always", True)])
def test_colour_on_a_terminal_follows_no_color_and_the_flag(fake, no_color, flag, coloured):
    driver = _driver(fake)
    env = {**os.environ, "NO_COLOR": no_color, "TERM": "xterm-256color", "COLUMNS": "200"}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    assert subprocess.run([sys.executable, str(driver), "build", str(fake.spec_path)], env=env,
                          capture_output=True).returncode == 0
    argv = [sys.executable, str(driver), "build", str(fake.spec_path)] + (["--color", flag] if flag else [])
    code, text = _on_a_terminal(argv, env, fake.root)
    assert code == 0 and "[a] cached" in text
    assert (ESC + "2m" in text) == coloured


def test_live_bar_with_eta_on_a_terminal(fake):
    # The stage sleeps 0.4 s per step so that the bar (refreshed 10 times a second) is drawn.
    fake.write_spec(quantize={"num_samples": 400})
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    code, text = _on_a_terminal([sys.executable, str(_driver(fake)), "build", str(fake.spec_path)], env, fake.root)
    assert code == 0 and "[p] ran in" in text
    assert "ETA" in text and "training steps 1/3" in text and "loss" in text
    assert "elapsed:" not in text  # no plain progress lines on a terminal


# ---- progress in a log ------------------------------------------------------------------------------

def test_piped_build_prints_progress_lines_with_elapsed_step_epoch_and_loss(fake, capsys):
    code, out, _ = _run(capsys, "build", fake.spec_path, "--progress-every", "0")
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("[p] ") and " elapsed: " in ln]
    assert len(lines) == 3
    assert lines[0].endswith("training steps 1/3 (33%), epoch 1/2, loss 1")
    assert lines[2].endswith("training steps 3/3 (100%), epoch 2/2, loss 0.3333")
    elapsed = lines[0].split("] ", 1)[1].split(" elapsed", 1)[0]
    assert elapsed.endswith("s") and float(elapsed[:-1]) >= 0
    assert out.index(lines[2]) < out.index("[p] ran in")
    # the default interval (5 s) prints nothing for a stage this short, and -q never does
    code, out, _ = _run(capsys, "build", fake.spec_path, "--force", "p")
    assert code == 0 and " elapsed: " not in out
    code, out, _ = _run(capsys, "build", fake.spec_path, "--force", "p", "-q", "--progress-every", "0")
    assert code == 0 and " elapsed: " not in out


def test_a_log_gets_a_line_every_interval_while_a_stage_is_silent():
    stream = io.StringIO()
    log = BuildLog(stream, progress_every=0.01)
    log.started("emulate-run")
    log.progress("emulate-run", "training steps", done=5, total=50, epoch=1, epochs=3, loss=0.25)
    deadline = time.monotonic() + 30  # waits for the heartbeat; asserts nothing about the time it took
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    log.finished()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(ln.startswith("[emulate-run] ") and ln.endswith(
        "elapsed: training steps 5/50 (10%), epoch 1/3, loss 0.25") for ln in lines)
    count = len(stream.getvalue())
    time.sleep(0.05)
    assert len(stream.getvalue()) == count  # the ticker stopped with the stage


def test_progress_every_must_be_a_number_of_seconds(fake, capsys):
    code, _, err = _run(capsys, "build", fake.spec_path, "--progress-every", "soon")
    assert code == 2 and "expected a number of seconds" in err


# ---- a reader that goes away ------------------------------------------------------------------------

def _with_closed_stdout(argv: list[str]) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` after its line: every write gets EPIPE
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def test_status_into_a_closed_pipe_ends_quietly(fake):
    if not EXE.exists():
        pytest.skip("console script not installed next to this interpreter")
    fake.write_spec()
    proc = _with_closed_stdout([str(EXE), "status", str(fake.spec_path)])
    assert proc.returncode == EXIT_BROKEN_PIPE and proc.stderr == ""
    proc = _with_closed_stdout([str(EXE), "schema"])
    assert proc.returncode == EXIT_BROKEN_PIPE and proc.stderr == ""


def test_build_into_a_closed_pipe_finishes_the_build(fake):
    proc = _with_closed_stdout([sys.executable, str(_driver(fake)), "build", str(fake.spec_path)])
    assert proc.returncode == 0 and proc.stderr == ""
    assert (fake.out / "p" / "p.txt").read_text() == "trained"


# ---- folders that are files -------------------------------------------------------------------------

def test_out_dir_that_is_a_file_is_one_line_exit_2(fake, capsys, tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    fake.write_spec(build={"out_dir": str(a_file)})
    for argv in (["build", fake.spec_path], ["clean", fake.spec_path]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and err == f"error: build.out_dir {a_file} is a file, not a folder\n", err
    fake.write_spec(build={"out_dir": str(a_file / "sub")})
    code, _, err = _run(capsys, "build", fake.spec_path)
    assert code == 2 and err == f"error: build.out_dir {a_file / 'sub'} is under {a_file}, which is a file, not a folder\n"


def test_cache_dir_that_is_a_file_is_one_line_exit_2(fake, capsys, tmp_path):
    a_file = tmp_path / "cachefile"
    a_file.write_text("x")
    for argv in (["build", fake.spec_path], ["status", fake.spec_path], ["cache", "stats"]):
        code, out, err = _run(capsys, *argv, "--cache-dir", a_file)
        assert code == 2 and err == f"error: --cache-dir {a_file} is a file, not a folder\n", err
    fake.write_spec(build={"out_dir": "out", "cache_dir": str(a_file / "c")})
    code, _, err = _run(capsys, "build", fake.spec_path)
    assert code == 2 and err.startswith(f"error: build.cache_dir {a_file / 'c'} is under {a_file}") and "\n" == err[-1]


# ---- the installed command on the example -----------------------------------------------------------

def test_installed_command_quiet_verbose_and_colour_on_the_example(tmp_path):
    if not EXE.exists():
        pytest.skip("console script not installed next to this interpreter")
    import shutil

    repo = Path(__file__).resolve().parents[1]
    shutil.copy(repo / "tinytrain.yaml.example", tmp_path / "tinytrain.yaml.example")
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copy(repo / "tests" / "fixtures" / "digits_cnn_float.tflite", tmp_path / "tests" / "fixtures")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(TERM="xterm-256color", COLUMNS="200")
    argv = [str(EXE), "build", "tinytrain.yaml.example", "--until", "load"]
    quiet = subprocess.run([*argv, "-q"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == ""
    lines = quiet.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("build ok in ") and "1 ran, 0 cached" in lines[0]
    verbose = subprocess.run([*argv, "-v"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    key = json.loads((tmp_path / "build" / "digits" / "build.json").read_text())["stages"][0]["key"]
    assert verbose.returncode == 0 and f"[load] key {key}, restored in " in verbose.stdout and ESC not in verbose.stdout
    # load is cached now, so no live bar draws: any escape code is colour
    code, text = _on_a_terminal(argv, env, tmp_path)
    assert code == 0 and ESC + "2m" in text and "[load] cached" in text
    code, text = _on_a_terminal(argv, {**env, "NO_COLOR": "1"}, tmp_path)
    assert code == 0 and ESC not in text and "[load] cached" in text
