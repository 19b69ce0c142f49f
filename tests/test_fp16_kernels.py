"""kernels_c/tt_f16.c's software fp16 conversions against numpy's (IEEE round to nearest even), on every fp16
value, every tie between neighbours and a million random float32 bit patterns; and the loss-scale policy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.golden import fp16 as h

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


def _inputs() -> np.ndarray:
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    fin = every[np.isfinite(every)].astype(np.float32)
    fin = np.unique(fin)
    mids = ((fin[:-1].astype(np.float64) + fin[1:]) / 2).astype(np.float32)   # exact ties (float32 holds them)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    rnd = np.random.default_rng(0).integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edge = np.array([65504, 65519.996, 65520, 65536, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -14,
                     np.inf, -np.inf, 3.4e38, 1e-45, 0.0, -0.0], np.float32)
    return np.concatenate([fin, mids, near, rnd, edge]).astype(np.float32)


def test_conversions_match_numpy_bit_for_bit(tmp_path):
    exe = tmp_path / "conv"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-ffp-contract=off",
                    f"-I{ROOT / 'kernels_c'}", str(ROOT / "tests" / "c" / "f16_convert_main.c"),
                    str(ROOT / "kernels_c" / "tt_f16.c"), "-o", str(exe)], check=True)
    x = _inputs()
    x.tofile(tmp_path / "in.bin")
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin"), str(tmp_path / "all.bin")],
                   check=True)
    got = np.fromfile(tmp_path / "out.bin", np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert ((got[nan] & 0x7C00) == 0x7C00).all() and ((got[nan] & 0x3FF) != 0).all()   # NaN stays NaN
    back = np.fromfile(tmp_path / "all.bin", np.float32)
    ref = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    same = np.isnan(ref)
    np.testing.assert_array_equal(back[~same].view(np.uint32), ref[~same].view(np.uint32))
    assert np.isnan(back[same]).all()


def test_dynamic_policy_backs_off_grows_and_respects_limits():
    s, good, skipped = np.array(8.0, np.float32), np.zeros((), np.int32), np.zeros((), np.int32)
    kw = dict(dynamic=True, growth=2.0, backoff=0.5, interval=2, lo=2.0, hi=16.0)
    trace = []
    for flag in (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0):
        h.update_scale(s, good, skipped, flag, **kw)
        trace.append(float(s))
    assert trace == [4.0, 2.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0, 16.0, 16.0]
    assert int(skipped) == 3


def test_static_policy_keeps_the_scale_but_counts_skips():
    s, good, skipped = np.array(128.0, np.float32), np.zeros((), np.int32), np.zeros((), np.int32)
    for flag in (0, 1, 0, 1):
        h.update_scale(s, good, skipped, flag, dynamic=False, growth=2.0, backoff=0.5, interval=1, lo=1.0, hi=1e9)
    assert float(s) == 128.0 and int(skipped) == 2
