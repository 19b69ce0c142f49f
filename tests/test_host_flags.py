"""The native host build is optimised (-O3, issue 14) without giving up bit-identity with QEMU: -ffp-contract=off
is still on the command line, and nothing that relaxes IEEE arithmetic is. (The bits themselves are checked by
test_codegen.py's host-vs-golden and QEMU-vs-host tests, which build with these flags.)"""

from tinytrain.stages.device.boards import get_board
from tinytrain.stages.cross_compile import _cflags


def test_host_flags_are_o3_and_keep_strict_fp():
    flags = _cflags(get_board("host"), {}, (), ())
    assert "-ffp-contract=off" in flags
    opt = [f for f in flags if f.startswith("-O")]
    assert opt[-1] == "-O3"                       # the last -O wins
    assert not any(f.startswith(("-ffast-math", "-Ofast", "-funsafe-math", "-march=native")) for f in flags)


def test_boards_keep_o2():
    flags = _cflags(get_board("stm32f746-disco"), {}, (), ())
    assert [f for f in flags if f.startswith("-O")][-1] == "-O2"
