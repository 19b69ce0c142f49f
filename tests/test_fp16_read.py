"""tt_f16_read (kernels_c/tt_f16.h), the widening every fp16-reading kernel uses, against the portable tt_f16_widen on
all 65,536 fp16 values: built as the host build is (x86-64-v3: F16C's VCVTPH2PS) and portable. The only difference
allowed is a signalling NaN coming back quiet, which no tensor holds (tt_f32_to_f16 stores every NaN quiet)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

KDIR = Path(__file__).resolve().parents[1] / "kernels_c"
SRC = r"""
#include <stdio.h>
#include "tt_f16.h"
int main(void)
{
    unsigned h, bad = 0;
    for (h = 0; h < 65536u; ++h) {
        float a = tt_f16_read((uint16_t)h), b = tt_f16_widen((uint16_t)h);
        uint32_t ua, ub;
        const int snan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0 && (h & 0x200u) == 0;
        memcpy(&ua, &a, 4);
        memcpy(&ub, &b, 4);
        if (ua != ub && !(snan && ua == (ub | 0x400000u))) {
            ++bad;
        }
    }
    printf("%u\n", bad);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("flags", [["-march=x86-64-v3"], ["-DTT_F16_PORTABLE_READ"]], ids=["f16c", "portable"])
def test_f16_read_equals_the_portable_widening(flags, tmp_path):
    if flags[0].startswith("-march") and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("not an x86-64 host")
    (tmp_path / "r.c").write_text(SRC)
    exe = tmp_path / "r"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", *flags, f"-I{KDIR}", str(tmp_path / "r.c"),
                    "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == "0"
