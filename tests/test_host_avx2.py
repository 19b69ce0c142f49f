"""The native host build's AVX2 kernels (kernels_c/tt_avx2.h, tt_dw_s8_avx2.h, tt_pw_s8_avx2.h) give the portable
kernels' bytes: tests/c/tt_avx2_check.c runs the same random cases (depthwise 3x3 out of place and in place, 1x1
conv, the hidden-stream mask gradient) built with the host board's ISA flags and TT_USE_HOST_SIMD=1, and built
portable; both under ASan / UBSan. Skipped where the build machine has no x86-64-v3 (AVX2) target."""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.device.boards import HOST_ISA_PROBE, host_isa_flags

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "kernels_c"
CHECK = ROOT / "tests" / "c" / "tt_avx2_check.c"
# -O0: under ASan and UBSan, gcc compiles tt_conv2d.c about 3x faster than at -O1 (the two builds took ~17 s of CPU at
# -O1, ~5 s at -O0), the cases run in a fraction of a second either way, and no access is optimised away unchecked.
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O0", "-g",
          "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
SOURCES = [KDIR / "tt_common.c", KDIR / "ops" / "tt_conv2d.c", KDIR / "ops" / "tt_depthwise_conv2d.c",
           KDIR / "tt_hidden_stream.c", CHECK]
CASES = 600


def _isa_flags() -> tuple[str, ...]:
    res = subprocess.run(list(HOST_ISA_PROBE), capture_output=True, text=True)
    lines = res.stdout.splitlines()
    return host_isa_flags(lines[0]) if res.returncode == 0 and lines else ()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[list[str], list[str]]:
    """(AVX2 build's lines, portable build's lines) of the same cases."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    isa = _isa_flags()
    if not isa:
        pytest.skip("the build machine has no x86-64-v3 (AVX2) target: the host board builds no AVX2 kernels here")
    out = tmp_path_factory.mktemp("avx2")
    common = [cc, *CFLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", *map(str, SOURCES), "-lm"]
    builds = {"avx2": [*isa, "-DTT_USE_HOST_SIMD=1"], "portable": []}
    procs = {k: subprocess.Popen([*common, *flags, "-o", str(out / k)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for k, flags in builds.items()}
    for k, p in procs.items():
        log = p.communicate()[0]
        assert p.returncode == 0, f"{k} build failed:\n{log}"
    lines = {}
    for k in builds:
        res = subprocess.run([str(out / k), "14", str(CASES)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        lines[k] = res.stdout.splitlines()
    return lines["avx2"], lines["portable"]


def test_avx2_kernels_give_the_portable_bytes(runs):
    avx2, portable = runs
    assert len(avx2) == len(portable) == CASES
    for a, p in zip(avx2, portable):
        assert re.sub(r" avx2 [01]", "", a) == re.sub(r" avx2 [01]", "", p), f"AVX2: {a}\nportable: {p}"


def test_both_paths_ran(runs):
    """Most conv cases take the AVX2 kernels (in place too); the ones with a channel outside the fast
    requantisation fall back to the portable kernel. The portable build never reports the AVX2 path."""
    avx2, portable = runs
    took = Counter()
    for line in avx2:
        m = re.match(r"\d+ (dw inplace|dw copy|pw) .* avx2 ([01]) ", line)
        if m:
            took[m[1], m[2]] += 1
    for kind in ("dw inplace", "dw copy", "pw"):
        assert took[kind, "1"] >= 40, (kind, took)
    assert sum(took[k, "0"] for k in ("dw inplace", "dw copy", "pw")) >= 10, took
    assert not any(" avx2 1 " in line for line in portable)
