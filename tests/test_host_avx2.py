"""The native host build's AVX2 kernels (kernels_c/tt_avx2.h, tt_dw_s8_avx2.h, tt_pw_s8_avx2.h) give the portable
kernels' bytes: tests/c/tt_avx2_check.c, built with the host board's ISA flags and TT_USE_HOST_SIMD=1 (the AVX2
kernels are static functions of those headers), runs each random case (depthwise 3x3 out of place and in place, 1x1
conv, the hidden-stream mask gradient) through them and through the library's portable kernels, built without those
flags, in the same program: one build, under ASan / UBSan. Skipped where the build machine has no x86-64-v3 (AVX2)
target. (The library's dispatch to the AVX2 kernels is what the host board runs: the host-vs-golden and QEMU-vs-host
tests of test_codegen.py check its bits.)"""
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
def lines(tmp_path_factory) -> list[str]:
    """The check program's line per case."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    isa = _isa_flags()
    if not isa:
        pytest.skip("the build machine has no x86-64-v3 (AVX2) target: the host board builds no AVX2 kernels here")
    out = tmp_path_factory.mktemp("avx2")
    common = [cc, *CFLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}"]
    # the library portable, the check (and so the AVX2 kernels in its headers) with the host board's flags
    units = {src: (out / f"{i}.o", [] if src != CHECK else [*isa, "-DTT_USE_HOST_SIMD=1"])
             for i, src in enumerate(SOURCES)}
    procs = {src: subprocess.Popen([*common, *flags, "-c", str(src), "-o", str(obj)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True) for src, (obj, flags) in units.items()}
    for src, p in procs.items():
        log = p.communicate()[0]
        assert p.returncode == 0, f"{src.name} did not compile:\n{log}"
    link = subprocess.run([cc, *CFLAGS, *(str(obj) for obj, _ in units.values()), "-lm", "-o", str(out / "check")],
                          capture_output=True, text=True)
    assert link.returncode == 0, link.stderr[-3000:]
    res = subprocess.run([str(out / "check"), "14", str(CASES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.splitlines()


_CASE = re.compile(r"\d+ (dw inplace|dw copy|pw|mask) .* avx2 ([01]) (?:kept ([01]) )?out (\w+) avx2out (\w+)$")


def test_avx2_kernels_give_the_portable_bytes(lines):
    assert len(lines) == CASES
    for line in lines:
        m = _CASE.match(line)
        assert m, line
        if m[2] == "1":
            assert m[4] == m[5], f"AVX2 and portable outputs differ: {line}"
        # Declining a case in place, the AVX2 kernel leaves the buffer to the portable kernel as it was.
        assert m[3] != "0", f"the AVX2 kernel declined an in-place case after writing to it: {line}"


def test_both_paths_ran(lines):
    """Most conv cases take the AVX2 kernels (in place too); the ones with a channel outside the fast
    requantisation are left to the portable kernel."""
    took = Counter()
    for line in lines:
        m = _CASE.match(line)
        took[m[1], m[2]] += 1
    for kind in ("dw inplace", "dw copy", "pw", "mask"):
        assert took[kind, "1"] >= 40, (kind, took)
    assert sum(took[k, "0"] for k in ("dw inplace", "dw copy", "pw")) >= 10, took
