"""tt_f16_read and tt_f16_narrow (kernels_c/tt_f16.h), the widening and rounding every fp16 kernel uses, against the
portable integer forms, built as the host build is (x86-64-v3: F16C's VCVTPH2PS / VCVTPS2PH) and portable: the
widening on all 65,536 fp16 values (the only difference allowed is a signalling NaN coming back quiet, which no tensor
holds: every NaN is stored quiet), the rounding on every float32 whose low 16 bits are one of 24 patterns around the
rounding points (and all high 16 bits: every exponent, sign, NaN and Inf; ~1.6 million values)."""

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
    {
        static const uint32_t lows[24] = {0u, 1u, 0x7FFu, 0x800u, 0x801u, 0xFFFu, 0x1000u, 0x1001u, 0x17FFu, 0x1800u,
                                          0x1FFFu, 0x2000u, 0x2001u, 0x3FFFu, 0x4000u, 0x7FFFu, 0x8000u, 0x8001u,
                                          0xBFFFu, 0xC000u, 0xEFFFu, 0xF000u, 0xFFFEu, 0xFFFFu};
        uint32_t hi, k;
        for (hi = 0; hi < 65536u; ++hi) {
            for (k = 0; k < 24u; ++k) {
                const uint32_t u = (hi << 16) | lows[k];
                float f;
                memcpy(&f, &u, 4);
                if (tt_f16_narrow(f) != tt_f16_narrow_portable(f)) {
                    ++bad;
                }
            }
        }
    }
    printf("%u\n", bad);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("flags", [["-march=x86-64-v3"], ["-DTT_F16_PORTABLE"]], ids=["f16c", "portable"])
def test_f16_read_and_narrow_equal_the_portable_forms(flags, tmp_path):
    if flags[0].startswith("-march") and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("not an x86-64 host")
    (tmp_path / "r.c").write_text(SRC)
    exe = tmp_path / "r"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", *flags, f"-I{KDIR}", str(tmp_path / "r.c"),
                    "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == "0"
