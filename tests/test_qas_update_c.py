"""tt_qas_update (kernels_c/tt_train_ops.c) against the numpy golden stages/quant/qas.qas_update, under ASan/UBSan.

Random odd shapes in the three scale layouts (channel per rows_per_channel rows, per column, one scale), int8
weights and int32 biases, batch 1 and 3, both roundings, master copy on and off, with ties (steps of k + 0.5),
steps around the 2^24 fast-path limit, beyond the int32 range and 2^40, infinities and zeros of both signs. The
parameters, the master copy and the PRNG state must match bit for bit.

NaN steps are checked against the documented C rule (the parameter keeps its value and no random number is drawn)
rather than numpy, which leaves NaN unguarded: the remaining elements must still equal the golden update with the
draws assigned, in row-major order, to the non-NaN elements only.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from pathlib import Path

from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.quant import qas

KDIR = Path(__file__).resolve().parents[1] / "kernels_c"
FLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O1", "-g",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
F32 = np.float32
KINDS = ("sgd", "momentum", "adam", "rmsprop")

_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "tt_train_ops.h"
static void *rd(FILE *f, size_t n) { void *p = malloc(n ? n : 1); if (n && fread(p, 1, n, f) != n) exit(3); return p; }
int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "rb"), *o = fopen(argv[2], "wb");
    int32_t ncase, t;
    (void)argc;
    if (f == 0 || o == 0 || fread(&ncase, 4, 1, f) != 1) return 2;
    for (t = 0; t < ncase; ++t) {
        /* rows, cols, n, rows_per_channel, scale_count, is_int32, master, stochastic, state count */
        int32_t h[9];
        tt_qas_params pp;
        size_t psz, ne;
        float *scale, *g, *ms, *st[2] = {0, 0};
        void *par;
        uint32_t rng;
        int32_t i;
        if (fread(h, 4, 9, f) != 9 || fread(&pp, sizeof pp, 1, f) != 1) return 2;
        psz = (size_t)h[0] * (size_t)h[1] * (h[5] ? 4u : 1u);
        ne = (size_t)h[0] * (size_t)h[2];
        scale = rd(f, 4u * (size_t)h[4]);
        g = rd(f, 4u * ne);
        par = rd(f, psz);
        ms = rd(f, 4u * ne);
        for (i = 0; i < h[8]; ++i) st[i] = rd(f, 4u * ne);
        if (fread(&rng, 4, 1, f) != 1) return 2;
        tt_qas_update(&pp, h[0], h[1], h[2], h[3], h[4], scale, par, h[5], g, st[0], st[1], h[6] ? ms : 0,
                      h[7] ? &rng : 0);
        fwrite(par, 1, psz, o);
        fwrite(ms, 4, ne, o);
        fwrite(&rng, 4, 1, o);
        free(scale); free(g); free(par); free(ms); free(st[0]); free(st[1]);
    }
    fclose(o);
    fclose(f);
    return 0;
}
"""

_PARAMS = np.dtype([("kind", "<i4"), ("qas", "<i4"), ("rounding", "<i4"), ("lo", "<i4"), ("hi", "<i4"),
                    ("f", "<f4", (12,))])  # tt_qas_params: 5 ints, then 12 floats in declaration order

# steps (in integer units) the rounding and the fast path must get right
_EDGE = np.array([0.5, -0.5, 1.5, -2.5, 126.5, -127.5, 0.49999997, -0.49999997, 8388607.5, -8388607.5,
                  16777215.0, 16777216.0, -16777216.0, 16777218.0, 3e9, -3e9, 5e12, -5e12, np.inf, -np.inf, 0.0,
                  -0.0], F32)


# portable C, and the host board's define: its SSE2 blocks (kernels_c/tt_simd.h; plain C off x86-64)
@pytest.fixture(scope="module", params=[(), ("-DTT_USE_HOST_SIMD=1",)], ids=["portable", "host_simd"])
def harness(tmp_path_factory, request):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    d = tmp_path_factory.mktemp("qas_c")
    (d / "h.c").write_text(_HARNESS)
    srcs = [KDIR / "tt_train_ops.c"]  # tt_qas_update and what it calls live there
    res = subprocess.run([cc, *FLAGS, *request.param, f"-I{KDIR}", f"-I{ops_header.include_dir()}",
                          *map(str, srcs), str(d / "h.c"), "-lm", "-o", str(d / "h")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return d / "h"


def _case(rng, *, kind, stochastic, master, is32, layout, nan):
    chans, n = int(rng.integers(1, 6)), int(rng.integers(1, 40))
    cols = n + int(rng.integers(0, 4))
    if layout == "row":
        rpc = int(rng.integers(1, 4))
        rows, sc, shape, axis = chans * rpc, chans, (chans, rpc, cols), 0
    elif layout == "col":
        rows, rpc, n = chans, 0, cols  # the per-column scale covers the whole row (numpy broadcasts over cols)
        sc, shape, axis = cols, (chans, cols), 1
    else:
        rows, rpc, sc, shape, axis = chans, int(rng.integers(0, 2)), 1, (chans, cols), 0
    ne = rows * n
    batch = int(rng.choice([1, 3]))
    lr = F32(rng.choice([1.0, 0.01, 0.37]))
    # powers of two: lr = 1, s = 1 turns the edge gradients into exact edge steps
    scale = np.where(rng.random(sc) < 0.3, F32(1.0), rng.uniform(1e-4, 5e-2, sc)).astype(F32)
    g = (rng.standard_normal(ne) * 10.0 ** rng.uniform(-3, 3, ne)).astype(F32)
    pick = rng.random(ne) < 0.3
    g[pick] = rng.choice(_EDGE, int(pick.sum())) * F32(batch)
    if kind in ("adam", "rmsprop"):
        g[np.isinf(g)] = F32(3e9)  # an infinite gradient gives them a NaN step (inf / inf): the NaN rule's case
    if nan:
        g[rng.random(ne) < 0.15] = np.nan
    if is32:
        lo, hi = qas.BIAS_RANGE
        p = rng.integers(-3000, 3000, rows * cols).astype(np.int32)
        p[rng.random(p.size) < 0.2] = hi - 3
        p[rng.random(p.size) < 0.2] = lo + 3
    else:
        lo, hi = qas.WEIGHT_RANGE
        p = rng.integers(-127, 128, rows * cols).astype(np.int8)
    ms = (p.reshape(rows, cols)[:, :n].astype(F32) + rng.uniform(-0.5, 0.5, (rows, n)).astype(F32)).reshape(-1)
    nstate = qas.STATE_COUNT[kind]
    states = [np.abs(rng.standard_normal(ne) * 0.1).astype(F32) for _ in range(nstate)]
    seed = int(rng.integers(1, 2 ** 32))
    return dict(rows=rows, cols=cols, n=n, rpc=rpc, sc=sc, shape=shape, axis=axis, batch=batch, lr=lr,
                scale=scale, g=g, p=p, ms=ms, states=states, seed=seed, lo=lo, hi=hi, kind=kind,
                stochastic=stochastic, master=master, is32=is32)


_ADAM_STEP = 3


def _blob(c) -> bytes:
    f = np.zeros(12, F32)
    # batch_scale, lr, wd, momentum, 1-b1, b2, 1-b2, lr/bc1, sqrt_bc2, alpha, 1-alpha, eps
    # Adam's per-step values as tt_adam_prepare makes them (double, then float32) for step _ADAM_STEP
    lr_bc1, sqrt_bc2 = float(c["lr"]) / (1 - 0.9 ** _ADAM_STEP), np.sqrt(1 - 0.999 ** _ADAM_STEP)
    f[:] = [F32(1.0 / c["batch"]), c["lr"], 0.0, 0.9, 0.1, 0.999, 0.001, lr_bc1, sqrt_bc2, 0.99, 0.01, 1e-8]
    prm = np.zeros(1, _PARAMS)
    prm["kind"], prm["qas"], prm["lo"], prm["hi"], prm["f"] = KINDS.index(c["kind"]), 1, c["lo"], c["hi"], f
    prm["rounding"] = 1 if c["stochastic"] else 0
    head = np.array([c["rows"], c["cols"], c["n"], c["rpc"], c["sc"], int(c["is32"]), int(c["master"]),
                     int(c["stochastic"] and not c["master"]), len(c["states"])], np.int32)
    parts = [head, prm, c["scale"], c["g"], c["p"], c["ms"], *c["states"], np.array([c["seed"]], np.uint32)]
    return b"".join(a.tobytes() for a in parts)


def _golden(c):
    """qas.qas_update on the case; NaN steps leave the parameter alone and draw nothing (the C rule)."""
    shape, n = c["shape"], c["n"]
    p = c["p"].reshape(shape).copy()
    g = c["g"].reshape(shape[:-1] + (n,)).copy()
    nan = np.isnan(g)
    g[nan] = 0.0
    ms = c["ms"].reshape(g.shape).copy() if c["master"] else None
    states = [s.reshape(g.shape).copy() for s in c["states"]]
    hp = {"learning_rate": float(c["lr"]), "momentum": 0.9, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
          "alpha": 0.99}
    stoch = c["stochastic"] and not c["master"]
    prng = np.array(c["seed"], np.uint32).view(np.int32).copy() if stoch else None
    before = p[..., :n].copy()
    if stoch and nan.any():
        # the draws go to the non-NaN elements in row-major order: round those with a stream of their own length
        draws, new = qas.xorshift32_draws(c["seed"], int((~nan).sum()))
        u = np.zeros(g.shape, F32)
        u[~nan] = qas.uniforms(draws)
        s = qas.broadcast_scale(c["scale"], shape, c["axis"], n)
        gg = go.prepare_grad(g, 1.0 / c["batch"])
        if c["kind"] == "sgd":
            d = go.sgd_step(gg, c["lr"])
        else:
            d = go.momentum_step(gg, states[0], c["lr"], hp["momentum"])
        delta = (-np.asarray(d, F32) / s).astype(F32)
        r = qas.round_stochastic(delta, u)
        p[..., :n] = np.clip(before.astype(np.int64) + r, c["lo"], c["hi"]).astype(p.dtype)
        prng = np.array(new, np.uint32).view(np.int32)
    else:
        qas.qas_update(c["kind"], p, g, c["scale"], axis=c["axis"], n=n, state=states, hp=hp,
                       step=_ADAM_STEP, batch_size=c["batch"], rounding="stochastic" if stoch else "nearest",
                       bounds=(c["lo"], c["hi"]), master=ms, prng=prng)
    trained = p[..., :n]
    trained[nan] = before[nan]
    if ms is not None:
        ms[nan] = np.nan
    rng_out = int(np.asarray(prng).view(np.uint32)) if stoch else c["seed"]
    return p.reshape(-1), (ms.reshape(-1) if ms is not None else c["ms"]), rng_out


def test_qas_update_equals_numpy_golden(harness, tmp_path):
    rng = np.random.default_rng(14)
    cases = []
    for kind in ("sgd", "sgd", "momentum", "adam", "rmsprop"):  # sgd twice: the common case has its own loop
        for stochastic in (False, True):
            for master in (False, True):
                for is32 in (False, True):
                    if master and is32:
                        continue  # master copies exist for int8 weights only
                    for layout in ("row", "col", "one"):
                        # _golden's NaN rule reads the step of sgd and momentum only
                        for nan in (False, True) if kind in ("sgd", "momentum") else (False,):
                            cases.append(_case(rng, kind=kind, stochastic=stochastic, master=master, is32=is32,
                                               layout=layout, nan=nan))
    (tmp_path / "in.bin").write_bytes(np.int32(len(cases)).tobytes() + b"".join(_blob(c) for c in cases))
    res = subprocess.run([str(harness), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], capture_output=True,
                         text=True, env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
    assert res.returncode == 0, res.stderr
    out, pos = (tmp_path / "out.bin").read_bytes(), 0
    for i, c in enumerate(cases):
        psz = c["p"].nbytes
        p_c = np.frombuffer(out[pos:pos + psz], c["p"].dtype)
        ms_c = np.frombuffer(out[pos + psz:pos + psz + c["ms"].nbytes], F32)
        pos += psz + c["ms"].nbytes
        rng_c = int(np.frombuffer(out[pos:pos + 4], np.uint32)[0])
        pos += 4
        p_ref, ms_ref, rng_ref = _golden(c)
        what = {k: c[k] for k in ("kind", "stochastic", "master", "is32", "rows", "cols", "n", "rpc", "batch")}
        assert np.array_equal(p_c, p_ref), f"case {i} {what}: parameters differ"
        assert rng_c == rng_ref, f"case {i} {what}: PRNG state differs"
        if c["master"]:
            same = (ms_c.view(np.uint32) == ms_ref.view(np.uint32)) | (np.isnan(ms_c) & np.isnan(ms_ref))
            assert same.all(), f"case {i} {what}: master copy differs"
    assert pos == len(out)


# ---- tt_qas_update_s8 (kernels_c/tt_qas.c): the edges of its cheap rounding ------------------------------------
# Its floor is an int32 truncation after clamping (no libm floorf on Cortex-M4); these are the values where that
# could go wrong: a master copy at +127 plus a draw just below 1 (127 + u rounds to 128.0 in float32), steps far
# beyond the int8 range, infinities, -0.0 and NaN (skipped, no draw). The golden is the rule in tt_kernels.h, as
# tests/test_kernels_c.py's qas_update_ref transcribes it.

_S8_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "tt_kernels.h"
int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "rb"), *o = fopen(argv[2], "wb");
    int32_t h[6]; /* rows, cols, n, rows_per_channel, rounding, channels */
    float *fac, *g, *m, lr;
    int8_t *w;
    uint32_t st;
    tt_qas_layout l;
    (void)argc;
    if (f == 0 || o == 0 || fread(h, 4, 6, f) != 6 || fread(&lr, 4, 1, f) != 1) return 2;
    fac = malloc(4u * (size_t)h[5]); g = malloc(4u * (size_t)(h[0] * h[2])); m = malloc(4u * (size_t)(h[0] * h[2]));
    w = malloc((size_t)(h[0] * h[1]));
    if (fread(fac, 4, (size_t)h[5], f) != (size_t)h[5] || fread(g, 4, (size_t)(h[0] * h[2]), f) != (size_t)(h[0] * h[2])
        || fread(m, 4, (size_t)(h[0] * h[2]), f) != (size_t)(h[0] * h[2]) || fread(w, 1, (size_t)(h[0] * h[1]), f)
        != (size_t)(h[0] * h[1]) || fread(&st, 4, 1, f) != 1) return 2;
    l.s.rows = h[0]; l.s.cols = h[1]; l.s.n = h[2]; l.rows_per_channel = h[3]; l.rounding = (tt_rounding)h[4];
    tt_qas_factors(h[5], lr, fac, 1.0f, fac);
    for (int pass = 0; pass < 2; ++pass) { /* without, then with the master copy (on fresh copies) */
        int8_t *wc = malloc((size_t)(h[0] * h[1]));
        float *mc = malloc(4u * (size_t)(h[0] * h[2]));
        uint32_t s = st;
        for (int i = 0; i < h[0] * h[1]; ++i) wc[i] = w[i];
        for (int i = 0; i < h[0] * h[2]; ++i) mc[i] = m[i];
        tt_qas_update_s8(&l, fac, wc, g, pass ? mc : 0, &s);
        fwrite(wc, 1, (size_t)(h[0] * h[1]), o); fwrite(mc, 4, (size_t)(h[0] * h[2]), o); fwrite(&s, 4, 1, o);
        free(wc); free(mc);
    }
    fclose(o); fclose(f); free(fac); free(g); free(m); free(w);
    return 0;
}
"""


def _xorshift_inverse(x: int) -> int:
    """The state whose next xorshift32 state is x (each x ^= x << k / x >> k step is invertible)."""
    def undo_left(y, k):
        v = y
        for _ in range(32 // k + 1):
            v = y ^ ((v << k) & 0xFFFFFFFF)
        return v

    def undo_right(y, k):
        v = y
        for _ in range(32 // k + 1):
            v = y ^ (v >> k)
        return v
    return undo_left(undo_right(undo_left(x, 5), 17), 13)


def _s8_rule(w, g, s_w, lr, rpc, n, rounding, master, state):
    """The rule of tt_kernels.h, one float32 operation at a time, element by element in row-major order."""
    w, master = w.copy(), None if master is None else master.copy()
    with np.errstate(all="ignore"):
        for r in range(g.shape[0]):
            for j in range(n):
                f = F32(lr) / (F32(1.0) * s_w[r // rpc if rpc else j])
                x = -(g[r, j] * f)
                if np.isnan(x):
                    continue
                if master is not None:
                    master[r, j] = min(max(F32(master[r, j] + x), F32(-127)), F32(127))
                    y = master[r, j]
                else:
                    y = x
                if rounding:
                    state = qas.xorshift32_next(state)
                    y = F32(y + F32(state >> 8) * F32(2.0 ** -24))
                else:
                    y = F32(y + F32(0.5))
                q = np.floor(y)
                if master is not None:
                    w[r, j] = int(min(max(q, -127), 127))
                else:
                    w[r, j] = int(min(max(int(w[r, j]) + min(max(q, -255), 255), -127), 127))
    return w, master, state


@pytest.mark.parametrize("rounding", [0, 1])
def test_qas_update_s8_rounding_edges(tmp_path, rounding):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    (tmp_path / "h.c").write_text(_S8_HARNESS)
    res = subprocess.run([cc, *FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", str(KDIR / "tt_qas.c"),
                          str(tmp_path / "h.c"), "-lm", "-o", str(tmp_path / "h")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    seed = _xorshift_inverse(0xFFFFFF00 | 0x5A)  # first draw: u = 1 - 2^-24
    assert qas.xorshift32_next(seed) >> 8 == 0xFFFFFF
    rng = np.random.default_rng(3)
    for rows, cols, n, rpc, ch in ((7, 5, 5, 1, 7), (6, 4, 3, 3, 2), (3, 6, 6, 0, 6), (5, 9, 7, 5, 1)):
        s_w = rng.uniform(0.002, 0.02, ch).astype(F32)
        g = (rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-2, 2, (rows, n))).astype(F32)
        edge = np.array([-0.0, np.inf, -np.inf, 1e30, -1e30, 3e9, -3e9, np.nan, 0.01, -0.01], F32)
        g.flat[1:1 + min(edge.size, g.size - 1)] = edge[:g.size - 1]
        g[rng.random(g.shape) < 0.1] = np.nan
        g.flat[0] = 0.0  # with the master copy at +127: 127 + (1 - 2^-24) == 128.0f, which must give 127
        w = rng.integers(-127, 128, (rows, cols)).astype(np.int8)
        master = (w[:, :n].astype(F32) + rng.uniform(-0.5, 0.5, (rows, n)).astype(F32)).astype(F32)
        master.flat[0] = 127.0
        lr = F32(0.05)
        blob = b"".join(a.tobytes() for a in (np.array([rows, cols, n, rpc, rounding, ch], np.int32),
                                              np.array([lr], F32), s_w, g, master, w, np.array([seed], np.uint32)))
        (tmp_path / "in.bin").write_bytes(blob)
        res = subprocess.run([str(tmp_path / "h"), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                             capture_output=True, text=True, env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
        assert res.returncode == 0, res.stderr
        out, pos = (tmp_path / "out.bin").read_bytes(), 0
        for use_master in (False, True):
            w_c = np.frombuffer(out[pos:pos + w.size], np.int8).reshape(w.shape)
            m_c = np.frombuffer(out[pos + w.size:pos + w.size + 4 * g.size], F32).reshape(g.shape)
            pos += w.size + 4 * g.size
            st_c = int(np.frombuffer(out[pos:pos + 4], np.uint32)[0])
            pos += 4
            ref_w, ref_m, ref_st = _s8_rule(w, g, s_w, lr, rpc, n, rounding, master if use_master else None, seed)
            np.testing.assert_array_equal(w_c, ref_w)
            assert st_c == (ref_st if rounding else seed)
            if use_master:
                assert (m_c.view(np.uint32) == ref_m.view(np.uint32)).all()
                if rounding:
                    assert w_c.flat[0] == 127
