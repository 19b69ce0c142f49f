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


def test_host_isa_flags_take_only_march_lines():
    from tinytrain.stages.device.boards import host_isa_flags

    assert host_isa_flags("-march=x86-64-v3") == ("-march=x86-64-v3",)
    for other in ("default", "", "exit 1: sh: cc: not found", "-O0", "-march=x86-64-v3 -ffast-math"):
        assert host_isa_flags(other) == ()


def test_the_isa_probe_is_in_cross_compiles_key_and_answers_here():
    """The -march choice depends on the build machine, so the probe that makes it is one of cross-compile's tools
    for the host board (their first output line is part of its cache key: tests/test_cache_keys_hermetic.py checks
    which boards' keys it changes); here it answers one of its two words."""
    from tinytrain.cache.keys import tool_identity
    from tinytrain.pipeline.stage_graph import stage
    from tinytrain.stages.device.boards import HOST_ISA_PROBE

    assert HOST_ISA_PROBE in [t.cmd for t in stage("cross-compile").tools]
    assert tool_identity(list(HOST_ISA_PROBE)) in ("default", "-march=x86-64-v3")


def test_host_build_uses_the_probed_isa_and_host_eval_does_not(tmp_path):
    """The host board's firmware gets the probe's -march (before the user's flags, which may override it); the host
    evaluation build of an emulated board keeps the compiler's default target."""
    import json
    import shutil

    import pytest

    from tinytrain.cache.keys import tool_identity
    from tinytrain.stages.cross_compile import build_firmware
    from tinytrain.stages.device.boards import HOST_ISA_PROBE, host_isa_flags

    isa = list(host_isa_flags(tool_identity(list(HOST_ISA_PROBE))))
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "main.c").write_text("int tt_main(void);\nint tt_main(void) { return 0; }\n")
    build_firmware(get_board("host"), prog, tmp_path / "h", kernels=[], extra_cflags=["-g0"])
    flags = json.loads((tmp_path / "h" / "build.json").read_text())["cflags"]
    assert flags[len(flags) - 1 - len(isa):] == [*isa, "-g0"]
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("arm-none-eabi-gcc not installed")
    build_firmware(get_board("stm32f746-disco"), prog, tmp_path / "q", kernels=[], host_eval=True)
    doc = json.loads((tmp_path / "q" / "build.json").read_text())["host_eval"]
    assert doc["built"] and not any(f.startswith("-march") for f in doc["cflags"])
