"""The kernels' C built as a host shared library for ctypes tests: the sources named (relative to kernels_c/), with
the flags every such test uses (C99, warnings as errors, -ffp-contract=off so that float results round as in the
firmware). -O0 by default: the layer files take several times longer to compile optimised, and the float
operations are the same (SSE scalar, no FMA)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

KDIR = Path(__file__).resolve().parents[1] / "kernels_c"


def host_kernel_lib(out: Path, sources: list[str], opt: str = "-O0") -> ctypes.CDLL:
    from tinytrain.stages.c_emit import ops_header

    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", opt, "-ffp-contract=off", "-shared", "-fPIC",
                    f"-I{KDIR}", f"-I{ops_header.include_dir()}", *(str(KDIR / s) for s in sources), "-o", str(out)],
                   check=True)
    return ctypes.CDLL(str(out))
